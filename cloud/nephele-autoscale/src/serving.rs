//! The serving rules a region applies between two scaler ticks, shared by the region
//! actor (live) and `nephele sim autoscale` (virtual time), so what the simulator
//! measures is what a region does:
//!
//! - [`least_loaded`]: where a request goes (the ready replica with the least work
//!   ahead; ties to the smallest key, so the choice is deterministic);
//! - [`admit`]: the per-request admission gate against the scaler's level, with the
//!   wait predicted at that replica;
//! - [`SignalWindow`]: what is counted between two ticks (arrivals, answers, whether
//!   each met its target, latencies) and how it becomes the [`Signals`] of the next
//!   tick, with one definition of utilisation ([`offered_utilisation`]).
//!
//! - [`Deployment`]: the gate, the scaler and its last decision, ticked with the
//!   window the shell kept.
//!
//! The shells only say what happened (a request arrived, an answer left after so many
//! ms, within its target or not) and what the replicas are now ([`Snapshot`]).

use serde::{Deserialize, Serialize};

use crate::admission::{Admission, AdmissionGate, Verdict};
use crate::Signals;

/// The candidate with the least load; among equal loads, the smallest key.
pub fn least_loaded<L: Ord, K: Ord>(candidates: impl IntoIterator<Item = (L, K)>) -> Option<K> {
    candidates.into_iter().min().map(|(_, key)| key)
}

/// The gate's verdict for one request arriving at `now_ms` that would wait
/// `predicted_wait_ms()` at the replica [`least_loaded`] chose (asked only when the
/// level bounds anything). No level yet (before the first tick), or an open one:
/// admitted.
pub fn admit(
    gate: &mut AdmissionGate,
    now_ms: u64,
    level: Option<&Admission>,
    predicted_wait_ms: impl FnOnce() -> f64,
) -> Verdict {
    match level {
        Some(level) if !level.is_open() => gate.check(now_ms, level, predicted_wait_ms()),
        _ => Verdict::Admit,
    }
}

/// The service time a request is judged with before anything was measured (no
/// replica reported its compute time, no answer yet in the window), ms.
pub const UNMEASURED_SERVICE_MS: f64 = 1_000.0;

/// The service time the gate predicts waits with: what was measured, else
/// [`UNMEASURED_SERVICE_MS`]; never below 1 µs.
pub fn service_estimate_ms(measured: Option<f64>) -> f64 {
    measured
        .filter(|ms| ms.is_finite())
        .unwrap_or(UNMEASURED_SERVICE_MS)
        .max(0.001)
}

/// The share of the ready replicas' slots the offered load keeps busy (Little's law:
/// arrival rate × service time over ready slots), 0..=1; 0 with no ready replica.
pub fn offered_utilisation(
    arrivals: u64,
    window_ms: u64,
    service_ms: f64,
    ready: u32,
    concurrency: u32,
) -> f64 {
    if ready == 0 || window_ms == 0 || service_ms.is_nan() || service_ms <= 0.0 {
        return 0.0;
    }
    let busy = arrivals as f64 / window_ms as f64 * service_ms;
    (busy / (f64::from(ready) * f64::from(concurrency.max(1)))).clamp(0.0, 1.0)
}

/// What the replicas are at the moment a tick closes the window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    /// Requests being served at replicas.
    pub in_flight: u32,
    /// Requests waiting (at replicas, or at the region while none is ready).
    pub queued: u32,
    pub ready: u32,
    pub starting: u32,
    /// Mean service time of one request at a replica, measured (0: not yet).
    pub service_ms: f64,
    /// Requests one replica declares it serves at once.
    pub concurrency: u32,
    pub cold_start_ms: Option<f64>,
    pub priority: u32,
}

/// At most this many latencies are kept between two ticks (the p99 of a window with
/// more is taken over the first ones).
pub const MAX_LATENCY_SAMPLES: usize = 20_000;

/// What happened to one deployment's requests since the last tick.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SignalWindow {
    arrivals: u64,
    answered: u64,
    within: u64,
    latencies_ms: Vec<f64>,
}

impl SignalWindow {
    /// A request was offered (admitted or not).
    pub fn arrival(&mut self) {
        self.arrivals += 1;
    }

    /// An answer left `latency_ms` after its request arrived, within its target or not.
    /// `found_replica`: the request went to a ready replica when it arrived (one that
    /// waited at the region for a replica to start says nothing about what a replica
    /// carries; it counts in the p99 only).
    pub fn answer(&mut self, latency_ms: f64, within_target: bool, found_replica: bool) {
        if found_replica {
            self.answered += 1;
            self.within += u64::from(within_target);
        }
        if self.latencies_ms.len() < MAX_LATENCY_SAMPLES && latency_ms.is_finite() {
            self.latencies_ms.push(latency_ms.max(0.0));
        }
    }

    pub fn arrivals(&self) -> u64 {
        self.arrivals
    }

    /// The mean latency of the answers kept so far in the window (None: no answer).
    pub fn mean_latency_ms(&self) -> Option<f64> {
        (!self.latencies_ms.is_empty())
            .then(|| self.latencies_ms.iter().sum::<f64>() / self.latencies_ms.len() as f64)
    }

    /// The signals of the window that ends now (`window_ms` long); the window starts
    /// again empty.
    pub fn close(&mut self, window_ms: u64, now: Snapshot) -> Signals {
        let p99_ms = quantile(&mut self.latencies_ms, 0.99);
        let signals = Signals {
            window_ms,
            arrivals: self.arrivals,
            in_flight: now.in_flight,
            queued: now.queued,
            p99_ms,
            utilisation: offered_utilisation(
                self.arrivals,
                window_ms,
                now.service_ms,
                now.ready,
                now.concurrency,
            ),
            ready: now.ready,
            starting: now.starting,
            service_ms: now.service_ms,
            concurrency: now.concurrency.max(1),
            cold_start_ms: now.cold_start_ms,
            priority: now.priority,
            answered: self.answered,
            within_target: self.within,
        };
        self.arrivals = 0;
        self.answered = 0;
        self.within = 0;
        self.latencies_ms.clear();
        signals
    }
}

/// One deployment's serving state between the shell and its scaler: the admission
/// gate, the scaler's last decision (whose level the gate applies) and the signals
/// it was given. The region actor keeps one per deployment and `nephele sim
/// autoscale` one per run; the window of counts stays with the shell (the region's is
/// shared with the requests in flight), and is closed into signals by [`tick`].
///
/// [`tick`]: Deployment::tick
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment<P> {
    pub policy: P,
    gate: AdmissionGate,
    /// The scaler's last decision (None before the first tick).
    pub decision: Option<crate::Decision>,
    /// The signals of the last tick.
    pub signals: Option<Signals>,
    last_tick_ms: u64,
}

impl<P: crate::ScalingPolicy> Deployment<P> {
    /// A deployment whose first window starts at `now_ms`.
    pub fn new(policy: P, now_ms: u64) -> Deployment<P> {
        Deployment {
            policy,
            gate: AdmissionGate::default(),
            decision: None,
            signals: None,
            last_tick_ms: now_ms,
        }
    }

    /// The gate's verdict for a request arriving at `now_ms`, against the last
    /// decision's admission level ([`admit`]).
    pub fn admit(&mut self, now_ms: u64, predicted_wait_ms: impl FnOnce() -> f64) -> Verdict {
        let level = self.decision.as_ref().map(|d| &d.admission);
        admit(&mut self.gate, now_ms, level, predicted_wait_ms)
    }

    /// Closes `window` into the signals of the time since the last tick, ticks the
    /// scaler with them and keeps both.
    pub fn tick(
        &mut self,
        now_ms: u64,
        window: &mut SignalWindow,
        now: Snapshot,
    ) -> &crate::Decision {
        let window_ms = now_ms.saturating_sub(self.last_tick_ms).max(1);
        self.last_tick_ms = self.last_tick_ms.max(now_ms);
        let signals = window.close(window_ms, now);
        let decision = self.policy.tick(now_ms, &signals);
        self.signals = Some(signals);
        self.decision.insert(decision)
    }
}

/// The `q` quantile (nearest rank) of `values` (sorted in place); None when empty.
pub fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    Some(values[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::ShedReason;

    fn snapshot(ready: u32) -> Snapshot {
        Snapshot {
            in_flight: 3,
            queued: 1,
            ready,
            starting: 0,
            service_ms: 500.0,
            concurrency: 2,
            cold_start_ms: Some(20_000.0),
            priority: 7,
        }
    }

    #[test]
    fn routing_takes_the_least_load_and_breaks_ties_by_key() {
        assert_eq!(least_loaded([(3, "a"), (1, "c"), (1, "b")]), Some("b"));
        assert_eq!(least_loaded(Vec::<(u32, u32)>::new()), None);
    }

    #[test]
    fn admission_is_open_before_the_first_level_and_bounded_after() {
        let mut gate = AdmissionGate::default();
        assert_eq!(admit(&mut gate, 0, None, || 1e9), Verdict::Admit);
        assert_eq!(
            admit(&mut gate, 0, Some(&Admission::open()), || 1e9),
            Verdict::Admit
        );
        let level = Admission {
            max_wait_ms: Some(1_000.0),
            max_rate_per_s: None,
            burst: 1.0,
            retry_after_ms: 2_000,
        };
        assert_eq!(admit(&mut gate, 0, Some(&level), || 900.0), Verdict::Admit);
        assert_eq!(
            admit(&mut gate, 0, Some(&level), || 1_100.0),
            Verdict::Shed {
                retry_after_ms: 2_000,
                reason: ShedReason::PastDeadline
            }
        );
    }

    #[test]
    fn a_window_closes_into_signals_and_starts_again() {
        let mut window = SignalWindow::default();
        for _ in 0..10 {
            window.arrival();
        }
        for latency in 1..=100 {
            window.answer(f64::from(latency), latency <= 95, true);
        }
        for _ in 0..3 {
            window.answer(1_000.0, false, false);
        }
        let signals = window.close(5_000, snapshot(2));
        assert_eq!(signals.arrivals, 10);
        assert_eq!(signals.answered, 100);
        assert_eq!(signals.within_target, 95);
        assert_eq!(signals.p99_ms, Some(1_000.0));
        // 10 requests in 5 s × 0.5 s = 1 busy slot of 2 replicas × 2 slots.
        assert!((signals.utilisation - 0.25).abs() < 1e-12);
        assert_eq!(
            (signals.in_flight, signals.queued, signals.priority),
            (3, 1, 7)
        );
        let empty = window.close(5_000, snapshot(0));
        assert_eq!((empty.arrivals, empty.answered, empty.p99_ms), (0, 0, None));
        assert_eq!(empty.utilisation, 0.0);
    }

    #[test]
    fn utilisation_is_bounded_whatever_it_is_given() {
        assert_eq!(offered_utilisation(10, 0, 500.0, 1, 1), 0.0);
        assert_eq!(offered_utilisation(10, 1_000, f64::NAN, 1, 1), 0.0);
        assert_eq!(offered_utilisation(10_000, 1_000, 500.0, 1, 0), 1.0);
        assert_eq!(offered_utilisation(1, 1_000, 500.0, 0, 1), 0.0);
    }

    #[test]
    fn a_flood_of_answers_keeps_a_bounded_sample() {
        let mut window = SignalWindow::default();
        for _ in 0..(MAX_LATENCY_SAMPLES + 10) {
            window.answer(1.0, true, true);
        }
        let signals = window.close(1_000, snapshot(1));
        assert_eq!(signals.answered, MAX_LATENCY_SAMPLES as u64 + 10);
    }
}
