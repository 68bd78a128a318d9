//! Models as exporters make them: several named inputs and outputs, each with its own
//! type (f32, f16, i64, i32, u8, bool) and shape. Every input's shape must be fully
//! known (from the file, or given at push with `--input`); the plan is then static and
//! runs one request at a time (no batch axis is assumed). [`crate::Model`] remains the
//! path for single-f32-input models, which the batcher batches and the agent offloads.
//!
//! Tensors travel as [`NamedTensor`]: a type name, a shape and the values as JSON
//! numbers (bool as 0 or 1; an i64 beyond 2^53 loses precision in JSON).

use std::collections::HashMap;
use std::sync::Arc;

use tract_onnx::prelude::*;
use tract_onnx::tract_hir::infer::Factoid;

use crate::RuntimeError;

/// The manifest `format` of an ONNX model run through [`GraphModel`].
pub const FORMAT_ONNX_GRAPH: &str = "onnx-graph";

/// An input or output of a [`GraphModel`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TensorDecl {
    pub name: String,
    /// `f32`, `f16`, `i64`, `i32`, `u8` or `bool`.
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// One tensor of a request or an answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedTensor {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

/// A loaded multi-input, multi-output model; cheap to clone, safe to share.
#[derive(Clone)]
pub struct GraphModel {
    name: String,
    plan: Arc<TypedRunnableModel>,
    inputs: Vec<TensorDecl>,
    outputs: Vec<TensorDecl>,
}

impl std::fmt::Debug for GraphModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphModel")
            .field("name", &self.name)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .finish()
    }
}

fn type_name(dt: DatumType) -> Option<&'static str> {
    Some(match dt {
        DatumType::F32 => "f32",
        DatumType::F16 => "f16",
        DatumType::I64 => "i64",
        DatumType::I32 => "i32",
        DatumType::U8 => "u8",
        DatumType::Bool => "bool",
        _ => return None,
    })
}

impl GraphModel {
    /// Loads an ONNX file whose inputs all have a known type and shape.
    pub fn load(name: &str, bytes: &[u8]) -> Result<GraphModel, RuntimeError> {
        crate::guard_parser(name, || {
            // An int8-weights variant computes in f32: its weights are folded back first
            // (tract would dequantize them on every run, measured slower than fp32).
            let folded = crate::onnx_edit::dequantize_weights(name, bytes)?;
            Self::load_inner(name, folded.as_deref().unwrap_or(bytes))
        })
    }

    fn load_inner(name: &str, bytes: &[u8]) -> Result<GraphModel, RuntimeError> {
        let load = |cause: String| RuntimeError::Load {
            model: name.to_string(),
            cause,
        };
        let unsupported = |cause: String| RuntimeError::Unsupported {
            model: name.to_string(),
            cause,
        };
        let mut reader = bytes;
        let mut model = tract_onnx::onnx()
            .model_for_read(&mut reader)
            .map_err(|e| load(format!("{e:#}")))?;
        if model.inputs.is_empty() {
            return Err(unsupported(
                "the model has no inputs left (every one was folded in as a constant)".into(),
            ));
        }
        let mut inputs = Vec::with_capacity(model.inputs.len());
        for index in 0..model.inputs.len() {
            let input_name = model.node(model.inputs[index].node).name.clone();
            let fact = model
                .input_fact(index)
                .map_err(|e| load(format!("{e:#}")))?
                .clone();
            let dt = fact.datum_type.concretize().ok_or_else(|| {
                unsupported(format!(
                    "input {input_name} has no declared type; give it at push: --input {input_name}=DIMS:f32"
                ))
            })?;
            let dtype = type_name(dt).ok_or_else(|| {
                unsupported(format!(
                    "input {input_name} is {dt:?}; inputs may be f32, f16, i64, i32, u8 or bool"
                ))
            })?;
            let shape = fact
                .shape
                .as_concrete_finite()
                .ok()
                .flatten()
                .ok_or_else(|| {
                    unsupported(format!(
                        "input {input_name} has dimensions that are not sizes ({:?}); give them at push: --input {input_name}=<sizes>:{dtype}",
                        fact.shape
                    ))
                })?;
            model = model
                .with_input_fact(index, InferenceFact::dt_shape(dt, shape.clone()))
                .map_err(|e| load(format!("{e:#}")))?;
            inputs.push(TensorDecl {
                name: input_name,
                dtype: dtype.to_string(),
                shape: shape.to_vec(),
            });
        }
        let typed = model.into_optimized().map_err(|e| load(format!("{e:#}")))?;
        let mut outputs = Vec::with_capacity(typed.outputs.len());
        for (index, outlet) in typed.outputs.iter().enumerate() {
            let fact = typed
                .output_fact(index)
                .map_err(|e| load(format!("{e:#}")))?;
            let output_name = typed
                .outlet_label(*outlet)
                .map(str::to_string)
                .unwrap_or_else(|| typed.node(outlet.node).name.clone());
            let dtype = type_name(fact.datum_type).ok_or_else(|| {
                unsupported(format!(
                    "output {output_name} is {:?}; outputs may be f32, f16, i64, i32, u8 or bool",
                    fact.datum_type
                ))
            })?;
            let shape: Vec<usize> = fact
                .shape
                .as_concrete()
                .map(|s| s.to_vec())
                .unwrap_or_default();
            outputs.push(TensorDecl {
                name: output_name,
                dtype: dtype.to_string(),
                shape,
            });
        }
        let plan = typed.into_runnable().map_err(|e| load(format!("{e:#}")))?;
        Ok(GraphModel {
            name: name.to_string(),
            plan,
            inputs,
            outputs,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn inputs(&self) -> &[TensorDecl] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[TensorDecl] {
        &self.outputs
    }

    /// Checks a request without running it: every input given once, with the declared
    /// type and shape and as many values as the shape holds; no unknown names.
    /// Checks recurrent-state bindings (`--state INPUT=OUTPUT`): each names an input
    /// and an output of this model with the same type and shape, and no input or output
    /// is bound twice.
    pub fn check_state<'a>(
        &self,
        bindings: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<(), String> {
        let mut seen: Vec<&str> = Vec::new();
        for (input, output) in bindings {
            let names = |decls: &[TensorDecl]| {
                decls
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let flag = format!("--state {input}={output}");
            let i = self
                .inputs
                .iter()
                .find(|d| d.name == input)
                .ok_or_else(|| {
                    format!(
                        "{flag}: the model has no input {input:?}; its inputs are {}",
                        names(&self.inputs)
                    )
                })?;
            let o = self
                .outputs
                .iter()
                .find(|d| d.name == output)
                .ok_or_else(|| {
                    format!(
                        "{flag}: the model has no output {output:?}; its outputs are {}",
                        names(&self.outputs)
                    )
                })?;
            if i.dtype != o.dtype || i.shape != o.shape {
                return Err(format!(
                    "{flag}: input {input} is {} {:?} but output {output} is {} {:?}; a state must come back as it goes in",
                    i.dtype, i.shape, o.dtype, o.shape
                ));
            }
            if seen.contains(&input) || seen.contains(&output) {
                return Err(format!("{flag}: {input} or {output} is bound twice"));
            }
            seen.push(input);
            seen.push(output);
        }
        Ok(())
    }

    /// Zeros for the input `name` (a session's first state).
    pub fn zeros_for(&self, name: &str) -> Option<NamedTensor> {
        self.inputs
            .iter()
            .find(|d| d.name == name)
            .map(|d| NamedTensor {
                dtype: d.dtype.clone(),
                shape: d.shape.clone(),
                data: vec![0.0; d.shape.iter().product()],
            })
    }

    pub fn check(&self, request: &HashMap<String, NamedTensor>) -> Result<(), String> {
        for name in request.keys() {
            if !self.inputs.iter().any(|i| &i.name == name) {
                let names: Vec<&str> = self.inputs.iter().map(|i| i.name.as_str()).collect();
                return Err(format!(
                    "the model has no input {name:?}; its inputs are {}",
                    names.join(", ")
                ));
            }
        }
        for decl in &self.inputs {
            let given = request.get(&decl.name).ok_or_else(|| {
                format!(
                    "input {} ({} {:?}) is missing",
                    decl.name, decl.dtype, decl.shape
                )
            })?;
            if given.dtype != decl.dtype || given.shape != decl.shape {
                return Err(format!(
                    "input {} is {} {:?} in the model, not {} {:?}",
                    decl.name, decl.dtype, decl.shape, given.dtype, given.shape
                ));
            }
            let count: usize = decl.shape.iter().product();
            if given.data.len() != count {
                return Err(format!(
                    "input {} has {} values; its shape {:?} holds {count}",
                    decl.name,
                    given.data.len(),
                    decl.shape
                ));
            }
            if let Some(bad) = given
                .data
                .iter()
                .find(|v| !v.is_finite() && decl.dtype != "f32" && decl.dtype != "f16")
            {
                return Err(format!(
                    "input {}: {bad} is not a {}",
                    decl.name, decl.dtype
                ));
            }
        }
        Ok(())
    }

    /// Runs one request: inputs by name, outputs by name.
    pub fn run(
        &self,
        request: &HashMap<String, NamedTensor>,
    ) -> Result<HashMap<String, NamedTensor>, RuntimeError> {
        let bad = |cause: String| RuntimeError::BadInput {
            model: self.name.clone(),
            cause,
        };
        let failed = |cause: String| RuntimeError::Run {
            model: self.name.clone(),
            cause,
        };
        self.check(request).map_err(bad)?;
        let mut values = TVec::new();
        for decl in &self.inputs {
            let given = &request[&decl.name];
            let shape = &decl.shape;
            let data = &given.data;
            let tensor = match decl.dtype.as_str() {
                "f32" => {
                    Tensor::from_shape(shape, &data.iter().map(|v| *v as f32).collect::<Vec<_>>())
                }
                "f16" => Tensor::from_shape(
                    shape,
                    &data.iter().map(|v| f16::from_f64(*v)).collect::<Vec<_>>(),
                ),
                "i64" => {
                    Tensor::from_shape(shape, &data.iter().map(|v| *v as i64).collect::<Vec<_>>())
                }
                "i32" => {
                    Tensor::from_shape(shape, &data.iter().map(|v| *v as i32).collect::<Vec<_>>())
                }
                "u8" => {
                    Tensor::from_shape(shape, &data.iter().map(|v| *v as u8).collect::<Vec<_>>())
                }
                "bool" => {
                    Tensor::from_shape(shape, &data.iter().map(|v| *v != 0.0).collect::<Vec<_>>())
                }
                other => return Err(bad(format!("input {} has type {other}", decl.name))),
            }
            .map_err(|e| bad(format!("{e:#}")))?;
            values.push(tensor.into());
        }
        let results = self
            .plan
            .run(values)
            .map_err(|e| failed(format!("{e:#}")))?;
        let mut out = HashMap::with_capacity(results.len());
        for (decl, value) in self.outputs.iter().zip(results.iter()) {
            let tensor: &Tensor = value;
            let data: Vec<f64> = match tensor.datum_type() {
                DatumType::F32 => tensor
                    .to_plain_array_view::<f32>()
                    .map(|s| s.iter().map(|v| *v as f64).collect()),
                DatumType::F16 => tensor
                    .to_plain_array_view::<f16>()
                    .map(|s| s.iter().map(|v| v.to_f64()).collect()),
                DatumType::I64 => tensor
                    .to_plain_array_view::<i64>()
                    .map(|s| s.iter().map(|v| *v as f64).collect()),
                DatumType::I32 => tensor
                    .to_plain_array_view::<i32>()
                    .map(|s| s.iter().map(|v| *v as f64).collect()),
                DatumType::U8 => tensor
                    .to_plain_array_view::<u8>()
                    .map(|s| s.iter().map(|v| *v as f64).collect()),
                DatumType::Bool => tensor
                    .to_plain_array_view::<bool>()
                    .map(|s| s.iter().map(|v| if *v { 1.0 } else { 0.0 }).collect()),
                other => {
                    return Err(failed(format!(
                        "output {} came back as {other:?}",
                        decl.name
                    )))
                }
            }
            .map_err(|e| failed(format!("{e:#}")))?;
            out.insert(
                decl.name.clone(),
                NamedTensor {
                    dtype: type_name(tensor.datum_type()).unwrap_or("f32").to_string(),
                    shape: tensor.shape().to_vec(),
                    data,
                },
            );
        }
        Ok(out)
    }

    /// A request of zeros for every input (for a load-time check and timing).
    pub fn zeros(&self) -> HashMap<String, NamedTensor> {
        self.inputs
            .iter()
            .map(|d| {
                (
                    d.name.clone(),
                    NamedTensor {
                        dtype: d.dtype.clone(),
                        shape: d.shape.clone(),
                        data: vec![0.0; d.shape.iter().product()],
                    },
                )
            })
            .collect()
    }
}
