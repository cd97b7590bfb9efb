//! The KServe v2 inference protocol's request and response bodies, sans-IO:
//! bytes in, the platform's inputs out; the platform's answers in, bytes
//! out. Both forms: JSON tensors, and the binary tensor extension (a JSON
//! header of `Inference-Header-Content-Length` bytes, then the tensors'
//! raw bytes in the order of the inputs/outputs that carry
//! `binary_data_size`).
//!
//! What a request may say (anything else is a [`V2Error`], HTTP 400):
//! - exactly one input, named [`INPUT`](crate::models::INPUT), of the
//!   model's datatype, shape `[N, ...the model's dims]` with `1 <= N <=
//!   max_batch`; its data either `data` (a flat or nested JSON array of
//!   exactly that many numbers, UINT8 in 0..=255) or binary
//!   (`parameters.binary_data_size` = exactly the tensor's bytes);
//! - `outputs` (optional, default both): `CLASSES` and/or `SCORES`, each
//!   binary when its `parameters.binary_data` is true, or all of them when
//!   the request's `parameters.binary_data_output` is;
//! - `id` (echoed), `parameters.timeout` (µs, as tritonclient sends it;
//!   capped by the gateway's own timeout). Other parameters are ignored.

use std::fmt;
use std::time::Duration;

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use kneepoint_client::Answer;

use crate::models::{DataType, ServedModel, CLASSES, INPUT, SCORES, VERSION};

/// A request the gateway cannot serve, and why (its message goes back as
/// `{"error": ...}` with HTTP 400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct V2Error(pub String);

fn bad<T>(msg: impl Into<String>) -> Result<T, V2Error> {
    Err(V2Error(msg.into()))
}

/// Which outputs to return, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputForm {
    /// Not asked for.
    Omit,
    /// As a JSON `data` array.
    Json,
    /// As raw bytes after the JSON header.
    Binary,
}

/// A parsed infer request: the platform's inputs, one per batch item.
#[derive(Debug, PartialEq)]
pub struct InferRequest {
    /// The request's `id`, echoed in the response.
    pub id: Option<String>,
    /// Batch items (the tensor's first dimension).
    pub batch: usize,
    /// `batch` inputs back to back, each the model's `input_bytes`, in the
    /// wire's format (u8 as is, f32 little-endian).
    pub input: Vec<u8>,
    /// How to return `CLASSES`.
    pub classes: OutputForm,
    /// How to return `SCORES`.
    pub scores: OutputForm,
    /// The client's own timeout (`parameters.timeout`, µs), if it gave one.
    pub timeout: Option<Duration>,
}

#[derive(Deserialize)]
struct RawRequest<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Option<RequestParams>,
    #[serde(borrow)]
    inputs: Vec<RawInput<'a>>,
    #[serde(default)]
    outputs: Option<Vec<RawOutput>>,
}

#[derive(Default, Deserialize)]
struct RequestParams {
    #[serde(default)]
    binary_data_output: Option<bool>,
    #[serde(default)]
    timeout: Option<u64>,
}

#[derive(Deserialize)]
struct RawInput<'a> {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Option<InputParams>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

#[derive(Default, Deserialize)]
struct InputParams {
    #[serde(default)]
    binary_data_size: Option<u64>,
}

#[derive(Deserialize)]
struct RawOutput {
    name: String,
    #[serde(default)]
    parameters: Option<OutputParams>,
}

#[derive(Default, Deserialize)]
struct OutputParams {
    #[serde(default)]
    binary_data: Option<bool>,
}

/// Parses an infer request body for `model`. `header_len` is the
/// `Inference-Header-Content-Length` (the JSON's length; the rest of
/// `body` is binary tensor data), `None` for a JSON-only body.
pub fn parse_infer(
    model: &ServedModel,
    body: &[u8],
    header_len: Option<usize>,
    max_batch: usize,
) -> Result<InferRequest, V2Error> {
    let (json, binary) = match header_len {
        None => (body, &[][..]),
        Some(n) if n <= body.len() => body.split_at(n),
        Some(n) => {
            return bad(format!(
                "Inference-Header-Content-Length {n} exceeds the body's {} bytes",
                body.len()
            ))
        }
    };
    let raw: RawRequest = serde_json::from_slice(json)
        .map_err(|e| V2Error(format!("malformed inference request JSON: {e}")))?;
    let [input] = raw.inputs.as_slice() else {
        return bad(format!(
            "model '{}' takes exactly one input ({INPUT}), the request has {}",
            model.name,
            raw.inputs.len()
        ));
    };
    if input.name != INPUT {
        return bad(format!(
            "model '{}' has no input '{}' (its input is {INPUT})",
            model.name, input.name
        ));
    }
    if input.datatype != model.input_type.as_str() {
        return bad(format!(
            "input {INPUT} of model '{}' is {}, the request says {}",
            model.name,
            model.input_type.as_str(),
            input.datatype
        ));
    }
    let batch = check_shape(model, &input.shape, max_batch)?;
    let elems = batch * model.input_elems();
    let bytes = batch * model.input_bytes;
    let binary_size = input.parameters.as_ref().and_then(|p| p.binary_data_size);
    let data = match (binary_size, input.data) {
        (Some(_), Some(_)) => {
            return bad(format!(
                "input {INPUT} has both `data` and `binary_data_size`"
            ))
        }
        (None, None) => return bad(format!("input {INPUT} has no `data`")),
        (Some(size), None) => {
            if header_len.is_none() {
                return bad(format!(
                    "input {INPUT} says binary_data_size but the request has no \
                     Inference-Header-Content-Length header"
                ));
            }
            if size != bytes as u64 {
                return bad(format!(
                    "input {INPUT}: binary_data_size is {size}, shape {:?} of {} is {bytes} bytes",
                    input.shape,
                    model.input_type.as_str()
                ));
            }
            if binary.len() != bytes {
                return bad(format!(
                    "the binary part of the body is {} bytes, input {INPUT} is {bytes}",
                    binary.len()
                ));
            }
            binary.to_vec()
        }
        (None, Some(raw)) => {
            if !binary.is_empty() {
                return bad(format!(
                    "{} bytes of binary data after the JSON header, but no input says \
                     binary_data_size",
                    binary.len()
                ));
            }
            json_data(raw, model.input_type, elems)?
        }
    };
    let all_binary = raw
        .parameters
        .as_ref()
        .and_then(|p| p.binary_data_output)
        .unwrap_or(false);
    let default_form = if all_binary {
        OutputForm::Binary
    } else {
        OutputForm::Json
    };
    let (classes, scores) = match &raw.outputs {
        None => (default_form, default_form),
        Some(outputs) => {
            let (mut classes, mut scores) = (OutputForm::Omit, OutputForm::Omit);
            for o in outputs {
                let form = match o.parameters.as_ref().and_then(|p| p.binary_data) {
                    Some(true) => OutputForm::Binary,
                    Some(false) => OutputForm::Json,
                    None => default_form,
                };
                match o.name.as_str() {
                    CLASSES => classes = form,
                    SCORES => scores = form,
                    other => {
                        return bad(format!(
                        "model '{}' has no output '{other}' (its outputs are {CLASSES}, {SCORES})",
                        model.name
                    ))
                    }
                }
            }
            (classes, scores)
        }
    };
    let timeout = raw
        .parameters
        .as_ref()
        .and_then(|p| p.timeout)
        .filter(|&us| us > 0)
        .map(Duration::from_micros);
    Ok(InferRequest {
        id: raw.id,
        batch,
        input: data,
        classes,
        scores,
        timeout,
    })
}

/// The batch size of a request shape, if it is `[N, dims...]` with
/// `1 <= N <= max_batch`.
fn check_shape(model: &ServedModel, shape: &[i64], max_batch: usize) -> Result<usize, V2Error> {
    let want = || {
        let d = model.input_dims;
        format!(
            "[N, {}, {}, {}] with 1 <= N <= {max_batch}",
            d[0], d[1], d[2]
        )
    };
    let [n, rest @ ..] = shape else {
        return bad(format!(
            "input {INPUT}: shape [] is not {} for model '{}'",
            want(),
            model.name
        ));
    };
    let dims_ok = rest.len() == 3
        && rest
            .iter()
            .zip(model.input_dims)
            .all(|(&got, want)| usize::try_from(got).ok() == Some(want));
    match usize::try_from(*n) {
        Ok(n) if dims_ok && (1..=max_batch).contains(&n) => Ok(n),
        _ => bad(format!(
            "input {INPUT}: shape {shape:?} is not {} for model '{}'",
            want(),
            model.name
        )),
    }
}

/// A JSON `data` array (flat or nested) of exactly `elems` numbers of
/// `dtype`, as the wire's bytes.
fn json_data(raw: &RawValue, dtype: DataType, elems: usize) -> Result<Vec<u8>, V2Error> {
    let mut out = Vec::with_capacity(elems * dtype.size());
    let mut count = 0usize;
    let seed = Flatten {
        out: &mut out,
        count: &mut count,
        max: elems,
        dtype,
    };
    let mut de = serde_json::Deserializer::from_str(raw.get());
    seed.deserialize(&mut de)
        .map_err(|e| V2Error(format!("input {INPUT}: `data`: {e}")))?;
    if count != elems {
        return bad(format!(
            "input {INPUT}: `data` has {count} elements, the shape says {elems}"
        ));
    }
    Ok(out)
}

/// Numbers and (nested) arrays of numbers, appended to `out` as `dtype`'s
/// wire bytes; fails past `max` elements (so a body cannot make it grow
/// beyond what the shape says) and on a value `dtype` cannot hold.
struct Flatten<'v> {
    out: &'v mut Vec<u8>,
    count: &'v mut usize,
    max: usize,
    dtype: DataType,
}

impl Flatten<'_> {
    fn push<E: serde::de::Error>(&mut self, v: Num) -> Result<(), E> {
        if *self.count >= self.max {
            return Err(E::custom(format_args!(
                "more elements than the shape's {}",
                self.max
            )));
        }
        match (self.dtype, v) {
            (DataType::Uint8, Num::U(u)) if u <= 255 => self.out.push(u as u8),
            (DataType::Uint8, v) => {
                return Err(E::custom(format_args!(
                    "{v} is not a UINT8 (an integer in 0..=255)"
                )))
            }
            (DataType::Fp32, v) => {
                let f = match v {
                    Num::U(u) => u as f32,
                    Num::I(i) => i as f32,
                    Num::F(f) => f as f32,
                };
                self.out.extend_from_slice(&f.to_le_bytes());
            }
            (DataType::Int32, _) => return Err(E::custom("INT32 inputs are not served")),
        }
        *self.count += 1;
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Num {
    U(u64),
    I(i64),
    F(f64),
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::U(v) => write!(f, "{v}"),
            Num::I(v) => write!(f, "{v}"),
            Num::F(v) => write!(f, "{v}"),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Flatten<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Flatten<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number or an array of numbers")
    }

    fn visit_u64<E: serde::de::Error>(mut self, v: u64) -> Result<(), E> {
        self.push(Num::U(v))
    }

    fn visit_i64<E: serde::de::Error>(mut self, v: i64) -> Result<(), E> {
        match u64::try_from(v) {
            Ok(u) => self.push(Num::U(u)),
            Err(_) => self.push(Num::I(v)),
        }
    }

    fn visit_f64<E: serde::de::Error>(mut self, v: f64) -> Result<(), E> {
        self.push(Num::F(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Flatten {
            out,
            count,
            max,
            dtype,
        } = self;
        while seq
            .next_element_seed(Flatten {
                out: &mut *out,
                count: &mut *count,
                max,
                dtype,
            })?
            .is_some()
        {}
        Ok(())
    }
}

/// A response body, and the JSON header's length when binary outputs
/// follow it (the `Inference-Header-Content-Length` to send).
#[derive(Debug, PartialEq)]
pub struct InferResponse {
    /// The whole body.
    pub body: Vec<u8>,
    /// Bytes of JSON at its start, when binary data follows.
    pub header_len: Option<usize>,
}

/// The response to `req` for `model`, from the platform's answers (one per
/// batch item, in order). `k` is the shortest answer's top-k length (the
/// IF answers the same k to every request).
pub fn render_infer(model: &ServedModel, req: &InferRequest, answers: &[Answer]) -> InferResponse {
    let k = answers.iter().map(|a| a.top_k.len()).min().unwrap_or(0);
    let shape = json!([answers.len(), k]);
    let mut binary = Vec::new();
    let mut outputs = Vec::new();
    let mut output = |name: &str,
                      dtype: DataType,
                      form: OutputForm,
                      json_values: &dyn Fn() -> Vec<Value>,
                      bytes: &dyn Fn(&mut Vec<u8>)| {
        let mut o = Map::new();
        o.insert("name".into(), name.into());
        o.insert("datatype".into(), dtype.as_str().into());
        o.insert("shape".into(), shape.clone());
        match form {
            OutputForm::Omit => return,
            OutputForm::Json => {
                o.insert("data".into(), Value::Array(json_values()));
            }
            OutputForm::Binary => {
                let at = binary.len();
                bytes(&mut binary);
                o.insert(
                    "parameters".into(),
                    json!({ "binary_data_size": binary.len() - at }),
                );
            }
        }
        outputs.push(Value::Object(o));
    };
    let items = || answers.iter().flat_map(|a| &a.top_k[..k]);
    output(
        CLASSES,
        DataType::Int32,
        req.classes,
        &|| items().map(|c| Value::from(c.class)).collect(),
        &|b: &mut Vec<u8>| {
            for c in items() {
                // Class ids are < num_classes, which fits an i32.
                let id = i32::try_from(c.class).unwrap_or(i32::MAX);
                b.extend_from_slice(&id.to_le_bytes());
            }
        },
    );
    output(
        SCORES,
        DataType::Fp32,
        req.scores,
        &|| items().map(|c| Value::from(c.score)).collect(),
        &|b: &mut Vec<u8>| {
            for c in items() {
                b.extend_from_slice(&c.score.to_le_bytes());
            }
        },
    );
    let mut head = Map::new();
    head.insert("model_name".into(), model.name.clone().into());
    head.insert("model_version".into(), VERSION.into());
    if let Some(id) = &req.id {
        head.insert("id".into(), id.clone().into());
    }
    head.insert("outputs".into(), Value::Array(outputs));
    let mut body = Value::Object(head).to_string().into_bytes();
    let header_len = (!binary.is_empty()).then_some(body.len());
    body.extend_from_slice(&binary);
    InferResponse { body, header_len }
}

/// `GET /v2/models/{name}`: the model's metadata.
pub fn model_metadata(model: &ServedModel) -> Value {
    let d = model.input_dims;
    json!({
        "name": model.name,
        "versions": [VERSION],
        "platform": "kneepoint",
        "inputs": [{
            "name": INPUT,
            "datatype": model.input_type.as_str(),
            "shape": [-1, d[0], d[1], d[2]],
        }],
        "outputs": [
            {"name": CLASSES, "datatype": DataType::Int32.as_str(), "shape": [-1, model.top_k]},
            {"name": SCORES, "datatype": DataType::Fp32.as_str(), "shape": [-1, model.top_k]},
        ],
        "parameters": {
            "if_id": model.if_id,
            "scores": if model.probabilities { "probabilities" } else { "logits" },
            "slo_ms": model.slo.as_secs_f64() * 1e3,
        },
    })
}

/// `GET /v2`: the server's metadata.
pub fn server_metadata() -> Value {
    json!({
        "name": "kneepoint",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kneepoint_client::{Class, RequestId};

    fn model(dtype: DataType) -> ServedModel {
        ServedModel {
            name: "m".into(),
            if_id: 3,
            input_type: dtype,
            input_dims: [2, 2, 3],
            input_bytes: 12 * dtype.size(),
            top_k: 2,
            probabilities: true,
            slo: Duration::from_millis(20),
        }
    }

    fn err(r: Result<InferRequest, V2Error>) -> String {
        r.unwrap_err().0
    }

    #[test]
    fn json_tensors_flat_or_nested_become_wire_bytes() {
        let m = model(DataType::Uint8);
        let flat: Vec<u32> = (0..24).collect();
        let body = json!({
            "id": "r1",
            "inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [2, 2, 2, 3], "data": flat}],
        })
        .to_string();
        let r = parse_infer(&m, body.as_bytes(), None, 4).unwrap();
        assert_eq!(
            r,
            InferRequest {
                id: Some("r1".into()),
                batch: 2,
                input: (0..24).collect(),
                classes: OutputForm::Json,
                scores: OutputForm::Json,
                timeout: None,
            }
        );
        let nested = r#"{"inputs":[{"name":"INPUT","datatype":"UINT8","shape":[1,2,2,3],
            "data":[[[1,2,3],[4,5,6]],[[7,8,9],[10,11,255]]]}],
            "parameters":{"timeout":1500,"other":"ignored"}}"#;
        let r = parse_infer(&m, nested.as_bytes(), None, 4).unwrap();
        assert_eq!(r.input, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 255]);
        assert_eq!(r.timeout, Some(Duration::from_micros(1500)));

        let f = model(DataType::Fp32);
        let body = json!({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 2, 2, 3],
            "data": [0.5, -1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1e-3]}]})
        .to_string();
        let r = parse_infer(&f, body.as_bytes(), None, 1).unwrap();
        assert_eq!(r.input.len(), 48);
        assert_eq!(r.input[..4], 0.5f32.to_le_bytes());
        assert_eq!(r.input[4..8], (-1f32).to_le_bytes());
        assert_eq!(r.input[44..], 1e-3f32.to_le_bytes());
    }

    #[test]
    fn binary_tensors_are_taken_after_the_header() {
        let m = model(DataType::Uint8);
        let header = json!({
            "inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [1, 2, 2, 3],
                        "parameters": {"binary_data_size": 12}}],
            "outputs": [{"name": "SCORES", "parameters": {"binary_data": true}}],
        })
        .to_string();
        let mut body = header.clone().into_bytes();
        body.extend(100..112u8);
        let r = parse_infer(&m, &body, Some(header.len()), 1).unwrap();
        assert_eq!(r.input, (100..112).collect::<Vec<u8>>());
        assert_eq!(
            (r.classes, r.scores),
            (OutputForm::Omit, OutputForm::Binary)
        );
        // One byte short, one too many, a header length past the body.
        assert_eq!(
            err(parse_infer(
                &m,
                &body[..body.len() - 1],
                Some(header.len()),
                1
            )),
            "the binary part of the body is 11 bytes, input INPUT is 12"
        );
        let mut long = body.clone();
        long.push(0);
        assert_eq!(
            err(parse_infer(&m, &long, Some(header.len()), 1)),
            "the binary part of the body is 13 bytes, input INPUT is 12"
        );
        assert_eq!(
            err(parse_infer(&m, &body, Some(body.len() + 1), 1)),
            format!(
                "Inference-Header-Content-Length {} exceeds the body's {} bytes",
                body.len() + 1,
                body.len()
            )
        );
        assert_eq!(
            err(parse_infer(&m, header.as_bytes(), None, 1)),
            "input INPUT says binary_data_size but the request has no \
             Inference-Header-Content-Length header"
        );
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let m = model(DataType::Uint8);
        let req = |input: Value| json!({"inputs": [input]}).to_string();
        let p = |body: &str| err(parse_infer(&m, body.as_bytes(), None, 2));
        assert_eq!(
            p(r#"{"inputs": []}"#),
            "model 'm' takes exactly one input (INPUT), the request has 0"
        );
        let ok_data: Vec<u8> = vec![1; 12];
        assert_eq!(
            p(&req(
                json!({"name": "x", "datatype": "UINT8", "shape": [1,2,2,3], "data": ok_data})
            )),
            "model 'm' has no input 'x' (its input is INPUT)"
        );
        assert_eq!(
            p(&req(
                json!({"name": "INPUT", "datatype": "FP32", "shape": [1,2,2,3], "data": ok_data})
            )),
            "input INPUT of model 'm' is UINT8, the request says FP32"
        );
        for shape in [
            json!([3, 2, 2, 3]),
            json!([0, 2, 2, 3]),
            json!([1, 2, 3, 2]),
            json!([2, 2, 3]),
            json!([-1, 2, 2, 3]),
        ] {
            assert_eq!(
                p(&req(
                    json!({"name": "INPUT", "datatype": "UINT8", "shape": shape, "data": ok_data})
                )),
                format!(
                    "input INPUT: shape {:?} is not [N, 2, 2, 3] with 1 <= N <= 2 for model 'm'",
                    serde_json::from_value::<Vec<i64>>(shape.clone()).unwrap()
                )
            );
        }
        assert_eq!(
            p(&req(
                json!({"name": "INPUT", "datatype": "UINT8", "shape": [1,2,2,3], "data": vec![1; 11]})
            )),
            "input INPUT: `data` has 11 elements, the shape says 12"
        );
        assert_eq!(
            p(&req(
                json!({"name": "INPUT", "datatype": "UINT8", "shape": [1,2,2,3]})
            )),
            "input INPUT has no `data`"
        );
        assert_eq!(
            p(&json!({"inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [1,2,2,3], "data": ok_data}],
                      "outputs": [{"name": "PROBS"}]}).to_string()),
            "model 'm' has no output 'PROBS' (its outputs are CLASSES, SCORES)"
        );
    }

    #[test]
    fn serde_errors_are_passed_on_with_where_they_are() {
        let m = model(DataType::Uint8);
        let p = |body: &str| err(parse_infer(&m, body.as_bytes(), None, 2));
        let data = |d: &str| {
            format!(
                r#"{{"inputs":[{{"name":"INPUT","datatype":"UINT8","shape":[1,2,2,3],"data":{d}}}]}}"#
            )
        };
        // Deep nesting ends in serde_json's recursion limit, not a stack
        // overflow. (Columns are within `data`.)
        let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
        let cases = [
            (r#"{"inputs": ["#.to_string(), "malformed inference request JSON: EOF while parsing a list at line 1 column 12"),
            ("[]".to_string(), "malformed inference request JSON: invalid length 2, expected struct RawRequest with 4 elements at line 1 column 2"),
            (data(&format!("[{}]", ["1"; 13].join(","))), "input INPUT: `data`: more elements than the shape's 12 at line 1 column 26"),
            (data(&format!("[{},256]", ["1"; 11].join(","))), "input INPUT: `data`: 256 is not a UINT8 (an integer in 0..=255) at line 1 column 26"),
            (data(&format!("[{},-1]", ["1"; 11].join(","))), "input INPUT: `data`: -1 is not a UINT8 (an integer in 0..=255) at line 1 column 25"),
            (data(&format!("[{},1.5]", ["1"; 11].join(","))), "input INPUT: `data`: 1.5 is not a UINT8 (an integer in 0..=255) at line 1 column 26"),
            (data(r#""abc""#), "input INPUT: `data`: invalid type: string \"abc\", expected a number or an array of numbers at line 1 column 5"),
            (data(&deep), "input INPUT: `data`: recursion limit exceeded at line 1 column 128"),
        ];
        for (body, want) in cases {
            assert_eq!(p(&body), want);
        }
    }

    fn answer(top: &[(u32, f32)]) -> Answer {
        Answer {
            request_id: RequestId(1),
            if_id: 3,
            top_k: top
                .iter()
                .map(|&(class, score)| Class { class, score })
                .collect(),
            batch_size: 1,
            platform_latency_us: 10,
            rtt: Duration::from_micros(20),
        }
    }

    #[test]
    fn responses_in_json_and_binary() {
        let m = model(DataType::Uint8);
        let answers = [
            answer(&[(967, 0.5), (2, 0.25)]),
            answer(&[(7, 0.75), (1, 0.125)]),
        ];
        let mut req = InferRequest {
            id: Some("a".into()),
            batch: 2,
            input: vec![],
            classes: OutputForm::Json,
            scores: OutputForm::Json,
            timeout: None,
        };
        let r = render_infer(&m, &req, &answers);
        assert_eq!(r.header_len, None);
        assert_eq!(
            serde_json::from_slice::<Value>(&r.body).unwrap(),
            json!({"model_name": "m", "model_version": "1", "id": "a", "outputs": [
                {"name": "CLASSES", "datatype": "INT32", "shape": [2, 2], "data": [967, 2, 7, 1]},
                {"name": "SCORES", "datatype": "FP32", "shape": [2, 2], "data": [0.5, 0.25, 0.75, 0.125]},
            ]})
        );
        req.id = None;
        req.classes = OutputForm::Binary;
        req.scores = OutputForm::Binary;
        let r = render_infer(&m, &req, &answers);
        let n = r.header_len.unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&r.body[..n]).unwrap(),
            json!({"model_name": "m", "model_version": "1", "outputs": [
                {"name": "CLASSES", "datatype": "INT32", "shape": [2, 2], "parameters": {"binary_data_size": 16}},
                {"name": "SCORES", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}},
            ]})
        );
        let mut want = Vec::new();
        for c in [967i32, 2, 7, 1] {
            want.extend_from_slice(&c.to_le_bytes());
        }
        for s in [0.5f32, 0.25, 0.75, 0.125] {
            want.extend_from_slice(&s.to_le_bytes());
        }
        assert_eq!(&r.body[n..], &want[..]);
    }

    #[test]
    fn metadata_describes_the_tensors() {
        assert_eq!(
            model_metadata(&model(DataType::Uint8)),
            json!({"name": "m", "versions": ["1"], "platform": "kneepoint",
                "inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [-1, 2, 2, 3]}],
                "outputs": [{"name": "CLASSES", "datatype": "INT32", "shape": [-1, 2]},
                            {"name": "SCORES", "datatype": "FP32", "shape": [-1, 2]}],
                "parameters": {"if_id": 3, "scores": "probabilities", "slo_ms": 20.0}})
        );
    }
}
