//! The queue-trigger scenarios, each written once for every broker kind: the
//! per-kind files (`queue_amqp.rs`, `queue_nats.rs`, ...) run them against their broker
//! (`queue_mqtt.rs` twice: MQTT 3.1.1 and MQTT 5).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::send;
use crate::queue_harness::{Client, Setup, Source, WAIT, own_broker, shared_broker, unique};

/// JSON, text, binary and empty payloads become the events the contract names, and
/// the consumer lives on; a payload published three times is delivered three times;
/// the handler's return value reaches `response_topic`.
pub async fn payloads_duplicates_and_responses(source: Source) {
    let broker = shared_broker(source).await;
    let setup = Setup::new("payloads").await;
    let topic = unique("payloads");
    let responses = unique("responses");
    let reader = Client::connect(&*broker, &responses).await;
    setup
        .trigger(
            "payloads",
            &*broker,
            &topic,
            json!({"response_topic": responses}),
        )
        .await;
    setup.wait_connected("payloads").await;
    let publisher = Client::connect(&*broker, &unique("publisher")).await;

    publisher.publish(&topic, "not json at all").await;
    publisher.publish(&topic, vec![0xffu8, 0x00, 0xfe]).await;
    publisher.publish(&topic, Vec::<u8>::new()).await;
    for _ in 0..3 {
        publisher
            .publish(&topic, json!({"run": "dup", "n": 1}).to_string())
            .await;
    }
    publisher.publish_run(&topic, "after", 0..1).await;

    setup.wait_handled("after", 0..1).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let dups = setup.handled("dup").await.get(&1).copied().unwrap_or(0);
        if dups >= 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a payload published 3 times was handled {dups} times"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = setup.log().await;
    for line in [
        r#"raw "not json at all""#,
        r#"raw {"base64": "/wD+"}"#,
        r#"raw """#,
    ] {
        assert!(log.contains(line), "{line} not in the log:\n{log}");
    }

    // Every success is answered on response_topic with the handler's return value.
    let mut answers = Vec::new();
    for _ in 0..7 {
        let m = reader.next().await;
        answers.push(serde_json::from_slice::<Value>(&m.payload).expect("JSON answer"));
    }
    assert!(
        answers.contains(&json!({"handled": "not json at all"})),
        "{answers:?}"
    );
    assert!(
        answers.contains(&json!({"handled": {"run": "after", "n": 0}})),
        "{answers:?}"
    );

    let status = setup.trigger_status("payloads").await;
    assert_eq!(status["connection"], "connected", "{status}");
    assert!(
        status["counters"]["received"].as_u64() >= Some(7),
        "{status}"
    );
}

/// A burst of 100 reaches a function with no instance running, then 1000 more
/// messages all end as succeeded queue invocations.
pub async fn bursts_at_zero_instances_and_a_thousand(source: Source) {
    let broker = shared_broker(source).await;
    let setup = Setup::new("bursts").await;
    let topic = unique("bursts");
    setup
        .trigger(
            "bursts",
            &*broker,
            &topic,
            json!({"delivery": {"concurrency": 8}}),
        )
        .await;
    setup.wait_connected("bursts").await;
    // Nothing has called the function yet: no instance runs when the burst comes.
    let publisher = Client::connect(&*broker, &unique("publisher")).await;
    publisher.publish_run(&topic, "burst", 0..100).await;
    setup.wait_handled("burst", 0..100).await;

    publisher.publish_run(&topic, "thousand", 0..1000).await;
    let seen = setup.wait_handled("thousand", 0..1000).await;
    assert_eq!(seen.len(), 1000);
    // Records are written in batches: wait (bounded) until the newest 1000 queue
    // invocations are the thousand's, every one of them a success.
    let deadline = Instant::now() + WAIT;
    loop {
        let records = setup.queue_invocations(1000).await;
        let ok = records.iter().filter(|i| i.status == 200).count();
        if ok == 1000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{ok} of the newest {} queue invocations succeeded",
            records.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The server restarted three times while messages flow loses none; messages
/// published while it is down are delivered once it is back.
pub async fn server_restarts(source: Source) {
    let broker = shared_broker(source).await;
    let mut setup = Setup::new("restarts").await;
    let topic = unique("restarts");
    setup.trigger("restarts", &*broker, &topic, json!({})).await;
    setup.wait_connected("restarts").await;
    let publisher = Client::connect(&*broker, &unique("publisher")).await;
    for round in 0..3u32 {
        publisher
            .publish_run(&topic, "stream", round * 50..round * 50 + 50)
            .await;
        setup.server.stop().await;
        setup.server.restart().await;
    }
    setup.wait_handled("stream", 0..150).await;

    setup.server.stop().await;
    publisher.publish_run(&topic, "while-down", 0..50).await;
    setup.server.restart().await;
    setup.wait_handled("while-down", 0..50).await;
}

/// A trigger created while its broker is down reports `connecting`, connects once the
/// broker is up and delivers; a broker restart mid-stream loses nothing.
pub async fn broker_down_then_up_then_restarted(source: Source) {
    let broker = own_broker(source).await;
    let setup = Setup::new("brokerdown").await;
    let topic = unique("brokerdown");
    setup
        .trigger("brokerdown", &*broker, &topic, json!({}))
        .await;
    let status = setup.trigger_status("brokerdown").await;
    assert_ne!(status["connection"], "connected", "{status}");

    let b = broker.clone();
    tokio::task::spawn_blocking(move || b.restart())
        .await
        .expect("broker starts");
    setup.wait_connected("brokerdown").await;
    let publisher = Client::connect(&*broker, &unique("publisher")).await;
    publisher.publish_run(&topic, "first", 0..20).await;
    setup.wait_handled("first", 0..20).await;

    publisher.publish_run(&topic, "around", 0..50).await;
    let b = broker.clone();
    tokio::task::spawn_blocking(move || b.restart())
        .await
        .expect("broker restarts");
    publisher.publish_run(&topic, "around", 50..100).await;
    setup.wait_handled("around", 0..100).await;
}

/// A handler answering 400 fails without retry: one attempt, a dead letter (on
/// `dead_letter_topic` with the x-sless headers), acknowledged, and the messages
/// behind it are delivered.
pub async fn refused_messages_become_dead_letters(source: Source) {
    let broker = shared_broker(source).await;
    let setup = Setup::new("refused").await;
    let topic = unique("refused");
    let dlq = unique("dlq");
    let reader = Client::connect(&*broker, &dlq).await;
    setup
        .trigger(
            "refused",
            &*broker,
            &topic,
            json!({"dead_letter_topic": dlq, "delivery": {"max_attempts": 3}}),
        )
        .await;
    setup.wait_connected("refused").await;
    let publisher = Client::connect(&*broker, &unique("publisher")).await;
    let poison = json!({"fail": 400, "n": 7}).to_string();
    publisher.publish(&topic, poison.clone()).await;
    publisher.publish_run(&topic, "behind", 0..10).await;
    setup.wait_handled("behind", 0..10).await;

    let dead = reader.next().await;
    assert_eq!(dead.payload, poison.as_bytes());
    let header = |k: &str| {
        dead.headers
            .iter()
            .find(|(h, _)| h == k)
            .map(|(_, v)| v.clone())
    };
    if source.has_headers() {
        assert_eq!(header("x-sless-original-topic"), Some(topic.clone()));
        assert_eq!(header("x-sless-attempts").as_deref(), Some("1"));
        assert_eq!(header("x-sless-last-status").as_deref(), Some("400"));
    }
    let refused = setup.log().await.matches("refused 7").count();
    assert_eq!(refused, 1, "a 400 is not retried");
}

/// A source whose URL is a secret's value connects; disabling stops consuming
/// (messages wait in the broker); enabling resumes.
pub async fn disable_and_enable(source: Source) {
    let broker = shared_broker(source).await;
    let setup = Setup::new("toggle").await;
    let topic = unique("toggle");
    let (status, body) = send(
        &setup.server,
        reqwest::Method::PUT,
        "/v1/namespaces/default/secrets/broker",
        Some(json!({"data": {"url": broker.url()}})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    setup
        .trigger(
            "toggle",
            &*broker,
            &topic,
            json!({"source": {"kind": source.kind().as_str(), "topic": topic, "start_from": "earliest",
                              "url_secret": {"secret": "broker", "key": "url"}}}),
        )
        .await;
    setup.wait_connected("toggle").await;
    let t = setup.trigger_status("toggle").await;
    assert!(!t.to_string().contains(&broker.url()), "{t}");
    let publisher = Client::connect(&*broker, &unique("publisher")).await;
    publisher.publish_run(&topic, "on", 0..5).await;
    setup.wait_handled("on", 0..5).await;

    let path = "/v1/namespaces/default/triggers/toggle";
    let (status, t) = send(
        &setup.server,
        reqwest::Method::PATCH,
        path,
        Some(json!({"enabled": false})),
    )
    .await;
    assert_eq!(status, 200, "{t}");
    assert!(t["status"].get("connection").is_none(), "{t}");
    publisher.publish_run(&topic, "off", 0..5).await;
    // Nothing consumes: a later look at the log still has none of them (the
    // broker holds them), which the enable below then delivers.
    assert!(setup.handled("off").await.is_empty());

    let (status, t) = send(
        &setup.server,
        reqwest::Method::PATCH,
        path,
        Some(json!({"enabled": true})),
    )
    .await;
    assert_eq!(status, 200, "{t}");
    setup.wait_handled("off", 0..5).await;

    // A new value of the secret is used at once: a URL nothing listens on, then the
    // broker's again.
    let nowhere = format!(
        "{}://127.0.0.1:1",
        broker.url().split("://").next().unwrap_or("amqp")
    );
    for (url, want) in [(nowhere, false), (broker.url(), true)] {
        let (status, body) = send(
            &setup.server,
            reqwest::Method::PUT,
            "/v1/namespaces/default/secrets/broker",
            Some(json!({"data": {"url": url}})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let deadline = Instant::now() + WAIT;
        loop {
            let status = setup.trigger_status("toggle").await;
            if (status["connection"] == "connected") == want {
                break;
            }
            assert!(Instant::now() < deadline, "want connected={want}: {status}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    publisher.publish_run(&topic, "rotated", 0..3).await;
    setup.wait_handled("rotated", 0..3).await;
}

/// A handler that raises is retried `max_attempts` times with growing gaps, then the
/// message is a dead letter (on `dead_letter_topic` with the error); the messages
/// behind it do not wait for its retries (`ordering: none`).
pub async fn raising_handlers_retry_then_dead_letter(source: Source) {
    let broker = shared_broker(source).await;
    let setup = Setup::new("raising").await;
    let topic = unique("raising");
    let dlq = unique("dlq");
    let reader = Client::connect(&*broker, &dlq).await;
    setup
        .trigger(
            "raising",
            &*broker,
            &topic,
            json!({"dead_letter_topic": dlq,
                   "delivery": {"max_attempts": 3, "backoff_initial_ms": 1500,
                                "backoff_max_ms": 6000, "concurrency": 1}}),
        )
        .await;
    setup.wait_connected("raising").await;
    let publisher = Client::connect(&*broker, &unique("publisher")).await;
    let poison = json!({"raise": true, "n": 1}).to_string();
    publisher.publish(&topic, poison.clone()).await;
    publisher.publish_run(&topic, "behind", 0..10).await;

    let dead = reader.next().await;
    assert_eq!(dead.payload, poison.as_bytes());
    let header = |k: &str| {
        dead.headers
            .iter()
            .find(|(h, _)| h == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    if source.has_headers() {
        assert_eq!(header("x-sless-attempts"), "3");
        assert_eq!(header("x-sless-last-status"), "500");
        assert!(header("x-sless-error").contains("poison 1"), "{dead:?}");
    }
    let log = setup.log().await;
    assert_eq!(log.matches("raising 1").count(), 3, "{log}");
    // The ten behind it were handled before its last attempt.
    let last_raise = log.rfind("raising 1").expect("raised");
    let last_behind = log.find("got behind 9").expect("all handled");
    assert!(
        last_behind < last_raise,
        "the messages behind a poison message waited for its retries:\n{log}"
    );

    // Every attempt is a queue invocation record with its attempt number, and the
    // gaps between them grow (records are written in batches: wait for the third).
    let body = wait_records(
        &setup,
        "/v1/namespaces/default/invocations?function=raising&status=500&limit=10",
        3,
    )
    .await;
    let mut attempts: Vec<(u64, chrono::DateTime<chrono::Utc>)> = body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            (
                i["attempt"].as_u64().expect("attempt"),
                i["started_at"]
                    .as_str()
                    .expect("started_at")
                    .parse()
                    .expect("time"),
            )
        })
        .collect();
    attempts.sort();
    assert_eq!(
        attempts.iter().map(|a| a.0).collect::<Vec<_>>(),
        [1, 2, 3],
        "{body}"
    );
    let gap = |i: usize| (attempts[i + 1].1 - attempts[i].1).num_milliseconds();
    assert!(gap(0) >= 700, "first retry after {} ms", gap(0));
    assert!(gap(1) >= 1400, "second retry after {} ms", gap(1));
    let status = setup.trigger_status("raising").await;
    assert!(
        status["counters"]["dead_lettered"].as_u64() >= Some(1),
        "{status}"
    );
    assert!(
        status["counters"]["retried"].as_u64() >= Some(2),
        "{status}"
    );
    // The dead letter is kept with the error; after the function is fixed, a redrive
    // delivers it from attempt 1, and it goes away.
    let (status, body) = send(
        &setup.server,
        reqwest::Method::GET,
        "/v1/namespaces/default/dead-letters?trigger=raising",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let items = body["items"].as_array().expect("items").clone();
    assert_eq!(items.len(), 1, "{body}");
    let dl = &items[0];
    assert_eq!(dl["source"], "queue", "{dl}");
    assert_eq!(dl["function"], "raising", "{dl}");
    assert_eq!(dl["payload"], json!({"raise": true, "n": 1}), "{dl}");
    assert_eq!(dl["attempts"], 3, "{dl}");
    assert_eq!(dl["last_status"], 500, "{dl}");
    assert!(
        dl["error"]
            .as_str()
            .unwrap_or_default()
            .contains("poison 1"),
        "{dl}"
    );
    assert!(!dl.to_string().contains(&broker.url()), "{dl}");
    let fixed = crate::queue_harness::HANDLER.replace(
        "raise RuntimeError(\"poison %s\" % event.get(\"n\"))",
        "print(\"recovered %s\" % event.get(\"n\"))",
    );
    assert_ne!(fixed, crate::queue_harness::HANDLER);
    setup
        .server
        .deploy(
            "raising",
            json!({"runtime": "python3"}),
            &[("handler.py", &fixed)],
        )
        .await;
    let id = dl["id"].as_str().expect("id");
    let (status, body) = send(
        &setup.server,
        reqwest::Method::POST,
        &format!("/v1/namespaces/default/dead-letters/{id}/redrive"),
        None,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, body) = send(
            &setup.server,
            reqwest::Method::GET,
            "/v1/namespaces/default/dead-letters?trigger=raising",
            None,
        )
        .await;
        let log = setup.log().await;
        if log.contains("recovered 1") && body["items"].as_array().is_some_and(Vec::is_empty) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the redrive did not succeed: {body}\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `ordering: key` keeps the messages of one key in order under `concurrency` > 1;
/// `concurrency: 1` never runs two at once.
pub async fn ordering_and_concurrency(source: Source) {
    let broker = shared_broker(source).await;
    let setup = Setup::new("ordering").await;
    let publisher = Client::connect(&*broker, &unique("publisher")).await;

    let ordered = unique("ordered");
    setup
        .trigger(
            "ordered",
            &*broker,
            &ordered,
            json!({"delivery": {"concurrency": 8, "ordering": "key"}}),
        )
        .await;
    setup.wait_connected("ordered").await;
    publisher.publish_run(&ordered, "ordered", 0..40).await;
    setup.wait_handled("ordered", 0..40).await;
    let log = setup.log().await;
    // One topic is one key (on Kafka, messages without a key are ordered per partition);
    // a redelivery may repeat a message, never reorder them.
    let mut orders: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    if source == Source::Kafka {
        for line in log.lines() {
            let Some(rest) = line.split("partition ordered ").nth(1) else {
                continue;
            };
            let mut parts = rest.split_whitespace();
            if let (Some(n), Some(p)) = (parts.next(), parts.next())
                && let Ok(n) = n.parse()
            {
                orders.entry(p.to_string()).or_default().push(n);
            }
        }
    } else {
        orders.insert(
            ordered.clone(),
            log.lines()
                .filter_map(|l| l.split("got ordered ").nth(1))
                .filter_map(|n| n.trim().parse().ok())
                .collect(),
        );
    }
    assert!(
        orders.values().map(Vec::len).sum::<usize>() >= 40,
        "every message logged: {orders:?}"
    );
    for (key, order) in &orders {
        let mut firsts = order.clone();
        firsts.dedup();
        assert!(
            firsts.windows(2).all(|w| w[0] < w[1]),
            "{key}: out of order: {order:?}"
        );
    }

    let single = unique("single");
    setup
        .trigger(
            "single",
            &*broker,
            &single,
            json!({"delivery": {"concurrency": 1}}),
        )
        .await;
    setup.wait_connected("single").await;
    // Each handler takes 20 ms, so two at once would overlap by far more than the
    // records' millisecond precision.
    for n in 0..20 {
        publisher
            .publish(
                &single,
                json!({"run": "single", "n": n, "sleep": 0.02}).to_string(),
            )
            .await;
    }
    setup.wait_handled("single", 0..20).await;
    // With one in flight, each handler ended before the next began: the records'
    // time spans never overlap.
    let body = wait_records(
        &setup,
        "/v1/namespaces/default/invocations?function=ordering&trigger=single&limit=100",
        20,
    )
    .await;
    let mut spans: Vec<(f64, f64)> = body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            let start: chrono::DateTime<chrono::Utc> = i["started_at"]
                .as_str()
                .expect("start")
                .parse()
                .expect("time");
            let start = start.timestamp_micros() as f64 / 1000.0;
            (start, start + i["duration_ms"].as_f64().expect("duration"))
        })
        .collect();
    assert!(spans.len() >= 20, "{body}");
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in spans.windows(2) {
        // Starts are recorded to the millisecond: a millisecond of slack.
        assert!(w[1].0 + 1.0 >= w[0].1, "two at once: {w:?} in {body}");
    }
}

/// Polls an invocation listing (bounded) until it has at least `count` items.
async fn wait_records(setup: &Setup, path: &str, count: usize) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = send(&setup.server, reqwest::Method::GET, path, None).await;
        assert_eq!(status, 200, "{body}");
        if body["items"].as_array().map_or(0, Vec::len) >= count {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "fewer than {count} records: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `sless trigger create --queue` makes a queue trigger; `trigger ls` shows its state
/// and counters, `trigger get` its settings.
pub async fn from_the_command_line(source: Source) {
    let broker = shared_broker(source).await;
    let setup = Setup::new("clifn").await;
    let topic = unique("cli");
    let url = broker.url();
    let out = sless_cli(
        &setup,
        &[
            "trigger",
            "create",
            "from-cli",
            "--function",
            "clifn",
            "--queue",
            &url,
            "--topic",
            &topic,
            "--concurrency",
            "2",
            "--max-attempts",
            "2",
            "--dead-letter-topic",
            "cli.dlq",
        ],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        stdout.trim(),
        format!(
            "created trigger default/from-cli: {}:{topic} -> clifn",
            source.kind().as_str()
        )
    );
    setup.wait_connected("from-cli").await;
    let publisher = Client::connect(&*broker, &unique("publisher")).await;
    publisher.publish_run(&topic, "cli", 0..3).await;
    setup.wait_handled("cli", 0..3).await;

    let deadline = Instant::now() + WAIT;
    loop {
        let out = sless_cli(&setup, &["trigger", "ls"]).await;
        let table = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{out:?}");
        let row = table
            .lines()
            .find(|l| l.starts_with("from-cli"))
            .unwrap_or_default()
            .to_string();
        if row.contains("ok 3 / retry 0 / dlq 0") {
            assert!(table.starts_with("NAME"), "{table}");
            assert!(table.contains("STATE"), "{table}");
            assert!(row.contains(" connected "), "{row}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "counters never reached 3:\n{table}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = sless_cli(&setup, &["trigger", "get", "from-cli"]).await;
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in [
        "type:         queue",
        "state:        connected",
        "dead letters: cli.dlq",
        "delivery:     concurrency 2, ordering none, 2 attempts",
        "counters:     received 3, succeeded 3",
    ] {
        assert!(summary.contains(line), "{line:?} not in\n{summary}");
    }
}

async fn sless_cli(setup: &Setup, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
        .args(args)
        .env("SLESS_SERVER", setup.server.url())
        .env("SLESS_TOKEN", crate::harness::TOKEN)
        .env_remove("SLESS_NAMESPACE")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run sless")
}
