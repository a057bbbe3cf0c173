//! Functions: create, get, patch, delete, code upload, source, logs and invoke.

use axum::http::Method;
use serde_json::{Value, json};

use crate::harness::{App, MAX_ARCHIVE_MB, Req, zip};

const FNS: &str = "/v1/namespaces/default/functions";
const HELLO: &str = "/v1/namespaces/default/functions/hello";

fn create(body: Value) -> Req {
    Req::json(Method::POST, FNS, &body)
}

fn patch(body: Value) -> Req {
    Req::json(Method::PATCH, HELLO, &body)
}

fn upload(path: &str, content_type: &str, body: Vec<u8>) -> Req {
    Req::new(Method::PUT, &format!("{path}/code")).body(content_type, body)
}

#[tokio::test]
async fn create_names_the_bad_field() {
    let app = App::start().await;
    let cases = [
        (json!([]), "body"),
        (json!({"runtime": "python3"}), "name"),
        (json!({"name": 7, "runtime": "python3"}), "name"),
        (json!({"name": "Bad_Name", "runtime": "python3"}), "name"),
        (json!({"name": "-a", "runtime": "python3"}), "name"),
        (
            json!({"name": "a".repeat(64), "runtime": "python3"}),
            "name",
        ),
        (json!({"name": "a"}), "runtime"),
        (json!({"name": "a", "runtime": "cobol"}), "cobol"),
        (
            json!({"name": "a", "runtime": "python3", "memory_mb": 1}),
            "memory_mb",
        ),
        (
            json!({"name": "a", "runtime": "python3", "memory_mb": "lots"}),
            "memory_mb",
        ),
        (
            json!({"name": "a", "runtime": "python3", "timeout_sec": 901}),
            "timeout_sec",
        ),
        (
            json!({"name": "a", "runtime": "python3", "min_instances": 3, "max_instances": 2}),
            "max_instances",
        ),
        (
            json!({"name": "a", "runtime": "python3", "concurrency": 0}),
            "concurrency",
        ),
        (
            json!({"name": "a", "runtime": "python3", "idle_timeout_sec": 0}),
            "idle_timeout_sec",
        ),
        (
            json!({"name": "a", "runtime": "python3", "env": {"A": 1}}),
            "env.A",
        ),
        (
            json!({"name": "a", "runtime": "python3", "colour": "red"}),
            "colour",
        ),
    ];
    for (body, field) in cases {
        let message = app
            .expect_error(create(body.clone()), 400, "invalid", &[field])
            .await;
        assert!(!message.is_empty(), "{body}");
    }
    // Nothing was created by any of them.
    let list = app.expect(Req::get(FNS), 200).await;
    assert_eq!(list, json!({"items": []}));
}

#[tokio::test]
async fn create_refuses_bad_bodies_duplicates_and_missing_namespaces() {
    let app = App::start().await;
    app.expect_error(
        Req::new(Method::POST, FNS).body("application/json", b"{".to_vec()),
        400,
        "invalid",
        &["JSON"],
    )
    .await;
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut req = Req::new(Method::POST, FNS);
        if let Some(ct) = content_type {
            req = req.body(ct, br#"{"name": "a", "runtime": "python3"}"#.to_vec());
        }
        app.expect_error(req, 415, "unsupported_media_type", &["application/json"])
            .await;
    }
    // Over the 1 MiB a JSON document may have.
    let mut big = br#"{"name": "a", "runtime": "python3", "env": {"A": ""#.to_vec();
    big.extend(std::iter::repeat_n(b'x', 1 << 20));
    big.extend(br#""}}"#);
    app.expect_error(
        Req::new(Method::POST, FNS).body("application/json", big),
        413,
        "payload_too_large",
        &["limit"],
    )
    .await;

    app.function("default", "hello").await;
    app.expect_error(
        create(json!({"name": "hello", "runtime": "nodejs"})),
        409,
        "conflict",
        &["hello", "already exists"],
    )
    .await;
    app.expect_error(
        Req::json(
            Method::POST,
            "/v1/namespaces/nope/functions",
            &json!({"name": "a", "runtime": "python3"}),
        ),
        404,
        "not_found",
        &["nope"],
    )
    .await;
}

#[tokio::test]
async fn get_patch_and_delete_of_a_missing_function_are_404() {
    let app = App::start().await;
    let missing = "/v1/namespaces/default/functions/missing";
    for req in [
        Req::get(missing),
        Req::json(Method::PATCH, missing, &json!({"memory_mb": 256})),
        Req::delete(missing),
        upload(missing, "application/zip", zip(&[("handler.py", b"x")])),
        Req::get(&format!("{missing}/source")),
        Req::get(&format!("{missing}/logs")),
        Req::json(Method::POST, &format!("{missing}/invoke"), &json!({})),
    ] {
        app.expect_error(req, 404, "not_found", &["missing"]).await;
    }
    app.expect_error(
        Req::get("/v1/namespaces/nope/functions"),
        404,
        "not_found",
        &["nope"],
    )
    .await;
    // Deleted is gone: a second delete is 404 too.
    app.function("default", "hello").await;
    app.expect(Req::delete(HELLO), 204).await;
    app.expect_error(Req::delete(HELLO), 404, "not_found", &["hello"])
        .await;
}

#[tokio::test]
async fn patch_names_the_bad_field() {
    let app = App::start().await;
    app.function("default", "hello").await;
    let before = app.expect(Req::get(HELLO), 200).await;
    let cases = [
        (json!([1]), "body"),
        (json!({"colour": 1}), "colour"),
        (json!({"name": "renamed"}), "name"),
        (json!({"memory_mb": "lots"}), "memory_mb"),
        (json!({"memory_mb": 99999}), "memory_mb"),
        (json!({"runtime": "cobol"}), "runtime"),
        (json!({"max_instances": 0}), "max_instances"),
        (json!({"env": {"A": []}}), "env.A"),
    ];
    for (body, field) in cases {
        app.expect_error(patch(body), 400, "invalid", &[field])
            .await;
    }
    for content_type in ["text/plain", "application/zip"] {
        app.expect_error(
            Req::new(Method::PATCH, HELLO).body(content_type, b"{}".to_vec()),
            415,
            "unsupported_media_type",
            &["application/json"],
        )
        .await;
    }
    app.expect_error(
        Req::new(Method::PATCH, HELLO).body("application/merge-patch+json", b"{nope".to_vec()),
        400,
        "invalid",
        &["JSON"],
    )
    .await;
    // None of them changed the function.
    let after = app.expect(Req::get(HELLO), 200).await;
    assert_eq!(before["spec"], after["spec"]);
    assert_eq!(before["status"]["revision"], after["status"]["revision"]);
}

#[tokio::test]
async fn code_uploads_refuse_bad_archives() {
    let app = App::start_with(&["--max-unpacked-mb", "1"]).await;
    app.function("default", "hello").await;
    for content_type in ["text/plain", "application/json", "application/octet-stream"] {
        app.expect_error(
            upload(HELLO, content_type, zip(&[("handler.py", b"x")])),
            415,
            "unsupported_media_type",
            &["application/zip"],
        )
        .await;
    }
    app.expect_error(
        upload(HELLO, "application/zip", Vec::new()),
        400,
        "invalid",
        &["code"],
    )
    .await;
    app.expect_error(
        upload(HELLO, "application/zip", b"not a zip".to_vec()),
        400,
        "invalid",
        &["code", "zip"],
    )
    .await;
    for path in ["../evil.py", "/etc/evil.py", "a/../../evil.py"] {
        app.expect_error(
            upload(HELLO, "application/zip", zip(&[(path, b"x")])),
            400,
            "invalid",
            &["code"],
        )
        .await;
    }
    // Over the compressed limit, and a small archive that unpacks past the unpacked one.
    let limit = (MAX_ARCHIVE_MB << 20) as usize;
    app.expect_error(
        upload(HELLO, "application/zip", vec![0; limit + 1]),
        413,
        "payload_too_large",
        &["limit"],
    )
    .await;
    let bomb = zip(&[("zeros.bin", &vec![0; 2 << 20])]);
    assert!(bomb.len() < limit);
    app.expect_error(
        upload(HELLO, "application/zip", bomb),
        413,
        "payload_too_large",
        &[],
    )
    .await;
    // Multipart (browsers): the archive must be in field `code`.
    let form = b"--X\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nhi\r\n--X--\r\n";
    app.expect_error(
        upload(HELLO, "multipart/form-data; boundary=X", form.to_vec()),
        400,
        "invalid",
        &["code"],
    )
    .await;
    app.expect_error(
        upload(
            HELLO,
            "multipart/form-data; boundary=X",
            b"garbage".to_vec(),
        ),
        400,
        "invalid",
        &["multipart"],
    )
    .await;
    // Nothing was stored: the function still waits for code at revision 1.
    let f = app.expect(Req::get(HELLO), 200).await;
    assert_eq!(f["status"]["phase"], "Pending", "{f}");
    assert_eq!(f["status"]["code_sha256"], Value::Null, "{f}");
    let source = app.expect(Req::get(&format!("{HELLO}/source")), 200).await;
    assert_eq!(source, json!({"items": []}));
}

#[tokio::test]
async fn logs_and_invoke_refuse_bad_input() {
    let app = App::start().await;
    app.function("default", "hello").await;
    for tail in ["abc", "-1", "100001"] {
        app.expect_error(
            Req::get(&format!("{HELLO}/logs?tail={tail}")),
            400,
            "invalid",
            &["tail"],
        )
        .await;
    }
    app.expect_error(
        Req::get(&format!("{HELLO}/logs?follow=maybe")),
        400,
        "invalid",
        &["follow"],
    )
    .await;

    let invoke = format!("{HELLO}/invoke");
    app.expect_error(
        Req::new(Method::POST, &invoke).body("application/json", b"{".to_vec()),
        400,
        "invalid",
        &["JSON"],
    )
    .await;
    // Over --max-body-mb (1 MiB here).
    app.expect_error(
        Req::new(Method::POST, &invoke).body("application/json", vec![b' '; (1 << 20) + 1]),
        413,
        "payload_too_large",
        &["limit"],
    )
    .await;
    // No code yet: nothing can serve it.
    app.expect_error(
        Req::json(Method::POST, &invoke, &json!({"x": 1})),
        503,
        "unavailable",
        &["hello", "Pending"],
    )
    .await;
}
