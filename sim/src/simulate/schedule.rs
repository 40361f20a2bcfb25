//! The fault schedule: drawn once from the mix for a fleet, a horizon and a
//! seed, and played unchanged under every policy.

use serde::Serialize;

use super::mix::FaultMix;

/// splitmix64: small, fast, and the same numbers on every platform and
/// every version of every crate (the report's bytes depend on it).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6e69_6768_7473_6866)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A Poisson draw with mean `lambda` (Knuth's method in slices of at
    /// most 20, so a large mean does not underflow).
    pub fn poisson(&mut self, lambda: f64) -> u64 {
        let mut left = lambda.max(0.0);
        let mut n = 0;
        while left > 0.0 {
            let l = left.min(20.0);
            left -= l;
            let limit = (-l).exp();
            let mut p = 1.0;
            loop {
                p *= self.unit();
                if p <= limit {
                    break;
                }
                n += 1;
            }
        }
        n
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fault {
    /// Position in the schedule (time order).
    pub id: usize,
    /// Index of its class in the mix.
    pub class: usize,
    pub node: usize,
    pub gpu: u32,
    /// Milliseconds from the start of the run.
    pub at_ms: i64,
}

/// Draw the faults for `nodes` × `gpus_per_node` GPUs over `days`.
pub fn draw(mix: &FaultMix, nodes: usize, gpus_per_node: u32, days: f64, seed: u64) -> Vec<Fault> {
    let mut rng = Rng::new(seed);
    let horizon_ms = (days * 86_400_000.0) as u64;
    let gpus = nodes as u64 * gpus_per_node as u64;
    let mut out = Vec::new();
    for (ci, class) in mix.classes.iter().enumerate() {
        let n = rng.poisson(mix.expected(class, gpus, days));
        for _ in 0..n {
            let at_ms = rng.below(horizon_ms.max(1)) as i64;
            let node = rng.below(nodes as u64) as usize;
            let gpu = rng.below(gpus_per_node as u64) as u32;
            out.push(Fault { id: 0, class: ci, node, gpu, at_ms });
        }
    }
    out.sort_by_key(|f| (f.at_ms, f.class, f.node, f.gpu));
    for (i, f) in out.iter_mut().enumerate() {
        f.id = i;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_draws_have_the_mean_they_are_asked_for() {
        for lambda in [0.5, 7.0, 148.0] {
            let mut r = Rng::new(3);
            let n = 4000;
            let mean = (0..n).map(|_| r.poisson(lambda) as f64).sum::<f64>() / n as f64;
            assert!((mean - lambda).abs() < 0.05 * lambda + 0.05, "lambda {lambda}: mean {mean}");
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_another_seed_another() {
        let mix = super::super::mix::FaultMix::parse(
            "version: 1\nname: t\nsource: s\ngpu_days: 100\nclasses:\n  - {name: a, count: 50, signal: ecc_dbe, effect: kill, repair: reset, repair_secs: 60}\n",
            std::path::Path::new("m.yaml"),
        )
        .unwrap();
        let a = draw(&mix, 10, 8, 2.0, 7);
        assert_eq!(a, draw(&mix, 10, 8, 2.0, 7));
        assert_ne!(a, draw(&mix, 10, 8, 2.0, 8));
        assert!(a.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert!(a.iter().all(|f| f.node < 10 && f.gpu < 8 && f.at_ms < 2 * 86_400_000));
    }
}
