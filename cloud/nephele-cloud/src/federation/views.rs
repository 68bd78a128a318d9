//! What the API shows of the fleet (views built by the federation core) and the
//! deployment spec it accepts.

use nephele_domain::Labels;
use serde::Serialize;

use super::ModelState;
use crate::store::{ModelRecord, VariantRecord};

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct JoinTokenView {
    pub id: String,
    pub region: String,
    pub expires_unix: u64,
    pub used_by: Option<String>,
    /// Only present in the response that created it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct AcceleratorView {
    pub kind: String,
    pub model: String,
    pub count: u32,
    pub peak_int8_tops: f64,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DeviceView {
    pub name: String,
    pub role: String,
    pub region: String,
    pub profile: String,
    pub labels: Labels,
    pub accelerators: Vec<AcceleratorView>,
    pub cpu_cores: u32,
    pub memory_mb: u64,
    pub online: bool,
    /// `healthy` (heartbeats on time), `stale` (late heartbeats), `offline`.
    pub health: String,
    pub last_heartbeat_ms_ago: Option<u64>,
    pub connected_for_s: Option<u64>,
    /// The session now (numbered from 1 per control-plane start): a reconnect gets a
    /// new one, an address change or a short outage that QUIC rides out keeps it.
    pub session: Option<u64>,
    /// Where the control plane reaches the device now (IP:port as it sees it; follows
    /// QUIC connection migration).
    pub address: Option<String>,
    pub rss_bytes: Option<u64>,
    /// The link to the control plane as the agent measures it (QUIC RTT; throughput of
    /// its blob transfers, 0 until one was measured).
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    pub link: Option<nephele_proto::LinkReport>,
    pub local_endpoint: Option<String>,
    pub deployments: usize,
}

/// A model's input or output as the API shows it (`nephele_runtime::TensorInfo`).
#[derive(schemars::JsonSchema)]
#[schemars(rename = "Tensor")]
#[allow(dead_code)]
pub struct TensorSchema {
    pub name: String,
    /// Dimensions; -1 for one left symbolic.
    pub shape: Vec<i64>,
    /// `f32`, `i64`, `i32`, …
    pub dtype: String,
}

/// A recurrent state binding (`nephele_proto::StateBinding`).
#[derive(schemars::JsonSchema)]
#[schemars(rename = "StateBinding")]
#[allow(dead_code)]
pub struct StateBindingSchema {
    pub input: String,
    pub output: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ModelView {
    pub name: String,
    /// The tenant that pushed it.
    pub tenant: String,
    /// The first 12 hex digits of the stored file's sha256: pushing other content
    /// under the name adds a version, the same content is the same version.
    pub version: String,
    /// `name:version`, what a deployment names to run exactly this version.
    pub reference: String,
    /// `building` until the variants are built and stored, then `ready`; `failed` with
    /// `error` saying why.
    pub state: ModelState,
    /// How far the build is (while `building`).
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    pub progress: Option<nephele_runtime::variants::BuildProgress>,
    pub error: Option<String>,
    /// The `--input` specs applied to the file at push.
    pub input_specs: Vec<String>,
    /// Recurrent state kept per session on devices (`--state INPUT=OUTPUT`).
    #[schemars(with = "Vec<StateBindingSchema>")]
    pub recurrent_state: Vec<nephele_proto::StateBinding>,
    pub sha256: String,
    pub size: u64,
    pub created_unix: u64,
    #[schemars(with = "Vec<TensorSchema>")]
    pub inputs: Vec<nephele_runtime::TensorInfo>,
    #[schemars(with = "Vec<TensorSchema>")]
    pub outputs: Vec<nephele_runtime::TensorInfo>,
    /// What the variants were measured on.
    pub validation: String,
    /// Every variant built on push; those with `rejected` set are not shipped.
    pub variants: Vec<VariantRecord>,
    /// `onnx` (tract, or onnxruntime) or `candle-bert-gguf` (candle).
    pub format: String,
}

impl From<&ModelRecord> for ModelView {
    fn from(record: &ModelRecord) -> Self {
        let variants = if record.variants.is_empty() {
            vec![VariantRecord {
                name: "full".into(),
                precision: "fp32".into(),
                size: record.size,
                flops: 0,
                accuracy_pct: None,
                min_cosine: Some(1.0),
                top1_agreement: Some(1.0),
                cut: None,
                rejected: None,
                note: None,
                status: String::new(),
                reason: None,
            }]
        } else {
            record.variants.clone()
        };
        let variants = variants
            .into_iter()
            .map(|mut v| {
                v.status = if v.rejected.is_some() {
                    "rejected"
                } else {
                    "shipped"
                }
                .into();
                v.reason = v
                    .rejected
                    .clone()
                    .or_else(|| v.cut.as_ref().map(|c| c.chosen_because.clone()))
                    .or_else(|| v.note.clone())
                    .filter(|r| !r.is_empty());
                v
            })
            .collect();
        ModelView {
            name: record.name.clone(),
            tenant: record.tenant.clone(),
            version: record.version_id().to_string(),
            reference: record.reference(),
            state: ModelState::Ready,
            progress: None,
            error: None,
            input_specs: record.input_specs.clone(),
            recurrent_state: record.recurrent_state.clone(),
            sha256: record.sha256.clone(),
            size: record.size,
            created_unix: record.created_unix,
            inputs: record.inputs.clone(),
            outputs: record.outputs.clone(),
            validation: record.validation.clone(),
            variants,
            format: record.format.clone(),
        }
    }
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
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
    pub replicas: crate::store::ReplicaSettings,
    /// How updates of it roll out (steps and gates); absent: the defaults.
    #[serde(default)]
    pub rollout: Option<super::rollout::RolloutSettings>,
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

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DeviceDeploymentStatus {
    pub device: String,
    pub role: String,
    pub profile: String,
    pub online: bool,
    pub phase: String,
    pub ready: bool,
    pub variant: String,
    pub served_local: u64,
    pub served_offloaded: u64,
    pub failed: u64,
    pub queue_len: u32,
    /// Batch 1's compute time the agent measured for its variant when it loaded it.
    pub service_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The model version the device is told to run (`name:version`).
    pub model: String,
    /// Whether it runs that version now (its agent reports its bytes ready).
    pub current: bool,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
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
    pub replicas: crate::store::ReplicaSettings,
    /// How its updates roll out, as given (`null`: the defaults).
    pub rollout_settings: Option<super::rollout::RolloutSettings>,
    pub desired_devices: usize,
    pub ready_devices: usize,
    pub devices: Vec<DeviceDeploymentStatus>,
    /// What the deployment's author should know: a selector that matches no device.
    pub warnings: Vec<String>,
    /// Its latest rollout: under way, or how the last one ended.
    pub rollout: Option<RolloutView>,
}

/// A rollout as the API shows it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RolloutView {
    pub number: u64,
    /// `progressing`, `paused`, `complete` or `rolled_back`.
    pub state: super::rollout::RolloutState,
    pub from: super::rollout::RuntimeSpec,
    pub to: super::rollout::RuntimeSpec,
    /// 1-based step under way, of `steps`.
    pub step: usize,
    pub steps: Vec<u32>,
    /// Selected edge devices, and how many are told to run the new version.
    pub selected_devices: usize,
    pub moved_devices: Vec<String>,
    /// What the gate saw last, or what it waits for.
    pub gate: String,
    pub settings: super::rollout::RolloutSettings,
    pub started_unix_ms: u64,
    pub finished_unix_ms: Option<u64>,
    pub baseline: super::rollout::Figures,
    pub events: Vec<super::rollout::RolloutEvent>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RegionView {
    pub name: String,
    pub carbon_zone: Option<String>,
    pub pools: Vec<crate::config::PoolConfig>,
    pub devices: usize,
    pub online: usize,
}

/// An API token as listed: never its secret, which only the response that created or
/// rotated it carries (`token`).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ApiTokenView {
    pub id: String,
    pub name: String,
    pub role: super::Role,
    pub tenant: String,
    /// `active`, `expired` or `revoked`.
    pub state: &'static str,
    pub created_unix: u64,
    pub created_by: String,
    pub expires_unix: Option<u64>,
    pub revoked_unix: Option<u64>,
    pub rotated_unix: Option<u64>,
    /// The whole token (`id.secret`): only in the answer that made it; keep it, it is
    /// not shown again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// `POST /v1/api-tokens`.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiTokenSpec {
    /// What it is for (a name: a-z, 0-9 and `-`).
    #[schemars(regex(pattern = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"))]
    pub name: String,
    pub role: super::Role,
    /// The tenant it acts for.
    pub tenant: String,
    /// Seconds until it expires; absent: it does not.
    #[serde(default)]
    pub ttl_s: Option<u64>,
}

/// A tenant: its scheduling weight and quotas (from the configuration), and what it
/// holds.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct TenantView {
    pub name: String,
    pub weight: f64,
    pub quota_cpu_milli: Option<u64>,
    pub quota_memory_mib: Option<u64>,
    pub quota_gpu_milli: Option<u64>,
    pub quota_jobs: Option<u32>,
    pub quota_replicas: Option<u32>,
    pub api_tokens: usize,
    pub models: usize,
    pub deployments: usize,
    /// Cloud replicas its deployments ask for (the sum of their `replicas.max`).
    pub replicas_asked: u32,
    /// A `[[tenant]]` of the config declares it (it cannot be deleted through the API).
    pub declared_in_config: bool,
    pub created_unix: u64,
    pub updated_unix: u64,
    pub updated_by: String,
}
