//! How a prepared ONNX file is taken in: what a push does with it after
//! [`crate::input_spec::prepare`] and before its variants, and what `nephele model
//! inspect` reports. Both call [`load_prepared`], so they cannot disagree.
//!
//! The batched path first (one f32 input and output: [`crate::Model`]); whatever it
//! refuses, the typed path ([`crate::graph_model::GraphModel`]: several inputs and
//! outputs of any supported type, batched only along a batch axis the model really
//! has), which must also run once on zero inputs. A file neither path takes is
//! refused with both reasons when the batched one was tried for a reason.

use crate::graph_model::GraphModel;
use crate::{Model, RuntimeError};

/// How a file is served.
pub enum Served {
    /// One f32 input and output, batch plans of 1–64.
    Batched(Model),
    /// Named typed inputs and outputs.
    Typed(GraphModel),
}

impl Served {
    /// What `inspect` prints and a push reports: `batched (one f32 input)`, or `typed
    /// inputs, batched along N; planned symbolic`, or `typed inputs, unbatched (why);
    /// planned static`.
    pub fn describe(&self) -> String {
        match self {
            Served::Batched(_) => "batched (one f32 input)".to_string(),
            Served::Typed(model) => format!(
                "typed inputs, {}; planned {}",
                match model.batch_axis() {
                    Some(axis) => format!("batched along {axis}"),
                    None => "unbatched (no symbol is the first dimension of every input and output with rows kept apart)".to_string(),
                },
                model.planning()
            ),
        }
    }
}

/// Loads a prepared file the way a push serves it (see the module's doc).
pub fn load_prepared(name: &str, prepared: &[u8]) -> Result<Served, RuntimeError> {
    load(name, prepared, true)
}

/// [`load_prepared`] without running the typed model on zeros: what the fuzz target
/// checks (a parser's answer, not a model's run time or memory).
pub fn load_unchecked(name: &str, prepared: &[u8]) -> Result<Served, RuntimeError> {
    load(name, prepared, false)
}

fn load(name: &str, prepared: &[u8], run_zeros: bool) -> Result<Served, RuntimeError> {
    let single = match Model::load_onnx(name, prepared) {
        Ok(model) => return Ok(Served::Batched(model)),
        Err(error) => error,
    };
    let typed = GraphModel::load(name, prepared).and_then(|model| {
        if run_zeros {
            model
                .run(&model.zeros())
                .map_err(|error| RuntimeError::Load {
                    model: name.to_string(),
                    cause: format!("it does not run on zero inputs: {error}"),
                })?;
        }
        Ok(model)
    });
    match typed {
        Ok(model) => Ok(Served::Typed(model)),
        // A file that is not one f32 input and output can only be served typed: that
        // reason is the one that helps.
        Err(typed) if matches!(single, RuntimeError::Unsupported { .. }) => Err(explained(typed)),
        Err(typed) => {
            let (typed, single) = (cause(&explained(typed)), cause(&explained(single)));
            Err(RuntimeError::Load {
                model: name.to_string(),
                cause: if typed == single {
                    typed
                } else {
                    format!("{typed} (as one f32 input: {single})")
                },
            })
        }
    }
}

fn cause(error: &RuntimeError) -> String {
    match error {
        RuntimeError::Load { cause, .. }
        | RuntimeError::Unsupported { cause, .. }
        | RuntimeError::BadInput { cause, .. }
        | RuntimeError::Run { cause, .. } => cause.clone(),
    }
}

/// What to do about a node whose output tract cannot work out from its inputs.
pub const SHAPE_ADVICE: &str = "if an input's size decides it, give the size the model expects with --input (`nephele model inspect FILE --input ...` tries it without pushing); if none does, the file contradicts itself as exported and must be exported again (onnx.shape_inference.infer_shapes(model, strict_mode=True) names the same node)";

/// A load error whose cause is tract's analysis failing at a node (`Failed analyse for
/// node #12 "proj" MatMulInference: Infering facts: Applying rule …: Inconsistent
/// matmul …`), said as the node, its operator, the reason and what to do; any other
/// error unchanged.
fn explained(error: RuntimeError) -> RuntimeError {
    let RuntimeError::Load { model, cause } = &error else {
        return error;
    };
    match node_failure(cause) {
        Some((node, op, reason)) => RuntimeError::Load {
            model: model.clone(),
            cause: format!(
                "node \"{node}\" ({op}) cannot work out its output from its inputs' shapes: {reason}; {SHAPE_ADVICE}"
            ),
        },
        None => error,
    }
}

/// The node, operator and innermost reason of a tract analysis failure.
fn node_failure(cause: &str) -> Option<(String, String, String)> {
    const MARK: &str = "Failed analyse for node #";
    let rest = &cause[cause.find(MARK)? + MARK.len()..];
    let rest = &rest[rest.find(" \"")? + 2..];
    let end = rest.find('"')?;
    let node = &rest[..end];
    let rest = rest[end + 1..].trim_start();
    let op_end = rest
        .find(|c: char| c == ':' || c.is_whitespace())
        .unwrap_or(rest.len());
    let op = rest[..op_end].trim_end_matches("Inference");
    let details = rest[op_end..].trim_start_matches([':', ' ']);
    // The rule tract applied says nothing to a user; what it found does.
    let reason = match details.rfind("}: ") {
        Some(at) => &details[at + 3..],
        None => details.trim_start_matches("Infering facts: "),
    };
    let reason = if reason.is_empty() {
        "shapes that do not agree"
    } else {
        reason
    };
    Some((node.to_string(), op.to_string(), reason.to_string()))
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use tract_onnx::pb::{
        tensor_shape_proto::{dimension, Dimension},
        type_proto, ModelProto, TensorShapeProto, TypeProto, ValueInfoProto,
    };
    use tract_onnx::prelude::*;

    use super::*;
    use crate::input_spec::{inspect, prepare, InputSpec};

    fn shape_info(name: &str, dims: &[&str]) -> ValueInfoProto {
        let dim = dims
            .iter()
            .map(|d| Dimension {
                denotation: String::new(),
                value: Some(match d.parse::<i64>() {
                    Ok(size) => dimension::Value::DimValue(size),
                    Err(_) => dimension::Value::DimParam(d.to_string()),
                }),
            })
            .collect();
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: 1,
                    shape: Some(TensorShapeProto { dim }),
                })),
                ..TypeProto::default()
            }),
            ..ValueInfoProto::default()
        }
    }

    /// The synthetic CNN as an exporter writes it: its batch named `batch` (or
    /// `DynamicDimension.0`…) on the input and output, and a `value_info` entry for
    /// every intermediate tensor, as ONNX shape inference leaves them (Ultralytics' and
    /// paddle2onnx's exports carry hundreds). `stale`: the entries are those of an
    /// export at 32×32, which no size given at push can agree with.
    fn as_exported(batch: &str, stale: bool) -> Vec<u8> {
        let mut model = ModelProto::decode(&crate::synthetic::conv_net(7)[..]).expect("decodes");
        let graph = model.graph.as_mut().expect("graph");
        let side = if stale { "16" } else { "8" };
        graph.input[0] = shape_info("image", &[batch, "3", "16", "16"]);
        graph.output[0] = shape_info("features", &[batch, "8", "8", "8"]);
        graph.value_info = vec![
            shape_info("stem", &[batch, "6", side, side]),
            shape_info("stem_relu", &[batch, "6", side, side]),
            shape_info("dw", &[batch, "6", side, side]),
            shape_info("dw_relu", &[batch, "6", side, side]),
            shape_info("pw", &[batch, "8", side, side]),
        ];
        model.encode_to_vec()
    }

    fn answer(served: &Served) -> Vec<f32> {
        let Served::Batched(model) = served else {
            panic!("the CNN is one f32 input and output")
        };
        let row: Vec<f32> = (0..3 * 16 * 16).map(|i| (i % 17) as f32 / 17.0).collect();
        model.infer(&[1, 3, 16, 16], &row).expect("runs").1
    }

    #[test]
    fn an_exporters_value_info_is_not_read_and_inspect_says_what_push_does() {
        let reference = answer(
            &load_prepared("cnn", &crate::synthetic::conv_net(7)).expect("the plain CNN loads"),
        );
        for batch in ["batch", "DynamicDimension.0", "unk__123"] {
            for stale in [false, true] {
                let file = as_exported(batch, stale);
                // The fixture is the issue's: with its value_info read, a batch of 1
                // cannot be unified with the exporter's shapes.
                if stale {
                    let mut reader = &file[..];
                    let read = tract_onnx::onnx()
                        .model_for_read(&mut reader)
                        .and_then(|m| m.with_input_fact(0, f32::fact([1, 3, 16, 16]).into()))
                        .and_then(|m| m.into_typed());
                    assert!(read.is_err(), "{batch}: stale shapes were accepted");
                }
                for flags in [vec![], vec!["image=1,3,16,16"], vec!["image=N,3,16,16"]] {
                    let specs: Vec<InputSpec> =
                        flags.iter().map(|f| f.parse().expect("parses")).collect();
                    let pushed = prepare("cnn", &file, &specs)
                        .and_then(|prepared| load_prepared("cnn", &prepared));
                    let served = pushed.unwrap_or_else(|e| panic!("{batch} {flags:?}: {e}"));
                    assert_eq!(answer(&served), reference, "{batch} {flags:?}");
                    let report = inspect("cnn", &file, &specs).expect("inspects");
                    assert!(report.loads, "{batch} {flags:?}");
                    assert_eq!(report.serving, Some(served.describe()));
                    assert_eq!(report.load_error, None);
                }
            }
        }
    }

    #[test]
    fn inspect_reports_the_error_a_push_gets() {
        // Two files push refuses, and typed models both ways.
        let typed = crate::synthetic::typed_example();
        let cases: Vec<(Vec<u8>, Vec<&str>)> = vec![
            (typed.clone(), vec![]),
            (typed.clone(), vec!["scale=N..3,4", "offset=scalar:i64=3"]),
            (
                typed,
                vec!["scale=1,4", "ids=1,4:i64=1,2,3,4", "offset=scalar:i64=3"],
            ),
            (crate::synthetic::row_mixing_example(), vec![]),
            (
                crate::synthetic::dense_mlp(8, 4, 1, 2, 3),
                vec!["input=1,8=0.5"],
            ),
        ];
        for (file, flags) in cases {
            let specs: Vec<InputSpec> = flags.iter().map(|f| f.parse().expect("parses")).collect();
            let pushed =
                prepare("m", &file, &specs).and_then(|prepared| load_prepared("m", &prepared));
            let report = inspect("m", &file, &specs).expect("inspects");
            assert_eq!(report.loads, pushed.is_ok(), "{flags:?}");
            match pushed {
                Ok(served) => assert_eq!(report.serving, Some(served.describe()), "{flags:?}"),
                Err(error) => assert_eq!(report.load_error, Some(error.to_string()), "{flags:?}"),
            }
        }
    }

    #[test]
    fn answers_carry_the_files_output_names() {
        use crate::test_graphs::{model, node, scalar};
        // A `Clip` is expanded into a max and a min: before the outputs were named from
        // the file, the answer came back as `Clip_28.max`-like internal names.
        let clip = || node("Clip", &["x", "lo", "hi"], "probs");
        let single = model(
            &[1, 4],
            vec![clip()],
            vec![scalar("lo", 0.0), scalar("hi", 6.0)],
            &["probs"],
        )
        .encode_to_vec();
        match load_prepared("m", &single).expect("loads") {
            Served::Batched(model) => assert_eq!(model.output().name, "probs"),
            Served::Typed(_) => panic!("one f32 input and output is served batched"),
        }
        let two = model(
            &[1, 4],
            vec![clip(), node("Relu", &["probs"], "scores")],
            vec![scalar("lo", 0.0), scalar("hi", 6.0)],
            &["scores", "probs"],
        )
        .encode_to_vec();
        match load_prepared("m", &two).expect("loads") {
            Served::Typed(model) => {
                let names: Vec<&str> = model.outputs().iter().map(|o| o.name.as_str()).collect();
                assert_eq!(names, ["scores", "probs"]);
            }
            Served::Batched(_) => panic!("two outputs are served typed"),
        }
    }

    #[test]
    fn a_node_no_flag_can_fix_is_named_with_what_to_do() {
        use crate::test_graphs::{floats, model, node};
        // A 1×6 row times a 7×5 weight: the file contradicts itself whatever the input.
        let file = model(
            &[1, 6],
            vec![node("MatMul", &["x", "w"], "proj")],
            vec![floats("w", &[7, 5], &[0.5; 35])],
            &["proj"],
        )
        .encode_to_vec();
        for flags in [vec![], vec!["x=N,6"], vec!["x=1,6"]] {
            let specs: Vec<InputSpec> = flags.iter().map(|f| f.parse().expect("parses")).collect();
            let error = prepare("m", &file, &specs)
                .and_then(|prepared| load_prepared("m", &prepared))
                .err()
                .unwrap_or_else(|| panic!("{flags:?}: an inconsistent MatMul loaded"))
                .to_string();
            assert!(
                error.starts_with(
                    "model m: cannot load: node \"proj\" (MatMul) cannot work out its output from its inputs' shapes: Inconsistent matmul"
                ),
                "{flags:?}: {error}"
            );
            assert!(error.ends_with(SHAPE_ADVICE), "{flags:?}: {error}");
            // Said once, not once per path tried.
            assert_eq!(error.matches("Inconsistent matmul").count(), 1, "{error}");
            let report = inspect("m", &file, &specs).expect("inspects");
            assert_eq!(report.load_error, Some(error), "{flags:?}");
        }
        assert_eq!(
            node_failure("Failed analyse for node #3 \"head\" Reshape: Infering facts: Applying rule GivenRule { x }: 7200 is not 100"),
            Some(("head".into(), "Reshape".into(), "7200 is not 100".into()))
        );
        assert_eq!(node_failure("something else"), None);
    }
}
