//! People's own controls of a node: release holds, put a node back into
//! service. Each is sent to the agent as the person (`owner:
//! person:<name>`), through the same audited path as a runbook's actions
//! (the intent durable before it leaves, the agent's answer recorded
//! after, fenced by the leader's term). The agent's own rules still hold:
//! only a person releases a person's hold or a sticky (repair, RMA) drain,
//! and the hands-off marker refuses everything. No person ever needs the
//! engine's key.

use serde_json::{Value, json};

use nightshift_proto::{HoldInfo, Op, ReleaseArgs, Request, ResumeArgs};

use crate::audit::{NewRecord, RecordKind};
use crate::core::SentBy;
use crate::engine::{Engine, EngineError};

/// Which holds a person releases on a node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReleaseWhat {
    /// Only holds on this GPU.
    pub gpu: Option<u32>,
    /// Only this owner's holds (a run id, or `person:<name>`).
    pub owner: Option<String>,
    /// Only this hold.
    pub hold: Option<String>,
}

/// What a person's control did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ControlOutcome {
    pub node: String,
    /// Each request sent: the hold (or op), whether the agent did it, and
    /// what it said.
    pub actions: Vec<Value>,
}

impl Engine {
    /// Release holds on `node` as the person `name` (`actor` in the audit),
    /// saying why. Without `owner` or `hold`: every hold on the node (or
    /// its GPU `gpu`). The holds are read from the agent first, so what is
    /// released is what is there now.
    pub async fn person_release(
        &self,
        node: &str,
        what: &ReleaseWhat,
        name: &str,
        reason: &str,
    ) -> Result<ControlOutcome, EngineError> {
        check_reason(reason, "the holds are released")?;
        let holds = self.current_holds(node).await?;
        let chosen: Vec<&HoldInfo> = holds
            .iter()
            .filter(|h| what.gpu.is_none_or(|g| h.setting.gpu() == Some(g)))
            .filter(|h| what.owner.as_ref().is_none_or(|o| &h.owner == o))
            .filter(|h| what.hold.as_ref().is_none_or(|id| &h.id == id))
            .collect();
        if chosen.is_empty() {
            return Err(EngineError::BadTarget(format!(
                "{node} has no hold{}{}{}: see `nightshift agents holds {node}`",
                what.gpu.map(|g| format!(" on GPU {g}")).unwrap_or_default(),
                what.owner.as_ref().map(|o| format!(" owned by {o}")).unwrap_or_default(),
                what.hold.as_ref().map(|h| format!(" with id {h}")).unwrap_or_default(),
            )));
        }
        let mut out = ControlOutcome { node: node.to_string(), actions: Vec::new() };
        for h in chosen {
            let op = Op::Release(ReleaseArgs { hold: Some(h.id.clone()), ..Default::default() });
            let mut line = self.send_as_person(node, h.setting.gpu(), op, name, reason).await?;
            line["hold"] = json!(h.id);
            line["owner"] = json!(h.owner);
            line["setting"] = json!(h.setting.to_string());
            out.actions.push(line);
        }
        Ok(out)
    }

    /// Put `node` back into service as the person `name`: every drain on it
    /// ends — nightshift's, a repair or RMA drain, another person's.
    /// (`nightshift nodes repaired` is the lifecycle's step instead: it
    /// moves the GPUs to verifying and lets the health check decide.)
    pub async fn person_resume(&self, node: &str, name: &str, reason: &str) -> Result<ControlOutcome, EngineError> {
        check_reason(reason, "the node is put back into service")?;
        let mut line = self.send_as_person(node, None, Op::Resume(ResumeArgs::default()), name, reason).await?;
        let unhealthy: Vec<Value> = self
            .node_health(node)
            .and_then(|h| h["gpus"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|g| g["state"] != "healthy")
            .collect();
        if !unhealthy.is_empty() {
            line["warning"] = json!(format!(
                "{} GPU(s) of {node} are not healthy in the repair lifecycle (`nightshift agents show {node}`): a new fault drains the node again",
                unhealthy.len()
            ));
        }
        Ok(ControlOutcome { node: node.to_string(), actions: vec![line] })
    }

    /// The holds on `node` now, from its agent.
    async fn current_holds(&self, node: &str) -> Result<Vec<HoldInfo>, EngineError> {
        let reply = self.agent_call(node, Op::Holds(nightshift_proto::NoArgs {})).await?;
        let views: Vec<nightshift_proto::SettingView> =
            reply.result.and_then(|v| serde_json::from_value(v).ok()).ok_or_else(|| EngineError::AgentUnreachable {
                node: node.into(),
                message: "its answer to `holds` is not a list of settings".into(),
            })?;
        Ok(views.into_iter().flat_map(|v| v.holds).collect())
    }

    /// One request to `node`'s agent as `person:<name>`, audited; the line
    /// for the outcome.
    async fn send_as_person(
        &self,
        node: &str,
        gpu: Option<u32>,
        op: Op,
        name: &str,
        reason: &str,
    ) -> Result<Value, EngineError> {
        if self.core.fleet.get(node).is_none() {
            return Err(EngineError::UnknownNode(node.into()));
        }
        let owner = format!("person:{name}");
        let actor = format!("user:{name}");
        let req = Request::new(self.core.ids.request("person"), op);
        let (id, op_name) = (req.id.clone(), req.op.name());
        let sent = self
            .core
            .send_audited_by(None, SentBy { owner: &owner, actor: &actor, reason: Some(reason) }, node, gpu, req)
            .await;
        let mut result = crate::core::action_result(&id, op_name, false, &sent, ("applied", true));
        result.reason = Some(reason.into());
        result.by = Some(actor.clone());
        let data = json!(result);
        let rec = NewRecord::typed(RecordKind::ActionResult, &actor, &result).node(Some(node)).gpu(gpu);
        self.core.audit.append(rec, None).await?;
        match sent {
            Err(e) if !e.left => Err(EngineError::AgentUnreachable { node: node.into(), message: e.message }),
            _ => Ok(data),
        }
    }
}

fn check_reason(reason: &str, what: &str) -> Result<(), EngineError> {
    if nightshift_proto::names::has_visible_text(reason) {
        Ok(())
    } else {
        Err(EngineError::BadParams(format!(
            "reason: expected why {what} (kept in the audit), found no visible character"
        )))
    }
}
