//! `GET /metrics`: after real invocations, builds and requests the Prometheus text
//! carries their exact counts under bounded labels; `--metrics-token` guards it and
//! `--metrics=false` turns it off.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::harness::{Server, TOKEN};

const HANDLER: &str = r#"
def handle(event):
    if event.get("path") == "/boom":
        raise ValueError("kaput")
    return {"ok": True}
"#;

/// One sample line of the text format: `name{label="value",...} value`.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the sample lines of a Prometheus text exposition (comments skipped);
/// panics on a line that is not one.
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| parse_line(line).unwrap_or_else(|| panic!("not a sample line: {line:?}")))
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices();
        loop {
            // `key="value"` pairs, comma-separated, up to the closing brace.
            let (start, c) = chars.next()?;
            if c == '}' {
                rest = &after[start + 1..];
                break;
            }
            if c == ',' {
                continue;
            }
            let eq = after[start..].find("=\"")? + start;
            let key = after[start..eq].to_string();
            while chars.next()?.0 < eq + 1 {}
            let mut value = String::new();
            loop {
                let (_, c) = chars.next()?;
                match c {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    other => value.push(other),
                }
            }
            labels.insert(key, value);
        }
    }
    let value = rest.trim().split(' ').next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The value of the series `name` with exactly `labels`, if it is there.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    samples
        .iter()
        .find(|s| s.name == name && s.labels == want)
        .map(|s| s.value)
}

/// `GET /metrics`, with a bearer token when given: the status, content type and body.
async fn scrape(server: &Server, token: Option<&str>) -> (u16, String, String) {
    let mut req = server
        .client
        .http()
        .get(format!("{}/metrics", server.url()));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.expect("scrape");
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, content_type, resp.text().await.expect("body"))
}

#[tokio::test]
async fn metrics_count_invocations_builds_instances_and_requests() {
    let server = Server::start().await;
    let files = [("handler.py", HANDLER)];
    let f = server
        .deploy(
            "met",
            json!({"runtime": "python3", "idle_timeout_sec": 1}),
            &files,
        )
        .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    server.wait_idle("default", "met").await;

    // A cold call, a warm one on a sub-path, a handler error, and /invoke.
    assert_eq!(server.get("met", "").await.0, 200);
    assert_eq!(server.get("met", "/a/b").await.0, 200);
    let (status, body, _) = server
        .call("met", reqwest::Method::POST, "/boom", Some(json!({})))
        .await;
    assert_eq!(status, 500, "{body}");
    let resp = server
        .client
        .http()
        .post(format!(
            "{}/v1/namespaces/default/functions/met/invoke",
            server.url()
        ))
        .bearer_auth(TOKEN)
        .json(&json!({"name": "Ada"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // A path no route takes.
    let resp = server
        .client
        .http()
        .get(format!("{}/no/such/path", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);

    // One instance kept from now on (a spec change: the build is reused), and an async call.
    let f = server
        .deploy(
            "met",
            json!({"min_instances": 1, "idle_timeout_sec": 600}),
            &files,
        )
        .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    let resp = server
        .client
        .http()
        .post(format!("{}/async/default/met", server.url()))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let call: Value = resp.json().await.unwrap();
    let call = crate::async_calls::ended(&server, call["call_id"].as_str().unwrap()).await;
    assert_eq!(call["phase"], "Succeeded", "{call}");

    let (status, content_type, text) = scrape(&server, None).await;
    assert_eq!(status, 200, "{text}");
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let samples = parse(&text);
    let fn_labels = [("namespace", "default"), ("function", "met")];
    let invocations = |source: &str, status: &str| {
        value(
            &samples,
            "sless_invocations_total",
            &[
                fn_labels[0],
                fn_labels[1],
                ("source", source),
                ("status", status),
            ],
        )
    };
    assert_eq!(invocations("http", "200"), Some(2.0), "{text}");
    assert_eq!(invocations("http", "500"), Some(1.0), "{text}");
    assert_eq!(invocations("invoke", "200"), Some(1.0), "{text}");
    assert_eq!(invocations("async", "200"), Some(1.0), "{text}");
    assert_eq!(
        value(
            &samples,
            "sless_invocation_duration_seconds_count",
            &fn_labels
        ),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        value(
            &samples,
            "sless_invocation_duration_seconds_bucket",
            &[fn_labels[0], fn_labels[1], ("le", "+Inf")]
        ),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        value(&samples, "sless_cold_starts_total", &fn_labels),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&samples, "sless_builds_total", &[("result", "ok")]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&samples, "sless_builds_total", &[("result", "reused")]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&samples, "sless_build_duration_seconds_count", &[]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&samples, "sless_instances", &[("state", "ready")]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&samples, "sless_instances", &[("state", "starting")]),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        value(
            &samples,
            "sless_async_calls_total",
            &[
                ("namespace", "default"),
                ("function", "met"),
                ("outcome", "succeeded")
            ]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&samples, "sless_async_calls_queued", &[]),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        value(&samples, "sless_dead_letters", &[]),
        Some(0.0),
        "{text}"
    );
    let requests = |route: &str, status: &str| {
        value(
            &samples,
            "sless_http_requests_total",
            &[("route", route), ("status", status)],
        )
    };
    // Routes by template: raw paths never become labels.
    assert_eq!(requests("/fn/{ns}/{name}", "200"), Some(2.0), "{text}");
    assert_eq!(requests("/fn/{ns}/{name}", "500"), Some(1.0), "{text}");
    assert_eq!(
        requests("/v1/namespaces/{ns}/functions/{name}/invoke", "200"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(requests("unmatched", "404"), Some(1.0), "{text}");
    assert!(
        samples
            .iter()
            .filter_map(|s| s.labels.get("route"))
            .all(|r| !r.contains("met") && !r.contains("/a/b") && !r.contains("no/such")),
        "{text}"
    );
}

#[tokio::test]
async fn the_metrics_token_guards_the_endpoint_and_metrics_can_be_off() {
    let secret = "scrape-secret-0123456789";
    let server = Server::start_with(&["--metrics-token", secret]).await;
    for token in [None, Some("wrong-token"), Some(TOKEN)] {
        let (status, _, body) = scrape(&server, token).await;
        assert_eq!(status, 401, "{token:?}: {body}");
        let body: Value = serde_json::from_str(&body).expect("JSON error");
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        assert!(body["error"]["message"].is_string(), "{body}");
    }
    let (status, _, text) = scrape(&server, Some(secret)).await;
    assert_eq!(status, 200, "{text}");
    let samples = parse(&text);
    assert!(
        value(&samples, "sless_instances", &[("state", "ready")]).is_some(),
        "{text}"
    );
    drop(server);

    let server = Server::start_with(&["--metrics=false"]).await;
    let (status, _, body) = scrape(&server, None).await;
    assert_eq!(status, 404, "{body}");
    let body: Value = serde_json::from_str(&body).expect("JSON error");
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    // The rest of the server is unaffected.
    let resp = server
        .client
        .http()
        .get(format!("{}/healthz", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[test]
fn the_parser_reads_labels_with_braces_quotes_and_escapes() {
    let samples = parse(
        "# HELP x y\n# TYPE x counter\n\
         x{route=\"/fn/{ns}/{name}\",status=\"200\"} 3\n\
         y{a=\"q\\\"uote\",b=\"back\\\\slash\"} 1.5\n\
         z 7\n",
    );
    assert_eq!(
        value(
            &samples,
            "x",
            &[("route", "/fn/{ns}/{name}"), ("status", "200")]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(&samples, "y", &[("a", "q\"uote"), ("b", "back\\slash")]),
        Some(1.5)
    );
    assert_eq!(value(&samples, "z", &[]), Some(7.0));
}
