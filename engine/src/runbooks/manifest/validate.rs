//! The semantic checks a manifest gets after it parses: each refusal names
//! the field (file:line:column) and says what was expected and found.

use std::path::Path;

use super::*;

impl Manifest {
    pub(super) fn validate(&self, text: &str, path: &Path) -> Result<(), LoadError> {
        let err = |needle: &str, message: String| {
            let (line, column) = locate(text, needle);
            LoadError { file: path.into(), line, column, message }
        };
        if self.version != 1 {
            return Err(err("version", format!("unsupported manifest version: expected 1, found {}", self.version)));
        }
        if self.name.is_empty() || !self.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(err(
                "name",
                format!("name: expected lowercase letters, digits and dashes, found {:?}", self.name),
            ));
        }
        if let Some(metric) = self.trigger.metric() {
            let Some(id) = metrics::metric_id(metric) else {
                return Err(err(
                    metric,
                    format!("trigger.metric: unknown metric `{metric}`: expected one of {}", metrics::metric_names()),
                ));
            };
            let gpu_metric = metrics::metric(id).gpu_scoped;
            if !gpu_metric && self.scope == Scope::Gpu {
                return Err(err(
                    "scope",
                    format!("scope: `{metric}` is a node metric, so scope must be node or group, found gpu"),
                ));
            }
        }
        for (field, x) in self.trigger.levels() {
            if !x.is_finite() {
                return Err(err(field, format!("trigger.{field}: expected a finite number, found {x}")));
            }
        }
        for (field, x, most) in self.trigger.spans() {
            if x > most {
                return Err(err(field, format!("trigger.{field}: expected at most {most}, found {x}")));
            }
        }
        if let Trigger::Predict { model: PredictModel::FirstOrder { time_constant_secs: 0 }, .. } = &self.trigger {
            return Err(err(
                "time_constant_secs",
                "trigger.model.first_order.time_constant_secs: expected at least 1, found 0".into(),
            ));
        }
        let level_pair = |above: Option<f64>,
                          below: Option<f64>,
                          clear_below: Option<f64>,
                          clear_above: Option<f64>| match (above, below) {
            (Some(_), Some(_)) | (None, None) => {
                Err(err("trigger", "trigger: expected exactly one of `above` or `below`".to_string()))
            }
            (Some(a), None) => match (clear_below, clear_above) {
                (Some(c), _) if c > a => Err(err(
                    "clear_below",
                    format!("trigger.clear_below: expected a level at or below `above` ({a}), found {c}"),
                )),
                (_, Some(_)) => Err(err(
                    "clear_above",
                    "trigger.clear_above: goes with `below`; an `above` trigger clears with `clear_below`".into(),
                )),
                _ => Ok(()),
            },
            (None, Some(b)) => match (clear_below, clear_above) {
                (_, Some(c)) if c < b => Err(err(
                    "clear_above",
                    format!("trigger.clear_above: expected a level at or above `below` ({b}), found {c}"),
                )),
                (Some(_), _) => Err(err(
                    "clear_below",
                    "trigger.clear_below: goes with `above`; a `below` trigger clears with `clear_above`".into(),
                )),
                _ => Ok(()),
            },
        };
        let mut seen_alerts = std::collections::BTreeSet::new();
        for (name, matchers) in self.alerts() {
            if name.is_empty() {
                return Err(err("alertname", "alertname: expected an alert name, found an empty string".into()));
            }
            if !seen_alerts.insert((name, matchers)) {
                return Err(err(
                    "alert_triggers",
                    format!(
                        "alert_triggers: expected each alert once, found {name} (with the same matchers) a second time"
                    ),
                ));
            }
        }
        if !self.alert_triggers.is_empty() && self.scope == Scope::Group {
            return Err(err(
                "alert_triggers",
                "alert_triggers: an alert targets a node or GPU, so the runbook's scope must be node or gpu, found group".into(),
            ));
        }
        match &self.trigger {
            Trigger::Threshold { above, below, clear_below, clear_above, average, for_secs, .. } => {
                if *average && *for_secs == 0 {
                    return Err(err(
                        "average",
                        "trigger.average: averages over `for_secs`, so it needs for_secs of 1 or more, found 0".into(),
                    ));
                }
                level_pair(*above, *below, *clear_below, *clear_above)?
            }
            Trigger::Fleet { above, below, clear_below, clear_above, agg, where_above, .. } => {
                if self.scope != Scope::Group {
                    return Err(err(
                        "scope",
                        "scope: a fleet trigger acts on a label group, so scope must be group".into(),
                    ));
                }
                if *agg == Aggregate::Count && where_above.is_none() {
                    return Err(err("agg", "trigger.where_above: `agg: count` needs `where_above`".into()));
                }
                level_pair(*above, *below, *clear_below, *clear_above)?
            }
            Trigger::Rate { per_min_above, per_min_below, window_secs, .. } => {
                if per_min_above.is_some() == per_min_below.is_some() {
                    return Err(err(
                        "trigger",
                        "trigger: expected exactly one of `per_min_above` or `per_min_below`".into(),
                    ));
                }
                if *window_secs < 10 {
                    return Err(err(
                        "window_secs",
                        format!("trigger.window_secs: expected at least 10, found {window_secs}"),
                    ));
                }
            }
            Trigger::Predict { horizon_secs, window_secs, .. } => {
                if *window_secs < 10 || *horizon_secs == 0 {
                    return Err(err(
                        "window_secs",
                        format!(
                            "trigger: expected window_secs ≥ 10 and horizon_secs ≥ 1, found {window_secs} and {horizon_secs}"
                        ),
                    ));
                }
            }
            Trigger::Change { to_any_of, increase, .. } => {
                if to_any_of.is_empty() && !increase {
                    return Err(err(
                        "trigger",
                        "trigger: a change trigger needs `to_any_of` or `increase: true`".into(),
                    ));
                }
            }
            Trigger::Fault { kinds } => {
                if kinds.is_empty() {
                    return Err(err("kinds", "trigger.kinds: expected at least one fault kind, found none".into()));
                }
                for k in kinds {
                    if crate::base::faults::FaultKind::parse(k).is_none() {
                        return Err(err(
                            k,
                            format!(
                                "trigger.kinds: unknown fault kind `{k}`: expected one of {}",
                                crate::base::faults::FaultKind::ALL.map(|k| k.as_str()).join(", ")
                            ),
                        ));
                    }
                }
                if self.scope != Scope::Gpu {
                    return Err(err(
                        "scope",
                        "scope: a fault trigger acts on the GPU at fault, so scope must be gpu".into(),
                    ));
                }
            }
            Trigger::Alert { alertname, confirm, .. } => {
                if alertname.is_empty() {
                    return Err(err(
                        "alertname",
                        "trigger.alertname: expected an alert name, found an empty string".into(),
                    ));
                }
                if let Some(c) = confirm {
                    let Some(id) = metrics::metric_id(&c.metric) else {
                        return Err(err(
                            &c.metric,
                            format!(
                                "trigger.confirm.metric: unknown metric `{}`: expected one of {}",
                                c.metric,
                                metrics::metric_names()
                            ),
                        ));
                    };
                    if !metrics::metric(id).gpu_scoped && self.scope == Scope::Gpu {
                        return Err(err(
                            "confirm",
                            format!(
                                "trigger.confirm: `{}` is a node metric, so scope must be node, found gpu",
                                c.metric
                            ),
                        ));
                    }
                    match (c.below, c.above) {
                        (Some(x), None) | (None, Some(x)) if x.is_finite() => {}
                        _ => {
                            return Err(err(
                                "confirm",
                                format!(
                                    "trigger.confirm: expected exactly one finite `below:` or `above:`, found {}",
                                    match (c.below, c.above) {
                                        (Some(b), Some(a)) => format!("both (below: {b}, above: {a})"),
                                        (Some(x), None) | (None, Some(x)) => format!("{x}"),
                                        (None, None) => "neither".into(),
                                    }
                                ),
                            ));
                        }
                    }
                }
                if self.scope == Scope::Group {
                    return Err(err("scope", "scope: alert triggers target a node or GPU, found group".into()));
                }
            }
            Trigger::Schedule { every_secs } => {
                if self.scope != Scope::Node {
                    return Err(err(
                        "scope",
                        "scope: a schedule trigger runs once per node, so scope must be node".into(),
                    ));
                }
                if *every_secs < 10 {
                    return Err(err(
                        "every_secs",
                        format!("trigger.every_secs: expected at least 10, found {every_secs}"),
                    ));
                }
            }
            Trigger::Manual {} => {}
        }
        if self.scope == Scope::Group
            && !matches!(self.trigger, Trigger::Fleet { .. } | Trigger::Schedule { .. } | Trigger::Manual {})
        {
            return Err(err(
                "scope",
                format!(
                    "scope: group runs come from fleet, schedule or manual triggers, found {}",
                    self.trigger.kind()
                ),
            ));
        }
        if !(0.0..=100.0).contains(&self.blast_radius.max_drained_pct) {
            return Err(err(
                "max_drained_pct",
                format!("blast_radius.max_drained_pct: expected 0 to 100, found {}", self.blast_radius.max_drained_pct),
            ));
        }
        if self.blast_radius.max_per_group.is_some() != self.blast_radius.group_by.is_some() {
            return Err(err("blast_radius", "blast_radius: `max_per_group` and `group_by` go together".into()));
        }
        if self.max_concurrent == 0 {
            return Err(err("max_concurrent", "max_concurrent: expected at least 1, found 0".into()));
        }
        if !(1..=86_400).contains(&self.timeout_secs) {
            return Err(err("timeout_secs", format!("timeout_secs: expected 1 to 86400, found {}", self.timeout_secs)));
        }
        const MONTH: u64 = 30 * 86_400;
        for (field, x, lo, hi) in [
            ("cooldown_secs", self.cooldown_secs, 0, MONTH),
            ("max_event_age_secs", self.max_event_age_secs, 1, MONTH),
            ("expire_secs", self.approval.expire_secs, 60, 7 * 86_400),
        ] {
            if !(lo..=hi).contains(&x) {
                let name = if field == "expire_secs" { "approval.expire_secs" } else { field };
                return Err(err(field, format!("{name}: expected {lo} to {hi}, found {x}")));
            }
        }
        if let Some(h) = self.history_secs
            && !(60..=86_400).contains(&h)
        {
            return Err(err("history_secs", format!("history_secs: expected 60 to 86400, found {h}")));
        }
        if self.max_attempts_per_day == 0 {
            return Err(err("max_attempts_per_day", "max_attempts_per_day: expected at least 1, found 0".into()));
        }
        if self.approval.above_nodes == Some(0) {
            return Err(err("above_nodes", "approval.above_nodes: expected at least 1, found 0".into()));
        }
        // An approval rule that can never apply is a promise nobody keeps:
        // refused, saying why.
        if let Some(a) = self.approval.above_nodes {
            if self.scope != Scope::Group {
                return Err(err(
                    "approval.above_nodes",
                    format!(
                        "approval.above_nodes: a {}-scoped run changes one node, so above_nodes {a} never applies: expected a group runbook, or approval: {{always: true}}",
                        if self.scope == Scope::Gpu { "gpu" } else { "node" }
                    ),
                ));
            }
            if let Some(cap) = self.max_nodes_changed
                && cap <= a
            {
                return Err(err(
                    "approval.above_nodes",
                    format!(
                        "approval.above_nodes: runs change at most max_nodes_changed {cap} node(s), so above_nodes {a} never applies: expected above_nodes below {cap}"
                    ),
                ));
            }
        }
        if let Some(p) = &self.nodes_changed_param {
            if self.scope != Scope::Group || self.max_nodes_changed.is_none() {
                return Err(err(
                    "nodes_changed_param",
                    "nodes_changed_param: expected a group runbook with max_nodes_changed (the most a run may ask for)"
                        .into(),
                ));
            }
            if self.params.get(p).map(|s| s.ty) != Some(ParamType::Int) {
                return Err(err(
                    "nodes_changed_param",
                    format!("nodes_changed_param: expected the name of an int parameter, found {p:?}"),
                ));
            }
        }
        if let Some(v) = &self.selector.vendor
            && v != "nvidia"
            && v != "amd"
        {
            return Err(err("vendor", format!("selector.vendor: expected nvidia or amd, found {v:?}")));
        }
        for (name, p) in &self.params {
            if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(err(name, format!("params: `{name}` is not a valid name: use letters, digits and _")));
            }
            p.ty.read_yaml(&p.default).map_err(|m| err(name, format!("params.{name}.default: {m}")))?;
        }
        if self.class == RunClass::Observe && (self.sticky_drain || self.exclusive) {
            return Err(err(
                "class",
                "class: an observe runbook changes nothing, so it cannot be exclusive or place sticky drains".into(),
            ));
        }
        if let Some(n) = self.max_nodes_changed {
            if self.scope != Scope::Group {
                return Err(err(
                    "max_nodes_changed",
                    "max_nodes_changed: only group runbooks change several nodes; a node or GPU run changes one".into(),
                ));
            }
            if n == 0 {
                return Err(err("max_nodes_changed", "max_nodes_changed: expected at least 1, found 0".into()));
            }
        }
        if let Some(b) = &self.breaker
            && (b.max_targets == 0 || b.window_secs == 0 || b.window_secs > 86_400 || b.hold_secs > 3_600)
        {
            return Err(err(
                "breaker",
                format!(
                    "breaker: expected max_targets ≥ 1, window_secs 1 to 86400 and hold_secs at most 3600, found {}, {} and {}",
                    b.max_targets, b.window_secs, b.hold_secs
                ),
            ));
        }
        // A held fire whose event is older than max_event_age_secs when the
        // hold ends is skipped: a hold that long skips every run.
        if let Some(b) = &self.breaker
            && b.hold_secs >= self.max_event_age_secs
        {
            return Err(err(
                "breaker",
                format!(
                    "breaker: expected hold_secs under max_event_age_secs ({}), found {}: every held run would be too old to start — shorten the hold or raise max_event_age_secs",
                    self.max_event_age_secs, b.hold_secs
                ),
            ));
        }
        if !self.script.ends_with(".rhai") {
            return Err(err("script", format!("script: expected a .rhai file, found {:?}", self.script)));
        }
        if let Some(sig) = &self.signals {
            if sig.uses.is_empty() {
                return Err(err("signals", "signals.uses: expected at least one metric, found none".into()));
            }
            for (field, list) in [("uses", &sig.uses), ("fallback", &sig.fallback)] {
                if let Some(m) = list.iter().find(|m| metrics::metric_id(m).is_none()) {
                    return Err(err(
                        m,
                        format!("signals.{field}: unknown metric `{m}`: expected one of {}", metrics::metric_names()),
                    ));
                }
            }
        }
        Ok(())
    }
}
