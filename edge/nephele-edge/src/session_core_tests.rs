//! The session core on a virtual clock: `t0 + offset` stands for "now", nothing sleeps.

use super::*;
use nephele_proto::{ErrorFrame, Welcome};
use proptest::prelude::*;

fn config(servers: &str) -> SessionConfig {
    SessionConfig::for_servers(servers)
}

fn welcome(interval_ms: u32) -> Input {
    Input::Frame(CloudMessage::Welcome(Welcome {
        agent_id: "a".into(),
        region: "eu".into(),
        heartbeat_interval_ms: interval_ms,
    }))
}

fn refused(code: ErrorCode, message: &str) -> Input {
    Input::Frame(CloudMessage::Refused(ErrorFrame::new(code, message)))
}

fn desired(generation: u64) -> DesiredState {
    DesiredState {
        generation,
        assignments: Vec::new(),
        jobs: Vec::new(),
    }
}

/// A core and its virtual clock.
struct Clock {
    core: SessionCore,
    t0: Instant,
    now: Instant,
}

impl Clock {
    fn new(servers: &str, removed: Option<&str>) -> Clock {
        let t0 = Instant::now();
        Clock {
            core: SessionCore::new(config(servers), t0, 7, removed.map(str::to_string)),
            t0,
            now: t0,
        }
    }

    fn at(&self) -> Duration {
        self.now - self.t0
    }

    fn feed(&mut self, input: Input) -> Vec<Effect> {
        self.core.handle(self.now, input)
    }

    /// Moves the clock to the core's deadline and ticks.
    fn wait(&mut self) -> Vec<Effect> {
        let deadline = self.core.deadline().expect("the core is waiting for time");
        // A clock moved past the deadline ticks late, as a busy shell does.
        self.now = self.now.max(deadline);
        self.feed(Input::Tick)
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
    }

    /// Waits for the next attempt and returns the replica it dials.
    fn next_connect(&mut self) -> String {
        match self.wait().as_slice() {
            [Effect::Connect { server, .. }] => server.clone(),
            other => panic!("expected one Connect, got {other:?}"),
        }
    }

    /// Connects and receives a Welcome; returns the effects of the Welcome.
    fn establish(&mut self, interval_ms: u32) -> Vec<Effect> {
        self.next_connect();
        assert!(self.feed(Input::Connected).is_empty());
        self.feed(welcome(interval_ms))
    }
}

fn retry_of(effects: &[Effect]) -> (bool, Duration) {
    match effects.last() {
        Some(Effect::Close {
            established,
            retry_in,
            ..
        }) => (*established, *retry_in),
        other => panic!("expected a Close, got {other:?}"),
    }
}

#[test]
fn it_connects_at_once_and_serves_after_the_welcome() {
    let mut clock = Clock::new("cloud:7443", None);
    assert_eq!(
        clock.core.deadline(),
        Some(clock.t0),
        "the first attempt is now"
    );
    let effects = clock.wait();
    assert_eq!(
        effects,
        vec![Effect::Connect {
            server: "cloud:7443".into(),
            timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(15),
        }]
    );
    assert_eq!(clock.core.deadline(), None, "the shell owns the attempt");
    clock.feed(Input::Connected);
    let effects = clock.feed(welcome(1000));
    assert_eq!(
        effects,
        vec![
            Effect::Established {
                region: "eu".into()
            },
            Effect::SendHeartbeat { seq: 1 }
        ],
        "the first heartbeat goes at once"
    );
    assert!(clock.core.is_serving());
    let effects = clock.feed(Input::Frame(CloudMessage::DesiredState(desired(3))));
    assert_eq!(effects, vec![Effect::Apply(desired(3))]);
    let effects = clock.feed(Input::Frame(CloudMessage::UsageAck { up_to: 9 }));
    assert_eq!(effects, vec![Effect::AckUsage { up_to: 9 }]);
}

#[test]
fn heartbeats_keep_the_welcomes_interval_without_bursts() {
    let mut clock = Clock::new("cloud:7443", None);
    clock.establish(500);
    for seq in 2..6 {
        let before = clock.at();
        assert_eq!(clock.wait(), vec![Effect::SendHeartbeat { seq }]);
        assert_eq!(clock.at() - before, Duration::from_millis(500));
    }
    // A shell that wakes 3 s late sends one beat, not six, and keeps the cadence.
    clock.advance(Duration::from_secs(3));
    assert_eq!(
        clock.feed(Input::Tick),
        vec![Effect::SendHeartbeat { seq: 6 }]
    );
    assert_eq!(clock.feed(Input::Tick), vec![], "not due again yet");
    assert_eq!(
        clock.core.deadline(),
        Some(clock.now + Duration::from_millis(500))
    );
}

#[test]
fn an_applied_state_is_reported_at_once_and_the_cadence_restarts_from_it() {
    let mut clock = Clock::new("cloud:7443", None);
    assert!(
        clock.feed(Input::ReportNow).is_empty(),
        "nothing to report on before a session"
    );
    clock.establish(15_000);
    clock.advance(Duration::from_secs(4));
    assert_eq!(
        clock.feed(Input::ReportNow),
        vec![Effect::SendHeartbeat { seq: 2 }]
    );
    assert_eq!(
        clock.core.deadline(),
        Some(clock.now + Duration::from_secs(15)),
        "the next beat is an interval after the report, not a burst"
    );
    assert_eq!(clock.wait(), vec![Effect::SendHeartbeat { seq: 3 }]);
}

#[test]
fn a_tiny_heartbeat_interval_is_raised_to_the_floor() {
    let mut clock = Clock::new("cloud:7443", None);
    clock.establish(0);
    let before = clock.at();
    clock.wait();
    assert_eq!(clock.at() - before, Duration::from_millis(100));
}

#[test]
fn failed_attempts_back_off_doubling_to_ten_seconds_with_jitter() {
    let mut clock = Clock::new("cloud:7443", None);
    let mut bases = Vec::new();
    for _ in 0..10 {
        clock.next_connect();
        let (established, retry_in) = retry_of(&clock.feed(Input::ConnectFailed("refused".into())));
        assert!(!established);
        bases.push(retry_in);
    }
    let expected_ms = [
        200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000, 10_000,
    ];
    for (wait, base) in bases.iter().zip(expected_ms) {
        let base = Duration::from_millis(base);
        assert!(
            *wait >= base.mul_f64(0.8) && *wait < base.mul_f64(1.2),
            "{wait:?} is not {base:?} ±20%"
        );
    }
    assert!(
        bases.windows(2).any(|w| w[0] != w[1]),
        "the waits are jittered, not all equal"
    );
}

#[test]
fn an_established_session_that_ends_retries_soon_and_resets_the_backoff() {
    let mut clock = Clock::new("cloud:7443", None);
    for _ in 0..6 {
        clock.next_connect();
        clock.feed(Input::ConnectFailed("down".into()));
    }
    clock.establish(1000);
    let (established, retry_in) = retry_of(&clock.feed(Input::StreamClosed("reset".into())));
    assert!(established);
    assert!(retry_in < Duration::from_millis(240), "{retry_in:?}");
    // The next failure waits 400 ms (±20%), not the 10 s reached before.
    clock.next_connect();
    let (_, retry_in) = retry_of(&clock.feed(Input::ConnectFailed("down".into())));
    assert!(
        retry_in >= Duration::from_millis(320) && retry_in < Duration::from_millis(480),
        "{retry_in:?}"
    );
}

#[test]
fn a_silent_control_plane_fails_the_attempt_after_the_welcome_timeout() {
    let mut clock = Clock::new("cloud:7443", None);
    clock.next_connect();
    clock.feed(Input::Connected);
    assert_eq!(
        clock.core.deadline(),
        Some(clock.now + Duration::from_secs(10))
    );
    clock.advance(Duration::from_secs(9));
    assert!(clock.feed(Input::Tick).is_empty());
    let effects = clock.wait();
    match effects.as_slice() {
        [Effect::Close {
            reason,
            established: false,
            ..
        }] => assert!(reason.contains("no Welcome within 10 s"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(!clock.core.is_serving());
}

#[test]
fn replicas_are_tried_in_turn_and_a_working_one_is_kept() {
    let mut clock = Clock::new("a:1, b:2", None);
    assert_eq!(clock.core.config.connect_timeout, Duration::from_secs(4));
    assert_eq!(clock.core.config.idle_timeout, Duration::from_secs(6));
    assert_eq!(clock.next_connect(), "a:1");
    clock.feed(Input::ConnectFailed("timed out".into()));
    assert_eq!(clock.next_connect(), "b:2");
    clock.feed(Input::ConnectFailed("timed out".into()));
    assert_eq!(clock.next_connect(), "a:1", "round the list again");
    clock.feed(Input::ConnectFailed("timed out".into()));
    // Many failures later the wait before the next replica stays short.
    for _ in 0..8 {
        clock.next_connect();
        let (_, retry_in) = retry_of(&clock.feed(Input::ConnectFailed("x".into())));
        assert!(retry_in < Duration::from_millis(960), "{retry_in:?}");
    }
    let server = clock.next_connect();
    clock.feed(Input::Connected);
    clock.feed(welcome(1000));
    clock.feed(Input::StreamClosed("the leader went away".into()));
    assert_eq!(
        clock.next_connect(),
        server,
        "a session that ended tries the same replica first"
    );
}

#[test]
fn a_replica_that_falls_silent_is_left_for_the_next() {
    let mut clock = Clock::new("a:1,b:2", None);
    assert_eq!(clock.next_connect(), "a:1");
    clock.feed(Input::Connected);
    clock.feed(welcome(1000));
    let (established, retry_in) = retry_of(&clock.feed(Input::Silent("timed out".into())));
    assert!(established && retry_in < Duration::from_millis(240));
    assert_eq!(clock.next_connect(), "b:2", "the next replica first");
    // Alone, there is no other to try.
    let mut alone = Clock::new("a:1", None);
    alone.establish(1000);
    alone.feed(Input::Silent("timed out".into()));
    assert_eq!(alone.next_connect(), "a:1");
}

#[test]
fn a_refusal_before_the_welcome_is_a_failed_attempt() {
    let mut clock = Clock::new("cloud:7443", None);
    clock.next_connect();
    clock.feed(Input::Connected);
    let effects = clock.feed(refused(ErrorCode::Unavailable, "starting up"));
    match effects.as_slice() {
        [Effect::Close {
            reason,
            established: false,
            ..
        }] => assert!(reason.contains("starting up"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_deleted_device_is_marked_removed_once_and_cleared_when_accepted_again() {
    let mut clock = Clock::new("cloud:7443", None);
    clock.establish(1000);
    let effects = clock.feed(refused(ErrorCode::Unauthorized, "device deleted"));
    assert_eq!(
        effects[0],
        Effect::MarkRemoved {
            reason: "device deleted".into()
        }
    );
    assert!(matches!(
        effects[1],
        Effect::Close {
            established: true,
            ..
        }
    ));
    // Refused again on every attempt: marked once, not on each.
    for _ in 0..3 {
        clock.next_connect();
        clock.feed(Input::Connected);
        let effects = clock.feed(refused(ErrorCode::Unauthorized, "device deleted"));
        assert!(
            !effects
                .iter()
                .any(|e| matches!(e, Effect::MarkRemoved { .. })),
            "{effects:?}"
        );
    }
    let effects = clock.establish(1000);
    assert_eq!(effects[0], Effect::ClearRemoved);
}

#[test]
fn a_removal_kept_on_the_device_is_cleared_by_a_welcome() {
    let mut clock = Clock::new("cloud:7443", Some("device deleted"));
    assert_eq!(clock.establish(1000)[0], Effect::ClearRemoved);
}

#[test]
fn a_second_welcome_ends_the_session() {
    let mut clock = Clock::new("cloud:7443", None);
    clock.establish(1000);
    match clock.feed(welcome(1000)).as_slice() {
        [Effect::Close {
            reason,
            established: true,
            ..
        }] => assert!(reason.contains("second Welcome")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_interruption_notice_is_told_now_and_again_on_the_next_session() {
    let mut clock = Clock::new("cloud:7443", None);
    // Given while offline: kept for the session.
    let deadline = clock.now + Duration::from_secs(120);
    assert!(clock.feed(Input::Notice(Some(deadline))).is_empty());
    clock.advance(Duration::from_millis(1500));
    let effects = clock.establish(1000);
    assert!(
        effects.contains(&Effect::SendNotice { seconds: 119 }),
        "{effects:?}"
    );
    // Reset while serving: told at once.
    let deadline = clock.now + Duration::from_secs(30);
    assert_eq!(
        clock.feed(Input::Notice(Some(deadline))),
        vec![Effect::SendNotice { seconds: 30 }]
    );
    // The next session, after the deadline passed, says nothing of it.
    clock.feed(Input::WriteFailed("heartbeat: reset".into()));
    clock.advance(Duration::from_secs(31));
    let effects = clock.establish(1000);
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::SendNotice { .. })),
        "{effects:?}"
    );
}

#[test]
fn notice_seconds_round_up_and_stop_at_the_deadline() {
    let now = Instant::now();
    assert_eq!(notice_seconds(None, now), None);
    assert_eq!(
        notice_seconds(Some(now + Duration::from_secs(120)), now),
        Some(120)
    );
    assert_eq!(
        notice_seconds(Some(now + Duration::from_millis(1500)), now),
        Some(2)
    );
    assert_eq!(notice_seconds(Some(now), now), None);
    assert_eq!(
        notice_seconds(now.checked_sub(Duration::from_secs(1)), now),
        None
    );
}

#[test]
fn a_partition_is_ridden_out_with_a_reproducible_schedule() {
    // 60 s without the control plane: every attempt fails, and the attempts come at
    // the same times for the same seed.
    let schedule = |seed: u64| {
        let t0 = Instant::now();
        let mut core = SessionCore::new(config("cloud:7443"), t0, seed, None);
        let mut attempts = Vec::new();
        let mut now = t0;
        while now - t0 < Duration::from_secs(60) {
            now = core.deadline().expect("waiting");
            for effect in core.handle(now, Input::Tick) {
                if let Effect::Connect { .. } = effect {
                    attempts.push((now - t0).as_millis());
                    core.handle(now, Input::ConnectFailed("no route".into()));
                }
            }
        }
        attempts
    };
    let first = schedule(42);
    assert_eq!(first, schedule(42));
    assert_ne!(first, schedule(43), "another seed spreads the fleet");
    // 200 ms doubling to 10 s: the 60 s hold about a dozen attempts, not hundreds.
    assert!((9..=16).contains(&first.len()), "{first:?}");
}

#[test]
fn stale_inputs_after_a_close_are_ignored() {
    let mut clock = Clock::new("cloud:7443", None);
    clock.establish(1000);
    clock.feed(Input::StreamClosed("reset".into()));
    let deadline = clock.core.deadline();
    for input in [
        Input::WriteFailed("usage: closed".into()),
        Input::StreamClosed("again".into()),
        Input::Frame(CloudMessage::DesiredState(desired(1))),
        Input::Connected,
        Input::ConnectFailed("late".into()),
    ] {
        assert!(clock.feed(input).is_empty());
    }
    assert_eq!(clock.core.deadline(), deadline);
}

/// Inputs a shell could hand in, any order.
fn any_input() -> impl Strategy<Value = (u64, u8)> {
    (0u64..3_000, 0u8..11)
}

fn input_of(kind: u8, now: Instant) -> Input {
    match kind {
        0 => Input::Connected,
        1 => Input::ConnectFailed("x".into()),
        2 => welcome(700),
        3 => Input::Frame(CloudMessage::DesiredState(desired(1))),
        4 => refused(ErrorCode::Unauthorized, "deleted"),
        5 => Input::StreamClosed("closed".into()),
        6 => Input::WriteFailed("w".into()),
        9 => Input::Silent("s".into()),
        7 => Input::Notice(Some(now + Duration::from_secs(5))),
        8 => Input::Frame(CloudMessage::UsageAck { up_to: 1 }),
        _ => Input::Tick,
    }
}

proptest! {
    /// Whatever arrives in whatever order: sends only within a session, one attempt at
    /// a time, heartbeats numbered 1, 2, 3… per session, waits within the bounds, and a
    /// deadline whenever the core is not waiting on the shell.
    #[test]
    fn the_session_keeps_its_invariants(
        seed in any::<u64>(),
        servers in prop_oneof!["a:1", "a:1,b:2", "a:1,b:2,c:3"],
        steps in proptest::collection::vec(any_input(), 1..200),
    ) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut core = SessionCore::new(config(&servers), t0, seed, None);
        let mut attempt_open = false;
        let mut serving = false;
        let mut last_seq = 0u64;
        for (advance_ms, kind) in steps {
            now += Duration::from_millis(advance_ms);
            let input = input_of(kind, now);
            // A shell only reports on an attempt it was asked to make.
            if matches!(input, Input::Connected | Input::ConnectFailed(_)) && !attempt_open {
                continue;
            }
            if matches!(input, Input::Connected | Input::ConnectFailed(_)) {
                attempt_open = false;
            }
            for effect in core.handle(now, input) {
                match effect {
                    Effect::Connect { .. } => {
                        prop_assert!(!attempt_open && !serving, "one attempt at a time");
                        attempt_open = true;
                    }
                    Effect::Established { .. } => {
                        prop_assert!(!serving);
                        serving = true;
                        last_seq = 0;
                    }
                    Effect::SendHeartbeat { seq } => {
                        prop_assert!(serving);
                        prop_assert_eq!(seq, last_seq + 1);
                        last_seq = seq;
                    }
                    Effect::SendNotice { .. } | Effect::Apply(_) | Effect::AckUsage { .. } => {
                        prop_assert!(serving)
                    }
                    Effect::Close { established, retry_in, .. } => {
                        prop_assert_eq!(established, serving);
                        prop_assert!(retry_in >= Duration::from_millis(160));
                        prop_assert!(retry_in < Duration::from_secs(12));
                        serving = false;
                    }
                    Effect::MarkRemoved { .. } | Effect::ClearRemoved => {}
                }
            }
            prop_assert_eq!(core.is_serving(), serving);
            prop_assert_eq!(core.deadline().is_none(), attempt_open);
        }
    }
}
