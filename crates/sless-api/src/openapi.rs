//! `GET /openapi.json`: the OpenAPI 3 document of this API, generated from the
//! handlers' `#[utoipa::path]` annotations and the `ToSchema` shapes of
//! `sless-api-types`. No Swagger UI is served.
//!
//! Every route registered through [`Routes`] is recorded, so a test can compare the
//! router with the document: a route without an annotation fails it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use serde_json::json;
use sless_api_types::ErrorBody;
use utoipa::openapi::RefOr;
use utoipa::openapi::response::Response as OaResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi};

use crate::AppState;

/// The router being built, with the path of every route it registers.
pub struct Routes {
    router: Router<AppState>,
    paths: Vec<&'static str>,
}

impl Routes {
    pub fn new() -> Routes {
        Routes {
            router: Router::new(),
            paths: Vec::new(),
        }
    }

    /// [`Router::route`], remembering `path`.
    pub fn route(mut self, path: &'static str, method_router: MethodRouter<AppState>) -> Routes {
        self.paths.push(path);
        self.router = self.router.route(path, method_router);
        self
    }

    /// The paths registered so far, in order.
    pub fn paths(&self) -> &[&'static str] {
        &self.paths
    }

    pub fn into_router(self) -> Router<AppState> {
        self.router
    }
}

impl Default for Routes {
    fn default() -> Self {
        Routes::new()
    }
}

/// The document, built once.
pub fn document() -> &'static utoipa::openapi::OpenApi {
    static DOC: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOC.get_or_init(ApiDoc::openapi)
}

/// The document as it is served: JSON, keys in the order utoipa writes them.
pub fn document_json() -> serde_json::Value {
    serde_json::to_value(document()).unwrap_or_else(|e| {
        tracing::error!(error = %e, "the OpenAPI document does not serialize");
        serde_json::Value::Null
    })
}

/// `GET /openapi.json` (no authentication).
#[utoipa::path(get, path = "/openapi.json", tag = "meta", security(()),
    responses((status = 200, description = "This document", content_type = "application/json")))]
pub async fn serve() -> Response {
    static BODY: OnceLock<String> = OnceLock::new();
    let body = BODY.get_or_init(|| document_json().to_string());
    ([(header::CONTENT_TYPE, "application/json")], body.as_str()).into_response()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sless",
        description = "The sless REST API (`/v1`). Every error is `{\"error\": {\"code\", \"message\"}}`; \
                       authenticate with `Authorization: Bearer <token>` (the admin token or a namespace token)."
    ),
    paths(
        serve,
        crate::healthz,
        crate::readyz,
        crate::metrics::scrape,
        crate::namespaces::whoami,
        crate::namespaces::create_token,
        crate::namespaces::list,
        crate::namespaces::ensure,
        crate::namespaces::get,
        crate::namespaces::delete,
        crate::namespaces::restore,
        crate::functions::list,
        crate::functions::create,
        crate::functions::get,
        crate::functions::patch,
        crate::functions::delete,
        crate::functions::upload_code,
        crate::functions::source,
        crate::functions::logs,
        crate::functions::invoke,
        crate::invocations::list,
        crate::triggers::list,
        crate::triggers::create,
        crate::triggers::get,
        crate::triggers::patch,
        crate::triggers::delete,
        crate::jobs::list,
        crate::jobs::create,
        crate::jobs::get,
        crate::jobs::patch,
        crate::jobs::delete,
        crate::jobs::upload_code,
        crate::tokens::list,
        crate::tokens::delete,
        crate::tokens::rotate_admin,
        crate::audit::list,
        crate::backup::get,
        crate::secrets::list,
        crate::secrets::put,
        crate::secrets::get,
        crate::secrets::delete,
        crate::calls::get,
        crate::calls::list,
        crate::dead_letters::list,
        crate::dead_letters::redrive,
        crate::dead_letters::redrive_trigger,
        crate::dead_letters::delete,
        crate::devices::create,
        crate::devices::list,
        crate::devices::get,
        crate::devices::patch,
        crate::devices::delete,
        crate::devices::rotate,
        crate::devices::command,
        crate::devices::device_telemetry,
        crate::devices::namespace_telemetry,
    ),
    components(schemas(ErrorBody, sless_api_types::ErrorDetail)),
    modifiers(&Bearer),
    security(("bearer" = [])),
    tags(
        (name = "meta", description = "Health and this document"),
        (name = "namespaces", description = "Namespaces, tokens, whoami"),
        (name = "functions", description = "Functions, their code, logs and the authenticated invoke"),
        (name = "invocations", description = "Invocation records"),
        (name = "triggers", description = "HTTP, cron and queue triggers"),
        (name = "jobs", description = "One-shot runs"),
        (name = "secrets", description = "Encrypted secrets: names and keys are shown, values never"),
        (name = "calls", description = "Async calls: queued with /async/... or /invoke?async=true, their results"),
        (name = "dead-letters", description = "Messages and calls that exhausted their delivery policy"),
        (name = "devices", description = "Devices on sless's MQTT broker, their credentials, telemetry and commands"),
        (name = "audit", description = "The audit log of control-plane changes (admins only)"),
        (name = "operations", description = "Backups of the whole server (admins only)"),
    )
)]
pub struct ApiDoc;

/// The `bearer` security scheme every `/v1` operation requires.
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The admin token, or a namespace token from POST /v1/tokens",
                    ))
                    .build(),
            ),
        );
    }
}

/// What each error status means, as the document says it.
fn error_response(status: u16) -> RefOr<OaResponse> {
    let description = match status {
        400 => "Invalid input: the message names the field or parameter",
        401 => "No token, a malformed Authorization header, or an unknown token",
        403 => "The token may not do this",
        404 => "No such object, or not visible to this token",
        408 => "The request body stopped arriving",
        409 => "Already exists, or the object's state does not allow this",
        412 => "If-Match names another version than the current one (sent back as the ETag)",
        413 => "The body is over the configured limit",
        415 => "The Content-Type is not one this operation takes",
        429 => {
            "Too many failed authentications from this address (Retry-After), or over a namespace quota"
        }
        500 => "Internal error (logged on the server)",
        503 => "A dependency is unavailable, or the object is busy (Retry-After: 1)",
        507 => "The disk is full: nothing was stored",
        _ => "Error",
    };
    let value = json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    });
    // A constant shape; the golden document test builds every one.
    #[allow(clippy::expect_used)]
    serde_json::from_value(value).expect("a valid OpenAPI response")
}

/// Declares a set of error statuses, used in `responses(...)` of `#[utoipa::path]`.
macro_rules! errors {
    ($($(#[$doc:meta])* $name:ident = [$($status:literal),+];)+) => {
        $(
            $(#[$doc])*
            pub struct $name;

            impl utoipa::IntoResponses for $name {
                fn responses() -> BTreeMap<String, RefOr<OaResponse>> {
                    [$($status),+]
                        .into_iter()
                        .map(|s: u16| (s.to_string(), error_response(s)))
                        .collect()
                }
            }
        )+
    };
}

errors! {
    /// Any authenticated read.
    ReadErrors = [400, 401, 404, 429, 500, 503];
    /// A delete: a read's, and a state that forbids it.
    DeleteErrors = [400, 401, 404, 409, 429, 500, 503];
    /// A write with a body: a read's, and the body's and storage's own.
    WriteErrors = [400, 401, 404, 408, 409, 413, 415, 429, 500, 503, 507];
    /// A write that takes `If-Match`.
    MatchedWriteErrors = [400, 401, 404, 408, 409, 412, 413, 415, 429, 500, 503, 507];
}

/// `{ns}`.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct NsPath {
    /// The namespace.
    #[param(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", example = "default")]
    ns: String,
}

/// `{ns}` and `{name}`.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct NsNamePath {
    /// The namespace.
    #[param(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", example = "default")]
    ns: String,
    /// The object's name.
    #[param(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", example = "hello")]
    name: String,
}

/// `If-Match` on writes that take it.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub struct IfMatchHeader {
    /// Apply only to this version: an ETag from a read (`"3"`), or `*` (RFC 9110
    /// `"*" / #entity-tag`; a weak tag never matches).
    #[param(
        rename = "If-Match",
        pattern = r#"^[ \t,]*(\*([ \t]*,[ \t,]*\*)*|(W/)?"[\x21\x23-\x7e]*"([ \t]*,[ \t,]*(W/)?"[\x21\x23-\x7e]*")*)[ \t,]*$"#
    )]
    if_match: Option<String>,
}

/// `DELETE /v1/namespaces/{ns}?force=`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct ForceQuery {
    /// Delete the namespace with everything in it: it goes to the trash (kept
    /// `--trash-retention-hours`, 72 by default), from which
    /// `POST /v1/namespaces/{ns}/restore` brings it back. Without it, only an empty
    /// namespace is deleted (for good; not empty is 409).
    force: Option<bool>,
}

/// `GET .../logs?tail=&follow=`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct LogsParams {
    /// Lines from the end (default 200).
    #[param(minimum = 0, maximum = 100000)]
    tail: Option<u64>,
    /// Keep the response open and stream new lines.
    follow: Option<bool>,
}

/// `GET .../jobs/{name}?wait=`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct WaitParams {
    /// Seconds to wait for the current run to finish before answering.
    #[param(minimum = 0, maximum = 900)]
    wait: Option<u64>,
}

/// `GET .../invocations` filters; an empty value filters nothing.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct InvocationParams {
    /// Only this function's.
    #[param(pattern = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$")]
    function: Option<String>,
    /// Only the deliveries of this queue or device trigger.
    #[param(pattern = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$")]
    trigger: Option<String>,
    /// Only the attempts of this async call (no control characters).
    #[param(max_length = 200, pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    call_id: Option<String>,
    /// Only those answered with this HTTP status (100 to 599).
    #[param(pattern = "^(|[1-5][0-9][0-9])$")]
    status: Option<String>,
    /// Only those started by this source.
    #[param(inline, value_type = Option<String>, pattern = "^(|http|invoke|cron|queue|job|device|async)$")]
    source: Option<String>,
    /// Only those started at or after this time (RFC 3339, such as `2025-01-31T12:00:00Z`).
    #[param(
        pattern = r"^(|[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))$"
    )]
    since: Option<String>,
    /// At most this many, newest first (1 to 1000).
    #[param(pattern = "^(|[1-9][0-9]{0,2}|1000)$")]
    limit: Option<String>,
}

/// `GET /v1/tokens?namespace=`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct TokenListParams {
    /// Only this namespace's tokens (an admin; others see only their own namespace's).
    #[param(pattern = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$")]
    namespace: Option<String>,
}

/// `GET /v1/audit` filters; an empty value filters nothing.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct AuditParams {
    /// Only this namespace's entries.
    #[param(pattern = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$")]
    namespace: Option<String>,
    /// Only entries at or after this time (RFC 3339, such as `2025-01-31T12:00:00Z`).
    #[param(
        pattern = r"^(|[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))$"
    )]
    since: Option<String>,
    /// At most this many, newest first (1 to 1000; default 100).
    #[param(pattern = "^(|[1-9][0-9]{0,2}|1000)$")]
    limit: Option<String>,
}

/// `{id}` of a call.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct CallIdPath {
    /// The call's id (from the `202` that queued it).
    #[param(max_length = 200)]
    id: String,
}

/// `{id}` of a dead letter.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct DeadLetterIdPath {
    /// The dead letter's id.
    #[param(max_length = 200)]
    id: String,
}

/// `GET .../calls` filters; an empty value filters nothing.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct CallParams {
    /// Only this function's.
    #[param(pattern = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$")]
    function: Option<String>,
    /// Only calls in this phase.
    #[param(pattern = "^(|Queued|Running|Succeeded|Failed)$")]
    phase: Option<String>,
    /// At most this many, newest first (1 to 1000; default 100).
    #[param(pattern = "^(|[1-9][0-9]{0,2}|1000)$")]
    limit: Option<String>,
}

/// `GET .../dead-letters` filters; an empty value filters nothing.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct DeadLetterParams {
    /// Only this trigger's.
    #[param(pattern = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$")]
    trigger: Option<String>,
    /// Only this function's.
    #[param(pattern = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$")]
    function: Option<String>,
    /// At most this many, newest first (1 to 1000; default 100).
    #[param(pattern = "^(|[1-9][0-9]{0,2}|1000)$")]
    limit: Option<String>,
}

/// `GET .../devices/{name}/telemetry` filters; an empty value filters nothing.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct TelemetryParams {
    /// Received at or after this RFC 3339 time.
    #[param(
        pattern = r"^(|[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))$"
    )]
    since: Option<String>,
    /// Received before this RFC 3339 time.
    #[param(
        pattern = r"^(|[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))$"
    )]
    until: Option<String>,
    /// At most this many, newest first (1 to 1000; default 100).
    #[param(pattern = "^(|[1-9][0-9]{0,2}|1000)$")]
    limit: Option<String>,
}

/// `GET .../telemetry` filters; an empty value filters nothing.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct NamespaceTelemetryParams {
    /// Only this device's.
    #[param(pattern = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$")]
    device: Option<String>,
    /// Received at or after this RFC 3339 time.
    #[param(
        pattern = r"^(|[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))$"
    )]
    since: Option<String>,
    /// Received before this RFC 3339 time.
    #[param(
        pattern = r"^(|[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))$"
    )]
    until: Option<String>,
    /// At most this many, newest first (1 to 1000; default 100).
    #[param(pattern = "^(|[1-9][0-9]{0,2}|1000)$")]
    limit: Option<String>,
}

/// `POST .../dead-letters/redrive?trigger=`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct RedriveParams {
    /// The trigger whose dead letters to redrive.
    #[param(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    trigger: String,
}

/// `POST .../invoke?async=`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct InvokeParams {
    /// Queue the call and answer `202 {"call_id"}` at once.
    #[param(pattern = "^(|true|false)$")]
    r#async: Option<String>,
}

#[cfg(test)]
mod tests {
    /// The parameters' pattern (a literal in the attributes) is the schemas' one.
    #[test]
    fn the_name_pattern_is_the_one_the_schemas_use() {
        let doc = super::document_json();
        let params = &doc["paths"]["/v1/namespaces/{ns}"]["get"]["parameters"];
        assert_eq!(
            params[0]["schema"]["pattern"],
            sless_api_types::schema::NAME_PATTERN
        );
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
    }

    /// The whole document, reviewed: a change to a route's contract shows here.
    #[test]
    fn golden_document() {
        insta::assert_json_snapshot!("openapi", super::document_json());
    }
}
