//! A slow but working database never deposes a healthy leader: an engine on
//! PostgreSQL behind a loopback proxy that delays every chunk by 300 ms each
//! way (a link adding 600 ms to each round trip) with a 500 ms renew
//! interval stays leader. Each renewal may take what the lease has left; it
//! used to be cut at one renew interval, so every renewal "timed out" and the
//! engine stepped down (exit 75).
//!
//! The TTL is 6 s, ten round trips: what the test is about is a round trip
//! longer than the renew interval, not a lease that barely covers one. With a
//! 2 s TTL a loaded 2-core machine (the whole suite at once) stalled a
//! campaign's answer for 3 s, and the engine rightly stepped down: its lease
//! had run out by its own clock.

use std::path::Path;
use std::time::{Duration, Instant};

use nightshift_tests::engine_setup;
use nightshift_tests::external::{Daemon, PgCluster, free_port, postgres_bin_dir, workspace_bin_dir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DELAY: Duration = Duration::from_millis(300);

/// Forward `127.0.0.1:listen` to `127.0.0.1:to`, every chunk held `DELAY`
/// (in order) in each direction.
async fn slow_proxy(listen: u16, to: u16) {
    let l = tokio::net::TcpListener::bind(("127.0.0.1", listen)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else { return };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw));
                tokio::spawn(pipe(sr, cw));
            });
        }
    });
}

async fn pipe(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due.into()).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 65536];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx.send((Instant::now() + DELAY, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

async fn role(http: &reqwest::Client, url: &str) -> Option<String> {
    let v: serde_json::Value = http.get(format!("{url}/api/v1/ha")).send().await.ok()?.json().await.ok()?;
    v["role"].as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_database_link_does_not_depose_the_leader() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(bin) = postgres_bin_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pgdir = dir.join("pg");
    std::fs::create_dir_all(&pgdir).unwrap();
    let cluster = PgCluster::start(&pgdir, &bin);
    let proxy = free_port();
    slow_proxy(proxy, cluster.port).await;
    std::fs::write(dir.join("pg-url"), format!("host=127.0.0.1 port={proxy} user=nightshift dbname=postgres")).unwrap();
    nightshift_tests::engine_key(dir);
    engine_setup(dir, &[], &[], "auth: {allow_anonymous: admin}\n");
    let port = free_port();
    let base = std::fs::read_to_string(dir.join("engine.yaml")).unwrap();
    let text = base.replace("listen_addr: 127.0.0.1:0", &format!("listen_addr: 127.0.0.1:{port}")).replace(
        "data_dir: engine-data",
        "data_dir: data-a\naudit:\n  backend: postgres\n  postgres: {url_file: pg-url, lease_ttl_ms: 6000, lease_renew_ms: 500, follow_ms: 200}",
    );
    let config = dir.join("engine-a.yaml");
    std::fs::write(&config, text).unwrap();
    let argv = [
        workspace_bin_dir().join("nightshift").display().to_string(),
        "--config".into(),
        config.display().to_string(),
        "serve".into(),
    ];
    let mut engine = Daemon::start(&argv, &dir.join("a.log"));
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let end = Instant::now() + Duration::from_secs(120);
    while role(&http, &url).await.as_deref() != Some("leader") {
        assert!(Instant::now() < end, "never led through the slow link:\n{}", engine.log_text());
        assert!(engine.child.try_wait().unwrap().is_none(), "the engine exited:\n{}", engine.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Twenty-four seconds (four TTLs, forty renewals) through the slow link.
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(24) {
        assert!(engine.child.try_wait().unwrap().is_none(), "stepped down:\n{}", engine.log_text());
        assert_eq!(role(&http, &url).await.as_deref(), Some("leader"), "{}", engine.log_text());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = engine.child.kill();
    let _ = engine.child.wait();
    drop(cluster);
    let _ = Path::new(dir);
}
