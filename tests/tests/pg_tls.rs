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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_goes_over_tls_to_a_server_the_ca_vouches_for() {
    let Some(bin) = postgres_bin_dir() else { return };
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
