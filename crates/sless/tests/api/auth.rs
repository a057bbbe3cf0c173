//! Credentials on every `/v1` endpoint: none or a bad one is `401`; a namespace
//! token addressing another namespace gets `404`, as if nothing were there.

use axum::http::Method;
use serde_json::json;

use crate::harness::{App, Req};

/// Every `/v1` endpoint of the contract, on objects of the default namespace that
/// exist (function `hello`, trigger `t`, job `j`), each with a body it would take.
fn endpoints() -> Vec<Req> {
    let ns = "/v1/namespaces/default";
    let f = format!("{ns}/functions/hello");
    let empty = json!({});
    vec![
        Req::get("/v1/whoami"),
        Req::json(Method::POST, "/v1/tokens", &json!({"namespace": "default"})),
        Req::get("/v1/namespaces"),
        Req::new(Method::PUT, ns),
        Req::get(ns),
        Req::delete(&format!("{ns}?force=true")),
        Req::new(Method::POST, &format!("{ns}/restore")),
        Req::get(&format!("{ns}/functions")),
        Req::json(
            Method::POST,
            &format!("{ns}/functions"),
            &json!({"name": "other", "runtime": "python3"}),
        ),
        Req::get(&f),
        Req::json(Method::PATCH, &f, &json!({"env": {"A": "x"}})),
        Req::delete(&f),
        Req::new(Method::PUT, &format!("{f}/code")).body("application/zip", b"PK".to_vec()),
        Req::get(&format!("{f}/source")),
        Req::get(&format!("{f}/logs")),
        Req::json(Method::POST, &format!("{f}/invoke"), &empty),
        Req::get(&format!("{ns}/invocations")),
        Req::get(&format!("{ns}/triggers")),
        Req::json(
            Method::POST,
            &format!("{ns}/triggers"),
            &json!({"name": "u", "function": "hello", "type": "http", "path": "/u"}),
        ),
        Req::get(&format!("{ns}/triggers/t")),
        Req::json(
            Method::PATCH,
            &format!("{ns}/triggers/t"),
            &json!({"enabled": false}),
        ),
        Req::delete(&format!("{ns}/triggers/t")),
        Req::get(&format!("{ns}/jobs")),
        Req::json(
            Method::POST,
            &format!("{ns}/jobs"),
            &json!({"name": "k", "function": "hello", "run_id": 0}),
        ),
        Req::get(&format!("{ns}/jobs/j")),
        Req::json(
            Method::PATCH,
            &format!("{ns}/jobs/j"),
            &json!({"event": {"a": 1}}),
        ),
        Req::delete(&format!("{ns}/jobs/j")),
        Req::new(Method::PUT, &format!("{ns}/jobs/j/code")).body("application/zip", b"PK".to_vec()),
    ]
}

async fn app_with_objects() -> App {
    let app = App::start().await;
    app.function("default", "hello").await;
    app.trigger("t", "hello").await;
    app.job("j", json!({"function": "hello", "run_id": 0}))
        .await;
    app
}

/// Nothing was changed: the objects the sweep addressed are all still there.
async fn objects_intact(app: &App) {
    for path in [
        "/v1/namespaces/default/functions/hello",
        "/v1/namespaces/default/triggers/t",
        "/v1/namespaces/default/jobs/j",
    ] {
        app.expect(Req::get(path), 200).await;
    }
    for path in [
        "/v1/namespaces/default/functions/other",
        "/v1/namespaces/default/triggers/u",
        "/v1/namespaces/default/jobs/k",
    ] {
        app.expect_error(Req::get(path), 404, "not_found", &[])
            .await;
    }
}

#[tokio::test]
async fn every_endpoint_without_credentials_is_401() {
    let app = app_with_objects().await;
    for req in endpoints() {
        app.expect_error(req.token(None), 401, "unauthorized", &["Authorization"])
            .await;
    }
    objects_intact(&app).await;
}

#[tokio::test]
async fn every_endpoint_with_an_unknown_or_malformed_token_is_401() {
    let app = app_with_objects().await;
    for req in endpoints() {
        app.expect_error(
            req.token(Some("not-a-token")),
            401,
            "unauthorized",
            &["token"],
        )
        .await;
    }
    for req in endpoints() {
        app.expect_error(
            req.authorization("Basic YWRtaW46YWRtaW4="),
            401,
            "unauthorized",
            &["Bearer"],
        )
        .await;
    }
    objects_intact(&app).await;
}

#[tokio::test]
async fn a_namespace_token_sees_nothing_of_another_namespace() {
    let app = app_with_objects().await;
    let token = app.namespace_token("team-a").await;
    let own = ["/v1/whoami", "/v1/namespaces"];
    for req in endpoints() {
        let what = req.what();
        if own.iter().any(|p| what.ends_with(&format!("GET {p}"))) {
            continue;
        }
        // Creating tokens is the admin's: to a namespace token that endpoint does not exist.
        let (status, body) = app.send(req.token(Some(&token))).await;
        assert_eq!(status.as_u16(), 404, "{what}: {body}");
        assert_eq!(body["error"]["code"], "not_found", "{what}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            !message.contains("hello") || message.contains("namespace"),
            "{what}: the answer must not tell whether the object exists: {message}"
        );
    }
    objects_intact(&app).await;

    // What it may see is its own.
    let me = app
        .expect(Req::get("/v1/whoami").token(Some(&token)), 200)
        .await;
    assert_eq!(me["admin"], false, "{me}");
    assert_eq!(me["namespaces"], json!(["team-a"]), "{me}");
    let list = app
        .expect(Req::get("/v1/namespaces").token(Some(&token)), 200)
        .await;
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["team-a"], "{list}");
}

#[tokio::test]
async fn health_endpoints_need_no_credentials() {
    let app = App::start().await;
    let health = app.expect(Req::get("/healthz").token(None), 200).await;
    assert_eq!(health, json!({"status": "ok"}));
    let ready = app.expect(Req::get("/readyz").token(None), 200).await;
    assert_eq!(ready, json!({"status": "ready"}));
}
