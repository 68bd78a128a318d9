//! The inference runtime the edge and pool roles share.
//!
//! Two backends behind one [`Model`]: tract for ONNX models with f32 inputs and
//! outputs, and candle for BERT sentence encoders shipped as GGUF
//! ([`Model::load_bert_gguf`]; input token ids as f32 `[N, seq]`, output the pooled
//! embedding `[N, hidden]`). An ONNX model is prepared once (typed, optimised, its batch dimension fixed to 1 so the plan is
//! static) and then run from any number of threads. Loading never takes the caller
//! down: corrupt, truncated or unsupported models give a [`RuntimeError`] naming the
//! model and the cause, including when the parser itself panics.
//!
//! [`variants`] derives what the control plane ships for a pushed model (int8 weights,
//! head/tail splits), measured against the full model; [`onnx_edit`] rewrites the ONNX
//! files for it.
//!
//! Batching lives with the agent (`nephele-edge`'s batcher) and builds on
//! [`Model::infer`], whatever the backend.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use tract_onnx::prelude::*;

pub mod acceptance;
pub mod bench;
#[cfg(feature = "candle")]
pub mod candle_bert;
#[cfg(not(feature = "candle"))]
#[path = "candle_off.rs"]
pub mod candle_bert;
pub mod cut_choice;
pub mod dense;
pub mod depthwise;
pub mod direct;
pub mod fold_affine;
pub mod fold_if;
pub mod fuse_activations;
mod graph_index;
pub mod graph_model;
pub mod graph_variants;
pub mod import;
pub mod input_spec;
pub mod int8_compute;
pub mod kernels;
pub mod mixed_precision;
pub mod onnx_edit;
pub mod op_families;
pub mod op_profile;
#[cfg(feature = "onnxruntime")]
pub mod ort_backend;
pub mod plan_cache;
mod planned;
pub mod planned_if;
pub mod pointwise;
pub mod synthetic;
#[cfg(test)]
mod test_graphs;
pub mod variants;
pub mod windows;

/// tract's ONNX reader as the runtime uses it: a file's `value_info` (an exporter's
/// cache of ONNX shape inference, often with other symbols than its inputs', or shapes
/// from before `--input`) is not read, and tract infers every shape from the inputs'.
/// Exporters write hundreds of such entries (Ultralytics' and paddle2onnx's with
/// `batch`, `DynamicDimension.0`…), which then cannot be unified with the sizes a push
/// gives.
pub(crate) fn onnx_reader() -> tract_onnx::Onnx {
    tract_onnx::onnx().with_ignore_value_info(true)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    #[error("model {model}: cannot load: {cause}")]
    Load { model: String, cause: String },
    #[error("model {model}: unsupported: {cause}")]
    Unsupported { model: String, cause: String },
    #[error("model {model}: bad input: {cause}")]
    BadInput { model: String, cause: String },
    #[error("model {model}: inference failed: {cause}")]
    Run { model: String, cause: String },
}

/// The manifest `format` of an ONNX model (tract, or onnxruntime where it measures
/// faster).
pub const FORMAT_ONNX: &str = "onnx";
/// The manifest `format` of a BERT encoder run by candle, shipped as GGUF.
pub const FORMAT_CANDLE_BERT: &str = "candle-bert-gguf";

/// Name and shape of a model input or output; `-1` marks the symbolic batch dimension.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TensorInfo {
    pub name: String,
    pub shape: Vec<i64>,
    /// `f32` for every [`Model`]; a [`graph_model::GraphModel`]'s tensors have their own.
    #[serde(default = "f32_type")]
    pub dtype: String,
}

fn f32_type() -> String {
    "f32".into()
}

/// Batch sizes that get a plan of their own: a batch of any size runs as a sum of
/// these (13 = 8 + 4 + 1), so memory stays bounded at [`BATCH_PLANS`] plans however
/// the batcher sizes its batches, and each plan has fully static shapes.
pub const BATCH_PLANS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Time [`Model::tune_batches`] spends measuring batch sizes, beyond the first.
pub const TUNE_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

type PlanSlot = std::sync::OnceLock<Option<Arc<planned::Planned>>>;

/// A loaded, optimised model, cheap to clone and safe to share between threads.
#[derive(Clone)]
pub struct Model {
    name: String,
    /// The model as parsed, kept to build the plans of larger batches on first use.
    inference: Arc<InferenceModel>,
    /// `plans[i]` runs a batch of `BATCH_PLANS[i]`, or is `None` when tract cannot plan
    /// that size for this model (a model with a fixed batch of 1 inside, say): such
    /// batches run row by row. Index 0 is built at load time.
    plans: Arc<[PlanSlot; BATCH_PLANS.len()]>,
    /// `halve[i]`: run a batch of `BATCH_PLANS[i]` as two of half the size, because
    /// [`Model::tune_batches`] measured that faster (tract's convolutions can get slower
    /// per item as the batch grows). Starts all false.
    halve: Arc<[std::sync::atomic::AtomicBool; BATCH_PLANS.len()]>,
    input: TensorInfo,
    output: TensorInfo,
    /// Number of values in one input row (the input shape without its batch dimension).
    row_len: usize,
    /// The same file in onnxruntime, when attached ([`Model::attach_onnxruntime`]).
    #[cfg(feature = "onnxruntime")]
    onnxruntime: Option<Arc<ort_backend::OrtSession>>,
    /// Whether [`Model::choose_backend`] found onnxruntime faster for this model.
    use_onnxruntime: Arc<std::sync::atomic::AtomicBool>,
    /// A candle model ([`Model::load_bert_gguf`]); the tract fields are then empty.
    candle: Option<Arc<candle_bert::CandleBert>>,
}

/// What [`Model::choose_backend`] measured and chose.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BackendChoice {
    pub backend: &'static str,
    /// Median batch-1 time of each backend measured, µs.
    pub tract_us: u64,
    pub onnxruntime_us: Option<u64>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("name", &self.name)
            .field("input", &self.input)
            .field("output", &self.output)
            .finish()
    }
}

/// An optimised plan with every dimension fixed (`concrete`, batch first = `batch`).
fn plan_for(
    inference: &InferenceModel,
    concrete: &[usize],
    batch: usize,
) -> TractResult<Arc<TypedRunnableModel>> {
    let mut shape = concrete.to_vec();
    if let Some(first) = shape.first_mut() {
        *first = batch;
    }
    inference
        .clone()
        .with_input_fact(0, f32::fact(&shape).into())
        .and_then(kernels::optimized)
        .and_then(|model| model.into_runnable())
}

/// Runs `load`, turning a panic of the ONNX parser (which some corrupt files cause)
/// into a [`RuntimeError::Load`] naming the model.
pub(crate) fn guard_parser<T>(
    name: &str,
    load: impl FnOnce() -> Result<T, RuntimeError>,
) -> Result<T, RuntimeError> {
    catch_unwind(AssertUnwindSafe(load)).unwrap_or_else(|_| {
        Err(RuntimeError::Load {
            model: name.to_string(),
            cause: "the ONNX parser panicked on this file (it is corrupt or unsupported)".into(),
        })
    })
}

fn dims_of(fact: &TypedFact) -> Vec<i64> {
    fact.shape
        .iter()
        .map(|dim| dim.to_i64().unwrap_or(-1))
        .collect()
}

impl Model {
    /// Loads an ONNX model from bytes. `name` is used in errors and logs.
    pub fn load_onnx(name: &str, bytes: &[u8]) -> Result<Model, RuntimeError> {
        Self::load_onnx_with_shape(name, bytes, None)
    }

    /// Loads a model as shipped: an int8-weight variant is first folded back into f32
    /// weights ([`onnx_edit::dequantize_weights`]), so it runs exactly as fast as the
    /// full model; other models load unchanged.
    pub fn load_variant(
        name: &str,
        bytes: &[u8],
        row_shape: Option<&[usize]>,
    ) -> Result<Model, RuntimeError> {
        match onnx_edit::dequantize_weights(name, bytes)? {
            Some(folded) => Self::load_onnx_with_shape(name, &folded, row_shape),
            None => Self::load_onnx_with_shape(name, bytes, row_shape),
        }
    }

    /// Like [`Model::load_onnx`], with the input row shape (without the batch axis)
    /// fixed to `row_shape`: needed for models whose height and width are symbolic (a
    /// detector that takes any image size), and a fixed shape lets tract plan statically.
    pub fn load_onnx_with_shape(
        name: &str,
        bytes: &[u8],
        row_shape: Option<&[usize]>,
    ) -> Result<Model, RuntimeError> {
        guard_parser(name, || Self::load_onnx_inner(name, bytes, row_shape))
    }

    fn load_onnx_inner(
        name: &str,
        bytes: &[u8],
        row_shape: Option<&[usize]>,
    ) -> Result<Model, RuntimeError> {
        let load = |cause: String| RuntimeError::Load {
            model: name.to_string(),
            cause,
        };
        let unsupported = |cause: String| RuntimeError::Unsupported {
            model: name.to_string(),
            cause,
        };
        let mut inference = fuse_activations::read_for_running(name, bytes)?;
        // The file's own output name (tract's label right after parsing); typing may
        // leave only an internal node's, e.g. `Clip_28.max` for an expanded `Clip`.
        let declared_output = inference
            .outputs
            .first()
            .and_then(|outlet| inference.outlet_label(*outlet))
            .map(str::to_string);
        if let Some(row_shape) = row_shape {
            let batch = inference.symbols.sym("N");
            let mut dims: Vec<TDim> = vec![batch.into()];
            dims.extend(row_shape.iter().map(|d| TDim::from(*d as i64)));
            inference = inference
                .with_input_fact(0, f32::fact(dims).into())
                .map_err(|e| load(format!("cannot fix the input to {row_shape:?}: {e:#}")))?;
        }
        // A file whose input row is fully given (a symbolic batch at most), e.g. one
        // whose shapes were fixed at push (`--input x=N,3,48,320`), is its own row shape.
        let declared_row: Option<Vec<usize>> = inference.input_fact(0).ok().and_then(|fact| {
            use tract_onnx::tract_hir::infer::Factoid;
            let dims: Vec<Option<i64>> = fact
                .shape
                .dims()
                .map(|d| d.concretize().and_then(|t| t.to_i64().ok()))
                .collect();
            (dims.len() >= 2 && dims[1..].iter().all(|d| d.is_some_and(|v| v > 0)))
                .then(|| dims[1..].iter().map(|d| d.unwrap_or(1) as usize).collect())
        });
        if inference.inputs.len() != 1 || inference.outputs.len() != 1 {
            return Err(unsupported(format!(
                "{} inputs and {} outputs; one of each is supported",
                inference.inputs.len(),
                inference.outputs.len()
            )));
        }
        // Typed with a symbolic batch where tract can (so shapes say which axis is the
        // batch); some exporters compute reshapes from the batch size, which tract only
        // types for a known batch: then type at batch 1 and treat axis 0 as the batch.
        let mut typed_at_batch_one = false;
        let typed = match inference.clone().into_typed() {
            Ok(typed) => typed,
            Err(symbolic_error) => {
                let Some(row_shape) = row_shape.or(declared_row.as_deref()) else {
                    return Err(load(format!(
                        "{symbolic_error:#} (fix the input's shape at push, e.g. `--input NAME=N,3,224,224`; `nephele model inspect FILE` shows its dimensions)"
                    )));
                };
                let mut shape = vec![1usize];
                shape.extend_from_slice(row_shape);
                let typed = inference
                    .clone()
                    .with_input_fact(0, f32::fact(&shape).into())
                    .and_then(|m| m.into_typed())
                    .map_err(|e| load(format!("{e:#}")))?;
                typed_at_batch_one = true;
                typed
            }
        };
        let input_fact = typed.input_fact(0).map_err(|e| load(format!("{e:#}")))?;
        if input_fact.datum_type != f32::datum_type() {
            return Err(unsupported(format!(
                "input type {:?}; only f32 is supported",
                input_fact.datum_type
            )));
        }
        let mut input_shape = dims_of(input_fact);
        let mut output_shape = dims_of(typed.output_fact(0).map_err(|e| load(format!("{e:#}")))?);
        if row_shape.is_some() || typed_at_batch_one {
            // The batch axis is symbolic whatever the typing above fixed it to.
            for shape in [&mut input_shape, &mut output_shape] {
                if let Some(first) = shape.first_mut() {
                    *first = -1;
                }
            }
        }
        if input_shape.is_empty() || input_shape[1..].iter().any(|d| *d < 0) {
            return Err(unsupported(format!(
                "input shape {input_shape:?}: only the first (batch) dimension may be symbolic"
            )));
        }
        let input_name = typed.node(typed.inputs[0].node).name.clone();
        let output_name =
            declared_output.unwrap_or_else(|| typed.node(typed.outputs[0].node).name.clone());
        let mut concrete: Vec<usize> = input_shape.iter().map(|d| (*d).max(1) as usize).collect();
        concrete[0] = 1;
        let row_len = concrete.iter().product();
        let plan = plan_for(&inference, &concrete, 1).map_err(|e| load(format!("{e:#}")))?;
        let plans: [PlanSlot; BATCH_PLANS.len()] = Default::default();
        let plan = planned::Planned::new(plan).map_err(|e| load(format!("{e:#}")))?;
        let _ = plans[0].set(Some(Arc::new(plan)));
        Ok(Model {
            name: name.to_string(),
            inference: Arc::new(inference),
            plans: Arc::new(plans),
            halve: Arc::new(Default::default()),
            #[cfg(feature = "onnxruntime")]
            onnxruntime: None,
            use_onnxruntime: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            candle: None,
            input: TensorInfo {
                name: input_name,
                shape: input_shape,
                dtype: f32_type(),
            },
            output: TensorInfo {
                name: output_name,
                shape: output_shape,
                dtype: f32_type(),
            },
            row_len,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// This model for running one row at a time only (a split tail in a pool): the
    /// parsed model that larger batches' plans are built from, about the weights' size
    /// again, is dropped, and a larger batch runs row by row.
    pub fn single_row_only(mut self) -> Model {
        let plans: [PlanSlot; BATCH_PLANS.len()] = Default::default();
        let _ = plans[0].set(self.plan(0));
        for slot in &plans[1..] {
            let _ = slot.set(None);
        }
        self.plans = Arc::new(plans);
        self.inference = Arc::new(InferenceModel::default());
        self
    }

    /// Loads a shipped variant file by its manifest `format` ([`FORMAT_ONNX`] or
    /// [`FORMAT_CANDLE_BERT`]); `input_shape` is the manifest's input shape (batch
    /// first), which gives a candle model its sequence length.
    pub fn load_shipped(
        name: &str,
        bytes: &[u8],
        format: &str,
        input_shape: &[i64],
    ) -> Result<Model, RuntimeError> {
        match format {
            FORMAT_ONNX => Self::load_variant(name, bytes, None),
            FORMAT_CANDLE_BERT => match input_shape {
                [_, seq] if *seq > 0 => Self::load_bert_gguf(name, bytes, *seq as usize),
                other => Err(RuntimeError::Unsupported {
                    model: name.to_string(),
                    cause: format!("input shape {other:?}; a candle BERT takes [batch, sequence]"),
                }),
            },
            other => Err(RuntimeError::Unsupported {
                model: name.to_string(),
                cause: format!("model format {other:?}; this agent runs {FORMAT_ONNX} and {FORMAT_CANDLE_BERT}"),
            }),
        }
    }

    /// Loads a BERT encoder shipped as GGUF (`candle_bert::full_gguf` or
    /// `candle_bert::quantize_int8`) for rows of `seq` token ids. An int8 file is run the
    /// faster way on this machine: both ways are timed on one row at load.
    pub fn load_bert_gguf(name: &str, bytes: &[u8], seq: usize) -> Result<Model, RuntimeError> {
        use candle_bert::{CandleBert, Int8Compute};
        if seq == 0 {
            return Err(RuntimeError::BadInput {
                model: name.to_string(),
                cause: "a sequence length of 0".into(),
            });
        }
        let float = CandleBert::load_gguf(name, bytes, Int8Compute::Float)?;
        let row = vec![0.0f32; seq];
        let time = |bert: &CandleBert| -> Result<std::time::Duration, RuntimeError> {
            bert.embed(1, seq, &row)?;
            let started = std::time::Instant::now();
            bert.embed(1, seq, &row)?;
            Ok(started.elapsed())
        };
        let mut bert = float;
        if candle_bert::has_quantized_matrices(name, bytes)? {
            let quantized = CandleBert::load_gguf(name, bytes, Int8Compute::Quantized)?;
            if time(&quantized)? < time(&bert)? {
                bert = quantized;
            }
        } else {
            time(&bert)?;
        }
        let hidden = bert.hidden_size();
        Ok(Model {
            name: name.to_string(),
            inference: Arc::new(InferenceModel::default()),
            plans: Arc::new(Default::default()),
            halve: Arc::new(Default::default()),
            #[cfg(feature = "onnxruntime")]
            onnxruntime: None,
            use_onnxruntime: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            candle: Some(Arc::new(bert)),
            input: TensorInfo {
                name: "input_ids".into(),
                shape: vec![-1, seq as i64],
                dtype: f32_type(),
            },
            output: TensorInfo {
                name: "sentence_embedding".into(),
                shape: vec![-1, hidden as i64],
                dtype: f32_type(),
            },
            row_len: seq,
        })
    }

    /// Checks one input row (without the batch axis) on its own, so that a batcher can
    /// answer a bad row alone instead of failing the batch it would join: its length,
    /// and for a candle encoder that every value is a token id.
    pub fn check_row(&self, row: &[f32]) -> Result<(), String> {
        if row.len() != self.row_len {
            return Err(format!(
                "{} values for an input row of {}",
                row.len(),
                self.row_len
            ));
        }
        match &self.candle {
            Some(bert) => bert.check_ids(row),
            None => Ok(()),
        }
    }

    /// Compute for one row in FLOPs, for a candle model (`None` for ONNX: see
    /// `variants::flops`, which reads tract's cost model).
    pub fn candle_flops(&self) -> Option<u64> {
        self.candle.as_ref().map(|bert| bert.flops(self.row_len))
    }

    /// Loads the same file into onnxruntime as well (feature `onnxruntime`); the model
    /// keeps running on tract until [`Model::choose_backend`] finds onnxruntime faster.
    #[cfg(feature = "onnxruntime")]
    pub fn attach_onnxruntime(&mut self, bytes: &[u8]) -> Result<(), RuntimeError> {
        self.onnxruntime = Some(Arc::new(ort_backend::OrtSession::load(&self.name, bytes)?));
        Ok(())
    }

    /// Runs this model on onnxruntime from now on, if attached (for measuring it).
    #[cfg(feature = "onnxruntime")]
    pub fn force_onnxruntime(&self) {
        if self.onnxruntime.is_some() {
            self.use_onnxruntime
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The backend that runs this model now.
    pub fn backend(&self) -> &'static str {
        if self.candle.is_some() {
            return "candle";
        }
        if self
            .use_onnxruntime
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            "onnxruntime"
        } else {
            "tract"
        }
    }

    /// Measures batch 1 on every attached backend (median of `repeats` runs on zero
    /// input) and runs the model on the fastest from now on.
    pub fn choose_backend(&self, repeats: usize) -> Result<BackendChoice, RuntimeError> {
        use std::sync::atomic::Ordering::Relaxed;
        self.use_onnxruntime.store(false, Relaxed);
        let tract_us = self.profile_batches(&[1], repeats)?[0].1;
        #[cfg(feature = "onnxruntime")]
        if self.onnxruntime.is_some() {
            self.use_onnxruntime.store(true, Relaxed);
            let ort_us = self.profile_batches(&[1], repeats)?[0].1;
            let faster = ort_us < tract_us;
            self.use_onnxruntime.store(faster, Relaxed);
            return Ok(BackendChoice {
                backend: self.backend(),
                tract_us,
                onnxruntime_us: Some(ort_us),
            });
        }
        Ok(BackendChoice {
            backend: self.backend(),
            tract_us,
            onnxruntime_us: None,
        })
    }

    /// The plan for `BATCH_PLANS[index]`, built on first use; `None` when this size
    /// cannot be planned (then the batch runs row by row on the batch-1 plan).
    fn plan(&self, index: usize) -> Option<Arc<planned::Planned>> {
        let slot = self.plans.get(index)?;
        slot.get_or_init(|| {
            let size = *BATCH_PLANS.get(index)?;
            let concrete: Vec<usize> = self
                .input
                .shape
                .iter()
                .map(|d| (*d).max(1) as usize)
                .collect();
            match catch_unwind(AssertUnwindSafe(|| {
                plan_for(&self.inference, &concrete, size).and_then(planned::Planned::new)
            })) {
                Ok(Ok(plan)) => Some(Arc::new(plan)),
                _ => None,
            }
        })
        .clone()
    }

    /// Runs `chunk` (a batch of `BATCH_PLANS[index]` rows) with that size's plan, as two
    /// halves when tuning found that faster, or row by row when the size has no plan.
    fn run_chunk(
        &self,
        index: usize,
        chunk: &[f32],
        row_shape: &[usize],
        out_shape: &mut Vec<usize>,
        out: &mut Vec<f32>,
    ) -> Result<(), RuntimeError> {
        let halve = index > 0 && self.halve[index].load(std::sync::atomic::Ordering::Relaxed);
        if halve {
            let middle = chunk.len() / 2;
            self.run_chunk(index - 1, &chunk[..middle], row_shape, out_shape, out)?;
            return self.run_chunk(index - 1, &chunk[middle..], row_shape, out_shape, out);
        }
        // Shapes on the stack (`TVec` holds four dimensions inline): nothing is
        // allocated around the plan's own run.
        let shape_of = |rows: usize| -> TVec<usize> {
            let mut shape: TVec<usize> = tvec![rows];
            shape.extend_from_slice(row_shape);
            shape
        };
        match self.plan(index) {
            Some(plan) => {
                self.run_plan(&plan, &shape_of(BATCH_PLANS[index]), chunk, out_shape, out)
            }
            None => {
                let single = self.plan(0).ok_or_else(|| RuntimeError::Run {
                    model: self.name.clone(),
                    cause: "the batch-1 plan is missing".into(),
                })?;
                let one_row_shape = shape_of(1);
                for row in chunk.chunks(self.row_len) {
                    self.run_plan(&single, &one_row_shape, row, out_shape, out)?;
                }
                Ok(())
            }
        }
    }

    /// Chooses, for each planned batch size up to `max_batch`, between its own plan and
    /// two runs of half the size, by measuring both (median of `repeats` runs), from the
    /// smallest size up, so that a batch is never slower per item than smaller ones
    /// measured. Returns the service time of each size as it will now run, in
    /// microseconds: the profile the batcher chooses batch sizes from.
    pub fn tune_batches(
        &self,
        max_batch: usize,
        repeats: usize,
    ) -> Result<Vec<(usize, u64)>, RuntimeError> {
        let mut profile: Vec<(usize, u64)> = Vec::new();
        let started = std::time::Instant::now();
        for (index, &size) in BATCH_PLANS.iter().enumerate() {
            if size > max_batch.max(1) {
                break;
            }
            // A big model's larger batches take long to plan and to measure, and no
            // deployment waits for that: past the budget, or once one batch takes a
            // second, larger sizes are extrapolated by the batcher from the last one.
            if !profile.is_empty()
                && (started.elapsed() > TUNE_BUDGET
                    || profile.last().is_some_and(|&(_, us)| us > 1_000_000))
            {
                break;
            }
            self.halve[index].store(false, std::sync::atomic::Ordering::Relaxed);
            let own = self.profile_batches(&[size], repeats)?[0].1;
            let chosen = match profile.last() {
                Some(&(_, half)) if half.saturating_mul(2) < own => {
                    self.halve[index].store(true, std::sync::atomic::Ordering::Relaxed);
                    half.saturating_mul(2)
                }
                _ => own,
            };
            profile.push((size, chosen));
        }
        Ok(profile)
    }

    fn run_plan(
        &self,
        plan: &planned::Planned,
        shape: &[usize],
        chunk: &[f32],
        out_shape: &mut Vec<usize>,
        out: &mut Vec<f32>,
    ) -> Result<(), RuntimeError> {
        let run = |cause: String| RuntimeError::Run {
            model: self.name.clone(),
            cause,
        };
        let tensor = Tensor::from_shape(shape, chunk).map_err(|e| RuntimeError::BadInput {
            model: self.name.clone(),
            cause: format!("{e:#}"),
        })?;
        let result = plan
            .run(tvec!(tensor.into()))
            .map_err(|e| run(format!("{e:#}")))?;
        // A tract tensor in RAM is dense and in row-major order: its values are a
        // slice, copied at once (an `ndarray` view walks them element by element).
        let values = result[0]
            .try_as_plain_ram()
            .and_then(|plain| plain.as_slice::<f32>())
            .map_err(|e| run(format!("{e:#}")))?;
        if out_shape.is_empty() {
            out_shape.extend_from_slice(result[0].shape());
        }
        out.extend_from_slice(values);
        Ok(())
    }

    /// Measures the service time of each batch size in `sizes` on this machine: the
    /// median of `repeats` runs on zero input after one warm-up run, in microseconds.
    /// This is what the batcher's controller chooses batch sizes from.
    pub fn profile_batches(
        &self,
        sizes: &[usize],
        repeats: usize,
    ) -> Result<Vec<(usize, u64)>, RuntimeError> {
        let row_shape: Vec<usize> = self.input.shape[1..].iter().map(|d| *d as usize).collect();
        let mut profile = Vec::with_capacity(sizes.len());
        for &size in sizes.iter().filter(|s| **s > 0) {
            let mut shape = vec![size];
            shape.extend_from_slice(&row_shape);
            let data = vec![0.0f32; size * self.row_len];
            self.infer(&shape, &data)?;
            let mut times: Vec<u64> = (0..repeats.max(1))
                .map(|_| {
                    let started = std::time::Instant::now();
                    self.infer(&shape, &data)
                        .map(|_| started.elapsed().as_micros() as u64)
                })
                .collect::<Result<_, _>>()?;
            times.sort_unstable();
            profile.push((size, times[times.len() / 2].max(1)));
        }
        Ok(profile)
    }

    pub fn input(&self) -> &TensorInfo {
        &self.input
    }

    pub fn output(&self) -> &TensorInfo {
        &self.output
    }

    /// Runs the model on `data` laid out as `shape`: either the input shape with a batch
    /// dimension first, or one row without it. Returns the output shape (with the batch
    /// dimension) and values.
    pub fn infer(
        &self,
        shape: &[usize],
        data: &[f32],
    ) -> Result<(Vec<usize>, Vec<f32>), RuntimeError> {
        let bad = |cause: String| RuntimeError::BadInput {
            model: self.name.clone(),
            cause,
        };
        let row_shape: TVec<usize> = self.input.shape[1..].iter().map(|d| *d as usize).collect();
        let batch = if shape == row_shape.as_slice() {
            1
        } else if shape.len() == self.input.shape.len() && shape[1..] == row_shape[..] {
            shape[0]
        } else {
            return Err(bad(format!(
                "shape {shape:?} does not match the model input {:?} (batch first)",
                self.input.shape
            )));
        };
        if data.len() != batch * self.row_len {
            return Err(bad(format!(
                "{} values given for shape {shape:?}, which needs {}",
                data.len(),
                batch * self.row_len
            )));
        }
        if batch == 0 {
            return Err(bad("empty batch".into()));
        }
        if let Some(bert) = &self.candle {
            let out = bert.embed(batch, self.row_len, data)?;
            return Ok((vec![batch, bert.hidden_size()], out));
        }
        #[cfg(feature = "onnxruntime")]
        if self
            .use_onnxruntime
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            if let Some(session) = &self.onnxruntime {
                let mut full_shape = vec![batch];
                full_shape.extend_from_slice(&row_shape);
                return session.run(&self.name, &full_shape, data);
            }
        }
        let mut out_shape = Vec::new();
        let mut out = Vec::new();
        let mut done = 0;
        while done < batch {
            // The largest planned size that fits what is left: 13 runs as 8 + 4 + 1.
            let (index, size) = BATCH_PLANS
                .iter()
                .enumerate()
                .rev()
                .find(|(_, size)| **size <= batch - done)
                .map(|(index, size)| (index, *size))
                .unwrap_or((0, 1));
            let chunk = &data[done * self.row_len..(done + size) * self.row_len];
            self.run_chunk(index, chunk, &row_shape, &mut out_shape, &mut out)?;
            done += size;
        }
        if let Some(first) = out_shape.first_mut() {
            *first = batch;
        }
        Ok((out_shape, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_and_truncated_models_are_refused_with_the_model_name() {
        for bytes in [&b"not an onnx file at all"[..], &[0xff; 7][..], &[][..]] {
            match Model::load_onnx("broken", bytes) {
                Err(error) => assert!(error.to_string().contains("model broken"), "{error}"),
                Ok(_) => panic!("garbage loaded as a model"),
            }
        }
    }
}
