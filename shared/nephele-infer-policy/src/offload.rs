//! Per request: serve locally, offload to the cloud, or refuse with Retry-After; after
//! a local answer, whether to re-ask the cloud (a hard example); and the circuit
//! breaker that stops the agent from offloading to a cloud that keeps failing.
//!
//! [`decide`], with predicted local = ⌈(queue_ahead + 1) × local_service / slots⌉ ×
//! (1 + the learned margin, [`crate::lateness`]) and predicted remote = rtt + cloud
//! queue + cloud service:
//!
//! | # | condition (checked in order)                                              | route                          |
//! |---|---------------------------------------------------------------------------|--------------------------------|
//! | 1 | local queue has room and predicted local ≤ deadline                       | `Local`                        |
//! | 2 | remote known, predicted remote ≤ deadline, and the breaker allows         | `Offload { fallback_local }`   |
//! | 3 | local queue has room and predicted local ≤ deadline × (1 + tolerance)     | `Local` (late, but answered)   |
//! | 4 | nothing queued ahead and, without the margin, rule 3 holds                | `Local` (a probe)              |
//! | 5 | otherwise                                                                 | `Reject { retry_after_ms }`    |
//!
//! - `fallback_local` is rule 3's condition: when the offload fails, serve locally if
//!   that is within the tolerance, else refuse.
//! - The tolerance (default 25 % of the deadline) is how late a local answer may be
//!   before refusing is better: when neither side can meet the deadline the agent
//!   answers 429 with Retry-After rather than queueing forever.
//! - Rule 4: only local answers teach the margin, so a margin learned in a slow spell
//!   (a stalled machine, answers hundreds of times later than predicted) would refuse
//!   every request once it exceeds the deadline, with nothing left to unteach it: the
//!   agent served no request again (`nephele bench soak` found it, 26,819 answers in).
//!   With nothing queued ahead the request runs locally when its unmargined prediction
//!   is within the tolerance; refusing it frees nothing for anyone, and its answer
//!   corrects the margin. A model that really is too slow for the deadline is still
//!   refused.
//! - The breaker is asked last, only when the request would otherwise go remote,
//!   because asking a half-open breaker spends its one probe.
//! - `retry_after_ms` is the time for the local queue to drain to the longest queue at
//!   which a new request meets the deadline and finds room (the empty queue when none
//!   does), rounded up to whole milliseconds and at least 1.
//!
//! [`after_local_answer`] implements joint inference (KubeEdge Sedna): a local answer
//! whose confidence is below the threshold is a hard example, re-asked in the cloud
//! when the breaker allows.
//!
//! [`CircuitBreaker`] (sans-IO, times as `now_us` arguments):
//!
//! | state      | `allow(now)`                                    | `on_success`       | `on_failure`                        |
//! |------------|-------------------------------------------------|--------------------|-------------------------------------|
//! | `Closed`   | yes                                             | reset the count    | count; at `failure_threshold` consecutive → `Open` for the base time |
//! | `Open`     | no until `until_us`; then → `HalfOpen`, yes once (the probe) | ignored (late) | ignored (late)              |
//! | `HalfOpen` | no (the probe is out); a probe out longer than `probe_timeout_us` counts as failed | → `Closed`, backoff reset | → `Open` for twice the last time, capped |
//!
//! [`CircuitBreaker::on_path_alive`] (the transport hears from the cloud again) ends an
//! open breaker's wait: the next `allow` is the probe.
//!
//! [`offload_wait_us`] bounds how long an offloaded request waits for its answer by the
//! time left before its deadline (with the tolerance).
//!
//! Outcomes are not tied to requests, so a late outcome of a request sent while
//! `Closed` that lands in `HalfOpen` is taken as the probe's.

use serde::{Deserialize, Serialize};

/// What the agent knows about the cloud path for this deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteEstimate {
    /// Round-trip time to the cloud.
    pub rtt_us: u64,
    /// Expected wait in the cloud's queue.
    pub cloud_queue_us: u64,
    /// Service time of one request in the cloud.
    pub cloud_service_us: u64,
}

impl RemoteEstimate {
    /// Predicted latency of an offloaded request.
    pub fn predicted_us(&self) -> u64 {
        self.rtt_us
            .saturating_add(self.cloud_queue_us)
            .saturating_add(self.cloud_service_us)
    }
}

/// What the agent knows when a request arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestContext {
    /// Requests queued or running locally ahead of this one.
    pub queue_ahead: u32,
    /// Local service time of one request (0 before the first measurement).
    pub local_service_us: u64,
    /// Local inference slots (0 is treated as 1).
    pub slots: u32,
    /// Most requests the local queue holds; room means `queue_ahead` < this.
    pub local_queue_capacity: u32,
    /// The cloud path, when offload is configured and connected.
    pub remote: Option<RemoteEstimate>,
    /// The latency the request should be answered within (the SLO).
    pub deadline_us: u64,
    /// How much later than predicted local answers have been coming, in thousandths of
    /// the prediction ([`crate::lateness::LocalLateness`]; 0: none known).
    pub local_margin_permille: u32,
}

impl RequestContext {
    /// Predicted local latency, rounded up.
    pub fn predicted_local_us(&self) -> u64 {
        let work = (u128::from(self.queue_ahead) + 1) * u128::from(self.local_service_us);
        saturate(work.div_ceil(u128::from(self.slots.max(1))))
    }

    /// [`Self::predicted_local_us`] with the learned margin: what `decide` holds
    /// against the deadline.
    pub fn predicted_local_with_margin_us(&self) -> u64 {
        let predicted = u128::from(self.predicted_local_us());
        saturate(predicted * (1000 + u128::from(self.local_margin_permille)) / 1000)
    }

    fn has_room(&self) -> bool {
        self.queue_ahead < self.local_queue_capacity
    }
}

/// The tunable part of [`decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadPolicy {
    /// How late a local answer may be, in percent of the deadline, before refusing.
    pub lateness_tolerance_percent: u32,
}

impl OffloadPolicy {
    /// The latest a request with this deadline is still worth answering: the deadline
    /// plus the lateness tolerance (what [`decide`] accepts locally when nothing
    /// better is at hand).
    pub fn latest_answer_us(&self, deadline_us: u64) -> u64 {
        saturate(
            u128::from(deadline_us) * (100 + u128::from(self.lateness_tolerance_percent)) / 100,
        )
    }
}

/// How long an offloaded request may wait for the cloud's answer (µs): what is left of
/// its `latest_us` (from [`OffloadPolicy::latest_answer_us`]) after `elapsed_us`,
/// less `then_local_us`, the local run that must still fit should the cloud give no
/// answer (0 when a local answer is in hand or nothing would follow). `None` when
/// less than `min_wait_us` (a round trip) is left: the cloud's answer could only come
/// too late, so the caller keeps or computes the local answer, or refuses.
///
/// A link that goes silent then holds a client at most until its request's deadline
/// (with the tolerance), not for a fixed timeout: a hard example returns its local
/// answer by then, an overflow request its 429.
pub fn offload_wait_us(
    latest_us: u64,
    elapsed_us: u64,
    then_local_us: u64,
    min_wait_us: u64,
) -> Option<u64> {
    let left = latest_us
        .saturating_sub(elapsed_us)
        .saturating_sub(then_local_us);
    (left >= min_wait_us.max(1)).then_some(left)
}

impl Default for OffloadPolicy {
    /// A local answer up to 25 % late beats a refusal.
    fn default() -> Self {
        OffloadPolicy {
            lateness_tolerance_percent: 25,
        }
    }
}

/// Where one request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// Serve on this device.
    Local,
    /// Send to the cloud; report the outcome to the breaker. When it fails, serve
    /// locally if `fallback_local`, else refuse.
    Offload {
        /// Whether serving locally is still acceptable should the offload fail.
        fallback_local: bool,
    },
    /// Refuse now (HTTP 429) and tell the client when to retry.
    Reject {
        /// Retry-After, in milliseconds; at least 1.
        retry_after_ms: u64,
    },
}

/// Routes one request (see the module table). Asks `breaker` only when the request
/// would go remote; when it returns `Offload`, the caller must report the outcome with
/// [`CircuitBreaker::on_success`] or [`CircuitBreaker::on_failure`].
pub fn decide(
    request: &RequestContext,
    policy: &OffloadPolicy,
    breaker: &mut CircuitBreaker,
    now_us: u64,
) -> Route {
    let predicted_local_us = request.predicted_local_with_margin_us();
    let room = request.has_room();
    if room && predicted_local_us <= request.deadline_us {
        return Route::Local;
    }
    let tolerated_us = policy.latest_answer_us(request.deadline_us);
    let local_tolerable = room && predicted_local_us <= tolerated_us;
    if let Some(remote) = request.remote {
        if remote.predicted_us() <= request.deadline_us && breaker.allow(now_us) {
            return Route::Offload {
                fallback_local: local_tolerable,
            };
        }
    }
    if local_tolerable {
        return Route::Local;
    }
    if room
        && request.queue_ahead == 0
        && u128::from(request.predicted_local_us()) <= u128::from(tolerated_us)
    {
        return Route::Local;
    }
    Route::Reject {
        retry_after_ms: retry_after_ms(request),
    }
}

/// Time for the local queue to drain to the longest queue at which a new request
/// meets the deadline and finds room (the empty queue when none does), in whole
/// milliseconds rounded up, at least 1.
fn retry_after_ms(request: &RequestContext) -> u64 {
    let slots = u128::from(request.slots.max(1));
    let service_us = u128::from(request.local_service_us);
    // Longest queue ahead q with ⌈(q + 1) · s / slots⌉ ≤ deadline, i.e.
    // (q + 1) · s ≤ deadline · slots; with s = 0 any queue meets it.
    let meets_deadline = (u128::from(request.deadline_us) * slots)
        .checked_div(service_us)
        .map_or(u128::MAX, |requests| requests.saturating_sub(1));
    let has_room = u128::from(request.local_queue_capacity.saturating_sub(1));
    let target_ahead = meets_deadline.min(has_room);
    let to_drain = u128::from(request.queue_ahead).saturating_sub(target_ahead);
    let drain_us = (to_drain * service_us).div_ceil(slots);
    saturate(drain_us.div_ceil(1_000)).max(1)
}

fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// What to do with a local answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterLocal {
    /// Return the local answer.
    Keep,
    /// Re-ask the cloud; report the outcome to the breaker, and return the local
    /// answer if the cloud fails.
    HardExampleToCloud,
}

/// Whether a local answer is a hard example to re-ask in the cloud: its confidence is
/// below `threshold` (a NaN confidence counts as low) and the breaker allows. A
/// threshold that is NaN disables re-asking. The breaker is asked only for a hard
/// example, since asking may spend its half-open probe.
pub fn after_local_answer(
    confidence: f64,
    threshold: f64,
    breaker: &mut CircuitBreaker,
    now_us: u64,
) -> AfterLocal {
    if threshold.is_nan() || confidence >= threshold {
        return AfterLocal::Keep;
    }
    if breaker.allow(now_us) {
        AfterLocal::HardExampleToCloud
    } else {
        AfterLocal::Keep
    }
}

/// When the breaker opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakerConfig {
    /// Consecutive failures that open a closed breaker (0 is treated as 1).
    pub failure_threshold: u32,
    /// How long the breaker first stays open.
    pub open_for_us: u64,
    /// The cap on the doubled open time (never below `open_for_us`).
    pub max_open_for_us: u64,
    /// A probe with no outcome after this long counts as failed.
    pub probe_timeout_us: u64,
}

impl Default for BreakerConfig {
    /// Open after 5 consecutive failures, for 1 s doubling up to 60 s; probes time out
    /// after 10 s.
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            open_for_us: 1_000_000,
            max_open_for_us: 60_000_000,
            probe_timeout_us: 10_000_000,
        }
    }
}

/// The state of a breaker, as last updated by a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Remote attempts go through.
    Closed,
    /// Remote attempts are refused until `until_us` (the state changes on the first
    /// `allow` at or after it).
    Open {
        /// When the next probe may go.
        until_us: u64,
    },
    /// One probe is out; others are refused until its outcome.
    HalfOpen,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Closed { consecutive_failures: u32 },
    Open { until_us: u64 },
    HalfOpen { probe_sent_us: u64 },
}

/// Stops offloading to a cloud that keeps failing, and probes it to come back (see the
/// module table). Sans-IO: every method takes the caller's `now_us`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    phase: Phase,
    /// The open time used last; doubled on each failed probe, reset on close.
    open_for_us: u64,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        CircuitBreaker {
            config,
            phase: Phase::Closed {
                consecutive_failures: 0,
            },
            open_for_us: config.open_for_us,
        }
    }

    /// The state as of the last call.
    pub fn state(&self) -> BreakerState {
        match self.phase {
            Phase::Closed { .. } => BreakerState::Closed,
            Phase::Open { until_us } => BreakerState::Open { until_us },
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Whether a remote attempt may go now. Call it only for an attempt that will be
    /// made: a `true` from an open breaker whose time is up is the half-open probe, and
    /// its outcome must be reported.
    pub fn allow(&mut self, now_us: u64) -> bool {
        match self.phase {
            Phase::Closed { .. } => true,
            Phase::Open { until_us } if now_us >= until_us => {
                self.phase = Phase::HalfOpen {
                    probe_sent_us: now_us,
                };
                true
            }
            Phase::Open { .. } => false,
            Phase::HalfOpen { probe_sent_us } => {
                if now_us.saturating_sub(probe_sent_us) >= self.config.probe_timeout_us {
                    self.reopen_with_backoff(now_us);
                }
                false
            }
        }
    }

    /// The path answered something other than an offload (the transport acknowledged
    /// the agent's packets, or a new session was established): an open breaker lets
    /// the next attempt through as its probe now, instead of waiting out its
    /// (doubling) open time, so offload comes back as soon as the path does. The
    /// backoff is kept: a probe that fails still reopens for twice as long. Closed and
    /// half-open breakers are left as they are.
    pub fn on_path_alive(&mut self, now_us: u64) {
        if let Phase::Open { until_us } = self.phase {
            self.phase = Phase::Open {
                until_us: until_us.min(now_us),
            };
        }
    }

    /// Reports a remote attempt that succeeded. `now_us` is not needed today; it is
    /// taken so that every event carries its time, like `on_failure`.
    pub fn on_success(&mut self, _now_us: u64) {
        match self.phase {
            Phase::Closed { .. } | Phase::HalfOpen { .. } => {
                self.phase = Phase::Closed {
                    consecutive_failures: 0,
                };
                self.open_for_us = self.config.open_for_us;
            }
            Phase::Open { .. } => {}
        }
    }

    /// Reports a remote attempt that failed.
    pub fn on_failure(&mut self, now_us: u64) {
        match self.phase {
            Phase::Closed {
                consecutive_failures,
            } => {
                let consecutive_failures = consecutive_failures.saturating_add(1);
                if consecutive_failures >= self.config.failure_threshold.max(1) {
                    self.open_for_us = self.config.open_for_us;
                    self.phase = Phase::Open {
                        until_us: now_us.saturating_add(self.open_for_us),
                    };
                } else {
                    self.phase = Phase::Closed {
                        consecutive_failures,
                    };
                }
            }
            Phase::HalfOpen { .. } => self.reopen_with_backoff(now_us),
            Phase::Open { .. } => {}
        }
    }

    fn reopen_with_backoff(&mut self, now_us: u64) {
        let cap = self.config.max_open_for_us.max(self.config.open_for_us);
        self.open_for_us = self.open_for_us.saturating_mul(2).min(cap);
        self.phase = Phase::Open {
            until_us: now_us.saturating_add(self.open_for_us),
        };
    }
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker::new(BreakerConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 10 ms service on 2 slots, queue of 8, SLO 20 ms; the cloud answers in 15 ms.
    fn request(queue_ahead: u32, remote: bool) -> RequestContext {
        RequestContext {
            queue_ahead,
            local_service_us: 10_000,
            slots: 2,
            local_queue_capacity: 8,
            remote: remote.then_some(RemoteEstimate {
                rtt_us: 5_000,
                cloud_queue_us: 2_000,
                cloud_service_us: 8_000,
            }),
            deadline_us: 20_000,
            local_margin_permille: 0,
        }
    }

    fn check(request: RequestContext, breaker: &mut CircuitBreaker, expected: Route) {
        let route = decide(&request, &OffloadPolicy::default(), breaker, 0);
        assert_eq!(route, expected, "{request:?}");
    }

    fn open_breaker() -> CircuitBreaker {
        let mut breaker = CircuitBreaker::default();
        for _ in 0..5 {
            breaker.on_failure(0);
        }
        breaker
    }

    #[test]
    fn the_learned_margin_sends_a_long_queue_to_the_cloud() {
        let mut breaker = CircuitBreaker::new(BreakerConfig::default());
        // 5 ahead at 5 ms on 2 slots: 15 ms predicted, within 20 ms...
        let mut context = request(5, true);
        context.local_service_us = 5_000;
        assert_eq!(context.predicted_local_us(), 15_000);
        assert_eq!(
            decide(&context, &OffloadPolicy::default(), &mut breaker, 0),
            Route::Local
        );
        // ...but local answers have been coming 40 % later than predicted.
        context.local_margin_permille = 400;
        assert_eq!(context.predicted_local_with_margin_us(), 21_000);
        assert!(matches!(
            decide(&context, &OffloadPolicy::default(), &mut breaker, 0),
            Route::Offload { .. }
        ));
    }

    #[test]
    fn routes_follow_the_decision_table() {
        use Route::*;
        let mut closed = CircuitBreaker::default();
        // Predicted local (q + 1) × 10 / 2 ms: up to 3 ahead meets 20 ms.
        check(request(0, true), &mut closed, Local);
        check(request(3, true), &mut closed, Local);
        // 4 ahead: 25 ms locally, 15 in the cloud; 25 is within 25 % late, so a failed
        // offload may still be served locally.
        check(
            request(4, true),
            &mut closed,
            Offload {
                fallback_local: true,
            },
        );
        // 5 ahead: 30 ms is too late even as a fallback.
        check(
            request(5, true),
            &mut closed,
            Offload {
                fallback_local: false,
            },
        );
        // Queue full: offload without a local fallback.
        check(
            request(8, true),
            &mut closed,
            Offload {
                fallback_local: false,
            },
        );
        // No cloud: late but tolerable → local; beyond the tolerance → refuse, retry
        // when the queue is down to 3 ahead: (5 − 3) × 10 / 2 ms.
        check(request(4, false), &mut closed, Local);
        check(
            request(5, false),
            &mut closed,
            Reject { retry_after_ms: 10 },
        );
        check(
            request(8, false),
            &mut closed,
            Reject { retry_after_ms: 25 },
        );
        // An open breaker is the same as no cloud.
        let mut open = open_breaker();
        check(request(4, true), &mut open, Local);
        check(request(5, true), &mut open, Reject { retry_after_ms: 10 });
        // A cloud slower than the deadline is not tried.
        let slow_cloud = RequestContext {
            remote: Some(RemoteEstimate {
                rtt_us: 30_000,
                cloud_queue_us: 0,
                cloud_service_us: 0,
            }),
            ..request(5, true)
        };
        check(slow_cloud, &mut closed, Reject { retry_after_ms: 10 });
        // Before any measurement the local prediction is 0: local.
        let unmeasured = RequestContext {
            local_service_us: 0,
            ..request(7, true)
        };
        check(unmeasured, &mut closed, Local);
    }

    #[test]
    fn retry_after_covers_queues_that_never_meet_the_deadline() {
        // One request alone takes 50 ms on 1 slot, over twice the 20 ms SLO: retry
        // once all 3 ahead have drained, 150 ms.
        let hopeless = RequestContext {
            queue_ahead: 3,
            local_service_us: 50_000,
            slots: 1,
            local_queue_capacity: 8,
            remote: None,
            deadline_us: 20_000,
            local_margin_permille: 0,
        };
        let mut breaker = CircuitBreaker::default();
        check(
            hopeless,
            &mut breaker,
            Route::Reject {
                retry_after_ms: 150,
            },
        );
        // Nothing ahead still says at least 1 ms.
        let empty = RequestContext {
            queue_ahead: 0,
            ..hopeless
        };
        check(empty, &mut breaker, Route::Reject { retry_after_ms: 1 });
        // A queue of capacity 0 never has room.
        let no_queue = RequestContext {
            local_queue_capacity: 0,
            ..request(0, false)
        };
        check(no_queue, &mut breaker, Route::Reject { retry_after_ms: 1 });
        // Sub-millisecond drains round up.
        let fast = RequestContext {
            queue_ahead: 9,
            local_service_us: 100,
            slots: 1,
            local_queue_capacity: 8,
            remote: None,
            deadline_us: 1_000_000,
            local_margin_permille: 0,
        };
        check(fast, &mut breaker, Route::Reject { retry_after_ms: 1 });
        // Huge numbers saturate instead of overflowing.
        let huge = RequestContext {
            queue_ahead: u32::MAX,
            local_service_us: u64::MAX,
            slots: 0,
            local_queue_capacity: u32::MAX,
            remote: None,
            deadline_us: 0,
            local_margin_permille: 0,
        };
        assert!(matches!(
            decide(&huge, &OffloadPolicy::default(), &mut breaker, u64::MAX),
            Route::Reject {
                retry_after_ms: u64::MAX
            }
        ));
    }

    #[test]
    fn a_margin_learned_in_a_slow_spell_does_not_lock_an_idle_device_out() {
        let mut lateness = crate::lateness::LocalLateness::default();
        // 0.2 ms answers predicted, then a stalled machine answers a few of them in
        // about a second.
        for _ in 0..100 {
            lateness.observe(200, 200, 100_000);
        }
        for _ in 0..5 {
            lateness.observe(200, 1_000_000, 100_000);
        }
        let stuck = RequestContext {
            queue_ahead: 0,
            local_service_us: 200,
            slots: 2,
            local_queue_capacity: 8,
            remote: None,
            deadline_us: 100_000,
            local_margin_permille: lateness.margin_permille(),
        };
        assert!(
            stuck.predicted_local_with_margin_us() > 125_000,
            "the margin alone rules it out: {}",
            stuck.predicted_local_with_margin_us()
        );
        let mut breaker = CircuitBreaker::default();
        check(stuck, &mut breaker, Route::Local);
        // The probes' answers, on time again, unteach the margin until it admits on
        // its own.
        let mut answers = 0;
        let margined = |lateness: &crate::lateness::LocalLateness| {
            RequestContext {
                local_margin_permille: lateness.margin_permille(),
                ..stuck
            }
            .predicted_local_with_margin_us()
        };
        while margined(&lateness) > stuck.deadline_us {
            lateness.observe(200, 200, 100_000);
            answers += 1;
            assert!(answers < 5_000, "the margin never came down");
        }
        // With work queued ahead the margin still refuses.
        let busy = RequestContext {
            queue_ahead: 1,
            ..stuck
        };
        assert!(matches!(
            decide(&busy, &OffloadPolicy::default(), &mut breaker, 0),
            Route::Reject { .. }
        ));
    }

    #[test]
    fn a_local_route_does_not_spend_the_half_open_probe() {
        let mut breaker = open_breaker();
        // The open time is up, but this request is served locally.
        let route = decide(
            &request(0, true),
            &OffloadPolicy::default(),
            &mut breaker,
            1_000_000,
        );
        assert_eq!(route, Route::Local);
        assert_eq!(
            breaker.state(),
            BreakerState::Open {
                until_us: 1_000_000
            }
        );
        // The next one that needs the cloud is the probe.
        let route = decide(
            &request(5, true),
            &OffloadPolicy::default(),
            &mut breaker,
            1_000_000,
        );
        assert_eq!(
            route,
            Route::Offload {
                fallback_local: false
            }
        );
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
    }

    #[test]
    fn hard_examples_go_to_the_cloud_only_when_the_breaker_allows() {
        let mut closed = CircuitBreaker::default();
        let cases = [
            (0.95, 0.8, AfterLocal::Keep),
            (0.8, 0.8, AfterLocal::Keep),
            (0.5, 0.8, AfterLocal::HardExampleToCloud),
            (f64::NAN, 0.8, AfterLocal::HardExampleToCloud),
            (0.5, f64::NAN, AfterLocal::Keep),
        ];
        for (confidence, threshold, expected) in cases {
            assert_eq!(
                after_local_answer(confidence, threshold, &mut closed, 0),
                expected,
                "confidence {confidence}, threshold {threshold}"
            );
        }
        let mut open = open_breaker();
        assert_eq!(
            after_local_answer(0.1, 0.8, &mut open, 10),
            AfterLocal::Keep
        );
        // A confident answer leaves an expired breaker untouched.
        assert_eq!(
            after_local_answer(0.9, 0.8, &mut open, 2_000_000),
            AfterLocal::Keep
        );
        assert_eq!(
            open.state(),
            BreakerState::Open {
                until_us: 1_000_000
            }
        );
    }

    #[test]
    fn the_breaker_opens_probes_once_closes_and_backs_off() {
        let config = BreakerConfig {
            failure_threshold: 3,
            open_for_us: 1_000,
            max_open_for_us: 5_000,
            probe_timeout_us: 10_000,
        };
        let mut breaker = CircuitBreaker::new(config);
        // Two failures, a success, two failures: never 3 in a row.
        for outcome in [false, false, true, false, false] {
            assert!(breaker.allow(0));
            if outcome {
                breaker.on_success(0);
            } else {
                breaker.on_failure(0);
            }
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
        breaker.on_failure(100);
        assert_eq!(breaker.state(), BreakerState::Open { until_us: 1_100 });
        assert!(!breaker.allow(1_099));
        // Late outcomes while open change nothing.
        breaker.on_success(1_050);
        breaker.on_failure(1_050);
        assert_eq!(breaker.state(), BreakerState::Open { until_us: 1_100 });
        // Exactly one probe.
        assert!(breaker.allow(1_100));
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert!(!breaker.allow(1_100));
        assert!(!breaker.allow(1_200));
        // The probe fails: open for 2 ms, then 4, then the 5 ms cap.
        let mut now_us = 1_200;
        for open_for_us in [2_000, 4_000, 5_000, 5_000] {
            breaker.on_failure(now_us);
            assert_eq!(
                breaker.state(),
                BreakerState::Open {
                    until_us: now_us + open_for_us
                }
            );
            now_us += open_for_us;
            assert!(breaker.allow(now_us), "probe at {now_us}");
        }
        // The probe succeeds: closed, and the backoff starts over.
        breaker.on_success(now_us);
        assert_eq!(breaker.state(), BreakerState::Closed);
        for _ in 0..3 {
            breaker.on_failure(now_us);
        }
        assert_eq!(
            breaker.state(),
            BreakerState::Open {
                until_us: now_us + 1_000
            }
        );
        // A probe that never reports counts as failed after the probe timeout.
        now_us += 1_000;
        assert!(breaker.allow(now_us));
        assert!(!breaker.allow(now_us + 9_999));
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert!(!breaker.allow(now_us + 10_000));
        assert_eq!(
            breaker.state(),
            BreakerState::Open {
                until_us: now_us + 10_000 + 2_000
            }
        );
    }

    #[test]
    fn odd_breaker_configs_do_not_panic() {
        let mut breaker = CircuitBreaker::new(BreakerConfig {
            failure_threshold: 0,
            open_for_us: u64::MAX,
            max_open_for_us: 0,
            probe_timeout_us: 0,
        });
        breaker.on_failure(5);
        assert_eq!(breaker.state(), BreakerState::Open { until_us: u64::MAX });
        assert!(breaker.allow(u64::MAX));
        // Probe timeout 0: the next allow already counts the probe as lost.
        assert!(!breaker.allow(u64::MAX));
        assert_eq!(breaker.state(), BreakerState::Open { until_us: u64::MAX });
    }

    fn contexts() -> impl Strategy<Value = RequestContext> {
        let remote = proptest::option::of((any::<u64>(), 0u64..100_000, 0u64..100_000).prop_map(
            |(rtt_us, cloud_queue_us, cloud_service_us)| RemoteEstimate {
                rtt_us: rtt_us % 200_000,
                cloud_queue_us,
                cloud_service_us,
            },
        ));
        (
            prop_oneof![0u32..20, any::<u32>()],
            prop_oneof![0u64..50_000, any::<u64>()],
            0u32..8,
            prop_oneof![0u32..20, any::<u32>()],
            remote,
            prop_oneof![0u64..200_000, any::<u64>()],
            prop_oneof![Just(0u32), 0u32..3_000, any::<u32>()],
        )
            .prop_map(
                |(
                    queue_ahead,
                    local_service_us,
                    slots,
                    local_queue_capacity,
                    remote,
                    deadline_us,
                    local_margin_permille,
                )| {
                    RequestContext {
                        queue_ahead,
                        local_service_us,
                        slots,
                        local_queue_capacity,
                        remote,
                        deadline_us,
                        local_margin_permille,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn every_route_agrees_with_the_table(
            request in contexts(),
            tolerance in 0u32..200,
            breaker_open in any::<bool>(),
        ) {
            let policy = OffloadPolicy { lateness_tolerance_percent: tolerance };
            let mut breaker = if breaker_open { open_breaker() } else { CircuitBreaker::default() };
            let before = breaker.clone();
            let route = decide(&request, &policy, &mut breaker, 10);
            let predicted_local_us = request.predicted_local_with_margin_us();
            let room = request.queue_ahead < request.local_queue_capacity;
            let tolerated_us =
                u128::from(request.deadline_us) * (100 + u128::from(tolerance)) / 100;
            let tolerable = room && u128::from(predicted_local_us) <= tolerated_us;
            let remote_in_time = request
                .remote
                .is_some_and(|remote| remote.predicted_us() <= request.deadline_us);
            match route {
                Route::Local => {
                    // Within the tolerance, or the probe: idle, and within it without
                    // the margin.
                    let probe = room
                        && request.queue_ahead == 0
                        && u128::from(request.predicted_local_us()) <= tolerated_us;
                    prop_assert!(tolerable || probe);
                    prop_assert!(
                        predicted_local_us <= request.deadline_us || !remote_in_time || breaker_open
                    );
                    prop_assert_eq!(breaker, before);
                }
                Route::Offload { fallback_local } => {
                    prop_assert!(!breaker_open && remote_in_time);
                    prop_assert!(!(room && predicted_local_us <= request.deadline_us));
                    prop_assert_eq!(fallback_local, tolerable);
                }
                Route::Reject { retry_after_ms } => {
                    prop_assert!(retry_after_ms >= 1);
                    prop_assert!(!tolerable);
                    prop_assert!(
                        !room
                            || request.queue_ahead > 0
                            || u128::from(request.predicted_local_us()) > tolerated_us,
                        "an idle device refused a request only its margin ruled out"
                    );
                    prop_assert!(breaker_open || !remote_in_time);
                }
            }
        }

        #[test]
        fn the_breaker_lets_one_probe_through_and_caps_its_backoff(
            steps in proptest::collection::vec((0u64..3_000, 0u8..3), 0..200),
        ) {
            let config = BreakerConfig {
                failure_threshold: 2,
                open_for_us: 500,
                max_open_for_us: 4_000,
                probe_timeout_us: 2_500,
            };
            let mut breaker = CircuitBreaker::new(config);
            let mut now_us = 0u64;
            for (advance_us, action) in steps {
                now_us += advance_us;
                let before = breaker.state();
                match action {
                    0 => {
                        let allowed = breaker.allow(now_us);
                        match before {
                            BreakerState::Closed => prop_assert!(allowed),
                            BreakerState::HalfOpen => prop_assert!(!allowed),
                            BreakerState::Open { until_us } => {
                                prop_assert_eq!(allowed, now_us >= until_us);
                                if allowed {
                                    prop_assert_eq!(breaker.state(), BreakerState::HalfOpen);
                                }
                            }
                        }
                    }
                    1 => breaker.on_success(now_us),
                    _ => breaker.on_failure(now_us),
                }
                if let BreakerState::Open { until_us } = breaker.state() {
                    if before != breaker.state() {
                        let open_for_us = until_us - now_us;
                        prop_assert!((500..=4_000).contains(&open_for_us), "{}", open_for_us);
                    }
                }
            }
        }
    }

    #[test]
    fn a_path_that_answers_again_lets_the_probe_go_at_once() {
        let mut breaker = CircuitBreaker::default();
        for _ in 0..5 {
            breaker.on_failure(1_000);
        }
        // A failed probe doubles the open time to 2 s.
        assert!(breaker.allow(1_000_000 + 1_000));
        breaker.on_failure(1_100_000);
        assert_eq!(
            breaker.state(),
            BreakerState::Open {
                until_us: 3_100_000
            }
        );
        assert!(!breaker.allow(1_200_000));
        breaker.on_path_alive(1_300_000);
        assert!(
            breaker.allow(1_300_000),
            "the probe goes when the path answers"
        );
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        // The backoff is kept: this probe failing reopens for 4 s.
        breaker.on_failure(1_400_000);
        assert_eq!(
            breaker.state(),
            BreakerState::Open {
                until_us: 5_400_000
            }
        );
        // A live path never closes a breaker by itself, nor disturbs a closed one.
        let mut closed = CircuitBreaker::default();
        closed.on_path_alive(7);
        assert_eq!(closed, CircuitBreaker::default());
    }

    proptest! {
        #[test]
        fn an_offload_waits_no_longer_than_the_time_left(
            latest_us in prop_oneof![0u64..1_000_000, any::<u64>()],
            elapsed_us in prop_oneof![0u64..1_000_000, any::<u64>()],
            then_local_us in prop_oneof![Just(0u64), 0u64..500_000, any::<u64>()],
            min_wait_us in prop_oneof![Just(0u64), 0u64..50_000, any::<u64>()],
        ) {
            let left = u128::from(latest_us) - u128::from(elapsed_us.min(latest_us));
            let left = left.saturating_sub(u128::from(then_local_us));
            match offload_wait_us(latest_us, elapsed_us, then_local_us, min_wait_us) {
                Some(wait) => {
                    prop_assert_eq!(u128::from(wait), left);
                    prop_assert!(wait >= min_wait_us.max(1));
                    prop_assert!(u128::from(elapsed_us) + u128::from(wait) + u128::from(then_local_us)
                        <= u128::from(latest_us));
                }
                None => prop_assert!(left < u128::from(min_wait_us.max(1))),
            }
        }

        #[test]
        fn path_alive_only_ever_brings_the_probe_forward(
            failures in 0u32..12,
            at_us in 0u64..100_000_000,
            alive_us in 0u64..100_000_000,
        ) {
            let mut breaker = CircuitBreaker::default();
            for i in 0..failures {
                breaker.allow(at_us + u64::from(i));
                breaker.on_failure(at_us + u64::from(i));
            }
            let before = breaker.state();
            breaker.on_path_alive(alive_us);
            match (before, breaker.state()) {
                (BreakerState::Open { until_us }, BreakerState::Open { until_us: now }) => {
                    prop_assert_eq!(now, until_us.min(alive_us));
                }
                (before, after) => prop_assert_eq!(before, after),
            }
        }
    }
}
