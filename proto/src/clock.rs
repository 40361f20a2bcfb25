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
    /// Serial clocks only (a simulation that must be deterministic): take a
    /// place in the turn order for `key` (a run's number) before its thread
    /// starts. Runs then execute one at a time, in key order, between
    /// their sleeps.
    fn turn_reserve(&self, _key: u64) {}
    /// On the run's thread: wait for its turn (`turn_reserve` first).
    fn turn_enter(&self, _key: u64) {}
    /// When run `key` is done (on any thread): give its turn up.
    fn turn_leave(&self, _key: u64) {}
    /// A seed for ids that must repeat from run to run of a deterministic
    /// simulation (each call a new one); `None` elsewhere (ids are random).
    fn id_seed(&self) -> Option<u64> {
        None
    }
}

thread_local! {
    /// The turn key of the run this thread executes (serial clocks).
    static TURN_KEY: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
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

    /// A clock `scale` times faster than wall time since `origin_ms` (Unix
    /// ms): every process given the same origin and scale reads the same
    /// time, whenever it started — an engine restarted beside agents that
    /// were not goes on from their time, as a real one does.
    pub fn anchored(scale: f64, origin_ms: i64) -> ScaledClock {
        let scale = scale.max(1.0);
        let since = wall_ms().saturating_sub(origin_ms).max(0) as f64;
        ScaledClock { origin_real: Instant::now(), origin_ms: origin_ms.saturating_add((since * scale) as i64), scale }
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
    /// Current sleepers, and whose turn it is.
    sleepers: Mutex<Sleepers>,
    cv: Condvar,
    /// Runs take turns (deterministic simulations).
    serial: AtomicBool,
    seeds: std::sync::atomic::AtomicU64,
}

/// Who sleeps until when, and whose turn it is.
#[derive(Debug, Default)]
struct Sleepers {
    /// Deadlines, with the turn key of a run that sleeps (serial clocks).
    deadlines: Vec<(i64, Option<u64>)>,
    /// The run that has the turn.
    holder: Option<u64>,
    /// Runs waiting for the turn (and reserved ones not yet started).
    waiting: std::collections::BTreeSet<u64>,
}

impl Sleepers {
    /// Whether `key` may take the turn now: nobody has it, `key` is the
    /// lowest waiting, and no run whose sleep is over is still on its way
    /// to the waiting set (it could have a lower key).
    fn may_take(&self, key: u64, now: i64) -> bool {
        self.holder.is_none()
            && self.waiting.first() == Some(&key)
            && !self.deadlines.iter().any(|(d, k)| k.is_some() && *d <= now)
    }
}

impl VirtualClock {
    /// A clock stopped at `start_ms`.
    pub fn new(start_ms: i64) -> VirtualClock {
        let (tx, _rx) = tokio::sync::watch::channel(start_ms);
        VirtualClock {
            inner: Arc::new(VirtualInner {
                now: AtomicI64::new(start_ms),
                tx,
                sleepers: Mutex::new(Sleepers::default()),
                cv: Condvar::new(),
                serial: AtomicBool::new(false),
                seeds: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// A clock whose runs take turns, one at a time in run order between
    /// their sleeps, and whose ids come from `seed`: the same simulation
    /// gives the same result, byte for byte.
    pub fn serial(start_ms: i64, seed: u64) -> VirtualClock {
        let c = VirtualClock::new(start_ms);
        c.inner.serial.store(true, Ordering::SeqCst);
        c.inner.seeds.store(seed, Ordering::SeqCst);
        c
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sleepers> {
        self.inner.sleepers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_serial(&self) -> bool {
        self.inner.serial.load(Ordering::SeqCst)
    }

    /// Wait (holding the lock) until `key` may take the turn, and take it.
    fn take_turn<'a>(
        &'a self,
        mut g: std::sync::MutexGuard<'a, Sleepers>,
        key: u64,
    ) -> std::sync::MutexGuard<'a, Sleepers> {
        g.waiting.insert(key);
        // This thread's state changed (a due sleeper that left the sleepers
        // may be what another waiter waited for): tell them.
        self.inner.cv.notify_all();
        while !g.may_take(key, self.inner.now.load(Ordering::SeqCst)) {
            g = self.inner.cv.wait(g).unwrap_or_else(|e| e.into_inner());
            // Still waiting: still in line. Two runs of one key (an engine
            // that died with a run its successor started again) share one
            // place, and the one that leaves takes it out of the set.
            g.waiting.insert(key);
        }
        g.waiting.remove(&key);
        g.holder = Some(key);
        g
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

    /// Serial clocks: (who has the turn, who waits for it, sleeping runs
    /// with their deadlines) — for a stuck simulation's report.
    pub fn turns(&self) -> (Option<u64>, Vec<u64>, Vec<(i64, u64)>) {
        let g = self.lock();
        (
            g.holder,
            g.waiting.iter().copied().collect(),
            g.deadlines.iter().filter_map(|(d, k)| k.map(|k| (*d, k))).collect(),
        )
    }

    /// How many sleeps are waiting on this clock right now (due or not).
    pub fn sleepers(&self) -> usize {
        self.lock().deadlines.len()
    }

    /// The earliest deadline, when the clock is quiet: nobody holds or
    /// waits for a turn, somebody sleeps, and no sleeper is due — read
    /// under one lock, so a driver that advances to it never overtakes a
    /// run that has just woken (reading [`VirtualClock::turns`] and
    /// [`Clock::idle_sleepers`] one after the other can: the run wakes,
    /// takes its turn and gives it back to sleep between the two reads).
    pub fn quiet_until(&self) -> Option<i64> {
        let g = self.lock();
        let now = self.inner.now.load(Ordering::SeqCst);
        if g.holder.is_some() || !g.waiting.is_empty() || g.deadlines.iter().any(|(d, _)| *d <= now) {
            return None;
        }
        g.deadlines.iter().map(|(d, _)| *d).min()
    }

    /// The earliest deadline among sleepers not yet due.
    pub fn next_deadline(&self) -> Option<i64> {
        let now = self.now_ms();
        self.lock().deadlines.iter().map(|(d, _)| *d).filter(|d| *d > now).min()
    }
}

fn remove_one(v: &mut Vec<(i64, Option<u64>)>, deadline: i64, key: Option<u64>) {
    if let Some(i) = v.iter().position(|d| *d == (deadline, key)) {
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
            me.lock().deadlines.push((deadline, None));
            let _ = rx.wait_for(|t| *t >= deadline).await;
            remove_one(&mut me.lock().deadlines, deadline, None);
        })
    }

    fn sleep_until_blocking(&self, deadline_ms: i64, cancel: &AtomicBool) {
        let mut g = self.lock();
        if self.inner.now.load(Ordering::SeqCst) >= deadline_ms {
            return;
        }
        // A run holding the turn gives it up while it sleeps, and waits for
        // it again (in key order) when it wakes.
        let key = if self.is_serial() { TURN_KEY.with(|k| k.get()) } else { None };
        if key.is_some() && g.holder == key {
            g.holder = None;
        }
        g.deadlines.push((deadline_ms, key));
        self.inner.cv.notify_all();
        while self.inner.now.load(Ordering::SeqCst) < deadline_ms && !cancel.load(Ordering::Relaxed) {
            g = self.inner.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        remove_one(&mut g.deadlines, deadline_ms, key);
        if let Some(k) = key {
            g = self.take_turn(g, k);
        }
        drop(g);
    }

    fn idle_sleepers(&self) -> usize {
        let g = self.lock();
        let now = self.inner.now.load(Ordering::SeqCst);
        g.deadlines.iter().filter(|(d, _)| *d > now).count()
    }

    fn turn_reserve(&self, key: u64) {
        if self.is_serial() {
            self.lock().waiting.insert(key);
        }
    }

    fn turn_enter(&self, key: u64) {
        if !self.is_serial() {
            return;
        }
        TURN_KEY.with(|k| k.set(Some(key)));
        let g = self.lock();
        drop(self.take_turn(g, key));
    }

    fn turn_leave(&self, key: u64) {
        if !self.is_serial() {
            return;
        }
        TURN_KEY.with(|k| {
            if k.get() == Some(key) {
                k.set(None)
            }
        });
        let mut g = self.lock();
        if g.holder == Some(key) {
            g.holder = None;
        }
        g.waiting.remove(&key);
        self.inner.cv.notify_all();
    }

    fn id_seed(&self) -> Option<u64> {
        self.is_serial().then(|| self.inner.seeds.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::SeqCst))
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

    /// Three runs started in reverse order on a serial clock: each step
    /// between sleeps happens in key order, whatever the threads do.
    #[test]
    fn serial_clock_gives_turns_in_key_order() {
        let clock = VirtualClock::serial(0, 7);
        let log = Arc::new(Mutex::new(Vec::new()));
        for key in [1, 2, 3] {
            clock.turn_reserve(key);
        }
        let mut threads = Vec::new();
        for key in [3u64, 2, 1] {
            let (c, log) = (clock.clone(), log.clone());
            threads.push(std::thread::spawn(move || {
                c.turn_enter(key);
                for step in 0..3 {
                    log.lock().unwrap().push((c.now_ms(), key, step));
                    // Unequal sleeps: the wakers at one instant still go in
                    // key order.
                    c.sleep_blocking(1_000 * (1 + (key % 2)), &AtomicBool::new(false));
                }
                c.turn_leave(key);
            }));
            // Give the higher keys every chance to go first.
            std::thread::sleep(Duration::from_millis(5));
        }
        while !threads.iter().all(|t| t.is_finished()) {
            // Everyone asleep and nobody due (a due sleeper on its way back to
            // the turnstile must go first): time moves on. One read under
            // one lock (three reads let a run wake, log and sleep between
            // them, and time moved past its step: a CI failure, 1 in 300).
            if let Some(next) = clock.quiet_until() {
                clock.advance_to(next);
            }
            std::thread::yield_now();
        }
        for t in threads {
            t.join().unwrap();
        }
        let got = log.lock().unwrap().clone();
        let mut want = got.clone();
        want.sort();
        assert_eq!(got, want, "steps ran out of (time, key) order");
        assert_eq!(got[..3].iter().map(|x| x.1).collect::<Vec<_>>(), [1, 2, 3]);
        // Seeded ids: the same seed gives the same sequence.
        let a = VirtualClock::serial(0, 7);
        let b = VirtualClock::serial(0, 7);
        assert_eq!([a.id_seed(), a.id_seed()], [b.id_seed(), b.id_seed()]);
        assert_eq!(VirtualClock::new(0).id_seed(), None);
    }

    /// Regression (a CI hang): two runs with one turn key — a dead
    /// engine's run and the same run started again by its successor. The
    /// first left while the second waited, taking the shared key out of
    /// line: the second waited for good (and the runtime's drop with it).
    #[test]
    fn a_run_sharing_a_key_with_one_that_left_still_gets_its_turn() {
        let clock = VirtualClock::serial(0, 7);
        clock.turn_reserve(2);
        clock.turn_enter(2);
        let c = clock.clone();
        let second = std::thread::spawn(move || {
            c.turn_enter(2);
            c.turn_leave(2);
        });
        while clock.turns().1.is_empty() {
            std::thread::yield_now();
        }
        clock.turn_leave(2);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !second.is_finished() && std::time::Instant::now() < until {
            clock.poke();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(second.is_finished(), "the second run of key 2 never got its turn: {:?}", clock.turns());
        second.join().unwrap();
        assert_eq!(clock.turns(), (None, vec![], vec![]));
    }

    #[test]
    fn scaled_clock_runs_faster() {
        let clock = ScaledClock::new(100.0);
        let a = clock.now_ms();
        std::thread::sleep(Duration::from_millis(20));
        assert!(clock.now_ms() - a >= 1_900);
    }

    /// Two processes given one origin read one time, whenever each started:
    /// a clock made 50 ms later is not 50 ms behind but level.
    #[test]
    fn anchored_clocks_started_apart_agree() {
        let origin = wall_ms() - 1_000;
        let first = ScaledClock::anchored(30.0, origin);
        std::thread::sleep(Duration::from_millis(50));
        let second = ScaledClock::anchored(30.0, origin);
        let (a, b) = (first.now_ms(), second.now_ms());
        // 1 s of wall time since the origin is 30 s of scaled time.
        assert!(a - origin >= 30_000, "{}", a - origin);
        assert!((a - b).abs() < 300, "first {a}, second {b}: {} ms apart", a - b);
        let unanchored = ScaledClock::new(30.0);
        assert!(a - unanchored.now_ms() > 20_000, "a clock of its own starts at the wall time");
    }
}
