//! Real ONNX files made here, for load tests that need a model whose compute is not
//! negligible: a dense MLP (MatMul, Add, Relu) with seeded weights scaled by
//! 1/sqrt(fan-in), and a small CNN for the fuzzing corpus. It is an ordinary ONNX file that tract (or any ONNX runtime) loads
//! and runs; only its weights are not trained, so its answers mean nothing. Used by
//! the end-to-end autoscaling test (a burst must cost the pool real CPU time) and by
//! `nephele bench`, never shipped as a model people deploy.

use prost::Message;
use tract_onnx::pb::{
    tensor_proto::DataType, tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

/// SplitMix64: the same weights for the same seed on every machine.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn value(name: &str, width: usize) -> ValueInfoProto {
    typed_value(name, DataType::Float, &["N", &width.to_string()])
}

fn tensor(name: &str, dims: &[usize], data: Vec<f32>) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.iter().map(|d| *d as i64).collect(),
        data_type: DataType::Float as i32,
        float_data: data,
        ..TensorProto::default()
    }
}

fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: output.into(),
        op_type: op.into(),
        ..NodeProto::default()
    }
}

/// An MLP from `input` features through `layers` hidden layers of `width` (ReLU) to
/// `output` logits, input `input` and output `logits`, batch dimension symbolic.
pub fn dense_mlp(input: usize, width: usize, layers: usize, output: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut initializer = Vec::new();
    let mut nodes = Vec::new();
    let mut previous = "input".to_string();
    let mut fan_in = input;
    let widths: Vec<usize> = (0..layers).map(|_| width).chain([output]).collect();
    for (index, fan_out) in widths.iter().enumerate() {
        let scale = (1.0 / fan_in as f64).sqrt();
        let weights: Vec<f32> = (0..fan_in * fan_out)
            .map(|_| ((next(&mut state) as f64 / u64::MAX as f64 * 2.0 - 1.0) * scale) as f32)
            .collect();
        let bias: Vec<f32> = (0..*fan_out)
            .map(|_| ((next(&mut state) as f64 / u64::MAX as f64 - 0.5) * 0.1) as f32)
            .collect();
        let (w, b) = (format!("w{index}"), format!("b{index}"));
        initializer.push(tensor(&w, &[fan_in, *fan_out], weights));
        initializer.push(tensor(&b, &[*fan_out], bias));
        let last = index + 1 == widths.len();
        let product = format!("mm{index}");
        let sum = if last {
            "logits".to_string()
        } else {
            format!("add{index}")
        };
        nodes.push(node("MatMul", &[&previous, &w], &product));
        nodes.push(node("Add", &[&product, &b], &sum));
        previous = sum;
        if !last {
            let relu = format!("relu{index}");
            nodes.push(node("Relu", &[&previous], &relu));
            previous = relu;
        }
        fan_in = *fan_out;
    }
    model_bytes(GraphProto {
        name: "dense-mlp".into(),
        node: nodes,
        initializer,
        input: vec![value("input", input)],
        output: vec![value("logits", output)],
        ..GraphProto::default()
    })
}

/// `graph` as an ONNX file of this module's models (IR 8, opset 17).
fn model_bytes(graph: GraphProto) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        producer_name: "nephele-runtime synthetic".into(),
        graph: Some(graph),
        ..ModelProto::default()
    }
    .encode_to_vec()
}

/// A value of ONNX element type `elem` with dimensions `dims` (sizes, or names for
/// symbolic ones).
fn typed_value(name: &str, elem: DataType, dims: &[&str]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem as i32,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| tensor_shape_proto::Dimension {
                            denotation: String::new(),
                            value: Some(match d.parse::<i64>() {
                                Ok(size) => tensor_shape_proto::dimension::Value::DimValue(size),
                                Err(_) => {
                                    tensor_shape_proto::dimension::Value::DimParam(d.to_string())
                                }
                            }),
                        })
                        .collect(),
                }),
            })),
            ..TypeProto::default()
        }),
        ..ValueInfoProto::default()
    }
}

/// A model with the shape of an exported one rather than a demo's: three typed inputs,
/// `ids` (i64 `[1, 4]`), `scale` (f32 `[N, 4]`, its batch symbolic) and `offset` (i64,
/// rank 0), and two outputs, `doubled = ids + ids` (i64) and `scaled = f32(ids) · scale
/// + f32(offset)` (f32). For the typed-tensor tests: `--input scale=1,4` fixes the
/// batch and `--input offset=scalar:i64=3` folds the offset in.
pub fn typed_example() -> Vec<u8> {
    use tract_onnx::pb::{attribute_proto::AttributeType, AttributeProto};
    let cast = |input: &str, output: &str| NodeProto {
        input: vec![input.into()],
        output: vec![output.into()],
        name: output.into(),
        op_type: "Cast".into(),
        attribute: vec![AttributeProto {
            name: "to".into(),
            r#type: AttributeType::Int as i32,
            i: DataType::Float as i64,
            ..AttributeProto::default()
        }],
        ..NodeProto::default()
    };
    model_bytes(GraphProto {
        name: "typed-example".into(),
        node: vec![
            node("Add", &["ids", "ids"], "doubled"),
            cast("ids", "ids_f"),
            cast("offset", "offset_f"),
            node("Mul", &["ids_f", "scale"], "product"),
            node("Add", &["product", "offset_f"], "scaled"),
        ],
        input: vec![
            typed_value("ids", DataType::Int64, &["1", "4"]),
            typed_value("scale", DataType::Float, &["N", "4"]),
            typed_value("offset", DataType::Int64, &[]),
        ],
        output: vec![
            typed_value("doubled", DataType::Int64, &["1", "4"]),
            typed_value("scaled", DataType::Float, &["N", "4"]),
        ],
        ..GraphProto::default()
    })
}

/// A small CNN over `[N, 3, 16, 16]` images with one layer of each kind the runtime's
/// convolution kernels take (a 3×3 stride-2 stem, a depthwise 3×3, a 1×1), ReLUs
/// between, output `features` `[N, 8, 8, 8]`; seeded weights as [`dense_mlp`]'s. The
/// fuzzing corpus's seed for those kernels (`fuzz/examples/make_corpus.rs`).
pub fn conv_net(seed: u64) -> Vec<u8> {
    use tract_onnx::pb::{attribute_proto::AttributeType, AttributeProto};
    let ints = |name: &str, values: &[i64]| AttributeProto {
        name: name.into(),
        r#type: AttributeType::Ints as i32,
        ints: values.to_vec(),
        ..AttributeProto::default()
    };
    let mut state = seed;
    let mut weights = |dims: &[usize], fan_in: usize| {
        let scale = (1.0 / fan_in as f64).sqrt();
        let n = dims.iter().product::<usize>();
        (0..n)
            .map(|_| ((next(&mut state) as f64 / u64::MAX as f64 * 2.0 - 1.0) * scale) as f32)
            .collect::<Vec<f32>>()
    };
    // Name, input, output, kernel shape [O, I/group, kH, kW], group, stride, pad.
    let layers = [
        ("stem", "image", 6, 3, 3, 1, 2, 1),
        ("dw", "stem_relu", 6, 1, 3, 6, 1, 1),
        ("pw", "dw_relu", 8, 6, 1, 1, 1, 0),
    ];
    let mut nodes = Vec::new();
    let mut initializer = Vec::new();
    for (name, input, outputs, per_group, k, group, stride, pad) in layers {
        let (w, b) = (format!("{name}_w"), format!("{name}_b"));
        initializer.push(tensor(
            &w,
            &[outputs, per_group, k, k],
            weights(&[outputs, per_group, k, k], per_group * k * k),
        ));
        initializer.push(tensor(&b, &[outputs], weights(&[outputs], 10)));
        let mut conv = node("Conv", &[input, &w, &b], name);
        let k = k as i64;
        conv.attribute = vec![
            ints("kernel_shape", &[k, k]),
            ints("strides", &[stride, stride]),
            ints("pads", &[pad, pad, pad, pad]),
            AttributeProto {
                name: "group".into(),
                r#type: AttributeType::Int as i32,
                i: group,
                ..AttributeProto::default()
            },
        ];
        nodes.push(conv);
        let relu = if name == "pw" {
            "features".to_string()
        } else {
            format!("{name}_relu")
        };
        nodes.push(node("Relu", &[name], &relu));
    }
    model_bytes(GraphProto {
        name: "conv-net".into(),
        node: nodes,
        initializer,
        input: vec![typed_value(
            "image",
            DataType::Float,
            &["N", "3", "16", "16"],
        )],
        output: vec![typed_value(
            "features",
            DataType::Float,
            &["N", "8", "8", "8"],
        )],
        ..GraphProto::default()
    })
}

/// `y = x - mean(x over the batch)` for x f32 `[N, 4]`: its first dimension is a
/// symbol everywhere, but its rows mix, so it has no batch axis to batch requests on.
#[cfg(test)]
pub(crate) fn row_mixing_example() -> Vec<u8> {
    use tract_onnx::pb::{attribute_proto::AttributeType, AttributeProto};
    let mut mean = node("ReduceMean", &["x"], "mean");
    mean.attribute = vec![AttributeProto {
        name: "axes".into(),
        r#type: AttributeType::Ints as i32,
        ints: vec![0],
        ..AttributeProto::default()
    }];
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: "row-mixing".into(),
            node: vec![mean, node("Sub", &["x", "mean"], "y")],
            input: vec![typed_value("x", DataType::Float, &["N", "4"])],
            output: vec![typed_value("y", DataType::Float, &["N", "4"])],
            ..GraphProto::default()
        }),
        ..ModelProto::default()
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mlp_loads_runs_and_is_the_same_for_a_seed() {
        let bytes = dense_mlp(64, 128, 2, 10, 7);
        assert_eq!(bytes, dense_mlp(64, 128, 2, 10, 7));
        assert_ne!(bytes, dense_mlp(64, 128, 2, 10, 8));
        let model = crate::Model::load_onnx("mlp", &bytes).expect("tract loads it");
        let (shape, out) = model.infer(&[1, 64], &[0.5; 64]).expect("runs");
        assert_eq!((shape, out.len()), (vec![1, 10], 10));
        assert!(out.iter().all(|v| v.is_finite()));
    }

    /// The CNN seed plans its three convolutions on the runtime's own kernels, runs,
    /// and is the same for a seed.
    #[test]
    fn the_conv_net_runs_on_the_runtimes_convolution_kernels() {
        let bytes = conv_net(3);
        assert_eq!(bytes, conv_net(3));
        let model = crate::Model::load_onnx("cnn", &bytes).expect("tract loads it");
        let ops = model.op_profile(1).expect("profiles");
        for op in ["NepheleConv", "NepheleDepthwise", "NephelePointwise"] {
            assert!(ops.iter().any(|o| o.op == op), "{op}: {ops:?}");
        }
        let (shape, out) = model.infer(&[1, 3, 16, 16], &[0.5; 768]).expect("runs");
        assert_eq!((shape, out.len()), (vec![1, 8, 8, 8], 512));
        assert!(out.iter().all(|v| v.is_finite() && *v >= 0.0));
    }

    #[test]
    fn the_typed_example_runs_with_its_inputs_fixed_at_push() {
        use crate::graph_model::{GraphModel, NamedTensor};
        use crate::input_spec::{apply, InputSpec};
        let bytes = typed_example();
        // As exported: the single-f32 path refuses it, naming what to do; the typed
        // path loads it with N left symbolic, bound from each request's shapes.
        let refused = crate::Model::load_onnx("typed", &bytes).expect_err("refused");
        assert!(refused.to_string().contains("inputs"), "{refused}");
        let symbolic = GraphModel::load("typed", &bytes).expect("loads with N symbolic");
        assert_eq!(symbolic.inputs()[1].dims_text(), "[N, 4]");
        let tensor = |dtype: &str, shape: Vec<usize>, data: Vec<f64>| NamedTensor {
            dtype: dtype.into(),
            shape,
            data,
        };
        let mut two = std::collections::HashMap::from([
            (
                "ids".to_string(),
                tensor("i64", vec![1, 4], vec![1.0, 2.0, 3.0, -4.0]),
            ),
            (
                "scale".to_string(),
                tensor(
                    "f32",
                    vec![2, 4],
                    vec![1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0],
                ),
            ),
            ("offset".to_string(), tensor("i64", vec![], vec![1.0])),
        ]);
        let out = symbolic.run(&two).expect("runs with N = 2");
        assert_eq!(out["scaled"].shape, vec![2, 4]);
        assert_eq!(
            out["scaled"].data,
            vec![2.0, 3.0, 4.0, -3.0, 3.0, 5.0, 7.0, -7.0]
        );
        // A fixed size still has to match.
        two.insert("ids".into(), tensor("i64", vec![2, 4], vec![0.0; 8]));
        let wrong = symbolic.check(&two).expect_err("ids is [1, 4]");
        assert!(wrong.contains("[1, 4]"), "{wrong}");
        let specs: Vec<InputSpec> = ["scale=1,4", "offset=scalar:i64=3"]
            .iter()
            .map(|t| t.parse().expect("spec"))
            .collect();
        let fixed = apply("typed", &bytes, &specs).expect("applies");
        let model = GraphModel::load("typed", &fixed).expect("loads");
        assert_eq!(model.inputs().len(), 2, "{model:?}");
        let request = std::collections::HashMap::from([
            (
                "ids".to_string(),
                NamedTensor {
                    dtype: "i64".into(),
                    shape: vec![1, 4],
                    data: vec![1.0, 2.0, 3.0, -4.0],
                },
            ),
            (
                "scale".to_string(),
                NamedTensor {
                    dtype: "f32".into(),
                    shape: vec![1, 4],
                    data: vec![0.5, 0.5, 2.0, 1.0],
                },
            ),
        ]);
        let out = model.run(&request).expect("runs");
        assert_eq!(out["doubled"].dtype, "i64");
        assert_eq!(out["doubled"].data, vec![2.0, 4.0, 6.0, -8.0]);
        assert_eq!(out["scaled"].dtype, "f32");
        assert_eq!(out["scaled"].data, vec![3.5, 4.0, 9.0, -1.0]);
        // Wrong type, missing input, unknown name: each refused with the reason.
        let mut wrong = request.clone();
        if let Some(ids) = wrong.get_mut("ids") {
            ids.dtype = "i32".into();
        }
        assert!(model.check(&wrong).expect_err("type").contains("i64"));
        let mut missing = request.clone();
        missing.remove("scale");
        assert!(model
            .check(&missing)
            .expect_err("missing")
            .contains("missing"));
        let mut extra = request;
        extra.insert("offset".into(), model.zeros()["ids"].clone());
        assert!(model
            .check(&extra)
            .expect_err("folded")
            .contains("no input"));
    }
}
