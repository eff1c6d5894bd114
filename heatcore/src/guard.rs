//! `policies/learned/guard.py`'s `ChainGuard`: two miniature chain caches, with and without the learned
//! re-use term, on a sample of the prefix chains scaled to 1/`RATE` of the capacity, up to
//! `MAX_MINIATURE` blocks (the full-size core marks each block of a sampled chain: `SAMPLED`); the term
//! stands down while the one with it hits less, by more than two standard errors. Decision for decision
//! the Python guard's.

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

pub struct Guard {
    with: Box<Core>,
    without: Box<Core>,
    window: u64,
    pub cut: u64,
    pub term_on: bool,
    pub windows: u64,
    pub windows_off: u64,
    pub accesses: u64,
    pub hits_with: u64,
    pub hits_without: u64,
    in_window: u64,
    diff: i64,
    s: f64,
    q: f64,
    n: f64,
    scratch: Vec<(i64, u8)>,
}

impl Guard {
    /// The guard of a core with the learned term (None when its miniatures would be too small).
    pub fn around(p: &Params) -> Option<Box<Guard>> {
        let mini = (p.capacity / RATE).min(MAX_MINIATURE);
        if !p.chain_reuse || mini < MIN_MINIATURE {
            return None;
        }
        let miniature = |term: bool| {
            Box::new(Core::new(Params {
                capacity: mini,
                seed: p.seed,
                chain_reuse: term,
                chain_reuse_weight: p.chain_reuse_weight,
                chain_half_life: p.chain_half_life,
                rescore_ms: p.rescore_ms,
                rescore_accesses: mini / 8,
                neighbour_tau: p.neighbour_tau,
                cold_cluster: p.cold_cluster,
                prior_recency: p.prior_recency,
                chain_guard: false,
            }))
        };
        Some(Box::new(Guard {
            with: miniature(true),
            without: miniature(false),
            window: MIN_WINDOW.max(mini as u64 / 4),
            cut: ((1u128 << 64) * mini as u128 / p.capacity as u128) as u64,
            term_on: true,
            windows: 0,
            windows_off: 0,
            accesses: 0,
            hits_with: 0,
            hits_without: 0,
            in_window: 0,
            diff: 0,
            s: 0.0,
            q: 0.0,
            n: 0.0,
            scratch: Vec::new(),
        }))
    }

    /// A sampled block's access in the full-size core; Some(on) when the term is to be turned on or off.
    pub fn heard(&mut self, key: i64, parent: Option<i64>, now_ms: i64, size: u32) -> Option<bool> {
        let hit_with = access(&mut self.with, key, parent, now_ms, size, &mut self.scratch);
        let hit_without = access(
            &mut self.without,
            key,
            parent,
            now_ms,
            size,
            &mut self.scratch,
        );
        self.hits_with += hit_with as u64;
        self.hits_without += hit_without as u64;
        self.diff += hit_with as i64 - hit_without as i64;
        self.accesses += 1;
        self.in_window += 1;
        if self.in_window == self.window {
            return self.close_window();
        }
        None
    }

    fn close_window(&mut self) -> Option<bool> {
        let d = self.diff as f64 / self.window as f64;
        self.in_window = 0;
        self.diff = 0;
        self.windows += 1;
        self.s += d;
        self.q += d * d;
        self.n += 1.0;
        if self.windows.is_multiple_of(HALVE_WINDOWS) {
            self.s /= 2.0;
            self.q /= 2.0;
            self.n /= 2.0;
        }
        let mut change = None;
        if self.n >= MIN_WINDOWS {
            let mean = self.s / self.n;
            let se = ((self.q / self.n - mean * mean).max(0.0) / self.n).sqrt();
            if self.term_on && mean + 2.0 * se < 0.0 {
                self.term_on = false;
                change = Some(false);
            } else if !self.term_on && mean > 0.0 {
                self.term_on = true;
                change = Some(true);
            }
        }
        if !self.term_on {
            self.windows_off += 1;
        }
        change
    }

    pub fn bytes(&self) -> usize {
        self.with.bytes() + self.without.bytes()
    }
}
