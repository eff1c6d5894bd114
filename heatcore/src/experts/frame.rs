//! `policies/learned/frame.py`: W-TinyLFU whose victim is the least hot of the oldest few main
//! entries, heat from the owner's model (`Env::heat`) or, until it scores, the prior.

use super::lists::Lists;
use super::wtinylfu::{Admission, PROBATION, PROTECTED, WINDOW};
use super::{Env, Expert};

const GHOST: u8 = 3;
const NO_GAP: u64 = u64::MAX;
const VICTIM_CANDIDATES: usize = 4;
const HOT_FREQUENCY: u8 = 3;

/// Where the frame's features sit in the owner's feature rows (`features.FEATURES`).
#[derive(Clone)]
pub struct FrameParams {
    pub width: usize,
    pub recency: usize,
    pub interval: usize,
    pub frequency: usize,
    pub hits: usize,
    pub size: usize,
    pub ttl_left: usize,
    pub trace_alive: usize,
    pub prior_recency: f64,
}

#[derive(Clone, Copy)]
struct Entry {
    last: u64,
    gap: u64,
    hits: u32,
    heat_tick: u64,
    heat_epoch: u32, // cached heat is valid when this is the frame's epoch
    heat: f64,
}

pub struct Frame {
    capacity: usize,
    window_max: usize,
    protected_max: usize,
    l: Lists<Entry>,
    tick: u64,
    heat_ttl: u64,
    epoch: u32,
    admission: Admission,
    time_scale: f64,
    base: Vec<f32>,
    p: FrameParams,
}

impl Frame {
    pub fn new(capacity: usize, seed: u64, p: FrameParams) -> Self {
        let window_max = capacity.min(((0.01 * capacity as f64).round_ties_even() as usize).max(1));
        let mut base = vec![0f32; p.width];
        base[p.size] = (1f64.ln_1p() / (capacity.max(2) as f64).ln_1p()) as f32;
        base[p.ttl_left] = 1.0;
        base[p.trace_alive] = 1.0;
        Frame {
            capacity,
            window_max,
            protected_max: (0.80 * (capacity - window_max) as f64) as usize,
            l: Lists::default(),
            tick: 0,
            heat_ttl: 16.max(capacity as u64 / 16),
            epoch: 1,
            admission: Admission::new(seed),
            time_scale: (64.0 * capacity.max(16) as f64).ln_1p(),
            base,
            p,
        }
    }

    fn resident(&self) -> usize {
        self.l.total() - self.l.len(GHOST)
    }

    fn frequency(key: u64, env: &Env) -> u8 {
        env.sketch.frequency_at(&env.sketch.positions(key as i64))
    }

    fn evict(&mut self, key: u64) -> u64 {
        self.on_remove(key);
        key
    }

    fn admit(&mut self, candidate: u64, victim: u64, env: &Env) -> bool {
        let fc = Self::frequency(candidate, env);
        let fv = Self::frequency(victim, env);
        if fc <= 1 && fv >= HOT_FREQUENCY {
            return false;
        }
        self.admission.admit(fc, fv)
    }

    fn duel(&mut self, candidate: u64, env: &mut Env) -> u64 {
        match self.victim(candidate, env) {
            Some(victim) if self.admit(candidate, victim, env) => self.evict(victim),
            _ => self.evict(candidate),
        }
    }

    /// The least hot of the oldest few probation entries (protected ones if probation has none).
    fn victim(&mut self, exclude: u64, env: &mut Env) -> Option<u64> {
        let mut pool: Vec<u32> = Vec::with_capacity(VICTIM_CANDIDATES);
        for list in [PROBATION, PROTECTED] {
            let mut at = self.l.front(list);
            while let Some(i) = at {
                if self.l.key(i) != exclude {
                    pool.push(i);
                    if pool.len() >= VICTIM_CANDIDATES {
                        break;
                    }
                }
                at = self.l.next(i);
            }
            if !pool.is_empty() {
                break;
            }
        }
        if pool.len() <= 1 {
            return pool.first().map(|&i| self.l.key(i));
        }
        let (tick, ttl, epoch) = (self.tick, self.heat_ttl, self.epoch);
        let stale: Vec<u32> = pool
            .iter()
            .copied()
            .filter(|&i| {
                let e = self.l.val(i);
                e.heat_epoch != epoch || tick - e.heat_tick > ttl
            })
            .collect();
        if !stale.is_empty() {
            let heats = self.heat(&stale, env);
            for (&i, h) in stale.iter().zip(heats) {
                let e = self.l.val_mut(i);
                e.heat_tick = tick;
                e.heat_epoch = epoch;
                e.heat = h;
            }
        }
        let mut best = pool[0];
        for &i in &pool[1..] {
            if self.l.val(i).heat < self.l.val(best).heat {
                best = i;
            }
        }
        Some(self.l.key(best))
    }

    /// The four features the frame knows: (recency, interval, frequency, hits), as float32.
    fn dynamic(&self, i: u32, env: &Env) -> [f32; 4] {
        let e = self.l.val(i);
        let ts = self.time_scale;
        [
            ((((self.tick - e.last) as f64).ln_1p() / ts).min(1.0)) as f32,
            if e.gap == NO_GAP {
                1.0
            } else {
                (((e.gap as f64).ln_1p() / ts).min(1.0)) as f32
            },
            (f64::from(Self::frequency(self.l.key(i), env)) / 16.0) as f32,
            ((f64::from(e.hits).ln_1p() / 64f64.ln()).min(1.0)) as f32,
        ]
    }

    fn heat(&self, slots: &[u32], env: &mut Env) -> Vec<f64> {
        let p = &self.p;
        match env.heat.as_deref_mut() {
            None => {
                let w = p.prior_recency;
                slots
                    .iter()
                    .map(|&i| {
                        let d = self.dynamic(i, env);
                        let h = (w as f32) * (1.0f32 - d[0]) + ((1.0 - w) as f32) * d[2];
                        f64::from(h)
                    })
                    .collect()
            }
            Some(_) => {
                let mut rows = Vec::with_capacity(slots.len() * p.width);
                for &i in slots {
                    let d = self.dynamic(i, env);
                    let mut row = self.base.clone();
                    row[p.recency] = d[0];
                    row[p.interval] = d[1];
                    row[p.frequency] = d[2];
                    row[p.hits] = d[3];
                    rows.extend_from_slice(&row);
                }
                let f = env.heat.as_deref_mut().expect("the owner's heat");
                f(&rows, slots.len())
            }
        }
    }

    fn touch(&mut self, key: u64) -> u32 {
        self.tick += 1;
        let tick = self.tick;
        match self.l.find(key) {
            Some(i) if self.l.list(i) != GHOST => {
                let e = self.l.val_mut(i);
                e.gap = tick - e.last;
                e.last = tick;
                e.heat_epoch = 0;
                i
            }
            found => {
                let gap = match found {
                    Some(g) => tick - self.l.remove(g).1.last,
                    None => NO_GAP,
                };
                let e = Entry {
                    last: tick,
                    gap,
                    hits: 0,
                    heat_tick: 0,
                    heat_epoch: 0,
                    heat: 0.0,
                };
                self.l.push_back(WINDOW, key, e)
            }
        }
    }
}

impl Expert for Frame {
    fn contains(&self, key: u64) -> bool {
        matches!(self.l.which(key), Some(l) if l != GHOST)
    }
    fn len(&self) -> usize {
        self.resident()
    }
    fn on_hit(&mut self, key: u64, _env: &mut Env) {
        let i = self.touch(key);
        self.l.val_mut(i).hits += 1;
        match self.l.list(i) {
            PROBATION => {
                self.l.move_back(i, PROTECTED);
                while self.l.len(PROTECTED) > self.protected_max {
                    let j = self.l.front(PROTECTED).expect("protected is over its size");
                    self.l.move_back(j, PROBATION);
                }
            }
            list => self.l.move_back(i, list),
        }
    }
    fn on_miss(&mut self, key: u64, env: &mut Env, out: &mut Vec<u64>) {
        self.touch(key);
        while self.l.len(WINDOW) > self.window_max {
            let i = self.l.front(WINDOW).expect("the window is over its size");
            let candidate = self.l.key(i);
            self.l.move_back(i, PROBATION);
            if self.resident() > self.capacity {
                let loser = self.duel(candidate, env);
                out.push(loser);
            }
        }
        while self.resident() > self.capacity {
            let victim = match self.victim(key, env) {
                Some(v) => v,
                None => self
                    .l
                    .key(self.l.front(WINDOW).expect("a full cache holds something")),
            };
            out.push(self.evict(victim));
        }
    }
    fn on_remove(&mut self, key: u64) {
        let Some(i) = self.l.find(key) else { return };
        if self.l.list(i) == GHOST {
            return;
        }
        self.l.move_back(i, GHOST);
        if self.l.len(GHOST) > self.capacity {
            self.l.pop_front(GHOST);
        }
    }
    fn invalidate(&mut self) {
        self.epoch += 1;
    }
    fn bytes(&self) -> usize {
        self.l.bytes() + 624 * 4
    }
}
