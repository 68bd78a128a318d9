//! Which variant of a model each device runs: the deployment's request, or `auto`, the
//! pure choice of [`nephele_infer_policy::variant`] from the device's firmware profile.
//!
//! | device / request        | variant                                                      |
//! |-------------------------|--------------------------------------------------------------|
//! | pool replica            | `full`: offloaded and hard-example answers are the reference |
//! | edge, a variant name    | that variant (checked to exist when the deployment was made) |
//! | edge, `auto`            | `choose_variant` over the manifest's full and int8 variants  |
//! | edge, `auto`, no choice | `full`, with the reasons logged                              |
//!
//! int8 *weights* shrink the download and the stored file, not the memory of the loaded
//! plan (tract dequantises them when it loads), and compute at the full model's speed:
//! `auto` therefore keeps the reference model unless a measurement says otherwise, and
//! a deployment asks for `int8` by name where the download size matters.
//!
//! The device's capabilities are those of its CPU entry, because the runtime computes
//! on the CPU today (tract): an NPU or GPU in the profile counts once a backend drives
//! it. Split variants are placed by the split planner, not here.

use nephele_domain::{AcceleratorKind, AgentRole, FirmwareProfile, Precision as ProfilePrecision};
use nephele_infer_policy::variant::{
    choose_variant, Constraints, DeviceCaps, Precision, VariantInfo, VariantKind as PolicyKind,
};
use nephele_proto::{ModelManifest, VariantKind};

/// The variant a device gets and why, for logs and the deployment view.
#[derive(Debug, Clone, PartialEq)]
pub struct VariantDecision {
    pub variant: String,
    pub why: String,
}

/// The runtime's capabilities on a device described by `profile_toml`.
pub fn device_caps(profile_toml: &str) -> Result<DeviceCaps, String> {
    let profile = FirmwareProfile::from_toml(profile_toml, None).map_err(|e| e.to_string())?;
    let cpu = profile
        .accelerators
        .iter()
        .find(|a| a.kind == AcceleratorKind::Cpu)
        .ok_or_else(|| format!("profile {} has no cpu entry", profile.device.name))?;
    let precisions = cpu
        .precisions
        .iter()
        .filter_map(|p| match p {
            ProfilePrecision::Fp32 => Some(Precision::Fp32),
            ProfilePrecision::Fp16 => Some(Precision::Fp16),
            ProfilePrecision::Int8 => Some(Precision::Int8),
            _ => None,
        })
        .collect();
    let tops =
        |p: ProfilePrecision| cpu.peak_tops.get(&p).copied().unwrap_or(0.0) * f64::from(cpu.count);
    Ok(DeviceCaps::new(
        precisions,
        profile.device.memory_mb.saturating_mul(1 << 20),
        tops(ProfilePrecision::Fp32),
        tops(ProfilePrecision::Int8),
    ))
}

/// The manifest's whole-model variants as the policy sees them.
fn candidates(manifest: &ModelManifest) -> Vec<VariantInfo> {
    manifest
        .variants
        .iter()
        .filter_map(|v| {
            let kind = match v.kind {
                VariantKind::Full => PolicyKind::Full,
                VariantKind::Int8Weights => PolicyKind::Int8,
                VariantKind::Split { .. } => return None,
            };
            let full_accuracy = manifest
                .variants
                .iter()
                .find(|f| f.kind == VariantKind::Full)
                .and_then(|f| f.accuracy);
            Some(VariantInfo {
                name: v.name.clone(),
                // Weights-only int8 computes in f32.
                precision: Precision::Fp32,
                kind,
                size_bytes: v.size,
                // Loaded plans hold the weights in f32 whatever the file stores.
                peak_memory_bytes: manifest
                    .variants
                    .iter()
                    .find(|f| f.kind == VariantKind::Full)
                    .map_or(v.size, |f| f.size),
                agreement: v.min_cosine.map(f64::from),
                accuracy_drop_points: match (full_accuracy, v.accuracy) {
                    (Some(full), Some(this)) => Some(f64::from(full - this) * 100.0),
                    _ => None,
                },
                flops: v.flops,
                measured_latency_us: None,
            })
        })
        .collect()
}

/// The variant `role`/`profile_toml` runs for a deployment that asked for `requested`.
pub fn variant_for(
    role: AgentRole,
    profile_toml: &str,
    manifest: &ModelManifest,
    requested: &str,
) -> VariantDecision {
    let full = |why: String| VariantDecision {
        variant: "full".into(),
        why,
    };
    if role == AgentRole::Pool {
        return full("pool replicas run the reference model".into());
    }
    if requested != "auto" {
        return if manifest.variants.iter().any(|v| v.name == requested) {
            VariantDecision {
                variant: requested.to_string(),
                why: "requested by the deployment".into(),
            }
        } else {
            full(format!("the manifest has no variant {requested:?}"))
        };
    }
    let caps = match device_caps(profile_toml) {
        Ok(caps) => caps,
        Err(error) => return full(format!("no usable profile ({error})")),
    };
    match choose_variant(&candidates(manifest), &caps, &Constraints::default()) {
        Ok(choice) => VariantDecision {
            variant: choice.variant,
            why: format!("{:?}", choice.reason),
        },
        Err(none) => full(none.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nephele_proto::{ModelVariant, TensorSpec};

    fn manifest(full_size: u64) -> ModelManifest {
        let variant = |name: &str, kind: VariantKind, size: u64, cosine: f32| ModelVariant {
            name: name.into(),
            kind,
            precision: "fp32".into(),
            sha256: [0; 32],
            size,
            accuracy: Some(0.98),
            min_cosine: Some(cosine),
            flops: 34_000,
        };
        ModelManifest {
            name: "m".into(),
            format: "onnx".into(),
            created_unix: 0,
            inputs: vec![TensorSpec {
                name: "input".into(),
                shape: vec![-1, 64],
                dtype: "f32".into(),
            }],
            outputs: vec![],
            validation: "test".into(),
            variants: vec![
                variant("full", VariantKind::Full, full_size, 1.0),
                variant("int8", VariantKind::Int8Weights, full_size / 4, 0.9999),
            ],
        }
    }

    fn profile(name: &str) -> &'static str {
        nephele_domain::builtin_profiles::BUILTIN
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, toml)| *toml)
            .unwrap_or_else(|| panic!("no builtin profile {name}"))
    }

    fn check(role: AgentRole, profile_name: &str, full_size: u64, requested: &str, expected: &str) {
        let decision = variant_for(role, profile(profile_name), &manifest(full_size), requested);
        assert_eq!(
            decision.variant, expected,
            "{profile_name} {full_size} B {requested}: {decision:?}"
        );
    }

    #[test]
    fn variants_follow_the_rule_table() {
        const MB: u64 = 1 << 20;
        // Fits everywhere: the reference model, same speed as int8 weights.
        check(AgentRole::Edge, "rpi5-8gb", 70_000, "auto", "full");
        check(AgentRole::Edge, "coral-dev-board", 70_000, "auto", "full");
        // int8 weights are dequantised when loaded, so they need the full model's
        // memory: 900 MB fits neither variant on the Coral's 1 GB with headroom (full,
        // with the reasons), and both on the Jetson, which keeps the reference.
        check(AgentRole::Edge, "coral-dev-board", 900 * MB, "auto", "full");
        check(
            AgentRole::Edge,
            "jetson-orin-nano-8gb",
            900 * MB,
            "auto",
            "full",
        );
        // Asked for by name.
        check(AgentRole::Edge, "rpi5-8gb", 70_000, "int8", "int8");
        check(AgentRole::Edge, "rpi5-8gb", 70_000, "fp16", "full");
        // Pools always run the reference.
        check(AgentRole::Pool, "gpu-4x-l4", 70_000, "int8", "full");
        // Too big for anything: full, with the reasons.
        let decision = variant_for(
            AgentRole::Edge,
            profile("coral-dev-board"),
            &manifest(8 * 1024 * MB),
            "auto",
        );
        assert_eq!(decision.variant, "full");
        assert!(decision.why.contains("int8"), "{decision:?}");
    }

    #[test]
    fn a_broken_profile_falls_back_to_full() {
        let decision = variant_for(AgentRole::Edge, "not toml [", &manifest(1000), "auto");
        assert_eq!(decision.variant, "full");
        assert!(decision.why.contains("profile"), "{decision:?}");
    }
}
