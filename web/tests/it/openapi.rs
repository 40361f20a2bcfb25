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

/// Where the checked-in document is.
fn checked_in_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/openapi.json")
}

/// Issue 44: `openapi.json` is generated from the types the server takes
/// and answers with (`src/openapi.rs`), and this fails when the checked-in
/// file drifts from them — a field added to a reply, a new route in the
/// table. `NIGHTSHIFT_WRITE_OPENAPI=1` writes it again.
#[test]
fn openapi_json_is_what_the_types_generate() {
    let generated = nightshift_web::openapi::document_text();
    if std::env::var_os("NIGHTSHIFT_WRITE_OPENAPI").is_some() {
        std::fs::write(checked_in_path(), &generated).expect("write openapi.json");
    }
    let checked_in = std::fs::read_to_string(checked_in_path()).expect("openapi.json");
    if checked_in != generated {
        let line = checked_in.lines().zip(generated.lines()).position(|(a, b)| a != b).unwrap_or(0);
        let (was, now) = (checked_in.lines().nth(line).unwrap_or(""), generated.lines().nth(line).unwrap_or(""));
        panic!(
            "web/src/openapi.json is not what the types generate (first difference at line {}: {was:?} in the file, {now:?} generated); write it again with NIGHTSHIFT_WRITE_OPENAPI=1 cargo test -p nightshift-web --test it openapi:: and commit it",
            line + 1
        );
    }
}

/// Every `$ref` of the document names a schema it has, and every schema
/// has a type or a composition (no empty `{}` standing in for a type).
#[test]
fn every_reference_resolves() {
    let doc = nightshift_web::openapi::document();
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    assert!(schemas.len() > 40, "the types' schemas are there: {}", schemas.len());
    let mut refs = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(r) = m.get("$ref").and_then(|r| r.as_str()) {
                    out.push(r.to_string());
                }
                m.values().for_each(|x| walk(x, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(&doc, &mut refs);
    assert!(refs.len() > 50, "{refs:?}");
    let missing: Vec<&String> = refs
        .iter()
        .filter(|r| r.strip_prefix("#/components/schemas/").is_none_or(|name| !schemas.contains_key(name)))
        .collect();
    assert!(missing.is_empty(), "references to no schema: {missing:?}");
    // The replies the CLI reads are documented by their types.
    for name in ["RunDetail", "NodeHealth", "FleetModeView", "ControlReply", "ApiErrorBody", "StartRun", "Plan"] {
        assert!(schemas.contains_key(name), "no schema {name}");
    }
}
