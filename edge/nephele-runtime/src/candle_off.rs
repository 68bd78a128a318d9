//! The candle backend when this build leaves it out (`--no-default-features`, as a
//! small edge build does): the same names as `candle_bert.rs`, so the rest of the
//! runtime is the same code, but no model can be loaded through it. A deployment of a
//! candle model on such a device fails to load, saying why and what to build instead.

use crate::RuntimeError;

fn missing(model: &str) -> RuntimeError {
    RuntimeError::Unsupported {
        model: model.to_string(),
        cause: "this build has no candle backend (built without the `candle` feature); run BERT encoders on an agent built with it (the default), or deploy an ONNX model here".into(),
    }
}

/// How an int8 GGUF file is computed (only named here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int8Compute {
    Quantized,
    Float,
}

/// A loaded candle model: none can exist in this build.
pub enum CandleBert {}

impl CandleBert {
    pub fn load_gguf(name: &str, _: &[u8], _: Int8Compute) -> Result<Self, RuntimeError> {
        Err(missing(name))
    }

    pub fn hidden_size(&self) -> usize {
        match *self {}
    }

    pub fn check_ids(&self, _: &[f32]) -> Result<(), String> {
        match *self {}
    }

    pub fn flops(&self, _: usize) -> u64 {
        match *self {}
    }

    pub fn embed(&self, _: usize, _: usize, _: &[f32]) -> Result<Vec<f32>, RuntimeError> {
        match *self {}
    }
}

pub fn has_quantized_matrices(name: &str, _: &[u8]) -> Result<bool, RuntimeError> {
    Err(missing(name))
}

/// Whether `bytes` look like a GGUF file (its magic number), candle or not.
pub fn is_gguf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"GGUF")
}

pub fn quantize_int8(name: &str, _: &[u8], _: &str) -> Result<Vec<u8>, RuntimeError> {
    Err(missing(name))
}

pub fn full_gguf(name: &str, _: &[u8], _: &str) -> Result<Vec<u8>, RuntimeError> {
    Err(missing(name))
}
