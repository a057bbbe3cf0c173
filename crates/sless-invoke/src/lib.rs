//! The invocation pipeline: "invoke function X for source S and record it", in one
//! place for every invoker (the gateway's `/fn/` and `/t/`, the API's `/invoke`,
//! cron, jobs, and the queue, device and async invokers to come).
//!
//! An invoker describes the call ([`Call`]: namespace, function, source, request id,
//! event) and hands it to the [`Invoker`], which starts the record's clock, calls the
//! executor and answers with an [`Outcome`]. The outcome's status comes from one
//! table ([`status_of`]), and [`Outcome::finish`] builds the record, once, and hands
//! it to the [`Recorder`]. A caller that answers with a status of its own (the
//! gateway maps a handler's `statusCode`) finishes with that status; the others
//! take [`Invoker::run`], which finishes with the pipeline's status.
//!
//! Every finished outcome is also counted in the function's Prometheus series
//! (`sless_metrics::FunctionMetrics`, which the executor hands back with its answer,
//! so no label is looked up per call).
//!
//! Invariant: nothing here touches the metadata store. With recording off nothing is
//! timed, allocated or sent for the record; with metrics off nothing is timed or
//! counted for them.

mod failed;
mod record;
pub mod response;
mod routes;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sless_core::invocation::{InvocationRecord, InvocationSource};
use sless_executor::{Executor, InvokeError, InvokeRequest, InvokeResponse};
use sless_records::Recorder;

pub use failed::{FailedFunctions, Failure};
pub use routes::{HttpRoute, HttpRoutes, RouteMatch};

/// The status a handler's exception answers with (unless the caller maps the
/// handler's answer itself, as the gateway does).
pub const HANDLER_ERROR_STATUS: u16 = 500;

/// The status and error code of a platform failure: the one table every invoker uses.
pub fn status_of(e: &InvokeError) -> (u16, &'static str) {
    match e {
        InvokeError::NotFound => (404, "not_found"),
        InvokeError::Paused(_) => (503, "paused"),
        InvokeError::Unavailable(_) => (503, "unavailable"),
        InvokeError::Timeout { .. } => (504, "timeout"),
        InvokeError::InstanceFailed(_) => (502, "instance_failed"),
        InvokeError::QuotaExceeded(_) => (429, "quota_exceeded"),
    }
}

/// Errors preparing a call.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The event could not be encoded as JSON; nothing was invoked.
    #[error("the event could not be encoded as JSON: {0}")]
    Encode(#[from] serde_json::Error),
}

/// An event as the instance protocol carries it: JSON bytes.
pub fn encode_event(event: &serde_json::Value) -> Result<Bytes, EventError> {
    Ok(Bytes::from(serde_json::to_vec(event)?))
}

/// The longest `context.message` sent whole, in bytes of JSON: the instance protocol's
/// request head is at most 64 KiB, and the message travels in a header of it.
pub const MAX_MESSAGE_BYTES: usize = 48 * 1024;

/// A delivered message's `context.message` as the instance protocol carries it: JSON
/// in ASCII (every other character escaped as `\uXXXX`, so a header carries it
/// unchanged). When it is longer than [`MAX_MESSAGE_BYTES`] its `headers` are left out
/// (and `"truncated": true` added); when that is still too long, all but the
/// message's `kind`, `topic`, `key`, `partition`, `offset`, `id`, `attempt` and
/// `published_at`.
pub fn encode_message(message: &serde_json::Value) -> Result<Bytes, EventError> {
    let whole = ascii_json(message)?;
    if whole.len() <= MAX_MESSAGE_BYTES {
        return Ok(Bytes::from(whole));
    }
    let serde_json::Value::Object(fields) = message else {
        return Ok(Bytes::from(ascii_json(
            &serde_json::json!({"truncated": true}),
        )?));
    };
    let mut slim = fields.clone();
    slim.remove("headers");
    slim.insert("truncated".into(), serde_json::Value::Bool(true));
    let slimmer = ascii_json(&serde_json::Value::Object(slim.clone()))?;
    if slimmer.len() <= MAX_MESSAGE_BYTES {
        return Ok(Bytes::from(slimmer));
    }
    const KEPT: [&str; 8] = [
        "kind",
        "topic",
        "key",
        "partition",
        "offset",
        "id",
        "attempt",
        "published_at",
    ];
    slim.retain(|k, v| {
        k == "truncated" || (KEPT.contains(&k.as_str()) && v.to_string().len() < 1024)
    });
    Ok(Bytes::from(ascii_json(&serde_json::Value::Object(slim))?))
}

/// `value` as JSON with every non-ASCII character escaped.
fn ascii_json(value: &serde_json::Value) -> Result<Vec<u8>, EventError> {
    let text = serde_json::to_string(value)?;
    if text.is_ascii() {
        return Ok(text.into_bytes());
    }
    // Outside strings JSON is ASCII already, so escaping every other character is
    // exact: inside a string `\uXXXX` (a surrogate pair above U+FFFF) means it.
    let mut out = String::with_capacity(text.len() + 16);
    let mut units = [0u16; 2];
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    Ok(out.into_bytes())
}

/// A fresh request id: 32 lower-case hex digits.
pub fn new_request_id() -> String {
    let mut hex = [0u8; 32];
    // 16 bytes always fit 32 hex digits, which are ASCII.
    let _ = hex::encode_to_slice(rand::random::<u128>().to_be_bytes(), &mut hex);
    String::from_utf8_lossy(&hex).into_owned()
}

/// One call to make: which function, for which source, with which event.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    pub namespace: &'a str,
    /// The executor's pool to invoke (a function, or a job's private pool).
    pub function: &'a str,
    pub source: InvocationSource,
    /// The request id the instance tags its output with, and the record keeps.
    pub request_id: &'a str,
    /// The event, already encoded as JSON (see [`encode_event`]).
    pub event: Bytes,
    /// The name the record carries, when it is not `function` (a job's run
    /// records the function it ran, or its pool for its own code).
    pub recorded_as: Option<&'a str>,
    /// Deliveries: which attempt this is (1-based), for the record.
    pub attempt: Option<u32>,
    /// The queue or device trigger delivering it, for the record.
    pub trigger: Option<&'a str>,
    /// The async call it is an attempt of, for the record.
    pub call_id: Option<&'a str>,
    /// `context.message` for the handler (see [`encode_message`]).
    pub message: Option<Bytes>,
}

impl<'a> Call<'a> {
    pub fn new(
        namespace: &'a str,
        function: &'a str,
        source: InvocationSource,
        request_id: &'a str,
        event: Bytes,
    ) -> Self {
        Self {
            namespace,
            function,
            source,
            request_id,
            event,
            recorded_as: None,
            attempt: None,
            trigger: None,
            call_id: None,
            message: None,
        }
    }

    /// Makes the call attempt number `attempt` (1-based) of a delivery.
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = Some(attempt);
        self
    }

    /// Records the call as delivered by the trigger `name`.
    pub fn trigger(mut self, name: &'a str) -> Self {
        self.trigger = Some(name);
        self
    }

    /// Records the call as an attempt of the async call `id`.
    pub fn call_id(mut self, id: &'a str) -> Self {
        self.call_id = Some(id);
        self
    }

    /// Gives the handler `context.message`, already encoded (see [`encode_message`]).
    pub fn message(mut self, message: Bytes) -> Self {
        self.message = Some(message);
        self
    }

    /// Records the call under `name` instead of the pool it invokes.
    pub fn recorded_as(mut self, name: &'a str) -> Self {
        self.recorded_as = Some(name);
        self
    }
}

/// What a function's name resolves to before a call (for the gateway, which must
/// check a private function's token before reading the body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A pool serves it.
    Serving { private: bool },
    /// It exists but its latest revision failed and nothing serves it.
    Failed(Failure),
}

/// Invokes functions and records their invocations; see the crate's documentation.
pub struct Invoker {
    executor: Arc<Executor>,
    /// `None` when recording is off.
    recorder: Option<Arc<Recorder>>,
    failed: Arc<FailedFunctions>,
}

impl Invoker {
    pub fn new(
        executor: Arc<Executor>,
        recorder: Option<Arc<Recorder>>,
        failed: Arc<FailedFunctions>,
    ) -> Self {
        Self {
            executor,
            recorder,
            failed,
        }
    }

    /// The executor calls go to (for prewarming and deploying, which are not invocations).
    pub fn executor(&self) -> &Arc<Executor> {
        &self.executor
    }

    /// Whether `namespace/name` can be invoked, and whether it is private; `None`
    /// when no function of that name serves or failed.
    pub fn target(&self, namespace: &str, name: &str) -> Option<Target> {
        match self.executor.is_private(namespace, name) {
            Some(private) => Some(Target::Serving { private }),
            None => self.failed.get(namespace, name).map(Target::Failed),
        }
    }

    /// Invokes the call's function. The outcome is recorded when it is finished.
    pub async fn invoke<'a>(&'a self, mut call: Call<'a>) -> Outcome<'a> {
        let pipeline = self.pipeline();
        let started = pipeline.start();
        let clock = sless_metrics::enabled().then(Instant::now);
        let request = InvokeRequest {
            // The record needs the rest of the call; the event goes to the instance.
            event: std::mem::take(&mut call.event),
            request_id: call.request_id.to_string(),
            source: call.source,
            message: call.message.take(),
        };
        let (result, metrics) = self
            .executor
            .invoke_metered(call.namespace, call.function, request)
            .await;
        let mut outcome = pipeline.conclude(&call, started, result);
        outcome.meter = clock.map(|clock| Meter {
            clock,
            // A job's run recorded under its function is counted under that name too.
            metrics: metrics.filter(|_| call.recorded_as.is_none()),
        });
        outcome
    }

    /// Invokes the call's function and records it with the pipeline's status
    /// ([`Outcome::status`]): for invokers with no answer of their own to give
    /// (cron, jobs, queues).
    pub async fn run(&self, call: Call<'_>) -> Finished {
        let outcome = self.invoke(call).await;
        let status = outcome.status();
        let error = outcome.error();
        outcome.count(status);
        let result = outcome.finish_with(status, error.clone());
        Finished {
            result,
            status,
            error,
        }
    }

    fn pipeline(&self) -> Pipeline<'_> {
        Pipeline {
            recorder: self.recorder.as_deref(),
            failed: &self.failed,
        }
    }
}

/// The parts of an invocation around the executor's call: starting the record's
/// clock, and turning the executor's answer into an [`Outcome`].
#[derive(Clone, Copy)]
struct Pipeline<'a> {
    recorder: Option<&'a Recorder>,
    failed: &'a FailedFunctions,
}

impl<'a> Pipeline<'a> {
    /// The record's start; `None` (nothing timed) when recording is off.
    fn start(self) -> Option<Started> {
        self.recorder.is_some().then(Started::now)
    }

    fn conclude(
        self,
        call: &Call<'a>,
        started: Option<Started>,
        result: Result<InvokeResponse, InvokeError>,
    ) -> Outcome<'a> {
        let result = match result {
            Err(InvokeError::NotFound) => Err(self.not_serving(call.namespace, call.function)),
            other => other,
        };
        Outcome {
            result,
            recorder: self.recorder,
            started,
            namespace: call.namespace,
            function: call.recorded_as.unwrap_or(call.function),
            source: call.source,
            request_id: call.request_id,
            attempt: call.attempt,
            trigger: call.trigger,
            call_id: call.call_id,
            meter: None,
        }
    }

    /// The error for a function no pool serves: its failure when it failed,
    /// otherwise [`InvokeError::NotFound`].
    fn not_serving(self, namespace: &str, name: &str) -> InvokeError {
        match self.failed.get(namespace, name) {
            Some(failure) => failed_error(namespace, name, &failure),
            None => InvokeError::NotFound,
        }
    }
}

/// Whether a failure's text is an instance that could not start (the executor's
/// `function … could not start: …` and the controller's `revision … could not start: …`).
pub fn is_start_failure(text: &str) -> bool {
    text.contains(" could not start")
}

/// The error every invoker reports for a function whose latest revision failed:
/// `503 unavailable` with the reason. A start failure keeps its text as the
/// executor words it (`… could not start: …`), so public callers get the same
/// summary of it as of a start failing during a call.
pub fn failed_error(namespace: &str, name: &str, failure: &Failure) -> InvokeError {
    if is_start_failure(&failure.message) {
        InvokeError::Unavailable(failure.message.clone())
    } else {
        InvokeError::Unavailable(format!(
            "function {namespace}/{name} failed: {}",
            failure.message
        ))
    }
}

/// When an invocation started: the wall clock for the record, a monotonic one for
/// its duration.
#[derive(Debug, Clone, Copy)]
struct Started {
    at: DateTime<Utc>,
    clock: Instant,
}

impl Started {
    fn now() -> Self {
        Self {
            at: Utc::now(),
            clock: Instant::now(),
        }
    }
}

/// What the metrics need of an invocation: its clock, and its function's series
/// (`None`: no pool serves it, or it is counted under another name).
struct Meter {
    clock: Instant,
    metrics: Option<Arc<sless_metrics::FunctionMetrics>>,
}

/// What an invocation came to, not yet recorded: finish it with the status the
/// caller answered with.
#[must_use = "an outcome is recorded only when finished"]
pub struct Outcome<'a> {
    /// The executor's answer. A caller that learns more than the executor did (the
    /// API knows a function with no pool that exists in the store) may replace the
    /// error before finishing.
    pub result: Result<InvokeResponse, InvokeError>,
    recorder: Option<&'a Recorder>,
    /// `None` when recording is off.
    started: Option<Started>,
    namespace: &'a str,
    function: &'a str,
    source: InvocationSource,
    request_id: &'a str,
    attempt: Option<u32>,
    trigger: Option<&'a str>,
    call_id: Option<&'a str>,
    /// `None` when metrics are off.
    meter: Option<Meter>,
}

impl Outcome<'_> {
    /// The pipeline's status: 200 for an answer, [`HANDLER_ERROR_STATUS`] for a
    /// handler's exception, [`status_of`] for a platform failure.
    pub fn status(&self) -> u16 {
        match &self.result {
            Ok(r) if r.ok => 200,
            Ok(_) => HANDLER_ERROR_STATUS,
            Err(e) => status_of(e).0,
        }
    }

    /// The error the record keeps: the handler's exception message, or the
    /// platform's reason; `None` when the handler answered.
    pub fn error(&self) -> Option<String> {
        record::error_of(&self.result)
    }

    /// Records the invocation as answered with `status` and gives back the result.
    /// A function that does not exist ([`InvokeError::NotFound`]) leaves no record.
    pub fn finish(self, status: u16) -> Result<InvokeResponse, InvokeError> {
        self.count(status);
        if self.started.is_none() {
            return self.result;
        }
        let error = self.error();
        self.finish_with(status, error)
    }

    /// Counts the invocation in its function's series (a function that does not
    /// exist has none).
    fn count(&self, status: u16) {
        let Some(meter) = &self.meter else { return };
        let cold_start = match &self.result {
            Ok(r) => r.cold_start,
            Err(InvokeError::NotFound) => return,
            Err(_) => false,
        };
        let took = meter.clock.elapsed();
        let source = self.source.as_str();
        match &meter.metrics {
            Some(m) => m.invocation(source, status, took, cold_start),
            None => sless_metrics::invocation(
                self.namespace,
                self.function,
                source,
                status,
                took,
                cold_start,
            ),
        }
    }

    fn finish_with(
        self,
        status: u16,
        error: Option<String>,
    ) -> Result<InvokeResponse, InvokeError> {
        if let (Some(recorder), Some(record)) = (self.recorder, self.record(status, error)) {
            recorder.record(record);
        }
        self.result
    }

    /// The record of this outcome answered with `status`: the one place records are
    /// built. `None` when recording is off or the function does not exist.
    fn record(&self, status: u16, error: Option<String>) -> Option<InvocationRecord> {
        let started = self.started?;
        let (revision, cold_start) = match &self.result {
            Ok(r) => (r.revision, r.cold_start),
            Err(InvokeError::NotFound) => return None,
            Err(_) => (0, false),
        };
        Some(InvocationRecord {
            id: sless_records::new_id(),
            namespace: self.namespace.to_string(),
            function: self.function.to_string(),
            revision,
            source: self.source,
            request_id: self.request_id.to_string(),
            started_at: started.at,
            duration: started.clock.elapsed(),
            status,
            cold_start,
            error: error.map(record::truncate),
            attempt: self.attempt,
            trigger: self.trigger.map(str::to_string),
            call_id: self.call_id.map(str::to_string),
        })
    }
}

/// A finished invocation of [`Invoker::run`]: its result, and the status and error
/// it was recorded with (for a trigger's or job's own status).
#[derive(Debug)]
pub struct Finished {
    pub result: Result<InvokeResponse, InvokeError>,
    pub status: u16,
    pub error: Option<String>,
}

#[cfg(test)]
mod tests;
