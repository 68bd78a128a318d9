//! Nodes and pod requests. A GPU is 1000 milli-GPU; a pod asks for `num_gpu` GPUs with
//! `gpu_milli` each (fractional sharing only for one GPU, as in the openb trace).

/// Capacity of one GPU in milli-GPU.
pub const MILLI_PER_GPU: u32 = 1000;

/// An interned GPU model name (index into the cluster's model table).
pub type GpuModel = u16;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeSpec {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u8,
    /// `None` for CPU-only nodes.
    pub gpu_model: Option<GpuModel>,
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
}

impl PodRequest {
    /// Total milli-GPU requested.
    pub fn gpu_total(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
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
    InsufficientCpu,
    InsufficientMemory,
    NoGpu,
    GpuModelMismatch,
    InsufficientGpu,
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
        }
    }
}
