//! Client tests against a tiny axum server on 127.0.0.1:0 that speaks the contract's shapes.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::body::{Body, Bytes as AxBytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap as AxHeaders, StatusCode};
use axum::response::{IntoResponse, Response as AxResponse};
use axum::routing::{get, post, put};
use serde_json::{Value, json};

use super::*;

#[derive(Clone, Default)]
struct TestState {
    polls: Arc<AtomicU32>,
    job_polls: Arc<AtomicU32>,
}

fn api_error(status: StatusCode, code: &str, message: &str) -> AxResponse {
    (
        status,
        axum::Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

fn function_json(ns: &str, name: &str, phase: &str, revision: u64) -> Value {
    json!({
        "name": name, "namespace": ns, "spec": {"runtime": "python3"},
        "status": {"phase": phase, "message": "", "revision": revision, "code_sha256": null,
                   "url": format!("http://test/fn/{ns}/{name}"), "instances": {"ready": 0, "starting": 0},
                   "last_built_at": null},
        "created_at": "2025-01-01T00:00:00Z", "updated_at": "2025-01-01T00:00:00Z"
    })
}

async fn whoami(headers: AxHeaders) -> axum::Json<Value> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    axum::Json(json!({"admin": true, "namespaces": ["default"], "auth": auth}))
}

async fn ensure_ns(Path(ns): Path<String>) -> AxResponse {
    match ns.as_str() {
        "fresh" => StatusCode::CREATED.into_response(),
        "hidden" => api_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "namespace hidden not found",
        ),
        _ => StatusCode::OK.into_response(),
    }
}

async fn delete_ns(Path(ns): Path<String>, Query(q): Query<HashMap<String, String>>) -> AxResponse {
    if q.get("force").map(String::as_str) == Some("true") {
        return StatusCode::NO_CONTENT.into_response();
    }
    api_error(
        StatusCode::CONFLICT,
        "not_empty",
        &format!("namespace {ns} is not empty"),
    )
}

async fn restore_ns(Path(ns): Path<String>) -> AxResponse {
    match ns.as_str() {
        "gone" => api_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "namespace \"gone\" is not in the trash",
        ),
        "taken" => api_error(
            StatusCode::CONFLICT,
            "conflict",
            "namespace \"taken\" exists again",
        ),
        _ => axum::Json(json!({
            "name": ns, "created_at": "2025-01-01T00:00:00Z",
            "quota": {"functions": 3}, "usage": {"functions": 1}
        }))
        .into_response(),
    }
}

async fn list_ns() -> axum::Json<Value> {
    axum::Json(json!({"items": [{"name": "default"}, {"name": "team-a"}]}))
}

async fn list_functions(Path(ns): Path<String>) -> AxResponse {
    if ns == "proxied" {
        // Not the contract's shape: what a reverse proxy in front of the server might send.
        return (StatusCode::BAD_GATEWAY, "upstream went away").into_response();
    }
    axum::Json(json!({"items": [function_json(&ns, "a", "Ready", 1), function_json(&ns, "b", "Failed", 2)]}))
        .into_response()
}

async fn create_function(
    Path(ns): Path<String>,
    axum::Json(body): axum::Json<Value>,
) -> AxResponse {
    let name = body["name"].as_str().unwrap_or("").to_string();
    if name == "dup" {
        return api_error(
            StatusCode::CONFLICT,
            "already_exists",
            "function default/dup already exists",
        );
    }
    (
        StatusCode::CREATED,
        axum::Json(function_json(&ns, &name, "Pending", 1)),
    )
        .into_response()
}

async fn get_function(
    State(state): State<TestState>,
    Path((ns, name)): Path<(String, String)>,
) -> AxResponse {
    match name.as_str() {
        "missing" => api_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "function default/missing not found",
        ),
        "slow" => {
            // Builds revision 2 for two polls, then reports it Ready.
            let n = state.polls.fetch_add(1, Ordering::SeqCst);
            let (phase, revision) = match n {
                0 => ("Ready", 1),
                1 => ("Building", 2),
                _ => ("Ready", 2),
            };
            axum::Json(function_json(&ns, &name, phase, revision)).into_response()
        }
        "stuck" => axum::Json(function_json(&ns, &name, "Building", 5)).into_response(),
        _ => axum::Json(function_json(&ns, &name, "Ready", 1)).into_response(),
    }
}

async fn patch_function(
    Path((ns, name)): Path<(String, String)>,
    headers: AxHeaders,
    body: AxBytes,
) -> AxResponse {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type != "application/merge-patch+json" {
        return api_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            content_type,
        );
    }
    let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut f = function_json(&ns, &name, "Pending", 3);
    f["spec"] = patch;
    axum::Json(f).into_response()
}

async fn delete_function(Path((_ns, name)): Path<(String, String)>) -> AxResponse {
    if name == "missing" {
        return api_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "function default/missing not found",
        );
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn upload(headers: AxHeaders, body: AxBytes) -> AxResponse {
    if headers.get("content-type").and_then(|v| v.to_str().ok()) != Some("application/zip") {
        return api_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send a zip",
        );
    }
    if body.is_empty() {
        return api_error(
            StatusCode::BAD_REQUEST,
            "invalid_archive",
            "the archive is empty",
        );
    }
    (
        StatusCode::ACCEPTED,
        axum::Json(json!({"revision": 7, "code_sha256": format!("len-{}", body.len())})),
    )
        .into_response()
}

async fn invoke(Path((_ns, name)): Path<(String, String)>, body: AxBytes) -> AxResponse {
    if name == "bad" {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"error": "boom"})),
        )
            .into_response();
    }
    ([("x-echo", "yes")], body).into_response()
}

async fn logs(Query(q): Query<HashMap<String, String>>) -> AxResponse {
    if q.get("follow").map(String::as_str) == Some("true") {
        let chunks =
            ["line 1\n", "line 2\n", "line 3\n"].map(|c| Ok::<_, Infallible>(AxBytes::from(c)));
        return Body::from_stream(futures::stream::iter(chunks)).into_response();
    }
    let mut keys: Vec<_> = q.iter().map(|(k, v)| format!("{k}={v}")).collect();
    keys.sort();
    format!("query: {}\n", keys.join("&")).into_response()
}

async fn create_token(axum::Json(body): axum::Json<Value>) -> AxResponse {
    let ns = body["namespace"].as_str().unwrap_or("");
    (
        StatusCode::CREATED,
        axum::Json(json!({"token": format!("tok-{ns}")})),
    )
        .into_response()
}

fn content_type(headers: &AxHeaders) -> &str {
    headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn trigger_json(ns: &str, name: &str, enabled: bool) -> Value {
    json!({
        "name": name, "namespace": ns, "function": "hello", "type": "http", "enabled": enabled,
        "path": "/orders", "methods": ["GET", "POST"],
        "status": {"last_fired_at": null, "next_fire_at": null, "last_result": null},
        "created_at": "2025-01-01T00:00:00Z", "updated_at": "2025-01-01T00:00:00Z"
    })
}

async fn create_trigger(Path(ns): Path<String>, axum::Json(body): axum::Json<Value>) -> AxResponse {
    if body["function"] == "missing" {
        return api_error(
            StatusCode::BAD_REQUEST,
            "invalid",
            "function default/missing does not exist",
        );
    }
    let mut t = body.clone();
    t["namespace"] = json!(ns);
    t["status"] = json!({"next_fire_at": "2025-01-01T00:05:00Z"});
    (StatusCode::CREATED, axum::Json(t)).into_response()
}

async fn list_triggers(Path(ns): Path<String>) -> axum::Json<Value> {
    axum::Json(json!({"items": [trigger_json(&ns, "orders", true)]}))
}

async fn get_trigger(Path((ns, name)): Path<(String, String)>) -> AxResponse {
    if name == "missing" {
        return api_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "trigger default/missing not found",
        );
    }
    axum::Json(trigger_json(&ns, &name, true)).into_response()
}

async fn patch_trigger(
    Path((ns, name)): Path<(String, String)>,
    headers: AxHeaders,
    body: AxBytes,
) -> AxResponse {
    if content_type(&headers) != "application/merge-patch+json" {
        return api_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "",
        );
    }
    let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let enabled = patch["enabled"].as_bool().unwrap_or(true);
    axum::Json(trigger_json(&ns, &name, enabled)).into_response()
}

async fn delete_named(Path((_ns, name)): Path<(String, String)>) -> AxResponse {
    if name == "missing" {
        return api_error(StatusCode::NOT_FOUND, "not_found", "not found");
    }
    StatusCode::NO_CONTENT.into_response()
}

fn job_json(ns: &str, name: &str, spec: Value, status: Value) -> Value {
    json!({"name": name, "namespace": ns, "spec": spec, "status": status,
           "created_at": "2025-01-01T00:00:00Z", "updated_at": "2025-01-01T00:00:00Z"})
}

async fn create_job(Path(ns): Path<String>, axum::Json(mut body): axum::Json<Value>) -> AxResponse {
    let name = body["name"].as_str().unwrap_or("").to_string();
    if name == "dup" {
        return api_error(
            StatusCode::CONFLICT,
            "already_exists",
            "job default/dup already exists",
        );
    }
    if let Some(spec) = body.as_object_mut() {
        spec.remove("name");
    }
    let job = job_json(&ns, &name, body, json!({"phase": "Pending", "run_id": 1}));
    (StatusCode::CREATED, axum::Json(job)).into_response()
}

async fn list_jobs(Path(ns): Path<String>) -> axum::Json<Value> {
    axum::Json(json!({"items": [
        job_json(&ns, "once", json!({"function": "hello"}), json!({"phase": "Succeeded", "run_id": 1})),
        job_json(&ns, "batch", json!({"runtime": "python3"}), json!({"phase": "Building", "run_id": 1})),
    ]}))
}

async fn get_job(
    State(state): State<TestState>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> AxResponse {
    // The `wait` the client asked for is echoed in `message` so tests can see it.
    let wait = q.get("wait").cloned().unwrap_or_default();
    let status = match name.as_str() {
        "missing" => {
            return api_error(
                StatusCode::NOT_FOUND,
                "not_found",
                "job default/missing not found",
            );
        }
        "rerun" => {
            // Run 1 is over; run 2 is asked for and runs, then succeeds.
            match state.job_polls.fetch_add(1, Ordering::SeqCst) {
                0 => json!({"phase": "Succeeded", "run_id": 1, "result": "old"}),
                1 => json!({"phase": "Running", "run_id": 2, "attempts": 1}),
                _ => json!({"phase": "Succeeded", "run_id": 2, "result": {"n": 2}, "attempts": 1}),
            }
        }
        "stuck" => json!({"phase": "Running", "run_id": 5}),
        _ => json!({"phase": "Succeeded", "run_id": 1}),
    };
    let mut status = status;
    status["message"] = json!(format!("wait={wait}"));
    axum::Json(job_json(&ns, &name, json!({"function": "hello"}), status)).into_response()
}

async fn patch_job(
    Path((ns, name)): Path<(String, String)>,
    headers: AxHeaders,
    body: AxBytes,
) -> AxResponse {
    if content_type(&headers) != "application/merge-patch+json" {
        return api_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "",
        );
    }
    let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let run_id = patch["run_id"].clone();
    axum::Json(job_json(
        &ns,
        &name,
        patch,
        json!({"phase": "Pending", "run_id": run_id}),
    ))
    .into_response()
}

async fn upload_job_code(headers: AxHeaders, body: AxBytes) -> AxResponse {
    if content_type(&headers) != "application/zip" {
        return api_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send a zip",
        );
    }
    (
        StatusCode::ACCEPTED,
        axum::Json(json!({"code_sha256": format!("len-{}", body.len())})),
    )
        .into_response()
}

async fn list_invocations(Query(q): Query<HashMap<String, String>>) -> axum::Json<Value> {
    // The query the client sent comes back in `error`, sorted, so tests can check it.
    let mut pairs: Vec<_> = q.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    axum::Json(json!({"items": [{
        "id": "01J0", "function": "hello", "revision": 2, "source": "http",
        "request_id": "req-1", "started_at": "2025-01-01T00:00:00.123Z", "duration_ms": 12.5,
        "status": 200, "cold_start": true, "error": pairs.join("&")
    }, {"id": "01J1", "function": "hello", "status": 500}]}))
}

fn device_json(ns: &str, name: &str, enabled: bool, password: Option<&str>) -> Value {
    let mut mqtt = json!({
        "host": "127.0.0.1", "port": 1883, "ws_url": null, "client_id": format!("{ns}-{name}"),
        "username": format!("{ns}_{name}"), "publish_topic": format!("{ns}/telemetry/{name}"),
        "subscribe_topic": format!("{ns}/commands/{name}")
    });
    if let Some(password) = password {
        mqtt["password"] = json!(password);
    }
    json!({
        "name": name, "namespace": ns, "labels": {"room": "kitchen"}, "enabled": enabled,
        "mqtt": mqtt, "status": {"online": false, "last_seen_at": null, "messages": 0},
        "created_at": "2025-01-01T00:00:00Z", "updated_at": "2025-01-01T00:00:00Z"
    })
}

fn mqtt_disabled() -> AxResponse {
    api_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "devices need the MQTT broker: start the server with --mqtt-listen",
    )
}

async fn create_device(Path(ns): Path<String>, axum::Json(body): axum::Json<Value>) -> AxResponse {
    if body["name"] == "taken" {
        return api_error(
            StatusCode::CONFLICT,
            "already_exists",
            "device default/taken already exists",
        );
    }
    let name = body["name"].as_str().unwrap_or("");
    let mut d = device_json(
        &ns,
        name,
        body["enabled"].as_bool().unwrap_or(true),
        Some("pw-1"),
    );
    // The labels the client sent come back, so tests can check them.
    d["labels"] = body["labels"].clone();
    (StatusCode::CREATED, axum::Json(d)).into_response()
}

async fn list_devices(Path(ns): Path<String>) -> AxResponse {
    if ns == "nomqtt" {
        return mqtt_disabled();
    }
    axum::Json(json!({"items": [device_json(&ns, "t77", true, None)]})).into_response()
}

async fn get_device(Path((ns, name)): Path<(String, String)>) -> AxResponse {
    if name == "missing" {
        return api_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "device default/missing not found",
        );
    }
    axum::Json(device_json(&ns, &name, true, None)).into_response()
}

async fn patch_device(
    Path((ns, name)): Path<(String, String)>,
    headers: AxHeaders,
    body: AxBytes,
) -> AxResponse {
    if content_type(&headers) != "application/merge-patch+json" {
        return api_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "",
        );
    }
    let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let enabled = patch["enabled"].as_bool().unwrap_or(true);
    axum::Json(device_json(&ns, &name, enabled, None)).into_response()
}

async fn rotate_device(Path((ns, name)): Path<(String, String)>, body: AxBytes) -> AxResponse {
    if !body.is_empty() {
        return api_error(StatusCode::BAD_REQUEST, "invalid", "no body expected");
    }
    axum::Json(device_json(&ns, &name, true, Some("pw-2"))).into_response()
}

/// Telemetry whose one item's payload is the query the client sent, sorted.
fn echo_telemetry(device: &str, q: &HashMap<String, String>) -> axum::Json<Value> {
    let mut pairs: Vec<_> = q.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    axum::Json(json!({"items": [
        {"device": device, "received_at": "2025-01-01T00:00:01Z", "payload": pairs.join("&")},
        {"device": device, "received_at": "2025-01-01T00:00:00Z", "payload": {"temp": 21}},
    ]}))
}

async fn device_telemetry(
    Path((_ns, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> axum::Json<Value> {
    echo_telemetry(&name, &q)
}

async fn namespace_telemetry(Query(q): Query<HashMap<String, String>>) -> axum::Json<Value> {
    echo_telemetry("any", &q)
}

async fn device_command(
    Path((ns, name)): Path<(String, String)>,
    axum::Json(body): axum::Json<Value>,
) -> AxResponse {
    if body != json!({"led": "on"}) {
        return api_error(StatusCode::BAD_REQUEST, "invalid", "unexpected command");
    }
    (
        StatusCode::ACCEPTED,
        axum::Json(json!({"topic": format!("{ns}/commands/{name}")})),
    )
        .into_response()
}

async fn garbage() -> &'static str {
    "this is not json"
}

/// Starts the test server and returns its base URL.
async fn serve() -> String {
    let app = Router::new()
        .route("/v1/whoami", get(whoami))
        .route("/v1/garbage", get(garbage))
        .route("/v1/namespaces", get(list_ns))
        .route("/v1/namespaces/{ns}", put(ensure_ns).delete(delete_ns))
        .route("/v1/namespaces/{ns}/restore", post(restore_ns))
        .route(
            "/v1/namespaces/{ns}/functions",
            get(list_functions).post(create_function),
        )
        .route(
            "/v1/namespaces/{ns}/functions/{name}",
            get(get_function)
                .patch(patch_function)
                .delete(delete_function),
        )
        .route("/v1/namespaces/{ns}/functions/{name}/code", put(upload))
        .route("/v1/namespaces/{ns}/functions/{name}/invoke", post(invoke))
        .route("/v1/namespaces/{ns}/functions/{name}/logs", get(logs))
        .route(
            "/v1/namespaces/{ns}/triggers",
            get(list_triggers).post(create_trigger),
        )
        .route(
            "/v1/namespaces/{ns}/triggers/{name}",
            get(get_trigger).patch(patch_trigger).delete(delete_named),
        )
        .route("/v1/namespaces/{ns}/jobs", get(list_jobs).post(create_job))
        .route(
            "/v1/namespaces/{ns}/jobs/{name}",
            get(get_job).patch(patch_job).delete(delete_named),
        )
        .route("/v1/namespaces/{ns}/jobs/{name}/code", put(upload_job_code))
        .route("/v1/namespaces/{ns}/invocations", get(list_invocations))
        .route(
            "/v1/namespaces/{ns}/devices",
            get(list_devices).post(create_device),
        )
        .route(
            "/v1/namespaces/{ns}/devices/{name}",
            get(get_device).patch(patch_device).delete(delete_named),
        )
        .route(
            "/v1/namespaces/{ns}/devices/{name}/credentials",
            post(rotate_device),
        )
        .route(
            "/v1/namespaces/{ns}/devices/{name}/telemetry",
            get(device_telemetry),
        )
        .route(
            "/v1/namespaces/{ns}/devices/{name}/commands",
            post(device_command),
        )
        .route("/v1/namespaces/{ns}/telemetry", get(namespace_telemetry))
        .route("/v1/tokens", post(create_token))
        .with_state(TestState::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

async fn client(token: Option<&str>) -> Client {
    Client::new(&serve().await, token.map(String::from)).expect("client")
}

#[test]
fn new_normalises_and_validates_the_server_url() {
    let c = Client::new("http://127.0.0.1:8080/", None).expect("valid");
    assert_eq!(c.base_url(), "http://127.0.0.1:8080");
    let c = Client::new("127.0.0.1:9000", None).expect("bare host:port means http");
    assert_eq!(c.base_url(), "http://127.0.0.1:9000");
    let c = Client::new("https://example.com/sless/", None).expect("prefix kept");
    assert_eq!(
        c.function_url("default", "hello"),
        "https://example.com/sless/fn/default/hello"
    );
    for bad in ["", "ftp://x", "http://x/?a=1", "http://"] {
        assert!(
            matches!(Client::new(bad, None), Err(ClientError::InvalidUrl { .. })),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn sends_the_bearer_token() {
    let who = client(Some("secret")).await.whoami().await.expect("whoami");
    assert_eq!(who["auth"], "Bearer secret");
    let who = client(None).await.whoami().await.expect("whoami");
    assert_eq!(who["auth"], "");
}

#[tokio::test]
async fn parses_contract_errors() {
    let c = client(None).await;
    let err = c.get_function("default", "missing").await.expect_err("404");
    match &err {
        ClientError::Api {
            status,
            code,
            message,
        } => {
            assert_eq!(*status, 404);
            assert_eq!(code, "not_found");
            assert_eq!(message, "function default/missing not found");
        }
        other => panic!("expected an API error, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "function default/missing not found (HTTP 404 not_found)"
    );

    let err = c
        .create_function("default", &json!({"name": "dup", "runtime": "python3"}))
        .await
        .expect_err("409");
    assert_eq!(err.status(), Some(409));
    assert_eq!(err.code(), Some("already_exists"));

    let err = c.delete_namespace("team-a", false).await.expect_err("409");
    assert_eq!(
        err.to_string(),
        "namespace team-a is not empty (HTTP 409 not_empty)"
    );
}

#[tokio::test]
async fn non_contract_errors_keep_the_body_text() {
    let err = client(None)
        .await
        .list_functions("proxied")
        .await
        .expect_err("502");
    assert_eq!(err.to_string(), "upstream went away (HTTP 502 http_502)");
}

#[tokio::test]
async fn undecodable_success_is_a_decode_error() {
    let c = client(None).await;
    let err = c
        .request_json(Method::GET, "/v1/garbage", None)
        .await
        .expect_err("not json");
    assert!(matches!(err, ClientError::Decode { .. }), "{err:?}");
}

#[tokio::test]
async fn connection_refused_is_an_http_error() {
    // Bind then drop a listener so the port is known to be closed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let c = Client::new(&format!("http://{addr}"), None).expect("client");
    let err = c.whoami().await.expect_err("refused");
    assert!(matches!(err, ClientError::Http { .. }), "{err:?}");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
}

#[tokio::test]
async fn namespaces() {
    let c = client(None).await;
    assert!(c.ensure_namespace("fresh").await.expect("created"));
    assert!(!c.ensure_namespace("default").await.expect("existed"));
    assert_eq!(
        c.ensure_namespace("hidden")
            .await
            .expect_err("404")
            .status(),
        Some(404)
    );
    let names: Vec<_> = c
        .list_namespaces()
        .await
        .expect("list")
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, ["default", "team-a"]);
    c.delete_namespace("team-a", true)
        .await
        .expect("forced delete");
    let restored = c.restore_namespace("team-a").await.expect("restored");
    assert_eq!(
        (
            restored.name.as_str(),
            restored.quota.functions,
            restored.usage.functions
        ),
        ("team-a", 3, 1)
    );
    assert_eq!(restored.created_at.as_deref(), Some("2025-01-01T00:00:00Z"));
    let err = c.restore_namespace("gone").await.expect_err("404");
    assert_eq!((err.status(), err.code()), (Some(404), Some("not_found")));
    let err = c.restore_namespace("taken").await.expect_err("409");
    assert_eq!((err.status(), err.code()), (Some(409), Some("conflict")));
}

#[tokio::test]
async fn function_crud() {
    let c = client(None).await;
    let created = c
        .create_function("default", &json!({"name": "hello", "runtime": "python3"}))
        .await
        .expect("create");
    assert_eq!(
        (created.name.as_str(), created.status.phase.as_str()),
        ("hello", "Pending")
    );

    let listed = c.list_functions("default").await.expect("list");
    assert_eq!(
        listed.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );

    let patched = c
        .patch_function("default", "hello", &json!({"memory_mb": 256}))
        .await
        .expect("patch");
    assert_eq!(patched.spec, json!({"memory_mb": 256}));
    assert_eq!(patched.status.revision, 3);

    c.delete_function("default", "hello").await.expect("delete");
    assert_eq!(
        c.delete_function("default", "missing")
            .await
            .expect_err("404")
            .status(),
        Some(404)
    );
}

#[tokio::test]
async fn names_are_encoded_as_single_path_segments() {
    let c = client(None).await;
    let f = c.get_function("default", "a/b c").await.expect("get");
    assert_eq!(f.name, "a/b c");
}

#[tokio::test]
async fn uploads_zip_bytes() {
    let c = client(None).await;
    let up = c
        .upload_code("default", "hello", b"PK\x05\x06 pretend".to_vec())
        .await
        .expect("upload");
    assert_eq!(
        up,
        UploadResponse {
            revision: 7,
            code_sha256: "len-12".into()
        }
    );
    let err = c
        .upload_code("default", "hello", Vec::new())
        .await
        .expect_err("empty");
    assert_eq!(err.code(), Some("invalid_archive"));
}

#[tokio::test]
async fn invoke_returns_every_status_as_data() {
    let c = client(None).await;
    let ok = c
        .invoke("default", "echo", &json!({"x": 1}))
        .await
        .expect("invoke");
    assert!(ok.is_success());
    assert_eq!(
        ok.headers.get("x-echo").and_then(|v| v.to_str().ok()),
        Some("yes")
    );
    assert_eq!(ok.json::<Value>().expect("json"), json!({"x": 1}));

    let bad = c
        .invoke("default", "bad", &json!({}))
        .await
        .expect("a 500 is still an answer");
    assert_eq!(bad.status, 500);
    assert!(!bad.is_success());
    assert_eq!(bad.text(), r#"{"error":"boom"}"#);
}

#[tokio::test]
async fn logs_plain_and_followed() {
    let c = client(None).await;
    assert_eq!(
        c.logs("default", "hello", Some(20)).await.expect("logs"),
        "query: tail=20\n"
    );
    assert_eq!(
        c.logs("default", "hello", None).await.expect("logs"),
        "query: \n"
    );

    let stream = c
        .follow_logs("default", "hello", Some(5))
        .await
        .expect("follow");
    let chunks: Vec<Bytes> = stream.map(|c| c.expect("chunk")).collect().await;
    assert_eq!(chunks.concat(), b"line 1\nline 2\nline 3\n");
}

#[tokio::test]
async fn creates_tokens() {
    assert_eq!(
        client(None)
            .await
            .create_token("team-a")
            .await
            .expect("token"),
        "tok-team-a"
    );
}

#[tokio::test]
async fn wait_ready_waits_for_the_revision_to_settle() {
    let c = client(None).await;
    let mut seen = Vec::new();
    let f = c
        .wait_ready("default", "slow", 2, Duration::from_secs(30), |f| {
            seen.push((f.status.phase.clone(), f.status.revision));
        })
        .await
        .expect("ready");
    assert_eq!((f.status.phase.as_str(), f.status.revision), ("Ready", 2));
    // Ready at revision 1 does not count: the caller asked for revision 2.
    assert_eq!(
        seen,
        [
            (FunctionPhase::Ready, 1),
            (FunctionPhase::Building, 2),
            (FunctionPhase::Ready, 2)
        ]
    );
}

#[tokio::test]
async fn wait_ready_times_out() {
    let c = client(None).await;
    let err = c
        .wait_ready("default", "stuck", 5, Duration::from_millis(250), |_| {})
        .await
        .expect_err("timeout");
    match err {
        ClientError::WaitTimeout {
            revision,
            last_phase,
            ..
        } => {
            assert_eq!(revision, 5);
            assert_eq!(last_phase, "Building");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[tokio::test]
async fn trigger_crud() {
    let c = client(None).await;
    let created = c
        .create_trigger(
            "default",
            &json!({"name": "nightly", "function": "hello", "type": "cron", "schedule": "0 3 * * *"}),
        )
        .await
        .expect("create");
    assert_eq!(
        (
            created.name.as_str(),
            created.kind(),
            created.namespace.as_str()
        ),
        ("nightly", "cron", "default")
    );
    assert_eq!(created.schedule(), Some("0 3 * * *"));
    assert_eq!(
        created.status.next_fire_at.as_deref(),
        Some("2025-01-01T00:05:00Z")
    );
    assert!(
        created.spec.enabled,
        "absent enabled reads as the API default, true"
    );

    let err = c
        .create_trigger(
            "default",
            &json!({"name": "x", "function": "missing", "type": "http"}),
        )
        .await
        .expect_err("400");
    assert_eq!(err.status(), Some(400));

    let listed = c.list_triggers("default").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].methods(), ["GET", "POST"]);
    assert_eq!(listed[0].path(), Some("/orders"));

    assert_eq!(
        c.get_trigger("default", "orders").await.expect("get").name,
        "orders"
    );
    assert_eq!(
        c.get_trigger("default", "missing")
            .await
            .expect_err("404")
            .status(),
        Some(404)
    );

    let disabled = c
        .patch_trigger("default", "orders", &json!({"enabled": false}))
        .await
        .expect("patch");
    assert!(!disabled.spec.enabled);

    c.delete_trigger("default", "orders").await.expect("delete");
    assert_eq!(
        c.delete_trigger("default", "missing")
            .await
            .expect_err("404")
            .status(),
        Some(404)
    );
}

#[tokio::test]
async fn job_crud() {
    let c = client(None).await;
    let created = c
        .create_job(
            "default",
            &json!({"name": "once", "function": "hello", "event": {"a": 1}}),
        )
        .await
        .expect("create");
    assert_eq!(created.function(), Some("hello"));
    assert_eq!(created.spec["event"], json!({"a": 1}));
    assert_eq!(
        (created.status.phase.as_str(), created.status.run_id),
        ("Pending", 1)
    );

    let err = c
        .create_job("default", &json!({"name": "dup", "function": "hello"}))
        .await
        .expect_err("409");
    assert_eq!(err.status(), Some(409));

    let listed = c.list_jobs("default").await.expect("list");
    assert_eq!(
        listed
            .iter()
            .map(|j| (j.name.as_str(), j.runtime()))
            .collect::<Vec<_>>(),
        [("once", None), ("batch", Some("python3"))]
    );

    let job = c.get_job("default", "once", None).await.expect("get");
    assert_eq!(
        job.status.message, "wait=",
        "no wait parameter without a wait"
    );
    let job = c.get_job("default", "once", Some(7)).await.expect("get");
    assert_eq!(job.status.message, "wait=7");
    assert_eq!(
        c.get_job("default", "missing", None)
            .await
            .expect_err("404")
            .status(),
        Some(404)
    );

    let patched = c
        .patch_job("default", "once", &json!({"run_id": 2}))
        .await
        .expect("patch");
    assert_eq!(patched.spec_run_id(), 2);
    assert_eq!(
        (patched.status.phase.as_str(), patched.status.run_id),
        ("Pending", 2)
    );

    let uploaded = c
        .upload_job_code("default", "batch", b"PK\x05\x06".to_vec())
        .await
        .expect("upload");
    assert_eq!(uploaded["code_sha256"], "len-4");

    c.delete_job("default", "once").await.expect("delete");
    assert_eq!(
        c.delete_job("default", "missing")
            .await
            .expect_err("404")
            .status(),
        Some(404)
    );
}

#[tokio::test]
async fn wait_job_skips_earlier_runs() {
    let c = client(None).await;
    let mut seen = Vec::new();
    let job = c
        .wait_job("default", "rerun", 2, None, |j| {
            seen.push((j.status.phase.clone(), j.status.run_id));
        })
        .await
        .expect("finished");
    assert_eq!(job.status.result, Some(json!({"n": 2})));
    assert_eq!(job.status.message, "wait=30", "long polls of 30 s");
    // Succeeded for run 1 does not count: the caller asked for run 2.
    assert_eq!(
        seen,
        [
            (JobPhase::Succeeded, 1),
            (JobPhase::Running, 2),
            (JobPhase::Succeeded, 2)
        ]
    );
}

#[tokio::test]
async fn wait_job_times_out() {
    let c = client(None).await;
    let err = c
        .wait_job(
            "default",
            "stuck",
            5,
            Some(Duration::from_millis(10)),
            |j| {
                // A short timeout asks the server to hold the answer for a second only.
                assert_eq!(j.status.message, "wait=1");
            },
        )
        .await
        .expect_err("timeout");
    match err {
        ClientError::JobWaitTimeout {
            run_id, last_phase, ..
        } => assert_eq!((run_id, last_phase.as_str()), (5, "Running")),
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[tokio::test]
async fn lists_invocations_with_filters() {
    let c = client(None).await;
    let all = c
        .list_invocations("default", &InvocationQuery::default())
        .await
        .expect("list");
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].error.as_deref(), Some(""), "no filters sent");
    assert!(all[0].cold_start);
    assert_eq!((all[0].duration_ms, all[0].revision), (12.5, 2));
    // The second record omits most fields and still decodes.
    assert_eq!((all[1].status, all[1].error.as_deref()), (500, None));

    let query = InvocationQuery {
        function: Some("hello".into()),
        status: Some(500),
        source: Some("cron".into()),
        since: Some("2025-01-01T00:00:00+00:00".into()),
        limit: Some(10),
    };
    let filtered = c.list_invocations("default", &query).await.expect("list");
    assert_eq!(
        filtered[0].error.as_deref(),
        Some("function=hello&limit=10&since=2025-01-01T00:00:00+00:00&source=cron&status=500")
    );
}

#[tokio::test]
async fn device_crud() {
    let c = client(None).await;
    let labels = std::collections::BTreeMap::from([("room".to_string(), "lab".to_string())]);
    let created = c
        .create_device("default", "t77", &labels, false)
        .await
        .expect("create");
    assert_eq!((created.name.as_str(), created.enabled), ("t77", false));
    assert_eq!(created.labels, labels);
    assert_eq!(created.mqtt.password.as_deref(), Some("pw-1"));
    assert_eq!(created.mqtt.publish_topic, "default/telemetry/t77");
    let err = c
        .create_device("default", "taken", &Default::default(), true)
        .await
        .expect_err("409");
    assert_eq!(err.code(), Some("already_exists"));

    let listed = c.list_devices("default").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].mqtt.password, None, "lists carry no password");
    assert_eq!(listed[0].mqtt.port, 1883);

    assert_eq!(
        c.get_device("default", "t77").await.expect("get").name,
        "t77"
    );
    assert_eq!(
        c.get_device("default", "missing")
            .await
            .expect_err("404")
            .status(),
        Some(404)
    );

    let disabled = c
        .patch_device("default", "t77", &json!({"enabled": false}))
        .await
        .expect("patch");
    assert!(!disabled.enabled);

    let rotated = c
        .rotate_device_credentials("default", "t77")
        .await
        .expect("rotate");
    assert_eq!(rotated.mqtt.password.as_deref(), Some("pw-2"));

    let sent = c
        .send_device_command("default", "t77", &json!({"led": "on"}))
        .await
        .expect("command");
    assert_eq!(sent.topic, "default/commands/t77");

    c.delete_device("default", "t77").await.expect("delete");
    assert_eq!(
        c.delete_device("default", "missing")
            .await
            .expect_err("404")
            .status(),
        Some(404)
    );
}

#[tokio::test]
async fn devices_without_the_broker_say_so() {
    let err = client(None)
        .await
        .list_devices("nomqtt")
        .await
        .expect_err("503");
    assert_eq!((err.status(), err.code()), (Some(503), Some("unavailable")));
    assert!(err.to_string().contains("--mqtt-listen"), "{err}");
}

#[tokio::test]
async fn telemetry_sends_only_the_bounds_given() {
    let c = client(None).await;
    let items = c
        .device_telemetry("default", "t77", None, None, None)
        .await
        .expect("telemetry");
    assert_eq!(items.len(), 2);
    assert_eq!(items[0].payload, json!(""), "no query sent");
    assert_eq!(items[1].payload, json!({"temp": 21}));
    assert_eq!(items[1].device, "t77");

    let items = c
        .device_telemetry(
            "default",
            "t77",
            Some("2025-01-01T00:00:00+01:00"),
            Some("2025-01-02T00:00:00Z"),
            Some(5),
        )
        .await
        .expect("telemetry");
    // The '+' of an offset arrives as sent, not as a space.
    assert_eq!(
        items[0].payload,
        json!("limit=5&since=2025-01-01T00:00:00+01:00&until=2025-01-02T00:00:00Z")
    );

    let items = c
        .namespace_telemetry(
            "default",
            Some("t77"),
            Some("2025-01-01T00:00:00Z"),
            None,
            None,
        )
        .await
        .expect("telemetry");
    assert_eq!(
        items[0].payload,
        json!("device=t77&since=2025-01-01T00:00:00Z")
    );
    let items = c
        .namespace_telemetry("default", None, None, None, Some(1000))
        .await
        .expect("telemetry");
    assert_eq!(items[0].payload, json!("limit=1000"));
}
