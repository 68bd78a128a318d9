//! How much later than predicted local answers come, learned from the answers, so that
//! [`super::offload::decide`] keeps a request local only when it will be in time
//! with the error the device actually shows (sans-IO).
//!
//! [`super::offload::RequestContext::predicted_local_us`] is (queue ahead + 1) × the
//! service-time estimate. On a shared machine the service time moves in spells (the
//! bench's 2,000 samples on a 2-vCPU VM had two modes, 2.1 and 3.7 ms, alternating in
//! runs of a hundred or so), so after a fast spell a long queue is predicted at the fast
//! time and answered at the slow one: 1.7 × late. The error of a prediction grows with
//! it, so it is learned relative to the prediction: each local answer reports
//! `measured / predicted − 1` (at least 0), and the margin is `m + z·σ` of those
//! (exponentially weighted, 1/64 per answer), with `z` raised by answers past the
//! deadline and lowered by answers in time until misses are [`LocalLateness::MISS_TARGET`]
//! of the answers, never below the `z` it started with (as
//! [`super::batching::AdmissionControl`] does for the batcher's absolute error).
//!
//! Chosen on four sets of service times measured by `nephele bench inference --only
//! offload` on this project's 2-vCPU AMD EPYC machine (within the SLO 98.9–99.3 % with
//! an absolute margin, 99.3–99.6 % with this relative one, at 48.4–49.4 % sent to the
//! cloud against 47.3–48.2 % with no margin); the README reports it on later runs.

use serde::{Deserialize, Serialize};

/// The learned relative lateness of local answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalLateness {
    mean: f64,
    var: f64,
    z: f64,
    z_floor: f64,
}

impl Default for LocalLateness {
    fn default() -> Self {
        LocalLateness::new(crate::batching::DEFAULT_ERROR_QUANTILE_Z)
    }
}

impl LocalLateness {
    /// Weight of one answer in the mean and variance.
    pub const WEIGHT: f64 = 1.0 / 64.0;
    /// The share of local answers that may be past the deadline: half the 1 % a p99
    /// objective leaves.
    pub const MISS_TARGET: f64 = 0.005;
    /// How far one answer moves `z` (up on a miss, down by this × the target in time).
    pub const Z_STEP: f64 = 0.05;
    /// The most `z` is raised to.
    pub const Z_MAX: f64 = 8.0;

    /// Keeps `z` standard deviations of the error in hand (non-finite or negative is 0).
    pub fn new(z: f64) -> Self {
        let z = if z.is_finite() {
            z.clamp(0.0, Self::Z_MAX)
        } else {
            0.0
        };
        LocalLateness {
            mean: 0.0,
            var: 0.0,
            z,
            z_floor: z,
        }
    }

    /// The margin as thousandths of the prediction, for
    /// [`super::offload::RequestContext::local_margin_permille`].
    pub fn margin_permille(&self) -> u32 {
        let margin = self.mean + self.z * self.var.max(0.0).sqrt();
        if margin.is_finite() && margin > 0.0 {
            (margin * 1000.0).round().min(f64::from(u32::MAX)) as u32
        } else {
            0
        }
    }

    /// One local answer: predicted `predicted_us`, answered in `measured_us`, against
    /// `deadline_us`. A prediction of 0 (no service time measured yet) teaches nothing.
    pub fn observe(&mut self, predicted_us: u64, measured_us: u64, deadline_us: u64) {
        if predicted_us == 0 {
            return;
        }
        let missed = f64::from(u8::from(measured_us > deadline_us));
        self.z = (self.z + Self::Z_STEP * (missed - Self::MISS_TARGET))
            .clamp(self.z_floor, Self::Z_MAX.max(self.z_floor));
        let error = (measured_us as f64 / predicted_us as f64 - 1.0).max(0.0);
        let delta = error - self.mean;
        self.mean += Self::WEIGHT * delta;
        self.var = (1.0 - Self::WEIGHT) * (self.var + Self::WEIGHT * delta * delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_on_time_keep_no_margin_and_late_ones_raise_it() {
        let mut lateness = LocalLateness::default();
        assert_eq!(lateness.margin_permille(), 0);
        for _ in 0..200 {
            lateness.observe(10_000, 9_000, 20_000);
        }
        assert_eq!(
            lateness.margin_permille(),
            0,
            "early answers are an error of 0"
        );
        // A spell 1.7 × slower than predicted, past the deadline.
        for _ in 0..100 {
            lateness.observe(15_000, 25_500, 20_000);
        }
        let raised = lateness.margin_permille();
        assert!(raised > 500, "{raised}");
        // The margin is forgotten as answers come back in time.
        for _ in 0..2_000 {
            lateness.observe(10_000, 10_000, 20_000);
        }
        assert!(lateness.margin_permille() < raised / 10);
    }

    #[test]
    fn no_input_makes_it_panic_or_go_negative() {
        let mut lateness = LocalLateness::new(f64::NAN);
        lateness.observe(0, u64::MAX, 0);
        lateness.observe(1, u64::MAX, 0);
        lateness.observe(u64::MAX, 0, u64::MAX);
        let _ = lateness.margin_permille();
        assert_eq!(LocalLateness::new(-1.0).margin_permille(), 0);
    }
}
