use super::*;
use proptest::prelude::*;

fn spec(model: &str, slo_ms: u32) -> RuntimeSpec {
    RuntimeSpec {
        model: model.into(),
        variant: "auto".into(),
        slo_ms,
        offload: false,
        max_queue: 64,
        hard_example_threshold: None,
    }
}

fn settings() -> RolloutSettings {
    RolloutSettings {
        steps: vec![10, 50, 100],
        min_requests: 100,
        min_step_s: 10,
        progress_deadline_s: 60,
        ..RolloutSettings::default()
    }
}

fn devices(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("dev-{i:02}")).collect()
}

fn rollout() -> Rollout {
    let baseline = Figures {
        devices: 10,
        requests: 10_000,
        failed: 0,
        offloaded: 0,
        p99_ms: 1.0,
    };
    Rollout::new(
        1,
        spec("m:old", 50),
        spec("m:new", 50),
        settings(),
        baseline,
        0,
    )
}

/// Every device online; moved ones on the new version with `new_p99` ms and
/// `requests` served, the others on the old with 1 ms.
fn figures(
    rollout: &Rollout,
    selected: &[String],
    new_p99: f64,
    requests: u64,
) -> BTreeMap<String, DeviceFigures> {
    selected
        .iter()
        .map(|d| {
            let new = rollout.moved.contains(d);
            (
                d.clone(),
                DeviceFigures {
                    online: true,
                    on_new: new,
                    on_old: !new,
                    failure: None,
                    load_failed: false,
                    requests,
                    failed: 0,
                    offloaded: 0,
                    p99_ms: if new { new_p99 } else { 1.0 },
                },
            )
        })
        .collect()
}

#[test]
fn defaults_are_valid_and_bad_settings_are_named() {
    assert_eq!(RolloutSettings::default().validate(), Ok(()));
    let bad = |f: fn(&mut RolloutSettings)| {
        let mut s = RolloutSettings::default();
        f(&mut s);
        s.validate().expect_err("refused")
    };
    assert!(bad(|s| s.steps = vec![]).contains("steps"));
    assert!(bad(|s| s.steps = vec![50, 10, 100]).contains("increase"));
    assert!(bad(|s| s.steps = vec![10, 50]).contains("end in 100"));
    assert!(bad(|s| s.steps = vec![0, 100]).contains("increase"));
    assert!(bad(|s| s.max_p99_ratio = 0.5).contains("max_p99_ratio"));
    assert!(bad(|s| s.max_error_rate_increase = f64::NAN).contains("max_error_rate_increase"));
    assert!(bad(|s| s.progress_deadline_s = 0).contains("progress_deadline_s"));
}

#[test]
fn a_slow_canary_fails_its_gate_and_only_the_canary_goes_back() {
    let selected = devices(10);
    let mut r = rollout();
    // The first tick moves the canary: 10% of 10 devices.
    let change = r.tick(0, &selected, &figures(&r, &selected, 1.0, 0));
    assert_eq!(change, Some(Change::Moved(vec!["dev-00".into()])));
    assert!(r.runs_new("dev-00") && !r.runs_new("dev-01"));
    // Ready, but too few requests and too early: it waits.
    let change = r.tick(5_000, &selected, &figures(&r, &selected, 30.0, 10));
    assert_eq!(change, Some(Change::Noted));
    assert!(r.gate.contains("judging after 100"), "{}", r.gate);
    // Enough: p99 30 ms against 1 ms fails.
    let change = r.tick(20_000, &selected, &figures(&r, &selected, 30.0, 500));
    assert_eq!(change, Some(Change::RolledBack(vec!["dev-00".into()])));
    assert_eq!(r.state, RolloutState::RolledBack);
    assert!(r.gate.contains("p99 30.0 ms"), "{}", r.gate);
    assert!(!r.runs_new("dev-00"));
    // Nothing moves afterwards.
    assert_eq!(
        r.tick(30_000, &selected, &figures(&r, &selected, 1.0, 500)),
        None
    );
}

#[test]
fn a_good_version_reaches_every_device_step_by_step() {
    let selected = devices(10);
    let mut r = rollout();
    let mut now = 0;
    let mut moved_per_step = Vec::new();
    for _ in 0..20 {
        let f = figures(&r, &selected, 1.2, 500);
        match r.tick(now, &selected, &f) {
            Some(Change::Moved(devices)) => moved_per_step.push(devices.len()),
            Some(Change::Completed) => break,
            Some(Change::RolledBack(_)) => panic!("rolled back: {}", r.gate),
            _ => {}
        }
        now += 11_000;
    }
    assert_eq!(r.state, RolloutState::Complete, "{}", r.gate);
    assert_eq!(moved_per_step, vec![1, 4, 5]);
    assert_eq!(r.moved.len(), 10);
    assert!(r
        .events
        .iter()
        .any(|e| e.message.contains("step 3 of 3 passed")));
}

#[test]
fn devices_that_never_run_the_new_version_roll_it_back_at_the_deadline() {
    let selected = devices(4);
    let mut r = rollout();
    r.tick(0, &selected, &figures(&r, &selected, 1.0, 0));
    let mut f = figures(&r, &selected, 1.0, 0);
    let canary = f.get_mut("dev-00").expect("canary");
    // Still on the old version (a slow download): waited for, up to the deadline.
    canary.on_new = false;
    canary.failure = Some("still runs the old version".into());
    assert_eq!(r.tick(30_000, &selected, &f), Some(Change::Noted));
    let change = r.tick(61_000, &selected, &f);
    assert_eq!(change, Some(Change::RolledBack(vec!["dev-00".into()])));
    assert!(
        r.gate.contains("dev-00 (still runs the old version)"),
        "{}",
        r.gate
    );
}

#[test]
fn a_version_a_device_cannot_load_is_rolled_back_at_once() {
    let selected = devices(4);
    let mut r = rollout();
    r.tick(0, &selected, &figures(&r, &selected, 1.0, 0));
    let mut f = figures(&r, &selected, 1.0, 0);
    let canary = f.get_mut("dev-00").expect("canary");
    canary.on_new = false;
    canary.load_failed = true;
    canary.failure = Some("model failed to load: unsupported operator".into());
    let change = r.tick(2_000, &selected, &f);
    assert_eq!(change, Some(Change::RolledBack(vec!["dev-00".into()])));
    assert!(
        r.gate.contains(
            "could not load the new version: dev-00 (model failed to load: unsupported operator)"
        ),
        "{}",
        r.gate
    );
}

#[test]
fn the_gate_compares_errors_and_offload_share_too() {
    let selected = devices(2);
    let mut r = rollout();
    r.tick(0, &selected, &figures(&r, &selected, 1.0, 0));
    let mut f = figures(&r, &selected, 1.0, 1000);
    f.get_mut("dev-00").expect("canary").failed = 50;
    assert!(matches!(
        r.tick(20_000, &selected, &f),
        Some(Change::RolledBack(_))
    ));
    assert!(r.gate.contains("error rate 5.00%"), "{}", r.gate);

    let mut r = rollout();
    r.tick(0, &selected, &figures(&r, &selected, 1.0, 0));
    let mut f = figures(&r, &selected, 1.0, 1000);
    f.get_mut("dev-00").expect("canary").offloaded = 600;
    assert!(matches!(
        r.tick(20_000, &selected, &f),
        Some(Change::RolledBack(_))
    ));
    assert!(r.gate.contains("offloaded"), "{}", r.gate);
}

#[test]
fn the_last_step_is_judged_against_the_baseline() {
    let selected = devices(1);
    let mut r = rollout();
    assert_eq!(
        r.tick(0, &selected, &figures(&r, &selected, 1.0, 0)),
        Some(Change::Moved(vec!["dev-00".into()]))
    );
    // Nobody is left on the old version: the baseline (1 ms) is the reference.
    let change = r.tick(20_000, &selected, &figures(&r, &selected, 9.0, 500));
    assert!(matches!(change, Some(Change::RolledBack(_))));
    assert!(r.gate.contains("when the rollout began"), "{}", r.gate);
}

#[test]
fn pause_holds_and_resume_restarts_the_step_clock() {
    let selected = devices(10);
    let mut r = rollout();
    r.tick(0, &selected, &figures(&r, &selected, 1.0, 0));
    r.pause(1_000, "alice").expect("pause");
    assert_eq!(
        r.tick(50_000, &selected, &figures(&r, &selected, 1.0, 500)),
        None
    );
    r.resume(60_000, "alice").expect("resume");
    // The step clock restarted: 5 s after resuming is too early to judge.
    assert_eq!(
        r.tick(65_000, &selected, &figures(&r, &selected, 1.0, 500)),
        Some(Change::Noted)
    );
    let devices = r.roll_back(70_000, "by alice".into()).expect("roll back");
    assert_eq!(devices, vec!["dev-00".to_string()]);
    assert!(r.roll_back(71_000, "again".into()).is_err());
    assert!(r.pause(72_000, "alice").is_err());
}

#[test]
fn no_selected_device_completes_at_once() {
    let mut r = rollout();
    assert_eq!(r.tick(0, &[], &BTreeMap::new()), Some(Change::Completed));
    assert_eq!(r.state, RolloutState::Complete);
}

#[test]
fn offline_devices_are_moved_last() {
    let selected = devices(3);
    let mut r = rollout();
    let mut f = figures(&r, &selected, 1.0, 0);
    f.get_mut("dev-00").expect("device").online = false;
    assert_eq!(
        r.tick(0, &selected, &f),
        Some(Change::Moved(vec!["dev-01".into()]))
    );
}

proptest! {
    /// Whatever the devices show, a rollout never moves more devices than its step
    /// wants, never moves an unselected device, moves only forward, and a rollback
    /// returns exactly the devices it moved.
    #[test]
    fn steps_move_only_what_they_want(
        n in 1usize..30,
        ticks in proptest::collection::vec((0u64..40_000, any::<bool>(), 0.5f64..20.0, 0u64..300, 0u64..10), 1..40),
    ) {
        let selected = devices(n);
        let mut r = rollout();
        let mut now = 0;
        let mut moved_before = BTreeSet::new();
        for (dt, ready, p99, requests, failed) in ticks {
            now += dt;
            let mut f = figures(&r, &selected, p99, requests);
            for (name, device) in f.iter_mut() {
                if r.moved.contains(name) {
                    device.on_new = ready;
                    device.failed = failed.min(requests);
                }
            }
            let state_before = r.state;
            let change = r.tick(now, &selected, &f);
            prop_assert!(r.moved.iter().all(|d| selected.contains(d)));
            prop_assert!(moved_before.is_subset(&r.moved));
            if r.state.active() {
                prop_assert!(r.moved.len() <= r.wanted(n));
            }
            match change {
                Some(Change::RolledBack(devices)) => {
                    prop_assert_eq!(devices, r.moved.iter().cloned().collect::<Vec<_>>());
                    prop_assert!(!r.runs_new(&r.moved.iter().next().cloned().unwrap_or_default()));
                }
                Some(Change::Completed) => prop_assert_eq!(r.moved.len(), n),
                None if !state_before.active() => prop_assert_eq!(r.state, state_before),
                _ => {}
            }
            moved_before = r.moved.clone();
            prop_assert!(r.events.len() <= MAX_EVENTS);
        }
    }
}

#[test]
fn accuracy_is_judged_only_on_the_same_labelled_rows() {
    let measured = |pct: f64, rows: &str| MeasuredAccuracy {
        accuracy_pct: pct,
        rows_sha256: rows.into(),
        rows: "360 labelled rows".into(),
    };
    let old = measured(97.5, "aa");
    assert!(matches!(
        accuracy_verdict(Some(&old), Some(&measured(97.2, "aa")), 0.5),
        AccuracyVerdict::Passed(_)
    ));
    let AccuracyVerdict::Failed(why) =
        accuracy_verdict(Some(&old), Some(&measured(91.0, "aa")), 0.5)
    else {
        panic!("a drop of 6.5 points passed")
    };
    assert_eq!(
        why,
        "accuracy 91.00% on the new version against 97.50% on the old, on the same 360 labelled rows (limit −0.5 points)"
    );
    assert!(matches!(
        accuracy_verdict(Some(&old), Some(&measured(91.0, "bb")), 0.5),
        AccuracyVerdict::NotJudged(m) if m.contains("different validation rows")
    ));
    assert!(matches!(
        accuracy_verdict(None, Some(&old), 0.5),
        AccuracyVerdict::NotJudged(_)
    ));
    // A failed gate rolls back before any device moves; the others are history only.
    let selected = devices(4);
    let mut r = rollout();
    let change = r.judge_accuracy(
        0,
        accuracy_verdict(Some(&old), Some(&measured(91.0, "aa")), 0.5),
    );
    assert_eq!(change, Some(Change::RolledBack(vec![])));
    assert_eq!(
        r.tick(1_000, &selected, &figures(&r, &selected, 1.0, 0)),
        None
    );
    assert!(
        r.gate
            .starts_with("accuracy gate failed before the first step"),
        "{}",
        r.gate
    );
    let mut good = rollout();
    assert_eq!(
        good.judge_accuracy(0, accuracy_verdict(Some(&old), Some(&old), 0.5)),
        None
    );
    assert!(good
        .events
        .iter()
        .any(|e| e.message.starts_with("accuracy gate passed")));
}
