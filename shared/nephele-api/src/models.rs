//! Models (`/v1/models`): each pushed file a version, its variants built and measured
//! on push.

use serde::{Deserialize, Serialize};

/// Where a model is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModelState {
    Building,
    Ready,
    Failed,
}

/// How far a build is: `done` of `total` steps, `step` naming the one just finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BuildProgressView {
    pub done: usize,
    pub total: usize,
    pub step: String,
}

/// A model's input or output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "Tensor")]
pub struct TensorView {
    pub name: String,
    /// Dimensions; -1 for one left symbolic.
    pub shape: Vec<i64>,
    /// `f32`, `i64`, `i32`, …
    pub dtype: String,
}

/// A recurrent state of a stateful model: what it returns as `output` is fed back as
/// `input` on the same session's next request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "StateBinding")]
pub struct StateBindingView {
    pub input: String,
    pub output: String,
}

/// Where a split variant cuts the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CutView {
    pub tensor: String,
    /// Shape of the activation at the cut, batch first (`-1` symbolic).
    pub shape: Vec<i64>,
    /// f32 bytes of one row's activation: what crosses the link per request.
    pub activation_bytes: u64,
    pub head_flops: u64,
    pub tail_flops: u64,
    /// Why this cut was among those built.
    #[serde(default)]
    pub chosen_because: String,
}

/// One variant as built and measured on push; `rejected` says why it is not shipped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VariantView {
    pub name: String,
    pub precision: String,
    pub size: u64,
    pub flops: u64,
    /// Accuracy in percent on labelled validation data.
    pub accuracy_pct: Option<f64>,
    pub min_cosine: Option<f64>,
    pub top1_agreement: Option<f64>,
    pub cut: Option<CutView>,
    pub rejected: Option<String>,
    /// `shipped` or `rejected`.
    #[serde(default)]
    pub status: String,
    /// What mixed precision kept in f32, for an int8 variant that needed it.
    #[serde(default)]
    pub note: Option<String>,
    /// What its outputs were judged on against full, rule by rule, with the figure
    /// each measured (the push's `--accept` rules, or the default min cosine).
    #[serde(default)]
    pub accepted_on: Option<String>,
    /// Why it was rejected, for a split why its cut was built, or the note.
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ModelView {
    pub name: String,
    /// The tenant that pushed it.
    pub tenant: String,
    /// The first 12 hex digits of the stored file's sha256: pushing other content
    /// under the name adds a version, the same content is the same version.
    pub version: String,
    /// `name:version`, what a deployment names to run exactly this version.
    pub reference: String,
    /// `building` until the variants are built and stored, then `ready`; `failed` with
    /// `error` saying why.
    pub state: ModelState,
    /// How far the build is (while `building`).
    pub progress: Option<BuildProgressView>,
    pub error: Option<String>,
    /// The `--input` specs applied to the file at push.
    pub input_specs: Vec<String>,
    /// Recurrent state kept per session on devices (`--state INPUT=OUTPUT`).
    pub recurrent_state: Vec<StateBindingView>,
    pub sha256: String,
    pub size: u64,
    pub created_unix: u64,
    pub inputs: Vec<TensorView>,
    pub outputs: Vec<TensorView>,
    /// What the variants were measured on.
    pub validation: String,
    /// Every variant built on push; those with `rejected` set are not shipped.
    pub variants: Vec<VariantView>,
    /// `onnx` (tract, or onnxruntime), `onnx-graph` (several typed inputs and
    /// outputs) or `candle-bert-gguf` (candle).
    pub format: String,
}
