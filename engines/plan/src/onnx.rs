//! Reading an ONNX model: tract-onnx's protobuf types (prost on onnx.proto)
//! decode the file; this module turns the decoded graph into plain data the
//! planner works on — nodes with their attributes, constant tensors as f32
//! or i64 — and nothing else. No operator semantics live here.

use std::collections::HashMap;
use std::path::Path;

use prost::Message as _;
use tract_onnx::pb;

use crate::PlanError;

/// A constant tensor of the graph (an initializer or a `Constant` node).
#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    /// Full shape (no batch convention: constants have none).
    pub shape: Vec<usize>,
    /// The values.
    pub data: ConstData,
}

/// The element types the planner reads.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstData {
    /// FLOAT.
    F32(Vec<f32>),
    /// INT64 (shapes, axes).
    I64(Vec<i64>),
}

impl Const {
    /// The values as f32, or an error naming `what` when they are not f32.
    pub fn f32s(&self, what: &str) -> Result<&[f32], PlanError> {
        match &self.data {
            ConstData::F32(v) => Ok(v),
            ConstData::I64(_) => Err(PlanError::Graph(format!("{what} must be float, is int64"))),
        }
    }

    /// The values as i64, or an error naming `what` when they are not i64.
    pub fn i64s(&self, what: &str) -> Result<&[i64], PlanError> {
        match &self.data {
            ConstData::I64(v) => Ok(v),
            ConstData::F32(_) => Err(PlanError::Graph(format!("{what} must be int64, is float"))),
        }
    }
}

/// One attribute value of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// INT.
    Int(i64),
    /// FLOAT.
    Float(f32),
    /// INTS.
    Ints(Vec<i64>),
    /// FLOATS.
    Floats(Vec<f32>),
    /// STRING.
    Str(String),
    /// TENSOR.
    Tensor(Const),
    /// Any other kind (graphs, sparse tensors...): present, not readable here.
    Other,
}

/// One node of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The node's name, or `op_type#index` when the file gives none.
    pub name: String,
    /// ONNX operator type (e.g. `Conv`).
    pub op: String,
    /// Input value names; an empty name is an omitted optional input.
    pub inputs: Vec<String>,
    /// Output value names.
    pub outputs: Vec<String>,
    /// Attributes by name.
    pub attrs: HashMap<String, Attr>,
}

impl Node {
    /// An INT attribute, or `default` when absent.
    pub fn int(&self, name: &str, default: i64) -> Result<i64, PlanError> {
        match self.attrs.get(name) {
            None => Ok(default),
            Some(Attr::Int(i)) => Ok(*i),
            Some(other) => Err(self.bad_attr(name, "an int", other)),
        }
    }

    /// A FLOAT attribute, or `default` when absent.
    pub fn float(&self, name: &str, default: f32) -> Result<f32, PlanError> {
        match self.attrs.get(name) {
            None => Ok(default),
            Some(Attr::Float(f)) => Ok(*f),
            Some(other) => Err(self.bad_attr(name, "a float", other)),
        }
    }

    /// An INTS attribute, or `None` when absent.
    pub fn ints(&self, name: &str) -> Result<Option<&[i64]>, PlanError> {
        match self.attrs.get(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v)),
            Some(other) => Err(self.bad_attr(name, "a list of ints", other)),
        }
    }

    /// A STRING attribute, or `default` when absent.
    pub fn string<'a>(&'a self, name: &str, default: &'a str) -> Result<&'a str, PlanError> {
        match self.attrs.get(name) {
            None => Ok(default),
            Some(Attr::Str(s)) => Ok(s),
            Some(other) => Err(self.bad_attr(name, "a string", other)),
        }
    }

    fn bad_attr(&self, name: &str, want: &str, got: &Attr) -> PlanError {
        PlanError::Graph(format!(
            "node {} ({}): attribute {name} should be {want}, is {got:?}",
            self.name, self.op
        ))
    }
}

/// A decoded ONNX graph: one data input, one output.
#[derive(Clone, Debug)]
pub struct Graph {
    /// The default-domain opset the model was written for.
    pub opset: i64,
    /// The data input's name (the graph input that is not an initializer).
    pub input: String,
    /// The data input's declared shape; `None` for a symbolic dimension.
    pub input_shape: Vec<Option<usize>>,
    /// The output's name.
    pub output: String,
    /// Nodes, in the file's (topological) order.
    pub nodes: Vec<Node>,
    /// Constants by value name: initializers and `Constant` nodes' outputs.
    pub consts: HashMap<String, Const>,
}

/// Reads and decodes a model file.
pub fn read_path(path: &Path) -> Result<Graph, PlanError> {
    let bytes =
        std::fs::read(path).map_err(|e| PlanError::Read(format!("{}: {e}", path.display())))?;
    read_bytes(&bytes).map_err(|e| match e {
        PlanError::Read(m) => PlanError::Read(format!("{}: {m}", path.display())),
        other => other,
    })
}

/// Decodes a model held in memory.
pub fn read_bytes(bytes: &[u8]) -> Result<Graph, PlanError> {
    let proto = pb::ModelProto::decode(bytes)
        .map_err(|e| PlanError::Read(format!("not an ONNX model: {e}")))?;
    from_proto(&proto)
}

/// The plain-data form of a decoded model.
pub fn from_proto(model: &pb::ModelProto) -> Result<Graph, PlanError> {
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| PlanError::Graph("the model has no graph".into()))?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .unwrap_or(1);
    let mut consts = HashMap::new();
    for t in &graph.initializer {
        consts.insert(t.name.clone(), tensor(t)?);
    }
    let data_inputs: Vec<&pb::ValueInfoProto> = graph
        .input
        .iter()
        .filter(|i| !consts.contains_key(&i.name))
        .collect();
    let [input] = data_inputs.as_slice() else {
        return Err(PlanError::Graph(format!(
            "the model has {} data inputs ({}); one image input is supported",
            data_inputs.len(),
            data_inputs
                .iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let [output] = graph.output.as_slice() else {
        return Err(PlanError::Graph(format!(
            "the model has {} outputs; one is supported",
            graph.output.len()
        )));
    };
    let mut nodes = Vec::with_capacity(graph.node.len());
    for (index, n) in graph.node.iter().enumerate() {
        if !(n.domain.is_empty() || n.domain == "ai.onnx") {
            return Err(PlanError::Unsupported(vec![format!(
                "{} (domain {})",
                n.op_type, n.domain
            )]));
        }
        let mut attrs = HashMap::new();
        for a in &n.attribute {
            attrs.insert(a.name.clone(), attribute(a)?);
        }
        nodes.push(Node {
            name: if n.name.is_empty() {
                format!("{}#{index}", n.op_type)
            } else {
                n.name.clone()
            },
            op: n.op_type.clone(),
            inputs: n.input.clone(),
            outputs: n.output.clone(),
            attrs,
        });
    }
    Ok(Graph {
        opset,
        input: input.name.clone(),
        input_shape: value_shape(input),
        output: output.name.clone(),
        nodes,
        consts,
    })
}

fn value_shape(v: &pb::ValueInfoProto) -> Vec<Option<usize>> {
    use pb::tensor_shape_proto::dimension::Value;
    use pb::type_proto::Value as Type;
    let Some(Type::TensorType(t)) = v.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Vec::new();
    };
    let Some(shape) = t.shape.as_ref() else {
        return Vec::new();
    };
    shape
        .dim
        .iter()
        .map(|d| match d.value {
            Some(Value::DimValue(n)) if n > 0 => usize::try_from(n).ok(),
            _ => None,
        })
        .collect()
}

fn attribute(a: &pb::AttributeProto) -> Result<Attr, PlanError> {
    use pb::attribute_proto::AttributeType as T;
    Ok(match T::try_from(a.r#type).unwrap_or(T::Undefined) {
        T::Int => Attr::Int(a.i),
        T::Float => Attr::Float(a.f),
        T::Ints => Attr::Ints(a.ints.clone()),
        T::Floats => Attr::Floats(a.floats.clone()),
        T::String => Attr::Str(String::from_utf8_lossy(&a.s).into_owned()),
        T::Tensor => match &a.t {
            Some(t) => Attr::Tensor(tensor(t)?),
            None => Attr::Other,
        },
        _ => Attr::Other,
    })
}

/// ONNX TensorProto.DataType values read here.
const FLOAT: i32 = 1;
const INT64: i32 = 7;

/// Decodes a FLOAT or INT64 tensor (typed field or little-endian raw bytes).
pub fn tensor(t: &pb::TensorProto) -> Result<Const, PlanError> {
    let shape = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| PlanError::Graph(format!("tensor {} has a negative dimension", t.name)))?;
    if !t.external_data.is_empty() {
        return Err(PlanError::Graph(format!(
            "tensor {} keeps its data in an external file; save the model with the data inside",
            t.name
        )));
    }
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| {
            PlanError::Graph(format!("tensor {} of shape {shape:?} is too large", t.name))
        })?;
    let data = match t.data_type {
        FLOAT => ConstData::F32(if t.raw_data.is_empty() {
            t.float_data.clone()
        } else {
            t.raw_data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        }),
        INT64 => ConstData::I64(if t.raw_data.is_empty() {
            t.int64_data.clone()
        } else {
            t.raw_data
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect()
        }),
        other => {
            return Err(PlanError::Graph(format!(
                "tensor {} has ONNX data type {other}; float and int64 are supported",
                t.name
            )))
        }
    };
    let len = match &data {
        ConstData::F32(v) => v.len(),
        ConstData::I64(v) => v.len(),
    };
    if len != count {
        return Err(PlanError::Graph(format!(
            "tensor {} has {len} values for shape {shape:?} ({count})",
            t.name
        )));
    }
    Ok(Const { shape, data })
}
