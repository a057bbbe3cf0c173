//! Deploy and invoke: both runtimes, the handler conventions, failures of the
//! handler and of its process, timeouts and concurrency.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Server, deploy_dir, repo_path};

#[tokio::test]
async fn hello_python_and_node_deploy_invoke_and_log() {
    let server = Server::start().await;
    for (name, dir, runtime) in [
        ("hello-python", "examples/hello-python", "python3"),
        ("hello-node", "examples/hello-node", "nodejs"),
    ] {
        let f = deploy_dir(&server, name, json!({"runtime": runtime}), &repo_path(dir)).await;
        assert_eq!(f.status.phase, "Ready", "{name}: {}", f.status.message);
        assert_eq!(f.status.url, format!("{}/fn/default/{name}", server.url()));

        let (status, body, headers) = server
            .call(name, Method::POST, "", Some(json!({"name": "Ada"})))
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap(),
            json!({"message": "Hello, Ada!"})
        );
        assert!(headers.contains_key("x-request-id"));

        let r = server
            .client
            .invoke("default", name, &json!({"name": "Grace"}))
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(
            r.json::<Value>().unwrap(),
            json!({"message": "Hello, Grace!"})
        );

        server.wait_log(name, "greeting Ada").await;
    }
}

const MAPPING_PY: &str = r#"
def handle(event):
    p = event["path"]
    if p == "/dict":
        return {"a": 1}
    if p == "/list":
        return [1, "two"]
    if p == "/number":
        return 42
    if p == "/bool":
        return True
    if p == "/none":
        return None
    if p == "/text":
        return "plain words"
    if p == "/html":
        return "<h1>hi</h1>"
    if p == "/custom":
        return {"statusCode": 201, "headers": {"X-Extra": "yes", "Content-Type": "text/csv"}, "body": "a,b"}
    if p == "/custom-json":
        return {"statusCode": 404, "body": {"missing": True}}
    if p == "/boom":
        raise ValueError("kaput")
    if p == "/crash":
        import os
        os._exit(7)
    if p == "/slow":
        import time
        time.sleep(5)
        return "late"
    if p == "/sleep":
        import time
        time.sleep(0.3)
        return {"slept": True}
    if p == "/echo":
        return {k: event[k] for k in ("method", "path", "query", "headers", "body", "_accept")}
    return {"path": p}
"#;

#[tokio::test]
async fn return_values_map_to_responses() {
    let server = Server::start().await;
    let f = server
        .deploy(
            "mapping",
            json!({"runtime": "python3"}),
            &[("handler.py", MAPPING_PY)],
        )
        .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);

    let cases: &[(&str, u16, &str, &str)] = &[
        ("/dict", 200, "application/json", r#"{"a": 1}"#),
        ("/list", 200, "application/json", r#"[1, "two"]"#),
        ("/number", 200, "application/json", "42"),
        ("/bool", 200, "application/json", "true"),
        ("/none", 200, "application/json", "null"),
        ("/text", 200, "text/plain; charset=utf-8", "plain words"),
        ("/html", 200, "text/html; charset=utf-8", "<h1>hi</h1>"),
        ("/custom", 201, "text/csv", "a,b"),
        (
            "/custom-json",
            404,
            "application/json",
            r#"{"missing":true}"#,
        ),
    ];
    for (path, want_status, want_type, want_body) in cases {
        let (status, body, headers) = server.call("mapping", Method::GET, path, None).await;
        assert_eq!(status, *want_status, "{path}: {body}");
        assert_eq!(headers["content-type"], *want_type, "{path}");
        if want_type.starts_with("application/json") {
            let got: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(
                got,
                serde_json::from_str::<Value>(want_body).unwrap(),
                "{path}"
            );
        } else {
            assert_eq!(body, *want_body, "{path}");
        }
    }
    let (_, _, headers) = server.call("mapping", Method::GET, "/custom", None).await;
    assert_eq!(headers["x-extra"], "yes");

    // HEAD answers the GET's headers without a body.
    let resp = server
        .client
        .http()
        .head(format!("{}/fn/default/mapping/custom", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    assert_eq!(resp.headers()["x-extra"], "yes");
    assert_eq!(resp.text().await.unwrap(), "");
}

#[tokio::test]
async fn the_event_carries_method_path_query_headers_and_body() {
    let server = Server::start().await;
    server
        .deploy(
            "echo",
            json!({"runtime": "python3"}),
            &[("handler.py", MAPPING_PY)],
        )
        .await;
    let url = format!("{}/fn/default/echo/echo?x=1&y=two&x=3", server.url());
    let resp = server
        .client
        .http()
        .put(url)
        .header("X-Custom", "v")
        .header("Accept", "text/html")
        .header("X-Request-Id", "my-request-1")
        .json(&json!({"k": [1, 2]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], "my-request-1");
    let event: Value = resp.json().await.unwrap();
    assert_eq!(event["method"], "PUT");
    assert_eq!(event["path"], "/echo");
    assert_eq!(event["query"], json!({"x": "3", "y": "two"}));
    assert_eq!(event["headers"]["x-custom"], "v");
    assert_eq!(event["_accept"], "text/html");
    assert_eq!(event["body"], json!({"k": [1, 2]}));
    assert!(event["headers"].get("connection").is_none());

    // Form bodies arrive as maps; other bodies as text.
    let resp = server
        .client
        .http()
        .post(format!("{}/fn/default/echo/echo", server.url()))
        .form(&[("name", "Ada"), ("lang", "en")])
        .send()
        .await
        .unwrap();
    let event: Value = resp.json().await.unwrap();
    assert_eq!(event["body"], json!({"name": "Ada", "lang": "en"}));
    let resp = server
        .client
        .http()
        .post(format!("{}/fn/default/echo/echo", server.url()))
        .body("just text")
        .send()
        .await
        .unwrap();
    let event: Value = resp.json().await.unwrap();
    assert_eq!(event["body"], "just text");
    assert_eq!(event["path"], "/echo");

    // No suffix means "/".
    let (_, body) = server.get("echo", "").await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"path": "/"})
    );
}

#[tokio::test]
async fn exceptions_answer_500_and_the_instance_keeps_serving() {
    let server = Server::start().await;
    server
        .deploy(
            "boom",
            json!({"runtime": "python3"}),
            &[("handler.py", MAPPING_PY)],
        )
        .await;
    let (status, body) = server.get("boom", "/boom").await;
    assert_eq!(status, 500);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"error": "kaput"})
    );
    let (status, _) = server.get("boom", "/dict").await;
    assert_eq!(status, 200);
    server.wait_log("boom", "ValueError: kaput").await;

    const NODE: &str = "exports.handle = async (e) => { if (e.path === '/boom') throw new Error('node kaput'); return {ok: true}; };";
    server
        .deploy(
            "boom-node",
            json!({"runtime": "nodejs20"}),
            &[("handler.js", NODE)],
        )
        .await;
    let (status, body) = server.get("boom-node", "/boom").await;
    assert_eq!(
        (status, serde_json::from_str::<Value>(&body).unwrap()),
        (500, json!({"error": "node kaput"}))
    );
    assert_eq!(server.get("boom-node", "/").await.0, 200);
}

#[tokio::test]
async fn a_crashed_instance_answers_502_and_is_replaced() {
    let server = Server::start().await;
    server
        .deploy(
            "crash",
            json!({"runtime": "python3"}),
            &[("handler.py", MAPPING_PY)],
        )
        .await;
    assert_eq!(server.get("crash", "/dict").await.0, 200);
    let (status, body) = server.get("crash", "/crash").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("instance_failed"), "{body}");
    let (status, body) = server.get("crash", "/dict").await;
    assert_eq!(status, 200, "{body}");
    server.wait_log("crash", "exited with status 7").await;
    let f = server
        .client
        .get_function("default", "crash")
        .await
        .unwrap();
    assert!(
        f.status.message.contains("exited with status 7"),
        "{}",
        f.status.message
    );
}

#[tokio::test]
async fn past_the_timeout_the_caller_gets_504_and_service_continues() {
    let server = Server::start().await;
    server
        .deploy(
            "slow",
            json!({"runtime": "python3", "timeout_sec": 1}),
            &[("handler.py", MAPPING_PY)],
        )
        .await;
    let started = std::time::Instant::now();
    let (status, body) = server.get("slow", "/slow").await;
    assert_eq!(status, 504, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "gave up only after {:?}",
        started.elapsed()
    );
    let (status, _) = server.get("slow", "/dict").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn forty_concurrent_invocations_all_succeed() {
    let server = Server::start().await;
    server
        .deploy(
            "sleepy",
            json!({"runtime": "python3", "concurrency": 16, "max_instances": 4}),
            &[("handler.py", MAPPING_PY)],
        )
        .await;
    let calls = (0..40).map(|_| server.get("sleepy", "/sleep"));
    let results = futures::future::join_all(calls).await;
    for (status, body) in &results {
        assert_eq!(*status, 200, "{body}");
    }
    const NODE: &str = "exports.handle = async () => { await new Promise(r => setTimeout(r, 300)); return {ok: true}; };";
    server
        .deploy(
            "sleepy-node",
            json!({"runtime": "nodejs"}),
            &[("handler.js", NODE)],
        )
        .await;
    let results = futures::future::join_all((0..40).map(|_| server.get("sleepy-node", "/"))).await;
    assert!(results.iter().all(|(s, _)| *s == 200), "{results:?}");
}

#[tokio::test]
async fn the_form_example_serves_html_and_reads_its_post() {
    let server = Server::start().await;
    deploy_dir(
        &server,
        "guestbook",
        json!({"runtime": "python3"}),
        &repo_path("examples/form-python"),
    )
    .await;
    let (status, body, headers) = server.call("guestbook", Method::GET, "", None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert!(body.contains("<form method=\"post\">"), "{body}");
    let resp = server
        .client
        .http()
        .post(format!("{}/fn/default/guestbook", server.url()))
        .form(&[("name", "Ada <L>"), ("message", "hello")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("Thank you, <b>Ada &lt;L&gt;</b>!"), "{text}");
}

#[tokio::test]
async fn private_functions_need_a_token_of_their_namespace() {
    let server = Server::start().await;
    server
        .deploy(
            "secret",
            json!({"runtime": "python3", "private": true}),
            &[("handler.py", MAPPING_PY)],
        )
        .await;
    assert_eq!(server.get("secret", "/dict").await.0, 401);
    let url = format!("{}/fn/default/secret/dict", server.url());
    let ok = server
        .client
        .http()
        .get(&url)
        .bearer_auth(crate::harness::TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    server.client.ensure_namespace("other").await.unwrap();
    let other = server.client.create_token("other").await.unwrap();
    let denied = server
        .client
        .http()
        .get(&url)
        .bearer_auth(other)
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status().as_u16(), 404);
}
