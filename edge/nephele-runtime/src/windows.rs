//! Inputs too small for a convolution's or a pool's window. onnxruntime refuses a
//! request whose input, padding included, is shorter than a `Conv`'s, `MaxPool`'s or
//! `AveragePool`'s window along a spatial axis ("Invalid input shape"); tract answers
//! it with an empty or truncated tensor (a spectrogram of 400 samples through a
//! 512-sample STFT convolution came back as zero frames). A typed model with symbolic
//! sizes keeps, for each such node, its spatial sizes as expressions of the input's
//! names ([`windows`], read once at load), and every request is checked against them
//! before it runs ([`check`]), so it is refused with the node's name as onnxruntime
//! refuses it.

use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::cnn::{Conv, MaxPool, PaddingSpec, PoolSpec, SumPool};

/// One window node: along each spatial axis, its input's size and the least size that
/// gives one output (the window's extent less the padding).
#[derive(Debug, Clone)]
pub struct Window {
    pub node: String,
    pub op: &'static str,
    spatial: Vec<TDim>,
    needed: Vec<i64>,
}

/// The window nodes of `model` (typed, before the declutter, so each keeps its file's
/// name and operator). `SAME` padding never runs short, so it is not kept.
pub fn windows(model: &TypedModel) -> Vec<Window> {
    let mut found = Vec::new();
    for node in model.nodes() {
        let (op, spec): (&'static str, &PoolSpec) = if let Some(conv) = node.op_as::<Conv>() {
            ("Conv", &conv.pool_spec)
        } else if let Some(pool) = node.op_as::<MaxPool>() {
            ("MaxPool", &pool.pool_spec)
        } else if let Some(pool) = node.op_as::<SumPool>() {
            ("AveragePool", &pool.pool_spec)
        } else {
            continue;
        };
        let pads: Vec<usize> = match &spec.padding {
            PaddingSpec::Valid => vec![0; spec.kernel_shape.len()],
            PaddingSpec::Explicit(before, after)
            | PaddingSpec::ExplicitOnnxPool(before, after, _) => {
                before.iter().zip(after).map(|(b, a)| b + a).collect()
            }
            PaddingSpec::SameUpper | PaddingSpec::SameLower => continue,
        };
        let Some(input) = node.inputs.first() else {
            continue;
        };
        let Ok(fact) = model.outlet_fact(*input) else {
            continue;
        };
        let dims: TVec<TDim> = fact.shape.iter().cloned().collect();
        let Ok(shape) = spec.data_format.shape(dims) else {
            continue;
        };
        let spatial: Vec<TDim> = shape.hw_dims().to_vec();
        if spatial.len() != spec.kernel_shape.len() || pads.len() != spatial.len() {
            continue;
        }
        let dilations = spec.dilations();
        let needed = spec
            .kernel_shape
            .iter()
            .zip(dilations.iter())
            .zip(&pads)
            .map(|((k, d), pad)| (d * (k.max(&1) - 1) + 1) as i64 - *pad as i64)
            .collect();
        found.push(Window {
            node: node.name.clone(),
            op,
            spatial,
            needed,
        });
    }
    found
}

/// The first window node a request with these symbol values is too small for, said as
/// onnxruntime's refusal; Ok when every size fits (or cannot be evaluated).
pub fn check(windows: &[Window], values: &SymbolValues) -> Result<(), String> {
    match first_short(windows, values) {
        None => Ok(()),
        Some((window, axis, size)) => Err(format!(
            "the input is too small for node \"{}\" ({}): {size} values along its spatial axis {axis} where its window needs {}; onnxruntime refuses it too (Invalid input shape); send a larger input",
            window.node, window.op, window.needed[axis]
        )),
    }
}

fn first_short<'a>(
    windows: &'a [Window],
    values: &SymbolValues,
) -> Option<(&'a Window, usize, i64)> {
    windows.iter().find_map(|window| {
        window
            .spatial
            .iter()
            .zip(&window.needed)
            .enumerate()
            .find_map(|(axis, (size, needed))| {
                let size = size.eval_to_i64(values).ok()?;
                (size < *needed).then_some((window, axis, size))
            })
    })
}

/// Sizes for the names of a model's inputs that its windows take: 1 each, doubled
/// (within `bounds`) for the names of a window that would run short, until none does.
/// What a load-time run on zeros and its timing use instead of 1.
pub fn example_sizes(
    windows: &[Window],
    scope: &SymbolScope,
    names: &[String],
    bounds: &std::collections::BTreeMap<String, usize>,
) -> std::collections::BTreeMap<String, usize> {
    let mut sizes: std::collections::BTreeMap<String, usize> =
        names.iter().map(|name| (name.clone(), 1)).collect();
    for _ in 0..64 {
        let mut values = SymbolValues::default();
        for (name, size) in &sizes {
            values.set(&scope.sym(name), *size as i64);
        }
        let Some((window, axis, _)) = first_short(windows, &values) else {
            break;
        };
        let mut grew = false;
        for symbol in window.spatial[axis].symbols() {
            if let Some(size) = sizes.get_mut(&symbol.to_string()) {
                let cap = bounds
                    .get(&symbol.to_string())
                    .copied()
                    .unwrap_or(usize::MAX);
                let next = size.saturating_mul(2).min(cap);
                grew |= next > *size;
                *size = next.max(*size);
            }
        }
        if !grew {
            break;
        }
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_graphs::{floats, model, node};
    use tract_onnx::pb::{attribute_proto::AttributeType, AttributeProto, NodeProto};

    /// A 1-D `Conv` named `stft`: a window of 5 at dilation 2 (9 wide), padded by 1 on
    /// each side.
    fn stft() -> NodeProto {
        let mut conv = node("Conv", &["x", "w"], "stft");
        for (name, values) in [
            ("kernel_shape", &[5][..]),
            ("dilations", &[2]),
            ("pads", &[1, 1]),
        ] {
            conv.attribute.push(AttributeProto {
                name: name.into(),
                r#type: AttributeType::Ints as i32,
                ints: values.to_vec(),
                ..AttributeProto::default()
            });
        }
        conv
    }
    use prost::Message;

    /// A 1-D convolution with a window of 5 (dilation 2: 9 wide, padded by 2 in all)
    /// over `[1, 1, L]`, L symbolic.
    fn conv1d() -> TypedModel {
        let conv = stft();
        let bytes = model(
            &[1, 1, 9],
            vec![conv],
            vec![floats("w", &[2, 1, 5], &[0.1; 10])],
            &["stft"],
        )
        .encode_to_vec();
        let read = crate::onnx_reader()
            .model_for_read(&mut &bytes[..])
            .expect("reads");
        let length = read.symbols.sym("L");
        let dims: [TDim; 3] = [1.into(), 1.into(), length.into()];
        read.with_input_fact(0, f32::fact(dims).into())
            .and_then(|m| m.into_typed())
            .expect("types")
    }

    #[test]
    fn a_request_shorter_than_a_window_is_refused_with_the_node() {
        let typed = conv1d();
        let found = windows(&typed);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].node.as_str(), found[0].op), ("stft", "Conv"));
        let length = typed.symbols.sym("L");
        // 9 wide less 2 of padding: 7 values give one output, 6 none.
        assert_eq!(
            check(&found, &SymbolValues::default().with(&length, 7)),
            Ok(())
        );
        let error = check(&found, &SymbolValues::default().with(&length, 6)).unwrap_err();
        assert!(
            error.starts_with("the input is too small for node \"stft\" (Conv): 6 values along its spatial axis 0 where its window needs 7"),
            "{error}"
        );
        // Unknown values are not judged here.
        assert_eq!(check(&found, &SymbolValues::default()), Ok(()));
        // A run on zeros at load takes the least power of two that fits, within bounds.
        let names = ["L".to_string()];
        let sizes = example_sizes(&found, &typed.symbols, &names, &Default::default());
        assert_eq!(sizes["L"], 8);
        let bounded = example_sizes(
            &found,
            &typed.symbols,
            &names,
            &[("L".to_string(), 5)].into(),
        );
        assert_eq!(bounded["L"], 5);
    }

    #[test]
    fn a_typed_model_refuses_a_request_too_short_for_its_convolution() {
        use crate::graph_model::{GraphModel, NamedTensor};
        use tract_onnx::pb::tensor_shape_proto::dimension::Value;
        use tract_onnx::pb::type_proto;
        let conv = stft();
        let mut file = model(
            &[1, 1, 9],
            vec![conv],
            vec![floats("w", &[2, 1, 5], &[0.1; 10])],
            &["stft"],
        );
        let input = &mut file.graph.as_mut().expect("graph").input[0];
        if let Some(type_proto::Value::TensorType(tensor)) =
            input.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            tensor.shape.as_mut().expect("shape").dim[2].value = Some(Value::DimParam("L".into()));
        }
        let loaded = GraphModel::load("mel", &file.encode_to_vec()).expect("loads");
        let request = |length: usize| {
            std::collections::HashMap::from([(
                "x".to_string(),
                NamedTensor {
                    dtype: "f32".into(),
                    shape: vec![1, 1, length],
                    data: vec![0.5; length],
                },
            )])
        };
        let answer = loaded.run(&request(7)).expect("7 values give one output");
        assert_eq!(answer["stft"].shape, [1, 2, 1]);
        let error = loaded
            .run(&request(6))
            .expect_err("6 values give none")
            .to_string();
        assert!(
            error.contains("too small for node \"stft\" (Conv): 6 values"),
            "{error}"
        );
    }
}
