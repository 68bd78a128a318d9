//! The candle backend: a BERT sentence encoder (all-MiniLM-L6-v2 and its family) run
//! from its safetensors weights with `candle-core`, no ONNX involved.
//!
//! Same contract as the ONNX MiniLM the benchmark builds: one f32 input `[N, S]` of
//! token ids (0 = padding), one f32 output `[N, hidden]`, the mean of the last layer
//! over non-padding tokens, L2-normalised (sentence-transformers' pipeline). Token type
//! ids are all 0. Loading checks every tensor's presence and shape against the config,
//! so a truncated or mismatched file is an error naming the tensor, never a panic.
//!
//! Not here: tokenisation (the caller sends ids), other architectures, GPU (candle's
//! CUDA path would sit behind a cargo feature).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, D};

use crate::RuntimeError;

/// The parts of a Hugging Face BERT `config.json` the forward pass needs.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
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

struct Linear {
    /// `[out, in]` as stored (PyTorch layout).
    weight_t: Tensor,
    bias: Tensor,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.broadcast_matmul(&self.weight_t)?
            .broadcast_add(&self.bias)
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
        let load = |cause: String| RuntimeError::Load {
            model: name.to_string(),
            cause,
        };
        let config: BertConfig =
            serde_json::from_str(config_json).map_err(|e| load(format!("config.json: {e}")))?;
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
        let tensors: HashMap<String, Tensor> =
            candle_core::safetensors::load_buffer(safetensors, &device)
                .map_err(|e| load(format!("safetensors: {e}")))?;
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let get = |key: &str, shape: &[usize]| -> Result<Tensor, RuntimeError> {
            let tensor = tensors
                .get(key)
                .ok_or_else(|| load(format!("tensor {key} is missing")))?;
            if tensor.dims() != shape {
                return Err(load(format!(
                    "tensor {key} has shape {:?}, the config needs {shape:?}",
                    tensor.dims()
                )));
            }
            tensor
                .to_dtype(DType::F32)
                .map_err(|e| load(format!("tensor {key}: {e}")))
        };
        let linear = |prefix: &str, out: usize, inp: usize| -> Result<Linear, RuntimeError> {
            Ok(Linear {
                weight_t: get(&format!("{prefix}.weight"), &[out, inp])?
                    .t()
                    .and_then(|t| t.contiguous())
                    .map_err(|e| load(format!("{prefix}: {e}")))?,
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
        let mut token_ids = Vec::with_capacity(ids.len());
        for id in ids {
            if !(id.is_finite() && *id >= 0.0 && id.fract() == 0.0)
                || *id as usize >= self.config.vocab_size
            {
                return Err(bad(format!(
                    "{id} is not a token id of a {}-word vocabulary",
                    self.config.vocab_size
                )));
            }
            token_ids.push(*id as u32);
        }
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
}
