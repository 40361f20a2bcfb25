//! The Alertmanager webhook payload parser and what the engine reads from
//! each alert (name, host, GPU, start time, dedup key).
#![no_main]
use libfuzzer_sys::fuzz_target;
use nightshift_engine::embed::{WebhookPayload, parse_rfc3339_ms};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = WebhookPayload::parse(data) {
        for a in &p.alerts {
            let _ = (a.name(), a.host(), a.gpu(), a.starts_at_ms(), a.key());
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = parse_rfc3339_ms(s);
    }
});
