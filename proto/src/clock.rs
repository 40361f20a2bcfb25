//! Time, from one source per process.
//!
//! The engine and the agent read time only through [`Clock`], so the same code
//! runs against the wall clock in production, a sped-up clock in the demo, and
//! a [`VirtualClock`] in scenario tests, where a 30-minute incident takes well
//! under a second.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;

/// A source of time and of sleeping.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch, on this clock.
    fn now_ms(&self) -> i64;
    /// Sleep `ms` of this clock's time, asynchronously.
    fn sleep(&self, ms: u64) -> BoxFuture<'static, ()>;
    /// Sleep on a blocking thread until this clock reads `deadline_ms`,
    /// waking early when `cancel` is set.
    fn sleep_until_blocking(&self, deadline_ms: i64, cancel: &AtomicBool);
    /// Sleep `ms` of this clock's time on a blocking thread.
    fn sleep_blocking(&self, ms: u64, cancel: &AtomicBool) {
        self.sleep_until_blocking(self.now_ms() + ms as i64, cancel)
    }
    /// How many clock milliseconds pass per real millisecond.
    fn scale(&self) -> f64 {
        1.0
    }
    /// Sleepers whose deadline has not come yet (virtual clocks only; a
    /// driver advances time once every worker is such a sleeper).
    fn idle_sleepers(&self) -> usize {
        0
    }
}

/// A shared clock.
pub type SharedClock = Arc<dyn Clock>;

fn wall_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Sleep in short slices so a cancel is noticed within ~20 ms.
fn sliced_sleep(real: Duration, cancel: &AtomicBool) {
    let end = Instant::now() + real;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(20)));
    }
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        wall_ms()
    }
    fn sleep(&self, ms: u64) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(Duration::from_millis(ms)))
    }
    fn sleep_until_blocking(&self, deadline_ms: i64, cancel: &AtomicBool) {
        let ms = (deadline_ms - self.now_ms()).max(0) as u64;
        sliced_sleep(Duration::from_millis(ms), cancel)
    }
}

/// Wall time sped up by a factor: the demo runs minutes of incident in
/// seconds with the same runbooks.
#[derive(Debug, Clone)]
pub struct ScaledClock {
    origin_real: Instant,
    origin_ms: i64,
    scale: f64,
}

impl ScaledClock {
    /// A clock that starts at the current wall time and runs `scale` times
    /// faster (clamped to at least 1).
    pub fn new(scale: f64) -> ScaledClock {
        ScaledClock { origin_real: Instant::now(), origin_ms: wall_ms(), scale: scale.max(1.0) }
    }
}

impl Clock for ScaledClock {
    fn now_ms(&self) -> i64 {
        self.origin_ms + (self.origin_real.elapsed().as_secs_f64() * 1000.0 * self.scale) as i64
    }
    fn sleep(&self, ms: u64) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(Duration::from_secs_f64(ms as f64 / 1000.0 / self.scale)))
    }
    fn sleep_until_blocking(&self, deadline_ms: i64, cancel: &AtomicBool) {
        let ms = (deadline_ms - self.now_ms()).max(0) as f64;
        sliced_sleep(Duration::from_secs_f64(ms / 1000.0 / self.scale), cancel)
    }
    fn scale(&self) -> f64 {
        self.scale
    }
}

/// Time that moves only when told to. Sleepers wake when the clock passes
/// their deadline. [`Clock::idle_sleepers`] counts sleepers not yet due, so a
/// driver can advance time only once every worker is asleep: a sleeper that
/// is due but has not woken yet still counts as busy.
#[derive(Debug, Clone)]
pub struct VirtualClock {
    inner: Arc<VirtualInner>,
}

#[derive(Debug)]
struct VirtualInner {
    now: AtomicI64,
    tx: tokio::sync::watch::Sender<i64>,
    /// Deadlines of current sleepers.
    sleepers: Mutex<Vec<i64>>,
    cv: Condvar,
}

impl VirtualClock {
    /// A clock stopped at `start_ms`.
    pub fn new(start_ms: i64) -> VirtualClock {
        let (tx, _rx) = tokio::sync::watch::channel(start_ms);
        VirtualClock {
            inner: Arc::new(VirtualInner {
                now: AtomicI64::new(start_ms),
                tx,
                sleepers: Mutex::new(Vec::new()),
                cv: Condvar::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<i64>> {
        self.inner.sleepers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Move time to `t_ms` (never backwards) and wake whoever is due.
    pub fn advance_to(&self, t_ms: i64) {
        let _guard = self.lock();
        let now = self.inner.now.load(Ordering::SeqCst);
        if t_ms > now {
            self.inner.now.store(t_ms, Ordering::SeqCst);
        }
        self.inner.tx.send_replace(self.inner.now.load(Ordering::SeqCst));
        self.inner.cv.notify_all();
    }

    /// Move time forward by `ms`.
    pub fn advance(&self, ms: i64) {
        self.advance_to(self.now_ms() + ms);
    }

    /// Wake blocking sleepers so they re-check their cancel flags.
    pub fn poke(&self) {
        let _guard = self.lock();
        self.inner.cv.notify_all();
    }

    /// How many sleeps are waiting on this clock right now (due or not).
    pub fn sleepers(&self) -> usize {
        self.lock().len()
    }

    /// The earliest deadline among sleepers not yet due.
    pub fn next_deadline(&self) -> Option<i64> {
        let now = self.now_ms();
        self.lock().iter().copied().filter(|d| *d > now).min()
    }
}

fn remove_one(v: &mut Vec<i64>, deadline: i64) {
    if let Some(i) = v.iter().position(|d| *d == deadline) {
        v.swap_remove(i);
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> i64 {
        self.inner.now.load(Ordering::SeqCst)
    }

    fn sleep(&self, ms: u64) -> BoxFuture<'static, ()> {
        let deadline = self.now_ms() + ms as i64;
        let me = self.clone();
        Box::pin(async move {
            if ms == 0 {
                return;
            }
            let mut rx = me.inner.tx.subscribe();
            me.lock().push(deadline);
            let _ = rx.wait_for(|t| *t >= deadline).await;
            remove_one(&mut me.lock(), deadline);
        })
    }

    fn sleep_until_blocking(&self, deadline_ms: i64, cancel: &AtomicBool) {
        let mut sleepers = self.lock();
        if self.inner.now.load(Ordering::SeqCst) >= deadline_ms {
            return;
        }
        sleepers.push(deadline_ms);
        while self.inner.now.load(Ordering::SeqCst) < deadline_ms && !cancel.load(Ordering::Relaxed) {
            sleepers = self.inner.cv.wait(sleepers).unwrap_or_else(|e| e.into_inner());
        }
        remove_one(&mut sleepers, deadline_ms);
    }

    fn idle_sleepers(&self) -> usize {
        let sleepers = self.lock();
        let now = self.inner.now.load(Ordering::SeqCst);
        sleepers.iter().filter(|d| **d > now).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_wakes_blocking_sleepers_only_when_due() {
        let clock = VirtualClock::new(1_000);
        let c2 = clock.clone();
        let t = std::thread::spawn(move || {
            c2.sleep_blocking(5_000, &AtomicBool::new(false));
            c2.now_ms()
        });
        while clock.sleepers() == 0 {
            std::thread::yield_now();
        }
        clock.advance(4_000);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(clock.sleepers(), 1, "woke before the deadline");
        assert_eq!(clock.idle_sleepers(), 1);
        assert_eq!(clock.next_deadline(), Some(6_000));
        clock.advance(1_000);
        assert_eq!(t.join().unwrap(), 6_000);
        assert_eq!(clock.sleepers(), 0);
    }

    #[tokio::test]
    async fn virtual_clock_wakes_async_sleepers() {
        let clock = VirtualClock::new(0);
        let sleep = clock.sleep(10_000);
        let handle = tokio::spawn(sleep);
        while clock.sleepers() == 0 {
            tokio::task::yield_now().await;
        }
        clock.advance_to(10_000);
        handle.await.unwrap();
        assert_eq!(clock.now_ms(), 10_000);
    }

    #[test]
    fn virtual_clock_never_goes_backwards() {
        let clock = VirtualClock::new(50);
        clock.advance_to(10);
        assert_eq!(clock.now_ms(), 50);
    }

    #[test]
    fn scaled_clock_runs_faster() {
        let clock = ScaledClock::new(100.0);
        let a = clock.now_ms();
        std::thread::sleep(Duration::from_millis(20));
        assert!(clock.now_ms() - a >= 1_900);
    }
}
