//! Key -> slot: open addressing over slot numbers only (the keys live in the entry table), linear
//! probing, backward-shift deletion. Sized once for every slot at a load of at most one half.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Integer keys hash with one multiply (they are block hashes or dense ids already).
#[derive(Default)]
pub struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_i64(&mut self, n: i64) {
        let h = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}
pub type IdMap<V> = HashMap<i64, V, BuildHasherDefault<IdHasher>>;

pub struct KeyIndex {
    cells: Vec<u32>, // 0: empty, else slot + 1
    mask: usize,
    len: usize,
}

#[inline]
fn home(key: i64, mask: usize) -> usize {
    let h = (key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((h ^ (h >> 32)) as usize) & mask
}

impl KeyIndex {
    pub fn new(slots: usize) -> Self {
        let n = (2 * slots).next_power_of_two().max(8);
        KeyIndex {
            cells: vec![0; n],
            mask: n - 1,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn get(&self, key: i64, keys: &[i64]) -> Option<u32> {
        let mut i = home(key, self.mask);
        loop {
            let c = self.cells[i];
            if c == 0 {
                return None;
            }
            if keys[(c - 1) as usize] == key {
                return Some(c - 1);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// `key` (not present) now lives at `slot` (`keys[slot] == key` already).
    pub fn insert(&mut self, key: i64, slot: u32) {
        let mut i = home(key, self.mask);
        while self.cells[i] != 0 {
            i = (i + 1) & self.mask;
        }
        self.cells[i] = slot + 1;
        self.len += 1;
    }

    pub fn remove(&mut self, key: i64, keys: &[i64]) {
        let mut i = home(key, self.mask);
        loop {
            let c = self.cells[i];
            if c == 0 {
                return;
            }
            if keys[(c - 1) as usize] == key {
                break;
            }
            i = (i + 1) & self.mask;
        }
        // backward shift: pull later members of the probe run into the hole where they may live
        let mut hole = i;
        let mut j = (i + 1) & self.mask;
        loop {
            let c = self.cells[j];
            if c == 0 {
                break;
            }
            let h = home(keys[(c - 1) as usize], self.mask);
            // `c` may move to `hole` when its home is not cyclically within (hole, j]
            let dist_home = j.wrapping_sub(h) & self.mask;
            let dist_hole = j.wrapping_sub(hole) & self.mask;
            if dist_home >= dist_hole {
                self.cells[hole] = c;
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        self.cells[hole] = 0;
        self.len -= 1;
    }

    pub fn bytes(&self) -> usize {
        self.cells.len() * 4
    }
}
