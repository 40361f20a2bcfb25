//! The engine's config file (`engine.yaml`): config → validate → build.
//! Relative paths resolve against the config file's folder.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::runbooks::manifest::LoadError;
use crate::runbooks::script::ScriptLimits;

mod proxy;
pub(crate) mod tokens;
mod validate;
pub use proxy::{ProxyAuth, in_cidr, parse_cidr};
pub use validate::valid_token_name;

/// `engine.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    pub version: u32,
    /// HTTP listen address of the web UI / API.
    #[serde(default = "default_listen")]
    pub listen_addr: String,
    /// The audit store and engine state.
    pub data_dir: PathBuf,
    pub runbook_dir: PathBuf,
    pub inventory_path: PathBuf,
    /// The engine's SSH key (`nightshift keygen`); its `.pub` goes into each
    /// agent's authorized keys.
    pub engine_key_path: PathBuf,
    /// The whole fleet's mode until an admin sets one (`nightshift fleet
    /// mode`, audited): `act` when absent; the shipped engine.yaml starts a
    /// first deployment in `shadow` (docs/ROLLOUT.md).
    #[serde(default)]
    pub initial_fleet_mode: crate::runbooks::modes::FleetMode,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub script: ScriptLimits,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    #[serde(default)]
    pub auth: AuthConfig,
    /// Telemetry from Prometheus or dcgm-exporter endpoints, besides (or
    /// instead of) the agents' own streams.
    #[serde(default)]
    pub sources: SourcesConfig,
    /// Where `notify` and `escalate` messages are delivered (besides the
    /// audit log and the engine's log).
    #[serde(default)]
    pub notifications: NotificationsConfig,
    /// Run the engine's clock this many times faster than wall time (demo).
    #[serde(default = "one")]
    pub time_scale: f64,
    /// With `time_scale`: the moment (Unix ms) the scaled time counts from,
    /// so engines and simulated agents given the same origin share one
    /// time across restarts (tests, demos). None: the engine's start.
    #[serde(default)]
    pub time_origin_ms: Option<i64>,
    /// Links from run and node pages to Grafana, time range and host filled
    /// in.
    #[serde(default)]
    pub grafana: Option<GrafanaConfig>,
    /// A cluster or cloud autoscaler that adds and removes nodes for a pool
    /// (H4 beyond the standby nodes nightshift knows): nightshift POSTs a
    /// request, audited before it is sent.
    #[serde(default)]
    pub autoscaler: Option<AutoscalerConfig>,
    /// Where the audit chain lives: sled in `data_dir` (one engine), or
    /// PostgreSQL (engines of a shard share it; one leads, the others
    /// stand by).
    #[serde(default)]
    pub audit: AuditConfig,
    /// A site's overrides of the shipped XID policy (docs/XID.md, "Site
    /// overrides"): checked at start, re-read by every reload.
    #[serde(default)]
    pub fault_policy_path: Option<PathBuf>,
    /// The file this was read from (a reload reads it again).
    #[serde(skip)]
    pub source_path: Option<PathBuf>,
}

/// The generic autoscaler webhook: `POST url` with
/// `{"version": 1, "pool": {"label", "value"}, "direction": "out"|"in",
/// "count", "run", "reason", "request_id"}`; a 2xx answer means it took the
/// request (the nodes come later: the runbook judges the pool's power share).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscalerConfig {
    pub url: String,
    /// A file holding the bearer token the autoscaler expects (read at each
    /// request, so a rotation needs no restart).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    #[serde(default = "d_autoscaler_timeout")]
    pub timeout_secs: u64,
    /// The most nodes nightshift may have asked for, per pool, and not given
    /// back (the budget).
    #[serde(default = "d_autoscaler_max")]
    pub max_nodes_per_pool: u32,
}

fn d_autoscaler_timeout() -> u64 {
    10
}
fn d_autoscaler_max() -> u32 {
    8
}

/// Where the GPU dashboard lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrafanaConfig {
    /// Grafana's base URL, e.g. `https://grafana.example.com`.
    pub url: String,
    /// The dashboard's uid (the shipped one: `nightshift-engine`), which has
    /// the `Hostname` and `gpu` variables.
    #[serde(default = "default_dashboard_uid")]
    pub dashboard_uid: String,
}

fn default_dashboard_uid() -> String {
    "nightshift-engine".into()
}

#[cfg(test)]
#[test]
fn grafana_links_fill_in_host_gpu_and_range() {
    let g = GrafanaConfig { url: "https://g.example/".into(), dashboard_uid: "nightshift-engine".into() };
    assert_eq!(
        g.link("gpu a1", Some(3), "1700000000000", "now"),
        "https://g.example/d/nightshift-engine/?from=1700000000000&to=now&var-Hostname=gpu%20a1&var-gpu=3"
    );
}

impl GrafanaConfig {
    /// A link to the dashboard for `node` (and `gpu`) over `from`–`to`
    /// (Grafana time expressions or epoch milliseconds).
    pub fn link(&self, node: &str, gpu: Option<u32>, from: &str, to: &str) -> String {
        let enc = |s: &str| -> String {
            s.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                    _ => format!("%{b:02X}"),
                })
                .collect()
        };
        let mut u = format!(
            "{}/d/{}/?from={}&to={}&var-Hostname={}",
            self.url.trim_end_matches('/'),
            enc(&self.dashboard_uid),
            enc(from),
            enc(to),
            enc(node)
        );
        if let Some(g) = gpu {
            u.push_str(&format!("&var-gpu={g}"));
        }
        u
    }
}

/// `audit:` in engine.yaml.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    #[serde(default)]
    pub backend: AuditBackend,
    /// Required with `backend: postgres`.
    #[serde(default)]
    pub postgres: Option<PostgresConfig>,
    /// After the store stops at a write failure (a full or failing disk),
    /// `nightshift serve` answers 503 with why for this long, then exits
    /// non-zero (74) so the service manager starts it again.
    #[serde(default = "default_exit_after_stop")]
    pub exit_after_stop_secs: u64,
}

fn default_exit_after_stop() -> u64 {
    60
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            backend: AuditBackend::default(),
            postgres: None,
            exit_after_stop_secs: default_exit_after_stop(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditBackend {
    #[default]
    Sled,
    Postgres,
}

/// `audit.postgres:` — the database, this engine's shard and its lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// A file holding the connection URL (`postgres://user:pw@host/db?sslmode=require`);
    /// the URL is never logged.
    #[serde(default)]
    pub url_file: Option<PathBuf>,
    /// Or the environment variable holding it.
    #[serde(default)]
    pub url_env: Option<String>,
    /// PEM CA certificates the server's certificate is checked against
    /// (`sslmode=require`); without it, the public web roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The fleet partition this engine serves: its own lease and chain.
    #[serde(default = "default_shard")]
    pub shard: String,
    /// How long a lease lasts without renewal (by the database's clock).
    #[serde(default = "default_lease_ttl_ms")]
    pub lease_ttl_ms: u64,
    /// How often the leader renews it.
    #[serde(default = "default_lease_renew_ms")]
    pub lease_renew_ms: u64,
    /// How often a standby reads new records from the database.
    #[serde(default = "default_follow_ms")]
    pub follow_ms: u64,
    /// Where this engine's API is reached by the other engines (standbys
    /// forward writes to the leader's); default `http://` + `listen_addr`.
    #[serde(default)]
    pub advertise_url: Option<String>,
    /// The `advertise_url` of every engine of the shard (this one may be
    /// listed too). A standby forwards writes only to a leader whose URL
    /// is one of these: the lease row is data, and a row pointing
    /// elsewhere gets nothing.
    #[serde(default)]
    pub peers: Vec<String>,
    /// A file holding the secret the engines of the shard share (`openssl
    /// rand -hex 32`). A standby checks who is asking itself and forwards
    /// the request with this secret and that name: a person's token never
    /// leaves the engine it was sent to. Forwarding needs it and `peers`.
    #[serde(default)]
    pub peer_token_file: Option<PathBuf>,
    /// Cut the fleet into shards by this fleet.yaml label (`cluster`,
    /// `pool`): this engine serves only the nodes whose label equals its
    /// `shard`. Unset: the shard is the whole fleet.
    #[serde(default)]
    pub fleet_label: Option<String>,
}

fn default_shard() -> String {
    "default".into()
}
fn default_lease_ttl_ms() -> u64 {
    5_000
}
fn default_lease_renew_ms() -> u64 {
    1_000
}
fn default_follow_ms() -> u64 {
    250
}

impl EngineConfig {
    /// Keep the nodes of this engine's shard (`audit.postgres.fleet_label`);
    /// without one, every node.
    pub fn select_shard(&self, inventory: &mut crate::fleet::inventory::Inventory) {
        if self.audit.backend != AuditBackend::Postgres {
            return;
        }
        if let Some(pg) = &self.audit.postgres
            && let Some(label) = &pg.fleet_label
        {
            let before = inventory.nodes.len();
            inventory.nodes.retain(|n| n.labels.get(label) == Some(&pg.shard));
            tracing::info!(
                shard = %pg.shard,
                label = %label,
                nodes = inventory.nodes.len(),
                of = before,
                "this engine serves the nodes of its shard"
            );
        }
    }
}

impl PostgresConfig {
    /// The connection URL, from its file or variable.
    pub fn url(&self) -> Result<String, String> {
        PostgresConfig::read_url(self.url_file.as_deref(), self.url_env.as_deref(), "audit.postgres.")
    }

    /// The connection URL from a file or an environment variable (exactly
    /// one), trimmed; `what` prefixes the field names in errors
    /// (`audit.postgres.` here, `--` for the CLI's flags).
    pub fn read_url(file: Option<&Path>, env: Option<&str>, what: &str) -> Result<String, String> {
        let sep = if what.ends_with('.') { "_" } else { "-" };
        match (file, env) {
            (Some(f), None) => std::fs::read_to_string(f)
                .map(|s| s.trim().to_string())
                .map_err(|e| format!("{what}url{sep}file {}: {e}", f.display())),
            (None, Some(v)) => std::env::var(v)
                .map(|s| s.trim().to_string())
                .map_err(|_| format!("{what}url{sep}env: the environment variable {v} is not set")),
            _ => {
                Err(format!("expected exactly one of {what}url{sep}file and {what}url{sep}env, found both or neither"))
            }
        }
    }

    /// The shared engine secret, from `peer_token_file` (`None` when not
    /// configured).
    pub fn peer_token(&self) -> Result<Option<String>, String> {
        use std::os::unix::fs::PermissionsExt;
        let Some(f) = &self.peer_token_file else { return Ok(None) };
        // The secret lets its holder act as any engine of the shard: a
        // file others may read is refused, as ssh refuses a readable key.
        let mode = std::fs::metadata(f)
            .map_err(|e| format!("audit.postgres.peer_token_file {}: {e}", f.display()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "audit.postgres.peer_token_file {}: expected mode 0600 or stricter (only its owner may read the shard's secret), found {:04o}: chmod 600 {}",
                f.display(),
                mode & 0o7777,
                f.display()
            ));
        }
        let t = std::fs::read_to_string(f)
            .map(|s| s.trim().to_string())
            .map_err(|e| format!("audit.postgres.peer_token_file {}: {e}", f.display()))?;
        if t.len() < 32 {
            return Err(format!(
                "audit.postgres.peer_token_file {}: expected a secret of at least 32 characters (`openssl rand -hex 32`), found {}",
                f.display(),
                t.len()
            ));
        }
        Ok(Some(t))
    }
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Runs waiting to start; beyond this, events are shed (and audited).
    #[serde(default = "d_queue")]
    pub queue_capacity: usize,
    #[serde(default = "d_concurrent")]
    pub max_concurrent_runs: usize,
    /// Fleet-wide cap on drained nodes, whatever a runbook allows.
    #[serde(default = "d_drained")]
    pub max_drained_pct: f64,
    /// Alert (fingerprint, startsAt) pairs remembered for deduplication.
    #[serde(default = "d_dedup")]
    pub alert_dedup_entries: usize,
    #[serde(default = "d_action_timeout")]
    pub action_timeout_secs: u64,
    /// Alerts accepted but not yet handled; beyond this a webhook call is
    /// answered 503 (Alertmanager sends again) and the shed alerts are
    /// audited, so a storm cannot grow memory without bound.
    #[serde(default = "d_alert_backlog")]
    pub alert_backlog: usize,
    /// Repeat offenders: a GPU quarantined this many times within
    /// `repair_window_secs` is not remediated again: it goes to a person
    /// (RMA) with its history. 0 turns the rule off.
    #[serde(default = "d_max_repairs")]
    pub max_repairs_in_window: usize,
    #[serde(default = "d_repair_window")]
    pub repair_window_secs: u64,
    /// Alerts one poster (one webhook token) may send per second, on
    /// average; past it (and its burst) its calls are answered 503 with
    /// `Retry-After`, so one noisy or stolen token cannot take the whole
    /// backlog from the others. 0 turns the limit off.
    #[serde(default = "d_webhook_rate")]
    pub webhook_alerts_per_sec: f64,
    /// Alerts one poster may send at once above the rate.
    #[serde(default = "d_webhook_burst")]
    pub webhook_alert_burst: u64,
    /// A run resumed after a restart waits at most this long for its
    /// node's inventory and first reading from this engine before it
    /// decides anything; past it the run ends failed, its holds kept, and
    /// a person is paged (invariant 18).
    #[serde(default = "d_resume_wait")]
    pub resume_wait_secs: u64,
}

fn d_resume_wait() -> u64 {
    300
}

fn d_webhook_rate() -> f64 {
    5_000.0
}
fn d_webhook_burst() -> u64 {
    50_000
}

fn d_max_repairs() -> usize {
    2
}
fn d_repair_window() -> u64 {
    7 * 86_400
}

fn d_alert_backlog() -> usize {
    10_000
}

fn d_queue() -> usize {
    1000
}
fn d_concurrent() -> usize {
    64
}
fn d_drained() -> f64 {
    25.0
}
fn d_dedup() -> usize {
    100_000
}
fn d_action_timeout() -> u64 {
    30
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            queue_capacity: d_queue(),
            max_concurrent_runs: d_concurrent(),
            max_drained_pct: d_drained(),
            alert_dedup_entries: d_dedup(),
            action_timeout_secs: d_action_timeout(),
            alert_backlog: d_alert_backlog(),
            max_repairs_in_window: d_max_repairs(),
            repair_window_secs: d_repair_window(),
            webhook_alerts_per_sec: d_webhook_rate(),
            webhook_alert_burst: d_webhook_burst(),
            resume_wait_secs: d_resume_wait(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Agent telemetry subscription interval.
    #[serde(default = "d_interval")]
    pub interval_ms: u64,
    /// History kept for scripts' windowed readings (`metric(name, secs)`).
    #[serde(default = "d_script_window")]
    pub script_window_secs: u64,
    /// A node not heard from for this long counts as disconnected.
    #[serde(default = "d_stale")]
    pub stale_after_secs: u64,
    /// Subscribe to each agent's telemetry stream. Turn off when Prometheus
    /// (`sources`) is the telemetry source and agents are only for actions.
    #[serde(default = "yes")]
    pub stream_from_agents: bool,
    /// How far back the run and node pages can draw (`signals/history.rs`); 0
    /// keeps no plot history.
    #[serde(default = "d_history")]
    pub history_secs: u64,
    /// One plotted point per this many seconds (widened at start when the
    /// fleet is too large for `history_max_mib`).
    #[serde(default = "d_history_step")]
    pub history_step_secs: u64,
    /// The most memory the plot history may take for the whole fleet.
    #[serde(default = "d_history_max_mib")]
    pub history_max_mib: u64,
    /// The telemetry windows and their triggers split by node into this
    /// many shards; a large batch (a Prometheus pull, a backtest step) is
    /// evaluated one thread a shard. What fires does not depend on it.
    #[serde(default = "d_ingest_shards")]
    pub ingest_shards: u64,
}

fn d_ingest_shards() -> u64 {
    1
}

fn d_history_max_mib() -> u64 {
    256
}

fn d_history() -> u64 {
    6 * 3600
}
fn d_history_step() -> u64 {
    10
}

fn yes() -> bool {
    true
}

/// `sources:` — pulled telemetry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourcesConfig {
    /// A Prometheus server's HTTP API: one instant query per interval for
    /// the DCGM series (classic and DCGM 4.6 names).
    #[serde(default)]
    pub prometheus: Option<PullSource>,
    /// dcgm-exporter (or nightshift agent) `/metrics` endpoints, scraped
    /// directly.
    #[serde(default)]
    pub exporters: Vec<PullSource>,
}

/// One pulled endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullSource {
    /// `http://prometheus:9090` or `http://gpu-a1:9400/metrics`.
    pub url: String,
    #[serde(default = "d_pull_interval")]
    pub interval_secs: u64,
    #[serde(default = "d_pull_timeout")]
    pub timeout_secs: u64,
}

fn d_pull_interval() -> u64 {
    15
}
fn d_pull_timeout() -> u64 {
    5
}

/// `notifications:` — webhooks for `notify`/`escalate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotificationsConfig {
    #[serde(default)]
    pub webhooks: Vec<WebhookTarget>,
    /// Post the audit chain's head (sequence number and hash) this often to
    /// the targets with `audit_anchors: true`, so the chain is anchored
    /// outside the store: a rewritten history no longer matches a hash
    /// someone else kept. Off when absent.
    #[serde(default)]
    pub audit_anchor_every_secs: Option<u64>,
    /// Where people open the web UI (`https://nightshift.example`): every
    /// notification carries the links to its run's and node's pages.
    #[serde(default)]
    pub ui_url: Option<String>,
    /// A page (notification or escalation) not delivered within this long
    /// of its record is given up: recorded `undeliverable` and counted in
    /// `/metrics` (`nightshift_pages_undeliverable_total`). Until then it
    /// is retried, across restarts.
    #[serde(default = "d_page_expiry")]
    pub page_expiry_secs: u64,
    /// The longest pause between two tries of a page not delivered yet
    /// (the pause starts at 30 s, or this if shorter, and doubles).
    #[serde(default = "d_retry_max")]
    pub retry_max_secs: u64,
    /// A runbook that escalated about a node or GPU does not page about it
    /// again for this long (its later escalations are notes on the run),
    /// unless the GPU was repaired or a person took over in between: one
    /// page per fault, not one per retry, restart or expired hold.
    #[serde(default = "d_repage_after")]
    pub repage_after_secs: u64,
    /// The same for notifications: a runbook that told the team something
    /// about a node or GPU says it again (figures aside) only after this
    /// long — a reminder — or after a repair or a person's takeover; in
    /// between, and across restarts, it is a note on the run. A different
    /// finding (other words) is said at once. 0 says everything every time.
    #[serde(default = "d_repage_after")]
    pub remind_after_secs: u64,
    /// A finding a script told with a size (`notify(text, size)`: larger
    /// is worse) is said again, before its reminder, once its size has
    /// grown by this much since it was last said (25: 30 % → 37.5 %).
    #[serde(default = "d_worse_by")]
    pub worse_by_pct: f64,
    /// A breaker's storm of the same kind of symptom over mostly the nodes
    /// of one told about within this long (the trend runbook paged for a
    /// rack's cooling, then the over-temperature runbook's storm on the
    /// same rack) is the same shared cause: a note, not a second page.
    /// Past it — time enough for the cause to have been fixed and to fail
    /// again — a storm pages anew. 0 pages every storm.
    #[serde(default = "d_shared_cause")]
    pub shared_cause_secs: u64,
}

fn d_shared_cause() -> u64 {
    3_600
}

fn d_worse_by() -> f64 {
    25.0
}

fn d_repage_after() -> u64 {
    86_400
}

fn d_retry_max() -> u64 {
    300
}

fn d_page_expiry() -> u64 {
    21_600
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        NotificationsConfig {
            webhooks: Vec::new(),
            audit_anchor_every_secs: None,
            ui_url: None,
            page_expiry_secs: d_page_expiry(),
            retry_max_secs: d_retry_max(),
            repage_after_secs: d_repage_after(),
            remind_after_secs: d_repage_after(),
            worse_by_pct: d_worse_by(),
            shared_cause_secs: d_shared_cause(),
        }
    }
}

/// One notification webhook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookTarget {
    /// Shown in the audit log's delivery record.
    pub name: String,
    pub url: String,
    /// `generic` (nightshift's JSON) or `slack` (an incoming-webhook body).
    #[serde(default)]
    pub format: WebhookFormat,
    /// Only escalations (`escalate`), or every notification.
    #[serde(default)]
    pub escalations_only: bool,
    #[serde(default = "d_pull_timeout")]
    pub timeout_secs: u64,
    /// Tries before giving up (with 1 s, 2 s, 4 s … between).
    #[serde(default = "d_attempts")]
    pub max_attempts: u32,
    /// Also receive dry runs' notifications and escalations, marked
    /// `dry_run: true` (and "[dry run]" in Slack text). Off by default: a
    /// dry run sends nothing.
    #[serde(default)]
    pub dry_runs: bool,
    /// Receive the audit head every `audit_anchor_every_secs`.
    #[serde(default)]
    pub audit_anchors: bool,
    /// `format: alertmanager` only: how long the alert stays firing in
    /// Alertmanager (its `endsAt`), so a page is not resolved before a
    /// person has seen it. Default one hour.
    #[serde(default = "d_firing_secs")]
    pub firing_secs: u64,
    /// Another target's name: a page this one does not take within its
    /// quick tries goes there too (a second route for when the first is
    /// down), while this one keeps being retried.
    #[serde(default)]
    pub fallback: Option<String>,
}

fn d_firing_secs() -> u64 {
    3600
}

fn d_attempts() -> u32 {
    3
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookFormat {
    #[default]
    Generic,
    Slack,
    /// Alertmanager's v2 API (`POST /api/v2/alerts`): the notification as
    /// an alert, so the site's own routes take it to PagerDuty, Opsgenie,
    /// Slack or email (`examples/alertmanager.yml`).
    Alertmanager,
}

fn d_interval() -> u64 {
    1000
}
fn d_script_window() -> u64 {
    300
}
fn d_stale() -> u64 {
    15
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            interval_ms: d_interval(),
            script_window_secs: d_script_window(),
            stale_after_secs: d_stale(),
            stream_from_agents: true,
            history_secs: d_history(),
            history_step_secs: d_history_step(),
            history_max_mib: d_history_max_mib(),
            ingest_shards: d_ingest_shards(),
        }
    }
}

/// A role, in increasing power.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Viewer,
    Operator,
    Admin,
}

/// API tokens, stored as SHA-256 hashes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(default)]
    pub tokens: Vec<TokenSpec>,
    /// SHA-256 of the token Alertmanager sends as a bearer token (its
    /// poster is named `alertmanager` in the audit log). Shorthand for one
    /// entry of `webhook_tokens`.
    #[serde(default)]
    pub webhook_token_sha256: Option<String>,
    /// Tokens that may post to the Alertmanager webhook, by name (each
    /// alert's record names the token that posted it). Only these: a
    /// person's token cannot post alerts.
    #[serde(default)]
    pub webhook_tokens: Vec<WebhookToken>,
    /// Let requests without a token in with this role. Only for loopback
    /// demos: the server refuses it on any other address.
    #[serde(default)]
    pub allow_anonymous: Option<Role>,
    /// Mark the UI's session cookie `Secure` (sent only over HTTPS): set
    /// when people reach the engine through a TLS-terminating proxy, so the
    /// cookie never travels in clear between them and the proxy.
    #[serde(default)]
    pub secure_cookies: bool,
    /// Sign-in through the site's identity provider behind an
    /// authenticating proxy (oauth2-proxy, Pomerium, an nginx or Apache
    /// in front of the IdP), as Grafana's auth proxy: the proxy sets the
    /// person's name and groups in headers, trusted only on connections
    /// from its addresses.
    #[serde(default)]
    pub proxy: Option<ProxyAuth>,
}

/// A token that may post alerts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookToken {
    pub name: String,
    /// `sha256sum` of the token, hex.
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSpec {
    /// Who holds it (shown in the audit log as `user:<name>`).
    pub name: String,
    pub role: Role,
    /// `sha256sum` of the token, hex.
    pub sha256: String,
}

#[cfg(test)]
mod tests;
