//! `chains.ChainReuse`: P(re-used within the horizon | the block was ever extended), learned online.

use std::collections::VecDeque;

use crate::fastmod::FastMod;
use crate::index::IdMap;

pub struct Reuse {
    pub horizon: i64,
    pub weight: f64,
    sample_mod: FastMod,
    halve_mod: FastMod,
    pub yes: [f64; 2],
    pub seen: [f64; 2],
    pub labels: u64,
    bonus: [f64; 2],
    /// key -> 2 * tick watched + (extended since)
    pub pending: IdMap<i64>,
    pub order: VecDeque<(i64, i64)>,
}

impl Reuse {
    pub fn new(horizon: i64, weight: f64) -> Self {
        let mut r = Reuse {
            horizon,
            weight,
            sample_mod: FastMod::new(32),
            halve_mod: FastMod::new((3 * horizon).max(1) as u64),
            yes: [0.0; 2],
            seen: [0.0; 2],
            labels: 0,
            bonus: [0.0; 2],
            pending: IdMap::default(),
            order: VecDeque::new(),
        };
        r.refresh();
        r
    }

    pub fn refresh(&mut self) {
        for b in 0..2 {
            self.bonus[b] = self.weight * ((self.yes[b] + 1.0) / (self.seen[b] + 2.0)).log2();
        }
    }

    /// The term's weight from now on (the guard stands it down to 0 and back).
    pub fn set_weight(&mut self, weight: f64) {
        self.weight = weight;
        self.refresh();
    }

    pub fn bonus(&self, extended: bool) -> f64 {
        self.bonus[extended as usize]
    }

    fn label(&mut self, b: usize, reused: bool) {
        self.labels += 1;
        self.seen[b] += 1.0;
        self.yes[b] += reused as u8 as f64;
        self.refresh();
    }

    pub fn extended(&mut self, key: i64) {
        if let Some(v) = self.pending.get_mut(&key) {
            *v |= 1;
        }
    }

    pub fn heard(&mut self, key: i64, tick: i64) {
        if let Some(sample) = self.pending.remove(&key) {
            self.label((sample & 1) as usize, tick - (sample >> 1) <= self.horizon);
        }
        while let Some(&(started, old)) = self.order.front() {
            if tick - started <= self.horizon {
                break;
            }
            self.order.pop_front();
            if let Some(&sample) = self.pending.get(&old) {
                if sample >> 1 == started {
                    self.pending.remove(&old);
                    self.label((sample & 1) as usize, false);
                }
            }
        }
        // (ticks are positive: their remainders are as Python's)
        if self.sample_mod.rem(tick as u64) == 0 {
            self.pending.insert(key, 2 * tick);
            self.order.push_back((tick, key));
        }
        if self.halve_mod.rem(tick as u64) == 0 {
            for b in 0..2 {
                self.yes[b] /= 2.0;
                self.seen[b] /= 2.0;
            }
            self.refresh();
        }
    }

    pub fn bytes(&self) -> usize {
        self.pending.capacity() * 17 + self.order.capacity() * 16
    }
}
