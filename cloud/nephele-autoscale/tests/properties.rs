//! Properties of the scalers under any signals (within reason), and of the scaler in a
//! closed loop with a small deterministic plant (replicas that take a cold start to
//! become ready, a fluid queue).

use nephele_autoscale::config::{ForecastConfig, OursConfig};
use nephele_autoscale::forecast::{Forecaster, ForecasterKind};
use nephele_autoscale::{
    Hpa, HpaConfig, Kpa, KpaConfig, Ours, Policy, ScalingPolicy, Signals, Static,
};
use proptest::prelude::*;

fn any_signals() -> impl Strategy<Value = Signals> {
    (
        (1_000u64..20_000, 0u64..2_000, 0u32..200, 0u32..500),
        (
            proptest::option::of(0.0f64..100_000.0),
            -0.5f64..1.5,
            0u32..80,
            0u32..20,
        ),
        (
            prop_oneof![Just(f64::NAN), Just(0.0), 1.0f64..60_000.0],
            0u32..16,
            proptest::option::of(0.0f64..120_000.0),
        ),
    )
        .prop_map(
            |(
                (window_ms, arrivals, in_flight, queued),
                (p99_ms, utilisation, ready, starting),
                (service_ms, concurrency, cold_start_ms),
            )| Signals {
                window_ms,
                arrivals,
                in_flight,
                queued,
                p99_ms,
                utilisation,
                ready,
                starting,
                service_ms,
                concurrency,
                cold_start_ms,
                priority: 0,
                answered: arrivals + u64::from(in_flight),
                within_target: arrivals,
            },
        )
}

fn small_forecast() -> ForecastConfig {
    ForecastConfig {
        model: ForecasterKind::HoltWinters {
            alpha: 0.3,
            beta: 0.05,
            gamma: 0.3,
            phi: 0.9,
            season: 12,
        },
        ..ForecastConfig::default()
    }
}

fn policies(min: u32, max: u32) -> Vec<Policy> {
    vec![
        Policy::Ours(
            Ours::new(OursConfig {
                min_replicas: min,
                max_replicas: max,
                forecast: small_forecast(),
                ..OursConfig::default()
            })
            .expect("valid"),
        ),
        Policy::Hpa(
            Hpa::new(HpaConfig {
                min_replicas: min,
                max_replicas: max,
                ..HpaConfig::default()
            })
            .expect("valid"),
        ),
        Policy::Kpa(
            Kpa::new(KpaConfig {
                min_replicas: min,
                max_replicas: max,
                ..KpaConfig::default()
            })
            .expect("valid"),
        ),
    ]
}

/// Ticks `policy` through `inputs` (each `(gap_ms, signals)`), returning the decisions'
/// (desired, warm) and the tick times.
fn run(policy: &mut Policy, inputs: &[(u64, Signals)]) -> Vec<(u64, u32, String)> {
    let mut now = 0;
    inputs
        .iter()
        .map(|(gap, signals)| {
            now += gap;
            let decision = policy.tick(now, signals);
            (
                now,
                decision.desired,
                serde_json::to_string(&decision).expect("json"),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn never_below_min_or_above_max(
        min in 0u32..5,
        span in 0u32..30,
        inputs in proptest::collection::vec((1u64..20_000, any_signals()), 1..120),
    ) {
        let max = (min + span).max(1);
        for mut policy in policies(min, max) {
            for (now, desired, decision) in run(&mut policy, &inputs) {
                prop_assert!(desired >= min && desired <= max,
                    "{} at {now}: {desired} outside {min}..={max}: {decision}", policy.name());
            }
        }
    }

    #[test]
    fn ours_never_scales_in_while_requests_wait(
        inputs in proptest::collection::vec((1u64..20_000, any_signals()), 1..150),
    ) {
        let mut policy = policies(1, 40).remove(0);
        let mut previous: Option<u32> = None;
        let mut now = 0;
        for (gap, signals) in &inputs {
            now += gap;
            let decision = policy.tick(now, signals);
            if let Some(previous) = previous {
                if signals.queued > 0 {
                    prop_assert!(decision.desired >= previous,
                        "at {now}: {previous} → {} with {} queued: {}",
                        decision.desired, signals.queued, decision.reason);
                }
            }
            previous = Some(decision.desired);
        }
    }

    #[test]
    fn same_inputs_same_decisions_and_a_persisted_state_resumes_the_same(
        inputs in proptest::collection::vec((1u64..20_000, any_signals()), 2..100),
        cut in 0usize..100,
    ) {
        for policy in policies(1, 20) {
            let first = run(&mut policy.clone(), &inputs);
            let second = run(&mut policy.clone(), &inputs);
            prop_assert_eq!(&first, &second);
            // Persist after `cut` ticks, resume from JSON, and continue.
            let cut = cut.min(inputs.len());
            let mut live = policy.clone();
            let before = run(&mut live, &inputs[..cut]);
            let json = serde_json::to_string(&live).expect("serialises");
            let mut resumed: Policy = serde_json::from_str(&json).expect("parses");
            let offset: u64 = inputs[..cut].iter().map(|(gap, _)| gap).sum();
            let shifted: Vec<(u64, Signals)> = inputs[cut..].to_vec();
            let mut now = offset;
            let mut after = Vec::new();
            for (gap, signals) in &shifted {
                now += gap;
                let decision = resumed.tick(now, signals);
                after.push((now, decision.desired, serde_json::to_string(&decision).expect("json")));
            }
            // Compared on the counts: JSON keeps floats to the shortest text that
            // parses back, so the float fields are not compared bit for bit.
            let counts = |rows: &[(u64, u32, String)]| -> Vec<(u64, u32)> {
                rows.iter().map(|(now, desired, _)| (*now, *desired)).collect()
            };
            let mut joined = counts(&before);
            joined.extend(counts(&after));
            prop_assert_eq!(counts(&first), joined);
        }
    }

    #[test]
    fn decisions_do_not_depend_on_later_signals(
        inputs in proptest::collection::vec((1u64..20_000, any_signals()), 2..80),
        other in proptest::collection::vec((1u64..20_000, any_signals()), 1..40),
        cut in 1usize..80,
    ) {
        let cut = cut.min(inputs.len());
        for policy in policies(1, 20) {
            let full = run(&mut policy.clone(), &inputs);
            let mut changed: Vec<(u64, Signals)> = inputs[..cut].to_vec();
            changed.extend(other.iter().cloned());
            let diverged = run(&mut policy.clone(), &changed);
            prop_assert_eq!(&full[..cut], &diverged[..cut]);
        }
    }

    #[test]
    fn a_forecast_never_reads_the_future(
        prefix in proptest::collection::vec(0.0f64..500.0, 1..60),
        future_a in proptest::collection::vec(0.0f64..500.0, 1..30),
        future_b in proptest::collection::vec(0.0f64..500.0, 1..30),
        horizon in 1usize..8,
    ) {
        let kinds = [
            ForecasterKind::Last,
            ForecasterKind::Ewma { alpha: 0.3 },
            ForecasterKind::Holt { alpha: 0.5, beta: 0.2, phi: 0.9 },
            ForecasterKind::SeasonalNaive { season: 7 },
            ForecasterKind::HoltWinters { alpha: 0.3, beta: 0.1, gamma: 0.2, phi: 0.9, season: 7 },
        ];
        for kind in kinds {
            let mut reference = Forecaster::new(kind.clone());
            for value in &prefix {
                reference.observe(*value);
            }
            let expected = reference.forecast(horizon);
            // The evaluation harness: the forecast for bucket prefix.len() - 1 + h made
            // at the end of the prefix is the same whatever follows.
            for future in [&future_a, &future_b] {
                let mut series = prefix.clone();
                series.extend(future.iter().copied());
                let mut forecaster = Forecaster::new(kind.clone());
                for value in &series[..prefix.len()] {
                    forecaster.observe(*value);
                }
                prop_assert_eq!(forecaster.forecast(horizon).to_bits(), expected.to_bits());
            }
            prop_assert!(expected >= 0.0 && expected.is_finite());
        }
    }
}

/// A plant: constant offered rate, replicas ready a cold start after they are asked
/// for, a fluid FIFO queue. Returns the desired count at every tick.
fn closed_loop(
    policy: &mut dyn ScalingPolicy,
    rate_per_s: f64,
    service_ms: f64,
    concurrency: u32,
    cold_start_ms: u64,
    ticks: usize,
) -> Vec<(u64, u32)> {
    let tick_ms = 5_000u64;
    // Ready times of the replicas asked for, oldest first.
    let mut replicas: Vec<u64> = vec![0];
    let mut queue = 0.0f64;
    let mut out = Vec::new();
    for tick in 1..=ticks as u64 {
        let now = tick * tick_ms;
        let ready = replicas.iter().filter(|at| **at <= now).count() as u32;
        let starting = replicas.len() as u32 - ready;
        let capacity = f64::from(ready * concurrency) * 1000.0 / service_ms;
        queue = (queue + (rate_per_s - capacity) * 5.0).max(0.0);
        let busy = (rate_per_s * service_ms / 1000.0).min(f64::from(ready * concurrency));
        let utilisation = if ready == 0 {
            0.0
        } else {
            busy / f64::from(ready * concurrency)
        };
        let wait_ms = if capacity > 0.0 {
            queue / capacity * 1000.0
        } else {
            60_000.0
        };
        let signals = Signals {
            window_ms: tick_ms,
            arrivals: (rate_per_s * 5.0).round() as u64,
            in_flight: busy.round() as u32,
            queued: queue.round() as u32,
            p99_ms: Some(service_ms + wait_ms),
            utilisation,
            ready,
            starting,
            service_ms,
            concurrency,
            cold_start_ms: Some(cold_start_ms as f64),
            priority: 0,
            ..Signals::default()
        };
        let desired = policy.tick(now, &signals).desired as usize;
        if desired > replicas.len() {
            replicas.extend(std::iter::repeat_n(
                now + cold_start_ms,
                desired - replicas.len(),
            ));
        } else {
            // The newest (least ready) go first.
            replicas.sort_unstable();
            replicas.truncate(desired);
        }
        out.push((now, desired as u32));
    }
    out
}

fn direction_change_times(series: &[(u64, u32)]) -> Vec<u64> {
    let mut last_direction = 0i8;
    let mut previous = None::<u32>;
    let mut changes = Vec::new();
    for (now, desired) in series {
        if let Some(previous) = previous {
            let direction = match desired.cmp(&previous) {
                std::cmp::Ordering::Greater => 1,
                std::cmp::Ordering::Less => -1,
                std::cmp::Ordering::Equal => 0,
            };
            if direction != 0 {
                if last_direction != 0 && direction != last_direction {
                    changes.push(*now);
                }
                last_direction = direction;
            }
        }
        previous = Some(*desired);
    }
    changes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn under_constant_load_at_most_one_change_of_direction_per_stabilisation_window(
        rate in 0.0f64..60.0,
        service_ms in 50.0f64..1_900.0,
        concurrency in 1u32..8,
        cold_start_ms in 0u64..90_000,
    ) {
        let config = OursConfig {
            max_replicas: 200,
            forecast: small_forecast(),
            ..OursConfig::default()
        };
        let window = config.scale_down_stabilisation_ms;
        let mut ours = Ours::new(config).expect("valid");
        let series = closed_loop(&mut ours, rate, service_ms, concurrency, cold_start_ms, 720);
        let changes = direction_change_times(&series);
        for pair in changes.windows(2) {
            prop_assert!(pair[1] - pair[0] >= window,
                "direction changed at {} and {} ms: {:?}", pair[0], pair[1], series);
        }
    }
}

#[test]
fn static_is_static() {
    let mut policy = Static::new(7);
    let decision = policy.tick(5, &Signals::default());
    assert_eq!((decision.desired, decision.warm), (7, 0));
}
