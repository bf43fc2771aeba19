//! A small seeded generator (SplitMix64) for jitter, eviction draws and chaos. Every random
//! choice in the runtime takes its seed from configuration, so a run of a simulation can be
//! repeated exactly. Not for keys that must be unguessable: those come from [`unguessable_hex`].

/// SplitMix64: tiny, fast, and good enough for timing draws.
#[derive(Debug, Clone)]
pub struct SeededRng(u64);

impl SeededRng {
    /// A generator that always yields the same sequence for the same seed.
    pub fn new(seed: u64) -> Self {
        SeededRng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        // The whole range has 2^64 values: every draw is in it (and `hi - lo + 1` would wrap).
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.next_u64() % span,
            None => self.next_u64(),
        }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// 128 bits from the operating system's cryptographic generator, as 32 hex digits: for run
/// ids and the idempotency keys sent to payment APIs, which must not be guessable.
pub fn unguessable_hex() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(crate::json::hex(&bytes))
}

#[cfg(test)]
mod tests {
    use super::SeededRng;

    #[test]
    fn a_draw_stays_in_its_range_even_when_the_range_is_every_u64() {
        let mut rng = SeededRng::new(7);
        for _ in 0..1_000 {
            let n = rng.between(10, 20);
            assert!((10..=20).contains(&n), "{n}");
        }
        let draws: Vec<u64> = (0..4).map(|_| rng.between(0, u64::MAX)).collect();
        assert!(draws.windows(2).any(|w| w[0] != w[1]), "the full range still draws: {draws:?}");
        assert_eq!(rng.between(5, 5), 5);
        assert_eq!(rng.between(9, 3), 9);
    }
}
