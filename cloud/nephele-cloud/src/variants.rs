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
use nephele_infer_policy::split::{plan_split, AllowedCuts, LayerProfile, Link, SplitModel};
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

/// A device's capabilities, or why its profile gives none. The federation core works
/// them out once per profile a device announces, not per deployment per broadcast.
pub type Caps = Result<DeviceCaps, String>;

/// The runtime's capabilities on a device described by `profile_toml`.
pub fn device_caps(profile_toml: &str) -> Result<DeviceCaps, String> {
    let profile = FirmwareProfile::from_toml(profile_toml, None).map_err(|e| e.to_string())?;
    caps_of(&profile)
}

/// The runtime's capabilities on a device described by `profile`.
pub fn caps_of(profile: &FirmwareProfile) -> Result<DeviceCaps, String> {
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

/// The deployment variant that asks the split planner to choose the cut per device.
pub const PLANNED_SPLIT: &str = "split";

/// Whole-model compute times (batch 1, µs) the agents measured for one model: on the
/// device being planned for and on the pool replica that would run its tail.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeasuredTimes {
    pub device_full_us: Option<u64>,
    pub pool_full_us: Option<u64>,
}

/// The cut an edge device runs for a `variant = "split"` deployment: the Neurosurgeon
/// choice ([`plan_split`]) over the manifest's cuts, with
///
/// | input            | from                                                                 |
/// |------------------|----------------------------------------------------------------------|
/// | segments         | the `split@` variants ordered by head FLOPs: FLOPs between cuts       |
/// | edge / cloud time| the whole model's compute time the device / the pool replica measured (`MeasuredTimes`), shared out by segment FLOPs; before a measurement, segment FLOPs at the profile's peak fp32 |
/// | bytes at a cut   | the variant's activation bytes; the model input for the whole offload |
/// | link             | RTT and transfer throughput the device reports in its heartbeats     |
///
/// Peak TOPS overstate what a runtime reaches, and not by the same factor on every
/// device, so a measured time replaces them as soon as the agent reports one (the
/// federation re-plans then). The whole model, locally or as a whole offload (which the
/// per-request offload policy already does), is `full`. No link measurement yet, no
/// pool in the region, or no cut: `full`, with the reason.
pub fn split_for(
    manifest: &ModelManifest,
    device_caps: &Caps,
    pool_caps: Option<&Caps>,
    link: Option<Link>,
    measured: MeasuredTimes,
) -> VariantDecision {
    let full = |why: String| VariantDecision {
        variant: "full".into(),
        why,
    };
    let Some(pool_caps) = pool_caps else {
        return full("split planner: no pool replica in the region to run a tail".into());
    };
    let Some(link) = link.filter(|l| l.bandwidth_bps > 0.0) else {
        return full("split planner: the device has not measured its link yet".into());
    };
    let (device, pool) = match (device_caps, pool_caps) {
        (Ok(device), Ok(pool)) => (device, pool),
        (Err(error), _) | (_, Err(error)) => {
            return full(format!("split planner: no usable profile ({error})"))
        }
    };
    if device.peak_tops_fp32 <= 0.0 || pool.peak_tops_fp32 <= 0.0 {
        return full("split planner: a profile has no fp32 peak".into());
    }
    let Some(full_flops) = manifest
        .variants
        .iter()
        .find(|v| v.kind == VariantKind::Full)
        .map(|v| v.flops)
    else {
        return full("split planner: the manifest has no full variant".into());
    };
    let mut cuts: Vec<(&str, u64, u64)> = manifest
        .variants
        .iter()
        .filter_map(|v| match &v.kind {
            VariantKind::Split {
                head_flops,
                activation_bytes,
                ..
            } => Some((v.name.as_str(), *head_flops, *activation_bytes)),
            _ => None,
        })
        .collect();
    if cuts.is_empty() {
        return full("split planner: the model has no split variants".into());
    }
    cuts.sort_by_key(|&(name, head_flops, _)| (head_flops, name));
    // A measured whole-model time shared out by FLOPs; else the peak: tera-operations
    // per second = 10⁶ operations per µs.
    let timer = |measured_us: Option<u64>, tops: f64| {
        let measured = measured_us.filter(|us| *us > 0 && full_flops > 0);
        move |flops: u64| match measured {
            Some(us) => flops as f64 / full_flops as f64 * us as f64,
            None => flops as f64 / (tops * 1e6),
        }
    };
    let edge_time = timer(measured.device_full_us, device.peak_tops_fp32);
    let cloud_time = timer(measured.pool_full_us, pool.peak_tops_fp32);
    let mut layers = Vec::with_capacity(cuts.len() + 1);
    let mut done = 0u64;
    for &(name, head_flops, activation_bytes) in &cuts {
        let flops = head_flops.saturating_sub(done);
        layers.push(LayerProfile {
            name: name.to_string(),
            edge_us: edge_time(flops),
            cloud_us: cloud_time(flops),
            output_bytes: activation_bytes,
        });
        done = done.max(head_flops);
    }
    let rest = full_flops.saturating_sub(done);
    let output_bytes = tensor_bytes(manifest.outputs.first().map(|t| t.shape.as_slice()));
    layers.push(LayerProfile {
        name: "output".into(),
        edge_us: edge_time(rest),
        cloud_us: cloud_time(rest),
        output_bytes,
    });
    let source = |us: Option<u64>| match us.filter(|us| *us > 0) {
        Some(us) => format!("measured {:.3} ms", us as f64 / 1e3),
        None => "from peak TOPS".to_string(),
    };
    let inputs = format!(
        "device time {}, pool time {}",
        source(measured.device_full_us),
        source(measured.pool_full_us)
    );
    let model = SplitModel {
        layers,
        input_bytes: tensor_bytes(manifest.inputs.first().map(|t| t.shape.as_slice())),
        allowed_cuts: AllowedCuts::All,
        // One request or answer is one frame on the wire.
        max_transfer_bytes: Some(nephele_proto::MAX_TENSOR_BYTES as u64),
    };
    let n_layers = model.layers.len();
    match plan_split(&model, link, 0.0) {
        Ok(plan) => {
            let at = |cut: usize| plan.per_cut.get(cut).copied().unwrap_or(f64::INFINITY);
            let summary = format!(
                "at {:.1} Mbit/s, RTT {:.1} ms: local {:.3} ms, whole offload {:.3} ms ({inputs})",
                link.bandwidth_bps / 1e6,
                link.rtt_us / 1e3,
                at(n_layers) / 1e3,
                at(0) / 1e3
            );
            match cuts
                .get(plan.cut.wrapping_sub(1))
                .filter(|_| plan.cut < n_layers)
            {
                Some(&(name, _, _)) => VariantDecision {
                    variant: name.to_string(),
                    why: format!(
                        "split planner: {name} expected {:.3} ms {summary}",
                        plan.expected_us / 1e3
                    ),
                },
                None => full(format!(
                    "split planner: no cut beats the whole model {summary}"
                )),
            }
        }
        Err(error) => full(format!("split planner: {error}")),
    }
}

/// f32 bytes of one row of a tensor (the batch dimension, `-1`, left out).
fn tensor_bytes(shape: Option<&[i64]>) -> u64 {
    shape
        .unwrap_or(&[])
        .iter()
        .filter(|d| **d > 0)
        .map(|d| *d as u64)
        .product::<u64>()
        .saturating_mul(4)
}

/// The variant a device of `role` with `caps` runs for a deployment that asked for
/// `requested`.
pub fn variant_for(
    role: AgentRole,
    caps: &Caps,
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
    let caps = match caps {
        Ok(caps) => caps,
        Err(error) => return full(format!("no usable profile ({error})")),
    };
    match choose_variant(&candidates(manifest), caps, &Constraints::default()) {
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
            state: vec![],
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
        let decision = variant_for(
            role,
            &device_caps(profile(profile_name)),
            &manifest(full_size),
            requested,
        );
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
            &device_caps(profile("coral-dev-board")),
            &manifest(8 * 1024 * MB),
            "auto",
        );
        assert_eq!(decision.variant, "full");
        assert!(decision.why.contains("int8"), "{decision:?}");
    }

    #[test]
    fn a_broken_profile_falls_back_to_full() {
        let decision = variant_for(
            AgentRole::Edge,
            &device_caps("not toml ["),
            &manifest(1000),
            "auto",
        );
        assert_eq!(decision.variant, "full");
        assert!(decision.why.contains("profile"), "{decision:?}");
    }

    /// A CNN-like model: the input is large, the activation after most of the early
    /// compute small, the rest of the compute heavy.
    fn cnn_manifest() -> ModelManifest {
        let split = |name: &str, head_flops: u64, activation_bytes: u64| ModelVariant {
            name: name.into(),
            kind: VariantKind::Split {
                cut: name.trim_start_matches("split@").into(),
                activation_bytes,
                head_flops,
                tail_flops: 2_000_000_000 - head_flops,
                tail_sha256: [0; 32],
                tail_size: 1,
            },
            precision: "fp32".into(),
            sha256: [0; 32],
            size: 1,
            accuracy: None,
            min_cosine: Some(1.0),
            flops: 2_000_000_000,
        };
        let mut manifest = manifest(10_000_000);
        manifest.inputs[0].shape = vec![-1, 3, 224, 224];
        manifest.outputs = vec![TensorSpec {
            name: "logits".into(),
            shape: vec![-1, 1000],
            dtype: "f32".into(),
        }];
        for variant in &mut manifest.variants {
            variant.flops = 2_000_000_000;
        }
        // Listed out of order: the planner orders cuts by head FLOPs.
        manifest.variants.push(split("split@b", 400_000_000, 8_192));
        manifest
            .variants
            .push(split("split@a", 100_000_000, 200_704));
        manifest
    }

    #[test]
    fn the_split_planner_cuts_where_the_link_pays() {
        let cnn = cnn_manifest();
        let coral = &device_caps(profile("coral-dev-board"));
        let pool_caps = device_caps(profile("gpu-4x-l4"));
        let pool = Some(&pool_caps);
        let link = |mbit: f64| {
            Some(Link {
                bandwidth_bps: mbit * 1e6,
                rtt_us: 10_000.0,
            })
        };
        // 100 Mbit/s: the Coral's CPU (0.048 TOPS) runs the whole model in ~42 ms;
        // after cut b, 8 KB cross in 0.7 ms and the pool's tail takes 0.5 ms: ~19.5 ms.
        let fast = split_for(&cnn, coral, pool, link(100.0), MeasuredTimes::default());
        assert_eq!(fast.variant, "split@b", "{fast:?}");
        assert!(fast.why.contains("local 41.667 ms"), "{fast:?}");
        // 1 Mbit/s: 8 KB take 66 ms; nothing beats running it all on the device.
        let slow = split_for(&cnn, coral, pool, link(1.0), MeasuredTimes::default());
        assert_eq!(slow.variant, "full", "{slow:?}");
        assert!(slow.why.contains("no cut beats"), "{slow:?}");
        assert!(fast.why.contains("device time from peak TOPS"), "{fast:?}");
        // Measured: a device that runs the whole model in 4 ms, not the 42 its peak
        // says, keeps it even at 100 Mbit/s (any offload costs the 10 ms round trip); one
        // measured at 400 ms splits after b even at 1 Mbit/s, where the estimate kept
        // the whole model (80 ms head, 66 ms for 8 KB up, 33 ms for the answer back).
        let measured = |device_ms: u64| MeasuredTimes {
            device_full_us: Some(device_ms * 1000),
            pool_full_us: Some(1_000),
        };
        let quick = split_for(&cnn, coral, pool, link(100.0), measured(4));
        assert_eq!(quick.variant, "full", "{quick:?}");
        assert!(
            quick.why.contains("device time measured 4.000 ms"),
            "{quick:?}"
        );
        let sluggish = split_for(&cnn, coral, pool, link(1.0), measured(400));
        assert_eq!(sluggish.variant, "split@b", "{sluggish:?}");
        // No measurement, no pool, no cut, a broken profile: the whole model.
        for (decision, why) in [
            (
                split_for(&cnn, coral, pool, None, MeasuredTimes::default()),
                "not measured",
            ),
            (
                split_for(&cnn, coral, None, link(100.0), MeasuredTimes::default()),
                "no pool",
            ),
            (
                split_for(
                    &manifest(70_000),
                    coral,
                    pool,
                    link(100.0),
                    MeasuredTimes::default(),
                ),
                "no split variants",
            ),
            (
                split_for(
                    &cnn,
                    &device_caps("not toml ["),
                    pool,
                    link(100.0),
                    MeasuredTimes::default(),
                ),
                "profile",
            ),
        ] {
            assert_eq!(decision.variant, "full", "{decision:?}");
            assert!(decision.why.contains(why), "{why}: {decision:?}");
        }
    }
}
