//! The candle backend: a BERT sentence encoder (all-MiniLM-L6-v2 and its family) run
//! from its safetensors weights with `candle-core`, no ONNX involved.
//!
//! Same contract as the ONNX MiniLM the benchmark builds: one f32 input `[N, S]` of
//! token ids (0 = padding), one f32 output `[N, hidden]`, the mean of the last layer
//! over non-padding tokens, L2-normalised (sentence-transformers' pipeline). Token type
//! ids are all 0. Loading checks every tensor's presence and shape against the config,
//! so a truncated or mismatched file is an error naming the tensor, never a panic.
//!
//! int8: [`quantize_int8`] writes the encoder as GGUF with every weight matrix and
//! embedding table in candle's Q8_0 (blocks of 32 int8 values sharing an f16 scale,
//! 8.5 bits per weight) and biases and norms in f32, the config in the file's metadata.
//! [`CandleBert::load_gguf`] runs it either with candle's quantized matmul
//! ([`Int8Compute::Quantized`], activations quantized to Q8 on the fly) or dequantized
//! to f32 ([`Int8Compute::Float`]: the smaller file, the f32 speed); which is faster is
//! measured, not assumed (`nephele bench inference`).
//!
//! Not here: tokenisation (the caller sends ids), other architectures, GPU (candle's
//! CUDA path would sit behind a cargo feature).

use std::collections::HashMap;

use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor, D};

use crate::RuntimeError;

/// The parts of a Hugging Face BERT `config.json` the forward pass needs.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct BertConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
}

fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}

/// A weight matrix as the forward pass uses it.
enum Weight {
    /// Transposed to `[in, out]` for a plain matmul.
    Float(Tensor),
    /// Q8_0 blocks, `[out, in]` as stored; candle's quantized matmul.
    Int8(QMatMul),
}

struct Linear {
    weight: Weight,
    bias: Tensor,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = match &self.weight {
            Weight::Float(weight_t) => x.broadcast_matmul(weight_t)?,
            Weight::Int8(matrix) => matrix.forward(&x.contiguous()?)?,
        };
        y.broadcast_add(&self.bias)
    }
}

struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centered.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        normed
            .broadcast_mul(&self.weight)?
            .broadcast_add(&self.bias)
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// A loaded BERT encoder.
pub struct CandleBert {
    name: String,
    config: BertConfig,
    word: Tensor,
    position: Tensor,
    token_type0: Tensor,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    device: Device,
}

impl std::fmt::Debug for CandleBert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandleBert")
            .field("name", &self.name)
            .field("config", &self.config)
            .finish()
    }
}

fn softmax_last(x: &Tensor) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

impl CandleBert {
    /// Loads from the bytes of `model.safetensors` and `config.json`.
    pub fn load(name: &str, safetensors: &[u8], config_json: &str) -> Result<Self, RuntimeError> {
        let config = parse_config(name, config_json)?;
        let tensors = candle_core::safetensors::load_buffer(safetensors, &Device::Cpu)
            .map_err(|e| load_error(name, format!("safetensors: {e}")))?;
        Self::build(name, config, &Weights::Float(tensors))
    }

    /// Loads the int8 file [`quantize_int8`] writes, computing its matrices as
    /// `compute` says.
    pub fn load_gguf(name: &str, gguf: &[u8], compute: Int8Compute) -> Result<Self, RuntimeError> {
        let (config_json, tensors) = read_gguf(name, gguf)?;
        let config = parse_config(name, &config_json)?;
        Self::build(name, config, &Weights::Int8(tensors, compute))
    }

    fn build(name: &str, config: BertConfig, weights: &Weights) -> Result<Self, RuntimeError> {
        let load = |cause: String| load_error(name, cause);
        if config.hidden_act != "gelu" {
            return Err(RuntimeError::Unsupported {
                model: name.to_string(),
                cause: format!(
                    "hidden_act {:?}; only gelu (erf) is supported",
                    config.hidden_act
                ),
            });
        }
        if config.num_attention_heads == 0
            || !config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
        {
            return Err(load(format!(
                "hidden_size {} is not a multiple of {} heads",
                config.hidden_size, config.num_attention_heads
            )));
        }
        let device = Device::Cpu;
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let check = |key: &str, dims: &[usize], shape: &[usize]| {
            if dims != shape {
                return Err(load(format!(
                    "tensor {key} has shape {dims:?}, the config needs {shape:?}"
                )));
            }
            Ok(())
        };
        let get = |key: &str, shape: &[usize]| -> Result<Tensor, RuntimeError> {
            let tensor = match weights {
                Weights::Float(tensors) => tensors.get(key).cloned(),
                Weights::Int8(tensors, _) => tensors
                    .get(key)
                    .map(|q| q.dequantize(&device))
                    .transpose()
                    .map_err(|e| load(format!("tensor {key}: {e}")))?,
            }
            .ok_or_else(|| load(format!("tensor {key} is missing")))?;
            check(key, tensor.dims(), shape)?;
            tensor
                .to_dtype(DType::F32)
                .map_err(|e| load(format!("tensor {key}: {e}")))
        };
        let linear = |prefix: &str, out: usize, inp: usize| -> Result<Linear, RuntimeError> {
            let key = format!("{prefix}.weight");
            let weight = match weights {
                Weights::Int8(tensors, Int8Compute::Quantized) => {
                    let matrix = tensors
                        .get(&key)
                        .ok_or_else(|| load(format!("tensor {key} is missing")))?;
                    check(&key, matrix.shape().dims(), &[out, inp])?;
                    Weight::Int8(
                        QMatMul::from_arc(matrix.clone())
                            .map_err(|e| load(format!("{key}: {e}")))?,
                    )
                }
                _ => Weight::Float(
                    get(&key, &[out, inp])?
                        .t()
                        .and_then(|t| t.contiguous())
                        .map_err(|e| load(format!("{prefix}: {e}")))?,
                ),
            };
            Ok(Linear {
                weight,
                bias: get(&format!("{prefix}.bias"), &[out])?,
            })
        };
        let norm = |prefix: &str| -> Result<LayerNorm, RuntimeError> {
            Ok(LayerNorm {
                weight: get(&format!("{prefix}.weight"), &[h])?,
                bias: get(&format!("{prefix}.bias"), &[h])?,
                eps: config.layer_norm_eps,
            })
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            layers.push(Layer {
                query: linear(&format!("{p}.attention.self.query"), h, h)?,
                key: linear(&format!("{p}.attention.self.key"), h, h)?,
                value: linear(&format!("{p}.attention.self.value"), h, h)?,
                attention_out: linear(&format!("{p}.attention.output.dense"), h, h)?,
                attention_norm: norm(&format!("{p}.attention.output.LayerNorm"))?,
                intermediate: linear(&format!("{p}.intermediate.dense"), i, h)?,
                output: linear(&format!("{p}.output.dense"), h, i)?,
                output_norm: norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        let token_type = get("embeddings.token_type_embeddings.weight", &[2, h])
            .or_else(|_| get("embeddings.token_type_embeddings.weight", &[1, h]))?;
        Ok(CandleBert {
            name: name.to_string(),
            word: get("embeddings.word_embeddings.weight", &[config.vocab_size, h])?,
            position: get(
                "embeddings.position_embeddings.weight",
                &[config.max_position_embeddings, h],
            )?,
            token_type0: token_type
                .narrow(0, 0, 1)
                .map_err(|e| load(format!("token type embeddings: {e}")))?,
            embedding_norm: norm("embeddings.LayerNorm")?,
            layers,
            config,
            device,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    /// Whether every value is a token id of this model's vocabulary (a whole number in
    /// `0..vocab_size`; 0 is padding).
    pub fn check_ids(&self, ids: &[f32]) -> Result<(), String> {
        match ids.iter().find(|id| {
            !(id.is_finite() && **id >= 0.0 && id.fract() == 0.0)
                || **id as usize >= self.config.vocab_size
        }) {
            Some(id) => Err(format!(
                "{id} is not a token id of a {}-word vocabulary",
                self.config.vocab_size
            )),
            None => Ok(()),
        }
    }

    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Multiply-adds × 2 for one row of `seq` tokens: the linear layers and the two
    /// attention products (embeddings, norms and softmax left out, as tract's count
    /// leaves out element-wise work).
    pub fn flops(&self, seq: usize) -> u64 {
        let (h, i, s) = (
            self.config.hidden_size as u64,
            self.config.intermediate_size as u64,
            seq as u64,
        );
        let per_layer = 2 * s * (4 * h * h + 2 * h * i) + 2 * 2 * s * s * h;
        per_layer * self.config.num_hidden_layers as u64
    }

    /// Embeds `batch` rows of `seq` token ids (as f32, 0 = padding): `[batch, hidden]`.
    pub fn embed(&self, batch: usize, seq: usize, ids: &[f32]) -> Result<Vec<f32>, RuntimeError> {
        let bad = |cause: String| RuntimeError::BadInput {
            model: self.name.clone(),
            cause,
        };
        if batch == 0 || seq == 0 || ids.len() != batch * seq {
            return Err(bad(format!("{} ids for {batch} rows of {seq}", ids.len())));
        }
        if seq > self.config.max_position_embeddings {
            return Err(bad(format!(
                "sequence of {seq} is longer than the model's {} positions",
                self.config.max_position_embeddings
            )));
        }
        self.check_ids(ids).map_err(bad)?;
        let token_ids: Vec<u32> = ids.iter().map(|id| *id as u32).collect();
        self.forward(batch, seq, token_ids)
            .map_err(|e| RuntimeError::Run {
                model: self.name.clone(),
                cause: e.to_string(),
            })
    }

    fn forward(&self, batch: usize, seq: usize, ids: Vec<u32>) -> candle_core::Result<Vec<f32>> {
        let h = self.config.hidden_size;
        let heads = self.config.num_attention_heads;
        let head_dim = h / heads;
        let mask: Vec<f32> = ids.iter().map(|id| f32::from(u8::from(*id != 0))).collect();
        let ids = Tensor::from_vec(ids, (batch * seq,), &self.device)?;
        let words = self.word.index_select(&ids, 0)?.reshape((batch, seq, h))?;
        let positions = self.position.narrow(0, 0, seq)?;
        let x = words
            .broadcast_add(&positions)?
            .broadcast_add(&self.token_type0)?;
        let mut x = self.embedding_norm.forward(&x)?;
        let mask = Tensor::from_vec(mask, (batch, seq), &self.device)?;
        // Additive attention mask over the keys: 0 for tokens, −10000 for padding.
        let additive = ((mask.clone() - 1.0)? * 10_000.0)?.reshape((batch, 1, 1, seq))?;
        let scale = 1.0 / (head_dim as f64).sqrt();
        for layer in &self.layers {
            let split = |t: Tensor| -> candle_core::Result<Tensor> {
                t.reshape((batch, seq, heads, head_dim))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let q = split(layer.query.forward(&x)?)?;
            let k = split(layer.key.forward(&x)?)?;
            let v = split(layer.value.forward(&x)?)?;
            let scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?.broadcast_add(&additive)?;
            let context = softmax_last(&scores)?
                .matmul(&v)?
                .transpose(1, 2)?
                .contiguous()?
                .reshape((batch, seq, h))?;
            let attended = layer
                .attention_norm
                .forward(&(layer.attention_out.forward(&context)? + &x)?)?;
            let hidden = layer.intermediate.forward(&attended)?.gelu_erf()?;
            x = layer
                .output_norm
                .forward(&(layer.output.forward(&hidden)? + &attended)?)?;
        }
        // Mean over tokens, then L2 normalisation (clamped as sentence-transformers does).
        let weights = mask.reshape((batch, seq, 1))?;
        let summed = x.broadcast_mul(&weights)?.sum(1)?;
        let counts = weights.sum(1)?.clamp(1e-9, f64::MAX)?;
        let mean = summed.broadcast_div(&counts)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
        mean.broadcast_div(&norm)?.flatten_all()?.to_vec1::<f32>()
    }
}

/// How the matrices of an int8 file are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Int8Compute {
    /// candle's Q8_0 matmul (the activations are quantized to Q8 as well).
    Quantized,
    /// Dequantized to f32 at load: the int8 file's size, f32's compute.
    Float,
}

/// Where the forward pass's tensors come from.
enum Weights {
    Float(HashMap<String, Tensor>),
    Int8(HashMap<String, std::sync::Arc<QTensor>>, Int8Compute),
}

/// The GGUF metadata key that holds the model's `config.json`.
const CONFIG_KEY: &str = "nephele.bert.config";

fn load_error(name: &str, cause: String) -> RuntimeError {
    RuntimeError::Load {
        model: name.to_string(),
        cause,
    }
}

fn parse_config(name: &str, config_json: &str) -> Result<BertConfig, RuntimeError> {
    serde_json::from_str(config_json).map_err(|e| load_error(name, format!("config.json: {e}")))
}

/// Whether a GGUF file holds any quantized (non-f32) matrix.
pub fn has_quantized_matrices(name: &str, bytes: &[u8]) -> Result<bool, RuntimeError> {
    let (_, tensors) = read_gguf(name, bytes)?;
    Ok(tensors.values().any(|t| t.dtype() != GgmlDType::F32))
}

/// Whether `bytes` start like a GGUF file (what [`quantize_int8`] writes).
pub fn is_gguf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"GGUF")
}

fn read_gguf(
    name: &str,
    bytes: &[u8],
) -> Result<(String, HashMap<String, std::sync::Arc<QTensor>>), RuntimeError> {
    let load = |cause: String| load_error(name, cause);
    if !is_gguf(bytes) {
        return Err(load("not a GGUF file (no GGUF magic)".into()));
    }
    let mut reader = std::io::Cursor::new(bytes);
    // candle's reader trusts the header's counts and lengths; a damaged file must not
    // take the caller down with it.
    let content = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gguf_file::Content::read(&mut reader)
    }))
    .map_err(|_| load("GGUF header is corrupt".into()))?
    .map_err(|e| load(format!("GGUF: {e}")))?;
    let config = match content.metadata.get(CONFIG_KEY) {
        Some(gguf_file::Value::String(config)) => config.clone(),
        _ => return Err(load(format!("GGUF metadata has no {CONFIG_KEY}"))),
    };
    let mut tensors = HashMap::with_capacity(content.tensor_infos.len());
    for key in content.tensor_infos.keys() {
        let tensor = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            content.tensor(&mut reader, key, &Device::Cpu)
        }))
        .map_err(|_| load(format!("tensor {key} is corrupt")))?
        .map_err(|e| load(format!("tensor {key}: {e}")))?;
        tensors.insert(key.clone(), std::sync::Arc::new(tensor));
    }
    Ok((config, tensors))
}

/// The int8 file of a BERT encoder given as `model.safetensors` + `config.json`: GGUF
/// with every 2-D `*.weight` whose rows are a multiple of 32 long (the linear layers and
/// the embedding tables) in Q8_0, the rest in f32, and the config in the metadata. The
/// model is loaded first, so a file that would not run is refused here, not on a device.
pub fn quantize_int8(
    name: &str,
    safetensors: &[u8],
    config_json: &str,
) -> Result<Vec<u8>, RuntimeError> {
    to_gguf(name, safetensors, config_json, true)
}

/// The same encoder as one self-describing GGUF file in f32: what the control plane
/// ships as a candle model's `full` variant (weights and config in one artifact).
pub fn full_gguf(
    name: &str,
    safetensors: &[u8],
    config_json: &str,
) -> Result<Vec<u8>, RuntimeError> {
    to_gguf(name, safetensors, config_json, false)
}

fn to_gguf(
    name: &str,
    safetensors: &[u8],
    config_json: &str,
    int8: bool,
) -> Result<Vec<u8>, RuntimeError> {
    CandleBert::load(name, safetensors, config_json)?;
    let load = |cause: String| load_error(name, cause);
    let tensors = candle_core::safetensors::load_buffer(safetensors, &Device::Cpu)
        .map_err(|e| load(format!("safetensors: {e}")))?;
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let mut quantized = Vec::with_capacity(names.len());
    for key in names {
        let tensor = tensors[key]
            .to_dtype(DType::F32)
            .map_err(|e| load(format!("tensor {key}: {e}")))?;
        let dims = tensor.dims();
        let dtype = if int8 && key.ends_with(".weight") && dims.len() == 2 && dims[1] % 32 == 0 {
            GgmlDType::Q8_0
        } else {
            GgmlDType::F32
        };
        let q =
            QTensor::quantize(&tensor, dtype).map_err(|e| load(format!("tensor {key}: {e}")))?;
        quantized.push((key.as_str(), q));
    }
    let config = gguf_file::Value::String(config_json.to_string());
    let refs: Vec<(&str, &QTensor)> = quantized.iter().map(|(k, q)| (*k, q)).collect();
    let mut out = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut out, &[(CONFIG_KEY, &config)], &refs)
        .map_err(|e| load(format!("writing GGUF: {e}")))?;
    Ok(out.into_inner())
}

/// A small BERT encoder with deterministic pseudo-random weights in the real tensor
/// layout (hidden 64, 2 heads, 2 layers, 96-word vocabulary, 16 positions), as
/// `(model.safetensors bytes, config.json)`: the fixture tests and examples push when
/// they need a candle model and no downloaded one.
pub fn tiny_random_bert(seed: u64) -> Result<(Vec<u8>, String), RuntimeError> {
    let (h, i, vocab, positions, layers) = (64usize, 128usize, 96usize, 16usize, 2usize);
    let config = format!(
        r#"{{"hidden_size": {h}, "num_hidden_layers": {layers}, "num_attention_heads": 2, "intermediate_size": {i}, "max_position_embeddings": {positions}, "vocab_size": {vocab}}}"#
    );
    let fail = |e: candle_core::Error| load_error("tiny-bert", e.to_string());
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut random = |shape: &[usize]| -> Result<Tensor, RuntimeError> {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.4
            })
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).map_err(fail)
    };
    let ones = |n: usize| Tensor::ones(n, DType::F32, &Device::Cpu).map_err(fail);
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    tensors.insert(
        "embeddings.word_embeddings.weight".into(),
        random(&[vocab, h])?,
    );
    tensors.insert(
        "embeddings.position_embeddings.weight".into(),
        random(&[positions, h])?,
    );
    tensors.insert(
        "embeddings.token_type_embeddings.weight".into(),
        random(&[2, h])?,
    );
    tensors.insert("embeddings.LayerNorm.weight".into(), ones(h)?);
    tensors.insert("embeddings.LayerNorm.bias".into(), random(&[h])?);
    for l in 0..layers {
        let p = format!("encoder.layer.{l}");
        for (name, out, inp) in [
            ("attention.self.query", h, h),
            ("attention.self.key", h, h),
            ("attention.self.value", h, h),
            ("attention.output.dense", h, h),
            ("intermediate.dense", i, h),
            ("output.dense", h, i),
        ] {
            tensors.insert(format!("{p}.{name}.weight"), random(&[out, inp])?);
            tensors.insert(format!("{p}.{name}.bias"), random(&[out])?);
        }
        for name in ["attention.output.LayerNorm", "output.LayerNorm"] {
            tensors.insert(format!("{p}.{name}.weight"), ones(h)?);
            tensors.insert(format!("{p}.{name}.bias"), random(&[h])?);
        }
    }
    let path = std::env::temp_dir().join(format!(
        "nephele-tiny-bert-{}-{seed}-{:?}.safetensors",
        std::process::id(),
        std::thread::current().id()
    ));
    candle_core::safetensors::save(&tensors, &path).map_err(fail)?;
    let bytes = std::fs::read(&path).map_err(|e| load_error("tiny-bert", e.to_string()));
    let _ = std::fs::remove_file(&path);
    Ok((bytes?, config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_mismatched_files_are_refused_with_the_model_name() {
        let config = r#"{"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 16, "max_position_embeddings": 4, "vocab_size": 10}"#;
        let error = CandleBert::load("tiny", b"not safetensors", config).unwrap_err();
        assert!(error.to_string().contains("model tiny"), "{error}");
        let error = CandleBert::load("tiny", b"", "{").unwrap_err();
        assert!(error.to_string().contains("config.json"), "{error}");
        // A valid safetensors file that lacks the tensors the config needs.
        let empty = Tensor::zeros((2, 2), DType::F32, &Device::Cpu).unwrap();
        let path = std::env::temp_dir().join(format!("nephele-bert-{}.st", std::process::id()));
        candle_core::safetensors::save(&HashMap::from([("x".to_string(), empty)]), &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let error = CandleBert::load("tiny", &bytes, config).unwrap_err();
        assert!(error.to_string().contains("is missing"), "{error}");
    }

    fn tiny_bert() -> (Vec<u8>, String) {
        tiny_random_bert(7).unwrap()
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        dot / (norm(a) * norm(b)).max(1e-12)
    }

    #[test]
    fn the_int8_file_is_smaller_and_agrees_with_fp32_either_way_it_is_computed() {
        let (safetensors, config) = tiny_bert();
        let gguf = quantize_int8("tiny", &safetensors, &config).unwrap();
        assert!(is_gguf(&gguf));
        let ratio = safetensors.len() as f64 / gguf.len() as f64;
        assert!(ratio >= 3.0, "int8 file only {ratio:.2}x smaller");
        let fp32 = CandleBert::load("tiny", &safetensors, &config).unwrap();
        // Three rows of 8 ids, the last padded.
        let ids: Vec<f32> = [
            [5, 17, 33, 2, 90, 41, 8, 1],
            [60, 61, 62, 63, 64, 65, 66, 67],
            [3, 9, 27, 81, 0, 0, 0, 0],
        ]
        .iter()
        .flatten()
        .map(|&id| id as f32)
        .collect();
        let expected = fp32.embed(3, 8, &ids).unwrap();
        for compute in [Int8Compute::Quantized, Int8Compute::Float] {
            let int8 = CandleBert::load_gguf("tiny", &gguf, compute).unwrap();
            let got = int8.embed(3, 8, &ids).unwrap();
            for row in 0..3 {
                let range = row * 64..(row + 1) * 64;
                let c = cosine(&got[range.clone()], &expected[range]);
                assert!(c >= 0.99, "{compute:?} row {row}: cosine {c}");
            }
        }
    }

    #[test]
    fn a_damaged_int8_file_is_refused_with_the_model_name() {
        let (safetensors, config) = tiny_bert();
        let gguf = quantize_int8("tiny", &safetensors, &config).unwrap();
        for cut in [3, 40, gguf.len() / 2, gguf.len() - 7] {
            let error =
                CandleBert::load_gguf("tiny", &gguf[..cut], Int8Compute::Quantized).unwrap_err();
            assert!(error.to_string().contains("model tiny"), "{error}");
        }
        let error = CandleBert::load_gguf("tiny", &safetensors, Int8Compute::Float).unwrap_err();
        assert!(error.to_string().contains("not a GGUF"), "{error}");
        // A config the file does not match is refused before anything is written.
        let wrong = config.replace("\"vocab_size\": 96", "\"vocab_size\": 97");
        let error = quantize_int8("tiny", &safetensors, &wrong).unwrap_err();
        assert!(error.to_string().contains("word_embeddings"), "{error}");
    }

    #[test]
    fn a_bert_pushed_for_candle_gets_checked_variants_and_serves_through_model() {
        let (safetensors, config) = tiny_bert();
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|r| (0..8).map(|p| ((r * 7 + p * 3) % 95 + 1) as f32).collect())
            .collect();
        let set = crate::variants::build_bert_variants(
            "tiny",
            &safetensors,
            &config,
            8,
            &crate::variants::ValidationSet {
                rows: rows.clone(),
                labels: None,
            },
            &[],
        )
        .unwrap();
        let names: Vec<&str> = set.variants.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["full", "int8"]);
        assert!(set.variants.iter().all(|v| v.rejected.is_none()), "{set:?}");
        let int8 = set.get("int8").unwrap();
        assert!(int8.agreement.unwrap().min_cosine >= 0.99);
        assert!(set.get("full").unwrap().size() > 3 * int8.size());
        // Served through `Model` as an agent loads it: same answers as candle directly.
        let reference = CandleBert::load("tiny", &safetensors, &config).unwrap();
        let full = &set.get("full").unwrap().files[0];
        let model =
            crate::Model::load_shipped("tiny", full, crate::FORMAT_CANDLE_BERT, &[-1, 8]).unwrap();
        assert_eq!(model.backend(), "candle");
        assert_eq!(model.input().shape, vec![-1, 8]);
        let batch: Vec<f32> = rows[..2].iter().flatten().copied().collect();
        let (shape, out) = model.infer(&[2, 8], &batch).unwrap();
        assert_eq!(shape, vec![2, 64]);
        let expected = reference.embed(2, 8, &batch).unwrap();
        for (a, b) in out.iter().zip(&expected) {
            assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
        }
        // Wrong shapes and formats are errors, not panics.
        assert!(model.infer(&[1, 9], &[1.0; 9]).is_err());
        assert!(
            crate::Model::load_shipped("tiny", full, crate::FORMAT_CANDLE_BERT, &[-1]).is_err()
        );
        assert!(crate::Model::load_shipped("tiny", full, "tflite", &[-1, 8]).is_err());
        assert!(crate::Model::load_shipped("tiny", full, crate::FORMAT_ONNX, &[-1, 8]).is_err());
    }
}
