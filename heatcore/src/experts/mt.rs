//! Python's `random.Random(seed)` (MT19937 seeded by `init_by_array` over the seed's 32-bit words),
//! for `getrandbits(k)` with k <= 32: TinyLFU's hash-flooding escape draws from it.

const N: usize = 624;
const M: usize = 397;

pub struct Mt {
    mt: [u32; N],
    i: usize,
}

impl Mt {
    pub fn new(seed: u64) -> Self {
        let mut key = vec![seed as u32];
        if seed >> 32 != 0 {
            key.push((seed >> 32) as u32);
        }
        let mut mt = [0u32; N];
        mt[0] = 19_650_218;
        for i in 1..N {
            mt[i] = 1_812_433_253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        Mt { mt, i: N }
    }

    fn twist(&mut self) {
        for k in 0..N {
            let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % N] & 0x7fff_ffff);
            let mut v = self.mt[(k + M) % N] ^ (y >> 1);
            if y & 1 == 1 {
                v ^= 0x9908_b0df;
            }
            self.mt[k] = v;
        }
        self.i = 0;
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.i >= N {
            self.twist();
        }
        let mut y = self.mt[self.i];
        self.i += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `getrandbits(k)`, 1 <= k <= 32.
    pub fn bits(&mut self, k: u32) -> u32 {
        self.next_u32() >> (32 - k)
    }
}

#[cfg(test)]
mod tests {
    use super::Mt;

    #[test]
    fn matches_python_random_zero() {
        // python -c "import random; r = random.Random(0); print([r.getrandbits(32) for _ in range(3)])"
        let mut r = Mt::new(0);
        assert_eq!(
            [r.next_u32(), r.next_u32(), r.next_u32()],
            [3_626_764_237, 1_654_615_998, 3_255_389_356]
        );
    }
}
