//! `policies/adaptive/wtinylfu.py`: Caffeine's W-TinyLFU with its hill climber, and the TinyLFU duel
//! of `policies/admission/tinylfu.py` (its 1/128 escape drawn as Python's `random.Random(seed)`).

use super::lists::Lists;
use super::mt::Mt;
use super::{Env, Expert};
use crate::sketch::Sketch;

pub const WINDOW: u8 = 0;
pub const PROBATION: u8 = 1;
pub const PROTECTED: u8 = 2;
const PROTECTED_PERCENT: f64 = 0.80;
const STEP_PERCENT: f64 = 0.0625;
const HASHDOS_THRESHOLD: u8 = 6;

/// TinyLFU's duel on frequencies already read.
pub struct Admission {
    rng: Mt,
}

impl Admission {
    pub fn new(seed: u64) -> Self {
        Admission { rng: Mt::new(seed) }
    }

    pub fn admit(&mut self, candidate: u8, victim: u8) -> bool {
        candidate > victim || (candidate >= HASHDOS_THRESHOLD && self.rng.bits(7) == 0)
    }
}

struct HillClimber {
    capacity: f64,
    sample_size: u64,
    step: f64,
    previous: f64,
    hits: u64,
    misses: u64,
}

impl HillClimber {
    fn record(&mut self, hit: bool) -> i64 {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        let requests = self.hits + self.misses;
        if requests < self.sample_size {
            return 0;
        }
        let rate = self.hits as f64 / requests as f64;
        let change = rate - self.previous;
        let amount = if change >= 0.0 { self.step } else { -self.step };
        self.step = if change.abs() >= 0.05 {
            STEP_PERCENT * self.capacity * if amount >= 0.0 { 1.0 } else { -1.0 }
        } else {
            0.98 * amount
        };
        self.previous = rate;
        self.hits = 0;
        self.misses = 0;
        amount as i64
    }
}

pub struct WTinyLfu {
    capacity: usize,
    own: Option<Sketch>, // counted here when the owner shares none
    window_max: usize,
    main_max: usize,
    protected_max: usize,
    l: Lists<()>,
    climber: HillClimber,
    admission: Admission,
    candidates: Vec<u64>,
}

impl WTinyLfu {
    /// `shared`: the sample size of the owner's sketch it reads, or None to count its own.
    pub fn new(capacity: usize, seed: u64, shared: Option<u64>) -> Self {
        let own = shared.is_none().then(|| Sketch::new(capacity as u64, seed));
        let sample_size = shared.unwrap_or_else(|| own.as_ref().map_or(16, |s| s.sample_size));
        let window_max = capacity.min(((0.01 * capacity as f64).round_ties_even() as usize).max(1));
        let mut w = WTinyLfu {
            capacity,
            own,
            window_max,
            main_max: 0,
            protected_max: 0,
            l: Lists::default(),
            climber: HillClimber {
                capacity: capacity as f64,
                sample_size,
                step: -STEP_PERCENT * capacity as f64,
                previous: 0.0,
                hits: 0,
                misses: 0,
            },
            admission: Admission::new(seed),
            candidates: Vec::new(),
        };
        w.set_main(capacity - window_max);
        w
    }

    fn set_main(&mut self, main_max: usize) {
        self.main_max = main_max;
        self.protected_max = (PROTECTED_PERCENT * main_max as f64) as usize;
    }

    fn count(&mut self, key: u64) {
        if let Some(s) = self.own.as_mut() {
            let pos = s.positions(key as i64);
            s.increment_at(&pos);
        }
    }

    fn frequency(&self, key: u64, env: &Env) -> u8 {
        let s = self.own.as_ref().unwrap_or(env.sketch);
        s.frequency_at(&s.positions(key as i64))
    }

    fn demote(&mut self) {
        while self.l.len(PROTECTED) > self.protected_max {
            let i = self.l.front(PROTECTED).expect("protected is over its size");
            self.l.move_back(i, PROBATION);
        }
    }

    fn evict_main(&mut self, env: &Env) -> u64 {
        let mut victim = self.l.front(PROBATION).map(|i| self.l.key(i));
        if victim.is_some() && !self.candidates.is_empty() && victim == Some(self.candidates[0]) {
            victim = self.l.front(PROTECTED).map(|i| self.l.key(i));
        }
        let loser = match (self.candidates.first().copied(), victim) {
            (Some(candidate), Some(victim)) => {
                let (fc, fv) = (self.frequency(candidate, env), self.frequency(victim, env));
                self.candidates.remove(0);
                if self.admission.admit(fc, fv) {
                    victim
                } else {
                    candidate
                }
            }
            (Some(candidate), None) => {
                self.candidates.remove(0);
                candidate
            }
            (None, Some(victim)) => victim,
            (None, None) => self
                .l
                .key(self.l.front(WINDOW).expect("a full cache holds something")),
        };
        self.on_remove(loser);
        loser
    }

    fn climb(&mut self, hit: bool) {
        let amount = self.climber.record(hit);
        if amount > 0 {
            self.grow_window((amount as usize).min(self.main_max));
        } else if amount < 0 {
            self.shrink_window(((-amount) as usize).min(self.window_max.saturating_sub(1)));
        }
    }

    fn grow_window(&mut self, quota: usize) {
        self.window_max += quota;
        self.set_main(self.main_max - quota);
        for _ in 0..quota {
            if self.l.len(PROBATION) + self.l.len(PROTECTED) <= self.main_max {
                break;
            }
            let source = if self.l.len(PROBATION) > 0 {
                PROBATION
            } else {
                PROTECTED
            };
            let (key, ()) = self.l.pop_front(source).expect("main is over its size");
            self.l.push_front(WINDOW, key, ());
        }
        self.demote();
    }

    fn shrink_window(&mut self, quota: usize) {
        if quota == 0 {
            return;
        }
        self.window_max -= quota;
        self.set_main(self.main_max + quota);
        while self.l.len(WINDOW) > self.window_max {
            let i = self.l.front(WINDOW).expect("the window is over its size");
            self.l.move_back(i, PROBATION);
        }
    }
}

impl Expert for WTinyLfu {
    fn contains(&self, key: u64) -> bool {
        self.l.find(key).is_some()
    }
    fn len(&self) -> usize {
        self.l.total()
    }
    fn on_hit(&mut self, key: u64, _env: &mut Env) {
        self.count(key);
        if let Some(i) = self.l.find(key) {
            match self.l.list(i) {
                PROBATION => {
                    self.l.move_back(i, PROTECTED);
                    self.demote();
                }
                list => self.l.move_back(i, list),
            }
        }
        self.climb(true);
    }
    fn on_miss(&mut self, key: u64, env: &mut Env, out: &mut Vec<u64>) {
        self.count(key);
        self.l.push_back(WINDOW, key, ());
        self.candidates.clear();
        while self.l.len(WINDOW) > self.window_max {
            let i = self.l.front(WINDOW).expect("the window is over its size");
            self.candidates.push(self.l.key(i));
            self.l.move_back(i, PROBATION);
        }
        while self.l.total() > self.capacity {
            let loser = self.evict_main(env);
            out.push(loser);
        }
        self.climb(false);
    }
    fn on_remove(&mut self, key: u64) {
        if let Some(i) = self.l.find(key) {
            self.l.remove(i);
        }
    }
    fn bytes(&self) -> usize {
        self.l.bytes() + self.own.as_ref().map_or(0, Sketch::bytes) + 624 * 4
    }
}
