//! Property tests of the scheduling queue, driven through a small event loop: cluster
//! accounting and quotas hold after every tick, preemption only hits strictly lower
//! priority preemptible work and always makes room, backfilling never delays the
//! reserved job, no job is lost or duplicated, DRF ordering equals progressive filling,
//! and the same inputs give the same effects.

#![allow(clippy::unwrap_used)]
// `..Default::default()` stays although every field is set today: NodeSpec and
// PodRequest are gaining fields concurrently.

use std::collections::BTreeMap;

use nephele_placement::fairness::{drf_allocate, TenantDemand};
use nephele_placement::queue::{Counts, Effect, Job, JobState, PriorityClass, Quota, Tenant};
use nephele_placement::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Scenario {
    nodes: Vec<u8>,
    /// (tenant, class 0..3, submit, gpus per member, tenths of a GPU, members, runtime)
    jobs: Vec<(usize, u8, u64, u8, u32, usize, u64)>,
    fairness: bool,
    priorities: bool,
    preemption: bool,
    aging: Option<u64>,
    quota: bool,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        prop::collection::vec(prop_oneof![Just(1u8), Just(2), Just(4)], 1..4),
        prop::collection::vec(
            (
                0usize..3,
                0u8..3,
                0u64..60,
                0u8..=3,
                1u32..=10,
                1usize..=2,
                1u64..80,
            ),
            1..25,
        ),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(0u64..40),
        any::<bool>(),
    )
        .prop_map(
            |(nodes, jobs, fairness, priorities, preemption, aging, quota)| Scenario {
                nodes,
                jobs,
                fairness,
                priorities,
                preemption,
                aging,
                quota,
            },
        )
}

const CLASSES: [PriorityClass; 3] = [
    PriorityClass::BestEffort,
    PriorityClass::Batch,
    PriorityClass::Production,
];

fn cluster(gpus: &[u8]) -> Cluster {
    Cluster::new(
        gpus.iter()
            .enumerate()
            .map(|(i, g)| NodeSpec {
                name: format!("n{i}"),
                cpu_milli: 16_000,
                memory_mib: 64_000,
                gpus: *g,
                gpu_model: Some(0),
                ..Default::default()
            })
            .collect(),
    )
}

fn jobs_of(s: &Scenario) -> Vec<Job> {
    s.jobs
        .iter()
        .enumerate()
        .map(
            |(id, &(tenant, class, submit, gpus, tenth, members, runtime))| {
                let pod = PodRequest {
                    cpu_milli: 1000,
                    memory_mib: 2000,
                    num_gpu: gpus,
                    gpu_milli: match gpus {
                        0 => 0,
                        1 => tenth * 100,
                        _ => 1000,
                    },
                    ..Default::default()
                };
                let class = CLASSES[usize::from(class)];
                Job {
                    id: id as u64,
                    tenant,
                    priority: class.priority(),
                    submit,
                    members: vec![pod; members],
                    topology: Topology::Any,
                    expected_runtime: Some(runtime),
                    preemptible: class < PriorityClass::Production,
                }
            },
        )
        .collect()
}

struct Run {
    log: Vec<(u64, Effect)>,
    /// Reserved job → first planned start, and actual starts.
    planned: BTreeMap<u64, u64>,
    started: BTreeMap<u64, u64>,
}

/// Event loop in whole seconds; runtimes are exact, progress up to a preemption signal
/// is kept (as the queue assumes).
/// Ticks simulated: t = 0..HORIZON.
const HORIZON: u64 = 600;

fn simulate(s: &Scenario) -> Run {
    let mut c = cluster(&s.nodes);
    let tenants: Vec<Tenant> = (0..3)
        .map(|i| Tenant {
            name: format!("t{i}"),
            weight: 1.0 + i as f64,
            quota: Quota {
                gpu_milli: (s.quota && i == 0).then_some(2000),
                ..Default::default()
            },
        })
        .collect();
    let config = QueueConfig {
        fairness: s.fairness,
        priorities: s.priorities,
        preemption: s.preemption,
        aging_seconds: s.aging,
        grace_seconds: 5,
        ..Default::default()
    };
    let mut q = Queue::new(config, tenants, TypicalPods::default());
    let jobs = jobs_of(s);
    let mut remaining: Vec<u64> = jobs.iter().map(|j| j.expected_runtime.unwrap()).collect();
    let mut end: BTreeMap<u64, u64> = BTreeMap::new();
    let mut start: BTreeMap<u64, u64> = BTreeMap::new();
    let mut signalled: BTreeMap<u64, u64> = BTreeMap::new();
    let mut run = Run {
        log: Vec::new(),
        planned: BTreeMap::new(),
        started: BTreeMap::new(),
    };
    let mut submitted = 0;
    for t in 0..HORIZON {
        let done: Vec<u64> = end
            .iter()
            .filter(|(_, e)| **e == t)
            .map(|(j, _)| *j)
            .collect();
        for job in done {
            end.remove(&job);
            assert!(q.finish(&mut c, job, t));
        }
        for job in jobs.iter().filter(|j| j.submit == t) {
            q.submit(job.clone()).unwrap();
            submitted += 1;
        }
        let effects = q.tick(&mut c, t);
        if std::env::var("QDEBUG").is_ok() {
            for e in &effects {
                eprintln!("{t} {e:?}");
            }
        }
        assert!(c.accounting_holds());
        assert!(
            q.indexes_agree(),
            "indexes agree with a scan after tick {t}"
        );
        if s.quota {
            assert!(q.usage()[0].gpu_milli <= 2000, "quota exceeded");
        }
        // Preemption: strictly lower priority, preemptible, and freeing the victims
        // lets the preemptor fit.
        let mut victims_of: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for effect in &effects {
            if let Effect::Preempt { victim, by, .. } = effect {
                let (v, b) = (q.job(*victim).unwrap(), q.job(*by).unwrap());
                assert!(v.priority < b.priority && v.preemptible);
                victims_of.entry(*by).or_default().push(*victim);
            }
        }
        for (by, victims) in &victims_of {
            let mut freed = c.clone();
            for victim in victims {
                for member in 0..q.job(*victim).unwrap().members.len() {
                    freed.unreserve((victim << 16) | member as u64);
                }
            }
            let gang = GangRequest {
                first_id: (by << 16),
                members: q.job(*by).unwrap().members.clone(),
                topology: Topology::Any,
            };
            let mut rng = rng::Rng::new(0);
            let priority = freed.priority().to_vec();
            assert!(
                place_gang(
                    &mut freed,
                    &gang,
                    Policy::BestFit,
                    &TypicalPods::default(),
                    &priority,
                    &mut rng
                )
                .is_ok(),
                "useless preemption for job {by}"
            );
        }
        for effect in &effects {
            match effect {
                Effect::Bind { job, bindings } => {
                    assert_eq!(bindings.len(), q.job(*job).unwrap().members.len());
                    start.insert(*job, t);
                    run.started.entry(*job).or_insert(t);
                    end.insert(*job, t + remaining[*job as usize]);
                }
                Effect::Preempt { victim, .. } => {
                    signalled.insert(*victim, t);
                }
                Effect::Requeued { job } => {
                    end.remove(job);
                    let ran = signalled[job] - start[job];
                    remaining[*job as usize] = remaining[*job as usize].saturating_sub(ran).max(1);
                }
                Effect::Pending { .. } => {}
            }
        }
        if let Some(r) = q.reservation() {
            if let Some(at) = r.start {
                run.planned.entry(r.job).or_insert(at);
            }
        }
        // Every submitted job is in exactly one state, and exactly the running and
        // terminating ones hold reservations.
        let Counts {
            pending,
            running,
            terminating,
            finished,
        } = q.counts();
        assert_eq!(pending + running + terminating + finished, submitted);
        let held: usize = q
            .jobs()
            .filter(|(_, st)| matches!(st, JobState::Running { .. } | JobState::Terminating { .. }))
            .map(|(j, _)| j.members.len())
            .sum();
        assert_eq!(held, c.reservations().count());
        run.log.extend(effects.into_iter().map(|e| (t, e)));
    }
    run
}

proptest! {
    // Fixed seed: CI must not depend on the draw (cases found by random exploration
    // are kept in the regressions file and as named tests). Switch to RngSeed::Random
    // and raise `cases` to explore locally.
    #![proptest_config(ProptestConfig {
        cases: 64,
        rng_seed: proptest::test_runner::RngSeed::Fixed(20261130),
        ..ProptestConfig::default()
    })]

    #[test]
    fn invariants_hold_and_runs_are_deterministic(s in scenario()) {
        let first = simulate(&s);
        let second = simulate(&s);
        prop_assert_eq!(first.log, second.log);
    }

    /// Same priority, no preemption, exact runtimes, single pods: the reserved job
    /// starts no later than first planned, whatever is backfilled.
    #[test]
    fn backfill_never_delays_the_reserved_job(mut s in scenario()) {
        for job in &mut s.jobs {
            job.1 = 1;
            job.5 = 1;
        }
        s.preemption = false;
        s.quota = false;
        s.aging = Some(s.aging.unwrap_or(0));
        let run = simulate(&s);
        // A start planned at or after the horizon cannot be observed.
        for (job, planned) in run.planned.iter().filter(|(_, at)| **at < HORIZON) {
            let started = run.started.get(job).copied();
            prop_assert!(started.is_some_and(|at| at <= *planned), "job {} planned {} started {:?}", job, planned, started);
        }
    }

    /// One tick with identical tasks per tenant on one node gives DRF's progressive
    /// filling allocation.
    #[test]
    fn drf_order_matches_progressive_filling(
        tenants in prop::collection::vec((1u64..=8, 1u64..=8, 0u8..=2, 1u32..=3, 0u32..=12), 2..4),
    ) {
        let mut c = cluster(&[8]);
        let specs: Vec<Tenant> = tenants
            .iter()
            .enumerate()
            .map(|(i, t)| Tenant { name: format!("t{i}"), weight: f64::from(t.3), quota: Quota::default() })
            .collect();
        let mut q = Queue::new(QueueConfig { preemption: false, aging_seconds: None, ..Default::default() }, specs, TypicalPods::default());
        let mut id = 0;
        for (tenant, &(cpu, mem, gpus, _, n)) in tenants.iter().enumerate() {
            for _ in 0..n {
                q.submit(Job {
                    id,
                    tenant,
                    priority: 0,
                    submit: 0,
                    members: vec![PodRequest { cpu_milli: cpu * 1000, memory_mib: mem * 4000, num_gpu: gpus, gpu_milli: if gpus > 0 { 1000 } else { 0 }, ..Default::default() }],
                    topology: Topology::Any,
                    expected_runtime: None,
                    preemptible: false,
                }).unwrap();
                id += 1;
            }
        }
        let effects = q.tick(&mut c, 0);
        let mut got = vec![0u32; tenants.len()];
        for effect in &effects {
            if let Effect::Bind { job, .. } = effect {
                got[q.job(*job).unwrap().tenant] += 1;
            }
        }
        let demands: Vec<TenantDemand> = tenants
            .iter()
            .map(|&(cpu, mem, gpus, w, n)| TenantDemand {
                per_task: vec![(cpu * 1000) as f64, (mem * 4000) as f64, f64::from(gpus) * 1000.0],
                max_tasks: n,
                weight: f64::from(w),
            })
            .collect();
        prop_assert_eq!(got, drf_allocate(&[16_000.0, 64_000.0, 8000.0], &demands));
    }
}

/// Found by the property test in a clean-clone CI run: with priority ordering off, a
/// class-1 job preempted a class-0 job counting on a GPU that a class-2 job, attempted
/// later in the same tick, then took without preemption. Preemptions are now decided
/// after everything that fits without one has been placed.
#[test]
fn regression_preemption_on_three_four_gpu_nodes() {
    let s = Scenario {
        nodes: vec![4, 4, 4],
        jobs: vec![
            (2, 1, 28, 2, 1, 2, 32),
            (2, 2, 51, 1, 8, 2, 1),
            (0, 0, 2, 2, 1, 1, 54),
            (1, 0, 0, 2, 1, 1, 57),
            (1, 0, 18, 1, 3, 1, 39),
            (1, 1, 56, 2, 1, 2, 1),
            (2, 1, 35, 2, 1, 1, 22),
        ],
        fairness: true,
        priorities: false,
        preemption: true,
        aging: None,
        quota: false,
    };
    simulate(&s);
}
