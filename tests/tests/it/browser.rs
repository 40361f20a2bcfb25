//! The web UI in a real browser: headless Chromium (Debian `chromium`),
//! driven through ChromeDriver's WebDriver API, against a running engine
//! with a small fleet of sim agents over SSH. The timeline shows the runs, a
//! new run appears without a reload, the run detail page shows its steps,
//! and screenshots are saved (`NIGHTSHIFT_SCREENSHOTS`, default
//! `target/screenshots`). In anonymous mode, a page on another local port
//! cannot post alerts, start runs or approve one.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::engine::RunRequest;
use nightshift_engine::runs::Target;
use nightshift_tests::external::{free_port, kill_processes_naming, processes_naming};
use nightshift_tests::{TestAgent, engine_setup, eventually};
use serde_json::{Value, json};

struct Driver {
    child: Child,
    url: String,
    session: String,
    http: reqwest::Client,
    /// The browser's own profile folder: every Chromium process of this
    /// driver names it on its command line.
    profile: PathBuf,
}

impl Drop for Driver {
    /// Nothing is left running (issue 56 point 8): the session is ended
    /// (chromedriver quits its Chromium), then chromedriver's whole process
    /// group is killed, and any Chromium of this profile still there after
    /// that (a renderer that outlived its parent) is killed too.
    fn drop(&mut self) {
        end_session(&self.url, &self.session);
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
        kill_processes_naming(&self.profile);
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// `DELETE /session/{id}` on a plain socket (no runtime in a `Drop`).
fn end_session(url: &str, session: &str) {
    use std::io::{Read, Write};
    let Some(addr) = url.strip_prefix("http://") else { return };
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let req =
        format!("DELETE /session/{session} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_ok() {
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
}

impl Driver {
    async fn start(width: u32, height: u32) -> Driver {
        let port = free_port();
        use std::os::unix::process::CommandExt;
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: the browsers it starts go with it.
            .process_group(0)
            .spawn()
            .expect("chromedriver is installed (Debian chromium-driver)");
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let mut ready = false;
        for _ in 0..100 {
            if let Ok(r) = http.get(format!("{url}/status")).send().await
                && r.status().is_success()
            {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ready, "chromedriver did not start");
        let profile = tempfile::tempdir().unwrap().keep();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.display()),
                ]
            }
        }}});
        let r: Value = http.post(format!("{url}/session")).json(&caps).send().await.unwrap().json().await.unwrap();
        let session = r["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {r}")).to_string();
        Driver { child, url, session, http, profile }
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.url, self.session);
        let mut rb = self.http.request(method, url);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let v: Value = rb.send().await.unwrap().json().await.unwrap();
        v["value"].clone()
    }

    async fn go(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await;
    }

    async fn js(&self, script: &str) -> Value {
        self.cmd(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": []}))).await
    }

    async fn screenshot(&self, name: &str) -> PathBuf {
        let b64 = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD.decode(b64.as_str().unwrap()).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let dir = std::env::var_os("NIGHTSHIFT_SCREENSHOTS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, png).unwrap();
        path
    }
}

/// Serve `html` to every request on a new loopback port (another site, as
/// far as the browser is concerned); returns its URL.
async fn serve_page(html: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", l.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else { return };
            let html = html.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
                    html.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    url
}

fn manual(runbook: &str, node: &str, gpu: u32, watts: &str) -> RunRequest {
    RunRequest {
        runbook: runbook.into(),
        target: Target::gpu(node, gpu),
        trigger: "manual".into(),
        detail: format!("manual run by user:browser-test on {node}/gpu{gpu}"),
        event: json!({"kind": "manual"}),
        event_ts_ms: nightshift_proto::clock::Clock::now_ms(&nightshift_proto::clock::SystemClock),
        params: [("watts".to_string(), watts.to_string())].into(),
        dry_run: false,
        requested_by: "user:browser-test".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeline_and_run_pages_in_chromium() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sim = SimConfig { profile: "h100-sxm".into(), gpus: 4, ..SimConfig::default() };
    let a = TestAgent::start(d, "gpu-a1", sim.clone(), "").await;
    let b = TestAgent::start(d, "gpu-a2", sim, "").await;
    let cfg = engine_setup(
        d,
        &[&a, &b],
        &[
            (
                "cap-power",
                "handbook: H1\ntrigger: {type: manual}\nscope: gpu\nparams:\n  watts: {type: float, default: 500}\n",
                "// H1 — cap a GPU's power by hand.\nnote(`capping GPU ${target.gpu} to ${params.watts} W`);\nlet r = set_power_limit(params.watts);\nif !r.ok { fail(r.error); }\nnote(\"done\");\n",
            ),
            ("careful", "trigger: {type: manual}\nscope: node\napproval: {always: true}\n", "note(\"approved\");\n"),
            ("on-alert", "trigger: {type: alert, alertname: GpuTempHigh}\nscope: node\n", "note(\"from an alert\");\n"),
        ],
        "auth:\n  allow_anonymous: operator\n",
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    eventually(20, || (engine.gauges().agents_connected == 2).then_some(())).await.expect("agents connected");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let web_engine = engine.clone();
    let mut stop = engine.shutdown_signal();
    let server = tokio::spawn(async move {
        nightshift_web::serve(web_engine, listener, async move {
            let _ = stop.wait_for(|v| *v).await;
        })
        .await
        .unwrap();
    });

    // Two runs before the page loads; one refused by the envelope.
    let r1 = engine.submit(manual("cap-power", "gpu-a1", 0, "450")).await.unwrap().run().unwrap().id.clone();
    let r2 = engine.submit(manual("cap-power", "gpu-a2", 1, "90")).await.unwrap().run().unwrap().id.clone();
    for id in [&r1, &r2] {
        eventually(20, || engine.run(id).unwrap().and_then(|r| r.outcome)).await.expect("run finished");
    }

    let driver = Driver::start(1280, 900).await;
    driver.go(&base).await;
    let text = driver.js("return document.body.innerText").await;
    let text = text.as_str().unwrap();
    assert!(text.contains(&r1) && text.contains(&r2), "the timeline lists the runs:\n{text}");
    assert!(text.contains("succeeded") && text.contains("failed"));
    // The live tail connects.
    let live = eventually(10, || Some(())).await;
    assert!(live.is_some());
    let mut connected = false;
    for _ in 0..50 {
        if driver.js("return document.getElementById('live').className").await == "live on" {
            connected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(connected, "the page's event stream is open");

    // A new run appears without a reload.
    let marker = driver.js("window.__marker = 42; return window.__marker").await;
    assert_eq!(marker, 42);
    let r3 = engine.submit(manual("cap-power", "gpu-a2", 2, "520")).await.unwrap().run().unwrap().id.clone();
    let mut appeared = false;
    for _ in 0..100 {
        let rows = driver.js("return document.getElementById('runs').innerText").await;
        if rows.as_str().unwrap_or("").contains(&r3) {
            appeared = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(appeared, "{r3} appeared live");
    assert_eq!(driver.js("return window.__marker").await, 42, "no reload happened");
    eventually(20, || engine.run(&r3).unwrap().and_then(|r| r.outcome)).await.expect("run finished");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let shot = driver.screenshot("timeline.png").await;
    eprintln!("saved {}", shot.display());

    // The run detail page: why, steps with before → after.
    driver.go(&format!("{base}/runs/{r1}")).await;
    let text = driver.js("return document.body.innerText").await;
    let text = text.as_str().unwrap().to_string();
    for needle in [
        "set_power_limit gpu=0 watts=450",
        "applied",
        "power limit 700 W → 450 W (held until the run releases it)",
        "capping GPU 0 to 450.0 W",
        "succeeded after 1 action",
    ] {
        assert!(text.contains(needle), "run page lacks {needle:?}:\n{text}");
    }
    driver.screenshot("run.png").await;
    driver.go(&format!("{base}/runs/{r2}")).await;
    let text = driver.js("return document.body.innerText").await;
    assert!(text.as_str().unwrap().contains("below the floor 200 W"), "the refusal is shown");

    // Other pages render.
    for (path, needle) in [
        ("/nodes/gpu-a1", "GPUs"),
        ("/runbooks/cap-power", "Script"),
        ("/audit", "Chain verified"),
        ("/approvals", "Nothing is waiting"),
    ] {
        driver.go(&format!("{base}{path}")).await;
        let text = driver.js("return document.body.innerText").await;
        assert!(text.as_str().unwrap().contains(needle), "{path}: {text}");
    }
    driver.go(&format!("{base}/nodes/gpu-a1")).await;
    driver.screenshot("node.png").await;

    // A double-bit ECC error on gpu-a2's GPU 3: the node page charts the
    // counter's step, marked with the fault's lifecycle.
    {
        use nightshift_proto::ssh::client::AgentTransport;
        use nightshift_proto::{Op, Request, SimFault};
        let c = b.client();
        let r = c.call(Request::new("browser-dbe", Op::SimFault(SimFault::EccDbe { gpu: 3, count: 1 }))).await.unwrap();
        assert!(r.ok, "{r:?}");
    }
    let mut charted = false;
    for _ in 0..100 {
        driver.go(&format!("{base}/nodes/gpu-a2")).await;
        let text = driver.js("return document.body.innerText").await;
        if text.as_str().unwrap_or("").contains("GPU 3: fault counters") {
            charted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(charted, "the node page charts GPU 3's fault counters");
    tokio::time::sleep(Duration::from_secs(3)).await;
    driver.go(&format!("{base}/nodes/gpu-a2")).await;
    driver
        .js("for (const c of document.querySelectorAll('figcaption')) { if (c.innerText.includes('fault counters')) { c.parentElement.scrollIntoView(); window.scrollBy(0, -300); } } return 1")
        .await;
    driver.screenshot("node-fault.png").await;

    // The audit browser: filter, open a record, see its link checked.
    driver.go(&format!("{base}/audit?kind=action_result")).await;
    let text = driver.js("return document.getElementById('audit-records').innerText").await;
    let text = text.as_str().unwrap().to_string();
    assert!(text.contains("set_power_limit applied") && !text.contains("run_started"), "{text}");
    driver.screenshot("audit.png").await;
    driver.js("document.querySelector('#audit-records a').click(); return 1").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let link = driver.js("return document.getElementById('record-link').innerText").await;
    assert!(link.as_str().unwrap_or("").contains("equals record"), "{link}");
    driver.screenshot("audit-record.png").await;

    // Anonymous mode (this server's) against a page on another local port:
    // it posts an alert with `no-cors` `text/plain`, a run to the JSON API,
    // and auto-submits an approval form. None of it gets anything done.
    let mut careful = manual("careful", "gpu-a1", 0, "1");
    careful.target = Target::node("gpu-a1");
    careful.params.clear();
    let pending = engine.submit(careful).await.unwrap().run().unwrap().id.clone();
    let runs_before = engine.runs(&Default::default()).unwrap().runs.len();
    let alert =
        json!({"version": "4", "status": "firing", "receiver": "nightshift", "groupLabels": {}, "commonLabels": {},
        "commonAnnotations": {}, "externalURL": "http://x", "groupKey": "g", "truncatedAlerts": 0,
        "alerts": [{"status": "firing", "labels": {"alertname": "GpuTempHigh", "instance": "gpu-a1:9400"},
            "annotations": {}, "startsAt": "2026-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://x", "fingerprint": "csrf"}]})
        .to_string();
    let evil = format!(
        r#"<!doctype html><html><body><form id="f" method="post" action="{base}/ui/runs/{pending}/approve"></form>
<script>
fetch("{base}/api/v1/alerts/alertmanager", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}}, body: {alert:?}}});
fetch("{base}/api/v1/runs", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}}, body: '{{"runbook":"cap-power","node":"gpu-a1","gpu":3}}'}});
setTimeout(() => document.getElementById("f").submit(), 300);
</script></body></html>"#
    );
    let evil_url = serve_page(evil).await;
    driver.go(&evil_url).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let landed = driver.js("return document.body.innerText").await;
    eprintln!("the approval form landed on: {landed}");
    let p = engine.run(&pending).unwrap().unwrap();
    assert_eq!(
        p.state,
        nightshift_engine::runs::RunState::PendingApproval,
        "a cross-site form approved {pending}: {p:?}"
    );
    assert!(p.approvals.is_empty(), "{p:?}");
    let runs_after = engine.runs(&Default::default()).unwrap().runs.len();
    assert_eq!(runs_after, runs_before, "a cross-site request started a run");
    assert!(
        !engine.audit().tail(0, usize::MAX).unwrap().iter().any(|r| r.data["fingerprint"] == "csrf"),
        "the cross-site alert was received"
    );
    drop(driver);

    // A phone: no horizontal overflow of the page itself.
    let phone = Driver::start(390, 844).await;
    phone.go(&format!("{base}/runs/{r1}")).await;
    let overflow = phone.js("return document.documentElement.scrollWidth <= window.innerWidth + 1").await;
    assert_eq!(overflow, true, "the run page fits a phone's width");
    phone.screenshot("run-phone.png").await;
    drop(phone);

    engine.shutdown().await;
    tokio::time::timeout(Duration::from_secs(10), server).await.expect("the server stops (SSE streams end)").unwrap();
}

fn no_params(mut r: RunRequest) -> RunRequest {
    r.params.clear();
    r
}

impl Driver {
    /// Click the element `css` selects (a real click: the page's own
    /// handlers run).
    async fn click(&self, css: &str) {
        let e = self.cmd(reqwest::Method::POST, "/element", Some(json!({"using": "css selector", "value": css}))).await;
        let id = e
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(|v| v.as_str())
            .unwrap_or_else(|| panic!("no {css}: {e}"));
        self.cmd(reqwest::Method::POST, &format!("/element/{id}/click"), Some(json!({}))).await;
    }

    /// The open dialog's text (a `confirm`), answered yes or no.
    async fn answer_dialog(&self, yes: bool) -> String {
        let mut text = Value::Null;
        for _ in 0..50 {
            text = self.cmd(reqwest::Method::GET, "/alert/text", None).await;
            if text.is_string() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let text = text.as_str().unwrap_or_else(|| panic!("no dialog opened: {text}")).to_string();
        let path = if yes { "/alert/accept" } else { "/alert/dismiss" };
        self.cmd(reqwest::Method::POST, path, Some(json!({}))).await;
        text
    }
}

/// A person's controls in Chromium (issue 30): on the node page, release a
/// kept hold (the confirmation dismissed first: nothing happens; then
/// accepted) and resume a node under a sticky RMA drain; on the run page,
/// cancel a running run; hands-off from the node page. Each change is
/// checked on the agent and in the audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_controls_holds_nodes_and_runs_from_the_ui() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sim = SimConfig { profile: "h100-sxm".into(), gpus: 2, ..SimConfig::default() };
    let a = TestAgent::start(d, "gpu-a1", sim.clone(), "").await;
    let b = TestAgent::start(d, "gpu-a2", sim, "").await;
    let cfg = engine_setup(
        d,
        &[&a, &b],
        &[
            (
                "keep-cap",
                "trigger: {type: manual}\nscope: gpu\n",
                "let r = set_power_limit(480);\nif !r.ok { fail(r.error); }\nkeep_holds(3600);\n",
            ),
            (
                "rma",
                "trigger: {type: manual}\nscope: node\nsticky_drain: true\n",
                "let r = drain_sticky(\"GPU 1 to be replaced\");\nif !r.ok { fail(r.error); }\n",
            ),
            (
                "slow",
                "trigger: {type: manual}\nscope: gpu\ntimeout_secs: 900\n",
                "note(\"waiting\");\nsleep(600);\nnote(\"woke\");\n",
            ),
        ],
        "auth:\n  allow_anonymous: admin\n",
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    eventually(20, || (engine.gauges().agents_connected == 2).then_some(())).await.expect("agents connected");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let web_engine = engine.clone();
    let mut stop = engine.shutdown_signal();
    let server = tokio::spawn(async move {
        nightshift_web::serve(web_engine, listener, async move {
            let _ = stop.wait_for(|v| *v).await;
        })
        .await
        .unwrap();
    });
    let agent_a = a.started.as_ref().unwrap().agent.clone();
    let agent_b = b.started.as_ref().unwrap().agent.clone();
    let power = |agent: &std::sync::Arc<nightshift_agent::service::Agent>| {
        agent.backend().sample().unwrap().0[1].power_limit_watts
    };
    let person_intent = |op: &str| {
        engine.audit().tail(0, usize::MAX).unwrap().into_iter().any(|r| {
            r.kind == nightshift_engine::audit::RecordKind::ActionIntent
                && r.data["op"] == op
                && r.actor == "user:anonymous"
                && r.data["owner"] == "person:anonymous"
        })
    };

    // A kept cap on gpu-a1 GPU 1.
    let id = engine.submit(no_params(manual("keep-cap", "gpu-a1", 1, "1"))).await.unwrap().run().unwrap().id.clone();
    eventually(20, || engine.run(&id).unwrap().and_then(|r| r.outcome)).await.expect("run finished");
    assert_eq!(power(&agent_a), 480.0);
    let driver = Driver::start(1280, 1000).await;
    driver.go(&format!("{base}/nodes/gpu-a1")).await;
    driver.screenshot("node-holds.png").await;
    driver
        .js("document.querySelector('form.release input[name=reason]').value = 'the cap is no longer needed'; return 1")
        .await;
    // Asked first; "no" changes nothing.
    driver.click("form.release button").await;
    let asked = driver.answer_dialog(false).await;
    assert!(asked.contains("Release") && asked.contains(&id) && asked.contains("480 W"), "{asked}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(power(&agent_a), 480.0, "dismissed: still held");
    assert!(!person_intent("release"));
    // "Yes" releases it, as the person.
    driver.click("form.release button").await;
    driver.answer_dialog(true).await;
    eventually(10, || (power(&agent_a) == 700.0).then_some(())).await.expect("released on the agent");
    // The agent forgets the setting just after its restore: wait for it
    // (seen once under the full suite's load: 700 W, the empty entry still
    // listed).
    let forgotten = eventually(10, || agent_a.held().is_empty().then_some(())).await;
    assert!(forgotten.is_some(), "{:?}", agent_a.held());
    assert!(person_intent("release"), "the release is audited as the person");
    let text = driver.js("return document.body.innerText").await;
    assert!(text.as_str().unwrap().contains("None: every setting is as the device had it"), "{text}");

    // A sticky RMA drain on gpu-a2, ended from its node page.
    let mut rma = manual("rma", "gpu-a2", 0, "1");
    rma.target = Target::node("gpu-a2");
    rma.params.clear();
    let id = engine.submit(rma).await.unwrap().run().unwrap().id.clone();
    eventually(20, || engine.run(&id).unwrap().and_then(|r| r.outcome)).await.expect("run finished");
    let drained = |agent: &std::sync::Arc<nightshift_agent::service::Agent>| {
        agent.held().iter().any(|s| matches!(s.effective, nightshift_proto::HoldValue::NodeDrain { drained: true, .. }))
    };
    assert!(drained(&agent_b));
    eventually(10, || engine.node("gpu-a2").filter(|n| n.state.drained).map(|_| ())).await.expect("the engine sees it");
    driver.go(&format!("{base}/nodes/gpu-a2")).await;
    driver
        .js("document.querySelector('form.resume input[name=reason]').value = 'GPU 1 replaced and tested'; return 1")
        .await;
    driver.click("form.resume button").await;
    let asked = driver.answer_dialog(true).await;
    assert!(asked.contains("back into service") && asked.contains("RMA"), "{asked}");
    eventually(10, || (!drained(&agent_b)).then_some(())).await.expect("resumed on the agent");
    assert!(person_intent("resume"));

    // Hands-off from the node page (admin), asked first.
    driver.go(&format!("{base}/nodes/gpu-a2")).await;
    driver.js("document.querySelector('form.hands-off input[name=reason]').value = 'firmware update'; return 1").await;
    driver.click("form.hands-off button").await;
    assert!(driver.answer_dialog(true).await.contains("hands-off"));
    eventually(10, || engine.node("gpu-a2").filter(|n| n.state.hands_off()).map(|_| ())).await.expect("hands-off set");

    // A running run, cancelled from its page.
    let id = engine.submit(no_params(manual("slow", "gpu-a1", 0, "1"))).await.unwrap().run().unwrap().id.clone();
    eventually(20, || {
        engine.run(&id).unwrap().filter(|r| r.state == nightshift_engine::runs::RunState::Running).map(|_| ())
    })
    .await
    .expect("running");
    driver.go(&format!("{base}/runs/{id}")).await;
    driver.click("form.cancel button").await;
    assert!(driver.answer_dialog(true).await.contains(&format!("Cancel run {id}")));
    let outcome = eventually(20, || engine.run(&id).unwrap().and_then(|r| r.outcome)).await.expect("it ended");
    assert_eq!(outcome, nightshift_engine::runs::RunOutcome::Cancelled);
    // The morning after: the timeline says what the people did beside the
    // runs — the release, the resume, the hands-off, the cancel — each with
    // its reason.
    driver.go(&base).await;
    let people = driver.js("return document.querySelector('details.people').innerText").await;
    let people = people.as_str().unwrap_or_default();
    for said in [
        "release applied — the cap is no longer needed",
        "resume applied — GPU 1 replaced and tested",
        "hands-off set: firmware update",
        "cancelled",
    ] {
        assert!(people.contains(said), "the timeline's people box says {said:?}:\n{people}");
    }
    driver.screenshot("timeline-people.png").await;
    let profile = driver.profile.clone();
    drop(driver);
    // Nothing of the browser is left running after the test (issue 56
    // point 8): a Chromium that outlived chromedriver was the suite's
    // leftover.
    let left = processes_naming(&profile);
    assert!(left.is_empty(), "browser processes left running: {left:?}");
    engine.shutdown().await;
    tokio::time::timeout(Duration::from_secs(10), server).await.expect("the server stops").unwrap();
}

/// Issue 43 point 5: the nodes page of a 1,000-node fleet (8 GPUs each, four
/// pools, two GPUs sent for replacement) grouped by pool and sorted worst
/// first, and the fleet page, in Chromium. How long the browser takes is
/// printed (`--nocapture`), not asserted; the test holds the shape: every
/// node a row under its pool's header, the worst first, no page wider than
/// the window. Screenshots: `nodes-1000.png`, `fleet.png`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_node_fleet_in_chromium() {
    let _serial = nightshift_tests::serial::module(module_path!());
    use nightshift_engine::config::{AuthConfig, Role};
    use nightshift_sim::fleet::{SimFleet, SimFleetOptions, SimNodeSpec, scratch_dir};
    let rb = tempfile::tempdir().unwrap();
    std::fs::write(
        rb.path().join("fault.yaml"),
        "version: 1\nname: fault\ndescription: a GPU to replace (test)\nscript: fault.rhai\ntrigger: {type: manual}\nscope: gpu\n",
    )
    .unwrap();
    std::fs::write(
        rb.path().join("fault.rhai"),
        "declare_fault(\"dbe\", 48, \"double-bit ECC errors (test)\");\nlet r = rma(\"replace it (test)\");\nif !r.ok { fail(`${r}`); }\n",
    )
    .unwrap();
    let script = std::sync::Arc::new(nightshift_engine::embed::build_engine(&Default::default()));
    let set = nightshift_engine::embed::load_dir(rb.path(), &script);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let pools = ["train", "infer", "eval", "dev"];
    let nodes = (0..1000)
        .map(|i| SimNodeSpec {
            labels: [("pool".to_string(), pools[i % 4].to_string()), ("rack".to_string(), format!("r{:02}", i / 40))]
                .into(),
            ..SimNodeSpec::new(&format!("n{i:04}"), "h100-sxm", 8)
        })
        .collect();
    let mut opts = SimFleetOptions::new(nodes, set, script);
    opts.auth = AuthConfig { allow_anonymous: Some(Role::Viewer), ..AuthConfig::default() };
    let dir = scratch_dir().unwrap();
    let sim = SimFleet::start(opts, dir.path()).await.unwrap();
    for _ in 0..5 {
        sim.step().await.unwrap();
    }
    let mut ids = Vec::new();
    for (node, gpu) in [("n0517", 3), ("n0042", 0)] {
        let mut r = manual("fault", node, gpu, "0");
        r.params.clear();
        ids.push(sim.engine.submit(r).await.unwrap().run().unwrap().id.clone());
    }
    for _ in 0..200 {
        if ids.iter().all(|id| sim.engine.run(id).unwrap().is_some_and(|r| r.outcome.is_some())) {
            break;
        }
        sim.step().await.unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(nightshift_web::serve(sim.engine.clone(), listener, async move {
        let _ = stopped.await;
    }));

    let driver = Driver::start(1440, 1000).await;
    let measure = "const t = performance.getEntriesByType('navigation')[0]; \
        return {response_ms: t.responseEnd - t.startTime, loaded_ms: t.loadEventEnd - t.startTime, \
        bytes: t.transferSize, rows: document.querySelectorAll('tbody tr').length, \
        groups: document.querySelectorAll('tr.group').length, \
        wide: document.documentElement.scrollWidth > window.innerWidth, \
        first: [...document.querySelectorAll('tr.group')].map(g => g.nextElementSibling.querySelector('a').textContent)}";
    driver.go(&format!("{base}/nodes?group=pool&sort=health")).await;
    let m = driver.js(measure).await;
    eprintln!("/nodes, 1,000 nodes grouped by pool, in Chromium: {m}");
    assert_eq!(m["rows"], 1004, "1,000 nodes and 4 group headers: {m}");
    assert_eq!(m["groups"], 4, "{m}");
    assert_eq!(m["wide"], false, "the page fits the window: {m}");
    let firsts: Vec<&str> = m["first"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(firsts.contains(&"n0517") && firsts.contains(&"n0042"), "the worst lead their pools: {firsts:?}");
    driver.screenshot("nodes-1000.png").await;
    driver.go(&format!("{base}/fleet")).await;
    let m = driver.js(measure).await;
    eprintln!("/fleet, 1,000 nodes, in Chromium: {m}");
    assert_eq!(m["wide"], false, "{m}");
    let text = driver.js("return document.body.innerText").await;
    assert!(text.as_str().unwrap().contains("1000 nodes, 8000 GPUs"), "{text}");
    driver.screenshot("fleet.png").await;
    let _ = stop.send(());
    let _ = server.await;
}
