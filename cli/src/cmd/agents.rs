//! `nightshift agents list | ping | inventory | holds`.

use anyhow::Result;
use nightshift_proto::SettingView;

use crate::args::AgentsCmd;
use crate::conn::Conn;
use crate::out::Out;

pub async fn agents(c: &mut Conn, out: &Out, cmd: &AgentsCmd) -> Result<u8> {
    match cmd {
        AgentsCmd::List => {
            let nodes = c.nodes().await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&nodes)?);
                return Ok(0);
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
                        if n.state.connected { out.green("connected") } else { out.red("unreachable") },
                        drain,
                        hottest.map(|t| format!("{t:.1} °C")).unwrap_or_else(|| "—".into()),
                        n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","),
                    ]
                })
                .collect();
            out.table(&["NODE", "ADDRESS", "AGENT", "DRAIN", "HOTTEST", "LABELS"], &rows);
            Ok(0)
        }
        AgentsCmd::Ping { node } => {
            let v = c.agent(node, "ping").await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else if v["ok"] == true {
                outln!("{node}: ok in {} ms", v["round_trip_ms"]);
            } else {
                outln!("{node}: {}", v["error"]);
                return Ok(4);
            }
            Ok(0)
        }
        AgentsCmd::Holds { node } => {
            let v = c.agent(node, "holds").await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(0);
            }
            let settings: Vec<SettingView> = serde_json::from_value(v["settings"].clone())?;
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
        AgentsCmd::Inventory { node } => {
            let v = c.agent(node, "inventory").await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(0);
            }
            outln!(
                "{} · backend {} · scheduler {} · agent {}",
                v["node"].as_str().unwrap_or(node),
                v["backend"],
                v["scheduler"],
                v["agent_version"]
            );
            let rows: Vec<Vec<String>> = v["gpus"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|g| {
                    vec![
                        g["index"].to_string(),
                        g["name"].as_str().unwrap_or("").to_string(),
                        format!("{}–{} W", g["power_min_watts"], g["power_max_watts"]),
                        format!("{}–{} W", g["envelope_power_min_watts"], g["envelope_power_max_watts"]),
                        if g["fan_control"] == true { "yes".into() } else { "no".into() },
                        format!("{} MiB", g["mem_total_mib"]),
                    ]
                })
                .collect();
            out.table(&["GPU", "MODEL", "DEVICE POWER", "ENVELOPE", "FAN CONTROL", "MEMORY"], &rows);
            Ok(0)
        }
    }
}
