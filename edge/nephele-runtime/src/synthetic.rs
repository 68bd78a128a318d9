//! Real ONNX files made here, for load tests that need a model whose compute is not
//! negligible: a dense MLP (MatMul, Add, Relu) with seeded weights scaled by
//! 1/sqrt(fan-in). It is an ordinary ONNX file that tract (or any ONNX runtime) loads
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
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: DataType::Float as i32,
                shape: Some(TensorShapeProto {
                    dim: vec![
                        tensor_shape_proto::Dimension {
                            denotation: String::new(),
                            value: Some(tensor_shape_proto::dimension::Value::DimParam("N".into())),
                        },
                        tensor_shape_proto::Dimension {
                            denotation: String::new(),
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(
                                width as i64,
                            )),
                        },
                    ],
                }),
            })),
            denotation: String::new(),
        }),
        doc_string: String::new(),
    }
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
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        producer_name: "nephele-runtime synthetic".into(),
        graph: Some(GraphProto {
            name: "dense-mlp".into(),
            node: nodes,
            initializer,
            input: vec![value("input", input)],
            output: vec![value("logits", output)],
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
}
