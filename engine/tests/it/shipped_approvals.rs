//! Every approval rule a shipped runbook carries, checked as admission
//! decides it (issue 30: none of the shipped rules could ever apply). A
//! runbook that gains a rule without a row here fails the test.

use std::collections::BTreeMap;
use std::path::Path;

use nightshift_engine::embed::load_dir;
use nightshift_engine::embed::{ScriptLimits, build_engine};
use nightshift_engine::embed::{approval_reason, nodes_changed};

#[test]
fn each_shipped_approval_rule_asks_when_it_should_and_only_then() {
    let engine = build_engine(&ScriptLimits::default());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let mut runbooks = Vec::new();
    for dir in [root.clone(), root.join("alerts")] {
        let set = load_dir(&dir, &engine);
        assert!(set.errors.is_empty(), "{}: {:?}", dir.display(), set.errors);
        runbooks.extend(set.runbooks);
    }
    // (runbook, params set, nodes in the group, wants approval)
    type Row = (&'static str, &'static [(&'static str, &'static str)], usize, Option<&'static str>);
    let table: &[Row] = &[
        ("pool-scale-in", &[], 16, None),
        ("pool-scale-in", &[("nodes_per_step", "1")], 16, None),
        ("pool-scale-in", &[("nodes_per_step", "2")], 16, Some("changes up to 2 nodes (approval above 1)")),
        ("pool-scale-in", &[("nodes_per_step", "9")], 16, Some("changes up to 4 nodes (approval above 1)")),
    ];
    for rb in &runbooks {
        let m = &rb.manifest;
        if m.approval.always || m.approval.above_nodes.is_some() {
            assert!(
                table.iter().any(|(n, ..)| *n == m.name),
                "{} carries an approval rule with no row in this test",
                m.name
            );
        }
    }
    for (name, set, group, want) in table {
        let rb = runbooks.iter().find(|r| r.manifest.name == *name).unwrap_or_else(|| panic!("{name} is shipped"));
        let overrides: BTreeMap<String, String> = set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let params = rb.manifest.resolve_params(&overrides).unwrap();
        let got = approval_reason(&rb.manifest, nodes_changed(&rb.manifest, *group, &params));
        assert_eq!(got.as_deref(), *want, "{name} with {set:?} on {group} nodes");
    }
}
