//! Dead letters of async calls through the real server: a raising handler is retried
//! `max_attempts` times, the call fails into a dead letter, and after the function is
//! fixed a redrive succeeds and the dead letter goes away.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::async_calls::{async_records, ended};
use crate::harness::{Server, send};

const RAISES: &str = "def handle(event):\n    raise RuntimeError('not today')\n";
const FIXED: &str = "def handle(event):\n    return {'fixed': event['n']}\n";

async fn dead_letters(server: &Server) -> Vec<Value> {
    let (status, body) = send(
        server,
        reqwest::Method::GET,
        "/v1/namespaces/default/dead-letters?function=flaky",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_raising_call_is_retried_dead_lettered_and_redriven_once_fixed() {
    let server = Server::start().await;
    let policy = json!({"runtime": "python3", "network": "none",
        "delivery": {"max_attempts": 3, "backoff_initial_ms": 50, "backoff_max_ms": 200}});
    server
        .deploy("flaky", policy.clone(), &[("handler.py", RAISES)])
        .await;
    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/functions/flaky/invoke?async=true",
        Some(json!({"n": 7})),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let id = body["call_id"].as_str().expect("a call id").to_string();
    let call = ended(&server, &id).await;
    assert_eq!(call["phase"], "Failed", "{call}");
    assert_eq!(call["attempts"], 3, "{call}");
    assert!(
        call["error"]
            .as_str()
            .is_some_and(|e| e.contains("not today")),
        "{call}"
    );
    // Each attempt is an invocation record.
    let records = async_records(&server, "flaky", 3).await;
    assert_eq!(records.len(), 3, "{records:?}");

    let letters = dead_letters(&server).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let dl = &letters[0];
    assert_eq!(dl["source"], "async");
    assert_eq!(dl["payload"], json!({"n": 7}));
    assert_eq!(dl["message"]["call_id"], id.as_str());
    assert_eq!(dl["attempts"], 3);
    assert_eq!(dl["last_status"], 500);
    let dl_id = dl["id"].as_str().expect("an id").to_string();

    // Fixed, then redriven: delivered again from attempt 1, and the dead letter goes.
    server
        .deploy("flaky", policy, &[("handler.py", FIXED)])
        .await;
    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        &format!("/v1/namespaces/default/dead-letters/{dl_id}/redrive"),
        None,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let call = ended(&server, &id).await;
    assert_eq!(call["phase"], "Succeeded", "{call}");
    assert_eq!(call["attempts"], 1, "{call}");
    assert_eq!(call["response"]["body"], json!({"fixed": 7}), "{call}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dead_letters(&server).await.is_empty() {
        assert!(Instant::now() < deadline, "the dead letter stayed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
