//! Jobs (`/v1/jobs`): the spec a job is submitted with and what the API shows of it,
//! the regions' node slots (`/v1/regions/{name}/nodes`) and deployments' replica sets
//! (`/v1/deployments/{name}/replicas`).

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
        if let Some(dir) = self.working_dir.as_deref() {
            let path = std::path::Path::new(dir);
            let climbs = path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir));
            if !path.is_absolute() && climbs {
                return Err(format!(
                    "working_dir {dir:?}: a relative working directory stays inside the member's own directory on the node, so it may not contain `..`; give an absolute path for a directory elsewhere"
                ));
            }
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GpuShare {
    pub gpu: u8,
    pub milli: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MemberPlacement {
    pub member: usize,
    /// The node slot (`<pool>-<n>`).
    pub node: String,
    /// The pool agent serving that slot.
    pub agent: Option<String>,
    pub gpus: Vec<GpuShare>,
    pub mig_profile: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReasonCount {
    pub reason: String,
    pub nodes: u32,
}

/// The answer to "why is it not placed?".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WhyPendingView {
    pub message: String,
    /// Per filter reason, how many nodes rejected it (for unschedulable jobs).
    pub reasons: Vec<ReasonCount>,
    /// What to do about it, when there is something obvious.
    pub hint: Option<String>,
}

/// A deferrable job's carbon plan: while it waits, and after it was released.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeferralView {
    pub deadline_unix: u64,
    /// It starts by then whatever the forecast says.
    pub latest_start_unix: u64,
    /// `waiting` (held out of the queue) or `released` (queued).
    pub state: String,
    /// Why it waits, or why it was released, in words.
    pub reason: String,
    /// Mean carbon (gCO₂eq/kWh) of its window had it started on submission, as
    /// measured and forecast then.
    pub carbon_at_submit: Option<f64>,
    /// Mean carbon of the window starting at the last decision (waiting) or at release.
    pub carbon_now: Option<f64>,
    /// While waiting: the start hour and mean carbon of the greenest window forecast.
    pub best_start_unix: Option<u64>,
    pub best_carbon: Option<f64>,
    pub released_unix: Option<u64>,
}

/// One region as `"region": "auto"` weighed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RegionCandidate {
    pub region: String,
    /// Weighted, normalised score in [0, 1]; lower is better. `None` when excluded.
    pub score: Option<f64>,
    /// Mean carbon of the job's greenest window there (within its deadline).
    pub carbon_g_per_kwh: Option<f64>,
    pub best_start_unix: Option<u64>,
    pub price_per_mwh: Option<f64>,
    /// Free capacity on connected nodes, in the choice's unit.
    pub free: f64,
    /// Why it was not ranked.
    pub excluded: Option<String>,
}

/// How a region was chosen for `"region": "auto"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RegionChoiceView {
    pub chosen: String,
    pub reason: String,
    /// `gpu` (whole GPUs) or `cpu` (cores): what `free` and `demand` count.
    pub unit: String,
    pub demand: f64,
    pub weights: RegionWeightsConfig,
    pub candidates: Vec<RegionCandidate>,
}

/// Relative weight of carbon, price and free capacity in `"region": "auto"`; only the
/// ratios matter (see `carbon::choose_region`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RegionWeightsConfig {
    pub carbon: f64,
    pub price: f64,
    pub capacity: f64,
}

impl Default for RegionWeightsConfig {
    /// Carbon first, then price, with some weight on headroom.
    fn default() -> Self {
        RegionWeightsConfig {
            carbon: 0.6,
            price: 0.3,
            capacity: 0.1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JobView {
    pub name: String,
    pub tenant: String,
    /// Numbers this submission in its region (its processes' key on the nodes is
    /// `<tenant>/<name>/<uid>`).
    pub uid: u64,
    pub region: String,
    /// `deferred` (waiting for a lower-carbon hour, not queued yet), `pending`,
    /// `running` (placed; resources held), `terminating` (preempted, within its grace
    /// period), `backoff` (failed, waiting to be retried), `recovering` (its node went,
    /// its processes being found again), `succeeded`, `failed` or `finished`.
    pub state: String,
    pub priority: u32,
    pub preemptible: bool,
    pub submitted_unix: u64,
    pub started_unix: Option<u64>,
    pub placement: Vec<MemberPlacement>,
    pub why_pending: Option<WhyPendingView>,
    /// Set while terminating: who preempted it and when its resources are taken.
    pub preempted_by: Option<String>,
    pub grace_deadline_unix: Option<u64>,
    /// Times it lost its resources (preemption or node loss) and waited again.
    pub requeues: u32,
    /// For a job with a deadline: its carbon plan.
    pub deferral: Option<DeferralView>,
    /// For a job submitted with `"region": "auto"`: how this region was chosen.
    pub region_choice: Option<RegionChoiceView>,
    /// The current (or last) attempt, 0 before the first start.
    pub attempt: u32,
    /// The current attempt's members as their agents report them (jobs with a
    /// command).
    pub members: Vec<MemberView>,
    /// Every attempt so far, oldest first (the last 20).
    pub attempts: Vec<AttemptView>,
    /// `succeeded`, or `failed: <why>` once no attempt is left.
    pub outcome: Option<String>,
    /// While in `backoff`: when it runs again.
    pub retry_at_unix: Option<u64>,
    pub spec: JobSpec,
}

/// One member of a job's current attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MemberView {
    pub member: u16,
    pub node: String,
    /// `launching` (sent to its agent), `running`, `stopping`, `exited`,
    /// `failed-to-start`, `lost` (its node went away).
    pub state: String,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_unix: Option<u64>,
    pub finished_unix: Option<u64>,
    /// Why it could not start.
    pub error: Option<String>,
}

/// One attempt of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AttemptView {
    pub attempt: u32,
    pub started_unix: u64,
    pub ended_unix: Option<u64>,
    /// The node of each member.
    pub nodes: Vec<String>,
    /// `MASTER_ADDR:MASTER_PORT` of a gang.
    pub rendezvous: Option<String>,
    /// `succeeded`, `failed: …`, `preempted`, `drained`, `node lost`, `cancelled`, or
    /// none while it runs.
    pub outcome: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NodeView {
    pub name: String,
    pub pool: String,
    pub profile: String,
    pub agent: Option<String>,
    /// Takes new work: its agent is connected and it is not being drained.
    pub up: bool,
    /// `absent`, `launching`, `up`, `draining`, `releasing` (see
    /// `scheduler/nodes.rs`).
    pub phase: String,
    /// `none` (enrolled by hand), `local` or `command`.
    pub provider: String,
    /// The device name a provider starts this node as.
    pub device: Option<String>,
    /// Since when it is in its phase (unix seconds).
    pub since_unix: Option<u64>,
    /// Why it is draining, or the last provider error.
    pub note: Option<String>,
    /// The deployments it holds a serving replica of.
    pub replicas: Vec<String>,
    pub capacity_type: String,
    pub price_per_hour: f64,
    pub cpu_milli: u64,
    pub cpu_free_milli: u64,
    pub memory_mib: u64,
    pub memory_free_mib: u64,
    pub gpu_model: Option<String>,
    /// Free milli-GPU per GPU.
    pub gpu_free_milli: Vec<u32>,
    /// Free slices per MIG partition (`<profile> on gpu <n>`).
    pub mig_free: Vec<(String, u8)>,
    /// Jobs with a member here (`tenant/name`; replicas as `serving/<deployment>-<n>`).
    pub jobs: Vec<String>,
}

/// A deployment's cloud replicas in one region, and what its autoscaler decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReplicaSetView {
    pub region: String,
    pub deployment: String,
    pub priority: u32,
    pub min: u32,
    pub max: u32,
    /// What the autoscaler asks for (warm replicas included).
    pub desired: u32,
    pub ready: u32,
    pub starting: u32,
    pub pending: u32,
    /// Per replica: `pending`, `starting`, `ready`, `retiring` (replaced; leaves when its
    /// replacement is ready), `failed`.
    pub replicas: Vec<ReplicaView>,
    /// Recent cold starts (placement to ready), ms.
    pub cold_starts_ms: Vec<u64>,
    /// The autoscaler's last decision, filled in by the region actor.
    pub autoscaler: Option<crate::AutoscalerView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReplicaView {
    pub name: String,
    pub state: String,
    pub node: Option<String>,
    pub agent: Option<String>,
    pub placed_unix: Option<u64>,
    pub cold_start_ms: Option<u64>,
    pub error: Option<String>,
    /// Why a `pending` replica has no node yet (replicas of one deployment take a node
    /// each), as a pending job says it.
    #[serde(default)]
    pub why_pending: Option<WhyPendingView>,
}

/// `GET /v1/jobs/{name}/logs`: a slice of a member's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JobLogsView {
    pub job: String,
    pub attempt: u32,
    pub member: u16,
    pub offset: u64,
    pub next_offset: u64,
    pub size: u64,
    pub finished: bool,
    pub data: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_dir(dir: &str) -> JobSpec {
        let mut spec = JobSpec::named("j");
        spec.command = vec!["true".into()];
        spec.working_dir = Some(dir.into());
        spec
    }

    #[test]
    fn a_relative_working_dir_may_not_climb_out_of_the_members_own() {
        for ok in ["data", "a/b", "./x", "/srv/work", "/srv/../etc"] {
            assert!(with_dir(ok).validate_command().is_ok(), "{ok}");
        }
        for bad in ["..", "../../etc/passwd", "a/../../b", "x/.."] {
            let error = with_dir(bad).validate_command().expect_err(bad);
            assert!(error.contains("may not contain `..`"), "{bad}: {error}");
        }
        assert!(with_dir("").validate_command().is_err());
    }
}
