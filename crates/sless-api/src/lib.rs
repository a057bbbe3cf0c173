//! The REST API of `../shared/spec/api-v1.md` (`/v1/...`, `/healthz`, `/readyz`, `/metrics`):
//! authentication and tenancy, namespaces, functions, code uploads, logs and the
//! authenticated invoke. Every response body is one of the shapes of
//! `sless-api-types`, which the client decodes too; this crate only fills them.

mod audit;
mod auth;
pub mod backup;
pub mod calls;
pub mod console;
mod dead_letters;
mod devices;
mod error;
mod etag;
mod functions;
mod invocations;
mod jobs;
mod metrics;
mod namespaces;
pub mod openapi;
pub mod quotas;
mod secrets;
mod storage;
mod tokens;
mod triggers;

pub mod jwt;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde_json::Value;
use sless_api_types::Health;
use sless_blob::{ArchiveLimits, BlobStore};
use sless_controller::Controller;
use sless_controller::gc::Collector;
use sless_controller::jobs::Jobs;
use sless_controller::triggers::Triggers;
use sless_executor::Executor;
use sless_logs::LogStore;
use sless_records::Recorder;
use sless_store::{AuditStore, TokenStore};
use sless_store::{InvocationStore, JobStore, Store, TriggerStore};

pub use auth::{Actor, AuthLimiter, Caller, Tokens, hash_token, new_token};
pub use error::ApiError;
pub use metrics::MetricsEndpoint;
pub use storage::{Storage, StorageProblem};

/// Everything the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub blobs: Arc<dyn BlobStore>,
    pub controller: Arc<Controller>,
    /// Storage upkeep: the code storage quota, and collection after deletes.
    pub collector: Arc<Collector>,
    pub executor: Arc<Executor>,
    pub logs: Arc<LogStore>,
    pub tokens: Arc<Tokens>,
    pub archive_limits: ArchiveLimits,
    /// A request body that sends nothing for this long is refused with `408`.
    pub body_timeout: std::time::Duration,
    /// The data directory's health: the store's file and free space.
    pub storage: Arc<storage::Storage>,
    /// Largest event accepted by `/invoke`.
    pub max_invoke_body: usize,
    /// Where invocation records are listed from.
    pub invocations: Arc<dyn InvocationStore>,
    /// Where `/invoke` records invocations; `None` when recording is off.
    pub recorder: Option<Arc<Recorder>>,
    /// The invocation pipeline `/invoke` runs calls through: the gateway's, built once.
    pub invoker: Arc<sless_invoke::Invoker>,
    pub trigger_store: Arc<dyn TriggerStore>,
    pub job_store: Arc<dyn JobStore>,
    /// The running triggers (gateway routes, cron scheduler).
    pub triggers: Arc<Triggers>,
    pub jobs: Arc<Jobs>,
    /// Namespace tokens may give functions `"network": "host"` (otherwise only the admin).
    pub allow_host_network: bool,
    // Token listing and revocation, and the audit log.
    /// Where namespace tokens are listed and revoked.
    pub token_store: Arc<dyn TokenStore>,
    /// Where the audit log is written and read.
    pub audit: Arc<dyn AuditStore>,
    /// Per-namespace quotas: defaults, overrides, usage.
    pub quotas: Arc<quotas::Quotas>,
    // --- Secrets ---
    pub secret_store: Arc<dyn sless_store::SecretStore>,
    /// The server's secret key; `None` only in tests that keep no secrets.
    pub cipher: Option<Arc<sless_secrets::Cipher>>,
    // --- Async calls and dead letters ---
    /// The durable queue of async calls and its dispatcher.
    pub calls: Arc<sless_controller::calls::Calls>,
    /// Where calls are read from.
    pub call_store: Arc<dyn sless_store::CallStore>,
    /// Where dead letters are listed and deleted.
    pub dead_letters: Arc<dyn sless_store::DeadLetterStore>,
    /// Sends dead letters back to be delivered again.
    pub redrive: Arc<sless_controller::dead_letters::Redrive>,
    // --- Devices ---
    /// The device registry and its broker; `None` without `--mqtt-listen`.
    pub devices: Option<Arc<sless_controller::devices::Devices>>,
    /// Where devices and telemetry are read from.
    pub device_store: Arc<dyn sless_store::DeviceStore>,
    // --- Namespace trash ---
    /// Where force-deleted namespaces are kept until restored or purged.
    pub trash: Arc<dyn sless_store::TrashStore>,
    // --- Operations ---
    /// The store `GET /v1/backup` reads; `None`: no backups from this server.
    pub backup: Option<Arc<sless_store::SqlStore>>,
    // --- Metrics ---
    /// `/metrics`: the exporter (or none: `404`) and the token it needs.
    pub metrics: MetricsEndpoint,
}

/// A response body: one of `sless_api_types`' shapes, as the JSON document it is sent as.
pub(crate) fn body<T: serde::Serialize>(shape: &T) -> Result<axum::Json<Value>, ApiError> {
    sless_api_types::to_body(shape)
        .map(axum::Json)
        .map_err(|e| ApiError::Internal(e.into()))
}

/// Largest JSON document accepted by the object endpoints.
const MAX_JSON: usize = 1 << 20;

/// The `/v1` API plus health endpoints and `/openapi.json`.
pub fn router(state: AppState) -> Router {
    routes()
        .into_router()
        .merge(console::router())
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            storage::guard_writes,
        ))
        .layer(axum::middleware::from_fn(contract_errors))
        // Outermost, so the audit log sees the status the client gets.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            audit::record,
        ))
        .with_state(state)
}

/// Every route of [`router`], recorded (see [`openapi::Routes`]): each one needs a
/// `#[utoipa::path]` annotation and an entry in `openapi::ApiDoc`, or the document
/// test fails.
pub fn routes() -> openapi::Routes {
    use functions as f;
    use jobs as j;
    use namespaces as n;
    use triggers as t;
    openapi::Routes::new()
        .route("/openapi.json", get(openapi::serve))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::scrape))
        .route("/v1/whoami", get(n::whoami))
        .route("/v1/tokens", post(n::create_token).get(tokens::list))
        .route("/v1/namespaces", get(n::list))
        .route(
            "/v1/namespaces/{ns}",
            put(n::ensure).get(n::get).delete(n::delete),
        )
        .route("/v1/namespaces/{ns}/restore", post(n::restore))
        .route(
            "/v1/namespaces/{ns}/functions",
            get(f::list).post(f::create),
        )
        .route(
            "/v1/namespaces/{ns}/functions/{name}",
            get(f::get).patch(f::patch).delete(f::delete),
        )
        .route(
            "/v1/namespaces/{ns}/functions/{name}/code",
            put(f::upload_code),
        )
        .route(
            "/v1/namespaces/{ns}/functions/{name}/source",
            get(f::source),
        )
        .route("/v1/namespaces/{ns}/functions/{name}/logs", get(f::logs))
        .route(
            "/v1/namespaces/{ns}/functions/{name}/invoke",
            post(f::invoke),
        )
        .route("/v1/namespaces/{ns}/invocations", get(invocations::list))
        .route("/v1/namespaces/{ns}/triggers", get(t::list).post(t::create))
        .route(
            "/v1/namespaces/{ns}/triggers/{name}",
            get(t::get).patch(t::patch).delete(t::delete),
        )
        .route("/v1/namespaces/{ns}/jobs", get(j::list).post(j::create))
        .route(
            "/v1/namespaces/{ns}/jobs/{name}",
            get(j::get).patch(j::patch).delete(j::delete),
        )
        .route("/v1/namespaces/{ns}/jobs/{name}/code", put(j::upload_code))
        // Token listing, revocation and admin rotation; the audit log.
        .route("/v1/tokens/{id}", axum::routing::delete(tokens::delete))
        .route("/v1/tokens/admin/rotate", post(tokens::rotate_admin))
        .route("/v1/audit", get(audit::list))
        .route("/v1/backup", get(backup::get))
        // --- Secrets ---
        .route("/v1/namespaces/{ns}/secrets", get(secrets::list))
        .route(
            "/v1/namespaces/{ns}/secrets/{name}",
            put(secrets::put).get(secrets::get).delete(secrets::delete),
        )
        // --- Async calls and dead letters ---
        .route("/v1/namespaces/{ns}/calls", get(calls::list))
        .route("/v1/namespaces/{ns}/calls/{id}", get(calls::get))
        .route("/v1/namespaces/{ns}/dead-letters", get(dead_letters::list))
        .route(
            "/v1/namespaces/{ns}/dead-letters/redrive",
            post(dead_letters::redrive_trigger),
        )
        .route(
            "/v1/namespaces/{ns}/dead-letters/{id}",
            axum::routing::delete(dead_letters::delete),
        )
        .route(
            "/v1/namespaces/{ns}/dead-letters/{id}/redrive",
            post(dead_letters::redrive),
        )
        // --- Devices ---
        .route(
            "/v1/namespaces/{ns}/devices",
            get(devices::list).post(devices::create),
        )
        .route(
            "/v1/namespaces/{ns}/devices/{name}",
            get(devices::get)
                .patch(devices::patch)
                .delete(devices::delete),
        )
        .route(
            "/v1/namespaces/{ns}/devices/{name}/credentials",
            post(devices::rotate),
        )
        .route(
            "/v1/namespaces/{ns}/devices/{name}/commands",
            post(devices::command),
        )
        .route(
            "/v1/namespaces/{ns}/devices/{name}/telemetry",
            get(devices::device_telemetry),
        )
        .route(
            "/v1/namespaces/{ns}/telemetry",
            get(devices::namespace_telemetry),
        )
}

/// Gives every error the API answers the contract's shape `{"error": {"code",
/// "message"}}`: axum's own rejections (a query string or path that does not
/// decode, a method the route does not take) come as plain text or empty.
async fn contract_errors(req: Request, next: axum::middleware::Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(b) if !b.is_empty() => String::from_utf8_lossy(&b).into_owned(),
        _ => status.canonical_reason().unwrap_or("error").to_string(),
    };
    // Extractors answer 422 for well-formed but unacceptable input; the contract says 400.
    let status = if status == StatusCode::UNPROCESSABLE_ENTITY {
        StatusCode::BAD_REQUEST
    } else {
        status
    };
    let code = match status {
        StatusCode::BAD_REQUEST => "invalid",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        s if s.is_server_error() => "internal",
        _ => "error",
    };
    let mut out = sless_gateway::error_response(status, code, &text);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

async fn fallback() -> ApiError {
    ApiError::NotFound("no such endpoint".into())
}

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "meta",
    security(()),
    responses((status = 200, description = "The process serves", body = sless_api_types::Health))
)]
async fn healthz() -> Result<axum::Json<Value>, ApiError> {
    body(&Health {
        status: "ok".into(),
        problems: None,
    })
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "meta",
    security(()),
    responses((status = 200, description = "Ready: the store, the code store and the disk are healthy", body = sless_api_types::Health), (status = 503, description = "Not ready: `problems` says why", body = sless_api_types::Health))
)]
async fn readyz(State(s): State<AppState>) -> Response {
    // Both backends are asked at once, each for at most READY_TIMEOUT: a hung one
    // is unavailable, not a hung probe.
    let (store, blobs) = tokio::join!(
        within_ready_timeout("metadata store", s.store.ping()),
        within_ready_timeout("blob store (code archives)", s.blobs.ping()),
    );
    let disk = s.storage.problem().map(|p| p.to_string());
    let problems: Vec<String> = store.into_iter().chain(blobs).chain(disk).collect();
    if problems.is_empty() {
        body(&Health {
            status: "ready".into(),
            problems: None,
        })
        .into_response()
    } else {
        tracing::warn!(?problems, "not ready");
        (
            StatusCode::SERVICE_UNAVAILABLE,
            body(&Health {
                status: "unavailable".into(),
                problems: Some(problems),
            }),
        )
            .into_response()
    }
}

/// How long `/readyz` waits for each backend to answer.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `None` when `ping` succeeds within [`READY_TIMEOUT`], else what is wrong with `what`.
async fn within_ready_timeout<E: std::fmt::Display>(
    what: &str,
    ping: impl std::future::Future<Output = Result<(), E>>,
) -> Option<String> {
    match tokio::time::timeout(READY_TIMEOUT, ping).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(format!("{what}: {e}")),
        Err(_) => Some(format!(
            "{what}: no answer within {} s",
            READY_TIMEOUT.as_secs()
        )),
    }
}

/// The media type of a request's `Content-Type`, lowercased, without parameters
/// (`""` when there is none).
pub(crate) fn media_type(headers: &axum::http::HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// A JSON request body: checks the content type (`415`), the size (`413`) and the
/// syntax (`400`, naming what is wrong).
pub struct JsonBody(pub Value);

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let content_type = media_type(req.headers());
        if content_type != "application/json" && content_type != "application/merge-patch+json" {
            return Err(ApiError::UnsupportedMediaType(format!(
                "expected Content-Type: application/json, got {:?}",
                if content_type.is_empty() {
                    "nothing"
                } else {
                    &content_type
                }
            )));
        }
        let notes = audit::Notes::of(req.extensions());
        let bytes = read_limited(req, MAX_JSON, state.body_timeout).await?;
        let value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad(format!("body is not valid JSON: {e}")))?;
        notes.body(&value);
        Ok(JsonBody(value))
    }
}

/// A whole-number query parameter: absent or empty is `None`; anything but a number
/// within `min..=max` is `400` naming the parameter and its range (never silently
/// lowered to the range, so a client learns the server's bound).
pub(crate) fn ranged_param(
    name: &str,
    value: Option<&str>,
    min: u64,
    max: u64,
) -> Result<Option<u64>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    value
        .parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .map(Some)
        .ok_or_else(|| {
            ApiError::bad(format!(
                "{name}: must be a whole number from {min} to {max}, got {value:?}"
            ))
        })
}

/// Splits a create request's body into the object's `name` (checked as a
/// DNS label) and the remaining fields.
pub(crate) fn take_name(body: Value) -> Result<(String, serde_json::Map<String, Value>), ApiError> {
    let Value::Object(mut fields) = body else {
        return Err(ApiError::bad("body: must be a JSON object"));
    };
    let name = match fields.remove("name") {
        Some(Value::String(name)) => name,
        Some(_) => return Err(ApiError::bad("name: must be a string")),
        None => return Err(ApiError::bad("name: required")),
    };
    sless_core::validate_name("name", &name)?;
    Ok((name, fields))
}

/// Reads a whole body, refusing it with `413` past `limit` bytes and with `408`
/// when it stops arriving for `idle`.
pub(crate) async fn read_limited(
    req: Request,
    limit: usize,
    idle: std::time::Duration,
) -> Result<Bytes, ApiError> {
    let (parts, body) = req.into_parts();
    read_parts(&parts, body, limit, idle).await
}

pub(crate) async fn read_parts(
    parts: &axum::http::request::Parts,
    body: axum::body::Body,
    limit: usize,
    idle: std::time::Duration,
) -> Result<Bytes, ApiError> {
    sless_gateway::read_body(&parts.headers, body, limit, idle)
        .await
        .map_err(|e| match e {
            sless_gateway::BodyError::TooLarge(_) => ApiError::TooLarge(e.to_string()),
            sless_gateway::BodyError::TimedOut(_) => ApiError::Timeout(e.to_string()),
            sless_gateway::BodyError::Unreadable => ApiError::bad(e.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranged_params_refuse_what_is_out_of_range_naming_it() {
        assert_eq!(ranged_param("wait", None, 0, 900).unwrap(), None);
        assert_eq!(ranged_param("wait", Some(""), 0, 900).unwrap(), None);
        assert_eq!(ranged_param("wait", Some("0"), 0, 900).unwrap(), Some(0));
        assert_eq!(
            ranged_param("wait", Some("900"), 0, 900).unwrap(),
            Some(900)
        );
        for bad in ["901", "-1", "1e3", "abc", " 5", "99999999999999999999"] {
            let e = ranged_param("wait", Some(bad), 0, 900).unwrap_err();
            assert!(matches!(e, ApiError::BadRequest(_)), "{bad}");
            assert_eq!(
                e.to_string(),
                format!("wait: must be a whole number from 0 to 900, got {bad:?}")
            );
        }
    }
}
