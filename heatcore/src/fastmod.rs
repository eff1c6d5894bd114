//! `a % d` for a fixed 64-bit divisor without a division (Lemire, Kaser & Kurz, "Faster Remainder by
//! Direct Computation", 2019): exact for every 64-bit `a`.

#[derive(Clone, Copy)]
pub struct FastMod {
    m: u128,
    d: u64,
}

impl FastMod {
    pub fn new(d: u64) -> Self {
        assert!(d > 0);
        FastMod {
            m: (u128::MAX / d as u128).wrapping_add(1),
            d,
        }
    }

    #[inline]
    pub fn rem(&self, a: u64) -> u64 {
        let low = self.m.wrapping_mul(a as u128);
        // high 64 bits of the 192-bit product low * d
        let lo = (low as u64) as u128 * self.d as u128;
        let hi = (low >> 64) * self.d as u128;
        ((hi + (lo >> 64)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::FastMod;

    #[test]
    fn matches_the_remainder() {
        let mut x: u64 = 0x1234_5678_9abc_def1;
        for d in [
            1u64,
            2,
            3,
            7,
            32,
            40_000,
            4_000_004,
            90_000,
            u64::MAX,
            (1 << 61) - 1,
        ] {
            let f = FastMod::new(d);
            for _ in 0..20_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                assert_eq!(f.rem(x), x % d, "{x} % {d}");
                assert_eq!(f.rem(x >> 40), (x >> 40) % d);
            }
            assert_eq!(f.rem(0), 0);
            assert_eq!(f.rem(u64::MAX), u64::MAX % d);
        }
    }
}
