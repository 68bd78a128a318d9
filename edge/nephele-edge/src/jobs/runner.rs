//! `JobRunner`: the shell around [`JobRunnerCore`]. One driver thread owns the core's
//! mutations and carries out its actions: it spawns supervisors, signals process
//! groups, reads status files and writes the state file. Every step is blocking IO
//! (fork and exec, fsync'd writes, /proc reads), so it runs on a thread of its own and
//! never on the agent's async workers, which serve inference.
//!
//! Each pass of the driver: apply the newest desired state if one came (older ones
//! still queued are skipped: the state is level-triggered), look at every live
//! member's status file and processes, handle the core's timeouts. It wakes every
//! `poll_interval` while any member is live, else at the core's next timeout.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use nephele_proto::{ErrorCode, ErrorFrame, JobLaunch, JobMemberStatus};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use super::core::{
    Action, JobRunnerCore, MemberKey, MemberRecord, Observed, Phase, ProcessRef, Retention,
};
use super::files::{
    base_env, boot_id, member_env, process_alive, process_ref, signal_group, unix_now_ms,
    JobLayout, SupervisorStatus,
};
use super::supervisor::SupervisorCommand;

/// Most bytes one `JobLogs` answer carries (well inside one frame).
pub const MAX_LOG_CHUNK: u32 = 1024 * 1024;

/// How long a start may stay unconfirmed when the agent restarted between recording
/// it and recording its supervisor: the supervisor, if it was spawned at all, has
/// written its status long before.
const UNRECORDED_START_TIMEOUT_MS: u64 = 10_000;

/// How long the driver waits for a new supervisor's first status before leaving the
/// member to the periodic poll.
const FIRST_STATUS_WAIT: Duration = Duration::from_secs(5);

pub struct JobRunnerConfig {
    /// The agent's data dir; everything goes under `jobs/` in it.
    pub data_dir: PathBuf,
    pub supervisor: SupervisorCommand,
    pub poll_interval: Duration,
    pub retention: Retention,
    /// The environment members inherit, before secrets are removed from it.
    pub agent_env: Vec<(OsString, OsString)>,
}

impl JobRunnerConfig {
    /// Defaults: poll every 200 ms, [`Retention::default`], this process's environment.
    pub fn new(data_dir: &Path, supervisor: SupervisorCommand) -> JobRunnerConfig {
        JobRunnerConfig {
            data_dir: data_dir.to_path_buf(),
            supervisor,
            poll_interval: Duration::from_millis(200),
            retention: Retention::default(),
            agent_env: std::env::vars_os().collect(),
        }
    }
}

/// The state file's content.
#[derive(Debug, Serialize, Deserialize)]
struct PersistedState {
    version: u32,
    /// The boot the records' processes belong to.
    boot_id: Option<String>,
    members: Vec<MemberRecord>,
}

const STATE_VERSION: u32 = 1;

/// Part of a member's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    pub data: Vec<u8>,
    /// Size of the whole log so far.
    pub size: u64,
    /// The member is over: the log will not grow.
    pub finished: bool,
}

struct Shared {
    core: Mutex<JobRunnerCore>,
    layout: JobLayout,
    boot_id: Option<String>,
    retention: Retention,
}

/// The job runner of a pool agent. Dropping it stops its driver, not its members: they
/// run on under their supervisors, and the next runner on the same data dir adopts them.
pub struct JobRunner {
    shared: Arc<Shared>,
    commands: Option<mpsc::Sender<Vec<JobLaunch>>>,
    driver: Option<std::thread::JoinHandle<()>>,
}

impl JobRunner {
    /// Loads the state file, reads what became of the members it lists (adopting those
    /// still running, taking the outcome of those that ended meanwhile), and starts
    /// the driver. Nothing is started or stopped before the first desired state.
    pub fn start(config: JobRunnerConfig) -> Result<JobRunner> {
        let layout = JobLayout::new(&config.data_dir)
            .with_context(|| format!("bad data dir {}", config.data_dir.display()))?;
        std::fs::create_dir_all(layout.root())
            .with_context(|| format!("cannot create {}", layout.root().display()))?;
        let state_file = layout.state_file();
        let (records, recorded_boot) = match std::fs::read(&state_file) {
            Ok(bytes) => {
                let state: PersistedState = serde_json::from_slice(&bytes).with_context(|| {
                    format!(
                        "{} is not a job state file this agent can read; move it away to start without the record of this node's job members (they would not be adopted)",
                        state_file.display()
                    )
                })?;
                if state.version != STATE_VERSION {
                    bail!(
                        "{} has version {}, this agent reads {STATE_VERSION}",
                        state_file.display(),
                        state.version
                    );
                }
                (state.members, state.boot_id)
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => (Vec::new(), None),
            Err(error) => {
                return Err(error).with_context(|| format!("cannot read {}", state_file.display()))
            }
        };
        let boot_id = boot_id();
        // After a reboot no recorded process can be running, whatever its pid now is.
        let rebooted = recorded_boot.is_some() && boot_id.is_some() && recorded_boot != boot_id;
        let shared = Arc::new(Shared {
            core: Mutex::new(JobRunnerCore::restore(records, config.retention)),
            layout,
            boot_id,
            retention: config.retention,
        });
        let mut driver = Driver {
            shared: shared.clone(),
            supervisor: config.supervisor,
            base_env: base_env(config.agent_env),
            poll_interval: config.poll_interval,
            children: HashMap::new(),
            persisted_revision: None,
        };
        // Written now, so that a fresh data dir has a state file and the boot id moves on.
        driver
            .persist_now()
            .with_context(|| format!("cannot write {}", shared.layout.state_file().display()))?;
        driver.poll(rebooted);
        let (commands, receiver) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("nephele-jobs".into())
            .spawn(move || driver.run(receiver))
            .context("cannot start the job runner thread")?;
        Ok(JobRunner {
            shared,
            commands: Some(commands),
            driver: Some(handle),
        })
    }

    /// Hands the runner the `jobs` of a desired state. Returns at once; the driver
    /// applies the newest one it has.
    pub fn set_desired(&self, launches: Vec<JobLaunch>) {
        if let Some(commands) = &self.commands {
            let _ = commands.send(launches);
        }
    }

    /// What to report in a heartbeat or Hello (recently retired members included).
    pub fn statuses(&self) -> Vec<JobMemberStatus> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.shared
            .core
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .statuses_at(now_ms)
    }

    /// Bytes `[offset, offset + max_bytes)` of a member's log (`max_bytes` capped at
    /// [`MAX_LOG_CHUNK`]). Blocking file IO: call it off the async workers.
    pub fn read_log(
        &self,
        job: &str,
        attempt: u32,
        member: u16,
        offset: u64,
        max_bytes: u32,
    ) -> Result<LogChunk, ErrorFrame> {
        let key = MemberKey {
            job: job.to_string(),
            attempt,
            member,
        };
        // Whether it is finished is read before the log: a log read after the member
        // was seen finished is complete, so `finished` never hides a tail.
        let (finished, files_kept) = {
            let core = self.shared.core.lock().unwrap_or_else(|p| p.into_inner());
            match core.member(&key) {
                Some(record) => (record.phase.is_finished(), record.files_kept),
                None => {
                    return Err(ErrorFrame::new(
                        ErrorCode::NotFound,
                        format!(
                            "this node has no member {member} of attempt {attempt} of job {job}"
                        ),
                    ))
                }
            }
        };
        if !files_kept {
            return Err(ErrorFrame::new(
                ErrorCode::NotFound,
                format!(
                    "the log of member {member} of attempt {attempt} of job {job} was deleted (logs of finished members are kept {} h, at most {})",
                    self.shared.retention.files_max_age_ms / (3600 * 1000),
                    self.shared.retention.files_max_count
                ),
            ));
        }
        let path = self.shared.layout.log_file(&key);
        let mut file = match std::fs::File::open(&path) {
            Ok(file) => file,
            // Not started yet, or it failed before its log was opened.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(LogChunk {
                    data: Vec::new(),
                    size: 0,
                    finished,
                })
            }
            Err(error) => {
                return Err(ErrorFrame::new(
                    ErrorCode::Internal,
                    format!("cannot read the log of {key}: {error}"),
                ))
            }
        };
        let io_error = |error: std::io::Error| {
            ErrorFrame::new(
                ErrorCode::Internal,
                format!("cannot read the log of {key}: {error}"),
            )
        };
        let size = file.metadata().map_err(io_error)?.len();
        let want = u64::from(max_bytes.min(MAX_LOG_CHUNK)).min(size.saturating_sub(offset));
        let mut data = Vec::with_capacity(want as usize);
        if want > 0 {
            file.seek(SeekFrom::Start(offset)).map_err(io_error)?;
            file.take(want).read_to_end(&mut data).map_err(io_error)?;
        }
        Ok(LogChunk {
            data,
            size,
            finished,
        })
    }
}

impl Drop for JobRunner {
    fn drop(&mut self) {
        // Closing the channel ends the driver at its next wait.
        self.commands = None;
        if let Some(driver) = self.driver.take() {
            let _ = driver.join();
        }
    }
}

struct Driver {
    shared: Arc<Shared>,
    supervisor: SupervisorCommand,
    /// The agent's environment without secrets.
    base_env: Vec<(OsString, OsString)>,
    poll_interval: Duration,
    /// Supervisors this runner spawned, to reap them when they end.
    children: HashMap<MemberKey, Child>,
    persisted_revision: Option<u64>,
}

impl Driver {
    fn run(mut self, commands: mpsc::Receiver<Vec<JobLaunch>>) {
        loop {
            match commands.recv_timeout(self.next_wait()) {
                Ok(mut launches) => {
                    while let Ok(newer) = commands.try_recv() {
                        launches = newer;
                    }
                    let actions = self.update(|core, now| core.set_desired(&launches, now));
                    self.carry_out(actions);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            self.poll(false);
            let actions = self.update(|core, now| core.handle_timeout(now));
            self.carry_out(actions);
        }
    }

    fn next_wait(&self) -> Duration {
        let core = self.shared.core.lock().unwrap_or_else(|p| p.into_inner());
        let any_live = core.records().any(|r| !r.phase.is_finished());
        let until_timeout = core
            .poll_timeout()
            .map(|at| Duration::from_millis(at.saturating_sub(unix_now_ms())));
        let idle = if any_live {
            self.poll_interval
        } else {
            Duration::from_secs(60)
        };
        until_timeout.map_or(idle, |t| t.min(idle))
    }

    /// Runs `change` on the core and persists the records if it changed them, before
    /// its actions are returned to be carried out. When they cannot be persisted, its
    /// starts are refused (a start that is not on disk could be repeated by the next
    /// agent).
    fn update(
        &mut self,
        change: impl FnOnce(&mut JobRunnerCore, u64) -> Vec<Action>,
    ) -> Vec<Action> {
        let actions = {
            let mut core = self.shared.core.lock().unwrap_or_else(|p| p.into_inner());
            change(&mut core, unix_now_ms())
        };
        match self.persist() {
            Ok(()) => actions,
            Err(error) => {
                let state_file = self.shared.layout.state_file();
                tracing::error!(file = %state_file.display(), %error, "cannot write the job state");
                let message = format!(
                    "cannot record the start in {}: {error}; not started",
                    state_file.display()
                );
                let mut kept = Vec::new();
                for action in actions {
                    match action {
                        Action::Start(launch) => {
                            let key = MemberKey::of(&launch);
                            let mut core =
                                self.shared.core.lock().unwrap_or_else(|p| p.into_inner());
                            kept.extend(core.observe(
                                &key,
                                Observed::FailedToStart(message.clone()),
                                unix_now_ms(),
                            ));
                        }
                        other => kept.push(other),
                    }
                }
                let _ = self.persist();
                kept
            }
        }
    }

    fn persist(&mut self) -> std::io::Result<()> {
        let revision = self
            .shared
            .core
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .revision();
        if self.persisted_revision == Some(revision) {
            return Ok(());
        }
        self.persist_now()
    }

    fn persist_now(&mut self) -> std::io::Result<()> {
        let (revision, state) = {
            let core = self.shared.core.lock().unwrap_or_else(|p| p.into_inner());
            (
                core.revision(),
                PersistedState {
                    version: STATE_VERSION,
                    boot_id: self.shared.boot_id.clone(),
                    members: core.records().cloned().collect(),
                },
            )
        };
        let bytes = serde_json::to_vec_pretty(&state).map_err(std::io::Error::other)?;
        super::files::write_atomic(&self.shared.layout.state_file(), &bytes)?;
        self.persisted_revision = Some(revision);
        Ok(())
    }

    fn carry_out(&mut self, actions: Vec<Action>) {
        let mut queue = VecDeque::from(actions);
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Start(launch) => queue.extend(self.start_member(&launch)),
                Action::Terminate { key, member } => {
                    let sent = signal_group(&member, Signal::SIGTERM);
                    tracing::info!(member = %key, pid = member.pid, sent, "stopping job member (SIGTERM)");
                }
                Action::Kill { key, member } => {
                    let sent = signal_group(&member, Signal::SIGKILL);
                    tracing::warn!(member = %key, pid = member.pid, sent, "job member outlived its grace period (SIGKILL)");
                }
                Action::DeleteFiles { key } => {
                    if let Err(error) = self.shared.layout.delete_member_files(&key) {
                        tracing::warn!(member = %key, %error, "cannot delete a finished job member's files");
                    }
                }
            }
        }
    }

    /// Starts a member the core recorded as `Starting`, waits briefly for its
    /// supervisor's first word, and returns what the core makes of it.
    fn start_member(&mut self, launch: &JobLaunch) -> Vec<Action> {
        let key = MemberKey::of(launch);
        let mut child = match self.spawn_supervisor(&key, launch) {
            Ok(child) => child,
            Err(error) => return self.apply(&key, Observed::FailedToStart(error)),
        };
        let supervisor = process_ref(child.id());
        let mut actions = self.update(|core, _| {
            core.supervisor_spawned(&key, supervisor);
            Vec::new()
        });
        let first = self.await_first_status(&key, &mut child);
        self.children.insert(key.clone(), child);
        // Without a first status the poll takes over; until then the member is not
        // reported.
        if let Some(observed) = first {
            actions.extend(self.apply(&key, observed));
        }
        actions
    }

    fn apply(&mut self, key: &MemberKey, observed: Observed) -> Vec<Action> {
        match &observed {
            Observed::Running { member, .. } => {
                tracing::info!(member = %key, pid = member.pid, "job member running")
            }
            Observed::Exited { code, signal, .. } => {
                tracing::info!(member = %key, ?code, ?signal, "job member exited")
            }
            Observed::FailedToStart(error) => {
                tracing::warn!(member = %key, %error, "job member failed to start")
            }
        }
        let key = key.clone();
        self.update(move |core, now| core.observe(&key, observed, now))
    }

    /// Prepares the member's directories and environment and spawns its supervisor.
    /// Every refusal is the `FailedToStart` reason the control plane will see.
    fn spawn_supervisor(&self, key: &MemberKey, launch: &JobLaunch) -> Result<Child, String> {
        if launch.argv.first().is_none_or(|program| program.is_empty()) {
            return Err("empty command".into());
        }
        let layout = &self.shared.layout;
        let attempt_dir = layout.attempt_dir(key);
        std::fs::create_dir_all(&attempt_dir)
            .map_err(|e| format!("cannot create {}: {e}", attempt_dir.display()))?;
        let status_file = layout.status_file(key);
        // A status left by an earlier run of this key (forgotten past the retention)
        // must not be read as this run's.
        let _ = std::fs::remove_file(&status_file);
        let own_dir = layout.work_dir(key);
        // A relative directory stays inside the member's own, whatever the control
        // plane let through (its API refuses `..` too).
        let relative = Path::new(&launch.working_dir);
        if !relative.is_absolute()
            && relative
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(format!(
                "working directory {:?} climbs out of the member's own directory (`..`); refused",
                launch.working_dir
            ));
        }
        let work_dir = if launch.working_dir.is_empty() {
            own_dir
        } else {
            // Absolute: the operator's choice. Relative: inside the member's own.
            own_dir.join(&launch.working_dir)
        };
        if launch.working_dir.is_empty() || !Path::new(&launch.working_dir).is_absolute() {
            std::fs::create_dir_all(&work_dir)
                .map_err(|e| format!("cannot create {}: {e}", work_dir.display()))?;
        }
        match std::fs::metadata(&work_dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "working directory {} is not a directory",
                    work_dir.display()
                ))
            }
            Err(e) => return Err(format!("working directory {}: {e}", work_dir.display())),
        }
        let env = member_env(&self.base_env, &launch.env)?;
        let checkpoint = env
            .iter()
            .rev()
            .find(|(name, _)| name == "NEPHELE_CHECKPOINT_DIR")
            .map(|(_, value)| value.clone())
            .filter(|value| !value.is_empty());
        if let Some(checkpoint) = checkpoint {
            let checkpoint = work_dir.join(checkpoint);
            std::fs::create_dir_all(&checkpoint).map_err(|e| {
                format!(
                    "cannot create the checkpoint directory {}: {e}",
                    checkpoint.display()
                )
            })?;
        }
        let mut command =
            self.supervisor
                .command(&status_file, &layout.log_file(key), &launch.argv);
        command
            .current_dir(&work_dir)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group: a signal meant for the agent's group (a terminal's ^C,
            // a service manager stopping the agent) does not stop the members.
            .process_group(0);
        tracing::info!(member = %key, argv = ?launch.argv, dir = %work_dir.display(), "starting job member");
        command.spawn().map_err(|e| {
            format!(
                "cannot start the job supervisor {}: {e}",
                self.supervisor.program.display()
            )
        })
    }

    /// The supervisor's first status, or its exit without one; `None` if it said nothing
    /// within [`FIRST_STATUS_WAIT`].
    fn await_first_status(&self, key: &MemberKey, child: &mut Child) -> Option<Observed> {
        let status_file = self.shared.layout.status_file(key);
        let deadline = Instant::now() + FIRST_STATUS_WAIT;
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(status) = SupervisorStatus::read(&status_file) {
                return Some(observed(status));
            }
            if let Ok(Some(exit)) = child.try_wait() {
                return Some(match SupervisorStatus::read(&status_file) {
                    Some(status) => observed(status),
                    None => Observed::FailedToStart(format!(
                        "its supervisor ended ({exit}) before starting it"
                    )),
                });
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Looks at every live member: its status file, and whether its supervisor and
    /// the member itself still exist. `rebooted`: none of them can.
    fn poll(&mut self, rebooted: bool) {
        let live: Vec<(MemberKey, Phase, Option<ProcessRef>)> = {
            let core = self.shared.core.lock().unwrap_or_else(|p| p.into_inner());
            core.records()
                .filter(|r| !r.phase.is_finished())
                .map(|r| (r.key.clone(), r.phase.clone(), r.supervisor))
                .collect()
        };
        for (key, phase, supervisor) in live {
            if let Some(observed) = self.look(&key, &phase, supervisor, rebooted) {
                let actions = self.apply(&key, observed);
                self.carry_out(actions);
            }
        }
        // Reap supervisors whose members are over.
        self.children
            .retain(|_, child| matches!(child.try_wait(), Ok(None)));
    }

    fn look(
        &mut self,
        key: &MemberKey,
        phase: &Phase,
        supervisor: Option<ProcessRef>,
        rebooted: bool,
    ) -> Option<Observed> {
        let status_file = self.shared.layout.status_file(key);
        let status = SupervisorStatus::read(&status_file);
        match &status {
            Some(status) if status.is_final() => return Some(observed(status.clone())),
            Some(status) if matches!(phase, Phase::Starting { .. }) && !rebooted => {
                return Some(observed(status.clone()))
            }
            _ => {}
        }
        let supervisor_alive = !rebooted
            && match self.children.get_mut(key) {
                Some(child) => matches!(child.try_wait(), Ok(None)),
                None => supervisor.as_ref().is_some_and(process_alive),
            };
        let member_alive = !rebooted
            && match phase {
                Phase::Running { member, .. } | Phase::Stopping { member, .. } => {
                    process_alive(member)
                }
                _ => false,
            };
        // A member whose supervisor was killed runs on: it is still stopped through
        // its group, and found gone when it ends (its status then lost).
        if supervisor_alive || member_alive {
            return None;
        }
        // Both gone: the supervisor may have written its last word just before.
        if let Some(status) = SupervisorStatus::read(&status_file).filter(|s| s.is_final()) {
            return Some(observed(status));
        }
        let now = unix_now_ms();
        // Whether the member ever ran: then it ended without a recorded status.
        let ran = !matches!(phase, Phase::Starting { .. })
            || matches!(status, Some(SupervisorStatus::Running { .. }));
        match phase {
            Phase::Starting { since_ms } if !ran && supervisor.is_none() => {
                if !rebooted && now.saturating_sub(*since_ms) < UNRECORDED_START_TIMEOUT_MS {
                    return None;
                }
                Some(Observed::FailedToStart(
                    "the agent stopped while starting this member; it was not started again".into(),
                ))
            }
            Phase::Starting { .. } if !ran => Some(Observed::FailedToStart(if rebooted {
                "the node restarted before this member started".into()
            } else {
                "its supervisor ended before starting it".into()
            })),
            _ => {
                tracing::warn!(member = %key, rebooted, "job member and its supervisor are gone without an exit status");
                Some(Observed::Exited {
                    code: None,
                    signal: None,
                    finished_unix: now / 1000,
                })
            }
        }
    }
}

fn observed(status: SupervisorStatus) -> Observed {
    match status {
        SupervisorStatus::Running {
            pid,
            start_ticks,
            started_unix,
        } => Observed::Running {
            member: ProcessRef { pid, start_ticks },
            started_unix,
        },
        SupervisorStatus::Exited {
            code,
            signal,
            finished_unix,
        } => Observed::Exited {
            code,
            signal,
            finished_unix,
        },
        SupervisorStatus::FailedToStart { error } => Observed::FailedToStart(error),
    }
}
