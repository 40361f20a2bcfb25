//! `nightshift audit list | show | follow | verify | export | salvage`.

use anyhow::Result;

use nightshift_engine::api::{RunOutcome, RunState};
use nightshift_engine::audit::RunFilter;

use crate::args::{AuditCmd, Cli};
use crate::cmd::{conn, parse_since, run, usage};
use crate::conn::Conn;
use crate::out::{Out, clip, time};

pub async fn audit(cli: &Cli, out: &Out, cmd: &AuditCmd) -> Result<u8> {
    if let AuditCmd::Salvage { to } = cmd {
        return salvage(cli, out, to).await;
    }
    let mut c = conn(cli, out)?;
    match cmd {
        AuditCmd::Salvage { .. } => Err(anyhow::anyhow!("internal: salvage is handled without an engine")),
        AuditCmd::List(crate::args::RunListArgs { node, runbook, outcome, since, limit, all_shards, state, label }) => {
            let label = label
                .as_deref()
                .map(nightshift_engine::api::parse_label)
                .transpose()
                .map_err(|e| usage(format!("--{e}")))?;
            let state = match state.as_deref() {
                Some(st) => Some(
                    [RunState::Queued, RunState::PendingApproval, RunState::Running, RunState::Finished]
                        .into_iter()
                        .find(|x| x.as_str() == st)
                        .ok_or_else(|| {
                            usage(format!(
                                "--state: expected queued, pending_approval, running or finished, found {st:?}"
                            ))
                        })?,
                ),
                None => None,
            };
            let outcome = match outcome {
                Some(o) => Some(RunOutcome::parse(o).ok_or_else(|| {
                    usage(format!(
                        "--outcome: expected one of {}, found {o:?}",
                        RunOutcome::ALL.map(|o| o.as_str()).join(", ")
                    ))
                })?),
                None => None,
            };
            let f = RunFilter {
                node: node.clone(),
                runbook: runbook.clone(),
                outcome,
                since_ms: since.as_deref().map(parse_since).transpose()?,
                limit: Some(*limit),
                state,
                ..Default::default()
            };
            if *all_shards {
                let page = c.runs_all_shards(&f, label.as_ref()).await?;
                if out.json {
                    outln!("{}", serde_json::to_string_pretty(&page)?);
                    return Ok(0);
                }
                let rows: Vec<Vec<String>> = page
                    .runs
                    .iter()
                    .map(|sr| {
                        let r = &sr.run;
                        vec![
                            time(r.created_ms),
                            sr.shard.clone(),
                            r.id.clone(),
                            r.runbook.clone(),
                            r.target.to_string(),
                            out.status(&run_status(r)),
                            r.actions.to_string(),
                            clip(&r.why, 80),
                        ]
                    })
                    .collect();
                out.table(&["CREATED (UTC)", "SHARD", "RUN", "RUNBOOK", "TARGET", "STATUS", "ACTIONS", "WHY"], &rows);
                if page.next_cursor.is_some() {
                    eprintln!("{}", out.dim("(more: raise --limit)"));
                }
                return Ok(0);
            }
            let page = c.runs(&f, label.as_ref()).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&page)?);
            } else {
                let rows: Vec<Vec<String>> = page
                    .runs
                    .iter()
                    .map(|r| {
                        let status = run_status(r);
                        vec![
                            time(r.created_ms),
                            r.id.clone(),
                            r.runbook.clone(),
                            r.target.to_string(),
                            out.status(&status),
                            r.actions.to_string(),
                            clip(&r.why, 80),
                        ]
                    })
                    .collect();
                out.table(&["CREATED (UTC)", "RUN", "RUNBOOK", "TARGET", "STATUS", "ACTIONS", "WHY"], &rows);
                if page.next_cursor.is_some() {
                    eprintln!("{}", out.dim("(more: raise --limit)"));
                }
            }
            Ok(0)
        }
        AuditCmd::Show { run } => {
            let detail = c.run(run).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&detail)?);
                return Ok(0);
            }
            let (r, records) = (detail.run, detail.records);
            outln!(
                "{} {} on {}  {}",
                out.bold(&r.id),
                r.runbook,
                r.target,
                out.status(r.outcome.map(|o| o.as_str()).unwrap_or("active"))
            );
            outln!("{}", crate::out::clean(&r.why));
            outln!(
                "{}",
                out.dim(&format!(
                    "requested by {} · trigger {} · created {}",
                    crate::out::clean(&r.requested_by),
                    r.trigger,
                    time(r.created_ms)
                ))
            );
            for rec in &records {
                outln!("{}", run::describe_record(out, rec, r.created_ms));
            }
            Ok(0)
        }
        AuditCmd::Follow => match &c {
            Conn::Remote(remote) => {
                remote
                    .follow(|rec| {
                        outln!("{}", run::describe_record(out, &rec, rec.ts_ms));
                        true
                    })
                    .await?;
                Ok(0)
            }
            Conn::Local(_) => {
                let mut last = c.records_after(0, usize::MAX).await?.last().map(|r| r.seq).unwrap_or(0);
                loop {
                    for rec in c.records_after(last, 1000).await? {
                        last = rec.seq;
                        outln!("{}", run::describe_record(out, &rec, rec.ts_ms));
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
            }
        },
        AuditCmd::Verify { all_shards: true, .. } => {
            let v = c.verify_shards().await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            }
            let mut ok = true;
            for (shard, r) in &v {
                ok &= r.ok;
                if out.json {
                    continue;
                }
                if r.ok {
                    outln!("{} shard {shard}: chain verified up to record {}", out.green("ok:"), r.verified_up_to);
                } else {
                    outln!(
                        "{} shard {shard}: the chain breaks at record {}: {}",
                        out.red("broken:"),
                        serde_json::to_string(&r.first_bad_seq)?,
                        r.problem.as_deref().unwrap_or("")
                    );
                }
            }
            Ok(if ok { 0 } else { 1 })
        }
        AuditCmd::Verify { all_shards: false, head, evidence } => {
            let anchor = head
                .as_deref()
                .map(nightshift_engine::audit::parse_anchor)
                .transpose()
                .map_err(|e| usage(format!("--head: {e}")))?;
            let v = c.verify(anchor).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else if v.ok {
                outln!("{} chain verified up to record {} ({} records)", out.green("ok:"), v.verified_up_to, v.records);
                if let Some(h) = head {
                    outln!("{} the chain still holds the anchored head {h}", out.green("anchored:"));
                }
                for (seq, by) in &v.excused {
                    outln!(
                        "{} the chain breaks before record {seq}: excused by the `salvaged` record {by}, which lists what was lost",
                        out.yellow("excused:")
                    );
                }
            } else {
                outln!(
                    "{} the chain breaks at record {}: {}",
                    out.red("broken:"),
                    v.first_bad_seq.unwrap_or(0),
                    v.problem.clone().unwrap_or_default()
                );
                if c.is_local() {
                    outln!(
                        "nothing was changed; `nightshift audit salvage --to NEW_DIR` builds a store beside this one from every record that checks out"
                    );
                }
            }
            if !out.json {
                for n in &v.notes {
                    outln!("{} {n}", out.yellow("note:"));
                }
            }
            let evidence_ok = match evidence {
                Some(dir) => verify_evidence(&mut c, out, dir).await?,
                None => true,
            };
            Ok(if v.ok && evidence_ok { 0 } else { 1 })
        }
        AuditCmd::Migrate { to, url_file, url_env, ca_file, shard } => {
            if to != "postgres" {
                return Err(usage(format!("--to: expected postgres, found {to:?}")));
            }
            let config =
                nightshift_engine::config::EngineConfig::load(&cli.config).map_err(|e| usage(e.to_string()))?;
            // The connection string as the engine reads it: the flags, else
            // engine.yaml's audit.postgres.
            let from_config = config.audit.postgres.as_ref();
            let (url, config_ca) = if url_file.is_some() || url_env.is_some() {
                let url =
                    nightshift_engine::config::PostgresConfig::read_url(url_file.as_deref(), url_env.as_deref(), "--")
                        .map_err(usage)?;
                (url, from_config.and_then(|p| p.ca_file.clone()))
            } else {
                let p = from_config.ok_or_else(|| {
                    usage("name the connection string: --url-file FILE or --url-env VAR (or audit.postgres in engine.yaml)")
                })?;
                (p.url().map_err(usage)?, p.ca_file.clone())
            };
            let ca = ca_file.clone().or(config_ca);
            migrate_to_postgres(&config.data_dir, &url, ca.as_deref(), shard).await
        }
        AuditCmd::Head => {
            let Some(h) = c.audit_head().await? else {
                outln!("the audit store is empty");
                return Ok(0);
            };
            if out.json {
                // As the server's `GET /api/v1/audit/head` answers it.
                outln!("{}", serde_json::to_string(&nightshift_engine::api::AuditHead::of(Some(&h)))?);
            } else {
                outln!("record {} at {} hash {}", h.seq, nightshift_engine::api::format_rfc3339_ms(h.ts_ms), h.hash);
            }
            Ok(0)
        }
        AuditCmd::Export { format } => {
            if format != "jsonl" {
                return Err(usage(format!("--format: expected jsonl, found {format:?}")));
            }
            let mut after = 0;
            loop {
                let batch = c.records_after(after, 1000).await?;
                let Some(last) = batch.last() else { break };
                after = last.seq;
                for r in &batch {
                    outln!("{}", serde_json::to_string(r)?);
                }
            }
            Ok(0)
        }
    }
}

/// `nightshift audit salvage --to DIR`.
async fn salvage(cli: &Cli, out: &Out, to: &std::path::Path) -> Result<u8> {
    if cli.server.is_some() {
        return Err(usage("salvage works on the data dir itself: run it on the engine's host without --server"));
    }
    let cfg = nightshift_engine::config::EngineConfig::load(&cli.config).map_err(|e| usage(e.to_string()))?;
    let clock: nightshift_proto::clock::SharedClock = std::sync::Arc::new(nightshift_proto::clock::SystemClock);
    // Salvage blocks (files, sled, a watchdog): off the async threads.
    let (from, dest) = (cfg.data_dir.clone(), to.to_path_buf());
    let r = tokio::task::spawn_blocking(move || nightshift_engine::audit::salvage(&from, &dest, clock))
        .await?
        .map_err(|e| usage(e.to_string()))?;
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(0);
    }
    outln!("salvaged {} record(s) from {} into {}", r.recovered, cfg.data_dir.display(), to.display());
    if let Some(e) = &r.sled_error {
        outln!("  the old sled store could not be read ({e}): records came from the record log");
    }
    for (a, b) in &r.lost {
        outln!("  {} records {a}–{b}", out.red("lost"));
    }
    for (line, why) in &r.damaged_lines {
        outln!("  {} record log line {line}: {why}", out.yellow("damaged"));
    }
    outln!(
        "  run summaries: {} copied, {} rebuilt from their records; record {} says what happened",
        r.summaries_copied,
        r.summaries_rebuilt,
        r.salvage_seq
    );
    outln!("point data_dir at {} and start the engine", to.display());
    Ok(0)
}

/// `audit migrate --to postgres`: the record log into PostgreSQL
/// (`nightshift_audit::tools::migrate`), resuming after what is there.
async fn migrate_to_postgres(
    data_dir: &std::path::Path,
    url: &str,
    ca_file: Option<&std::path::Path>,
    shard: &str,
) -> Result<u8> {
    use nightshift_engine::audit::tools::migrate::{self, MigrateError};
    let mut progress = |done: usize, of: usize| eprintln!("audit migrate: {done} of {of}");
    let m = match migrate::to_postgres(data_dir, url, ca_file, shard, &mut progress).await {
        Ok(m) => m,
        Err(e @ (MigrateError::InUse(_) | MigrateError::OtherChain { .. })) => return Err(usage(e.to_string())),
        Err(e @ MigrateError::Connect(_)) => return Err(anyhow::Error::new(crate::Fail(4)).context(e.to_string())),
        Err(e) => return Err(e.into()),
    };
    eprintln!(
        "audit migrate: schema v{}; {} records in the store, {} already in shard {shard}, copied {}",
        m.schema_version, m.records, m.already, m.copied
    );
    if m.ok() {
        outln!(
            "migrated: shard {shard} holds records 1–{} and its chain verifies in PostgreSQL (head hash {})",
            m.verified.verified_up_to,
            m.db_head.unwrap_or_default()
        );
        Ok(0)
    } else {
        outln!(
            "the copy does not verify: {} (first bad record {:?}); the local store is unchanged",
            m.verified.problem.unwrap_or_else(|| "the heads differ".into()),
            m.verified.first_bad_seq
        );
        Ok(1)
    }
}

/// A run's outcome, or its state while it has none.
fn run_status(r: &nightshift_engine::api::RunSummary) -> String {
    r.outcome.map(|o| o.as_str().to_string()).unwrap_or_else(|| {
        serde_json::to_value(r.state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
    })
}

/// `audit verify --evidence DIR`: the bundle's files against its manifest,
/// the manifest against the hash the chain recorded for that bundle.
async fn verify_evidence(c: &mut Conn, out: &Out, dir: &std::path::Path) -> Result<bool> {
    let (bundle, sha) = match nightshift_proto::verify_evidence_dir(dir) {
        Ok(x) => x,
        Err(e) => {
            outln!("{} evidence: {e}", out.red("broken:"));
            return Ok(false);
        }
    };
    let mut after = 0;
    let mut recorded = None;
    loop {
        let page = c.records_after(after, 1000).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        if let Some(r) = page.into_iter().rev().find(|r| {
            r.kind == nightshift_engine::audit::RecordKind::EvidenceCollected
                && crate::cmd::agents::evidence(r).bundle == bundle.id
        }) {
            recorded = Some(r);
        }
    }
    match recorded {
        None => {
            outln!(
                "{} evidence: no evidence_collected record names bundle {} on this chain",
                out.red("broken:"),
                bundle.id
            );
            Ok(false)
        }
        Some(r) if crate::cmd::agents::evidence(&r).sha256 == sha => {
            outln!(
                "{} evidence bundle {} ({} files) matches the sha256 record {} holds ({sha})",
                out.green("ok:"),
                bundle.id,
                bundle.files.len(),
                r.seq
            );
            Ok(true)
        }
        Some(r) => {
            outln!(
                "{} evidence: bundle {}'s manifest has sha256 {sha}; record {} holds {}",
                out.red("broken:"),
                bundle.id,
                r.seq,
                crate::cmd::agents::evidence(&r).sha256
            );
            Ok(false)
        }
    }
}
