//! The engine's front door over HTTP: [`EngineApi`] for a [`Remote`]
//! server, each operation one call of the path the web crate serves it at
//! (`web/src/lib.rs`), with the same request and reply types. The embedded
//! engine answers the same trait in this process
//! (`nightshift_engine::api::Session`); `Conn` picks one.

use std::time::Duration;

use anyhow::{Result, anyhow};
use serde::Serialize;
use serde::de::DeserializeOwned;

use nightshift_engine::api::{
    AgentHolds, AgentPing, ApiErrorBody, AuditHead, Cancel, Cancelled, ControlReply, EngineApi, FleetModeView, HaReply,
    HandsOff, HandsOffReply, HealthCheckReply, NewWindow, NodeDetail, NodeHealth, NodePage, NodesQuery, Plan, Reason,
    RecordsQuery, Refused, ReleaseHolds, ReloadReply, Repaired, Reply, RunDetail, RunSummary, RunbookDetail,
    RunbookList, RunbookModeReply, RunsQuery, SetFleetMode, SetRunbookMode, ShadowReport, SimFaultReply, StartRun,
    Verifying, WindowReply, Windows,
};
use std::collections::BTreeMap;

use nightshift_engine::audit::pg::ShardRunPage;
use nightshift_engine::audit::{AuditRecord, RunPage, VerifyReport};
use nightshift_engine::engine::Submitted;
use nightshift_proto::NoArgs;
use reqwest::Method;

use crate::Fail;
use crate::out::urlencode;

/// A running server.
pub struct Remote {
    pub url: String,
    http: reqwest::Client,
    token: Option<String>,
}

pub(crate) fn unreachable(url: &str, e: reqwest::Error) -> anyhow::Error {
    anyhow::Error::new(Fail(4))
        .context(format!("the engine at {url} is unreachable: {e}; is `nightshift serve` running?"))
}

impl Remote {
    pub fn new(url: &str, token: Option<String>) -> Result<Remote> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
        Ok(Remote { url: url.trim_end_matches('/').to_string(), http, token })
    }

    pub(crate) fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.url));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// One request: the answer's status and body, or a refusal with
    /// status 0 when the server was not reached.
    async fn exchange(&self, rb: reqwest::RequestBuilder) -> Result<(reqwest::StatusCode, String), Refused> {
        let (status, _, body) = self.exchange_with_headers(rb).await?;
        Ok((status, body))
    }

    /// [`Remote::exchange`], with the answer's headers.
    async fn exchange_with_headers(
        &self,
        rb: reqwest::RequestBuilder,
    ) -> Result<(reqwest::StatusCode, reqwest::header::HeaderMap, String), Refused> {
        let unreached = |e: reqwest::Error| {
            Refused::new(
                0,
                "unreachable",
                format!("the engine at {} is unreachable: {e}; is `nightshift serve` running?", self.url),
            )
        };
        let resp = rb.send().await.map_err(unreached)?;
        let (status, headers) = (resp.status(), resp.headers().clone());
        Ok((status, headers, resp.text().await.map_err(unreached)?))
    }

    /// An answer's body as `T`, or the error it carries (with the exit code
    /// its status means).
    pub(crate) fn answer<T: DeserializeOwned>(&self, status: reqwest::StatusCode, body: String) -> Result<T> {
        self.read(status, &body).map_err(crate::remote::fail)
    }

    /// An answer's body as `T`, or the engine's refusal (its status, code
    /// and message, the server named).
    pub(crate) fn read<T: DeserializeOwned>(&self, status: reqwest::StatusCode, body: &str) -> Result<T, Refused> {
        if !status.is_success() {
            let err = serde_json::from_str::<ApiErrorBody>(body).ok().map(|b| b.error);
            let msg = err.as_ref().map(|e| e.message.clone()).unwrap_or_else(|| body.chars().take(300).collect());
            let code = err.map(|e| e.code).unwrap_or_else(|| "http".into());
            let hint = if status.as_u16() == 401 { " (set NIGHTSHIFT_TOKEN or --token)" } else { "" };
            return Err(Refused::new(status.as_u16(), &code, format!("{} {status}: {msg}{hint}", self.url)));
        }
        serde_json::from_str(body)
            .map_err(|e| Refused::new(500, "bad_reply", format!("unexpected reply from {}: {e}", self.url)))
    }

    /// A person's control: what was done, also on a 409 whose body says
    /// what the agent refused (its `error`); a 409 without one (a guard of
    /// the engine's) is a refusal.
    async fn control(&self, path: String, body: impl Serialize) -> Result<ControlReply, Refused> {
        let (status, text) = self.exchange(self.req(Method::POST, &path).json(&body)).await?;
        if status.as_u16() == 409
            && let Ok(v) = serde_json::from_str::<ControlReply>(&text)
        {
            return Ok(v);
        }
        self.read(status, &text)
    }

    /// The SSE live tail, as a stream of records, until `each` says stop.
    /// Events are parsed by `eventsource-stream` (a UTF-8 character split
    /// across network chunks stays whole); when the stream drops, it
    /// reconnects with `Last-Event-ID`, so nothing is skipped or repeated.
    pub async fn follow(&self, mut each: impl FnMut(AuditRecord) -> bool) -> Result<()> {
        use eventsource_stream::Eventsource;
        use futures::StreamExt;
        let mut last_id: Option<String> = None;
        let mut failures = 0u32;
        loop {
            let mut req = self.req(reqwest::Method::GET, "/api/v1/events/stream").timeout(Duration::from_secs(86_400));
            if let Some(id) = &last_id {
                req = req.header("Last-Event-ID", id);
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) if last_id.is_none() => return Err(unreachable(&self.url, e)),
                Err(e) => {
                    failures += 1;
                    eprintln!("the live tail dropped ({e}); reconnecting");
                    tokio::time::sleep(retry_delay(failures)).await;
                    continue;
                }
            };
            if !resp.status().is_success() {
                return Err(anyhow!("{}: {}", self.url, resp.status()));
            }
            failures = 0;
            let mut events = resp.bytes_stream().eventsource();
            while let Some(ev) = events.next().await {
                let ev = match ev {
                    Ok(ev) => ev,
                    Err(e) => {
                        eprintln!("the live tail dropped ({e}); reconnecting");
                        break;
                    }
                };
                if !ev.id.is_empty() {
                    last_id = Some(ev.id.clone());
                }
                match serde_json::from_str::<AuditRecord>(ev.data.trim()) {
                    Ok(r) => {
                        if !each(r) {
                            return Ok(());
                        }
                    }
                    Err(e) if !ev.data.trim().is_empty() => {
                        eprintln!(
                            "skipping an event that is not an audit record ({e}): {}",
                            ev.data.chars().take(200).collect::<String>()
                        );
                    }
                    Err(_) => {}
                }
            }
            failures += 1;
            tokio::time::sleep(retry_delay(failures)).await;
        }
    }
}

/// Wait before reconnect `n` (1-based): doubling from 250 ms to 30 s, each
/// with ±50 % jitter so many clients do not come back in lockstep.
pub fn retry_delay(n: u32) -> Duration {
    let base = (250u64 << n.saturating_sub(1).min(7)).min(30_000);
    let jitter = rand::random_range(0.5..1.5);
    Duration::from_millis((base as f64 * jitter) as u64)
}

/// A refusal as this CLI exits with it: 3 a conflict or a self-approval, 2
/// what was asked does not fit (400, 401, 403, 404, 413), 4 the engine or
/// its agent was not reached (0, 502), 1 anything else.
pub fn fail(r: Refused) -> anyhow::Error {
    let code = match (r.status, r.code.as_str()) {
        (_, "self_approval") | (409, _) => 3,
        (400 | 401 | 403 | 404 | 413, _) => 2,
        (0 | 502, _) => 4,
        _ => 1,
    };
    anyhow::Error::new(Fail(code)).context(r.message)
}

impl Remote {
    /// One call and its answer as `T`, or the refusal (status 0: the
    /// server was not reached).
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<T, Refused> {
        let mut rb = self.req(method, path);
        if let Some(b) = body {
            rb = rb.json(b);
        }
        let (status, text) = self.exchange(rb).await?;
        self.read(status, &text)
    }

    fn get_op<'a, T: DeserializeOwned + Send + 'a>(&'a self, path: String) -> Reply<'a, T> {
        Box::pin(async move { self.call(Method::GET, &path, None::<&NoArgs>).await })
    }

    fn post_op<'a, T: DeserializeOwned + Send + 'a, B: serde::Serialize + Send + Sync + 'a>(
        &'a self,
        path: String,
        body: B,
    ) -> Reply<'a, T> {
        Box::pin(async move { self.call(Method::POST, &path, Some(&body)).await })
    }
}

impl EngineApi for Remote {
    fn runs(&self, query: RunsQuery) -> Reply<'_, RunPage> {
        Box::pin(async move {
            let (status, text) = self.exchange(self.req(Method::GET, "/api/v1/runs").query(&query)).await?;
            self.read(status, &text)
        })
    }

    fn nodes(&self, query: NodesQuery) -> Reply<'_, NodePage> {
        Box::pin(async move {
            let (status, headers, text) =
                self.exchange_with_headers(self.req(Method::GET, "/api/v1/nodes").query(&query)).await?;
            let nodes = self.read(status, &text)?;
            let next_cursor = headers.get("next-cursor").and_then(|v| v.to_str().ok()).map(str::to_string);
            Ok(NodePage { nodes, next_cursor })
        })
    }

    fn node<'a>(&'a self, name: &'a str) -> Reply<'a, NodeDetail> {
        self.get_op(format!("/api/v1/nodes/{}", urlencode(name)))
    }

    fn approvals(&self) -> Reply<'_, Vec<RunSummary>> {
        self.get_op("/api/v1/approvals".into())
    }

    fn runs_all_shards(&self, query: RunsQuery) -> Reply<'_, ShardRunPage> {
        Box::pin(async move {
            let query = RunsQuery { shards: Some("all".into()), ..query };
            let (status, text) = self.exchange(self.req(Method::GET, "/api/v1/runs").query(&query)).await?;
            self.read(status, &text)
        })
    }

    fn run<'a>(&'a self, id: &'a str) -> Reply<'a, RunDetail> {
        self.get_op(format!("/api/v1/runs/{}", urlencode(id)))
    }

    fn plan(&self, body: StartRun) -> Reply<'_, Plan> {
        self.post_op("/api/v1/runs/plan".into(), body)
    }

    fn cancel<'a>(&'a self, run: &'a str, body: Cancel) -> Reply<'a, Cancelled> {
        self.post_op(format!("/api/v1/runs/{}/cancel", urlencode(run)), body)
    }

    fn node_health<'a>(&'a self, node: &'a str) -> Reply<'a, NodeHealth> {
        self.get_op(format!("/api/v1/nodes/{}/health", urlencode(node)))
    }

    fn health_check<'a>(&'a self, node: &'a str) -> Reply<'a, HealthCheckReply> {
        self.post_op(format!("/api/v1/agents/{}/health-check", urlencode(node)), NoArgs {})
    }

    fn repaired<'a>(&'a self, node: &'a str, body: Repaired) -> Reply<'a, Verifying> {
        self.post_op(format!("/api/v1/nodes/{}/repaired", urlencode(node)), body)
    }

    fn ping<'a>(&'a self, node: &'a str) -> Reply<'a, AgentPing> {
        self.get_op(format!("/api/v1/agents/{}/ping", urlencode(node)))
    }

    fn holds<'a>(&'a self, node: &'a str) -> Reply<'a, AgentHolds> {
        self.get_op(format!("/api/v1/agents/{}/holds", urlencode(node)))
    }

    fn fleet_mode(&self) -> Reply<'_, FleetModeView> {
        self.get_op("/api/v1/fleet/mode".into())
    }

    fn set_fleet_mode(&self, body: SetFleetMode) -> Reply<'_, FleetModeView> {
        self.post_op("/api/v1/fleet/mode".into(), body)
    }

    fn windows(&self) -> Reply<'_, Windows> {
        self.get_op("/api/v1/maintenance".into())
    }

    fn runbooks(&self) -> Reply<'_, RunbookList> {
        self.get_op("/api/v1/runbooks".into())
    }

    fn runbook<'a>(&'a self, name: &'a str) -> Reply<'a, RunbookDetail> {
        self.get_op(format!("/api/v1/runbooks/{}", urlencode(name)))
    }

    fn set_runbook_mode<'a>(&'a self, name: &'a str, body: SetRunbookMode) -> Reply<'a, RunbookModeReply> {
        self.post_op(format!("/api/v1/runbooks/{}/mode", urlencode(name)), body)
    }

    fn shadow_report<'a>(
        &'a self,
        name: &'a str,
        since_ms: Option<i64>,
        limit: Option<usize>,
    ) -> Reply<'a, ShadowReport> {
        let mut q = Vec::new();
        q.extend(since_ms.map(|s| format!("since_ms={s}")));
        q.extend(limit.map(|l| format!("limit={l}")));
        self.get_op(format!("/api/v1/runbooks/{}/shadow?{}", urlencode(name), q.join("&")))
    }

    fn audit_head(&self) -> Reply<'_, AuditHead> {
        self.get_op("/api/v1/audit/head".into())
    }

    fn records(&self, query: RecordsQuery) -> Reply<'_, Vec<AuditRecord>> {
        Box::pin(async move {
            let (status, text) = self.exchange(self.req(Method::GET, "/api/v1/audit/records").query(&query)).await?;
            self.read(status, &text)
        })
    }

    fn verify(&self) -> Reply<'_, VerifyReport> {
        self.get_op("/api/v1/audit/verify".into())
    }

    fn verify_shards(&self) -> Reply<'_, BTreeMap<String, VerifyReport>> {
        self.get_op("/api/v1/audit/verify?shards=all".into())
    }

    fn ha(&self) -> Reply<'_, HaReply> {
        self.get_op("/api/v1/ha".into())
    }

    fn submit(&self, body: StartRun, idempotency_key: Option<String>) -> Reply<'_, Submitted> {
        Box::pin(async move {
            let mut rb = self.req(Method::POST, "/api/v1/runs").json(&body);
            if let Some(k) = &idempotency_key {
                rb = rb.header("Idempotency-Key", k);
            }
            let (status, text) = self.exchange(rb).await?;
            self.read(status, &text)
        })
    }

    fn approve<'a>(&'a self, run: &'a str) -> Reply<'a, RunSummary> {
        self.post_op(format!("/api/v1/runs/{}/approve", urlencode(run)), NoArgs {})
    }

    fn reject<'a>(&'a self, run: &'a str, body: Reason) -> Reply<'a, RunSummary> {
        self.post_op(format!("/api/v1/runs/{}/reject", urlencode(run)), body)
    }

    fn release<'a>(&'a self, node: &'a str, body: ReleaseHolds) -> Reply<'a, ControlReply> {
        Box::pin(self.control(format!("/api/v1/nodes/{}/holds/release", urlencode(node)), body))
    }

    fn resume<'a>(&'a self, node: &'a str, body: Reason) -> Reply<'a, ControlReply> {
        Box::pin(self.control(format!("/api/v1/nodes/{}/resume", urlencode(node)), body))
    }

    fn drain<'a>(&'a self, node: &'a str, body: Reason) -> Reply<'a, ControlReply> {
        Box::pin(self.control(format!("/api/v1/nodes/{}/drain", urlencode(node)), body))
    }

    fn hands_off<'a>(&'a self, node: &'a str, body: HandsOff) -> Reply<'a, HandsOffReply> {
        self.post_op(format!("/api/v1/nodes/{}/hands-off", urlencode(node)), body)
    }

    fn sim_fault<'a>(&'a self, node: &'a str, fault: nightshift_proto::SimFault) -> Reply<'a, SimFaultReply> {
        self.post_op(format!("/api/v1/agents/{}/sim-fault", urlencode(node)), fault)
    }

    fn set_window(&self, body: NewWindow) -> Reply<'_, WindowReply> {
        self.post_op("/api/v1/maintenance".into(), body)
    }

    fn end_window<'a>(&'a self, id: &'a str, body: Reason) -> Reply<'a, WindowReply> {
        self.post_op(format!("/api/v1/maintenance/{}/end", urlencode(id)), body)
    }

    fn inventory<'a>(&'a self, node: &'a str) -> Reply<'a, nightshift_proto::Inventory> {
        self.get_op(format!("/api/v1/agents/{}/inventory", urlencode(node)))
    }

    fn reload(&self, allow_partial: bool) -> Reply<'_, ReloadReply> {
        let path = if allow_partial { "/api/v1/reload?allow_partial=true" } else { "/api/v1/reload" };
        self.post_op(path.into(), NoArgs {})
    }
}
