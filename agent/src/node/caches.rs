//! `flush_caches`: drop the OS page cache and tell GPU processes that asked
//! for it to release their cached allocator blocks.
//!
//! A training job registers by writing its pid into a file in the registry
//! folder (e.g. `/run/nightshift/flush.d/<job>.pid`) and installing a signal
//! handler that calls `torch.cuda.empty_cache()`. Stale registrations (the
//! process is gone) are removed.
//!
//! The folder is writable by job users by design, so a pid file is a claim,
//! not a proof: a process is signalled only if it owns its pid file (same
//! uid), has a handler installed for the signal (`SigCgt` in
//! `/proc/<pid>/status`: the signal's default action, terminate, cannot
//! happen) and holds a GPU device open (`/proc/<pid>/fd`). Anything else is
//! skipped and reported. The folder must be sticky if others can write it
//! (mode 1733 or 1777: nobody removes another's file); [`FlushConfig::check`]
//! refuses it otherwise.

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
    /// A registered process must hold one of these open (a path prefix of
    /// one of its descriptors' targets).
    #[serde(default = "default_gpu_devices")]
    pub gpu_device_prefixes: Vec<PathBuf>,
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
fn default_gpu_devices() -> Vec<PathBuf> {
    ["/dev/nvidia", "/dev/dri/", "/dev/kfd"].into_iter().map(PathBuf::from).collect()
}

impl Default for FlushConfig {
    fn default() -> Self {
        FlushConfig {
            drop_caches_path: default_drop_path(),
            registry_dir: default_registry(),
            signal: default_signal(),
            sync_timeout_secs: default_sync_timeout(),
            gpu_device_prefixes: default_gpu_devices(),
        }
    }
}

/// What a flush did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlushReport {
    pub page_cache_dropped: bool,
    pub signalled_pids: Vec<i32>,
    pub stale_registrations_removed: Vec<String>,
    /// Registered pids not signalled, each with why.
    #[serde(default)]
    pub skipped: Vec<String>,
}

impl FlushConfig {
    /// Check the signal name.
    pub fn signal(&self) -> Result<Signal, String> {
        self.signal.parse::<Signal>().map_err(|_| {
            format!("flush_caches.signal: expected a signal name such as SIGUSR1, found {:?}", self.signal)
        })
    }

    /// The registry folder, if it exists, is not writable by others without
    /// the sticky bit (anyone could remove or replace another's pid file).
    pub fn check(&self) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let Ok(m) = std::fs::metadata(&self.registry_dir) else { return Ok(()) };
        let mode = m.permissions().mode();
        if mode & 0o002 != 0 && mode & 0o1000 == 0 {
            return Err(format!(
                "flush_caches.registry_dir {}: expected mode 1733 or 1777 (sticky) when others may write it, found {:o}",
                self.registry_dir.display(),
                mode & 0o7777
            ));
        }
        Ok(())
    }

    /// Why `pid` (registered by the file at `path`) must not be signalled
    /// with `sig`, if it must not.
    fn refuse(&self, pid: i32, path: &std::path::Path, sig: Signal) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let (Ok(file), Ok(process)) = (std::fs::metadata(path), std::fs::metadata(&proc_dir)) else {
            return None; // gone: the signal finds it stale
        };
        if file.uid() != process.uid() {
            return Some(format!(
                "pid {pid}: its pid file {} belongs to uid {}, the process to uid {}",
                path.display(),
                file.uid(),
                process.uid()
            ));
        }
        let status = std::fs::read_to_string(proc_dir.join("status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
            .is_some_and(|mask| mask & (1u64 << (sig as i32 - 1)) != 0);
        if !caught {
            return Some(format!("pid {pid}: no handler for {sig:?} installed (its default action would end it)"));
        }
        // A prefix of the target's text: `/dev/nvidia` covers `/dev/nvidia0`.
        let holds_gpu = std::fs::read_dir(proc_dir.join("fd")).into_iter().flatten().filter_map(Result::ok).any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|t| {
                let t = t.to_string_lossy();
                self.gpu_device_prefixes.iter().any(|p| t.starts_with(&*p.to_string_lossy()))
            })
        });
        if !holds_gpu {
            return Some(format!("pid {pid}: holds no GPU device open"));
        }
        None
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
                if let Some(why) = self.refuse(pid, &path, sig) {
                    tracing::warn!(registration = %path.display(), why = %why, "flush: not signalled");
                    report.skipped.push(why);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};

    /// A process that ignores SIGUSR1 (handler installed) or not, holding
    /// `hold` open.
    fn job(handler: bool, hold: &std::path::Path) -> Option<Child> {
        let py = format!(
            "import signal,time\nf=open({:?})\n{}\ntime.sleep(30)\n",
            hold.display().to_string(),
            if handler { "signal.signal(signal.SIGUSR1, lambda *a: None)" } else { "pass" }
        );
        let child = Command::new("python3").args(["-c", &py]).spawn().ok()?;
        // Until the handler (and the open file) are in place.
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < end {
            let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
            let fds = std::fs::read_dir(format!("/proc/{}/fd", child.id())).map(|d| d.count()).unwrap_or(0);
            let caught = status
                .lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
                .is_some_and(|m| m & (1 << (Signal::SIGUSR1 as i32 - 1)) != 0);
            if fds > 3 && (caught || !handler) {
                std::thread::sleep(Duration::from_millis(100));
                return Some(child);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn alive(c: &mut Child) -> bool {
        c.try_wait().ok().flatten().is_none()
    }

    /// Regression (issue 27 item 6: every pid in the registry got SIGUSR1
    /// from a root agent; a root process was killed): only a process that
    /// owns its pid file, handles the signal and holds a GPU device open is
    /// signalled; the others are skipped, named, and stay alive.
    #[tokio::test]
    async fn only_registered_gpu_processes_that_handle_the_signal_are_signalled() {
        if Command::new("python3").arg("-c").arg("pass").status().is_err() {
            eprintln!("caches: no python3 here: nothing checked");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let registry = dir.path().join("flush.d");
        std::fs::create_dir_all(&registry).unwrap();
        let device = dir.path().join("nvidia0");
        std::fs::write(&device, b"").unwrap();
        let other = dir.path().join("not-a-gpu");
        std::fs::write(&other, b"").unwrap();
        let cfg = FlushConfig {
            registry_dir: registry.clone(),
            gpu_device_prefixes: vec![dir.path().join("nvidia")],
            ..FlushConfig::default()
        };
        let (Some(mut good), Some(mut no_handler), Some(mut no_gpu)) =
            (job(true, &device), job(false, &device), job(true, &other))
        else {
            panic!("the test jobs did not start");
        };
        for (name, c) in [("good", &good), ("no-handler", &no_handler), ("no-gpu", &no_gpu)] {
            std::fs::write(registry.join(format!("{name}.pid")), c.id().to_string()).unwrap();
        }
        let r = cfg.flush(false, true).await.unwrap();
        assert_eq!(r.signalled_pids, vec![good.id() as i32], "{r:?}");
        assert_eq!(r.skipped.len(), 2, "{r:?}");
        assert!(r.skipped.iter().any(|s| s.contains("no handler for SIGUSR1")), "{r:?}");
        assert!(r.skipped.iter().any(|s| s.contains("holds no GPU device open")), "{r:?}");
        std::thread::sleep(Duration::from_millis(200));
        assert!(alive(&mut good) && alive(&mut no_handler) && alive(&mut no_gpu), "nobody was killed");
        // A pid file that is not the process's own (another uid wrote it).
        let root =
            std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap_or(false);
        if root {
            let forged = registry.join("forged.pid");
            std::fs::write(&forged, good.id().to_string()).unwrap();
            std::os::unix::fs::chown(&forged, Some(65534), None).unwrap();
            for f in ["good", "no-handler", "no-gpu"] {
                std::fs::remove_file(registry.join(format!("{f}.pid"))).unwrap();
            }
            let r = cfg.flush(false, true).await.unwrap();
            assert!(r.signalled_pids.is_empty(), "{r:?}");
            assert!(r.skipped[0].contains("belongs to uid 65534"), "{r:?}");
        }
        for c in [&mut good, &mut no_handler, &mut no_gpu] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    #[test]
    fn a_registry_others_may_write_must_be_sticky() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cfg = FlushConfig { registry_dir: dir.path().to_path_buf(), ..FlushConfig::default() };
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(cfg.check().unwrap_err().contains("expected mode 1733 or 1777 (sticky)"));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(cfg.check(), Ok(()));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(cfg.check(), Ok(()));
    }
}
