//! Tests of the region scheduler core.

use nephele_placement::grid::{GridPoint, HOUR_S};

use super::*;
use crate::config::{PoolConfig, RegionConfig, TenantConfig};

fn region(max_nodes: u32) -> RegionConfig {
    RegionConfig {
        name: "eu".into(),
        carbon_zone: None,
        pools: vec![PoolConfig {
            name: "l4".into(),
            node_profile: "gpu-4x-l4".into(),
            capacity_type: "on-demand".into(),
            price_per_hour: 3.0,
            max_nodes,
            mig_profile: None,
            interruptions_per_1000h: 0,
            provider: crate::config::ProviderKind::None,
            min_nodes: 0,
            command: None,
        }],
    }
}

/// A pool agent with `profile` connects at time 0 from 127.0.0.1.
fn join(s: &mut RegionScheduler, agent: &str, profile: &str) -> Option<String> {
    s.agent_joined(agent, profile, "127.0.0.1", Vec::new(), 0)
}

fn tenants() -> Vec<TenantConfig> {
    ["alpha", "beta"]
        .into_iter()
        .map(|name| TenantConfig {
            name: name.into(),
            weight: 1.0,
            quota_cpu_milli: None,
            quota_memory_mib: None,
            quota_gpu_milli: (name == "beta").then_some(2000),
            quota_jobs: None,
            quota_replicas: None,
        })
        .collect()
}

fn scheduler(max_nodes: u32) -> RegionScheduler {
    let config = SchedulerConfig {
        grace_s: 10,
        ..SchedulerConfig::default()
    };
    RegionScheduler::new(&region(max_nodes), &tenants(), &config).expect("valid")
}

fn spec(value: serde_json::Value) -> JobSpec {
    serde_json::from_value(value).expect("valid spec")
}

#[test]
fn jobs_wait_for_pool_agents_and_say_why() {
    let mut s = scheduler(2);
    let (view, _) = s
        .submit(
            "alpha",
            spec(serde_json::json!({"name": "train", "gpus": 2})),
            100,
        )
        .expect("accepted");
    assert_eq!(view.state.as_str(), "pending");
    let why = view.why_pending.expect("why");
    assert_eq!(why.message, "0/2 nodes can take it: 2 node down");
    assert!(why.hint.expect("hint").contains("--role pool"));
    assert_eq!(join(&mut s, "pool-a", "gpu-4x-l4").as_deref(), Some("l4-0"));
    // An agent with another profile gets no slot.
    assert_eq!(join(&mut s, "cpu-1", "x86-cpu-server"), None);
    let events = s.tick(101);
    assert_eq!(
        events,
        vec![SchedEvent::Placed {
            job: "alpha/train".into(),
            nodes: vec!["l4-0".into()]
        }]
    );
    let view = s.get("alpha", "train").expect("exists");
    assert_eq!(view.state.as_str(), "running");
    assert_eq!(view.placement[0].agent.as_deref(), Some("pool-a"));
    assert_eq!(view.placement[0].gpus.len(), 2);
    // Tenant isolation: beta does not see alpha's job.
    assert!(matches!(
        s.get("beta", "train"),
        Err(SchedError::NotFound(_))
    ));
    assert_eq!(s.list(Some("beta")).len(), 0);
    assert_eq!(s.list(None).len(), 1);
    assert!(s.accounting_holds());
}

#[test]
fn a_batch_of_submissions_is_placed_by_one_tick_and_names_the_records_it_changed() {
    let mut s = scheduler(1);
    join(&mut s, "pool-a", "gpu-4x-l4");
    let _ = s.tick(100);
    // Whatever came before is written by a full write.
    assert_eq!(s.take_touched(), None);
    let ids: Vec<JobId> = ["a", "b", "c"]
        .into_iter()
        .map(|name| {
            s.admit(
                "alpha",
                spec(serde_json::json!({"name": name, "gpus": 1})),
                None,
                101,
            )
            .expect("admitted")
        })
        .collect();
    // Admitted, not placed yet: the batch's tick places them together.
    assert_eq!(s.job_view(ids[0]).expect("view").state.as_str(), "pending");
    let events = s.tick(101);
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, SchedEvent::Placed { .. }))
            .count(),
        3
    );
    let touched = s.take_touched().expect("only the batch changed");
    assert_eq!(touched, ids);
    // The batch's records are the full write's records for those jobs.
    let all = s.job_records();
    let batch = s.job_records_of(&touched);
    assert_eq!(batch.len(), 3);
    for (key, record) in &batch {
        assert_eq!(all.get(key), Some(record), "{key}");
    }
    assert_eq!(s.take_touched(), Some(Vec::new()), "taken");
    assert_eq!(s.job_state_counts().get("running"), Some(&3));
    // A deletion leaves a record to delete, which only a full write finds.
    s.delete("alpha", "b", 102).expect("deleted");
    assert_eq!(s.take_touched(), None);
    // A name taken within the batch is refused at once, as a single submission is.
    assert!(matches!(
        s.admit(
            "alpha",
            spec(serde_json::json!({"name": "a", "gpus": 1})),
            None,
            103
        ),
        Err(SchedError::Conflict(_))
    ));
}

#[test]
fn a_gang_is_placed_whole_and_requeued_whole_when_a_node_goes() {
    let mut s = scheduler(2);
    join(&mut s, "pool-a", "gpu-4x-l4");
    join(&mut s, "pool-b", "gpu-4x-l4");
    let (view, _) = s
        .submit(
            "alpha",
            spec(serde_json::json!({"name": "gang", "members": 2, "gpus": 3})),
            0,
        )
        .expect("accepted");
    assert_eq!(view.state.as_str(), "running");
    let nodes: Vec<&str> = view.placement.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(nodes.len(), 2);
    assert_ne!(nodes[0], nodes[1]);
    // A 3-member gang of 3 GPUs can never fit in 2 nodes of 4: refused at once.
    let refused = s
        .submit(
            "alpha",
            spec(serde_json::json!({"name": "big", "members": 3, "gpus": 3})),
            1,
        )
        .expect_err("never fits");
    assert!(
        refused.to_string().contains("can never hold 3 members"),
        "{refused}"
    );
    // More GPUs than any node has: refused with the figures.
    let refused = s
        .submit(
            "alpha",
            spec(serde_json::json!({"name": "wide", "gpus": 8})),
            1,
        )
        .expect_err("never fits");
    assert!(
        refused
            .to_string()
            .contains("a member asks for 8 GPU(s) at 1000 milli each, a node has 4 whole GPU(s)"),
        "{refused}"
    );
    let free: u32 = s
        .nodes()
        .iter()
        .flat_map(|n| n.gpu_free_milli.clone())
        .sum();
    assert_eq!(free, 2000);
    // Its agent goes: the gang keeps its place while the agent may come back...
    s.agent_left("pool-b", 5);
    s.tick(6);
    assert_eq!(s.get("alpha", "gang").expect("exists").state, "running");
    // ...and waits again, whole, once it has been away for 30 s.
    let events = s.tick(35);
    assert!(
        events.contains(&SchedEvent::Requeued {
            job: "alpha/gang".into()
        }),
        "{events:?}"
    );
    let view = s.get("alpha", "gang").expect("exists");
    assert_eq!(view.state.as_str(), "pending");
    assert_eq!(view.requeues, 1);
    assert!(s.nodes().iter().all(|n| n.jobs.is_empty()));
    // The agent comes back to its own slot and the gang runs again.
    assert_eq!(join(&mut s, "pool-b", "gpu-4x-l4").as_deref(), Some("l4-1"));
    s.tick(36);
    assert_eq!(s.get("alpha", "gang").expect("exists").state, "running");
    assert!(s.accounting_holds());
}

#[test]
fn higher_priority_preempts_after_the_grace_period_and_delete_frees_at_once() {
    let mut s = scheduler(1);
    join(&mut s, "pool-a", "gpu-4x-l4");
    s.submit(
        "alpha",
        spec(serde_json::json!({"name": "low", "gpus": 4, "priority": "best-effort"})),
        0,
    )
    .expect("accepted");
    let (high, events) = s
        .submit(
            "alpha",
            spec(serde_json::json!({"name": "high", "gpus": 4, "priority": "production"})),
            1,
        )
        .expect("accepted");
    assert_eq!(high.state.as_str(), "pending");
    assert_eq!(
        events,
        vec![SchedEvent::Preempting {
            job: "alpha/low".into(),
            by: "alpha/high".into(),
            grace_seconds: 10
        }]
    );
    let low = s.get("alpha", "low").expect("exists");
    assert_eq!(low.state.as_str(), "terminating");
    assert_eq!(low.preempted_by.as_deref(), Some("alpha/high"));
    assert_eq!(low.grace_deadline_unix, Some(11));
    assert!(s.tick(5).is_empty());
    let events = s.tick(11);
    assert!(events.contains(&SchedEvent::Requeued {
        job: "alpha/low".into()
    }));
    assert_eq!(s.get("alpha", "high").expect("exists").state, "running");
    // Deleting the running job lets the preempted one back on at once.
    let (gone, events) = s.delete("alpha", "high", 12).expect("exists");
    assert_eq!(gone.state.as_str(), "running");
    assert_eq!(
        events,
        vec![SchedEvent::Placed {
            job: "alpha/low".into(),
            nodes: vec!["l4-0".into()]
        }]
    );
    assert!(matches!(
        s.get("alpha", "high"),
        Err(SchedError::NotFound(_))
    ));
    assert!(s.accounting_holds());
}

#[test]
fn quotas_and_bad_specs_are_explained() {
    let mut s = scheduler(1);
    join(&mut s, "pool-a", "gpu-4x-l4");
    // More than the tenant's whole quota could never start: refused, naming the field.
    match s.submit("beta", spec(serde_json::json!({"name": "j", "gpus": 3})), 0) {
        Err(SchedError::Invalid { field, message }) => {
            assert_eq!(field, "gpus");
            assert!(message.contains("quota exceeded"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Within the quota but over it with what the tenant runs already: it waits.
    s.submit(
        "beta",
        spec(serde_json::json!({"name": "first", "gpus": 2})),
        0,
    )
    .expect("accepted");
    let (view, _) = s
        .submit("beta", spec(serde_json::json!({"name": "j", "gpus": 1})), 0)
        .expect("accepted");
    let why = view.why_pending.expect("why");
    assert!(why.message.contains("gpu quota"), "{}", why.message);
    for (body, expect) in [
        (
            serde_json::json!({"name": "x", "gpus": 2, "gpu_milli": 500}),
            "fractional",
        ),
        (
            serde_json::json!({"name": "x", "gpu_milli": 500}),
            "needs gpus",
        ),
        (
            serde_json::json!({"name": "x", "gpus": 1, "gpu_models": ["TPU"]}),
            "NVIDIA L4",
        ),
        (serde_json::json!({"name": "x", "members": 0}), "members"),
        (
            serde_json::json!({"name": "x", "mig_profile": "big"}),
            "1g.10gb",
        ),
        (
            serde_json::json!({"name": "x", "priority": "urgent"}),
            "unknown",
        ),
        (serde_json::json!({"name": "Bad Name"}), "job"),
    ] {
        let result = s.submit("alpha", spec(body.clone()), 0);
        match result {
            Err(SchedError::BadRequest(message)) => {
                assert!(message.contains(expect), "{body}: {message}")
            }
            other => panic!("{body}: {other:?}"),
        }
    }
    assert!(matches!(
        s.submit("gamma", JobSpec::named("x"), 0),
        Err(SchedError::BadRequest(_))
    ));
    assert!(matches!(
        s.submit("beta", JobSpec::named("j"), 0),
        Err(SchedError::Conflict(_))
    ));
    // Unknown fields are refused by the JSON layer.
    assert!(serde_json::from_value::<JobSpec>(serde_json::json!({"name": "x", "gpu": 1})).is_err());
}

#[test]
fn mig_pools_serve_slices() {
    let mut region = region(1);
    region.pools[0].node_profile = "dgx-a100-80gb".into();
    region.pools[0].mig_profile = Some("1g.10gb".into());
    let mut s = RegionScheduler::new(&region, &[], &SchedulerConfig::default()).expect("valid");
    join(&mut s, "dgx", "dgx-a100-80gb");
    let (view, _) = s
        .submit(
            "default",
            spec(serde_json::json!({"name": "small", "mig_profile": "1g.10gb"})),
            0,
        )
        .expect("accepted");
    assert_eq!(view.state.as_str(), "running");
    assert_eq!(view.placement[0].mig_profile.as_deref(), Some("1g.10gb"));
    // Whole GPUs: every GPU of the pool is in MIG slices, so this can never run here.
    let refused = s
        .submit(
            "default",
            spec(serde_json::json!({"name": "whole", "gpus": 1})),
            0,
        )
        .expect_err("never fits");
    assert!(
        refused
            .to_string()
            .contains("pool l4 (dgx-a100-80gb): insufficient gpu"),
        "{refused}"
    );
    assert!(
        refused
            .to_string()
            .contains("in MIG slices: ask for a mig_profile"),
        "{refused}"
    );
    // A slice the pool does not carve is refused with what it does offer.
    let refused = s
        .submit(
            "default",
            spec(serde_json::json!({"name": "big-slice", "mig_profile": "3g.40gb"})),
            0,
        )
        .expect_err("never fits");
    assert!(
        refused.to_string().contains("1g.10gb on gpu 0"),
        "{refused}"
    );
    let mut bad = region.clone();
    bad.pools[0].mig_profile = Some("9g.99gb".into());
    assert!(RegionScheduler::new(&bad, &[], &SchedulerConfig::default())
        .err()
        .expect("refused")
        .contains("1g.10gb"));
}

/// Lowest at 03:00 UTC, highest at 15:00 (gCO₂eq/kWh), plus `level`.
fn cycle(hour: u64, level: f64) -> f64 {
    level + 200.0 - 100.0 * (((hour % 24) as f64 - 3.0) / 24.0 * std::f64::consts::TAU).cos()
}

/// 30 days of measurements ending with the hour of `now`.
fn feed(s: &mut RegionScheduler, now: u64, level: f64) {
    let end = now / HOUR_S;
    let points: Vec<GridPoint> = (end - 30 * 24 + 1..=end)
        .map(|hour| GridPoint {
            hour,
            carbon: Some(cycle(hour, level)),
            price: Some(40.0),
        })
        .collect();
    s.push_grid(&points, None, now).expect("valid push");
}

/// 2023-11-14 16:00 UTC: the next trough is 11 hours away.
const NOW: u64 = 1_699_977_600 + 60;

#[test]
fn a_deferrable_job_waits_for_the_greener_hour_and_never_past_its_latest_start() {
    let mut s = scheduler(1);
    join(&mut s, "pool-a", "gpu-4x-l4");
    feed(&mut s, NOW, 0.0);
    let trough = (NOW / HOUR_S..NOW / HOUR_S + 24)
        .find(|h| h % 24 == 3)
        .expect("a 03:00");
    let body = |name: &str, deadline: u64| {
        spec(serde_json::json!({
            "name": name, "gpus": 1, "expected_runtime_s": 3600, "deadline_unix": deadline
        }))
    };
    let (view, events) = s
        .submit("alpha", body("night", NOW + 20 * HOUR_S), NOW)
        .expect("accepted");
    assert_eq!(view.state.as_str(), "deferred");
    assert!(s.indexes_agree(), "a deferred job is among the held ones");
    let plan = view.deferral.expect("a plan");
    assert_eq!(plan.state.as_str(), "waiting");
    assert_eq!(plan.latest_start_unix, NOW + 19 * HOUR_S);
    assert_eq!(plan.best_start_unix, Some(trough * HOUR_S));
    assert!(plan.best_carbon.expect("best") < plan.carbon_now.expect("now"));
    assert!(plan.reason.contains("lower-carbon hour"), "{}", plan.reason);
    assert!(matches!(&events[..], [SchedEvent::Deferred { job, .. }] if job == "alpha/night"));
    assert!(view.placement.is_empty() && s.nodes()[0].jobs.is_empty());
    // A job without a deadline is not held.
    let (now_job, _) = s
        .submit(
            "alpha",
            spec(serde_json::json!({"name": "now", "gpus": 1})),
            NOW,
        )
        .expect("accepted");
    assert_eq!(now_job.state.as_str(), "running");
    // Its latest start falls within this hour: it goes at once, whatever the forecast.
    let (tight, _) = s
        .submit("alpha", body("tight", NOW + 3600 + 1200), NOW)
        .expect("accepted");
    assert_eq!(tight.state.as_str(), "running");
    let plan = tight.deferral.expect("a plan");
    assert_eq!(plan.state.as_str(), "released");
    assert!(plan.reason.contains("latest start"), "{}", plan.reason);
    // Hour by hour, with the feed's measurement of each hour, it waits for 03:00.
    let mut hour = NOW / HOUR_S;
    while hour < trough {
        hour += 1;
        let now = hour * HOUR_S + 30;
        s.push_grid(
            &[GridPoint {
                hour,
                carbon: Some(cycle(hour, 0.0)),
                price: None,
            }],
            None,
            now,
        )
        .expect("valid push");
        let state = s.get("alpha", "night").expect("exists").state;
        if hour < trough {
            assert_eq!(state, "deferred", "hour {}", hour % 24);
        }
    }
    let night = s.get("alpha", "night").expect("exists");
    assert_eq!(night.state.as_str(), "running");
    let plan = night.deferral.expect("a plan");
    assert_eq!(plan.state.as_str(), "released");
    assert_eq!(plan.released_unix, Some(trough * HOUR_S + 30));
    assert!(plan.carbon_now.expect("now") < plan.carbon_at_submit.expect("then"));
    assert!(s.accounting_holds());
}

#[test]
fn deadlines_are_checked_and_no_signal_means_no_wait() {
    let mut s = scheduler(1);
    join(&mut s, "pool-a", "gpu-4x-l4");
    for (body, expect) in [
        (
            serde_json::json!({"name": "x", "deadline_unix": NOW + 7200}),
            "needs expected_runtime_s",
        ),
        (
            serde_json::json!({"name": "x", "deadline_unix": NOW + 600, "expected_runtime_s": 3600}),
            "leaves less than",
        ),
        (
            serde_json::json!({"name": "x", "deadline_unix": NOW + 40 * 86_400, "expected_runtime_s": 60}),
            "days away",
        ),
    ] {
        match s.submit("alpha", spec(body.clone()), NOW) {
            Err(SchedError::BadRequest(message)) => {
                assert!(message.contains(expect), "{body}: {message}")
            }
            other => panic!("{body}: {other:?}"),
        }
    }
    let (view, _) = s
        .submit(
            "alpha",
            spec(serde_json::json!({
                "name": "later", "expected_runtime_s": 60, "deadline_unix": NOW + 86_400
            })),
            NOW,
        )
        .expect("accepted");
    assert_eq!(view.state.as_str(), "running");
    let plan = view.deferral.expect("a plan");
    assert!(
        plan.reason.contains("no carbon measurements"),
        "{}",
        plan.reason
    );
    let grid = s.grid_view(NOW);
    assert_eq!(grid.signal, "none");
    assert!(grid.note.expect("note").contains("nephele grid push"));
    // A measurement from the future is refused and changes nothing.
    let future = GridPoint {
        hour: NOW / HOUR_S + 1,
        carbon: Some(10.0),
        price: None,
    };
    assert!(matches!(
        s.push_grid(&[future], None, NOW),
        Err(SchedError::BadRequest(m)) if m.contains("has not begun")
    ));
    assert_eq!(s.grid_view(NOW).measured_hours, 0);
    // A deferred job can be deleted while it waits.
    feed(&mut s, NOW, 0.0);
    let (held, _) = s
        .submit(
            "alpha",
            spec(serde_json::json!({
                "name": "held", "expected_runtime_s": 3600, "deadline_unix": NOW + 20 * HOUR_S
            })),
            NOW,
        )
        .expect("accepted");
    assert_eq!(held.state.as_str(), "deferred");
    assert_eq!(s.grid_view(NOW).deferred_jobs, 1);
    let (gone, _) = s.delete("alpha", "held", NOW).expect("exists");
    assert_eq!(gone.state.as_str(), "deferred");
    assert!(s.get("alpha", "held").is_err());
    assert_eq!(s.grid_view(NOW).deferred_jobs, 0);
}

fn named_region(name: &str, agents: usize) -> RegionScheduler {
    let mut config = region(1);
    config.name = name.into();
    let mut s =
        RegionScheduler::new(&config, &tenants(), &SchedulerConfig::default()).expect("valid");
    for a in 0..agents {
        join(&mut s, &format!("{name}-{a}"), "gpu-4x-l4");
    }
    s
}

#[test]
fn auto_region_takes_the_greener_region_with_room() {
    let job = spec(serde_json::json!({"name": "t", "gpus": 2, "expected_runtime_s": 3600}));
    let mut green = named_region("green", 1);
    let mut brown = named_region("brown", 1);
    feed(&mut green, NOW, 0.0);
    feed(&mut brown, NOW, 300.0);
    let weights = RegionWeightsConfig::default();
    let offers = [brown.offer(&job, NOW), green.offer(&job, NOW)];
    assert_eq!(offers[0].unit, "gpu");
    assert_eq!((offers[0].demand, offers[0].free), (2.0, 4.0));
    let choice = choose_region_for(&offers, weights).expect("a region");
    assert_eq!(choice.chosen, "green");
    assert!(choice.reason.contains("g/kWh"), "{}", choice.reason);
    assert!(choice.candidates.iter().all(|c| c.score.is_some()));
    // A deadline lets the comparison use each region's greenest window.
    let deferrable = spec(serde_json::json!({
        "name": "t", "gpus": 2, "expected_runtime_s": 3600, "deadline_unix": NOW + 20 * HOUR_S
    }));
    let offer = green.offer(&deferrable, NOW);
    let now_only = green.offer(&job, NOW);
    assert!(offer.window.as_ref().expect("w").1 < now_only.window.as_ref().expect("w").1);
    // No room in the green region now: the brown one, which has it.
    let mut full_green = named_region("green", 0);
    feed(&mut full_green, NOW, 0.0);
    let offers = [brown.offer(&job, NOW), full_green.offer(&job, NOW)];
    let choice = choose_region_for(&offers, weights).expect("a region");
    assert_eq!(choice.chosen, "brown");
    let excluded = &choice.candidates[1];
    assert_eq!(
        excluded.excluded.as_deref(),
        Some("not enough free capacity now")
    );
    // A region without a signal is not compared on carbon.
    let mut dark = named_region("dark", 1);
    let offers = [dark.offer(&job, NOW), brown.offer(&job, NOW)];
    let choice = choose_region_for(&offers, weights).expect("a region");
    assert_eq!(choice.chosen, "brown");
    assert!(choice.candidates[0]
        .excluded
        .as_deref()
        .expect("excluded")
        .contains("no grid signal"));
    // Without any signal it goes by free capacity alone.
    let mut empty = named_region("empty", 0);
    let offers = [empty.offer(&job, NOW), dark.offer(&job, NOW)];
    let choice = choose_region_for(&offers, weights).expect("a region");
    assert_eq!(choice.chosen, "dark");
    // A region whose pools cannot hold it is never chosen; none at all is a 400.
    let huge = spec(serde_json::json!({"name": "t", "gpus": 8}));
    let offers = [green.offer(&huge, NOW)];
    assert!(offers[0].unfit.is_some());
    assert!(matches!(
        choose_region_for(&offers, weights),
        Err(SchedError::BadRequest(m)) if m.contains("no region can take")
    ));
    // And the chosen region records how.
    let (view, _) = green
        .submit_chosen("alpha", job.clone(), Some(choice_for_test()), NOW)
        .expect("accepted");
    assert_eq!(view.region_choice.expect("recorded").chosen, "green");
}

fn choice_for_test() -> RegionChoiceView {
    RegionChoiceView {
        chosen: "green".into(),
        reason: "test".into(),
        unit: "gpu".into(),
        demand: 2.0,
        weights: RegionWeightsConfig::default(),
        candidates: Vec::new(),
    }
}

#[derive(Debug, Clone)]
enum Op {
    Join(usize),
    Leave(usize),
    Submit {
        tenant: usize,
        class: usize,
        members: u16,
        gpus: u8,
        milli: u32,
    },
    Delete(usize),
    Tick(u64),
    /// A measurement for the current hour.
    Grid(u16),
    /// A job that may wait up to this many hours.
    Deferrable(u8),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        2 => (0usize..4).prop_map(Op::Join),
        1 => (0usize..4).prop_map(Op::Leave),
        4 => (0usize..2, 0usize..3, 1u16..=3, 0u8..=4, 1u32..=1000).prop_map(
            |(tenant, class, members, gpus, milli)| Op::Submit { tenant, class, members, gpus, milli }
        ),
        1 => (0usize..30).prop_map(Op::Delete),
        2 => (1u64..20).prop_map(Op::Tick),
        1 => (1u64..7200).prop_map(Op::Tick),
        1 => (0u16..800).prop_map(Op::Grid),
        1 => (0u8..10).prop_map(Op::Deferrable),
    ]
}

proptest::proptest! {
    /// Whatever agents, jobs and deletions arrive: the books balance, every placed
    /// member sits on an up node served by an agent, a gang is placed whole or not
    /// at all, the node view and the job view agree, and tenants see only their own.
    #[test]
    fn the_scheduler_shell_keeps_its_books(ops in proptest::collection::vec(op(), 1..60)) {
        let mut s = scheduler(3);
        let mut now = 0u64;
        let mut submitted = 0usize;
        for op in ops {
            match op {
                Op::Join(a) => { join(&mut s, &format!("agent-{a}"), "gpu-4x-l4"); }
                Op::Leave(a) => { s.agent_left(&format!("agent-{a}"), now); }
                Op::Submit { tenant, class, members, gpus, milli } => {
                    let milli = if gpus == 1 { milli } else { 1000 };
                    let priority = ["best-effort", "batch", "production"][class];
                    let body = serde_json::json!({
                        "name": format!("j{submitted}"),
                        "members": members,
                        "gpus": gpus,
                        "gpu_milli": if gpus > 0 { Some(milli) } else { None },
                        "priority": priority,
                        "expected_runtime_s": 30,
                    });
                    let tenant = ["alpha", "beta"][tenant];
                    match s.submit(tenant, spec(body), now) {
                        Ok(_) => {}
                        // More than beta's whole quota: refused at submission.
                        Err(SchedError::Invalid { field, .. }) if tenant == "beta" => {
                            assert_eq!(field, "gpus");
                        }
                        Err(error) => panic!("a valid job was refused: {error}"),
                    }
                    submitted += 1;
                }
                Op::Delete(j) => {
                    for tenant in ["alpha", "beta"] {
                        let _ = s.delete(tenant, &format!("j{j}"), now);
                    }
                }
                Op::Tick(dt) => { now += dt; s.tick(now); }
                Op::Grid(value) => {
                    let point = GridPoint { hour: now / HOUR_S, carbon: Some(f64::from(value)), price: None };
                    s.push_grid(&[point], None, now).expect("valid measurement");
                }
                Op::Deferrable(hours) => {
                    let body = serde_json::json!({
                        "name": format!("j{submitted}"),
                        "gpus": 1,
                        "expected_runtime_s": 1800,
                        "deadline_unix": now + 1800 + u64::from(hours) * HOUR_S,
                    });
                    s.submit("alpha", spec(body), now).expect("valid job");
                    submitted += 1;
                }
            }
            proptest::prop_assert!(s.accounting_holds());
            let nodes = s.nodes();
            let jobs = s.list(None);
            for job in &jobs {
                match job.state.as_str() {
                    "pending" => proptest::prop_assert!(job.placement.is_empty() && job.why_pending.is_some()),
                    // Held out of the queue, and never past its latest start.
                    "deferred" => {
                        proptest::prop_assert!(job.placement.is_empty());
                        let plan = job.deferral.as_ref().expect("a plan");
                        proptest::prop_assert!(plan.latest_start_unix > now, "held past its latest start");
                    }
                    _ => {
                        proptest::prop_assert_eq!(job.placement.len(), usize::from(job.spec.members));
                        for member in &job.placement {
                            let node = nodes.iter().find(|n| n.name == member.node).expect("node");
                            // On a node that has (or had, within `lost_after_s`) an agent.
                            proptest::prop_assert!(node.phase == "up" || node.phase == "draining", "{}", node.phase);
                            proptest::prop_assert_eq!(&member.agent, &node.agent);
                            let qualified = format!("{}/{}", job.tenant, job.name);
                            proptest::prop_assert!(node.jobs.contains(&qualified));
                        }
                    }
                }
            }
            let holding: usize = nodes.iter().map(|n| n.jobs.len()).sum();
            let members_on_distinct_nodes: usize = jobs.iter().map(|j| {
                j.placement.iter().map(|p| p.node.as_str()).collect::<std::collections::BTreeSet<_>>().len()
            }).sum();
            proptest::prop_assert_eq!(holding, members_on_distinct_nodes);
            let alpha = s.list(Some("alpha"));
            proptest::prop_assert!(alpha.iter().all(|j| j.tenant == "alpha"));
            proptest::prop_assert_eq!(alpha.len() + s.list(Some("beta")).len(), jobs.len());
            // One state's jobs, and pages of them in key order, as the API pages them.
            let key = |j: &nephele_api::JobView| format!("{}/{}/{}", j.region, j.tenant, j.name);
            for state in [None, Some("pending"), Some("running"), Some("deferred")] {
                let mut want: Vec<nephele_api::JobView> = jobs
                    .iter()
                    .filter(|j| state.is_none_or(|wanted| j.state == wanted))
                    .cloned()
                    .collect();
                let (all, total) = s.list_page(None, state, None);
                proptest::prop_assert_eq!(&all, &want);
                proptest::prop_assert_eq!(total, want.len());
                want.sort_by_key(key);
                let (mut after, mut walked) = (None::<String>, Vec::new());
                loop {
                    let (page, total) = s.list_page(None, state, Some((after.as_deref(), 3)));
                    proptest::prop_assert_eq!(total, want.len());
                    proptest::prop_assert!(page.len() <= 3);
                    let Some(last) = page.last() else { break };
                    after = Some(key(last));
                    walked.extend(page);
                }
                proptest::prop_assert_eq!(walked, want);
            }
        }
    }
}

#[test]
fn a_provider_forecast_is_pushed_whole_shown_as_such_and_kept_in_the_books() {
    use nephele_placement::grid::ForecastPoint;
    let mut s = scheduler(1);
    feed(&mut s, NOW, 0.0);
    let hours = s.grid_view(NOW).measured_hours;
    let forecast = |issued: u64, windy: u64, value: f64| super::ForecastPush {
        issued,
        source: "electricitymaps".into(),
        points: (0..24)
            .map(|i| ForecastPoint {
                hour: NOW / HOUR_S + i,
                carbon: if i == windy { value } else { 400.0 },
            })
            .collect(),
    };
    // A bad forecast with good measurements: neither is kept.
    let measurement = GridPoint {
        hour: NOW / HOUR_S,
        carbon: Some(1.0),
        price: None,
    };
    let refused = s
        .push_grid(&[measurement], Some(&forecast(NOW, 2, -3.0)), NOW)
        .expect_err("refused");
    assert!(refused.to_string().contains("outside"), "{refused}");
    assert_eq!(s.grid_view(NOW).measured_hours, hours);
    assert!(s.grid_view(NOW).forecast.is_none());
    assert!(s.push_grid(&[], None, NOW).is_err());
    // A good one: the outlook says which hours are the provider's.
    let (pushed, _) = s
        .push_grid(&[], Some(&forecast(NOW - 600, 2, 12.0)), NOW)
        .expect("stored");
    assert_eq!(pushed.forecast_hours, Some(24));
    let view = s.grid_view(NOW);
    let held = view.forecast.clone().expect("held");
    assert_eq!(
        (held.source.as_str(), held.hours, held.fresh),
        ("electricitymaps", 24, true)
    );
    assert_eq!(view.outlook[0].source, "measured");
    assert_eq!(view.outlook[2].source, "provider");
    assert_eq!(view.outlook[2].carbon_g_per_kwh, 12.0);
    assert_eq!(view.outlook[30].source, "model");
    // An older one is refused, naming the one held.
    let older = s
        .push_grid(&[], Some(&forecast(NOW - 7200, 3, 5.0)), NOW)
        .expect_err("older");
    assert!(
        older
            .to_string()
            .contains("before the one this region holds"),
        "{older}"
    );
    // The books keep it, and a restart restores it.
    let record = s.region_record();
    let record: super::RegionRecord =
        serde_json::from_str(&serde_json::to_string(&record).expect("json")).expect("back");
    assert!(record.grid_forecast.is_some());
    let mut fresh = scheduler(1);
    let problems = fresh.restore(Vec::new(), Vec::new(), Some(record), NOW);
    assert!(problems.is_empty(), "{problems:?}");
    let restored = fresh.grid_view(NOW);
    assert_eq!(restored.forecast, view.forecast);
    assert_eq!(restored.outlook[2].carbon_g_per_kwh, 12.0);
}

#[test]
fn tenants_made_and_changed_at_run_time_take_effect_at_once() {
    let mut s = scheduler(1);
    join(&mut s, "pool-a", "gpu-4x-l4");
    // A tenant the region has not heard of is refused, then made.
    assert!(s
        .submit(
            "gamma",
            spec(serde_json::json!({"name": "a", "gpus": 1})),
            0
        )
        .is_err());
    let mut gamma = TenantConfig::named("gamma");
    gamma.quota_gpu_milli = Some(1000);
    gamma.quota_jobs = Some(2);
    s.set_tenant(&gamma);
    assert_eq!(s.tenant_names(), vec!["alpha", "beta", "gamma"]);
    let (view, _) = s
        .submit(
            "gamma",
            spec(serde_json::json!({"name": "a", "gpus": 1})),
            0,
        )
        .expect("accepted");
    assert_eq!(view.state.as_str(), "running");
    // Within its job quota, but over its GPU quota beside the first: waits.
    let (view, _) = s
        .submit(
            "gamma",
            spec(serde_json::json!({"name": "b", "gpus": 1})),
            1,
        )
        .expect("accepted");
    assert_eq!(view.state.as_str(), "pending");
    // A third job is over its job quota: refused, saying so.
    let refused = s
        .submit(
            "gamma",
            spec(serde_json::json!({"name": "c", "gpus": 1})),
            2,
        )
        .expect_err("over quota_jobs");
    assert!(refused.to_string().contains("quota_jobs is 2"), "{refused}");
    // A raised quota lets the waiting job start at the next tick.
    gamma.quota_gpu_milli = Some(2000);
    s.set_tenant(&gamma);
    s.tick(3);
    assert_eq!(s.get("gamma", "b").expect("exists").state, "running");
    assert_eq!(s.active_jobs("gamma"), 2);
    // Deleted: its jobs run on and are still found; new ones are refused.
    s.remove_tenant("gamma");
    assert_eq!(s.tenant_names(), vec!["alpha", "beta"]);
    assert_eq!(s.get("gamma", "a").expect("still there").state, "running");
    assert!(s
        .submit(
            "gamma",
            spec(serde_json::json!({"name": "d", "gpus": 1})),
            4
        )
        .is_err());
    assert!(s.accounting_holds());
}

/// The region plans for the pods it is asked to place: once it has seen enough of its
/// own, the typical pods its fragmentation-aware policy scores against are made of
/// them, and a GPU model that typed jobs ask for is weighed against the pools' supply.
#[test]
fn the_target_workload_is_learned_from_the_jobs_submitted() {
    let mut s = scheduler(2);
    let l4 = s
        .gpu_models
        .iter()
        .position(|m| m == "NVIDIA L4")
        .expect("the L4 pool's model") as nephele_placement::GpuModel;
    assert_eq!(s.queue.typical().pressure_of(Some(l4)), 0.0);
    for k in 0..nephele_placement::queue::LEARN_MIN_PODS {
        let body =
            serde_json::json!({"name": format!("t{k}"), "gpus": 1, "gpu_models": ["NVIDIA L4"]});
        s.submit("alpha", spec(body), 0).expect("accepted");
        if k + 1 < nephele_placement::queue::LEARN_MIN_PODS {
            s.tick(1);
            assert_eq!(s.queue.typical().pressure_of(Some(l4)), 0.0, "after {k}");
        }
    }
    s.tick(2);
    assert!(s.queue.typical().pressure_of(Some(l4)) > 0.0);
}

#[test]
fn a_job_refused_by_a_spot_pool_is_told_the_flag_that_allows_it() {
    let mut spot = region(2);
    spot.pools[0].capacity_type = "spot".into();
    let mut s =
        RegionScheduler::new(&spot, &tenants(), &SchedulerConfig::default()).expect("valid");
    let refused = s
        .submit("alpha", spec(serde_json::json!({"name": "hello"})), 1)
        .expect_err("spot only");
    let said = refused.to_string();
    assert!(
        said.contains("spot not allowed") && said.contains("--spot-ok"),
        "{said}"
    );
    let (view, _) = s
        .submit(
            "alpha",
            spec(serde_json::json!({"name": "hello", "spot_ok": true})),
            1,
        )
        .expect("accepted with spot_ok");
    assert_eq!(view.name, "hello");
}
