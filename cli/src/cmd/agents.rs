//! `nightshift agents list | ping | inventory | holds | show | health-check`,
//! `nightshift nodes repaired`.

use anyhow::{Context, Result};
use nightshift_engine::api::HealthState;
use nightshift_proto::SettingView;

use crate::Fail;
use crate::args::AgentsCmd;
use crate::conn::Conn;
use crate::out::{Out, clean};

pub async fn agents(c: &mut Conn, out: &Out, cmd: &AgentsCmd) -> Result<u8> {
    match cmd {
        AgentsCmd::List(a) => {
            let nodes = c.nodes_filtered(&node_filter(a)?).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&nodes)?);
                return Ok(0);
            }
            // A standby connects to no agent: they are its leader's.
            let standby_of = match c {
                Conn::Remote(_) => {
                    c.ha().await.ok().filter(|v| v.status.role == "standby").map(|v| match v.status.leader {
                        Some(l) => (l.holder, l.url),
                        None => ("none yet".to_string(), String::new()),
                    })
                }
                Conn::Local(_) => None,
            };
            if let Some((holder, url)) = &standby_of {
                outln!(
                    "{}",
                    out.dim(&format!(
                        "this engine is a standby: the agents are connected to the leader, {holder}{}",
                        if url.is_empty() { String::new() } else { format!(" ({url})") }
                    ))
                );
            }
            let rows: Vec<Vec<String>> = nodes
                .iter()
                .map(|n| {
                    let hottest = n
                        .gpus
                        .iter()
                        .filter_map(|g| g.get("gpu.temperature_c"))
                        .cloned()
                        .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
                    let drain = if n.state.drained {
                        if n.drained_by_person {
                            out.yellow("drained (person)")
                        } else {
                            out.blue("drained (nightshift)")
                        }
                    } else {
                        "in service".into()
                    };
                    vec![
                        n.name.clone(),
                        n.address.clone(),
                        match (&standby_of, n.state.connected) {
                            (_, true) => out.green("connected"),
                            (Some((holder, _)), false) => out.dim(&format!("the leader's ({holder})")),
                            (None, false) => out.red("unreachable"),
                        },
                        drain,
                        match (&n.state.engine_hands_off, n.state.engine_hands_off_until_ms) {
                            (Some((by, _)), Some(until)) => out.yellow(&format!(
                                "yes ({by}, until {})",
                                nightshift_engine::api::format_rfc3339_ms(until)
                            )),
                            (Some((by, _)), None) => out.yellow(&format!("yes ({by})")),
                            (None, _) if n.state.agent_hands_off => out.yellow("yes (marker on the node)"),
                            (None, _) if n.state.maintenance.is_some() => {
                                let w = n
                                    .state
                                    .maintenance
                                    .as_ref()
                                    .map(|w| (w.id.as_str(), w.ends_ms))
                                    .unwrap_or_default();
                                out.yellow(&format!(
                                    "yes (window {}, until {})",
                                    w.0,
                                    nightshift_engine::api::format_rfc3339_ms(w.1)
                                ))
                            }
                            (None, _) => "no".into(),
                        },
                        hottest.map(|t| format!("{t:.1} °C")).unwrap_or_else(|| "—".into()),
                        n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","),
                    ]
                })
                .collect();
            out.table(&["NODE", "ADDRESS", "AGENT", "DRAIN", "HANDS-OFF", "HOTTEST", "LABELS"], &rows);
            Ok(0)
        }
        AgentsCmd::Show { node } => {
            let h = c.node_health(node).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&h)?);
                return Ok(0);
            }
            outln!("{node}: {}", h.state.as_str());
            let secs = |v: Option<f64>| v.map(|x| format!("{x:.0} s")).unwrap_or_else(|| "—".into());
            let rows: Vec<Vec<String>> = h
                .gpus
                .iter()
                .map(|g| {
                    let p = g.lifecycle.as_ref().map(|l| l.phases).unwrap_or_default();
                    let state = g.state.as_str();
                    vec![
                        g.gpu.to_string(),
                        if g.state == HealthState::Healthy { out.green(state) } else { out.red(state) },
                        g.fault.as_ref().map(|f| f.detail.clone()).unwrap_or_default(),
                        secs(p.quarantined),
                        secs(p.requeued),
                        secs(p.repaired),
                        secs(p.verified),
                        g.history.len().to_string(),
                    ]
                })
                .collect();
            out.table(&["GPU", "STATE", "FAULT", "QUARANTINED", "REQUEUED", "REPAIRED", "VERIFIED", "PAST"], &rows);
            for g in &h.gpus {
                if let Some(i) = &g.instruction {
                    outln!("GPU {}: {i}", g.gpu);
                }
                for f in &g.check_failures {
                    outln!("GPU {}: health check failed: {f}", g.gpu);
                }
            }
            outln!("(seconds from the fault being seen to each phase of its repair)");
            Ok(0)
        }
        AgentsCmd::Evidence { node, fetch, bundle } => {
            let mut found = Vec::new();
            let mut after = 0;
            loop {
                let page = c.records_after(after, 1000).await?;
                let Some(last) = page.last() else { break };
                after = last.seq;
                found.extend(page.into_iter().filter(|r| {
                    r.kind == nightshift_engine::audit::RecordKind::EvidenceCollected && r.node.as_deref() == Some(node)
                }));
            }
            if let Some(dest) = fetch {
                return fetch_evidence(c, out, node, &found, bundle.as_deref(), dest).await;
            }
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&found)?);
                return Ok(0);
            }
            if found.is_empty() {
                outln!("no RMA evidence was collected on {node}");
            }
            for r in &found {
                let d = evidence(r);
                let gpu = r.gpu.map_or(String::new(), |g| format!(" GPU {g}"));
                match &d.error {
                    Some(e) => outln!("record {}{gpu}: not collected: {e}", r.seq),
                    None => {
                        outln!("record {}{gpu}: bundle {} at {}:{}", r.seq, d.bundle, node, d.dir);
                        outln!("  sha256 {}  ({})", d.sha256, clean(&d.reason));
                        for f in &d.files {
                            let err = f.error.as_ref().map_or(String::new(), |e| format!("  — {e}"));
                            outln!("  {} {} bytes{err}", f.name, f.bytes);
                        }
                    }
                }
            }
            Ok(0)
        }
        AgentsCmd::HealthCheck { node } => {
            let v = c.health_check(node).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            }
            let check = &v.check;
            let ok = check.ok;
            if !out.json {
                outln!(
                    "{node}: {}",
                    if ok { out.green("health check passed") } else { out.red("health check failed") }
                );
                for g in &check.gpus {
                    for f in &g.failures {
                        outln!("  GPU {}: {f}", g.index);
                    }
                }
                for f in &check.node_failures {
                    outln!("  {f}");
                }
                if let Some(d) = &check.dcgm {
                    outln!("  dcgmi diag: {d}");
                }
            }
            Ok(if ok { 0 } else { 1 })
        }
        AgentsCmd::Ping { node } => {
            let v = c.ping(node).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else if v.ok {
                outln!("{node}: ok in {} ms", serde_json::Value::from(v.round_trip_ms));
            } else {
                outln!("{node}: {}", serde_json::to_string(&v.error)?);
                return Ok(4);
            }
            Ok(0)
        }
        AgentsCmd::Holds { node } => {
            let v = c.holds(node).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(0);
            }
            let settings: Vec<SettingView> = v.settings;
            if settings.is_empty() {
                outln!("{node}: nothing held; every setting is as the device had it");
                return Ok(0);
            }
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let mut rows = Vec::new();
            for s in &settings {
                let effect = match &s.drifted {
                    Some(d) => out.yellow(&format!("drifted: {d}")),
                    None => s.effective.to_string(),
                };
                for h in &s.holds {
                    let lease = match h.expires_at_ms {
                        None => "sticky (a person releases it)".to_string(),
                        Some(t) => format!(
                            "{} left{}",
                            crate::out::secs((t - now_ms) / 1000),
                            if h.kept { ", kept" } else { "" }
                        ),
                    };
                    rows.push(vec![
                        s.setting.to_string(),
                        h.value.to_string(),
                        h.owner.clone(),
                        lease,
                        effect.clone(),
                        s.baseline.to_string(),
                        h.id.clone(),
                    ]);
                }
            }
            out.table(&["SETTING", "HOLD", "OWNER", "LEASE", "IN EFFECT", "BASELINE", "ID"], &rows);
            Ok(0)
        }
        AgentsCmd::SimFault { node, kind, gpu, count, code } => {
            /// The fault as the agent's `SimFault` reads it.
            #[derive(serde::Serialize)]
            struct Fault<'a> {
                kind: String,
                #[serde(skip_serializing_if = "Option::is_none")]
                gpu: Option<u32>,
                #[serde(skip_serializing_if = "Option::is_none")]
                count: Option<u64>,
                #[serde(skip_serializing_if = "Option::is_none")]
                code: Option<&'a u32>,
            }
            let count = match (kind.as_str(), count) {
                (_, Some(c)) => Some(*c),
                ("ecc-dbe" | "ecc_dbe", None) => Some(1),
                _ => None,
            };
            let fault = Fault { kind: kind.replace('-', "_"), gpu: *gpu, count, code: code.as_ref() };
            // Read here first: an unknown fault is refused before anything is sent.
            let fault: nightshift_proto::SimFault = serde_json::from_value(serde_json::to_value(&fault)?)
                .map_err(|e| crate::cmd::usage(format!("the fault: {e}")))?;
            let v = c.sim_fault(node, &fault).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(0);
            }
            outln!(
                "{}: injected {} (simulated hardware; audited under your name)",
                clean(node),
                clean(&v.injected.to_string())
            );
            Ok(0)
        }
        AgentsCmd::Inventory { node } => {
            let inv = c.inventory(node).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&inv)?);
                return Ok(0);
            }
            // Numbers as the JSON has them (700.0, null).
            let num = |x: Option<f64>| serde_json::to_string(&x).unwrap_or_default();
            outln!(
                "{} · backend {:?} · scheduler {:?} · agent {:?}",
                inv.node,
                inv.backend,
                inv.scheduler,
                inv.agent_version
            );
            let rows: Vec<Vec<String>> = inv
                .gpus
                .iter()
                .map(|g| {
                    vec![
                        g.index.to_string(),
                        g.name.clone(),
                        format!("{}–{} W", num(Some(g.power_min_watts)), num(Some(g.power_max_watts))),
                        format!("{}–{} W", num(g.envelope_power_min_watts), num(g.envelope_power_max_watts)),
                        if g.fan_control { "yes".into() } else { "no".into() },
                        format!("{} MiB", g.mem_total_mib),
                    ]
                })
                .collect();
            out.table(&["GPU", "MODEL", "DEVICE POWER", "ENVELOPE", "FAN CONTROL", "MEMORY"], &rows);
            Ok(0)
        }
    }
}

pub async fn nodes(c: &mut Conn, out: &Out, cmd: &crate::args::NodesCmd) -> Result<u8> {
    match cmd {
        crate::args::NodesCmd::Repaired { node, gpu, note } => {
            let v = c.repaired(node, *gpu, note).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let gpus: Vec<String> = v.verifying.iter().map(|g| format!("GPU {g}")).collect();
                outln!(
                    "{node}: {} verifying; the agent's health check decides whether they return to service (nightshift agents show {node})",
                    gpus.join(", ")
                );
            }
            Ok(0)
        }
        crate::args::NodesCmd::List(a) => agents(c, out, &AgentsCmd::List(a.clone())).await,
        crate::args::NodesCmd::Resume { .. }
        | crate::args::NodesCmd::Drain { .. }
        | crate::args::NodesCmd::HandsOff { .. } => Err(anyhow::anyhow!("internal: handled by cmd::control")),
    }
}

/// `nightshift holds list`: every hold in effect across the fleet, from
/// each node's last report (one line per hold).
/// The engine's node filter for a listing's arguments.
fn node_filter(a: &crate::args::NodeListArgs) -> Result<nightshift_engine::api::NodeFilter> {
    use nightshift_engine::api::{NodeFilter, NodeStateFilter, parse_label};
    Ok(NodeFilter {
        node: a.node.clone(),
        label: a.label.as_deref().map(parse_label).transpose().map_err(|e| crate::cmd::usage(format!("--{e}")))?,
        state: a
            .state
            .as_deref()
            .map(NodeStateFilter::parse)
            .transpose()
            .map_err(|e| crate::cmd::usage(format!("--{e}")))?,
        ..Default::default()
    })
}

pub async fn holds_list(cli: &crate::args::Cli, out: &Out, a: &crate::args::NodeListArgs) -> Result<u8> {
    let f = node_filter(a)?;
    let mut c = crate::cmd::conn(cli, out)?;
    let nodes = c.nodes_filtered(&f).await?;
    c.close().await;
    let holds: Vec<(&str, &nightshift_proto::HoldInfo)> =
        nodes.iter().flat_map(|n| n.holds.iter().map(move |h| (n.name.as_str(), h))).collect();
    if out.json {
        #[derive(serde::Serialize)]
        struct NodeHold<'a> {
            node: &'a str,
            hold: &'a nightshift_proto::HoldInfo,
        }
        let v: Vec<NodeHold<'_>> = holds.iter().map(|(node, hold)| NodeHold { node, hold }).collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    if holds.is_empty() {
        outln!("nothing is held anywhere: every setting is as its device had it");
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = holds
        .iter()
        .map(|(n, h)| {
            vec![
                n.to_string(),
                h.setting.to_string(),
                h.value.to_string(),
                h.owner.clone(),
                match h.expires_at_ms {
                    None => "sticky (a person releases it)".into(),
                    Some(t) => format!(
                        "until {}{}",
                        nightshift_engine::api::format_rfc3339_ms(t),
                        if h.kept { ", kept" } else { "" }
                    ),
                },
                h.id.clone(),
            ]
        })
        .collect();
    out.table(&["NODE", "SETTING", "VALUE", "OWNER", "LEASE", "HOLD"], &rows);
    outln!("{} hold(s) on {} node(s)", holds.len(), nodes.iter().filter(|n| !n.holds.is_empty()).count());
    Ok(0)
}

/// `agents evidence NODE --fetch DIR`: copy a bundle off the node into
/// DIR/ID (only the names its record lists, each a plain file name: nothing
/// is written outside DIR/ID), then check the copy against the record.
async fn fetch_evidence(
    c: &mut Conn,
    out: &Out,
    node: &str,
    found: &[nightshift_engine::audit::AuditRecord],
    bundle: Option<&str>,
    dest: &std::path::Path,
) -> Result<u8> {
    use nightshift_proto::{EVIDENCE_MANIFEST, plain_evidence_name};
    let rec = found.iter().rev().find(|r| {
        let d = evidence(r);
        match bundle {
            Some(id) => d.bundle == id,
            None => d.error.is_none() && !d.bundle.is_empty(),
        }
    });
    let Some(rec) = rec else {
        let which = bundle.map_or("no RMA evidence bundle".to_string(), |b| format!("no bundle {b}"));
        return Err(anyhow::Error::new(Fail(2))
            .context(format!("{which} was collected on {node} (`nightshift agents evidence {node}` lists them)")));
    };
    let d = evidence(rec);
    let id = d.bundle.as_str();
    let mut names = vec![EVIDENCE_MANIFEST.to_string()];
    names.extend(d.files.iter().map(|f| f.name.clone()));
    if let Some(bad) = std::iter::once(id).chain(names.iter().map(String::as_str)).find(|n| !plain_evidence_name(n)) {
        return Err(anyhow::Error::new(Fail(2))
            .context(format!("record {}: expected plain bundle and file names, found {bad:?}", rec.seq)));
    }
    let dir = dest.join(id);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for name in &names {
        let path = dir.join(name);
        let mut f = std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let n = c.evidence_file(node, id, name, &mut f).await?;
        outln!("  {name} {n} bytes");
    }
    let want = d.sha256.as_str();
    match nightshift_proto::verify_evidence_dir(&dir) {
        Ok((b, sha)) if sha == want && b.id == id => {
            outln!(
                "{} bundle {id} copied to {}: it matches the sha256 record {} holds ({sha})",
                out.green("ok:"),
                dir.display(),
                rec.seq
            );
            Ok(0)
        }
        Ok((_, sha)) => {
            outln!(
                "{} bundle {id} copied to {}: its manifest has sha256 {sha}; record {} holds {want}",
                out.red("broken:"),
                dir.display(),
                rec.seq
            );
            Ok(1)
        }
        Err(e) => {
            outln!("{} bundle {id} copied to {}: {e}", out.red("broken:"), dir.display());
            Ok(1)
        }
    }
}

/// An `evidence_collected` record's payload (its defaults when it cannot be
/// read: a bundle with no name matches nothing).
pub fn evidence(r: &nightshift_engine::audit::AuditRecord) -> nightshift_engine::audit::data::EvidenceCollected {
    r.payload().unwrap_or_default()
}
