//! `policies/fifo/sieve.py` (NSDI 2024): one queue, oldest first, and the hand; the Python keeps the
//! queue as two maps split at the hand, which is the same queue.

use super::lists::{Lists, NIL};
use super::{Env, Expert};

pub struct Sieve {
    capacity: usize,
    q: Lists<bool>, // visited
    hand: u32,      // the next node the sweep looks at (NIL: past the newest)
}

impl Sieve {
    pub fn new(capacity: usize) -> Self {
        Sieve {
            capacity,
            q: Lists::default(),
            hand: NIL,
        }
    }

    fn evict(&mut self) -> u64 {
        loop {
            if self.hand == NIL {
                self.hand = self
                    .q
                    .front(0)
                    .expect("SIEVE evicts from a non-empty queue");
            }
            let i = self.hand;
            self.hand = self.q.next(i).unwrap_or(NIL);
            if !self.q.val(i) {
                return self.q.remove(i).0;
            }
            *self.q.val_mut(i) = false;
        }
    }
}

impl Expert for Sieve {
    fn contains(&self, key: u64) -> bool {
        self.q.find(key).is_some()
    }
    fn len(&self) -> usize {
        self.q.total()
    }
    fn on_hit(&mut self, key: u64, _env: &mut Env) {
        if let Some(i) = self.q.find(key) {
            *self.q.val_mut(i) = true;
        }
    }
    fn on_miss(&mut self, key: u64, _env: &mut Env, out: &mut Vec<u64>) {
        if self.q.total() >= self.capacity {
            out.push(self.evict());
        }
        if self.hand == NIL {
            self.hand = self.q.front(0).unwrap_or(NIL);
        }
        let i = self.q.push_back(0, key, false);
        if self.hand == NIL {
            self.hand = i;
        }
    }
    fn on_remove(&mut self, key: u64) {
        if let Some(i) = self.q.find(key) {
            if i == self.hand {
                self.hand = self.q.next(i).unwrap_or(NIL);
            }
            self.q.remove(i);
        }
    }
    fn bytes(&self) -> usize {
        self.q.bytes()
    }
}
