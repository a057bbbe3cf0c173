//! Invocation records: every call over `/fn/` and `/invoke` is listed (newest
//! first, within a second), with its source, status, request id, cold start and
//! error; the list filters; other namespaces cannot see it.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Server, TOKEN};

const HANDLER: &str = r#"
def handle(event):
    if event.get("path") == "/boom" or event.get("boom"):
        raise ValueError("kaput")
    return {"ok": True}
"#;

/// `GET` an API path with a token; the status and the JSON body.
async fn get(server: &Server, path: &str, token: &str) -> (u16, Value) {
    let resp = server
        .client
        .http()
        .get(format!("{}{path}", server.url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

async fn list(server: &Server, query: &str) -> Vec<Value> {
    let (status, body) = get(
        server,
        &format!("/v1/namespaces/default/invocations{query}"),
        TOKEN,
    )
    .await;
    assert_eq!(status, 200, "{query}: {body}");
    body["items"].as_array().unwrap().clone()
}

fn request_ids(items: &[Value]) -> Vec<&str> {
    items
        .iter()
        .map(|i| i["request_id"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn invocations_are_recorded_listed_and_filtered() {
    let server = Server::start().await;
    let f = server
        .deploy(
            "rec",
            json!({"runtime": "python3", "idle_timeout_sec": 1}),
            &[("handler.py", HANDLER)],
        )
        .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    server.wait_idle("default", "rec").await;

    let http = server.client.http();
    let fn_url = format!("{}/fn/default/rec", server.url());
    let resp = http
        .get(&fn_url)
        .header("X-Request-Id", "req-cold")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "req-cold");
    let resp = http
        .post(format!("{fn_url}/boom"))
        .header("X-Request-Id", "req-boom")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 500);
    let resp = http
        .post(format!(
            "{}/v1/namespaces/default/functions/rec/invoke",
            server.url()
        ))
        .bearer_auth(TOKEN)
        .header("X-Request-Id", "req-invoke")
        .json(&json!({"name": "Ada"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let done = Instant::now();

    // Listable within a second of the invocation's end (polled up to two).
    let items = loop {
        let items = list(&server, "").await;
        if items.len() >= 3 {
            break items;
        }
        assert!(
            done.elapsed() < Duration::from_secs(2),
            "records missing: {items:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        request_ids(&items),
        ["req-invoke", "req-boom", "req-cold"],
        "newest first"
    );
    let [invoke, boom, cold] = [&items[0], &items[1], &items[2]];
    let revision = f.status.revision;
    assert_eq!(
        (
            &cold["source"],
            &cold["status"],
            &cold["cold_start"],
            &cold["error"]
        ),
        (&json!("http"), &json!(200), &json!(true), &Value::Null),
        "{cold}"
    );
    assert_eq!(
        (&boom["source"], &boom["status"], &boom["cold_start"]),
        (&json!("http"), &json!(500), &json!(false)),
        "{boom}"
    );
    assert!(boom["error"].as_str().unwrap().contains("kaput"), "{boom}");
    assert_eq!(
        (&invoke["source"], &invoke["status"], &invoke["error"]),
        (&json!("invoke"), &json!(200), &Value::Null),
        "{invoke}"
    );
    for item in &items {
        assert_eq!(item["function"], "rec");
        assert_eq!(item["revision"], revision, "{item}");
        assert!(item["duration_ms"].as_f64().unwrap() > 0.0, "{item}");
        chrono::DateTime::parse_from_rfc3339(item["started_at"].as_str().unwrap()).unwrap();
    }
    let ids: Vec<&str> = items.iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert!(
        ids.windows(2).all(|w| w[0] > w[1]),
        "ids sort by time: {ids:?}"
    );

    // Filters.
    assert_eq!(list(&server, "?function=rec").await.len(), 3);
    assert!(list(&server, "?function=nope").await.is_empty());
    assert_eq!(
        request_ids(&list(&server, "?status=500").await),
        ["req-boom"]
    );
    assert_eq!(
        request_ids(&list(&server, "?source=invoke").await),
        ["req-invoke"]
    );
    assert_eq!(
        request_ids(&list(&server, "?source=http&status=200").await),
        ["req-cold"]
    );
    let since = boom["started_at"].as_str().unwrap().replace('+', "%2B");
    assert_eq!(
        request_ids(&list(&server, &format!("?since={since}")).await),
        ["req-invoke", "req-boom"]
    );
    assert_eq!(
        request_ids(&list(&server, "?limit=1").await),
        ["req-invoke"]
    );
    assert_eq!(
        list(&server, "?function=&status=&source=&since=&limit=")
            .await
            .len(),
        3,
        "empty values filter nothing"
    );
    for (query, param) in [
        ("?status=abc", "status"),
        ("?source=email", "source"),
        ("?since=yesterday", "since"),
        ("?limit=0", "limit"),
        ("?function=Bad_Name", "function"),
    ] {
        let (status, body) = get(
            &server,
            &format!("/v1/namespaces/default/invocations{query}"),
            TOKEN,
        )
        .await;
        assert_eq!(status, 400, "{query}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(param), "{query}: {message}");
    }

    // Another namespace's token sees nothing, exactly as if it did not exist.
    server.client.ensure_namespace("team-b").await.unwrap();
    let token_b = server.client.create_token("team-b").await.unwrap();
    let (status, body) = get(&server, "/v1/namespaces/default/invocations", &token_b).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = get(&server, "/v1/namespaces/team-b/invocations", &token_b).await;
    assert_eq!((status, body), (200, json!({"items": []})));
    let (status, _) = get(&server, "/v1/namespaces/nope/invocations", TOKEN).await;
    assert_eq!(status, 404);
}
