//! Randomness for jitter: reconnect delays and lookupd polls spread out so that many
//! consumers do not act in step. Not for anything that needs real randomness.

use std::hash::{BuildHasher, Hasher};

/// A uniformly random number in `[0, 1)`, good enough for jitter (not for anything else).
pub(crate) fn random_unit() -> f64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x9e37_79b9_7f4a_7c15);
            h.finish() | 1
        });
    }
    STATE.with(|s| {
        // xorshift64*
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_unit_stays_in_range() {
        for _ in 0..10_000 {
            let x = random_unit();
            assert!((0.0..1.0).contains(&x), "{x}");
        }
    }
}
