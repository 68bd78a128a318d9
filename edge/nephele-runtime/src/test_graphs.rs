//! Small ONNX graphs built by hand for the graph rewrites' unit tests, and a way to run
//! them with tract (test builds only).

use prost::Message;
use tract_onnx::pb::{
    attribute_proto::AttributeType, tensor_proto::DataType, tensor_shape_proto, type_proto,
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use tract_onnx::prelude::*;

/// A float tensor named `name`.
pub fn floats(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Float as i32,
        float_data: values.to_vec(),
        ..TensorProto::default()
    }
}

/// A one-element float tensor of rank 0.
pub fn scalar(name: &str, value: f32) -> TensorProto {
    floats(name, &[], &[value])
}

/// A node writing `output` (also its name).
pub fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        name: output.into(),
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..NodeProto::default()
    }
}

/// `node` with float attributes.
pub fn with_floats(mut node: NodeProto, attributes: &[(&str, f32)]) -> NodeProto {
    node.attribute
        .extend(attributes.iter().map(|(name, value)| AttributeProto {
            name: name.to_string(),
            r#type: AttributeType::Float as i32,
            f: *value,
            ..AttributeProto::default()
        }));
    node
}

/// `node` with integer (list) attributes.
pub fn with_ints(mut node: NodeProto, attributes: &[(&str, &[i64])]) -> NodeProto {
    node.attribute
        .extend(attributes.iter().map(|(name, values)| {
            if let [value] = values {
                AttributeProto {
                    name: name.to_string(),
                    r#type: AttributeType::Int as i32,
                    i: *value,
                    ..AttributeProto::default()
                }
            } else {
                AttributeProto {
                    name: name.to_string(),
                    r#type: AttributeType::Ints as i32,
                    ints: values.to_vec(),
                    ..AttributeProto::default()
                }
            }
        }));
    node
}

/// A `Constant` node holding `tensor`.
pub fn constant(name: &str, mut tensor: TensorProto) -> NodeProto {
    tensor.name.clear();
    NodeProto {
        name: name.into(),
        op_type: "Constant".into(),
        output: vec![name.into()],
        attribute: vec![AttributeProto {
            name: "value".into(),
            r#type: AttributeType::Tensor as i32,
            t: Some(tensor),
            ..AttributeProto::default()
        }],
        ..NodeProto::default()
    }
}

/// A float value of the given dims, or of unknown shape.
pub fn value_info(name: &str, dims: Option<&[i64]>) -> ValueInfoProto {
    let shape = dims.map(|dims| TensorShapeProto {
        dim: dims
            .iter()
            .map(|d| tensor_shape_proto::Dimension {
                value: Some(tensor_shape_proto::dimension::Value::DimValue(*d)),
                ..Default::default()
            })
            .collect(),
    });
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: DataType::Float as i32,
                shape,
            })),
            ..TypeProto::default()
        }),
        ..ValueInfoProto::default()
    }
}

/// A model of opset 11 with one input `x` of `input_dims`: `nodes`, `initializers`, and
/// `outputs` (their shapes left to inference).
pub fn model(
    input_dims: &[i64],
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    outputs: &[&str],
) -> ModelProto {
    ModelProto {
        ir_version: 7,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 11,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: nodes,
            initializer: initializers,
            input: vec![value_info("x", Some(input_dims))],
            output: outputs.iter().map(|o| value_info(o, None)).collect(),
            ..GraphProto::default()
        }),
        ..ModelProto::default()
    }
}

/// The operator of each node, in order.
pub fn op_types(model: &ModelProto) -> Vec<String> {
    let graph = model.graph.as_ref().expect("graph");
    graph.node.iter().map(|n| n.op_type.clone()).collect()
}

/// Runs a model (optimised by tract) on `xs` shaped as its input; its first output.
pub fn run(model: &ModelProto, input_dims: &[usize], xs: &[f32]) -> Vec<f32> {
    let bytes = model.encode_to_vec();
    let plan = tract_onnx::onnx()
        .model_for_read(&mut bytes.as_slice())
        .and_then(|m| m.into_optimized())
        .and_then(|m| m.into_runnable())
        .expect("model loads");
    let input = tract_ndarray::ArrayD::from_shape_vec(input_dims.to_vec(), xs.to_vec())
        .expect("shape")
        .into_tensor();
    let out = plan.run(tvec!(input.into())).expect("runs");
    out[0]
        .to_plain_array_view::<f32>()
        .expect("f32")
        .iter()
        .copied()
        .collect()
}

/// Asserts that `rewrite` changes none of `cases` (it reports 0 and the nodes stay).
pub fn assert_left_alone(
    cases: Vec<(&str, ModelProto)>,
    rewrite: impl Fn(&mut ModelProto) -> usize,
) {
    for (case, mut model) in cases {
        let before = op_types(&model);
        assert_eq!(rewrite(&mut model), 0, "{case}");
        assert_eq!(op_types(&model), before, "{case}");
    }
}

/// Asserts two outputs agree to `tolerance`, relative to magnitudes above 1.
pub fn assert_close(got: &[f32], want: &[f32], tolerance: f32, case: &str) {
    assert_eq!(got.len(), want.len(), "{case}: lengths");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= tolerance * w.abs().max(1.0),
            "{case}: {g} vs {w}"
        );
    }
}

/// `n` values in [-scale, scale) from a fixed seed (a small linear congruential walk).
pub fn pseudo_random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `h = x·w` (16×16, quantized), then a value-dependent `If`: `h + b` when `h` sums
/// above zero, else `h − b`. The branches read `h` and `b` from the graph around
/// them by name, as openwakeword's verifier head does.
pub fn branch_reading_outer_names() -> ModelProto {
    let branch = |op: &str, out: &str| GraphProto {
        name: out.into(),
        node: vec![node(op, &["h", "b"], out)],
        output: vec![value_info(out, None)],
        ..GraphProto::default()
    };
    let weights: Vec<f32> = (0..256)
        .map(|i| ((i * 37 % 29) as f32 - 14.0) / 10.0)
        .collect();
    let bias: Vec<f32> = (0..16).map(|i| i as f32 / 4.0).collect();
    let mut choose = node("If", &["c"], "y");
    choose.attribute = vec![
        AttributeProto {
            name: "then_branch".into(),
            r#type: AttributeType::Graph as i32,
            g: Some(branch("Add", "t")),
            ..AttributeProto::default()
        },
        AttributeProto {
            name: "else_branch".into(),
            r#type: AttributeType::Graph as i32,
            g: Some(branch("Sub", "e")),
            ..AttributeProto::default()
        },
    ];
    let mut file = model(
        &[1, 16],
        vec![
            node("MatMul", &["x", "w"], "h"),
            node("ReduceSum", &["h"], "s"),
            node("Greater", &["s", "zero"], "c"),
            choose,
        ],
        vec![
            floats("w", &[16, 16], &weights),
            floats("b", &[16], &bias),
            floats("zero", &[], &[0.0]),
        ],
        &["y"],
    );
    file.opset_import[0].version = 13;
    file
}
