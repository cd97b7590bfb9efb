//! The HTTP side: the KServe v2 routes (axum), what each error becomes
//! (status code and `{"error": ...}` body), the limits that keep memory
//! bounded, and the accept loop (hyper HTTP/1.1 with keep-alive and a
//! header read timeout).
//!
//! Limits, in the order a request meets them:
//! 1. at most `max_connections` connections (the accept loop waits for a
//!    free one);
//! 2. the request head within `header_timeout` (hyper; a slow-loris that
//!    trickles headers is cut off, an idle keep-alive connection too);
//! 3. `infer` only: the model is served (404), no `Content-Encoding`
//!    (415), a `Content-Length` (411) of at most the model's largest
//!    request (413: `max_batch` inputs plus [`HEADER_ALLOWANCE`] in binary
//!    form, or [`JSON_BYTES_PER_ELEMENT`] per element in JSON form),
//!    refused before a byte of the body is read;
//! 4. the body's bytes reserved from a gateway-wide budget
//!    (`max_body_bytes`; a request waits for room), then read within
//!    `body_timeout` (408), never past its `Content-Length`;
//! 5. the platform's answer within the request's timeout (504).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Limited};
use kneepoint_client::{Answer, ClientError, Status};
use serde_json::{json, Value};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::bridge::Bridge;
use crate::models::{Models, ServedModel, VERSION};
use crate::v2;

/// JSON header bytes allowed beside the tensor data (names, shapes,
/// parameters, whitespace): generous for what any client writes.
pub const HEADER_ALLOWANCE: usize = 64 * 1024;

/// Body bytes allowed per element in JSON form: a UINT8 is at most
/// `255, ` (5), an FP32 as Python writes it up to 25 (`-1.2345678901234567e-30, `).
pub const JSON_BYTES_PER_ELEMENT: usize = 26;

/// The header carrying the JSON part's length in the binary form.
pub const HEADER_LENGTH: &str = "inference-header-content-length";
/// The response header of a successful `infer` that says how long the
/// platform took for it: the UDP round trip (first fragment sent to answer
/// received), µs; for a batch, its longest item. A client that times the
/// HTTP exchange can tell from it what the gateway and the HTTP hop added,
/// request by request (kp-http-load reports it as `beyond_platform_us`).
pub const PLATFORM_RTT_HEADER: &str = "kneepoint-platform-rtt-us";

/// What the gateway is allowed to use.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Batch items per infer request at most.
    pub max_batch: usize,
    /// How long a platform request may take (and the cap on a client's
    /// own `timeout` parameter).
    pub timeout: Duration,
    /// How long the body of a request may take to arrive.
    pub body_timeout: Duration,
    /// Request bodies held in memory at once, bytes.
    pub max_body_bytes: usize,
    /// How long a readiness probe's answer is reused.
    pub ready_ttl: Duration,
}

/// Why an HTTP request failed: each becomes a status code and a
/// KServe-style `{"error": "..."}` body.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body is not a valid inference request for the model (400).
    #[error(transparent)]
    BadRequest(#[from] v2::V2Error),
    /// A header the gateway cannot work with (400).
    #[error("{0}")]
    BadHeader(String),
    /// No such model (404).
    #[error("unknown model '{0}'")]
    UnknownModel(String),
    /// No such version of a model (404).
    #[error("model '{model}' has no version '{version}' (its only version is {VERSION})")]
    UnknownVersion {
        /// The model.
        model: String,
        /// The version asked for.
        version: String,
    },
    /// No such route (404).
    #[error("no such endpoint: {0}")]
    NoRoute(String),
    /// A route called with a method it does not take (405).
    #[error("{0} is not allowed on {1}")]
    MethodNotAllowed(String, String),
    /// `infer` without `Content-Length` (411).
    #[error("infer needs a Content-Length (chunked bodies are not accepted)")]
    LengthRequired,
    /// A body larger than the model's largest request (413).
    #[error("request body of {got} bytes exceeds the {limit} bytes model '{model}' can take")]
    TooLarge {
        /// The model.
        model: String,
        /// Content-Length.
        got: u64,
        /// The limit.
        limit: usize,
    },
    /// A compressed body (415).
    #[error("Content-Encoding '{0}' is not supported: send the body uncompressed")]
    Encoding(String),
    /// The body did not arrive in time (408).
    #[error("request body not received within {0:?}")]
    BodyTimeout(Duration),
    /// The body ended early or could not be read (400).
    #[error("request body: {0}")]
    Body(String),
    /// The platform's answer for model `model` was an error.
    #[error("model '{model}': {source}")]
    Platform {
        /// The model.
        model: String,
        /// What the client said.
        source: ClientError,
    },
    /// A model not ready (503).
    #[error("{0}")]
    NotReady(String),
}

impl GatewayError {
    /// The HTTP status it is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::BadRequest(_) | GatewayError::BadHeader(_) | GatewayError::Body(_) => {
                StatusCode::BAD_REQUEST
            }
            GatewayError::UnknownModel(_)
            | GatewayError::UnknownVersion { .. }
            | GatewayError::NoRoute(_) => StatusCode::NOT_FOUND,
            GatewayError::MethodNotAllowed(..) => StatusCode::METHOD_NOT_ALLOWED,
            GatewayError::LengthRequired => StatusCode::LENGTH_REQUIRED,
            GatewayError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::Encoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            GatewayError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            GatewayError::Platform { source, .. } => platform_status(source),
            GatewayError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// The HTTP status for a platform request's error:
///
/// | error | HTTP | why |
/// |---|---|---|
/// | OVERLOADED | 503 + `Retry-After: 1` | shed; a later try may succeed |
/// | BAD_REQUEST | 400 | the platform refused the input |
/// | UNKNOWN_IF | 404 | no IF serves the model: for the client, no such model (its `/ready` says 503) |
/// | INCOMPLETE | 502 | fragments lost between gateway and platform |
/// | INTERNAL | 500 | the model failed on this input |
/// | timeout | 504 | no answer in time |
/// | unreachable | 502 | nothing listens at the platform's address |
/// | anything else (a socket error) | 500 | |
pub fn platform_status(e: &ClientError) -> StatusCode {
    match e.status() {
        Some(Status::Overloaded) => StatusCode::SERVICE_UNAVAILABLE,
        Some(Status::BadRequest) => StatusCode::BAD_REQUEST,
        Some(Status::UnknownIf) => StatusCode::NOT_FOUND,
        Some(Status::Incomplete) => StatusCode::BAD_GATEWAY,
        Some(Status::Internal) | Some(Status::Ok) => StatusCode::INTERNAL_SERVER_ERROR,
        None => match e {
            ClientError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ClientError::Unreachable => StatusCode::BAD_GATEWAY,
            ClientError::WrongSize { .. }
            | ClientError::EmptyInput
            | ClientError::InputTooLarge { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut r = (status, Json(json!({ "error": self.to_string() }))).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

/// How infer requests ended, by HTTP status, and the gateway's own time
/// in the answered ones: the report's counters.
#[derive(Debug)]
pub struct Counters {
    by_status: Mutex<HashMap<u16, u64>>,
    /// Platform requests sent (a batch of N is N).
    pub platform_requests: AtomicU64,
    /// Per answered request, µs: from the handler's start (head received)
    /// to the response built, less the platform round trip (the longest
    /// of its items'): reading and parsing the body, bridging, rendering.
    /// (`None` only if hdrhistogram refused 3 significant digits.)
    own_us: Mutex<Option<Histogram<u64>>>,
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            by_status: Mutex::default(),
            platform_requests: AtomicU64::new(0),
            own_us: Mutex::new(Histogram::new(3).ok()),
        }
    }
}

impl Counters {
    fn count(&self, status: StatusCode) {
        *self
            .by_status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(status.as_u16())
            .or_default() += 1;
    }

    fn own_time(&self, us: u64) {
        if let Some(h) = self
            .own_us
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
        {
            h.saturating_record(us.max(1));
        }
    }

    /// `{"infer": {"200": n, "400": n, ...}, "platform_requests": n,
    /// "own_us": {"count", "p50", "p99", "max"}}`.
    pub fn report(&self) -> Value {
        let own = self
            .own_us
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map_or(Value::Null, |h| {
                json!({
                    "count": h.len(),
                    "p50": h.value_at_quantile(0.5),
                    "p99": h.value_at_quantile(0.99),
                    "max": h.max(),
                })
            });
        let by = self
            .by_status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut codes: Vec<_> = by.iter().collect();
        codes.sort();
        let infer: serde_json::Map<String, Value> = codes
            .into_iter()
            .map(|(c, n)| (c.to_string(), Value::from(*n)))
            .collect();
        json!({
            "infer": infer,
            "platform_requests": self.platform_requests.load(Ordering::Relaxed),
            "own_us": own,
        })
    }
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct Gateway {
    /// The served models.
    pub models: Models,
    /// The platform.
    pub bridge: Bridge,
    /// The limits.
    pub limits: Limits,
    /// Outcome counters.
    pub counters: Counters,
    body_budget: Semaphore,
    ready: Mutex<HashMap<String, Probe>>,
}

impl Gateway {
    /// A gateway for `models` on `bridge`.
    pub fn new(models: Models, bridge: Bridge, limits: Limits) -> Gateway {
        let permits = limits
            .max_body_bytes
            .div_ceil(1024)
            .min(Semaphore::MAX_PERMITS);
        Gateway {
            models,
            bridge,
            limits,
            counters: Counters::default(),
            body_budget: Semaphore::new(permits),
            ready: Mutex::new(HashMap::new()),
        }
    }

    fn model(&self, name: &str) -> Result<&ServedModel, GatewayError> {
        self.models
            .get(name)
            .ok_or_else(|| GatewayError::UnknownModel(name.to_string()))
    }

    /// The largest body an infer request for `model` may have.
    pub fn body_limit(&self, model: &ServedModel, binary: bool) -> usize {
        let per_item = if binary {
            model.input_bytes
        } else {
            model.input_elems() * JSON_BYTES_PER_ELEMENT
        };
        HEADER_ALLOWANCE + self.limits.max_batch * per_item
    }

    /// Whether an IF serves `model`. What the last answer for it said, if
    /// it came within `ready_ttl` (an infer request's, or a probe's);
    /// otherwise a probe: a one-byte request, which an IF refuses as
    /// BAD_REQUEST (no model takes one byte) and the if-manager answers
    /// UNKNOWN_IF when no IF has the model's if_id. So a model with traffic
    /// is never probed, and probes cannot flood the platform: at most one
    /// per model per `ready_ttl`. (An IF counts each probe as a bad request
    /// that missed its SLO.)
    async fn probe(&self, model: &ServedModel) -> Result<(), String> {
        let now = Instant::now();
        if let Some((at, r)) = self.ready_cache().get(&model.name) {
            if now.duration_since(*at) < self.limits.ready_ttl {
                return r.clone();
            }
        }
        let wait = self.limits.timeout.min(Duration::from_millis(500));
        let result = match self.bridge.submit(model.if_id, &[0], wait) {
            Err(e) => Err(e),
            Ok(answer) => answer.await,
        };
        let r = readiness(model, &result).unwrap_or_else(|| {
            Err(format!(
                "model '{}' (if_id {}): the platform did not answer: {}",
                model.name,
                model.if_id,
                result.err().map_or_else(String::new, |e| e.to_string())
            ))
        });
        self.ready_cache()
            .insert(model.name.clone(), (Instant::now(), r.clone()));
        r
    }

    /// Records what an infer request's answer says of `model`'s readiness.
    fn note_answer(&self, model: &ServedModel, result: &Result<Answer, ClientError>) {
        if let Some(r) = readiness(model, result) {
            self.ready_cache()
                .insert(model.name.clone(), (Instant::now(), r));
        }
    }

    fn ready_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Probe>> {
        self.ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What an answer says of whether an IF serves `model`: any answer from an
/// IF (OK, or an error status only an IF sends) says yes, UNKNOWN_IF says
/// no, anything else (no answer, a lost fragment) says nothing.
fn readiness(
    model: &ServedModel,
    result: &Result<Answer, ClientError>,
) -> Option<Result<(), String>> {
    match result {
        Ok(_) => Some(Ok(())),
        Err(e) => match e.status()? {
            Status::UnknownIf => Some(Err(format!(
                "model '{}' is not deployed (no inference function has if_id {})",
                model.name, model.if_id
            ))),
            Status::Incomplete => None,
            Status::Ok | Status::BadRequest | Status::Overloaded | Status::Internal => Some(Ok(())),
        },
    }
}

type Shared = State<Arc<Gateway>>;

/// A readiness probe's result (`Err`: why not ready) and when it was had.
type Probe = (Instant, Result<(), String>);

/// The KServe v2 routes over `gw`.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(server_ready))
        .route("/v2/models/{name}", get(model_metadata))
        .route(
            "/v2/models/{name}/versions/{version}",
            get(version_metadata),
        )
        .route("/v2/models/{name}/ready", get(model_ready))
        .route(
            "/v2/models/{name}/versions/{version}/ready",
            get(version_ready),
        )
        .route("/v2/models/{name}/infer", post(infer))
        .route(
            "/v2/models/{name}/versions/{version}/infer",
            post(version_infer),
        )
        .fallback(|req: Request| async move {
            GatewayError::NoRoute(format!("{} {}", req.method(), req.uri().path()))
        })
        .method_not_allowed_fallback(|req: Request| async move {
            GatewayError::MethodNotAllowed(req.method().to_string(), req.uri().path().to_string())
        })
        .with_state(gw)
}

async fn server_metadata() -> Json<Value> {
    Json(v2::server_metadata())
}

async fn live() -> Json<Value> {
    Json(json!({"live": true}))
}

/// Ready when every served model is.
async fn server_ready(State(gw): Shared) -> Result<Json<Value>, GatewayError> {
    for m in gw.models.values() {
        gw.probe(m).await.map_err(GatewayError::NotReady)?;
    }
    Ok(Json(json!({"ready": true})))
}

fn check_version(model: &ServedModel, version: &str) -> Result<(), GatewayError> {
    if version == VERSION {
        Ok(())
    } else {
        Err(GatewayError::UnknownVersion {
            model: model.name.clone(),
            version: version.to_string(),
        })
    }
}

async fn model_metadata(
    State(gw): Shared,
    Path(name): Path<String>,
) -> Result<Json<Value>, GatewayError> {
    Ok(Json(v2::model_metadata(gw.model(&name)?)))
}

async fn version_metadata(
    State(gw): Shared,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<Value>, GatewayError> {
    let m = gw.model(&name)?;
    check_version(m, &version)?;
    Ok(Json(v2::model_metadata(m)))
}

async fn model_ready(
    State(gw): Shared,
    Path(name): Path<String>,
) -> Result<Json<Value>, GatewayError> {
    let m = gw.model(&name)?;
    gw.probe(m).await.map_err(GatewayError::NotReady)?;
    Ok(Json(json!({"name": m.name, "ready": true})))
}

async fn version_ready(
    State(gw): Shared,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<Value>, GatewayError> {
    check_version(gw.model(&name)?, &version)?;
    model_ready(State(gw), Path(name)).await
}

async fn version_infer(
    State(gw): Shared,
    Path((name, version)): Path<(String, String)>,
    req: Request,
) -> Response {
    if let Err(e) = gw.model(&name).and_then(|m| check_version(m, &version)) {
        gw.counters.count(e.status());
        return e.into_response();
    }
    infer(State(gw), Path(name), req).await
}

async fn infer(State(gw): Shared, Path(name): Path<String>, req: Request) -> Response {
    let r = match infer_inner(&gw, &name, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    gw.counters.count(r.status());
    r
}

/// A header's value as text, if present.
fn header_str<'h>(h: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, GatewayError> {
    h.get(name)
        .map(|v| {
            v.to_str()
                .map_err(|_| GatewayError::BadHeader(format!("{name} is not ASCII")))
        })
        .transpose()
}

async fn infer_inner(gw: &Gateway, name: &str, req: Request) -> Result<Response, GatewayError> {
    let start = Instant::now();
    let model = gw.model(name)?;
    let (parts, body) = req.into_parts();
    if let Some(enc) = header_str(&parts.headers, header::CONTENT_ENCODING.as_str())? {
        if !enc.eq_ignore_ascii_case("identity") {
            return Err(GatewayError::Encoding(enc.to_string()));
        }
    }
    let header_len = header_str(&parts.headers, HEADER_LENGTH)?
        .map(|v| {
            v.trim().parse::<usize>().map_err(|_| {
                GatewayError::BadHeader(format!(
                    "Inference-Header-Content-Length {v:?} is not a byte count"
                ))
            })
        })
        .transpose()?;
    let length = header_str(&parts.headers, header::CONTENT_LENGTH.as_str())?
        .ok_or(GatewayError::LengthRequired)?
        .trim()
        .parse::<u64>()
        .map_err(|_| GatewayError::BadHeader("Content-Length is not a byte count".into()))?;
    let limit = gw.body_limit(model, header_len.is_some());
    if length > limit as u64 {
        return Err(GatewayError::TooLarge {
            model: model.name.clone(),
            got: length,
            limit,
        });
    }
    let length = length as usize;
    let (body, _reserved) = read_body(gw, body, length).await?;
    let request = v2::parse_infer(model, &body, header_len, gw.limits.max_batch)?;
    drop(body);
    let timeout = request
        .timeout
        .map_or(gw.limits.timeout, |t| t.min(gw.limits.timeout));
    let mut pending = Vec::with_capacity(request.batch);
    for item in request.input.chunks_exact(model.input_bytes) {
        let sent = gw.bridge.submit(model.if_id, item, timeout);
        gw.counters
            .platform_requests
            .fetch_add(1, Ordering::Relaxed);
        pending.push(sent.map_err(|source| GatewayError::Platform {
            model: model.name.clone(),
            source,
        })?);
    }
    let mut answers = Vec::with_capacity(pending.len());
    let mut first_error = None;
    for p in pending {
        // Every one is awaited (they end by their timeout), so the first
        // error is returned only once all are done.
        let result = p.await;
        gw.note_answer(model, &result);
        match result {
            Ok(a) => answers.push(a),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(source) = first_error {
        return Err(GatewayError::Platform {
            model: model.name.clone(),
            source,
        });
    }
    let out = v2::render_infer(model, &request, &answers);
    let platform = answers.iter().map(|a| a.rtt).max().unwrap_or_default();
    let own = start.elapsed().saturating_sub(platform);
    gw.counters
        .own_time(u64::try_from(own.as_micros()).unwrap_or(u64::MAX));
    let mut r = Response::new(Body::from(out.body));
    let h = r.headers_mut();
    h.insert(
        PLATFORM_RTT_HEADER,
        HeaderValue::from(u64::try_from(platform.as_micros()).unwrap_or(u64::MAX)),
    );
    match out.header_len {
        Some(n) => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            h.insert(HEADER_LENGTH, HeaderValue::from(n));
        }
        None => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
    }
    Ok(r)
}

/// The body, exactly `length` bytes, read within `body_timeout`, and its
/// bytes' reservation from the gateway's budget (hold it while the body or
/// what is parsed from it is alive).
async fn read_body(
    gw: &Gateway,
    body: Body,
    length: usize,
) -> Result<(Bytes, SemaphorePermit<'_>), GatewayError> {
    let kib = u32::try_from(length.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
    let deadline = gw.limits.body_timeout;
    let read = async {
        let permit = gw
            .body_budget
            .acquire_many(kib)
            .await
            .map_err(|_| GatewayError::Body("gateway shutting down".into()))?;
        let collected = Limited::new(body, length)
            .collect()
            .await
            .map_err(|e| GatewayError::Body(e.to_string()))?;
        let bytes = collected.to_bytes();
        if bytes.len() != length {
            return Err(GatewayError::Body(format!(
                "{} bytes received, Content-Length says {length}",
                bytes.len()
            )));
        }
        Ok((bytes, permit))
    };
    tokio::time::timeout(deadline, read)
        .await
        .map_err(|_| GatewayError::BodyTimeout(deadline))?
}

/// Serves `app` on `listener` until `shutdown` resolves: HTTP/1.1 with
/// keep-alive, at most `max_connections` at once (further ones wait in the
/// listen backlog), each request head within `header_timeout`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    max_connections: usize,
    header_timeout: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            () = &mut shutdown => return,
        };
        let (stream, _peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                // EMFILE and the like: back off, do not spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    tower::ServiceExt::oneshot(app.clone(), req)
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
            drop(permit);
        });
    }
}

/// Bytes hyper buffers for a request head at most (its buffer; bodies
/// stream through it): long enough for any KServe client's headers.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

#[cfg(test)]
mod tests;
