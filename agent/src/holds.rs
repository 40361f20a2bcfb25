//! The hold store: every setting the agent changes is held by an owner,
//! with a lease; the most restrictive active hold decides the device's
//! value; the baseline read from the device when the first hold was placed
//! comes back when the last one goes — unless a person changed the setting
//! meanwhile (drifted).
//!
//! This module owns the *rules* (pure functions over holds, unit-tested
//! here) and the *record* in memory: what changed since it was last made
//! durable is a [`HoldsDelta`], one part of a line of the agent's state log
//! (`statelog`), so holds, baselines, leases and rate-limit windows survive
//! restarts exactly. Reading and writing the device is the service's job
//! (`service::settings`).

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use nightshift_proto::{ActionKind, EndedHold, FanPoint, HoldInfo, HoldValue, Setting, SettingView, fan_curve_speed};

/// One held setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Held {
    pub setting: Setting,
    /// The device's value when the first hold was placed.
    pub baseline: HoldValue,
    /// What the agent last put on the device for this setting.
    pub applied: HoldValue,
    /// A person changed the setting: what was found. The agent no longer
    /// writes this setting until its last hold goes.
    #[serde(default)]
    pub drifted: Option<String>,
    pub holds: Vec<HoldInfo>,
    /// A value the agent is putting on the device: recorded (durably, with
    /// the hold) before the write, so a crash after the write and before
    /// `applied` is saved finds the device at a value the agent wrote —
    /// its own, never a person's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writing: Option<HoldValue>,
    /// The last time the setting was found at its baseline while held (a
    /// reset, a reboot) and applied again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reapplied: Option<nightshift_proto::Reapplied>,
}

impl Held {
    /// Whether the device's value `dev` is one the agent put there (what it
    /// applied, or what it was writing when it last stopped).
    pub fn is_own(&self, dev: &HoldValue) -> bool {
        same_value(dev, &self.applied) || self.writing.as_ref().is_some_and(|w| same_value(dev, w))
    }

    /// The value the holds ask for together.
    pub fn effective(&self) -> HoldValue {
        effective(&self.baseline, &self.holds)
    }

    pub fn view(&self) -> SettingView {
        SettingView {
            setting: self.setting.clone(),
            baseline: self.baseline.clone(),
            effective: self.effective(),
            drifted: self.drifted.clone(),
            holds: self.holds.clone(),
            reapplied: self.reapplied.clone(),
        }
    }
}

/// What is persisted (whole in a snapshot, as [`HoldsDelta`]s between).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    version: u32,
    held: Vec<Held>,
    /// Applied changes per (kind, GPU), for the rate limits.
    rate: Vec<RateWindow>,
    /// The most recent ends, oldest first (at most [`ENDED_KEPT`]).
    #[serde(default)]
    ended: VecDeque<EndedHold>,
    /// How many ends were ever noted (what a delta's `ended` counts from).
    #[serde(default)]
    ended_total: u64,
}

/// What changed in the record since it was last made durable: the held
/// settings that changed (whole) or went, the rate windows that changed,
/// the ends noted since. Applying it to the durable record gives the
/// record in memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldsDelta {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<Held>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<Setting>,
    /// The held settings' order, when it is not what applying `set` and
    /// `removed` gives (a setting forgotten and held again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<Setting>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    rate: Vec<RateWindow>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ended: Vec<EndedHold>,
    /// How many ends were ever noted, with these (more than `ended` says
    /// when more ended than are kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ended_total: Option<u64>,
}

impl HoldsDelta {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
            && self.removed.is_empty()
            && self.order.is_none()
            && self.rate.is_empty()
            && self.ended.is_empty()
            && self.ended_total.is_none()
    }
}

impl Record {
    /// A new, empty record.
    pub fn empty() -> Record {
        Record { version: 1, ..Record::default() }
    }

    /// Read a whole record (a snapshot, or the older `holds.json`).
    pub fn check(self) -> Result<Record, String> {
        if self.version != 1 {
            return Err(format!("unsupported hold record version: expected 1, found {}", self.version));
        }
        Ok(self)
    }

    /// Apply a delta (replaying the state log).
    pub fn apply(&mut self, d: &HoldsDelta) {
        self.held.retain(|h| !d.removed.contains(&h.setting));
        for h in &d.set {
            match self.held.iter_mut().find(|x| x.setting == h.setting) {
                Some(x) => *x = h.clone(),
                None => self.held.push(h.clone()),
            }
        }
        if let Some(order) = &d.order {
            self.held.sort_by_key(|h| order.iter().position(|s| *s == h.setting).unwrap_or(usize::MAX));
        }
        for w in &d.rate {
            match self.rate.iter_mut().find(|x| x.kind == w.kind && x.gpu == w.gpu) {
                Some(x) => *x = w.clone(),
                None => self.rate.push(w.clone()),
            }
        }
        for e in &d.ended {
            self.ended.push_back(e.clone());
            self.ended_total += 1;
        }
        if let Some(t) = d.ended_total {
            self.ended_total = t;
        }
        while self.ended.len() > ENDED_KEPT {
            self.ended.pop_front();
        }
    }

    /// What turns `base` into `self`.
    fn delta_from(&self, base: &Record) -> HoldsDelta {
        let set: Vec<Held> = self
            .held
            .iter()
            .filter(|h| base.held.iter().find(|b| b.setting == h.setting) != Some(*h))
            .cloned()
            .collect();
        let removed: Vec<Setting> = base
            .held
            .iter()
            .filter(|b| !self.held.iter().any(|h| h.setting == b.setting))
            .map(|b| b.setting.clone())
            .collect();
        let rate: Vec<RateWindow> = self
            .rate
            .iter()
            .filter(|w| base.rate.iter().find(|b| b.kind == w.kind && b.gpu == w.gpu) != Some(*w))
            .cloned()
            .collect();
        let new_ends = (self.ended_total.saturating_sub(base.ended_total) as usize).min(self.ended.len());
        let ended: Vec<EndedHold> = self.ended.iter().skip(self.ended.len() - new_ends).cloned().collect();
        let ended_total = (self.ended_total != base.ended_total).then_some(self.ended_total);
        let mut d = HoldsDelta { set, removed, order: None, rate, ended, ended_total };
        let mut replayed = base.clone();
        replayed.apply(&d);
        let order = |r: &Record| r.held.iter().map(|h| h.setting.clone()).collect::<Vec<_>>();
        if order(&replayed) != order(self) {
            d.order = Some(order(self));
        }
        d
    }
}

/// How many ended holds the store remembers.
pub const ENDED_KEPT: usize = 128;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateWindow {
    kind: ActionKind,
    gpu: Option<u32>,
    at_ms: VecDeque<i64>,
}

/// The store. Mutations change memory; [`HoldStore::delta`] is what a
/// line of the state log must carry to make them durable, and
/// [`HoldStore::mark_durable`] says it did.
#[derive(Debug, Clone)]
pub struct HoldStore {
    rec: Record,
    /// The record as the state log has it.
    durable: Record,
}

/// A copy of the store's record ([`HoldStore::snapshot`]).
#[derive(Debug, Clone)]
pub struct Snapshot(Record);

impl HoldStore {
    /// A store holding `rec`, all of it durable.
    pub fn from_record(rec: Record) -> HoldStore {
        HoldStore { durable: rec.clone(), rec }
    }

    /// The whole record (what a snapshot of the state log carries).
    pub fn record(&self) -> &Record {
        &self.rec
    }

    /// What changed since the state log last took the record; `None` when
    /// nothing did.
    pub fn delta(&self) -> Option<HoldsDelta> {
        let d = self.rec.delta_from(&self.durable);
        (!d.is_empty()).then_some(d)
    }

    /// The state log has the record as it is now.
    pub fn mark_durable(&mut self) {
        self.durable = self.rec.clone();
    }

    /// The whole record as it is now, to put back with
    /// [`HoldStore::restore`] when a change cannot be made durable (a full
    /// disk): a refused request leaves nothing behind in memory either.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.rec.clone())
    }

    pub fn restore(&mut self, s: Snapshot) {
        self.rec = s.0;
    }

    pub fn get(&self, s: &Setting) -> Option<&Held> {
        self.rec.held.iter().find(|h| &h.setting == s)
    }

    pub fn get_mut(&mut self, s: &Setting) -> Option<&mut Held> {
        self.rec.held.iter_mut().find(|h| &h.setting == s)
    }

    /// Every held setting.
    pub fn held(&self) -> &[Held] {
        &self.rec.held
    }

    /// Every active hold.
    pub fn all_holds(&self) -> Vec<HoldInfo> {
        self.rec.held.iter().flat_map(|h| h.holds.iter().cloned()).collect()
    }

    /// Place (or, for the same owner and setting, replace) a hold. The
    /// baseline is recorded when the setting was not held yet.
    pub fn place(&mut self, hold: HoldInfo, baseline: HoldValue) {
        match self.get_mut(&hold.setting) {
            Some(h) => {
                h.holds.retain(|x| x.owner != hold.owner);
                h.holds.push(hold);
            }
            None => self.rec.held.push(Held {
                setting: hold.setting.clone(),
                applied: baseline.clone(),
                baseline,
                drifted: None,
                holds: vec![hold],
                writing: None,
                reapplied: None,
            }),
        }
    }

    /// The hold `owner` has on `setting`.
    pub fn hold_of(&self, s: &Setting, owner: &str) -> Option<&HoldInfo> {
        self.get(s)?.holds.iter().find(|h| h.owner == owner)
    }

    /// Remove the holds `pick` selects; returns them with their settings.
    pub fn remove(&mut self, mut pick: impl FnMut(&HoldInfo) -> bool) -> Vec<HoldInfo> {
        let mut out = Vec::new();
        for h in &mut self.rec.held {
            let (gone, keep): (Vec<HoldInfo>, Vec<HoldInfo>) = h.holds.drain(..).partition(|x| pick(x));
            h.holds = keep;
            out.extend(gone);
        }
        out
    }

    /// Forget a setting whose last hold went (after its restore).
    pub fn forget(&mut self, s: &Setting) {
        self.rec.held.retain(|h| &h.setting != s || !h.holds.is_empty());
    }

    /// Remember that a hold ended (for telemetry; saved with the store).
    pub fn note_ended(&mut self, e: EndedHold) {
        self.rec.ended.push_back(e);
        self.rec.ended_total += 1;
        while self.rec.ended.len() > ENDED_KEPT {
            self.rec.ended.pop_front();
        }
    }

    /// Holds that ended at or after `since_ms`, oldest first, at most `max`
    /// (the newest ones).
    pub fn ended_since(&self, since_ms: i64, max: usize) -> Vec<EndedHold> {
        let recent: Vec<&EndedHold> = self.rec.ended.iter().filter(|e| e.ended_at_ms >= since_ms).collect();
        recent[recent.len().saturating_sub(max)..].iter().map(|e| (*e).clone()).collect()
    }

    /// Holds whose lease has run out at `now_ms`.
    pub fn expired(&self, now_ms: i64) -> Vec<String> {
        self.rec
            .held
            .iter()
            .flat_map(|h| h.holds.iter())
            .filter(|h| h.expires_at_ms.is_some_and(|t| t <= now_ms))
            .map(|h| h.id.clone())
            .collect()
    }

    /// Refuse a change of `kind` on `gpu` at `now_ms` if it would exceed
    /// `limit` changes in the window.
    pub fn rate_check(
        &mut self,
        kind: ActionKind,
        gpu: Option<u32>,
        limit: Option<&crate::envelope::RateLimit>,
        now_ms: i64,
    ) -> Result<(), String> {
        let Some(limit) = limit else { return Ok(()) };
        let window_ms = limit.window_secs.saturating_mul(1000).min(i64::MAX as u64) as i64;
        let w = self.window(kind, gpu);
        while w.front().is_some_and(|t| *t <= now_ms.saturating_sub(window_ms)) {
            w.pop_front();
        }
        if w.len() as u32 >= limit.max_changes {
            let target = gpu.map_or("this node".to_string(), |g| format!("GPU {g}"));
            let retry_secs = w.front().map_or(0, |t| (t.saturating_add(window_ms) - now_ms + 999) / 1000);
            return Err(format!(
                "rate limit: {} changes of kind {} on {target} in the last {} s (limit {}); retry in {retry_secs} s",
                w.len(),
                kind.as_str(),
                limit.window_secs,
                limit.max_changes
            ));
        }
        Ok(())
    }

    /// Count one applied change.
    pub fn rate_record(&mut self, kind: ActionKind, gpu: Option<u32>, now_ms: i64) {
        let w = self.window(kind, gpu);
        w.push_back(now_ms);
        while w.len() > 1024 {
            w.pop_front();
        }
    }

    fn window(&mut self, kind: ActionKind, gpu: Option<u32>) -> &mut VecDeque<i64> {
        let i = match self.rec.rate.iter().position(|w| w.kind == kind && w.gpu == gpu) {
            Some(i) => i,
            None => {
                self.rec.rate.push(RateWindow { kind, gpu, at_ms: VecDeque::new() });
                self.rec.rate.len() - 1
            }
        };
        &mut self.rec.rate[i].at_ms
    }
}

/// The value a set of holds asks for together, over `baseline`:
///
/// - power limit: the lowest;
/// - fan curve: the highest speed, point by point;
/// - clocks: the narrowest range (highest minimum, lowest maximum);
/// - GPU drain: drained if any hold drains, else in service if any hold
///   says so, else the baseline;
/// - node drain: the same, except that a node already drained keeps its
///   drain and reason (nightshift never rewrites a person's drain);
/// - config: the most recently placed hold's version;
/// - chassis fans: full if any hold asks for it;
/// - a scheduler mark: set if any hold (or the baseline) sets it.
pub fn effective(baseline: &HoldValue, holds: &[HoldInfo]) -> HoldValue {
    if holds.is_empty() {
        return baseline.clone();
    }
    let mut values: Vec<(&HoldInfo, &HoldValue)> = holds.iter().map(|h| (h, &h.value)).collect();
    values.sort_by_key(|(h, _)| h.placed_at_ms);
    match baseline {
        HoldValue::PowerLimit { .. } => {
            let w = values
                .iter()
                .filter_map(|(_, v)| match v {
                    HoldValue::PowerLimit { watts } => Some(*watts),
                    _ => None,
                })
                .fold(f64::INFINITY, f64::min);
            if w.is_finite() { HoldValue::PowerLimit { watts: w } } else { baseline.clone() }
        }
        HoldValue::FanCurve { .. } => {
            let curves: Vec<&Vec<FanPoint>> = values
                .iter()
                .filter_map(|(_, v)| match v {
                    HoldValue::FanCurve { points: Some(p) } => Some(p),
                    _ => None,
                })
                .collect();
            match curves.len() {
                0 => baseline.clone(),
                1 => HoldValue::FanCurve { points: Some(curves[0].clone()) },
                _ => HoldValue::FanCurve { points: Some(max_curve(&curves)) },
            }
        }
        HoldValue::Clocks { .. } => {
            let ranges: Vec<(u32, u32)> = values
                .iter()
                .filter_map(|(_, v)| match v {
                    HoldValue::Clocks { locked_mhz: Some(r) } => Some(*r),
                    _ => None,
                })
                .collect();
            if ranges.is_empty() {
                return baseline.clone();
            }
            let hi = ranges.iter().map(|r| r.1).min().unwrap_or(0);
            let lo = ranges.iter().map(|r| r.0).max().unwrap_or(0).min(hi);
            HoldValue::Clocks { locked_mhz: Some((lo, hi)) }
        }
        HoldValue::GpuDrain { .. } => {
            let any = |want: bool| {
                values.iter().any(|(_, v)| matches!(v, HoldValue::GpuDrain { drained } if *drained == want))
            };
            if any(true) {
                HoldValue::GpuDrain { drained: true }
            } else if any(false) {
                HoldValue::GpuDrain { drained: false }
            } else {
                baseline.clone()
            }
        }
        HoldValue::NodeDrain { drained: base_drained, .. } => {
            let first_drain = values.iter().find_map(|(_, v)| match v {
                HoldValue::NodeDrain { drained: true, reason } => Some(reason.clone()),
                _ => None,
            });
            match first_drain {
                Some(_) if *base_drained => baseline.clone(),
                Some(reason) => HoldValue::NodeDrain { drained: true, reason },
                None if values.iter().any(|(_, v)| matches!(v, HoldValue::NodeDrain { drained: false, .. })) => {
                    HoldValue::NodeDrain { drained: false, reason: None }
                }
                None => baseline.clone(),
            }
        }
        HoldValue::Config { .. } => values
            .iter()
            .rev()
            .find_map(|(_, v)| matches!(v, HoldValue::Config { version: Some(_) }).then(|| (*v).clone()))
            .unwrap_or_else(|| baseline.clone()),
        // Chassis fans: full if any hold asks for it.
        HoldValue::ChassisFans { full } => HoldValue::ChassisFans {
            full: *full || values.iter().any(|(_, v)| matches!(v, HoldValue::ChassisFans { full: true })),
        },
        // A mark: set if any hold sets it (a mark in the baseline — a
        // person's — stays).
        HoldValue::Mark { set } => {
            HoldValue::Mark { set: *set || values.iter().any(|(_, v)| matches!(v, HoldValue::Mark { set: true })) }
        }
    }
}

/// The pointwise maximum of monotonic fan curves: at every breakpoint of
/// any curve, the highest speed any curve asks for there. Monotonic when
/// the inputs are.
pub fn max_curve(curves: &[&Vec<FanPoint>]) -> Vec<FanPoint> {
    let mut temps: Vec<f64> = curves.iter().flat_map(|c| c.iter().map(|p| p.temp_c)).collect();
    temps.sort_by(f64::total_cmp);
    temps.dedup();
    temps
        .into_iter()
        .map(|t| FanPoint {
            temp_c: t,
            speed_pct: curves.iter().map(|c| fan_curve_speed(c, t)).fold(f64::NEG_INFINITY, f64::max),
        })
        .collect()
}

/// Whether `a` asks less of the hardware than `b` would (used to say which
/// hold decides). Both must be values of the same setting.
pub fn same_value(a: &HoldValue, b: &HoldValue) -> bool {
    match (a, b) {
        (HoldValue::PowerLimit { watts: x }, HoldValue::PowerLimit { watts: y }) => (x - y).abs() < 0.5,
        _ => a == b,
    }
}

/// Holds grouped by setting, for views.
pub fn by_setting(holds: &[HoldInfo]) -> BTreeMap<Setting, Vec<HoldInfo>> {
    let mut m: BTreeMap<Setting, Vec<HoldInfo>> = BTreeMap::new();
    for h in holds {
        m.entry(h.setting.clone()).or_default().push(h.clone());
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(owner: &str, at: i64, value: HoldValue, setting: Setting) -> HoldInfo {
        HoldInfo {
            id: format!("{owner}-{at}"),
            owner: owner.into(),
            setting,
            value,
            reason: "test".into(),
            placed_at_ms: at,
            expires_at_ms: Some(at + 60_000),
            kept: false,
            repair: false,
        }
    }

    fn pw(w: f64) -> HoldValue {
        HoldValue::PowerLimit { watts: w }
    }

    fn nd(drained: bool, reason: Option<&str>) -> HoldValue {
        HoldValue::NodeDrain { drained, reason: reason.map(str::to_string) }
    }

    /// The table of "most restrictive" rules: (baseline, holds, effective).
    #[test]
    fn the_most_restrictive_hold_decides() {
        let p = Setting::PowerLimit { gpu: 0 };
        let n = Setting::NodeDrain {};
        let g = Setting::GpuDrain { gpu: 0 };
        let c = Setting::Clocks { gpu: 0 };
        let cfg = Setting::Config { name: "nccl".into() };
        let cases: Vec<(&str, HoldValue, Vec<HoldInfo>, HoldValue)> = vec![
            ("no holds: the baseline", pw(700.0), vec![], pw(700.0)),
            (
                "lowest power wins",
                pw(700.0),
                vec![hold("a", 1, pw(450.0), p.clone()), hold("b", 2, pw(600.0), p.clone())],
                pw(450.0),
            ),
            (
                "order does not matter",
                pw(700.0),
                vec![hold("b", 1, pw(600.0), p.clone()), hold("a", 2, pw(450.0), p.clone())],
                pw(450.0),
            ),
            (
                "narrowest clocks",
                HoldValue::Clocks { locked_mhz: None },
                vec![
                    hold("a", 1, HoldValue::Clocks { locked_mhz: Some((300, 1500)) }, c.clone()),
                    hold("b", 2, HoldValue::Clocks { locked_mhz: Some((500, 1800)) }, c.clone()),
                ],
                HoldValue::Clocks { locked_mhz: Some((500, 1500)) },
            ),
            (
                "disjoint clock ranges: the lower maximum",
                HoldValue::Clocks { locked_mhz: None },
                vec![
                    hold("a", 1, HoldValue::Clocks { locked_mhz: Some((300, 800)) }, c.clone()),
                    hold("b", 2, HoldValue::Clocks { locked_mhz: Some((1000, 1800)) }, c.clone()),
                ],
                HoldValue::Clocks { locked_mhz: Some((800, 800)) },
            ),
            (
                "any GPU drain drains",
                HoldValue::GpuDrain { drained: false },
                vec![
                    hold("a", 1, HoldValue::GpuDrain { drained: false }, g.clone()),
                    hold("b", 2, HoldValue::GpuDrain { drained: true }, g.clone()),
                ],
                HoldValue::GpuDrain { drained: true },
            ),
            (
                "a drain over an undrained node takes the first drain's reason",
                nd(false, None),
                vec![
                    hold("b", 5, nd(true, Some("nightshift: b hot")), n.clone()),
                    hold("a", 1, nd(true, Some("nightshift: a dbe")), n.clone()),
                ],
                nd(true, Some("nightshift: a dbe")),
            ),
            (
                "a person's drain is kept as it is",
                nd(true, Some("fan swap by dave")),
                vec![hold("a", 1, nd(true, Some("nightshift: a hot")), n.clone())],
                nd(true, Some("fan swap by dave")),
            ),
            (
                "in service over a standby drain",
                nd(true, Some("nightshift: standby")),
                vec![hold("s", 1, nd(false, None), n.clone())],
                nd(false, None),
            ),
            (
                "a drain beats in service",
                nd(true, Some("nightshift: standby")),
                vec![
                    hold("s", 1, nd(false, None), n.clone()),
                    hold("x", 2, nd(true, Some("nightshift: x rma")), n.clone()),
                ],
                nd(true, Some("nightshift: standby")),
            ),
            (
                "the latest config hold wins",
                HoldValue::Config { version: Some(3) },
                vec![
                    hold("a", 1, HoldValue::Config { version: Some(2) }, cfg.clone()),
                    hold("b", 2, HoldValue::Config { version: Some(4) }, cfg.clone()),
                ],
                HoldValue::Config { version: Some(4) },
            ),
        ];
        for (name, baseline, holds, want) in cases {
            assert_eq!(effective(&baseline, &holds), want, "{name}");
        }
    }

    #[test]
    fn fan_curves_combine_point_by_point() {
        let pt = |t, s| FanPoint { temp_c: t, speed_pct: s };
        let a = vec![pt(40.0, 30.0), pt(80.0, 100.0)];
        let b = vec![pt(40.0, 50.0), pt(60.0, 60.0), pt(90.0, 80.0)];
        let m = max_curve(&[&a, &b]);
        assert_eq!(m.iter().map(|p| p.temp_c).collect::<Vec<_>>(), vec![40.0, 60.0, 80.0, 90.0]);
        assert_eq!(m.iter().map(|p| p.speed_pct).collect::<Vec<_>>(), vec![50.0, 65.0, 100.0, 100.0]);
        // Never below either curve anywhere.
        for t in 0..120 {
            let t = t as f64;
            let s = fan_curve_speed(&m, t);
            assert!(s + 1e-9 >= fan_curve_speed(&a, t) && s + 1e-9 >= fan_curve_speed(&b, t), "{t}: {s}");
        }
        assert!(m.windows(2).all(|w| w[1].speed_pct >= w[0].speed_pct), "monotonic");
    }

    #[test]
    fn the_record_survives_a_reopen_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let limit = crate::envelope::RateLimit { max_changes: 2, window_secs: 60 };
        {
            let (mut log, mut st) = crate::statelog::StateLog::open(dir.path()).unwrap();
            let s = &mut st.holds;
            let p = Setting::PowerLimit { gpu: 1 };
            s.place(hold("r1", 1_000, pw(450.0), p.clone()), pw(700.0));
            s.place(hold("r2", 2_000, pw(500.0), p.clone()), pw(0.0));
            s.get_mut(&p).unwrap().applied = pw(450.0);
            s.rate_record(ActionKind::PowerLimit, Some(1), 1_000);
            s.rate_record(ActionKind::PowerLimit, Some(1), 2_000);
            log.commit(s, None, None, true).unwrap();
        }
        let (_, mut st) = crate::statelog::StateLog::open(dir.path()).unwrap();
        let s = &mut st.holds;
        let h = s.get(&Setting::PowerLimit { gpu: 1 }).unwrap();
        assert_eq!(h.baseline, pw(700.0), "the first hold's baseline stays");
        assert_eq!(h.applied, pw(450.0));
        assert_eq!(h.holds.len(), 2);
        assert_eq!(h.effective(), pw(450.0));
        let err = s.rate_check(ActionKind::PowerLimit, Some(1), Some(&limit), 3_000).unwrap_err();
        assert!(err.contains("2 changes of kind power_limit on GPU 1"), "{err}");
        s.rate_check(ActionKind::PowerLimit, Some(1), Some(&limit), 61_001).unwrap();
        // A placement by the same owner replaces its hold.
        s.place(hold("r1", 5_000, pw(400.0), Setting::PowerLimit { gpu: 1 }), pw(0.0));
        assert_eq!(s.get(&Setting::PowerLimit { gpu: 1 }).unwrap().holds.len(), 2);
        assert_eq!(s.expired(62_000).len(), 1, "r2 ran out at 62 s; r1 was replaced at 5 s");
        assert_eq!(s.expired(65_000).len(), 2);
        assert_eq!(s.remove(|h| h.owner == "r1").len(), 1);
    }

    /// Every sequence of changes: the durable record with the delta applied
    /// is the record in memory (table of steps, each checked).
    #[test]
    fn a_delta_turns_the_durable_record_into_the_one_in_memory() {
        let p0 = Setting::PowerLimit { gpu: 0 };
        let p1 = Setting::PowerLimit { gpu: 1 };
        let d = Setting::NodeDrain {};
        type Step = fn(&mut HoldStore, &Setting, &Setting, &Setting);
        let steps: &[(&str, Step)] = &[
            ("place", |s, p0, _, _| s.place(hold("a", 1, pw(600.0), p0.clone()), pw(700.0))),
            ("second setting", |s, _, p1, _| s.place(hold("b", 2, pw(500.0), p1.clone()), pw(700.0))),
            ("drain", |s, _, _, d| s.place(hold("c", 3, nd(true, Some("x")), d.clone()), nd(false, None))),
            ("applied", |s, p0, _, _| s.get_mut(p0).unwrap().applied = pw(600.0)),
            ("writing", |s, _, p1, _| s.get_mut(p1).unwrap().writing = Some(pw(500.0))),
            ("rate", |s, _, _, _| s.rate_record(ActionKind::PowerLimit, Some(0), 9)),
            ("remove and forget first", |s, p0, _, _| {
                s.remove(|h| h.owner == "a");
                s.forget(p0);
            }),
            ("ended", |s, _, _, _| {
                for i in 0..(ENDED_KEPT + 3) {
                    s.note_ended(EndedHold {
                        hold: hold("a", i as i64, pw(1.0), Setting::PowerLimit { gpu: 0 }),
                        ended_at_ms: i as i64,
                        how: nightshift_proto::HoldEnd::Expired,
                        by: String::new(),
                        outcome: nightshift_proto::RestoreOutcome::Restored,
                        now: pw(700.0),
                    })
                }
            }),
            ("held again, last in order", |s, p0, _, _| s.place(hold("e", 4, pw(650.0), p0.clone()), pw(700.0))),
            ("drifted", |s, _, _, d| s.get_mut(d).unwrap().drifted = Some("by hand".into())),
        ];
        let mut s = HoldStore::from_record(Record::empty());
        for (what, step) in steps {
            step(&mut s, &p0, &p1, &d);
            let delta = s.delta().unwrap_or_default();
            let mut replayed = s.durable.clone();
            replayed.apply(&delta);
            assert!(&replayed == s.record(), "{what}: the replayed record differs");
            s.mark_durable();
            assert!(s.delta().is_none(), "{what}: nothing left after it is durable");
        }
    }
}
