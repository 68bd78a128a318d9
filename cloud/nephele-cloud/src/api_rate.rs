//! Per-token rate limits of the API: a token bucket per API token, refilled at
//! `api_rate_per_s` up to `api_rate_burst`. A request that finds its bucket empty is
//! answered 429 with the seconds until a token is back (`Retry-After`). The bucket
//! arithmetic is pure ([`Bucket::take`], time as an argument); [`RateLimiter`] keeps
//! the buckets of one process.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// One token's bucket: how many requests it may make now, as of `at`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub tokens: f64,
    pub at: Instant,
}

impl Bucket {
    pub fn full(burst: u32, at: Instant) -> Bucket {
        Bucket {
            tokens: f64::from(burst),
            at,
        }
    }

    /// Takes one request's token at `now`, or says how many whole seconds (at least
    /// 1) until one is back.
    pub fn take(&mut self, now: Instant, per_s: f64, burst: u32) -> Result<(), u64> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_s).min(f64::from(burst));
        self.at = now.max(self.at);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err((((1.0 - self.tokens) / per_s).ceil() as u64).max(1))
        }
    }
}

/// The buckets of every token that made a request (a few bytes each).
pub struct RateLimiter {
    per_s: f64,
    burst: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    pub fn new(per_s: f64, burst: u32) -> RateLimiter {
        RateLimiter {
            per_s,
            burst,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `token` may make a request now; if not, the seconds to wait.
    pub fn check(&self, token: &str) -> Result<(), u64> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        buckets
            .entry(token.to_string())
            .or_insert_with(|| Bucket::full(self.burst, now))
            .take(now, self.per_s, self.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn a_burst_is_allowed_then_the_rate() {
        let t0 = Instant::now();
        let mut bucket = Bucket::full(3, t0);
        for _ in 0..3 {
            assert_eq!(bucket.take(t0, 2.0, 3), Ok(()));
        }
        assert_eq!(bucket.take(t0, 2.0, 3), Err(1));
        // Half a second at 2/s gives one back.
        assert_eq!(bucket.take(t0 + Duration::from_millis(500), 2.0, 3), Ok(()));
        assert!(bucket
            .take(t0 + Duration::from_millis(500), 2.0, 3)
            .is_err());
        // At 0.1/s, the wait is ten seconds.
        let mut slow = Bucket::full(1, t0);
        assert_eq!(slow.take(t0, 0.1, 1), Ok(()));
        assert_eq!(slow.take(t0, 0.1, 1), Err(10));
    }

    #[test]
    fn buckets_are_per_token() {
        let limiter = RateLimiter::new(0.001, 2);
        assert!(limiter.check("a").is_ok());
        assert!(limiter.check("a").is_ok());
        assert!(limiter.check("a").is_err());
        assert!(limiter.check("b").is_ok());
    }

    proptest! {
        /// Over any schedule of requests, no more are allowed than the burst plus the
        /// rate times the time elapsed.
        #[test]
        fn never_more_than_burst_plus_rate(
            gaps_ms in proptest::collection::vec(0u64..400, 1..200),
            per_s in 0.5f64..50.0,
            burst in 1u32..20,
        ) {
            let t0 = Instant::now();
            let mut bucket = Bucket::full(burst, t0);
            let mut now = t0;
            let mut allowed = 0u64;
            for gap in gaps_ms {
                now += Duration::from_millis(gap);
                if bucket.take(now, per_s, burst).is_ok() {
                    allowed += 1;
                }
            }
            let bound = f64::from(burst) + (now - t0).as_secs_f64() * per_s;
            prop_assert!(allowed as f64 <= bound + 1e-9, "{allowed} > {bound}");
        }
    }
}
