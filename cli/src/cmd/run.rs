//! `nightshift run` (plan, confirm, stream the steps, exit by outcome) and
//! `nightshift runbooks test` (scenarios in virtual time).

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;

use nightshift_engine::api::{RunOutcome, Target};
use nightshift_engine::audit::{AuditRecord, RecordKind};
use nightshift_engine::engine::{RunRequest, Submitted};

use crate::Fail;
use crate::conn::Conn;
use crate::out::{Out, clip};

fn compact(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::Object(m) => m.iter().map(|(k, v)| format!("{k}={}", compact(v))).collect::<Vec<_>>().join(" "),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// One line for a record, with the time since `t0`.
pub fn describe_record(out: &Out, r: &AuditRecord, t0: i64) -> String {
    // What people wrote (a reason, a note) is shown, never obeyed by the
    // terminal.
    let cleaned = AuditRecord {
        data: crate::out::clean_json(&r.data),
        actor: crate::out::clean(&r.actor),
        node: r.node.as_deref().map(crate::out::clean),
        ..r.clone()
    };
    let r = &cleaned;
    let t = out.dim(&format!("+{:>5.0}s", (r.ts_ms - t0) as f64 / 1000.0));
    let d = &r.data;
    let where_ =
        format!("{}{}", r.node.clone().unwrap_or_default(), r.gpu.map(|g| format!("/gpu{g}")).unwrap_or_default());
    use nightshift_engine::audit::data;
    // A payload as its kind's type (a record too old or too new for it
    // reads as its defaults: the line says less, never fails).
    fn p<P: data::Payload + Default>(r: &AuditRecord) -> P {
        r.payload::<P>().unwrap_or_default()
    }
    let text = match r.kind {
        RecordKind::RunQueued => format!(
            "queued {} {} on {} — {}",
            r.run.clone().unwrap_or_default(),
            r.runbook.clone().unwrap_or_default(),
            where_,
            p::<data::RunQueued>(r).detail
        ),
        RecordKind::ApprovalRequested => {
            out.yellow(&format!("waiting for approval: {}", p::<data::ApprovalRequested>(r).reason))
        }
        RecordKind::Approved => out.green(&format!("approved by {}", p::<data::Approval>(r).by)),
        RecordKind::Rejected => {
            let a = p::<data::Approval>(r);
            out.red(&format!("rejected by {}: {}", a.by, a.reason.unwrap_or_default()))
        }
        RecordKind::RunStarted => "started".into(),
        RecordKind::ActionIntent => {
            let i = p::<data::ActionIntent>(r);
            format!(
                "→ {} {} on {}{}",
                out.bold(if i.op.is_empty() { "?" } else { &i.op }),
                compact(&i.args),
                where_,
                if i.dry_run { " (dry run)" } else { "" }
            )
        }
        RecordKind::ActionResult => {
            let a = p::<data::ActionResult>(r);
            let outcome = if a.outcome.is_empty() { "?" } else { &a.outcome };
            let mark = if a.ok { out.status(outcome) } else { out.red(outcome) };
            let null = Value::Null;
            let after = a.after.as_ref().unwrap_or(&null);
            let before = a.more.get("before").unwrap_or(&null);
            // A release says what each setting came back to, in words.
            let released = crate::cmd::control::released_words(after);
            let change = if a.op == "release" && !released.is_empty() {
                format!(" {}", released.join("; "))
            } else if before.is_null() && after.is_null() {
                String::new()
            } else {
                format!(" {} → {}", compact(before), compact(after))
            };
            let detail = a.more.get("detail").and_then(Value::as_str);
            let extra = a.error.as_deref().or(detail).map(|e| format!(" ({e})")).unwrap_or_default();
            format!(
                "  {mark}{change}{extra}{}",
                a.duration_ms.map(|ms| out.dim(&format!(" {ms} ms"))).unwrap_or_default()
            )
        }
        RecordKind::Note => format!("  note: {}", p::<data::Note>(r).text),
        RecordKind::Notification => out.yellow(&format!("  notify: {}", p::<data::Notice>(r).text)),
        RecordKind::Escalation => out.red(&format!("  ESCALATE: {}", p::<data::Notice>(r).text)),
        RecordKind::Refusal => {
            let x = p::<data::Refusal>(r);
            out.red(&format!("  refused ({}): {}", x.code, x.reason))
        }
        RecordKind::RunFinished => {
            let f = p::<data::RunFinished>(r);
            let o = if f.outcome.is_empty() { "?" } else { &f.outcome };
            // Why it ended so: the error, or what a person must do.
            let why = f.error.as_deref().or(f.note.as_deref());
            format!("finished: {}{}", out.status(o), why.map(|e| format!(" — {e}")).unwrap_or_default())
        }
        other => format!("{} {} {}", other.as_str(), where_, clip(&compact(d), 120)),
    };
    format!("{t} {text}")
}

fn exit_for(o: Option<RunOutcome>, rejected: bool) -> u8 {
    match o {
        Some(RunOutcome::Succeeded) => 0,
        Some(RunOutcome::NeedsPerson) => 4,
        Some(RunOutcome::Refused) => 3,
        Some(RunOutcome::Cancelled) if rejected => 3,
        _ => 1,
    }
}

/// What `nightshift run` was asked to do.
pub struct Ask<'a> {
    pub runbook: &'a str,
    pub node: Option<String>,
    pub gpu: Option<u32>,
    /// `label=value`.
    pub group: Option<String>,
    pub params: BTreeMap<String, String>,
    pub dry_run: bool,
    /// Do not ask for confirmation.
    pub yes: bool,
}

/// Show the plan, confirm, submit, stream the steps; the exit code says how
/// the run ended.
pub async fn run(c: &mut Conn, out: &Out, ask: Ask<'_>) -> Result<u8> {
    let Ask { runbook, node, gpu, group, params, dry_run, yes } = ask;
    let target = match (&node, gpu, &group) {
        (Some(n), g, None) => Target { node: Some(n.clone()), gpu: g, group: None },
        (None, None, Some(g)) => {
            let (k, v) = g.split_once('=').ok_or_else(|| {
                anyhow::Error::new(Fail(2)).context(format!("--group: expected label=value, found {g:?}"))
            })?;
            Target::group(k, v)
        }
        _ => {
            return Err(
                anyhow::Error::new(Fail(2)).context("name a target: --node N [--gpu G], or --group label=value")
            );
        }
    };
    // The plan: the engine's own decision (nodes, nodes changed, approval),
    // never a count of this command's.
    let rb = c.runbook(runbook).await?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    let requested_by = format!("user:{}", std::env::var("USER").unwrap_or_else(|_| "cli".into()));
    let request = RunRequest {
        runbook: runbook.into(),
        target: target.clone(),
        trigger: "manual".into(),
        detail: format!("manual run by {requested_by}"),
        event: nightshift_engine::api::manual_event(&requested_by, None),
        event_ts_ms: now,
        params: params.clone(),
        dry_run,
        requested_by,
    };
    let plan = c.plan(&request).await?;
    let touched: Vec<String> = plan.nodes.clone();
    if touched.is_empty() {
        return Err(
            anyhow::Error::new(Fail(2)).context(format!("no node matches {target}: check the node name or the label"))
        );
    }
    let needs_approval = plan.needs_approval;
    let approval_why = plan.approval_reason.clone().unwrap_or_default();
    let mut resolved: BTreeMap<String, String> = BTreeMap::new();
    // The engine's resolution: every parameter, defaults filled in.
    for (k, v) in &plan.params {
        resolved.insert(k.clone(), serde_json::to_string(v)?);
    }
    for (k, v) in &params {
        resolved.insert(k.clone(), format!("{v} (set)"));
    }
    if !out.json {
        outln!("{} {} — {}", out.bold("runbook"), rb.name, rb.description);
        outln!("{} {}  ({} node(s): {})", out.bold("target "), target, touched.len(), clip(&touched.join(", "), 80));
        if !resolved.is_empty() {
            outln!(
                "{} {}",
                out.bold("params "),
                resolved.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
            );
        }
        outln!(
            "{} {}{}",
            out.bold("mode   "),
            if dry_run {
                out.yellow("dry run: every action is checked and nothing changes")
            } else {
                out.red("live: actions change the nodes")
            },
            if needs_approval {
                out.yellow(&format!("; needs approval by another operator ({approval_why})"))
            } else {
                String::new()
            }
        );
    }
    if !dry_run && !yes {
        if !std::io::stdin().is_terminal() {
            return Err(anyhow::Error::new(Fail(2))
                .context("this run changes nodes: confirm with --yes (stdin is not a terminal), or use --dry-run"));
        }
        out!("Proceed? [y/N] ");
        std::io::stdout().flush()?;
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        if !matches!(line.trim(), "y" | "Y" | "yes") {
            outln!("not started");
            return Ok(3);
        }
    }
    if needs_approval && matches!(c, Conn::Local(_)) {
        return Err(anyhow::Error::new(Fail(3)).context(
            "this run needs approval by someone else, which needs a running engine: run it with --server URL",
        ));
    }
    if let Conn::Local(l) = c {
        l.wait_connected(&touched, 15).await?;
    }
    let submitted = c.submit(request).await?;
    let id = match &submitted {
        Submitted::Queued { run } | Submitted::PendingApproval { run } => run.id.clone(),
        Submitted::Refused { run } => {
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&submitted)?);
            } else {
                outln!("{} {}", out.red("refused:"), run.error.clone().unwrap_or_default());
            }
            return Ok(3);
        }
        Submitted::Suppressed { reason, .. } | Submitted::Dropped { reason } => {
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&submitted)?);
            } else {
                outln!("{} {reason}", out.red("not started:"));
            }
            return Ok(3);
        }
    };
    // Stream the steps.
    let mut spinner = (out.tty && !out.json).then(|| {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_message(format!("{id} submitted"));
        pb.enable_steady_tick(Duration::from_millis(120));
        pb
    });
    let mut shown = 0usize;
    let mut interrupt = std::pin::pin!(tokio::signal::ctrl_c());
    let mut cancelling = false;
    let submitted_at = std::time::Instant::now();
    loop {
        // Through an HA standby the run is the leader's: the standby's copy
        // of the chain has it a moment later (its `follow_ms`).
        let (run, records) = match c.run(&id).await {
            Ok(d) => (d.run, d.records),
            Err(e) if submitted_at.elapsed() < Duration::from_secs(15) && format!("{e:#}").contains("404") => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        for r in records.iter().skip(shown) {
            let line = describe_record(out, r, run.created_ms);
            if out.json {
                outln!("{}", serde_json::to_string(r)?);
            } else if let Some(pb) = &spinner {
                pb.println(line);
            } else {
                outln!("{line}");
            }
        }
        shown = records.len();
        // The spinner says what the run waits for, not always "running".
        if let Some(pb) = &spinner {
            pb.set_message(format!("{id} {}", waiting_words(run.state, run.waiting_for.as_deref())));
        }
        if let Some(o) = run.outcome {
            if let Some(pb) = spinner {
                pb.finish_and_clear();
            }
            let rejected = run.approvals.iter().any(|a| !a.approved);
            if !out.json {
                outln!("{} {} {} — {}", out.bold(&run.id), out.status(o.as_str()), run.target, run.why);
            }
            return Ok(exit_for(Some(o), rejected));
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = &mut interrupt, if !cancelling => {
                // The question goes on a clean line: the spinner is gone
                // for good (what follows prints line by line).
                if let Some(pb) = spinner.take() {
                    pb.finish_and_clear();
                }
                match on_interrupt(c, out, &id).await? {
                    Some(code) => return Ok(code),
                    // Cancelled: follow the run to its end.
                    None => cancelling = true,
                }
            }
        }
    }
}

/// What a streamed run is doing, for the spinner: queued (and behind
/// what), waiting for approval, running.
fn waiting_words(state: nightshift_engine::api::RunState, waiting_for: Option<&str>) -> String {
    use nightshift_engine::api::RunState;
    match (state, waiting_for) {
        (RunState::PendingApproval, _) => "waiting for approval by another operator (nightshift approve)".into(),
        (RunState::Queued, Some(w)) => format!("queued: waiting for {w}"),
        (RunState::Queued, None) => "queued".into(),
        (RunState::Running, _) => "running".into(),
        (RunState::Finished, _) => "finished".into(),
    }
}

/// Ctrl-C while a run streams: ask whether to cancel it or leave it
/// running (a terminal), and say which. `None`: cancelled, keep following
/// it to its end; `Some(code)`: exit now, the run left running.
async fn on_interrupt(c: &mut Conn, out: &Out, id: &str) -> Result<Option<u8>> {
    let local = matches!(c, Conn::Local(_));
    let cancel = if local {
        // The engine is this process: leaving would interrupt the run
        // mid-step. Cancel it properly instead (it stops at its next step
        // and gives back its holds).
        eprintln!("\n{id}: this command runs the engine itself, so the run cannot outlive it: cancelling it");
        true
    } else if std::io::stdin().is_terminal() {
        eprint!("{id} is still on the engine. Cancel it? [y/N] (no: it goes on, and you can follow it) ");
        let mut line = String::new();
        let answered = tokio::task::spawn_blocking(move || std::io::stdin().lock().read_line(&mut line).map(|_| line))
            .await
            .ok()
            .and_then(|r| r.ok());
        matches!(answered.as_deref().map(str::trim), Some("y" | "Y" | "yes"))
    } else {
        false
    };
    if !cancel {
        eprintln!(
            "{id}: left running. Follow it with `nightshift audit show {id}`; cancel it with `nightshift runs cancel {id}`"
        );
        return Ok(Some(130));
    }
    c.cancel(id, "cancelled at the terminal that started it (interrupted while waiting)").await?;
    if !out.json {
        eprintln!("{id}: cancelled — it stops at its next step and gives back its holds");
    }
    Ok(None)
}

/// `nightshift runbooks test [NAME]`.
pub async fn test_scenarios(out: &Out, dir: &Path, name: Option<&str>, trace: Option<u64>) -> Result<u8> {
    use nightshift_sim::scenario::{Scenario, run_traced, scenario_files};
    let files = scenario_files(&dir.join("scenarios"));
    if files.is_empty() {
        return Err(anyhow::Error::new(Fail(2)).context(format!("no scenarios in {}", dir.join("scenarios").display())));
    }
    let mut rows = Vec::new();
    let mut reports = Vec::new();
    let mut failed = 0;
    for f in files {
        let s = Scenario::load(&f).map_err(|e| anyhow::Error::new(Fail(2)).context(e.to_string()))?;
        if let Some(n) = name {
            let of_runbook = s.runbooks.as_ref().is_some_and(|l| l.iter().any(|r| r == n));
            if !of_runbook && !s.name.starts_with(n) {
                continue;
            }
        }
        let r = run_traced(&f, dir, trace).await.map_err(|e| anyhow::Error::new(Fail(2)).context(e.to_string()))?;
        if !r.passed {
            failed += 1;
        }
        // A line as each one finishes (the table comes at the end).
        if !out.json {
            eprintln!(
                "{} {} ({} s virtual in {} ms)",
                out.status(if r.passed { "pass" } else { "FAIL" }),
                r.name,
                r.virtual_secs,
                r.wall_ms
            );
        }
        rows.push(vec![
            r.name.clone(),
            r.handbook.clone().unwrap_or_default(),
            out.status(if r.passed { "pass" } else { "FAIL" }),
            format!("{} s", r.virtual_secs),
            format!("{} ms", r.wall_ms),
            r.evaluations
                .iter()
                .map(|e| {
                    if e.fires == 0 {
                        format!("{} looked {}×, quiet", e.runbook, e.evaluations)
                    } else {
                        format!("{} fired {}×", e.runbook, e.fires)
                    }
                })
                .collect::<Vec<_>>()
                .join("; "),
            r.actions.iter().filter(|a| a.outcome == "applied").map(|a| a.op.clone()).collect::<Vec<_>>().join(", "),
        ]);
        reports.push(r);
    }
    if rows.is_empty() {
        return Err(anyhow::Error::new(Fail(2)).context(format!("no scenario matches {:?}", name.unwrap_or(""))));
    }
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        out.table(&["SCENARIO", "ROW", "RESULT", "VIRTUAL", "WALL", "TRIGGERS", "ACTIONS"], &rows);
        for r in reports.iter().filter(|r| !r.trace.is_empty()) {
            outln!("\n{} {}", out.bold("trace"), r.name);
            for l in &r.trace {
                outln!("  {l}");
            }
        }
        for r in reports.iter().filter(|r| !r.passed) {
            outln!("\n{} {}", out.red("FAIL"), r.name);
            for f in &r.failures {
                outln!("  {f}");
            }
        }
        outln!("\n{} scenario(s), {} failed", reports.len(), failed);
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::waiting_words;
    use nightshift_engine::api::RunState;

    #[test]
    fn the_spinner_says_what_the_run_waits_for() {
        let cases = [
            (RunState::PendingApproval, None, "waiting for approval by another operator (nightshift approve)"),
            (
                RunState::Queued,
                Some("the node lock held by r000007-abc"),
                "queued: waiting for the node lock held by r000007-abc",
            ),
            (RunState::Queued, None, "queued"),
            (RunState::Running, None, "running"),
        ];
        for (state, waiting, want) in cases {
            assert_eq!(waiting_words(state, waiting), want);
        }
    }
}
