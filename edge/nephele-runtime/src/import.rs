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
        Err(typed) if matches!(single, RuntimeError::Unsupported { .. }) => Err(typed),
        Err(typed) => Err(RuntimeError::Load {
            model: name.to_string(),
            cause: format!("{typed} (as one f32 input: {single})"),
        }),
    }
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
}
