//! nightshift-proto: what the engine, the web server and the CLI need of an
//! agent, without the node daemon.
//!
//! - the wire protocol (types only): [`Request`], [`Op`], [`Reply`],
//!   [`ErrorCode`], [`Telemetry`], [`Inventory`] — re-exported from [`wire`];
//! - [`clock`]: the one source of time (wall, scaled, virtual);
//! - [`exposition`]: the Prometheus text format, read and written once;
//! - [`ssh`]: the client the engine uses to reach agents, and Ed25519 keys;
//! - [`owner`]: which drains are nightshift's own (a person's are never undone);
//! - [`yaml`]: YAML error locations for every config and manifest loader;
//! - [`fsutil`]: atomic file replacement.
//!
//! Dependency rule (checked by `tests/tests/it/architecture.rs`): the engine
//! depends on this crate and never on `nightshift-agent`.
#![forbid(unsafe_code)]
// Library code says what went wrong instead of panicking (issue 44): no
// `unwrap`/`expect` outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod clock;
pub mod exposition;
pub mod fsutil;
pub mod json;
pub mod names;
pub mod owner;
pub mod params;
pub mod ssh;
pub mod wire;
pub mod yaml;

pub use wire::*;
