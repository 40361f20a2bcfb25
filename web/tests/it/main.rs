//! The web crate's integration tests, in one binary (issue 44: one link
//! instead of three); run one with `cargo test -p nightshift-web --test it
//! MODULE::`.

mod openapi;
mod router;
mod sse;
