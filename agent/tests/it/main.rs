//! The agent crate's integration tests, in one binary (issue 44: one link
//! instead of seven); run one with `cargo test -p nightshift-agent --test it
//! MODULE::`. The fake NVML library (`../fake_nvml`) is loaded in-process by
//! `nvml_fake` alone; `gpu_check` runs it in child processes.

mod crash_points;
mod full_disk;
mod gpu_check;
mod holds;
mod leader_term;
mod nvml_fake;
mod syncs;
