//! The count-min sketch with doorkeeper and aging of `policies/admission/sketch.py`, bit for bit on
//! integer keys (same hash, same rows, same reset).

const MIX: u64 = 0x9E37_79B9_7F4A_7C15;
const DEPTH: usize = 4;

/// `stable_hash` of an integer key (the Python one hashes `key & 2**64-1`).
pub fn stable_hash(key: u64, seed: u64) -> u64 {
    let mut h = (key ^ seed.wrapping_mul(MIX)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 31;
    h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 29)
}

fn next_pow2(n: u64) -> u64 {
    if n <= 1 {
        1
    } else {
        1u64 << (64 - (n - 1).leading_zeros())
    }
}

pub type Pos = ([usize; 4], u64, u64);

pub struct Sketch {
    width: u64,
    mask: u64,
    table: Vec<u8>,
    pub sample_size: u64,
    pub additions: u64,
    pub resets: u32,
    seed: u64,
    door_bits: u64,
    door: Vec<u8>,
}

impl Sketch {
    pub fn new(capacity: u64, seed: u64) -> Self {
        let width = next_pow2(16.max(4 * capacity));
        let sample_size = 16.max(10 * capacity);
        let door_bits = next_pow2(8 * sample_size);
        Sketch {
            width,
            mask: width - 1,
            table: vec![0; DEPTH * width as usize],
            sample_size,
            additions: 0,
            resets: 0,
            seed,
            door_bits,
            door: vec![0; 1.max((door_bits >> 3) as usize)],
        }
    }

    /// `new`, or `off` unless `on`.
    pub fn counting(on: bool, capacity: u64, seed: u64) -> Self {
        if on {
            Sketch::new(capacity, seed)
        } else {
            Sketch::off()
        }
    }

    /// A sketch that counts nothing (frequency 0): for a core no decision of which reads it.
    pub fn off() -> Self {
        Sketch {
            width: 0,
            mask: 0,
            table: Vec::new(),
            sample_size: u64::MAX,
            additions: 0,
            resets: 0,
            seed: 0,
            door_bits: 0,
            door: Vec::new(),
        }
    }

    /// Where `key` counts: its four counters and two doorkeeper bits.
    pub fn positions(&self, key: i64) -> Pos {
        if self.table.is_empty() {
            return ([0; 4], 0, 0);
        }
        let h = stable_hash(key as u64, self.seed);
        let (m, w) = (self.mask, self.width);
        let rows = if w <= 1 << 16 {
            [
                h & m,
                w + ((h >> 16) & m),
                2 * w + ((h >> 32) & m),
                3 * w + ((h >> 48) & m),
            ]
        } else {
            let g = stable_hash(h ^ 0x5555, self.seed);
            [
                h & m,
                w + ((h >> 32) & m),
                2 * w + (g & m),
                3 * w + ((g >> 32) & m),
            ]
        };
        let dm = self.door_bits - 1;
        let g = h.wrapping_mul(MIX);
        (rows.map(|r| r as usize), (g >> 40) & dm, (g >> 13) & dm)
    }

    fn door_has(&self, x: u64, y: u64) -> bool {
        (self.door[(x >> 3) as usize] >> (x & 7)) & 1 == 1
            && (self.door[(y >> 3) as usize] >> (y & 7)) & 1 == 1
    }

    pub fn frequency_at(&self, pos: &Pos) -> u8 {
        if self.table.is_empty() {
            return 0;
        }
        let (rows, x, y) = *pos;
        let t = &self.table;
        let f = t[rows[0]].min(t[rows[1]]).min(t[rows[2]]).min(t[rows[3]]);
        if self.door_has(x, y) {
            f + 1
        } else {
            f
        }
    }

    pub fn increment_at(&mut self, pos: &Pos) {
        if self.table.is_empty() {
            return;
        }
        let (rows, x, y) = *pos;
        if !self.door_has(x, y) {
            self.door[(x >> 3) as usize] |= 1 << (x & 7);
            self.door[(y >> 3) as usize] |= 1 << (y & 7);
        } else {
            for r in rows {
                if self.table[r] < 15 {
                    self.table[r] += 1;
                }
            }
        }
        self.additions += 1;
        if self.additions >= self.sample_size {
            self.reset();
        }
    }

    fn reset(&mut self) {
        for c in self.table.iter_mut() {
            *c >>= 1;
        }
        self.additions /= 2;
        self.resets += 1;
        self.door.iter_mut().for_each(|b| *b = 0);
    }

    /// Takes over the state of a Python sketch of the same shape.
    pub fn load(
        &mut self,
        table: &[u8],
        door: &[u8],
        additions: u64,
        resets: u32,
    ) -> Result<(), String> {
        if table.len() != self.table.len() || door.len() != self.door.len() {
            return Err(format!(
                "sketch of {} / {} bytes does not fit {} / {}",
                table.len(),
                door.len(),
                self.table.len(),
                self.door.len()
            ));
        }
        self.table.copy_from_slice(table);
        self.door.copy_from_slice(door);
        self.additions = additions;
        self.resets = resets;
        Ok(())
    }

    /// The counters and the doorkeeper, as `load` takes them.
    pub fn state(&self) -> (&[u8], &[u8]) {
        (&self.table, &self.door)
    }

    pub fn bytes(&self) -> usize {
        self.table.len() + self.door.len()
    }
}
