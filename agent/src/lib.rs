//! nightshift-agent: the node agent. It exposes safe hardware and node
//! actions over SSH and refuses anything outside its own safety envelope,
//! whatever the engine asks.
//!
//! - [`proto`]: the wire protocol (types only).
//! - [`backend`]: hardware behind one trait — `sim`, `nvml`, `rocm`.
//! - [`envelope`]: the policy file and every bound and rate limit.
//! - [`node`]: drain/resume through the scheduler, cache flushes, config files.
//! - [`service`]: request handling, idempotency, dry runs, leases.
//! - [`ssh`]: the server, keys, and the client the engine uses.
//! - [`clock`]: the one source of time.
#![cfg_attr(not(feature = "rocm"), forbid(unsafe_code))]

pub mod backend;
pub mod clock;
pub mod config;
pub mod envelope;
pub mod exporter;
pub mod fsutil;
pub mod journal;
pub mod node;
pub mod procs;
pub mod proto;
pub mod runtime;
pub mod service;
pub mod ssh;
