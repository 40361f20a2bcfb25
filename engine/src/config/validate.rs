//! `engine.yaml` read and checked: the listen address, then every section's
//! values against what keeps the engine safe, each refusal located at its
//! key (file:line:column) with what was expected and what was found.

use std::path::Path;

use super::*;

impl EngineConfig {
    /// `listen_addr` is an address, and anonymous access (a demo's) only on
    /// loopback. Checked at load and again after a `--listen` override.
    pub fn check_listen(&self) -> Result<(), String> {
        let Ok(addr) = self.listen_addr.parse::<std::net::SocketAddr>() else {
            return Err(format!(
                "listen_addr: expected host:port such as 127.0.0.1:8080, found {:?}",
                self.listen_addr
            ));
        };
        if self.auth.allow_anonymous.is_some() && !addr.ip().is_loopback() {
            return Err(format!(
                "auth.allow_anonymous is only allowed on a loopback listen_addr, found {}",
                self.listen_addr
            ));
        }
        Ok(())
    }

    /// Read, resolve relative paths, validate.
    pub fn load(path: &Path) -> Result<EngineConfig, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError {
            file: path.into(),
            line: 0,
            column: 0,
            message: format!("cannot read the engine config: {e}"),
        })?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<EngineConfig, LoadError> {
        let mut cfg: EngineConfig = nightshift_proto::yaml::from_str(text).map_err(|e| {
            let (line, column, message) = nightshift_proto::yaml::error_parts(&e);
            LoadError { file: path.into(), line, column, message }
        })?;
        cfg.source_path = Some(path.to_path_buf());
        let base = path.parent().unwrap_or(Path::new("."));
        for p in [&mut cfg.data_dir, &mut cfg.runbook_dir, &mut cfg.inventory_path, &mut cfg.engine_key_path] {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        if let Some(p) = cfg.fault_policy_path.as_mut().filter(|p| p.is_relative()) {
            *p = base.join(&*p);
        }
        if let Some(pg) = &mut cfg.audit.postgres {
            for p in [&mut pg.url_file, &mut pg.ca_file, &mut pg.peer_token_file].into_iter().flatten() {
                if p.is_relative() {
                    *p = base.join(&*p);
                }
            }
        }
        let err = |needle: &str, message: String| {
            let (line, column) = crate::runbooks::manifest::locate(text, needle);
            LoadError { file: path.into(), line, column, message }
        };
        if cfg.version != 1 {
            return Err(err("version", format!("unsupported config version: expected 1, found {}", cfg.version)));
        }
        if let Err(m) = cfg.check_listen() {
            return Err(err(if m.starts_with("auth") { "auth.allow_anonymous" } else { "listen_addr" }, m));
        }
        if let Some(p) = &cfg.auth.proxy {
            if p.from.is_empty() {
                return Err(err(
                    "auth.proxy",
                    "auth.proxy.from: expected the proxy's addresses (IPs or CIDRs): without them anyone could send the header".into(),
                ));
            }
            if let Some(bad) = p.from.iter().find(|f| parse_cidr(f).is_none()) {
                return Err(err(
                    "from",
                    format!("auth.proxy.from: expected an IP or a CIDR such as 10.0.0.0/24, found {bad:?}"),
                ));
            }
            for h in [&p.user_header, &p.groups_header] {
                if axum_header_name_problem(h) {
                    return Err(err(h, format!("auth.proxy: expected a header name, found {h:?}")));
                }
            }
            if p.roles.is_empty() && p.default_role.is_none() {
                return Err(err(
                    "auth.proxy",
                    "auth.proxy: expected roles (group: role) or a default_role, found neither: nobody could sign in"
                        .into(),
                ));
            }
        }
        if let Some(a) = &cfg.autoscaler {
            if !(a.url.starts_with("http://") || a.url.starts_with("https://")) {
                return Err(err(
                    "autoscaler.url",
                    format!("autoscaler.url: expected http:// or https://…, found {:?}", a.url),
                ));
            }
            if !(1..=300).contains(&a.timeout_secs) {
                return Err(err(
                    "autoscaler.timeout_secs",
                    format!("autoscaler.timeout_secs: expected 1 to 300, found {}", a.timeout_secs),
                ));
            }
            if !(1..=10_000).contains(&a.max_nodes_per_pool) {
                return Err(err(
                    "autoscaler.max_nodes_per_pool",
                    format!("autoscaler.max_nodes_per_pool: expected 1 to 10000, found {}", a.max_nodes_per_pool),
                ));
            }
        }
        if let Some(g) = &cfg.grafana
            && !(g.url.starts_with("http://") || g.url.starts_with("https://"))
        {
            return Err(err("grafana.url", format!("grafana.url: expected http:// or https://…, found {:?}", g.url)));
        }
        match (cfg.audit.backend, &cfg.audit.postgres) {
            (AuditBackend::Postgres, None) => {
                return Err(err(
                    "audit.backend",
                    "audit.backend: postgres needs audit.postgres: {url_file: FILE} (or url_env: VAR)".into(),
                ));
            }
            (AuditBackend::Postgres, Some(pg)) => {
                if pg.url_file.is_some() == pg.url_env.is_some() {
                    return Err(err(
                        "audit.postgres",
                        "audit.postgres: expected exactly one of url_file and url_env, found both or neither".into(),
                    ));
                }
                let (ttl, renew) = (pg.lease_ttl_ms, pg.lease_renew_ms);
                if !(1_000..=600_000).contains(&ttl) || renew == 0 || renew * 2 > ttl {
                    return Err(err(
                        "audit.postgres.lease_ttl_ms",
                        format!(
                            "audit.postgres: expected lease_ttl_ms 1000 to 600000 and lease_renew_ms at most half of it, found {ttl} and {renew}"
                        ),
                    ));
                }
                if !(10..=60_000).contains(&pg.follow_ms) {
                    return Err(err(
                        "audit.postgres.follow_ms",
                        format!("audit.postgres.follow_ms: expected 10 to 60000, found {}", pg.follow_ms),
                    ));
                }
                if pg.shard.is_empty() || !pg.shard.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
                    return Err(err(
                        "audit.postgres.shard",
                        format!(
                            "audit.postgres.shard: expected letters, digits, '-', '_' or '.', found {:?}",
                            pg.shard
                        ),
                    ));
                }
                if let Some(u) = &pg.advertise_url
                    && !(u.starts_with("http://") || u.starts_with("https://"))
                {
                    return Err(err(
                        "audit.postgres.advertise_url",
                        format!("audit.postgres.advertise_url: expected http:// or https://…, found {u:?}"),
                    ));
                }
                if let Some(u) = pg.peers.iter().find(|u| !(u.starts_with("http://") || u.starts_with("https://"))) {
                    return Err(err(
                        "audit.postgres.peers",
                        format!("audit.postgres.peers: expected http:// or https://…, found {u:?}"),
                    ));
                }
            }
            (AuditBackend::Sled, _) => {}
        }
        if !(1.0..=1000.0).contains(&cfg.time_scale) || cfg.time_scale.is_nan() {
            return Err(err("time_scale", format!("time_scale: expected 1 to 1000, found {}", cfg.time_scale)));
        }
        if let Some(origin) = cfg.time_origin_ms
            && (cfg.time_scale <= 1.0 || origin < 0)
        {
            return Err(err(
                "time_origin_ms",
                format!(
                    "time_origin_ms: expected a Unix time in ms (0 or more) with a time_scale above 1, found {origin} with time_scale {}",
                    cfg.time_scale
                ),
            ));
        }
        if !(0.0..=10_000_000.0).contains(&cfg.limits.webhook_alerts_per_sec) {
            return Err(err(
                "limits.webhook_alerts_per_sec",
                format!(
                    "limits.webhook_alerts_per_sec: expected 0 (no limit) to 10000000, found {}",
                    cfg.limits.webhook_alerts_per_sec
                ),
            ));
        }
        if !(0.0..=100.0).contains(&cfg.limits.max_drained_pct) {
            return Err(err(
                "limits.max_drained_pct",
                format!("limits.max_drained_pct: expected 0 to 100, found {}", cfg.limits.max_drained_pct),
            ));
        }
        let urls = cfg
            .sources
            .prometheus
            .iter()
            .chain(&cfg.sources.exporters)
            .map(|s| (&s.url, s.interval_secs, s.timeout_secs))
            .chain(cfg.notifications.webhooks.iter().map(|w| (&w.url, 1, w.timeout_secs)));
        for (url, interval, timeout) in urls {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(err(url, format!("expected an http:// or https:// URL, found {url:?}")));
            }
            if interval == 0 || timeout == 0 {
                return Err(err(url, format!("{url}: interval_secs and timeout_secs must be above 0")));
            }
        }
        let is_sha = |h: &str| h.len() == 64 && hex::decode(h).is_ok();
        // A token's name is who the audit says acted: one per person or
        // Alertmanager, across both lists, and text that shows as itself
        // on every page (no spaces, newlines or markup).
        let mut names = std::collections::HashMap::new();
        for (list, i, name) in cfg
            .auth
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| ("tokens", i, &t.name))
            .chain(cfg.auth.webhook_tokens.iter().enumerate().map(|(i, t)| ("webhook_tokens", i, &t.name)))
        {
            let at = format!("auth.{list}.{i}.name");
            if !valid_token_name(name) {
                return Err(err(
                    &at,
                    format!(
                        "auth.{list}[{i}].name: expected 1 to 64 letters, digits or `._-@` (the name the audit shows), found {name:?}"
                    ),
                ));
            }
            if let Some(first) = names.insert(name.clone(), format!("auth.{list}[{}]", i)) {
                return Err(err(
                    &at,
                    format!(
                        "auth.{list}[{i}].name: expected a name no other token has, found {name:?}, the name of {first}: the audit could not tell who acted"
                    ),
                ));
            }
        }
        for t in &cfg.auth.tokens {
            if !is_sha(&t.sha256) {
                return Err(err(
                    &t.sha256,
                    format!(
                        "auth.tokens[{}].sha256: expected 64 hex characters (sha256sum of the token), found {:?}",
                        t.name, t.sha256
                    ),
                ));
            }
        }
        if let Some(h) = &cfg.auth.webhook_token_sha256
            && !is_sha(h)
        {
            return Err(err(
                "auth.webhook_token_sha256",
                format!(
                    "auth.webhook_token_sha256: expected 64 hex characters (`nightshift token` prints it; never the token itself), found {} characters",
                    h.len()
                ),
            ));
        }
        for t in &cfg.auth.webhook_tokens {
            if !is_sha(&t.sha256) {
                return Err(err(
                    &t.sha256,
                    format!(
                        "auth.webhook_tokens[{}].sha256: expected 64 hex characters (sha256sum of the token), found {} characters",
                        t.name,
                        t.sha256.len()
                    ),
                ));
            }
        }
        if !(1..=86_400).contains(&cfg.audit.exit_after_stop_secs) {
            return Err(err(
                "audit.exit_after_stop_secs",
                format!("audit.exit_after_stop_secs: expected 1 to 86400, found {}", cfg.audit.exit_after_stop_secs),
            ));
        }
        // Numbers that would switch a safety off or stop the engine.
        let l = &cfg.limits;
        for (field, v, lo, hi) in [
            ("queue_capacity", l.queue_capacity as u64, 1, 1_000_000),
            ("max_concurrent_runs", l.max_concurrent_runs as u64, 1, 100_000),
            ("alert_dedup_entries", l.alert_dedup_entries as u64, 1, 100_000_000),
            ("action_timeout_secs", l.action_timeout_secs, 1, 3_600),
            ("alert_backlog", l.alert_backlog as u64, 1, 10_000_000),
            ("webhook_alert_burst", l.webhook_alert_burst, 1, 100_000_000),
            ("resume_wait_secs", l.resume_wait_secs, 1, 86_400),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err(err(
                    &format!("limits.{field}"),
                    format!("limits.{field}: expected {lo} to {hi}, found {v}"),
                ));
            }
        }
        let sl = &cfg.script;
        for (field, v, lo, hi) in [
            ("max_operations", sl.max_operations, 1_000, 1_000_000_000),
            ("max_call_levels", sl.max_call_levels as u64, 1, 256),
            ("max_expr_depth", sl.max_expr_depth as u64, 1, 1_024),
            ("max_string_size", sl.max_string_size as u64, 1, 16 * 1024 * 1024),
            ("max_array_size", sl.max_array_size as u64, 1, 10_000_000),
            ("max_map_size", sl.max_map_size as u64, 1, 10_000_000),
            ("max_variables", sl.max_variables as u64, 1, 100_000),
            ("max_notes", u64::from(sl.max_notes), 1, 100_000),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err(err(
                    field,
                    format!("script.{field}: expected {lo} to {hi} (0 would switch the limit off), found {v}"),
                ));
            }
        }
        let t = &cfg.telemetry;
        for (field, v, lo, hi) in [
            ("interval_ms", t.interval_ms, 50, 600_000),
            ("script_window_secs", t.script_window_secs, 1, 86_400),
            ("stale_after_secs", t.stale_after_secs, 1, 86_400),
            ("history_secs", t.history_secs, 0, 7 * 86_400),
            ("history_step_secs", t.history_step_secs, 1, 3_600),
            ("history_max_mib", t.history_max_mib, 1, 65_536),
            ("ingest_shards", t.ingest_shards, 1, 64),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err(err(
                    &format!("telemetry.{field}"),
                    format!("telemetry.{field}: expected {lo} to {hi}, found {v}"),
                ));
            }
        }
        if let Some(every) = cfg.notifications.audit_anchor_every_secs
            && !(60..=7 * 86_400).contains(&every)
        {
            return Err(err(
                "notifications.audit_anchor_every_secs",
                format!("notifications.audit_anchor_every_secs: expected 60 to 604800, found {every}"),
            ));
        }
        if let Some(u) = &cfg.notifications.ui_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            return Err(err(
                "notifications.ui_url",
                format!("notifications.ui_url: expected the web UI's http:// or https:// URL, found {u:?}"),
            ));
        }
        for w in &cfg.notifications.webhooks {
            if w.format == super::WebhookFormat::Alertmanager {
                if !w.url.trim_end_matches('/').ends_with("/api/v2/alerts") {
                    return Err(err(
                        &w.url,
                        format!(
                            "notifications.webhooks[{}]: format alertmanager expects Alertmanager's v2 alerts endpoint (http://alertmanager:9093/api/v2/alerts), found {:?}",
                            w.name, w.url
                        ),
                    ));
                }
                if w.audit_anchors || !(60..=7 * 86_400).contains(&w.firing_secs) {
                    return Err(err(
                        &w.name,
                        format!(
                            "notifications.webhooks[{}]: format alertmanager expects firing_secs 60 to 604800 and no audit_anchors (keep the head where it is not resolved away), found {} and {}",
                            w.name, w.firing_secs, w.audit_anchors
                        ),
                    ));
                }
            }
            if !(1..=20).contains(&w.max_attempts) || w.timeout_secs > 300 {
                return Err(err(
                    &w.name,
                    format!(
                        "notifications.webhooks[{}]: expected max_attempts 1 to 20 and timeout_secs at most 300, found {} and {}",
                        w.name, w.max_attempts, w.timeout_secs
                    ),
                ));
            }
            if let Some(fb) = &w.fallback
                && (fb == &w.name || !cfg.notifications.webhooks.iter().any(|o| &o.name == fb))
            {
                let names: Vec<&str> =
                    cfg.notifications.webhooks.iter().map(|o| o.name.as_str()).filter(|n| n != &w.name).collect();
                return Err(err(
                    fb,
                    format!(
                        "notifications.webhooks[{}].fallback: expected another target's name ({}), found {fb:?}",
                        w.name,
                        if names.is_empty() { "there is none".to_string() } else { names.join(", ") }
                    ),
                ));
            }
        }
        let retry = cfg.notifications.retry_max_secs;
        if !(5..=3600).contains(&retry) {
            return Err(err(
                "notifications.retry_max_secs",
                format!("notifications.retry_max_secs: expected 5 to 3600, found {retry}"),
            ));
        }
        let repage = cfg.notifications.repage_after_secs;
        if repage > 30 * 86_400 {
            return Err(err(
                "notifications.repage_after_secs",
                format!(
                    "notifications.repage_after_secs: expected 0 (page every time) to 2592000 (30 days), found {repage}"
                ),
            ));
        }
        let remind = cfg.notifications.remind_after_secs;
        if remind > 30 * 86_400 {
            return Err(err(
                "notifications.remind_after_secs",
                format!(
                    "notifications.remind_after_secs: expected 0 (say every time) to 2592000 (30 days), found {remind}"
                ),
            ));
        }
        let shared = cfg.notifications.shared_cause_secs;
        if shared > 86_400 {
            return Err(err(
                "notifications.shared_cause_secs",
                format!(
                    "notifications.shared_cause_secs: expected 0 (page every storm) to 86400 (a day), found {shared}"
                ),
            ));
        }
        let worse = cfg.notifications.worse_by_pct;
        if !(worse.is_finite() && (1.0..=1000.0).contains(&worse)) {
            return Err(err(
                "notifications.worse_by_pct",
                format!(
                    "notifications.worse_by_pct: expected 1 to 1000 (percent of the size last said), found {worse}"
                ),
            ));
        }
        let expiry = cfg.notifications.page_expiry_secs;
        if !(60..=86_400).contains(&expiry) {
            return Err(err(
                "notifications.page_expiry_secs",
                format!("notifications.page_expiry_secs: expected 60 to 86400, found {expiry}"),
            ));
        }
        Ok(cfg)
    }
}

/// Whether `name` may name a token: 1 to 64 letters, digits or `._-@` —
/// the name the audit shows for whoever uses it, as itself on every page.
pub fn valid_token_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b))
}

/// A header name HTTP would refuse (empty, or a character outside a token).
fn axum_header_name_problem(h: &str) -> bool {
    h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}
