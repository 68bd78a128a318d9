//! Other versions of the digits model for rollout tests, made by editing its ONNX
//! protobuf: one that answers the same but computes far more (a deliberately slow
//! version), and one that is the same computation in other bytes (a good version).

use prost::Message;
use tract_onnx::pb::{tensor_proto::DataType, ModelProto, NodeProto, TensorProto};

/// The digits model with `layers` extra `width`×`width` matrix products in front of
/// it, whose result is added to the input scaled by 1e-9: the answers stay the same,
/// each row costs about `layers × width²` more multiply-adds. The square weight is one
/// initializer shared by every layer, so the file grows by one matrix only.
pub fn slow_digits(layers: usize, width: usize) -> Vec<u8> {
    let mut model = ModelProto::decode(crate::MODEL_ONNX).expect("the digits model decodes");
    let graph = model.graph.as_mut().expect("a graph");
    let input = graph.input[0].name.clone();
    let features = 64usize;
    let renamed = format!("{input}__slowed");
    for node in &mut graph.node {
        for name in &mut node.input {
            if *name == input {
                *name = renamed.clone();
            }
        }
    }
    let mut seed = 0x5eed_u64;
    let mut weights = |rows: usize, cols: usize, scale: f32| -> Vec<f32> {
        (0..rows * cols)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect()
    };
    let tensor = |name: &str, dims: &[usize], data: Vec<f32>| TensorProto {
        name: name.into(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: DataType::Float as i32,
        float_data: data,
        ..Default::default()
    };
    // Scaled so activations neither vanish nor blow up through the ReLU chain.
    let scale = (6.0 / width as f32).sqrt();
    graph.initializer.push(tensor(
        "slow_in",
        &[features, width],
        weights(features, width, scale),
    ));
    graph.initializer.push(tensor(
        "slow_w",
        &[width, width],
        weights(width, width, scale),
    ));
    graph.initializer.push(tensor(
        "slow_out",
        &[width, features],
        weights(width, features, 1e-9),
    ));
    let node = |op: &str, inputs: &[&str], output: &str| NodeProto {
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: output.into(),
        ..Default::default()
    };
    let mut front = vec![
        node("MatMul", &[&input, "slow_in"], "slow_0m"),
        node("Relu", &["slow_0m"], "slow_0"),
    ];
    for layer in 1..=layers {
        let previous = format!("slow_{}", layer - 1);
        let product = format!("slow_{layer}m");
        front.push(node("MatMul", &[&previous, "slow_w"], &product));
        front.push(node("Relu", &[&product], &format!("slow_{layer}")));
    }
    let last = format!("slow_{layers}");
    front.push(node("MatMul", &[&last, "slow_out"], "slow_tiny"));
    front.push(node("Add", &[&input, "slow_tiny"], &renamed));
    front.append(&mut graph.node);
    graph.node = front;
    model.encode_to_vec()
}

/// The digits model in other bytes (its doc string says `tag`): the same computation,
/// another content address, so another version.
pub fn retagged_digits(tag: &str) -> Vec<u8> {
    let mut model = ModelProto::decode(crate::MODEL_ONNX).expect("the digits model decodes");
    model.doc_string = format!("digits, {tag}");
    model.encode_to_vec()
}

/// The digits model with class 0's output bias raised by `shift`: it loads and runs at
/// the same speed, but answers 0 far too often (a version whose accuracy dropped, as a
/// bad retraining would make one).
pub fn biased_digits(shift: f32) -> Vec<u8> {
    let mut model = ModelProto::decode(crate::MODEL_ONNX).expect("the digits model decodes");
    let graph = model.graph.as_mut().expect("a graph");
    let bias = graph
        .initializer
        .iter_mut()
        .find(|t| t.name == "fc3.bias")
        .expect("the digits model's output bias");
    if bias.raw_data.len() >= 4 {
        let value = f32::from_le_bytes([
            bias.raw_data[0],
            bias.raw_data[1],
            bias.raw_data[2],
            bias.raw_data[3],
        ]) + shift;
        bias.raw_data[..4].copy_from_slice(&value.to_le_bytes());
    } else {
        bias.float_data[0] += shift;
    }
    model.encode_to_vec()
}
