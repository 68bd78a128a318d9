//! Folding `If` nodes whose condition is fixed once the inputs' shapes (and the inputs
//! folded in with `--input NAME=…=VALUE`) are known.
//!
//! Exporters keep both branches of a Python `if`: silero-vad has one `If` on the
//! sample rate with a whole network in each branch, and inside those, `If`s on whether
//! a dimension is 1 (a `squeeze` that only applies to some shapes). tract types both
//! branches of an `If` and requires their outputs to agree, so the branch that would
//! never run makes the model fail to load ("Attempt to squeeze an axis which dimension
//! is not one"). Once the sample rate is a constant and the audio chunk has a size, every
//! one of those conditions is a constant: this module finds which, and replaces each
//! such `If` by the nodes of the branch it takes.
//!
//! A condition is folded only when tract itself proves it constant: the nodes it
//! depends on are typed and decluttered as a model of their own (inputs at their
//! declared shapes), every size in it must be a number, and the condition must come
//! out as a constant of that model. A condition that depends on the *values* of an
//! input never does, nor one on a symbolic size, so data-dependent control flow and
//! shapes left open stay as they are. Only `If`s of the main graph are folded (one whose
//! branch is inlined may expose more, which are then tried in turn); `Loop` and `Scan`
//! bodies are not touched.

use std::collections::{BTreeSet, HashMap, HashSet};

use prost::Message;
use tract_onnx::pb::{
    tensor_proto::DataType, type_proto, GraphProto, ModelProto, NodeProto, TypeProto,
    ValueInfoProto,
};
use tract_onnx::prelude::*;

use crate::graph_index::outer_reads;

/// At most this many `If`s are folded in one model (each fold types a sub-model).
pub const MAX_FOLDS: usize = 256;

/// What [`fold_constant_ifs`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IfFolding {
    /// `If` nodes replaced by the branch they take.
    pub folded: usize,
    /// `If` nodes of the main graph left in place (their condition is not a constant),
    /// by node name (or first output when unnamed).
    pub kept: Vec<String>,
}

/// Replaces every `If` of the main graph whose condition tract proves constant by the
/// nodes of the branch taken. Never fails: an `If` that cannot be decided stays.
pub fn fold_constant_ifs(model: &mut ModelProto) -> IfFolding {
    let mut report = IfFolding::default();
    let mut undecided: HashSet<String> = HashSet::new();
    while report.folded < MAX_FOLDS {
        let Some(graph) = model.graph.as_ref() else {
            break;
        };
        let next = graph.node.iter().position(|n| {
            n.op_type == "If"
                && n.domain.is_empty()
                && n.input.len() == 1
                && !n.output.is_empty()
                && !undecided.contains(&n.output[0])
        });
        let Some(index) = next else {
            break;
        };
        let folded = condition_value(model, index)
            .and_then(|value| model.graph.as_mut().map(|g| inline_branch(g, index, value)))
            .unwrap_or(false);
        if folded {
            report.folded += 1;
        } else if let Some(node) = model.graph.as_ref().map(|g| &g.node[index]) {
            undecided.insert(node.output[0].clone());
            report.kept.push(if node.name.is_empty() {
                node.output[0].clone()
            } else {
                node.name.clone()
            });
        }
    }
    report
}

/// The model's graph has at least one `If` node (in the main graph).
pub fn has_if(model: &ModelProto) -> bool {
    model
        .graph
        .as_ref()
        .is_some_and(|g| g.node.iter().any(|n| n.op_type == "If"))
}

/// Indices of the nodes `tensor` depends on, among the first `before` nodes.
fn ancestors(graph: &GraphProto, tensor: &str, before: usize) -> BTreeSet<usize> {
    let producer: HashMap<&str, usize> = graph.node[..before]
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i)))
        .collect();
    let mut seen = BTreeSet::new();
    let mut stack = vec![tensor];
    while let Some(name) = stack.pop() {
        if let Some(&i) = producer.get(name) {
            if seen.insert(i) {
                let node = &graph.node[i];
                stack.extend(
                    node.input
                        .iter()
                        .filter(|s| !s.is_empty())
                        .map(String::as_str),
                );
                // A node with a subgraph (an `If` left undecided) may read outer tensors.
                for attribute in &node.attribute {
                    for g in attribute.g.iter().chain(attribute.graphs.iter()) {
                        stack.extend(outer_reads(g));
                    }
                }
            }
        }
    }
    seen
}

/// The value of node `index`'s condition when tract proves it constant.
fn condition_value(model: &ModelProto, index: usize) -> Option<bool> {
    let graph = model.graph.as_ref()?;
    let condition = graph.node.get(index)?.input.first()?.clone();
    let nodes = ancestors(graph, &condition, index);
    let mut used: HashSet<&str> = HashSet::from([condition.as_str()]);
    for &i in &nodes {
        let node = &graph.node[i];
        used.extend(node.input.iter().map(String::as_str));
        for attribute in &node.attribute {
            for g in attribute.g.iter().chain(attribute.graphs.iter()) {
                used.extend(outer_reads(g));
            }
        }
    }
    let initializers: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let head = GraphProto {
        name: format!("{}-condition", graph.name),
        node: nodes.iter().map(|&i| graph.node[i].clone()).collect(),
        initializer: graph
            .initializer
            .iter()
            .filter(|t| used.contains(t.name.as_str()))
            .cloned()
            .collect(),
        input: graph
            .input
            .iter()
            .filter(|i| !initializers.contains(i.name.as_str()))
            .cloned()
            .collect(),
        output: vec![ValueInfoProto {
            name: condition.clone(),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: DataType::Bool as i32,
                    shape: None,
                })),
                ..TypeProto::default()
            }),
            doc_string: String::new(),
        }],
        ..GraphProto::default()
    };
    let bytes = ModelProto {
        ir_version: model.ir_version,
        opset_import: model.opset_import.clone(),
        graph: Some(head),
        ..ModelProto::default()
    }
    .encode_to_vec();
    let typed = crate::guard_parser("condition", || {
        let mut reader = &bytes[..];
        crate::onnx_reader()
            .model_for_read(&mut reader)
            .and_then(|m| m.into_typed())
            .and_then(|m| {
                // tract compares symbolic sizes structurally (`N == 1` is "false"), so a
                // condition is only trusted when every size it was computed from is a
                // number.
                let concrete = m
                    .nodes()
                    .iter()
                    .all(|n| n.outputs.iter().all(|o| o.fact.shape.is_concrete()));
                if concrete {
                    m.into_decluttered()
                } else {
                    Err(TractError::msg("the condition depends on a symbolic size"))
                }
            })
            .map_err(|e| crate::RuntimeError::Load {
                model: "condition".into(),
                cause: format!("{e:#}"),
            })
    })
    .ok()?;
    let fact = typed.output_fact(0).ok()?;
    let konst = fact.konst.as_ref()?;
    if konst.len() != 1 {
        return None;
    }
    konst.cast_to_scalar::<bool>().ok()
}

/// Replaces the `If` at `index` by the nodes of the branch `value` selects, plus one
/// `Identity` per output. Returns false (and changes nothing) when the node is not a
/// well-formed `If`.
fn inline_branch(graph: &mut GraphProto, index: usize, value: bool) -> bool {
    let node = &graph.node[index];
    let wanted = if value { "then_branch" } else { "else_branch" };
    let Some(branch) = node
        .attribute
        .iter()
        .find(|a| a.name == wanted)
        .and_then(|a| a.g.clone())
    else {
        return false;
    };
    if branch.output.len() != node.output.len() || !branch.sparse_initializer.is_empty() {
        return false;
    }
    let mut nodes = branch.node;
    for (k, (from, to)) in branch.output.iter().zip(&node.output).enumerate() {
        nodes.push(NodeProto {
            name: format!("{}:{wanted}:{k}", node.name),
            op_type: "Identity".into(),
            input: vec![from.name.clone()],
            output: vec![to.clone()],
            ..NodeProto::default()
        });
    }
    graph.initializer.extend(branch.initializer);
    graph.node.splice(index..=index, nodes);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_onnx::pb::{tensor_shape_proto, AttributeProto, OperatorSetIdProto, TensorProto};

    fn value_info(name: &str, elem: DataType, dims: &[i64]) -> ValueInfoProto {
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: elem as i32,
                    shape: Some(tract_onnx::pb::TensorShapeProto {
                        dim: dims
                            .iter()
                            .map(|d| tensor_shape_proto::Dimension {
                                value: Some(if *d < 0 {
                                    tensor_shape_proto::dimension::Value::DimParam("N".into())
                                } else {
                                    tensor_shape_proto::dimension::Value::DimValue(*d)
                                }),
                                ..Default::default()
                            })
                            .collect(),
                    }),
                })),
                ..TypeProto::default()
            }),
            doc_string: String::new(),
        }
    }

    fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..NodeProto::default()
        }
    }

    fn i64_tensor(name: &str, dims: &[i64], values: &[i64]) -> TensorProto {
        TensorProto {
            name: name.into(),
            dims: dims.to_vec(),
            data_type: DataType::Int64 as i32,
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ..TensorProto::default()
        }
    }

    /// `y = x * 2` when `x`'s first dimension is 1, else `y = x + 1`: the shape of `x`
    /// decides, as in an exporter's `if x.shape[0] == 1`.
    fn shape_branching(x_dims: &[i64]) -> ModelProto {
        let branch = |op: &str, out: &str, constant: &str| GraphProto {
            name: out.into(),
            node: vec![node(op, &["x", constant], &[out])],
            output: vec![value_info(out, DataType::Float, &[])],
            ..GraphProto::default()
        };
        let graph = GraphProto {
            name: "g".into(),
            input: vec![value_info("x", DataType::Float, x_dims)],
            output: vec![value_info("y", DataType::Float, &[])],
            initializer: vec![
                i64_tensor("zero", &[1], &[0]),
                i64_tensor("one", &[], &[1]),
                TensorProto {
                    name: "two".into(),
                    data_type: DataType::Float as i32,
                    raw_data: 2f32.to_le_bytes().to_vec(),
                    ..TensorProto::default()
                },
                TensorProto {
                    name: "onef".into(),
                    data_type: DataType::Float as i32,
                    raw_data: 1f32.to_le_bytes().to_vec(),
                    ..TensorProto::default()
                },
            ],
            node: vec![
                node("Shape", &["x"], &["s"]),
                node("Gather", &["s", "one"], &["d0"]),
                node("Equal", &["d0", "one"], &["c"]),
                NodeProto {
                    name: "choose".into(),
                    attribute: vec![
                        AttributeProto {
                            name: "then_branch".into(),
                            g: Some(branch("Mul", "t", "two")),
                            ..AttributeProto::default()
                        },
                        AttributeProto {
                            name: "else_branch".into(),
                            g: Some(branch("Add", "e", "onef")),
                            ..AttributeProto::default()
                        },
                    ],
                    ..node("If", &["c"], &["y"])
                },
            ],
            ..GraphProto::default()
        };
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 16,
            }],
            graph: Some(graph),
            ..ModelProto::default()
        }
    }

    fn ops(model: &ModelProto) -> Vec<String> {
        model
            .graph
            .as_ref()
            .map(|g| g.node.iter().map(|n| n.op_type.clone()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_condition_on_a_known_shape_takes_its_branch() {
        // x is [2, 1]: dimension 1 is 1, so `then` (Mul) is taken.
        let mut model = shape_branching(&[2, 1]);
        let report = fold_constant_ifs(&mut model);
        assert_eq!(report.folded, 1);
        assert!(report.kept.is_empty());
        assert_eq!(ops(&model), ["Shape", "Gather", "Equal", "Mul", "Identity"]);
        // x is [2, 3]: `else` (Add).
        let mut model = shape_branching(&[2, 3]);
        assert_eq!(fold_constant_ifs(&mut model).folded, 1);
        assert_eq!(ops(&model), ["Shape", "Gather", "Equal", "Add", "Identity"]);
        // The folded model computes what the else branch says.
        let bytes = model.encode_to_vec();
        let typed = tract_onnx::onnx()
            .model_for_read(&mut &bytes[..])
            .and_then(|m| m.into_optimized())
            .and_then(|m| m.into_runnable())
            .expect("the folded model loads");
        let x = tract_ndarray::Array2::<f32>::from_elem((2, 3), 4.0);
        let out = typed.run(tvec!(Tensor::from(x).into())).expect("runs");
        let y = out[0].to_plain_array_view::<f32>().expect("f32");
        assert!(y.iter().all(|v| *v == 5.0), "{y:?}");
    }

    #[test]
    fn a_condition_on_an_unknown_size_is_left_alone() {
        let mut model = shape_branching(&[2, -1]);
        let before = model.clone();
        let report = fold_constant_ifs(&mut model);
        assert_eq!(report.folded, 0);
        assert_eq!(report.kept, ["choose"]);
        assert_eq!(model, before);
    }
}
