//! Admission control: refuse (429 with Retry-After) what cannot be served before its
//! deadline, instead of letting it wait and delay everything behind it. Nothing is
//! dropped silently: every refusal is a [`Verdict::Shed`] with its reason and a
//! Retry-After for the caller to send.
//!
//! Two parts, both pure:
//! - the **level** ([`Admission`]), set per deployment at each tick by the scaler: how
//!   long a request may wait before its service starts and still meet its deadline,
//!   and, when even the most replicas allowed cannot carry the offered rate, a maximum
//!   admitted rate;
//! - the **gate** ([`AdmissionGate::check`]), called by the shell for every request
//!   with `now_ms` and the wait the request would have at the replica it would be
//!   routed to (least outstanding): shed when that wait is past the level's bound (it
//!   would miss its deadline anyway), or when the token bucket of the rate limit is
//!   empty.
//!
//! Priorities: when a region cannot give every deployment the replicas it asks for,
//! [`grant_by_priority`] grants them highest priority first; a deployment granted
//! fewer than it needs gets a rate limit at what its grant can carry, so the lowest
//! priorities shed first.

use serde::{Deserialize, Serialize};

/// A deployment's admission level until the next tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Admission {
    /// Shed a request whose predicted wait before service is longer than this.
    /// `None`: no bound.
    pub max_wait_ms: Option<f64>,
    /// Admit at most this rate (token bucket); `None`: no limit.
    pub max_rate_per_s: Option<f64>,
    /// Tokens the bucket holds at most (the burst admitted at once).
    pub burst: f64,
    /// What a shed request is told to wait before retrying.
    pub retry_after_ms: u64,
}

impl Admission {
    /// Admit everything.
    pub fn open() -> Admission {
        Admission {
            max_wait_ms: None,
            max_rate_per_s: None,
            burst: 0.0,
            retry_after_ms: 0,
        }
    }

    pub fn is_open(&self) -> bool {
        self.max_wait_ms.is_none() && self.max_rate_per_s.is_none()
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShedReason {
    /// Its predicted wait is past its deadline's budget.
    PastDeadline,
    /// Over the admitted rate (the deployment is at its replica limit).
    OverRate,
}

/// The gate's answer for one request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Verdict {
    Admit,
    /// Answer 429 with `Retry-After: retry_after_ms` (rounded up to seconds on HTTP).
    Shed {
        retry_after_ms: u64,
        reason: ShedReason,
    },
}

/// The per-deployment token bucket behind [`Admission::max_rate_per_s`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct AdmissionGate {
    tokens: f64,
    last_ms: Option<u64>,
}

impl AdmissionGate {
    /// Decides one request arriving at `now_ms` that would wait `predicted_wait_ms`
    /// before its service starts (the shell's estimate at the replica it would go to).
    /// Admitting takes a token when the level has a rate limit.
    pub fn check(&mut self, now_ms: u64, level: &Admission, predicted_wait_ms: f64) -> Verdict {
        let retry_after_ms = level.retry_after_ms;
        if let Some(max_wait) = level.max_wait_ms {
            // A NaN wait is not a reason to refuse.
            if predicted_wait_ms > max_wait {
                return Verdict::Shed {
                    retry_after_ms,
                    reason: ShedReason::PastDeadline,
                };
            }
        }
        let Some(rate) = level.max_rate_per_s.filter(|rate| rate.is_finite()) else {
            return Verdict::Admit;
        };
        let burst = level.burst.max(1.0);
        let now_ms = self.last_ms.map_or(now_ms, |last| last.max(now_ms));
        match self.last_ms {
            None => self.tokens = burst,
            Some(last) => {
                let refill = (now_ms - last) as f64 / 1000.0 * rate.max(0.0);
                self.tokens = (self.tokens + refill).min(burst);
            }
        }
        self.last_ms = Some(now_ms);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Verdict::Admit
        } else {
            Verdict::Shed {
                retry_after_ms,
                reason: ShedReason::OverRate,
            }
        }
    }
}

/// The predicted wait of a request that joins a replica now: `ahead` requests are
/// queued or in service there, it serves `concurrency` at once at `service_ms` each.
/// With no ready replica, the time until the first one is (`until_ready_ms`).
pub fn predicted_wait_ms(
    ahead: u32,
    concurrency: u32,
    service_ms: f64,
    until_ready_ms: Option<f64>,
) -> f64 {
    let concurrency = concurrency.max(1);
    match until_ready_ms {
        Some(until_ready) => until_ready.max(0.0) + f64::from(ahead / concurrency) * service_ms,
        None if ahead < concurrency => 0.0,
        None => f64::from(ahead - concurrency + 1) / f64::from(concurrency) * service_ms,
    }
}

/// One deployment's ask for replicas in a region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    pub priority: u32,
    pub wanted: u32,
}

/// Shares `budget` replicas among `claims`, highest priority first (ties in the order
/// given), each getting what it wants while the budget lasts. Returns the grants in
/// the claims' order.
pub fn grant_by_priority(budget: u32, claims: &[Claim]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..claims.len()).collect();
    order.sort_by_key(|&idx| std::cmp::Reverse(claims[idx].priority));
    let mut left = budget;
    let mut grants = vec![0; claims.len()];
    for idx in order {
        let grant = claims[idx].wanted.min(left);
        grants[idx] = grant;
        left -= grant;
    }
    grants
}

/// The rate `replicas` can carry (requests per second, slots fully busy).
pub fn capacity_per_s(replicas: u32, concurrency: u32, service_ms: f64) -> f64 {
    if service_ms <= 0.0 || !service_ms.is_finite() {
        return f64::INFINITY;
    }
    f64::from(replicas) * f64::from(concurrency.max(1)) * 1000.0 / service_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(max_wait_ms: Option<f64>, rate: Option<f64>) -> Admission {
        Admission {
            max_wait_ms,
            max_rate_per_s: rate,
            burst: 2.0,
            retry_after_ms: 3_000,
        }
    }

    fn check(level: &Admission, arrivals: &[(u64, f64)], expected: &[bool]) {
        let mut gate = AdmissionGate::default();
        let got: Vec<bool> = arrivals
            .iter()
            .map(|(now, wait)| gate.check(*now, level, *wait) == Verdict::Admit)
            .collect();
        assert_eq!(got, expected, "{level:?} {arrivals:?}");
    }

    #[test]
    fn the_gate_sheds_past_the_deadline_and_over_the_rate() {
        check(&Admission::open(), &[(0, 1e9), (0, 1e9)], &[true, true]);
        check(
            &level(Some(100.0), None),
            &[(0, 50.0), (0, 100.0), (0, 101.0), (0, f64::NAN)],
            &[true, true, false, true],
        );
        // 1 req/s, burst 2: two at once, then one a second.
        check(
            &level(None, Some(1.0)),
            &[
                (0, 0.0),
                (0, 0.0),
                (0, 0.0),
                (1_000, 0.0),
                (1_500, 0.0),
                (3_000, 0.0),
            ],
            &[true, true, false, true, false, true],
        );
        let mut gate = AdmissionGate::default();
        assert_eq!(
            gate.check(0, &level(Some(0.0), None), 1.0),
            Verdict::Shed {
                retry_after_ms: 3_000,
                reason: ShedReason::PastDeadline
            }
        );
    }

    #[test]
    fn waits_and_grants() {
        assert_eq!(predicted_wait_ms(3, 4, 100.0, None), 0.0);
        assert_eq!(predicted_wait_ms(4, 4, 100.0, None), 25.0);
        assert_eq!(predicted_wait_ms(0, 1, 100.0, Some(500.0)), 500.0);
        let claims = [
            Claim {
                priority: 1,
                wanted: 5,
            },
            Claim {
                priority: 9,
                wanted: 4,
            },
            Claim {
                priority: 1,
                wanted: 3,
            },
        ];
        assert_eq!(grant_by_priority(6, &claims), vec![2, 4, 0]);
        assert_eq!(grant_by_priority(100, &claims), vec![5, 4, 3]);
        assert_eq!(capacity_per_s(2, 4, 500.0), 16.0);
    }
}
