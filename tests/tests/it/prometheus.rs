//! The stack GPU teams run: a real Prometheus (Debian `prometheus`) scrapes
//! a sim agent's dcgm-exporter-compatible `/metrics`; the engine takes its
//! telemetry from Prometheus only (`stream_from_agents: false`) and a
//! threshold runbook fires on an injected fault and acts over SSH. The
//! Prometheus config, alert rules and Grafana dashboard are the ones in
//! `examples/`: the rules evaluate and every dashboard query returns data.
//! And `promtool check metrics` accepts the agent's and the engine's
//! `/metrics`, and the agent's series have the names, types and labels
//! dcgm-exporter gives them (its counters list and label template are in
//! `tests/fixtures/dcgm-exporter/`).

use std::time::Duration;

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::runs::RunOutcome;
use nightshift_proto::ssh::client::AgentConnection;
use nightshift_proto::*;
use nightshift_tests::external::{Daemon, free_port, require, start_prometheus};
use nightshift_tests::{TestAgent, engine_setup, eventually};

fn example(name: &str) -> String {
    let path = format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `examples/prometheus.yml` with only the targets, the token file and the
/// intervals changed.
fn example_prometheus_config(dir: &std::path::Path, exporter: &str, engine: &str) -> String {
    use serde_yaml::Value;
    let mut v: Value = serde_yaml::from_str(&example("prometheus.yml")).unwrap();
    v["global"]["scrape_interval"] = "1s".into();
    v["global"]["evaluation_interval"] = "1s".into();
    // Nothing listens there; Prometheus only logs that it cannot send.
    v["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] =
        Value::Sequence(vec![format!("127.0.0.1:{}", free_port()).into()]);
    let jobs = v["scrape_configs"].as_sequence_mut().unwrap();
    let mut seen = Vec::new();
    for job in jobs.iter_mut() {
        let name = job["job_name"].as_str().unwrap().to_string();
        let target = match name.as_str() {
            "dcgm" => exporter,
            "nightshift" => {
                job["authorization"]["credentials_file"] = dir.join("nightshift.token").display().to_string().into();
                engine
            }
            other => panic!("examples/prometheus.yml has a job this test does not know: {other}"),
        };
        job["static_configs"][0]["targets"] = Value::Sequence(vec![target.into()]);
        seen.push(name);
    }
    assert_eq!(seen, ["dcgm", "nightshift"]);
    serde_yaml::to_string(&v).unwrap()
}

/// Run every `expr` of `examples/grafana/nightshift-dashboard.json` (its
/// panels, the GPU panels with the `Hostname` and `gpu` variables set as a
/// person picking `host` and all GPUs would, its variables' queries and the
/// runs annotation) until each returns at least one series.
async fn dashboard_queries_return_data(prom_url: &str, prom: &Daemon, host: &str) {
    let dashboard: serde_json::Value = serde_json::from_str(&example("grafana/nightshift-dashboard.json")).unwrap();
    let set = |e: &str| e.replace("$Hostname", host).replace("$gpu", ".*");
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| set(t["expr"].as_str().unwrap()))
        .collect();
    let gpu_panels = exprs.iter().filter(|e| e.contains("DCGM_FI_DEV_")).count();
    assert!(gpu_panels >= 6, "the dashboard has {gpu_panels} GPU queries: {exprs:?}");
    for v in dashboard["templating"]["list"].as_array().unwrap().iter().filter(|v| v["type"] == "query") {
        // label_values(METRIC{…}, label) is Grafana's; Prometheus runs the selector.
        let q = v["query"]["query"].as_str().unwrap();
        let inner = q.trim_start_matches("label_values(").rsplit_once(',').unwrap().0;
        exprs.push(set(inner));
    }
    for a in dashboard["annotations"]["list"].as_array().unwrap() {
        exprs.push(set(a["expr"].as_str().unwrap()));
    }
    assert!(exprs.len() >= 20, "{exprs:?}");
    let http = reqwest::Client::new();
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut empty = Vec::new();
        for e in &exprs {
            let r: serde_json::Value = http
                .get(format!("{prom_url}/api/v1/query"))
                .query(&[("query", e.as_str())])
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(r["status"], "success", "the dashboard query {e} is not valid PromQL: {r}");
            // The HA panels have data only with an HA pair (this engine is
            // one, on sled): valid PromQL is all that is asked of them here.
            if r["data"]["result"].as_array().is_none_or(|a| a.is_empty()) && !e.starts_with("nightshift_ha_") {
                empty.push(e.clone());
            }
        }
        if empty.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < end,
            "dashboard queries with no data after 60 s: {empty:?}\nprometheus log:\n{}",
            prom.log_text()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_seen_through_prometheus_fires_a_runbook() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(prometheus) = require("prometheus", "prometheus") else { return };
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { profile: "rtx6000-ada".into(), gpus: 2, seed: 9, ..SimConfig::default() };
    let agent =
        TestAgent::start(dir.path(), "p1", sim, "sim_time_scale: 30\nexporter_listen_addr: 127.0.0.1:0\n").await;
    let exporter = agent.started.as_ref().unwrap().exporter_addr.expect("exporter listening");

    // The engine and its web server first: Prometheus scrapes its /metrics
    // with a viewer token, as examples/prometheus.yml says.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let web_addr = listener.local_addr().unwrap();
    let token = "prometheus-scrape-token-4f1c";
    std::fs::write(dir.path().join("nightshift.token"), token).unwrap();

    let config = example_prometheus_config(dir.path(), &exporter.to_string(), &web_addr.to_string());
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    std::fs::write(dir.path().join("prometheus-rules.yml"), example("prometheus-rules.yml")).unwrap();
    if let Some(promtool) = require("promtool", "prometheus") {
        let out = std::process::Command::new(promtool)
            .args(["check", "config"])
            .arg(dir.path().join("prometheus.yml"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool check config: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (prom, prom_url) = start_prometheus(
        &prometheus,
        &dir.path().join("prometheus.yml"),
        &dir.path().join("tsdb"),
        &[],
        &dir.path().join("prometheus.log"),
    )
    .await;

    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[(
            "cool-down",
            "trigger: {type: threshold, metric: gpu.temperature_c, above: 85, for_secs: 2, clear_below: 80}\nscope: gpu\n",
            "note(`hot: ${metric(\"gpu.temperature_c\")} C`);\nlet r = set_power_limit(150);\nif !r.ok { fail(r.error); }\nkeep_holds(600);\n",
        )],
        &format!(
            "telemetry: {{stream_from_agents: false}}\nsources:\n  prometheus: {{url: '{prom_url}', interval_secs: 1, timeout_secs: 2}}\n\
             auth: {{tokens: [{{name: prometheus, role: viewer, sha256: {}}}]}}\n",
            nightshift_web::auth::hash_token(token)
        ),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    let web = tokio::spawn(nightshift_web::serve(engine.clone(), listener, std::future::pending()));
    // Samples arrive through Prometheus (the agent stream is off).
    let flowing = eventually(60, || {
        (engine.counters().source_samples > 0
            && engine.latest("p1", Some(0), nightshift_engine::embed::ids::TEMPERATURE).is_some())
        .then_some(())
    })
    .await;
    assert!(flowing.is_some(), "no samples from Prometheus; its log:\n{}", prom.log_text());

    // The fault: a clogged heatsink on GPU 0.
    let c = AgentConnection::connect(&agent.client_config()).await.unwrap();
    let r = c
        .call(&Request::new("fault", Op::SimFault(SimFault::HeatsinkDegradation { gpu: 0, factor: 2.0 })))
        .await
        .unwrap();
    assert!(r.ok, "{r:?}");
    let run =
        eventually(120, || engine.runs(&Default::default()).unwrap().runs.into_iter().find(|r| r.outcome.is_some()))
            .await
            .unwrap_or_else(|| panic!("no run finished; prometheus log:\n{}", prom.log_text()));
    assert_eq!(run.runbook, "cool-down");
    assert_eq!((run.target.node.as_deref(), run.target.gpu), (Some("p1"), Some(0)));
    assert_eq!(run.outcome, Some(RunOutcome::Succeeded), "{run:?}");
    let t: Telemetry =
        serde_json::from_value(c.call(&Request::new("t", Op::Telemetry(NoArgs {}))).await.unwrap().result.unwrap())
            .unwrap();
    assert_eq!(t.gpus[0].power_limit_watts, 150.0);
    assert!(
        t.node_metrics.holds.iter().any(|h| h.owner == run.id && h.kept),
        "the run kept its cap: {:?}",
        t.node_metrics.holds
    );
    c.close().await;

    // Every query on the example Grafana dashboard runs on this Prometheus
    // and returns data: the dashboard and the engine's metric names agree.
    dashboard_queries_return_data(&prom_url, &prom, "p1").await;
    // The example alert rules load and evaluate.
    let rules: serde_json::Value =
        reqwest::get(format!("{prom_url}/api/v1/rules")).await.unwrap().json().await.unwrap();
    let healthy = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter(|r| r["health"] == "ok")
        .count();
    assert_eq!(healthy, 22, "all 22 example rules evaluate: {rules}");

    web.abort();
    engine.shutdown().await;
    drop(prom);
    let mut agent = agent;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_agent_and_engine_metrics() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(promtool) = require("promtool", "prometheus") else { return };
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { gpus: 2, ..SimConfig::default() };
    let agent = TestAgent::start(dir.path(), "m1", sim, "exporter_listen_addr: 127.0.0.1:0\n").await;
    let exporter = agent.started.as_ref().unwrap().exporter_addr.unwrap();
    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[("noop", "trigger: {type: manual}\nscope: node\n", "note(\"x\");\n")],
        "auth: {allow_anonymous: viewer}\n",
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let web_addr = listener.local_addr().unwrap();
    let web = tokio::spawn(nightshift_web::serve(engine.clone(), listener, std::future::pending()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let http = reqwest::Client::new();
    for (what, url) in
        [("agent exporter", format!("http://{exporter}/metrics")), ("engine", format!("http://{web_addr}/metrics"))]
    {
        let text = http.get(&url).send().await.unwrap().text().await.unwrap();
        assert!(text.contains("# TYPE"), "{what}: {text}");
        let mut child = std::process::Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let findings = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if what == "engine" {
            assert!(
                out.status.success(),
                "promtool check metrics rejects the engine's /metrics:\n{findings}\n--- the text:\n{text}"
            );
        } else {
            // dcgm-exporter's own naming draws two style findings; exactly
            // those are accepted (exit 3 is "lint problems", not a parse
            // error), and nothing else.
            assert!(
                out.status.success() || out.status.code() == Some(3),
                "promtool cannot parse the agent's /metrics ({}):\n{findings}\n--- the text:\n{text}",
                out.status
            );
            for line in findings.lines().filter(|l| !l.trim().is_empty()) {
                let (name, problem) = line.split_once(' ').unwrap_or((line, ""));
                let dcgm_style = name.starts_with("DCGM_FI_")
                    && (problem == "counter metrics should have \"_total\" suffix"
                        || problem == "metric name should not include type 'counter'"
                        || problem == "label names should be written in 'snake_case' not 'camelCase'");
                assert!(
                    dcgm_style,
                    "promtool finding beyond dcgm-exporter's own naming: {line:?}\n--- the text:\n{text}"
                );
            }
        }
    }
    web.abort();
    engine.shutdown().await;
    let mut agent = agent;
    agent.stop().await;
}

/// `(name, type, help)` of every field line in a dcgm-exporter counters
/// file, commented-out ones included (they document the type of fields that
/// are off by default).
fn counters_csv(text: &str) -> Vec<(String, String, String)> {
    let parse = |l: &str| {
        let mut parts = l.splitn(3, ',').map(str::trim);
        Some((parts.next()?.to_string(), parts.next()?.to_string(), parts.next()?.to_string()))
    };
    // Active lines first: where a field is listed twice, they win.
    let active = text.lines().map(str::trim).filter(|l| l.starts_with("DCGM_")).filter_map(parse);
    let commented = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix('#'))
        .map(str::trim)
        .filter(|l| l.starts_with("DCGM_"))
        .filter_map(parse);
    active.chain(commented).collect()
}

/// Every DCGM field the engine's Prometheus source reads is on in the
/// shipped counters list (`dcgm-exporter -f examples/dcgm-counters.csv`):
/// a field a runbook decides on but dcgm-exporter never serves is a signal
/// that is always absent (H9's SM activity was, until this test). Where
/// the engine knows several names for one reading, one of them is enough.
#[test]
fn the_shipped_counters_serve_every_dcgm_field_the_engine_reads() {
    let _serial = nightshift_tests::serial::module(module_path!());
    use nightshift_engine::embed::{DCGM_NAMES, dcgm_metric};
    let text = example("dcgm-counters.csv");
    let active: Vec<&str> =
        text.lines().map(str::trim).filter(|l| l.starts_with("DCGM_")).filter_map(|l| l.split(',').next()).collect();
    let mut missing = Vec::new();
    for name in DCGM_NAMES.iter().filter(|n| n.starts_with("DCGM_")) {
        let field = dcgm_metric(name);
        let served = DCGM_NAMES
            .iter()
            .filter(|other| dcgm_metric(other) == field)
            .any(|other| active.iter().any(|a| a.trim() == *other));
        if !served {
            missing.push(*name);
        }
    }
    assert!(missing.is_empty(), "fields the engine reads that examples/dcgm-counters.csv leaves off: {missing:?}");
}

/// The label names of dcgm-exporter's GPU series, in order, from its
/// template: no MIG, a hostname, and the label-type fields after.
fn dcgm_exporter_labels(template: &str, label_fields: &[String]) -> Vec<String> {
    let t = template.replace("{{ $metric.UUID }}", "UUID");
    // Leave out the MIG block; keep the hostname block's content.
    let mig_start = t.find("{{if $metric.MigProfile}}").unwrap();
    let mig_end = mig_start + t[mig_start..].find("{{end}}").unwrap() + "{{end}}".len();
    let t = format!("{}{}", &t[..mig_start], &t[mig_end..]);
    let body = &t[t.find("}{").unwrap() + 2..];
    let mut names: Vec<String> = body
        .split(',')
        .filter_map(|part| {
            let part = part.trim_start_matches("{{if $metric.Hostname }}");
            let (name, _) = part.split_once("=\"")?;
            Some(name.to_string())
        })
        .collect();
    names.extend(label_fields.iter().cloned());
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_exports_what_dcgm_exporter_exports() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let fixtures = format!("{}/fixtures/dcgm-exporter", env!("CARGO_MANIFEST_DIR"));
    let reference = counters_csv(&std::fs::read_to_string(format!("{fixtures}/default-counters.csv")).unwrap());
    let ours = counters_csv(&example("dcgm-counters.csv"));
    // Label-type fields on by default (active lines) become labels.
    let reference_text = std::fs::read_to_string(format!("{fixtures}/default-counters.csv")).unwrap();
    let label_fields: Vec<String> = reference_text
        .lines()
        .filter(|l| l.starts_with("DCGM_"))
        .filter_map(|l| {
            let mut parts = l.split(',').map(str::trim);
            let (name, kind) = (parts.next()?, parts.next()?);
            (kind == "label").then(|| name.to_string())
        })
        .collect();
    assert_eq!(label_fields, ["DCGM_FI_DRIVER_VERSION"], "the default label-type fields changed");
    let want_labels =
        dcgm_exporter_labels(&std::fs::read_to_string(format!("{fixtures}/gpu-metric.tmpl")).unwrap(), &label_fields);
    assert_eq!(want_labels, ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]);

    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { gpus: 2, ..SimConfig::default() };
    let agent = TestAgent::start(dir.path(), "m1", sim, "exporter_listen_addr: 127.0.0.1:0\n").await;
    let exporter = agent.started.as_ref().unwrap().exporter_addr.unwrap();
    let text = reqwest::get(format!("http://{exporter}/metrics")).await.unwrap().text().await.unwrap();
    let mut types = std::collections::BTreeMap::new();
    let mut helps = std::collections::BTreeMap::new();
    let mut series = 0;
    let mut nightshift_series = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_string(), kind.to_string());
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            helps.insert(name.to_string(), help.to_string());
        } else {
            let (name, rest) = line.split_once('{').unwrap_or_else(|| panic!("a series without labels: {line}"));
            let labels: Vec<&str> = rest.split("\",").map(|kv| kv.split_once('=').unwrap().0).collect();
            // nightshift's own series (not dcgm-exporter's) are about the
            // node, labelled by host only.
            if name.starts_with("nightshift_") {
                assert_eq!(labels, ["Hostname"], "labels of {line}");
                nightshift_series.push(line.to_string());
                continue;
            }
            assert_eq!(labels, want_labels, "labels of {line}");
            assert!(types.contains_key(name), "{name} has no # TYPE line before it");
            series += 1;
        }
    }
    assert!(series >= 2 * 15, "expected at least 15 fields for each of 2 GPUs, found {series} series:\n{text}");
    assert_eq!(nightshift_series, ["nightshift_agent_state_degraded{Hostname=\"m1\"} 0"], "{text}");
    for (name, kind) in types.iter().filter(|(n, _)| !n.starts_with("nightshift_")) {
        // Every field is in the counters file we ship (so dcgm-exporter run
        // with it exports the same series) with the same type…
        let shipped = ours.iter().find(|(n, _, _)| n == name);
        assert_eq!(shipped.map(|(_, t, _)| t.as_str()), Some(kind.as_str()), "{name} in examples/dcgm-counters.csv");
        // … and where dcgm-exporter's own list has it, type and help are its.
        if let Some((_, t, help)) = reference.iter().find(|(n, _, _)| n == name) {
            assert_eq!(t, kind, "type of {name}");
            assert_eq!(helps[name].trim_end_matches('.'), help.trim_end_matches('.'), "help of {name}");
        }
    }
    for needed in [
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ] {
        assert!(types.contains_key(needed), "{needed} missing from\n{text}");
    }
    // A flood of idle connections (more than the 64 served at once) does
    // not lock Prometheus out: each is dropped after the 5 s head deadline.
    const IDLE: usize = 80;
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        idle.push(tokio::net::TcpStream::connect(exporter).await.unwrap());
    }
    let started = std::time::Instant::now();
    let scrape = reqwest::Client::builder().timeout(Duration::from_secs(15)).build().unwrap();
    let r = scrape.get(format!("http://{exporter}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(12), "scraped after {:?}", started.elapsed());
    drop(idle);
    // Served by a real HTTP server: HEAD, 404 and a bad method answered.
    let http = reqwest::Client::new();
    let head = http.head(format!("http://{exporter}/metrics")).send().await.unwrap();
    assert_eq!(head.status(), 200);
    let missing = http.get(format!("http://{exporter}/nope")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    assert!(missing.text().await.unwrap().contains("try /metrics"));
    let post = http.post(format!("http://{exporter}/metrics")).send().await.unwrap();
    assert_eq!(post.status(), 405);
    let mut agent = agent;
    agent.stop().await;
}

/// The engine's exposition parser against Prometheus' own: a real
/// Prometheus scrapes a text full of the format's corners (escapes, odd
/// spacing, special values, UTF-8, comments) and what it stored must be
/// exactly what `parse_exposition` reads from the same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exposition_parser_reads_what_prometheus_reads() {
    let _serial = nightshift_tests::serial::module(module_path!());
    use nightshift_engine::embed::parse_exposition;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(prometheus) = require("prometheus", "prometheus") else { return };
    let text = concat!(
        "# HELP t_plain A gauge.\n",
        "# TYPE t_plain gauge\n",
        "t_plain 1\n",
        "t_labels{a=\"1\",b=\"x y\"} 2.5\n",
        "t_spaces {  a = \"1\" , b=\"2\" ,} 3\n",
        "t_escapes{q=\"say \\\"hi\\\"\",bs=\"C:\\\\dir\",nl=\"two\\nlines\",tab=\"a\\tb\"} 4\n",
        "t_utf8{gpu=\"0\",unit=\"°C → ok\"} -5e-3\n",
        "t_inf{s=\"+\"} +Inf\n",
        "t_inf{s=\"-\"} -Inf\n",
        "t_big 1.7976931348623157e308\n",
        "t_colon:sum 6\n",
        "# a comment line\n",
        "t_empty{e=\"\"} 7\n",
        "t_separators{run=\"a,b} c\",gpu=\"1\"} 8\n",
    );
    let (ours, bad) = parse_exposition(text);
    assert_eq!(bad, 0);
    // Serve it.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yml"),
        format!("global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: t\n    static_configs: [{{targets: ['{target}']}}]\n"),
    )
    .unwrap();
    let (prom, url) = start_prometheus(
        &prometheus,
        &dir.path().join("p.yml"),
        &dir.path().join("tsdb"),
        &[],
        &dir.path().join("prometheus.log"),
    )
    .await;
    let http = reqwest::Client::new();
    let mut theirs = Vec::new();
    for _ in 0..60 {
        let r: serde_json::Value = http
            .get(format!("{url}/api/v1/query"))
            .query(&[("query", "{__name__=~\"t_.*\"}")])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        theirs = nightshift_engine::embed::parse_query_response(&url, &serde_json::to_vec(&r).unwrap()).unwrap();
        if theirs.len() == ours.len() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(theirs.len(), ours.len(), "prometheus stored {theirs:?}\nlog:\n{}", prom.log_text());
    let key = |s: &nightshift_engine::embed::PromSample| {
        let mut l = s.labels.clone();
        l.remove("__name__");
        l.remove("job");
        l.remove("instance");
        (s.name.clone(), l)
    };
    for o in &ours {
        let t = theirs.iter().find(|t| key(t) == key(o)).unwrap_or_else(|| {
            panic!("prometheus has no series {:?}; it has {:?}", key(o), theirs.iter().map(key).collect::<Vec<_>>())
        });
        assert!(
            t.value == o.value || (t.value.is_nan() && o.value.is_nan()),
            "{:?}: {} vs {}",
            key(o),
            t.value,
            o.value
        );
    }
}

/// The shipped monitoring knows about standbys and pages people about
/// nightshift itself (issue 30): `promtool test rules` runs
/// `examples/prometheus-rules.test.yml` through Prometheus's own rule
/// engine (an HA pair: the standby's `nightshift_agents_connected 0` pages
/// nobody; the leader missing an agent does; no leader does), and `amtool`
/// routes nightshift's own alerts to people and GPU alerts to nightshift.
#[test]
fn the_shipped_rules_know_standbys_and_route_nightshifts_own_alerts_to_people() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if let Some(promtool) = require("promtool", "prometheus") {
        let out = std::process::Command::new(promtool)
            .args(["test", "rules", "examples/prometheus-rules.test.yml"])
            .current_dir(&repo)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool test rules: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every shipped rule has a case that makes it fire.
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo.join("examples/prometheus-rules.yml")).unwrap()).unwrap();
    let cases: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo.join("examples/prometheus-rules.test.yml")).unwrap())
            .unwrap();
    let fired: Vec<&str> = cases["tests"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_sequence().into_iter().flatten())
        .filter(|c| c["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty()))
        .filter_map(|c| c["alertname"].as_str())
        .collect();
    for g in rules["groups"].as_sequence().unwrap() {
        for r in g["rules"].as_sequence().unwrap() {
            if let Some(alert) = r["alert"].as_str() {
                assert!(
                    fired.contains(&alert),
                    "{alert} has no case in examples/prometheus-rules.test.yml that fires it"
                );
            }
        }
    }
    let Some(amtool) = require("amtool", "prometheus-alertmanager") else { return };
    let route = |labels: &[&str]| {
        let out = std::process::Command::new(&amtool)
            .args(["config", "routes", "test", "--config.file=examples/alertmanager.yml"])
            .args(labels)
            .current_dir(&repo)
            .output()
            .unwrap();
        assert!(out.status.success(), "amtool: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for own in ["NightshiftDown", "NightshiftNoLeader", "NightshiftAgentsDisconnected", "NightshiftAgentStateDegraded"]
    {
        assert_eq!(route(&["component=nightshift", &format!("alertname={own}")]), "on-call", "{own}");
    }
    // A GPU alert reaches nightshift and, through a route that waits 15
    // minutes (resolved by then: no page), the person.
    assert_eq!(route(&["alertname=GpuTempHigh", "Hostname=gpu-a1", "gpu=3"]), "nightshift,on-call-gpu");
    // nightshift's own pages go to people, never back to nightshift.
    assert_eq!(route(&["alertname=NightshiftEscalation", "component=nightshift", "Hostname=gpu-a1"]), "on-call");
    assert_eq!(route(&["alertname=NightshiftNotification", "component=nightshift", "Hostname=gpu-a1"]), "team-chat");
    let am: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo.join("examples/alertmanager.yml")).unwrap()).unwrap();
    let gpu_page = am["route"]["routes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|r| r["receiver"] == "on-call-gpu")
        .expect("a person's route for GPU alerts");
    assert_eq!(gpu_page["group_wait"], "15m", "nightshift gets its chance before a person is paged");
    // Every rule of the nightshift group carries the label that routes it.
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo.join("examples/prometheus-rules.yml")).unwrap()).unwrap();
    for g in rules["groups"].as_sequence().unwrap() {
        if g["name"] == "nightshift" {
            for r in g["rules"].as_sequence().unwrap() {
                assert_eq!(r["labels"]["component"], "nightshift", "{:?}", r["alert"]);
            }
        }
    }
}
