//! How a deployment's cloud replicas are sized and bounded: from what the deployment
//! asks (`replicas` in `POST /v1/deployments`), else the control plane's `[autoscale]`
//! defaults, with the GPU share sized from the model.
//!
//! Sizing rule, when the deployment names no `gpu_milli` or `mig_profile`: a replica
//! needs about four times its model's bytes in GPU memory (weights, activations and the
//! runtime's workspace), measured against a 16 GiB reference GPU, rounded up to a tenth
//! of a GPU: a 70 KB model takes 100 milli-GPU, a 4 GB one 1000. Memory on the node is
//! the same four times the model, at least `replica_memory_mib`.

use crate::config::AutoscaleConfig;
use crate::scheduler::ReplicaSpec;
use crate::store::{DeploymentRecord, ReplicaSettings};

/// GPU memory of the reference GPU the share is sized against, bytes.
const REFERENCE_GPU_BYTES: u64 = 16 << 30;
/// GPU (and host) memory a replica needs per byte of model.
const BYTES_PER_MODEL_BYTE: u64 = 4;

/// The replica spec of `deployment` and the p99 latency (ms) its autoscaler keeps.
pub fn replica_spec(
    deployment: &DeploymentRecord,
    model_bytes: u64,
    defaults: &AutoscaleConfig,
) -> (ReplicaSpec, u32) {
    let asked = &deployment.replicas;
    let need = model_bytes.saturating_mul(BYTES_PER_MODEL_BYTE);
    let sized_milli = need
        .saturating_mul(1000)
        .div_ceil(REFERENCE_GPU_BYTES)
        .div_ceil(100)
        .saturating_mul(100)
        .clamp(100, 1000) as u32;
    let sized_memory = (need >> 20) + 256;
    let min = asked.min.unwrap_or(defaults.min_replicas);
    let max = asked.max.unwrap_or(defaults.max_replicas).max(min);
    (
        ReplicaSpec {
            deployment: deployment.name.clone(),
            cpu_milli: asked.cpu_milli.unwrap_or(defaults.replica_cpu_milli),
            memory_mib: asked
                .memory_mib
                .unwrap_or(defaults.replica_memory_mib.max(sized_memory)),
            gpu_milli: asked.gpu_milli.unwrap_or(sized_milli),
            mig_profile: asked.mig_profile.clone(),
            priority: asked.priority.unwrap_or(defaults.replica_priority),
            min,
            max,
            spot_ok: asked.spot_ok.unwrap_or(true),
        },
        asked.target_p99_ms.unwrap_or(deployment.slo_ms),
    )
}

/// Checks what a deployment asks of its replicas.
pub fn validate(settings: &ReplicaSettings) -> Result<(), String> {
    if let (Some(min), Some(max)) = (settings.min, settings.max) {
        if min > max {
            return Err(format!(
                "replicas.min ({min}) is above replicas.max ({max})"
            ));
        }
    }
    if settings.max.is_some_and(|m| m == 0 || m > 1024) {
        return Err("replicas.max must be 1..=1024".into());
    }
    if settings.min.is_some_and(|m| m > 1024) {
        return Err("replicas.min must be at most 1024".into());
    }
    if settings.gpu_milli.is_some_and(|m| m == 0 || m > 1000) {
        return Err("replicas.gpu_milli is a share of one GPU: 1..=1000".into());
    }
    if settings.gpu_milli.is_some() && settings.mig_profile.is_some() {
        return Err("replicas: give gpu_milli or mig_profile, not both".into());
    }
    if let Some(profile) = &settings.mig_profile {
        if nephele_placement::MigProfile::parse(profile).is_none() {
            return Err(format!(
                "replicas.mig_profile {profile:?} must look like 1g.10gb"
            ));
        }
    }
    if settings.cpu_milli == Some(0) || settings.memory_mib == Some(0) {
        return Err("replicas.cpu_milli and replicas.memory_mib must be > 0".into());
    }
    if settings.target_p99_ms == Some(0) {
        return Err("replicas.target_p99_ms must be > 0".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(replicas: ReplicaSettings) -> DeploymentRecord {
        DeploymentRecord {
            name: "d".into(),
            model: "m".into(),
            selector: String::new(),
            slo_ms: 20,
            offload: true,
            max_queue: 4,
            created_unix: 0,
            variant: "auto".into(),
            hard_example_threshold: None,
            replicas,
            rollout_settings: None,
            rollout: None,
            tenant: "default".into(),
        }
    }

    #[test]
    fn replicas_are_sized_from_the_model_unless_asked() {
        let defaults = AutoscaleConfig::default();
        let (small, target) = replica_spec(&deployment(Default::default()), 70_000, &defaults);
        assert_eq!((small.gpu_milli, target), (100, 20));
        assert_eq!(small.priority, 500);
        let (large, _) = replica_spec(&deployment(Default::default()), 2 << 30, &defaults);
        assert_eq!(large.gpu_milli, 500);
        let (huge, _) = replica_spec(&deployment(Default::default()), 8 << 30, &defaults);
        assert_eq!(huge.gpu_milli, 1000);
        assert!(huge.memory_mib >= 32 * 1024);
        let asked = ReplicaSettings {
            gpu_milli: Some(250),
            min: Some(2),
            max: Some(3),
            target_p99_ms: Some(50),
            ..Default::default()
        };
        let (spec, target) = replica_spec(&deployment(asked), 8 << 30, &defaults);
        assert_eq!(
            (spec.gpu_milli, spec.min, spec.max, target),
            (250, 2, 3, 50)
        );
        for bad in [
            ReplicaSettings {
                min: Some(3),
                max: Some(2),
                ..Default::default()
            },
            ReplicaSettings {
                gpu_milli: Some(0),
                ..Default::default()
            },
            ReplicaSettings {
                mig_profile: Some("big".into()),
                ..Default::default()
            },
            ReplicaSettings {
                max: Some(0),
                ..Default::default()
            },
        ] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
    }
}
