//! The Kafka connector against librdkafka's mock cluster (a real Kafka protocol
//! endpoint with consumer groups and committed offsets), run by `kcat` once per test
//! binary. Every test uses its own topic and group.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message as _};
use sless_brokers::KafkaMock;
use sless_core::{ConnectionState, QueueKind, StartFrom};
use sless_queue::{ConnectionStatus, Connector, QueueError, Received, SourceConfig, connector};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

fn mock() -> &'static KafkaMock {
    static MOCK: OnceLock<KafkaMock> = OnceLock::new();
    MOCK.get_or_init(|| KafkaMock::start().expect("kcat's mock cluster starts"))
}

fn unique(prefix: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    )
}

fn config(topic: &str, group: &str, start_from: StartFrom) -> SourceConfig {
    SourceConfig {
        kind: QueueKind::Kafka,
        url: mock().url(),
        topic: topic.to_string(),
        group: group.to_string(),
        start_from,
        prefetch: 100,
        label: format!("test/{group}"),
    }
}

struct Running {
    connector: Arc<dyn Connector>,
    status: Arc<ConnectionStatus>,
    rx: mpsc::Receiver<Received>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    async fn start(config: SourceConfig) -> Self {
        let connector = connector(config).expect("a valid source");
        let status = Arc::new(ConnectionStatus::default());
        let (tx, rx) = mpsc::channel(1024);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(connector.clone().run(tx, status.clone(), shutdown.clone()));
        let running = Self {
            connector,
            status,
            rx,
            shutdown,
            task,
        };
        running.wait_connected().await;
        running
    }

    async fn wait_connected(&self) {
        tokio::time::timeout(WAIT, async {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            while self.status.state() != ConnectionState::Connected {
                tick.tick().await;
            }
        })
        .await
        .expect("the connector reports connected");
    }

    async fn wait_lag(&self, lag: u64) {
        tokio::time::timeout(WAIT, async {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            while self.status.lag() != Some(lag) {
                tick.tick().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("lag {lag}, not {:?}", self.status.lag()));
    }

    async fn next(&mut self) -> Received {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("a message in time")
            .expect("the connector runs")
    }

    async fn take(&mut self, n: usize) -> Vec<Received> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            out.push(self.next().await);
        }
        out
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the connector stops")
            .expect("the connector does not panic");
    }
}

fn producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", mock().bootstrap())
        .create()
        .expect("a producer")
}

/// Publishes `payloads` in order, all with `key` (so all on one partition, in order).
async fn produce(topic: &str, key: &str, payloads: &[String]) {
    let p = producer();
    for payload in payloads {
        p.send(
            FutureRecord::to(topic).key(key).payload(payload.as_str()),
            Duration::from_secs(10),
        )
        .await
        .expect("produced");
    }
}

fn payloads(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn text(r: &Received) -> String {
    String::from_utf8_lossy(&r.message.payload).into_owned()
}

async fn ack(r: Received) {
    r.ack.ack().await.expect("acked");
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_messages_are_not_delivered_again_after_a_restart() {
    let (topic, group) = (unique("acked"), unique("g"));
    let mut c = Running::start(config(&topic, &group, StartFrom::Latest)).await;
    produce(&topic, "k", &payloads("m", 5)).await;
    let got = c.take(5).await;
    assert_eq!(got.iter().map(text).collect::<Vec<_>>(), payloads("m", 5));
    for r in got {
        ack(r).await;
    }
    c.stop().await;

    produce(&topic, "k", &["after".to_string()]).await;
    let mut c = Running::start(config(&topic, &group, StartFrom::Latest)).await;
    assert_eq!(text(&c.next().await), "after");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unacknowledged_messages_are_delivered_again_after_a_restart() {
    let (topic, group) = (unique("unacked"), unique("g"));
    let mut c = Running::start(config(&topic, &group, StartFrom::Latest)).await;
    produce(&topic, "k", &payloads("m", 3)).await;
    let first = c.take(3).await;
    let ids: Vec<String> = first.iter().map(|r| r.message.id.clone()).collect();
    drop(first);
    c.stop().await;

    let mut c = Running::start(config(&topic, &group, StartFrom::Latest)).await;
    let again = c.take(3).await;
    assert_eq!(again.iter().map(text).collect::<Vec<_>>(), payloads("m", 3));
    // Same message, same id: a duplicate is visible as such.
    assert_eq!(
        again
            .iter()
            .map(|r| r.message.id.clone())
            .collect::<Vec<_>>(),
        ids
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn out_of_order_acks_never_commit_past_an_unacknowledged_offset() {
    let (topic, group) = (unique("ooo"), unique("g"));
    let mut c = Running::start(config(&topic, &group, StartFrom::Latest)).await;
    produce(&topic, "k", &payloads("m", 6)).await;
    let mut got = c.take(6).await;
    // m-3 never finishes; the others finish in reverse order.
    let unfinished = got.remove(3);
    while let Some(r) = got.pop() {
        ack(r).await;
    }
    drop(unfinished);
    c.stop().await;

    let mut c = Running::start(config(&topic, &group, StartFrom::Latest)).await;
    // Resumes exactly at the unfinished message: nothing before it again, nothing skipped.
    let again = c.take(3).await;
    assert_eq!(
        again.iter().map(text).collect::<Vec<_>>(),
        vec!["m-3", "m-4", "m-5"]
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_group_reading_from_latest_gets_everything_published_after_connected() {
    let (topic, group) = (unique("latest"), unique("g"));
    // Something already there is not read by a new group starting from the latest.
    produce(&topic, "k", &["before".to_string()]).await;
    let c = Running::start(config(&topic, &group, StartFrom::Latest)).await;
    // Connected, then stopped before reading anything: the position is kept, so
    // what is published while the consumer is away is read when it is back.
    c.stop().await;
    produce(&topic, "k", &["while-away".to_string()]).await;
    let mut c = Running::start(config(&topic, &group, StartFrom::Latest)).await;
    assert_eq!(text(&c.next().await), "while-away");
    // And right after `connected`, nothing is skipped.
    produce(&topic, "k", &["right-after".to_string()]).await;
    assert_eq!(text(&c.next().await), "right-after");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lag_counts_what_is_not_finished_yet() {
    let (topic, group) = (unique("lag"), unique("g"));
    let mut c = Running::start(config(&topic, &group, StartFrom::Latest)).await;
    produce(&topic, "k", &payloads("m", 5)).await;
    let got = c.take(5).await;
    c.wait_lag(5).await;
    for r in got {
        ack(r).await;
    }
    c.wait_lag(0).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_group_reading_from_earliest_gets_what_is_already_there() {
    let (topic, group) = (unique("earliest"), unique("g"));
    produce(&topic, "k", &payloads("old", 3)).await;
    let mut c = Running::start(config(&topic, &group, StartFrom::Earliest)).await;
    let got = c.take(3).await;
    assert_eq!(got.iter().map(text).collect::<Vec<_>>(), payloads("old", 3));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_carry_key_partition_offset_headers_and_timestamp() {
    let (topic, group) = (unique("meta"), unique("g"));
    let mut c = Running::start(config(&topic, &group, StartFrom::Latest)).await;
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "trace",
            value: Some("abc"),
        })
        .insert(Header {
            key: "empty",
            value: None::<&str>,
        });
    let delivery = producer()
        .send(
            FutureRecord::to(&topic)
                .key("order-7")
                .payload("{\"n\":1}")
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .expect("produced");
    let (partition, offset) = (delivery.partition, delivery.offset);
    let r = c.next().await;
    let m = &r.message;
    assert_eq!(m.id, format!("{topic}/{partition}/{offset}"));
    assert_eq!(m.topic, topic);
    assert_eq!(m.key.as_deref(), Some("order-7"));
    assert_eq!((m.partition, m.offset), (Some(partition), Some(offset)));
    assert_eq!(
        m.headers,
        vec![
            ("trace".to_string(), "abc".to_string()),
            ("empty".to_string(), String::new())
        ]
    );
    let age = chrono::Utc::now() - m.published_at.expect("a timestamp");
    assert!(
        age.num_seconds().abs() < 60,
        "published_at is recent: {age}"
    );
    assert!(!m.redelivered);
    assert_eq!(&m.payload[..], b"{\"n\":1}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_reaches_a_plain_consumer_with_its_headers() {
    let (topic, group) = (unique("in"), unique("g"));
    let out = unique("out");
    let c = Running::start(config(&topic, &group, StartFrom::Latest)).await;
    c.connector
        .publish(
            &out,
            Bytes::from_static(b"result"),
            &[("x-sless-original-topic".to_string(), topic.clone())],
        )
        .await
        .expect("published");

    let plain: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", mock().bootstrap())
        .set("group.id", unique("plain"))
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("a consumer");
    plain.subscribe(&[&out]).expect("subscribed");
    let m = tokio::time::timeout(WAIT, plain.recv())
        .await
        .expect("a message in time")
        .expect("a message");
    assert_eq!(m.payload(), Some(&b"result"[..]));
    let h = m.headers().expect("headers").get(0);
    assert_eq!(h.key, "x-sless-original-topic");
    assert_eq!(h.value, Some(topic.as_bytes()));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_that_is_not_there_is_not_an_error() {
    let port = sless_brokers::free_port().expect("a port");
    let mut cfg = config("t", &unique("g"), StartFrom::Latest);
    cfg.url = format!("kafka://127.0.0.1:{port}");
    let connector = connector(cfg).expect("a broker being down is no configuration error");
    let status = Arc::new(ConnectionStatus::default());
    let (tx, _rx) = mpsc::channel(1);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(connector.clone().run(tx, status.clone(), shutdown.clone()));
    tokio::time::timeout(WAIT, async {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        while status.last_error().is_none() {
            tick.tick().await;
        }
    })
    .await
    .expect("the outage is reported");
    assert_eq!(status.state(), ConnectionState::Connecting);
    shutdown.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("stops")
        .expect("no panic");
}

#[test]
fn invalid_urls_are_configuration_errors() {
    let mut cfg = config("t", "g", StartFrom::Latest);
    cfg.url = "kafka://".into();
    assert!(matches!(connector(cfg), Err(QueueError::Config(_))));
}

#[tokio::test(flavor = "multi_thread")]
async fn throughput_of_the_connector_alone() {
    const N: usize = 10_000;
    let (topic, group) = (unique("bulk"), unique("g"));
    let p = producer();
    let sends: Vec<_> = (0..N)
        .map(|i| {
            let payload = format!("{{\"i\":{i}}}");
            let key = format!("k{}", i % 16);
            let p = p.clone();
            let topic = topic.clone();
            async move {
                p.send(
                    FutureRecord::to(&topic).key(&key).payload(&payload),
                    Duration::from_secs(30),
                )
                .await
                .map(|_| ())
                .map_err(|(e, _)| e)
            }
        })
        .collect();
    for r in futures_join_all(sends).await {
        r.expect("produced");
    }
    let mut c = Running::start(config(&topic, &group, StartFrom::Earliest)).await;
    let started = Instant::now();
    let mut seen = std::collections::HashSet::new();
    while seen.len() < N {
        let r = c.next().await;
        seen.insert(r.message.id.clone());
        ack(r).await;
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "kafka connector: {N} messages received and acked in {secs:.2} s = {:.0} msg/s",
        N as f64 / secs
    );
    c.stop().await;
}

/// Awaits all futures, concurrently, in order.
async fn futures_join_all<F: std::future::Future + Send + 'static>(fs: Vec<F>) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("no panic"));
    }
    out
}
