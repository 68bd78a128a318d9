//! Named typed tensors between their request form ([`NamedTensor`]: a type name, a shape
//! and the values as numbers, as JSON carries them) and their wire form
//! ([`TypedTensor`]: the values' little-endian bytes), for offloading a typed model's
//! request and relaying its answer. Pure conversions: every failure names the tensor.

use std::collections::HashMap;

use nephele_proto::{DType, Payload, TypedTensor};
use nephele_runtime::graph_model::NamedTensor;

/// The wire form of one tensor.
pub fn to_wire(name: &str, tensor: &NamedTensor) -> Result<TypedTensor, String> {
    let dtype = DType::parse(&tensor.dtype).ok_or_else(|| {
        format!(
            "tensor {name} has type {}, which the wire does not carry",
            tensor.dtype
        )
    })?;
    let shape = tensor
        .shape
        .iter()
        .map(|d| u32::try_from(*d).map_err(|_| format!("tensor {name} has a dimension of {d}")))
        .collect::<Result<Vec<u32>, String>>()?;
    let mut data = Vec::with_capacity(tensor.data.len() * dtype.size());
    for v in &tensor.data {
        match dtype {
            DType::F32 => data.extend_from_slice(&(*v as f32).to_le_bytes()),
            DType::F16 => data.extend_from_slice(&half::f16::from_f64(*v).to_le_bytes()),
            DType::I64 => data.extend_from_slice(&(*v as i64).to_le_bytes()),
            DType::I32 => data.extend_from_slice(&(*v as i32).to_le_bytes()),
            DType::U8 => data.push(*v as u8),
            DType::Bool => data.push(u8::from(*v != 0.0)),
        }
    }
    let wire = TypedTensor {
        name: name.to_string(),
        dtype,
        shape,
        data,
    };
    wire.validate()?;
    Ok(wire)
}

/// The request form of one tensor from the wire, checked first.
pub fn from_wire(tensor: &TypedTensor) -> Result<NamedTensor, String> {
    tensor.validate()?;
    let size = tensor.dtype.size();
    let data = tensor
        .data
        .chunks_exact(size)
        .map(|b| match tensor.dtype {
            DType::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
            DType::I64 => {
                i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64
            }
            DType::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DType::U8 => f64::from(b[0]),
            DType::Bool => f64::from(u8::from(b[0] != 0)),
        })
        .collect();
    Ok(NamedTensor {
        dtype: tensor.dtype.name().to_string(),
        shape: tensor.shape.iter().map(|d| *d as usize).collect(),
        data,
    })
}

/// A whole request or answer to the wire, tensors in name order (so equal requests
/// encode equally).
pub fn to_payload(tensors: &HashMap<String, NamedTensor>) -> Result<Payload, String> {
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    names
        .into_iter()
        .map(|name| to_wire(name, &tensors[name]))
        .collect::<Result<Vec<_>, String>>()
        .map(Payload::Typed)
}

/// A typed payload from the wire back to tensors by name; a single-tensor payload is
/// refused (the deployment takes named inputs).
pub fn from_payload(payload: &Payload) -> Result<HashMap<String, NamedTensor>, String> {
    payload.validate()?;
    match payload {
        Payload::Typed(tensors) => tensors
            .iter()
            .map(|t| from_wire(t).map(|n| (t.name.clone(), n)))
            .collect(),
        Payload::Tensor(_) => Err(
            "this deployment takes named typed inputs, but the request carries one f32 tensor"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tensor(dtype: &str, shape: Vec<usize>, data: Vec<f64>) -> NamedTensor {
        NamedTensor {
            dtype: dtype.into(),
            shape,
            data,
        }
    }

    #[test]
    fn every_type_crosses_the_wire_and_back() {
        let request: HashMap<String, NamedTensor> = [
            ("a", tensor("f32", vec![2], vec![0.5, -3.25])),
            ("b", tensor("f16", vec![1, 2], vec![1.5, -0.25])),
            ("c", tensor("i64", vec![], vec![16_000.0])),
            ("d", tensor("i32", vec![3], vec![-7.0, 0.0, 2_000_000.0])),
            ("e", tensor("u8", vec![2], vec![0.0, 255.0])),
            ("f", tensor("bool", vec![2], vec![1.0, 0.0])),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let payload = to_payload(&request).unwrap();
        assert_eq!(from_payload(&payload).unwrap(), request);
    }

    #[test]
    fn a_bad_tensor_is_refused_naming_it() {
        let short = Payload::Typed(vec![TypedTensor {
            name: "state".into(),
            dtype: DType::F32,
            shape: vec![2, 128],
            data: vec![0; 12],
        }]);
        let error = from_payload(&short).unwrap_err();
        assert!(
            error.contains("state") && error.contains("1024 bytes"),
            "{error}"
        );
        let unknown = tensor("f64", vec![1], vec![1.0]);
        assert!(to_wire("x", &unknown)
            .unwrap_err()
            .contains("x has type f64"));
        let single = Payload::Tensor(nephele_proto::Tensor {
            shape: vec![1],
            data: vec![1.0],
        });
        assert!(from_payload(&single).is_err());
    }

    proptest! {
        #[test]
        fn f32_and_i32_values_survive_exactly(values in proptest::collection::vec(-1.0e6f32..1.0e6, 0..64), ints in proptest::collection::vec(any::<i32>(), 0..64)) {
            let floats = tensor("f32", vec![values.len()], values.iter().map(|v| f64::from(*v)).collect());
            let back = from_wire(&to_wire("x", &floats).unwrap()).unwrap();
            prop_assert_eq!(back, floats);
            let ints = tensor("i32", vec![ints.len()], ints.iter().map(|v| f64::from(*v)).collect());
            let back = from_wire(&to_wire("y", &ints).unwrap()).unwrap();
            prop_assert_eq!(back, ints);
        }

        #[test]
        fn arbitrary_bytes_never_panic(dtype in 0usize..6, shape in proptest::collection::vec(0u32..5, 0..4), data in proptest::collection::vec(any::<u8>(), 0..80)) {
            let wire = TypedTensor { name: "z".into(), dtype: DType::ALL[dtype], shape, data };
            let _ = from_wire(&wire);
        }
    }
}
