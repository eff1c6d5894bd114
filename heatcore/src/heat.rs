//! The heat of entries in chain mode (the prior: prefix chains are not scored by the model), the
//! re-score, dooming, and what the mesh says (ended conversations, expiry): a second `impl Core`.

use std::collections::HashMap;

use crate::core::{Core, CONTEXT_ENDED, EXPIRED, UNSCORED, USED};

impl Core {
    // -- heat (the prior: prefix chains are not scored by the model) ---------------------------------

    pub(crate) fn maybe_rescore(&mut self, now_ms: i64) {
        match self.last_rescore_ms {
            None => {
                self.last_rescore_ms = Some(now_ms);
                self.last_rescore_tick = self.tick;
            }
            Some(last) => {
                if now_ms - last >= self.p.rescore_ms
                    && self.tick - self.last_rescore_tick >= self.p.rescore_accesses
                {
                    self.rescore(now_ms);
                }
            }
        }
    }

    pub fn rescore(&mut self, now_ms: i64) {
        self.last_rescore_ms = Some(now_ms);
        self.last_rescore_tick = self.tick;
        self.rescores += 1;
        if !self.clusters_seen {
            // Without clusters no decision reads the heat (leaves go by CRF): entries are scored
            // when it is asked for (`fresh`), by the clock of that moment.
            for f in self.flags.iter_mut() {
                if *f & USED != 0 {
                    *f |= UNSCORED;
                }
            }
            if !self.ended.is_empty() || self.ttls_seen {
                let idx = self.resident();
                self.doom_dead(&idx, now_ms);
            }
            return;
        }
        self.flags.iter_mut().for_each(|f| *f &= !UNSCORED);
        let idx = self.resident();
        if idx.is_empty() {
            return;
        }
        // numpy's float32 arithmetic of `HeatPolicy._score_all` (the prior), step by step
        let w = self.p.prior_recency as f32;
        let w1 = (1.0 - self.p.prior_recency) as f32;
        let mut hottest: HashMap<i64, f32> = HashMap::new();
        for &s in &idx {
            let age = (self.tick - self.last_tick[s]).max(0) as f64;
            let rf0 = ((age.ln_1p() / self.time_scale).min(1.0)) as f32;
            let rf1 = self.frequency_feature(s) as f32;
            let raw = w * (1.0 - rf0) + w1 * rf1;
            self.raw[s] = raw;
            self.eff.remove(&(s as u32));
            let c = self.cluster_of(s);
            if c >= 0 {
                let h = hottest.entry(c).or_insert(0.0);
                *h = h.max(raw);
            }
        }
        if !hottest.is_empty() {
            let tau = self.p.neighbour_tau;
            for &s in &idx {
                if let Some(&(c, distance)) = self.clusters.get(&(s as u32)) {
                    let keep = hottest[&c] * (-distance / tau).exp();
                    if keep > self.raw[s] {
                        self.eff.insert(s as u32, keep);
                    }
                }
            }
        }
        self.doom_dead(&idx, now_ms);
    }

    pub(crate) fn doom_dead(&mut self, idx: &[usize], now_ms: i64) {
        if !self.ended.is_empty() {
            for &s in idx {
                let t = self.trace[s];
                if t >= 0 && self.ended.contains(&t) {
                    self.doom(s, CONTEXT_ENDED);
                }
            }
        }
        if self.ttls_seen {
            for &s in idx {
                let (inserted, ttl) = self.ttl_of(s);
                if ttl > 0 && now_ms - inserted >= ttl {
                    self.doom(s, EXPIRED);
                }
            }
        }
    }

    fn frequency_feature(&self, s: usize) -> f64 {
        self.freq[s] as f64
            / 16.0
            / 2f64.powi(self.sketch.resets as i32 - self.freq_epoch[s] as i32)
    }

    fn score_one(&self, s: usize) -> f32 {
        let age = (self.tick - self.last_tick[s]).max(0) as f64;
        let f0 = (age.ln_1p() / self.time_scale).min(1.0);
        let w = self.p.prior_recency;
        (w * (1.0 - f0) + (1.0 - w) * self.frequency_feature(s)) as f32
    }

    pub(crate) fn fresh(&mut self, slots: &[usize]) {
        for &s in slots {
            if self.is(s, UNSCORED) {
                self.set(s, UNSCORED, false);
                if !self.doomed.iter().any(|d| d.0 as usize == s) {
                    let h = self.score_one(s);
                    self.raw[s] = h;
                    if !self.eff.is_empty() {
                        self.eff.remove(&(s as u32));
                    }
                }
            }
        }
    }

    pub fn fresh_all(&mut self) {
        let all: Vec<usize> = (0..self.slots())
            .filter(|&s| self.is(s, UNSCORED))
            .collect();
        self.fresh(&all);
    }

    pub(crate) fn doom(&mut self, s: usize, reason: u8) {
        match self.doomed.iter_mut().find(|d| d.0 as usize == s) {
            Some(d) => d.1 = reason,
            None => self.doomed.push((s as u32, reason)),
        }
    }

    // -- mesh signals --------------------------------------------------------------------------------

    pub fn end_trace(&mut self, tid: i32, evict: bool, out: &mut Vec<(i64, u8)>) {
        self.ended.insert(tid);
        let members: Vec<usize> = self
            .resident()
            .into_iter()
            .filter(|&s| self.trace[s] == tid)
            .collect();
        for s in self.deepest_first(members) {
            if evict && self.children[s] == 0 {
                self.evict_one(s, CONTEXT_ENDED, out);
            } else {
                self.doom(s, CONTEXT_ENDED);
            }
        }
    }

    pub fn expire(&mut self, now_ms: i64, out: &mut Vec<(i64, u8)>) {
        let dead: Vec<usize> = self
            .resident()
            .into_iter()
            .filter(|&s| {
                let (inserted, ttl) = self.ttl_of(s);
                ttl > 0 && now_ms - inserted >= ttl
            })
            .collect();
        for s in self.deepest_first(dead) {
            if self.children[s] == 0 {
                self.evict_one(s, EXPIRED, out);
            } else {
                self.doom(s, EXPIRED);
            }
        }
    }
}
