//! The audit chain in PostgreSQL: connecting (TLS checked against a CA
//! file), the schema and its versioned migrations, appends that keep the
//! chain (a group lands only after the stored record its first one links
//! to, and optionally only while the writer's lease term holds), the reads
//! a standby follows with, `verify`, and the copy of a sled store into it
//! (`nightshift audit migrate`). Each record is kept as the exact JSON line
//! the record log holds (and the exact run summary it vouches for), so its
//! hash recomputes from the stored text; the columns beside it are for
//! queries. The engine's writer thread on it is `pgwriter.rs`.

use tokio_postgres::Client;

use super::{AuditRecord, GENESIS, LoggedRecord, VerifyReport};
use crate::ha::LeaseConfig;

/// Why a PostgreSQL audit operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PgAuditError {
    #[error("postgres: {}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("the database's audit schema is version {found}; this nightshift knows up to {known}: upgrade nightshift")]
    SchemaTooNew { found: i32, known: i32 },
    #[error("record {seq}: {message}")]
    Record { seq: u64, message: String },
    #[error("record {seq} was not written: {why}")]
    NotAppended { seq: u64, why: String },
}

pub use crate::ha::describe;

/// The schema, one step per version; step N takes version N-1 to N.
const MIGRATIONS: &[&str] = &[
    // 1: records and run summaries, per shard.
    "CREATE TABLE nightshift_audit (
         shard     text   NOT NULL,
         seq       bigint NOT NULL,
         ts_ms     bigint NOT NULL,
         kind      text   NOT NULL,
         run       text,
         node      text,
         gpu       integer,
         runbook   text,
         actor     text   NOT NULL,
         prev_hash text   NOT NULL,
         hash      text   NOT NULL,
         record    text   NOT NULL,
         PRIMARY KEY (shard, seq)
     );
     CREATE INDEX nightshift_audit_run ON nightshift_audit (shard, run, seq) WHERE run IS NOT NULL;
     CREATE INDEX nightshift_audit_node ON nightshift_audit (shard, node, ts_ms) WHERE node IS NOT NULL;
     CREATE TABLE nightshift_run_summary (
         shard   text NOT NULL,
         run     text NOT NULL,
         summary text NOT NULL,
         PRIMARY KEY (shard, run)
     );",
    // 2: the exact bytes of the run summary each record vouches for, so a
    // standby's copy indexes every record as the leader wrote it.
    "ALTER TABLE nightshift_audit ADD COLUMN summary text;",
    // 3: the runbook modes an admin set, read by each new leader.
    "CREATE INDEX nightshift_audit_mode ON nightshift_audit (shard, seq) WHERE kind = 'runbook_mode';",
    // 4: run summaries as columns, for the runs of every shard in SQL.
    "ALTER TABLE nightshift_run_summary
         ADD COLUMN created_ms bigint, ADD COLUMN runbook text, ADD COLUMN state text,
         ADD COLUMN outcome text, ADD COLUMN node text, ADD COLUMN gpu integer, ADD COLUMN nodes jsonb;
     UPDATE nightshift_run_summary SET
         created_ms = (summary::jsonb->>'created_ms')::bigint, runbook = summary::jsonb->>'runbook',
         state = summary::jsonb->>'state', outcome = summary::jsonb->>'outcome',
         node = summary::jsonb->'target'->>'node', gpu = (summary::jsonb->'target'->>'gpu')::integer,
         nodes = COALESCE(summary::jsonb->'nodes', '[]'::jsonb);
     CREATE INDEX nightshift_run_created ON nightshift_run_summary (created_ms DESC, shard DESC, run DESC);",
];

/// Bring the schema to the newest version this build knows (idempotent;
/// one transaction per step; refuses a schema newer than it knows).
pub async fn migrate_schema(db: &mut Client) -> Result<i32, PgAuditError> {
    // Engines starting together migrate one at a time (a concurrent
    // `CREATE TABLE IF NOT EXISTS` can fail on the catalog's unique index).
    db.batch_execute("SELECT pg_advisory_lock(7465847)").await?;
    let r = migrate_locked(db).await;
    let _ = db.batch_execute("SELECT pg_advisory_unlock(7465847)").await;
    r
}

async fn migrate_locked(db: &mut Client) -> Result<i32, PgAuditError> {
    db.batch_execute("CREATE TABLE IF NOT EXISTS nightshift_schema (version integer NOT NULL)").await?;
    crate::ha::migrate(db).await.map_err(|e| match e {
        crate::ha::LeaseError::Db(d) => PgAuditError::Db(d),
        other => PgAuditError::Record { seq: 0, message: other.to_string() },
    })?;
    let known = MIGRATIONS.len() as i32;
    loop {
        let tx = db.transaction().await?;
        tx.batch_execute("LOCK TABLE nightshift_schema IN EXCLUSIVE MODE").await?;
        let version: i32 =
            tx.query_opt("SELECT version FROM nightshift_schema", &[]).await?.map(|r| r.get(0)).unwrap_or(0);
        if version > known {
            return Err(PgAuditError::SchemaTooNew { found: version, known });
        }
        if version == known {
            tx.commit().await?;
            return Ok(version);
        }
        tx.batch_execute(MIGRATIONS[version as usize]).await?;
        if version == 0 {
            tx.execute("INSERT INTO nightshift_schema (version) VALUES (1)", &[]).await?;
        } else {
            tx.execute("UPDATE nightshift_schema SET version = $1", &[&(version + 1)]).await?;
        }
        tx.commit().await?;
    }
}

/// The newest record of a shard: `(seq, hash)`.
pub async fn head(db: &Client, shard: &str) -> Result<Option<(u64, String)>, PgAuditError> {
    Ok(db
        .query_opt("SELECT seq, hash FROM nightshift_audit WHERE shard = $1 ORDER BY seq DESC LIMIT 1", &[&shard])
        .await?
        .map(|r| (r.get::<_, i64>(0) as u64, r.get(1))))
}

/// Append chained records (and the run summaries they vouch for) in one
/// statement, whatever their number. The group lands
/// only if it continues the chain — its first record after the genesis
/// hash or after a stored record whose hash is its `prev_hash`, each later
/// one after the one before it (checked here, and by the primary key) —
/// and, with `lease`, only while that lease at `term` holds: the lease row
/// is read `FOR SHARE` in the same statement, so a takeover's update of it
/// waits for this commit, and a commit after a takeover finds no row.
/// Committed (synchronous_commit on) before this returns.
pub async fn append(
    db: &Client,
    shard: &str,
    records: &[LoggedRecord],
    lease: Option<(&LeaseConfig, u64)>,
) -> Result<(), PgAuditError> {
    append_with(&mut Appender::default(), db, shard, records, lease).await
}

/// [`append`] with the statement prepared once per connection.
pub async fn append_with(
    appender: &mut Appender,
    db: &Client,
    shard: &str,
    records: &[LoggedRecord],
    lease: Option<(&LeaseConfig, u64)>,
) -> Result<(), PgAuditError> {
    let Some((first, _)) = records.first() else { return Ok(()) };
    for pair in records.windows(2) {
        let (a, b) = (&pair[0].0, &pair[1].0);
        if b.seq != a.seq + 1 || b.prev_hash != a.hash {
            return Err(PgAuditError::NotAppended {
                seq: b.seq,
                why: format!("it does not follow record {} in the group", a.seq),
            });
        }
    }
    let mut c = Columns::default();
    // The newest summary of each run the group changes.
    let mut summaries: std::collections::BTreeMap<&str, String> = Default::default();
    for (r, summary) in records {
        let line = serde_json::to_string(r).map_err(|e| PgAuditError::Record { seq: r.seq, message: e.to_string() })?;
        let summary_text = summary.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
        if let (Some(run), Some(text)) = (&r.run, &summary_text) {
            summaries.insert(run.as_str(), text.clone());
        }
        c.seq.push(r.seq as i64);
        c.ts_ms.push(r.ts_ms);
        c.kind.push(r.kind.as_str());
        c.run.push(r.run.as_deref());
        c.node.push(r.node.as_deref());
        c.gpu.push(r.gpu.map(|g| g as i32));
        c.runbook.push(r.runbook.as_deref());
        c.actor.push(&r.actor);
        c.prev_hash.push(&r.prev_hash);
        c.hash.push(&r.hash);
        c.record.push(line);
        c.summary.push(summary_text);
    }
    let (runs, texts): (Vec<&str>, Vec<String>) = summaries.into_iter().unzip();
    let (first_seq, first_prev, count) = (first.seq as i64, first.prev_hash.as_str(), records.len() as i64);
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
        &shard,
        &c.seq,
        &c.ts_ms,
        &c.kind,
        &c.run,
        &c.node,
        &c.gpu,
        &c.runbook,
        &c.actor,
        &c.prev_hash,
        &c.hash,
        &c.record,
        &c.summary,
        &first_seq,
        &first_prev,
        &runs,
        &texts,
        &count,
    ];
    let term_i;
    if let Some((cfg, term)) = lease {
        term_i = term as i64;
        params.extend([&cfg.shard as &(dyn tokio_postgres::types::ToSql + Sync), &cfg.holder, &term_i]);
    }
    let stmt = appender.statement(db, lease.is_some()).await?;
    let n: i64 = match db.query_one(&stmt, &params).await {
        Ok(row) => row.get(0),
        // Another writer's record at this place: not ours to continue.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => 0,
        Err(e) => return Err(e.into()),
    };
    if n != count {
        let why = if lease.is_some() {
            "it does not continue the stored chain, or this engine no longer holds the lease (deposed)"
        } else {
            "it does not continue the stored chain"
        };
        return Err(PgAuditError::NotAppended { seq: first.seq, why: why.into() });
    }
    Ok(())
}

/// A group of records, column by column (the statement's arrays).
#[derive(Default)]
struct Columns<'a> {
    seq: Vec<i64>,
    ts_ms: Vec<i64>,
    kind: Vec<&'a str>,
    run: Vec<Option<&'a str>>,
    node: Vec<Option<&'a str>>,
    gpu: Vec<Option<i32>>,
    runbook: Vec<Option<&'a str>>,
    actor: Vec<&'a str>,
    prev_hash: Vec<&'a str>,
    hash: Vec<&'a str>,
    record: Vec<String>,
    summary: Vec<Option<String>>,
}

/// The append statement, prepared once per connection (a new connection
/// needs a new `Appender`).
#[derive(Default)]
pub struct Appender {
    plain: Option<tokio_postgres::Statement>,
    fenced: Option<tokio_postgres::Statement>,
}

impl Appender {
    async fn statement(&mut self, db: &Client, fenced: bool) -> Result<tokio_postgres::Statement, PgAuditError> {
        let slot = if fenced { &mut self.fenced } else { &mut self.plain };
        if let Some(s) = slot {
            return Ok(s.clone());
        }
        let (lease_rows, fence) = if fenced {
            (
                "lease AS (SELECT 1 FROM nightshift_lease WHERE shard = $19 AND holder = $20 AND term = $21 AND expires_at > now() FOR SHARE),",
                " AND EXISTS (SELECT 1 FROM lease)",
            )
        } else {
            ("", "")
        };
        // One statement, so one round trip and its own transaction: the
        // records land, and the summaries only if all of them did.
        let sql = format!(
            "WITH {lease_rows}
             rows AS (
                 SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::integer[],
                                      $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[])
                     AS u(seq, ts_ms, kind, run, node, gpu, runbook, actor, prev_hash, hash, record, summary)),
             ins AS (
                 INSERT INTO nightshift_audit (shard, seq, ts_ms, kind, run, node, gpu, runbook, actor, prev_hash, hash, record, summary)
                 SELECT $1, seq, ts_ms, kind, run, node, gpu, runbook, actor, prev_hash, hash, record, summary FROM rows
                 WHERE ((CAST($14 AS bigint) = 1 AND $15::text = '{GENESIS}')
                        OR EXISTS (SELECT 1 FROM nightshift_audit p WHERE p.shard = $1 AND p.seq = CAST($14 AS bigint) - 1 AND p.hash = $15::text)){fence}
                 RETURNING 1),
             sums AS (
                 INSERT INTO nightshift_run_summary (shard, run, summary, created_ms, runbook, state, outcome, node, gpu, nodes)
                 SELECT $1, r, s, (j->>'created_ms')::bigint, j->>'runbook', j->>'state', j->>'outcome',
                        j->'target'->>'node', (j->'target'->>'gpu')::integer, COALESCE(j->'nodes', '[]'::jsonb)
                 FROM (SELECT r, s, s::jsonb AS j FROM unnest($16::text[], $17::text[]) AS u(r, s)) AS v
                 WHERE (SELECT count(*) FROM ins) = $18::bigint
                 ON CONFLICT (shard, run) DO UPDATE SET summary = EXCLUDED.summary, created_ms = EXCLUDED.created_ms,
                     runbook = EXCLUDED.runbook, state = EXCLUDED.state, outcome = EXCLUDED.outcome,
                     node = EXCLUDED.node, gpu = EXCLUDED.gpu, nodes = EXCLUDED.nodes
                 RETURNING 1)
             SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM sums)"
        );
        let s = db.prepare(&sql).await?;
        *slot = Some(s.clone());
        Ok(s)
    }
}

/// Records of a shard after `after_seq`, oldest first, at most `limit`,
/// each with the exact bytes of the run summary it vouches for (what a
/// standby's copy indexes).
pub async fn records_after(
    db: &Client,
    shard: &str,
    after_seq: u64,
    limit: i64,
) -> Result<Vec<LoggedRecord>, PgAuditError> {
    let rows = db
        .query(
            "SELECT seq, record, summary FROM nightshift_audit WHERE shard = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            &[&shard, &(after_seq as i64), &limit],
        )
        .await?;
    rows.into_iter()
        .map(|row| {
            let (seq, line, summary): (i64, String, Option<String>) = (row.get(0), row.get(1), row.get(2));
            let r: AuditRecord = serde_json::from_str(&line).map_err(|e| PgAuditError::Record {
                seq: seq as u64,
                message: format!("not a readable record: {e}"),
            })?;
            Ok((r, summary.map(String::into_bytes)))
        })
        .collect()
}

/// The mode each runbook was last promoted or demoted to in a shard
/// (`runbook_mode` records, oldest first, so the newest wins).
pub async fn runbook_modes(
    db: &Client,
    shard: &str,
) -> Result<std::collections::BTreeMap<String, String>, PgAuditError> {
    let rows = db
        .query(
            "SELECT runbook, record FROM nightshift_audit WHERE shard = $1 AND kind = 'runbook_mode' ORDER BY seq",
            &[&shard],
        )
        .await?;
    let mut out = std::collections::BTreeMap::new();
    for row in rows {
        let (runbook, line): (Option<String>, String) = (row.get(0), row.get(1));
        let to =
            serde_json::from_str::<AuditRecord>(&line).ok().and_then(|r| r.data["to"].as_str().map(str::to_string));
        if let (Some(runbook), Some(to)) = (runbook, to) {
            out.insert(runbook, to);
        }
    }
    Ok(out)
}

/// A run of some shard, as the runs of every shard list it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShardRun {
    pub shard: String,
    pub run: crate::runs::RunSummary,
}

/// A page of every shard's runs, newest first.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShardRunPage {
    pub runs: Vec<ShardRun>,
    /// Pass back as `cursor` for the next (older) page.
    pub next_cursor: Option<String>,
}

/// The runs of one shard or (`None`) every shard, newest first, filtered in
/// SQL as the single engine's listing filters (node: the target or any node the run touched;
/// gpu, runbook, outcome, state, created between since and until), a page
/// at a time (the cursor is the last run's `created_ms/shard/run`).
pub async fn runs(db: &Client, f: &super::RunFilter, shard: Option<&str>) -> Result<ShardRunPage, PgAuditError> {
    let limit = f.limit.unwrap_or(50).clamp(1, 1000) as i64;
    let cursor = match &f.cursor {
        Some(c) => {
            let mut parts = c.splitn(3, '/');
            let created = parts.next().and_then(|x| x.parse::<i64>().ok());
            match (created, parts.next(), parts.next()) {
                (Some(t), Some(shard), Some(run)) => Some((t, shard.to_string(), run.to_string())),
                _ => {
                    return Err(PgAuditError::Record {
                        seq: 0,
                        message: format!("cursor {c:?}: expected CREATED_MS/SHARD/RUN as this server gave it out"),
                    });
                }
            }
        }
        None => None,
    };
    let outcome = f.outcome.map(|o| o.as_str().to_string());
    let state = f.state.and_then(|s| serde_json::to_value(s).ok().and_then(|v| v.as_str().map(str::to_string)));
    let gpu = f.gpu.map(|g| g as i32);
    let (c_t, c_shard, c_run) = match &cursor {
        Some((t, s, r)) => (Some(*t), Some(s.as_str()), Some(r.as_str())),
        None => (None, None, None),
    };
    let rows = db
        .query(
            "SELECT shard, run, summary, created_ms FROM nightshift_run_summary
             WHERE ($1::text IS NULL OR node = $1 OR nodes ? $1)
               AND ($2::integer IS NULL OR gpu = $2)
               AND ($3::text IS NULL OR runbook = $3)
               AND ($4::text IS NULL OR outcome = $4)
               AND ($5::text IS NULL OR state = $5)
               AND ($6::bigint IS NULL OR created_ms >= $6)
               AND ($7::bigint IS NULL OR created_ms <= $7)
               AND ($8::bigint IS NULL OR (created_ms, shard, run) < ($8, $9::text, $10::text))
               AND ($12::text IS NULL OR shard = $12)
               AND ($13::text[] IS NULL OR node = ANY($13) OR nodes ?| $13)
             ORDER BY created_ms DESC, shard DESC, run DESC
             LIMIT $11",
            &[
                &f.node,
                &gpu,
                &f.runbook,
                &outcome,
                &state,
                &f.since_ms,
                &f.until_ms,
                &c_t,
                &c_shard,
                &c_run,
                &(limit + 1),
                &shard,
                &f.nodes_any,
            ],
        )
        .await?;
    let next_cursor = (rows.len() as i64 > limit).then(|| {
        let last = &rows[limit as usize - 1];
        format!("{}/{}/{}", last.get::<_, i64>(3), last.get::<_, String>(0), last.get::<_, String>(1))
    });
    let mut runs = Vec::with_capacity(rows.len());
    for row in rows.iter().take(limit as usize) {
        let (shard, run, text): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        match serde_json::from_str::<crate::runs::RunSummary>(&text) {
            Ok(r) => runs.push(ShardRun { shard, run: r }),
            Err(e) => {
                tracing::error!(shard = %shard, run = %run, error = %e, "a run summary cannot be read; left out of the listing")
            }
        }
    }
    Ok(ShardRunPage { runs, next_cursor })
}

/// The hash of a shard's record `seq`, if it is stored.
pub async fn hash_at(db: &Client, shard: &str, seq: u64) -> Result<Option<String>, PgAuditError> {
    Ok(db
        .query_opt("SELECT hash FROM nightshift_audit WHERE shard = $1 AND seq = $2", &[&shard, &(seq as i64)])
        .await?
        .map(|r| r.get(0)))
}

/// Every shard the database holds records of.
pub async fn shards(db: &Client) -> Result<Vec<String>, PgAuditError> {
    Ok(db
        .query("SELECT DISTINCT shard FROM nightshift_audit ORDER BY shard", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Why the database could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("postgres: {}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error(
        "postgres: the connection URL is not valid: {0} (expected postgres://USER@HOST:PORT/DB?sslmode=disable|prefer|require)"
    )]
    Url(tokio_postgres::Error),
    #[error("postgres TLS: cannot read the CA file {path}: {message}")]
    Ca { path: String, message: String },
}

/// Connect to `url` (a libpq URL or key=value string), with TLS when the
/// URL asks for it (`sslmode=require`): the server's certificate is checked
/// against `ca_file` (PEM) if given, else against the public web roots.
/// The connection is driven by a task on the current runtime; it ends when
/// the client is dropped.
pub async fn connect(url: &str, ca_file: Option<&std::path::Path>) -> Result<Client, ConnectError> {
    let config: tokio_postgres::Config = url.parse().map_err(ConnectError::Url)?;
    if config.get_ssl_mode() == tokio_postgres::config::SslMode::Disable {
        let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "postgres connection ended");
            }
        });
        return Ok(client);
    }
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            use rustls_pki_types::pem::PemObject;
            let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| ConnectError::Ca { path: path.display().to_string(), message: e.to_string() })?;
            if certs.is_empty() {
                return Err(ConnectError::Ca {
                    path: path.display().to_string(),
                    message: "expected PEM certificates (-----BEGIN CERTIFICATE-----), found none".into(),
                });
            }
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| ConnectError::Ca { path: path.display().to_string(), message: e.to_string() })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConnectError::Ca { path: "(built-in)".into(), message: e.to_string() })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let (client, conn) = config.connect(tokio_postgres_rustls::MakeRustlsConnect::new(tls)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "postgres connection ended");
        }
    });
    Ok(client)
}

/// Walk a shard's chain in the database: every stored line parses, hashes
/// to its `hash`, and links to the one before; the columns agree with the
/// line.
pub async fn verify(db: &Client, shard: &str) -> Result<VerifyReport, PgAuditError> {
    // No salvage in a database: nothing is excused.
    let none = std::collections::HashMap::new();
    let mut walk = crate::chain::Walk::new(&none);
    let mut after = 0i64;
    let mut records = 0u64;
    let bad = |seq: u64, verified: u64, records: u64, problem: String| VerifyReport {
        ok: false,
        verified_up_to: verified,
        records,
        first_bad_seq: Some(seq),
        problem: Some(problem),
        excused: Vec::new(),
        notes: Vec::new(),
    };
    loop {
        let rows = db
            .query(
                "SELECT seq, hash, record FROM nightshift_audit WHERE shard = $1 AND seq > $2 ORDER BY seq LIMIT 10000",
                &[&shard, &after],
            )
            .await?;
        if rows.is_empty() {
            break;
        }
        for row in rows {
            let (seq, hash, line): (i64, String, String) = (row.get(0), row.get(1), row.get(2));
            let seq = seq as u64;
            records += 1;
            let r: AuditRecord = match serde_json::from_str(&line) {
                Ok(r) => r,
                Err(e) => return Ok(bad(seq, seq - 1, records, format!("record {seq} is not a readable record: {e}"))),
            };
            if r.seq != seq || r.hash != hash {
                return Ok(bad(
                    seq,
                    seq - 1,
                    records,
                    format!("record {seq}: its columns disagree with its stored line"),
                ));
            }
            if let Err(b) = walk.check(&r) {
                return Ok(bad(b.seq(), walk.verified_up_to(), records, b.to_string()));
            }
            after = seq as i64;
        }
    }
    Ok(VerifyReport {
        ok: true,
        verified_up_to: walk.verified_up_to(),
        records,
        first_bad_seq: None,
        problem: None,
        excused: Vec::new(),
        notes: Vec::new(),
    })
}
