//! Optimistic concurrency: every function, trigger and job answers with an `ETag`
//! that moves only when its spec or code does; `If-Match` makes a write conditional
//! (`412` when stale); concurrent unconditional patches all land.

use axum::http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};
use sless_store::{JobStore, SqlStore, Store, TriggerStore};

use crate::harness::{App, Req, zip};

const FUNCTION: &str = "/v1/namespaces/default/functions/hello";
const TRIGGER: &str = "/v1/namespaces/default/triggers/t";
const JOB: &str = "/v1/namespaces/default/jobs/j";

fn etag(headers: &HeaderMap) -> String {
    headers
        .get("etag")
        .expect("an ETag header")
        .to_str()
        .unwrap()
        .to_string()
}

/// A server with function `hello`, http trigger `t` and self-contained job `j`
/// (`run_id: 0`, so it never runs), each checked to answer its create with `ETag: "1"`.
async fn app_with_objects() -> App {
    let app = App::start().await;
    let creates = [
        (
            "/v1/namespaces/default/functions",
            json!({"name": "hello", "runtime": "python3"}),
        ),
        (
            "/v1/namespaces/default/triggers",
            json!({"name": "t", "function": "hello", "type": "http", "path": "/t"}),
        ),
        (
            "/v1/namespaces/default/jobs",
            json!({"name": "j", "runtime": "python3", "run_id": 0}),
        ),
    ];
    for (path, body) in creates {
        let (status, headers, answer) = app.send_full(Req::json(Method::POST, path, &body)).await;
        assert_eq!(status, StatusCode::CREATED, "{path}: {answer}");
        assert_eq!(etag(&headers), "\"1\"", "{path}");
    }
    app
}

/// The store of a test server, opened beside it, to write status as the controller,
/// the scheduler and the job runner do.
async fn store(app: &App) -> SqlStore {
    app.open_store().await
}

/// A patch that changes a spec, different for every number.
type Change = fn(usize) -> Value;

/// Each object with a patch that changes its spec (different for every `i`).
fn objects() -> [(&'static str, Change); 3] {
    [
        (FUNCTION, |i| json!({"env": {"K": i.to_string()}})),
        (TRIGGER, |i| json!({"path": format!("/t{i}")})),
        (JOB, |i| json!({"max_attempts": i})),
    ]
}

async fn get(app: &App, path: &str) -> (String, Value) {
    let (status, headers, body) = app.send_full(Req::get(path)).await;
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    (etag(&headers), body)
}

/// An object without its status (which the server writes as it goes).
fn without_status(mut body: Value) -> Value {
    body.as_object_mut().unwrap().remove("status");
    body
}

/// The ETag and the object without its status.
async fn get_spec(app: &App, path: &str) -> (String, Value) {
    let (tag, body) = get(app, path).await;
    (tag, without_status(body))
}

async fn patch(
    app: &App,
    path: &str,
    body: &Value,
    if_match: &[&str],
) -> (StatusCode, HeaderMap, Value) {
    let mut req = Req::json(Method::PATCH, path, body);
    for value in if_match {
        req = req.header("if-match", value);
    }
    app.send_full(req).await
}

#[tokio::test]
async fn the_etag_moves_with_the_spec_and_never_with_status() {
    let app = app_with_objects().await;
    let no_ops = [
        (FUNCTION, json!({"memory_mb": 128})),
        (TRIGGER, json!({"enabled": true})),
        (JOB, json!({"run_id": 0})),
    ];
    for (path, no_op) in no_ops {
        let (tag, before) = get_spec(&app, path).await;
        assert_eq!(tag, "\"1\"", "{path}");
        let (status, headers, body) = patch(&app, path, &no_op, &[]).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert_eq!(
            etag(&headers),
            "\"1\"",
            "{path}: a patch that changes nothing"
        );
        assert_eq!(without_status(body), before, "{path}");
    }
    for (path, change) in objects() {
        let (status, headers, body) = patch(&app, path, &change(5), &[]).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert_eq!(etag(&headers), "\"2\"", "{path}");
        assert_eq!(
            get_spec(&app, path).await,
            ("\"2\"".to_string(), without_status(body))
        );
    }

    // Status written by the server's own parts leaves the ETag alone.
    let store = store(&app).await;
    let function = sless_core::FunctionStatus {
        message: "status of revision 2".into(),
        revision: 2,
        ..Default::default()
    };
    assert!(
        store
            .set_status("default", "hello", 2, &function)
            .await
            .unwrap()
    );
    let job = sless_core::JobStatus {
        message: "written by the runner".into(),
        ..Default::default()
    };
    assert!(store.set_job_status("default", "j", &job).await.unwrap());
    let trigger = sless_core::TriggerStatus {
        last_result: Some(sless_core::trigger::TriggerResult::parse("ok")),
        ..Default::default()
    };
    store
        .set_trigger_status("default", "t", &trigger)
        .await
        .unwrap();
    let (tag, body) = get(&app, FUNCTION).await;
    assert_eq!(
        (tag.as_str(), &body["status"]["message"]),
        ("\"2\"", &json!("status of revision 2"))
    );
    let (tag, body) = get(&app, JOB).await;
    assert_eq!(
        (tag.as_str(), &body["status"]["message"]),
        ("\"2\"", &json!("written by the runner"))
    );
    assert_eq!(get(&app, TRIGGER).await.0, "\"2\"");
}

#[tokio::test]
async fn if_match_applies_to_the_current_version_only() {
    let app = app_with_objects().await;
    for (path, change) in objects() {
        let (status, headers, body) = patch(&app, path, &change(2), &["\"1\""]).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert_eq!(etag(&headers), "\"2\"", "{path}");

        // Stale: 412, the current tag, nothing changed.
        let before = get_spec(&app, path).await;
        let (status, headers, body) = patch(&app, path, &change(3), &["\"1\""]).await;
        assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{path}: {body}");
        assert_eq!(etag(&headers), "\"2\"", "{path}");
        assert_eq!(body["error"]["code"], "precondition_failed", "{path}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("current ETag \"2\""), "{path}: {message}");
        // Even a body that would be refused: the precondition is looked at first.
        let (status, _, _) = patch(&app, path, &json!({"colour": 1}), &["\"1\""]).await;
        assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{path}");
        assert_eq!(
            get_spec(&app, path).await,
            before,
            "{path}: a stale write changes nothing"
        );

        // A weak tag never matches, not even the current one.
        let (status, headers, _) = patch(&app, path, &change(3), &["W/\"2\""]).await;
        assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{path}");
        assert_eq!(etag(&headers), "\"2\"", "{path}");

        // `*`, or a list holding the current tag (in one field or several), applies.
        let (status, headers, body) = patch(&app, path, &change(3), &["*"]).await;
        assert_eq!(
            (status, etag(&headers)),
            (StatusCode::OK, "\"3\"".into()),
            "{path}: {body}"
        );
        let (status, headers, body) = patch(&app, path, &change(4), &["\"1\", \"3\""]).await;
        assert_eq!(
            (status, etag(&headers)),
            (StatusCode::OK, "\"4\"".into()),
            "{path}: {body}"
        );
        let (status, headers, body) =
            patch(&app, path, &change(5), &["\"9\"", "W/\"1\", \"4\""]).await;
        assert_eq!(
            (status, etag(&headers)),
            (StatusCode::OK, "\"5\"".into()),
            "{path}: {body}"
        );

        for malformed in ["5", "\"5", "*, \"5\"", "\"5\" \"6\""] {
            let mut req = Req::json(Method::PATCH, path, &change(6));
            req = req.header("if-match", malformed);
            app.expect_error(req, 400, "invalid", &["If-Match"]).await;
        }
        assert_eq!(get(&app, path).await.0, "\"5\"", "{path}");
    }
    // A missing object is 404 whatever If-Match says.
    let missing = "/v1/namespaces/default/jobs/missing";
    for if_match in ["*", "\"1\""] {
        let req = Req::json(Method::PATCH, missing, &json!({"max_attempts": 2}))
            .header("if-match", if_match);
        app.expect_error(req, 404, "not_found", &["missing"]).await;
    }
}

#[tokio::test]
async fn code_uploads_take_if_match_and_answer_with_the_etag() {
    let app = app_with_objects().await;
    let archive = zip(&[("handler.py", b"def handle(event, context):\n    return 1\n")]);
    let upload = |path: &str, if_match: &str| {
        Req::new(Method::PUT, &format!("{path}/code"))
            .body("application/zip", archive.clone())
            .header("if-match", if_match)
    };
    // A stale If-Match is refused before the archive is looked at or stored.
    let (status, headers, body) = app.send_full(upload(FUNCTION, "\"7\"")).await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{body}");
    assert_eq!(etag(&headers), "\"1\"");
    assert_eq!(
        get(&app, FUNCTION).await.1["status"]["code_sha256"],
        Value::Null
    );

    let (status, headers, body) = app.send_full(upload(JOB, "\"7\"")).await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{body}");
    assert_eq!(etag(&headers), "\"1\"");
    let (status, headers, body) = app.send_full(upload(JOB, "\"1\"")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(etag(&headers), "\"2\"");
    let (tag, job) = get(&app, JOB).await;
    assert_eq!(tag, "\"2\"");
    assert_eq!(job["code_sha256"], body["code_sha256"]);
    // The same archive again changes nothing.
    let (status, headers, _) = app.send_full(upload(JOB, "*")).await;
    assert_eq!(
        (status, etag(&headers)),
        (StatusCode::ACCEPTED, "\"2\"".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_patches_of_one_object_all_land() {
    const N: usize = 20;
    let app = app_with_objects().await;
    app.expect(
        Req::json(
            Method::POST,
            "/v1/namespaces/default/triggers",
            &json!({"name": "c", "function": "hello", "type": "cron", "schedule": "0 0 1 1 *"}),
        ),
        201,
    )
    .await;
    let cron = "/v1/namespaces/default/triggers/c";
    let kinds: [(&str, &str, Change); 3] = [
        (FUNCTION, "env", |i| json!({"env": {format!("K{i}"): "v"}})),
        (cron, "event", |i| json!({"event": {format!("k{i}"): i}})),
        (JOB, "env", |i| json!({"env": {format!("K{i}"): "v"}})),
    ];
    for (path, field, change) in kinds {
        let bodies: Vec<Value> = (0..N).map(change).collect();
        let answers =
            futures::future::join_all(bodies.iter().map(|b| patch(&app, path, b, &[]))).await;
        for (status, _, body) in &answers {
            assert_eq!(*status, StatusCode::OK, "{path}: {body}");
        }
        let (tag, body) = get(&app, path).await;
        let keys = body["spec"][field]
            .as_object()
            .or_else(|| body[field].as_object())
            .unwrap_or_else(|| panic!("{path}: no {field} in {body}"));
        assert_eq!(keys.len(), N, "{path}: every patch landed: {body}");
        assert_eq!(tag, format!("\"{}\"", N + 1), "{path}");
    }
}
