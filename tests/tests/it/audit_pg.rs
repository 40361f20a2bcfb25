//! The audit chain in a real PostgreSQL (issue 17, first part): a store
//! written by a real engine is copied with `nightshift audit migrate` — the
//! chain and the run summaries — and verifies there; a second copy resumes
//! (copies nothing); a row changed in the database is named by `verify`;
//! another store's chain is refused; and appends fenced by the leader lease
//! land only while the writer leads.

use std::process::Command;
use std::sync::Arc;

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::audit::{AuditStore, pg};
use nightshift_engine::ha::{LeaseConfig, campaign};
use nightshift_engine::runs::Target;
use nightshift_tests::external::{PgCluster, postgres_bin_dir, workspace_bin_dir};
use nightshift_tests::{TestAgent, engine_setup, eventually, manual_run};

async fn connect(conninfo: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// A store with two finished runs, its engine stopped.
async fn store_with_runs(dir: &std::path::Path, node: &str) -> nightshift_engine::config::EngineConfig {
    let agent = TestAgent::start(dir, node, SimConfig { gpus: 1, ..SimConfig::default() }, "").await;
    let cfg = engine_setup(
        dir,
        &[&agent],
        &[("cap", "trigger: {type: manual}\nscope: gpu\n", "note(\"91.5 °C → capping\");\nset_power_limit(612.5);\n")],
        "",
    );
    let engine = nightshift_engine::serve::start(cfg.clone()).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    for _ in 0..2 {
        let s = engine.submit(manual_run("cap", Target::gpu(node, 0))).await.unwrap();
        let id = s.run().unwrap().id.clone();
        eventually(20, || engine.run(&id).unwrap().filter(|r| r.outcome.is_some())).await.unwrap();
    }
    engine.shutdown().await;
    drop(engine);
    let mut agent = agent;
    agent.stop().await;
    // Until every task let go of the store.
    let clock: nightshift_proto::clock::SharedClock = Arc::new(nightshift_proto::clock::SystemClock);
    assert!(
        eventually(30, || AuditStore::open(&cfg.data_dir, clock.clone()).ok().map(drop)).await.is_some(),
        "the engine never released its store"
    );
    cfg
}

fn migrate(dir: &std::path::Path, config: &std::path::Path, url_file: &std::path::Path, shard: &str) -> (bool, String) {
    let out = Command::new(workspace_bin_dir().join("nightshift"))
        .current_dir(dir)
        .arg("--config")
        .arg(config)
        .args(["audit", "migrate", "--to", "postgres", "--shard", shard, "--url-file"])
        .arg(url_file)
        .output()
        .unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_migrates_into_postgres_and_its_chain_holds_there() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(bin) = postgres_bin_dir() else { return };
    let pgdir = tempfile::tempdir().unwrap();
    let pgc = PgCluster::start(pgdir.path(), &bin);
    let work = tempfile::tempdir().unwrap();
    let url_file = work.path().join("pg.url");
    std::fs::write(&url_file, &pgc.conninfo).unwrap();

    let one = work.path().join("one");
    std::fs::create_dir_all(&one).unwrap();
    let cfg = store_with_runs(&one, "m1").await;
    let local = nightshift_engine::audit::log_records(&cfg.data_dir).unwrap();
    assert!(local.len() > 10 && local.iter().filter(|(_, s)| s.is_some()).count() >= 4);
    let config = one.join("engine.yaml");

    let (ok, out) = migrate(&one, &config, &url_file, "a");
    assert!(ok, "{out}");
    assert!(out.contains(&format!("holds records 1–{}", local.len())), "{out}");
    let db = connect(&pgc.conninfo).await;
    let count: i64 = db.query_one("SELECT count(*) FROM nightshift_audit WHERE shard = 'a'", &[]).await.unwrap().get(0);
    assert_eq!(count as usize, local.len());
    let summaries: i64 =
        db.query_one("SELECT count(*) FROM nightshift_run_summary WHERE shard = 'a'", &[]).await.unwrap().get(0);
    assert_eq!(summaries, 2, "one summary per run");
    let (seq, hash) = pg::head(&db, "a").await.unwrap().unwrap();
    assert_eq!((seq as usize, hash.as_str()), (local.len(), local.last().unwrap().0.hash.as_str()));
    // The stored summary is the one the chain vouches for.
    let run = local.iter().rev().find_map(|(r, s)| s.as_ref().map(|s| (r, s))).unwrap();
    let stored: String = db
        .query_one("SELECT summary FROM nightshift_run_summary WHERE shard = 'a' AND run = $1", &[&run.0.run])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        run.0.data["summary_sha256"].as_str().unwrap(),
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(stored.as_bytes()))
    );

    // Again: nothing to copy, still verified.
    let (ok, out) = migrate(&one, &config, &url_file, "a");
    assert!(ok && out.contains(&format!("{} already in shard a, copied 0", local.len())), "{out}");

    // Another store's chain into the same shard: refused, nothing written.
    let two = work.path().join("two");
    std::fs::create_dir_all(&two).unwrap();
    store_with_runs(&two, "m2").await;
    let (ok, out) = migrate(&two, &two.join("engine.yaml"), &url_file, "a");
    assert!(!ok && out.contains("it holds another chain"), "{out}");
    // Into a shard of its own it goes.
    let (ok, out) = migrate(&two, &two.join("engine.yaml"), &url_file, "b");
    assert!(ok, "{out}");

    // A row changed in the database is found.
    let v = pg::verify(&db, "a").await.unwrap();
    assert!(v.ok, "{v:?}");
    let victim = local.iter().find(|(r, _)| r.data["text"].as_str().is_some_and(|t| t.contains("°C"))).unwrap().0.seq;
    db.execute(
        "UPDATE nightshift_audit SET record = replace(record, '91.5', '71.5') WHERE shard = 'a' AND seq = $1",
        &[&(victim as i64)],
    )
    .await
    .unwrap();
    let v = pg::verify(&db, "a").await.unwrap();
    assert_eq!(v.first_bad_seq, Some(victim), "{v:?}");
    assert!(v.problem.unwrap().contains(&format!("record {victim} was altered: its hash does not match its content")));

    // Appends fenced by the lease: the leader's lands, a deposed one's not.
    let writer = connect(&pgc.conninfo).await;
    let lease_a = LeaseConfig::new("b", "engine-a");
    let term = campaign(&writer, &lease_a).await.unwrap().expect("the lease");
    let (last, _) = pg::head(&writer, "b").await.unwrap().unwrap();
    let two_records = nightshift_engine::audit::log_records(&two.join("engine-data")).unwrap();
    let prev = two_records.last().unwrap().0.clone();
    let next = |seq: u64, prev: &nightshift_engine::audit::AuditRecord, text: &str| {
        let mut r = prev.clone();
        r.seq = seq;
        r.prev_hash = prev.hash.clone();
        r.data = serde_json::json!({"text": text});
        r.kind = nightshift_engine::audit::RecordKind::Note;
        r.run = None;
        r.hash = r.compute_hash();
        r
    };
    let r1 = next(last + 1, &prev, "written while leading");
    pg::append(&writer, "b", &[(r1.clone(), None)], Some((&lease_a, term))).await.unwrap();
    // The lease moves on (engine-a paused past its TTL; engine-b took it).
    writer
        .execute("UPDATE nightshift_lease SET expires_at = now() - interval '1 second' WHERE shard = 'b'", &[])
        .await
        .unwrap();
    let lease_b = LeaseConfig::new("b", "engine-b");
    assert_eq!(campaign(&writer, &lease_b).await.unwrap(), Some(term + 1));
    let r2 = next(last + 2, &r1, "written after being deposed");
    let err = pg::append(&writer, "b", &[(r2.clone(), None)], Some((&lease_a, term))).await.unwrap_err();
    assert!(err.to_string().contains("no longer holds the lease"), "{err}");
    pg::append(&writer, "b", &[(r2, None)], Some((&lease_b, term + 1))).await.unwrap();
    // A record that does not continue the chain is refused too.
    let forged = next(last + 10, &r1, "a gap");
    assert!(pg::append(&writer, "b", &[(forged, None)], None).await.is_err());
    assert!(pg::verify(&writer, "b").await.unwrap().ok);

    // The runs of every shard, filtered in SQL (what `?shards=all` and
    // `audit list --all-shards` read): two runs on m1 in shard a, two on m2
    // in shard b.
    use nightshift_engine::audit::RunFilter;
    let all = pg::runs(&db, &RunFilter::default(), None).await.unwrap();
    let created: Vec<i64> = all.runs.iter().map(|r| r.run.created_ms).collect();
    assert!(created.windows(2).all(|w| w[0] >= w[1]), "newest first: {created:?}");
    let outcome = all.runs[0].run.outcome;
    let f = |node: Option<&str>, runbook: Option<&str>, since_ms: Option<i64>| RunFilter {
        node: node.map(str::to_string),
        runbook: runbook.map(str::to_string),
        since_ms,
        ..Default::default()
    };
    for (filter, want) in [
        (RunFilter::default(), vec![("a", 2), ("b", 2)]),
        (f(Some("m1"), None, None), vec![("a", 2)]),
        (f(Some("m2"), None, None), vec![("b", 2)]),
        (f(None, Some("cap"), None), vec![("a", 2), ("b", 2)]),
        (f(None, Some("nope"), None), vec![]),
        (f(None, None, Some(i64::MAX / 2)), vec![]),
        (RunFilter { gpu: Some(0), ..Default::default() }, vec![("a", 2), ("b", 2)]),
        (RunFilter { gpu: Some(3), ..Default::default() }, vec![]),
        (RunFilter { outcome, ..f(Some("m1"), None, None) }, vec![("a", 2)]),
        // A label, resolved by the engine into the nodes that carry it.
        (RunFilter { nodes_any: Some(vec!["m2".into(), "m9".into()]), ..Default::default() }, vec![("b", 2)]),
        (RunFilter { nodes_any: Some(vec!["m1".into(), "m2".into()]), ..Default::default() }, vec![("a", 2), ("b", 2)]),
        (RunFilter { nodes_any: Some(vec![]), ..Default::default() }, vec![]),
    ] {
        let page = pg::runs(&db, &filter, None).await.unwrap();
        let mut got: std::collections::BTreeMap<&str, usize> = Default::default();
        for r in &page.runs {
            *got.entry(r.shard.as_str()).or_default() += 1;
        }
        let got: Vec<(&str, usize)> = got.into_iter().collect();
        assert_eq!(got, want, "{filter:?}");
    }
    // A page at a time: every run once, in the same order.
    let mut paged = Vec::new();
    let mut cursor = None;
    loop {
        let page = pg::runs(&db, &RunFilter { limit: Some(1), cursor: cursor.clone(), ..Default::default() }, None)
            .await
            .unwrap();
        paged.extend(page.runs.iter().map(|r| r.run.id.clone()));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(paged, all.runs.iter().map(|r| r.run.id.clone()).collect::<Vec<_>>());
    let bad =
        pg::runs(&db, &RunFilter { cursor: Some("yesterday".into()), ..Default::default() }, None).await.unwrap_err();
    // One shard's runs only.
    let b = pg::runs(&db, &RunFilter::default(), Some("b")).await.unwrap();
    assert!(b.runs.len() == 2 && b.runs.iter().all(|r| r.shard == "b"), "{b:?}");
    assert!(bad.to_string().contains("expected CREATED_MS/SHARD/RUN"), "{bad}");
    drop(pgc);
}
