//! Host readings for any backend: CPU utilisation from `/proc/stat` (the
//! share of non-idle time between two reads). H9 ("98 % CPU, 15 % GPU")
//! needs it on real nodes, where no GPU library reports it.

use std::path::PathBuf;
use std::sync::Mutex;

/// CPU utilisation between successive calls.
#[derive(Debug)]
pub struct HostStats {
    stat_path: PathBuf,
    last: Mutex<Option<(u64, u64)>>,
}

impl Default for HostStats {
    fn default() -> Self {
        HostStats::new(PathBuf::from("/proc/stat"))
    }
}

impl HostStats {
    pub fn new(stat_path: PathBuf) -> HostStats {
        HostStats { stat_path, last: Mutex::new(None) }
    }

    /// Percent busy since the previous call; `None` on the first call or
    /// where `/proc/stat` cannot be read.
    pub fn cpu_util_pct(&self) -> Option<f64> {
        let text = std::fs::read_to_string(&self.stat_path).ok()?;
        let (total, idle) = parse_cpu_line(&text)?;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let prev = last.replace((total, idle))?;
        let dt = total.checked_sub(prev.0)?;
        let di = idle.checked_sub(prev.1)?;
        if dt == 0 {
            return None;
        }
        Some(((1.0 - di as f64 / dt as f64) * 100.0).clamp(0.0, 100.0))
    }
}

/// `(total, idle)` jiffies from the aggregate `cpu` line: idle counts
/// `idle` and `iowait`; guest time is already inside user time.
fn parse_cpu_line(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    let total = v.iter().try_fold(0u64, |a, x| a.checked_add(*x))?;
    Some((total, v[3].checked_add(v[4])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_share_between_two_reads() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("stat");
        std::fs::write(&p, "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n").unwrap();
        let h = HostStats::new(p.clone());
        assert_eq!(h.cpu_util_pct(), None, "one read has no interval");
        // +300 busy, +100 idle of +400: 75 %.
        std::fs::write(&p, "cpu  300 0 200 750 150 0 0 0 0 0\n").unwrap();
        assert_eq!(h.cpu_util_pct(), Some(75.0));
        std::fs::write(&p, "cpu  garbage\n").unwrap();
        assert_eq!(h.cpu_util_pct(), None);
        assert_eq!(parse_cpu_line("intr 1 2 3\n"), None);
    }

    #[test]
    fn this_machine_has_a_reading() {
        let h = HostStats::default();
        h.cpu_util_pct();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let v = h.cpu_util_pct();
        assert!(v.is_none_or(|v| (0.0..=100.0).contains(&v)), "{v:?}");
    }
}
