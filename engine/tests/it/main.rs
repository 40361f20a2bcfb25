//! The engine crate's integration tests, in one binary (issue 44); run one
//! with `cargo test -p nightshift-engine --test it MODULE::`.

mod manifests;
mod shipped_approvals;
