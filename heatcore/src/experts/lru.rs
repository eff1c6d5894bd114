//! `policies/recency/lru.py`, counting entries.

use super::lists::Lists;
use super::{Env, Expert};

pub struct Lru {
    capacity: usize,
    entries: Lists<()>,
}

impl Lru {
    pub fn new(capacity: usize) -> Self {
        Lru {
            capacity,
            entries: Lists::default(),
        }
    }
}

impl Expert for Lru {
    fn contains(&self, key: u64) -> bool {
        self.entries.find(key).is_some()
    }
    fn len(&self) -> usize {
        self.entries.total()
    }
    fn on_hit(&mut self, key: u64, _env: &mut Env) {
        if let Some(i) = self.entries.find(key) {
            self.entries.move_back(i, 0);
        }
    }
    fn on_miss(&mut self, key: u64, _env: &mut Env, out: &mut Vec<u64>) {
        while self.entries.total() + 1 > self.capacity {
            let (victim, ()) = self
                .entries
                .pop_front(0)
                .expect("a full cache holds something");
            out.push(victim);
        }
        self.entries.push_back(0, key, ());
    }
    fn on_remove(&mut self, key: u64) {
        if let Some(i) = self.entries.find(key) {
            self.entries.remove(i);
        }
    }
    fn bytes(&self) -> usize {
        self.entries.bytes()
    }
}
