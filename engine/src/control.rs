//! People's own controls of a node: release holds, drain a node, put it
//! back into service. Each is sent to the agent as the person (`owner:
//! person:<name>`), through the same audited path as a runbook's actions
//! (the intent durable before it leaves, the agent's answer recorded
//! after, fenced by the leader's term). The agent's own rules still hold:
//! only a person releases a person's hold or a sticky (repair, RMA) drain,
//! and the hands-off marker refuses everything. No person ever needs the
//! engine's key.

use nightshift_proto::{DrainArgs, HoldInfo, Op, ReleaseArgs, Request, ResumeArgs};

use crate::audit::{NewRecord, RecordKind};
use crate::core::SentBy;
use crate::engine::{Engine, EngineError};

/// Which holds a person releases on a node. A release names its scope:
/// `all`, or at least one of the narrowing fields.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReleaseWhat {
    /// Only holds on this GPU.
    pub gpu: Option<u32>,
    /// Only this owner's holds (a run id, or `person:<name>`).
    pub owner: Option<String>,
    /// Only this hold.
    pub hold: Option<String>,
    /// Only holds of this kind (`power_limit`, `fan_curve`, `node_drain`, …).
    pub kind: Option<String>,
    /// Every hold on the node (said on purpose).
    pub all: bool,
    /// An admin releases a repair drain of a GPU the health model holds
    /// broken anyway (a reason is required, as always).
    pub force: bool,
}

/// Who acts, as far as the guards care.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Person<'a> {
    pub name: &'a str,
    pub admin: bool,
}

/// The kinds of held settings a release may name.
pub const HOLD_KINDS: [&str; 8] =
    ["power_limit", "fan_curve", "clocks", "gpu_drain", "node_drain", "config", "chassis_fans", "mark"];

/// What a person's control did.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ControlOutcome {
    pub node: String,
    /// Each request sent: the hold (or op), whether the agent did it, and
    /// what it said.
    pub actions: Vec<ControlAction>,
}

impl ControlOutcome {
    /// The first request the agent refused.
    pub fn refused(&self) -> Option<&ControlAction> {
        self.actions.iter().find(|a| !a.result.ok)
    }
}

/// One request of a person's control: its audited result, and for a
/// release the hold it named.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ControlAction {
    #[serde(flatten)]
    pub result: crate::audit::data::ActionResult,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The held setting, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setting: Option<String>,
    /// What a person should know about the node afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

impl ControlAction {
    fn of(mut result: crate::audit::data::ActionResult) -> ControlAction {
        // Named here, not by the agent's answer.
        for k in ["hold", "owner", "setting", "warning"] {
            result.more.remove(k);
        }
        ControlAction { result, hold: None, owner: None, setting: None, warning: None }
    }
}

impl Engine {
    /// Release holds on `node` as the person `name` (`actor` in the audit),
    /// saying why. Without `owner` or `hold`: every hold on the node (or
    /// its GPU `gpu`). The holds are read from the agent first, so what is
    /// released is what is there now.
    ///
    /// The guards the CLI's questions stand for, kept here so every way in
    /// has them: the scope is named (`all`, or a GPU, owner, hold or kind);
    /// an admin's hands-off on the node refuses an operator's release; a
    /// drain nightshift keeps on a GPU the health model holds broken
    /// (faulted, quarantined, awaiting repair, RMA) goes only by the repair
    /// lifecycle (`nodes repaired`) or an admin's `force`. Nothing is sent
    /// when a guard refuses.
    pub(crate) async fn person_release(
        &self,
        node: &str,
        what: &ReleaseWhat,
        who: Person<'_>,
        reason: &str,
    ) -> Result<ControlOutcome, EngineError> {
        check_reason(reason, "the holds are released")?;
        if !what.all && what.gpu.is_none() && what.owner.is_none() && what.hold.is_none() && what.kind.is_none() {
            return Err(EngineError::BadTarget(format!(
                "expected the release's scope — all: true (every hold on {node}), or a gpu, owner, hold or kind — found none"
            )));
        }
        if let Some(k) = &what.kind
            && !HOLD_KINDS.contains(&k.as_str())
        {
            return Err(EngineError::BadTarget(format!(
                "kind: expected one of {}, found {k:?}",
                HOLD_KINDS.join(", ")
            )));
        }
        if what.force && !who.admin {
            return Err(EngineError::AdminOnly(format!(
                "force: only an admin releases a repair drain of a broken GPU; {} is not one",
                who.name
            )));
        }
        let hands_off = self.core.fleet().get(node).and_then(|n| n.state().engine_hands_off.clone());
        if let Some((by, why)) = hands_off
            && !who.admin
        {
            return Err(EngineError::Guarded {
                code: "hands_off",
                message: format!(
                    "{node} is hands-off ({by}: {why}): nothing released; an admin releases it, or ends the hands-off first (`nightshift nodes hands-off {node} --off`)"
                ),
            });
        }
        let holds = self.current_holds(node).await?;
        let chosen: Vec<&HoldInfo> = holds
            .iter()
            .filter(|h| what.gpu.is_none_or(|g| h.setting.gpu() == Some(g)))
            .filter(|h| what.owner.as_ref().is_none_or(|o| &h.owner == o))
            .filter(|h| what.hold.as_ref().is_none_or(|id| &h.id == id))
            .filter(|h| what.kind.as_ref().is_none_or(|k| h.setting.kind() == k))
            .collect();
        if chosen.is_empty() {
            return Err(EngineError::BadTarget(format!(
                "{node} has no hold{}{}{}{}: see `nightshift agents holds {node}`",
                what.kind.as_ref().map(|k| format!(" of kind {k}")).unwrap_or_default(),
                what.gpu.map(|g| format!(" on GPU {g}")).unwrap_or_default(),
                what.owner.as_ref().map(|o| format!(" owned by {o}")).unwrap_or_default(),
                what.hold.as_ref().map(|h| format!(" with id {h}")).unwrap_or_default(),
            )));
        }
        if !(who.admin && what.force) {
            let broken: Vec<String> = chosen.iter().filter_map(|h| self.repair_drain_of_broken_gpu(node, h)).collect();
            if !broken.is_empty() {
                return Err(EngineError::Guarded {
                    code: "repair_pending",
                    message: format!(
                        "nothing released: {}; mark the repair done (`nightshift nodes repaired {node}`: the health check then ends the drain), or, as an admin, force the release with a reason",
                        broken.join("; ")
                    ),
                });
            }
        }
        let mut out = ControlOutcome { node: node.to_string(), actions: Vec::new() };
        for h in chosen {
            let op = Op::Release(ReleaseArgs { hold: Some(h.id.clone()), ..Default::default() });
            let mut line = self.send_as_person(node, h.setting.gpu(), op, who.name, reason).await?;
            line.hold = Some(h.id.clone());
            line.owner = Some(h.owner.clone());
            line.setting = Some(h.setting.to_string());
            out.actions.push(line);
        }
        if out.actions.iter().any(|a| a.result.ok) {
            self.resolve_pages(node, what.gpu, &format!("taken over by {}: {reason}", who.name), None).await;
        }
        Ok(out)
    }

    /// Put `node` back into service as the person `name`: every drain on it
    /// ends — nightshift's, a repair or RMA drain, another person's.
    /// (`nightshift nodes repaired` is the lifecycle's step instead: it
    /// moves the GPUs to verifying and lets the health check decide.)
    pub(crate) async fn person_resume(
        &self,
        node: &str,
        name: &str,
        reason: &str,
    ) -> Result<ControlOutcome, EngineError> {
        check_reason(reason, "the node is put back into service")?;
        let mut line = self.send_as_person(node, None, Op::Resume(ResumeArgs::default()), name, reason).await?;
        if line.result.ok {
            self.resolve_pages(node, None, &format!("taken over by {name}: {reason}"), None).await;
        }
        let unhealthy = self.node_health(node).map_or(0, |h| h.unhealthy().count());
        if unhealthy > 0 {
            line.warning = Some(format!(
                "{} GPU(s) of {node} are not healthy in the repair lifecycle (`nightshift agents show {node}`): the node serves again, but a GPU nightshift took out for its fault stays out (its own drain, no lease) until it is repaired (`nightshift nodes repaired {node} --gpu N`: the health check ends it) or an admin forces its release (`nightshift holds release {node} --gpu N --kind gpu_drain --force --reason …`)",
                unhealthy
            ));
        }
        Ok(ControlOutcome { node: node.to_string(), actions: vec![line] })
    }

    /// Drain `node` as the person `name` (`nightshift nodes drain`): the
    /// scheduler places no new work there, running jobs finish. It is the
    /// person's drain — the scheduler's reason names them, it has no lease,
    /// nightshift never ends it and its blast radius does not count it —
    /// until a person resumes the node (`nodes resume`). Audited before it
    /// is sent, under the person, with the reason.
    pub(crate) async fn person_drain(
        &self,
        node: &str,
        name: &str,
        reason: &str,
    ) -> Result<ControlOutcome, EngineError> {
        check_reason(reason, "the node is drained")?;
        let op = Op::Drain(DrainArgs { reason: reason.into(), run: None, sticky: true, repair: false });
        let line = self.send_as_person(node, None, op, name, reason).await?;
        Ok(ControlOutcome { node: node.to_string(), actions: vec![line] })
    }

    /// If `h` is a drain nightshift keeps for a GPU the health model holds
    /// broken: what it is, in words. A node drain counts for every GPU of
    /// the node; a GPU drain for its GPU.
    fn repair_drain_of_broken_gpu(&self, node: &str, h: &HoldInfo) -> Option<String> {
        use crate::health::HealthState;
        let drain = matches!(
            h.value,
            nightshift_proto::HoldValue::NodeDrain { drained: true, .. }
                | nightshift_proto::HoldValue::GpuDrain { drained: true }
        );
        if !drain || h.owner.starts_with("person:") {
            return None;
        }
        let model = self.core.health().model();
        let broken: Vec<String> = model
            .node_gpus(node)
            .filter(|(g, _)| h.setting.gpu().is_none_or(|only| only == *g))
            .filter(|(_, gh)| {
                matches!(
                    gh.state,
                    HealthState::Faulted | HealthState::Quarantined | HealthState::AwaitingRepair | HealthState::Rma
                )
            })
            .map(|(g, gh)| format!("GPU {g} {}", gh.state.as_str()))
            .collect();
        (!broken.is_empty()).then(|| format!("hold {} ({}) keeps {} out of service", h.id, h.value, broken.join(", ")))
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
    ) -> Result<ControlAction, EngineError> {
        if self.core.fleet().get(node).is_none() {
            return Err(EngineError::UnknownNode(node.into()));
        }
        let owner = format!("person:{name}");
        let actor = format!("user:{name}");
        let req = Request::new(self.core.ids().request("person"), op);
        let (id, op_name) = (req.id.clone(), req.op.name());
        let sent = self
            .core
            .send_audited_by(None, SentBy { owner: &owner, actor: &actor, reason: Some(reason) }, node, gpu, req)
            .await;
        let mut result = crate::core::action_result(&id, op_name, false, &sent, ("applied", true));
        result.reason = Some(reason.into());
        result.by = Some(actor.clone());
        let rec = NewRecord::typed(RecordKind::ActionResult, &actor, &result).node(Some(node)).gpu(gpu);
        self.core.audit().append(rec, None).await?;
        match sent {
            Err(e) if !e.left => Err(EngineError::AgentUnreachable { node: node.into(), message: e.message }),
            _ => Ok(ControlAction::of(result)),
        }
    }
}

fn check_reason(reason: &str, what: &str) -> Result<(), EngineError> {
    if nightshift_proto::names::has_visible_text(reason)
        && let Some(problem) = nightshift_proto::names::free_text_problem("reason", reason)
    {
        return Err(EngineError::BadParams(problem));
    }
    if nightshift_proto::names::has_visible_text(reason) {
        Ok(())
    } else {
        Err(EngineError::BadParams(format!(
            "reason: expected why {what} (kept in the audit), found no visible character"
        )))
    }
}

impl Engine {
    /// Tell a `sim` agent's simulated hardware a fault (an admin trying
    /// the stack in a lab: a DBE, an XID, a GPU off the bus). Not a change
    /// nightshift makes — the world it watches — so no run owns it; it is
    /// audited as a note under who injected it, and refused by any agent
    /// on real hardware (the agent says so).
    pub(crate) async fn simulate_fault(
        &self,
        node: &str,
        by: &str,
        fault: nightshift_proto::SimFault,
    ) -> Result<serde_json::Value, EngineError> {
        let n = self.core.fleet().get(node).ok_or_else(|| EngineError::UnknownNode(node.into()))?;
        let what = serde_json::to_value(&fault).map(|v| v.to_string()).unwrap_or_default();
        let text = format!("a simulated fault injected by {by}: {what}");
        let note = crate::audit::data::Note { text, ..Default::default() };
        self.core.audit().append(NewRecord::typed(RecordKind::Note, by, &note).node(Some(node)), None).await?;
        let req =
            nightshift_proto::Request::new(self.core.ids().request("sim-fault"), nightshift_proto::Op::SimFault(fault));
        let reply = n
            .transport
            .call(req)
            .await
            .map_err(|e| EngineError::AgentUnreachable { node: node.to_string(), message: e.to_string() })?;
        match (reply.ok, reply.result, reply.error) {
            (true, Some(v), _) => Ok(v),
            (_, _, Some(e)) => Err(EngineError::BadParams(format!("{node}: {}", e.message))),
            _ => Err(EngineError::BadParams(format!("{node}: the agent did not say what it injected"))),
        }
    }
}
