//! The API document and the router agree (issue 30: `/agents/{name}/holds`,
//! `/runbooks/{name}/mode` and `/runbooks/{name}/shadow` were served but
//! undocumented): every `/api/…`, `/healthz` and `/metrics` route the router
//! serves is in `openapi.json` with the same methods, and the document
//! names no route the router does not serve. Routes are read from
//! `router()` in `src/lib.rs`, where each is one `.route(PATH, METHOD(…)…)`.

use std::collections::{BTreeMap, BTreeSet};

/// (path → methods) of every `.route(…)` in the router's source.
fn served() -> BTreeMap<String, BTreeSet<String>> {
    let src = include_str!("../../src/lib.rs");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in src.lines().map(str::trim).filter(|l| l.starts_with(".route(\"")) {
        let rest = &line[".route(\"".len()..];
        let (path, handlers) = rest.split_once('"').expect("a quoted path");
        let methods = out.entry(path.to_string()).or_default();
        for m in ["get", "post", "put", "delete", "patch"] {
            if handlers.contains(&format!(" {m}("))
                || handlers.contains(&format!(".{m}("))
                || handlers.starts_with(&format!(", {m}("))
            {
                methods.insert(m.to_string());
            }
        }
        assert!(!methods.is_empty(), "no method found in {line}");
    }
    out
}

fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let doc: serde_json::Value =
        serde_json::from_str(include_str!("../../src/openapi.json")).expect("openapi.json parses");
    doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .map(|(p, ops)| (p.clone(), ops.as_object().expect("operations").keys().cloned().collect()))
        .collect()
}

#[test]
fn every_api_route_is_documented_and_every_documented_route_served() {
    let api = |p: &str| p.starts_with("/api/") || p == "/healthz" || p == "/readyz" || p == "/metrics";
    let served: BTreeMap<_, _> = served().into_iter().filter(|(p, _)| api(p)).collect();
    let documented = documented();
    assert!(served.len() > 30, "the router's routes were read: {served:?}");
    let mut problems = Vec::new();
    for (path, methods) in &served {
        match documented.get(path) {
            None => problems.push(format!("{path} is served but not in openapi.json")),
            Some(d) if d != methods => problems.push(format!("{path}: served for {methods:?}, documented for {d:?}")),
            _ => {}
        }
    }
    for path in documented.keys() {
        if !served.contains_key(path) {
            problems.push(format!("{path} is in openapi.json but not served"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
