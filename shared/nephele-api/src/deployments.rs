//! Deployments (`/v1/deployments`): a model version run on the devices a selector
//! picks, with cloud replicas where it may offload.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::rollouts::{RolloutSettings, RolloutView};

/// A deployment's cloud replicas as its spec asks for them; every field left out takes
/// the control plane's `[autoscale]` default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplicaSettings {
    /// Priority of its replicas and of its requests in admission control (higher
    /// keeps serving longer).
    #[serde(default)]
    pub priority: Option<u32>,
    #[serde(default)]
    pub min: Option<u32>,
    #[serde(default)]
    pub max: Option<u32>,
    /// p99 latency (ms) of offloaded requests through the region that the autoscaler
    /// keeps; default the deployment's SLO.
    #[serde(default)]
    pub target_p99_ms: Option<u32>,
    /// What one replica takes on its node.
    #[serde(default)]
    pub cpu_milli: Option<u64>,
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// A share of one GPU (1..=1000); default sized from the model.
    #[serde(default)]
    pub gpu_milli: Option<u32>,
    /// A MIG slice instead, e.g. `1g.10gb`.
    #[serde(default)]
    pub mig_profile: Option<String>,
    /// May run on spot nodes (default true: an interruption notice moves it first).
    #[serde(default)]
    pub spot_ok: Option<bool>,
}

/// `POST /v1/deployments` and `PUT /v1/deployments/{name}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeploymentSpec {
    #[schemars(regex(pattern = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"))]
    pub name: String,
    pub model: String,
    #[serde(default)]
    pub selector: String,
    #[serde(default = "default_slo_ms")]
    pub slo_ms: u32,
    #[serde(default = "default_true")]
    pub offload: bool,
    #[serde(default = "default_max_queue")]
    pub max_queue: u32,
    /// `auto` (chosen per device from its profile) or a variant name of the model.
    #[serde(default = "default_variant")]
    pub variant: String,
    /// Re-ask the cloud when the local answer's top-class probability is below this.
    #[serde(default)]
    pub hard_example_threshold: Option<f32>,
    /// Its cloud replicas: priority, bounds, latency target and size (each absent
    /// field takes the `[autoscale]` default).
    #[serde(default)]
    pub replicas: ReplicaSettings,
    /// How updates of it roll out (steps and gates); absent: the defaults.
    #[serde(default)]
    pub rollout: Option<RolloutSettings>,
    /// The tenant it belongs to: the token's own when absent; only admins name another.
    #[serde(default)]
    pub tenant: Option<String>,
}

fn default_variant() -> String {
    "auto".into()
}

fn default_slo_ms() -> u32 {
    50
}

fn default_true() -> bool {
    true
}

fn default_max_queue() -> u32 {
    64
}

/// One device of a deployment. What only the leader knows (its sessions and
/// heartbeats) is `null` in an answer from a standby's copy (`?stale`), and `phase`
/// is `unknown` there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeviceDeploymentStatus {
    pub device: String,
    pub role: String,
    pub profile: String,
    pub online: Option<bool>,
    pub phase: String,
    pub ready: Option<bool>,
    pub variant: Option<String>,
    pub served_local: Option<u64>,
    pub served_offloaded: Option<u64>,
    pub failed: Option<u64>,
    pub queue_len: Option<u32>,
    /// Batch 1's compute time the agent measured for its variant when it loaded it.
    pub service_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// The model version the device is told to run (`name:version`).
    pub model: String,
    /// Whether it runs that version now (its agent reports its bytes ready).
    pub current: Option<bool>,
}

/// A deployment's device rows summed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeploymentTotals {
    pub served_local: u64,
    pub served_offloaded: u64,
    pub failed: u64,
    /// The highest p99 any device reported, ms.
    pub worst_p99_ms: f64,
    /// How many devices run each variant (those that reported none are left out).
    pub variants: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeploymentStatus {
    pub name: String,
    pub tenant: String,
    pub model: String,
    pub selector: String,
    pub slo_ms: u32,
    pub offload: bool,
    pub max_queue: u32,
    /// What the deployment asked for: `auto` or a variant name.
    pub variant: String,
    pub hard_example_threshold: Option<f32>,
    /// Its cloud replicas' settings as given (absent fields take the defaults).
    pub replicas: ReplicaSettings,
    /// How its updates roll out, as given (`null`: the defaults).
    pub rollout_settings: Option<RolloutSettings>,
    pub desired_devices: usize,
    /// `null` in an answer from a standby's copy.
    pub ready_devices: Option<usize>,
    /// Its edge devices counted by what they do: `ready`, `downloading`, `pending`,
    /// `failed`, or `offline` (not connected now, whatever it last reported). `null`
    /// in an answer from a standby's copy.
    #[serde(default)]
    pub device_phases: Option<BTreeMap<String, usize>>,
    /// Its rows summed (edge devices and pool agents alike), so a fleet's figures need
    /// no rows: `null` in an answer from a standby's copy.
    #[serde(default)]
    pub totals: Option<DeploymentTotals>,
    /// A row per device that runs it (edge devices and pool agents), in name order;
    /// empty when asked with `?devices=false`, and paged at
    /// `/v1/deployments/{name}/devices`.
    pub devices: Vec<DeviceDeploymentStatus>,
    /// What the deployment's author should know: a selector that matches no device.
    pub warnings: Vec<String>,
    /// Its latest rollout: under way, or how the last one ended.
    pub rollout: Option<RolloutView>,
}
