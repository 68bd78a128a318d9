//! The `command` provider: operator scripts add and remove nodes, as Slurm's
//! ResumeProgram and SuspendProgram do. The contract (environment, exit status,
//! timeout) is in `deploy/providers/README.md`, with examples for a Kubernetes
//! StatefulSet and for a cloud CLI.
//!
//! A script runs with the control plane's environment plus the `NEPHELE_*` names of the
//! call, in a process group of its own; one still running after `timeout_s` is killed
//! with its children, and the call fails. Its stderr (the end of it) is the error the
//! operator sees. The join token travels in the environment only, never on a command
//! line.

use std::process::Stdio;
use std::time::Duration;

use super::{tail_text, BoxFuture, LaunchRequest, Provider, ReleaseRequest};
use crate::config::CommandProviderConfig;

pub struct CommandProvider {
    config: CommandProviderConfig,
}

impl CommandProvider {
    pub fn new(config: CommandProviderConfig) -> CommandProvider {
        CommandProvider { config }
    }
}

impl Provider for CommandProvider {
    fn launch(&self, request: LaunchRequest) -> BoxFuture<Result<(), String>> {
        let script = self.config.add.clone();
        let timeout = Duration::from_secs(self.config.timeout_s);
        let env = vec![
            ("NEPHELE_REGION".to_string(), request.region),
            ("NEPHELE_POOL".to_string(), request.pool),
            ("NEPHELE_NODE".to_string(), request.device),
            ("NEPHELE_PROFILE".to_string(), request.profile),
            ("NEPHELE_CAPACITY_TYPE".to_string(), request.capacity_type),
            ("NEPHELE_SERVER".to_string(), request.server),
            ("NEPHELE_JOIN_TOKEN".to_string(), request.token),
        ];
        Box::pin(run_script(script, env, timeout))
    }

    fn release(&self, request: ReleaseRequest) -> BoxFuture<Result<(), String>> {
        let script = self.config.remove.clone();
        let timeout = Duration::from_secs(self.config.timeout_s);
        let env = vec![
            ("NEPHELE_REGION".to_string(), request.region),
            ("NEPHELE_POOL".to_string(), request.pool),
            ("NEPHELE_NODE".to_string(), request.device),
        ];
        Box::pin(run_script(script, env, timeout))
    }

    fn list(&self, region: &str, pool: &str) -> BoxFuture<Option<Result<Vec<String>, String>>> {
        let Some(script) = self.config.list.clone() else {
            return Box::pin(async { None });
        };
        let timeout = Duration::from_secs(self.config.timeout_s);
        let env = vec![
            ("NEPHELE_REGION".to_string(), region.to_string()),
            ("NEPHELE_POOL".to_string(), pool.to_string()),
        ];
        Box::pin(async move {
            Some(run_script_output(script, env, timeout).await.map(|out| {
                String::from_utf8_lossy(&out)
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect()
            }))
        })
    }
}

/// Runs `script` with `env` added; `Ok` when it exits 0 within `timeout`.
pub async fn run_script(
    script: String,
    env: Vec<(String, String)>,
    timeout: Duration,
) -> Result<(), String> {
    run_script_output(script, env, timeout).await.map(|_| ())
}

/// [`run_script`], returning what the script printed on stdout.
pub async fn run_script_output(
    script: String,
    env: Vec<(String, String)>,
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    use std::os::unix::process::CommandExt as _;
    let mut command = std::process::Command::new(&script);
    command
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    let child = command
        .spawn()
        .map_err(|e| format!("cannot run {script}: {e}"))?;
    let pid = child.id();
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(output)) if output.status.success() => Ok(output.stdout),
        Ok(Ok(output)) => {
            let stderr = tail_text(&output.stderr, 2000);
            Err(format!(
                "{script} failed ({}){}",
                output.status,
                if stderr.is_empty() {
                    String::new()
                } else {
                    format!(": {stderr}")
                }
            ))
        }
        Ok(Err(error)) => Err(format!("{script}: {error}")),
        Err(_) => {
            // The script and whatever it started share its process group.
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            Err(format!(
                "{script} did not finish within {} s and was killed",
                timeout.as_secs()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path.display().to_string()
    }

    #[tokio::test]
    async fn scripts_succeed_fail_and_time_out_with_their_reason() {
        let dir = std::env::temp_dir().join(format!("nephele-command-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let ok = script(&dir, "ok.sh", "test \"$NEPHELE_NODE\" = n1");
        let env = vec![("NEPHELE_NODE".to_string(), "n1".to_string())];
        assert_eq!(
            run_script(ok, env.clone(), Duration::from_secs(5)).await,
            Ok(())
        );
        let fail = script(&dir, "fail.sh", "echo 'quota exceeded' >&2; exit 3");
        let error = run_script(fail, env.clone(), Duration::from_secs(5))
            .await
            .expect_err("fails");
        assert!(error.contains("quota exceeded"), "{error}");
        let hang = script(&dir, "hang.sh", "sleep 30 & sleep 30");
        let started = std::time::Instant::now();
        let error = run_script(hang, env.clone(), Duration::from_millis(300))
            .await
            .expect_err("times out");
        assert!(error.contains("did not finish"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let missing = run_script(
            dir.join("nope.sh").display().to_string(),
            env,
            Duration::from_secs(1),
        )
        .await
        .expect_err("no such script");
        assert!(missing.contains("cannot run"), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
