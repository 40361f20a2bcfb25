//! `flush_caches`: drop the OS page cache and tell GPU processes that asked
//! for it to release their cached allocator blocks.
//!
//! A training job registers by writing its pid into a file in the registry
//! folder (e.g. `/run/nightshift/flush.d/<job>.pid`) and installing a signal
//! handler that calls `torch.cuda.empty_cache()`. Stale registrations (the
//! process is gone) are removed.

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::NodeError;
use crate::procs;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlushConfig {
    /// Written with `1` to drop the page cache (needs root).
    #[serde(default = "default_drop_path")]
    pub drop_caches_path: PathBuf,
    /// Folder of pid files of processes to signal.
    #[serde(default = "default_registry")]
    pub registry_dir: PathBuf,
    /// Signal name, e.g. `SIGUSR1`.
    #[serde(default = "default_signal")]
    pub signal: String,
    #[serde(default = "default_sync_timeout")]
    pub sync_timeout_secs: u64,
}

fn default_drop_path() -> PathBuf {
    PathBuf::from("/proc/sys/vm/drop_caches")
}
fn default_registry() -> PathBuf {
    PathBuf::from("/run/nightshift/flush.d")
}
fn default_signal() -> String {
    "SIGUSR1".into()
}
fn default_sync_timeout() -> u64 {
    30
}

impl Default for FlushConfig {
    fn default() -> Self {
        FlushConfig {
            drop_caches_path: default_drop_path(),
            registry_dir: default_registry(),
            signal: default_signal(),
            sync_timeout_secs: default_sync_timeout(),
        }
    }
}

/// What a flush did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlushReport {
    pub page_cache_dropped: bool,
    pub signalled_pids: Vec<i32>,
    pub stale_registrations_removed: Vec<String>,
}

impl FlushConfig {
    /// Check the signal name.
    pub fn signal(&self) -> Result<Signal, String> {
        self.signal.parse::<Signal>().map_err(|_| {
            format!("flush_caches.signal: expected a signal name such as SIGUSR1, found {:?}", self.signal)
        })
    }

    /// Carry out a flush.
    pub async fn flush(&self, drop_page_cache: bool, signal_processes: bool) -> Result<FlushReport, NodeError> {
        let mut report = FlushReport::default();
        if drop_page_cache {
            procs::run(&["sync".to_string()], Duration::from_secs(self.sync_timeout_secs)).await?;
            std::fs::write(&self.drop_caches_path, b"1\n").map_err(|e| {
                NodeError::Io(format!(
                    "cannot drop the page cache through {}: {e} (the agent must run as root)",
                    self.drop_caches_path.display()
                ))
            })?;
            report.page_cache_dropped = true;
        }
        if signal_processes {
            let sig = self.signal().map_err(NodeError::Unexpected)?;
            let entries = match std::fs::read_dir(&self.registry_dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
                Err(e) => return Err(NodeError::Io(format!("cannot read {}: {e}", self.registry_dir.display()))),
            };
            let mut files: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
            files.sort();
            for path in files {
                let Ok(text) = std::fs::read_to_string(&path) else { continue };
                let Ok(pid) = text.trim().parse::<i32>() else { continue };
                if pid <= 1 {
                    continue;
                }
                match kill(Pid::from_raw(pid), sig) {
                    Ok(()) => report.signalled_pids.push(pid),
                    Err(nix::errno::Errno::ESRCH) => {
                        let _ = std::fs::remove_file(&path);
                        report.stale_registrations_removed.push(path.display().to_string());
                    }
                    Err(e) => {
                        return Err(NodeError::Io(format!("cannot signal pid {pid} ({}): {e}", path.display())));
                    }
                }
            }
        }
        Ok(report)
    }
}
