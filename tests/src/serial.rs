//! One module's tests at a time in the one integration binary
//! (`tests/tests/it/main.rs`, issue 44). The modules start real services
//! and processes — Prometheus, Alertmanager, Slurm, PostgreSQL, kill loops,
//! floods — and were written to run one binary at a time; in one binary
//! libtest would run two modules' tests at once. Every test takes
//! [`module`] first: tests of the same module still run together (as they
//! did in their own binary), a test of another module waits until the
//! running module's tests have ended. A test that panics releases its turn
//! as it unwinds.

use std::sync::{Condvar, Mutex, MutexGuard};

/// The module whose tests run now, and how many of them.
static TURN: Mutex<(Option<&'static str>, usize)> = Mutex::new((None, 0));
static ENDED: Condvar = Condvar::new();

fn turn() -> MutexGuard<'static, (Option<&'static str>, usize)> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// A test's turn: held for the test's whole body.
#[must_use = "the turn ends when this is dropped: bind it (`let _serial = …`)"]
pub struct Turn {
    _private: (),
}

/// Wait for `module`'s turn (pass `module_path!()`).
pub fn module(module: &'static str) -> Turn {
    let mut t = turn();
    while t.0.is_some_and(|m| m != module) {
        t = ENDED.wait(t).unwrap_or_else(|e| e.into_inner());
    }
    t.0 = Some(module);
    t.1 += 1;
    Turn { _private: () }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut t = turn();
        t.1 = t.1.saturating_sub(1);
        if t.1 == 0 {
            t.0 = None;
            ENDED.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Two tests of module a run together; b's test waits until both
    /// ended, then runs alone.
    #[test]
    fn modules_take_turns_and_a_modules_tests_share_one() {
        let running = Arc::new(AtomicUsize::new(0));
        let (a1, a2) = (module("t::a"), module("t::a"));
        running.fetch_add(2, Ordering::SeqCst);
        let seen = Arc::new(AtomicUsize::new(usize::MAX));
        let b = {
            let (running, seen) = (running.clone(), seen.clone());
            std::thread::spawn(move || {
                let _turn = module("t::b");
                seen.store(running.load(Ordering::SeqCst), Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(seen.load(Ordering::SeqCst), usize::MAX, "b waits while a runs");
        running.fetch_sub(1, Ordering::SeqCst);
        drop(a1);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(seen.load(Ordering::SeqCst), usize::MAX, "b waits for a's last test");
        running.fetch_sub(1, Ordering::SeqCst);
        drop(a2);
        b.join().unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 0, "b ran once a's tests had ended");
    }
}
