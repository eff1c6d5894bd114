//! The heat policy in prefix-chain mode (`policies/learned/heat.py` once a block names a parent):
//! leaves evicted by combined recency-frequency plus the learned re-use term, ended / expired entries
//! first, cold clusters whole. Decision for decision the Python reference's (the differential tests
//! replay both); one struct of arrays indexed by slot, no object per entry.

use std::collections::{HashMap, HashSet};

use crate::ghost::Ghosts;
use crate::guard::{root_sampled, Guard};
use crate::index::KeyIndex;
use crate::leaves::Leaves;
use crate::reuse::Reuse;
use crate::sketch::{Pos, Sketch};

pub const CAPACITY: u8 = 0;
pub const REJECTED: u8 = 1;
pub const EXPIRED: u8 = 2;
pub const CONTEXT_ENDED: u8 = 3;
pub const COLD_CLUSTER: u8 = 4;
pub const USED: u8 = 1;
pub const EXTENDED: u8 = 2;
pub const UNSCORED: u8 = 4;
/// The block's chain is in the guard's sample (guard.rs)
pub const SAMPLED: u8 = 8;
/// The decision `changed` last gave for the entry: keep, keep-alive (neither: none yet, or evict)
pub const GAVE_KEEP: u8 = 16;
pub const GAVE_ALIVE: u8 = 32;
/// Decision codes of `changed`
pub const KEEP: u8 = 1;
pub const KEEP_ALIVE: u8 = 2;
pub const EVICT: u8 = 3;

/// 2^x by libm's `pow`, as Python's `2.0 ** x` computes it (a constant base 2 would be compiled
/// into `exp2`, which may round the last bit differently).
fn pow2(x: f64) -> f64 {
    std::hint::black_box(2.0f64).powf(x)
}

#[derive(Clone, Copy, Default)]
pub struct Meta {
    pub trace: Option<i32>,
    pub ttl_ms: Option<i64>,
    pub cluster: Option<i64>,
}

pub struct Params {
    pub capacity: i64,
    pub seed: u64,
    pub chain_reuse: bool,
    pub chain_reuse_weight: f64,
    pub chain_half_life: f64,
    /// The half-lives the guard's miniatures compare (guard.rs; the core follows the best)
    pub chain_half_lives: Vec<f64>,
    pub rescore_ms: i64,
    pub rescore_accesses: i64,
    pub neighbour_tau: f32,
    pub cold_cluster: f64,
    pub prior_recency: f64,
    /// Miniatures with and without the learned term decide whether it stays on (guard.rs)
    pub chain_guard: bool,
    /// Count accesses in the frequency sketch (the guard's miniatures do not: none of their decisions reads it)
    pub sketch: bool,
}

pub struct Core {
    pub p: Params,
    lam: f64,
    pub(crate) time_scale: f64,
    // the entry table, one column per field (slot-indexed); what only some entries have (a TTL, a
    // cluster) is kept beside it by slot
    pub key: Vec<i64>,
    /// USED | EXTENDED (the block was ever a parent) | UNSCORED (its heat is to be computed) | SAMPLED
    pub flags: Vec<u8>,
    pub last_tick: Vec<i64>,
    pub crf: Vec<f64>,
    pub size: Vec<u32>,
    pub trace: Vec<i32>,
    pub depth: Vec<i32>,
    pub parent: Vec<i32>,
    pub children: Vec<i32>,
    pub freq: Vec<u8>,
    pub freq_epoch: Vec<u32>,
    pub raw: Vec<f32>,
    /// Effective heat where a cluster raised it above `raw` (re-scores with clusters only); a doomed
    /// entry's is -1 (its conversation ended) or -2 (expired)
    pub eff: HashMap<u32, f32>,
    /// slot -> (inserted at, TTL), ms
    pub ttl: HashMap<u32, (i64, i64)>,
    /// slot -> (cluster, distance to its centre)
    pub clusters: HashMap<u32, (i64, f32)>,
    pub index: KeyIndex,
    /// The free slots as a stack, linked through their `depth` (next below, -1 at the bottom): the
    /// next slot taken is the last one freed, as in the Python policy's list.
    free_top: i32,
    pub free_len: usize,
    pub doomed: Vec<(u32, u8)>,
    pub ended: HashSet<i32>,
    pub used_total: i64,
    pub tick: i64,
    pub now_ms: i64,
    pub last_rescore_ms: Option<i64>,
    pub last_rescore_tick: i64,
    pub rescores: u64,
    /// Some entry was given a cluster (heat then decides cold clusters: re-scores score every entry)
    pub clusters_seen: bool,
    /// Some entry was given a TTL (re-scores look for expired entries)
    pub ttls_seen: bool,
    pub sketch: Sketch,
    pub ghosts: Ghosts,
    pub reuse: Option<Reuse>,
    pub guard: Option<Box<Guard>>,
    leaves: Leaves,
}

impl Core {
    pub fn new(p: Params) -> Self {
        let cap = p.capacity;
        let slots = (cap + 1) as usize;
        let lam = 1.0 / (p.chain_half_life * cap as f64);
        let reuse = if p.chain_reuse {
            Some(Reuse::new(3 * cap, p.chain_reuse_weight))
        } else {
            None
        };
        let guard = if p.chain_guard {
            Guard::around(&p)
        } else {
            None
        };
        Core {
            lam,
            time_scale: (64.0 * cap.max(16) as f64).ln_1p(),
            key: vec![0; slots],
            flags: vec![0; slots],
            last_tick: vec![0; slots],
            crf: vec![0.0; slots],
            size: vec![1; slots],
            trace: vec![-1; slots],
            depth: (1..=slots as i32)
                .map(|n| if n == slots as i32 { -1 } else { n })
                .collect(),
            parent: vec![-1; slots],
            children: vec![0; slots],
            freq: vec![0; slots],
            freq_epoch: vec![0; slots],
            raw: vec![0.0; slots],
            eff: HashMap::new(),
            ttl: HashMap::new(),
            clusters: HashMap::new(),
            index: KeyIndex::new(slots),
            free_top: 0,
            free_len: slots,
            doomed: Vec::new(),
            ended: HashSet::new(),
            used_total: 0,
            tick: 0,
            now_ms: 0,
            last_rescore_ms: None,
            last_rescore_tick: 0,
            rescores: 0,
            clusters_seen: false,
            ttls_seen: false,
            sketch: Sketch::counting(p.sketch, cap as u64, p.seed),
            ghosts: Ghosts::new(4 * cap as usize),
            reuse,
            guard,
            leaves: Leaves::new(slots),
            p,
        }
    }

    pub fn contains(&self, key: i64) -> bool {
        self.index.get(key, &self.key).is_some()
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    #[inline]
    pub fn is(&self, s: usize, flag: u8) -> bool {
        self.flags[s] & flag != 0
    }

    #[inline]
    pub fn set(&mut self, s: usize, flag: u8, on: bool) {
        if on {
            self.flags[s] |= flag;
        } else {
            self.flags[s] &= !flag;
        }
    }

    pub fn slots(&self) -> usize {
        self.flags.len()
    }

    /// The resident slots, in slot order.
    pub fn resident(&self) -> Vec<usize> {
        (0..self.slots()).filter(|&s| self.is(s, USED)).collect()
    }

    /// Effective heat: a doomed entry's mark, else what a cluster raised it to, else its raw heat.
    pub fn eff_of(&self, s: usize) -> f32 {
        if let Some(&(_, reason)) = self.doomed.iter().find(|d| d.0 as usize == s) {
            return if reason == CONTEXT_ENDED { -1.0 } else { -2.0 };
        }
        if self.eff.is_empty() {
            return self.raw[s];
        }
        self.eff.get(&(s as u32)).copied().unwrap_or(self.raw[s])
    }

    /// The free slots, bottom of the stack first (the last is taken next).
    pub fn set_free(&mut self, free: &[u32]) {
        let mut below = -1;
        for &s in free {
            self.depth[s as usize] = below;
            below = s as i32;
        }
        self.free_top = below;
        self.free_len = free.len();
    }

    fn pop_free(&mut self) -> usize {
        assert!(
            self.free_top >= 0,
            "a free slot: capacity + 1 slots, at most capacity used"
        );
        let s = self.free_top as usize;
        self.free_top = self.depth[s];
        self.depth[s] = 0;
        self.free_len -= 1;
        s
    }

    fn push_free(&mut self, s: usize) {
        self.depth[s] = self.free_top;
        self.free_top = s as i32;
        self.free_len += 1;
    }

    pub fn cluster_of(&self, s: usize) -> i64 {
        if self.clusters.is_empty() {
            return -1;
        }
        self.clusters.get(&(s as u32)).map_or(-1, |c| c.0)
    }

    // -- accesses ------------------------------------------------------------------------------

    pub fn slot_of(&self, key: i64) -> Option<usize> {
        self.index.get(key, &self.key).map(|s| s as usize)
    }

    /// A hit on resident `key`, at slot `s` (`slot_of`).
    pub fn on_hit(&mut self, s: usize, key: i64, now_ms: i64, parent: Option<i64>, meta: &Meta) {
        self.tick += 1;
        self.now_ms = now_ms;
        let pos = self.sketch.positions(key);
        self.sketch.increment_at(&pos);
        let (tick, last) = (self.tick, self.last_tick[s]);
        self.crf[s] = 1.0 + self.crf[s] * pow2(-self.lam * (tick - last) as f64);
        self.last_tick[s] = tick;
        self.hear_chain(key, parent, self.is(s, SAMPLED), self.size[s]);
        if self.children[s] == 0 {
            self.push_leaf(s);
        }
        self.freq[s] = self.sketch.frequency_at(&pos);
        self.freq_epoch[s] = self.sketch.resets;
        self.apply_meta(s, meta);
        self.maybe_rescore(now_ms);
    }

    /// Admits `key` or rejects it; what must leave is appended to `out` as (key, reason).
    pub fn on_miss(
        &mut self,
        key: i64,
        now_ms: i64,
        size: u32,
        parent: Option<i64>,
        meta: &Meta,
        out: &mut Vec<(i64, u8)>,
    ) {
        self.tick += 1;
        self.now_ms = now_ms;
        let pos = self.sketch.positions(key);
        self.sketch.increment_at(&pos);
        if size as i64 > self.p.capacity {
            out.push((key, REJECTED));
            return;
        }
        let mut pslot: i64 = -1;
        if let Some(p) = parent {
            match self.index.get(p, &self.key) {
                Some(ps) => pslot = ps as i64,
                None => {
                    out.push((key, REJECTED)); // an orphan block can never be hit
                    return;
                }
            }
        }
        let sampled = match &self.guard {
            None => false,
            Some(_) if pslot >= 0 => self.is(pslot as usize, SAMPLED),
            Some(g) => root_sampled(key, g.cut),
        };
        self.hear_chain(key, parent, sampled, size);
        self.maybe_rescore(now_ms);
        let s = self.stage(key, &pos, size, pslot, meta);
        while self.used_total + size as i64 > self.p.capacity {
            let v = self.pick_victim(pslot);
            if v < 0 {
                self.unstage(s);
                out.push((key, REJECTED));
                return;
            }
            self.evict(v as usize, out);
        }
        self.set(s, USED | UNSCORED, true);
        self.set(s, SAMPLED, sampled);
        self.key[s] = key;
        self.index.insert(key, s as u32);
        self.used_total += self.size[s] as i64;
        self.push_leaf(s);
    }

    pub fn remove(&mut self, key: i64) {
        if let Some(s) = self.slot_of(key) {
            self.release(s);
        }
    }

    /// `sampled`: the block's chain is in the guard's sample (which hears the block's `size` too).
    fn hear_chain(&mut self, key: i64, parent: Option<i64>, sampled: bool, size: u32) {
        let mut half_life = None;
        if let Some(r) = self.reuse.as_mut() {
            r.heard(key, self.tick);
            if let Some(p) = parent {
                r.extended(p);
            }
            if let (true, Some(g)) = (sampled, self.guard.as_mut()) {
                let change = g.heard(key, parent, self.now_ms, size);
                if let Some(on) = change.term {
                    r.set_weight(if on { self.p.chain_reuse_weight } else { 0.0 });
                }
                half_life = change.half_life;
            }
        }
        if let Some(h) = half_life {
            self.set_half_life(h);
        }
    }

    /// LRFU's half-life, in capacities of accesses: the leaf queue is rebuilt at the new rate.
    pub fn set_half_life(&mut self, half_life: f64) {
        self.p.chain_half_life = half_life;
        self.lam = 1.0 / (half_life * self.p.capacity as f64);
        self.leaves.clear();
        self.start_chains();
    }

    fn apply_meta(&mut self, s: usize, meta: &Meta) {
        // (attention heat is a feature of the model, which does not score prefix chains)
        if let Some(t) = meta.trace {
            self.trace[s] = t;
        }
        if let Some(ttl) = meta.ttl_ms {
            self.ttls_seen = true;
            self.ttl.insert(s as u32, (self.now_ms, ttl));
        }
        if let Some(c) = meta.cluster {
            self.set_cluster(s, c, None);
        }
    }

    /// `distance` None keeps the one recorded.
    pub fn set_cluster(&mut self, s: usize, cluster: i64, distance: Option<f32>) {
        self.clusters_seen = true;
        let d = distance.unwrap_or_else(|| self.clusters.get(&(s as u32)).map_or(0.0, |c| c.1));
        self.clusters.insert(s as u32, (cluster, d));
    }

    pub(crate) fn ttl_of(&self, s: usize) -> (i64, i64) {
        if self.ttl.is_empty() {
            return (0, 0);
        }
        self.ttl.get(&(s as u32)).copied().unwrap_or((0, 0))
    }

    // -- the leaf queue ----------------------------------------------------------------------------

    fn push_leaf(&mut self, s: usize) {
        let bonus = self
            .reuse
            .as_ref()
            .map_or(0.0, |r| r.bonus(self.is(s, EXTENDED)));
        let priority = self.crf[s].log2() + self.lam * self.last_tick[s] as f64 + bonus;
        self.leaves.set(s as u32, priority);
    }

    /// Every resident leaf queued, in slot order (what entering prefix mode does).
    pub fn start_chains(&mut self) {
        for s in self.resident() {
            if self.children[s] == 0 {
                self.push_leaf(s);
            }
        }
    }

    // -- eviction ----------------------------------------------------------------------------------

    fn pick_victim(&mut self, exclude: i64) -> i64 {
        for &(s, _) in &self.doomed {
            if self.children[s as usize] == 0 && s as i64 != exclude {
                return s as i64;
            }
        }
        // `exclude` (the newcomer's parent) has a child now, so it is not queued
        self.leaves.least()
    }

    fn evict(&mut self, v: usize, out: &mut Vec<(i64, u8)>) {
        if let Some(&(_, reason)) = self.doomed.iter().find(|d| d.0 as usize == v) {
            self.evict_one(v, reason, out);
            return;
        }
        let c = self.cluster_of(v);
        if c >= 0 {
            let members: Vec<usize> = self
                .resident()
                .into_iter()
                .filter(|&m| self.cluster_of(m) == c)
                .collect();
            self.fresh(&members);
            let hottest = members
                .iter()
                .map(|&m| self.raw[m])
                .fold(f32::NEG_INFINITY, f32::max);
            if (hottest as f64) < self.p.cold_cluster {
                self.evict_one(v, COLD_CLUSTER, out);
                for m in self.deepest_first(members) {
                    if m != v && self.is(m, USED) && self.children[m] == 0 {
                        self.evict_one(m, COLD_CLUSTER, out);
                    }
                }
                return;
            }
        }
        self.evict_one(v, CAPACITY, out);
    }

    pub(crate) fn deepest_first(&self, mut slots: Vec<usize>) -> Vec<usize> {
        slots.sort_by_key(|&s| -(self.depth[s] as i64)); // stable: equal depths keep slot order
        slots
    }

    pub(crate) fn evict_one(&mut self, s: usize, reason: u8, out: &mut Vec<(i64, u8)>) {
        let key = self.key[s];
        self.ghosts.put(key, self.last_tick[s], self.crf[s]);
        self.release(s);
        out.push((key, reason));
    }

    fn reset_slot(&mut self, s: usize) {
        self.set(s, USED | UNSCORED | GAVE_KEEP | GAVE_ALIVE, false);
        self.freq[s] = 0;
        self.freq_epoch[s] = 0;
        self.size[s] = 1;
        self.trace[s] = -1;
        self.depth[s] = 0;
        self.parent[s] = -1;
        self.children[s] = 0;
        if !self.ttl.is_empty() {
            self.ttl.remove(&(s as u32));
        }
        if !self.clusters.is_empty() {
            self.clusters.remove(&(s as u32));
        }
    }

    fn release(&mut self, s: usize) {
        self.index.remove(self.key[s], &self.key);
        self.leaves.remove(s as u32);
        self.used_total -= self.size[s] as i64;
        self.doomed.retain(|d| d.0 as usize != s);
        let parent = self.parent[s];
        if self.children[s] > 0 {
            // Removed from outside (delete / invalidation): its children lose their parent link.
            for c in 0..self.slots() {
                if self.is(c, USED) && self.parent[c] == s as i32 {
                    self.parent[c] = -1;
                }
            }
        }
        self.reset_slot(s);
        self.set(s, EXTENDED | SAMPLED, false);
        self.raw[s] = 0.0;
        if !self.eff.is_empty() {
            self.eff.remove(&(s as u32));
        }
        self.crf[s] = 0.0;
        self.push_free(s);
        if parent >= 0 {
            let p = parent as usize;
            self.children[p] -= 1;
            if self.children[p] == 0 {
                self.push_leaf(p);
            }
        }
    }

    fn stage(&mut self, key: i64, pos: &Pos, size: u32, pslot: i64, meta: &Meta) -> usize {
        let s = self.pop_free();
        self.last_tick[s] = self.tick;
        self.size[s] = size;
        self.freq[s] = self.sketch.frequency_at(pos);
        self.freq_epoch[s] = self.sketch.resets;
        match self.ghosts.pop(key) {
            None => self.crf[s] = 1.0,
            Some((last, crf)) => {
                self.crf[s] = 1.0 + crf * pow2(-self.lam * (self.tick - last) as f64);
            }
        }
        if pslot >= 0 {
            let p = pslot as usize;
            self.parent[s] = pslot as i32;
            self.depth[s] = self.depth[p] + 1;
            self.children[p] += 1;
            self.set(p, EXTENDED, true);
            self.leaves.remove(p as u32); // not a leaf while it has a child
        }
        self.apply_meta(s, meta);
        s
    }

    fn unstage(&mut self, s: usize) {
        let parent = self.parent[s];
        self.reset_slot(s);
        self.push_free(s);
        if parent >= 0 {
            let p = parent as usize;
            self.children[p] -= 1;
            if self.children[p] == 0 {
                self.push_leaf(p);
            }
        }
    }

    /// Bytes this core holds (its arrays, the key index, the leaf queue, ghosts, sketch, pending labels).
    /// The resident entries whose decision differs from the one this last gave for them, each as
    /// (slot, decision code): `EVICT` below `below` (a leaf; given every time, as a command),
    /// `KEEP_ALIVE` when only a neighbour or a child keeps it, `KEEP` otherwise. A re-score round
    /// then costs the changes, not the whole table, in Python.
    pub fn changed(&mut self, below: f64) -> Vec<(usize, u8)> {
        self.fresh_all();
        let mut out = Vec::new();
        for s in 0..self.slots() {
            if !self.is(s, USED) {
                continue;
            }
            let code = if f64::from(self.eff_of(s)) < below && self.children[s] == 0 {
                EVICT
            } else if f64::from(self.raw[s]) < below {
                KEEP_ALIVE
            } else {
                KEEP
            };
            let gave = if self.is(s, GAVE_KEEP) {
                KEEP
            } else if self.is(s, GAVE_ALIVE) {
                KEEP_ALIVE
            } else {
                0
            };
            if code != gave || code == EVICT {
                out.push((s, code));
                self.set(s, GAVE_KEEP, code == KEEP);
                self.set(s, GAVE_ALIVE, code == KEEP_ALIVE);
            }
        }
        out
    }

    pub fn bytes(&self) -> usize {
        // key, last tick, CRF, size, trace, depth, parent, children, frequency, its epoch, raw heat, flags
        let per_slot = 8 + 8 + 8 + 4 + 4 + 4 + 4 + 4 + 1 + 4 + 4 + 1;
        let sparse = (self.ttl.capacity() + self.clusters.capacity() + self.eff.capacity()) * 21;
        self.slots() * per_slot
            + sparse
            + self.index.bytes()
            + self.leaves.bytes()
            + self.ghosts.bytes()
            + self.sketch.bytes()
            + self.reuse.as_ref().map_or(0, |r| r.bytes())
            + self.guard.as_ref().map_or(0, |g| g.bytes())
    }
}
