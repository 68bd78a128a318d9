//! Where to cut a model between edge and cloud: the Neurosurgeon choice (Kang et al.,
//! "Neurosurgeon: Collaborative Intelligence Between the Cloud and Mobile Edge",
//! ASPLOS 2017), for latency.
//!
//! A model of `L` layers in execution order is cut at `k` in `0..=L`: layers `0..k` run
//! on the edge, layers `k..L` in the cloud, and the tensor at the cut is sent over the
//! link. The expected latency of cut `k` is
//!
//! ```text
//! Σ edge_us[0..k]                                          (edge part)
//!   + if k < L: rtt_us + bytes(k) · 8 / bandwidth_bps · 1e6 (send the cut tensor)
//!               + cloud_queue_us + Σ cloud_us[k..L]         (cloud part)
//!               + bytes(L) · 8 / bandwidth_bps · 1e6        (the answer comes back)
//! bytes(0) = input_bytes, bytes(k) = output_bytes[k - 1]
//! ```
//!
//! The link is taken as symmetric (agents measure one throughput). The answer's leg
//! matters for models whose output is large: a detector's score map can be a third of
//! its input (measured over a shaped link in `nephele bench split`).
//!
//! | cut          | runs on the edge | sends            | pays the RTT |
//! |--------------|------------------|------------------|--------------|
//! | `k = 0`      | nothing          | the model input  | yes          |
//! | `0 < k < L`  | layers `0..k`    | layer `k-1` out  | yes          |
//! | `k = L`      | everything       | nothing          | no           |
//!
//! Rules where the formula leaves a choice:
//!
//! - Only the cuts in [`AllowedCuts`] are candidates (a model is exported with a few
//!   cut tensors, not every layer boundary).
//! - Ties go to the larger `k`, the more local cut: it depends less on the network and
//!   sends less data off the device.
//! - The remote leg is infeasible (every `k < L` costs `f64::INFINITY`) when the
//!   bandwidth is zero, negative or NaN, or the RTT or cloud queue wait is negative or
//!   not finite. An infinite bandwidth means free transfer. So with no link only the
//!   all-local cut remains; if it is not allowed there is no feasible cut.
//! - Layer costs must be finite and non-negative: anything else is a typed error.
//! - With [`SplitModel::max_transfer_bytes`], a remote cut that would send or receive
//!   more than that in one message is infeasible (the wire protocol's frame limit).
//!
//! [`Replanner`] keeps a plan current as bandwidth samples arrive: it replans when its
//! EWMA estimate moves far enough from the bandwidth the current plan was made for.

use serde::{Deserialize, Serialize};

/// Cost and output of one layer, measured on both sides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerProfile {
    /// Layer (or cut tensor) name, for reports.
    pub name: String,
    /// Time to run the layer on the edge device.
    pub edge_us: f64,
    /// Time to run the layer in the cloud.
    pub cloud_us: f64,
    /// Size of the layer's output tensor, as sent over the link.
    pub output_bytes: u64,
}

/// The network between the device and the cloud.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// Usable uplink bandwidth in bits per second.
    pub bandwidth_bps: f64,
    /// Round-trip time in microseconds.
    pub rtt_us: f64,
}

/// Which cuts the model can be split at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllowedCuts {
    /// Every `k` in `0..=L`.
    All,
    /// Only these (duplicates are harmless; each must be at most `L`).
    Only(Vec<usize>),
}

/// Everything about a model the split choice needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitModel {
    /// The layers in execution order.
    pub layers: Vec<LayerProfile>,
    /// Size of the model input, sent when the whole model is offloaded.
    pub input_bytes: u64,
    /// The cuts the model can be split at.
    pub allowed_cuts: AllowedCuts,
    /// The most one message over the link may carry (`None`: no limit).
    #[serde(default)]
    pub max_transfer_bytes: Option<u64>,
}

/// The chosen cut.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitPlan {
    /// Layers `0..cut` run on the edge, the rest in the cloud.
    pub cut: usize,
    /// Expected latency at that cut.
    pub expected_us: f64,
    /// Expected latency of every cut `0..=L`; `f64::INFINITY` where the cut is not
    /// allowed or not feasible.
    pub per_cut: Vec<f64>,
}

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SplitError {
    /// A layer cost is negative or not finite.
    #[error("layer {index} ({name}) has a cost that is negative or not a finite number")]
    InvalidLayer {
        /// Position of the layer.
        index: usize,
        /// Its name.
        name: String,
    },
    /// An allowed cut is beyond the last layer.
    #[error("cut {cut} is out of range for a model of {n_layers} layers")]
    CutOutOfRange {
        /// The offending cut.
        cut: usize,
        /// Number of layers.
        n_layers: usize,
    },
    /// The allowed set is empty.
    #[error("the model allows no cut at all")]
    NoAllowedCut,
    /// Every allowed cut needs the link and the link is unusable (or every cost is
    /// infinite).
    #[error("no allowed cut is feasible: the link is unusable and running everything on the edge is not allowed")]
    NoFeasibleCut,
    /// A replanning parameter is out of range.
    #[error("ewma_weight must be in (0, 1] and relative_threshold finite and >= 0")]
    InvalidReplanConfig,
}

/// Chooses the cut with the lowest expected latency (see the module docs).
pub fn plan_split(
    model: &SplitModel,
    link: Link,
    cloud_queue_us: f64,
) -> Result<SplitPlan, SplitError> {
    let n_layers = model.layers.len();
    for (index, layer) in model.layers.iter().enumerate() {
        let valid = |cost: f64| cost.is_finite() && cost >= 0.0;
        if !valid(layer.edge_us) || !valid(layer.cloud_us) {
            return Err(SplitError::InvalidLayer {
                index,
                name: layer.name.clone(),
            });
        }
    }
    let mut allowed = vec![false; n_layers + 1];
    match &model.allowed_cuts {
        AllowedCuts::All => allowed.iter_mut().for_each(|cut| *cut = true),
        AllowedCuts::Only(cuts) => {
            for &cut in cuts {
                match allowed.get_mut(cut) {
                    Some(slot) => *slot = true,
                    None => return Err(SplitError::CutOutOfRange { cut, n_layers }),
                }
            }
        }
    }
    if !allowed.contains(&true) {
        return Err(SplitError::NoAllowedCut);
    }

    let remote_usable = !link.bandwidth_bps.is_nan()
        && link.bandwidth_bps > 0.0
        && link.rtt_us.is_finite()
        && link.rtt_us >= 0.0
        && cloud_queue_us.is_finite()
        && cloud_queue_us >= 0.0;
    // edge_prefix[k] = Σ edge_us[0..k]; cloud_suffix[k] = Σ cloud_us[k..L].
    let mut edge_prefix = vec![0.0; n_layers + 1];
    for (index, layer) in model.layers.iter().enumerate() {
        edge_prefix[index + 1] = edge_prefix[index] + layer.edge_us;
    }
    let mut cloud_suffix = vec![0.0; n_layers + 1];
    for (index, layer) in model.layers.iter().enumerate().rev() {
        cloud_suffix[index] = cloud_suffix[index + 1] + layer.cloud_us;
    }
    let per_cut: Vec<f64> = (0..=n_layers)
        .map(|cut| {
            if !allowed[cut] {
                f64::INFINITY
            } else if cut == n_layers {
                edge_prefix[cut]
            } else if !remote_usable {
                f64::INFINITY
            } else {
                let bytes = match cut {
                    0 => model.input_bytes,
                    _ => model.layers[cut - 1].output_bytes,
                };
                let answer = model.layers.last().map_or(0, |layer| layer.output_bytes);
                if model
                    .max_transfer_bytes
                    .is_some_and(|limit| bytes.max(answer) > limit)
                {
                    return f64::INFINITY;
                }
                let transfer_us = (bytes as f64 + answer as f64) * 8.0 / link.bandwidth_bps * 1e6;
                edge_prefix[cut] + link.rtt_us + transfer_us + cloud_queue_us + cloud_suffix[cut]
            }
        })
        .collect();
    // From the most local cut down, keeping only strict improvements: ties go local.
    let mut best: Option<usize> = None;
    for cut in (0..=n_layers).rev() {
        let cost = per_cut[cut];
        if cost.is_finite() && best.is_none_or(|best_cut| cost < per_cut[best_cut]) {
            best = Some(cut);
        }
    }
    let cut = best.ok_or(SplitError::NoFeasibleCut)?;
    Ok(SplitPlan {
        cut,
        expected_us: per_cut[cut],
        per_cut,
    })
}

/// How [`Replanner`] smooths bandwidth samples and when it replans.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReplanConfig {
    /// Weight of a new sample: `estimate ← w · sample + (1 − w) · estimate`.
    pub ewma_weight: f64,
    /// Replan when `|estimate − planned| > relative_threshold × planned`.
    pub relative_threshold: f64,
}

impl Default for ReplanConfig {
    /// Weight 0.25 (a step change is three-quarters absorbed after five samples,
    /// 0.75⁵ ≈ 0.24) and a 25 % threshold (a 10× drop replans on the second sample).
    fn default() -> Self {
        ReplanConfig {
            ewma_weight: 0.25,
            relative_threshold: 0.25,
        }
    }
}

/// Keeps a split plan current as bandwidth samples arrive (sans-IO).
///
/// Call [`Replanner::observe_bandwidth`] with each throughput sample the transport
/// measures; when it returns a plan, switch to that plan's cut.
#[derive(Debug, Clone)]
pub struct Replanner {
    model: SplitModel,
    cloud_queue_us: f64,
    config: ReplanConfig,
    /// The link the current plan was made for.
    planned_link: Link,
    estimate_bps: f64,
    plan: SplitPlan,
}

impl Replanner {
    /// Plans for `link` and starts the estimate at its bandwidth.
    pub fn new(
        model: SplitModel,
        link: Link,
        cloud_queue_us: f64,
        config: ReplanConfig,
    ) -> Result<Self, SplitError> {
        let weight_valid = config.ewma_weight > 0.0 && config.ewma_weight <= 1.0;
        let threshold_valid =
            config.relative_threshold.is_finite() && config.relative_threshold >= 0.0;
        if !weight_valid || !threshold_valid {
            return Err(SplitError::InvalidReplanConfig);
        }
        let plan = plan_split(&model, link, cloud_queue_us)?;
        Ok(Replanner {
            model,
            cloud_queue_us,
            config,
            planned_link: link,
            estimate_bps: link.bandwidth_bps,
            plan,
        })
    }

    /// The plan in force.
    pub fn plan(&self) -> &SplitPlan {
        &self.plan
    }

    /// The smoothed bandwidth estimate.
    pub fn estimate_bps(&self) -> f64 {
        self.estimate_bps
    }

    /// The link the plan in force was made for.
    pub fn planned_link(&self) -> Link {
        self.planned_link
    }

    /// Folds in one bandwidth sample; returns the new plan when the estimate moved more
    /// than the threshold from the bandwidth the plan in force was made for (the new
    /// plan may keep the same cut; its costs are current).
    ///
    /// Samples that are negative or not finite are ignored. If the estimate itself is
    /// not a finite non-negative number (the initial link said so), the first valid
    /// sample replaces it. If no allowed cut is feasible on the new estimate, the plan
    /// in force is kept and the next sample tries again.
    pub fn observe_bandwidth(&mut self, bandwidth_bps: f64) -> Option<SplitPlan> {
        if !(bandwidth_bps.is_finite() && bandwidth_bps >= 0.0) {
            return None;
        }
        self.estimate_bps = if self.estimate_bps.is_finite() && self.estimate_bps >= 0.0 {
            self.config.ewma_weight * bandwidth_bps
                + (1.0 - self.config.ewma_weight) * self.estimate_bps
        } else {
            bandwidth_bps
        };
        let planned_bps = self.planned_link.bandwidth_bps;
        let moved = if planned_bps.is_finite() && planned_bps >= 0.0 {
            (self.estimate_bps - planned_bps).abs() > self.config.relative_threshold * planned_bps
        } else {
            true
        };
        if !moved {
            return None;
        }
        let link = Link {
            bandwidth_bps: self.estimate_bps,
            ..self.planned_link
        };
        let plan = plan_split(&self.model, link, self.cloud_queue_us).ok()?;
        self.planned_link = link;
        self.plan = plan.clone();
        Some(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MBIT: f64 = 1e6;

    /// A small CNN: the first layer's output is larger than the input, the later ones
    /// shrink; the cloud is 20× faster. RTT 10 ms, no cloud queue.
    fn cnn(allowed_cuts: AllowedCuts) -> SplitModel {
        let layer = |name: &str, edge_us: f64, output_bytes: u64| LayerProfile {
            name: name.into(),
            edge_us,
            cloud_us: edge_us / 20.0,
            output_bytes,
        };
        SplitModel {
            layers: vec![
                layer("conv1", 10_000.0, 400_000),
                layer("conv2", 20_000.0, 20_000),
                layer("fc", 30_000.0, 400),
            ],
            input_bytes: 150_000,
            allowed_cuts,
            max_transfer_bytes: None,
        }
    }

    fn link(bandwidth_bps: f64) -> Link {
        Link {
            bandwidth_bps,
            rtt_us: 10_000.0,
        }
    }

    fn check(model: &SplitModel, bandwidth_bps: f64, expected: Result<(usize, f64), SplitError>) {
        let result = plan_split(model, link(bandwidth_bps), 0.0);
        match (&result, &expected) {
            (Ok(plan), Ok((cut, expected_us))) => {
                assert_eq!(plan.cut, *cut, "at {bandwidth_bps} bit/s: {plan:?}");
                assert!(
                    (plan.expected_us - expected_us).abs() < 1e-6,
                    "at {bandwidth_bps} bit/s: {plan:?}"
                );
            }
            _ => assert_eq!(result.map(|plan| plan.cut), expected.map(|(cut, _)| cut)),
        }
    }

    #[test]
    fn the_best_cut_moves_from_local_to_split_to_offload_as_bandwidth_grows() {
        let model = cnn(AllowedCuts::All);
        // 1 Mbit/s: sending anything costs more than computing everything (60 ms).
        check(&model, MBIT, Ok((3, 60_000.0)));
        // 10 Mbit/s: after conv2, 20 kB up is 16 ms and the 400 B answer down 0.32 ms:
        // 30 + 10 + 16 + 1.5 + 0.32 = 57.82 ms.
        check(&model, 10.0 * MBIT, Ok((2, 57_820.0)));
        // 100 Mbit/s: the 150 kB input is 12 ms: 10 + 12 + 3 + 0.032 = 25.032 ms.
        check(&model, 100.0 * MBIT, Ok((0, 25_032.0)));
        // Free transfer: full offload, RTT and cloud compute only.
        check(&model, f64::INFINITY, Ok((0, 13_000.0)));
    }

    #[test]
    fn a_cut_over_the_message_limit_is_not_a_candidate() {
        // At 100 Mbit/s the whole offload wins (see above), but its 150 kB input is over
        // a 100 kB limit; conv2's 20 kB is under it: 30 + 10 + 1.6 + 1.5 + 0.032 ms.
        let mut model = cnn(AllowedCuts::All);
        model.max_transfer_bytes = Some(100_000);
        check(&model, 100.0 * MBIT, Ok((2, 43_132.0)));
        let plan = plan_split(&model, link(100.0 * MBIT), 0.0).unwrap();
        assert_eq!(plan.per_cut[..2], [f64::INFINITY; 2]);
        // An answer over the limit leaves only local.
        model.max_transfer_bytes = Some(300);
        check(&model, 100.0 * MBIT, Ok((3, 60_000.0)));
    }

    #[test]
    fn only_allowed_cuts_are_chosen_and_a_dead_link_leaves_only_local() {
        // Without the conv2 cut, 10 Mbit/s is best served locally.
        check(
            &cnn(AllowedCuts::Only(vec![0, 1, 3])),
            10.0 * MBIT,
            Ok((3, 60_000.0)),
        );
        for dead in [0.0, -5.0, f64::NAN, f64::NEG_INFINITY] {
            check(&cnn(AllowedCuts::All), dead, Ok((3, 60_000.0)));
            check(
                &cnn(AllowedCuts::Only(vec![0, 2])),
                dead,
                Err(SplitError::NoFeasibleCut),
            );
        }
        check(
            &cnn(AllowedCuts::Only(vec![])),
            MBIT,
            Err(SplitError::NoAllowedCut),
        );
        check(
            &cnn(AllowedCuts::Only(vec![1, 4])),
            MBIT,
            Err(SplitError::CutOutOfRange {
                cut: 4,
                n_layers: 3,
            }),
        );
        let mut broken = cnn(AllowedCuts::All);
        broken.layers[1].cloud_us = f64::NAN;
        check(
            &broken,
            MBIT,
            Err(SplitError::InvalidLayer {
                index: 1,
                name: "conv2".into(),
            }),
        );
        // An empty model runs "locally" in no time.
        let empty = SplitModel {
            layers: vec![],
            input_bytes: 10,
            allowed_cuts: AllowedCuts::All,
            max_transfer_bytes: None,
        };
        check(&empty, MBIT, Ok((0, 0.0)));
        // A cloud queue that is not a number disables the remote leg too.
        let plan = plan_split(&cnn(AllowedCuts::All), link(100.0 * MBIT), f64::NAN)
            .expect("local remains");
        assert_eq!(plan.cut, 3);
        assert_eq!(plan.per_cut[..3], [f64::INFINITY; 3]);
    }

    #[test]
    fn ties_go_to_the_more_local_cut() {
        // Offload costs 10 + 8 + 2 = 20 ms, as does local compute.
        let model = SplitModel {
            layers: vec![LayerProfile {
                name: "only".into(),
                edge_us: 20_000.0,
                cloud_us: 2_000.0,
                output_bytes: 1,
            }],
            input_bytes: 1_000,
            allowed_cuts: AllowedCuts::All,
            max_transfer_bytes: None,
        };
        check(&model, MBIT, Ok((1, 20_000.0)));
    }

    #[test]
    fn the_replanner_replans_when_bandwidth_moves_past_the_threshold() {
        let mut replanner = Replanner::new(
            cnn(AllowedCuts::All),
            link(100.0 * MBIT),
            0.0,
            ReplanConfig::default(),
        )
        .expect("plannable");
        assert_eq!(replanner.plan().cut, 0);
        // Noise within 25 %: no new plan.
        assert_eq!(replanner.observe_bandwidth(90.0 * MBIT), None);
        assert_eq!(replanner.observe_bandwidth(110.0 * MBIT), None);
        // A drop to 1 Mbit/s: 100.6 → 75.7 (moved 24.3 %) → 57.0 (43 %): replan.
        assert_eq!(replanner.observe_bandwidth(MBIT), None);
        let plan = replanner.observe_bandwidth(MBIT).expect("moved 43 %");
        assert_eq!(
            replanner.planned_link().bandwidth_bps,
            replanner.estimate_bps()
        );
        assert_eq!(plan.cut, 0, "56 Mbit/s still favours offload");
        let mut cuts = vec![];
        for _ in 0..30 {
            if let Some(plan) = replanner.observe_bandwidth(MBIT) {
                cuts.push(plan.cut);
            }
        }
        assert_eq!(cuts.last(), Some(&3), "at 1 Mbit/s run locally: {cuts:?}");
        assert_eq!(replanner.plan().cut, 3);
        // Garbage samples are ignored.
        let estimate = replanner.estimate_bps();
        for garbage in [f64::NAN, f64::INFINITY, -1.0] {
            assert_eq!(replanner.observe_bandwidth(garbage), None);
        }
        assert_eq!(replanner.estimate_bps(), estimate);
    }

    #[test]
    fn the_replanner_recovers_from_an_unknown_or_dead_initial_link() {
        for initial in [f64::NAN, f64::INFINITY, 0.0] {
            let mut replanner = Replanner::new(
                cnn(AllowedCuts::All),
                link(initial),
                0.0,
                ReplanConfig::default(),
            )
            .expect("plannable");
            let plan = replanner
                .observe_bandwidth(100.0 * MBIT)
                .expect("any real sample moves an unknown or zero estimate");
            if initial == 0.0 {
                // 0 → 25 Mbit/s with the EWMA: after conv2 costs 30 + 10 + 6.4 + 1.5 ms.
                assert_eq!(plan.cut, 2);
            } else {
                assert_eq!(plan.cut, 0);
            }
        }
        let bad = ReplanConfig {
            ewma_weight: 0.0,
            relative_threshold: 0.25,
        };
        assert_eq!(
            Replanner::new(cnn(AllowedCuts::All), link(MBIT), 0.0, bad).err(),
            Some(SplitError::InvalidReplanConfig)
        );
        // A link that dies under an offload-only model keeps the plan in force.
        let no_smoothing = ReplanConfig {
            ewma_weight: 1.0,
            relative_threshold: 0.25,
        };
        let mut offload_only = Replanner::new(
            cnn(AllowedCuts::Only(vec![0])),
            link(MBIT),
            0.0,
            no_smoothing,
        )
        .expect("plannable");
        assert_eq!(offload_only.observe_bandwidth(0.0), None);
        assert_eq!(offload_only.estimate_bps(), 0.0);
        assert_eq!(offload_only.planned_link(), link(MBIT));
        assert_eq!(offload_only.plan().cut, 0);
        // ... and the next usable sample replans.
        assert!(offload_only.observe_bandwidth(2.0 * MBIT).is_some());
    }

    fn layers() -> impl Strategy<Value = Vec<LayerProfile>> {
        proptest::collection::vec(
            (0.0..1e6f64, 0.0..1e6f64, 0u64..10_000_000).prop_map(
                |(edge_us, cloud_us, output_bytes)| LayerProfile {
                    name: "layer".into(),
                    edge_us,
                    cloud_us,
                    output_bytes,
                },
            ),
            0..12,
        )
    }

    proptest! {
        #[test]
        fn the_chosen_cut_is_the_argmin_over_allowed_cuts(
            layers in layers(),
            input_bytes in 0u64..10_000_000,
            bandwidth_bps in prop_oneof![Just(0.0), 1.0..1e10f64],
            rtt_us in 0.0..1e6f64,
            cloud_queue_us in 0.0..1e6f64,
            allowed_mask in proptest::collection::vec(any::<bool>(), 13),
            max_transfer_bytes in proptest::option::of(0u64..20_000_000),
        ) {
            let n_layers = layers.len();
            let cuts: Vec<usize> = (0..=n_layers).filter(|cut| allowed_mask[*cut]).collect();
            let model = SplitModel {
                layers: layers.clone(),
                input_bytes,
                allowed_cuts: AllowedCuts::Only(cuts.clone()),
                max_transfer_bytes,
            };
            let link = Link { bandwidth_bps, rtt_us };
            // An independent reading of the formula in the module docs.
            let oracle = |cut: usize| -> f64 {
                let edge: f64 = layers[..cut].iter().map(|layer| layer.edge_us).sum();
                if cut == n_layers {
                    return edge;
                }
                if bandwidth_bps == 0.0 {
                    return f64::INFINITY;
                }
                let bytes = if cut == 0 { input_bytes } else { layers[cut - 1].output_bytes };
                let answer = layers.last().map_or(0, |layer| layer.output_bytes);
                if max_transfer_bytes.is_some_and(|limit| bytes > limit || answer > limit) {
                    return f64::INFINITY;
                }
                let cloud: f64 = layers[cut..].iter().map(|layer| layer.cloud_us).sum();
                edge + rtt_us + (bytes as f64 + answer as f64) * 8.0 / bandwidth_bps * 1e6
                    + cloud_queue_us
                    + cloud
            };
            match plan_split(&model, link, cloud_queue_us) {
                Ok(plan) => {
                    prop_assert!(cuts.contains(&plan.cut));
                    prop_assert!(plan.expected_us.is_finite() && plan.expected_us >= 0.0);
                    prop_assert_eq!(plan.per_cut.len(), n_layers + 1);
                    for cut in 0..=n_layers {
                        let expected = if cuts.contains(&cut) { oracle(cut) } else { f64::INFINITY };
                        let got = plan.per_cut[cut];
                        prop_assert!(
                            got == expected || (got - expected).abs() <= 1e-9 * expected.abs(),
                            "cut {cut}: {got} vs {expected}"
                        );
                        if cuts.contains(&cut) {
                            prop_assert!(plan.expected_us <= got);
                        }
                    }
                }
                Err(SplitError::NoAllowedCut) => prop_assert!(cuts.is_empty()),
                Err(SplitError::NoFeasibleCut) => {
                    // A dead link or the message limit rules out every remote cut, and
                    // local is not allowed.
                    prop_assert!(!cuts.contains(&n_layers));
                    prop_assert!(cuts.iter().all(|&cut| oracle(cut).is_infinite()));
                }
                Err(other) => prop_assert!(false, "unexpected {other}"),
            }
        }

        #[test]
        fn any_numbers_give_a_plan_or_a_typed_error(
            edge_us in any::<f64>(),
            cloud_us in any::<f64>(),
            output_bytes in any::<u64>(),
            input_bytes in any::<u64>(),
            bandwidth_bps in any::<f64>(),
            rtt_us in any::<f64>(),
            cloud_queue_us in any::<f64>(),
        ) {
            let model = SplitModel {
                layers: vec![LayerProfile { name: "x".into(), edge_us, cloud_us, output_bytes }],
                input_bytes,
                allowed_cuts: AllowedCuts::All,
                max_transfer_bytes: None,
            };
            if let Ok(plan) = plan_split(&model, Link { bandwidth_bps, rtt_us }, cloud_queue_us) {
                prop_assert!(plan.expected_us.is_finite() && plan.expected_us >= 0.0);
            }
        }
    }
}
