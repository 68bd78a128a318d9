//! The binary form of inference requests and answers, for tensors too large to send
//! as JSON numbers (as Triton's binary tensor extension does): the request carries an
//! `Inference-Header-Content-Length: N` header; its first N bytes are a JSON header and
//! the rest is the tensors' values, little-endian in their own type, one after another
//! in the order the header lists them.
//!
//! - a typed model: `{"inputs": [{"name", "dtype", "shape", "binary_data_size"}, …],
//!   "session", "end", "binary_outputs"}` (an input may carry `"data"` instead);
//! - a single-tensor model: `{"shape": [1, N], "binary_data_size": 4·N,
//!   "binary_outputs"}` (f32).
//!
//! With `"binary_outputs": true` the answer has the same form: a JSON header (the
//! outputs as a list with their `binary_data_size`, plus `computed_by`, `where`, …),
//! then the values, and `Inference-Header-Content-Length` says where the header ends.
//! Pure parsing and encoding: every error says which tensor and what is wrong.

use std::collections::HashMap;

use nephele_proto::{DType, TypedTensor};
use nephele_runtime::graph_model::NamedTensor;
use serde::Deserialize;

/// The request header that marks a binary body and gives its JSON header's length.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// One input of a binary typed request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BinaryInput {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    #[serde(default)]
    pub data: Option<Vec<f64>>,
    #[serde(default)]
    pub binary_data_size: Option<usize>,
}

/// The JSON header of a binary typed request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypedHeader {
    pub inputs: Vec<BinaryInput>,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub end: bool,
    #[serde(default)]
    pub binary_outputs: bool,
}

/// The JSON header of a binary single-tensor request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SingleHeader {
    pub shape: Vec<u32>,
    pub binary_data_size: usize,
    #[serde(default)]
    pub binary_outputs: bool,
}

/// A binary request split into its JSON header and its data.
pub enum BinaryRequest {
    Typed {
        header: TypedHeader,
        inputs: HashMap<String, NamedTensor>,
    },
    Single {
        header: SingleHeader,
        data: Vec<f32>,
    },
}

/// Splits and decodes a body whose JSON header is `header_length` bytes (the value of
/// [`HEADER_LENGTH`]).
pub fn parse(header_length: &str, body: &[u8]) -> Result<BinaryRequest, String> {
    let length: usize = header_length.trim().parse().map_err(|_| {
        format!("{HEADER_LENGTH} must be the JSON header's length in bytes, not {header_length:?}")
    })?;
    if length > body.len() {
        return Err(format!(
            "{HEADER_LENGTH} says {length} bytes of JSON but the body has {}",
            body.len()
        ));
    }
    let (json, data) = body.split_at(length);
    let value: serde_json::Value = serde_json::from_slice(json)
        .map_err(|e| format!("the binary request's JSON header is invalid: {e}"))?;
    if value.get("inputs").is_some() {
        let header: TypedHeader = serde_json::from_value(value).map_err(|e| {
            format!("invalid binary typed request: {e}; expected {{\"inputs\": [{{\"name\", \"dtype\", \"shape\", \"binary_data_size\"}}, …]}}")
        })?;
        let inputs = typed_inputs(&header.inputs, data)?;
        Ok(BinaryRequest::Typed { header, inputs })
    } else {
        let header: SingleHeader = serde_json::from_value(value).map_err(|e| {
            format!("invalid binary request: {e}; expected {{\"shape\": [1, N], \"binary_data_size\": 4·N}}")
        })?;
        if header.binary_data_size != data.len() {
            return Err(format!(
                "binary_data_size is {} but {} bytes follow the header",
                header.binary_data_size,
                data.len()
            ));
        }
        if data.len() % 4 != 0 {
            return Err(format!(
                "{} bytes is not a whole number of f32 values",
                data.len()
            ));
        }
        let values = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(BinaryRequest::Single {
            header,
            data: values,
        })
    }
}

/// The inputs of a typed request, each from its JSON `data` or its slice of `data`.
fn typed_inputs(
    inputs: &[BinaryInput],
    mut data: &[u8],
) -> Result<HashMap<String, NamedTensor>, String> {
    let mut out = HashMap::with_capacity(inputs.len());
    for input in inputs {
        let tensor = match (&input.data, input.binary_data_size) {
            (Some(values), None) => NamedTensor {
                dtype: input.dtype.clone(),
                shape: input.shape.clone(),
                data: values.clone(),
            },
            (None, Some(size)) => {
                if size > data.len() {
                    return Err(format!(
                        "input {}: binary_data_size {size} but only {} bytes are left",
                        input.name,
                        data.len()
                    ));
                }
                let (mine, rest) = data.split_at(size);
                data = rest;
                let dtype = DType::parse(&input.dtype).ok_or_else(|| {
                    format!(
                        "input {} has type {}; use f32, f16, i64, i32, u8 or bool",
                        input.name, input.dtype
                    )
                })?;
                let shape = input
                    .shape
                    .iter()
                    .map(|d| {
                        u32::try_from(*d).map_err(|_| {
                            format!("input {}: dimension {d} is too large", input.name)
                        })
                    })
                    .collect::<Result<Vec<u32>, String>>()?;
                crate::typed_wire::from_wire(&TypedTensor {
                    name: input.name.clone(),
                    dtype,
                    shape,
                    data: mine.to_vec(),
                })?
            }
            _ => {
                return Err(format!(
                    "input {} needs either \"data\" or \"binary_data_size\", not both or neither",
                    input.name
                ))
            }
        };
        if out.insert(input.name.clone(), tensor).is_some() {
            return Err(format!("input {} is given twice", input.name));
        }
    }
    if !data.is_empty() {
        return Err(format!(
            "{} bytes follow the last input's data; binary_data_size must add up to the body",
            data.len()
        ));
    }
    Ok(out)
}

/// A binary answer: the JSON header `meta` with `outputs` (name order) added as a list
/// with their sizes, then their values. Returns the body and the header's length.
pub fn encode_typed(
    outputs: &HashMap<String, NamedTensor>,
    mut meta: serde_json::Map<String, serde_json::Value>,
) -> Result<(Vec<u8>, usize), String> {
    let mut names: Vec<&String> = outputs.keys().collect();
    names.sort();
    let mut listed = Vec::with_capacity(names.len());
    let mut data = Vec::new();
    for name in names {
        let wire = crate::typed_wire::to_wire(name, &outputs[name])?;
        listed.push(serde_json::json!({
            "name": name,
            "dtype": wire.dtype.name(),
            "shape": wire.shape,
            "binary_data_size": wire.data.len(),
        }));
        data.extend_from_slice(&wire.data);
    }
    meta.insert("outputs".into(), serde_json::Value::Array(listed));
    Ok(join(meta, data))
}

/// A binary answer of one f32 tensor: `meta` with `shape` and `binary_data_size`.
pub fn encode_single(
    shape: &[u32],
    values: &[f32],
    mut meta: serde_json::Map<String, serde_json::Value>,
) -> (Vec<u8>, usize) {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    meta.insert("shape".into(), serde_json::json!(shape));
    meta.insert("binary_data_size".into(), serde_json::json!(data.len()));
    join(meta, data)
}

fn join(meta: serde_json::Map<String, serde_json::Value>, data: Vec<u8>) -> (Vec<u8>, usize) {
    let mut body = serde_json::to_vec(&serde_json::Value::Object(meta)).unwrap_or_default();
    let header = body.len();
    body.extend_from_slice(&data);
    (body, header)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body(header: serde_json::Value, data: &[u8]) -> (String, Vec<u8>) {
        let mut bytes = serde_json::to_vec(&header).unwrap();
        let length = bytes.len().to_string();
        bytes.extend_from_slice(data);
        (length, bytes)
    }

    #[test]
    fn a_typed_request_takes_its_inputs_in_order_and_json_data_mixed_in() {
        let mut data: Vec<u8> = [1i64, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        data.extend([0.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()));
        let (length, bytes) = body(
            serde_json::json!({"inputs": [
                {"name": "ids", "dtype": "i64", "shape": [1, 3], "binary_data_size": 24},
                {"name": "sr", "dtype": "i64", "shape": [], "data": [16000]},
                {"name": "x", "dtype": "f32", "shape": [2], "binary_data_size": 8},
            ], "session": "s1", "binary_outputs": true}),
            &data,
        );
        let Ok(BinaryRequest::Typed { header, inputs }) = parse(&length, &bytes) else {
            panic!("parsed");
        };
        assert!(header.binary_outputs);
        assert_eq!(header.session.as_deref(), Some("s1"));
        assert_eq!(inputs["ids"].data, vec![1.0, 2.0, 3.0]);
        assert_eq!(inputs["sr"].data, vec![16000.0]);
        assert_eq!(inputs["x"].data, vec![0.5, -2.0]);
    }

    #[test]
    fn sizes_that_do_not_add_up_are_refused_saying_so() {
        let cases = [
            (
                serde_json::json!({"inputs": [{"name": "x", "dtype": "f32", "shape": [2], "binary_data_size": 12}]}),
                8,
                "only 8 bytes",
            ),
            (
                serde_json::json!({"inputs": [{"name": "x", "dtype": "f32", "shape": [2], "binary_data_size": 4}]}),
                8,
                "needs 8 bytes",
            ),
            (
                serde_json::json!({"inputs": [{"name": "x", "dtype": "f32", "shape": [1], "binary_data_size": 4}]}),
                8,
                "4 bytes follow",
            ),
            (
                serde_json::json!({"inputs": [{"name": "x", "dtype": "f32", "shape": [1]}]}),
                0,
                "either",
            ),
            (
                serde_json::json!({"shape": [1, 2], "binary_data_size": 8}),
                4,
                "4 bytes follow the header",
            ),
        ];
        for (header, n, says) in cases {
            let (length, bytes) = body(header.clone(), &vec![0u8; n]);
            let error = parse(&length, &bytes).err().unwrap_or_default();
            assert!(error.contains(says), "{header} → {error}");
        }
        assert!(parse("99", b"{}")
            .err()
            .unwrap_or_default()
            .contains("99 bytes"));
        assert!(parse("x", b"{}")
            .err()
            .unwrap_or_default()
            .contains("length"));
    }

    #[test]
    fn an_answer_decodes_back_to_its_outputs() {
        let outputs = HashMap::from([(
            "y".to_string(),
            NamedTensor {
                dtype: "f32".into(),
                shape: vec![2],
                data: vec![1.5, -3.0],
            },
        )]);
        let (bytes, header) = encode_typed(&outputs, serde_json::Map::new()).unwrap();
        let meta: serde_json::Value = serde_json::from_slice(&bytes[..header]).unwrap();
        assert_eq!(meta["outputs"][0]["binary_data_size"], 8);
        let values: Vec<f32> = bytes[header..]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(values, vec![1.5, -3.0]);
        let (bytes, header) = encode_single(&[1, 2], &[0.25, 4.0], serde_json::Map::new());
        assert_eq!(bytes.len() - header, 8);
    }

    proptest! {
        #[test]
        fn any_body_gives_a_request_or_an_error(length in 0usize..64, bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = parse(&length.to_string(), &bytes);
        }
    }
}
