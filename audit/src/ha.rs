//! High availability on PostgreSQL: the leader lease with a fencing term.
//! Engines of one shard campaign for one lease row; its expiry is kept by
//! the *database's* clock, so engines' clocks do not matter. Taking the
//! lease over bumps the term. A write is fenced by making it conditional, in
//! its own statement, on the writer's term still holding the lease
//! (`audit/pg.rs::append_with` reads the row `FOR SHARE`): a deposed or
//! paused leader's write changes nothing, so it cannot record an intent and
//! therefore cannot act. [`Leadership`] is what the rest of the engine
//! reads: the term to fence and to send, the known leader, deposition. The
//! loop that campaigns, renews and steps down is `serve.rs::lease_loop`;
//! docs/HA.md tells the whole story.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::types::Type;

/// A database error with what the server said (tokio-postgres's own
/// message is only "db error").
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => {
            format!("{} ({}){}", d.message(), d.code().code(), d.detail().map(|x| format!(": {x}")).unwrap_or_default())
        }
        None => match std::error::Error::source(e) {
            Some(s) => format!("{e}: {s}"),
            None => e.to_string(),
        },
    }
}

/// Why a lease operation failed (the database, not the campaign: losing
/// is an answer, not an error).
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("the lease table: {}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error(
        "lease: expected a TTL of 1 s to 10 min and a renew interval below it, found ttl {ttl_ms} ms and renew {renew_ms} ms"
    )]
    Config { ttl_ms: u64, renew_ms: u64 },
    #[error("the lease table: not connected to the database (connect first)")]
    NotConnected,
}

/// One engine's part in a shard's election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The fleet partition this lease governs.
    pub shard: String,
    /// This engine (host name and a start id, say).
    pub holder: String,
    pub ttl: Duration,
    pub renew_every: Duration,
    /// Where this engine's API answers (standbys forward writes there);
    /// empty when unknown.
    pub url: String,
}

impl LeaseConfig {
    /// TTL 5 s, renewed every second.
    pub fn new(shard: &str, holder: &str) -> LeaseConfig {
        LeaseConfig {
            shard: shard.into(),
            holder: holder.into(),
            ttl: Duration::from_secs(5),
            renew_every: Duration::from_secs(1),
            url: String::new(),
        }
    }

    pub fn check(&self) -> Result<(), LeaseError> {
        let (ttl_ms, renew_ms) = (self.ttl.as_millis() as u64, self.renew_every.as_millis() as u64);
        if !(1_000..=600_000).contains(&ttl_ms) || renew_ms == 0 || renew_ms >= ttl_ms {
            return Err(LeaseError::Config { ttl_ms, renew_ms });
        }
        Ok(())
    }
}

/// Create the lease table if it is missing (idempotent).
pub async fn migrate(db: &Client) -> Result<(), LeaseError> {
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS nightshift_lease (
             shard      text PRIMARY KEY,
             holder     text NOT NULL,
             term       bigint NOT NULL,
             expires_at timestamptz NOT NULL
         );
         ALTER TABLE nightshift_lease ADD COLUMN IF NOT EXISTS url text NOT NULL DEFAULT '';
         CREATE TABLE IF NOT EXISTS nightshift_engines (
             shard   text NOT NULL,
             holder  text NOT NULL,
             url     text NOT NULL DEFAULT '',
             role    text NOT NULL,
             term    bigint NOT NULL DEFAULT 0,
             seen_at timestamptz NOT NULL,
             PRIMARY KEY (shard, holder)
         )",
    )
    .await?;
    Ok(())
}

/// Take the lease if it is free, expired, or already ours. Returns the term
/// held, or `None` while another engine holds it. Taking it from someone
/// else (or for the first time) starts a new term; keeping our own renews
/// it at the same term.
pub async fn campaign(db: &Client, cfg: &LeaseConfig) -> Result<Option<u64>, LeaseError> {
    cfg.check()?;
    let ttl_ms = cfg.ttl.as_millis() as i64;
    let row = db
        .query_typed_opt(
            "INSERT INTO nightshift_lease AS l (shard, holder, term, expires_at, url)
                 VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond', $4)
             ON CONFLICT (shard) DO UPDATE SET
                 holder = EXCLUDED.holder,
                 url = EXCLUDED.url,
                 term = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now() THEN l.term ELSE l.term + 1 END,
                 expires_at = EXCLUDED.expires_at
             WHERE l.holder = EXCLUDED.holder OR l.expires_at <= now()
             RETURNING term",
            &[
                (&cfg.shard, Type::TEXT),
                (&cfg.holder, Type::TEXT),
                (&(ttl_ms as f64), Type::FLOAT8),
                (&cfg.url, Type::TEXT),
            ],
        )
        .await?;
    Ok(row.map(|r| r.get::<_, i64>(0) as u64))
}

/// Renew the lease at `term`. False: the lease expired and someone else
/// took it (or it moved on) — this engine is deposed and must stop acting.
/// Each renewal writes this engine's URL again: a row changed by hand (to
/// send the standbys' forwarded requests elsewhere) lasts one renewal.
pub async fn renew(db: &Client, cfg: &LeaseConfig, term: u64) -> Result<bool, LeaseError> {
    let ttl_ms = cfg.ttl.as_millis() as i64;
    // Typed: one round trip, no separate prepare (a leader far from its
    // database renews in one RTT, not two).
    let n = db
        .execute_typed(
            "UPDATE nightshift_lease SET expires_at = now() + $4 * interval '1 millisecond', url = $5
             WHERE shard = $1 AND holder = $2 AND term = $3 AND expires_at > now()",
            &[
                (&cfg.shard, Type::TEXT),
                (&cfg.holder, Type::TEXT),
                (&(term as i64), Type::INT8),
                (&(ttl_ms as f64), Type::FLOAT8),
                (&cfg.url, Type::TEXT),
            ],
        )
        .await?;
    Ok(n == 1)
}

/// Hand the lease at `term` back (it expires now): a standby takes over at
/// its next campaign instead of after the TTL.
pub async fn release(db: &Client, cfg: &LeaseConfig, term: u64) -> Result<(), LeaseError> {
    db.execute(
        "UPDATE nightshift_lease SET expires_at = now() WHERE shard = $1 AND holder = $2 AND term = $3",
        &[&cfg.shard, &cfg.holder, &(term as i64)],
    )
    .await?;
    Ok(())
}

/// The SQL condition that fences a write: put it in the write's `WHERE`
/// (or check it in the same transaction) with the shard, holder and term
/// as parameters `$shard`, `$holder`, `$term`.
pub fn fence_condition(shard: usize, holder: usize, term: usize) -> String {
    format!(
        "EXISTS (SELECT 1 FROM nightshift_lease WHERE shard = ${shard} AND holder = ${holder} AND term = ${term} AND expires_at > now())"
    )
}

/// Who holds a shard's lease now, at what term, and for how many more
/// milliseconds (negative: expired).
pub async fn holder(db: &Client, shard: &str) -> Result<Option<(String, u64, i64)>, LeaseError> {
    Ok(lease_row(db, shard).await?.map(|l| (l.holder, l.term, l.expires_in_ms)))
}

/// A shard's lease row as the database has it now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LeaseRow {
    pub holder: String,
    pub term: u64,
    /// Milliseconds left by the database's clock (negative: expired).
    pub expires_in_ms: i64,
    /// The holder's API address (may be empty).
    pub url: String,
}

/// [`holder`] with the holder's address.
pub async fn lease_row(db: &Client, shard: &str) -> Result<Option<LeaseRow>, LeaseError> {
    let row = db
        .query_opt(
            "SELECT holder, term, (extract(epoch FROM (expires_at - now())) * 1000)::bigint, url
             FROM nightshift_lease WHERE shard = $1",
            &[&shard],
        )
        .await?;
    Ok(row.map(|r| LeaseRow {
        holder: r.get(0),
        term: r.get::<_, i64>(1) as u64,
        expires_in_ms: r.get(2),
        url: r.get(3),
    }))
}

/// One shard of a database: its lease and its chain's head.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ShardRow {
    pub shard: String,
    pub holder: String,
    pub term: u64,
    /// Milliseconds left on the lease (negative: expired, no leader).
    pub expires_in_ms: i64,
    pub url: String,
    /// The newest record of the shard's chain (0: none).
    pub head_seq: u64,
}

/// Every shard with a lease in the database (each running shard has one).
pub async fn shards(db: &Client) -> Result<Vec<ShardRow>, LeaseError> {
    let rows = db
        .query(
            "SELECT l.shard, l.holder, l.term, (extract(epoch FROM (l.expires_at - now())) * 1000)::bigint, l.url,
                    COALESCE((SELECT max(a.seq) FROM nightshift_audit a WHERE a.shard = l.shard), 0)
             FROM nightshift_lease l ORDER BY l.shard",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| ShardRow {
            shard: r.get(0),
            holder: r.get(1),
            term: r.get::<_, i64>(2) as u64,
            expires_in_ms: r.get(3),
            url: r.get(4),
            head_seq: r.get::<_, i64>(5) as u64,
        })
        .collect())
}

/// How long an engine that stopped announcing itself is still listed.
pub const ENGINE_LISTED_SECS: i64 = 600;

/// Say this engine is alive, in what role and term (every engine of a
/// shard, leader and standbys, every few seconds): what `nightshift ha`
/// lists. Rows not refreshed in a day are removed.
pub async fn announce(db: &Client, cfg: &LeaseConfig, role: &str, term: u64) -> Result<(), LeaseError> {
    db.execute(
        "INSERT INTO nightshift_engines (shard, holder, url, role, term, seen_at) VALUES ($1, $2, $3, $4, $5, now())
         ON CONFLICT (shard, holder) DO UPDATE SET url = EXCLUDED.url, role = EXCLUDED.role, term = EXCLUDED.term,
             seen_at = EXCLUDED.seen_at",
        &[&cfg.shard, &cfg.holder, &cfg.url, &role, &(term as i64)],
    )
    .await?;
    db.execute("DELETE FROM nightshift_engines WHERE seen_at < now() - interval '1 day'", &[]).await?;
    Ok(())
}

/// One engine of a shard as it last announced itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EngineRow {
    pub shard: String,
    pub holder: String,
    pub url: String,
    /// `leader`, `taking_over`, `standby`, `deposed` or `stopped`.
    pub role: String,
    pub term: u64,
    /// Since its last announcement, by the database's clock.
    pub seen_ms_ago: i64,
}

/// Every engine heard from in the last [`ENGINE_LISTED_SECS`], by shard.
pub async fn engines(db: &Client) -> Result<Vec<EngineRow>, LeaseError> {
    let rows = db
        .query(
            "SELECT shard, holder, url, role, term, (extract(epoch FROM (now() - seen_at)) * 1000)::bigint
             FROM nightshift_engines WHERE seen_at > now() - $1 * interval '1 second'
             ORDER BY shard, holder",
            &[&(ENGINE_LISTED_SECS as f64)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| EngineRow {
            shard: r.get(0),
            holder: r.get(1),
            url: r.get(2),
            role: r.get(3),
            term: r.get::<_, i64>(4) as u64,
            seen_ms_ago: r.get(5),
        })
        .collect())
}

/// What this engine knows of its shard's leadership, shared by the lease
/// loop (which writes it), the audit writer (which fences every append
/// with the term), the agents' requests (which carry it) and the API
/// (which reports it and forwards writes to the leader).
#[derive(Debug)]
pub struct Leadership {
    pub cfg: LeaseConfig,
    /// The term this engine leads at; 0 while it is a standby (or after it
    /// was deposed).
    term: std::sync::atomic::AtomicU64,
    /// The leader as last read from the lease row (a standby forwards
    /// writes to its `url`).
    leader: std::sync::RwLock<Option<LeaseRow>>,
    /// When the lease was last taken or renewed (ms since the Unix epoch,
    /// this host's clock; for `/metrics` only).
    renewed_ms: std::sync::atomic::AtomicI64,
    /// Set once: why this engine stopped leading.
    deposed: tokio::sync::watch::Sender<Option<String>>,
    /// Caught up and recovered: runs may be submitted (until then the API
    /// answers 503 and a retry finds the leader ready).
    ready: std::sync::atomic::AtomicBool,
    /// Until when the lease is surely this engine's, on this host's
    /// monotonic clock: the send time of the last campaign or renewal that
    /// succeeded, plus the TTL (the database set its expiry later still).
    secured_until: std::sync::Mutex<Option<std::time::Instant>>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Leadership {
    pub fn new(cfg: LeaseConfig) -> std::sync::Arc<Leadership> {
        std::sync::Arc::new(Leadership {
            cfg,
            term: std::sync::atomic::AtomicU64::new(0),
            leader: std::sync::RwLock::new(None),
            renewed_ms: std::sync::atomic::AtomicI64::new(0),
            deposed: tokio::sync::watch::channel(None).0,
            ready: std::sync::atomic::AtomicBool::new(false),
            secured_until: std::sync::Mutex::new(None),
        })
    }

    /// The term this engine leads at, if it leads.
    pub fn term(&self) -> Option<u64> {
        match self.term.load(std::sync::atomic::Ordering::SeqCst) {
            0 => None,
            t => Some(t),
        }
    }

    pub fn is_leader(&self) -> bool {
        self.term().is_some()
    }

    /// Lead at `term` (the lease was just taken).
    pub fn lead(&self, term: u64) {
        self.renewed();
        self.term.store(term, std::sync::atomic::Ordering::SeqCst);
    }

    /// Recovered and acting: submissions are taken from now on.
    pub fn set_ready(&self) {
        self.ready.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Leading, caught up and recovered.
    pub fn is_ready(&self) -> bool {
        self.is_leader() && self.ready.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The lease was renewed just now.
    pub fn renewed(&self) {
        self.renewed_ms.store(now_ms(), std::sync::atomic::Ordering::SeqCst);
    }

    /// Milliseconds since the lease was last taken or renewed (None while
    /// standing by).
    pub fn lease_age_ms(&self) -> Option<i64> {
        self.is_leader().then(|| now_ms() - self.renewed_ms.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// A campaign or renewal *sent* at `sent` succeeded: the lease is this
    /// engine's until `sent + ttl` at least.
    pub fn secured(&self, sent: std::time::Instant) {
        let until = sent + self.cfg.ttl;
        let mut g = self.secured_until.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none_or(|u| u < until) {
            *g = Some(until);
        }
    }

    /// How long the lease is surely still this engine's (zero when it may
    /// have lapsed; `None` while not leading). Checked immediately before
    /// every send.
    pub fn lease_left(&self) -> Option<Duration> {
        if !self.is_leader() {
            return None;
        }
        let until = *self.secured_until.lock().unwrap_or_else(|e| e.into_inner());
        Some(until.map_or(Duration::ZERO, |u| u.saturating_duration_since(std::time::Instant::now())))
    }

    /// Stop leading for good: every later append is refused, and whoever
    /// waits on [`Leadership::deposed`] hears why (the first reason given).
    pub fn depose(&self, why: String) {
        self.term.store(0, std::sync::atomic::Ordering::SeqCst);
        self.ready.store(false, std::sync::atomic::Ordering::SeqCst);
        // The first reason stands (a deposed engine's own shutdown must not
        // read as a clean hand-over).
        self.deposed.send_if_modified(|r| {
            if r.is_some() {
                return false;
            }
            *r = Some(why);
            true
        });
    }

    /// Flips to `Some(why)` when this engine stops leading.
    pub fn deposed(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.deposed.subscribe()
    }

    pub fn set_leader(&self, row: Option<LeaseRow>) {
        *self.leader.write().unwrap_or_else(|e| e.into_inner()) = row;
    }

    /// The leader as last read (possibly this engine).
    pub fn leader(&self) -> Option<LeaseRow> {
        self.leader.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader deposed by a lost lease, whose own shutdown then tries to
    /// hand the lease back, still says it was deposed (`serve` exits 75 on
    /// that, 0 on a clean hand-over).
    #[test]
    fn the_first_reason_for_stepping_down_stands() {
        let l = Leadership::new(LeaseConfig::new("a", "e1"));
        assert_eq!((l.term(), l.is_ready()), (None, false));
        l.lead(7);
        l.set_ready();
        assert_eq!((l.term(), l.is_ready()), (Some(7), true));
        assert!(l.lease_age_ms().is_some_and(|ms| (0..1000).contains(&ms)));
        let rx = l.deposed();
        l.depose("e2 took the lease at term 8".into());
        l.depose("this engine shut down and handed the lease back".into());
        assert_eq!(rx.borrow().as_deref(), Some("e2 took the lease at term 8"));
        assert_eq!((l.term(), l.is_ready(), l.lease_age_ms()), (None, false, None));
    }

    /// The send-time fence reads this: sure until the last successful
    /// campaign or renewal's *send* time plus the TTL, never longer.
    #[test]
    fn the_lease_is_sure_until_the_last_send_plus_the_ttl() {
        let l = Leadership::new(LeaseConfig::new("a", "e1"));
        assert_eq!(l.lease_left(), None, "not leading");
        l.lead(3);
        assert_eq!(l.lease_left(), Some(Duration::ZERO), "leading, never secured: nothing is sure");
        let ttl = l.cfg.ttl;
        l.secured(std::time::Instant::now() - ttl + Duration::from_millis(300));
        let left = l.lease_left().unwrap();
        assert!(left <= Duration::from_millis(300) && left > Duration::from_millis(100), "{left:?}");
        // An older send never shortens what a newer one secured.
        l.secured(std::time::Instant::now());
        l.secured(std::time::Instant::now() - ttl);
        assert!(l.lease_left().unwrap() > ttl - Duration::from_millis(200));
        l.depose("gone".into());
        assert_eq!(l.lease_left(), None);
    }

    #[test]
    fn lease_settings_are_checked() {
        let mut c = LeaseConfig::new("a", "e1");
        assert!(c.check().is_ok());
        c.renew_every = Duration::from_secs(5);
        assert_eq!(
            c.check().unwrap_err().to_string(),
            "lease: expected a TTL of 1 s to 10 min and a renew interval below it, found ttl 5000 ms and renew 5000 ms"
        );
        c.ttl = Duration::from_millis(200);
        c.renew_every = Duration::from_millis(100);
        assert!(c.check().is_err());
        assert_eq!(
            fence_condition(1, 2, 3),
            "EXISTS (SELECT 1 FROM nightshift_lease WHERE shard = $1 AND holder = $2 AND term = $3 AND expires_at > now())"
        );
    }
}
