//! The optional onnxruntime backend (cargo feature `onnxruntime`, off by default so
//! the default build stays pure Rust). The library is loaded at run time from the path
//! in `ORT_DYLIB_PATH` (e.g. the `libonnxruntime.so` inside the `onnxruntime` wheel
//! that `shared/models/registry/prepare.sh` installs); nothing is linked or downloaded
//! at build time. [`crate::Model::choose_backend`] measures it against tract per model
//! and keeps the faster.

use std::sync::{Mutex, OnceLock};

use ort::session::{builder::GraphOptimizationLevel, Session};
use ort::value::Tensor;

use crate::RuntimeError;

static ENVIRONMENT: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();

fn environment() -> Result<&'static ort::environment::Environment, String> {
    ENVIRONMENT
        .get_or_init(|| {
            let path = std::env::var("ORT_DYLIB_PATH").map_err(|_| {
                "ORT_DYLIB_PATH is not set; point it at libonnxruntime.so (see shared/models/registry/README.md)".to_string()
            })?;
            ort::init_from(&path)
                .map_err(|e| format!("cannot load {path}: {e}"))?
                .build()
                .map_err(|e| format!("onnxruntime environment: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// One onnxruntime session, one intra-op thread, sequential, all graph optimisations.
pub struct OrtSession {
    session: Mutex<Session>,
}

impl OrtSession {
    pub fn load(name: &str, bytes: &[u8]) -> Result<Self, RuntimeError> {
        let load = |cause: String| RuntimeError::Load {
            model: name.to_string(),
            cause: format!("onnxruntime: {cause}"),
        };
        let environment = environment().map_err(load)?;
        let builder = Session::builder(environment).map_err(|e| load(e.to_string()))?;
        let builder = builder
            .with_intra_threads(1)
            .map_err(|e| load(e.to_string()))?;
        let builder = builder
            .with_inter_threads(1)
            .map_err(|e| load(e.to_string()))?;
        let mut builder = builder
            .with_optimization_level(GraphOptimizationLevel::Level3)
            .map_err(|e| load(e.to_string()))?;
        let session = builder
            .commit_from_memory(bytes)
            .map_err(|e| load(e.to_string()))?;
        Ok(OrtSession {
            session: Mutex::new(session),
        })
    }

    /// Runs one batch laid out as `shape` (batch first).
    pub fn run(
        &self,
        name: &str,
        shape: &[usize],
        data: &[f32],
    ) -> Result<(Vec<usize>, Vec<f32>), RuntimeError> {
        let run = |cause: String| RuntimeError::Run {
            model: name.to_string(),
            cause: format!("onnxruntime: {cause}"),
        };
        let dims: Vec<i64> = shape.iter().map(|d| *d as i64).collect();
        let input = Tensor::from_array((dims, data.to_vec())).map_err(|e| run(e.to_string()))?;
        let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
        let outputs = session
            .run(ort::inputs![input])
            .map_err(|e| run(e.to_string()))?;
        let (out_shape, values) = outputs[0]
            .try_extract_tensor::<f32>()
            .map_err(|e| run(e.to_string()))?;
        Ok((
            out_shape.iter().map(|d| (*d).max(0) as usize).collect(),
            values.to_vec(),
        ))
    }
}
