//! `policies/adaptive/lirs.py` (Jiang & Zhang, SIGMETRICS 2002, §4.2): the stack S, and the queue Q
//! of resident HIR blocks beside the ghosts (non-resident HIR blocks still in S), oldest first. A
//! block's status is where it is: in Q, HIR; a ghost, GHOST; in S only, LIR.

use super::lists::Lists;
use super::{Env, Expert};

const QUEUE: u8 = 0;
const GHOSTS: u8 = 1;
const MAX_GHOSTS: usize = 1 << 18;

#[derive(PartialEq)]
enum Status {
    Lir,
    Hir,
    Ghost,
}

pub struct Lirs {
    capacity: usize,
    lir_max: usize,
    ghost_max: usize,
    stack: Lists<()>,
    hq: Lists<()>,
    lir: usize,
}

impl Lirs {
    pub fn new(capacity: usize) -> Self {
        let hir_max = capacity.min(((0.01 * capacity as f64).round_ties_even() as usize).max(1));
        let ghost_max = ((10.0 * capacity as f64) as usize)
            .min(capacity.max(MAX_GHOSTS))
            .max(1);
        Lirs {
            capacity,
            lir_max: capacity - hir_max,
            ghost_max,
            stack: Lists::default(),
            hq: Lists::default(),
            lir: 0,
        }
    }

    fn status(&self, key: u64) -> Option<Status> {
        match self.hq.which(key) {
            Some(QUEUE) => Some(Status::Hir),
            Some(_) => Some(Status::Ghost),
            None => self.stack.find(key).map(|_| Status::Lir),
        }
    }

    fn prune(&mut self) {
        while let Some(i) = self.stack.front(0) {
            let key = self.stack.key(i);
            match self.hq.find(key) {
                None => return, // LIR
                Some(j) => {
                    self.stack.remove(i);
                    if self.hq.list(j) == GHOSTS {
                        self.hq.remove(j);
                    }
                }
            }
        }
    }

    fn demote_bottom(&mut self) {
        self.prune();
        let (key, ()) = self.stack.pop_front(0).expect("a LIR block to demote");
        self.lir -= 1;
        self.hq.push_back(QUEUE, key, ());
        self.prune();
    }

    /// `key` (in neither Q nor the ghosts) becomes LIR, the newest in S.
    fn make_lir(&mut self, key: u64) {
        self.lir += 1;
        match self.stack.find(key) {
            Some(i) => self.stack.move_back(i, 0),
            None => {
                self.stack.push_back(0, key, ());
            }
        }
        while self.lir > self.lir_max {
            self.demote_bottom();
        }
    }

    fn evict(&mut self) -> u64 {
        if let Some((victim, ())) = self.hq.pop_front(QUEUE) {
            if self.stack.find(victim).is_some() {
                self.hq.push_back(GHOSTS, victim, ());
                if self.hq.len(GHOSTS) > self.ghost_max {
                    let (old, ()) = self.hq.pop_front(GHOSTS).expect("a ghost");
                    let i = self.stack.find(old).expect("a ghost is in S");
                    self.stack.remove(i);
                }
            }
            victim
        } else {
            let (victim, ()) = self.stack.pop_front(0).expect("a resident block");
            self.lir -= 1;
            self.prune();
            victim
        }
    }
}

impl Expert for Lirs {
    fn contains(&self, key: u64) -> bool {
        matches!(self.status(key), Some(Status::Lir) | Some(Status::Hir))
    }
    fn len(&self) -> usize {
        self.lir + self.hq.len(QUEUE)
    }
    fn on_hit(&mut self, key: u64, _env: &mut Env) {
        match self.status(key) {
            Some(Status::Lir) => {
                let i = self.stack.find(key).expect("LIR is in S");
                let bottom = self.stack.front(0) == Some(i);
                self.stack.move_back(i, 0);
                if bottom {
                    self.prune();
                }
            }
            Some(Status::Hir) => {
                let j = self.hq.find(key).expect("HIR is in Q");
                if self.stack.find(key).is_some() {
                    self.hq.remove(j);
                    self.make_lir(key);
                } else {
                    self.stack.push_back(0, key, ());
                    self.hq.move_back(j, QUEUE);
                }
            }
            _ => {}
        }
    }
    fn on_miss(&mut self, key: u64, _env: &mut Env, out: &mut Vec<u64>) {
        let mut status = self.status(key);
        if status.is_none() && self.lir < self.lir_max {
            self.make_lir(key);
            return;
        }
        if self.len() >= self.capacity {
            out.push(self.evict());
            status = self.status(key);
        }
        if status == Some(Status::Ghost) {
            let j = self.hq.find(key).expect("a ghost");
            self.hq.remove(j);
            self.make_lir(key);
        } else {
            self.stack.push_back(0, key, ());
            self.hq.push_back(QUEUE, key, ());
        }
    }
    fn on_remove(&mut self, key: u64) {
        match self.status(key) {
            Some(Status::Lir) => {
                let i = self.stack.find(key).expect("LIR is in S");
                self.stack.remove(i);
                self.lir -= 1;
                self.prune();
            }
            Some(Status::Hir) => {
                let j = self.hq.find(key).expect("HIR is in Q");
                self.hq.remove(j);
                if let Some(i) = self.stack.find(key) {
                    self.stack.remove(i);
                }
            }
            _ => {}
        }
    }
    fn bytes(&self) -> usize {
        self.stack.bytes() + self.hq.bytes()
    }
}
