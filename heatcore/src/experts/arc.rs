//! `policies/adaptive/arc.py` (Megiddo & Modha, FAST 2003, Fig. 4).

use super::lists::Lists;
use super::{Env, Expert};

const T1: u8 = 0;
const T2: u8 = 1;
const B1: u8 = 2;
const B2: u8 = 3;

pub struct Arc {
    capacity: usize,
    p: f64,
    l: Lists<()>,
}

impl Arc {
    pub fn new(capacity: usize) -> Self {
        Arc {
            capacity,
            p: 0.0,
            l: Lists::default(),
        }
    }

    fn replace(&mut self, in_b2: bool, out: &mut Vec<u64>) {
        let t1 = self.l.len(T1);
        let t1f = t1 as f64;
        let from_t1 = t1 > 0 && ((in_b2 && t1f == self.p) || t1f > self.p || self.l.len(T2) == 0);
        let (from, to) = if from_t1 { (T1, B1) } else { (T2, B2) };
        let i = self
            .l
            .front(from)
            .expect("ARC replaces from a non-empty list");
        let victim = self.l.key(i);
        self.l.move_back(i, to);
        out.push(victim);
    }
}

impl Expert for Arc {
    fn contains(&self, key: u64) -> bool {
        matches!(self.l.which(key), Some(T1) | Some(T2))
    }
    fn len(&self) -> usize {
        self.l.len(T1) + self.l.len(T2)
    }
    fn on_hit(&mut self, key: u64, _env: &mut Env) {
        if let Some(i) = self.l.find(key) {
            self.l.move_back(i, T2);
        }
    }
    fn on_miss(&mut self, key: u64, _env: &mut Env, out: &mut Vec<u64>) {
        let c = self.capacity;
        let full = self.l.len(T1) + self.l.len(T2) >= c;
        match self.l.find(key) {
            Some(i) if self.l.list(i) == B1 => {
                let ratio = (self.l.len(B2) as f64 / self.l.len(B1) as f64).max(1.0);
                self.p = (c as f64).min(self.p + ratio);
                self.l.remove(i);
                if full {
                    self.replace(false, out);
                }
                self.l.push_back(T2, key, ());
                return;
            }
            Some(i) if self.l.list(i) == B2 => {
                let ratio = (self.l.len(B1) as f64 / self.l.len(B2) as f64).max(1.0);
                self.p = (self.p - ratio).max(0.0);
                self.l.remove(i);
                if full {
                    self.replace(true, out);
                }
                self.l.push_back(T2, key, ());
                return;
            }
            _ => {}
        }
        let l1 = self.l.len(T1) + self.l.len(B1);
        let total = l1 + self.l.len(T2) + self.l.len(B2);
        if l1 >= c {
            if self.l.len(T1) < c {
                self.l.pop_front(B1);
                if full {
                    self.replace(false, out);
                }
            } else {
                let (victim, ()) = self.l.pop_front(T1).expect("T1 holds the cache");
                out.push(victim);
            }
        } else if total >= c {
            if total >= 2 * c {
                self.l.pop_front(B2);
            }
            if full {
                self.replace(false, out);
            }
        }
        self.l.push_back(T1, key, ());
    }
    fn on_remove(&mut self, key: u64) {
        if let Some(i) = self.l.find(key) {
            if self.l.list(i) <= T2 {
                self.l.remove(i);
            }
        }
    }
    fn bytes(&self) -> usize {
        self.l.bytes()
    }
}
