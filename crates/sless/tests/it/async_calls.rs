//! Async calls through the real server: `202` with a call id once the call is
//! stored, the call runs and keeps the function's response, the result is POSTed
//! to the callback with the contract's headers, a queued call survives `kill -9`,
//! and past the queue limit calls are refused with `429`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Server, send};

const DOUBLE: &str = "def handle(event):\n    return {'double': event['n'] * 2}\n";

/// Sleeps first, so a call is still queued or running for a while.
const SLOW: &str =
    "import time\n\ndef handle(event):\n    time.sleep(2)\n    return {'done': True}\n";

/// Polls the call (bounded) until it has ended.
pub async fn ended(server: &Server, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, call) = send(
            server,
            reqwest::Method::GET,
            &format!("/v1/namespaces/default/calls/{id}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{call}");
        if matches!(call["phase"].as_str(), Some("Succeeded" | "Failed")) {
            return call;
        }
        assert!(Instant::now() < deadline, "call {id} never ended: {call}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `POST /async/default/{name}` with a JSON body; the status, headers and body.
async fn post_async(
    server: &Server,
    name: &str,
    body: &Value,
    callback: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = server
        .client
        .http()
        .post(format!("{}/async/default/{name}", server.url()))
        .json(body);
    if let Some(url) = callback {
        req = req.header("x-callback-url", url);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.json().await.unwrap_or(Value::Null))
}

/// The invocation records of the function started by async calls (polled: records
/// are written in batches), once there are at least `n`.
pub async fn async_records(server: &Server, function: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, list) = send(
            server,
            reqwest::Method::GET,
            &format!("/v1/namespaces/default/invocations?function={function}&source=async"),
            None,
        )
        .await;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        if items.len() >= n {
            return items;
        }
        assert!(
            Instant::now() < deadline,
            "fewer than {n} async records of {function}: {list}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A one-route HTTP server on loopback that hands every request it gets (headers
/// and body) to the test, answering `200`.
async fn callback_listener() -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<(axum::http::HeaderMap, axum::body::Bytes)>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/done",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send((headers, body));
                    "thanks"
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/done"), rx)
}

#[tokio::test]
async fn an_async_call_runs_keeps_its_response_and_calls_back() {
    let server = Server::start().await;
    server
        .deploy(
            "double",
            json!({"runtime": "python3", "network": "none"}),
            &[("handler.py", DOUBLE)],
        )
        .await;
    let (callback, mut received) = callback_listener().await;

    // The authenticated API queues a JSON event.
    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/functions/double/invoke?async=true",
        Some(json!({"n": 21})),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let id = body["call_id"].as_str().expect("a call id").to_string();
    let call = ended(&server, &id).await;
    assert_eq!(call["phase"], "Succeeded", "{call}");
    assert_eq!(call["attempts"], 1, "{call}");
    assert_eq!(call["response"]["status"], 200, "{call}");
    assert_eq!(call["response"]["body"], json!({"double": 42}), "{call}");
    for field in ["queued_at", "started_at", "finished_at"] {
        assert!(call[field].is_string(), "{field}: {call}");
    }

    // The public route maps the request as /fn/ does; the result goes to the callback.
    // A JSON body reaches the handler parsed, as on /fn/.
    let handler = "def handle(event):\n    return {'double': event['body']['n'] * 2}\n";
    server
        .deploy(
            "double",
            json!({"runtime": "python3", "network": "none"}),
            &[("handler.py", handler)],
        )
        .await;
    let (status, headers, body) =
        post_async(&server, "double", &json!({"n": 5}), Some(&callback)).await;
    assert_eq!(status, 202, "{body}");
    let id = body["call_id"].as_str().expect("a call id").to_string();
    assert_eq!(headers["x-call-id"], id.as_str());
    let (headers, body) = tokio::time::timeout(Duration::from_secs(60), received.recv())
        .await
        .expect("the callback came")
        .expect("a request");
    assert_eq!(headers["x-call-id"], id.as_str());
    assert_eq!(headers["x-function-status"], "200");
    let seconds: f64 = headers["x-duration-seconds"]
        .to_str()
        .unwrap()
        .parse()
        .expect("a decimal number of seconds");
    assert!(seconds >= 0.0);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({"double": 10})
    );
    let call = ended(&server, &id).await;
    assert_eq!(call["phase"], "Succeeded", "{call}");

    // Every attempt is an invocation record with source async.
    async_records(&server, "double", 2).await;

    // A callback that is not an http(s) URL is refused before anything is queued.
    let (status, _, body) =
        post_async(&server, "double", &json!({"n": 1}), Some("gopher://x")).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid", "{body}");
}

#[tokio::test]
async fn a_queued_call_survives_kill_9() {
    let mut server = Server::start().await;
    server
        .deploy(
            "slow",
            json!({"runtime": "python3", "network": "none"}),
            &[("handler.py", SLOW)],
        )
        .await;
    let (status, _, body) = post_async(&server, "slow", &json!({}), None).await;
    assert_eq!(status, 202, "{body}");
    let id = body["call_id"].as_str().expect("a call id").to_string();
    // Right after the 202: the call is queued or running (the handler sleeps).
    server.kill9().await;
    server.restart().await;
    let call = ended(&server, &id).await;
    assert_eq!(call["phase"], "Succeeded", "{call}");
    assert_eq!(call["response"]["body"], json!({"done": true}), "{call}");
}

#[tokio::test]
async fn past_the_queue_limit_calls_are_refused() {
    let server = Server::start_with(&["--async-queue-limit", "2"]).await;
    server
        .deploy(
            "slow",
            json!({"runtime": "python3", "network": "none"}),
            &[("handler.py", SLOW)],
        )
        .await;
    let mut statuses = Vec::new();
    let mut refused = Value::Null;
    for _ in 0..4 {
        let (status, _, body) = post_async(&server, "slow", &json!({}), None).await;
        if status == 429 {
            refused = body;
        }
        statuses.push(status);
    }
    assert_eq!(statuses, [202, 202, 429, 429]);
    assert_eq!(refused["error"]["code"], "too_many_requests", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("slow")),
        "{refused}"
    );
}

#[tokio::test]
async fn private_functions_need_a_token_and_big_bodies_are_refused() {
    let server = Server::start_with(&["--max-body-mb", "1"]).await;
    server
        .deploy(
            "secret",
            json!({"runtime": "python3", "network": "none", "private": true}),
            &[("handler.py", DOUBLE)],
        )
        .await;
    let url = format!("{}/async/default/secret", server.url());
    let http = server.client.http();
    let anonymous = http.post(&url).json(&json!({"n": 1})).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let unknown = http
        .post(&url)
        .bearer_auth("not-a-token")
        .json(&json!({"n": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        unknown.status(),
        404,
        "another token does not learn it exists"
    );
    let token = server.client.create_token("default").await.unwrap();
    let queued = http
        .post(&url)
        .bearer_auth(&token)
        .json(&json!({"n": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(queued.status(), 202);
    let big = http
        .post(&url)
        .bearer_auth(&token)
        .header("content-type", "application/octet-stream")
        .body(vec![b'x'; 2 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 413);
    let body: Value = big.json().await.unwrap();
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
}

/// Runs the `sless` command line against `server`.
async fn sless(server: &Server, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
        .args(args)
        .env("SLESS_SERVER", server.url())
        .env("SLESS_TOKEN", crate::harness::TOKEN)
        .env_remove("SLESS_NAMESPACE")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run sless")
}

#[tokio::test]
async fn the_command_line_queues_a_call_and_waits_for_it() {
    let server = Server::start().await;
    server
        .deploy(
            "double",
            json!({"runtime": "python3", "network": "none"}),
            &[("handler.py", DOUBLE)],
        )
        .await;
    let out = sless(
        &server,
        &["invoke", "double", "--async", "--data", r#"{"n": 4}"#],
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.len(), 32, "the call id: {stdout}");
    let id = stdout.as_str();
    let out = sless(&server, &["calls", "get", id, "--wait"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let call: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(call["phase"], "Succeeded", "{call}");
    let out = sless(&server, &["calls", "ls", "--function", "double"]).await;
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(id));
    let out = sless(&server, &["dead-letters", "ls"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("SOURCE"));
}
