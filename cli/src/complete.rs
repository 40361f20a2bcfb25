//! Dynamic shell completion: runbook, node and run names, read when the
//! shell asks (`source <(COMPLETE=bash nightshift)`, or the script
//! `nightshift completions SHELL` prints). Runbooks and nodes come from the
//! engine config's files (the `--config` on the line being completed, else
//! `NIGHTSHIFT_CONFIG`, else `./engine.yaml`); runs from the engine at
//! `--server`/`NIGHTSHIFT_SERVER` when one is named, within a second.
//! Nothing here may fail loudly: no candidates is the answer to any error.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::Duration;

use clap_complete::CompletionCandidate;

/// The value of `--NAME`/`-SHORT` on the command line being completed.
fn flag(name: &str, short: Option<&str>) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&format!("--{name}=")) {
            return Some(v.to_string());
        }
        (a == &format!("--{name}") || short.is_some_and(|s| a == s)).then(|| args.get(i + 1).cloned()).flatten()
    })
}

fn config() -> Option<nightshift_engine::config::EngineConfig> {
    let path = flag("config", Some("-c"))
        .or_else(|| std::env::var("NIGHTSHIFT_CONFIG").ok())
        .unwrap_or_else(|| "engine.yaml".into());
    nightshift_engine::config::EngineConfig::load(&PathBuf::from(path)).ok()
}

fn matching(names: impl IntoIterator<Item = (String, Option<String>)>, current: &OsStr) -> Vec<CompletionCandidate> {
    let prefix = current.to_string_lossy();
    let mut out: Vec<(String, Option<String>)> = names.into_iter().filter(|(n, _)| n.starts_with(&*prefix)).collect();
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    out.into_iter().map(|(n, help)| CompletionCandidate::new(n).help(help.map(Into::into))).collect()
}

/// Runbook names (from their manifests), with their descriptions.
pub fn runbooks(current: &OsStr) -> Vec<CompletionCandidate> {
    let dir = config().map(|c| c.runbook_dir).unwrap_or_else(|| PathBuf::from("runbooks"));
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let names = entries.filter_map(|e| {
        let p = e.ok()?.path();
        if p.extension()? != "yaml" {
            return None;
        }
        // Only the two fields: a manifest that does not load still
        // completes by its name.
        #[derive(serde::Deserialize)]
        struct Named {
            name: String,
            #[serde(default)]
            description: Option<String>,
        }
        let v: Named = serde_yaml::from_str(&std::fs::read_to_string(&p).ok()?).ok()?;
        Some((v.name, v.description))
    });
    matching(names, current)
}

/// Node names from the inventory, with their labels.
pub fn nodes(current: &OsStr) -> Vec<CompletionCandidate> {
    let Some(inv) = config().and_then(|c| nightshift_engine::api::Inventory::load(&c.inventory_path).ok()) else {
        return Vec::new();
    };
    let names = inv.nodes.into_iter().map(|n| {
        let labels: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        (n.name, (!labels.is_empty()).then(|| labels.join(" ")))
    });
    matching(names, current)
}

/// Recent run ids from the engine named by `--server`, with what they are.
pub fn runs(current: &OsStr) -> Vec<CompletionCandidate> {
    let Some(server) = flag("server", None).or_else(|| std::env::var("NIGHTSHIFT_SERVER").ok()) else {
        return Vec::new();
    };
    let token = flag("token", None).or_else(|| std::env::var("NIGHTSHIFT_TOKEN").ok());
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return Vec::new() };
    let page: Option<nightshift_engine::audit::RunPage> = rt.block_on(async {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(1)).build().ok()?;
        let mut req = http.get(format!("{}/api/v1/runs?limit=50", server.trim_end_matches('/')));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send().await.ok()?.json().await.ok()
    });
    let runs = page.map(|p| p.runs).unwrap_or_default();
    let names = runs.into_iter().map(|r| {
        let target = r.target.node.clone().unwrap_or_default();
        let state = r.outcome.map(|o| o.as_str()).unwrap_or(r.state.as_str());
        let help = format!("{} on {target}: {state}", r.runbook);
        (r.id, Some(help))
    });
    matching(names, current)
}
