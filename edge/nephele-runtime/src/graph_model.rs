//! Models as exporters make them: several named inputs and outputs, each with its own
//! type (f32, f16, i64, i32, u8, bool) and shape. Every input dimension is a size or a
//! named symbol (from the file, or given at push with `--input`, e.g.
//! `input_ids=1,S:i64`); an unnamed unknown one is refused. With every size known the
//! plan is static. With symbols, tract plans once with them left symbolic and each run
//! binds them from the request's shapes (the same symbol must have one size across the
//! inputs); a model tract cannot plan that way gets a plan per distinct request shape,
//! built on first use, the [`PLANS_KEPT`] most recently used kept
//! ([`crate::plan_cache`]). A model whose first input dimension is one symbol across
//! every input and output, with rows that do not mix, has a batch axis
//! ([`GraphModel::batch_axis`], checked at load) and runs several requests as one batch
//! ([`GraphModel::run_batch`]); any other runs one request at a time.
//! [`crate::Model`] remains the path for single-f32-input models, which the batcher
//! batches.
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

/// Plans kept for a model planned per request shape.
pub const PLANS_KEPT: usize = 8;

/// An input or output of a [`GraphModel`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TensorDecl {
    pub name: String,
    /// `f32`, `f16`, `i64`, `i32`, `u8` or `bool`.
    pub dtype: String,
    /// Sizes; a symbolic dimension's entry is its example size, 1 (what the load-time
    /// check and synthetic rows use).
    pub shape: Vec<usize>,
    /// The name of each symbolic dimension, `None` for a size; empty when every
    /// dimension is a size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub symbols: Vec<Option<String>>,
}

impl TensorDecl {
    /// The symbol of dimension `axis`, if it is one.
    pub fn symbol(&self, axis: usize) -> Option<&str> {
        self.symbols.get(axis).and_then(|s| s.as_deref())
    }

    /// The dimensions as a person reads them: `[1, S]`.
    pub fn dims_text(&self) -> String {
        let dims: Vec<String> = (0..self.shape.len())
            .map(|axis| match self.symbol(axis) {
                Some(symbol) => symbol.to_string(),
                None => self.shape[axis].to_string(),
            })
            .collect();
        format!("[{}]", dims.join(", "))
    }

    /// Dimensions for a manifest: sizes, `-1` for a symbol.
    pub fn manifest_shape(&self) -> Vec<i64> {
        (0..self.shape.len())
            .map(|axis| match self.symbol(axis) {
                Some(_) => -1,
                None => self.shape[axis] as i64,
            })
            .collect()
    }
}

/// One tensor of a request or an answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedTensor {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

type Plan = Arc<TypedRunnableModel>;

/// How a [`GraphModel`] runs requests of different sizes.
#[derive(Clone)]
enum Plans {
    /// One plan: every size fixed, or symbols tract binds at each run.
    One(Plan),
    /// A plan per distinct request shape, built from `model` on first use.
    PerShape {
        model: Arc<InferenceModel>,
        cache: Arc<std::sync::Mutex<crate::plan_cache::PlanCache<Vec<Vec<usize>>, Plan>>>,
    },
}

/// A loaded multi-input, multi-output model; cheap to clone, safe to share.
#[derive(Clone)]
pub struct GraphModel {
    name: String,
    plans: Plans,
    /// How it was planned, for people: `static`, `symbolic` or `per request shape (why)`.
    planning: String,
    inputs: Vec<TensorDecl>,
    outputs: Vec<TensorDecl>,
    /// Upper bounds of symbolic dimensions, from the file's metadata
    /// ([`crate::input_spec::MAX_DIM_KEY`], given at push as `S..512`).
    max_dims: std::collections::BTreeMap<String, usize>,
    /// The symbol of the batch axis the model really has, if any ([`Self::batch_axis`]).
    batch_axis: Option<String>,
    /// Its convolutions' and pools' windows with their inputs' sizes in the input's
    /// names, and the scope of those names: a request too small for one is refused as
    /// onnxruntime refuses it ([`crate::windows`]).
    windows: Arc<Vec<crate::windows::Window>>,
    symbols: SymbolScope,
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
        Self::load_with(name, bytes, false)
    }

    /// [`Self::load`]; with `per_shape`, symbolic dimensions are planned per request
    /// shape even where tract could plan with them (to test that path).
    fn load_with(name: &str, bytes: &[u8], per_shape: bool) -> Result<GraphModel, RuntimeError> {
        crate::guard_parser(name, || {
            // An int8-weights variant computes in f32: its weights are folded back first
            // (tract would dequantize them on every run, measured slower than fp32).
            let folded = crate::onnx_edit::dequantize_weights(name, bytes)?;
            Self::load_inner(name, folded.as_deref().unwrap_or(bytes), per_shape)
        })
    }

    fn load_inner(name: &str, bytes: &[u8], per_shape: bool) -> Result<GraphModel, RuntimeError> {
        let load = |cause: String| RuntimeError::Load {
            model: name.to_string(),
            cause,
        };
        let unsupported = |cause: String| RuntimeError::Unsupported {
            model: name.to_string(),
            cause,
        };
        let mut model = crate::fuse_activations::read_for_running(name, bytes)?;
        // Outputs are answered under the file's own names: tract labels output i with
        // the graph's output i right after parsing and keeps their order, while typing
        // and optimising may move a label or drop it (an output written by an expanded
        // or decluttered node), leaving only an internal node's name.
        let declared_outputs: Vec<Option<String>> = model
            .outputs
            .iter()
            .map(|outlet| model.outlet_label(*outlet).map(str::to_string))
            .collect();
        let max_dims = max_dims(&model);
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
            // Each dimension a size or a named symbol; an unnamed unknown (`?`) or an
            // expression cannot be bound from a request.
            let not_sizes = || {
                unsupported(format!(
                    "input {input_name} has dimensions that are neither sizes nor names ({:?}); give them at push: --input {input_name}=<sizes or names>:{dtype}",
                    fact.shape
                ))
            };
            if fact.shape.is_open() {
                return Err(not_sizes());
            }
            let mut dims: Vec<TDim> = Vec::new();
            let mut shape = Vec::new();
            let mut symbols = Vec::new();
            for dim in fact.shape.dims() {
                let dim = dim.concretize().ok_or_else(not_sizes)?;
                match &dim {
                    TDim::Val(v) if *v >= 0 => {
                        shape.push(*v as usize);
                        symbols.push(None);
                    }
                    TDim::Sym(symbol) => {
                        shape.push(1);
                        symbols.push(Some(symbol.to_string()));
                    }
                    _ => return Err(not_sizes()),
                }
                dims.push(dim);
            }
            model = model
                .with_input_fact(index, InferenceFact::dt_shape(dt, dims))
                .map_err(|e| load(format!("{e:#}")))?;
            if symbols.iter().all(Option::is_none) {
                symbols.clear();
            }
            inputs.push(TensorDecl {
                name: input_name,
                dtype: dtype.to_string(),
                shape,
                symbols,
            });
        }
        let symbolic = inputs.iter().any(|d| !d.symbols.is_empty());
        // With symbols: one plan tract binds at each run, checked at the example sizes;
        // else (tract cannot type or run it with symbols) a plan per request shape.
        let asked_per_shape = if per_shape && symbolic {
            Err(TractError::msg("planning per request shape was asked for"))
        } else {
            Ok(())
        };
        let one_plan = asked_per_shape
            .and_then(|()| crate::kernels::optimized_with_windows(model.clone()))
            .and_then(|(typed, windows)| {
                let plan = typed.clone().into_runnable()?;
                if symbolic {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        plan.run(zero_values(&inputs)?)
                    }))
                    .unwrap_or_else(|_| Err(TractError::msg("tract panicked running it")))?;
                }
                Ok((typed, plan, windows))
            });
        let symbols = model.symbols.clone();
        let (typed, plans, planning, windows) = match one_plan {
            Ok((typed, plan, windows)) => (
                typed,
                Plans::One(plan),
                if symbolic { "symbolic" } else { "static" }.to_string(),
                windows,
            ),
            Err(error) if symbolic => {
                // The windows with the names left symbolic, where tract can type that.
                let windows = model
                    .clone()
                    .into_typed()
                    .map(|typed| crate::windows::windows(&typed))
                    .unwrap_or_default();
                let why = format!("{error:#}");
                let why = why.lines().next().unwrap_or("").to_string();
                let model = Arc::new(model);
                let example: Vec<Vec<usize>> = inputs.iter().map(|d| d.shape.clone()).collect();
                let (typed, plan) =
                    plan_for(&model, &inputs, &example).map_err(|e| load(format!("{e:#}")))?;
                let mut cache = crate::plan_cache::PlanCache::new(PLANS_KEPT);
                cache.insert(example, plan);
                (
                    typed,
                    Plans::PerShape {
                        model,
                        cache: Arc::new(std::sync::Mutex::new(cache)),
                    },
                    format!("per request shape (tract could not plan with the names left symbolic: {why})"),
                    windows,
                )
            }
            Err(error) => return Err(load(format!("{error:#}"))),
        };
        let mut outputs = Vec::with_capacity(typed.outputs.len());
        for (index, outlet) in typed.outputs.iter().enumerate() {
            let fact = typed
                .output_fact(index)
                .map_err(|e| load(format!("{e:#}")))?;
            let output_name = declared_outputs
                .get(index)
                .cloned()
                .flatten()
                .or_else(|| typed.outlet_label(*outlet).map(str::to_string))
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
                symbols: Vec::new(),
            });
        }
        // Each name's example size (the zeros run at load and its timing): 1, or what
        // the windows take.
        if !windows.is_empty() {
            let names: Vec<String> = inputs
                .iter()
                .flat_map(|d| d.symbols.iter().flatten().cloned())
                .collect();
            let sizes = crate::windows::example_sizes(&windows, &symbols, &names, &max_dims);
            for decl in &mut inputs {
                for (axis, symbol) in decl.symbols.iter().enumerate() {
                    if let Some(size) = symbol.as_ref().and_then(|s| sizes.get(s)) {
                        decl.shape[axis] = *size;
                    }
                }
            }
        }
        let mut model = GraphModel {
            name: name.to_string(),
            plans,
            planning,
            inputs,
            outputs,
            max_dims,
            batch_axis: None,
            windows: Arc::new(windows),
            symbols,
        };
        model.batch_axis = model.find_batch_axis();
        Ok(model)
    }

    /// The batch axis this model really has, found at load: the symbol that is the
    /// first dimension of every input and of no other dimension, with every output's
    /// first dimension following it, and rows that do not mix (two different rows run
    /// together answer as each runs alone). Only for a model planned once with its
    /// symbols (a per-shape model would plan again for every batch size).
    fn find_batch_axis(&self) -> Option<String> {
        if !matches!(self.plans, Plans::One(_)) {
            return None;
        }
        let symbol = self.inputs.first()?.symbol(0)?.to_string();
        let only_first = self.inputs.iter().all(|d| {
            d.symbol(0) == Some(symbol.as_str())
                && (1..d.shape.len()).all(|axis| d.symbol(axis) != Some(symbol.as_str()))
        });
        if !only_first {
            return None;
        }
        // Two different rows (values an index input can take: 0 and 1).
        let row = |which: usize| -> HashMap<String, NamedTensor> {
            self.inputs
                .iter()
                .map(|d| {
                    let count: usize = d.shape.iter().product();
                    let data = (0..count)
                        .map(|k| match (d.dtype.as_str(), which) {
                            ("f32" | "f16", 0) => 0.25 + 0.125 * (k % 7) as f64,
                            ("f32" | "f16", _) => -0.5 + 0.25 * (k % 5) as f64,
                            (_, w) => ((k + w) % 2) as f64,
                        })
                        .collect();
                    (
                        d.name.clone(),
                        NamedTensor {
                            dtype: d.dtype.clone(),
                            shape: d.shape.clone(),
                            data,
                        },
                    )
                })
                .collect()
        };
        let (a, b) = (row(0), row(1));
        let alone_a = self.run(&a).ok()?;
        let alone_b = self.run(&b).ok()?;
        let mut with_axis = self.clone();
        with_axis.batch_axis = Some(symbol.clone());
        let together = with_axis.run_batch(&[&a, &b]).ok()?;
        let close = |x: &NamedTensor, y: &NamedTensor| {
            x.shape == y.shape
                && x.data
                    .iter()
                    .zip(&y.data)
                    .all(|(p, q)| (p - q).abs() <= 1e-4 * p.abs().max(q.abs()).max(1.0))
        };
        let rows_kept = self.outputs.iter().all(|o| {
            let (Some(ta), Some(tb)) = (together[0].get(&o.name), together[1].get(&o.name)) else {
                return false;
            };
            alone_a
                .get(&o.name)
                .is_some_and(|x| x.shape.first() == Some(&1) && close(x, ta))
                && alone_b.get(&o.name).is_some_and(|x| close(x, tb))
        });
        rows_kept.then_some(symbol)
    }

    /// The symbol of the batch axis the model really has (the first dimension of every
    /// input and output, rows independent), found at load; `None`: requests run one at
    /// a time.
    pub fn batch_axis(&self) -> Option<&str> {
        self.batch_axis.as_deref()
    }

    /// The rows a request has along the batch axis (1 without one).
    pub fn rows(&self, request: &HashMap<String, NamedTensor>) -> usize {
        match (&self.batch_axis, self.inputs.first()) {
            (Some(_), Some(first)) => request
                .get(&first.name)
                .and_then(|t| t.shape.first().copied())
                .unwrap_or(1),
            _ => 1,
        }
    }

    /// What requests must share to run in one batch: every input's shape past the
    /// batch axis (`None` without a batch axis).
    pub fn batch_key(&self, request: &HashMap<String, NamedTensor>) -> Option<Vec<Vec<usize>>> {
        self.batch_axis.as_ref()?;
        self.inputs
            .iter()
            .map(|d| {
                request
                    .get(&d.name)
                    .map(|t| t.shape.iter().skip(1).copied().collect())
            })
            .collect()
    }

    /// The most rows one batch may hold: the batch symbol's bound, if given at push.
    pub fn max_batch_rows(&self) -> Option<usize> {
        self.max_dims.get(self.batch_axis.as_deref()?).copied()
    }

    /// Runs checked requests with the same [`Self::batch_key`] as one batch along the
    /// batch axis and gives each its own rows of every output, in order.
    pub fn run_batch(
        &self,
        requests: &[&HashMap<String, NamedTensor>],
    ) -> Result<Vec<HashMap<String, NamedTensor>>, RuntimeError> {
        if requests.len() == 1 {
            return Ok(vec![self.run(requests[0])?]);
        }
        let failed = |cause: String| RuntimeError::Run {
            model: self.name.clone(),
            cause,
        };
        if self.batch_axis.is_none() {
            return Err(failed("the model has no batch axis".into()));
        }
        let key = self.batch_key(requests[0]);
        if requests.iter().any(|r| self.batch_key(r) != key) {
            return Err(failed(
                "requests of different shapes cannot share a batch".into(),
            ));
        }
        let sizes: Vec<usize> = requests.iter().map(|r| self.rows(r)).collect();
        let total: usize = sizes.iter().sum();
        let mut merged = HashMap::with_capacity(self.inputs.len());
        for decl in &self.inputs {
            let first = &requests[0][&decl.name];
            let mut shape = first.shape.clone();
            shape[0] = total;
            let mut data = Vec::with_capacity(first.data.len() / sizes[0].max(1) * total);
            for request in requests {
                data.extend_from_slice(&request[&decl.name].data);
            }
            merged.insert(
                decl.name.clone(),
                NamedTensor {
                    dtype: decl.dtype.clone(),
                    shape,
                    data,
                },
            );
        }
        let outputs = self.run(&merged)?;
        let mut answers: Vec<HashMap<String, NamedTensor>> =
            vec![HashMap::with_capacity(outputs.len()); requests.len()];
        for (name, tensor) in outputs {
            if tensor.shape.first() != Some(&total) {
                return Err(failed(format!(
                    "output {name} has shape {:?}, not {total} rows",
                    tensor.shape
                )));
            }
            let row_len: usize = tensor.shape[1..].iter().product();
            let mut at = 0;
            for (answer, rows) in answers.iter_mut().zip(&sizes) {
                let mut shape = tensor.shape.clone();
                shape[0] = *rows;
                answer.insert(
                    name.clone(),
                    NamedTensor {
                        dtype: tensor.dtype.clone(),
                        shape,
                        data: tensor.data[at..at + rows * row_len].to_vec(),
                    },
                );
                at += rows * row_len;
            }
        }
        Ok(answers)
    }

    /// Upper bounds of symbolic dimensions (`S` → 512); a name not here is unbounded.
    pub fn max_dims(&self) -> &std::collections::BTreeMap<String, usize> {
        &self.max_dims
    }

    /// How requests are planned: `static`, `symbolic` or `per request shape (why)`.
    pub fn planning(&self) -> &str {
        &self.planning
    }

    /// The plan for a request of these input shapes (in input order).
    fn plan(&self, shapes: &[Vec<usize>]) -> Result<Plan, RuntimeError> {
        match &self.plans {
            Plans::One(plan) => Ok(plan.clone()),
            Plans::PerShape { model, cache } => {
                let key = shapes.to_vec();
                if let Some(plan) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
                    return Ok(plan);
                }
                // Built outside the lock: a new shape does not hold up known ones.
                let planned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    plan_for(model, &self.inputs, shapes)
                }))
                .unwrap_or_else(|_| Err(TractError::msg("tract panicked while planning")));
                let (_, plan) = planned.map_err(|e| RuntimeError::Run {
                    model: self.name.clone(),
                    cause: format!("planning for input shapes {shapes:?}: {e:#}"),
                })?;
                cache
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, plan.clone());
                Ok(plan)
            }
        }
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

    /// Zeros for the input `name` (a session's first state; symbolic dimensions at
    /// their example size).
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
        let mut bound: HashMap<&str, (&str, &usize)> = HashMap::new();
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
                    "input {} ({} {}) is missing",
                    decl.name,
                    decl.dtype,
                    decl.dims_text()
                )
            })?;
            let fits =
                given.shape.len() == decl.shape.len()
                    && given.shape.iter().enumerate().all(|(axis, size)| {
                        decl.symbol(axis).is_some() || *size == decl.shape[axis]
                    });
            if given.dtype != decl.dtype || !fits {
                return Err(format!(
                    "input {} is {} {} in the model, not {} {:?}",
                    decl.name,
                    decl.dtype,
                    decl.dims_text(),
                    given.dtype,
                    given.shape
                ));
            }
            // One size per symbol across the inputs.
            for (axis, size) in given.shape.iter().enumerate() {
                if let Some(symbol) = decl.symbol(axis) {
                    match bound.get(symbol) {
                        Some((other, was)) if *was != size => {
                            return Err(format!(
                                "input {} has {symbol} = {size}, but input {other} has {symbol} = {was}; a dimension's name stands for one size",
                                decl.name
                            ))
                        }
                        Some(_) => {}
                        None => {
                            bound.insert(symbol, (decl.name.as_str(), size));
                        }
                    }
                    if *size == 0 {
                        return Err(format!("input {}: {symbol} is 0", decl.name));
                    }
                    if let Some(bound) = self.max_dims.get(symbol).filter(|b| size > b) {
                        return Err(format!(
                            "input {} has {symbol} = {size}, above the {bound} this model takes (bounded at push with {symbol}..{bound}); send a smaller request, or push the model with a larger bound",
                            decl.name
                        ));
                    }
                }
            }
            let count = given
                .shape
                .iter()
                .try_fold(1usize, |acc, d| acc.checked_mul(*d))
                .ok_or_else(|| format!("input {} shape {:?} overflows", decl.name, given.shape))?;
            if given.data.len() != count {
                return Err(format!(
                    "input {} has {} values; its shape {:?} holds {count}",
                    decl.name,
                    given.data.len(),
                    given.shape
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
        if !self.windows.is_empty() {
            let mut values = SymbolValues::default();
            for (symbol, (_, size)) in &bound {
                values.set(&self.symbols.sym(symbol), **size as i64);
            }
            crate::windows::check(&self.windows, &values)?;
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
        let shapes: Vec<Vec<usize>> = self
            .inputs
            .iter()
            .map(|decl| request[&decl.name].shape.clone())
            .collect();
        let plan = self.plan(&shapes)?;
        let mut values = TVec::new();
        for decl in &self.inputs {
            let given = &request[&decl.name];
            let shape = &given.shape;
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
        // tract trusts index values (a Gather past its table panics): such an input is
        // this request's error, not the process's end.
        let results = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| plan.run(values)))
            .map_err(|_| {
                bad("the model failed on these values (an index input out of its range, such as a token id past the vocabulary?)".into())
            })?
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

/// Bounds written into the file's metadata (`nephele.max_dim.S` = `512`).
fn max_dims(model: &InferenceModel) -> std::collections::BTreeMap<String, usize> {
    let prefix = format!("onnx.metadata_props.{}", crate::input_spec::MAX_DIM_KEY);
    model
        .properties
        .iter()
        .filter_map(|(key, value)| {
            let symbol = key.strip_prefix(&prefix)?;
            let view = value.to_plain_array_view::<String>().ok()?;
            let text = view.iter().next()?;
            Some((symbol.to_string(), text.trim().parse().ok()?))
        })
        .collect()
}

/// Zeros for every input at its example sizes, in input order.
fn zero_values(inputs: &[TensorDecl]) -> TractResult<TVec<TValue>> {
    inputs
        .iter()
        .map(|d| {
            let dt = match d.dtype.as_str() {
                "f32" => DatumType::F32,
                "f16" => DatumType::F16,
                "i64" => DatumType::I64,
                "i32" => DatumType::I32,
                "u8" => DatumType::U8,
                _ => DatumType::Bool,
            };
            Ok(Tensor::zero_dt(dt, &d.shape)?.into())
        })
        .collect()
}

/// A plan with every input's shape fixed to `shapes` (in input order).
fn plan_for(
    model: &InferenceModel,
    inputs: &[TensorDecl],
    shapes: &[Vec<usize>],
) -> TractResult<(TypedModel, Plan)> {
    let mut model = model.clone();
    for (index, (decl, shape)) in inputs.iter().zip(shapes).enumerate() {
        let dt = zero_values(std::slice::from_ref(decl))?[0].datum_type();
        model = model.with_input_fact(index, InferenceFact::dt_shape(dt, shape.clone()))?;
    }
    let typed = crate::kernels::optimized(model)?;
    let plan = typed.clone().into_runnable()?;
    Ok((typed, plan))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(dtype: &str, shape: Vec<usize>, data: Vec<f64>) -> NamedTensor {
        NamedTensor {
            dtype: dtype.into(),
            shape,
            data,
        }
    }

    #[test]
    fn a_batch_axis_is_found_only_where_the_model_has_one_and_batches_answer_as_alone() {
        use crate::input_spec::{apply, InputSpec};
        let bytes = crate::synthetic::typed_example();
        // As exported, `ids` is [1, 4]: N is not every input's first dimension.
        let exported = GraphModel::load("typed", &bytes).expect("loads");
        assert_eq!(exported.batch_axis(), None);
        let specs: Vec<InputSpec> = ["ids=N,4", "scale=N..3,4", "offset=scalar:i64=3"]
            .iter()
            .map(|t| t.parse().expect("spec"))
            .collect();
        let model = GraphModel::load("typed", &apply("typed", &bytes, &specs).expect("applies"))
            .expect("loads");
        assert_eq!(model.batch_axis(), Some("N"));
        assert_eq!(model.max_batch_rows(), Some(3));
        let request = |rows: usize, seed: f64| {
            HashMap::from([
                (
                    "ids".to_string(),
                    tensor(
                        "i64",
                        vec![rows, 4],
                        (0..4 * rows).map(|v| (v % 5) as f64 - seed).collect(),
                    ),
                ),
                (
                    "scale".to_string(),
                    tensor(
                        "f32",
                        vec![rows, 4],
                        (0..4 * rows).map(|v| v as f64 * 0.5 + seed).collect(),
                    ),
                ),
            ])
        };
        let (a, b) = (request(1, 1.0), request(2, -2.0));
        assert_eq!(model.batch_key(&a), model.batch_key(&b));
        assert_eq!((model.rows(&a), model.rows(&b)), (1, 2));
        let together = model.run_batch(&[&a, &b]).expect("one batch");
        assert_eq!(together[0], model.run(&a).expect("a alone"));
        assert_eq!(together[1], model.run(&b).expect("b alone"));
        assert_eq!(together[1]["scaled"].shape, vec![2, 4]);
        assert!(exported.run_batch(&[&a, &b]).is_err());
        // A symbol first everywhere is not enough: rows that mix (a mean over the
        // batch) would answer differently together, so that model runs unbatched.
        let mixing =
            GraphModel::load("mixing", &crate::synthetic::row_mixing_example()).expect("loads");
        assert_eq!(mixing.planning(), "symbolic");
        assert_eq!(mixing.batch_axis(), None);
    }

    #[test]
    fn planned_per_shape_it_keeps_a_bounded_set_of_plans_and_answers_as_symbolic() {
        let bytes = crate::synthetic::typed_example();
        let symbolic = GraphModel::load("typed", &bytes).expect("loads");
        let per_shape = GraphModel::load_with("typed", &bytes, true).expect("loads");
        assert_eq!(symbolic.planning(), "symbolic");
        assert!(per_shape.planning().starts_with("per request shape"));
        for n in 1..=PLANS_KEPT + 4 {
            let request = HashMap::from([
                (
                    "ids".to_string(),
                    tensor("i64", vec![1, 4], vec![1.0, 2.0, 3.0, -4.0]),
                ),
                (
                    "scale".to_string(),
                    tensor("f32", vec![n, 4], (0..4 * n).map(|v| v as f64).collect()),
                ),
                ("offset".to_string(), tensor("i64", vec![], vec![n as f64])),
            ]);
            let want = symbolic.run(&request).expect("symbolic runs");
            let got = per_shape.run(&request).expect("per-shape runs");
            assert_eq!(got, want, "N = {n}");
            assert_eq!(got["scaled"].shape, vec![n, 4]);
        }
        let Plans::PerShape { cache, .. } = &per_shape.plans else {
            panic!("planned per shape");
        };
        let cache = cache.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(cache.len(), PLANS_KEPT);
        // The example shape (N = 1) was planned at load and reused; 12 shapes, 8 kept.
        assert_eq!(cache.evicted, 4);
    }
}
