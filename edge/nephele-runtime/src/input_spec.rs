//! Input shapes, types and fixed values given at push (`--input NAME=DIMS[:DTYPE][=VALUE]`),
//! applied to the ONNX file by the control plane so nobody edits an exported model by
//! hand, and [`inspect`], which says what a file needs before it is pushed.
//!
//! | spec                     | means                                                        |
//! |--------------------------|--------------------------------------------------------------|
//! | `x=N,3,48,320`           | input `x` has shape [N, 3, 48, 320]; `N` stays symbolic       |
//! | `bytes=1,2048:i32`       | input `bytes` is [1, 2048] of int32 (checked against the file)|
//! | `sr=scalar:i64=16000`    | rank-0 int64 input folded into the model as the constant 16000|
//! | `input_ids=1,S..512:i64` | `S` symbolic, at most 512 in a request                        |
//!
//! DIMS are comma-separated sizes or names (a name is a symbolic dimension), or `scalar`.
//! A name is any run of characters with a letter or `_` in it, without whitespace, `..` or
//! any of `, : = < > ( ) + * /`: exporters' own names (`batch_size`, `N`, `unk__123`,
//! `DynamicDimension.0`, `height-px`) are taken as they are ([`onnx_symbol`] says how one
//! is written into the file). `-1` (or `?`) is a symbolic dimension without a name of
//! the caller's: the file's own name for that axis, or `INPUT_AXIS` where it has none.
//! `NAME..MAX` bounds a name (as OpenVINO's `1..512` ranges do), which the control plane
//! writes into the file's metadata ([`MAX_DIM_KEY`]) and the device checks per request,
//! so a request cannot make the model allocate without limit (attention over a
//! sequence grows with its square).
//! DTYPE is one of f32, f16, i64, i32, u8, bool. VALUE is one number, which fills the
//! tensor, or as many comma-separated numbers as the tensor has elements; it needs every
//! dimension given as a size.

use std::fmt;
use std::str::FromStr;

use prost::Message;
use tract_onnx::pb::{
    tensor_proto::DataType, tensor_shape_proto, type_proto, ModelProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, ValueInfoProto,
};
use tract_onnx::prelude::Framework;

use crate::RuntimeError;

/// Metadata key prefix (ONNX `metadata_props`) of a symbolic dimension's bound:
/// `nephele.max_dim.S` = `512`.
pub const MAX_DIM_KEY: &str = "nephele.max_dim.";

/// One dimension of an input spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Size(u64),
    Symbol(String),
    /// `-1` or `?`: symbolic, named by the file (or `INPUT_AXIS` where it names none).
    Dynamic,
}

/// Characters a dimension name may not hold (besides whitespace): the spec's own
/// separators, the placeholders' brackets, and what would make it an expression.
const NOT_IN_NAMES: &[char] = &[',', ':', '=', '<', '>', '(', ')', '+', '*', '/', '"', '\''];

/// One dimension of a spec's DIMS, or why it is none.
fn parse_dim(d: &str) -> Result<Dim, String> {
    if d.is_empty() {
        return Err("an empty dimension".into());
    }
    if d == "-1" || d == "?" {
        return Ok(Dim::Dynamic);
    }
    if let Ok(size) = d.parse::<u64>() {
        return if size == 0 {
            Err("a dimension of 0".into())
        } else {
            Ok(Dim::Size(size))
        };
    }
    if d.parse::<i64>().is_ok() {
        return Err(format!(
            "dimension {d:?} is negative; -1 (or ?) leaves a dimension symbolic"
        ));
    }
    if d.starts_with('<') && d.ends_with('>') {
        return Err(format!(
            "{d} is a placeholder: put a size or a name in its place"
        ));
    }
    let has_letter = d.chars().any(|c| c.is_alphabetic() || c == '_');
    let odd = d
        .chars()
        .find(|c| c.is_whitespace() || NOT_IN_NAMES.contains(c));
    if !has_letter || odd.is_some() || d.contains("..") {
        return Err(format!(
            "dimension {d:?} is neither a size nor a name (a name has a letter or _ in it, and no whitespace, .. or any of , : = < > ( ) + * /), nor -1"
        ));
    }
    Ok(Dim::Symbol(d.to_string()))
}

/// How a dimension name is written into the file (its `dim_param`). tract reads a
/// `dim_param` as an expression over identifiers (`[A-Za-z_][A-Za-z0-9_.]*`), so
/// `height-px` would be `height - px` there: every other character becomes `_`, and a
/// name that does not start with a letter or `_` gets a leading `_` (`3d` → `_3d`).
/// Names that are identifiers already (`N`, `batch_size`, `unk__123`,
/// `DynamicDimension.0`) are written as they are. The runtime, its errors and a bound's
/// metadata key then use this form.
pub fn onnx_symbol(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        out.insert(0, '_');
    }
    out
}

/// Element types an input spec may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemType {
    F32,
    F16,
    I64,
    I32,
    U8,
    Bool,
}

impl ElemType {
    pub const ALL: [ElemType; 6] = [
        ElemType::F32,
        ElemType::F16,
        ElemType::I64,
        ElemType::I32,
        ElemType::U8,
        ElemType::Bool,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ElemType::F32 => "f32",
            ElemType::F16 => "f16",
            ElemType::I64 => "i64",
            ElemType::I32 => "i32",
            ElemType::U8 => "u8",
            ElemType::Bool => "bool",
        }
    }

    fn onnx(self) -> DataType {
        match self {
            ElemType::F32 => DataType::Float,
            ElemType::F16 => DataType::Float16,
            ElemType::I64 => DataType::Int64,
            ElemType::I32 => DataType::Int32,
            ElemType::U8 => DataType::Uint8,
            ElemType::Bool => DataType::Bool,
        }
    }

    fn from_onnx(code: i32) -> Option<ElemType> {
        ElemType::ALL.into_iter().find(|t| t.onnx() as i32 == code)
    }

    /// Little-endian bytes of `value` in this type, or why it does not fit.
    fn encode(self, value: f64, out: &mut Vec<u8>) -> Result<(), String> {
        let integral = |lo: f64, hi: f64| {
            if value.fract() != 0.0 || value < lo || value > hi {
                Err(format!("{value} is not a {}", self.as_str()))
            } else {
                Ok(())
            }
        };
        match self {
            ElemType::F32 => out.extend_from_slice(&(value as f32).to_le_bytes()),
            ElemType::F16 => out.extend_from_slice(
                &tract_onnx::prelude::f16::from_f64(value)
                    .to_bits()
                    .to_le_bytes(),
            ),
            ElemType::I64 => {
                integral(-9.007_199_254_740_992e15, 9.007_199_254_740_992e15)?;
                out.extend_from_slice(&(value as i64).to_le_bytes())
            }
            ElemType::I32 => {
                integral(i32::MIN as f64, i32::MAX as f64)?;
                out.extend_from_slice(&(value as i32).to_le_bytes())
            }
            ElemType::U8 => {
                integral(0.0, 255.0)?;
                out.push(value as u8)
            }
            ElemType::Bool => {
                integral(0.0, 1.0)?;
                out.push(value as u8)
            }
        }
        Ok(())
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name ONNX element type `code` goes by in specs, or its ONNX name.
pub fn onnx_type_name(code: i32) -> String {
    match ElemType::from_onnx(code) {
        Some(t) => t.as_str().to_string(),
        None => DataType::try_from(code)
            .map(|t| t.as_str_name().to_ascii_lowercase())
            .unwrap_or_else(|_| format!("type {code}")),
    }
}

/// One `--input NAME=DIMS[:DTYPE][=VALUE]`.
#[derive(Debug, Clone, PartialEq)]
pub struct InputSpec {
    pub name: String,
    /// Empty for a rank-0 tensor (`scalar`).
    pub dims: Vec<Dim>,
    pub dtype: Option<ElemType>,
    /// Folded into the model as a constant.
    pub value: Option<Vec<f64>>,
    /// Upper bounds of this spec's symbolic dimensions (`S..512`).
    pub max: std::collections::BTreeMap<String, u64>,
}

const SPEC_FORM: &str =
    "NAME=DIMS[:DTYPE][=VALUE], e.g. x=N,3,48,320, ids=1,S..512:i64 or sr=scalar:i64=16000";

impl FromStr for InputSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: String| format!("--input {text:?}: {why} (the form is {SPEC_FORM})");
        let (name, rest) = text
            .split_once('=')
            .ok_or_else(|| bad("no '=' after the input name".into()))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(bad("the input name is empty".into()));
        }
        let (shape_part, value_part) = match rest.split_once('=') {
            Some((shape, value)) => (shape, Some(value)),
            None => (rest, None),
        };
        let (dims_part, dtype_part) = match shape_part.split_once(':') {
            Some((dims, dtype)) => (dims, Some(dtype)),
            None => (shape_part, None),
        };
        let dims_part = dims_part.trim();
        let mut max = std::collections::BTreeMap::new();
        let dims = if dims_part == "scalar" {
            Vec::new()
        } else {
            dims_part
                .split(',')
                .map(|d| {
                    let d = d.trim();
                    // The last `..`: a name may end with a dot (`a...8` is `a.` at most 8).
                    match d.rsplit_once("..") {
                        None => parse_dim(d).map_err(bad),
                        Some((symbol, bound)) => {
                            let symbol = symbol.trim();
                            let bound = bound.trim().parse::<u64>().ok().filter(|b| *b > 0).ok_or_else(|| {
                                bad(format!("the bound in {d:?} is not a size above 0 (e.g. S..512)"))
                            })?;
                            match parse_dim(symbol).map_err(bad)? {
                                Dim::Symbol(name) => {
                                    if max.insert(name.clone(), bound).is_some_and(|b| b != bound) {
                                        return Err(bad(format!("{name} is given two bounds")));
                                    }
                                    Ok(Dim::Symbol(name))
                                }
                                _ => Err(bad(format!(
                                    "{d:?} bounds a size or -1; only a named dimension takes a bound (e.g. S..512)"
                                ))),
                            }
                        }
                    }
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        let dtype = match dtype_part.map(str::trim) {
            None => None,
            Some(t) => Some(
                ElemType::ALL
                    .into_iter()
                    .find(|e| e.as_str() == t)
                    .ok_or_else(|| {
                        bad(format!(
                            "unknown type {t:?}; use one of f32, f16, i64, i32, u8, bool"
                        ))
                    })?,
            ),
        };
        let value = match value_part {
            None => None,
            Some(v) => {
                if dims.iter().any(|d| !matches!(d, Dim::Size(_))) {
                    return Err(bad(
                        "a fixed value needs every dimension as a size, not a name or -1".into(),
                    ));
                }
                let numbers = v
                    .split(',')
                    .map(|n| {
                        let n = n.trim();
                        match n {
                            "true" => Ok(1.0),
                            "false" => Ok(0.0),
                            _ => n
                                .parse::<f64>()
                                .ok()
                                .filter(|x| x.is_finite())
                                .ok_or_else(|| bad(format!("value {n:?} is not a number"))),
                        }
                    })
                    .collect::<Result<Vec<f64>, _>>()?;
                let elements: u64 = dims
                    .iter()
                    .map(|d| match d {
                        Dim::Size(s) => *s,
                        Dim::Symbol(_) | Dim::Dynamic => 1,
                    })
                    .product();
                if numbers.len() != 1 && numbers.len() as u64 != elements {
                    return Err(bad(format!(
                        "{} values for a tensor of {elements} elements; give one (it fills the tensor) or {elements}",
                        numbers.len()
                    )));
                }
                if elements > (1 << 20) {
                    return Err(bad(format!(
                        "a fixed value of {elements} elements; at most 1048576 can be folded in"
                    )));
                }
                Some(numbers)
            }
        };
        Ok(InputSpec {
            name: name.to_string(),
            dims,
            dtype,
            value,
            max,
        })
    }
}

impl fmt::Display for InputSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=", self.name)?;
        if self.dims.is_empty() {
            f.write_str("scalar")?;
        }
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match d {
                Dim::Size(s) => write!(f, "{s}")?,
                Dim::Symbol(s) => match self.max.get(s) {
                    Some(bound) => write!(f, "{s}..{bound}")?,
                    None => f.write_str(s)?,
                },
                Dim::Dynamic => f.write_str("-1")?,
            }
        }
        if let Some(t) = self.dtype {
            write!(f, ":{t}")?;
        }
        if let Some(values) = &self.value {
            let text: Vec<String> = values.iter().map(|v| v.to_string()).collect();
            write!(f, "={}", text.join(","))?;
        }
        Ok(())
    }
}

fn decode(name: &str, bytes: &[u8]) -> Result<ModelProto, RuntimeError> {
    ModelProto::decode(bytes).map_err(|e| RuntimeError::Load {
        model: name.to_string(),
        cause: format!("not an ONNX protobuf: {e}"),
    })
}

/// Bounds of symbolic dimensions written in a file's metadata (`S` → 512).
pub fn max_dims(model: &ModelProto) -> std::collections::BTreeMap<String, u64> {
    model
        .metadata_props
        .iter()
        .filter_map(|entry| {
            let symbol = entry.key.strip_prefix(MAX_DIM_KEY)?;
            Some((symbol.to_string(), entry.value.trim().parse().ok()?))
        })
        .collect()
}

/// The graph inputs that are not initializers (what a caller feeds).
fn real_inputs(model: &ModelProto) -> Vec<&ValueInfoProto> {
    let Some(graph) = model.graph.as_ref() else {
        return Vec::new();
    };
    graph
        .input
        .iter()
        .filter(|i| !graph.initializer.iter().any(|t| t.name == i.name))
        .collect()
}

fn tensor_type(info: &ValueInfoProto) -> Option<&type_proto::Tensor> {
    let type_proto::Value::TensorType(t) = info.r#type.as_ref()?.value.as_ref()?;
    Some(t)
}

fn dim_text(dim: &tensor_shape_proto::Dimension) -> String {
    match &dim.value {
        // A negative size (paddle2onnx writes -1) is unknown, as tract reads it.
        Some(tensor_shape_proto::dimension::Value::DimValue(v)) if *v >= 0 => v.to_string(),
        Some(tensor_shape_proto::dimension::Value::DimParam(p)) if !p.is_empty() => p.clone(),
        _ => "?".into(),
    }
}

/// Checks that `bytes` is an ONNX protobuf with a graph and applies `specs` to it; the
/// file comes back unchanged (the same bytes, borrowed, not copied: an upload of
/// hundreds of MiB is held once) when there are none and it has no `If` to fold.
pub fn prepare<'a>(
    name: &str,
    bytes: &'a [u8],
    specs: &[InputSpec],
) -> Result<std::borrow::Cow<'a, [u8]>, RuntimeError> {
    use std::borrow::Cow;
    if specs.is_empty() {
        let model = decode(name, bytes)?;
        if model.graph.as_ref().is_none_or(|g| g.node.is_empty()) {
            return Err(RuntimeError::Load {
                model: name.to_string(),
                cause: "the ONNX file has no graph (or an empty one)".into(),
            });
        }
        // `If`s decided by the file's own fixed shapes are folded too; a file without
        // any comes back byte for byte.
        if crate::fold_if::has_if(&model) {
            let mut model = model;
            if crate::fold_if::fold_constant_ifs(&mut model).folded > 0 {
                return Ok(Cow::Owned(model.encode_to_vec()));
            }
        }
        return Ok(Cow::Borrowed(bytes));
    }
    apply(name, bytes, specs).map(Cow::Owned)
}

/// Applies `specs` to an ONNX file: shapes and types of the named inputs are set, and
/// inputs with a value become constants of the model. Every spec must name a real input
/// of the file; a type that differs from the file's is refused (nothing is cast).
pub fn apply(name: &str, bytes: &[u8], specs: &[InputSpec]) -> Result<Vec<u8>, RuntimeError> {
    if specs.is_empty() {
        return Ok(bytes.to_vec());
    }
    let unsupported = |cause: String| RuntimeError::Unsupported {
        model: name.to_string(),
        cause,
    };
    let mut model = decode(name, bytes)?;
    let names: Vec<String> = real_inputs(&model).iter().map(|i| i.name.clone()).collect();
    let graph = model.graph.as_mut().ok_or_else(|| RuntimeError::Load {
        model: name.to_string(),
        cause: "the ONNX file has no graph".into(),
    })?;
    // Each `dim_param` written, with what it was written for (a name as given, or a
    // `-1`): two different names must not become one symbol in the file.
    let mut written: std::collections::HashMap<String, String> = Default::default();
    for (i, spec) in specs.iter().enumerate() {
        if specs[..i].iter().any(|s| s.name == spec.name) {
            return Err(unsupported(format!("--input {} is given twice", spec.name)));
        }
        if !names.contains(&spec.name) {
            return Err(unsupported(format!(
                "--input {}: the model has no input {:?}; its inputs are {}",
                spec.name,
                spec.name,
                names.join(", ")
            )));
        }
        let Some(position) = graph.input.iter().position(|i| i.name == spec.name) else {
            continue;
        };
        let declared = tensor_type(&graph.input[position]).cloned();
        let declared_code = declared.as_ref().map(|t| t.elem_type).unwrap_or(0);
        let elem = match (spec.dtype, ElemType::from_onnx(declared_code)) {
            (Some(given), Some(file)) if given != file => {
                return Err(unsupported(format!(
                    "--input {spec}: the model's input {} is {file}, not {given}; give :{file} or leave the type out",
                    spec.name
                )))
            }
            (Some(given), _) => given,
            (None, Some(file)) => file,
            (None, None) => {
                return Err(unsupported(format!(
                    "--input {spec}: the model's input {} is {}; give its type (:f32, :i64, …) if it is one of f32, f16, i64, i32, u8, bool",
                    spec.name,
                    onnx_type_name(declared_code)
                )))
            }
        };
        if let Some(shape) = declared.as_ref().and_then(|t| t.shape.as_ref()) {
            if !shape.dim.is_empty() && shape.dim.len() != spec.dims.len() {
                let dims: Vec<String> = shape.dim.iter().map(dim_text).collect();
                return Err(unsupported(format!(
                    "--input {spec}: the model's input {} has rank {} ([{}]); give {} dimensions",
                    spec.name,
                    shape.dim.len(),
                    dims.join(","),
                    shape.dim.len()
                )));
            }
        }
        match &spec.value {
            Some(values) => {
                let count: u64 = spec
                    .dims
                    .iter()
                    .map(|d| match d {
                        Dim::Size(s) => *s,
                        Dim::Symbol(_) | Dim::Dynamic => 1,
                    })
                    .product();
                let mut raw = Vec::new();
                for k in 0..count as usize {
                    let v = if values.len() == 1 {
                        values[0]
                    } else {
                        values[k]
                    };
                    elem.encode(v, &mut raw)
                        .map_err(|why| unsupported(format!("--input {spec}: {why}")))?;
                }
                graph.input.remove(position);
                graph.initializer.push(TensorProto {
                    name: spec.name.clone(),
                    data_type: elem.onnx() as i32,
                    dims: spec
                        .dims
                        .iter()
                        .map(|d| match d {
                            Dim::Size(s) => *s as i64,
                            Dim::Symbol(_) | Dim::Dynamic => 1,
                        })
                        .collect(),
                    raw_data: raw,
                    ..Default::default()
                });
            }
            None => {
                let file_dims: Vec<tensor_shape_proto::Dimension> = declared
                    .as_ref()
                    .and_then(|t| t.shape.as_ref())
                    .map(|shape| shape.dim.clone())
                    .unwrap_or_default();
                let mut dims = Vec::with_capacity(spec.dims.len());
                for (axis, d) in spec.dims.iter().enumerate() {
                    let (param, source) = match d {
                        Dim::Size(s) => {
                            dims.push(tensor_shape_proto::Dimension {
                                value: Some(tensor_shape_proto::dimension::Value::DimValue(
                                    *s as i64,
                                )),
                                ..Default::default()
                            });
                            continue;
                        }
                        Dim::Symbol(given) => (onnx_symbol(given), given.clone()),
                        // The file's own name for the axis where it has one tract reads
                        // as a name, else one of its own.
                        Dim::Dynamic => match file_dims.get(axis).and_then(|f| f.value.as_ref()) {
                            Some(tensor_shape_proto::dimension::Value::DimParam(p))
                                if !p.is_empty() && onnx_symbol(p) == *p =>
                            {
                                (p.clone(), p.clone())
                            }
                            _ => (
                                onnx_symbol(&format!("{}_{axis}", spec.name)),
                                format!("-1 at axis {axis} of {}", spec.name),
                            ),
                        },
                    };
                    match written.get(&param) {
                        Some(other) if *other != source => {
                            return Err(unsupported(format!(
                                "--input {spec}: {source} and {other} would both be the dimension {param} of the file (names are written with characters other than letters, digits, _ and . as _); rename one"
                            )))
                        }
                        Some(_) => {}
                        None => {
                            written.insert(param.clone(), source);
                        }
                    }
                    dims.push(tensor_shape_proto::Dimension {
                        value: Some(tensor_shape_proto::dimension::Value::DimParam(param)),
                        ..Default::default()
                    });
                }
                let shape = TensorShapeProto { dim: dims };
                graph.input[position].r#type = Some(tract_onnx::pb::TypeProto {
                    value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                        elem_type: elem.onnx() as i32,
                        shape: Some(shape),
                    })),
                    ..Default::default()
                });
            }
        }
    }
    // Bounds of symbolic dimensions travel in the file's metadata (signed with it).
    // Keyed as the symbol is written in the file, which is what the runtime reads.
    let mut bounds: std::collections::BTreeMap<String, u64> = Default::default();
    for spec in specs {
        for (symbol, bound) in &spec.max {
            if let Some(other) = bounds
                .insert(onnx_symbol(symbol), *bound)
                .filter(|b| b != bound)
            {
                return Err(unsupported(format!(
                    "{symbol} is bounded twice, ..{other} and ..{bound}; give one bound"
                )));
            }
        }
    }
    for (symbol, bound) in bounds {
        let key = format!("{MAX_DIM_KEY}{symbol}");
        model.metadata_props.retain(|entry| entry.key != key);
        model.metadata_props.push(StringStringEntryProto {
            key,
            value: bound.to_string(),
        });
    }
    // With the shapes and constants given, conditions on them are constants too: fold
    // those `If`s so that tract never types a branch that cannot run.
    crate::fold_if::fold_constant_ifs(&mut model);
    Ok(model.encode_to_vec())
}

/// `If` nodes in a graph and its subgraphs.
fn counts_if(graph: &tract_onnx::pb::GraphProto) -> usize {
    graph
        .node
        .iter()
        .map(|node| {
            usize::from(node.op_type == "If")
                + node
                    .attribute
                    .iter()
                    .flat_map(|a| a.g.iter().chain(a.graphs.iter()))
                    .map(counts_if)
                    .sum::<usize>()
        })
        .sum()
}

/// An input or output as the file declares it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeclaredTensor {
    pub name: String,
    pub dtype: String,
    /// Sizes, names of symbolic dimensions, or `?` for an unnamed unknown one.
    pub dims: Vec<String>,
}

/// What `nephele model inspect` reports about a file.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Inspection {
    pub file_bytes: u64,
    pub producer: String,
    pub opsets: Vec<String>,
    pub inputs: Vec<DeclaredTensor>,
    pub outputs: Vec<DeclaredTensor>,
    pub nodes: usize,
    /// Operator → count, most frequent first.
    pub operators: Vec<(String, usize)>,
    /// Operators tract parses as unimplemented.
    pub unsupported_operators: Vec<String>,
    /// Agent features this model needs (`onnx-fft`…: [`crate::op_families`]), each with
    /// the first of its operators found; agents built without one refuse the model.
    pub agent_features: Vec<(String, String)>,
    /// `If` nodes in the file (subgraphs included)…
    pub ifs_in_file: usize,
    /// …and left once the conditions fixed by the file's shapes and `specs` are folded.
    pub ifs_left: usize,
    /// Whether this version of nephele loads it as given (after `specs`)…
    pub loads: bool,
    /// …how it would be served (`batched (one f32 input)`, `typed inputs, batched along
    /// N; planned symbolic`, `typed inputs, unbatched (why); planned static`)…
    pub serving: Option<String>,
    /// …and if not, why.
    pub load_error: Option<String>,
    /// What to change so that it loads, one line each.
    pub advice: Vec<String>,
}

/// Inspects an ONNX file before any push: declared inputs and outputs, operators,
/// whether nephele's runtime loads it with `specs` applied, and what would make it load.
pub fn inspect(name: &str, bytes: &[u8], specs: &[InputSpec]) -> Result<Inspection, RuntimeError> {
    let model = decode(name, bytes)?;
    let graph = model.graph.as_ref().ok_or_else(|| RuntimeError::Load {
        model: name.to_string(),
        cause: "the ONNX file has no graph".into(),
    })?;
    let declared = |info: &ValueInfoProto| {
        let t = tensor_type(info);
        DeclaredTensor {
            name: info.name.clone(),
            dtype: t
                .map(|t| onnx_type_name(t.elem_type))
                .unwrap_or_else(|| "not a tensor".into()),
            dims: t
                .and_then(|t| t.shape.as_ref())
                .map(|s| s.dim.iter().map(dim_text).collect())
                .unwrap_or_default(),
        }
    };
    let inputs: Vec<DeclaredTensor> = real_inputs(&model).into_iter().map(declared).collect();
    let outputs: Vec<DeclaredTensor> = graph.output.iter().map(declared).collect();
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    fn walk(
        graph: &tract_onnx::pb::GraphProto,
        counts: &mut std::collections::BTreeMap<String, usize>,
    ) {
        for node in &graph.node {
            *counts.entry(node.op_type.clone()).or_default() += 1;
            for attribute in &node.attribute {
                if let Some(g) = &attribute.g {
                    walk(g, counts);
                }
                for g in &attribute.graphs {
                    walk(g, counts);
                }
            }
        }
    }
    walk(graph, &mut counts);
    let nodes = counts.values().sum();
    let mut operators: Vec<(String, usize)> = counts.into_iter().collect();
    operators.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let unsupported_operators = std::panic::catch_unwind(|| {
        let mut reader = bytes;
        crate::onnx_reader()
            .model_for_read(&mut reader)
            .map(|m| {
                let mut found: Vec<String> = m
                    .nodes()
                    .iter()
                    .filter_map(|n| {
                        let op = n.op.name();
                        op.strip_prefix("Unimplemented(")
                            .and_then(|s| s.strip_suffix(')'))
                            .map(str::to_string)
                    })
                    .collect();
                found.sort();
                found.dedup();
                found
            })
            .unwrap_or_default()
    })
    .unwrap_or_default();
    let single_f32 = inputs.len() == 1 && inputs[0].dtype == "f32";
    let prepared = prepare(name, bytes, specs);
    let ifs_in_file = counts_if(graph);
    let ifs_left = match &prepared {
        Ok(edited) => decode(name, edited)
            .ok()
            .and_then(|m| m.graph.map(|g| counts_if(&g)))
            .unwrap_or(ifs_in_file),
        Err(_) => ifs_in_file,
    };
    // Exactly what a push does with the file ([`crate::import::load_prepared`]).
    let loaded = prepared.and_then(|edited| crate::import::load_prepared(name, &edited));
    let batched_served = matches!(loaded, Ok(crate::import::Served::Batched(_)));
    let (serving, load_error) = match &loaded {
        Ok(served) => (Some(served.describe()), None),
        Err(error) => (None, Some(error.to_string())),
    };
    let mut advice = Vec::new();
    // Bounds from the file and from `specs`; the dims shown as `S..512`.
    let mut bounds = max_dims(&model);
    for spec in specs {
        bounds.extend(spec.max.iter().map(|(k, v)| (k.clone(), *v)));
    }
    let batched = batched_served;
    let mut unbounded: Vec<(String, String)> = Vec::new();
    for input in &inputs {
        let dims = specs
            .iter()
            .find(|s| s.name == input.name)
            .map(|s| {
                s.dims
                    .iter()
                    .map(|d| match d {
                        Dim::Size(v) => v.to_string(),
                        Dim::Symbol(n) => n.clone(),
                        Dim::Dynamic => "?".to_string(),
                    })
                    .collect()
            })
            .unwrap_or_else(|| input.dims.clone());
        for (axis, dim) in dims.iter().enumerate() {
            let named = dim != "?" && dim.parse::<u64>().is_err();
            // The batched single-f32 path cuts its batch axis into batches itself.
            if named
                && !batched
                && !bounds.contains_key(dim)
                && !unbounded.iter().any(|(d, _)| d == dim)
            {
                let example: Vec<String> = dims
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        if i == axis {
                            format!("{d}..<max>")
                        } else {
                            d.clone()
                        }
                    })
                    .collect();
                unbounded.push((
                    dim.clone(),
                    format!(
                        "--input {}={}:{}",
                        input.name,
                        example.join(","),
                        input.dtype
                    ),
                ));
            }
        }
    }
    for (symbol, flag) in unbounded {
        advice.push(format!(
            "dimension {symbol} has no upper bound, so one request can make the model allocate as much as the request body allows; bound it at push: {flag}"
        ));
    }
    let show_bound = |t: &mut DeclaredTensor| {
        for d in &mut t.dims {
            if let Some(bound) = bounds.get(d.as_str()) {
                *d = format!("{d}..{bound}");
            }
        }
    };
    let mut inputs = inputs;
    inputs.iter_mut().for_each(show_bound);
    for input in &inputs {
        if specs.iter().any(|s| s.name == input.name) {
            continue;
        }
        // The batched path needs every size after the batch; the typed path binds
        // names from each request, so only an unnamed `?` is unknown to it.
        let unknown = |d: &String| {
            if single_f32 {
                d.parse::<u64>().is_err()
            } else {
                d == "?"
            }
        };
        let unknown_after_batch: Vec<&String> =
            input.dims.iter().skip(1).filter(|d| unknown(d)).collect();
        if single_f32 && !unknown_after_batch.is_empty() {
            let mut dims = vec!["N".to_string()];
            dims.extend(input.dims.iter().skip(1).map(|d| {
                if unknown(d) {
                    "<size>".into()
                } else {
                    d.clone()
                }
            }));
            advice.push(format!(
                "input {} has unknown dimensions {} after the batch: fix them at push with --input {}={}",
                input.name,
                unknown_after_batch
                    .iter()
                    .map(|d| d.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                input.name,
                dims.join(",")
            ));
        } else if !single_f32 && input.dims.iter().any(unknown) {
            let dims: Vec<String> = input
                .dims
                .iter()
                .enumerate()
                .map(|(i, d)| match (unknown(d), i) {
                    (false, _) => d.clone(),
                    (true, 0) => "1".into(),
                    (true, _) => "<size>".into(),
                })
                .collect();
            advice.push(format!(
                "input {} has unnamed unknown dimensions: give each a size or a name (a name is bound from each request): --input {}={}:{} (or fold a fixed input in: --input {}=DIMS:{}=VALUE)",
                input.name,
                input.name,
                dims.join(","),
                input.dtype,
                input.name,
                input.dtype
            ));
        }
    }
    if !unsupported_operators.is_empty() {
        advice.push(format!(
            "operators tract does not implement: {}; re-export the model without them (e.g. a lower opset)",
            unsupported_operators.join(", ")
        ));
    }
    Ok(Inspection {
        file_bytes: bytes.len() as u64,
        producer: format!("{} {}", model.producer_name, model.producer_version)
            .trim()
            .to_string(),
        opsets: model
            .opset_import
            .iter()
            .map(|o| {
                let domain = if o.domain.is_empty() {
                    "ai.onnx"
                } else {
                    &o.domain
                };
                format!("{domain} {}", o.version)
            })
            .collect(),
        inputs,
        outputs,
        nodes,
        operators,
        unsupported_operators,
        agent_features: crate::op_families::families_used(&model)
            .into_iter()
            .map(|(family, op)| (family.feature.to_string(), op))
            .collect(),
        ifs_in_file,
        ifs_left,
        loads: load_error.is_none(),
        serving,
        load_error,
        advice,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_issue_examples_parse() {
        let x: InputSpec = "x=N,3,48,W".parse().expect("x");
        assert_eq!(
            x.dims,
            vec![
                Dim::Symbol("N".into()),
                Dim::Size(3),
                Dim::Size(48),
                Dim::Symbol("W".into())
            ]
        );
        let b: InputSpec = "bytes=1,2048:i32".parse().expect("bytes");
        assert_eq!(b.dtype, Some(ElemType::I32));
        let sr: InputSpec = "sr=scalar:i64=16000".parse().expect("sr");
        assert!(sr.dims.is_empty());
        assert_eq!(sr.value, Some(vec![16000.0]));
        let ids: InputSpec = "input_ids=1,S..512:i64".parse().expect("bounded");
        assert_eq!(ids.dims, vec![Dim::Size(1), Dim::Symbol("S".into())]);
        assert_eq!(ids.max.get("S"), Some(&512));
        assert_eq!(ids.to_string(), "input_ids=1,S..512:i64");
    }

    #[test]
    fn a_bound_travels_in_the_file_and_the_model_enforces_it() {
        use crate::graph_model::{GraphModel, NamedTensor};
        let bytes = crate::synthetic::typed_example();
        // Unbounded, inspect says how to bound it.
        let report = inspect("typed", &bytes, &[]).expect("inspects");
        assert!(
            report
                .advice
                .iter()
                .any(|a| a.contains("N has no upper bound")
                    && a.contains("--input scale=N..<max>,4:f32")),
            "{:?}",
            report.advice
        );
        let bounded = apply("typed", &bytes, &specs(&["scale=N..3,4"])).expect("applies");
        let report = inspect("typed", &bounded, &[]).expect("inspects");
        assert_eq!(report.inputs[1].dims, vec!["N..3", "4"]);
        assert!(report.advice.is_empty(), "{:?}", report.advice);
        let model = GraphModel::load("typed", &bounded).expect("loads");
        assert_eq!(model.max_dims().get("N"), Some(&3));
        let request = |n: usize| {
            std::collections::HashMap::from([
                (
                    "ids".to_string(),
                    NamedTensor {
                        dtype: "i64".into(),
                        shape: vec![1, 4],
                        data: vec![1.0; 4],
                    },
                ),
                (
                    "scale".to_string(),
                    NamedTensor {
                        dtype: "f32".into(),
                        shape: vec![n, 4],
                        data: vec![1.0; 4 * n],
                    },
                ),
                (
                    "offset".to_string(),
                    NamedTensor {
                        dtype: "i64".into(),
                        shape: vec![],
                        data: vec![0.0],
                    },
                ),
            ])
        };
        assert_eq!(
            model.run(&request(3)).expect("N = 3")["scaled"].shape,
            vec![3, 4]
        );
        let refused = model.run(&request(4)).expect_err("N = 4").to_string();
        assert!(refused.contains("N = 4, above the 3"), "{refused}");
        // Two bounds for one name are refused, naming both.
        let twice = apply("typed", &bytes, &specs(&["scale=N..3,4", "ids=1,N..5"]));
        assert!(twice
            .expect_err("twice")
            .to_string()
            .contains("..3 and ..5"));
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (text, says) in [
            ("x", "no '='"),
            ("=1,2", "name is empty"),
            ("x=1,,2", "empty dimension"),
            ("x=1,0", "dimension of 0"),
            ("x=1,2:f64", "unknown type"),
            ("x=N,2=0", "every dimension as a size"),
            ("x=2,2=1,2,3", "3 values for a tensor of 4 elements"),
            ("x=2=abc", "not a number"),
            ("x=3-4", "neither a size nor a name"),
            ("x=a b,2", "neither a size nor a name"),
            ("x=a..b..8", "neither a size nor a name"),
            ("x=1,-2", "negative"),
            ("x=1,<size>", "placeholder"),
            ("x=-1..8", "only a named dimension takes a bound"),
            ("x=?..8", "only a named dimension takes a bound"),
            ("x=-1,2=0", "every dimension as a size"),
            ("x=1,S..0", "not a size above 0"),
            ("x=1,S..many", "not a size above 0"),
            ("x=1,4..8", "only a named dimension takes a bound"),
            ("x=S..4,S..8", "two bounds"),
        ] {
            let error = text.parse::<InputSpec>().expect_err(text);
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    const DIGITS: &[u8] = include_bytes!("../../../shared/models/digits-mlp/model.onnx");

    fn specs(texts: &[&str]) -> Vec<InputSpec> {
        texts.iter().map(|t| t.parse().expect(t)).collect()
    }

    /// Issue 51: the names exporters write (paddle2onnx's `DynamicDimension.0`,
    /// tf2onnx's `unk__123`, `batch_size`, `-1`, names with dots, dashes and digits) all
    /// parse, print back as given, and reach the file as symbols tract reads as names.
    #[test]
    fn exporters_dimension_names_parse_and_round_trip() {
        let symbol = |s: &str| Dim::Symbol(s.to_string());
        for (text, dims) in [
            (
                "x=DynamicDimension.0..640,3,DynamicDimension.1,DynamicDimension.2",
                vec![
                    symbol("DynamicDimension.0"),
                    Dim::Size(3),
                    symbol("DynamicDimension.1"),
                    symbol("DynamicDimension.2"),
                ],
            ),
            (
                "x=unk__123,batch_size,N,N2",
                vec![
                    symbol("unk__123"),
                    symbol("batch_size"),
                    symbol("N"),
                    symbol("N2"),
                ],
            ),
            (
                "x=-1,?,height-px,3d,a.",
                vec![
                    Dim::Dynamic,
                    Dim::Dynamic,
                    symbol("height-px"),
                    symbol("3d"),
                    symbol("a."),
                ],
            ),
        ] {
            let spec: InputSpec = text.parse().expect(text);
            assert_eq!(spec.dims, dims, "{text}");
            assert_eq!(
                spec.to_string().parse::<InputSpec>(),
                Ok(spec.clone()),
                "{text}"
            );
        }
        let bounded: InputSpec = "x=DynamicDimension.0..640,3".parse().expect("bounded");
        assert_eq!(bounded.max.get("DynamicDimension.0"), Some(&640));
        assert_eq!(bounded.to_string(), "x=DynamicDimension.0..640,3");
        // A name ending with a dot, bounded: the last `..` is the bound's.
        let dotted: InputSpec = "x=a...8".parse().expect("dotted");
        assert_eq!(
            (dotted.dims.clone(), dotted.max.get("a.")),
            (vec![symbol("a.")], Some(&8))
        );
        assert_eq!(dotted.to_string(), "x=a...8");
        for (name, written) in [
            ("N", "N"),
            ("batch_size", "batch_size"),
            ("unk__123", "unk__123"),
            ("DynamicDimension.0", "DynamicDimension.0"),
            ("height-px", "height_px"),
            ("3d", "_3d"),
        ] {
            assert_eq!(onnx_symbol(name), written, "{name}");
        }
    }

    #[test]
    fn names_are_written_as_symbols_the_runtime_reads_and_bounds_with_them() {
        use crate::graph_model::GraphModel;
        // Dotted and dashed names, bounded, through the file to the runtime.
        for (given, symbol, bound) in [
            (
                "input=DynamicDimension.0..640,64",
                "DynamicDimension.0",
                640,
            ),
            ("input=batch-size..8,64", "batch_size", 8),
            ("input=unk__123..16,64", "unk__123", 16),
        ] {
            let fixed = apply("digits", DIGITS, &specs(&[given])).expect(given);
            let report = inspect("digits", &fixed, &[]).expect("inspects");
            assert_eq!(
                report.inputs[0].dims,
                vec![format!("{symbol}..{bound}"), "64".into()],
                "{given}"
            );
            let model = GraphModel::load("digits", &fixed).expect(given);
            assert_eq!(model.inputs()[0].symbol(0), Some(symbol), "{given}");
            assert_eq!(model.max_dims().get(symbol), Some(&bound), "{given}");
        }
        // `-1` keeps the file's name for the axis (`N`), or makes one where it has none.
        let dynamic = apply("digits", DIGITS, &specs(&["input=-1,-1"])).expect("-1");
        let report = inspect("digits", &dynamic, &[]).expect("inspects");
        assert_eq!(report.inputs[0].dims, vec!["N", "input_1"]);
        // Two names that would be one symbol in the file are refused.
        let error = apply("digits", DIGITS, &specs(&["input=a-b,a_b"]))
            .expect_err("one symbol for two names")
            .to_string();
        assert!(error.contains("would both be the dimension a_b"), "{error}");
    }

    /// Issue 51: the flag inspect suggests to bound a name is one push takes, whatever
    /// the name (here paddle2onnx's `DynamicDimension.0`), once `<max>` is filled in.
    #[test]
    fn the_bound_inspect_suggests_for_an_exporters_name_is_taken_by_push() {
        use crate::graph_model::GraphModel;
        let bytes = crate::synthetic::typed_example();
        let exported =
            apply("typed", &bytes, &specs(&["scale=DynamicDimension.0,4"])).expect("applies");
        let report = inspect("typed", &exported, &[]).expect("inspects");
        let flag = report
            .advice
            .iter()
            .find_map(|a| a.split_once("--input ").map(|(_, flag)| flag.to_string()))
            .unwrap_or_else(|| panic!("no flag suggested: {:?}", report.advice));
        assert_eq!(flag, "scale=DynamicDimension.0..<max>,4:f32");
        let filled = flag.replace("<max>", "512");
        let bounded = apply("typed", &exported, &specs(&[filled.as_str()])).expect("push takes it");
        let model = GraphModel::load("typed", &bounded).expect("loads");
        assert_eq!(model.max_dims().get("DynamicDimension.0"), Some(&512));
        let report = inspect("typed", &bounded, &[]).expect("inspects");
        assert!(report.advice.is_empty(), "{:?}", report.advice);
    }

    #[test]
    fn specs_are_checked_against_the_file_and_applied() {
        for (given, says) in [
            (
                "pixels=N,64",
                "has no input \"pixels\"; its inputs are input",
            ),
            ("input=N,64:i64", "is f32, not i64"),
            ("input=N,8,8", "has rank 2 ([N,64]); give 2 dimensions"),
        ] {
            let error = apply("digits", DIGITS, &specs(&[given])).expect_err(given);
            assert!(error.to_string().contains(says), "{given}: {error}");
        }
        let fixed = apply("digits", DIGITS, &specs(&["input=B,64:f32"])).expect("applies");
        let report = inspect("digits", &fixed, &[]).expect("inspects");
        assert_eq!(report.inputs[0].dims, vec!["B", "64"]);
        assert_eq!(report.inputs[0].dtype, "f32");
        assert!(report.loads, "{:?}", report.load_error);
        assert!(report.advice.is_empty(), "{:?}", report.advice);
        assert_eq!(
            report.operators.iter().map(|(_, n)| n).sum::<usize>(),
            report.nodes
        );
        // Folding the only input in leaves a model without inputs, which nephele refuses
        // with the reason (serving needs an input), but the file itself is valid ONNX.
        let folded = apply("digits", DIGITS, &specs(&["input=1,64=0.5"])).expect("folds");
        let report = inspect("digits", &folded, &[]).expect("inspects");
        assert!(report.inputs.is_empty());
        assert!(!report.loads && report.load_error.is_some());
        // A file with its batch dimension unnamed gets advice naming the flag.
        let unknown = apply("digits", DIGITS, &specs(&["input=N,W"])).expect("applies");
        let report = inspect("digits", &unknown, &[]).expect("inspects");
        assert!(
            report
                .advice
                .iter()
                .any(|a| a.contains("--input input=N,<size>")),
            "{:?}",
            report.advice
        );
    }

    proptest! {
        #[test]
        fn display_and_parse_round_trip(
            name in "[a-z][a-z0-9_]{0,8}",
            dims in proptest::collection::vec(prop_oneof![
                (1u64..5000).prop_map(Dim::Size),
                "[A-Z][a-z0-9]{0,3}".prop_map(Dim::Symbol),
                "[a-zA-Z_][a-zA-Z0-9_.-]{0,6}"
                    .prop_filter("a name holds no .. and is not scalar", |s| {
                        !s.contains("..") && s != "scalar"
                    })
                    .prop_map(Dim::Symbol),
                Just(Dim::Dynamic),
            ], 0..5),
            dtype in proptest::option::of(proptest::sample::select(ElemType::ALL.to_vec())),
        ) {
            let max = dims
                .iter()
                .filter_map(|d| match d {
                    Dim::Symbol(s) if s.len() % 2 == 0 => Some((s.clone(), s.len() as u64 * 64)),
                    _ => None,
                })
                .collect();
            let spec = InputSpec { name, dims, dtype, value: None, max };
            let text = spec.to_string();
            prop_assert_eq!(text.parse::<InputSpec>(), Ok(spec));
        }

        #[test]
        fn parsing_never_panics(text in ".{0,40}") {
            let _ = text.parse::<InputSpec>();
        }
    }
}
