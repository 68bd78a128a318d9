//! Property tests of the queue operations a region uses to carry jobs out on real
//! processes: eviction (a drained node, a failed attempt), early stop of a terminating
//! job, adoption of running jobs from restored books, and anti-affinity groups (a
//! deployment's replicas). Under any sequence of them, mixed with submissions, ticks,
//! finishes, removals and node losses: the books balance, every job is in exactly one
//! state, no node ever holds two pods of one anti-affinity group, and an adopted job
//! holds exactly the bindings it was adopted with.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use nephele_placement::queue::{Job, JobState, MEMBER_BITS};
use nephele_placement::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// (gpus per member 0..=2, members 1..=2, anti-affinity group, priority class)
    Submit(u8, usize, Option<u64>, bool),
    Tick,
    Finish(usize),
    Remove(usize),
    Evict(usize, u64),
    Stopped(usize),
    NodeLost(usize),
    NodeUp(usize),
    /// Takes no new work but keeps its reservations (its agent is away, or drained).
    Cordon(usize),
    /// Adopt a copy of job `i`'s running placement under a fresh id after removing it
    /// (what a restart does: the same job, the same bindings).
    Readopt(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..=2, 1usize..=2, prop::option::of(0u64..3), any::<bool>())
            .prop_map(|(g, m, a, p)| Op::Submit(g, m, a, p)),
        4 => Just(Op::Tick),
        1 => (0usize..20).prop_map(Op::Finish),
        1 => (0usize..20).prop_map(Op::Remove),
        2 => (0usize..20, 0u64..5).prop_map(|(j, g)| Op::Evict(j, g)),
        2 => (0usize..20).prop_map(Op::Stopped),
        1 => (0usize..4).prop_map(Op::NodeLost),
        1 => (0usize..4).prop_map(Op::NodeUp),
        2 => (0usize..4).prop_map(Op::Cordon),
        2 => (0usize..20).prop_map(Op::Readopt),
    ]
}

fn cluster() -> Cluster {
    Cluster::new(
        (0..4)
            .map(|i| NodeSpec {
                name: format!("n{i}"),
                cpu_milli: 8_000,
                memory_mib: 32_000,
                gpus: 2,
                gpu_model: Some(0),
                ..Default::default()
            })
            .collect(),
    )
}

fn queue() -> Queue {
    Queue::new(
        QueueConfig {
            grace_seconds: 3,
            ..Default::default()
        },
        vec![queue::Tenant {
            name: "t".into(),
            weight: 1.0,
            quota: Default::default(),
        }],
        TypicalPods::default(),
    )
}

fn check_books(q: &Queue, c: &Cluster, ids: &[u64]) {
    assert!(c.accounting_holds(), "capacity = left + reservations");
    assert!(
        q.indexes_agree(),
        "the pending and terminating indexes agree with a scan of every job"
    );
    // Anti-affinity: per node, at most one reservation of each group.
    let mut seen: BTreeSet<(usize, u64)> = BTreeSet::new();
    for (_, (pod, binding)) in c.reservations() {
        if let Some(group) = pod.anti_affinity {
            assert!(
                seen.insert((binding.node, group)),
                "two pods of group {group} on node {}",
                binding.node
            );
        }
    }
    // Reservations belong to running or terminating jobs only, with their bindings.
    let mut expected: BTreeMap<u64, usize> = BTreeMap::new();
    for id in ids {
        if let Some(JobState::Running { bindings, .. } | JobState::Terminating { bindings, .. }) =
            q.state(*id)
        {
            for (member, binding) in bindings.iter().enumerate() {
                let rid = (id << MEMBER_BITS) | member as u64;
                let (_, held) = c.reservation(rid).expect("a running member is reserved");
                assert_eq!(held, binding);
                expected.insert(rid, binding.node);
            }
        }
    }
    assert_eq!(
        c.reservations().count(),
        expected.len(),
        "no reservation without a running or terminating job"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn drain_stop_and_adopt_keep_the_books(ops in prop::collection::vec(op(), 1..80)) {
        let mut c = cluster();
        let mut q = queue();
        let mut ids: Vec<u64> = Vec::new();
        let mut now = 0u64;
        let mut next_id = 0u64;
        for op in ops {
            now += 1;
            let pick = |i: usize, ids: &[u64]| (!ids.is_empty()).then(|| ids[i % ids.len()]);
            match op {
                Op::Submit(gpus, members, group, high) => {
                    let pod = PodRequest {
                        cpu_milli: 1000,
                        memory_mib: 1000,
                        num_gpu: gpus,
                        gpu_milli: if gpus == 0 { 0 } else { 500 },
                        anti_affinity: group,
                        ..Default::default()
                    };
                    let job = Job {
                        id: next_id,
                        tenant: 0,
                        priority: if high { 1000 } else { 100 },
                        submit: now,
                        members: vec![pod; members],
                        topology: Topology::Any,
                        expected_runtime: Some(10),
                        preemptible: !high,
                    };
                    q.submit(job).unwrap();
                    ids.push(next_id);
                    next_id += 1;
                }
                Op::Tick => {
                    q.tick(&mut c, now);
                }
                Op::Finish(i) => {
                    if let Some(id) = pick(i, &ids) {
                        let was = q.state(id).cloned();
                        let ended = q.finish(&mut c, id, now);
                        prop_assert_eq!(
                            ended,
                            matches!(was, Some(JobState::Running { .. } | JobState::Terminating { .. }))
                        );
                    }
                }
                Op::Remove(i) => {
                    if let Some(id) = pick(i, &ids) {
                        q.remove(&mut c, id);
                        ids.retain(|j| *j != id);
                    }
                }
                Op::Evict(i, grace) => {
                    if let Some(id) = pick(i, &ids) {
                        let was_running = matches!(q.state(id), Some(JobState::Running { .. }));
                        prop_assert_eq!(q.evict(id, now, grace), was_running);
                        if was_running {
                            let terminating = matches!(
                                q.state(id),
                                Some(JobState::Terminating { deadline, .. }) if *deadline == now + grace
                            );
                            prop_assert!(terminating);
                        }
                    }
                }
                Op::Stopped(i) => {
                    if let Some(id) = pick(i, &ids) {
                        let was = matches!(q.state(id), Some(JobState::Terminating { .. }));
                        prop_assert_eq!(q.stopped(&mut c, id, now), was);
                        if was {
                            prop_assert_eq!(q.state(id), Some(&JobState::Pending));
                        }
                    }
                }
                Op::NodeLost(node) => {
                    q.node_lost(&mut c, node, now);
                }
                Op::NodeUp(node) => {
                    c.node_up(node);
                }
                Op::Cordon(node) => {
                    c.set_available(node, false);
                }
                Op::Readopt(i) => {
                    let Some(id) = pick(i, &ids) else { continue };
                    let Some(JobState::Running { start, bindings }) = q.state(id).cloned() else {
                        continue;
                    };
                    let mut job = q.job(id).unwrap().clone();
                    q.remove(&mut c, id);
                    ids.retain(|j| *j != id);
                    job.id = next_id;
                    next_id += 1;
                    let adopted = q.adopt(&mut c, job.clone(), &bindings, start).unwrap();
                    // Removing then adopting at once always fits: the room was just freed.
                    prop_assert!(adopted);
                    prop_assert_eq!(
                        q.state(job.id),
                        Some(&JobState::Running { start, bindings: bindings.clone() })
                    );
                    ids.push(job.id);
                }
            }
            check_books(&q, &c, &ids);
        }
    }
}

#[test]
fn an_adoption_that_no_longer_fits_leaves_the_job_pending() {
    let mut c = cluster();
    let mut q = queue();
    let pod = PodRequest {
        cpu_milli: 1000,
        memory_mib: 1000,
        num_gpu: 2,
        gpu_milli: 1000,
        ..Default::default()
    };
    let job = |id| Job {
        id,
        tenant: 0,
        priority: 100,
        submit: 0,
        members: vec![pod.clone()],
        topology: Topology::Any,
        expected_runtime: None,
        preemptible: true,
    };
    let binding = Binding {
        node: 0,
        gpus: vec![(0, 1000), (1, 1000)],
        mig: None,
    };
    assert!(q
        .adopt(&mut c, job(1), std::slice::from_ref(&binding), 5)
        .unwrap());
    // The same GPUs again: they are taken, so the second job waits instead.
    assert!(!q.adopt(&mut c, job(2), &[binding], 5).unwrap());
    assert_eq!(q.state(2), Some(&JobState::Pending));
    assert!(c.accounting_holds());
    // An evicted job frees its GPUs when it reports stopped, and the other one fits.
    assert!(q.evict(1, 6, 30));
    assert!(q.stopped(&mut c, 1, 7));
    let placed = q.tick(&mut c, 8);
    assert!(
        placed
            .iter()
            .any(|e| matches!(e, queue::Effect::Bind { job: 2, .. })),
        "{placed:?}"
    );
}

#[test]
fn anti_affinity_spreads_a_group_one_per_node() {
    let mut c = cluster();
    let mut q = queue();
    for id in 0..6 {
        q.submit(Job {
            id,
            tenant: 0,
            priority: 500,
            submit: 0,
            members: vec![PodRequest {
                cpu_milli: 500,
                memory_mib: 500,
                num_gpu: 1,
                gpu_milli: 100,
                anti_affinity: Some(7),
                ..Default::default()
            }],
            topology: Topology::Any,
            expected_runtime: None,
            preemptible: false,
        })
        .unwrap();
    }
    q.tick(&mut c, 1);
    let nodes: Vec<usize> = (0..6)
        .filter_map(|id| match q.state(id) {
            Some(JobState::Running { bindings, .. }) => Some(bindings[0].node),
            _ => None,
        })
        .collect();
    let distinct: BTreeSet<usize> = nodes.iter().copied().collect();
    assert_eq!(nodes.len(), 4, "four nodes, one replica each");
    assert_eq!(distinct.len(), 4);
    let why = q.why_pending(4).map(|w| w.to_string()).unwrap_or_default();
    assert!(why.contains("replica of the same deployment"), "{why}");
}
