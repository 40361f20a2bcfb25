//! `nightshift audit migrate --to postgres`: a stopped engine's record log
//! copied into a PostgreSQL shard — over the engine's own connection (TLS
//! as the URL's `sslmode` asks, the server's certificate checked against
//! the CA file) — in transactions of 1,000 records, resuming after what the
//! shard already holds, then verified there.

use std::path::Path;

use crate::pg::{self, ConnectError, PgAuditError};
use crate::{AuditError, AuditStore, VerifyReport};

/// Records a transaction.
const BATCH: usize = 1000;

/// Why a migration could not run.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{0} (stop the engine before migrating)")]
    InUse(AuditError),
    #[error(transparent)]
    Store(AuditError),
    #[error("cannot connect to PostgreSQL: {0}")]
    Connect(ConnectError),
    #[error(transparent)]
    Db(#[from] PgAuditError),
    #[error(
        "shard {shard} in the database ends at record {seq} with hash {hash}, which this store does not have at that record: it holds another chain; use another --shard or database"
    )]
    OtherChain { shard: String, seq: u64, hash: String },
}

/// What a migration did.
#[derive(Debug, Clone)]
pub struct Migrated {
    pub schema_version: i32,
    /// Records in the local store.
    pub records: usize,
    /// Records the shard held already (the copy resumed after them).
    pub already: u64,
    pub copied: usize,
    /// The shard's chain, verified in the database after the copy.
    pub verified: VerifyReport,
    pub local_head: Option<String>,
    pub db_head: Option<String>,
}

impl Migrated {
    /// The copy verifies and ends where the store does.
    pub fn ok(&self) -> bool {
        self.verified.ok && self.local_head == self.db_head
    }
}

/// Copy the record log of `data_dir` into `shard`; `progress(copied, of)`
/// every 20,000 records.
pub async fn to_postgres(
    data_dir: &Path,
    url: &str,
    ca_file: Option<&Path>,
    shard: &str,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Migrated, MigrateError> {
    // The store must not be in use: opening it takes its lock.
    drop(
        AuditStore::open(data_dir, std::sync::Arc::new(nightshift_proto::clock::SystemClock))
            .map_err(MigrateError::InUse)?,
    );
    let records = crate::log_records(data_dir).map_err(MigrateError::Store)?;
    let mut db = pg::connect(url, ca_file).await.map_err(MigrateError::Connect)?;
    let schema_version = pg::migrate_schema(&mut db).await?;
    let already = match pg::head(&db, shard).await? {
        None => 0,
        Some((seq, hash)) => match records.get((seq as usize).saturating_sub(1)) {
            Some((r, _)) if r.hash == hash && seq > 0 => seq,
            _ => return Err(MigrateError::OtherChain { shard: shard.into(), seq, hash }),
        },
    };
    let todo = &records[already as usize..];
    for (i, batch) in todo.chunks(BATCH).enumerate() {
        pg::append(&db, shard, batch, None).await?;
        if i % 20 == 19 {
            progress((i + 1) * BATCH, todo.len());
        }
    }
    let verified = pg::verify(&db, shard).await?;
    let db_head = pg::head(&db, shard).await?.map(|(_, h)| h);
    Ok(Migrated {
        schema_version,
        records: records.len(),
        already,
        copied: todo.len(),
        verified,
        local_head: records.last().map(|(r, _)| r.hash.clone()),
        db_head,
    })
}
