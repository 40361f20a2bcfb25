//! TLS to PostgreSQL: a real server with `ssl=on` and a certificate made
//! here. With `sslmode=require` the engine's connection is encrypted and
//! the server's certificate is checked against `audit.postgres.ca_file`: a
//! server whose certificate another CA signed is refused. The audit chain
//! goes over it (schema, a fenced append, verify).

use nightshift_engine::audit::pg;
use nightshift_tests::external::{PgCluster, give_to_postgres, postgres_bin_dir};

/// A self-signed certificate for 127.0.0.1: (certificate PEM, key PEM).
fn self_signed() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.subject_alt_names = vec![rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap())];
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A PostgreSQL cluster with `ssl=on` and a certificate for 127.0.0.1,
/// and the CA file that vouches for it (`None`: no PostgreSQL here).
fn tls_cluster() -> Option<(tempfile::TempDir, PgCluster, std::path::PathBuf)> {
    let bin = postgres_bin_dir()?;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pg");
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = self_signed();
    let (crt_path, key_path) = (dir.join("server.crt"), dir.join("server.key"));
    std::fs::write(&crt_path, &cert).unwrap();
    std::fs::write(&key_path, &key).unwrap();
    give_to_postgres(&crt_path);
    give_to_postgres(&key_path);
    let cluster = PgCluster::start_with(
        &dir,
        &bin,
        &["ssl=on", &format!("ssl_cert_file={}", crt_path.display()), &format!("ssl_key_file={}", key_path.display())],
    );
    let ca = tmp.path().join("ca.pem");
    std::fs::write(&ca, &cert).unwrap();
    Some((tmp, cluster, ca))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_goes_over_tls_to_a_server_the_ca_vouches_for() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some((tmp, cluster, ca)) = tls_cluster() else { return };

    // Encrypted, and the certificate checked.
    let url = format!("{} sslmode=require", cluster.conninfo);
    let mut db = pg::connect(&url, Some(&ca)).await.expect("a TLS connection the CA vouches for");
    let ssl: bool = db.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await.unwrap().get(0);
    assert!(ssl, "the session is encrypted");
    pg::migrate_schema(&mut db).await.unwrap();
    let lease = nightshift_engine::ha::LeaseConfig::new("tls", "engine-tls");
    let term = nightshift_engine::ha::campaign(&db, &lease).await.unwrap().unwrap();
    let mut r = nightshift_engine::audit::AuditRecord {
        seq: 1,
        ts_ms: 1_790_000_000_000,
        kind: nightshift_engine::audit::RecordKind::Note,
        run: None,
        node: None,
        gpu: None,
        runbook: None,
        actor: "engine".into(),
        data: serde_json::json!({"text": "over TLS"}),
        prev_hash: nightshift_engine::audit::GENESIS.into(),
        hash: String::new(),
        v: Some(2),
    };
    r.hash = r.compute_hash();
    pg::append(&db, "tls", &[(r, None)], Some((&lease, term))).await.unwrap();
    assert!(pg::verify(&db, "tls").await.unwrap().ok);

    // A certificate another CA signed: refused, saying why.
    let (other, _) = self_signed();
    let wrong = tmp.path().join("other-ca.pem");
    std::fs::write(&wrong, other).unwrap();
    let e = pg::connect(&url, Some(&wrong)).await.expect_err("refused");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    // A CA file that is not PEM: said so, with its path.
    let junk = tmp.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let e = pg::connect(&url, Some(&junk)).await.expect_err("refused");
    assert!(e.to_string().contains("junk.pem"), "{e}");
}

/// `nightshift audit migrate --to postgres` goes over the engine's own TLS
/// connection (it used `NoTls`, so `sslmode=require` — what docs/HA.md
/// tells operators to write — failed with "error performing TLS
/// handshake"): a sled store's records copied to a TLS server whose
/// certificate the CA file vouches for, and the chain verifies there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_migrate_goes_over_tls() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some((tmp, cluster, ca)) = tls_cluster() else { return };
    let url_file = tmp.path().join("pg-url");
    std::fs::write(&url_file, format!("{} sslmode=require", cluster.conninfo)).unwrap();

    // A sled store with a few records, and an engine.yaml naming it.
    let data = tmp.path().join("data");
    let d = data.clone();
    tokio::task::spawn_blocking(move || {
        let store =
            nightshift_engine::audit::AuditStore::open(&d, std::sync::Arc::new(nightshift_proto::clock::SystemClock))
                .unwrap();
        for i in 0..5 {
            store
                .append_blocking(
                    nightshift_engine::audit::NewRecord::new(
                        nightshift_engine::audit::RecordKind::Note,
                        "engine",
                        serde_json::json!({"text": format!("note {i}")}),
                    ),
                    None,
                )
                .unwrap();
        }
    })
    .await
    .unwrap();
    let cfg = tmp.path().join("engine.yaml");
    std::fs::write(
        &cfg,
        format!(
            "version: 1\ndata_dir: {}\nrunbook_dir: rb\ninventory_path: fleet.yaml\nengine_key_path: key\n",
            data.display()
        ),
    )
    .unwrap();
    let nightshift = nightshift_tests::external::workspace_bin_dir().join("nightshift");
    let migrate = |extra: &[&str]| {
        std::process::Command::new(&nightshift)
            .arg("--config")
            .arg(&cfg)
            .args(["audit", "migrate", "--to", "postgres", "--url-file"])
            .arg(&url_file)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = migrate(&["--ca-file", ca.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "migrate over TLS: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let db = pg::connect(&format!("{} sslmode=require", cluster.conninfo), Some(&ca)).await.unwrap();
    let head = pg::head(&db, "default").await.unwrap();
    assert_eq!(head.map(|h| h.0), Some(5), "every record is in the database");
    // A CA that did not sign the server's certificate: refused, nothing copied twice.
    let (other, _) = self_signed();
    let other_ca = tmp.path().join("other-ca.pem");
    std::fs::write(&other_ca, other).unwrap();
    let out = migrate(&["--ca-file", other_ca.to_str().unwrap()]);
    assert!(!out.status.success(), "a certificate the CA did not sign is refused");
}
