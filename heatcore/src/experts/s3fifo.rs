//! `policies/fifo/s3fifo.py` (SOSP 2023, Algorithm 1; `fill_main_first`: libCacheSim's variant).

use super::lists::Lists;
use super::{Env, Expert};

const SMALL: u8 = 0;
const MAIN: u8 = 1;
const GHOST: u8 = 2;
const MOVE_THRESHOLD: u8 = 2;
const MAX_FREQ: u8 = 3;

pub struct S3Fifo {
    capacity: usize,
    small_max: usize,
    main_max: usize,
    ghost_max: usize,
    fill_main_first: bool,
    l: Lists<u8>, // frequency
    has_evicted: bool,
}

impl S3Fifo {
    pub fn new(capacity: usize, fill_main_first: bool) -> Self {
        let small_max = ((capacity as f64 * 0.10) as usize)
            .max(1)
            .min(capacity.saturating_sub(1).max(1));
        S3Fifo {
            capacity,
            small_max,
            main_max: capacity - small_max,
            ghost_max: (capacity as f64 * 0.90) as usize,
            fill_main_first,
            l: Lists::default(),
            has_evicted: false,
        }
    }

    fn resident(&self) -> usize {
        self.l.len(SMALL) + self.l.len(MAIN)
    }

    fn evict_small(&mut self) -> Option<u64> {
        while let Some(i) = self.l.front(SMALL) {
            if self.l.val(i) >= MOVE_THRESHOLD {
                *self.l.val_mut(i) = 0;
                self.l.move_back(i, MAIN);
                continue;
            }
            let key = self.l.key(i);
            if self.ghost_max > 0 {
                self.l.move_back(i, GHOST);
                *self.l.val_mut(i) = 0;
                if self.l.len(GHOST) > self.ghost_max {
                    self.l.pop_front(GHOST);
                }
            } else {
                self.l.remove(i);
            }
            return Some(key);
        }
        None
    }

    fn evict_main(&mut self) -> Option<u64> {
        while let Some(i) = self.l.front(MAIN) {
            let f = self.l.val(i);
            if f > 0 {
                *self.l.val_mut(i) = f - 1;
                self.l.move_back(i, MAIN);
                continue;
            }
            return Some(self.l.remove(i).0);
        }
        None
    }

    fn evict(&mut self) -> u64 {
        self.has_evicted = true;
        let victim = if self.l.len(MAIN) > self.main_max || self.l.len(SMALL) == 0 {
            self.evict_main()
        } else {
            self.evict_small().or_else(|| self.evict_main())
        };
        victim.expect("evicting from an empty cache")
    }
}

impl Expert for S3Fifo {
    fn contains(&self, key: u64) -> bool {
        matches!(self.l.which(key), Some(SMALL) | Some(MAIN))
    }
    fn len(&self) -> usize {
        self.resident()
    }
    fn on_hit(&mut self, key: u64, _env: &mut Env) {
        if let Some(i) = self.l.find(key) {
            let f = self.l.val_mut(i);
            *f = (*f + 1).min(MAX_FREQ);
        }
    }
    fn on_miss(&mut self, key: u64, _env: &mut Env, out: &mut Vec<u64>) {
        let was_ghost = match self.l.find(key) {
            Some(i) => {
                self.l.remove(i);
                true
            }
            None => false,
        };
        while self.resident() >= self.capacity {
            let victim = self.evict();
            out.push(victim);
        }
        let to = if was_ghost
            || (self.fill_main_first && !self.has_evicted && self.l.len(SMALL) >= self.small_max)
        {
            MAIN
        } else {
            SMALL
        };
        self.l.push_back(to, key, 0);
    }
    fn on_remove(&mut self, key: u64) {
        if let Some(i) = self.l.find(key) {
            self.l.remove(i);
        }
    }
    fn bytes(&self) -> usize {
        self.l.bytes()
    }
}
