//! Tests of what makes a region act: jobs that run as attempts, serving replicas,
//! nodes from providers, drains, and books that survive a restart.

use std::collections::{BTreeMap, BTreeSet};

use nephele_proto::{
    DeploymentPhase, DeploymentTelemetry, JobLaunch, JobMemberStatus, MemberState,
};

use super::*;
use crate::config::{NodesConfig, PoolConfig, ProviderKind, RegionConfig};

fn pool(name: &str, profile: &str, max_nodes: u32, provider: ProviderKind) -> PoolConfig {
    PoolConfig {
        name: name.into(),
        node_profile: profile.into(),
        capacity_type: "on-demand".into(),
        price_per_hour: 3.0,
        max_nodes,
        mig_profile: None,
        interruptions_per_1000h: 0,
        provider,
        min_nodes: 0,
        command: None,
    }
}

fn region(pools: Vec<PoolConfig>) -> RegionConfig {
    RegionConfig {
        name: "eu".into(),
        carbon_zone: None,
        pools,
    }
}

fn scheduler_with(pools: Vec<PoolConfig>) -> RegionScheduler {
    let config = SchedulerConfig {
        grace_s: 10,
        retry_backoff_s: 5,
        ..SchedulerConfig::default()
    };
    RegionScheduler::new(&region(pools), &[], &config)
        .expect("valid")
        .with_nodes(
            NodesConfig {
                scale_down_after_s: 60,
                join_timeout_s: 30,
                retry_after_s: 4,
                ..NodesConfig::default()
            },
            20,
        )
        .with_default_checkpoint_root("/ckpt")
}

fn manual(nodes: u32) -> RegionScheduler {
    scheduler_with(vec![pool("l4", "gpu-4x-l4", nodes, ProviderKind::None)])
}

fn join(s: &mut RegionScheduler, agent: &str, now: u64) -> Option<String> {
    s.agent_joined(
        agent,
        "gpu-4x-l4",
        &format!("10.0.0.{}", agent.len()),
        Vec::new(),
        now,
    )
}

fn spec(value: serde_json::Value) -> JobSpec {
    serde_json::from_value(value).expect("valid spec")
}

fn env(launch: &JobLaunch, key: &str) -> String {
    launch
        .env
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("{key} not set in {:?}", launch.env))
}

/// Every launch of every agent, with the agent.
fn launches(s: &RegionScheduler) -> Vec<(String, JobLaunch)> {
    assert!(
        s.indexes_agree(),
        "pool work walks the index of jobs with processes"
    );
    s.pool_work()
        .into_iter()
        .flat_map(|(agent, work)| work.jobs.into_iter().map(move |l| (agent.clone(), l)))
        .collect()
}

/// The key a job's processes have on the agents: `<tenant>/<name>/<uid>`.
fn key(s: &RegionScheduler, name: &str) -> String {
    let uid = s.get("default", name).map(|v| v.uid).unwrap_or(0);
    format!("default/{name}/{uid}")
}

fn report(job: &str, attempt: u32, member: u16, state: MemberState) -> JobMemberStatus {
    JobMemberStatus {
        job: job.into(),
        attempt,
        member,
        state,
    }
}

fn exited(code: i32) -> MemberState {
    MemberState::Exited {
        code: Some(code),
        signal: None,
        finished_unix: 0,
    }
}

#[test]
fn a_job_runs_as_attempts_and_is_retried_after_a_failure() {
    let mut s = manual(1);
    join(&mut s, "pool-a", 0);
    let (view, _) = s
        .submit(
            "default",
            spec(serde_json::json!({
                "name": "train", "gpus": 2, "command": ["python3", "train.py"],
                "args": ["--epochs", "3"], "env": {"LR": "0.1", "RANK": "99"}, "max_retries": 1
            })),
            1,
        )
        .expect("accepted");
    assert_eq!((view.state.as_str(), view.attempt), ("running", 1));
    let all = launches(&s);
    assert_eq!(all.len(), 1);
    let (agent, launch) = &all[0];
    assert_eq!(agent, "pool-a");
    assert_eq!(launch.argv, ["python3", "train.py", "--epochs", "3"]);
    assert_eq!((launch.attempt, launch.member), (1, 0));
    assert_eq!(env(launch, "LR"), "0.1");
    assert_eq!(env(launch, "RANK"), "0", "the control plane's RANK wins");
    assert_eq!(env(launch, "WORLD_SIZE"), "1");
    assert_eq!(
        env(launch, "NEPHELE_CHECKPOINT_DIR"),
        "/ckpt/eu/default/train"
    );
    let gpus = env(launch, "CUDA_VISIBLE_DEVICES");
    assert_eq!(gpus.split(',').count(), 2, "{gpus}");

    // It runs, then fails: the attempt ends, and the job waits out its backoff.
    s.member_reports(
        "pool-a",
        &[report(
            &key(&s, "train"),
            1,
            0,
            MemberState::Running {
                pid: 7,
                started_unix: 2,
            },
        )],
        2,
    );
    assert_eq!(
        s.get("default", "train").expect("job").members[0].state,
        "running"
    );
    let events = s.member_reports("pool-a", &[report(&key(&s, "train"), 1, 0, exited(3))], 3);
    assert!(
        matches!(
            &events[..],
            [SchedEvent::Failed {
                retry_in_s: Some(5),
                ..
            }]
        ),
        "{events:?}"
    );
    let view = s.get("default", "train").expect("job");
    assert_eq!(view.state.as_str(), "backoff");
    assert_eq!(
        view.attempts[0].outcome.as_deref(),
        Some("failed: member 0 exited with code 3")
    );
    assert!(
        launches(&s).is_empty(),
        "a failed attempt is not desired any more"
    );
    assert!(s.nodes()[0].jobs.is_empty(), "its resources are back");
    // A stale report of the old attempt changes nothing.
    assert!(s
        .member_reports("pool-a", &[report(&key(&s, "train"), 1, 0, exited(0))], 4)
        .is_empty());
    s.tick(7);
    assert_eq!(s.get("default", "train").expect("job").state, "backoff");
    s.tick(8);
    let view = s.get("default", "train").expect("job");
    assert_eq!((view.state.as_str(), view.attempt), ("running", 2));
    assert_eq!(launches(&s)[0].1.attempt, 2);
    // Its second failure uses up its one retry: failed for good.
    let events = s.member_reports(
        "pool-a",
        &[report(
            &key(&s, "train"),
            2,
            0,
            MemberState::FailedToStart("no python3".into()),
        )],
        9,
    );
    assert!(
        matches!(
            &events[..],
            [SchedEvent::Failed {
                retry_in_s: None,
                ..
            }]
        ),
        "{events:?}"
    );
    let view = s.get("default", "train").expect("job");
    assert_eq!(view.state.as_str(), "failed");
    assert!(view
        .outcome
        .expect("outcome")
        .contains("could not start: no python3"));
    assert!(s.accounting_holds());
}

#[test]
fn a_gang_gets_ranks_one_rendezvous_and_succeeds_when_every_member_exits_0() {
    let mut s = manual(2);
    join(&mut s, "pool-a", 0);
    join(&mut s, "pool-bb", 0);
    s.submit(
        "default",
        spec(serde_json::json!({
            "name": "ddp", "members": 4, "gpus": 2, "command": ["torchrun-like"]
        })),
        1,
    )
    .expect("accepted");
    let all = launches(&s);
    assert_eq!(all.len(), 4);
    let ranks: BTreeSet<String> = all.iter().map(|(_, l)| env(l, "RANK")).collect();
    assert_eq!(ranks, ["0", "1", "2", "3"].map(String::from).into());
    let rank0 = all
        .iter()
        .find(|(_, l)| env(l, "RANK") == "0")
        .expect("rank 0");
    let master_addr = if rank0.0 == "pool-a" {
        "10.0.0.6"
    } else {
        "10.0.0.7"
    };
    for (agent, launch) in &all {
        assert_eq!(env(launch, "WORLD_SIZE"), "4");
        assert_eq!(env(launch, "MASTER_ADDR"), master_addr);
        assert_eq!(env(launch, "MASTER_PORT"), env(&all[0].1, "MASTER_PORT"));
        let local: Vec<String> = all
            .iter()
            .filter(|(a, _)| a == agent)
            .map(|(_, l)| env(l, "LOCAL_RANK"))
            .collect();
        assert_eq!(local.len(), 2, "two members per node");
        assert!(local.contains(&"0".to_string()) && local.contains(&"1".to_string()));
    }
    let port: u16 = env(&all[0].1, "MASTER_PORT").parse().expect("a port");
    assert!((29500..=30499).contains(&port));
    // Three members done: still running; the fourth: succeeded, resources freed.
    let done: Vec<JobMemberStatus> = (0..3)
        .map(|m| report(&key(&s, "ddp"), 1, m, exited(0)))
        .collect();
    assert!(s.member_reports("pool-a", &done, 5).is_empty());
    assert_eq!(s.get("default", "ddp").expect("job").state, "running");
    let events = s.member_reports("pool-bb", &[report(&key(&s, "ddp"), 1, 3, exited(0))], 6);
    assert!(
        matches!(&events[..], [SchedEvent::Succeeded { attempt: 1, .. }]),
        "{events:?}"
    );
    assert_eq!(s.get("default", "ddp").expect("job").state, "succeeded");
    assert!(launches(&s).is_empty());
    assert!(s.nodes().iter().all(|n| n.jobs.is_empty()));
}

#[test]
fn a_preempted_job_is_stopped_then_runs_again_with_the_same_checkpoint_dir() {
    let mut s = manual(1);
    join(&mut s, "pool-a", 0);
    s.submit(
        "default",
        spec(serde_json::json!({"name": "low", "gpus": 4, "priority": "batch", "command": ["c"]})),
        1,
    )
    .expect("accepted");
    let first = launches(&s)[0].1.clone();
    let (high, events) = s
        .submit(
            "default",
            spec(serde_json::json!({"name": "high", "gpus": 4, "priority": "production", "command": ["c"]})),
            2,
        )
        .expect("accepted");
    assert_eq!(high.state.as_str(), "pending");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, SchedEvent::Preempting { .. })),
        "{events:?}"
    );
    // The victim leaves the desired state at once: its agent sends SIGTERM.
    assert!(launches(&s).iter().all(|(_, l)| l.job != key(&s, "low")));
    assert_eq!(s.get("default", "low").expect("job").state, "terminating");
    // It checkpoints and exits (143 after SIGTERM is no failure): its GPUs go to `high`.
    s.member_reports("pool-a", &[report(&key(&s, "low"), 1, 0, exited(143))], 3);
    s.tick(3);
    assert_eq!(s.get("default", "high").expect("job").state, "running");
    let low = s.get("default", "low").expect("job");
    assert_eq!((low.state.as_str(), low.requeues), ("pending", 1));
    assert_eq!(low.attempts[0].outcome.as_deref(), Some("preempted"));
    // When `high` is done, `low` runs again as attempt 2 with the same checkpoint dir.
    s.member_reports("pool-a", &[report(&key(&s, "high"), 1, 0, exited(0))], 4);
    s.tick(5);
    let again = launches(&s)
        .into_iter()
        .find(|(_, l)| l.job == key(&s, "low"))
        .expect("low runs again")
        .1;
    assert_eq!(again.attempt, 2);
    assert_eq!(
        env(&again, "NEPHELE_CHECKPOINT_DIR"),
        env(&first, "NEPHELE_CHECKPOINT_DIR")
    );
}

#[test]
fn jobs_that_can_never_fit_are_refused_with_the_reason() {
    let mut s = manual(2);
    for (body, expect) in [
        (
            serde_json::json!({"name": "a", "gpus": 8}),
            "insufficient gpu",
        ),
        (
            serde_json::json!({"name": "b", "gpus": 1, "mig_profile": "1g.10gb"}),
            "mig",
        ),
        (
            serde_json::json!({"name": "c", "node_selector": {"nephele.io/pool": "h100"}}),
            "node selector mismatch",
        ),
        (
            serde_json::json!({"name": "d", "members": 3, "gpus": 3, "topology": "same-node"}),
            "must share one",
        ),
        (serde_json::json!({"name": "e", "command": [""]}), "program"),
        (
            serde_json::json!({"name": "f", "args": ["x"]}),
            "args need a command",
        ),
        (
            serde_json::json!({"name": "g", "command": ["x"], "env": {"A=B": "1"}}),
            "env name",
        ),
    ] {
        let error = s
            .submit("default", spec(body.clone()), 0)
            .expect_err("refused");
        assert!(error.to_string().contains(expect), "{body}: {error}");
    }
    assert!(s.list(None).is_empty(), "nothing was kept of a refused job");
}

fn replica_spec(name: &str, min: u32, max: u32) -> ReplicaSpec {
    ReplicaSpec {
        deployment: name.into(),
        cpu_milli: 1000,
        memory_mib: 1024,
        gpu_milli: 100,
        mig_profile: None,
        priority: 500,
        min,
        max,
        spot_ok: true,
    }
}

fn ready(deployment: &str) -> Vec<DeploymentTelemetry> {
    vec![DeploymentTelemetry::idle(
        deployment,
        DeploymentPhase::Ready,
    )]
}

#[test]
fn replicas_are_placed_one_per_node_above_batch_and_routed_once_ready() {
    let mut s = manual(3);
    for agent in ["pool-a", "pool-b", "pool-c"] {
        join(&mut s, agent, 0);
    }
    // Batch work fills every GPU first.
    for n in 0..3 {
        s.submit(
            "default",
            spec(serde_json::json!({"name": format!("b{n}"), "gpus": 4, "priority": "batch"})),
            0,
        )
        .expect("accepted");
    }
    s.sync_replica_sets(&[replica_spec("digits", 2, 4)], 1);
    // Replicas preempt batch work: nothing is placed until the victims' grace is over.
    assert_eq!(s.replica_counts("digits"), (0, 0, 2));
    // The queue preempts for one replica at a time here: the second would fit in the
    // room freed for the first, until the first takes it and anti-affinity sends the
    // second elsewhere. So the second starts one grace period later.
    s.tick(12);
    assert_eq!(s.replica_counts("digits").1, 1);
    s.tick(23);
    let (_, starting, _) = s.replica_counts("digits");
    assert_eq!(starting, 2);
    let holders: Vec<String> = s
        .pool_work()
        .into_iter()
        .filter(|(_, w)| w.deployments.contains("digits"))
        .map(|(a, _)| a)
        .collect();
    assert_eq!(
        holders.len(),
        2,
        "only the agents holding a replica load the model"
    );
    assert!(s.ready_agents("digits").is_empty(), "none is ready yet");
    for agent in &holders {
        s.replica_reports(agent, &ready("digits"), 25);
    }
    let mut routed = s.ready_agents("digits");
    routed.sort();
    assert_eq!(routed, holders);
    let view = s.replica_set_view("digits").expect("view");
    assert_eq!(view.cold_starts_ms.len(), 2);
    assert!(
        view.cold_starts_ms.iter().all(|ms| *ms <= 14_000),
        "{view:?}"
    );
    // Four replicas need four nodes (one per node): the fourth waits.
    s.scale("digits", 4, 26).expect("scaled");
    s.tick(40);
    let (ready_n, starting, pending) = s.replica_counts("digits");
    assert_eq!((ready_n + starting, pending), (3, 1));
    let view = s.replica_set_view("digits").expect("view");
    let pending: Vec<_> = view
        .replicas
        .iter()
        .filter(|r| r.state == "pending")
        .collect();
    assert_eq!(pending.len(), 1);
    // The pending one says why, as a pending job does; the placed ones say nothing.
    let why = pending[0].why_pending.as_ref().expect("a reason");
    assert!(!why.message.is_empty(), "{why:?}");
    assert!(view
        .replicas
        .iter()
        .filter(|r| r.state != "pending")
        .all(|r| r.why_pending.is_none()));
    // Scaling in removes the pending one first, then a ready one.
    s.scale("digits", 2, 41).expect("scaled");
    assert_eq!(s.replica_counts("digits").2, 0);
    // The deployment goes: every replica goes.
    s.sync_replica_sets(&[], 50);
    assert!(s.pool_work().values().all(|w| w.deployments.is_empty()));
    assert!(s.accounting_holds());
}

#[test]
fn a_drained_node_moves_its_replicas_first_and_stops_its_jobs() {
    let mut s = manual(2);
    join(&mut s, "pool-a", 0);
    s.sync_replica_sets(&[replica_spec("digits", 1, 2)], 0);
    s.submit(
        "default",
        spec(serde_json::json!({"name": "job", "gpus": 2, "command": ["c"]})),
        0,
    )
    .expect("accepted");
    s.replica_reports("pool-a", &ready("digits"), 2);
    assert_eq!(s.ready_agents("digits"), ["pool-a"]);
    join(&mut s, "pool-b", 3);
    // A spot notice for node l4-0: 120 s.
    let events = s
        .drain("l4-0", 124, "interruption notice", 4)
        .expect("drains");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, SchedEvent::Replica { .. })),
        "{events:?}"
    );
    s.tick(4);
    // The replacement starts on the other node; the old one still serves meanwhile.
    assert_eq!(s.ready_agents("digits"), ["pool-a"]);
    assert!(s.pool_work()["pool-b"].deployments.contains("digits"));
    assert_eq!(s.get("default", "job").expect("job").state, "terminating");
    assert!(
        launches(&s).iter().all(|(a, _)| a != "pool-a"),
        "its job is stopped"
    );
    s.replica_reports("pool-b", &ready("digits"), 9);
    s.tick(9);
    assert_eq!(
        s.ready_agents("digits"),
        ["pool-b"],
        "the old one left once replaced"
    );
    assert!(!s.pool_work()["pool-a"].deployments.contains("digits"));
    // The job checkpoints, exits, and runs again on the other node.
    s.member_reports("pool-a", &[report(&key(&s, "job"), 1, 0, exited(143))], 10);
    s.tick(10);
    let job = s.get("default", "job").expect("job");
    assert_eq!((job.state.as_str(), job.attempt), ("running", 2));
    assert_eq!(job.placement[0].node, "l4-1");
    let node = &s.nodes()[0];
    assert_eq!((node.phase.as_str(), node.up), ("draining", false));
    assert!(node.jobs.is_empty());
}

fn provider_pool(max: u32) -> RegionScheduler {
    scheduler_with(vec![pool("l4", "gpu-4x-l4", max, ProviderKind::Local)])
}

fn launched(actions: &[NodeAction]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            NodeAction::Launch { device, .. } => Some(device.clone()),
            _ => None,
        })
        .collect()
}

fn released(actions: &[NodeAction]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            NodeAction::Release { device, .. } => Some(device.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_provider_pool_launches_nodes_for_pending_work_and_releases_idle_ones() {
    let mut s = provider_pool(4);
    assert_eq!(s.plan_nodes(0).0, vec![], "no work, no nodes");
    s.submit(
        "default",
        spec(serde_json::json!({"name": "gang", "members": 2, "gpus": 4, "command": ["c"]})),
        1,
    )
    .expect("accepted");
    let (actions, _) = s.plan_nodes(1);
    assert_eq!(launched(&actions), ["eu-l4-0", "eu-l4-1"]);
    // Planned again before they join: nothing more (a launching node counts).
    assert!(s.plan_nodes(2).0.is_empty());
    // One launch fails: its slot is free again and the pool backs off.
    s.launch_result("l4-1", Err("quota exceeded".into()), 3);
    assert_eq!(s.nodes()[1].phase, "absent");
    assert!(s.nodes()[1].note.as_deref().unwrap_or("").contains("quota"));
    assert!(
        launched(&s.plan_nodes(4).0).is_empty(),
        "within the backoff"
    );
    let (actions, _) = s.plan_nodes(8);
    assert_eq!(launched(&actions), ["eu-l4-1"]);
    // The nodes' agents join as their device names; the gang runs.
    s.launch_result("l4-0", Ok(()), 8);
    assert_eq!(join(&mut s, "eu-l4-0", 9).as_deref(), Some("l4-0"));
    assert_eq!(join(&mut s, "eu-l4-1", 9).as_deref(), Some("l4-1"));
    // An agent enrolled by hand gets no slot of a provider pool.
    assert_eq!(join(&mut s, "stray", 9), None);
    s.tick(9);
    assert_eq!(s.get("default", "gang").expect("job").state, "running");
    // Done: the nodes are empty, and released after 60 s, one at a time (budget 1).
    let done: Vec<JobMemberStatus> = (0..2)
        .map(|m| report(&key(&s, "gang"), 1, m, exited(0)))
        .collect();
    s.member_reports("eu-l4-0", &done, 10);
    s.tick(10);
    assert!(released(&s.plan_nodes(60).0).is_empty());
    s.tick(71);
    let (actions, _) = s.plan_nodes(71);
    assert_eq!(released(&actions), ["eu-l4-1"], "highest index first");
    assert!(
        released(&s.plan_nodes(72).0).is_empty(),
        "budget: one at a time"
    );
    s.release_result("l4-1", Ok(()), 73);
    let (actions, _) = s.plan_nodes(74);
    assert_eq!(released(&actions), ["eu-l4-0"]);
    s.release_result("l4-0", Err("api down".into()), 75);
    assert_eq!(s.nodes()[0].phase, "releasing");
    assert!(
        released(&s.plan_nodes(76).0).is_empty(),
        "retried after its backoff"
    );
    assert_eq!(released(&s.plan_nodes(90).0), ["eu-l4-0"]);
    s.release_result("l4-0", Ok(()), 91);
    assert!(s.nodes().iter().all(|n| n.phase == "absent"));
}

#[test]
fn a_launch_that_never_joins_is_released_and_tried_again() {
    let mut s = provider_pool(2);
    s.submit(
        "default",
        spec(serde_json::json!({"name": "j", "gpus": 1})),
        0,
    )
    .expect("accepted");
    assert_eq!(launched(&s.plan_nodes(0).0), ["eu-l4-0"]);
    s.launch_result("l4-0", Ok(()), 1);
    // 30 s without its agent: released, and the pool backs off.
    let (actions, _) = s.plan_nodes(31);
    assert_eq!(released(&actions), ["eu-l4-0"]);
    s.release_result("l4-0", Ok(()), 32);
    let (actions, _) = s.plan_nodes(40);
    assert_eq!(launched(&actions).len(), 1, "the job still needs a node");
}

/// Everything a restart keeps.
fn restart(s: &RegionScheduler, pools: Vec<PoolConfig>, now: u64) -> RegionScheduler {
    let jobs: Vec<JobRecord> = s.job_records().into_values().collect();
    let nodes: Vec<NodeRecord> = s.node_records().into_values().collect();
    let region = s.region_record();
    // Through JSON, as the store keeps them.
    let jobs: Vec<JobRecord> =
        serde_json::from_str(&serde_json::to_string(&jobs).expect("json")).expect("back");
    let mut fresh = scheduler_with(pools);
    let problems = fresh.restore(jobs, nodes, Some(region), now);
    assert!(problems.is_empty(), "{problems:?}");
    fresh
}

#[test]
fn the_books_survive_a_restart_and_nothing_starts_twice() {
    let pools = vec![pool("l4", "gpu-4x-l4", 2, ProviderKind::None)];
    let mut s = scheduler_with(pools.clone());
    join(&mut s, "pool-a", 0);
    join(&mut s, "pool-bb", 0);
    s.sync_replica_sets(&[replica_spec("digits", 2, 2)], 0);
    s.submit(
        "default",
        spec(serde_json::json!({"name": "gang", "members": 2, "gpus": 2, "command": ["c"]})),
        0,
    )
    .expect("accepted");
    s.submit(
        "default",
        spec(serde_json::json!({"name": "waits", "gpus": 4, "command": ["c"]})),
        0,
    )
    .expect("accepted");
    for agent in ["pool-a", "pool-bb"] {
        s.replica_reports(agent, &ready("digits"), 1);
    }
    let before = s.pool_work();
    assert_eq!(before.values().map(|w| w.jobs.len()).sum::<usize>(), 2);

    let mut r = restart(&s, pools.clone(), 100);
    // Until the agents are back, their work is still theirs: an agent reconnecting
    // first thing is told to keep running it.
    assert_eq!(r.pool_work(), before);
    assert_eq!(r.get("default", "gang").expect("job").state, "recovering");
    assert_eq!(r.get("default", "waits").expect("job").state, "pending");
    join(&mut r, "pool-bb", 101);
    r.tick(101);
    assert_eq!(r.get("default", "gang").expect("job").state, "recovering");
    join(&mut r, "pool-a", 102);
    let events = r.tick(102);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, SchedEvent::Placed { .. })),
        "{events:?}"
    );
    let gang = r.get("default", "gang").expect("job");
    assert_eq!(
        (gang.state.as_str(), gang.attempt),
        ("running", 1),
        "adopted, not started again"
    );
    assert_eq!(r.pool_work(), before, "the same launches, the same attempt");
    for agent in ["pool-a", "pool-bb"] {
        r.replica_reports(agent, &ready("digits"), 103);
    }
    assert_eq!(r.replica_counts("digits"), (2, 0, 0));
    // Adopted replicas' first ready report is not a cold start.
    assert_eq!(
        r.replica_set_view("digits").expect("view").cold_starts_ms,
        s.replica_set_view("digits").expect("view").cold_starts_ms
    );
    assert!(r.accounting_holds());
}

#[test]
fn a_restored_job_whose_nodes_do_not_come_back_runs_again_elsewhere() {
    let pools = vec![pool("l4", "gpu-4x-l4", 2, ProviderKind::None)];
    let mut s = scheduler_with(pools.clone());
    join(&mut s, "pool-a", 0);
    s.submit(
        "default",
        spec(serde_json::json!({"name": "j", "gpus": 4, "command": ["c"]})),
        0,
    )
    .expect("accepted");
    let mut r = restart(&s, pools, 100);
    join(&mut r, "pool-bb", 100);
    r.tick(120);
    assert_eq!(r.get("default", "j").expect("job").state, "recovering");
    // 60 s (recover_timeout_s) later: attempt 2 on the node that is there.
    r.tick(161);
    let j = r.get("default", "j").expect("job");
    assert_eq!((j.state.as_str(), j.attempt), ("running", 2));
    assert_eq!(j.placement[0].agent.as_deref(), Some("pool-bb"));
    let all = launches(&r);
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].0.as_str(), all[0].1.attempt), ("pool-bb", 2));
}

#[derive(Debug, Clone)]
enum Op {
    Join(usize),
    Leave(usize),
    Submit {
        gpus: u8,
        members: u16,
        command: bool,
    },
    Exit {
        job: usize,
        member: u16,
        code: i32,
    },
    Delete(usize),
    Tick(u64),
    Plan,
    LaunchDone(usize, bool),
    ReleaseDone(usize, bool),
    Scale(u32),
    Ready(usize),
    Drain(usize),
    Restart,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        2 => (0usize..3).prop_map(Op::Join),
        1 => (0usize..3).prop_map(Op::Leave),
        3 => (0u8..=4, 1u16..=2, any::<bool>()).prop_map(|(gpus, members, command)| Op::Submit { gpus, members, command }),
        3 => (0usize..12, 0u16..2, prop_oneof![Just(0), Just(1), Just(143)]).prop_map(|(job, member, code)| Op::Exit { job, member, code }),
        1 => (0usize..12).prop_map(Op::Delete),
        3 => (1u64..40).prop_map(Op::Tick),
        2 => Just(Op::Plan),
        1 => (0usize..3, any::<bool>()).prop_map(|(n, ok)| Op::LaunchDone(n, ok)),
        1 => (0usize..3, any::<bool>()).prop_map(|(n, ok)| Op::ReleaseDone(n, ok)),
        1 => (0u32..4).prop_map(Op::Scale),
        2 => (0usize..3).prop_map(Op::Ready),
        1 => (0usize..3).prop_map(Op::Drain),
        1 => Just(Op::Restart),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// Whatever happens (agents, jobs, exits, provider answers, drains, scaling,
    /// restarts): the books balance; no launch of one (job, attempt, member) is ever
    /// given to two agents; a job's attempt never goes back; at most one replica of a
    /// deployment per node; a node counts as capacity only while launching or up.
    #[test]
    fn a_region_that_acts_keeps_its_books(ops in proptest::collection::vec(op(), 1..70)) {
        let pools = vec![
            pool("l4", "gpu-4x-l4", 2, ProviderKind::Local),
            pool("hand", "gpu-4x-l4", 1, ProviderKind::None),
        ];
        let mut s = scheduler_with(pools.clone());
        s.sync_replica_sets(&[replica_spec("digits", 1, 3)], 0);
        let mut now = 0u64;
        let mut submitted = 0usize;
        let agents = ["eu-l4-0", "eu-l4-1", "hand-agent"];
        let mut owner: BTreeMap<(String, u32, u16), String> = BTreeMap::new();
        let mut attempts: BTreeMap<String, u32> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Join(a) => { join(&mut s, agents[a], now); }
                Op::Leave(a) => { s.agent_left(agents[a], now); }
                Op::Submit { gpus, members, command } => {
                    let mut body = serde_json::json!({"name": format!("j{submitted}"), "gpus": gpus, "members": members});
                    if command { body["command"] = serde_json::json!(["c"]); }
                    let _ = s.submit("default", spec(body), now);
                    submitted += 1;
                }
                Op::Exit { job, member, code } => {
                    let name = key(&s, &format!("j{job}"));
                    let attempt = attempts.get(&name).copied().unwrap_or(1);
                    for agent in agents {
                        s.member_reports(agent, &[report(&name, attempt, member, exited(code))], now);
                    }
                }
                Op::Delete(j) => { let _ = s.delete("default", &format!("j{j}"), now); }
                Op::Tick(dt) => { now += dt; s.tick(now); }
                Op::Plan => { s.plan_nodes(now); }
                Op::LaunchDone(n, ok) => {
                    s.launch_result(&format!("l4-{n}"), if ok { Ok(()) } else { Err("no".into()) }, now);
                }
                Op::ReleaseDone(n, ok) => {
                    s.release_result(&format!("l4-{n}"), if ok { Ok(()) } else { Err("no".into()) }, now);
                }
                Op::Scale(n) => { let _ = s.scale("digits", n, now); }
                Op::Ready(a) => { s.replica_reports(agents[a], &ready("digits"), now); }
                Op::Drain(n) => {
                    let node = s.nodes()[n % 3].name.clone();
                    let _ = s.drain(&node, now + 30, "test", now);
                }
                Op::Restart => { s = restart(&s, pools.clone(), now); }
            }
            proptest::prop_assert!(s.accounting_holds());
            proptest::prop_assert!(s.indexes_agree(), "a held job or one with processes is not indexed");
            for (agent, launch) in launches(&s) {
                let key = (launch.job.clone(), launch.attempt, launch.member);
                let first = owner.entry(key.clone()).or_insert_with(|| agent.clone());
                proptest::prop_assert_eq!(&*first, &agent, "{:?} given to two agents", key);
                let last = attempts.entry(launch.job.clone()).or_insert(launch.attempt);
                proptest::prop_assert!(launch.attempt >= *last, "attempt went back");
                *last = launch.attempt;
            }
            for node in s.nodes() {
                let mut seen = BTreeSet::new();
                for deployment in &node.replicas {
                    proptest::prop_assert!(seen.insert(deployment.clone()), "two replicas on {}", node.name);
                }
                if node.up {
                    proptest::prop_assert!(node.phase == "up", "{} takes work while {}", node.name, node.phase);
                }
                if matches!(node.phase.as_str(), "absent" | "launching" | "releasing") {
                    proptest::prop_assert!(node.jobs.is_empty(), "{} holds work while {}", node.name, node.phase);
                }
            }
        }
    }
}

#[test]
fn after_a_restart_the_books_are_reconciled_with_what_the_provider_runs() {
    let pools = vec![pool("l4", "gpu-4x-l4", 3, ProviderKind::Local)];
    let mut s = scheduler_with(pools.clone());
    s.submit(
        "default",
        spec(serde_json::json!({"name": "j", "gpus": 4, "members": 2})),
        0,
    )
    .expect("accepted");
    assert_eq!(launched(&s.plan_nodes(0).0), ["eu-l4-0", "eu-l4-1"]);
    join(&mut s, "eu-l4-0", 1);
    join(&mut s, "eu-l4-1", 1);
    s.tick(1);
    let mut r = restart(&s, pools, 100);
    // The provider still runs l4-0 and an l4-2 the books never recorded; l4-1 is gone.
    let (actions, events) =
        r.provider_listed("l4", &["eu-l4-0".to_string(), "eu-l4-2".to_string()], 100);
    assert_eq!(released(&actions), ["eu-l4-2"]);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, SchedEvent::Node { node, .. } if node == "l4-1")),
        "{events:?}"
    );
    let nodes = r.nodes();
    assert_eq!(
        nodes.iter().map(|n| n.phase.as_str()).collect::<Vec<_>>(),
        ["up", "absent", "releasing"]
    );
    // The gang that ran on l4-0 and l4-1 runs again elsewhere once nodes are back.
    assert_eq!(r.get("default", "j").expect("job").state, "recovering");
}
