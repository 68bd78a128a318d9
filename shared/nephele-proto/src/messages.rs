//! Message types. Changing a field's type or order changes the encoding: the golden
//! byte tests in `tests/golden.rs` fail, and [`crate::PROTOCOL_VERSION`] must be bumped.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A sha256 digest, identifying content-addressed blobs (models and variants).
pub type Digest = [u8; 32];

/// Short hex form of a digest for logs and file names.
pub fn digest_hex(digest: &Digest) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------
// Enrolment
// ---------------------------------------------------------------------------------

/// First and only frame from an agent on the join stream of an unauthenticated
/// connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JoinRequest {
    pub protocol_version: u32,
    /// The secret part of the join token (the CA fingerprint part stays on the device).
    pub token_id: String,
    pub token_secret: String,
    /// Requested device name; the control plane refuses duplicates.
    pub name: String,
    pub role: String,
    /// A PKCS#10 certificate signing request for the agent's own key pair (DER).
    pub csr_der: Vec<u8>,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum JoinResponse {
    Accepted(JoinAccepted),
    Refused(ErrorFrame),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JoinAccepted {
    pub agent_id: String,
    pub region: String,
    /// The agent's client certificate, signed by the cluster CA (DER).
    pub certificate_der: Vec<u8>,
    /// The cluster CA certificate (DER); its sha256 equals the token's fingerprint.
    pub ca_der: Vec<u8>,
    /// Ed25519 public key that signs model manifests.
    pub manifest_signing_key: Vec<u8>,
}

// ---------------------------------------------------------------------------------
// Control stream
// ---------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentMessage {
    Hello(Hello),
    Heartbeat(Heartbeat),
    /// The node will be taken away (a spot interruption notice from its provider):
    /// the region drains it within the notice.
    Notice(InterruptionNotice),
    /// Usage the agent recorded and the control plane has not acknowledged yet, oldest
    /// first. Resent until acknowledged (`CloudMessage::UsageAck`); the control plane
    /// counts each `seq` once, so a resent record is not counted twice.
    Usage(UsageReport),
}

/// A batch of the agent's usage records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    pub records: Vec<UsageRecord>,
    /// Records the agent dropped, oldest first, because its queue was full (while the
    /// control plane was unreachable for long); counted since the agent enrolled.
    pub dropped: u64,
}

/// What one deployment served on one agent in one window of time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// Numbers the agent's records from 1, without gaps, across restarts.
    pub seq: u64,
    pub start_unix_ms: u64,
    pub end_unix_ms: u64,
    pub deployment: String,
    pub served_local: u64,
    pub served_offloaded: u64,
    pub failed: u64,
}

/// A node's provider announced that it will reclaim the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InterruptionNotice {
    /// Time left before the node goes away, in seconds.
    pub seconds: u32,
    /// Where the notice came from, for the operator (e.g. `SIGUSR1`, `metadata service`).
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    pub agent_version: String,
    pub role: String,
    /// Profile name (a file in `firmware-profiles/`, or `detected`).
    pub profile_name: String,
    /// The full profile as TOML; the control plane validates it.
    pub profile_toml: String,
    /// Models already in the agent's cache, by content hash.
    pub models_cached: Vec<Digest>,
    /// Where applications on the device reach the agent, e.g. `127.0.0.1:8700`.
    pub local_endpoint: String,
    /// What the node reports of itself (pool role): its address for gang rendezvous
    /// and its GPUs as the driver lists them.
    pub node: NodeReport,
    /// Job members this agent is running or has finished (after an agent or control
    /// plane restart the region reconciles with this).
    pub jobs: Vec<JobMemberStatus>,
}

/// A pool node's own report.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeReport {
    /// Host or IP other members of a gang reach this node at (`MASTER_ADDR` when it
    /// holds rank 0); empty: the host part of `local_endpoint`.
    pub address: String,
    /// GPUs as the driver lists them (`nvidia-smi -L`); empty where there are none or
    /// no driver answers.
    pub gpus: Vec<GpuReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuReport {
    pub index: u32,
    pub model: String,
    pub uuid: String,
    /// MIG instances on this GPU, in the driver's order.
    pub mig: Vec<MigReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigReport {
    /// e.g. `1g.10gb`.
    pub profile: String,
    /// e.g. `MIG-7c5f…`: what `CUDA_VISIBLE_DEVICES` names the slice by.
    pub uuid: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CloudMessage {
    Welcome(Welcome),
    DesiredState(DesiredState),
    /// The control plane refuses the session; it closes the connection after this.
    Refused(ErrorFrame),
    /// Every usage record up to this `seq` is counted: the agent may forget them.
    UsageAck {
        up_to: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    pub agent_id: String,
    pub region: String,
    pub heartbeat_interval_ms: u32,
}

/// The whole desired state of one agent. Level-triggered: each message replaces the
/// previous one, so a repeated or lost message does no harm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DesiredState {
    pub generation: u64,
    pub assignments: Vec<Assignment>,
    /// Pool role: every job member this agent must be running. A member it runs that
    /// is not listed is stopped (SIGTERM, then SIGKILL after its `grace_ms`); a listed
    /// one it already started (same job, attempt and member) is never started again.
    pub jobs: Vec<JobLaunch>,
}

/// One member of one attempt of a job, to run as a process on a pool node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLaunch {
    /// `<tenant>/<name>/<n>`, unique in the agent's region: `n` numbers the job's
    /// submissions, so a job deleted and submitted again under its name is a new key.
    pub job: String,
    /// Starts at 1; a requeued or retried job runs again as the next attempt.
    pub attempt: u32,
    pub member: u16,
    /// Program and arguments (no shell).
    pub argv: Vec<String>,
    /// Environment on top of the agent's minimal one: the user's, then `RANK`,
    /// `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`, `CUDA_VISIBLE_DEVICES`,
    /// `NEPHELE_CHECKPOINT_DIR` and the `NEPHELE_JOB*` names set by the control plane.
    pub env: Vec<(String, String)>,
    /// Working directory; empty: a directory of its own in the agent's data dir.
    pub working_dir: String,
    /// Time between SIGTERM and SIGKILL when the member is stopped.
    pub grace_ms: u64,
}

/// What became of one job member on an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMemberStatus {
    pub job: String,
    pub attempt: u32,
    pub member: u16,
    pub state: MemberState,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    Running {
        pid: u32,
        started_unix: u64,
    },
    /// Sent SIGTERM (it is no longer desired); SIGKILL follows at the grace deadline.
    Stopping {
        pid: u32,
    },
    /// Exited by itself or after a stop: the exit code, or the signal that ended it.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        finished_unix: u64,
    },
    /// The process could not be started (no such program, bad working dir…).
    FailedToStart(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    pub deployment: String,
    pub model: SignedManifest,
    /// Which variant of the manifest to run, e.g. `full`.
    pub variant: String,
    /// Latency objective of one request, end to end on the device.
    pub slo_ms: u32,
    /// Whether requests the device cannot serve in time may go to the region's pool.
    pub offload: bool,
    /// Local queue bound; requests beyond it are offloaded (or refused without offload).
    pub max_queue: u32,
    /// Joint inference: a local answer whose top-class probability (softmax of the
    /// output) is below this is re-asked in the cloud, when offload is allowed.
    pub hard_example_threshold: Option<f32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub seq: u64,
    pub uptime_ms: u64,
    /// The `DesiredState::generation` the agent has applied.
    pub applied_generation: u64,
    pub rss_bytes: u64,
    pub deployments: Vec<DeploymentTelemetry>,
    /// The agent's link to the control plane as it measures it.
    pub link: LinkReport,
    /// Pool role: every job member it runs, or ran and the desired state still lists
    /// or listed in the last two minutes (so a stopped member's exit is heard).
    pub jobs: Vec<JobMemberStatus>,
}

/// A link measurement: what the split planner plans a device's cut with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LinkReport {
    /// QUIC's smoothed round-trip time, µs.
    pub rtt_us: u64,
    /// Throughput of recent blob transfers, bits per second (0: nothing measured yet).
    pub bandwidth_bps: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DeploymentPhase {
    Pending,
    Downloading,
    Ready,
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeploymentTelemetry {
    pub deployment: String,
    pub phase: DeploymentPhase,
    pub variant: String,
    pub served_local: u64,
    pub served_offloaded: u64,
    pub failed: u64,
    pub queue_len: u32,
    pub p50_us: u64,
    pub p99_us: u64,
    /// Compute time of one request (batch 1) that the agent measured for this variant
    /// when it loaded it, µs; 0 when not measured. What the control plane plans split
    /// cuts with, instead of the profile's peak TOPS.
    pub service_us: u64,
    /// The sha256 of the variant file it runs (zero while none runs): which model
    /// version serves, so a rollout knows a device runs the new one.
    pub model_sha256: Digest,
}

impl DeploymentTelemetry {
    /// Telemetry of a deployment that serves nothing yet (pending, downloading, failed).
    pub fn idle(deployment: &str, phase: DeploymentPhase) -> Self {
        DeploymentTelemetry {
            deployment: deployment.to_string(),
            phase,
            variant: String::new(),
            served_local: 0,
            served_offloaded: 0,
            failed: 0,
            queue_len: 0,
            p50_us: 0,
            p99_us: 0,
            service_us: 0,
            model_sha256: [0; 32],
        }
    }
}

// ---------------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------------

/// A manifest as signed by the control plane: the exact bincode bytes of a
/// [`ModelManifest`] and an Ed25519 signature over them. Agents verify before decoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignedManifest {
    pub manifest: Vec<u8>,
    pub signature: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelManifest {
    pub name: String,
    pub format: String,
    pub created_unix: u64,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    /// What the variants were measured on, e.g. `360 labelled rows`.
    pub validation: String,
    /// Only variants that passed their checks against the full model are listed.
    pub variants: Vec<ModelVariant>,
    /// Recurrent state of a stateful model (empty for a stateless one): devices keep it
    /// per client session.
    pub state: Vec<StateBinding>,
}

/// One recurrent state of a stateful model: what the model returns as `output` is fed
/// back as `input` on the same session's next request (zeros on its first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateBinding {
    pub input: String,
    pub output: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorSpec {
    pub name: String,
    /// Dimensions; `-1` for a symbolic one (the batch).
    pub shape: Vec<i64>,
    pub dtype: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelVariant {
    /// `full`, `int8` or `split@<cut tensor>`.
    pub name: String,
    pub kind: VariantKind,
    pub precision: String,
    /// The file the device runs (the head, for a split).
    pub sha256: Digest,
    pub size: u64,
    /// Accuracy (0..1) on the model's validation data, when it is labelled.
    pub accuracy: Option<f32>,
    /// Lowest cosine similarity of this variant's outputs to the full model's over the
    /// validation rows (1 for `full`).
    pub min_cosine: Option<f32>,
    /// Compute for one row, in FLOPs (tract's cost model).
    pub flops: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum VariantKind {
    Full,
    /// Weights stored as int8 with per-channel scales, computed in f32.
    Int8Weights,
    /// The head runs on the device and sends the activation at `cut` to the tail,
    /// which runs in the region's pool.
    Split {
        cut: String,
        /// f32 bytes of one row's activation at the cut.
        activation_bytes: u64,
        head_flops: u64,
        tail_flops: u64,
        tail_sha256: Digest,
        tail_size: u64,
    },
}

// ---------------------------------------------------------------------------------
// Request streams
// ---------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamRequest {
    pub protocol_version: u32,
    pub body: RequestBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RequestBody {
    /// A byte range of a content-addressed blob.
    FetchChunk {
        sha256: Digest,
        offset: u64,
        len: u32,
    },
    /// One inference request for a deployment.
    Infer(InferRequest),
    /// Bytes of a job member's log (stdout and stderr as they came), from `offset`.
    JobLogs {
        job: String,
        attempt: u32,
        member: u16,
        offset: u64,
        max_bytes: u32,
    },
    /// Agent → cloud: a certificate for a new key (its CSR), before the current one
    /// expires. Answered with `Certificate`; the control plane then accepts the old and
    /// the new certificate until the agent first connects with the new one.
    RenewCertificate { csr_der: Vec<u8> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferRequest {
    pub deployment: String,
    pub request_id: u64,
    pub input: Payload,
    /// What to run on `input`.
    pub stage: InferStage,
    /// The W3C trace context of the span that sent it (the caller's), so the spans of
    /// the next hop join the same trace; `None` when the request is not traced.
    pub trace: Option<TraceParent>,
}

/// A W3C trace context (`traceparent` without its text form): the trace, the sending
/// span, and the trace flags (bit 0: sampled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

/// What an inference request asks the serving agent to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InferStage {
    /// The deployment's whole model on the request's input.
    Whole,
    /// Only the tail of the split variant `variant` (`split@<cut>`): the input is the
    /// activation at the cut, as the device's head computed it.
    Tail { variant: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StreamResponse {
    Chunk {
        total_size: u64,
        data: Vec<u8>,
    },
    Inferred(InferResponse),
    Error(ErrorFrame),
    /// Part of a job member's log: `data` starts at the requested offset.
    Logs {
        data: Vec<u8>,
        /// Size of the log so far.
        size: u64,
        /// The member has exited: the log will not grow.
        finished: bool,
    },
    /// The answer to `RenewCertificate`: the agent's new certificate (DER).
    Certificate {
        certificate_der: Vec<u8>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferResponse {
    pub request_id: u64,
    pub output: Payload,
    /// Name of the agent that computed it.
    pub computed_by: String,
    pub compute_us: u64,
}

/// What an inference request carries, or its answer: one f32 tensor (models with one
/// input and one output, which the batcher batches), or the named typed tensors of a
/// model with several inputs and outputs (for a stateful model, its recurrent state
/// travels as inputs and comes back as outputs, so the replica keeps nothing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Payload {
    Tensor(Tensor),
    Typed(Vec<TypedTensor>),
}

impl Payload {
    /// Checks every tensor's size against its shape (and, for typed tensors, that the
    /// names are distinct).
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Payload::Tensor(tensor) => tensor.validate(),
            Payload::Typed(tensors) => {
                for (k, tensor) in tensors.iter().enumerate() {
                    tensor.validate()?;
                    if tensors[..k].iter().any(|t| t.name == tensor.name) {
                        return Err(format!("tensor {} is given twice", tensor.name));
                    }
                }
                Ok(())
            }
        }
    }

    /// Bytes of tensor data it carries.
    pub fn data_bytes(&self) -> usize {
        match self {
            Payload::Tensor(tensor) => tensor.data.len().saturating_mul(4),
            Payload::Typed(tensors) => tensors.iter().map(|t| t.data.len()).sum(),
        }
    }
}

/// The element type of a [`TypedTensor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DType {
    F32,
    F16,
    I64,
    I32,
    U8,
    Bool,
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 => 2,
            DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// The name requests and manifests use (`f32`, `i64`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    pub fn parse(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

/// One named tensor of a typed model's request or answer: the values little-endian in
/// row-major order (`bool` one byte, 0 or 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TypedTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u32>,
    pub data: Vec<u8>,
}

impl TypedTensor {
    /// Checks that `data` holds exactly the bytes `shape` and `dtype` describe.
    pub fn validate(&self) -> Result<(), String> {
        let bytes = self
            .shape
            .iter()
            .try_fold(self.dtype.size() as u64, |acc, dim| {
                acc.checked_mul(u64::from(*dim))
            });
        match bytes {
            Some(n) if n == self.data.len() as u64 => Ok(()),
            Some(n) => Err(format!(
                "tensor {} ({} {:?}) needs {n} bytes but {} were given",
                self.name,
                self.dtype.name(),
                self.shape,
                self.data.len()
            )),
            None => Err(format!(
                "tensor {} shape {:?} overflows",
                self.name, self.shape
            )),
        }
    }
}

/// A dense f32 tensor in row-major order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tensor {
    pub shape: Vec<u32>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// Checks that `data` holds exactly the elements `shape` describes.
    pub fn validate(&self) -> Result<(), String> {
        let elements = self
            .shape
            .iter()
            .try_fold(1u64, |acc, dim| acc.checked_mul(u64::from(*dim)));
        match elements {
            Some(n) if n == self.data.len() as u64 => Ok(()),
            Some(n) => Err(format!(
                "tensor shape {:?} needs {n} values but {} were given",
                self.shape,
                self.data.len()
            )),
            None => Err(format!("tensor shape {:?} overflows", self.shape)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    BadRequest,
    Unauthorized,
    NotFound,
    Unavailable,
    Overloaded,
    Internal,
    VersionMismatch,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorFrame {
    pub code: ErrorCode,
    pub message: String,
    /// For `Overloaded`: when to try again, ms (admission control's Retry-After).
    pub retry_after_ms: Option<u32>,
}

impl ErrorFrame {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorFrame {
            code,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// An `Overloaded` answer that says when to retry.
    pub fn overloaded(message: impl Into<String>, retry_after_ms: u32) -> Self {
        ErrorFrame {
            code: ErrorCode::Overloaded,
            message: message.into(),
            retry_after_ms: Some(retry_after_ms),
        }
    }
}

impl std::fmt::Display for ErrorFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}
