//! `policies/learned/guard.py`'s `ChainGuard`: miniature chain caches on a sample of the prefix
//! chains scaled to 1/`RATE` of the capacity, up to `MAX_MINIATURE` blocks (the full-size core marks
//! each block of a sampled chain: `SAMPLED`). One miniature without the learned re-use term per
//! candidate LRFU half-life (the arms) and one with it at the half-life in use: the term stands down
//! while that one hits less than the arm in use, by more than two standard errors, and the core moves
//! to another half-life when that arm hits more than the one in use by more than `SWITCH_SE` standard
//! errors. Decision for decision the Python guard's.

use crate::core::{Core, Meta, Params};

pub const RATE: i64 = 10;
const MAX_MINIATURE: i64 = 2048;
const MIN_MINIATURE: i64 = 64;
const MIN_WINDOW: u64 = 256;
const MIN_WINDOWS: f64 = 4.0;
const HALVE_WINDOWS: u64 = 32;

fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A chain whose root is `key` is in the sample (its hash below `cut`, of 2^64); a later block is
/// when its parent is.
pub fn root_sampled(key: i64, cut: u64) -> bool {
    mix64(key as u64) < cut
}

/// One access to a miniature; whether it hit.
fn access(
    mini: &mut Core,
    key: i64,
    parent: Option<i64>,
    now_ms: i64,
    size: u32,
    scratch: &mut Vec<(i64, u8)>,
) -> bool {
    let none = Meta::default();
    if let Some(s) = mini.slot_of(key) {
        mini.on_hit(s, key, now_ms, parent, &none);
        return true;
    }
    mini.on_miss(key, now_ms, size, parent, &none, scratch);
    scratch.clear();
    false
}

/// What a window's close changed: the term turned on or off, the half-life moved.
#[derive(Default)]
pub struct Change {
    pub term: Option<bool>,
    pub half_life: Option<f64>,
}

/// Paired statistics of one per-window difference (decayed with the windows).
#[derive(Clone, Copy, Default)]
struct Paired {
    s: f64,
    q: f64,
}

impl Paired {
    fn add(&mut self, d: f64) {
        self.s += d;
        self.q += d * d;
    }

    fn halve(&mut self) {
        self.s /= 2.0;
        self.q /= 2.0;
    }

    /// (mean, standard error) over `n` windows.
    fn mean_se(&self, n: f64) -> (f64, f64) {
        let mean = self.s / n;
        (mean, ((self.q / n - mean * mean).max(0.0) / n).sqrt())
    }
}

pub struct Guard {
    /// Without the term, one per half-life (`half_lives`): the first is the one the core starts at
    arms: Vec<Core>,
    pub half_lives: Vec<f64>,
    /// The arm (half-life) the full-size core runs
    pub current: usize,
    /// With the term, at the half-life in use
    with: Box<Core>,
    window: u64,
    pub cut: u64,
    pub term_on: bool,
    pub windows: u64,
    pub windows_off: u64,
    pub switches: u64,
    pub accesses: u64,
    pub hits_with: u64,
    pub hits_without: u64,
    in_window: u64,
    /// This window's hits per arm, and with the term minus without (the arm in use)
    arm_hits: Vec<u64>,
    term_diff: i64,
    term: Paired,
    /// arm i minus arm j at i * arms + j (i > j)
    pairs: Vec<Paired>,
    n: f64,
    scratch: Vec<(i64, u8)>,
}

/// Standard errors by which another half-life's arm must beat the one in use
const SWITCH_SE: f64 = 2.0;

impl Guard {
    /// The guard of a core with the learned term (None when its miniatures would be too small).
    pub fn around(p: &Params) -> Option<Box<Guard>> {
        let mini = (p.capacity / RATE).min(MAX_MINIATURE);
        if !p.chain_reuse || mini < MIN_MINIATURE {
            return None;
        }
        let miniature = |term: bool, half_life: f64| {
            Core::new(Params {
                capacity: mini,
                seed: p.seed,
                chain_reuse: term,
                chain_reuse_weight: p.chain_reuse_weight,
                chain_half_life: half_life,
                chain_half_lives: Vec::new(),
                rescore_ms: p.rescore_ms,
                rescore_accesses: mini / 8,
                neighbour_tau: p.neighbour_tau,
                cold_cluster: p.cold_cluster,
                prior_recency: p.prior_recency,
                chain_guard: false,
                sketch: false,
            })
        };
        let mut half_lives = vec![p.chain_half_life];
        for &h in &p.chain_half_lives {
            if !half_lives.contains(&h) {
                half_lives.push(h);
            }
        }
        let k = half_lives.len();
        Some(Box::new(Guard {
            arms: half_lives.iter().map(|&h| miniature(false, h)).collect(),
            half_lives,
            current: 0,
            with: Box::new(miniature(true, p.chain_half_life)),
            window: MIN_WINDOW.max(mini as u64 / 4),
            cut: ((1u128 << 64) * mini as u128 / p.capacity as u128) as u64,
            term_on: true,
            windows: 0,
            windows_off: 0,
            switches: 0,
            accesses: 0,
            hits_with: 0,
            hits_without: 0,
            in_window: 0,
            arm_hits: vec![0; k],
            term_diff: 0,
            term: Paired::default(),
            pairs: vec![Paired::default(); k * k],
            n: 0.0,
            scratch: Vec::new(),
        }))
    }

    /// A sampled block's access in the full-size core: what it changed, if it closed a window.
    pub fn heard(&mut self, key: i64, parent: Option<i64>, now_ms: i64, size: u32) -> Change {
        let mut without = 0;
        for (a, arm) in self.arms.iter_mut().enumerate() {
            let hit = access(arm, key, parent, now_ms, size, &mut self.scratch);
            self.arm_hits[a] += hit as u64;
            if a == self.current {
                without = hit as u64;
            }
        }
        let hit_with = access(&mut self.with, key, parent, now_ms, size, &mut self.scratch);
        self.hits_with += hit_with as u64;
        self.hits_without += without;
        self.term_diff += hit_with as i64 - without as i64;
        self.accesses += 1;
        self.in_window += 1;
        if self.in_window == self.window {
            return self.close_window();
        }
        Change::default()
    }

    fn close_window(&mut self) -> Change {
        let w = self.window as f64;
        let k = self.arms.len();
        self.term.add(self.term_diff as f64 / w);
        for i in 1..k {
            for j in 0..i {
                let d = (self.arm_hits[i] as f64 - self.arm_hits[j] as f64) / w;
                self.pairs[i * k + j].add(d);
            }
        }
        self.in_window = 0;
        self.term_diff = 0;
        self.arm_hits.iter_mut().for_each(|h| *h = 0);
        self.windows += 1;
        self.n += 1.0;
        if self.windows.is_multiple_of(HALVE_WINDOWS) {
            self.term.halve();
            self.pairs.iter_mut().for_each(Paired::halve);
            self.n /= 2.0;
        }
        let mut change = Change::default();
        if self.n >= MIN_WINDOWS {
            let (mean, se) = self.term.mean_se(self.n);
            if self.term_on && mean + 2.0 * se < 0.0 {
                self.term_on = false;
                change.term = Some(false);
            } else if !self.term_on && mean > 0.0 {
                self.term_on = true;
                change.term = Some(true);
            }
            change.half_life = self.switch();
        }
        if !self.term_on {
            self.windows_off += 1;
        }
        change
    }

    /// The arm with the most hits, if it beats the one in use by `SWITCH_SE` standard errors.
    fn switch(&mut self) -> Option<f64> {
        let k = self.arms.len();
        let (c, mut best, mut best_lead) = (self.current, self.current, 0.0);
        for a in 0..k {
            if a == c {
                continue;
            }
            let (mean, se) = self.lead(a, c);
            if mean - SWITCH_SE * se > 0.0 && mean > best_lead {
                best = a;
                best_lead = mean;
            }
        }
        if best == c {
            return None;
        }
        self.current = best;
        self.switches += 1;
        let h = self.half_lives[best];
        self.with.set_half_life(h);
        Some(h)
    }

    /// Arm `a`'s hits per access over arm `b`'s: (mean, standard error).
    fn lead(&self, a: usize, b: usize) -> (f64, f64) {
        let k = self.arms.len();
        if a > b {
            self.pairs[a * k + b].mean_se(self.n)
        } else {
            let (mean, se) = self.pairs[b * k + a].mean_se(self.n);
            (-mean, se)
        }
    }

    pub fn half_life(&self) -> f64 {
        self.half_lives[self.current]
    }

    pub fn bytes(&self) -> usize {
        self.arms.iter().map(|a| a.bytes()).sum::<usize>() + self.with.bytes()
    }
}
