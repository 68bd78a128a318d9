//! tract's ONNX operator families that a build may leave out, and the refusal of a model
//! that needs one this build lacks.
//!
//! Each family is a cargo feature of this crate (on by default; `onnx-ops` is all of
//! them) that turns on the tract-onnx code registering its operators (the patched
//! tract-onnx, shared/vendor/README.md). An edge build without one is smaller (the FFT
//! family alone links 1.9 MB of rustfft) and cannot run such a model; without this check
//! tract would fail deep in its analysis with a message naming an unimplemented operator
//! and nothing else. tract looks operators up by name whatever their domain, and so
//! does this.

use tract_onnx::pb::{GraphProto, ModelProto};

/// One family: the feature that carries it and the operators it registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpFamily {
    /// The cargo feature of nephele-runtime and nephele-edge.
    pub feature: &'static str,
    /// What the family is, for people.
    pub what: &'static str,
    /// The ONNX operator types tract-onnx registers for it.
    pub ops: &'static [&'static str],
    /// Whether this build has it.
    pub compiled: bool,
}

/// Every family a build may leave out.
pub const OP_FAMILIES: [OpFamily; 3] = [
    OpFamily {
        feature: "onnx-fft",
        what: "Fourier transforms and spectrogram front-ends",
        ops: &[
            "DFT",
            "STFT",
            "MelWeightMatrix",
            "BlackmanWindow",
            "HammingWindow",
            "HannWindow",
        ],
        compiled: cfg!(feature = "onnx-fft"),
    },
    OpFamily {
        feature: "onnx-ml",
        what: "ONNX-ML classic models (tree ensembles, linear models)",
        ops: &[
            "CategoryMapper",
            "LinearClassifier",
            "LinearRegressor",
            "Normalizer",
            "TreeEnsembleClassifier",
        ],
        compiled: cfg!(feature = "onnx-ml"),
    },
    OpFamily {
        feature: "onnx-attention",
        what: "fused attention operators",
        ops: &["Attention", "GroupQueryAttention", "MultiHeadAttention"],
        compiled: cfg!(feature = "onnx-attention"),
    },
];

/// The families `model` uses (its main graph and every subgraph), in [`OP_FAMILIES`]'
/// order, each with the first of its operators found.
pub fn families_used(model: &ModelProto) -> Vec<(OpFamily, String)> {
    let mut used: Vec<(OpFamily, String)> = Vec::new();
    if let Some(graph) = &model.graph {
        collect(graph, &mut used);
    }
    used.sort_by_key(|(family, _)| OP_FAMILIES.iter().position(|f| f.feature == family.feature));
    used
}

fn collect(graph: &GraphProto, used: &mut Vec<(OpFamily, String)>) {
    for node in &graph.node {
        let family = OP_FAMILIES
            .iter()
            .find(|family| family.ops.contains(&node.op_type.as_str()));
        if let Some(family) = family {
            if !used.iter().any(|(f, _)| f.feature == family.feature) {
                used.push((*family, node.op_type.clone()));
            }
        }
        for attribute in &node.attribute {
            for subgraph in attribute.g.iter().chain(attribute.graphs.iter()) {
                collect(subgraph, used);
            }
        }
    }
}

/// Why this build cannot run `model`, when it uses a family the build was made without:
/// the operator, the feature and what to do.
pub fn refusal(model: &ModelProto) -> Option<String> {
    refusal_unless(model, |family| family.compiled)
}

/// [`refusal`] for a build that has the families `compiled` says it has.
fn refusal_unless(model: &ModelProto, compiled: impl Fn(&OpFamily) -> bool) -> Option<String> {
    let (family, op) = families_used(model)
        .into_iter()
        .find(|(family, _)| !compiled(family))?;
    Some(format!(
        "operator {op} ({}) is not in this build (built without the `{}` feature); run this model on an agent built with it (the default, or `--features {}`)",
        family.what, family.feature, family.feature
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RuntimeError;
    use tract_onnx::pb::{AttributeProto, NodeProto};

    fn node(op: &str) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            ..Default::default()
        }
    }

    fn model(nodes: Vec<NodeProto>) -> ModelProto {
        ModelProto {
            graph: Some(GraphProto {
                node: nodes,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn each_operator_belongs_to_one_family() {
        let mut seen = std::collections::HashSet::new();
        for family in OP_FAMILIES {
            for op in family.ops {
                assert!(seen.insert(*op), "{op} is in two families");
            }
        }
    }

    /// The table names exactly what the (vendored) tract-onnx registers under each
    /// feature, so a new tract release that adds an operator to a family is noticed.
    #[test]
    fn the_table_matches_what_tract_onnx_registers_per_feature() {
        fn inserted(source: &str) -> Vec<String> {
            source
                .split("reg.insert(\"")
                .skip(1)
                .filter_map(|rest| rest.split('"').next())
                .map(str::to_string)
                .collect()
        }
        let ops = "../../shared/vendor/tract-onnx/src/ops/";
        let fft = inserted(include_str!(
            "../../../shared/vendor/tract-onnx/src/ops/fft.rs"
        ));
        let ml: Vec<String> = [
            include_str!("../../../shared/vendor/tract-onnx/src/ops/ml/category_mapper.rs"),
            include_str!("../../../shared/vendor/tract-onnx/src/ops/ml/linear_classifier.rs"),
            include_str!("../../../shared/vendor/tract-onnx/src/ops/ml/linear_regressor.rs"),
            include_str!("../../../shared/vendor/tract-onnx/src/ops/ml/normalizer.rs"),
            include_str!(
                "../../../shared/vendor/tract-onnx/src/ops/ml/tree_ensemble_classifier.rs"
            ),
        ]
        .into_iter()
        .flat_map(inserted)
        .collect();
        let ml_mod = include_str!("../../../shared/vendor/tract-onnx/src/ops/ml/mod.rs");
        let files = ml_mod.lines().filter(|l| l.starts_with("mod ")).count();
        assert_eq!(files, 5, "{ops}ml/mod.rs registers files not read here");
        // The attention operators: the registrations right after `cfg(feature = "transformers")`.
        let nn = include_str!("../../../shared/vendor/tract-onnx/src/ops/nn/mod.rs");
        let attention: Vec<String> = nn
            .split("#[cfg(feature = \"transformers\")]")
            .skip(1)
            .filter_map(|rest| rest.trim_start().strip_prefix("reg.insert(\""))
            .filter_map(|rest| rest.split('"').next())
            .map(str::to_string)
            .collect();
        let table = |feature: &str| -> Vec<String> {
            let family = OP_FAMILIES
                .iter()
                .find(|f| f.feature == feature)
                .expect("family");
            family.ops.iter().map(|op| op.to_string()).collect()
        };
        assert_eq!(fft, table("onnx-fft"), "{ops}fft.rs");
        assert_eq!(ml, table("onnx-ml"), "{ops}ml/");
        assert_eq!(attention, table("onnx-attention"), "{ops}nn/mod.rs");
    }

    #[test]
    fn families_are_found_in_subgraphs_once_each_in_table_order() {
        let body = GraphProto {
            node: vec![node("Add"), node("DFT"), node("STFT")],
            ..Default::default()
        };
        let mut branch = node("If");
        branch.attribute.push(AttributeProto {
            name: "then_branch".into(),
            g: Some(body),
            ..Default::default()
        });
        let found = families_used(&model(vec![
            node("MatMul"),
            node("TreeEnsembleClassifier"),
            branch,
            node("Attention"),
            node("Normalizer"),
        ]));
        let found: Vec<(&str, &str)> = found
            .iter()
            .map(|(f, op)| (f.feature, op.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                ("onnx-fft", "DFT"),
                ("onnx-ml", "TreeEnsembleClassifier"),
                ("onnx-attention", "Attention")
            ]
        );
        assert!(families_used(&model(vec![node("Conv"), node("Relu")])).is_empty());
        assert!(families_used(&ModelProto::default()).is_empty());
    }

    /// A model is refused for a family the build lacks, with its operator and feature
    /// named, and for nothing else.
    #[test]
    fn a_model_is_refused_only_for_a_family_the_build_lacks() {
        let stft = model(vec![node("Relu"), node("STFT")]);
        assert_eq!(refusal(&stft).is_some(), !cfg!(feature = "onnx-fft"));
        let cause = refusal_unless(&stft, |f| f.feature != "onnx-fft")
            .expect("a build without onnx-fft refuses STFT");
        assert!(cause.contains("operator STFT"), "{cause}");
        assert!(cause.contains("without the `onnx-fft` feature"), "{cause}");
        assert!(cause.contains("--features onnx-fft"), "{cause}");
        assert!(refusal_unless(&stft, |f| f.feature != "onnx-ml").is_none());
        assert!(refusal_unless(&model(vec![node("Conv")]), |_| false).is_none());
    }

    /// The features reach tract-onnx: a model of each family loads on a build that has
    /// it (this workspace's, every family on) and one with a DFT computes its transform.
    #[test]
    fn a_dft_model_runs_or_is_refused_by_what_this_build_has() {
        use crate::test_graphs;
        use prost::Message;
        use tract_onnx::pb::OperatorSetIdProto;
        // 8 real samples in, 8 complex frequencies (re, im) out.
        let mut dft = test_graphs::model(
            &[1, 8, 1],
            vec![test_graphs::node("DFT", &["x"], "y")],
            vec![],
            &["y"],
        );
        dft.opset_import = vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }];
        let xs: Vec<f32> = (0..8).map(|i| ((i * 5) % 7) as f32 - 3.0).collect();
        let loaded = crate::Model::load_onnx("dft", &dft.encode_to_vec());
        if !cfg!(feature = "onnx-fft") {
            match loaded {
                Err(RuntimeError::Unsupported { cause, .. }) => {
                    assert!(cause.contains("`onnx-fft`"), "{cause}")
                }
                Err(other) => panic!("not refused for its operator family: {other}"),
                Ok(_) => panic!("loaded without the onnx-fft feature"),
            }
            return;
        }
        let model = loaded.expect("a DFT model loads with the onnx-fft feature");
        let (shape, ys) = model.infer(&[1, 8, 1], &xs).expect("runs");
        assert_eq!(shape, [1, 8, 2]);
        for k in 0..8 {
            let angle = |n: usize| -2.0 * std::f32::consts::PI * (k * n) as f32 / 8.0;
            let re: f32 = (0..8).map(|n| xs[n] * angle(n).cos()).sum();
            let im: f32 = (0..8).map(|n| xs[n] * angle(n).sin()).sum();
            assert!(
                (ys[2 * k] - re).abs() < 1e-4,
                "frequency {k}: {} vs {re}",
                ys[2 * k]
            );
            assert!(
                (ys[2 * k + 1] - im).abs() < 1e-4,
                "frequency {k}: {} vs {im}",
                ys[2 * k + 1]
            );
        }
    }
}
