//! The leader lease with a fencing term, on a real PostgreSQL (issue 17's
//! first part): one engine holds a shard's lease; while it holds it, its
//! fenced writes land; once it stops renewing (paused, partitioned) past
//! the TTL, another takes the lease at a new term — and from then on
//! nothing the old leader writes at its term lands, and it learns it was
//! deposed. The database's clock decides expiry.

use std::time::Duration;

use nightshift_engine::ha::{LeaseConfig, campaign, fence_condition, holder, migrate, renew};
use nightshift_tests::external::{PgCluster, postgres_bin_dir};

async fn connect(conninfo: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// An audit-like write fenced by the lease: lands only while `term` holds it.
async fn fenced_write(db: &tokio_postgres::Client, cfg: &LeaseConfig, term: u64, what: &str) -> u64 {
    let sql = format!("INSERT INTO intents (term, what) SELECT $3, $4 WHERE {}", fence_condition(1, 2, 3));
    db.execute(&sql, &[&cfg.shard, &cfg.holder, &(term as i64), &what]).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_cannot_write() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(bin) = postgres_bin_dir() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pg = PgCluster::start(dir.path(), &bin);
    let (a, b) = (connect(&pg.conninfo).await, connect(&pg.conninfo).await);
    migrate(&a).await.unwrap();
    migrate(&b).await.unwrap(); // idempotent
    a.batch_execute("CREATE TABLE intents (term bigint NOT NULL, what text NOT NULL)").await.unwrap();
    let ttl = Duration::from_millis(1500);
    let renew_every = Duration::from_millis(300);
    let ca = LeaseConfig { ttl, renew_every, ..LeaseConfig::new("shard-a", "engine-a") };
    let cb = LeaseConfig { ttl, renew_every, ..LeaseConfig::new("shard-a", "engine-b") };

    // A wins the first term; B cannot take it while A renews.
    assert_eq!(campaign(&a, &ca).await.unwrap(), Some(1));
    assert_eq!(campaign(&b, &cb).await.unwrap(), None);
    for _ in 0..5 {
        tokio::time::sleep(renew_every).await;
        assert!(renew(&a, &ca, 1).await.unwrap());
        assert_eq!(campaign(&b, &cb).await.unwrap(), None, "the lease is held");
    }
    // Campaigning again for a lease it holds keeps A's term.
    assert_eq!(campaign(&a, &ca).await.unwrap(), Some(1));
    assert_eq!(fenced_write(&a, &ca, 1, "a: cap gpu3").await, 1);

    // A pauses past the TTL; B takes over at term 2.
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    assert_eq!(campaign(&b, &cb).await.unwrap(), Some(2));
    assert_eq!(fenced_write(&b, &cb, 2, "b: drain n7").await, 1);

    // A wakes up: its writes at term 1 land nowhere, its renewal says it
    // was deposed, and it cannot campaign back while B renews.
    assert_eq!(fenced_write(&a, &ca, 1, "a: stale intent").await, 0);
    assert!(!renew(&a, &ca, 1).await.unwrap());
    assert_eq!(campaign(&a, &ca).await.unwrap(), None);
    // Nor with B's term: the fence names the holder too.
    assert_eq!(fenced_write(&a, &ca, 2, "a: borrowed term").await, 0);
    let (h, term, left_ms) = holder(&a, "shard-a").await.unwrap().unwrap();
    assert_eq!((h.as_str(), term), ("engine-b", 2));
    assert!(left_ms > 0 && left_ms <= ttl.as_millis() as i64, "{left_ms}");

    let rows: Vec<(i64, String)> = a
        .query("SELECT term, what FROM intents ORDER BY term", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, [(1, "a: cap gpu3".to_string()), (2, "b: drain n7".to_string())]);

    // Another shard has a lease of its own.
    let other = LeaseConfig { ttl, renew_every, ..LeaseConfig::new("shard-b", "engine-a") };
    assert_eq!(campaign(&a, &other).await.unwrap(), Some(1));
    drop(pg);
}
