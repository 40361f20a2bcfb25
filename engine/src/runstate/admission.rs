//! Admission: whether a run request becomes a run, as one pure function of
//! the run table, the manifest, the request and the time. The rules, in the
//! order they apply:
//!
//! 0. **paused** — an admin paused the whole fleet (`nightshift fleet
//!    mode paused`): suppressed, audited once (not manual runs);
//! 1. **stale** — an event older than `max_event_age_secs` is dropped
//!    (manual runs are never stale);
//! 2. **dedup** — a run for the same (runbook, target) is active: suppressed;
//! 3. **cooldown** — within `cooldown_secs` of the last one: suppressed
//!    (not for manual runs);
//! 4. **breaker** — the runbook's breaker is tripped: suppressed (one
//!    with `on_trip: reversible_only` admits, its runs reversible only);
//! 5. **budget** — `max_attempts_per_day` spent: refused (not manual);
//! 6. **hands-off** — a target node is in maintenance: refused;
//! 7. **capacity** — the queue is full: shed (never a critical run);
//! 8. **approval** — `always`, or more nodes changed than `above_nodes`:
//!    the run waits for a person (dry runs never do).
//!
//! The caller applies the decision (records the attempt, the breaker fire,
//! the queued run) — see `run/executor.rs`.

use std::collections::BTreeMap;

use crate::config::Limits;
use crate::runbooks::manifest::{Manifest, Priority, Scope};
use crate::runs::Target;
use crate::runstate::runtable::{Key, RunTable};

/// A run request, as admission sees it.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    pub manifest: &'a Manifest,
    pub target: &'a Target,
    /// Manual runs (CLI, web) skip staleness, cooldown and budget.
    pub manual: bool,
    pub event_ts_ms: i64,
    pub dry_run: bool,
    /// A node of the target in maintenance, if any, in words with who set
    /// it and why (`NodeState::hands_off_words`).
    pub hands_off: Option<&'a str>,
    /// Nodes in the target (the group's size for group runs).
    pub target_nodes: usize,
    /// The run's parameters (`nodes_changed_param` counts one of them).
    pub params: &'a BTreeMap<String, crate::runbooks::manifest::ParamValue>,
    /// The fleet is paused: by whom and why.
    pub paused: Option<&'a str>,
}

/// What becomes of a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Not acted on and not a run (stale).
    Drop { reason: String },
    /// Not a run: another is active, cooling down, or the breaker is open.
    /// `first`: the first suppression of this episode (audited).
    Suppress { reason: String, existing: Option<String>, first: bool },
    /// A run, refused at once (budget, hands-off).
    Refuse { reason: String },
    /// Not a run: the queue is full.
    Shed { reason: String },
    /// A run: queued (after `hold_ms`), or waiting for approval.
    Admit { approval: Option<String>, hold_ms: i64 },
}

/// How many nodes a run of `m` on `target` changes at most.
pub fn nodes_changed(
    m: &Manifest,
    target_nodes: usize,
    params: &BTreeMap<String, crate::runbooks::manifest::ParamValue>,
) -> u32 {
    match m.scope {
        Scope::Gpu | Scope::Node => 1,
        Scope::Group => {
            let cap = m.max_nodes_changed.unwrap_or(target_nodes.min(u32::MAX as usize) as u32);
            match m.nodes_changed_param.as_ref().and_then(|p| params.get(p)) {
                Some(crate::runbooks::manifest::ParamValue::Int(n)) => cap.min((*n).clamp(0, u32::MAX as i64) as u32),
                _ => cap,
            }
        }
    }
}

/// Why a run of `m` changing `n` nodes needs approval, if it does.
pub fn approval_reason(m: &Manifest, n: u32) -> Option<String> {
    if m.approval.always {
        Some("runbook always needs approval".into())
    } else {
        m.approval.above_nodes.filter(|a| n > *a).map(|a| format!("changes up to {n} nodes (approval above {a})"))
    }
}

/// Decide; changes nothing.
pub fn admit(t: &RunTable, a: &Ask<'_>, now: i64, limits: &Limits) -> Decision {
    let m = a.manifest;
    let key: Key = (m.name.clone(), a.target.clone());
    if let (Some(why), false) = (a.paused, a.manual) {
        return Decision::Suppress {
            reason: format!("the fleet is paused ({why}): {} on {} waits until it is not", m.name, a.target),
            existing: None,
            first: !t.suppression_noted(&key),
        };
    }
    let age_ms = now.saturating_sub(a.event_ts_ms);
    let max_age_ms = (m.max_event_age_secs as i64).saturating_mul(1000);
    if !a.manual && age_ms > max_age_ms {
        return Decision::Drop {
            reason: format!(
                "event for {} is {} s old (max_event_age_secs {}): not acted on",
                a.target,
                age_ms / 1000,
                m.max_event_age_secs
            ),
        };
    }
    let first = !t.suppression_noted(&key);
    if let Some(existing) = t.active_run(&key) {
        return Decision::Suppress {
            reason: format!("run {existing} for {} is already active", a.target),
            existing: Some(existing.clone()),
            first,
        };
    }
    let cooldown_ms = (m.cooldown_secs as i64).saturating_mul(1000);
    if let Some(last) = t.last_finished(&key)
        && !a.manual
        && now.saturating_sub(last) < cooldown_ms
    {
        return Decision::Suppress {
            reason: format!(
                "{} cooling down for {} more s after its last run (cooldown_secs {})",
                a.target,
                (last.saturating_add(cooldown_ms) - now) / 1000,
                m.cooldown_secs
            ),
            existing: None,
            first,
        };
    }
    // A breaker that lets the storm's runs go on (reversible steps only)
    // admits them: each is told it belongs to the shared cause.
    let refuses = m.breaker.as_ref().is_none_or(|b| b.on_trip == crate::runbooks::manifest::OnTrip::Refuse);
    if refuses && t.breaker(&m.name).is_some_and(|b| b.tripped_until > now) {
        return Decision::Suppress { reason: format!("breaker for {} is tripped", m.name), existing: None, first };
    }
    let attempts = t.attempts_since(&key, now.saturating_sub(86_400_000));
    if !a.manual && attempts as u64 >= m.max_attempts_per_day as u64 {
        return Decision::Refuse {
            reason: format!(
                "attempt budget spent: {attempts} runs of {} on {} in the last 24 h (max_attempts_per_day {})",
                m.name, a.target, m.max_attempts_per_day
            ),
        };
    }
    if let Some(why) = a.hands_off {
        return Decision::Refuse { reason: format!("{why}: nightshift does not act on it") };
    }
    let waiting = t.queue().len();
    if waiting >= limits.queue_capacity && m.priority != Priority::Critical {
        return Decision::Shed {
            reason: format!(
                "run queue is full ({waiting} waiting, queue_capacity {}): {} for {} shed",
                limits.queue_capacity, m.name, a.target
            ),
        };
    }
    let approval = if a.dry_run { None } else { approval_reason(m, nodes_changed(m, a.target_nodes, a.params)) };
    let hold_ms = m.breaker.as_ref().map_or(0, |b| (b.hold_secs as i64).saturating_mul(1000));
    Decision::Admit { approval, hold_ms }
}

#[cfg(test)]
mod tests {
    use super::*;

    static NO_PARAMS: BTreeMap<String, crate::runbooks::manifest::ParamValue> = BTreeMap::new();
    use crate::runstate::runtable::BreakerFire;
    use std::path::Path;

    /// An automatic request for one GPU, its event fresh.
    fn plain_ask<'a>(m: &'a Manifest, target: &'a Target) -> Ask<'a> {
        Ask {
            manifest: m,
            target,
            manual: false,
            event_ts_ms: NOW,
            dry_run: false,
            hands_off: None,
            target_nodes: 1,
            params: &NO_PARAMS,
            paused: None,
        }
    }

    fn manifest(extra: &str) -> Manifest {
        let text = format!(
            "version: 1\nname: rb\ndescription: d\nscript: rb.rhai\ntrigger:\n  type: threshold\n  metric: gpu.temperature_c\n  above: 85\nscope: gpu\ncooldown_secs: 600\nmax_attempts_per_day: 2\nmax_event_age_secs: 300\n{extra}"
        );
        Manifest::parse(&text, Path::new("rb.yaml")).unwrap()
    }

    fn group_manifest(extra: &str) -> Manifest {
        let text = format!(
            "version: 1\nname: scale\ndescription: d\nscript: s.rhai\ntrigger:\n  type: manual\nscope: group\n{extra}"
        );
        Manifest::parse(&text, Path::new("s.yaml")).unwrap()
    }

    const NOW: i64 = 10_000_000;

    /// Each rule, alone: (name, table setup, manifest, ask tweaks, expected
    /// decision kind and a phrase of its reason).
    #[test]
    fn each_rule_decides_alone() {
        let target = Target::gpu("n1", 0);
        let key: Key = ("rb".into(), target.clone());
        type Setup = Box<dyn Fn(&mut RunTable)>;
        type Tweak = Box<dyn Fn(&mut Ask<'_>)>;
        let none: Setup = Box::new(|_| {});
        let same: Tweak = Box::new(|_| {});
        let limits = Limits { queue_capacity: 2, ..Limits::default() };
        let m = manifest("");
        let critical = manifest("priority: critical\n");
        let cases: Vec<(&str, Setup, &Manifest, Tweak, &str, &str)> = vec![
            ("fresh: admitted", Box::new(|_| {}), &m, Box::new(|_| {}), "admit", ""),
            ("stale", Box::new(|_| {}), &m, Box::new(|a| a.event_ts_ms = NOW - 301_000), "drop", "301 s old"),
            (
                "stale but manual",
                Box::new(|_| {}),
                &m,
                Box::new(|a| {
                    a.event_ts_ms = NOW - 301_000;
                    a.manual = true
                }),
                "admit",
                "",
            ),
            (
                "dedup",
                {
                    let k = key.clone();
                    Box::new(move |t| {
                        t.activate(k.clone(), crate::runstate::runtable::test_entry("r7", &k));
                    })
                },
                &m,
                Box::new(|_| {}),
                "suppress",
                "run r7 for n1/gpu0 is already active",
            ),
            (
                "cooldown",
                {
                    let k = key.clone();
                    Box::new(move |t| {
                        t.finished(k.clone(), NOW - 100_000);
                    })
                },
                &m,
                Box::new(|_| {}),
                "suppress",
                "cooling down for 500 more s",
            ),
            (
                "cooldown over",
                {
                    let k = key.clone();
                    Box::new(move |t| {
                        t.finished(k.clone(), NOW - 600_000);
                    })
                },
                &m,
                Box::new(|_| {}),
                "admit",
                "",
            ),
            (
                "cooldown but manual",
                {
                    let k = key.clone();
                    Box::new(move |t| {
                        t.finished(k.clone(), NOW - 1_000);
                    })
                },
                &m,
                Box::new(|a| a.manual = true),
                "admit",
                "",
            ),
            (
                "breaker",
                Box::new(|t| {
                    t.breaker_or_new("rb").tripped_until = NOW + 1;
                }),
                &m,
                Box::new(|_| {}),
                "suppress",
                "breaker for rb is tripped",
            ),
            (
                "budget",
                {
                    let k = key.clone();
                    Box::new(move |t| {
                        [NOW - 5_000_000, NOW - 1_000_000].iter().for_each(|ts| t.admitted(&k, *ts));
                    })
                },
                &m,
                Box::new(|_| {}),
                "refuse",
                "attempt budget spent: 2 runs",
            ),
            (
                "budget of yesterday",
                {
                    let k = key.clone();
                    Box::new(move |t| {
                        [NOW - 90_000_000, NOW - 87_000_000].iter().for_each(|ts| t.admitted(&k, *ts));
                    })
                },
                &m,
                Box::new(|_| {}),
                "admit",
                "",
            ),
            (
                "hands-off",
                Box::new(|_| {}),
                &m,
                Box::new(|a| a.hands_off = Some("node n1 is hands-off (user:ana: NVSwitch tray reseat)")),
                "refuse",
                "node n1 is hands-off (user:ana: NVSwitch tray reseat): nightshift does not act on it",
            ),
            (
                "queue full",
                Box::new(|t| {
                    t.enqueue("a".into(), Priority::Normal);
                    t.enqueue("b".into(), Priority::Normal);
                }),
                &m,
                Box::new(|_| {}),
                "shed",
                "run queue is full (2 waiting",
            ),
            (
                "queue full, critical",
                Box::new(|t| {
                    t.enqueue("a".into(), Priority::Normal);
                    t.enqueue("b".into(), Priority::Normal);
                }),
                &critical,
                Box::new(|_| {}),
                "admit",
                "",
            ),
        ];
        let _ = (&none, &same);
        for (name, setup, man, tweak, want, phrase) in cases {
            let mut t = RunTable::new(10);
            setup(&mut t);
            let mut ask = Ask {
                manifest: man,
                target: &target,
                manual: false,
                event_ts_ms: NOW - 1_000,
                dry_run: false,
                hands_off: None,
                target_nodes: 1,
                params: &NO_PARAMS,
                paused: None,
            };
            tweak(&mut ask);
            let d = admit(&t, &ask, NOW, &limits);
            let (kind, reason) = match &d {
                Decision::Drop { reason } => ("drop", reason.as_str()),
                Decision::Suppress { reason, .. } => ("suppress", reason.as_str()),
                Decision::Refuse { reason } => ("refuse", reason.as_str()),
                Decision::Shed { reason } => ("shed", reason.as_str()),
                Decision::Admit { .. } => ("admit", ""),
            };
            assert_eq!(kind, want, "{name}: {d:?}");
            assert!(reason.contains(phrase), "{name}: {reason:?} lacks {phrase:?}");
        }
    }

    #[test]
    fn the_first_suppression_of_an_episode_is_the_one_audited() {
        let target = Target::gpu("n1", 0);
        let key: Key = ("rb".into(), target.clone());
        let m = manifest("");
        let mut t = RunTable::new(10);
        t.activate(key.clone(), crate::runstate::runtable::test_entry("r1", &key));
        let ask = plain_ask(&m, &target);
        assert!(matches!(admit(&t, &ask, NOW, &Limits::default()), Decision::Suppress { first: true, .. }));
        t.note_suppression(key);
        assert!(matches!(admit(&t, &ask, NOW, &Limits::default()), Decision::Suppress { first: false, .. }));
    }

    /// Approval counts what the run changes: the manifest's cap, the run's
    /// own `nodes_changed_param` value under it, or the whole group.
    #[test]
    fn approval_counts_the_nodes_a_run_changes() {
        use crate::runbooks::manifest::ParamValue;
        let target = Target::group("pool", "a");
        let t = RunTable::new(10);
        let stepped = "max_nodes_changed: 4\nnodes_changed_param: nodes_per_step\nparams:\n  nodes_per_step: {type: int, default: 1}\napproval: {above_nodes: 1}\n";
        let step = |n: i64| BTreeMap::from([("nodes_per_step".to_string(), ParamValue::Int(n))]);
        type Case<'a> = (&'a str, Manifest, BTreeMap<String, ParamValue>, usize, bool, Option<&'a str>);
        let cases: Vec<Case<'_>> = vec![
            ("one node a step, above 1", group_manifest(stepped), step(1), 20, false, None),
            (
                "three nodes a step, above 1",
                group_manifest(stepped),
                step(3),
                20,
                false,
                Some("changes up to 3 nodes (approval above 1)"),
            ),
            (
                "ten asked, the cap says four",
                group_manifest(stepped),
                step(10),
                20,
                false,
                Some("changes up to 4 nodes (approval above 1)"),
            ),
            (
                "a 20-node pool, no cap, above 3",
                group_manifest("approval: {above_nodes: 3}\n"),
                BTreeMap::new(),
                20,
                false,
                Some("changes up to 20 nodes (approval above 3)"),
            ),
            (
                "always",
                group_manifest("max_nodes_changed: 1\napproval: {always: true}\n"),
                BTreeMap::new(),
                20,
                false,
                Some("always"),
            ),
            ("a dry run never waits", group_manifest("approval: {always: true}\n"), BTreeMap::new(), 20, true, None),
        ];
        for (name, m, params, size, dry, want) in cases {
            let ask = Ask {
                manifest: &m,
                target: &target,
                manual: true,
                event_ts_ms: NOW,
                dry_run: dry,
                hands_off: None,
                target_nodes: size,
                params: &params,
                paused: None,
            };
            match (admit(&t, &ask, NOW, &Limits::default()), want) {
                (Decision::Admit { approval: None, .. }, None) => {}
                (Decision::Admit { approval: Some(r), .. }, Some(p)) => assert!(r.contains(p), "{name}: {r}"),
                (d, w) => panic!("{name}: got {d:?}, want approval {w:?}"),
            }
        }
    }

    /// An approval rule that can never apply is refused where it is written.
    #[test]
    fn an_approval_that_never_applies_is_refused() {
        let parse = |scope: &str, extra: &str| {
            let text = format!(
                "version: 1\nname: scale\ndescription: d\nscript: s.rhai\ntrigger:\n  type: manual\nscope: {scope}\n{extra}"
            );
            Manifest::parse(&text, Path::new("s.yaml")).map(|_| ()).map_err(|e| e.to_string())
        };
        let e = parse("gpu", "approval: {above_nodes: 1}\n").unwrap_err();
        assert_eq!(
            e,
            "s.yaml:8:12: approval.above_nodes: a gpu-scoped run changes one node, so above_nodes 1 never applies: expected a group runbook, or approval: {always: true}"
        );
        let e = parse("group", "max_nodes_changed: 1\napproval: {above_nodes: 3}\n").unwrap_err();
        assert!(e.contains("runs change at most max_nodes_changed 1 node(s), so above_nodes 3 never applies"), "{e}");
        let e = parse("group", "nodes_changed_param: n\nparams: {n: {type: int, default: 1}}\n").unwrap_err();
        assert!(e.contains("nodes_changed_param: expected a group runbook with max_nodes_changed"), "{e}");
        let e =
            parse("group", "max_nodes_changed: 3\nnodes_changed_param: n\nparams: {n: {type: float, default: 1}}\n")
                .unwrap_err();
        assert!(e.contains("expected the name of an int parameter"), "{e}");
        parse("group", "max_nodes_changed: 3\napproval: {above_nodes: 1}\n").unwrap();
        parse("node", "approval: {always: true}\n").unwrap();
    }

    #[test]
    fn breaker_holds_are_passed_on() {
        let target = Target::gpu("n1", 0);
        let m = manifest("breaker: {max_targets: 3, window_secs: 300, hold_secs: 20}\n");
        let mut t = RunTable::new(10);
        t.breaker_or_new("rb").fires.push_back(BreakerFire { ts_ms: NOW, node: "n2".into(), gpu: None });
        let ask = plain_ask(&m, &target);
        assert_eq!(admit(&t, &ask, NOW, &Limits::default()), Decision::Admit { approval: None, hold_ms: 20_000 });
    }

    /// A tripped breaker suppresses the storm's runs, unless it lets them
    /// go on with reversible steps only (a rack's cooling: every GPU still
    /// needs its cap).
    #[test]
    fn a_tripped_breaker_admits_when_its_runs_go_on_reversible_only() {
        let target = Target::gpu("n1", 0);
        for (on_trip, admitted) in [("refuse", false), ("reversible_only", true)] {
            let m = manifest(&format!("breaker: {{max_targets: 3, window_secs: 300, on_trip: {on_trip}}}\n"));
            let mut t = RunTable::new(10);
            t.breaker_or_new("rb").tripped_until = NOW + 1;
            let ask = plain_ask(&m, &target);
            let d = admit(&t, &ask, NOW, &Limits::default());
            assert_eq!(matches!(d, Decision::Admit { .. }), admitted, "on_trip {on_trip}: {d:?}");
        }
    }
}
