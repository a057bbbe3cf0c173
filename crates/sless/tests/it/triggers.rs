//! HTTP and cron triggers through the real server.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Server, send};

const ECHO: &str = "def handle(event):\n    print('fired', event.get('fired_at') if 'fired_at' in event else event.get('path'))\n    return {'path': event.get('path'), 'method': event.get('method'), 'event': event}\n";

#[tokio::test]
async fn http_triggers_route_enable_disable_and_go_with_their_function() {
    let server = Server::start().await;
    server
        .deploy(
            "orders",
            json!({"runtime": "python3"}),
            &[("handler.py", ECHO)],
        )
        .await;
    let triggers = "/v1/namespaces/default/triggers";
    let (status, t) = send(&server, reqwest::Method::POST, triggers, Some(json!({"name": "orders-route", "function": "orders", "type": "http", "path": "/orders", "methods": ["GET", "POST"]}))).await;
    assert_eq!(status, 201, "{t}");
    assert_eq!(t["enabled"], true);

    let r = server
        .client
        .http()
        .get(format!("{}/t/default/orders/12?x=1", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["path"].as_str(), body["method"].as_str()),
        (Some("/orders/12"), Some("GET"))
    );
    let r = server
        .client
        .http()
        .delete(format!("{}/t/default/orders", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    let r = server
        .client
        .http()
        .get(format!("{}/t/default/elsewhere", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    // Validation: a second trigger on the same path, a missing function, a bad path.
    let (status, _) = send(
        &server,
        reqwest::Method::POST,
        triggers,
        Some(json!({"name": "dup", "function": "orders", "type": "http", "path": "/orders"})),
    )
    .await;
    assert_eq!(status, 409);
    let (status, err) = send(
        &server,
        reqwest::Method::POST,
        triggers,
        Some(json!({"name": "x", "function": "nope", "type": "http", "path": "/x"})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("function"),
        "{err}"
    );
    let (status, _) = send(
        &server,
        reqwest::Method::POST,
        triggers,
        Some(json!({"name": "y", "function": "orders", "type": "http", "path": "no-slash"})),
    )
    .await;
    assert_eq!(status, 400);

    // Disabling answers 404 without deleting anything; enabling brings it back.
    let (status, t) = send(
        &server,
        reqwest::Method::PATCH,
        &format!("{triggers}/orders-route"),
        Some(json!({"enabled": false})),
    )
    .await;
    assert_eq!((status, t["enabled"].as_bool()), (200, Some(false)));
    let r = server
        .client
        .http()
        .get(format!("{}/t/default/orders", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(
        server.get("orders", "/direct").await.0,
        200,
        "the function's own URL is unaffected"
    );
    send(
        &server,
        reqwest::Method::PATCH,
        &format!("{triggers}/orders-route"),
        Some(json!({"enabled": true})),
    )
    .await;
    let r = server
        .client
        .http()
        .post(format!("{}/t/default/orders", server.url()))
        .json(&json!({"a": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // Deleting the function deletes its triggers.
    server
        .client
        .delete_function("default", "orders")
        .await
        .unwrap();
    let (status, _) = send(
        &server,
        reqwest::Method::GET,
        &format!("{triggers}/orders-route"),
        None,
    )
    .await;
    assert_eq!(status, 404);
    let r = server
        .client
        .http()
        .get(format!("{}/t/default/orders", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

/// `fired_at` values the function printed, in order.
async fn fires(server: &Server, name: &str) -> Vec<String> {
    let logs = server
        .client
        .logs("default", name, Some(10_000))
        .await
        .unwrap();
    logs.lines()
        .filter_map(|l| l.split_once("fired ").map(|(_, t)| t.trim().to_string()))
        .filter(|t| t.contains('T'))
        .collect()
}

#[tokio::test]
async fn cron_triggers_fire_on_schedule_are_recorded_and_survive_a_restart_without_double_fires() {
    let mut server = Server::start().await;
    server
        .deploy(
            "ticker",
            json!({"runtime": "python3"}),
            &[("handler.py", ECHO)],
        )
        .await;
    let (status, t) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/triggers",
        Some(json!({"name": "every-second", "function": "ticker", "type": "cron", "schedule": "* * * * * *", "event": {"job": "tick"}})),
    )
    .await;
    assert_eq!(status, 201, "{t}");
    assert!(t["status"]["next_fire_at"].is_string(), "{t}");

    let deadline = Instant::now() + Duration::from_secs(15);
    while fires(&server, "ticker").await.len() < 3 {
        assert!(
            Instant::now() < deadline,
            "cron fired fewer than 3 times: {:?}",
            fires(&server, "ticker").await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, t) = send(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces/default/triggers/every-second",
        None,
    )
    .await;
    assert!(t["status"]["last_fired_at"].is_string(), "{t}");
    assert!(t["status"]["last_result"].as_str().is_some(), "{t}");

    // Each fire is an invocation with source cron.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let list = server
            .client
            .request_json(
                reqwest::Method::GET,
                "/v1/namespaces/default/invocations?source=cron&function=ticker",
                None,
            )
            .await
            .unwrap();
        let items = list["items"].as_array().unwrap();
        if items.len() >= 3 {
            assert!(
                items
                    .iter()
                    .all(|i| i["source"] == "cron" && i["status"] == 200),
                "{list}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cron invocations not recorded: {list}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Restart: no fire time is handled twice.
    server.stop().await;
    server.restart().await;
    let before = fires(&server, "ticker").await.len();
    let deadline = Instant::now() + Duration::from_secs(15);
    while fires(&server, "ticker").await.len() < before + 2 {
        assert!(
            Instant::now() < deadline,
            "cron did not resume after restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all = fires(&server, "ticker").await;
    let mut unique = all.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        all.len(),
        "a fire time was handled twice: {all:?}"
    );

    // Disabled: no next fire.
    let (_, t) = send(
        &server,
        reqwest::Method::PATCH,
        "/v1/namespaces/default/triggers/every-second",
        Some(json!({"enabled": false})),
    )
    .await;
    assert!(t["status"]["next_fire_at"].is_null(), "{t}");
    let (status, err) = send(
        &server,
        reqwest::Method::PATCH,
        "/v1/namespaces/default/triggers/every-second",
        Some(json!({"schedule": "61 * * * *"})),
    )
    .await;
    assert_eq!(status, 400, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("schedule"),
        "{err}"
    );
}
