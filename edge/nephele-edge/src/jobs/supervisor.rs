//! The supervisor: this same binary, re-executed as
//!
//! ```text
//! <agent program> [<args before `run`>] supervise --status FILE --log FILE -- ARGV…
//! ```
//!
//! in the member's working directory and environment, in a process group of its own.
//! It starts ARGV in another new process group (whose id is the member's pid), with
//! stdout and stderr appended to the log and stdin empty; forwards SIGTERM and SIGINT
//! it receives to that group; and when the member ends, SIGKILLs what the member left
//! behind in its group and writes the exit status to the status file. The status file
//! is written atomically, twice: `running` (pid, start time) once the member runs, then
//! `exited` (code or signal) or `failed_to_start` (the OS error). It outlives the agent,
//! so a restarted agent reads what became of its members from these files.
//!
//! Signals are caught with handlers (tokio's, on a single-threaded runtime), installed
//! before the member is spawned so that none is missed. Handlers, unlike a blocked
//! signal mask, do not pass to the member: exec resets them to the default, and the
//! supervisor unblocks every signal first, so the member starts with none blocked
//! whatever the agent's thread had.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result};
use nix::sys::signal::{SigSet, Signal};
use tokio::signal::unix::{signal, SignalKind};

use super::files::{process_ref, SupervisorStatus};

/// The hidden `supervise` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct SuperviseArgs {
    /// Where to write the member's status (JSON, atomically).
    #[arg(long)]
    pub status: PathBuf,
    /// Where to append the member's stdout and stderr.
    #[arg(long)]
    pub log: PathBuf,
    /// The member's program and arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// How to re-execute this binary as a supervisor: the program and the arguments that
/// come before the `supervise` subcommand (`[]` for `nephele-edge`, `["edge"]` for
/// `nephele edge`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisorCommand {
    pub program: PathBuf,
    pub prefix: Vec<OsString>,
}

impl SupervisorCommand {
    /// From how the agent was invoked: `args` is the whole command line (program
    /// first); the arguments between the program and `run` are the prefix.
    pub fn from_invocation(program: PathBuf, args: &[OsString]) -> SupervisorCommand {
        let after_program = args.get(1..).unwrap_or_default();
        let prefix = after_program
            .iter()
            .position(|arg| arg == "run")
            .map(|run| after_program[..run].to_vec())
            .unwrap_or_default();
        SupervisorCommand { program, prefix }
    }

    /// For this process, which must be the agent started with `… run …`.
    pub fn current() -> Result<SupervisorCommand> {
        let program = std::env::current_exe()
            .context("cannot find this program's path to start job supervisors")?;
        let args: Vec<OsString> = std::env::args_os().collect();
        Ok(SupervisorCommand::from_invocation(program, &args))
    }

    /// The command that supervises `argv`, writing to `status` and `log`.
    pub fn command(
        &self,
        status: &std::path::Path,
        log: &std::path::Path,
        argv: &[String],
    ) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.prefix)
            .arg("supervise")
            .arg("--status")
            .arg(status)
            .arg("--log")
            .arg(log)
            .arg("--")
            .args(argv);
        command
    }
}

/// Whether the member has ended, without reaping it (Linux `waitid` with `WNOWAIT`).
#[cfg(target_os = "linux")]
fn ended_unreaped(member: nix::unistd::Pid) -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    matches!(
        waitid(Id::Pid(member), flags),
        Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..))
    )
}

/// Elsewhere the group is killed after the member is reaped.
#[cfg(not(target_os = "linux"))]
fn ended_unreaped(_member: nix::unistd::Pid) -> bool {
    false
}

fn unix_now() -> u64 {
    super::files::unix_now_ms() / 1000
}

/// Runs the supervisor (blocking, on a runtime of its own) until the member ends.
pub fn supervise(args: &SuperviseArgs) -> Result<()> {
    // A mask is inherited across exec: the member must not start with signals blocked.
    SigSet::all()
        .thread_unblock()
        .context("cannot unblock signals in the supervisor")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the supervisor's runtime")?;
    runtime.block_on(supervise_member(args))
}

async fn supervise_member(args: &SuperviseArgs) -> Result<()> {
    let mut terminate = signal(SignalKind::terminate()).context("cannot catch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot catch SIGINT")?;
    let mut child_ended = signal(SignalKind::child()).context("cannot catch SIGCHLD")?;

    let fail = |error: String| -> Result<()> {
        SupervisorStatus::FailedToStart {
            error: error.clone(),
        }
        .write(&args.status)
        .with_context(|| format!("cannot write {}", args.status.display()))?;
        Ok(())
    };
    let log = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)
    {
        Ok(log) => log,
        Err(error) => {
            return fail(format!(
                "cannot open the log {}: {error}",
                args.log.display()
            ))
        }
    };
    let Some((program, rest)) = args.command.split_first() else {
        return fail("empty command".into());
    };
    let (stdout, stderr) = match (log.try_clone(), log.try_clone()) {
        (Ok(stdout), Ok(stderr)) => (stdout, stderr),
        (Err(error), _) | (_, Err(error)) => {
            return fail(format!(
                "cannot open the log {}: {error}",
                args.log.display()
            ))
        }
    };
    let spawned = Command::new(program)
        .args(rest)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
            let message = format!("cannot run {}: {error}", program.to_string_lossy());
            let _ = writeln!(&log, "nephele: {message}");
            return fail(message);
        }
    };
    let member = process_ref(child.id());
    let group = nix::unistd::Pid::from_raw(i32::try_from(member.pid).unwrap_or(i32::MAX));
    let running = SupervisorStatus::Running {
        pid: member.pid,
        start_ticks: member.start_ticks,
        started_unix: unix_now(),
    };
    if let Err(error) = running.write(&args.status) {
        // Nobody could learn of this member: it must not run unseen.
        let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
        let _ = child.wait();
        return Err(error).with_context(|| format!("cannot write {}", args.status.display()));
    }

    // SIGCHLD wakes the loop when the member ends; the periodic look is a safeguard
    // that costs nothing.
    let mut safeguard = tokio::time::interval(std::time::Duration::from_secs(1));
    let exit = loop {
        tokio::select! {
            Some(()) = terminate.recv() => {
                let _ = nix::sys::signal::killpg(group, Signal::SIGTERM);
            }
            Some(()) = interrupt.recv() => {
                let _ = nix::sys::signal::killpg(group, Signal::SIGINT);
            }
            Some(()) = child_ended.recv() => {}
            _ = safeguard.tick() => {}
        }
        // What the member started in its group ends with it, as it would in a
        // container: killed while the member is a zombie, so its pid (the group's id)
        // cannot have been reused yet.
        if ended_unreaped(group) {
            let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
        }
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(error) => {
                // Cannot happen for our own child; do not spin if it does.
                let _ = writeln!(&log, "nephele: waiting for the member failed: {error}");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    };
    #[cfg(not(target_os = "linux"))]
    let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
    let exited = SupervisorStatus::Exited {
        code: exit.code(),
        signal: exit.signal(),
        finished_unix: unix_now(),
    };
    let mut last_error = None;
    for _ in 0..5 {
        match exited.write(&args.status) {
            Ok(()) => return Ok(()),
            Err(error) => last_error = Some(error),
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    Err(anyhow::anyhow!(
        "cannot write {}: {}",
        args.status.display(),
        last_error.map(|e| e.to_string()).unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_supervisor_prefix_is_what_came_before_run() {
        fn check(args: &[&str], expected: &[&str]) {
            let args: Vec<OsString> = args.iter().map(OsString::from).collect();
            let command = SupervisorCommand::from_invocation("/bin/agent".into(), &args);
            let expected: Vec<OsString> = expected.iter().map(OsString::from).collect();
            assert_eq!(command.prefix, expected, "{args:?}");
        }
        check(&["nephele-edge", "run", "--data-dir", "d"], &[]);
        check(&["nephele", "edge", "run", "--listen", "x"], &["edge"]);
        // A `run` that is a value after `run` does not matter: the first one counts.
        check(&["nephele", "edge", "run", "--profile", "run"], &["edge"]);
        check(&["nephele-edge"], &[]);
        check(&[], &[]);
    }
}
