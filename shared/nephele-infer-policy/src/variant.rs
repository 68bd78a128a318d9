//! Which model variant a device runs: filter the candidates, then take the fastest.
//!
//! Filters, cheapest first; the first one that fails is the candidate's [`RejectReason`]:
//!
//! | check (in order)                                                     | rejection              |
//! |----------------------------------------------------------------------|------------------------|
//! | kind is `SplitHead` / `SplitTail` (the `split` module places those)  | `SplitVariant`         |
//! | the device cannot compute in the variant's precision                 | `PrecisionUnsupported` |
//! | `max(size, peak memory)` + 10 % headroom > device memory             | `TooLarge`             |
//! | agreement with fp32 measured and below `min_agreement` (or NaN)      | `DisagreesWithFp32`    |
//! | accuracy drop measured and above `max_accuracy_drop_points` (or NaN) | `TooInaccurate`        |
//! | not the fp32 reference and neither agreement nor drop was measured   | `NotValidated`         |
//! | no measured latency and no positive peak TOPS to estimate one        | `NoLatencyEstimate`    |
//! | an SLO is given and the expected latency exceeds it                  | `TooSlow`              |
//!
//! A variant whose outputs disagree with fp32 is never chosen, however fast it is; a
//! reduced-precision variant nobody compared with fp32 is not chosen either.
//!
//! Ranking of the survivors: lowest expected latency, then the closest to fp32 (higher
//! agreement; the full model counts as 1), then smaller `size_bytes`, then name (so the
//! result does not depend on the order of the candidates). A weights-only int8 variant
//! computes at the full model's speed, so the full model keeps the device unless it
//! does not fit or the int8 one measured faster there: int8 is chosen for a reason,
//! never by default. The expected
//! latency is, first found wins:
//!
//! 1. the latency measured on this device (`DeviceCaps::measured`, by variant name);
//! 2. the latency carried with the variant (`VariantInfo::measured_latency_us`);
//! 3. `flops / (peak TOPS at the variant's precision × ESTIMATE_EFFICIENCY)`.
//!
//! The precision of a variant is the arithmetic it computes in, which is what the
//! device must support and whose peak TOPS the estimate uses: a weights-only quantised
//! variant (int8 weights dequantised to fp32) is `kind: Int8, precision: Fp32`, native
//! int8 compute is `kind: Int8, precision: Int8`. `DeviceCaps` carries no fp16 figure,
//! so fp16 is estimated at the fp32 peak (conservative: fp16 is rarely slower).

use serde::{Deserialize, Serialize};

/// Fraction of peak TOPS a model reaches in practice, used only when nothing was
/// measured. Between variants on one device only the ratio of peaks matters; against
/// an SLO this is a rough guess, which is why measurements take precedence.
pub const ESTIMATE_EFFICIENCY: f64 = 0.3;

/// Memory a variant needs beyond its peak, in percent of that peak (allocator slack,
/// runtime buffers, the rest of the agent).
pub const MEMORY_HEADROOM_PERCENT: u64 = 10;

/// The arithmetic precision a variant computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// 32-bit float, the reference.
    Fp32,
    /// 16-bit float.
    Fp16,
    /// 8-bit integer.
    Int8,
}

/// What a variant is, as built by the model pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VariantKind {
    /// The whole model at its reference or reduced float precision.
    Full,
    /// The whole model with int8-quantised weights (compute precision in `precision`).
    Int8,
    /// The layers before `cut`, run on the edge (chosen by the `split` module).
    SplitHead {
        /// Name of the tensor the model is cut at.
        cut: String,
    },
    /// The layers from `cut` on, run in the cloud (chosen by the `split` module).
    SplitTail {
        /// Name of the tensor the model is cut at.
        cut: String,
    },
}

/// One candidate variant of a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantInfo {
    /// Unique name of the variant within its model.
    pub name: String,
    /// The precision the variant computes in.
    pub precision: Precision,
    /// What the variant is.
    pub kind: VariantKind,
    /// Size of the weights file.
    pub size_bytes: u64,
    /// Peak memory while running one request.
    pub peak_memory_bytes: u64,
    /// Fraction of inputs on which the variant's output agrees with fp32's, in 0..=1.
    pub agreement: Option<f64>,
    /// Accuracy lost against fp32 on the validation set, in percentage points.
    pub accuracy_drop_points: Option<f64>,
    /// Operations for one request (a multiply-add counts as two).
    pub flops: u64,
    /// Latency of one request measured on the device class this record is for.
    pub measured_latency_us: Option<u64>,
}

impl VariantInfo {
    /// The fp32 full model is the reference the others are compared with, so it needs
    /// no agreement figure of its own.
    fn is_reference(&self) -> bool {
        self.kind == VariantKind::Full && self.precision == Precision::Fp32
    }
}

/// What a device can do, in plain numbers (callers convert firmware profiles).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceCaps {
    /// Precisions the device computes in.
    pub precisions: Vec<Precision>,
    /// Memory available to models.
    pub memory_bytes: u64,
    /// Peak fp32 tera-operations per second (also used for fp16).
    pub peak_tops_fp32: f64,
    /// Peak int8 tera-operations per second.
    pub peak_tops_int8: f64,
    /// Latencies measured on this very device: `(variant name, latency in µs)`.
    pub measured: Vec<(String, u64)>,
}

impl DeviceCaps {
    /// A device with no measurements yet.
    pub fn new(
        precisions: Vec<Precision>,
        memory_bytes: u64,
        peak_tops_fp32: f64,
        peak_tops_int8: f64,
    ) -> Self {
        DeviceCaps {
            precisions,
            memory_bytes,
            peak_tops_fp32,
            peak_tops_int8,
            measured: Vec::new(),
        }
    }

    /// Adds a latency measured on this device for one variant.
    pub fn with_measured(mut self, variant: &str, latency_us: u64) -> Self {
        self.measured.push((variant.to_string(), latency_us));
        self
    }

    fn peak_tops(&self, precision: Precision) -> f64 {
        match precision {
            Precision::Fp32 | Precision::Fp16 => self.peak_tops_fp32,
            Precision::Int8 => self.peak_tops_int8,
        }
    }
}

/// Bounds a variant must meet.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Constraints {
    /// Most accuracy a variant may lose against fp32, in percentage points.
    pub max_accuracy_drop_points: f64,
    /// Least fraction of outputs that must agree with fp32.
    pub min_agreement: f64,
    /// Latency one request must not exceed on this device, if any.
    pub slo_us: Option<u64>,
}

impl Default for Constraints {
    /// At most 0.5 points lost, at least 99 % agreement, no latency bound.
    fn default() -> Self {
        Constraints {
            max_accuracy_drop_points: 0.5,
            min_agreement: 0.99,
            slo_us: None,
        }
    }
}

/// Where an expected latency came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencySource {
    /// Measured on this device.
    MeasuredOnDevice,
    /// Measured on the device class, carried with the variant.
    MeasuredForVariant,
    /// Estimated from flops and peak TOPS.
    Estimated,
}

/// Why the chosen variant won.
#[derive(Debug, Clone, PartialEq)]
pub enum ChoiceReason {
    /// It was the only candidate that passed the filters.
    OnlyFeasible,
    /// It has the lowest expected latency; the runner-up is named.
    Fastest {
        /// The next best variant.
        runner_up: String,
        /// Its expected latency.
        runner_up_latency_us: f64,
    },
    /// Same expected latency as the runner-up, but closer to fp32's outputs.
    TieBrokenByAgreement {
        /// The next best variant.
        runner_up: String,
    },
    /// Same expected latency and agreement as the runner-up, but smaller.
    TieBrokenBySize {
        /// The next best variant.
        runner_up: String,
    },
    /// Same expected latency and size as the runner-up; its name sorts first.
    TieBrokenByName {
        /// The next best variant.
        runner_up: String,
    },
}

/// The variant to run, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// Name of the chosen variant.
    pub variant: String,
    /// Its expected latency for one request.
    pub expected_latency_us: f64,
    /// Where that latency came from.
    pub latency_source: LatencySource,
    /// Why it won.
    pub reason: ChoiceReason,
    /// Every candidate that was filtered out, with its reason, in candidate order.
    pub rejected: Vec<Rejection>,
}

/// Why one candidate was filtered out.
#[derive(Debug, Clone, PartialEq)]
pub enum RejectReason {
    /// A split head or tail; the `split` module decides those.
    SplitVariant,
    /// The device cannot compute in this precision.
    PrecisionUnsupported {
        /// The variant's precision.
        precision: Precision,
    },
    /// Does not fit in memory with headroom.
    TooLarge {
        /// Bytes needed, headroom included.
        need: u64,
        /// Bytes the device has.
        have: u64,
    },
    /// Its outputs agree with fp32 less often than required.
    DisagreesWithFp32 {
        /// The measured agreement.
        agreement: f64,
    },
    /// It loses more accuracy than allowed.
    TooInaccurate {
        /// The measured drop in points.
        drop_points: f64,
    },
    /// A reduced-precision variant that was never compared with fp32.
    NotValidated,
    /// Nothing measured and the device has no usable peak TOPS for this precision.
    NoLatencyEstimate,
    /// Expected to exceed the SLO on this device.
    TooSlow {
        /// Expected latency.
        expected_us: f64,
        /// The SLO.
        slo_us: u64,
    },
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RejectReason::SplitVariant => {
                write!(f, "split variants are placed by the split planner")
            }
            RejectReason::PrecisionUnsupported { precision } => {
                write!(f, "the device cannot compute in {precision:?}")
            }
            RejectReason::TooLarge { need, have } => {
                write!(f, "needs {need} bytes with headroom, the device has {have}")
            }
            RejectReason::DisagreesWithFp32 { agreement } => {
                write!(f, "agrees with fp32 on only {agreement} of outputs")
            }
            RejectReason::TooInaccurate { drop_points } => {
                write!(f, "loses {drop_points} accuracy points")
            }
            RejectReason::NotValidated => write!(f, "never compared with fp32"),
            RejectReason::NoLatencyEstimate => {
                write!(f, "no measured latency and no peak TOPS to estimate one")
            }
            RejectReason::TooSlow {
                expected_us,
                slo_us,
            } => write!(
                f,
                "expected {expected_us} µs exceeds the SLO of {slo_us} µs"
            ),
        }
    }
}

/// One filtered-out candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// The candidate's name.
    pub variant: String,
    /// Why it was filtered out.
    pub reason: RejectReason,
}

/// No candidate passed the filters.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("no variant fits this device: {}", describe(.rejected))]
pub struct NoVariant {
    /// Every candidate with its reason, in candidate order (empty: no candidates).
    pub rejected: Vec<Rejection>,
}

fn describe(rejected: &[Rejection]) -> String {
    if rejected.is_empty() {
        return "there were no candidates".to_string();
    }
    rejected
        .iter()
        .map(|rejection| format!("{}: {}", rejection.variant, rejection.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

struct Feasible<'a> {
    variant: &'a VariantInfo,
    expected_latency_us: f64,
    latency_source: LatencySource,
}

/// Chooses the variant a device runs (see the module table for the rules).
pub fn choose_variant(
    candidates: &[VariantInfo],
    device: &DeviceCaps,
    constraints: &Constraints,
) -> Result<Choice, NoVariant> {
    let mut feasible = Vec::new();
    let mut rejected = Vec::new();
    for variant in candidates {
        match check_variant(variant, device, constraints) {
            Ok(found) => feasible.push(found),
            Err(reason) => rejected.push(Rejection {
                variant: variant.name.clone(),
                reason,
            }),
        }
    }
    feasible.sort_by(|a, b| {
        a.expected_latency_us
            .total_cmp(&b.expected_latency_us)
            .then(closeness(b.variant).total_cmp(&closeness(a.variant)))
            .then(a.variant.size_bytes.cmp(&b.variant.size_bytes))
            .then(a.variant.name.cmp(&b.variant.name))
    });
    let mut ranked = feasible.into_iter();
    let Some(best) = ranked.next() else {
        return Err(NoVariant { rejected });
    };
    let reason = match ranked.next() {
        None => ChoiceReason::OnlyFeasible,
        Some(runner_up) if runner_up.expected_latency_us != best.expected_latency_us => {
            ChoiceReason::Fastest {
                runner_up: runner_up.variant.name.clone(),
                runner_up_latency_us: runner_up.expected_latency_us,
            }
        }
        Some(runner_up) if closeness(runner_up.variant) != closeness(best.variant) => {
            ChoiceReason::TieBrokenByAgreement {
                runner_up: runner_up.variant.name.clone(),
            }
        }
        Some(runner_up) if runner_up.variant.size_bytes != best.variant.size_bytes => {
            ChoiceReason::TieBrokenBySize {
                runner_up: runner_up.variant.name.clone(),
            }
        }
        Some(runner_up) => ChoiceReason::TieBrokenByName {
            runner_up: runner_up.variant.name.clone(),
        },
    };
    Ok(Choice {
        variant: best.variant.name.clone(),
        expected_latency_us: best.expected_latency_us,
        latency_source: best.latency_source,
        reason,
        rejected,
    })
}

/// How close a variant's outputs are to fp32's: its measured agreement, 1 for the full
/// model, 0 when unknown (such variants were already filtered unless full).
fn closeness(variant: &VariantInfo) -> f64 {
    match (&variant.kind, variant.agreement) {
        (VariantKind::Full, _) => 1.0,
        (_, Some(agreement)) if agreement.is_finite() => agreement.min(1.0),
        _ => 0.0,
    }
}

/// The filters of the module table, in its order.
fn check_variant<'a>(
    variant: &'a VariantInfo,
    device: &DeviceCaps,
    constraints: &Constraints,
) -> Result<Feasible<'a>, RejectReason> {
    if matches!(
        variant.kind,
        VariantKind::SplitHead { .. } | VariantKind::SplitTail { .. }
    ) {
        return Err(RejectReason::SplitVariant);
    }
    if !device.precisions.contains(&variant.precision) {
        return Err(RejectReason::PrecisionUnsupported {
            precision: variant.precision,
        });
    }
    let peak = variant.size_bytes.max(variant.peak_memory_bytes);
    // Rounded up, computed in u128 so that no size overflows; saturates at u64::MAX.
    let need_wide = (u128::from(peak) * u128::from(100 + MEMORY_HEADROOM_PERCENT)).div_ceil(100);
    let need = u64::try_from(need_wide).unwrap_or(u64::MAX);
    if need > device.memory_bytes {
        return Err(RejectReason::TooLarge {
            need,
            have: device.memory_bytes,
        });
    }
    if let Some(agreement) = variant.agreement {
        // False when the agreement or the bound is NaN, so NaN fails the check.
        let agrees_enough = agreement >= constraints.min_agreement;
        if !agrees_enough {
            return Err(RejectReason::DisagreesWithFp32 { agreement });
        }
    }
    if let Some(drop_points) = variant.accuracy_drop_points {
        let accurate_enough = drop_points <= constraints.max_accuracy_drop_points;
        if !accurate_enough {
            return Err(RejectReason::TooInaccurate { drop_points });
        }
    }
    if !variant.is_reference()
        && variant.agreement.is_none()
        && variant.accuracy_drop_points.is_none()
    {
        return Err(RejectReason::NotValidated);
    }
    let (expected_latency_us, latency_source) = expected_latency(variant, device)?;
    if let Some(slo_us) = constraints.slo_us {
        if expected_latency_us > slo_us as f64 {
            return Err(RejectReason::TooSlow {
                expected_us: expected_latency_us,
                slo_us,
            });
        }
    }
    Ok(Feasible {
        variant,
        expected_latency_us,
        latency_source,
    })
}

fn expected_latency(
    variant: &VariantInfo,
    device: &DeviceCaps,
) -> Result<(f64, LatencySource), RejectReason> {
    // The first measurement listed for a name wins, so duplicates cannot reorder.
    if let Some((_, latency_us)) = device
        .measured
        .iter()
        .find(|(name, _)| *name == variant.name)
    {
        return Ok((*latency_us as f64, LatencySource::MeasuredOnDevice));
    }
    if let Some(latency_us) = variant.measured_latency_us {
        return Ok((latency_us as f64, LatencySource::MeasuredForVariant));
    }
    let tops = device.peak_tops(variant.precision);
    if !(tops > 0.0 && tops.is_finite()) {
        return Err(RejectReason::NoLatencyEstimate);
    }
    // flops / (tops × 1e12 × efficiency) seconds, in µs.
    let estimate_us = variant.flops as f64 / (tops * ESTIMATE_EFFICIENCY * 1e6);
    Ok((estimate_us, LatencySource::Estimated))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1 << 30;
    const MB: u64 = 1 << 20;

    /// A classifier of 8 G operations per request.
    const FLOPS: u64 = 8_000_000_000;

    fn fp32() -> VariantInfo {
        VariantInfo {
            name: "m-fp32".into(),
            precision: Precision::Fp32,
            kind: VariantKind::Full,
            size_bytes: 100 * MB,
            peak_memory_bytes: 300 * MB,
            agreement: None,
            accuracy_drop_points: None,
            flops: FLOPS,
            measured_latency_us: None,
        }
    }

    fn int8() -> VariantInfo {
        VariantInfo {
            name: "m-int8".into(),
            precision: Precision::Int8,
            kind: VariantKind::Int8,
            size_bytes: 25 * MB,
            peak_memory_bytes: 80 * MB,
            agreement: Some(0.995),
            accuracy_drop_points: Some(0.3),
            flops: FLOPS,
            measured_latency_us: None,
        }
    }

    fn pi() -> DeviceCaps {
        DeviceCaps::new(vec![Precision::Fp32, Precision::Int8], 8 * GB, 0.1, 0.4)
    }

    fn coral() -> DeviceCaps {
        DeviceCaps::new(vec![Precision::Int8], GB, 0.0, 4.0)
    }

    fn check(
        candidates: &[VariantInfo],
        device: &DeviceCaps,
        constraints: Constraints,
        expected: Result<&str, &[(&str, RejectReason)]>,
    ) {
        let result = choose_variant(candidates, device, &constraints);
        match (&result, expected) {
            (Ok(choice), Ok(name)) => assert_eq!(choice.variant, name, "{choice:?}"),
            (Err(error), Err(reasons)) => {
                let expected: Vec<Rejection> = reasons
                    .iter()
                    .map(|(variant, reason)| Rejection {
                        variant: variant.to_string(),
                        reason: reason.clone(),
                    })
                    .collect();
                assert_eq!(error.rejected, expected);
            }
            (got, want) => panic!("got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn choices_follow_the_rule_table() {
        let defaults = Constraints::default();
        // A Raspberry-Pi-like CPU: both fit, int8 has 4x the peak, so int8.
        check(&[fp32(), int8()], &pi(), defaults, Ok("m-int8"));
        // A Coral-like accelerator computes only int8.
        check(&[fp32(), int8()], &coral(), defaults, Ok("m-int8"));
        // 256 MB: fp32 needs 300 MB + 10 %, only int8 fits.
        let tiny = DeviceCaps::new(vec![Precision::Fp32, Precision::Int8], 256 * MB, 0.1, 0.4);
        check(&[fp32(), int8()], &tiny, defaults, Ok("m-int8"));
        // Measured on this device, int8 is slower (no fast int8 kernels): fp32 wins.
        let measured = pi()
            .with_measured("m-int8", 9_000)
            .with_measured("m-fp32", 5_000);
        check(&[fp32(), int8()], &measured, defaults, Ok("m-fp32"));
        // A measurement carried with the variant also beats the estimate.
        let slow_int8 = VariantInfo {
            measured_latency_us: Some(10_000_000),
            ..int8()
        };
        check(&[fp32(), slow_int8], &pi(), defaults, Ok("m-fp32"));
        // An int8 variant that disagrees with fp32 on 5 % of inputs is never chosen.
        let sloppy = VariantInfo {
            agreement: Some(0.95),
            ..int8()
        };
        check(&[fp32(), sloppy.clone()], &pi(), defaults, Ok("m-fp32"));
        // ... not even when it is the only one that fits.
        check(
            &[fp32(), sloppy],
            &coral(),
            defaults,
            Err(&[
                (
                    "m-fp32",
                    RejectReason::PrecisionUnsupported {
                        precision: Precision::Fp32,
                    },
                ),
                (
                    "m-int8",
                    RejectReason::DisagreesWithFp32 { agreement: 0.95 },
                ),
            ]),
        );
        // Weights-only quantisation computes in fp32: fp32 peak, fp32 support needed.
        let weights_only = VariantInfo {
            name: "m-w8".into(),
            precision: Precision::Fp32,
            ..int8()
        };
        check(
            &[weights_only.clone(), int8()],
            &pi(),
            defaults,
            Ok("m-int8"),
        );
        // Same speed as fp32: the full model keeps the device (closest to fp32)…
        check(
            &[fp32(), weights_only.clone()],
            &pi(),
            defaults,
            Ok("m-fp32"),
        );
        // …unless only the int8 weights fit.
        let small = DeviceCaps::new(vec![Precision::Fp32], 200 * MB, 0.1, 0.0);
        check(&[fp32(), weights_only], &small, defaults, Ok("m-w8"));
    }

    #[test]
    fn every_filter_names_its_reason() {
        let defaults = Constraints::default();
        let tiny = DeviceCaps::new(vec![Precision::Fp32, Precision::Int8], 64 * MB, 0.1, 0.4);
        let split_head = VariantInfo {
            name: "m-head".into(),
            kind: VariantKind::SplitHead {
                cut: "conv3".into(),
            },
            ..fp32()
        };
        let inaccurate = VariantInfo {
            name: "m-int8-bad".into(),
            accuracy_drop_points: Some(0.8),
            ..int8()
        };
        let unvalidated = VariantInfo {
            name: "m-fp16".into(),
            precision: Precision::Fp16,
            kind: VariantKind::Full,
            agreement: None,
            accuracy_drop_points: None,
            ..int8()
        };
        let nan_agreement = VariantInfo {
            name: "m-int8-nan".into(),
            agreement: Some(f64::NAN),
            ..int8()
        };
        check(
            &[
                split_head,
                fp32(),
                inaccurate,
                unvalidated.clone(),
                int8(),
                nan_agreement,
            ],
            &tiny,
            defaults,
            Err(&[
                ("m-head", RejectReason::SplitVariant),
                (
                    "m-fp32",
                    RejectReason::TooLarge {
                        need: 330 * MB,
                        have: 64 * MB,
                    },
                ),
                (
                    "m-int8-bad",
                    RejectReason::TooLarge {
                        need: 88 * MB,
                        have: 64 * MB,
                    },
                ),
                (
                    "m-fp16",
                    RejectReason::PrecisionUnsupported {
                        precision: Precision::Fp16,
                    },
                ),
                (
                    "m-int8",
                    RejectReason::TooLarge {
                        need: 88 * MB,
                        have: 64 * MB,
                    },
                ),
                (
                    "m-int8-nan",
                    RejectReason::TooLarge {
                        need: 88 * MB,
                        have: 64 * MB,
                    },
                ),
            ]),
        );
        // The accuracy checks, on a device where everything fits.
        let with_fp16 = DeviceCaps::new(
            vec![Precision::Fp32, Precision::Fp16, Precision::Int8],
            8 * GB,
            0.0,
            0.0,
        );
        let inaccurate = VariantInfo {
            accuracy_drop_points: Some(0.8),
            ..int8()
        };
        check(
            &[inaccurate, unvalidated, fp32()],
            &with_fp16,
            defaults,
            Err(&[
                ("m-int8", RejectReason::TooInaccurate { drop_points: 0.8 }),
                ("m-fp16", RejectReason::NotValidated),
                ("m-fp32", RejectReason::NoLatencyEstimate),
            ]),
        );
        // 8 Gop at 0.1 TOPS × 0.3 is 266 667 µs: over a 100 ms SLO.
        let slo = Constraints {
            slo_us: Some(100_000),
            ..defaults
        };
        let result = choose_variant(&[fp32()], &pi(), &slo);
        let error = result.expect_err("too slow");
        assert!(matches!(
            error.rejected[0].reason,
            RejectReason::TooSlow {
                slo_us: 100_000,
                ..
            }
        ));
        assert!(error.to_string().contains("m-fp32: expected"), "{error}");
        // No candidates at all.
        let error = choose_variant(&[], &pi(), &defaults).expect_err("empty");
        assert_eq!(error.rejected, vec![]);
        assert!(error.to_string().contains("no candidates"), "{error}");
    }

    #[test]
    fn the_choice_says_why_and_ties_are_deterministic() {
        let defaults = Constraints::default();
        let choice = choose_variant(&[fp32(), int8()], &pi(), &defaults).expect("feasible");
        assert_eq!(choice.latency_source, LatencySource::Estimated);
        assert!((choice.expected_latency_us - 8e9 / (0.4 * 0.3 * 1e6)).abs() < 1e-6);
        assert_eq!(
            choice.reason,
            ChoiceReason::Fastest {
                runner_up: "m-fp32".into(),
                runner_up_latency_us: 8e9 / (0.1 * 0.3 * 1e6),
            }
        );
        // Same latency: the smaller one, in either candidate order.
        let device = pi().with_measured("a", 1_000).with_measured("b", 1_000);
        let a = VariantInfo {
            name: "a".into(),
            size_bytes: 50 * MB,
            ..int8()
        };
        let b = VariantInfo {
            name: "b".into(),
            size_bytes: 40 * MB,
            ..int8()
        };
        for candidates in [[a.clone(), b.clone()], [b.clone(), a.clone()]] {
            let choice = choose_variant(&candidates, &device, &defaults).expect("feasible");
            assert_eq!(choice.variant, "b");
            assert_eq!(
                choice.reason,
                ChoiceReason::TieBrokenBySize {
                    runner_up: "a".into()
                }
            );
            assert_eq!(choice.latency_source, LatencySource::MeasuredOnDevice);
        }
        // Same latency and size: the name.
        let b = VariantInfo {
            size_bytes: 50 * MB,
            ..b
        };
        let choice = choose_variant(&[b, a], &device, &defaults).expect("feasible");
        assert_eq!(choice.variant, "a");
        assert_eq!(
            choice.reason,
            ChoiceReason::TieBrokenByName {
                runner_up: "b".into()
            }
        );
    }

    #[test]
    fn huge_and_odd_numbers_do_not_panic() {
        let huge = VariantInfo {
            size_bytes: u64::MAX,
            peak_memory_bytes: u64::MAX,
            flops: u64::MAX,
            ..fp32()
        };
        let device = DeviceCaps::new(vec![Precision::Fp32], u64::MAX, f64::NAN, f64::INFINITY);
        // Needs more than u64::MAX with headroom: saturates, so it fits u64::MAX bytes,
        // but a NaN peak gives no estimate.
        let error = choose_variant(
            std::slice::from_ref(&huge),
            &device,
            &Constraints::default(),
        )
        .expect_err("no estimate");
        assert_eq!(error.rejected[0].reason, RejectReason::NoLatencyEstimate);
        let smaller = DeviceCaps::new(vec![Precision::Fp32], u64::MAX - 1, 1.0, 1.0);
        let error =
            choose_variant(&[huge], &smaller, &Constraints::default()).expect_err("too large");
        assert!(matches!(
            error.rejected[0].reason,
            RejectReason::TooLarge { need: u64::MAX, .. }
        ));
        let nan_bounds = Constraints {
            max_accuracy_drop_points: f64::NAN,
            min_agreement: f64::NAN,
            slo_us: Some(0),
        };
        // A NaN bound rejects every measured variant; the fp32 reference is measured by
        // nobody, so only the SLO of 0 stops it.
        let error = choose_variant(&[fp32(), int8()], &pi(), &nan_bounds).expect_err("no");
        assert!(matches!(
            error.rejected[0].reason,
            RejectReason::TooSlow { .. }
        ));
        assert!(matches!(
            error.rejected[1].reason,
            RejectReason::DisagreesWithFp32 { .. }
        ));
    }
}
