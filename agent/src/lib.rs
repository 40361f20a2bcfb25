//! nightshift-agent: the node agent. It exposes safe hardware and node
//! actions over SSH and refuses anything outside its own safety envelope,
//! whatever the engine asks.
//!
//! - [`backend`]: hardware behind one trait — `sim`, `nvml`, `rocm`.
//! - [`envelope`]: the policy file and every bound and rate limit.
//! - [`node`]: drain/resume through the scheduler, cache flushes, config files.
//! - [`holds`]: every change is a hold: owned, leased, persisted, restored.
//! - [`service`]: request handling, idempotency, dry runs, the hold pipeline.
//! - [`journal`]: applied request ids, so none is applied twice.
//! - [`statelog`]: the one append-only log all of that state lives in.
//! - [`ssh`]: the SSH server; [`local`]: the same service in-process.
//! - [`exporter`]: dcgm-exporter-compatible `/metrics`.
//! - [`config`], [`runtime`]: agent.yaml → validate → build → run.
//!
//! The wire protocol, the clock, keys and the engine's client are in
//! `nightshift-proto`.
#![cfg_attr(not(feature = "rocm"), forbid(unsafe_code))]
// Library code says what went wrong instead of panicking (issue 44): no
// `unwrap`/`expect` outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod backend;
pub mod config;
pub mod envelope;
pub mod evidence;
pub mod exporter;
pub mod holds;
pub mod journal;
pub mod local;
pub mod node;
pub mod probe;
pub mod procs;
pub mod runtime;
pub mod service;
pub mod ssh;
pub mod statelog;

pub use local::LocalAgent;
