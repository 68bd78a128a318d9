//! The job runner with real processes: `sh -c` members under the real supervisor (this
//! crate's `nephele-edge` binary), as a pool agent runs them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nephele_edge::jobs::files::SupervisorStatus;
use nephele_edge::jobs::{JobRunner, JobRunnerConfig, Retention, SupervisorCommand};
use nephele_proto::{ErrorCode, JobLaunch, MemberState};

/// A fresh data dir for one test. Dropped (also when the test fails), it SIGKILLs
/// every member a status file says still runs, then deletes the directory: a failed
/// test leaves no process behind.
struct TestDir(PathBuf);

impl TestDir {
    fn new(test: &str) -> TestDir {
        let dir = std::env::temp_dir().join(format!("nephele-jobs-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TestDir(dir)
    }
}

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        fn kill_running(dir: &Path) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    kill_running(&path);
                } else if path.extension().is_some_and(|e| e == "status") {
                    if let Some(SupervisorStatus::Running { pid, .. }) =
                        SupervisorStatus::read(&path)
                    {
                        if let Ok(pid) = i32::try_from(pid) {
                            let _ = nix::sys::signal::killpg(
                                nix::unistd::Pid::from_raw(pid),
                                nix::sys::signal::Signal::SIGKILL,
                            );
                        }
                    }
                }
            }
        }
        kill_running(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn supervisor() -> SupervisorCommand {
    SupervisorCommand {
        program: PathBuf::from(env!("CARGO_BIN_EXE_nephele-edge")),
        prefix: Vec::new(),
    }
}

/// A runner on `dir` whose agent environment holds a join token that must not leak.
fn runner(dir: &Path) -> JobRunner {
    runner_with(dir, supervisor())
}

fn runner_with(dir: &Path, supervisor: SupervisorCommand) -> JobRunner {
    // The runner's log lines go with a failing test's output (captured otherwise).
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_test_writer()
        .try_init();
    let mut agent_env: Vec<(OsString, OsString)> = vec![
        ("NEPHELE_JOIN_TOKEN".into(), "nph1.secret".into()),
        ("AGENT_VISIBLE".into(), "yes".into()),
    ];
    if let Some(path) = std::env::var_os("PATH") {
        agent_env.push(("PATH".into(), path));
    }
    JobRunner::start(JobRunnerConfig {
        data_dir: dir.to_path_buf(),
        supervisor,
        poll_interval: Duration::from_millis(20),
        retention: Retention::default(),
        agent_env,
    })
    .expect("runner starts")
}

fn sh(job: &str, member: u16, script: &str) -> JobLaunch {
    JobLaunch {
        job: job.into(),
        attempt: 1,
        member,
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: Vec::new(),
        working_dir: String::new(),
        grace_ms: 30_000,
    }
}

/// Waits (a failsafe minute at most) until the member's reported state passes `test`.
fn wait_for(
    runner: &JobRunner,
    launch: &JobLaunch,
    what: &str,
    test: impl Fn(Option<&MemberState>) -> bool,
) -> Option<MemberState> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let statuses = runner.statuses();
        let state = statuses
            .iter()
            .find(|s| {
                s.job == launch.job && s.attempt == launch.attempt && s.member == launch.member
            })
            .map(|s| s.state.clone());
        if test(state.as_ref()) {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "{} member {} never became {what}; statuses: {statuses:?}",
            launch.job,
            launch.member
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn exited(runner: &JobRunner, launch: &JobLaunch) -> (Option<i32>, Option<i32>) {
    match wait_for(runner, launch, "exited", |s| {
        matches!(
            s,
            Some(MemberState::Exited { .. } | MemberState::FailedToStart(_))
        )
    }) {
        Some(MemberState::Exited { code, signal, .. }) => (code, signal),
        other => panic!("{} did not exit: {other:?}", launch.job),
    }
}

/// The member's pid, once its script printed `started` (past its `trap`s).
fn running_pid(runner: &JobRunner, launch: &JobLaunch) -> u32 {
    wait_for_log(runner, launch, "started");
    match wait_for(runner, launch, "running", |s| {
        matches!(s, Some(MemberState::Running { .. }))
    }) {
        Some(MemberState::Running { pid, .. }) => pid,
        other => panic!("not running: {other:?}"),
    }
}

fn log(runner: &JobRunner, launch: &JobLaunch) -> String {
    let chunk = runner
        .read_log(&launch.job, launch.attempt, launch.member, 0, u32::MAX)
        .expect("log");
    String::from_utf8_lossy(&chunk.data).into_owned()
}

/// Waits for `text` in the log; the member may not be known yet (the runner applies a
/// desired state on its own thread).
fn wait_for_log(runner: &JobRunner, launch: &JobLaunch, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let current = || {
        runner
            .read_log(&launch.job, launch.attempt, launch.member, 0, u32::MAX)
            .map(|chunk| String::from_utf8_lossy(&chunk.data).into_owned())
    };
    while !current().is_ok_and(|text_now| text_now.contains(text)) {
        assert!(
            Instant::now() < deadline,
            "log never showed {text:?}: {:?}",
            current()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn members_see_their_environment_and_directory_and_their_output_is_logged() {
    let dir = TestDir::new("env");
    let runner = runner(&dir);
    let mut own_dir = sh(
        "acme/env",
        0,
        "echo \"rank=$RANK agent=$AGENT_VISIBLE token=${NEPHELE_JOIN_TOKEN:-none}\"; pwd; echo oops >&2",
    );
    own_dir.env = vec![("RANK".into(), "0".into()), ("RANK".into(), "3".into())];
    let chosen = dir.join("chosen");
    std::fs::create_dir_all(&chosen).expect("dir");
    let mut chosen_dir = sh(
        "acme/env",
        1,
        "pwd; test -d ckpt && echo has-checkpoint-dir; exit 3",
    );
    chosen_dir.working_dir = chosen.to_string_lossy().into_owned();
    chosen_dir.env = vec![("NEPHELE_CHECKPOINT_DIR".into(), "ckpt".into())];
    runner.set_desired(vec![own_dir.clone(), chosen_dir.clone()]);

    assert_eq!(exited(&runner, &own_dir), (Some(0), None));
    assert_eq!(exited(&runner, &chosen_dir), (Some(3), None));

    let text = log(&runner, &own_dir);
    assert!(text.contains("rank=3 agent=yes token=none"), "{text}");
    assert!(text.contains("oops"), "stderr is logged too: {text}");
    let member_dir = dir
        .join("jobs")
        .join("acme%2Fenv")
        .join("1")
        .join("member-0");
    assert!(
        text.contains(&*member_dir.to_string_lossy()),
        "runs in {}: {text}",
        member_dir.display()
    );
    assert!(dir.join("jobs/acme%2Fenv/1/member-0.log").is_file());

    let text = log(&runner, &chosen_dir);
    assert!(text.contains(&*chosen.to_string_lossy()), "{text}");
    assert!(text.contains("has-checkpoint-dir"), "{text}");

    // A range of the log, and the end of it.
    let chunk = runner.read_log("acme/env", 1, 0, 5, 6).expect("range");
    assert_eq!(chunk.data, b"3 agen");
    assert!(chunk.finished);
    let size = chunk.size;
    let end = runner
        .read_log("acme/env", 1, 0, size + 10, 100)
        .expect("end");
    assert!(end.data.is_empty());
    assert_eq!(end.size, size);
}

#[test]
fn members_that_cannot_start_say_why_and_unknown_logs_are_not_found() {
    let dir = TestDir::new("fail");
    let runner = runner(&dir);
    let mut empty = sh("acme/bad", 0, "");
    empty.argv.clear();
    let mut missing = sh("acme/bad", 1, "");
    missing.argv = vec!["/no/such/program".into()];
    let mut bad_dir = sh("acme/bad", 2, "true");
    bad_dir.working_dir = "/no/such/dir".into();
    // A relative directory that climbs out of the member's own: refused, nothing made.
    let mut climbing = sh("acme/bad", 4, "true");
    climbing.working_dir = "../../../../escaped".into();
    runner.set_desired(vec![
        empty.clone(),
        missing.clone(),
        bad_dir.clone(),
        climbing.clone(),
    ]);
    fn failed(runner: &JobRunner, launch: &JobLaunch) -> String {
        match wait_for(runner, launch, "failed", |s| {
            matches!(s, Some(MemberState::FailedToStart(_)))
        }) {
            Some(MemberState::FailedToStart(why)) => why,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(failed(&runner, &empty), "empty command");
    let why = failed(&runner, &missing);
    assert!(
        why.contains("/no/such/program") && why.contains("No such file"),
        "{why}"
    );
    let why = failed(&runner, &bad_dir);
    assert!(why.contains("/no/such/dir"), "{why}");
    let why = failed(&runner, &climbing);
    assert!(why.contains("climbs out"), "{why}");
    assert!(!dir.join("escaped").exists() && !dir.join("jobs/escaped").exists());

    drop(runner);

    // A supervisor that cannot be started fails the member the same way.
    let runner = runner_with(
        &dir,
        SupervisorCommand {
            program: "/no/such/supervisor".into(),
            prefix: Vec::new(),
        },
    );
    let unsupervised = sh("acme/bad", 3, "true");
    runner.set_desired(vec![unsupervised.clone()]);
    let why = failed(&runner, &unsupervised);
    assert!(why.contains("/no/such/supervisor"), "{why}");

    let error = runner
        .read_log("acme/nothing", 1, 0, 0, 10)
        .expect_err("unknown member");
    assert_eq!(error.code, ErrorCode::NotFound);
    assert!(error.message.contains("acme/nothing"), "{}", error.message);
}

#[test]
fn a_stopped_member_that_traps_sigterm_exits_before_its_grace() {
    let dir = TestDir::new("term");
    let runner = runner(&dir);
    let launch = sh(
        "acme/term",
        0,
        "trap 'echo got-term; exit 7' TERM; echo started; while :; do sleep 0.05; done",
    );
    runner.set_desired(vec![launch.clone()]);
    running_pid(&runner, &launch);
    runner.set_desired(Vec::new());
    // No longer desired, it is still reported for a while once it exited, so the
    // control plane hears it stopped: by its own exit, not the SIGKILL 30 s later…
    assert_eq!(exited(&runner, &launch), (Some(7), None));
    assert!(log(&runner, &launch).contains("got-term"));
    // …and listed again, it reports the same and is not started again.
    runner.set_desired(vec![launch.clone()]);
    assert_eq!(exited(&runner, &launch), (Some(7), None));
    assert_eq!(log(&runner, &launch).matches("started").count(), 1);
}

#[test]
fn a_stopped_member_that_ignores_sigterm_is_killed_after_its_grace() {
    let dir = TestDir::new("kill");
    let runner = runner(&dir);
    let mut launch = sh(
        "acme/kill",
        0,
        "trap '' TERM; echo started; while :; do sleep 0.05; done",
    );
    launch.grace_ms = 500;
    runner.set_desired(vec![launch.clone()]);
    let pid = running_pid(&runner, &launch);
    runner.set_desired(Vec::new());
    assert_eq!(exited(&runner, &launch), (None, Some(9)), "pid {pid}");
    runner.set_desired(vec![launch.clone()]);
    assert_eq!(exited(&runner, &launch), (None, Some(9)), "pid {pid}");
}

#[test]
fn repeated_desired_states_start_nothing_twice() {
    let dir = TestDir::new("repeat");
    let runner = runner(&dir);
    let long = sh("acme/repeat", 0, "echo started; exec sleep 60");
    let short = sh("acme/repeat", 1, "echo started");
    for _ in 0..5 {
        runner.set_desired(vec![long.clone(), short.clone(), long.clone()]);
    }
    let pid = running_pid(&runner, &long);
    assert_eq!(exited(&runner, &short), (Some(0), None));
    for _ in 0..5 {
        runner.set_desired(vec![short.clone(), long.clone()]);
        std::thread::sleep(Duration::from_millis(30));
    }
    assert_eq!(running_pid(&runner, &long), pid);
    assert_eq!(log(&runner, &long).matches("started").count(), 1);
    assert_eq!(log(&runner, &short).matches("started").count(), 1);
    runner.set_desired(Vec::new());
    // Stopped: SIGTERM ends `sleep` (reported with its signal, still, after it left).
    assert_eq!(exited(&runner, &long), (None, Some(15)));
}

#[test]
fn a_restarted_runner_adopts_its_members_and_reports_their_real_exit() {
    let dir = TestDir::new("adopt");
    // Each waits for a file in its working directory, then exits with its own code.
    let first = sh(
        "acme/adopt",
        0,
        "echo started; while [ ! -f go ]; do sleep 0.02; done; echo bye; exit 5",
    );
    let second = sh(
        "acme/adopt",
        1,
        "echo started; while [ ! -f go ]; do sleep 0.02; done; echo bye; exit 6",
    );
    let work_dir = |member: u16| dir.join(format!("jobs/acme%2Fadopt/1/member-{member}"));

    let agent = runner(&dir);
    agent.set_desired(vec![first.clone(), second.clone()]);
    let first_pid = running_pid(&agent, &first);
    let second_pid = running_pid(&agent, &second);
    drop(agent);

    // The agent restarts: the members run on and are adopted, not started again.
    let agent = runner(&dir);
    assert!(matches!(
        wait_for(&agent, &first, "running", |s| s.is_some()),
        Some(MemberState::Running { pid, .. }) if pid == first_pid
    ));
    agent.set_desired(vec![first.clone(), second.clone()]);
    std::fs::write(work_dir(0).join("go"), b"").expect("go");
    assert_eq!(exited(&agent, &first), (Some(5), None));
    assert_eq!(running_pid(&agent, &second), second_pid);
    drop(agent);

    // The second ends while no agent runs; the next one still learns its exit code.
    std::fs::write(work_dir(1).join("go"), b"").expect("go");
    let status_file = dir.join("jobs/acme%2Fadopt/1/member-1.status");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !SupervisorStatus::read(&status_file).is_some_and(|s| s.is_final()) {
        assert!(
            Instant::now() < deadline,
            "the supervisor never wrote the exit"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let agent = runner(&dir);
    agent.set_desired(vec![first.clone(), second.clone()]);
    assert_eq!(exited(&agent, &first), (Some(5), None));
    assert_eq!(exited(&agent, &second), (Some(6), None));
    for launch in [&first, &second] {
        assert_eq!(log(&agent, launch).matches("started").count(), 1);
    }
}

#[test]
fn the_supervisor_forwards_sigterm_to_its_member_and_records_the_exit() {
    let dir = TestDir::new("forward");
    let status = dir.join("member.status");
    let log_file = dir.join("member.log");
    let mut child = supervisor()
        .command(
            &status,
            &log_file,
            &[
                "sh".into(),
                "-c".into(),
                "trap 'echo got-term; exit 9' TERM; echo started; while :; do sleep 0.05; done"
                    .into(),
            ],
        )
        .spawn()
        .expect("supervisor");
    // The member can print before its supervisor has written the status (the status
    // needs the member's pid, so it comes after the spawn): wait for both.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(std::fs::read_to_string(&log_file)
        .unwrap_or_default()
        .contains("started")
        && matches!(
            SupervisorStatus::read(&status),
            Some(SupervisorStatus::Running { .. })
        ))
    {
        assert!(
            Instant::now() < deadline,
            "member never started, or its supervisor never wrote Running: {:?}",
            SupervisorStatus::read(&status)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal");
    assert!(child.wait().expect("supervisor exits").success());
    assert_eq!(
        SupervisorStatus::read(&status),
        Some(SupervisorStatus::Exited {
            code: Some(9),
            signal: None,
            finished_unix: match SupervisorStatus::read(&status) {
                Some(SupervisorStatus::Exited { finished_unix, .. }) => finished_unix,
                _ => 0,
            },
        })
    );
    assert!(std::fs::read_to_string(&log_file)
        .unwrap_or_default()
        .contains("got-term"));
}

#[test]
fn a_member_lost_with_its_supervisor_is_reported_exited_without_a_status() {
    let dir = TestDir::new("lost");
    let runner = runner(&dir);
    let launch = sh("acme/lost", 0, "echo started; exec sleep 60");
    runner.set_desired(vec![launch.clone()]);
    let pid = running_pid(&runner, &launch);
    // Someone kill -9s the supervisor, then the member: nobody writes an exit status.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("member stat");
    let supervisor_pid: i32 = stat[stat.rfind(')').expect("stat") + 1..]
        .split_whitespace()
        .nth(1)
        .and_then(|ppid| ppid.parse().ok())
        .expect("ppid");
    for (target, group) in [(supervisor_pid, false), (pid as i32, true)] {
        let target = nix::unistd::Pid::from_raw(target);
        let signal = nix::sys::signal::Signal::SIGKILL;
        if group {
            nix::sys::signal::killpg(target, signal).expect("kill member");
        } else {
            nix::sys::signal::kill(target, signal).expect("kill supervisor");
        }
    }
    assert_eq!(exited(&runner, &launch), (None, None));
}
