//! The cross-process tests, in one binary (issue 44: one link instead of
//! twenty-eight). Each module was its own test binary before and still runs
//! alone: every test takes `nightshift_tests::serial::module` first, so the
//! modules take turns (their tests start real services and processes) while
//! the tests of one module run together. Run one module with
//! `cargo test -p nightshift-tests --test it MODULE::`.

mod agent_faults;
mod agent_flood;
mod agent_ssh;
mod alertmanager;
mod alertmanager_pages;
mod architecture;
mod audit_damage;
mod audit_kill;
mod audit_pg;
mod backtest;
mod browser;
mod deployment;
mod engine_ssh;
mod exporter_flood;
mod ha_failover;
mod ha_forward;
mod ha_frozen_leader;
mod ha_lease;
mod ha_slow_db;
mod job_textfile;
mod notify;
mod operations;
mod pg_tls;
mod prometheus;
mod restart_mitigation;
mod shadow;
mod slurm;
mod storm;
