//! `policies/learned/ghosts.py`: last tick and CRF of recently evicted keys, two-way set associative.

use crate::fastmod::FastMod;

const MIX1: u64 = 0x9E37_79B9_7F4A_7C15;
const MIX2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const EMPTY: i64 = -1;

/// Python's `hash()` of an int (the ghost table's tag there).
pub fn py_hash(n: i64) -> i64 {
    const P: u128 = (1u128 << 61) - 1;
    if (0..P as i64).contains(&n) {
        return n; // below the modulus: itself, as in Python
    }
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

/// One slot: a key's tag, the tick it was last seen (EMPTY: free) and its CRF, side by side so that a
/// probe reads one place in memory instead of three arrays (20 bytes: packed).
#[derive(Clone, Copy)]
#[repr(C, packed)]
pub struct Cell {
    tag: i64,
    last: i64,
    crf: f32,
}

pub struct Ghosts {
    n: FastMod,
    cells: Vec<Cell>,
}

impl Ghosts {
    pub fn new(slots: usize) -> Self {
        let n = slots.max(2);
        Ghosts {
            n: FastMod::new(n as u64),
            cells: vec![
                Cell {
                    tag: 0,
                    last: EMPTY,
                    crf: 0.0,
                };
                n
            ],
        }
    }

    /// The table as the Python reference holds it (`policies/learned/ghosts.py`'s three arrays).
    pub fn load(&mut self, tag: &[i64], last: &[i64], crf: &[f32]) -> bool {
        let n = self.cells.len();
        if tag.len() != n || last.len() != n || crf.len() != n {
            return false;
        }
        for (i, cell) in self.cells.iter_mut().enumerate() {
            *cell = Cell {
                tag: tag[i],
                last: last[i],
                crf: crf[i],
            };
        }
        true
    }

    fn slots(&self, key: i64) -> (i64, usize, usize) {
        let h = py_hash(key);
        let a = self.n.rem((h as u64).wrapping_mul(MIX1)) as usize;
        let mut b = self.n.rem((h as u64).wrapping_mul(MIX2)) as usize;
        if b == a {
            b = (a + 1) % self.cells.len();
        }
        (h, a, b)
    }

    pub fn pop(&mut self, key: i64) -> Option<(i64, f64)> {
        let (h, a, b) = self.slots(key);
        for i in [a, b] {
            let Cell { tag, last, crf } = self.cells[i];
            if last != EMPTY && tag == h {
                self.cells[i].last = EMPTY;
                return Some((last, crf as f64));
            }
        }
        None
    }

    pub fn put(&mut self, key: i64, last_tick: i64, crf: f64) {
        let (h, a, b) = self.slots(key);
        let (la, lb) = (self.cells[a].last, self.cells[b].last);
        let i = if la == EMPTY || (lb != EMPTY && la <= lb) {
            a
        } else {
            b
        };
        self.cells[i] = Cell {
            tag: h,
            last: last_tick,
            crf: crf as f32,
        };
    }

    pub fn bytes(&self) -> usize {
        self.cells.len() * std::mem::size_of::<Cell>()
    }
}
