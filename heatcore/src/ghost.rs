//! `policies/learned/ghosts.py`: last tick and CRF of recently evicted keys, two-way set associative.

use crate::fastmod::FastMod;

const MIX1: u64 = 0x9E37_79B9_7F4A_7C15;
const MIX2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const EMPTY: i64 = -1;

/// Python's `hash()` of an int (the ghost table's tag there).
pub fn py_hash(n: i64) -> i64 {
    const P: u128 = (1u128 << 61) - 1;
    if n >= 0 {
        ((n as u128) % P) as i64
    } else {
        let r = -(((n as i128).unsigned_abs() % P) as i64);
        if r == -1 {
            -2
        } else {
            r
        }
    }
}

pub struct Ghosts {
    n: FastMod,
    pub tag: Vec<i64>,
    pub last: Vec<i64>,
    pub crf: Vec<f32>,
}

impl Ghosts {
    pub fn new(slots: usize) -> Self {
        let n = slots.max(2);
        Ghosts {
            n: FastMod::new(n as u64),
            tag: vec![0; n],
            last: vec![EMPTY; n],
            crf: vec![0.0; n],
        }
    }

    fn cells(&self, key: i64) -> (i64, usize, usize) {
        let h = py_hash(key);
        let a = self.n.rem((h as u64).wrapping_mul(MIX1)) as usize;
        let mut b = self.n.rem((h as u64).wrapping_mul(MIX2)) as usize;
        if b == a {
            b = (a + 1) % self.tag.len();
        }
        (h, a, b)
    }

    pub fn pop(&mut self, key: i64) -> Option<(i64, f64)> {
        let (h, a, b) = self.cells(key);
        for i in [a, b] {
            if self.last[i] != EMPTY && self.tag[i] == h {
                let out = (self.last[i], self.crf[i] as f64);
                self.last[i] = EMPTY;
                return Some(out);
            }
        }
        None
    }

    pub fn put(&mut self, key: i64, last_tick: i64, crf: f64) {
        let (h, a, b) = self.cells(key);
        let last = &self.last;
        let i = if last[a] == EMPTY || (last[b] != EMPTY && last[a] <= last[b]) {
            a
        } else {
            b
        };
        self.tag[i] = h;
        self.last[i] = last_tick;
        self.crf[i] = crf as f32;
    }

    pub fn bytes(&self) -> usize {
        self.tag.len() * 20
    }
}
