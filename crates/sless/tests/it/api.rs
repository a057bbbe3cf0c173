//! The REST API's contract: validation, conflicts, tenancy, archives, builds.

use serde_json::{Value, json};

use crate::harness::{Server, TOKEN, repo_path, zip, zip_bytes};

async fn raw(
    server: &Server,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = server
        .client
        .http()
        .request(method, format!("{}{path}", server.url()));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn message(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn validation_errors_are_400_naming_the_field() {
    let server = Server::start().await;
    let fns = "/v1/namespaces/default/functions";
    let cases = [
        (json!({"runtime": "python3"}), "name"),
        (json!({"name": "Bad_Name", "runtime": "python3"}), "name"),
        (json!({"name": "a", "runtime": "cobol"}), "runtime"),
        (json!({"name": "a"}), "runtime"),
        (
            json!({"name": "a", "runtime": "python3", "memory_mb": 8}),
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
            json!({"name": "a", "runtime": "python3", "entrypoint": "nodot"}),
            "entrypoint",
        ),
        (
            json!({"name": "a", "runtime": "python3", "colour": "red"}),
            "colour",
        ),
        (
            json!({"name": "a", "runtime": "python3", "memory_mb": "lots"}),
            "memory_mb",
        ),
        (json!({"name": "a", "runtime": "ruby"}), "runtime"),
        (
            json!({"name": "a", "runtime": "go", "entrypoint": "handler.handle"}),
            "entrypoint",
        ),
    ];
    for (body, field) in cases {
        let (status, err) = raw(
            &server,
            reqwest::Method::POST,
            fns,
            Some(TOKEN),
            Some(body.clone()),
        )
        .await;
        assert_eq!(status, 400, "{body}: {err}");
        assert_eq!(err["error"]["code"], "invalid");
        assert!(
            message(&err).contains(field),
            "{body}: message {:?} does not name {field}",
            message(&err)
        );
    }
    // Not JSON at all, and the wrong content type.
    let resp = server
        .client
        .http()
        .post(format!("{}{fns}", server.url()))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let resp = server
        .client
        .http()
        .post(format!("{}{fns}", server.url()))
        .bearer_auth(TOKEN)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 415);
    // PATCH validates too, and unknown fields are refused.
    server
        .client
        .create_function("default", &json!({"name": "p", "runtime": "python3"}))
        .await
        .unwrap();
    let (status, err) = raw(
        &server,
        reqwest::Method::PATCH,
        "/v1/namespaces/default/functions/p",
        Some(TOKEN),
        Some(json!({"memory_mb": 1})),
    )
    .await;
    assert_eq!(status, 400, "{err}");
    assert!(message(&err).contains("memory_mb"));
    let (status, _) = raw(
        &server,
        reqwest::Method::PATCH,
        "/v1/namespaces/default/functions/p",
        Some(TOKEN),
        Some(json!({"nope": 1})),
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn duplicates_conflict_and_missing_objects_are_404() {
    let server = Server::start().await;
    let body = json!({"name": "dup", "runtime": "python3"});
    server
        .client
        .create_function("default", &body)
        .await
        .unwrap();
    let err = server
        .client
        .create_function("default", &body)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409));
    let err = server
        .client
        .delete_function("default", "missing")
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(404));
    let err = server
        .client
        .get_function("default", "missing")
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(404));
    server
        .client
        .delete_function("default", "dup")
        .await
        .unwrap();
    let (status, _) = raw(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces/default/functions/dup",
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 404);
    // The name is free again.
    server
        .client
        .create_function("default", &body)
        .await
        .unwrap();
}

#[tokio::test]
async fn tokens_and_tenancy() {
    let server = Server::start().await;
    let (status, _) = raw(&server, reqwest::Method::GET, "/v1/namespaces", None, None).await;
    assert_eq!(status, 401);
    let (status, _) = raw(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces",
        Some("wrong"),
        None,
    )
    .await;
    assert_eq!(status, 401);

    assert!(server.client.ensure_namespace("team-a").await.unwrap());
    assert!(!server.client.ensure_namespace("team-a").await.unwrap());
    server.client.ensure_namespace("team-b").await.unwrap();
    let token_a = server.client.create_token("team-a").await.unwrap();
    server
        .client
        .create_function("team-b", &json!({"name": "hidden", "runtime": "python3"}))
        .await
        .unwrap();

    let (status, who) = raw(
        &server,
        reqwest::Method::GET,
        "/v1/whoami",
        Some(&token_a),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(who, json!({"admin": false, "namespaces": ["team-a"]}));
    // Another namespace's objects look exactly like missing ones.
    for path in [
        "/v1/namespaces/team-b/functions/hidden",
        "/v1/namespaces/team-b/functions",
        "/v1/namespaces/nope/functions",
    ] {
        let (status, body) = raw(&server, reqwest::Method::GET, path, Some(&token_a), None).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, _) = raw(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/team-b/functions",
        Some(&token_a),
        Some(json!({"name": "x", "runtime": "python3"})),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = raw(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/team-a/functions",
        Some(&token_a),
        Some(json!({"name": "x", "runtime": "python3"})),
    )
    .await;
    assert_eq!(status, 201);
    let (status, list) = raw(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces",
        Some(&token_a),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    // Only admins mint tokens.
    let (status, _) = raw(
        &server,
        reqwest::Method::POST,
        "/v1/tokens",
        Some(&token_a),
        Some(json!({"namespace": "team-a"})),
    )
    .await;
    assert_eq!(status, 404);
    // A namespace with functions is deleted only with force.
    let err = server
        .client
        .delete_namespace("team-b", false)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409));
    server
        .client
        .delete_namespace("team-b", true)
        .await
        .unwrap();
}

#[tokio::test]
async fn unsafe_unreadable_and_oversized_archives_are_refused() {
    let server = Server::start_with(&["--max-archive-mb", "1"]).await;
    server
        .client
        .create_function("default", &json!({"name": "z", "runtime": "python3"}))
        .await
        .unwrap();
    for (what, archive) in [
        ("zip-slip", zip(&[("../evil.py", "x = 1")])),
        ("absolute path", zip(&[("/etc/evil.py", "x = 1")])),
        ("garbage", b"this is not a zip".to_vec()),
        ("empty", Vec::new()),
    ] {
        let err = server
            .client
            .upload_code("default", "z", archive)
            .await
            .unwrap_err();
        assert_eq!(err.status(), Some(400), "{what}: {err}");
    }
    // Incompressible bytes so the archive itself is over 1 MiB.
    let mut noise = Vec::with_capacity(2 << 20);
    let mut x: u64 = 0x9E3779B97F4A7C15;
    while noise.len() < (2 << 20) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        noise.extend_from_slice(&x.to_le_bytes());
    }
    let big = zip_bytes(&[
        ("handler.py", b"def handle(e): return 1"),
        ("blob.bin", &noise),
    ]);
    let err = server
        .client
        .upload_code("default", "z", big)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(413), "{err}");
    // Nothing was stored: the function still waits for code.
    let f = server.client.get_function("default", "z").await.unwrap();
    assert_eq!(f.status.phase, "Pending");
    assert_eq!(f.status.code_sha256, None);
}

#[tokio::test]
async fn redeploy_changes_the_answer_and_identical_upload_does_not_rebuild() {
    let server = Server::start().await;
    let v1 = [("handler.py", "def handle(event):\n    return 'one'\n")];
    let f1 = server
        .deploy("rev", json!({"runtime": "python3"}), &v1)
        .await;
    assert_eq!(server.get("rev", "").await, (200, "one".to_string()));
    let built = f1.status.last_built_at.clone().expect("built");

    let up = server
        .client
        .upload_code("default", "rev", zip(&v1))
        .await
        .unwrap();
    assert_eq!(
        up.revision, f1.status.revision,
        "identical bytes must not make a revision"
    );
    let again = server.wait_settled("default", "rev", up.revision).await;
    assert_eq!(again.status.last_built_at.as_deref(), Some(built.as_str()));

    let f2 = server
        .deploy(
            "rev",
            json!({}),
            &[("handler.py", "def handle(event):\n    return 'two'\n")],
        )
        .await;
    assert!(f2.status.revision > f1.status.revision);
    assert_eq!(server.get("rev", "").await, (200, "two".to_string()));

    // A spec change makes a new revision that serves with the new settings.
    let f3 = server
        .client
        .patch_function("default", "rev", &json!({"env": {"GREETING": "hey"}}))
        .await
        .unwrap();
    assert!(f3.status.revision > f2.status.revision);
    let f3 = server
        .wait_settled("default", "rev", f3.status.revision)
        .await;
    assert_eq!(f3.status.phase, "Ready");
    let src = server
        .client
        .request_json(
            reqwest::Method::GET,
            "/v1/namespaces/default/functions/rev/source",
            None,
        )
        .await
        .unwrap();
    assert_eq!(src["items"][0]["name"], "handler.py");
    assert!(
        src["items"][0]["content"]
            .as_str()
            .unwrap()
            .contains("'two'")
    );
}

#[tokio::test]
async fn a_missing_entrypoint_fails_the_build_naming_it() {
    let server = Server::start().await;
    let f = server
        .deploy(
            "nomod",
            json!({"runtime": "python3"}),
            &[("other.py", "x = 1")],
        )
        .await;
    assert_eq!(f.status.phase, "Failed");
    assert!(f.status.message.contains("handler"), "{}", f.status.message);
    let f = server
        .deploy(
            "nofn",
            json!({"runtime": "python3"}),
            &[("handler.py", "def other(e): pass")],
        )
        .await;
    assert_eq!(f.status.phase, "Failed");
    assert!(
        f.status.message.contains("\"handle\""),
        "{}",
        f.status.message
    );
    let f = server
        .deploy(
            "nofn-node",
            json!({"runtime": "nodejs"}),
            &[("handler.js", "exports.other = () => 1;")],
        )
        .await;
    assert_eq!(f.status.phase, "Failed");
    assert!(f.status.message.contains("handle"), "{}", f.status.message);
    // The failed function's URL does not serve.
    assert_ne!(server.get("nofn", "").await.0, 200);
}

#[tokio::test]
async fn dependencies_install_from_packages_in_the_archive() {
    let server = Server::start().await;
    let wheel = std::fs::read(repo_path("tests/fixtures/tinylib-0.1-py3-none-any.whl")).unwrap();
    let handler = b"import tinylib\n\ndef handle(event):\n    return {'lib': tinylib.__name__}\n";
    let archive = zip_bytes(&[
        ("handler.py", handler),
        (
            "requirements.txt",
            b"./vendor/tinylib-0.1-py3-none-any.whl\n",
        ),
        ("vendor/tinylib-0.1-py3-none-any.whl", &wheel),
    ]);
    server
        .client
        .create_function("default", &json!({"name": "deps-py", "runtime": "python3"}))
        .await
        .unwrap();
    let up = server
        .client
        .upload_code("default", "deps-py", archive)
        .await
        .unwrap();
    let f = server.wait_settled("default", "deps-py", up.revision).await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    let (status, body) = server.get("deps-py", "").await;
    assert_eq!(
        (status, serde_json::from_str::<Value>(&body).unwrap()),
        (200, json!({"lib": "tinylib"}))
    );

    let tgz = std::fs::read(repo_path("tests/fixtures/tinypkg-0.1.0.tgz")).unwrap();
    let archive = zip_bytes(&[
        ("handler.js", b"const t = require('tinypkg');\nexports.handle = async () => ({ pkg: typeof t });\n"),
        ("package.json", br#"{"name": "deps-node", "version": "1.0.0", "dependencies": {"tinypkg": "file:./vendor/tinypkg-0.1.0.tgz"}}"#),
        ("vendor/tinypkg-0.1.0.tgz", &tgz),
    ]);
    server
        .client
        .create_function(
            "default",
            &json!({"name": "deps-node", "runtime": "nodejs"}),
        )
        .await
        .unwrap();
    let up = server
        .client
        .upload_code("default", "deps-node", archive)
        .await
        .unwrap();
    let f = server
        .wait_settled("default", "deps-node", up.revision)
        .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    let (status, body) = server.get("deps-node", "").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"pkg\""), "{body}");
}

#[tokio::test]
async fn health_and_readiness() {
    let server = Server::start().await;
    let r = server
        .client
        .http()
        .get(format!("{}/readyz", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = server
        .client
        .http()
        .get(format!("{}/fn/default/nothing-here", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
}
