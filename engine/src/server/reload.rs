//! Reading fleet.yaml, the tokens, the runbooks and the site's XID policy
//! overrides again while the engine runs (SIGHUP, `POST /api/v1/reload`,
//! `nightshift reload`): every file is read and checked before anything
//! changes, then new and changed nodes get a node loop, tokens, runbooks and
//! the XID policy are swapped; audited as `config_reloaded`, the policy's
//! changes row by row.

use std::sync::Arc;

use nightshift_proto::ssh::client::AgentTransport;
use nightshift_proto::ssh::keys;

use crate::audit::AuditError;
use crate::config::EngineConfig;
use crate::engine::Engine;
use crate::fleet::inventory::Inventory;
use crate::health::xid_policy::XidPolicy;
use crate::runbooks::manifest::LoadError;
use crate::runbooks::runbook::load_dir;
use crate::server::serve::{client_for, node_loop};

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ReloadReport {
    pub nodes: crate::fleet::FleetChange,
    /// API tokens by name.
    pub tokens_added: Vec<String>,
    pub tokens_removed: Vec<String>,
    /// Same name, another role or hash.
    pub tokens_changed: Vec<String>,
    pub webhook_tokens_changed: bool,
    /// Whether any runbook's manifest or script changed (trigger states
    /// then start over).
    pub runbooks_changed: bool,
    pub runbooks: usize,
    pub runbook_errors: Vec<String>,
    /// engine.yaml settings that differ from the running ones and take
    /// effect only at a restart.
    pub restart_needed: Vec<String>,
    /// What changed in the XID policy in force, one line per code (`XID
    /// 109: reset_gpu → ignore (why)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fault_policy: Vec<String>,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot read the engine key {path}: {message}; nothing was reloaded")]
    Key { path: String, message: String },
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// The runbook folder cannot be read: reloading would stop every
    /// automation at once.
    #[error(
        "expected a folder of runbooks at {path}, found {found}; nothing was reloaded (the runbooks in force stay)"
    )]
    RunbookDir { path: String, found: String },
    /// Some runbooks failed to load: reloading would drop them silently.
    #[error(
        "{} runbook file(s) failed to load, so nothing was reloaded: {}; fix them, or reload with --allow-partial \
         to put the others in force without them",
        failures.len(),
        failures.join("; ")
    )]
    Runbooks { failures: Vec<String> },
}

/// Fingerprint of a runbook set: what a reload compares.
fn runbook_digest(set: &crate::runbooks::runbook::RunbookSet) -> Vec<(String, String, String)> {
    let mut d: Vec<(String, String, String)> = set
        .runbooks
        .iter()
        .map(|r| {
            (r.manifest.name.clone(), serde_json::to_string(&r.manifest).unwrap_or_default(), r.script_source.clone())
        })
        .collect();
    d.extend(set.errors.iter().map(|e| (String::new(), e.to_string(), String::new())));
    d.sort();
    d
}

/// Read fleet.yaml, engine.yaml's tokens and the runbooks again and put
/// what changed in force: new nodes are connected, changed ones reconnected
/// (their state kept), removed ones let go (runs already holding them finish
/// on them); tokens are replaced; runbooks swapped when they changed. All
/// files are read and checked first: if one is broken, nothing changes.
/// Audited either way (`config_reloaded`, by `by`). Other engine.yaml
/// settings are listed as needing a restart.
pub async fn reload(engine: &Engine, by: &str) -> Result<ReloadReport, ReloadError> {
    reload_with(engine, by, false).await
}

/// [`reload`]; with `allow_partial`, runbooks that fail to load are left
/// out (and listed) instead of refusing the whole reload.
pub async fn reload_with(engine: &Engine, by: &str, allow_partial: bool) -> Result<ReloadReport, ReloadError> {
    let _one = engine.core.runbooks().reloading().await;
    let result = reload_files(engine, allow_partial);
    let record = match &result {
        Ok(r) => crate::audit::data::ConfigReloaded {
            ok: true,
            error: None,
            report: match serde_json::to_value(r) {
                Ok(serde_json::Value::Object(m)) => m,
                _ => Default::default(),
            },
        },
        Err(e) => crate::audit::data::ConfigReloaded { ok: false, error: Some(e.to_string()), ..Default::default() },
    };
    let appended = engine
        .core
        .audit()
        .append(crate::audit::NewRecord::typed(crate::audit::RecordKind::ConfigReloaded, by, &record), None)
        .await;
    match appended {
        Ok(_) => {}
        // A standby writes nothing: its reload is in force here and in
        // its log; the leader audits its own.
        Err(AuditError::NotLeader(_)) => {
            tracing::info!(by, ok = result.is_ok(), "standby: reload not audited (the leader audits its own)")
        }
        Err(e) => return Err(e.into()),
    }
    match &result {
        Ok(r) => tracing::info!(by, added = ?r.nodes.added, changed = ?r.nodes.changed, removed = ?r.nodes.removed,
            tokens_added = ?r.tokens_added, tokens_removed = ?r.tokens_removed, runbooks_changed = r.runbooks_changed,
            restart_needed = ?r.restart_needed, "reloaded"),
        Err(e) => tracing::error!(by, error = %e, "reload refused: nothing changed"),
    }
    result
}

fn reload_files(engine: &Engine, allow_partial: bool) -> Result<ReloadReport, ReloadError> {
    let running = engine.config();
    let mut report = ReloadReport::default();
    // 1. Read and check everything; change nothing yet.
    let new_config = match &running.source_path {
        Some(path) => Some(EngineConfig::load(path)?),
        None => None,
    };
    let inventory = match &new_config {
        Some(_) => {
            let mut inv = Inventory::load(&running.inventory_path)?;
            running.select_shard(&mut inv);
            Some(inv)
        }
        None => None,
    };
    let key = match &inventory {
        Some(_) => Some(Arc::new(keys::load(&running.engine_key_path).map_err(|e| ReloadError::Key {
            path: running.engine_key_path.display().to_string(),
            message: e.to_string(),
        })?)),
        None => None,
    };
    match std::fs::metadata(&running.runbook_dir) {
        Ok(m) if m.is_dir() => {}
        other => {
            return Err(ReloadError::RunbookDir {
                path: running.runbook_dir.display().to_string(),
                found: match other {
                    Ok(_) => "a file".into(),
                    Err(e) => format!("nothing there ({e})"),
                },
            });
        }
    }
    let set = load_dir(&running.runbook_dir, engine.core.runbooks().script());
    if !allow_partial && !set.errors.is_empty() {
        return Err(ReloadError::Runbooks { failures: set.errors.iter().map(|e| e.to_string()).collect() });
    }
    // The overrides named by the engine.yaml now on disk (or the running
    // one's, when it was not read from a file).
    let policy_path = new_config.as_ref().map_or(&running.fault_policy_path, |c| &c.fault_policy_path);
    let policy = XidPolicy::load(policy_path.as_deref())?;
    if let Some(new) = &new_config {
        for (name, a, b) in [
            ("listen_addr", j(&running.listen_addr), j(&new.listen_addr)),
            ("data_dir", j(&running.data_dir), j(&new.data_dir)),
            ("runbook_dir", j(&running.runbook_dir), j(&new.runbook_dir)),
            ("inventory_path", j(&running.inventory_path), j(&new.inventory_path)),
            ("engine_key_path", j(&running.engine_key_path), j(&new.engine_key_path)),
            ("limits", j(&running.limits), j(&new.limits)),
            ("script", j(&running.script), j(&new.script)),
            ("telemetry", j(&running.telemetry), j(&new.telemetry)),
            ("sources", j(&running.sources), j(&new.sources)),
            ("notifications", j(&running.notifications), j(&new.notifications)),
            ("time_scale", j(&running.time_scale), j(&new.time_scale)),
            ("grafana", j(&running.grafana), j(&new.grafana)),
            ("audit.backend", j(&running.audit.backend), j(&new.audit.backend)),
            (
                "audit.postgres",
                j(&running.audit.postgres.as_ref().map(|p| (&p.url_file, &p.url_env, &p.shard, p.lease_ttl_ms))),
                j(&new.audit.postgres.as_ref().map(|p| (&p.url_file, &p.url_env, &p.shard, p.lease_ttl_ms))),
            ),
            ("auth.allow_anonymous", j(&running.auth.allow_anonymous), j(&new.auth.allow_anonymous)),
        ] {
            if a != b {
                report.restart_needed.push(name.to_string());
            }
        }
    }
    // 2. Put it in force.
    if let (Some(inventory), Some(key)) = (inventory, key) {
        let mut clients = std::collections::HashMap::new();
        let specs: Vec<_> = inventory.nodes.iter().map(|s| (s.clone(), s.addr(&inventory.defaults))).collect();
        let (change, fresh) = engine.core.fleet().replace(specs, |spec, addr| {
            let c = client_for(spec, addr, &inventory, &key, running);
            clients.insert(spec.name.clone(), c.clone());
            c as Arc<dyn AgentTransport>
        });
        engine.core.fleet().agent_clients().keep(
            |name| engine.core.fleet().get(name).is_some(),
            fresh.iter().filter_map(|n| Some((n.spec.name.clone(), clients.get(&n.spec.name)?.clone()))),
        );
        // A standby connects to no agent: it starts the loops when it
        // takes over.
        if engine.core.acting() {
            for node in fresh {
                let Some(client) = clients.remove(&node.spec.name) else { continue };
                let e = engine.clone();
                engine.add_task(tokio::spawn(async move { node_loop(e, node, client).await }));
            }
        }
        report.nodes = change;
    }
    if let Some(new) = new_config {
        let (_, old) = engine.auth();
        let mut auth = new.auth.clone();
        auth.allow_anonymous = old.allow_anonymous;
        if auth != *old {
            for t in &auth.tokens {
                match old.tokens.iter().find(|o| o.name == t.name) {
                    None => report.tokens_added.push(t.name.clone()),
                    Some(o) if o != t => report.tokens_changed.push(t.name.clone()),
                    Some(_) => {}
                }
            }
            report.tokens_removed = old
                .tokens
                .iter()
                .filter(|o| !auth.tokens.iter().any(|t| t.name == o.name))
                .map(|o| o.name.clone())
                .collect();
            report.webhook_tokens_changed =
                auth.webhook_token_sha256 != old.webhook_token_sha256 || auth.webhook_tokens != old.webhook_tokens;
            engine.core.tokens().replace(auth);
        }
    }
    report.fault_policy = engine.put_fault_policy(policy);
    report.runbooks = set.runbooks.len();
    report.runbook_errors = set.errors.iter().map(|e| e.to_string()).collect();
    for e in &set.errors {
        tracing::error!(error = %e, "runbook not loaded");
    }
    if runbook_digest(&set) != runbook_digest(&engine.runbook_set()) {
        report.runbooks_changed = true;
        engine.replace_runbooks(set);
    }
    Ok(report)
}

impl Engine {
    /// Put `policy` in force; what changed, one line per code.
    pub(crate) fn put_fault_policy(&self, policy: Arc<XidPolicy>) -> Vec<String> {
        self.core.health().set_policy(policy)
    }
}

/// A setting as JSON, for comparing old and new.
fn j<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}
