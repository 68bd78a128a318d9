//! The job spec that `POST /v1/jobs` takes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A job priority: a class name or a number (higher is more important).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum PrioritySpec {
    Class(String),
    Value(u32),
}

/// Where a gang's members may go.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum TopologySpec {
    #[default]
    Any,
    /// Every member on the node of the first (hard).
    SameNode,
    /// On one node when possible, anywhere otherwise.
    PreferSameNode,
}

/// `POST /v1/jobs`: one pod, or a gang of `members` identical pods placed all or none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    #[schemars(regex(pattern = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"))]
    pub name: String,
    /// Region to queue in (default: the first configured region); `auto` lets the
    /// control plane choose by carbon, price and free capacity.
    #[serde(default)]
    pub region: Option<String>,
    /// Tenant charged (default: the API token's tenant; only admins may name another).
    #[serde(default)]
    pub tenant: Option<String>,
    /// `best-effort`, `batch` (default), `production`, `system`, or a number.
    #[serde(default)]
    pub priority: Option<PrioritySpec>,
    #[serde(default = "one_member")]
    pub members: u16,
    /// Per member.
    #[serde(default = "default_cpu_milli")]
    pub cpu_milli: u64,
    #[serde(default = "default_memory_mib")]
    pub memory_mib: u64,
    #[serde(default)]
    pub gpus: u8,
    /// Share of each GPU in milli-GPU (1..=1000); below 1000 only with `gpus = 1`.
    #[serde(default)]
    pub gpu_milli: Option<u32>,
    /// Acceptable GPU models (as the firmware profiles name them); empty: any.
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// One MIG slice of this profile (e.g. `1g.10gb`) instead of whole GPUs.
    #[serde(default)]
    pub mig_profile: Option<String>,
    /// All of a member's GPUs in one NVLink domain.
    #[serde(default)]
    pub same_nvlink: bool,
    #[serde(default)]
    pub topology: TopologySpec,
    /// What backfilling and the starvation reservation plan with; unknown if absent.
    #[serde(default)]
    pub expected_runtime_s: Option<u64>,
    /// Finish by this unix second. Makes the job deferrable: it may wait for a
    /// lower-carbon hour, and starts by `deadline_unix − expected_runtime_s` whatever
    /// the forecast says. Needs `expected_runtime_s`.
    #[serde(default)]
    pub deadline_unix: Option<u64>,
    /// How often the job checkpoints (for the expected cost of spot interruptions).
    #[serde(default)]
    pub checkpoint_interval_s: Option<u64>,
    /// May be preempted by higher priorities (default: below `production`).
    #[serde(default)]
    pub preemptible: Option<bool>,
    /// May run on spot capacity.
    #[serde(default)]
    pub spot_ok: bool,
    /// Node labels required (`nephele.io/pool`, `nephele.io/profile` are set on every
    /// node).
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default)]
    pub tolerations: Vec<String>,
    /// The program each member runs on its pool node and its first arguments (no
    /// shell). Empty: the job only holds its resources until it is deleted.
    #[serde(default)]
    pub command: Vec<String>,
    /// More arguments after `command` (as a container's `command` and `args`).
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment of every member, besides what the control plane sets (`RANK`,
    /// `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`, `CUDA_VISIBLE_DEVICES`,
    /// `NEPHELE_CHECKPOINT_DIR`, `NEPHELE_JOB*`), which wins over these.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory of every member; absent: one of its own on the node.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// How many times a failed attempt is retried (default 3), with a doubling backoff.
    #[serde(default)]
    pub max_retries: Option<u32>,
}

/// Most bytes of a job's command, arguments and environment together.
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;

fn one_member() -> u16 {
    1
}
fn default_cpu_milli() -> u64 {
    1000
}
fn default_memory_mib() -> u64 {
    1024
}

impl JobSpec {
    /// Checks the command, arguments, environment and working directory.
    pub fn validate_command(&self) -> Result<(), String> {
        if self.command.is_empty() && !self.args.is_empty() {
            return Err("args need a command".into());
        }
        if let Some(program) = self.command.first() {
            if program.trim().is_empty() {
                return Err("command[0] (the program) must not be empty".into());
            }
        }
        let mut bytes = 0usize;
        for part in self.command.iter().chain(&self.args) {
            if part.contains('\0') {
                return Err("command and args must not contain NUL bytes".into());
            }
            bytes += part.len();
        }
        for (key, value) in &self.env {
            if key.is_empty()
                || key.contains('=')
                || key.contains('\0')
                || value.contains('\0')
                || key.chars().next().is_some_and(|c| c.is_ascii_digit())
            {
                return Err(format!(
                    "env name {key:?} is not valid (no '=', no NUL, not empty, not starting with a digit)"
                ));
            }
            bytes += key.len() + value.len();
        }
        if self
            .working_dir
            .as_deref()
            .is_some_and(|d| d.is_empty() || d.contains('\0'))
        {
            return Err("working_dir must be a path (or absent)".into());
        }
        if bytes > MAX_COMMAND_BYTES {
            return Err(format!(
                "command, args and env take {bytes} bytes; at most {MAX_COMMAND_BYTES}"
            ));
        }
        if self.command.is_empty() && (!self.env.is_empty() || self.working_dir.is_some()) {
            return Err("env and working_dir need a command".into());
        }
        if self.max_retries.is_some_and(|r| r > 100) {
            return Err("max_retries is at most 100".into());
        }
        Ok(())
    }

    /// A one-member job with the defaults, for tests and the CLI.
    pub fn named(name: &str) -> JobSpec {
        serde_json::from_value(serde_json::json!({ "name": name }))
            .unwrap_or_else(|_| unreachable!("a name alone is a valid spec"))
    }
}
