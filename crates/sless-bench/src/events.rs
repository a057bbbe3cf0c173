//! Event delivery figures: messages per second from publish to handler completion through a
//! queue trigger, per broker kind, against the broker's own publish → consume rate with the
//! same client library and no engine (`queue_vs_broker_<kind>`); and async calls per second
//! from the first `202` to the last call `Succeeded`, against the same calls made
//! synchronously through `/fn/` (`async_vs_sync`).
//!
//! Every broker is a real one started for the run (`sless-brokers`: RabbitMQ, nats-server,
//! mosquitto, librdkafka's mock cluster) on a free loopback port; every message must arrive:
//! a run that loses or dead-letters one fails instead of printing a rate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use sless_core::{QueueKind, StartFrom};
use sless_queue::{ConnectionStatus, Connector, SourceConfig};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::error::{BenchError, Result};
use crate::measure::{NS, Plan, create, progress, ratio, remove};
use crate::procs::Server;
use crate::stats::Figures;

/// How long any one wait of this module may take before the run fails.
const WAIT: Duration = Duration::from_secs(120);
/// Publishes in flight at once (each waits for the broker's confirmation).
const PUBLISH_WINDOW: usize = 256;
/// The no-op handler every delivery runs.
const NOOP_PY: &str = "def handle(event):\n    return None\n";
/// The function's own concurrency and instances: enough that the engine, not the pool, is
/// what is measured.
fn noop_spec() -> Value {
    json!({"runtime": "python3", "concurrency": 32, "max_instances": 4, "min_instances": 1,
           "timeout_sec": 30})
}

/// A broker started for the run.
enum Broker {
    Amqp(sless_brokers::RabbitMq),
    Kafka(sless_brokers::KafkaMock),
    Mqtt(sless_brokers::Mosquitto),
    Nats(sless_brokers::Nats),
}

impl Broker {
    fn start(kind: QueueKind) -> Result<Broker> {
        let setup =
            |e: anyhow::Error| BenchError::Setup(format!("start the {kind:?} broker: {e:#}"));
        Ok(match kind {
            QueueKind::Amqp => Broker::Amqp(sless_brokers::RabbitMq::start().map_err(setup)?),
            QueueKind::Kafka => Broker::Kafka(sless_brokers::KafkaMock::start().map_err(setup)?),
            QueueKind::Mqtt => Broker::Mqtt(sless_brokers::Mosquitto::start().map_err(setup)?),
            QueueKind::Nats => Broker::Nats(sless_brokers::Nats::start().map_err(setup)?),
        })
    }

    fn url(&self) -> String {
        match self {
            Broker::Amqp(b) => b.url(),
            Broker::Kafka(b) => b.url(),
            Broker::Mqtt(b) => b.url(),
            Broker::Nats(b) => b.url(),
        }
    }
}

/// A running connector of the bench's own: a consumer (its messages go to `rx`) and the
/// publisher the bench sends through.
struct Client {
    connector: Arc<dyn Connector>,
    rx: mpsc::Receiver<sless_queue::Received>,
    stop: CancellationToken,
}

impl Client {
    async fn start(kind: QueueKind, url: &str, topic: &str, group: &str) -> Result<Client> {
        let connector = sless_queue::connector(SourceConfig {
            kind,
            url: url.to_string(),
            topic: topic.to_string(),
            group: group.to_string(),
            start_from: StartFrom::Latest,
            prefetch: 1024,
            label: format!("bench/{group}"),
        })
        .map_err(|e| BenchError::Setup(format!("{kind:?} client: {e}")))?;
        let (tx, rx) = mpsc::channel(1024);
        let status = Arc::new(ConnectionStatus::default());
        let stop = CancellationToken::new();
        tokio::spawn(connector.clone().run(tx, status.clone(), stop.clone()));
        let start = Instant::now();
        while status.state() != sless_core::ConnectionState::Connected {
            if start.elapsed() > WAIT {
                return Err(BenchError::Setup(format!(
                    "the bench's {kind:?} client did not connect: {:?}",
                    status.last_error()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Client {
            connector,
            rx,
            stop,
        })
    }

    /// Publishes `n` small JSON messages to `topic`, `PUBLISH_WINDOW` at a time.
    async fn publish(&self, topic: &str, n: usize, round: usize) -> Result<()> {
        publish(&self.connector, topic, n, round).await
    }
}

/// Publishes `n` small JSON messages to `topic` through `connector`, `PUBLISH_WINDOW` at a time.
async fn publish(
    connector: &Arc<dyn Connector>,
    topic: &str,
    n: usize,
    round: usize,
) -> Result<()> {
    let window = Arc::new(Semaphore::new(PUBLISH_WINDOW));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let permit = window
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| BenchError::Setup("publish window closed".into()))?;
        let connector = connector.clone();
        let topic = topic.to_string();
        tasks.spawn(async move {
            let _permit = permit;
            let body = Bytes::from(format!(r#"{{"round":{round},"n":{i}}}"#));
            connector.publish(&topic, body, &[]).await
        });
    }
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(BenchError::Setup(format!("publish to {topic}: {e}"))),
            Err(e) => return Err(BenchError::Setup(format!("publish task: {e}"))),
        }
    }
    Ok(())
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// `queue_msgs_per_s_<kind>` and `queue_vs_broker_<kind>`.
pub async fn queue(
    server: &Server,
    kind: QueueKind,
    plan: &Plan,
    figures: &mut Figures,
) -> Result<()> {
    let n = plan.messages;
    progress!(
        "queue {}: {n} messages per round, {} alternating rounds, engine vs the broker alone",
        kind.as_str(),
        plan.rounds
    );
    let broker = Broker::start(kind)?;
    let url = broker.url();
    let tag = kind.as_str();
    let function = format!("bench-queue-{tag}");
    let trigger = format!("bench-queue-{tag}");
    let topic = format!("bench-in-{tag}");
    let base_topic = format!("bench-base-{tag}");
    create(server, &function, &noop_spec(), &[("handler.py", NOOP_PY)]).await?;
    let body = json!({
        "name": trigger, "function": function, "type": "queue",
        "source": {"kind": tag, "url": url, "topic": topic},
        "delivery": {"concurrency": 64, "max_attempts": 3, "backoff_initial_ms": 50},
    });
    server
        .client
        .create_trigger(NS, &body)
        .await
        .map_err(crate::error::api(format!("create trigger {trigger}")))?;
    let outcome = queue_rounds(server, kind, &url, &trigger, &topic, &base_topic, plan).await;
    let _ = server.client.delete_trigger(NS, &trigger).await;
    remove(server, &function).await?;
    drop(broker);
    let (engine, base) = outcome?;
    let total = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ratios: Vec<f64> = engine
        .iter()
        .zip(&base)
        .map(|(e, b)| ratio(*e, *b))
        .collect();
    let (rate_key, ratio_key) = keys(kind);
    figures.set_with_rounds(rate_key, total(&engine), &engine);
    figures.set_with_rounds(ratio_key, ratio(total(&engine), total(&base)), &ratios);
    Ok(())
}

fn keys(kind: QueueKind) -> (&'static str, &'static str) {
    match kind {
        QueueKind::Amqp => ("queue_msgs_per_s_amqp", "queue_vs_broker_amqp"),
        QueueKind::Kafka => ("queue_msgs_per_s_kafka", "queue_vs_broker_kafka"),
        QueueKind::Mqtt => ("queue_msgs_per_s_mqtt", "queue_vs_broker_mqtt"),
        QueueKind::Nats => ("queue_msgs_per_s_nats", "queue_vs_broker_nats"),
    }
}

/// The rates of every round: through the trigger, and through the bench's own consumer.
async fn queue_rounds(
    server: &Server,
    kind: QueueKind,
    url: &str,
    trigger: &str,
    topic: &str,
    base_topic: &str,
    plan: &Plan,
) -> Result<(Vec<f64>, Vec<f64>)> {
    wait_trigger(
        server,
        trigger,
        |s| s["connection"] == "connected",
        "to connect",
    )
    .await?;
    let mut base = Client::start(
        kind,
        url,
        base_topic,
        &format!("bench-base-{}", kind.as_str()),
    )
    .await?;
    // A warm-up round brings the function's instances up; it is not measured.
    base.publish(topic, 200, 0).await?;
    let mut expected = 200u64;
    wait_succeeded(server, trigger, expected).await?;
    let (mut engine_rates, mut base_rates) = (Vec::new(), Vec::new());
    for round in 1..=plan.rounds as usize {
        let n = plan.messages;
        // The broker alone: publish and consume with the same client library, ack at once.
        let start = Instant::now();
        let publishing = publish(&base.connector, base_topic, n, round);
        let rx = &mut base.rx;
        let consume = async {
            let mut got = 0;
            while got < n {
                let received = tokio::time::timeout(WAIT, rx.recv())
                    .await
                    .map_err(|_| BenchError::Setup(format!("baseline: {got} of {n} arrived")))?
                    .ok_or_else(|| BenchError::Setup("baseline consumer stopped".into()))?;
                received
                    .ack
                    .ack()
                    .await
                    .map_err(|e| BenchError::Setup(format!("baseline ack: {e}")))?;
                got += 1;
            }
            Ok::<(), BenchError>(())
        };
        let (p, c) = tokio::join!(publishing, consume);
        p?;
        c?;
        let base_rate = n as f64 / start.elapsed().as_secs_f64();
        // The engine: publish, and wait until every message is a succeeded invocation.
        let start = Instant::now();
        base.publish(topic, n, round).await?;
        expected += n as u64;
        wait_succeeded(server, trigger, expected).await?;
        let engine_rate = n as f64 / start.elapsed().as_secs_f64();
        progress!(
            "  round {round}: trigger {engine_rate:.0} msg/s, broker alone {base_rate:.0} msg/s"
        );
        engine_rates.push(engine_rate);
        base_rates.push(base_rate);
    }
    Ok((engine_rates, base_rates))
}

/// Waits until the trigger's counters show `expected` succeeded deliveries, failing on any
/// dead letter, failed attempt or more successes than messages (a loss would time out).
async fn wait_succeeded(server: &Server, trigger: &str, expected: u64) -> Result<()> {
    let status = wait_trigger(
        server,
        trigger,
        |s| s["counters"]["succeeded"].as_u64().unwrap_or(0) >= expected,
        &format!("to deliver {expected} messages"),
    )
    .await?;
    let counters = &status["counters"];
    let count = |k: &str| counters[k].as_u64().unwrap_or(0);
    if count("succeeded") != expected || count("dead_lettered") > 0 || count("failed") > 0 {
        return Err(BenchError::Setup(format!(
            "trigger {trigger}: expected {expected} succeeded deliveries and no failure, got {counters}"
        )));
    }
    Ok(())
}

/// Polls the trigger's status until `done` holds; answers the status.
async fn wait_trigger(
    server: &Server,
    trigger: &str,
    done: impl Fn(&Value) -> bool,
    what: &str,
) -> Result<Value> {
    let start = Instant::now();
    loop {
        let t = server
            .client
            .get_trigger(NS, trigger)
            .await
            .map_err(crate::error::api(format!("get trigger {trigger}")))?;
        let status = serde_json::to_value(&t.status).unwrap_or_default();
        if done(&status) {
            return Ok(status);
        }
        if start.elapsed() > WAIT {
            return Err(BenchError::Timeout {
                what: format!("trigger {trigger} {what} (status: {status})"),
                waited: WAIT,
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `async_calls_per_s` and `async_vs_sync`: `plan.messages` calls of a no-op function, all
/// queued with `/async/` by 32 concurrent callers, until the last one succeeded; against the
/// same calls made through `/fn/` by the same callers.
pub async fn async_calls(server: &Server, plan: &Plan, figures: &mut Figures) -> Result<()> {
    let n = plan.messages;
    let function = "bench-async";
    progress!(
        "async calls: {n} per round, {} alternating rounds, vs /fn/",
        plan.rounds
    );
    let mut spec = noop_spec();
    spec["delivery"] = json!({"concurrency": 64});
    create(server, function, &spec, &[("handler.py", NOOP_PY)]).await?;
    let outcome = async_rounds(server, function, plan).await;
    remove(server, function).await?;
    let (async_rates, sync_rates) = outcome?;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ratios: Vec<f64> = async_rates
        .iter()
        .zip(&sync_rates)
        .map(|(a, s)| ratio(*a, *s))
        .collect();
    figures.set_with_rounds("async_calls_per_s", mean(&async_rates), &async_rates);
    figures.set_with_rounds(
        "async_vs_sync",
        ratio(mean(&async_rates), mean(&sync_rates)),
        &ratios,
    );
    Ok(())
}

async fn async_rounds(
    server: &Server,
    function: &str,
    plan: &Plan,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let base = format!("http://{}", server.addr);
    // Warm-up: the instances come up before anything is timed.
    fire(server, &format!("{base}/fn/{NS}/{function}"), 100, 200).await?;
    let (mut async_rates, mut sync_rates) = (Vec::new(), Vec::new());
    for round in 1..=plan.rounds as usize {
        let n = plan.messages;
        let start = Instant::now();
        fire(server, &format!("{base}/fn/{NS}/{function}"), n, 200).await?;
        let sync_rate = n as f64 / start.elapsed().as_secs_f64();
        let start = Instant::now();
        fire(server, &format!("{base}/async/{NS}/{function}"), n, 202).await?;
        wait_calls_done(server, function).await?;
        let async_rate = n as f64 / start.elapsed().as_secs_f64();
        progress!("  round {round}: async {async_rate:.0} calls/s, /fn/ {sync_rate:.0} req/s");
        async_rates.push(async_rate);
        sync_rates.push(sync_rate);
    }
    Ok((async_rates, sync_rates))
}

/// POSTs `{}` to `url` `n` times from 32 concurrent callers; every answer must be `want`.
async fn fire(server: &Server, url: &str, n: usize, want: u16) -> Result<()> {
    let callers = Arc::new(Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let permit = callers
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| BenchError::Setup("caller window closed".into()))?;
        let http = server.client.http().clone();
        let url = url.to_string();
        tasks.spawn(async move {
            let _permit = permit;
            let r = http
                .post(&url)
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await;
            match r {
                Ok(r) => Ok(r.status().as_u16()),
                Err(e) => Err(e.to_string()),
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(status)) if status == want => {}
            Ok(Ok(status)) => {
                return Err(BenchError::Setup(format!(
                    "{url} answered {status}, not {want}"
                )));
            }
            Ok(Err(e)) => return Err(BenchError::Setup(format!("{url}: {e}"))),
            Err(e) => return Err(BenchError::Setup(format!("caller task: {e}"))),
        }
    }
    Ok(())
}

/// Waits until the function has no call `Queued` or `Running`, then fails if any `Failed`.
async fn wait_calls_done(server: &Server, function: &str) -> Result<()> {
    let start = Instant::now();
    let count = |phase: &'static str| {
        let path = format!("/v1/namespaces/{NS}/calls?function={function}&phase={phase}&limit=1");
        async move {
            let v: Value = server
                .client
                .request_json(reqwest::Method::GET, &path, None)
                .await
                .map_err(crate::error::api(format!("list {phase} calls")))?;
            Ok::<usize, BenchError>(v["items"].as_array().map_or(0, Vec::len))
        }
    };
    loop {
        if count("Queued").await? == 0 && count("Running").await? == 0 {
            break;
        }
        if start.elapsed() > WAIT {
            return Err(BenchError::Timeout {
                what: format!("the async calls of {function} to finish"),
                waited: WAIT,
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if count("Failed").await? > 0 {
        return Err(BenchError::Setup(format!(
            "an async call of {function} failed"
        )));
    }
    Ok(())
}

/// Devices publishing at once in the telemetry figures.
const DEVICES: usize = 10;

/// `telemetry_msgs_per_s`, `mqtt_broker_msgs_per_s` and `telemetry_vs_broker`:
/// `plan.messages` QoS 1 messages from [`DEVICES`] devices, from the first publish until
/// every one is stored and listable (the devices' `status.messages` add up), against the
/// same broker program (Debian's mosquitto, a plain instance of its own) with a plain
/// MQTT 5 subscriber acknowledging each message, publishers alike. A run that stores
/// fewer or more messages than were published fails instead of printing a rate.
pub async fn telemetry(
    server: &Server,
    mqtt_port: u16,
    plan: &Plan,
    figures: &mut Figures,
) -> Result<()> {
    let n = plan.messages - plan.messages % DEVICES;
    progress!(
        "telemetry: {n} messages from {DEVICES} devices per round, {} alternating rounds, sless's ingest vs a plain subscriber",
        plan.rounds
    );
    let mut devices = Vec::new();
    for i in 0..DEVICES {
        let name = format!("bench-dev-{i}");
        let _ = server.client.delete_device(NS, &name).await;
        let d = server
            .client
            .create_device(NS, &name, &Default::default(), true)
            .await
            .map_err(crate::error::api(format!("create device {name}")))?;
        let password = d.mqtt.password.clone().unwrap_or_default();
        let url = format!(
            "mqtt://{}:{password}@127.0.0.1:{mqtt_port}",
            d.mqtt.username
        );
        let client = Client::start(
            QueueKind::Mqtt,
            &url,
            &d.mqtt.subscribe_topic,
            &d.mqtt.client_id,
        )
        .await?;
        devices.push((name, d.mqtt.publish_topic.clone(), client));
    }
    let plain = Broker::start(QueueKind::Mqtt)?;
    let plain_url = plain.url();
    let mut base_rx = Client::start(
        QueueKind::Mqtt,
        &format!("{plain_url}?version=5"),
        "base/telemetry/+",
        "bench-base-telemetry",
    )
    .await?;
    let mut base_publishers = Vec::new();
    for i in 0..DEVICES {
        base_publishers.push(
            Client::start(
                QueueKind::Mqtt,
                &plain_url,
                &format!("base/commands/{i}"),
                &format!("bench-base-pub-{i}"),
            )
            .await?,
        );
    }
    let stored = |server: &Server| {
        let client = server.client.clone();
        async move {
            let list = client
                .list_devices(NS)
                .await
                .map_err(crate::error::api("list devices".to_string()))?;
            Ok::<u64, BenchError>(
                list.iter()
                    .filter(|d| d.name.starts_with("bench-dev-"))
                    .map(|d| d.status.messages)
                    .sum(),
            )
        }
    };
    let per_device = n / DEVICES;
    let mut expected = stored(server).await?;
    let (mut ingest_rates, mut base_rates) = (Vec::new(), Vec::new());
    for round in 0..=plan.rounds as usize {
        // Round 0 warms both paths up and is not measured.
        let count = if round == 0 { 20 * DEVICES } else { n };
        let each = if round == 0 { 20 } else { per_device };
        // The broker alone.
        let start = Instant::now();
        let base_topics: Vec<String> = (0..DEVICES)
            .map(|i| format!("base/telemetry/{i}"))
            .collect();
        let publishing = async {
            let mut all = Vec::new();
            for (p, topic) in base_publishers.iter().zip(&base_topics) {
                all.push(publish(&p.connector, topic, each, round));
            }
            for r in futures::future::join_all(all).await {
                r?;
            }
            Ok::<(), BenchError>(())
        };
        let rx = &mut base_rx.rx;
        let consume = async {
            let mut got = 0;
            while got < count {
                let received = tokio::time::timeout(WAIT, rx.recv())
                    .await
                    .map_err(|_| BenchError::Setup(format!("baseline: {got} of {count} arrived")))?
                    .ok_or_else(|| BenchError::Setup("baseline consumer stopped".into()))?;
                received
                    .ack
                    .ack()
                    .await
                    .map_err(|e| BenchError::Setup(format!("baseline ack: {e}")))?;
                got += 1;
            }
            Ok::<(), BenchError>(())
        };
        let (p, c) = tokio::join!(publishing, consume);
        p?;
        c?;
        let base_rate = count as f64 / start.elapsed().as_secs_f64();
        // Through sless: published by the devices, stored, listable.
        let start = Instant::now();
        let mut all = Vec::new();
        for (_, topic, client) in &devices {
            all.push(publish(&client.connector, topic, each, round));
        }
        for r in futures::future::join_all(all).await {
            r?;
        }
        expected += count as u64;
        loop {
            let now = stored(server).await?;
            if now == expected {
                break;
            }
            if now > expected {
                return Err(BenchError::Setup(format!(
                    "telemetry: {now} messages stored, {expected} published (duplicates)"
                )));
            }
            if start.elapsed() > WAIT {
                return Err(BenchError::Timeout {
                    what: format!("telemetry: {now} of {expected} messages stored"),
                    waited: WAIT,
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ingest_rate = count as f64 / start.elapsed().as_secs_f64();
        if round > 0 {
            progress!(
                "  round {round}: stored {ingest_rate:.0} msg/s, broker alone {base_rate:.0} msg/s"
            );
            ingest_rates.push(ingest_rate);
            base_rates.push(base_rate);
        }
    }
    for (name, _, _) in &devices {
        let _ = server.client.delete_device(NS, name).await;
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ratios: Vec<f64> = ingest_rates
        .iter()
        .zip(&base_rates)
        .map(|(e, b)| ratio(*e, *b))
        .collect();
    figures.set_with_rounds("telemetry_msgs_per_s", mean(&ingest_rates), &ingest_rates);
    figures.set_with_rounds("mqtt_broker_msgs_per_s", mean(&base_rates), &base_rates);
    figures.set_with_rounds(
        "telemetry_vs_broker",
        ratio(mean(&ingest_rates), mean(&base_rates)),
        &ratios,
    );
    Ok(())
}
