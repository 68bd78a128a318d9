//! Which traces are recorded: parent-based, as OpenTelemetry's default sampler is. A
//! request that arrives with a trace context follows its caller's decision (the
//! `sampled` flag), so a trace is recorded whole or not at all; a request that starts
//! a trace is recorded with probability `ratio`, decided from the trace id alone
//! (its rightmost 56 bits, the ones W3C trace context level 2 makes random), so every
//! process that sees the trace decides alike.

/// The sampling rule of one process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    ratio: f64,
}

impl Sampler {
    /// `ratio` in 0..=1 (clamped): the share of new traces recorded.
    pub fn new(ratio: f64) -> Sampler {
        let ratio = if ratio.is_nan() {
            0.0
        } else {
            ratio.clamp(0.0, 1.0)
        };
        Sampler { ratio }
    }

    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// Whether a span of `trace_id` is recorded: the caller's decision when there is
    /// a caller (`parent_sampled`), else the ratio's.
    pub fn sample(&self, trace_id: &[u8; 16], parent_sampled: Option<bool>) -> bool {
        if let Some(sampled) = parent_sampled {
            return sampled;
        }
        if self.ratio >= 1.0 {
            return true;
        }
        let mut low = [0u8; 8];
        low[1..].copy_from_slice(&trace_id[9..]);
        let random = u64::from_be_bytes(low);
        (random as f64) < self.ratio * (1u64 << 56) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_callers_decision_wins() {
        let sampler = Sampler::new(0.0);
        assert!(sampler.sample(&[7; 16], Some(true)));
        assert!(!Sampler::new(1.0).sample(&[7; 16], Some(false)));
    }

    #[test]
    fn the_ratio_decides_new_traces_at_about_its_share() {
        let sampler = Sampler::new(0.25);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut recorded = 0;
        for _ in 0..20_000 {
            let mut id = [0u8; 16];
            for chunk in id.chunks_mut(8) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                chunk.copy_from_slice(&rng.to_le_bytes());
            }
            recorded += usize::from(sampler.sample(&id, None));
        }
        let share = recorded as f64 / 20_000.0;
        assert!((0.23..0.27).contains(&share), "recorded {share}");
    }

    proptest! {
        #[test]
        fn all_and_nothing_are_exact(id in any::<[u8; 16]>()) {
            prop_assert!(Sampler::new(1.0).sample(&id, None));
            prop_assert!(!Sampler::new(0.0).sample(&id, None));
        }

        #[test]
        fn a_larger_ratio_records_every_trace_a_smaller_one_does(
            id in any::<[u8; 16]>(), a in 0.0f64..1.0, b in 0.0f64..1.0,
        ) {
            let (low, high) = if a < b { (a, b) } else { (b, a) };
            if Sampler::new(low).sample(&id, None) {
                prop_assert!(Sampler::new(high).sample(&id, None));
            }
        }
    }
}
