//! Tests of the queue: order, fairness, quota, preemption, reservation, gangs and
//! bad submissions.

// `..Default::default()` stays although every field is set today: NodeSpec and
// PodRequest are gaining fields concurrently.
use super::*;
use crate::gang::Topology;
use crate::model::NodeSpec;

fn cluster(gpus: &[u8]) -> Cluster {
    Cluster::new(
        gpus.iter()
            .enumerate()
            .map(|(i, g)| NodeSpec {
                name: format!("n{i}"),
                cpu_milli: 64_000,
                memory_mib: 256_000,
                gpus: *g,
                gpu_model: Some(0),
                ..Default::default()
            })
            .collect(),
    )
}

fn pod(gpus: u8) -> PodRequest {
    PodRequest {
        cpu_milli: 1000,
        memory_mib: 1000,
        num_gpu: gpus,
        gpu_milli: 1000,
        ..Default::default()
    }
}

fn job(id: JobId, tenant: TenantId, class: PriorityClass, submit: u64, gpus: u8) -> Job {
    Job {
        id,
        tenant,
        priority: class.priority(),
        submit,
        members: vec![pod(gpus)],
        topology: Topology::Any,
        expected_runtime: Some(100),
        preemptible: class < PriorityClass::Production,
    }
}

fn tenants(n: usize) -> Vec<Tenant> {
    (0..n)
        .map(|i| Tenant {
            name: format!("t{i}"),
            weight: 1.0,
            quota: Quota::default(),
        })
        .collect()
}

fn queue(config: QueueConfig, n: usize) -> Queue {
    Queue::new(config, tenants(n), TypicalPods::default())
}

fn bound(effects: &[Effect]) -> Vec<JobId> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Bind { job, .. } => Some(*job),
            _ => None,
        })
        .collect()
}

#[test]
fn remove_frees_resources_in_any_state_and_forgets_the_job() {
    let mut c = cluster(&[2]);
    let mut q = queue(QueueConfig::default(), 1);
    q.submit(job(1, 0, PriorityClass::Batch, 0, 2)).unwrap();
    q.submit(job(2, 0, PriorityClass::Batch, 1, 2)).unwrap();
    assert_eq!(bound(&q.tick(&mut c, 1)), vec![1]);
    // Pending: just gone.
    assert!(q.remove(&mut c, 2));
    assert_eq!(q.state(2), None);
    // Running: its GPUs come back and the next job gets them.
    assert!(q.remove(&mut c, 1));
    assert_eq!(c.used_gpu_milli(), 0);
    assert_eq!(q.usage()[0], Resources::default());
    assert!(c.accounting_holds());
    assert!(!q.remove(&mut c, 1));
    q.submit(job(3, 0, PriorityClass::Batch, 2, 2)).unwrap();
    assert_eq!(bound(&q.tick(&mut c, 2)), vec![3]);
    assert_eq!(q.counts().running, 1);
}

#[test]
fn higher_priority_class_goes_first() {
    let mut c = cluster(&[1]);
    let config = QueueConfig {
        preemption: false,
        ..Default::default()
    };
    let mut q = queue(config, 1);
    q.submit(job(1, 0, PriorityClass::BestEffort, 0, 1))
        .unwrap();
    q.submit(job(2, 0, PriorityClass::Production, 5, 1))
        .unwrap();
    assert_eq!(bound(&q.tick(&mut c, 10)), vec![2]);
    assert!(matches!(
        q.why_pending(1),
        Some(WhyPending::Unschedulable(_))
    ));
}

#[test]
fn drf_serves_the_tenant_with_the_lowest_dominant_share() {
    let mut c = cluster(&[4]);
    let mut q = queue(QueueConfig::default(), 2);
    q.submit(job(1, 0, PriorityClass::Batch, 0, 1)).unwrap();
    q.submit(job(2, 0, PriorityClass::Batch, 0, 1)).unwrap();
    assert_eq!(bound(&q.tick(&mut c, 0)), vec![1, 2]);
    // Tenant 0 holds half the GPUs; tenant 1 submitted later but goes first.
    for id in 3..5 {
        q.submit(job(id, 0, PriorityClass::Batch, 1, 1)).unwrap();
    }
    for id in 5..7 {
        q.submit(job(id, 1, PriorityClass::Batch, 2, 1)).unwrap();
    }
    assert_eq!(bound(&q.tick(&mut c, 3)), vec![5, 6]);
    // FIFO across tenants ignores shares.
    let mut c = cluster(&[4]);
    let config = QueueConfig {
        fairness: false,
        ..Default::default()
    };
    let mut q = queue(config, 2);
    for id in 1..5 {
        q.submit(job(id, 0, PriorityClass::Batch, id, 1)).unwrap();
    }
    q.submit(job(9, 1, PriorityClass::Batch, 9, 1)).unwrap();
    assert_eq!(bound(&q.tick(&mut c, 10)), vec![1, 2, 3, 4]);
}

#[test]
fn over_quota_jobs_wait_with_a_reason() {
    let mut c = cluster(&[4]);
    let mut t = tenants(1);
    t[0].quota.gpu_milli = Some(1000);
    let mut q = Queue::new(QueueConfig::default(), t, TypicalPods::default());
    q.submit(job(1, 0, PriorityClass::Batch, 0, 1)).unwrap();
    q.submit(job(2, 0, PriorityClass::Batch, 0, 1)).unwrap();
    assert_eq!(bound(&q.tick(&mut c, 0)), vec![1]);
    assert_eq!(
        q.why_pending(2),
        Some(&WhyPending::OverQuota { resource: "gpu" })
    );
    assert!(q.finish(&mut c, 1, 50));
    assert_eq!(bound(&q.tick(&mut c, 50)), vec![2]);
}

#[test]
fn preemption_frees_resources_only_after_the_grace_period() {
    let mut c = cluster(&[1]);
    let mut q = queue(QueueConfig::default(), 1);
    q.submit(job(1, 0, PriorityClass::BestEffort, 0, 1))
        .unwrap();
    assert_eq!(bound(&q.tick(&mut c, 0)), vec![1]);
    q.submit(job(2, 0, PriorityClass::Production, 10, 1))
        .unwrap();
    let effects = q.tick(&mut c, 10);
    assert!(effects.contains(&Effect::Preempt {
        victim: 1,
        by: 2,
        grace_seconds: 30
    }));
    assert_eq!(
        c.used_gpu_milli(),
        1000,
        "victim keeps its GPU during grace"
    );
    assert!(bound(&q.tick(&mut c, 20)).is_empty());
    assert_eq!(q.preemptions(), 1, "no second preemption while waiting");
    let effects = q.tick(&mut c, 40);
    assert!(effects.contains(&Effect::Requeued { job: 1 }));
    assert_eq!(bound(&effects), vec![2]);
    assert_eq!(q.state(1), Some(&JobState::Pending));
}

#[test]
fn no_useless_or_equal_priority_preemption() {
    let mut c = cluster(&[1]);
    let mut q = queue(QueueConfig::default(), 1);
    q.submit(job(1, 0, PriorityClass::BestEffort, 0, 1))
        .unwrap();
    q.tick(&mut c, 0);
    // Needs two GPUs: evicting everything still would not make room.
    q.submit(job(2, 0, PriorityClass::Production, 1, 2))
        .unwrap();
    // Same priority: never a victim.
    q.submit(job(3, 0, PriorityClass::BestEffort, 1, 1))
        .unwrap();
    let effects = q.tick(&mut c, 1);
    assert!(!effects.iter().any(|e| matches!(e, Effect::Preempt { .. })));
}

#[test]
fn fewest_then_cheapest_victims() {
    let mut c = cluster(&[2, 2]);
    let mut q = queue(QueueConfig::default(), 1);
    // Node 0: two 1-GPU best-effort jobs; node 1: one 2-GPU batch job.
    q.submit(job(1, 0, PriorityClass::BestEffort, 0, 1))
        .unwrap();
    q.submit(job(2, 0, PriorityClass::BestEffort, 0, 1))
        .unwrap();
    q.submit(job(3, 0, PriorityClass::Batch, 0, 2)).unwrap();
    assert_eq!(bound(&q.tick(&mut c, 0)).len(), 3);
    q.submit(job(4, 0, PriorityClass::Production, 5, 2))
        .unwrap();
    let victims: Vec<JobId> = q
        .tick(&mut c, 5)
        .iter()
        .filter_map(|e| match e {
            Effect::Preempt { victim, .. } => Some(*victim),
            _ => None,
        })
        .collect();
    assert_eq!(victims, vec![3], "one victim beats two cheaper ones");
}

#[test]
fn aged_job_gets_a_reservation_and_backfill_cannot_delay_it() {
    let mut c = cluster(&[5]);
    let config = QueueConfig {
        preemption: false,
        aging_seconds: Some(0),
        ..Default::default()
    };
    let mut q = queue(config, 1);
    let mut short = job(1, 0, PriorityClass::Batch, 0, 1);
    short.expected_runtime = Some(100);
    let mut long = job(2, 0, PriorityClass::Batch, 0, 2);
    long.expected_runtime = Some(1000);
    q.submit(short).unwrap();
    q.submit(long).unwrap();
    assert_eq!(bound(&q.tick(&mut c, 0)), vec![1, 2]);
    q.submit(job(3, 0, PriorityClass::Batch, 10, 4)).unwrap();
    let mut fits_before = job(4, 0, PriorityClass::Batch, 11, 1);
    fits_before.expected_runtime = Some(50);
    let mut too_long = job(5, 0, PriorityClass::Batch, 12, 1);
    too_long.expected_runtime = Some(5000);
    q.submit(fits_before).unwrap();
    q.submit(too_long).unwrap();
    assert_eq!(bound(&q.tick(&mut c, 20)), vec![4]);
    let reservation = q.reservation().cloned().unwrap();
    assert_eq!((reservation.job, reservation.start), (3, Some(1000)));
    assert_eq!(
        q.why_pending(5),
        Some(&WhyPending::BehindReservation { reserved: 3 })
    );
    q.finish(&mut c, 4, 70);
    q.finish(&mut c, 1, 100);
    assert!(bound(&q.tick(&mut c, 100)).is_empty());
    q.finish(&mut c, 2, 1000);
    // The reserved job starts on time; the long one may go once it has.
    assert_eq!(bound(&q.tick(&mut c, 1000)), vec![3, 5]);
    assert!(q.reservation().is_none());
}

#[test]
fn a_job_that_can_never_fit_gets_no_reservation() {
    let mut c = cluster(&[2]);
    let config = QueueConfig {
        aging_seconds: Some(0),
        ..Default::default()
    };
    let mut q = queue(config, 1);
    q.submit(job(1, 0, PriorityClass::Production, 0, 4))
        .unwrap();
    q.submit(job(2, 0, PriorityClass::Batch, 1, 1)).unwrap();
    assert_eq!(bound(&q.tick(&mut c, 5)), vec![2]);
    assert!(q.reservation().is_none());
}

#[test]
fn bad_submissions_are_errors() {
    let mut q = queue(QueueConfig::default(), 1);
    q.submit(job(1, 0, PriorityClass::Batch, 0, 1)).unwrap();
    assert_eq!(
        q.submit(job(1, 0, PriorityClass::Batch, 0, 1)),
        Err(QueueError::DuplicateJob(1))
    );
    assert_eq!(
        q.submit(job(2, 7, PriorityClass::Batch, 0, 1)),
        Err(QueueError::UnknownTenant(7))
    );
    let mut empty = job(3, 0, PriorityClass::Batch, 0, 1);
    empty.members.clear();
    assert_eq!(q.submit(empty), Err(QueueError::EmptyJob));
    assert_eq!(
        q.submit(job(MAX_JOB_ID + 1, 0, PriorityClass::Batch, 0, 1)),
        Err(QueueError::JobIdTooLarge)
    );
}

#[test]
fn gang_is_placed_whole_and_can_preempt() {
    let mut c = cluster(&[2, 2]);
    let mut q = queue(QueueConfig::default(), 1);
    q.submit(job(1, 0, PriorityClass::BestEffort, 0, 1))
        .unwrap();
    q.tick(&mut c, 0);
    let mut gang = job(2, 0, PriorityClass::Production, 1, 2);
    gang.members = vec![pod(2), pod(2)];
    q.submit(gang).unwrap();
    let effects = q.tick(&mut c, 1);
    assert!(effects
        .iter()
        .any(|e| matches!(e, Effect::Preempt { victim: 1, .. })));
    let effects = q.tick(&mut c, 31);
    assert_eq!(bound(&effects), vec![2]);
    assert_eq!(c.used_gpu_milli(), 4000);
}
