//! The `local` provider: pool nodes as `nephele-edge` processes on this machine, for a
//! laptop, a lab, a demo and the end-to-end tests.
//!
//! A launch waits `boot_delay_s` (it stands for a cloud machine's boot and image pull,
//! which a local process does not have; say so in figures measured with it), enrols
//! the agent with its own join token (`nephele-edge join --role pool`, the token in the
//! environment, not on the command line), and starts `nephele-edge run` in a process
//! group of its own, so the node outlives a control-plane crash or Ctrl-C, as a real
//! machine would. Each node's data dir (`<nodes dir>/<device>`) holds `agent.pid` and
//! `agent.log`. A release sends SIGTERM (the agent stops its jobs' processes), then
//! SIGKILL after 10 s, and removes the data dir; it checks first that the pid still
//! belongs to that node's agent (pids are reused).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::{tail_text, BoxFuture, LaunchRequest, Provider, ReleaseRequest};
use crate::config::LocalProviderConfig;

/// How long `nephele-edge join` may take.
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Between SIGTERM and SIGKILL on release.
const STOP_GRACE: Duration = Duration::from_secs(10);

pub struct LocalProvider {
    agent_command: Vec<String>,
    nodes_dir: PathBuf,
    boot_delay: Duration,
    workers: u32,
}

/// The agent program next to this one: `nephele-edge` beside `nephele-cloud`, or the
/// `nephele` CLI's own `edge` subcommand.
pub fn default_agent_command() -> Vec<String> {
    let Ok(exe) = std::env::current_exe() else {
        return vec!["nephele-edge".into()];
    };
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    if name == "nephele" {
        return vec![exe.display().to_string(), "edge".into()];
    }
    let sibling = exe.with_file_name("nephele-edge");
    if sibling.exists() {
        vec![sibling.display().to_string()]
    } else {
        vec!["nephele-edge".into()]
    }
}

impl LocalProvider {
    pub fn new(config: &LocalProviderConfig, data_dir: &Path) -> LocalProvider {
        LocalProvider {
            agent_command: if config.agent_command.is_empty() {
                default_agent_command()
            } else {
                config.agent_command.clone()
            },
            nodes_dir: config
                .data_dir
                .clone()
                .unwrap_or_else(|| data_dir.join("nodes")),
            boot_delay: Duration::from_secs_f64(config.boot_delay_s.max(0.0)),
            workers: config.workers.max(1),
        }
    }

    pub fn nodes_dir(&self) -> &Path {
        &self.nodes_dir
    }

    fn command(&self) -> Result<tokio::process::Command, String> {
        let (program, rest) = self
            .agent_command
            .split_first()
            .ok_or("[nodes.local] agent_command is empty")?;
        let mut command = std::process::Command::new(program);
        command.args(rest);
        Ok(tokio::process::Command::from(command))
    }
}

/// Processes whose command line mentions `dir` (the node's agent and its jobs'
/// supervisors), and everything they started (the jobs' members).
fn node_processes(dir: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let pids: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .collect();
    let parent_of = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(')')?;
        rest.split_whitespace().nth(1)?.parse().ok()
    };
    let mut found: Vec<i32> = pids
        .iter()
        .copied()
        .filter(|pid| mentions(*pid, dir))
        .collect();
    // Descendants, to a fixed point (members run in process groups of their own).
    loop {
        let more: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|pid| !found.contains(pid))
            .filter(|pid| parent_of(*pid).is_some_and(|p| found.contains(&p)))
            .collect();
        if more.is_empty() {
            return found;
        }
        found.extend(more);
    }
}

fn mentions(pid: i32, dir: &Path) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            String::from_utf8_lossy(&raw)
                .split('\0')
                .any(|arg| arg.starts_with(&*dir.display().to_string()))
        })
        .unwrap_or(false)
}

/// Whether `pid` is a live process whose command line mentions `dir` (our agent).
fn is_our_agent(pid: i32, dir: &Path) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            String::from_utf8_lossy(&raw)
                .split('\0')
                .any(|arg| Path::new(arg) == dir)
        })
        .unwrap_or(false)
}

impl Provider for LocalProvider {
    fn list(&self, region: &str, pool: &str) -> BoxFuture<Option<Result<Vec<String>, String>>> {
        let prefix = format!("{region}-{pool}-");
        let dir = self.nodes_dir.clone();
        Box::pin(async move {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                return Some(Ok(Vec::new()));
            };
            let mut running = Vec::new();
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                if !name.starts_with(&prefix) {
                    continue;
                }
                let node_dir = dir.join(&name);
                let alive = std::fs::read_to_string(node_dir.join("agent.pid"))
                    .ok()
                    .and_then(|t| t.trim().parse::<i32>().ok())
                    .is_some_and(|pid| is_our_agent(pid, &node_dir));
                if alive {
                    running.push(name);
                }
            }
            running.sort();
            Some(Ok(running))
        })
    }

    fn launch(&self, request: LaunchRequest) -> BoxFuture<Result<(), String>> {
        let dir = self.nodes_dir.join(&request.device);
        let join = self.command();
        let run = self.command();
        let boot_delay = self.boot_delay;
        let workers = self.workers;
        Box::pin(async move {
            let (mut join, mut run) = (join?, run?);
            tokio::time::sleep(boot_delay).await;
            // A slot launched again starts from a clean machine.
            let _ = tokio::fs::remove_dir_all(&dir).await;
            tokio::fs::create_dir_all(&dir)
                .await
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            join.args(["join", "--server", &request.server, "--data-dir"])
                .arg(&dir)
                .args([
                    "--name",
                    &request.device,
                    "--role",
                    "pool",
                    "--profile",
                    &request.profile,
                    "--label",
                    &format!("nephele.io/capacity-type={}", request.capacity_type),
                ])
                .env("NEPHELE_JOIN_TOKEN", &request.token)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            let output = tokio::time::timeout(JOIN_TIMEOUT, join.output())
                .await
                .map_err(|_| format!("join of {} took over {JOIN_TIMEOUT:?}", request.device))?
                .map_err(|e| format!("cannot run the agent to join: {e}"))?;
            if !output.status.success() {
                return Err(format!(
                    "join of {} failed: {}",
                    request.device,
                    tail_text(&[output.stdout, output.stderr].concat(), 1500)
                ));
            }
            let log = std::fs::File::create(dir.join("agent.log"))
                .map_err(|e| format!("cannot create the agent's log: {e}"))?;
            let log_err = log
                .try_clone()
                .map_err(|e| format!("cannot open the agent's log: {e}"))?;
            run.args(["run", "--data-dir"])
                .arg(&dir)
                .args(["--listen", "127.0.0.1:0", "--workers", &workers.to_string()])
                .arg("--ready-file")
                .arg(dir.join("ready.json"))
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err)
                // Its own process group: a Ctrl-C or crash of the control plane does
                // not take the node down, as it would not take a machine down.
                .process_group(0);
            let mut child = run
                .spawn()
                .map_err(|e| format!("cannot start the agent of {}: {e}", request.device))?;
            let pid = child.id().unwrap_or(0);
            std::fs::write(dir.join("agent.pid"), pid.to_string())
                .map_err(|e| format!("cannot record the agent's pid: {e}"))?;
            // Reap it when it ends, so no zombie is left behind.
            tokio::spawn(async move {
                let _ = child.wait().await;
            });
            Ok(())
        })
    }

    fn release(&self, request: ReleaseRequest) -> BoxFuture<Result<(), String>> {
        let dir = self.nodes_dir.join(&request.device);
        Box::pin(async move {
            let pid = tokio::fs::read_to_string(dir.join("agent.pid"))
                .await
                .ok()
                .and_then(|text| text.trim().parse::<i32>().ok());
            if let Some(pid) = pid.filter(|pid| *pid > 0 && is_our_agent(*pid, &dir)) {
                let target = nix::unistd::Pid::from_raw(pid);
                let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM);
                let deadline = tokio::time::Instant::now() + STOP_GRACE;
                while is_our_agent(pid, &dir) && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if is_our_agent(pid, &dir) {
                    let _ = nix::sys::signal::killpg(target, nix::sys::signal::Signal::SIGKILL);
                }
            }
            // The machine is gone, and its jobs' processes with it: they get SIGTERM
            // (their supervisors pass it on), then SIGKILL.
            let signal_all = |signal| {
                for pid in node_processes(&dir) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
                }
            };
            signal_all(nix::sys::signal::Signal::SIGTERM);
            let deadline = tokio::time::Instant::now() + STOP_GRACE;
            while !node_processes(&dir).is_empty() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            signal_all(nix::sys::signal::Signal::SIGKILL);
            let _ = tokio::fs::remove_dir_all(&dir).await;
            Ok(())
        })
    }
}
