//! The engine's doors to PostgreSQL besides the chain's own writer (issue
//! 44: the audit store is the only door to the database — the engine holds
//! none of its clients): [`LeaseDb`], one loop's connection for the lease
//! (campaign, renew, hand back, announce, the modes a new leader adopts),
//! and [`PgReads`], the API's shared connection for reads across shards.
//! Each is made when first needed and made again after it broke; neither
//! hands out the client.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;

use crate::ha::{EngineRow, LeaseConfig, LeaseError, LeaseRow, ShardRow};
use crate::pg::{PgAuditError, ShardRunPage};
use crate::{PgOptions, RunFilter, VerifyReport};

/// Where the database is (the URL is never logged, nor shown by `Debug`).
#[derive(Clone)]
struct Target {
    url: String,
    ca_file: Option<std::path::PathBuf>,
}

impl Target {
    fn of(pg: &PgOptions) -> Target {
        Target { url: pg.url.clone(), ca_file: pg.ca_file.clone() }
    }

    async fn connect(&self, within: Duration) -> Result<Client, String> {
        match tokio::time::timeout(within, crate::pg::connect(&self.url, self.ca_file.as_deref())).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("postgres: no connection within {} ms", within.as_millis())),
        }
    }
}

/// One loop's connection for the shard's lease, owned by that loop (a
/// clone shares the connection, as the lease loop shares it with its
/// renewals). Calls made while not connected fail with
/// [`LeaseError::NotConnected`]: the caller decides when to
/// [`connect_within`](LeaseDb::connect_within) and how long it may take.
#[derive(Clone)]
pub struct LeaseDb {
    target: Target,
    conn: Option<Arc<Client>>,
}

impl std::fmt::Debug for LeaseDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseDb").field("connected", &self.is_connected()).finish()
    }
}

impl LeaseDb {
    /// Not connected yet.
    pub fn new(pg: &PgOptions) -> LeaseDb {
        LeaseDb { target: Target::of(pg), conn: None }
    }

    /// A connection is held and has not closed.
    pub fn is_connected(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| !c.is_closed())
    }

    /// Connect unless a live connection is held, within `within`. `Ok` when
    /// connected (already, or now).
    pub async fn connect_within(&mut self, within: Duration) -> Result<(), String> {
        if self.is_connected() {
            return Ok(());
        }
        self.conn = None;
        self.conn = Some(Arc::new(self.target.connect(within).await?));
        Ok(())
    }

    /// Drop the connection after an error: the next
    /// [`connect_within`](LeaseDb::connect_within) makes a new one.
    pub fn forget(&mut self) {
        self.conn = None;
    }

    fn client(&self) -> Result<&Client, LeaseError> {
        self.conn.as_deref().ok_or(LeaseError::NotConnected)
    }

    /// [`crate::ha::campaign`].
    pub async fn campaign(&self, cfg: &LeaseConfig) -> Result<Option<u64>, LeaseError> {
        crate::ha::campaign(self.client()?, cfg).await
    }

    /// [`crate::ha::renew`].
    pub async fn renew(&self, cfg: &LeaseConfig, term: u64) -> Result<bool, LeaseError> {
        crate::ha::renew(self.client()?, cfg, term).await
    }

    /// [`crate::ha::release`].
    pub async fn release(&self, cfg: &LeaseConfig, term: u64) -> Result<(), LeaseError> {
        crate::ha::release(self.client()?, cfg, term).await
    }

    /// [`crate::ha::lease_row`].
    pub async fn lease_row(&self, shard: &str) -> Result<Option<LeaseRow>, LeaseError> {
        crate::ha::lease_row(self.client()?, shard).await
    }

    /// [`crate::ha::announce`].
    pub async fn announce(&self, cfg: &LeaseConfig, role: &str, term: u64) -> Result<(), LeaseError> {
        crate::ha::announce(self.client()?, cfg, role, term).await
    }

    /// [`crate::pg::runbook_modes`]: what the last leader was told holds.
    pub async fn runbook_modes(&self, shard: &str) -> Result<BTreeMap<String, String>, String> {
        let c = self.client().map_err(|e| e.to_string())?;
        crate::pg::runbook_modes(c, shard).await.map_err(|e| e.to_string())
    }
}

/// The API's connection for reading the database: one, shared by every
/// request, made again (within 5 s) when it broke.
pub struct PgReads {
    target: Target,
    held: tokio::sync::Mutex<Option<Arc<Client>>>,
}

impl std::fmt::Debug for PgReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgReads").finish_non_exhaustive()
    }
}

/// What a read through [`PgReads`] met: the text says which.
fn text(e: PgAuditError) -> String {
    e.to_string()
}

impl PgReads {
    pub(crate) fn new(pg: &PgOptions) -> PgReads {
        PgReads { target: Target::of(pg), held: tokio::sync::Mutex::new(None) }
    }

    async fn client(&self) -> Result<Arc<Client>, String> {
        let mut held = self.held.lock().await;
        if let Some(c) = held.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let c = Arc::new(self.target.connect(Duration::from_secs(5)).await?);
        *held = Some(c.clone());
        Ok(c)
    }

    /// [`crate::pg::runs`]: one shard's runs or (`None`) every shard's.
    pub async fn runs(&self, f: &RunFilter, shard: Option<&str>) -> Result<ShardRunPage, String> {
        crate::pg::runs(&*self.client().await?, f, shard).await.map_err(text)
    }

    /// Every shard's chain in the database verified, each by name.
    pub async fn verify_shards(&self) -> Result<BTreeMap<String, VerifyReport>, String> {
        let db = self.client().await?;
        let mut out = BTreeMap::new();
        for shard in crate::pg::shards(&db).await.map_err(text)? {
            let r = crate::pg::verify(&db, &shard).await.map_err(text)?;
            out.insert(shard, r);
        }
        Ok(out)
    }

    /// [`crate::ha::shards`]: who leads each shard, at what term, its head.
    pub async fn shards(&self) -> Result<Vec<ShardRow>, String> {
        crate::ha::shards(&*self.client().await?).await.map_err(|e| e.to_string())
    }

    /// [`crate::ha::engines`]: every engine, as each last announced itself.
    pub async fn engines(&self) -> Result<Vec<EngineRow>, String> {
        crate::ha::engines(&*self.client().await?).await.map_err(|e| e.to_string())
    }
}
