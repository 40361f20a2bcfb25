//! `nightshift runbooks list | show | validate | test`.

use anyhow::Result;

use crate::args::{Cli, RunbooksCmd};
use crate::cmd::{conn, default_runbook_dir};
use crate::out::{Out, clip};

pub async fn runbooks(cli: &Cli, out: &Out, cmd: &RunbooksCmd) -> Result<u8> {
    match cmd {
        RunbooksCmd::List => {
            let mut c = conn(cli, out)?;
            let list = c.runbooks().await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|r| {
                        vec![
                            r.handbook.clone().unwrap_or_default(),
                            r.name.clone(),
                            if r.mode == "shadow" { out.yellow("shadow") } else { r.mode.clone() },
                            r.trigger.clone(),
                            r.scope.clone(),
                            clip(&r.input, 80),
                            clip(&r.description, 60),
                        ]
                    })
                    .collect();
                out.table(&["ROW", "RUNBOOK", "MODE", "TRIGGER", "SCOPE", "INPUT", "DESCRIPTION"], &rows);
            }
            Ok(0)
        }
        RunbooksCmd::Promote { name, reason } | RunbooksCmd::Demote { name, reason } => {
            use nightshift_engine::api::Mode;
            let mode = if matches!(cmd, RunbooksCmd::Promote { .. }) { Mode::Act } else { Mode::Shadow };
            let mut c = crate::cmd::conn_announced(cli, out)?;
            let r = c.set_mode(name, mode, reason).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&r)?);
            } else if mode == Mode::Act {
                outln!("{name} is in act mode: its automatic runs change things from now on (audited: runbook_mode)");
            } else {
                outln!(
                    "{name} is in shadow mode: its automatic runs send every action as a dry run and notify no one (audited: runbook_mode)"
                );
            }
            Ok(0)
        }
        RunbooksCmd::ShadowReport { name, since } => {
            let since_ms = crate::cmd::parse_since(since)?;
            let mut c = conn(cli, out)?;
            let r = c.shadow_report(name, since_ms).await?;
            c.close().await;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&r)?);
                return Ok(0);
            }
            outln!("{name} ({} mode now): {} shadow fire(s) since {since}", r.mode.as_str(), r.fires.len());
            for f in &r.fires {
                let at = nightshift_engine::api::format_rfc3339_ms(f.ts_ms);
                outln!(
                    "{} {} on {} — {} [{}]",
                    &at[..19],
                    f.run,
                    f.target,
                    f.why,
                    f.outcome.as_deref().unwrap_or("running")
                );
                if let Some(a) = &f.would_need_approval {
                    outln!("    would have waited for approval: {a}");
                }
                for w in &f.would_act {
                    outln!(
                        "    would {} {} on {}: agent {} ({})",
                        w.op,
                        w.args,
                        w.place(),
                        if w.agent_ok { "would apply" } else { "refuses" },
                        w.answer
                    );
                }
                for x in &f.refusals {
                    outln!("    refused by the engine: {x}");
                }
                for x in &f.afterwards {
                    outln!("    afterwards: {x}");
                }
            }
            Ok(0)
        }
        RunbooksCmd::Show { name } => {
            let mut c = conn(cli, out)?;
            let r = c.runbook(name).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                outln!("{} {}", out.bold(&r.name), r.handbook.clone().unwrap_or_default());
                outln!("{}\n", r.description);
                outln!("{}", out.dim(&format!("# {}", r.manifest_path)));
                // The manifest as written (YAML, comments and all); the
                // parsed form when the file cannot be read from here.
                match std::fs::read_to_string(&r.manifest_path) {
                    Ok(text) => outln!("{}", text.trim_end()),
                    Err(_) => outln!("{}", serde_json::to_string_pretty(&r.manifest)?),
                }
                outln!("{}", out.dim("# script"));
                for (i, l) in r.script.lines().enumerate() {
                    outln!("{} {l}", out.dim(&format!("{:>4}", i + 1)));
                }
            }
            Ok(0)
        }
        RunbooksCmd::Validate { path } => {
            let dir = match path {
                Some(p) => p.clone(),
                None => default_runbook_dir(cli)?,
            };
            let engine = nightshift_engine::embed::build_engine(&Default::default());
            let set = nightshift_engine::embed::load_dir(&dir, &engine);
            if out.json {
                /// What `runbooks validate --json` prints (the shape `POST
                /// /api/v1/runbooks/reload` answered for runbooks).
                #[derive(serde::Serialize)]
                struct Validated {
                    loaded: Vec<String>,
                    errors: Vec<String>,
                }
                let errors: Vec<String> = set.errors.iter().map(|e| e.to_string()).collect();
                let v = Validated { loaded: set.names(), errors };
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for e in &set.errors {
                    outln!("{} {e}", out.red("error:"));
                }
                outln!("{} runbook(s) valid, {} error(s) in {}", set.runbooks.len(), set.errors.len(), dir.display());
            }
            Ok(if set.errors.is_empty() { 0 } else { 2 })
        }
        RunbooksCmd::Test { name, dir, trace } => {
            let dir = match dir {
                Some(d) => d.clone(),
                None => default_runbook_dir(cli)?,
            };
            crate::cmd::run::test_scenarios(out, &dir, name.as_deref(), *trace).await
        }
    }
}
