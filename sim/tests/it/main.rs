//! The simulator crate's integration tests, in one binary (issue 44: one
//! link instead of twelve). Each module was its own test binary before;
//! run one with `cargo test -p nightshift-sim --test it MODULE::`.

mod common;

mod autoscaler;
mod backtest_shards;
mod determinism;
mod executor;
mod fuzz_inputs;
mod handbook;
mod lifecycle;
mod pages;
mod recovery;
mod sandbox;
mod scenario_fixtures;
mod simulate;
