//! Config loading and validation: the shipped example, located errors, values that would switch a safety off.

use super::*;

/// Issue 46 point 11: the shard's secret in a file others can read is
/// refused, naming the mode and the fix.
#[test]
fn a_peer_token_others_can_read_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("peer.token");
    std::fs::write(&f, "0123456789abcdef0123456789abcdef\n").unwrap();
    let pg: PostgresConfig =
        serde_yaml::from_str(&format!("{{url_file: u, peer_token_file: {}}}", f.display())).unwrap();
    for (mode, ok) in [(0o644, false), (0o640, false), (0o604, false), (0o600, true), (0o400, true)] {
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        match pg.peer_token() {
            Ok(t) => assert!(ok && t.is_some(), "{mode:o}"),
            Err(e) => {
                assert!(!ok, "{mode:o}: {e}");
                assert!(e.contains("expected mode 0600 or stricter") && e.contains(&format!("found 0{mode:o}")), "{e}");
                assert!(e.contains("chmod 600"), "{e}");
            }
        }
    }
}

#[test]
fn example_config_is_valid_and_errors_are_located() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/engine.yaml");
    let cfg = EngineConfig::load(&path).unwrap();
    assert!(cfg.data_dir.is_absolute());
    let bad = "version: 1\ndata_dir: d\nrunbook_dir: r\ninventory_path: i\nengine_key_path: k\nlimits:\n  queue_capasity: 5\n";
    let e = EngineConfig::parse(bad, Path::new("engine.yaml")).unwrap_err();
    assert!(e.to_string().starts_with("engine.yaml:7:3: limits: unknown field `queue_capasity`"), "{e}");
}

/// `audit.postgres.fleet_label` cuts the fleet: an engine keeps the
/// nodes whose label is its shard; without the label, all of them.
#[test]
fn a_shard_keeps_its_part_of_the_fleet() {
    let inv = crate::fleet::inventory::Inventory::parse(
        "version: 1\nnodes:\n  - {name: a1, address: '10.0.0.1:22', host_key: 'SHA256:x', labels: {cluster: east}}\n  - {name: b1, address: '10.0.0.2:22', host_key: 'SHA256:y', labels: {cluster: west}}\n  - {name: c1, address: '10.0.0.3:22', host_key: 'SHA256:z'}\n",
        Path::new("fleet.yaml"),
    )
    .unwrap();
    let base = "version: 1\ndata_dir: d\nrunbook_dir: r\ninventory_path: i\nengine_key_path: k\n";
    let names = |extra: &str| {
        let cfg = EngineConfig::parse(&format!("{base}{extra}"), Path::new("engine.yaml")).unwrap();
        let mut i = inv.clone();
        cfg.select_shard(&mut i);
        i.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>()
    };
    assert_eq!(names(""), ["a1", "b1", "c1"]);
    assert_eq!(names("audit:\n  backend: postgres\n  postgres: {url_env: V, shard: east}\n"), ["a1", "b1", "c1"]);
    assert_eq!(
        names("audit:\n  backend: postgres\n  postgres: {url_env: V, shard: east, fleet_label: cluster}\n"),
        ["a1"]
    );
    assert_eq!(
        names("audit:\n  backend: postgres\n  postgres: {url_env: V, shard: west, fleet_label: cluster}\n"),
        ["b1"]
    );
}

/// Values that would switch a safety off, stop the engine or never
/// match: each refused with its line and what was expected.
#[test]
fn values_that_disable_safety_are_refused_with_their_line() {
    let base = "version: 1\ndata_dir: d\nrunbook_dir: r\ninventory_path: i\nengine_key_path: k\n";
    let cases = [
        (
            "script:\n  max_string_size: 0\n",
            "engine.yaml:7:3: script.max_string_size: expected 1 to 16777216 (0 would switch the limit off), found 0",
        ),
        (
            "script:\n  max_operations: 0\n",
            "engine.yaml:7:3: script.max_operations: expected 1000 to 1000000000 (0 would switch the limit off), found 0",
        ),
        ("limits:\n  queue_capacity: 0\n", "engine.yaml:7:3: limits.queue_capacity: expected 1 to 1000000, found 0"),
        (
            "limits:\n  max_concurrent_runs: 0\n",
            "engine.yaml:7:3: limits.max_concurrent_runs: expected 1 to 100000, found 0",
        ),
        (
            "limits:\n  action_timeout_secs: 0\n",
            "engine.yaml:7:3: limits.action_timeout_secs: expected 1 to 3600, found 0",
        ),
        ("limits:\n  max_drained_pct: .nan\n", "engine.yaml:7:3: limits.max_drained_pct: expected 0 to 100, found NaN"),
        (
            "limits:\n  webhook_alerts_per_sec: .nan\n",
            "engine.yaml:7:3: limits.webhook_alerts_per_sec: expected 0 (no limit) to 10000000, found NaN",
        ),
        (
            "limits:\n  webhook_alert_burst: 0\n",
            "engine.yaml:7:3: limits.webhook_alert_burst: expected 1 to 100000000, found 0",
        ),
        ("time_scale: .nan\n", "engine.yaml:6:1: time_scale: expected 1 to 1000, found NaN"),
        (
            "auth:\n  proxy:\n    from: []\n    default_role: viewer\n",
            "engine.yaml:7:3: auth.proxy.from: expected the proxy's addresses (IPs or CIDRs): without them anyone could send the header",
        ),
        (
            "auth:\n  proxy:\n    from: [10.0.0.0/33]\n    default_role: viewer\n",
            "engine.yaml:8:5: auth.proxy.from: expected an IP or a CIDR such as 10.0.0.0/24, found \"10.0.0.0/33\"",
        ),
        (
            "auth:\n  proxy:\n    from: [10.0.0.5]\n",
            "engine.yaml:7:3: auth.proxy: expected roles (group: role) or a default_role, found neither: nobody could sign in",
        ),
        (
            "auth:\n  proxy:\n    from: [10.0.0.5]\n    user_header: 'X User'\n    default_role: viewer\n",
            "engine.yaml:9:18: auth.proxy: expected a header name, found \"X User\"",
        ),
        (
            "time_origin_ms: 1790000000000\n",
            "engine.yaml:6:1: time_origin_ms: expected a Unix time in ms (0 or more) with a time_scale above 1, found 1790000000000 with time_scale 1",
        ),
        ("limits:\n  resume_wait_secs: 0\n", "engine.yaml:7:3: limits.resume_wait_secs: expected 1 to 86400, found 0"),
        (
            "notifications:\n  page_expiry_secs: 5\n",
            "engine.yaml:7:3: notifications.page_expiry_secs: expected 60 to 86400, found 5",
        ),
        (
            "notifications:\n  remind_after_secs: 99999999\n",
            "engine.yaml:7:3: notifications.remind_after_secs: expected 0 (say every time) to 2592000 (30 days), found 99999999",
        ),
        (
            "notifications:\n  shared_cause_secs: 604800\n",
            "engine.yaml:7:3: notifications.shared_cause_secs: expected 0 (page every storm) to 86400 (a day), found 604800",
        ),
        (
            "notifications:\n  worse_by_pct: .nan\n",
            "engine.yaml:7:3: notifications.worse_by_pct: expected 1 to 1000 (percent of the size last said), found NaN",
        ),
        (
            "notifications:\n  worse_by_pct: 0\n",
            "engine.yaml:7:3: notifications.worse_by_pct: expected 1 to 1000 (percent of the size last said), found 0",
        ),
        (
            "notifications:\n  webhooks:\n    - {name: pager, url: 'http://pager.example/hook', fallback: phone}\n",
            "engine.yaml:8:65: notifications.webhooks[pager].fallback: expected another target's name (there is none), found \"phone\"",
        ),
        (
            "autoscaler:\n  url: autoscaler.local\n",
            "engine.yaml:7:3: autoscaler.url: expected http:// or https://…, found \"autoscaler.local\"",
        ),
        (
            "autoscaler:\n  url: http://a\n  max_nodes_per_pool: 0\n",
            "engine.yaml:8:3: autoscaler.max_nodes_per_pool: expected 1 to 10000, found 0",
        ),
        (
            "grafana:\n  url: grafana.local:3000\n",
            "engine.yaml:7:3: grafana.url: expected http:// or https://…, found \"grafana.local:3000\"",
        ),
        (
            "grafana:\n  url: http://g\n  uid: x\n",
            "engine.yaml:8:3: grafana: unknown field `uid`, expected `url` or `dashboard_uid`",
        ),
        (
            "auth:\n  webhook_token_sha256: s3cret-token\n",
            "engine.yaml:7:3: auth.webhook_token_sha256: expected 64 hex characters (`nightshift token` prints it; never the token itself), found 12 characters",
        ),
        (
            "auth:\n  webhook_tokens:\n    - {name: am, sha256: abc}\n",
            "engine.yaml:8:26: auth.webhook_tokens[am].sha256: expected 64 hex characters (sha256sum of the token), found 3 characters",
        ),
        // Issue 46 point 8: who acted must be one name each.
        (
            "auth:\n  tokens:\n    - {name: viewer, role: admin, sha256: '0000000000000000000000000000000000000000000000000000000000000000'}\n    - {name: viewer, role: viewer, sha256: '1111111111111111111111111111111111111111111111111111111111111111'}\n",
            "engine.yaml:9:8: auth.tokens[1].name: expected a name no other token has, found \"viewer\", the name of auth.tokens[0]: the audit could not tell who acted",
        ),
        (
            "auth:\n  tokens:\n    - {name: ana, role: admin, sha256: '0000000000000000000000000000000000000000000000000000000000000000'}\n  webhook_tokens:\n    - {name: ana, sha256: '1111111111111111111111111111111111111111111111111111111111111111'}\n",
            "engine.yaml:10:8: auth.webhook_tokens[0].name: expected a name no other token has, found \"ana\", the name of auth.tokens[0]: the audit could not tell who acted",
        ),
        (
            "auth:\n  tokens:\n    - {name: '<b>ana</b>', role: admin, sha256: '0000000000000000000000000000000000000000000000000000000000000000'}\n",
            "engine.yaml:8:8: auth.tokens[0].name: expected 1 to 64 letters, digits or `._-@` (the name the audit shows), found \"<b>ana</b>\"",
        ),
        (
            "auth:\n  tokens:\n    - {name: '', role: admin, sha256: '0000000000000000000000000000000000000000000000000000000000000000'}\n",
            "engine.yaml:8:8: auth.tokens[0].name: expected 1 to 64 letters, digits or `._-@` (the name the audit shows), found \"\"",
        ),
        (
            "notifications:\n  audit_anchor_every_secs: 5\n",
            "engine.yaml:7:3: notifications.audit_anchor_every_secs: expected 60 to 604800, found 5",
        ),
        ("telemetry:\n  interval_ms: 0\n", "engine.yaml:7:3: telemetry.interval_ms: expected 50 to 600000, found 0"),
        ("telemetry:\n  ingest_shards: 0\n", "engine.yaml:7:3: telemetry.ingest_shards: expected 1 to 64, found 0"),
        (
            "audit:\n  backend: postgres\n",
            "engine.yaml:7:3: audit.backend: postgres needs audit.postgres: {url_file: FILE} (or url_env: VAR)",
        ),
        (
            "audit:\n  backend: postgres\n  postgres: {url_file: u, url_env: V}\n",
            "engine.yaml:8:3: audit.postgres: expected exactly one of url_file and url_env, found both or neither",
        ),
        (
            "audit:\n  backend: postgres\n  postgres: {url_env: V, lease_ttl_ms: 2000, lease_renew_ms: 1500}\n",
            "engine.yaml:8:26: audit.postgres: expected lease_ttl_ms 1000 to 600000 and lease_renew_ms at most half of it, found 2000 and 1500",
        ),
        (
            "audit:\n  backend: postgres\n  postgres: {url_env: V, shard: 'a b'}\n",
            "engine.yaml:8:26: audit.postgres.shard: expected letters, digits, '-', '_' or '.', found \"a b\"",
        ),
        (
            "audit:\n  backend: mysql\n",
            "engine.yaml:7:12: audit.backend: unknown variant `mysql`, expected `sled` or `postgres`",
        ),
        (
            "notifications:\n  webhooks:\n    - {name: ops, url: 'http://x', max_attempts: 0}\n",
            "engine.yaml:8:14: notifications.webhooks[ops]: expected max_attempts 1 to 20 and timeout_secs at most 300, found 0 and 5",
        ),
        (
            "notifications:\n  webhooks:\n    - {name: am, url: 'http://am:9093/', format: alertmanager}\n",
            "engine.yaml:8:23: notifications.webhooks[am]: format alertmanager expects Alertmanager's v2 alerts endpoint (http://alertmanager:9093/api/v2/alerts), found \"http://am:9093/\"",
        ),
        (
            "notifications:\n  webhooks:\n    - {name: am, url: 'http://am:9093/api/v2/alerts', format: alertmanager, audit_anchors: true}\n",
            "engine.yaml:8:14: notifications.webhooks[am]: format alertmanager expects firing_secs 60 to 604800 and no audit_anchors (keep the head where it is not resolved away), found 3600 and true",
        ),
        (
            "notifications:\n  ui_url: ui.example\n",
            "engine.yaml:7:3: notifications.ui_url: expected the web UI's http:// or https:// URL, found \"ui.example\"",
        ),
    ];
    for (extra, want) in cases {
        let e = EngineConfig::parse(&format!("{base}{extra}"), Path::new("engine.yaml")).unwrap_err();
        assert_eq!(e.to_string(), want, "{extra}");
    }
}

/// Regression (issue 27 item 9: a first-line comment containing
/// "backend" made an error on line 9 point at `engine.yaml:1:52`): the
/// key is found by the parser — not in a comment, not in a value, and
/// the right one of several keys of that name.
#[test]
fn errors_point_at_the_key_not_at_a_comment_or_another_key_of_that_name() {
    let text = "# engine.yaml — the audit backend: sled unless set (see docs/HA.md, follow_ms too)\n\
                version: 1\n\
                listen_addr: 127.0.0.1:8080\n\
                data_dir: d\n\
                runbook_dir: r\n\
                inventory_path: f.yaml\n\
                engine_key_path: k\n\
                grafana: {url: 'http://backend:3000', dashboard_uid: backend}\n\
                audit:\n\
                \x20 backend: postgres   # backend: the database\n\
                \x20 postgres: {url_env: V, follow_ms: 5}\n";
    let e = EngineConfig::parse(text, Path::new("engine.yaml")).unwrap_err().to_string();
    assert_eq!(e, "engine.yaml:11:26: audit.postgres.follow_ms: expected 10 to 60000, found 5");
    let e = EngineConfig::parse(&text.replace("follow_ms: 5", "shard: 'a b'"), Path::new("engine.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("engine.yaml:11:26: audit.postgres.shard:"), "{e}");
    let e =
        EngineConfig::parse(&text.replace("  postgres: {url_env: V, follow_ms: 5}\n", ""), Path::new("engine.yaml"))
            .unwrap_err()
            .to_string();
    assert!(e.starts_with("engine.yaml:10:3: audit.backend: postgres needs audit.postgres"), "{e}");
}
