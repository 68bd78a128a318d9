//! Nodes and pod requests. A GPU is 1000 milli-GPU; a pod asks for `num_gpu` GPUs with
//! `gpu_milli` each (fractional sharing only for one GPU, as in the openb trace), or for
//! one MIG slice of a given profile.
//!
//! MIG: a GPU in MIG mode is carved into slices ([`MigPartition`]); a slice is a child
//! of its physical GPU and holds `profile.milli()` of the GPU's 1000 milli, so the
//! parent's capacity is never counted twice: whole-GPU and fractional pods never land on
//! a MIG GPU, and a slice taken lowers its parent's milli left by the slice's share.
//!
//! Static node facts that placement reads besides capacity: labels and taints (the
//! Kubernetes model), location (region / zone / rack, plus NVLink domains of the GPUs),
//! capacity type (spot or on-demand) with price and interruption rate.
use std::collections::BTreeMap;

/// Capacity of one GPU in milli-GPU.
pub const MILLI_PER_GPU: u32 = 1000;

/// An interned GPU model name (index into the cluster's model table).
pub type GpuModel = u16;

/// A MIG profile: sevenths of the GPU's compute and memory in GB (`1g.10gb` = 1, 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MigProfile {
    pub compute_sevenths: u8,
    pub memory_gb: u8,
}

impl MigProfile {
    /// The slice's share of its GPU in milli-GPU.
    pub fn milli(self) -> u32 {
        u32::from(self.compute_sevenths.min(7)) * MILLI_PER_GPU / 7
    }

    /// Parses `1g.10gb`-style names.
    pub fn parse(name: &str) -> Option<MigProfile> {
        let (compute, memory) = name.split_once('.')?;
        let compute_sevenths = compute.strip_suffix('g')?.parse().ok()?;
        let memory_gb = memory.strip_suffix("gb")?.parse().ok()?;
        (1..=7).contains(&compute_sevenths).then_some(MigProfile {
            compute_sevenths,
            memory_gb,
        })
    }
}

impl std::fmt::Display for MigProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}g.{}gb", self.compute_sevenths, self.memory_gb)
    }
}

/// `count` slices of `profile` carved from GPU `gpu` of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MigPartition {
    pub gpu: u8,
    pub profile: MigProfile,
    pub count: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum CapacityType {
    #[default]
    OnDemand,
    /// Cheaper, and taken back by the provider at `interruptions_per_1000h`.
    Spot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaintEffect {
    /// Pods that do not tolerate it are filtered out.
    NoSchedule,
    /// Pods that do not tolerate it score lower here.
    PreferNoSchedule,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Taint {
    pub key: String,
    pub effect: TaintEffect,
}

/// Where a node is. Ids are interned by the caller; equal ids mean the same domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Location {
    pub region: u16,
    pub zone: u16,
    pub rack: u32,
}

/// A failure or network domain level, from the finest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DomainLevel {
    Node,
    Rack,
    Zone,
    Region,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeSpec {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u8,
    /// `None` for CPU-only nodes.
    pub gpu_model: Option<GpuModel>,
    /// MIG partitions; a GPU named here serves MIG slices only.
    pub mig: Vec<MigPartition>,
    /// NVLink domain of each GPU (empty: all GPUs in one domain).
    pub nvlink_domain: Vec<u8>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub location: Location,
    pub capacity_type: CapacityType,
    /// Price of the whole node, micro-USD per hour (0 = unknown / owned).
    pub price_micro_usd_per_hour: u64,
    /// Expected provider interruptions per 1000 node-hours (spot).
    pub interruptions_per_1000h: u32,
}

impl NodeSpec {
    /// Whether GPU `gpu` is in MIG mode.
    pub fn is_mig(&self, gpu: u8) -> bool {
        self.mig.iter().any(|p| p.gpu == gpu)
    }

    /// The NVLink domain of GPU `gpu`.
    pub fn nvlink_domain_of(&self, gpu: u8) -> u8 {
        self.nvlink_domain
            .get(usize::from(gpu))
            .copied()
            .unwrap_or(0)
    }

    /// The id of this node's domain at `level` (node index for `Node`).
    pub fn domain(&self, level: DomainLevel, node: usize) -> u64 {
        match level {
            DomainLevel::Node => node as u64,
            DomainLevel::Rack => u64::from(self.location.rack),
            DomainLevel::Zone => u64::from(self.location.zone),
            DomainLevel::Region => u64::from(self.location.region),
        }
    }
}

/// Spread the members of one job across domains (replicas across failure domains).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Spread {
    /// Members with the same `job` count against each other.
    pub job: u64,
    pub level: DomainLevel,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PodRequest {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub num_gpu: u8,
    /// Per GPU; 1..=1000 when `num_gpu > 0`.
    pub gpu_milli: u32,
    /// Acceptable GPU models; empty means any.
    pub gpu_models: Vec<GpuModel>,
    /// One MIG slice of this profile instead of GPUs (`num_gpu` 1, `gpu_milli` the
    /// slice's share, as [`PodRequest::mig`] builds it).
    pub mig_profile: Option<MigProfile>,
    /// All GPUs from one NVLink domain of the node.
    pub same_nvlink: bool,
    /// Labels a node must carry (all of them).
    pub node_selector: BTreeMap<String, String>,
    /// Taint keys tolerated.
    pub tolerations: Vec<String>,
    /// May run on spot capacity (it can be interrupted).
    pub spot_ok: bool,
    /// Expected runtime and checkpoint interval in minutes (0 = unknown / none), for
    /// the expected cost of running on spot: an interruption loses the work since the
    /// last checkpoint.
    pub runtime_minutes: u32,
    pub checkpoint_minutes: u32,
    /// Where the pod's data is (region, zone), for the locality scorer.
    pub data_location: Option<(u16, u16)>,
    /// Spread across domains with the other members of a job.
    pub spread: Option<Spread>,
    /// Never on a node that already holds a pod of the same group (a deployment's
    /// replicas: one per node, since one agent serves a deployment once). Read from
    /// other placements, so such pods take the node-by-node path.
    pub anti_affinity: Option<u64>,
}

impl PodRequest {
    /// Total milli-GPU requested.
    pub fn gpu_total(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    /// A pod asking for one MIG slice of `profile`.
    pub fn mig(cpu_milli: u64, memory_mib: u64, profile: MigProfile) -> PodRequest {
        PodRequest {
            cpu_milli,
            memory_mib,
            num_gpu: 1,
            gpu_milli: profile.milli(),
            mig_profile: Some(profile),
            ..PodRequest::default()
        }
    }

    /// Work lost per interruption in hours: since the last checkpoint, or half the run
    /// when it does not checkpoint (or the run's length is unknown: one hour).
    pub fn expected_loss_hours(&self) -> f64 {
        if self.checkpoint_minutes > 0 {
            f64::from(self.checkpoint_minutes) / 120.0
        } else if self.runtime_minutes > 0 {
            f64::from(self.runtime_minutes) / 120.0
        } else {
            1.0
        }
    }

    pub fn accepts_model(&self, model: Option<GpuModel>) -> bool {
        match model {
            None => false,
            Some(model) => self.gpu_models.is_empty() || self.gpu_models.contains(&model),
        }
    }
}

/// Why a node cannot take a pod. Ordered cheapest check first, which is also the order
/// the filter applies them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    NodeDown,
    NodeSelectorMismatch,
    UntoleratedTaint,
    SpotNotAllowed,
    InsufficientCpu,
    InsufficientMemory,
    NoGpu,
    GpuModelMismatch,
    NoMigSlice,
    InsufficientGpu,
    NvlinkDomain,
    /// A pod of the same anti-affinity group is already on the node.
    AntiAffinity,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NodeDown => "node down",
            Reason::InsufficientCpu => "insufficient cpu",
            Reason::InsufficientMemory => "insufficient memory",
            Reason::NoGpu => "node has no gpu",
            Reason::GpuModelMismatch => "gpu model not accepted",
            Reason::InsufficientGpu => "insufficient gpu",
            Reason::NodeSelectorMismatch => "node selector mismatch",
            Reason::UntoleratedTaint => "untolerated taint",
            Reason::SpotNotAllowed => "spot not allowed",
            Reason::NoMigSlice => "no free mig slice of the profile",
            Reason::NvlinkDomain => "gpus not in one nvlink domain",
            Reason::AntiAffinity => "a replica of the same deployment is already there",
        }
    }
}
