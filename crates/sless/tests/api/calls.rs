//! Async calls and dead letters through the API, in-process: queueing answers `202`
//! with the call id, the call's result and its dead letter are visible, and every
//! refusal has the contract's status and error shape.

use axum::http::Method;
use serde_json::{Value, json};

use crate::harness::{App, Req};

/// Reads the call until it has ended (the dispatcher runs it in the background).
async fn ended(app: &App, id: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let call = app
            .expect(Req::get(&format!("/v1/namespaces/default/calls/{id}")), 200)
            .await;
        if matches!(call["phase"].as_str(), Some("Succeeded" | "Failed")) {
            return call;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the call never ended: {call}"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn invoke_async(function: &str, event: &Value) -> Req {
    Req::json(
        Method::POST,
        &format!("/v1/namespaces/default/functions/{function}/invoke?async=true"),
        event,
    )
}

#[tokio::test]
async fn a_call_that_cannot_run_is_failed_dead_lettered_redriven_and_deleted() {
    let app = App::start().await;
    // Created without code: nothing serves it, so every attempt fails with the
    // platform's 404, retried like a 503 (a deploy may be on its way) until the
    // policy's three attempts are spent.
    app.function("default", "pending").await;
    let (status, headers, body) = app
        .send_full(invoke_async("pending", &json!({"n": 1})))
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["call_id"].as_str().expect("a call id").to_string();
    assert_eq!(headers["x-call-id"], id.as_str());

    let call = ended(&app, &id).await;
    assert_eq!(call["phase"], "Failed", "{call}");
    assert_eq!(call["function"], "pending");
    assert_eq!(call["attempts"], 3, "{call}");
    assert_eq!(call["error"], "function not found", "{call}");
    assert!(call["finished_at"].is_string(), "{call}");
    let listed = app
        .expect(
            Req::get("/v1/namespaces/default/calls?function=pending&phase=Failed"),
            200,
        )
        .await;
    assert_eq!(listed["items"][0]["id"], id.as_str(), "{listed}");

    let dead = app
        .expect(
            Req::get("/v1/namespaces/default/dead-letters?function=pending"),
            200,
        )
        .await;
    let dl = &dead["items"][0];
    assert_eq!(dl["source"], "async", "{dead}");
    assert_eq!(dl["payload"], json!({"n": 1}), "{dead}");
    assert_eq!(dl["message"]["call_id"], id.as_str(), "{dead}");
    assert_eq!(dl["attempts"], 3);
    let dl_id = dl["id"].as_str().expect("an id").to_string();

    // Redriven: queued again from attempt 1; it fails again and comes back updated.
    app.expect(
        Req::new(
            Method::POST,
            &format!("/v1/namespaces/default/dead-letters/{dl_id}/redrive"),
        ),
        202,
    )
    .await;
    let again = ended(&app, &id).await;
    assert_eq!(again["phase"], "Failed", "{again}");
    let dead = app
        .expect(Req::get("/v1/namespaces/default/dead-letters"), 200)
        .await;
    assert_eq!(dead["items"].as_array().map(Vec::len), Some(1), "{dead}");

    app.expect(
        Req::delete(&format!("/v1/namespaces/default/dead-letters/{dl_id}")),
        204,
    )
    .await;
    app.expect_error(
        Req::delete(&format!("/v1/namespaces/default/dead-letters/{dl_id}")),
        404,
        "not_found",
        &[&dl_id],
    )
    .await;
}

#[tokio::test]
async fn refusals_name_what_is_wrong() {
    let app = App::start().await;
    app.function("default", "f").await;
    app.expect_error(
        Req::json(
            Method::POST,
            "/v1/namespaces/default/functions/f/invoke?async=maybe",
            &json!({}),
        ),
        400,
        "invalid",
        &["async"],
    )
    .await;
    app.expect_error(
        invoke_async("f", &json!({})).header("x-callback-url", "ftp://example.com/x"),
        400,
        "invalid",
        &["X-Callback-Url"],
    )
    .await;
    app.expect_error(
        invoke_async("nope", &json!({})),
        404,
        "not_found",
        &["nope"],
    )
    .await;
    app.expect_error(
        Req::get("/v1/namespaces/default/calls?phase=Done"),
        400,
        "invalid",
        &["phase"],
    )
    .await;
    app.expect_error(
        Req::get("/v1/namespaces/default/calls?limit=0"),
        400,
        "invalid",
        &["limit"],
    )
    .await;
    app.expect_error(
        Req::get("/v1/namespaces/default/calls/0123"),
        404,
        "not_found",
        &["0123"],
    )
    .await;
    app.expect_error(
        Req::get("/v1/namespaces/default/dead-letters?colour=red"),
        400,
        "invalid",
        &["colour"],
    )
    .await;
    app.expect_error(
        Req::new(
            Method::POST,
            "/v1/namespaces/default/dead-letters/x1/redrive",
        ),
        404,
        "not_found",
        &["x1"],
    )
    .await;
    app.expect_error(
        Req::new(Method::POST, "/v1/namespaces/default/dead-letters/redrive"),
        400,
        "invalid",
        &["trigger"],
    )
    .await;
    // The public route knows only functions that serve.
    let (status, body) = app
        .send(Req::new(Method::POST, "/async/default/nope").token(None))
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
}

#[tokio::test]
async fn the_namespace_quota_of_queued_calls_is_enforced() {
    let app = App::start_with(&["--quota-queued-calls", "0"]).await;
    app.function("default", "f").await;
    app.expect_error(
        invoke_async("f", &json!({})),
        429,
        "quota_exceeded",
        &["queued_calls"],
    )
    .await;
}

#[tokio::test]
async fn a_call_of_another_namespace_is_not_found() {
    let app = App::start().await;
    app.function("default", "pending").await;
    let body = app.expect(invoke_async("pending", &json!(null)), 202).await;
    let id = body["call_id"].as_str().expect("a call id");
    app.expect(Req::new(Method::PUT, "/v1/namespaces/other"), 201)
        .await;
    app.expect_error(
        Req::get(&format!("/v1/namespaces/other/calls/{id}")),
        404,
        "not_found",
        &[id],
    )
    .await;
}
