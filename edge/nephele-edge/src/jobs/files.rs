//! What the job runner keeps on disk, and the few facts it reads from the OS.
//!
//! Every path is built from a [`MemberKey`] by [`JobLayout`]: the job name comes from
//! the network, so it is escaped into one path component ([`safe_job_name`]) that can
//! be neither `..` nor absolute nor contain a separator.

use std::ffi::{OsStr, OsString};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::core::{MemberKey, ProcessRef};

/// Paths under `<data_dir>/jobs`.
#[derive(Debug, Clone)]
pub struct JobLayout {
    root: PathBuf,
}

impl JobLayout {
    /// `data_dir` is made absolute: the supervisor runs in the member's working
    /// directory and must still find its log and status file.
    pub fn new(data_dir: &Path) -> std::io::Result<JobLayout> {
        Ok(JobLayout {
            root: std::path::absolute(data_dir)?.join("jobs"),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The runner's persisted records. No job directory can have this name: escaped
    /// names never contain a `.`.
    pub fn state_file(&self) -> PathBuf {
        self.root.join("state.json")
    }

    fn job_dir(&self, key: &MemberKey) -> PathBuf {
        self.root.join(safe_job_name(&key.job))
    }

    /// `jobs/<safe job>/<attempt>/`: holds every file of the attempt's members here.
    pub fn attempt_dir(&self, key: &MemberKey) -> PathBuf {
        self.job_dir(key).join(key.attempt.to_string())
    }

    pub fn log_file(&self, key: &MemberKey) -> PathBuf {
        self.attempt_dir(key)
            .join(format!("member-{}.log", key.member))
    }

    pub fn status_file(&self, key: &MemberKey) -> PathBuf {
        self.attempt_dir(key)
            .join(format!("member-{}.status", key.member))
    }

    /// The member's own working directory, used when its launch names none.
    pub fn work_dir(&self, key: &MemberKey) -> PathBuf {
        self.attempt_dir(key).join(format!("member-{}", key.member))
    }

    /// SIGKILLs the process group of every member whose status file says it runs,
    /// without the agent or the control plane: what tears down a node whose agent is
    /// gone for good (the demo's cleanup). A group is signalled only while its leader
    /// is the process the status file names (same start time), never a reused pid.
    /// Returns how many groups were signalled.
    pub fn kill_running_members(&self) -> usize {
        let mut killed = 0;
        let dirs = |dir: &Path| -> Vec<PathBuf> {
            std::fs::read_dir(dir)
                .map(|entries| entries.flatten().map(|e| e.path()).collect())
                .unwrap_or_default()
        };
        for job in dirs(&self.root).into_iter().filter(|p| p.is_dir()) {
            for attempt in dirs(&job).into_iter().filter(|p| p.is_dir()) {
                for status in dirs(&attempt)
                    .into_iter()
                    .filter(|p| p.extension().is_some_and(|e| e == "status"))
                {
                    if let Some(SupervisorStatus::Running {
                        pid, start_ticks, ..
                    }) = SupervisorStatus::read(&status)
                    {
                        let leader = ProcessRef { pid, start_ticks };
                        if signal_group(&leader, nix::sys::signal::Signal::SIGKILL) {
                            killed += 1;
                        }
                    }
                }
            }
        }
        killed
    }

    /// Deletes a member's log, status file and own working directory, then its attempt
    /// and job directories if that left them empty. Missing files are not an error.
    pub fn delete_member_files(&self, key: &MemberKey) -> std::io::Result<()> {
        for file in [self.log_file(key), self.status_file(key)] {
            match std::fs::remove_file(&file) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
                _ => {}
            }
        }
        match std::fs::remove_dir_all(self.work_dir(key)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        // Fails (and is meant to) while another member still has files there.
        let _ = std::fs::remove_dir(self.attempt_dir(key));
        let _ = std::fs::remove_dir(self.job_dir(key));
        Ok(())
    }
}

/// Longest escaped job name kept whole; longer ones are cut and given a digest suffix
/// so that every path component stays well under the usual 255-byte limit.
const MAX_SAFE_NAME: usize = 120;

/// A job name as one path component: ASCII letters, digits, `-` and `_` as they are,
/// every other byte as `%XX`; the empty name as `%`. Injective (two jobs never share a
/// directory) up to the length cut, past which a sha256 of the whole name keeps them
/// apart. Never `.`, `..`, absolute, or containing a separator.
pub fn safe_job_name(job: &str) -> String {
    if job.is_empty() {
        return "%".into();
    }
    let mut out = String::with_capacity(job.len());
    for byte in job.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    if out.len() > MAX_SAFE_NAME {
        let digest = ring::digest::digest(&ring::digest::SHA256, job.as_bytes());
        let suffix: String = digest.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        // Cut at a character boundary (all characters here are ASCII).
        out.truncate(MAX_SAFE_NAME - 17);
        out.push('~');
        out.push_str(&suffix);
    }
    out
}

/// Writes `bytes` to `path` atomically: a temporary file next to it, flushed to disk,
/// then renamed over it. A reader (or an agent restarted after kill -9) sees the old
/// content or the new, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// What a supervisor writes to its member's status file (JSON, atomically).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SupervisorStatus {
    Running {
        pid: u32,
        start_ticks: Option<u64>,
        started_unix: u64,
    },
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        finished_unix: u64,
    },
    FailedToStart {
        error: String,
    },
}

impl SupervisorStatus {
    pub fn is_final(&self) -> bool {
        !matches!(self, SupervisorStatus::Running { .. })
    }

    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        write_atomic(path, &bytes)
    }

    /// The status in `path`; `None` while there is none (or it cannot be read: the
    /// supervisor writes atomically, so a bad file is not one it wrote).
    pub fn read(path: &Path) -> Option<SupervisorStatus> {
        let bytes = std::fs::read(path).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// Environment variable names that look like they hold a credential. The agent's own
/// join token must not reach a job, nor anything else of the kind it was started with.
const SECRET_MARKERS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "PRIVATE_KEY",
    "API_KEY",
    "ACCESS_KEY",
];

fn looks_secret(name: &OsStr) -> bool {
    let upper = name.to_string_lossy().to_ascii_uppercase();
    SECRET_MARKERS.iter().any(|marker| upper.contains(marker))
}

/// The agent's environment without anything that looks like a credential.
pub fn base_env(
    agent_env: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    agent_env
        .into_iter()
        .filter(|(name, _)| !looks_secret(name))
        .collect()
}

/// A member's whole environment: `base` (already without secrets), then the launch's
/// variables in order, a later one replacing an earlier one of the same name. Refuses
/// a name no process environment can hold.
pub fn member_env(
    base: &[(OsString, OsString)],
    launch: &[(String, String)],
) -> Result<Vec<(OsString, OsString)>, String> {
    let mut env: Vec<(OsString, OsString)> = base.to_vec();
    for (name, value) in launch {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(format!("invalid environment variable name {name:?}"));
        }
        if value.contains('\0') {
            return Err(format!("environment variable {name} contains a NUL byte"));
        }
        let name = OsString::from(name);
        env.retain(|(existing, _)| *existing != name);
        env.push((name, OsString::from(value)));
    }
    Ok(env)
}

/// State and start time of a process from `/proc/<pid>/stat`; `None` where there is
/// no such process (or no /proc).
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields after it
    // start after the last ')'. Field 3 is the state, field 22 the start time.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start_ticks = fields.nth(18)?.parse().ok()?;
    Some((state, start_ticks))
}

fn has_proc() -> bool {
    Path::new("/proc/self/stat").exists()
}

/// A [`ProcessRef`] for a process that exists now.
pub fn process_ref(pid: u32) -> ProcessRef {
    ProcessRef {
        pid,
        start_ticks: proc_stat(pid).map(|(_, start)| start),
    }
}

/// Whether this process still exists, zombie or not: its pid cannot have been reused,
/// so its process group may be signalled.
pub fn process_exists(process: &ProcessRef) -> bool {
    match proc_stat(process.pid) {
        Some((_, start)) => process.start_ticks.is_none_or(|known| known == start),
        None if has_proc() => false,
        None => kill_probe(process.pid),
    }
}

/// Whether this process is alive: it exists and is not a zombie waiting to be reaped.
pub fn process_alive(process: &ProcessRef) -> bool {
    match proc_stat(process.pid) {
        Some((state, start)) => {
            !matches!(state, 'Z' | 'X') && process.start_ticks.is_none_or(|known| known == start)
        }
        None if has_proc() => false,
        None => kill_probe(process.pid),
    }
}

fn kill_probe(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(errno) => errno == nix::errno::Errno::EPERM,
    }
}

/// Sends `signal` to the process group led by `leader` (a member runs in a group of
/// its own), when the leader still exists: a group whose leader is gone is never
/// signalled by number, since that number may belong to someone else by now.
pub fn signal_group(leader: &ProcessRef, signal: nix::sys::signal::Signal) -> bool {
    if !process_exists(leader) {
        return false;
    }
    let Ok(pid) = i32::try_from(leader.pid) else {
        return false;
    };
    if pid <= 1 {
        return false;
    }
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), signal).is_ok()
}

/// This boot's id (Linux), to tell after a restart whether the node rebooted, in which
/// case no recorded process can still be running.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_string())
}

pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_names_become_one_safe_path_component() {
        fn check(job: &str, expected: &str) {
            assert_eq!(safe_job_name(job), expected, "{job:?}");
        }
        check("acme/train-1", "acme%2Ftrain-1");
        check("a_b", "a_b");
        check("..", "%2E%2E");
        check("/etc/passwd", "%2Fetc%2Fpasswd");
        check("../../x", "%2E%2E%2F%2E%2E%2Fx");
        check("", "%");
        check("é", "%C3%A9");
        check("state.json", "state%2Ejson");
    }

    #[test]
    fn long_job_names_are_cut_with_a_digest_and_stay_distinct() {
        let a = safe_job_name(&format!("t/{}", "a".repeat(300)));
        let b = safe_job_name(&format!("t/{}b", "a".repeat(300)));
        assert!(a.len() <= MAX_SAFE_NAME, "{}", a.len());
        assert_ne!(a, b);
        assert!(!a.contains('/') && !a.contains('.'));
    }

    #[test]
    fn member_paths_stay_under_the_jobs_directory() {
        let layout = JobLayout::new(Path::new("/data")).expect("absolute");
        let key = MemberKey {
            job: "../../../etc".into(),
            attempt: 3,
            member: 1,
        };
        for path in [
            layout.log_file(&key),
            layout.status_file(&key),
            layout.work_dir(&key),
        ] {
            assert!(path.starts_with("/data/jobs/"), "{}", path.display());
            assert!(
                path.components()
                    .all(|c| !matches!(c, std::path::Component::ParentDir)),
                "{}",
                path.display()
            );
        }
        assert_eq!(
            layout.log_file(&key),
            Path::new("/data/jobs/%2E%2E%2F%2E%2E%2F%2E%2E%2Fetc/3/member-1.log")
        );
    }

    #[test]
    fn the_member_environment_drops_secrets_then_applies_the_launch_in_order() {
        let agent: Vec<(OsString, OsString)> = [
            ("PATH", "/bin"),
            ("NEPHELE_JOIN_TOKEN", "nph1.x"),
            ("GITHUB_TOKEN", "t"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("HOME", "/root"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
        let base = base_env(agent);
        let env = member_env(
            &base,
            &[
                ("RANK".into(), "0".into()),
                ("HOME".into(), "/work".into()),
                ("RANK".into(), "1".into()),
            ],
        )
        .expect("valid");
        let as_strings: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect();
        assert_eq!(
            as_strings,
            vec![
                ("PATH".to_string(), "/bin".to_string()),
                ("HOME".to_string(), "/work".to_string()),
                ("RANK".to_string(), "1".to_string()),
            ]
        );
        assert!(member_env(&base, &[("A=B".into(), "c".into())]).is_err());
        assert!(member_env(&base, &[(String::new(), "c".into())]).is_err());
        assert!(member_env(&base, &[("A".into(), "c\0d".into())]).is_err());
    }

    #[test]
    fn status_files_round_trip_and_bad_ones_read_as_none() {
        let dir = std::env::temp_dir().join(format!("nephele-status-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("member-0.status");
        assert_eq!(SupervisorStatus::read(&path), None);
        let status = SupervisorStatus::Exited {
            code: Some(3),
            signal: None,
            finished_unix: 9,
        };
        status.write(&path).expect("writes");
        assert_eq!(SupervisorStatus::read(&path), Some(status));
        std::fs::write(&path, b"{\"state\":").expect("writes");
        assert_eq!(SupervisorStatus::read(&path), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn this_process_is_alive_and_a_changed_start_time_is_another_process() {
        let me = process_ref(std::process::id());
        assert!(process_alive(&me));
        if me.start_ticks.is_some() {
            let impostor = ProcessRef {
                pid: me.pid,
                start_ticks: me.start_ticks.map(|t| t + 1),
            };
            assert!(!process_alive(&impostor));
            assert!(!process_exists(&impostor));
        }
    }

    #[test]
    fn running_members_are_ended_from_their_status_files_and_reused_pids_are_not() {
        use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
        let dir = std::env::temp_dir().join(format!("nephele-reap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let layout = JobLayout::new(&dir).expect("layout");
        let spawn = || {
            std::process::Command::new("sleep")
                .arg("60")
                .process_group(0)
                .spawn()
                .expect("sleep starts")
        };
        let (mut member, mut other) = (spawn(), spawn());
        let key = |job: &str| MemberKey {
            job: job.into(),
            attempt: 1,
            member: 0,
        };
        let running = |child: &std::process::Child, shift: u64| {
            let process = process_ref(child.id());
            SupervisorStatus::Running {
                pid: process.pid,
                start_ticks: process.start_ticks.map(|t| t + shift),
                started_unix: 1,
            }
        };
        std::fs::create_dir_all(layout.attempt_dir(&key("default/train"))).expect("dir");
        running(&member, 0)
            .write(&layout.status_file(&key("default/train")))
            .expect("writes");
        // A status naming `other`'s pid with another start time: the pid was reused.
        std::fs::create_dir_all(layout.attempt_dir(&key("default/old"))).expect("dir");
        running(&other, 1)
            .write(&layout.status_file(&key("default/old")))
            .expect("writes");
        let reused_detectable = process_ref(other.id()).start_ticks.is_some();

        let killed = layout.kill_running_members();
        assert_eq!(killed, if reused_detectable { 1 } else { 2 });
        assert_eq!(member.wait().expect("waits").signal(), Some(9));
        if reused_detectable {
            assert_eq!(other.try_wait().expect("try_wait"), None, "left alone");
        }
        let _ = other.kill();
        let _ = other.wait();
        assert_eq!(layout.kill_running_members(), 0, "nothing left to end");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
