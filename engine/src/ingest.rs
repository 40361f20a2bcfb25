//! What comes in: agent telemetry, samples pulled from Prometheus or
//! exporters, and Alertmanager alerts. Samples go into the telemetry store
//! and step the triggers watching their metric; what fires (and every new
//! alert a runbook matches) becomes a run request for the executor.

use crate::runbooks::script::workload::fragmentation_limit;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::json;

use nightshift_proto::Telemetry;

use crate::audit::data::AlertReceived;
use crate::audit::{AuditRecord, NewRecord, RecordKind};
use crate::base::metrics::{self, MetricId, ids};
use crate::engine::{Engine, EngineError, Ingested, RunRequest, Submitted};
use crate::fleet::Node;
use crate::runbooks::manifest::Scope;
use crate::runbooks::runbook::Runbook;
use crate::runs::Target;
use crate::runstate::runtable::FireRef;
use crate::signals::alerts::{Alert, WebhookPayload};
use crate::signals::telemetry::{SeriesKey, samples_from};
use crate::signals::triggers::Fire;

/// The slowdown temperature assumed for a GPU whose backend reports none
/// (NVIDIA's data-center parts slow down near 90 °C).
const DEFAULT_SLOWDOWN_C: f64 = 90.0;

/// The HBM limit assumed for a GPU that reports an HBM temperature but no
/// limit (HBM2e/HBM3's maximum operating temperature on NVIDIA's parts).
const DEFAULT_MEM_MAX_C: f64 = 95.0;

/// A GPU's thermal headroom from its readings and its model: `(the nearer
/// of its sensor's and its HBM's, the HBM's alone)`. Either reading may be
/// missing from a batch.
fn headrooms(
    info: Option<&nightshift_proto::GpuInfo>,
    temp_c: Option<f64>,
    mem_temp_c: Option<f64>,
) -> (Option<f64>, Option<f64>) {
    let core = temp_c.map(|t| info.and_then(|i| i.slowdown_temp_c).unwrap_or(DEFAULT_SLOWDOWN_C) - t);
    let mem = mem_temp_c.map(|t| info.and_then(|i| i.mem_max_temp_c).unwrap_or(DEFAULT_MEM_MAX_C) - t);
    (core.map(|c| mem.map_or(c, |m| c.min(m))), mem)
}
impl Engine {
    /// [`Engine::ingest_telemetry`]'s work (the façade, `engine.rs`, forwards here).
    pub(crate) async fn take_telemetry(&self, t: &Telemetry) {
        let Some(node) = self.core.fleet().get(&t.node) else {
            tracing::warn!(node = %t.node, "telemetry from a node not in the inventory");
            return;
        };
        let resumed_by_hand = {
            let mut st = node.state();
            // Out for nightshift (a repair, an RMA) and back in service, and
            // not by nightshift (it resumes only healthy nodes): a person.
            let resumed = st.drained
                && nightshift_proto::owner::owned_by_nightshift(st.drain_reason.as_deref())
                && !t.node_metrics.drained;
            st.connected = true;
            st.saw_reading(t.ts_ms);
            st.drained = t.node_metrics.drained;
            st.drain_reason = t.node_metrics.drain_reason.clone();
            st.agent_hands_off = t.node_metrics.hands_off;
            st.holds = t.node_metrics.holds.clone();
            if st.state_degraded != t.node_metrics.state_degraded {
                match &t.node_metrics.state_degraded {
                    Some(why) => tracing::error!(node = %t.node, error = %why,
                        "the agent cannot record changes durably: it refuses every change until it can"),
                    None => tracing::info!(node = %t.node, "the agent records changes durably again"),
                }
                st.state_degraded = t.node_metrics.state_degraded.clone();
            }
            resumed
        };
        if resumed_by_hand {
            self.resumed_before_repair(&node).await;
        }
        if !t.node_metrics.ended_holds.is_empty() {
            self.audit_ended_holds(&t.node, &t.node_metrics.ended_holds).await;
        }
        if !t.node_metrics.reapplied.is_empty() || !t.node_metrics.drifted.is_empty() {
            self.audit_holds_not_in_force(&t.node, &t.node_metrics).await;
        }
        let mut samples = samples_from(t);
        // How far each GPU is below its own slowdown temperature (per model
        // and sensor: an AMD junction is not NVIDIA's GPU sensor).
        {
            let st = node.state();
            if let Some(inv) = &st.inventory {
                for g in t.gpus.iter().filter(|g| !g.lost) {
                    let info = inv.gpus.iter().find(|i| i.index == g.index);
                    let gpu = u16::try_from(g.index).ok();
                    let (headroom, mem) = headrooms(info, Some(g.temperature_c), g.mem_temperature_c);
                    samples.extend(headroom.map(|h| (gpu, ids::THERMAL_HEADROOM, h)));
                    samples.extend(mem.map(|m| (gpu, ids::MEM_HEADROOM, m)));
                    // And how far fragmentation is over the model's own
                    // limit (H6's trigger, one threshold for every model).
                    if let Some(f) = g.mem_fragmentation_pct {
                        let (_, lim) = fragmentation_limit(info.map_or("", |i| i.name.as_str()));
                        samples.push((u16::try_from(g.index).ok(), ids::MEM_FRAG_OVER, f - lim));
                    }
                }
            }
        }
        // Each GPU's XID history (every code, fatal or not; no counts yet is
        // zero of each, so the first event counts): how far its most
        // frequent non-fatal code is over the policy's repeat rule, read
        // once it has seen an XID.
        {
            let policy = self.core.health().model().policy();
            let mut h = self.core.health().xid_history();
            for g in &t.gpus {
                h.observe(node.idx, g.index, t.ts_ms, &g.xid_counts);
                if !g.xid_counts.is_empty() {
                    let over = h.over_limit(node.idx, g.index, t.ts_ms, &policy);
                    samples.push((u16::try_from(g.index).ok(), ids::XID_REPEATS, over));
                }
            }
        }
        {
            let mut h = self.core.signals().history();
            for (gpu, metric, v) in &samples {
                if crate::signals::history::History::plotted(*metric) {
                    h.push((node.idx, *gpu, *metric), t.ts_ms, *v);
                }
            }
        }
        let fires = {
            let mut b = self.core.signals().brain();
            let batch: Vec<(SeriesKey, i64, f64)> = samples
                .into_iter()
                .map(|(gpu, metric, v)| (SeriesKey { node: node.idx, gpu, metric }, t.ts_ms, v))
                .collect();
            let mut fires = b.ingest(&batch);
            // Derived: the utilisation swing over the last minute.
            let store = b.store();
            let swing = t
                .gpus
                .iter()
                .filter_map(|g| {
                    let gpu = u16::try_from(g.index).ok()?;
                    store.stats(SeriesKey { node: node.idx, gpu: Some(gpu), metric: ids::UTIL }, t.ts_ms - 60_000)
                })
                .filter(|s| s.count >= 10)
                .map(|s| s.max - s.min)
                .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
            if let Some(sw) = swing {
                let key = SeriesKey { node: node.idx, gpu: None, metric: ids::UTIL_SWING };
                fires.extend(b.ingest(&[(key, t.ts_ms, sw)]));
            }
            fires
        };
        self.core.counters().add(crate::base::counters::Count::SamplesIngested, t.gpus.len() as u64 * 12 + 8);
        // Faults are states: every reading is evaluated against them before
        // what the thresholds fired.
        self.evaluate_health(&node).await;
        self.handle_fires(fires).await;
    }

    /// [`Engine::ingest_samples`]'s work (the façade, `engine.rs`, forwards here).
    pub(crate) async fn take_samples<N>(&self, samples: &[(N, Option<u32>, MetricId, i64, f64)])
    where
        N: AsRef<str> + Clone + Send + Sync,
    {
        // Each sample's node, looked up once (a batch comes node by node:
        // the last one found is tried first).
        let mut nodes: Vec<Arc<Node>> = Vec::new();
        let mut position: std::collections::HashMap<u32, u32> = Default::default();
        let mut at: Vec<Option<u32>> = Vec::with_capacity(samples.len());
        let mut last: Option<(&str, u32)> = None;
        for (name, ..) in samples {
            let name = name.as_ref();
            let hit = match last {
                // The same string (a recording's interned name) or an equal one.
                Some((l, i)) if std::ptr::eq(l, name) || l == name => Some(i),
                _ => self.core.fleet().get(name).map(|n| {
                    *position.entry(n.idx).or_insert_with(|| {
                        nodes.push(n);
                        nodes.len() as u32 - 1
                    })
                }),
            };
            last = hit.map(|i| (name, i));
            at.push(hit);
        }
        // (node, series key, ts, value) for the samples of known nodes and
        // GPUs, then each GPU temperature's headroom below the device's own
        // slowdown temperature, as the agent path does.
        let mut keyed: Vec<(u32, SeriesKey, i64, f64)> = Vec::with_capacity(samples.len() + samples.len() / 8);
        for ((_, gpu, metric, ts, v), n) in samples.iter().zip(&at) {
            let (Some(n), Ok(gpu)) = (n, gpu.map(u16::try_from).transpose()) else { continue };
            keyed.push((*n, SeriesKey { node: nodes[*n as usize].idx, gpu, metric: *metric }, *ts, *v));
        }
        // Derived per GPU from its model (its node's inventory read once
        // per node, nothing copied): the headroom below its nearest thermal
        // limit (its sensor's or its HBM's, both readings of the batch), and
        // how far its fragmentation is over the model's own limit.
        type Temps = (i64, Option<f64>, Option<f64>);
        let derived = {
            let mut readings: Vec<((u32, SeriesKey), i64, bool, f64)> = Vec::new();
            let mut derived: Vec<(u32, SeriesKey, i64, f64)> = Vec::new();
            let mut held: Option<(u32, std::sync::MutexGuard<'_, crate::fleet::NodeState>)> = None;
            // The held node's GPUs: each index and the position of the first
            // inventory entry with it, read once per node (a search of the
            // inventory per GPU read a cache line per entry it passed).
            let mut first: Vec<(u16, usize)> = Vec::new();
            let mut with_info = |n: u32, k: &SeriesKey, f: &mut dyn FnMut(Option<&nightshift_proto::GpuInfo>)| {
                if held.as_ref().is_none_or(|(h, _)| *h != n) {
                    held = None;
                    let st = nodes[n as usize].state();
                    first.clear();
                    for (at, i) in st.inventory.iter().flat_map(|inv| inv.gpus.iter()).enumerate() {
                        if let Ok(index) = u16::try_from(i.index)
                            && !first.iter().any(|(x, _)| *x == index)
                        {
                            first.push((index, at));
                        }
                    }
                    held = Some((n, st));
                }
                let info = held.as_ref().and_then(|(_, st)| {
                    let at = first.iter().find(|(x, _)| Some(*x) == k.gpu)?.1;
                    st.inventory.as_ref()?.gpus.get(at)
                });
                f(info)
            };
            for (n, k, ts, v) in keyed.iter().filter(|(_, k, ..)| k.gpu.is_some()) {
                match k.metric {
                    ids::TEMPERATURE | ids::MEM_TEMP => readings.push((
                        (*n, SeriesKey { metric: ids::THERMAL_HEADROOM, ..*k }),
                        *ts,
                        k.metric == ids::TEMPERATURE,
                        *v,
                    )),
                    ids::MEM_FRAG => with_info(*n, k, &mut |info| {
                        let (_, lim) = fragmentation_limit(info.map_or("", |i| i.name.as_str()));
                        derived.push((*n, SeriesKey { metric: ids::MEM_FRAG_OVER, ..*k }, *ts, v - lim));
                    }),
                    _ => {}
                }
            }
            // Each GPU's two temperatures, in (node, key) order: the latest
            // reading of each, at the latest time of either.
            readings.sort_by_key(|(at, ..)| *at);
            let mut temps: Vec<((u32, SeriesKey), Temps)> = Vec::new();
            for (at, ts, core, v) in readings {
                if temps.last().is_none_or(|(last, _)| *last != at) {
                    temps.push((at, Temps::default()));
                }
                if let Some((_, e)) = temps.last_mut() {
                    e.0 = e.0.max(ts);
                    if core {
                        e.1 = Some(v);
                    } else {
                        e.2 = Some(v);
                    }
                }
            }
            for ((n, k), (ts, temp, mem_temp)) in temps {
                with_info(n, &k, &mut |info| {
                    let (headroom, mem) = headrooms(info, temp, mem_temp);
                    derived.extend(headroom.map(|h| (n, k, ts, h)));
                    derived.extend(mem.map(|m| (n, SeriesKey { metric: ids::MEM_HEADROOM, ..k }, ts, m)));
                });
            }
            derived
        };
        keyed.extend(derived);
        {
            let mut h = self.core.signals().history();
            if h.keeps() {
                for (_, key, ts, v) in
                    keyed.iter().filter(|(_, k, ..)| crate::signals::history::History::plotted(k.metric))
                {
                    h.push((key.node, key.gpu, key.metric), *ts, *v);
                }
            }
        }
        let batch: Vec<(SeriesKey, i64, f64)> = keyed.iter().map(|(_, k, ts, v)| (*k, *ts, *v)).collect();
        let fires = self.core.signals().brain().ingest(&batch);
        // Per node: its newest reading, and whether the batch brought fault
        // evidence.
        let mut seen: Vec<(i64, bool)> = vec![(i64::MIN, false); nodes.len()];
        let evidence = crate::repair::EVIDENCE_METRICS.iter().fold(0u128, |m, id| m | 1u128 << (*id as u32 & 127));
        for (n, k, ts, _) in &keyed {
            let s = &mut seen[*n as usize];
            s.0 = s.0.max(*ts);
            s.1 |= (k.metric as u32) < 128 && evidence & 1u128 << k.metric as u32 != 0;
        }
        // A node needs its health judged again when evidence came, it is on
        // record, or the policy or its GPUs changed since it was last judged
        // quiet; for the others `evaluate_health` would find what it found
        // (a backtest of temperature and power, a pull without XID series).
        let generation = self.core.health().policy_generation();
        let on_record: Vec<bool> = {
            let m = self.core.health().model();
            nodes.iter().map(|n| m.node_gpus(&n.spec.name).next().is_some()).collect()
        };
        let mut judge: Vec<&Arc<Node>> = Vec::new();
        for ((n, (ts, evidence)), on_record) in nodes.iter().zip(seen).zip(on_record) {
            let mut st = n.state();
            st.saw_reading(ts);
            let quiet = st.evidence_judged == Some((generation, st.gpu_count() as u32));
            if evidence || on_record || !quiet {
                judge.push(n);
            }
        }
        self.core.counters().add(crate::base::counters::Count::SamplesIngested, batch.len() as u64);
        // Health in name order, as before.
        let mut touched: Vec<&Arc<Node>> = judge;
        touched.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        for n in touched {
            self.evaluate_health(n).await;
        }
        self.handle_fires(fires).await;
    }

    /// Feed pulled Prometheus/exporter samples: map, count, ingest.
    pub(crate) async fn ingest_pulled(
        &self,
        samples: &[crate::signals::sources::PromSample],
    ) -> crate::signals::sources::MapStats {
        let now = self.core.now();
        let (mapped, st) =
            crate::signals::sources::map_samples(samples, now, &|h| self.has_node(h), &|n, u| self.gpu_by_uuid(n, u));
        let c = &self.core.counters();
        c.add(crate::base::counters::Count::SourceSamples, st.mapped as u64);
        c.add(
            crate::base::counters::Count::SourceIgnored,
            (st.other_series + st.unknown_host + st.unknown_gpu + st.bad_value) as u64,
        );
        self.ingest_samples(&mapped).await;
        st
    }

    /// Rebuild the plot history from recorded samples (a Prometheus range
    /// query at takeover or start): into the history only — no trigger
    /// sees them — under whatever arrived live meanwhile. Returns the
    /// points kept.
    pub(crate) fn backfill_history(&self, samples: &[crate::signals::sources::PromSample]) -> usize {
        let now = self.core.now();
        // One timestamp at a time: the framebuffer pair makes memory per instant.
        let mut by_ts: std::collections::BTreeMap<i64, Vec<crate::signals::sources::PromSample>> = Default::default();
        for s in samples {
            by_ts.entry(s.ts_ms.unwrap_or(now)).or_default().push(s.clone());
        }
        let mut older = self.core.signals().history().like();
        let mut kept = 0;
        for (_, group) in by_ts {
            let (mapped, _) = crate::signals::sources::map_samples(&group, now, &|h| self.has_node(h), &|n, u| {
                self.gpu_by_uuid(n, u)
            });
            for (node, gpu, metric, ts, v) in &mapped {
                if let (Some(n), true) =
                    (self.core.fleet().get(node), crate::signals::history::History::plotted(*metric))
                    && let Ok(gpu) = gpu.map(u16::try_from).transpose()
                {
                    older.push((n.idx, gpu, *metric), *ts, *v);
                    kept += 1;
                }
            }
        }
        self.core.signals().history().merge_older(older);
        kept
    }

    /// The plot history's step and length, ms.
    pub(crate) fn history_span_ms(&self) -> (i64, i64) {
        let h = self.core.signals().history();
        (h.step_ms(), h.keep_ms())
    }

    /// A pull from a source failed.
    pub(crate) fn count_source_error(&self) {
        self.core.counters().add(crate::base::counters::Count::SourceErrors, 1);
    }

    /// Telemetry store size: (series, points).
    pub(crate) fn telemetry_size(&self) -> (usize, usize) {
        let b = self.core.signals().brain();
        (b.store().series_count(), b.store().points())
    }

    async fn handle_fires(&self, fires: Vec<Fire>) {
        if fires.is_empty() {
            return;
        }
        let set = self.runbook_set();
        for fire in fires {
            self.core.counters().add(crate::base::counters::Count::TriggersFired, 1);
            let Some(rb) = set.runbooks.get(fire.trigger) else { continue };
            let Some(req) = self.fire_request(rb, &fire) else { continue };
            let rearm =
                FireRef { trigger: fire.trigger, node: fire.node, group: fire.group.as_ref().map(|g| g.1.clone()) };
            match self.submit_inner(req, Some(rearm.clone())).await {
                Ok(Submitted::Suppressed { .. }) => {
                    // Still true after the cooldown? Then fire again.
                    self.core.signals().brain().rearm(rearm.trigger, rearm.node, rearm.group.as_deref());
                }
                Ok(_) => {}
                Err(e) => tracing::error!(runbook = %rb.manifest.name, error = %e, "cannot submit a fired trigger"),
            }
        }
    }

    /// Whether a runbook's selector takes this node.
    pub(crate) fn selector_matches(&self, rb: &Runbook, node: &Node) -> bool {
        let sel = &rb.manifest.selector;
        if !sel.labels.iter().all(|(k, v)| node.label(k) == Some(v.as_str())) {
            return false;
        }
        match &sel.vendor {
            None => true,
            Some(v) => node.state().vendor().is_some_and(|x| x.as_str() == v),
        }
    }

    fn fire_request(&self, rb: &Runbook, fire: &Fire) -> Option<RunRequest> {
        let m = &rb.manifest;
        let node = fire.node.and_then(|i| self.core.fleet().by_idx(i));
        if let Some(n) = &node
            && !self.selector_matches(rb, n)
        {
            return None;
        }
        let target = match (m.scope, &node, &fire.group) {
            (Scope::Gpu, Some(n), _) => Target::gpu(&n.spec.name, fire.gpu? as u32),
            (Scope::Node, Some(n), _) => Target::node(&n.spec.name),
            (Scope::Group, _, Some((k, v))) => Target::group(k, v),
            _ => return None,
        };
        Some(RunRequest {
            runbook: m.name.clone(),
            target: target.clone(),
            trigger: m.trigger.kind().into(),
            detail: fire.detail.clone(),
            event: json!({
                "kind": "telemetry",
                "trigger": m.trigger.kind(),
                "metric": m.trigger.metric(),
                "value": fire.value,
                "detail": fire.detail,
                "node": target.node,
                "gpu": target.gpu,
                "group": fire.group.as_ref().map(|g| format!("{}={}", g.0, g.1)),
                "ts_ms": fire.ts_ms,
            }),
            event_ts_ms: fire.ts_ms,
            params: BTreeMap::new(),
            dry_run: false,
            requested_by: "engine".into(),
        })
    }

    /// Evaluate fleet triggers over the live, undrained nodes of each group.
    /// The groups are listed again only when the fleet changed (a reload,
    /// a node connected or lost, drained or back, a GPU count): see
    /// [`crate::signals::triggers::GroupCache`].
    pub(crate) async fn fleet_triggers(&self, now: i64) {
        let fires = {
            let mut b = self.core.signals().brain();
            if !b.triggers().has_fleet() {
                return;
            }
            let fleet = &self.core.fleet();
            let nodes = fleet.nodes();
            let mut basis = Vec::with_capacity(nodes.len() + 1);
            basis.push(fleet.generation());
            basis.extend(nodes.iter().map(|n| {
                let st = n.state();
                let live = st.connected && !st.drained;
                (u64::from(n.idx) << 32) | ((st.gpu_count().max(1) as u64 & 0x7fff_ffff) << 1) | u64::from(live)
            }));
            let list = |label: &str, metric: MetricId| -> Vec<(String, Vec<SeriesKey>)> {
                let gpu_scoped = metrics::metric(metric).gpu_scoped;
                fleet
                    .groups(label)
                    .into_iter()
                    .map(|(v, nodes)| {
                        let keys = nodes
                            .iter()
                            .filter(|n| {
                                let st = n.state();
                                st.connected && !st.drained
                            })
                            .flat_map(|n| {
                                let count = n.state().gpu_count().max(1);
                                (0..if gpu_scoped { count } else { 1 }).filter_map(move |g| {
                                    Some(SeriesKey {
                                        node: n.idx,
                                        gpu: if gpu_scoped { Some(u16::try_from(g).ok()?) } else { None },
                                        metric,
                                    })
                                })
                            })
                            .collect();
                        (v, keys)
                    })
                    .collect()
            };
            b.fleet_tick(basis, now, &list)
        };
        self.handle_fires(fires).await;
    }

    // ---------------------------------------------------------------- alerts

    /// [`Engine::ingest_alertmanager`], and a future that ends once the last
    /// accepted alert's `event_received` (and so every one before it) is
    /// durable.
    pub(crate) fn intake_alertmanager(
        &self,
        payload: WebhookPayload,
        poster: &str,
    ) -> (Ingested, Option<futures::future::BoxFuture<'static, Result<(), String>>>) {
        use futures::FutureExt;
        let cap = self.core.config().limits.alert_backlog as u64;
        let (mut duplicates, mut shed) = (0, 0);
        // Under the table's lock: which alerts are new, their records sent
        // to the writer (in order, not awaited), and each new key's
        // durability future noted, so a duplicate arriving meanwhile waits
        // for the original's record instead of being acknowledged first.
        let mut recorded = Vec::new();
        let mut keys = Vec::new();
        let mut waits: Vec<crate::runstate::runtable::AlertDurable> = Vec::new();
        let mut durable = None;
        // Records built before the lock (building one looks up its node).
        let prepared: Vec<(String, NewRecord, Alert)> = payload
            .alerts
            .into_iter()
            .map(|a| (crate::runstate::runtable::alert_key(&a.status, &a.key()), self.alert_record(&a, poster), a))
            .collect();
        {
            let mut t = self.core.runs().table();
            let backlog = self.core.signals().backlog().alerts();
            let mut fresh = Vec::new();
            for (key, rec, a) in prepared {
                if t.alert_seen(&key) {
                    duplicates += 1;
                    if let Some(w) = t.alert_pending(&key) {
                        waits.push(w);
                    }
                } else if backlog + fresh.len() as u64 >= cap {
                    shed += 1;
                } else {
                    t.see_alert(key.clone());
                    fresh.push((key, rec, a));
                }
            }
            self.core.signals().backlog().alerts_in(fresh.len() as u64);
            // Each accepted alert is on the chain, in order, before this
            // returns (the acknowledging caller awaits its durability:
            // [`Engine::accept_alertmanager`]); what it leads to comes after.
            let last = fresh.len().saturating_sub(1);
            for (i, (key, rec, a)) in fresh.into_iter().enumerate() {
                let sent = if i == last {
                    self.core
                        .audit()
                        .append_ordered_ack(rec, None)
                        .map(|f| durable = Some(f.map(|r| r.map(|_| ()).map_err(|e| e.to_string())).boxed().shared()))
                } else {
                    self.core.audit().append_ordered(rec, None)
                };
                match sent {
                    Ok(()) => {
                        keys.push(key);
                        recorded.push(a);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot audit an alert");
                        self.core.signals().backlog().alert_out();
                    }
                }
            }
            if let Some(d) = &durable {
                for k in &keys {
                    t.alert_durable(k, Some(d.clone()));
                }
            }
        }
        // Once durable, the keys wait for nothing more.
        if let Some(d) = durable.clone() {
            let engine = self.clone();
            self.core.handle().spawn(async move {
                let _ = d.await;
                let mut t = engine.core.runs().table();
                for k in &keys {
                    t.alert_durable(k, None);
                }
            });
        }
        let c = &self.core.counters();
        c.add(crate::base::counters::Count::AlertsReceived, (recorded.len() + duplicates + shed) as u64);
        c.add(crate::base::counters::Count::AlertsDuplicate, duplicates as u64);
        let durable: Option<futures::future::BoxFuture<'static, Result<(), String>>> = match (durable, waits.is_empty())
        {
            (None, true) => None,
            (own, _) => Some(
                async move {
                    for w in waits {
                        w.await?;
                    }
                    if let Some(d) = own {
                        d.await?;
                    }
                    Ok(())
                }
                .boxed(),
            ),
        };
        let accepted = recorded.len();
        let fresh = recorded;
        if accepted > 0 || shed > 0 {
            let engine = self.clone();
            let poster = poster.to_string();
            self.core.signals().backlog().batch_started();
            self.core.handle().spawn(async move {
                if shed > 0 {
                    engine.core.counters().add(crate::base::counters::Count::EventsShed, shed as u64);
                    let reason = format!(
                        "alert intake full ({cap} waiting, limits.alert_backlog): {shed} alerts shed, answered 503 so Alertmanager sends them again"
                    );
                    if let Err(e) = engine.drop_event(&reason, None).await {
                        tracing::error!(error = %e, "cannot audit shed alerts");
                    }
                }
                for a in fresh {
                    engine.handle_alert(a, &poster).await;
                    engine.core.signals().backlog().alert_out();
                }
                engine.core.signals().backlog().batch_done();
            });
        }
        (Ingested { accepted, duplicates, shed }, durable)
    }

    /// [`Engine::accept_alertmanager`]'s work (the façade, `engine.rs`, forwards here).
    pub(crate) async fn accept_alerts(&self, payload: WebhookPayload, poster: &str) -> Result<Ingested, EngineError> {
        // A store stopped at a durability failure accepts nothing (a 503:
        // Alertmanager sends it again later, to this engine or another).
        if let Some(e) = self.core.audit().stopped() {
            return Err(EngineError::Audit(e));
        }
        let (r, durable) = self.intake_alertmanager(payload, poster);
        if let Some(d) = durable {
            // The writer is one queue: once the last is durable, every
            // alert appended before it is too — and a duplicate's original.
            d.await.map_err(|e| EngineError::Audit(crate::audit::AuditError::Write(e)))?;
        }
        Ok(r)
    }

    /// Alerts accepted and not yet handled.
    pub(crate) fn alert_backlog(&self) -> u64 {
        self.core.signals().backlog().alerts()
    }

    /// The `event_received` record of an alert.
    fn alert_record(&self, a: &Alert, poster: &str) -> NewRecord {
        let node = a.host().and_then(|h| self.core.fleet().get(&h)).map(|n| n.spec.name.clone());
        NewRecord::typed(
            RecordKind::EventReceived,
            &format!("alertmanager:{poster}"),
            &AlertReceived {
                source: AlertReceived::SOURCE.into(),
                // Acknowledged once durable; handled by a later
                // `event_handled` (recovery finishes any it lacks).
                acked: true,
                posted_by: poster.into(),
                alertname: a.name().to_string(),
                status: a.status.clone(),
                fingerprint: a.fingerprint.clone(),
                starts_at: a.starts_at.clone(),
                ends_at: a.ends_at.clone(),
                labels: a.labels.clone(),
                annotations: a.annotations.clone(),
            },
        )
        .node(node.as_deref())
        .gpu(a.gpu())
    }

    /// An alert as its `event_received` record has it (recovery handles the
    /// ones whose handling a crash cut off).
    pub(crate) fn alert_of_record(r: &AuditRecord) -> Option<(Alert, String)> {
        let d = r.payload::<AlertReceived>().ok().filter(|d| d.source == AlertReceived::SOURCE)?;
        if d.status.is_empty() || d.fingerprint.is_empty() || d.starts_at.is_empty() {
            return None;
        }
        let poster = if d.posted_by.is_empty() { AlertReceived::SOURCE.to_string() } else { d.posted_by };
        let a = Alert {
            status: d.status,
            labels: d.labels,
            annotations: d.annotations,
            starts_at: d.starts_at,
            ends_at: d.ends_at,
            generator_url: String::new(),
            fingerprint: d.fingerprint,
        };
        Some((a, poster))
    }
}
