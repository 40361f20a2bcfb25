//! The shadow report: what a runbook in shadow mode would have done — every
//! fire, its target, each action it would have taken with the agent's
//! answer to the dry run, its refusals — and what happened on that target
//! afterwards (other runs there, a person's drain, the trigger's reading
//! then and now), so an ops lead can compare automation with people before
//! promoting it.

use serde::Serialize;
use serde_json::Value;

use crate::audit::{RecordKind, RunFilter};
use crate::engine::{Engine, EngineError};

/// One action a shadow run would have taken.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct WouldAct {
    pub ts_ms: i64,
    pub node: Option<String>,
    pub gpu: Option<u32>,
    pub op: String,
    pub args: Value,
    /// The agent passed the dry run: it would have applied this.
    pub agent_ok: bool,
    /// The agent's answer: outcome, or its refusal code and message.
    pub answer: String,
}

impl WouldAct {
    /// Where: `node/gpuN`, the node, or nothing.
    pub fn place(&self) -> String {
        match (&self.node, self.gpu) {
            (Some(n), Some(g)) => format!("{n}/gpu{g}"),
            (Some(n), None) => n.clone(),
            _ => String::new(),
        }
    }
}

/// One fire of a shadow runbook.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ShadowFire {
    pub run: String,
    pub ts_ms: i64,
    pub target: String,
    pub why: String,
    pub outcome: Option<String>,
    pub would_act: Vec<WouldAct>,
    /// The engine's own refusals (blast radius, hands-off, breaker…).
    pub refusals: Vec<String>,
    /// What would have needed a person's approval.
    pub would_need_approval: Option<String>,
    /// What happened on the target afterwards, one line each.
    pub afterwards: Vec<String>,
}

impl Engine {
    /// The shadow runs of `runbook` since `since_ms`, newest first (at most
    /// `limit`).
    pub(crate) fn shadow_report(
        &self,
        runbook: &str,
        since_ms: i64,
        limit: usize,
    ) -> Result<Vec<ShadowFire>, EngineError> {
        let set = self.runbook_set();
        if set.get(runbook).is_none() {
            return Err(EngineError::UnknownRunbook { name: runbook.into(), known: set.names().join(", ") });
        }
        let page = self.runs(&RunFilter {
            runbook: Some(runbook.to_string()),
            since_ms: Some(since_ms),
            limit: Some(limit.saturating_mul(4).max(100)),
            ..Default::default()
        })?;
        let mut out = Vec::new();
        for run in page.runs.iter().filter(|r| r.shadow).take(limit) {
            let records = self.run_records(&run.id)?;
            let mut would_act = Vec::new();
            let mut refusals = Vec::new();
            let mut would_need_approval = None;
            for r in &records {
                match r.kind {
                    RecordKind::RunQueued => {
                        would_need_approval = r.data["would_need_approval"].as_str().map(str::to_string);
                    }
                    RecordKind::ActionResult => {
                        let intent = records
                            .iter()
                            .find(|i| i.kind == RecordKind::ActionIntent && i.data["action_id"] == r.data["action_id"]);
                        let ok = r.data["ok"] == true;
                        let answer = if ok {
                            r.data["outcome"].as_str().unwrap_or("ok").replace('_', " ")
                        } else {
                            format!(
                                "refused: {} {}",
                                r.data["code"].as_str().unwrap_or("?"),
                                r.data["error"].as_str().unwrap_or("")
                            )
                        };
                        would_act.push(WouldAct {
                            ts_ms: r.ts_ms,
                            node: r.node.clone(),
                            gpu: r.gpu,
                            op: intent.and_then(|i| i.data["op"].as_str()).unwrap_or("?").to_string(),
                            args: intent.map(|i| i.data["args"].clone()).unwrap_or(Value::Null),
                            agent_ok: ok,
                            answer: answer.trim().to_string(),
                        });
                    }
                    RecordKind::Refusal => refusals.push(format!(
                        "{}: {}",
                        r.data["code"].as_str().unwrap_or("refused"),
                        r.data["reason"].as_str().or(r.data["error"].as_str()).unwrap_or("")
                    )),
                    _ => {}
                }
            }
            out.push(ShadowFire {
                run: run.id.clone(),
                ts_ms: run.created_ms,
                target: run.target.to_string(),
                why: run.detail.clone(),
                outcome: run.outcome.map(|o| o.as_str().to_string()),
                would_act,
                refusals,
                would_need_approval,
                afterwards: self.afterwards(run)?,
            });
        }
        Ok(out)
    }

    /// What happened on a shadow run's target after it.
    fn afterwards(&self, run: &crate::runs::RunSummary) -> Result<Vec<String>, EngineError> {
        let mut lines = Vec::new();
        let Some(node) = run.target.node.clone() else { return Ok(lines) };
        let later = self.runs(&RunFilter {
            node: Some(node.clone()),
            since_ms: Some(run.created_ms),
            limit: Some(50),
            ..Default::default()
        })?;
        let mut others: Vec<_> = later.runs.iter().filter(|r| r.id != run.id && !r.shadow).collect();
        others.sort_by_key(|r| r.created_ms);
        for r in others.iter().take(5) {
            lines.push(format!(
                "{} {} ran {} on {}{} ({})",
                crate::signals::alerts::format_rfc3339_ms(r.created_ms),
                r.requested_by,
                r.runbook,
                r.target,
                if r.dry_run { " as a dry run" } else { "" },
                r.outcome.map(|o| o.as_str().to_string()).unwrap_or_else(|| "not finished".into())
            ));
        }
        if self.core.runs().episode_resolved(&run.event) {
            lines.push("the alert resolved".into());
        }
        if let Some(n) = self.node(&node) {
            if n.drained_by_person {
                lines.push(format!(
                    "a person drained {node}: {}",
                    n.state.drain_reason.clone().unwrap_or_else(|| "no reason given".into())
                ));
            }
            // The trigger's reading at the fire and now.
            let set = self.runbook_set();
            let metric = set.get(&run.runbook).and_then(|(_, rb)| rb.manifest.metric_id());
            if let (Some(m), Some(at_fire)) = (metric, run.event["value"].as_f64()) {
                let def = crate::base::metrics::metric(m);
                let gpu = if def.gpu_scoped { run.target.gpu } else { None };
                if let Some(now) = self.latest(&node, gpu, m) {
                    lines.push(format!("{} was {at_fire:.1} {} at the fire, {now:.1} now", def.name, def.unit));
                }
            }
        }
        Ok(lines)
    }
}
