//! Drain-reason ownership: nightshift writes `nightshift: <run> <why>` on
//! every drain it makes and only ever resumes drains carrying that prefix,
//! so a drain set by a person is never undone (the convention Slurm's node
//! health checkers use).

/// The reason prefix nightshift writes on every drain it makes. A drain
/// whose reason lacks it belongs to a person and is never undone.
pub const OWNER_PREFIX: &str = "nightshift:";

/// Whether a drain reason is nightshift's own.
pub fn owned_by_nightshift(reason: Option<&str>) -> bool {
    reason.is_some_and(|r| r.trim_start().starts_with(OWNER_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_prefix_makes_a_drain_ours() {
        let cases = [
            (Some("nightshift: r1 hot"), true),
            (Some("  nightshift: r1"), true),
            (Some("fan swap by dave"), false),
            (Some("by nightshift: r1"), false),
            (Some(""), false),
            (None, false),
        ];
        for (reason, ours) in cases {
            assert_eq!(owned_by_nightshift(reason), ours, "{reason:?}");
        }
    }
}
