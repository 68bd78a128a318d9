//! What the API shows of the fleet: the views are the API's own types
//! (`nephele_api`); here the federation core's records become them.

pub use nephele_api::{
    AcceleratorView, ApiTokenSpec, ApiTokenView, BuildProgressView, CutView, DeploymentSpec,
    DeploymentStatus, DeploymentTotals, DeviceDeploymentStatus, DeviceRunning, DeviceView,
    JoinTokenView, LinkView, ModelView, PoolView, RegionView, RolloutView, StateBindingView,
    TenantView, TensorView, VariantView,
};

use super::ModelState;
use crate::store::{ModelRecord, VariantRecord};

/// A deployment's phase on a device as the API writes it: `ready`, `downloading`,
/// `pending` or `failed: <why>`.
pub fn phase_text(phase: &nephele_proto::DeploymentPhase) -> String {
    use nephele_proto::DeploymentPhase::*;
    match phase {
        Pending => "pending".into(),
        Downloading => "downloading".into(),
        Ready => "ready".into(),
        Failed(reason) => format!("failed: {reason}"),
    }
}

/// A model input or output as the API shows it.
pub fn tensor_view(info: &nephele_runtime::TensorInfo) -> TensorView {
    TensorView {
        name: info.name.clone(),
        shape: info.shape.clone(),
        dtype: info.dtype.clone(),
    }
}

pub fn state_binding_view(binding: &nephele_proto::StateBinding) -> StateBindingView {
    StateBindingView {
        input: binding.input.clone(),
        output: binding.output.clone(),
    }
}

pub fn progress_view(progress: &nephele_runtime::variants::BuildProgress) -> BuildProgressView {
    BuildProgressView {
        done: progress.done,
        total: progress.total,
        step: progress.step.clone(),
    }
}

pub fn cut_view(cut: &nephele_runtime::variants::CutInfo) -> CutView {
    CutView {
        tensor: cut.tensor.clone(),
        shape: cut.shape.clone(),
        activation_bytes: cut.activation_bytes,
        head_flops: cut.head_flops,
        tail_flops: cut.tail_flops,
        chosen_because: cut.chosen_because.clone(),
    }
}

pub fn link_view(link: &nephele_proto::LinkReport) -> LinkView {
    LinkView {
        rtt_us: link.rtt_us,
        bandwidth_bps: link.bandwidth_bps,
    }
}

pub fn pool_view(pool: &crate::config::PoolConfig) -> PoolView {
    PoolView {
        name: pool.name.clone(),
        node_profile: pool.node_profile.clone(),
        capacity_type: pool.capacity_type.clone(),
        price_per_hour: pool.price_per_hour,
        max_nodes: pool.max_nodes,
        mig_profile: pool.mig_profile.clone(),
        interruptions_per_1000h: pool.interruptions_per_1000h,
        provider: pool.provider.as_str().to_string(),
        min_nodes: pool.min_nodes,
    }
}

/// A stored model version as the API shows it: every variant with whether it ships and
/// why.
pub fn model_view(record: &ModelRecord) -> ModelView {
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
            accepted_on: None,
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
        recurrent_state: record
            .recurrent_state
            .iter()
            .map(state_binding_view)
            .collect(),
        sha256: record.sha256.clone(),
        size: record.size,
        created_unix: record.created_unix,
        inputs: record.inputs.iter().map(tensor_view).collect(),
        outputs: record.outputs.iter().map(tensor_view).collect(),
        validation: record.validation.clone(),
        variants,
        format: record.format.clone(),
    }
}
