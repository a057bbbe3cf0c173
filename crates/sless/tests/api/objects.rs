//! Triggers and jobs: create, get, patch, delete and a self-contained job's code.

use axum::http::Method;
use serde_json::{Value, json};

use crate::harness::{App, MAX_ARCHIVE_MB, Req, zip};

const TRIGGERS: &str = "/v1/namespaces/default/triggers";
const JOBS: &str = "/v1/namespaces/default/jobs";

#[tokio::test]
async fn trigger_create_names_the_bad_field() {
    let app = App::start().await;
    app.function("default", "hello").await;
    let http = |extra: Value| {
        let mut body = json!({"name": "t", "function": "hello", "type": "http", "path": "/x"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let cases = [
        (json!([]), "body"),
        (
            json!({"function": "hello", "type": "http", "path": "/x"}),
            "name",
        ),
        (http(json!({"name": "Bad_Name"})), "name"),
        (http(json!({"function": "missing"})), "function"),
        (json!({"name": "t", "function": "hello"}), "type"),
        (http(json!({"type": "smoke"})), "type"),
        (http(json!({"path": "no-slash"})), "path"),
        (http(json!({"methods": ["FLY"]})), "methods"),
        (http(json!({"enabled": "yes"})), "enabled"),
        (http(json!({"colour": 1})), "colour"),
        (
            json!({"name": "c", "function": "hello", "type": "cron", "schedule": "every day"}),
            "schedule",
        ),
        (
            json!({"name": "c", "function": "hello", "type": "cron", "schedule": "* * * * *", "timezone": "Mars/Olympus"}),
            "timezone",
        ),
    ];
    for (body, field) in cases {
        app.expect_error(
            Req::json(Method::POST, TRIGGERS, &body),
            400,
            "invalid",
            &[field],
        )
        .await;
    }
    app.expect_error(
        Req::new(Method::POST, TRIGGERS).body("text/plain", http(json!({})).to_string().into()),
        415,
        "unsupported_media_type",
        &["application/json"],
    )
    .await;
    app.expect_error(
        Req::new(Method::POST, TRIGGERS).body("application/json", b"{".to_vec()),
        400,
        "invalid",
        &["JSON"],
    )
    .await;
    let list = app.expect(Req::get(TRIGGERS), 200).await;
    assert_eq!(list, json!({"items": []}));

    // A name or a route already taken is a conflict.
    app.trigger("t", "hello").await;
    app.expect_error(
        Req::json(Method::POST, TRIGGERS, &http(json!({"path": "/y"}))),
        409,
        "conflict",
        &["\"t\"", "already exists"],
    )
    .await;
    app.expect_error(
        Req::json(
            Method::POST,
            TRIGGERS,
            &http(json!({"name": "u", "path": "/t"})),
        ),
        409,
        "conflict",
        &["/t"],
    )
    .await;
}

#[tokio::test]
async fn trigger_get_patch_delete_errors() {
    let app = App::start().await;
    app.function("default", "hello").await;
    app.trigger("t", "hello").await;
    let missing = format!("{TRIGGERS}/missing");
    for req in [
        Req::get(&missing),
        Req::json(Method::PATCH, &missing, &json!({"enabled": false})),
        Req::delete(&missing),
    ] {
        app.expect_error(req, 404, "not_found", &["missing"]).await;
    }
    let t = format!("{TRIGGERS}/t");
    let before = app.expect(Req::get(&t), 200).await;
    for (body, field) in [
        (json!([1]), "body"),
        (json!({"colour": 1}), "colour"),
        (json!({"enabled": "yes"}), "enabled"),
        (json!({"type": "cron"}), "type"),
        (json!({"path": "relative"}), "path"),
    ] {
        app.expect_error(
            Req::json(Method::PATCH, &t, &body),
            400,
            "invalid",
            &[field],
        )
        .await;
    }
    app.expect_error(
        Req::new(Method::PATCH, &t).body("text/plain", b"{}".to_vec()),
        415,
        "unsupported_media_type",
        &["application/json"],
    )
    .await;
    let after = app.expect(Req::get(&t), 200).await;
    assert_eq!(before, after, "a refused patch changes nothing");
    app.expect(Req::delete(&t), 204).await;
    app.expect_error(Req::delete(&t), 404, "not_found", &["\"t\""])
        .await;
}

#[tokio::test]
async fn queue_trigger_url_secrets_must_exist_but_brokers_need_not_be_up() {
    let app = App::start().await;
    app.function("default", "hello").await;
    let queue = |source: Value| {
        json!({"name": "q", "function": "hello", "type": "queue", "source": source,
               "delivery": {"max_attempts": 2, "concurrency": 4}})
    };
    let secret_source = |key: &str| json!({"kind": "amqp", "topic": "orders", "url_secret": {"secret": "rabbit", "key": key}});
    // An MQTT URL names its protocol version, 3.1.1 or 5, and nothing else.
    app.expect_error(
        Req::json(
            Method::POST,
            TRIGGERS,
            &queue(json!({"kind": "mqtt", "url": "mqtt://127.0.0.1:1?version=6", "topic": "t"})),
        ),
        400,
        "invalid",
        &["source.url", "version=\"6\"", "version=3.1.1 or version=5"],
    )
    .await;
    app.expect_error(
        Req::json(Method::POST, TRIGGERS, &queue(secret_source("url"))),
        400,
        "invalid",
        &["source.url_secret", "\"rabbit\" does not exist"],
    )
    .await;
    app.expect(
        Req::json(
            Method::PUT,
            "/v1/namespaces/default/secrets/rabbit",
            &json!({"data": {"url": "amqp://guest:guest@127.0.0.1:1/%2f"}}),
        ),
        201,
    )
    .await;
    app.expect_error(
        Req::json(Method::POST, TRIGGERS, &queue(secret_source("uri"))),
        400,
        "invalid",
        &["source.url_secret", "no key \"uri\""],
    )
    .await;

    // Nothing listens on port 1: the trigger is created all the same, with a status.
    let created = app
        .expect(
            Req::json(Method::POST, TRIGGERS, &queue(secret_source("url"))),
            201,
        )
        .await;
    assert_eq!(created["source"]["group"], "sless-default-q");
    assert_eq!(created["delivery"]["concurrency"], 4);
    assert!(
        created["status"]["counters"].is_object(),
        "a queue trigger reports counters: {created}"
    );
    assert!(
        !created.to_string().contains("guest:guest"),
        "the secret's value is never shown: {created}"
    );
    let t = format!("{TRIGGERS}/q");
    app.expect_error(
        Req::json(
            Method::PATCH,
            &t,
            &json!({"source": {"url_secret": {"key": "other"}}}),
        ),
        400,
        "invalid",
        &["source.url_secret", "no key \"other\""],
    )
    .await;
    let patched = app
        .expect(
            Req::json(Method::PATCH, &t, &json!({"enabled": false})),
            200,
        )
        .await;
    assert!(
        patched["status"].get("connection").is_none(),
        "a disabled trigger consumes nothing: {patched}"
    );
    app.expect(Req::delete(&t), 204).await;
}

#[tokio::test]
async fn job_create_names_the_bad_field() {
    let app = App::start().await;
    app.function("default", "hello").await;
    let cases = [
        (json!([]), "body"),
        (json!({"function": "hello"}), "name"),
        (json!({"name": "Bad_Name", "function": "hello"}), "name"),
        (json!({"name": "j"}), "function"),
        (json!({"name": "j", "function": "missing"}), "function"),
        (
            json!({"name": "j", "function": "hello", "runtime": "python3"}),
            "function",
        ),
        (
            json!({"name": "j", "function": "hello", "run_id": -1}),
            "run_id",
        ),
        (
            json!({"name": "j", "function": "hello", "max_attempts": 0}),
            "max_attempts",
        ),
        (
            json!({"name": "j", "function": "hello", "timeout_sec": 100000}),
            "timeout_sec",
        ),
        (
            json!({"name": "j", "function": "hello", "colour": 1}),
            "colour",
        ),
        (json!({"name": "j", "runtime": "cobol"}), "runtime"),
    ];
    for (body, field) in cases {
        app.expect_error(
            Req::json(Method::POST, JOBS, &body),
            400,
            "invalid",
            &[field],
        )
        .await;
    }
    app.expect_error(
        Req::new(Method::POST, JOBS).body("text/plain", b"{}".to_vec()),
        415,
        "unsupported_media_type",
        &["application/json"],
    )
    .await;
    let list = app.expect(Req::get(JOBS), 200).await;
    assert_eq!(list, json!({"items": []}));
    app.job("j", json!({"function": "hello", "run_id": 0}))
        .await;
    app.expect_error(
        Req::json(
            Method::POST,
            JOBS,
            &json!({"name": "j", "function": "hello", "run_id": 0}),
        ),
        409,
        "conflict",
        &["\"j\"", "already exists"],
    )
    .await;
}

#[tokio::test]
async fn job_get_patch_delete_and_code_errors() {
    let app = App::start().await;
    app.function("default", "hello").await;
    app.job("j", json!({"function": "hello", "run_id": 0}))
        .await;
    let missing = format!("{JOBS}/missing");
    for req in [
        Req::get(&missing),
        Req::json(Method::PATCH, &missing, &json!({"run_id": 1})),
        Req::delete(&missing),
        Req::new(Method::PUT, &format!("{missing}/code"))
            .body("application/zip", zip(&[("handler.py", b"x")])),
    ] {
        app.expect_error(req, 404, "not_found", &["missing"]).await;
    }
    let j = format!("{JOBS}/j");
    for wait in ["abc", "-1", "901"] {
        app.expect_error(
            Req::get(&format!("{j}?wait={wait}")),
            400,
            "invalid",
            &["wait"],
        )
        .await;
    }
    let before = app.expect(Req::get(&j), 200).await;
    for (body, field) in [
        (json!([1]), "body"),
        (json!({"colour": 1}), "colour"),
        (json!({"function": 5}), "function"),
        (json!({"run_id": "next"}), "run_id"),
        (json!({"max_attempts": 0}), "max_attempts"),
    ] {
        app.expect_error(
            Req::json(Method::PATCH, &j, &body),
            400,
            "invalid",
            &[field],
        )
        .await;
    }
    app.expect_error(
        Req::new(Method::PATCH, &j).body("text/plain", b"{}".to_vec()),
        415,
        "unsupported_media_type",
        &["application/json"],
    )
    .await;
    let after = app.expect(Req::get(&j), 200).await;
    assert_eq!(before, after, "a refused patch changes nothing");

    // Only a self-contained job takes code.
    app.expect_error(
        Req::new(Method::PUT, &format!("{j}/code"))
            .body("application/zip", zip(&[("handler.py", b"x")])),
        409,
        "conflict",
        &["hello", "self-contained"],
    )
    .await;
    app.job("own", json!({"runtime": "python3", "run_id": 0}))
        .await;
    let code = format!("{JOBS}/own/code");
    app.expect_error(
        Req::new(Method::PUT, &code).body("text/plain", b"x".to_vec()),
        415,
        "unsupported_media_type",
        &["application/zip"],
    )
    .await;
    app.expect_error(
        Req::new(Method::PUT, &code).body("application/zip", b"not a zip".to_vec()),
        400,
        "invalid",
        &["code"],
    )
    .await;
    app.expect_error(
        Req::new(Method::PUT, &code).body("application/zip", zip(&[("../x.py", b"x")])),
        400,
        "invalid",
        &["code"],
    )
    .await;
    let limit = (MAX_ARCHIVE_MB << 20) as usize;
    app.expect_error(
        Req::new(Method::PUT, &code).body("application/zip", vec![0; limit + 1]),
        413,
        "payload_too_large",
        &["limit"],
    )
    .await;
    app.expect(Req::delete(&j), 204).await;
    app.expect_error(Req::delete(&j), 404, "not_found", &["\"j\""])
        .await;
}

#[tokio::test]
async fn without_a_broker_every_device_endpoint_says_how_to_get_one() {
    let app = App::start().await;
    let devices = "/v1/namespaces/default/devices";
    for req in [
        Req::get(devices),
        Req::json(Method::POST, devices, &json!({"name": "t1"})),
        Req::get(&format!("{devices}/t1")),
        Req::json(
            Method::PATCH,
            &format!("{devices}/t1"),
            &json!({"enabled": false}),
        ),
        Req::delete(&format!("{devices}/t1")),
        Req::json(Method::POST, &format!("{devices}/t1/commands"), &json!({})),
        Req::get(&format!("{devices}/t1/telemetry")),
        Req::get("/v1/namespaces/default/telemetry"),
    ] {
        app.expect_error(req, 503, "unavailable", &["--mqtt-listen"])
            .await;
    }
    app.function("default", "hello").await;
    app.expect_error(
        Req::json(
            Method::POST,
            TRIGGERS,
            &json!({"name": "d", "function": "hello", "type": "device"}),
        ),
        400,
        "invalid",
        &["type", "--mqtt-listen"],
    )
    .await;
    app.expect_error(
        Req::json(
            Method::POST,
            TRIGGERS,
            &json!({"name": "d", "function": "hello", "type": "device", "devices": "Caps*"}),
        ),
        400,
        "invalid",
        &["devices"],
    )
    .await;
}
