//! Per-namespace quotas: admins set them, namespace tokens read them, and each
//! enforced quota answers `429 quota_exceeded` naming itself, its limit and the
//! usage, without affecting another namespace.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Server, TOKEN, send, send_as, zip};

const HELLO: &str = "def handle(event):\n    return 'hello'\n";

async fn set_quota(server: &Server, ns: &str, quota: Value) -> Value {
    let (status, body) = send(
        server,
        reqwest::Method::PUT,
        &format!("/v1/namespaces/{ns}"),
        Some(json!({ "quota": quota })),
    )
    .await;
    assert!(status == 200 || status == 201, "{status} {body}");
    body
}

async fn create(server: &Server, ns: &str, spec: Value) -> (u16, Value) {
    send(
        server,
        reqwest::Method::POST,
        &format!("/v1/namespaces/{ns}/functions"),
        Some(spec),
    )
    .await
}

async fn namespace(server: &Server, ns: &str) -> Value {
    let (status, body) = send(
        server,
        reqwest::Method::GET,
        &format!("/v1/namespaces/{ns}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

fn assert_quota_exceeded(status: u16, body: &Value, needle: &str) {
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
}

/// A call of `/fn/{ns}/{name}`: status, body, headers.
async fn call(server: &Server, ns: &str, name: &str) -> (u16, Value, reqwest::header::HeaderMap) {
    let resp = server
        .client
        .http()
        .get(format!("{}/fn/{ns}/{name}", server.url()))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, resp.json().await.unwrap_or(Value::Null), headers)
}

#[tokio::test]
async fn admins_set_quotas_namespace_tokens_read_them_and_functions_are_counted() {
    let server = Server::start().await;

    // An admin creates a namespace with a quota; the answer shows it in force.
    let body = set_quota(&server, "team-a", json!({"functions": 2, "memory_mb": 256})).await;
    assert_eq!(body["quota"]["functions"], 2, "{body}");
    assert_eq!(body["quota"]["memory_mb"], 256, "{body}");
    assert!(body["quota"]["instances"].as_u64().unwrap() > 0, "{body}");

    // Bad quotas are 400 naming the field, and change nothing.
    for (quota, field) in [
        (json!({"functions": -1}), "quota.functions"),
        (json!({"functions": "3"}), "quota.functions"),
        (json!({"cpus": 1}), "quota.cpus"),
    ] {
        let (status, body) = send(
            &server,
            reqwest::Method::PUT,
            "/v1/namespaces/team-a",
            Some(json!({ "quota": quota })),
        )
        .await;
        assert_eq!(status, 400, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{message}");
    }
    assert_eq!(namespace(&server, "team-a").await["quota"]["functions"], 2);

    // A namespace token reads the quota and usage, but may not set it.
    let (status, created) = send(
        &server,
        reqwest::Method::POST,
        "/v1/tokens",
        Some(json!({"namespace": "team-a"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let token = created["token"].as_str().unwrap().to_string();
    let (status, body) = send_as(
        &server,
        &token,
        reqwest::Method::GET,
        "/v1/namespaces/team-a",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["quota"]["functions"], 2, "{body}");
    assert_eq!(body["usage"]["functions"], 0, "{body}");
    let (status, body) = send_as(
        &server,
        &token,
        reqwest::Method::PUT,
        "/v1/namespaces/team-a",
        Some(json!({"quota": {"functions": 100}})),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    let (status, body) = send_as(
        &server,
        &token,
        reqwest::Method::PUT,
        "/v1/namespaces/team-a",
        None,
    )
    .await;
    assert_eq!(status, 200, "a PUT without a body still works: {body}");
    assert_eq!(namespace(&server, "team-a").await["quota"]["functions"], 2);

    // A minimum that alone exceeds the memory quota is refused at create.
    let (status, body) = create(
        &server,
        "team-a",
        json!({"name": "big", "runtime": "python3", "min_instances": 3, "memory_mb": 128}),
    )
    .await;
    assert_quota_exceeded(status, &body, "memory_mb 256");

    // Functions: two fit, the third is refused, naming the quota and the usage.
    for name in ["f1", "f2"] {
        let (status, body) = send_as(
            &server,
            &token,
            reqwest::Method::POST,
            "/v1/namespaces/team-a/functions",
            Some(json!({"name": name, "runtime": "python3"})),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = create(
        &server,
        "team-a",
        json!({"name": "f3", "runtime": "python3"}),
    )
    .await;
    assert_quota_exceeded(status, &body, "quota exceeded: functions 2 of 2 in use");
    let (status, _) = send(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces/team-a/functions/f3",
        None,
    )
    .await;
    assert_eq!(status, 404, "the refused create stored nothing");
    assert_eq!(namespace(&server, "team-a").await["usage"]["functions"], 2);
    // Raising min_instances over the memory quota by a patch is refused too.
    let (status, body) = send(
        &server,
        reqwest::Method::PATCH,
        "/v1/namespaces/team-a/functions/f1",
        Some(json!({"min_instances": 4})),
    )
    .await;
    assert_quota_exceeded(status, &body, "memory_mb");

    // Another namespace is not affected.
    for name in ["f1", "f2", "f3"] {
        let (status, body) = create(
            &server,
            "default",
            json!({"name": name, "runtime": "python3"}),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }

    // Two creates racing for the last place: exactly one gets it.
    set_quota(&server, "team-a", json!({"functions": 3})).await;
    let racers = ["r1", "r2"].map(|name| {
        create(
            &server,
            "team-a",
            json!({"name": name, "runtime": "python3"}),
        )
    });
    let results = futures::future::join_all(racers).await;
    let statuses: Vec<u16> = results.iter().map(|(s, _)| *s).collect();
    assert!(
        statuses.contains(&201) && statuses.contains(&429),
        "{results:?}"
    );
    assert_eq!(namespace(&server, "team-a").await["usage"]["functions"], 3);

    // `null` resets a quota to the server's default.
    let body = set_quota(&server, "team-a", json!({"functions": null})).await;
    let default = namespace(&server, "default").await;
    assert_eq!(body["quota"]["functions"], default["quota"]["functions"]);
    assert_eq!(body["quota"]["memory_mb"], 256, "the others are kept");
}

#[tokio::test]
async fn code_storage_counts_against_the_namespace_s_own_quota() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    set_quota(&server, "small", json!({"storage_mb": 1})).await;
    // Padding compresses to almost nothing, but its unpacked size counts.
    let padding = "#".repeat(1_500_000);
    let archive = zip(&[("handler.py", HELLO), ("padding.txt", &padding)]);
    for ns in ["small", "default"] {
        let (status, body) = create(&server, ns, json!({"name": "f", "runtime": "python3"})).await;
        assert_eq!(status, 201, "{body}");
    }
    let upload = |ns: &'static str| {
        let archive = archive.clone();
        let server = &server;
        async move {
            let resp = server
                .client
                .http()
                .put(format!(
                    "{}/v1/namespaces/{ns}/functions/f/code",
                    server.url()
                ))
                .bearer_auth(TOKEN)
                .header("content-type", "application/zip")
                .body(archive)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, body) = upload("small").await;
    assert_quota_exceeded(status, &body, "storage");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1.0 MiB"),
        "{body}"
    );
    let (status, body) = upload("default").await;
    assert_eq!(status, 202, "{body}");
    let usage = &namespace(&server, "default").await["usage"];
    assert!(usage["storage_mb"].as_u64().unwrap() >= 1, "{usage}");
    assert_eq!(namespace(&server, "small").await["usage"]["storage_mb"], 0);

    // A namespace made again under a deleted one's name has the defaults.
    let (status, body) = send(
        &server,
        reqwest::Method::DELETE,
        "/v1/namespaces/small?force=true",
        None,
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let (status, body) = send(&server, reqwest::Method::PUT, "/v1/namespaces/small", None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["quota"]["storage_mb"], 2048, "{body}");
}

#[tokio::test]
async fn invocations_over_the_rate_are_refused_with_retry_after() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    let (status, _) = send(&server, reqwest::Method::PUT, "/v1/namespaces/other", None).await;
    assert_eq!(status, 201);
    server
        .deploy_in(
            "default",
            "hello",
            json!({"runtime": "python3"}),
            &[("handler.py", HELLO)],
        )
        .await;
    server
        .deploy_in(
            "other",
            "hello",
            json!({"runtime": "python3"}),
            &[("handler.py", HELLO)],
        )
        .await;
    set_quota(&server, "default", json!({"invocations_per_sec": 1})).await;

    // Twenty calls at once: a rate of one a second admits at most a couple.
    let calls = (0..20).map(|_| call(&server, "default", "hello"));
    let results = futures::future::join_all(calls).await;
    let refused: Vec<_> = results.iter().filter(|(s, _, _)| *s == 429).collect();
    assert!(
        refused.len() >= 15,
        "{:?}",
        results.iter().map(|r| r.0).collect::<Vec<_>>()
    );
    let (_, body, headers) = refused[0];
    assert_quota_exceeded(429, body, "invocations_per_sec");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("of 1 in use"),
        "{body}"
    );
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1, "{retry}");

    // The authenticated /invoke shares the limit.
    let invokes = (0..5).map(|_| {
        send(
            &server,
            reqwest::Method::POST,
            "/v1/namespaces/default/functions/hello/invoke",
            Some(json!({})),
        )
    });
    let answers = futures::future::join_all(invokes).await;
    assert!(
        answers
            .iter()
            .any(|(s, b)| *s == 429 && b["error"]["code"] == "quota_exceeded"),
        "{answers:?}"
    );

    // Another namespace is not limited.
    for _ in 0..5 {
        let (status, body, _) = call(&server, "other", "hello").await;
        assert_eq!(status, 200, "{body}");
    }
    assert!(
        namespace(&server, "other").await["usage"]["invocations_per_sec"]
            .as_u64()
            .unwrap()
            >= 1
    );
}

/// Waits (bounded, polling) until the namespace's usage shows `instances`.
async fn wait_instances(server: &Server, ns: &str, instances: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let usage = namespace(server, ns).await["usage"].clone();
        if usage["instances"] == instances {
            return;
        }
        assert!(Instant::now() < deadline, "usage stayed at {usage}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_new_instance_over_the_instance_or_memory_quota_is_refused() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    let (status, _) = send(&server, reqwest::Method::PUT, "/v1/namespaces/other", None).await;
    assert_eq!(status, 201);
    set_quota(&server, "default", json!({"instances": 1})).await;
    // One function keeps its instance; another's idles out after a second.
    server
        .deploy(
            "keeper",
            json!({"runtime": "python3", "min_instances": 1}),
            &[("handler.py", HELLO)],
        )
        .await;
    server
        .deploy(
            "idler",
            json!({"runtime": "python3", "idle_timeout_sec": 1}),
            &[("handler.py", HELLO)],
        )
        .await;
    wait_instances(&server, "default", 1).await;
    let body = namespace(&server, "default").await;
    assert_eq!(body["usage"]["memory_mb"], 128, "{body}");

    // The keeper is served by its instance; the idler would need a new one.
    let (status, body, _) = call(&server, "default", "keeper").await;
    assert_eq!(status, 200, "{body}");
    let (status, body, _) = call(&server, "default", "idler").await;
    assert_quota_exceeded(status, &body, "quota exceeded: instances 1 of 1 in use");

    // Memory: 128 of 200 MiB is held, another 128 does not fit.
    set_quota(
        &server,
        "default",
        json!({"instances": null, "memory_mb": 200}),
    )
    .await;
    let (status, body, _) = call(&server, "default", "idler").await;
    assert_quota_exceeded(status, &body, "quota exceeded: memory_mb 128 of 200 in use");

    // The same function in another namespace starts as usual.
    server
        .deploy_in(
            "other",
            "idler",
            json!({"runtime": "python3", "idle_timeout_sec": 1}),
            &[("handler.py", HELLO)],
        )
        .await;
    wait_instances(&server, "other", 0).await;
    let (status, body, _) = call(&server, "other", "idler").await;
    assert_eq!(status, 200, "{body}");

    // With room again, the idler starts.
    set_quota(&server, "default", json!({"memory_mb": null})).await;
    let (status, body, _) = call(&server, "default", "idler").await;
    assert_eq!(status, 200, "{body}");
}
