//! Maintenance windows: a person's "hands off these nodes until then", as
//! Alertmanager's silences are for alerts — matched by node labels
//! (`pool=train`, `rack=r12`) and names, from a start (now, or later) to an
//! end that always comes. Every matcher must hold, as in a silence: a node
//! is covered when its name is among `nodes` (when any are named) and it has
//! every label of `matchers`. A node that joins the pool during the window
//! is covered at the next tick.
//!
//! A covered node is hands-off (`NodeState::hands_off`): admission refuses
//! automatic runs there, a running run's change waits, and the pages open
//! about it end as "taken over". The window is on the chain
//! (`maintenance` records, indexed by kind): it outlives restarts and moves
//! to the next leader; it ends by itself at its end time, audited as the
//! engine's, or earlier by a person.

use std::collections::BTreeMap;

use crate::audit::{NewRecord, RecordKind, data};
use crate::engine::{Engine, EngineError};
use crate::fleet::windows::{Cover, Window, WindowSpec, validate};

impl Engine {
    /// Set a maintenance window (admin), durable before it is in force.
    pub(crate) async fn set_window(&self, by: &str, spec: WindowSpec) -> Result<Window, EngineError> {
        let now = self.core.now();
        validate(&spec, now, &|n| self.core.fleet().get(n).is_some()).map_err(EngineError::BadParams)?;
        let w = Window {
            id: self.core.ids().request("mw"),
            by: by.to_string(),
            reason: spec.reason.trim().to_string(),
            matchers: spec.matchers,
            nodes: spec.nodes,
            starts_ms: spec.starts_ms.unwrap_or(now).max(now),
            ends_ms: spec.ends_ms,
            covers: Vec::new(),
        };
        let payload = data::Maintenance {
            id: w.id.clone(),
            set: true,
            matchers: w.matchers.clone(),
            nodes: w.nodes.clone(),
            starts_ms: Some(w.starts_ms),
            ends_ms: Some(w.ends_ms),
            reason: w.reason.clone(),
        };
        self.core.audit().append(NewRecord::typed(RecordKind::Maintenance, by, &payload), None).await?;
        self.core.fleet().windows().put(w.clone());
        tracing::info!(window = %w.id, by, reason = %w.reason, "maintenance window set");
        self.apply_windows().await;
        Ok(self.windows().into_iter().find(|x| x.id == w.id).unwrap_or(w))
    }

    /// End a window before its time (admin), saying why.
    pub(crate) async fn end_window(&self, id: &str, by: &str, reason: &str) -> Result<Window, EngineError> {
        let Some(w) = self.core.fleet().windows().get(id) else {
            let open: Vec<String> = self.windows().into_iter().map(|w| w.id).collect();
            return Err(EngineError::BadParams(format!(
                "no maintenance window {id:?}: expected one of [{}] (`nightshift maintenance list`)",
                open.join(", ")
            )));
        };
        if let Some(problem) = nightshift_proto::names::free_text_problem("reason", reason) {
            return Err(EngineError::BadParams(problem));
        }
        let why = Some(reason.trim()).filter(|r| !r.is_empty()).unwrap_or("ended by a person");
        self.record_window_end(&w, by, why).await?;
        self.apply_windows().await;
        Ok(w)
    }

    async fn record_window_end(&self, w: &Window, by: &str, why: &str) -> Result<(), EngineError> {
        let payload = data::Maintenance { id: w.id.clone(), set: false, reason: why.to_string(), ..Default::default() };
        self.core.audit().append(NewRecord::typed(RecordKind::Maintenance, by, &payload), None).await?;
        self.core.fleet().windows().remove(&w.id);
        tracing::info!(window = %w.id, by, reason = why, "maintenance window ended");
        Ok(())
    }

    /// Windows in force or to come, soonest end first, each with the nodes
    /// it covers now.
    pub(crate) fn windows(&self) -> Vec<Window> {
        let now = self.core.now();
        let mut all: Vec<Window> = self.core.fleet().windows().all();
        for w in &mut all {
            if w.active(now) {
                w.covers = self
                    .core
                    .fleet()
                    .nodes()
                    .iter()
                    .filter(|n| w.matches(&n.spec.name, &n.spec.labels))
                    .map(|n| n.spec.name.clone())
                    .collect();
            }
        }
        all.sort_by(|a, b| (a.ends_ms, &a.id).cmp(&(b.ends_ms, &b.id)));
        all
    }

    /// End the windows whose time is up (audited as the engine's), then
    /// put each node under the window that covers it now (the one ending
    /// last), or none; a node newly covered has its open pages ended as
    /// taken over.
    pub(crate) async fn apply_windows(&self) {
        let now = self.core.now();
        let due = self.core.fleet().windows().ended_by(now);
        for w in due {
            let why = format!(
                "the window {} set ended at {} as they asked",
                w.by,
                crate::signals::alerts::format_rfc3339_ms(w.ends_ms)
            );
            if let Err(e) = self.record_window_end(&w, "engine", &why).await {
                tracing::error!(window = %w.id, error = %e, "cannot audit a maintenance window's end: it stays");
            }
        }
        // Nothing in force and nothing covered last time: nothing to do.
        let Some(windows) = self.core.fleet().windows().to_apply(now) else { return };
        let mut taken: Vec<(String, String)> = Vec::new();
        for n in self.core.fleet().nodes().iter() {
            let cover = windows
                .iter()
                .filter(|w| w.matches(&n.spec.name, &n.spec.labels))
                .max_by_key(|w| (w.ends_ms, w.id.clone()))
                .map(|w| Cover { id: w.id.clone(), by: w.by.clone(), reason: w.reason.clone(), ends_ms: w.ends_ms });
            let mut st = n.state();
            if st.maintenance.as_ref().map(|c| &c.id) != cover.as_ref().map(|c| &c.id) {
                if let Some(c) = &cover
                    && st.maintenance.is_none()
                {
                    taken.push((
                        n.spec.name.clone(),
                        format!("taken over by {}: maintenance window {} ({})", c.by, c.id, c.reason),
                    ));
                }
                st.maintenance = cover;
            }
        }
        for (node, why) in taken {
            Box::pin(self.resolve_pages(&node, None, &why, None)).await;
        }
    }

    /// Rebuild the windows from the chain (startup, takeover): each id's
    /// newest record, kept if it is set and not over.
    pub(crate) fn rebuild_windows(&self) -> Result<usize, crate::audit::AuditError> {
        let records = self.core.audit().records_of_kind(RecordKind::Maintenance)?;
        let mut open: BTreeMap<String, Window> = BTreeMap::new();
        for r in &records {
            let Ok(p) = r.payload::<data::Maintenance>() else {
                tracing::error!(seq = r.seq, "a maintenance record cannot be read: it is skipped");
                continue;
            };
            if !p.set {
                open.remove(&p.id);
                continue;
            }
            let (Some(starts_ms), Some(ends_ms)) = (p.starts_ms, p.ends_ms) else { continue };
            open.insert(
                p.id.clone(),
                Window {
                    id: p.id,
                    by: r.actor.clone(),
                    reason: p.reason,
                    matchers: p.matchers,
                    nodes: p.nodes,
                    starts_ms,
                    ends_ms,
                    covers: Vec::new(),
                },
            );
        }
        let n = open.len();
        self.core.fleet().windows().replace(open);
        Ok(n)
    }
}
