//! nightshift-sim: the simulated world. A fleet of real agents (the agent
//! crate's request handling on its `sim` backend) and a real engine, joined
//! by in-process transports and driven by one virtual clock, so a 30-minute
//! incident runs in well under a second.
//!
//! - [`fleet`]: [`fleet::SimFleet`], stepping physics, agents and engine tick by tick;
//! - [`scenario`]: scenario files (fleet, timeline, expectations) and their runner;
//! - [`simulate`]: a fault mix played for weeks on a whole fleet under three policies (`nightshift simulate`);
//! - [`workload`]: the scheduler's view of work (pools, drains that do not stop jobs at once).
//!
//! Dependency rule: this crate depends on the engine and the agent; neither
//! depends on it.
#![forbid(unsafe_code)]
// Library code says what went wrong instead of panicking (issue 44): no
// `unwrap`/`expect` outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod backtest;
pub mod fleet;
pub mod recording;
pub mod scenario;
pub mod simulate;
pub mod workload;
