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
        lo + self.next_u64() % (hi - lo + 1)
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
