//! `JobRunnerCore`: what to do with job members, given what the control plane wants and
//! what the shell has seen of their processes. No IO and no clock: time is a `now_ms`
//! argument (Unix milliseconds, because deadlines outlive an agent restart), and every
//! method returns the [`Action`]s the shell must carry out, in order.
//!
//! Calling order for the shell: [`JobRunnerCore::set_desired`] with the `jobs` of every
//! `DesiredState`; after carrying out an [`Action::Start`],
//! [`JobRunnerCore::supervisor_spawned`] and then [`JobRunnerCore::observe`] with what
//! the member's status file says (or that it could not start);
//! [`JobRunnerCore::observe`] again whenever a status file changes or a process is
//! found gone; [`JobRunnerCore::handle_timeout`] at or after
//! [`JobRunnerCore::poll_timeout`]. Persist [`JobRunnerCore::records`] after every call
//! that changed [`JobRunnerCore::revision`] and before carrying out its actions: a start
//! is recorded before it happens, so no restart can start a member twice.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use nephele_proto::{JobLaunch, JobMemberStatus, MemberState};
use serde::{Deserialize, Serialize};

/// One member of one attempt of one job: what is started at most once.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MemberKey {
    pub job: String,
    pub attempt: u32,
    pub member: u16,
}

impl MemberKey {
    pub fn of(launch: &JobLaunch) -> MemberKey {
        MemberKey {
            job: launch.job.clone(),
            attempt: launch.attempt,
            member: launch.member,
        }
    }
}

impl fmt::Display for MemberKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} attempt {} member {}",
            self.job, self.attempt, self.member
        )
    }
}

/// A process as the shell identifies it: its pid and, where the OS says, when it
/// started (clock ticks since boot), so that a reused pid is never taken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRef {
    pub pid: u32,
    pub start_ticks: Option<u64>,
}

/// Where a member is in its life. See the table in the module doc of `jobs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// The start is decided and recorded; the supervisor has not confirmed it yet.
    Starting {
        since_ms: u64,
    },
    Running {
        member: ProcessRef,
        started_unix: u64,
    },
    /// SIGTERM was sent; SIGKILL follows at `kill_at_ms` unless it exits first.
    Stopping {
        member: ProcessRef,
        kill_at_ms: u64,
        killed: bool,
    },
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        finished_unix: u64,
    },
    FailedToStart(String),
}

impl Phase {
    /// Whether the member is over: it will never run again under this key.
    pub fn is_finished(&self) -> bool {
        matches!(self, Phase::Exited { .. } | Phase::FailedToStart(_))
    }
}

/// Everything the runner keeps about one member; persisted as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub key: MemberKey,
    /// SIGTERM to SIGKILL, from the last desired state that listed the member.
    pub grace_ms: u64,
    pub phase: Phase,
    /// Whether the latest desired state lists it.
    pub desired: bool,
    /// Set when it is finished and no longer desired: it is not reported any more and
    /// its files are kept for the log retention.
    pub retired_ms: Option<u64>,
    /// Whether its log (and status file, and own working directory) are still on disk.
    pub files_kept: bool,
    /// The supervisor process, once the shell spawned it.
    pub supervisor: Option<ProcessRef>,
}

/// How long finished members are remembered. Both bounds apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A retired member's files are deleted this long after it retired…
    pub files_max_age_ms: u64,
    /// …or sooner, when more retired members than this still have files.
    pub files_max_count: usize,
    /// Retired records (the outcome and the fact that the key ran) beyond this count
    /// are forgotten, oldest first. A forgotten key could be started again; the control
    /// plane never lists a finished attempt that long after it finished.
    pub records_max_count: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            files_max_age_ms: 7 * 24 * 3600 * 1000,
            files_max_count: 100,
            records_max_count: 4096,
        }
    }
}

/// What the shell saw of a member's process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// The supervisor started the member (its status file says so).
    Running {
        member: ProcessRef,
        started_unix: u64,
    },
    /// The member ended; both `None` when its status was lost (supervisor and member
    /// gone without a word, or the node rebooted).
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        finished_unix: u64,
    },
    FailedToStart(String),
}

/// What the shell must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start this member under a supervisor (it is recorded as `Starting` already).
    Start(JobLaunch),
    /// SIGTERM to the member's process group.
    Terminate { key: MemberKey, member: ProcessRef },
    /// SIGKILL to the member's process group.
    Kill { key: MemberKey, member: ProcessRef },
    /// Delete the member's log, status file and own working directory.
    DeleteFiles { key: MemberKey },
}

/// How long a member is still reported after it retired (see
/// [`JobRunnerCore::statuses_at`]).
pub const REPORT_RETIRED_MS: u64 = 120_000;

#[derive(Debug, Default)]
pub struct JobRunnerCore {
    members: BTreeMap<MemberKey, MemberRecord>,
    retention: Retention,
    revision: u64,
}

impl JobRunnerCore {
    pub fn new(retention: Retention) -> JobRunnerCore {
        JobRunnerCore {
            members: BTreeMap::new(),
            retention,
            revision: 0,
        }
    }

    /// A core that continues from persisted records (after an agent restart). Members
    /// are not started or stopped by this: that waits for the next desired state.
    pub fn restore(records: Vec<MemberRecord>, retention: Retention) -> JobRunnerCore {
        JobRunnerCore {
            members: records.into_iter().map(|r| (r.key.clone(), r)).collect(),
            retention,
            revision: 0,
        }
    }

    /// Changes whenever anything that must be persisted changed.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Every record, in key order: what to persist.
    pub fn records(&self) -> impl Iterator<Item = &MemberRecord> {
        self.members.values()
    }

    pub fn member(&self, key: &MemberKey) -> Option<&MemberRecord> {
        self.members.get(key)
    }

    /// Applies the `jobs` of a desired state (level-triggered: the whole list each
    /// time). Starts every listed key never seen before (the first launch of a key
    /// listed twice wins), stops every live member not listed, retires finished ones
    /// not listed. A listed key that was ever started is never started again, whatever
    /// its launch says now.
    pub fn set_desired(&mut self, launches: &[JobLaunch], now_ms: u64) -> Vec<Action> {
        let mut wanted: BTreeMap<MemberKey, &JobLaunch> = BTreeMap::new();
        for launch in launches {
            wanted.entry(MemberKey::of(launch)).or_insert(launch);
        }
        let mut actions = Vec::new();
        let before = self.revision;
        let mut changed = false;
        for record in self.members.values_mut() {
            let launch = wanted.get(&record.key);
            let desired = launch.is_some();
            if record.desired != desired {
                record.desired = desired;
                changed = true;
            }
            if let Some(launch) = launch {
                if record.grace_ms != launch.grace_ms {
                    record.grace_ms = launch.grace_ms;
                    changed = true;
                }
                // Listed again after it retired: reported again, never restarted.
                if record.retired_ms.take().is_some() {
                    changed = true;
                }
                continue;
            }
            match &record.phase {
                Phase::Running { member, .. } => {
                    let member = *member;
                    record.phase = Phase::Stopping {
                        member,
                        kill_at_ms: now_ms.saturating_add(record.grace_ms),
                        killed: false,
                    };
                    actions.push(Action::Terminate {
                        key: record.key.clone(),
                        member,
                    });
                    changed = true;
                }
                // Stopped as soon as the supervisor confirms the start (see `observe`).
                Phase::Starting { .. } | Phase::Stopping { .. } => {}
                Phase::Exited { .. } | Phase::FailedToStart(_) => {
                    if record.retired_ms.is_none() {
                        record.retired_ms = Some(now_ms);
                        changed = true;
                    }
                }
            }
        }
        for (key, launch) in wanted {
            if self.members.contains_key(&key) {
                continue;
            }
            self.members.insert(
                key.clone(),
                MemberRecord {
                    key,
                    grace_ms: launch.grace_ms,
                    phase: Phase::Starting { since_ms: now_ms },
                    desired: true,
                    retired_ms: None,
                    files_kept: true,
                    supervisor: None,
                },
            );
            actions.push(Action::Start(launch.clone()));
            changed = true;
        }
        if changed {
            self.revision = before + 1;
        }
        actions.extend(self.enforce_retention(now_ms));
        actions
    }

    /// Records the supervisor the shell spawned for a `Starting` member.
    pub fn supervisor_spawned(&mut self, key: &MemberKey, supervisor: ProcessRef) {
        if let Some(record) = self.members.get_mut(key) {
            if matches!(record.phase, Phase::Starting { .. }) {
                record.supervisor = Some(supervisor);
                self.revision += 1;
            }
        }
    }

    /// Applies what the shell saw of a member. A finished member never changes again;
    /// a confirmed start of a member that is no longer desired is stopped at once.
    pub fn observe(&mut self, key: &MemberKey, observed: Observed, now_ms: u64) -> Vec<Action> {
        let Some(record) = self.members.get_mut(key) else {
            return Vec::new();
        };
        let mut actions = Vec::new();
        match (observed, &record.phase) {
            (_, Phase::Exited { .. } | Phase::FailedToStart(_)) => return actions,
            (
                Observed::Running {
                    member,
                    started_unix,
                },
                Phase::Starting { .. },
            ) => {
                if record.desired {
                    record.phase = Phase::Running {
                        member,
                        started_unix,
                    };
                } else {
                    record.phase = Phase::Stopping {
                        member,
                        kill_at_ms: now_ms.saturating_add(record.grace_ms),
                        killed: false,
                    };
                    actions.push(Action::Terminate {
                        key: key.clone(),
                        member,
                    });
                }
            }
            (Observed::Running { .. }, Phase::Running { .. } | Phase::Stopping { .. }) => {
                return actions;
            }
            (
                Observed::Exited {
                    code,
                    signal,
                    finished_unix,
                },
                _,
            ) => {
                record.phase = Phase::Exited {
                    code,
                    signal,
                    finished_unix,
                };
            }
            (Observed::FailedToStart(error), Phase::Starting { .. }) => {
                record.phase = Phase::FailedToStart(error);
            }
            // A running member cannot fail to start; the status that said so is stale.
            (Observed::FailedToStart(_), _) => return actions,
        }
        if record.phase.is_finished() && !record.desired && record.retired_ms.is_none() {
            record.retired_ms = Some(now_ms);
        }
        self.revision += 1;
        actions.extend(self.enforce_retention(now_ms));
        actions
    }

    /// SIGKILLs whose grace ran out, and the retention of finished members' files.
    pub fn handle_timeout(&mut self, now_ms: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        for record in self.members.values_mut() {
            if let Phase::Stopping {
                member,
                kill_at_ms,
                killed: killed @ false,
            } = &mut record.phase
            {
                if *kill_at_ms <= now_ms {
                    *killed = true;
                    actions.push(Action::Kill {
                        key: record.key.clone(),
                        member: *member,
                    });
                }
            }
        }
        if !actions.is_empty() {
            self.revision += 1;
        }
        actions.extend(self.enforce_retention(now_ms));
        actions
    }

    /// When [`JobRunnerCore::handle_timeout`] has something to do next, if ever.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.members
            .values()
            .filter_map(|record| match (&record.phase, record.retired_ms) {
                (
                    Phase::Stopping {
                        kill_at_ms,
                        killed: false,
                        ..
                    },
                    _,
                ) => Some(*kill_at_ms),
                (_, Some(retired_ms)) if record.files_kept => {
                    Some(retired_ms.saturating_add(self.retention.files_max_age_ms))
                }
                _ => None,
            })
            .min()
    }

    /// What the heartbeat reports: every member not retired, except one whose start is
    /// not confirmed yet (for the milliseconds until its supervisor says it runs, or
    /// could not start it): until then the control plane sees what it saw before the
    /// launch reached the agent.
    pub fn statuses(&self) -> Vec<JobMemberStatus> {
        self.statuses_since(None)
    }

    /// [`Self::statuses`], plus members retired within [`REPORT_RETIRED_MS`] of
    /// `now_ms`: a member stopped because it is no longer listed (preempted, drained, a
    /// failed gang's other members) exits after it left the desired state, and the
    /// control plane frees its resources as soon as it hears that, instead of waiting
    /// out the grace period. Reports of an attempt it no longer runs are ignored there.
    pub fn statuses_at(&self, now_ms: u64) -> Vec<JobMemberStatus> {
        self.statuses_since(Some(now_ms.saturating_sub(REPORT_RETIRED_MS)))
    }

    fn statuses_since(&self, retired_after_ms: Option<u64>) -> Vec<JobMemberStatus> {
        self.members
            .values()
            .filter(|record| match (record.retired_ms, retired_after_ms) {
                (None, _) => true,
                (Some(at), Some(after)) => at >= after,
                (Some(_), None) => false,
            })
            .filter_map(|record| {
                let state = match &record.phase {
                    Phase::Starting { .. } => return None,
                    Phase::Running {
                        member,
                        started_unix,
                    } => MemberState::Running {
                        pid: member.pid,
                        started_unix: *started_unix,
                    },
                    Phase::Stopping { member, .. } => MemberState::Stopping { pid: member.pid },
                    Phase::Exited {
                        code,
                        signal,
                        finished_unix,
                    } => MemberState::Exited {
                        code: *code,
                        signal: *signal,
                        finished_unix: *finished_unix,
                    },
                    Phase::FailedToStart(error) => MemberState::FailedToStart(error.clone()),
                };
                Some(JobMemberStatus {
                    job: record.key.job.clone(),
                    attempt: record.key.attempt,
                    member: record.key.member,
                    state,
                })
            })
            .collect()
    }

    /// Deletes files of retired members past the age or count bound, and forgets the
    /// oldest retired records past theirs.
    fn enforce_retention(&mut self, now_ms: u64) -> Vec<Action> {
        let mut retired: Vec<(u64, MemberKey)> = self
            .members
            .values()
            .filter_map(|r| r.retired_ms.map(|at| (at, r.key.clone())))
            .collect();
        // Newest first, so the count bounds keep the most recent.
        retired.sort_by(|a, b| b.cmp(a));
        let mut actions = Vec::new();
        let mut with_files = 0usize;
        let mut forget = BTreeSet::new();
        for (index, (retired_ms, key)) in retired.iter().enumerate() {
            if index >= self.retention.records_max_count {
                forget.insert(key.clone());
            }
            let Some(record) = self.members.get_mut(key) else {
                continue;
            };
            if !record.files_kept {
                continue;
            }
            let too_old = retired_ms.saturating_add(self.retention.files_max_age_ms) <= now_ms;
            if too_old || with_files >= self.retention.files_max_count || forget.contains(key) {
                record.files_kept = false;
                actions.push(Action::DeleteFiles { key: key.clone() });
            } else {
                with_files += 1;
            }
        }
        for key in &forget {
            self.members.remove(key);
        }
        if !actions.is_empty() || !forget.is_empty() {
            self.revision += 1;
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(job: &str, member: u16) -> JobLaunch {
        JobLaunch {
            job: job.into(),
            attempt: 1,
            member,
            argv: vec!["true".into()],
            env: vec![],
            working_dir: String::new(),
            grace_ms: 1000,
        }
    }

    fn key(job: &str, member: u16) -> MemberKey {
        MemberKey {
            job: job.into(),
            attempt: 1,
            member,
        }
    }

    fn pid(pid: u32) -> ProcessRef {
        ProcessRef {
            pid,
            start_ticks: Some(7),
        }
    }

    /// A step of a test: what happens at a time.
    #[derive(Clone, Copy)]
    enum Step {
        Desire(&'static [(&'static str, u16)]),
        Confirm(&'static str, u16, u32),
        Exit(&'static str, u16, i32),
        Fail(&'static str, u16),
        Timeout,
    }

    /// Runs `steps` (each at `now_ms`) on a fresh core with the default retention, and
    /// compares the actions of the last step, written as short strings, and the states
    /// the core reports after it.
    fn check(steps: &[(u64, Step)], expected_actions: &[&str], expected_states: &[&str]) {
        let mut core = JobRunnerCore::new(Retention::default());
        let mut actions = Vec::new();
        for (now_ms, step) in steps {
            actions = match step {
                Step::Desire(members) => {
                    let launches: Vec<JobLaunch> =
                        members.iter().map(|(job, m)| launch(job, *m)).collect();
                    core.set_desired(&launches, *now_ms)
                }
                Step::Confirm(job, m, p) => {
                    core.supervisor_spawned(&key(job, *m), pid(p + 1000));
                    core.observe(
                        &key(job, *m),
                        Observed::Running {
                            member: pid(*p),
                            started_unix: now_ms / 1000,
                        },
                        *now_ms,
                    )
                }
                Step::Exit(job, m, code) => core.observe(
                    &key(job, *m),
                    Observed::Exited {
                        code: Some(*code),
                        signal: None,
                        finished_unix: now_ms / 1000,
                    },
                    *now_ms,
                ),
                Step::Fail(job, m) => core.observe(
                    &key(job, *m),
                    Observed::FailedToStart("no such program".into()),
                    *now_ms,
                ),
                Step::Timeout => core.handle_timeout(*now_ms),
            };
        }
        let actions: Vec<String> = actions
            .iter()
            .map(|action| match action {
                Action::Start(l) => format!("start {}/{}", l.job, l.member),
                Action::Terminate { key, member } => {
                    format!("term {}/{} pid {}", key.job, key.member, member.pid)
                }
                Action::Kill { key, member } => {
                    format!("kill {}/{} pid {}", key.job, key.member, member.pid)
                }
                Action::DeleteFiles { key } => format!("delete {}/{}", key.job, key.member),
            })
            .collect();
        assert_eq!(actions, expected_actions, "actions");
        let states: Vec<String> = core
            .statuses()
            .iter()
            .map(|s| {
                let state = match &s.state {
                    MemberState::Running { pid, .. } => format!("running {pid}"),
                    MemberState::Stopping { pid } => format!("stopping {pid}"),
                    MemberState::Exited { code, signal, .. } => {
                        format!("exited {code:?} {signal:?}")
                    }
                    MemberState::FailedToStart(e) => format!("failed: {e}"),
                };
                format!("{}/{} {state}", s.job, s.member)
            })
            .collect();
        assert_eq!(states, expected_states, "states");
    }

    #[test]
    fn a_new_member_is_started_once() {
        check(
            &[(0, Step::Desire(&[("t/a", 0), ("t/a", 1)]))],
            &["start t/a/0", "start t/a/1"],
            // Not reported before the supervisor confirms the start.
            &[],
        );
        check(
            &[
                (0, Step::Desire(&[("t/a", 0)])),
                (5, Step::Confirm("t/a", 0, 42)),
                (10, Step::Desire(&[("t/a", 0)])),
            ],
            &[],
            &["t/a/0 running 42"],
        );
    }

    #[test]
    fn a_key_listed_twice_in_one_state_starts_once() {
        check(
            &[(0, Step::Desire(&[("t/a", 0), ("t/a", 0)]))],
            &["start t/a/0"],
            &[],
        );
    }

    #[test]
    fn a_member_no_longer_desired_is_terminated_then_killed_after_its_grace() {
        let steps = [
            (0, Step::Desire(&[("t/a", 0)])),
            (5, Step::Confirm("t/a", 0, 42)),
            (100, Step::Desire(&[])),
        ];
        check(&steps, &["term t/a/0 pid 42"], &["t/a/0 stopping 42"]);
        let mut before_grace = Vec::from(steps);
        before_grace.push((1099, Step::Timeout));
        check(&before_grace, &[], &["t/a/0 stopping 42"]);
        let mut at_grace = Vec::from(steps);
        at_grace.push((1100, Step::Timeout));
        check(&at_grace, &["kill t/a/0 pid 42"], &["t/a/0 stopping 42"]);
        // Killed once only.
        let mut after = Vec::from(steps);
        after.push((1100, Step::Timeout));
        after.push((1200, Step::Timeout));
        check(&after, &[], &["t/a/0 stopping 42"]);
    }

    #[test]
    fn a_stopped_member_that_exits_is_retired_and_no_longer_reported() {
        check(
            &[
                (0, Step::Desire(&[("t/a", 0)])),
                (5, Step::Confirm("t/a", 0, 42)),
                (100, Step::Desire(&[])),
                (200, Step::Exit("t/a", 0, 143)),
            ],
            &[],
            &[],
        );
    }

    #[test]
    fn a_member_stopped_before_its_start_is_confirmed_is_terminated_on_confirmation() {
        check(
            &[
                (0, Step::Desire(&[("t/a", 0)])),
                (1, Step::Desire(&[])),
                (5, Step::Confirm("t/a", 0, 42)),
            ],
            &["term t/a/0 pid 42"],
            &["t/a/0 stopping 42"],
        );
    }

    #[test]
    fn an_exited_member_is_reported_while_desired_and_never_restarted() {
        check(
            &[
                (0, Step::Desire(&[("t/a", 0)])),
                (5, Step::Confirm("t/a", 0, 42)),
                (50, Step::Exit("t/a", 0, 3)),
                (60, Step::Desire(&[("t/a", 0)])),
            ],
            &[],
            &["t/a/0 exited Some(3) None"],
        );
    }

    #[test]
    fn a_retired_member_listed_again_is_reported_again_not_restarted() {
        check(
            &[
                (0, Step::Desire(&[("t/a", 0)])),
                (5, Step::Confirm("t/a", 0, 42)),
                (50, Step::Exit("t/a", 0, 0)),
                (60, Step::Desire(&[])),
                (70, Step::Desire(&[("t/a", 0)])),
            ],
            &[],
            &["t/a/0 exited Some(0) None"],
        );
    }

    #[test]
    fn a_new_attempt_is_a_new_key() {
        let mut core = JobRunnerCore::new(Retention::default());
        let first = launch("t/a", 0);
        assert_eq!(core.set_desired(std::slice::from_ref(&first), 0).len(), 1);
        let second = JobLaunch {
            attempt: 2,
            ..first
        };
        let actions = core.set_desired(std::slice::from_ref(&second), 10);
        assert_eq!(actions, vec![Action::Start(second)]);
    }

    #[test]
    fn a_member_that_failed_to_start_is_reported_with_why() {
        check(
            &[
                (0, Step::Desire(&[("t/a", 0)])),
                (1, Step::Fail("t/a", 0)),
                (2, Step::Desire(&[("t/a", 0)])),
            ],
            &[],
            &["t/a/0 failed: no such program"],
        );
    }

    #[test]
    fn a_finished_member_does_not_change_again() {
        check(
            &[
                (0, Step::Desire(&[("t/a", 0)])),
                (5, Step::Confirm("t/a", 0, 42)),
                (50, Step::Exit("t/a", 0, 1)),
                (51, Step::Exit("t/a", 0, 2)),
                (52, Step::Confirm("t/a", 0, 43)),
            ],
            &[],
            &["t/a/0 exited Some(1) None"],
        );
    }

    #[test]
    fn retired_members_files_are_deleted_after_the_retention_age() {
        let day = 24 * 3600 * 1000;
        let steps = [
            (0, Step::Desire(&[("t/a", 0)])),
            (5, Step::Exit("t/a", 0, 0)),
            (10, Step::Desire(&[])),
        ];
        let mut before = Vec::from(steps);
        before.push((10 + 7 * day - 1, Step::Timeout));
        check(&before, &[], &[]);
        let mut at = Vec::from(steps);
        at.push((10 + 7 * day, Step::Timeout));
        check(&at, &["delete t/a/0"], &[]);
    }

    #[test]
    fn retention_counts_keep_the_newest_files_and_records() {
        let retention = Retention {
            files_max_age_ms: u64::MAX,
            files_max_count: 2,
            records_max_count: 3,
        };
        let mut core = JobRunnerCore::new(retention);
        let mut deleted = Vec::new();
        for member in 0..5u16 {
            let now = u64::from(member) * 10;
            core.set_desired(&[launch("t/a", member)], now);
            core.observe(
                &key("t/a", member),
                Observed::FailedToStart("x".into()),
                now + 1,
            );
            for action in core.set_desired(&[], now + 2) {
                if let Action::DeleteFiles { key } = action {
                    deleted.push(key.member);
                }
            }
        }
        assert_eq!(deleted, vec![0, 1, 2], "files of all but the 2 newest");
        let remembered: Vec<u16> = core.records().map(|r| r.key.member).collect();
        assert_eq!(remembered, vec![2, 3, 4], "the 3 newest records");
        // A remembered key is still never started again.
        assert!(core.set_desired(&[launch("t/a", 4)], 100).is_empty());
    }

    #[test]
    fn poll_timeout_is_the_next_kill_or_file_deletion() {
        let mut core = JobRunnerCore::new(Retention::default());
        assert_eq!(core.poll_timeout(), None);
        core.set_desired(&[launch("t/a", 0)], 0);
        core.observe(
            &key("t/a", 0),
            Observed::Running {
                member: pid(1),
                started_unix: 0,
            },
            0,
        );
        assert_eq!(core.poll_timeout(), None);
        core.set_desired(&[], 500);
        assert_eq!(core.poll_timeout(), Some(1500));
    }

    #[test]
    fn restored_records_continue_where_they_were() {
        let mut core = JobRunnerCore::new(Retention::default());
        core.set_desired(&[launch("t/a", 0)], 0);
        core.supervisor_spawned(&key("t/a", 0), pid(900));
        core.observe(
            &key("t/a", 0),
            Observed::Running {
                member: pid(901),
                started_unix: 0,
            },
            1,
        );
        core.set_desired(&[], 100);
        let json = serde_json::to_string(&core.records().collect::<Vec<_>>()).expect("json");
        let records: Vec<MemberRecord> = serde_json::from_str(&json).expect("parses");
        let mut restored = JobRunnerCore::restore(records, Retention::default());
        assert_eq!(restored.statuses(), core.statuses());
        // The SIGKILL deadline survived the restart.
        assert_eq!(
            restored.handle_timeout(1100),
            vec![Action::Kill {
                key: key("t/a", 0),
                member: pid(901)
            }]
        );
        // And a repeated desired state after the restart starts nothing.
        assert!(restored.set_desired(&[launch("t/a", 0)], 1200).is_empty());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            /// A desired state listing these keys (indices into a small universe).
            Desire(Vec<usize>),
            /// The shell carries out the pending start of a key (spawned and confirmed,
            /// or failed).
            Confirm(usize, bool),
            Exit(usize),
            /// Time passes and timeouts are handled.
            Tick(u64),
            /// The agent restarts: the core is rebuilt from its persisted records.
            /// Whether the crash came before the shell recorded a pending supervisor.
            Restart,
        }

        fn universe() -> Vec<JobLaunch> {
            let mut all = Vec::new();
            for job in ["t/a", "t/b", "u/a"] {
                for attempt in 1..=2 {
                    for member in 0..2 {
                        all.push(JobLaunch {
                            attempt,
                            ..launch(job, member)
                        });
                    }
                }
            }
            all
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                3 => proptest::collection::vec(0usize..12, 0..6).prop_map(Op::Desire),
                3 => (0usize..12, any::<bool>()).prop_map(|(k, ok)| Op::Confirm(k, ok)),
                2 => (0usize..12).prop_map(Op::Exit),
                2 => (0u64..3000).prop_map(Op::Tick),
                1 => Just(Op::Restart),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn no_key_is_ever_started_twice(ops in proptest::collection::vec(op(), 1..80)) {
                let universe = universe();
                let mut core = JobRunnerCore::new(Retention::default());
                let mut now = 0u64;
                let mut started: BTreeSet<MemberKey> = BTreeSet::new();
                let mut exited: BTreeMap<MemberKey, i32> = BTreeMap::new();
                let mut desired: BTreeSet<MemberKey> = BTreeSet::new();
                let mut terminated: BTreeSet<MemberKey> = BTreeSet::new();
                let mut pid = 100u32;
                for op in ops {
                    now += 1;
                    let actions = match op {
                        Op::Desire(indices) => {
                            let launches: Vec<JobLaunch> =
                                indices.iter().map(|i| universe[*i].clone()).collect();
                            desired = launches.iter().map(MemberKey::of).collect();
                            core.set_desired(&launches, now)
                        }
                        Op::Confirm(index, ok) => {
                            let key = MemberKey::of(&universe[index]);
                            let starting = core
                                .member(&key)
                                .is_some_and(|r| matches!(r.phase, Phase::Starting { .. }));
                            if !starting {
                                continue;
                            }
                            pid += 1;
                            core.supervisor_spawned(&key, ProcessRef { pid, start_ticks: None });
                            let observed = if ok {
                                Observed::Running {
                                    member: ProcessRef { pid: pid + 1, start_ticks: None },
                                    started_unix: now / 1000,
                                }
                            } else {
                                Observed::FailedToStart("nope".into())
                            };
                            core.observe(&key, observed, now)
                        }
                        Op::Exit(index) => {
                            let key = MemberKey::of(&universe[index]);
                            let code = index as i32;
                            let actions = core.observe(
                                &key,
                                Observed::Exited { code: Some(code), signal: None, finished_unix: now / 1000 },
                                now,
                            );
                            if core.member(&key).is_some_and(|r| r.phase == Phase::Exited { code: Some(code), signal: None, finished_unix: now / 1000 }) {
                                exited.entry(key).or_insert(code);
                            }
                            actions
                        }
                        Op::Tick(ms) => {
                            now += ms;
                            core.handle_timeout(now)
                        }
                        Op::Restart => {
                            let json = serde_json::to_string(&core.records().collect::<Vec<_>>())
                                .map_err(|e| TestCaseError::fail(e.to_string()))?;
                            let records: Vec<MemberRecord> = serde_json::from_str(&json)
                                .map_err(|e| TestCaseError::fail(e.to_string()))?;
                            core = JobRunnerCore::restore(records, Retention::default());
                            Vec::new()
                        }
                    };
                    for action in &actions {
                        match action {
                            Action::Start(launch) => {
                                let key = MemberKey::of(launch);
                                prop_assert!(started.insert(key.clone()), "{key} started twice");
                                prop_assert!(desired.contains(&key), "{key} started but not desired");
                            }
                            Action::Terminate { key, .. } => {
                                prop_assert!(!desired.contains(key), "{key} stopped while desired");
                                prop_assert!(terminated.insert(key.clone()), "{key} terminated twice");
                            }
                            // A stop once begun is finished, even if the key is listed
                            // again meanwhile (it is never restarted either).
                            Action::Kill { key, .. } => {
                                prop_assert!(terminated.contains(key), "{key} killed before SIGTERM");
                            }
                            Action::DeleteFiles { key } => {
                                prop_assert!(!desired.contains(key), "{key}'s files deleted while desired");
                            }
                        }
                    }
                    // No exit status is lost: a desired member that exited reports its
                    // first exit code; every reported member is desired or still live.
                    for status in core.statuses() {
                        let key = MemberKey { job: status.job.clone(), attempt: status.attempt, member: status.member };
                        let live = matches!(status.state, MemberState::Running { .. } | MemberState::Stopping { .. });
                        prop_assert!(desired.contains(&key) || live, "{key} reported but neither desired nor live");
                    }
                    for (key, code) in &exited {
                        if desired.contains(key) {
                            let reported = core.statuses().into_iter().find(|s| s.job == key.job && s.attempt == key.attempt && s.member == key.member);
                            prop_assert!(
                                matches!(reported, Some(JobMemberStatus { state: MemberState::Exited { code: Some(c), .. }, .. }) if c == *code),
                                "{key} exited with {code} but reports {reported:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
