//! Namespaces, tokens, invocations, unknown endpoints and methods, and a full disk.

use axum::http::Method;
use serde_json::json;

use crate::harness::{App, Req};

#[tokio::test]
async fn namespace_errors() {
    let app = App::start().await;
    app.expect_error(Req::get("/v1/namespaces/nope"), 404, "not_found", &["nope"])
        .await;
    app.expect_error(
        Req::delete("/v1/namespaces/nope"),
        404,
        "not_found",
        &["nope"],
    )
    .await;
    app.expect_error(
        Req::new(Method::PUT, "/v1/namespaces/Bad_NS"),
        400,
        "invalid",
        &["Bad_NS"],
    )
    .await;
    app.function("default", "hello").await;
    app.expect_error(
        Req::delete("/v1/namespaces/default"),
        409,
        "conflict",
        &["default", "force"],
    )
    .await;
    app.expect_error(
        Req::delete("/v1/namespaces/default?force=maybe"),
        400,
        "invalid",
        &["force"],
    )
    .await;
    // Ensuring is idempotent: 201, then 200.
    app.expect(Req::new(Method::PUT, "/v1/namespaces/team-a"), 201)
        .await;
    app.expect(Req::new(Method::PUT, "/v1/namespaces/team-a"), 200)
        .await;
    // A JSON `null` body asks for nothing more than no body does.
    let answer = app
        .expect(
            Req::json(Method::PUT, "/v1/namespaces/team-a", &json!(null)),
            200,
        )
        .await;
    assert_eq!(answer["name"], "team-a", "{answer}");
    app.expect_error(
        Req::json(Method::PUT, "/v1/namespaces/team-a", &json!([1])),
        400,
        "invalid",
        &["body"],
    )
    .await;
}

#[tokio::test]
async fn the_tenancy_endpoints_refuse_callers_without_credentials() {
    let app = App::start().await;
    let secret = "/v1/namespaces/default/secrets/db";
    for req in [
        Req::get("/v1/tokens"),
        Req::delete("/v1/tokens/0123456789ab"),
        Req::new(Method::POST, "/v1/tokens/admin/rotate"),
        Req::get("/v1/audit"),
        Req::get("/v1/namespaces/default/secrets"),
        Req::json(Method::PUT, secret, &json!({"data": {"K": "v"}})),
        Req::get(secret),
        Req::delete(secret),
    ] {
        app.expect_error(req.token(None), 401, "unauthorized", &["Authorization"])
            .await;
    }
    // Nothing was written.
    app.expect_error(Req::get(secret), 404, "not_found", &["db"])
        .await;
}

#[tokio::test]
async fn token_errors() {
    let app = App::start().await;
    let tokens = |body: serde_json::Value| Req::json(Method::POST, "/v1/tokens", &body);
    app.expect_error(tokens(json!({})), 400, "invalid", &["namespace"])
        .await;
    app.expect_error(
        tokens(json!({"namespace": 5})),
        400,
        "invalid",
        &["namespace"],
    )
    .await;
    app.expect_error(
        tokens(json!({"namespace": "Bad_NS"})),
        400,
        "invalid",
        &["namespace"],
    )
    .await;
    app.expect_error(
        tokens(json!({"namespace": "default", "colour": 1})),
        400,
        "invalid",
        &["colour"],
    )
    .await;
    app.expect_error(
        tokens(json!({"namespace": "nope"})),
        404,
        "not_found",
        &["nope"],
    )
    .await;
    app.expect_error(
        Req::new(Method::POST, "/v1/tokens").body("text/plain", b"{}".to_vec()),
        415,
        "unsupported_media_type",
        &["application/json"],
    )
    .await;
    // A namespace token may not make tokens, not even for its own namespace.
    let token = app.namespace_token("team-a").await;
    app.expect_error(
        tokens(json!({"namespace": "team-a"})).token(Some(&token)),
        404,
        "not_found",
        &[],
    )
    .await;
    // Nor make other namespaces.
    app.expect_error(
        Req::new(Method::PUT, "/v1/namespaces/team-b").token(Some(&token)),
        404,
        "not_found",
        &["team-b"],
    )
    .await;
    app.expect_error(
        Req::get("/v1/namespaces/team-b"),
        404,
        "not_found",
        &["team-b"],
    )
    .await;
}

#[tokio::test]
async fn invocation_queries_name_the_bad_parameter() {
    let app = App::start().await;
    let list = "/v1/namespaces/default/invocations";
    for (query, name) in [
        ("status=abc", "status"),
        ("status=600", "status"),
        ("since=yesterday", "since"),
        ("limit=-1", "limit"),
        ("limit=0", "limit"),
        ("limit=100000000", "limit"),
        ("source=carrier-pigeon", "source"),
        ("function=Bad_Name", "function"),
    ] {
        app.expect_error(
            Req::get(&format!("{list}?{query}")),
            400,
            "invalid",
            &[name],
        )
        .await;
    }
    app.expect_error(
        Req::get("/v1/namespaces/nope/invocations"),
        404,
        "not_found",
        &["nope"],
    )
    .await;
    let empty = app.expect(Req::get(list), 200).await;
    assert_eq!(empty, json!({"items": []}));
}

#[tokio::test]
async fn unknown_endpoints_are_404_and_unknown_methods_405() {
    let app = App::start().await;
    app.function("default", "hello").await;
    for path in [
        "/v1/nothing",
        "/v1/namespaces/default/functions/hello/nothing",
        "/nothing",
    ] {
        app.expect_error(Req::get(path), 404, "not_found", &["endpoint"])
            .await;
    }
    let f = "/v1/namespaces/default/functions/hello";
    for (method, path) in [
        (Method::POST, "/healthz"),
        (Method::POST, "/readyz"),
        (Method::POST, "/v1/whoami"),
        (Method::PUT, "/v1/tokens"),
        (Method::GET, "/v1/tokens/admin/rotate"),
        (Method::POST, "/v1/namespaces"),
        (Method::POST, "/v1/namespaces/default"),
        (Method::DELETE, "/v1/namespaces/default/functions"),
        (Method::PUT, f),
        (Method::POST, f),
        (Method::GET, &format!("{f}/code")),
        (Method::POST, &format!("{f}/source")),
        (Method::DELETE, &format!("{f}/logs")),
        (Method::GET, &format!("{f}/invoke")),
        (Method::POST, "/v1/namespaces/default/invocations"),
        (Method::PUT, "/v1/namespaces/default/triggers"),
        (Method::PUT, "/v1/namespaces/default/triggers/t"),
        (Method::PUT, "/v1/namespaces/default/jobs"),
        (Method::PUT, "/v1/namespaces/default/jobs/j"),
        (Method::GET, "/v1/namespaces/default/jobs/j/code"),
    ] {
        app.expect_error(Req::new(method, path), 405, "method_not_allowed", &[])
            .await;
    }
}

#[tokio::test]
async fn public_routes_to_nothing_are_404() {
    let app = App::start().await;
    app.expect_error(
        Req::get("/fn/default/missing").token(None),
        404,
        "not_found",
        &["missing"],
    )
    .await;
    app.expect_error(
        Req::get("/t/default/missing").token(None),
        404,
        "not_found",
        &["/t/default/missing"],
    )
    .await;
}

#[tokio::test]
async fn below_the_free_space_floor_readyz_is_503_and_writes_507() {
    // A floor no disk can meet.
    let app = App::start_with(&["--min-free-mb", "1000000000"]).await;
    let (status, body) = app.send(Req::get("/readyz").token(None)).await;
    assert_eq!(status.as_u16(), 503, "{body}");
    assert_eq!(body["status"], "unavailable", "{body}");
    app.expect_error(
        Req::json(
            Method::POST,
            "/v1/namespaces/default/functions",
            &json!({"name": "a", "runtime": "python3"}),
        ),
        507,
        "insufficient_storage",
        &[],
    )
    .await;
    // Reads still work.
    app.expect(Req::get("/v1/namespaces/default/functions"), 200)
        .await;
}
