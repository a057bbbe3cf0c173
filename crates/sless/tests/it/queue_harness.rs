//! Queue triggers end to end: real brokers (started once per test binary, or per
//! test where the test stops them), a publisher and a reader that speak each
//! broker's own protocol (the connectors of `sless-queue`, outside the server), and a
//! Python function whose log says which messages it handled.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use sless_core::{QueueKind, StartFrom};
use sless_queue::{ConnectionStatus, Connector, Message, Received, SourceConfig};
use tokio::sync::{Mutex, OnceCell, mpsc};
use tokio_util::sync::CancellationToken;

use crate::harness::{Server, send};

/// How long any one wait in these tests may take.
pub const WAIT: Duration = Duration::from_secs(90);

/// The function every queue test deploys. JSON objects with `n` are logged as
/// `got RUN N` (after sleeping `sleep` seconds when the event says so); anything
/// else as `raw <event as JSON>`. `{"fail": 400}` answers 400
/// (a failure without retry); `{"raise": ...}` raises. A Kafka message's partition is
/// logged as `partition RUN N P` beside it.
pub const HANDLER: &str = r#"import json
import time

def handle(event, context):
    message = getattr(context, "message", None) or {}
    if isinstance(event, dict) and "n" in event and message.get("partition") is not None:
        print("partition %s %s %s" % (event.get("run"), event["n"], message["partition"]))
    if isinstance(event, dict) and "sleep" in event:
        time.sleep(event["sleep"])
    if isinstance(event, dict) and event.get("fail") == 400:
        print("refused %s" % event.get("n"))
        return {"statusCode": 400, "body": "refused"}
    if isinstance(event, dict) and "raise" in event:
        print("raising %s" % event.get("n"))
        raise RuntimeError("poison %s" % event.get("n"))
    if isinstance(event, dict) and "n" in event:
        print("got %s %s" % (event.get("run"), event["n"]))
    else:
        print("raw %s" % json.dumps(event, sort_keys=True))
    return {"handled": event}
"#;

/// A broker a test can reach, stop and start again.
pub trait TestBroker: Send + Sync {
    fn kind(&self) -> QueueKind;
    fn url(&self) -> String;
    /// Starts it (again), on the same port with the same data; blocks until it serves.
    fn restart(&self);
    /// Stops it gracefully (the scenarios stop brokers through `restart`; kept for
    /// tests of a broker that stays away).
    #[allow(dead_code)]
    fn stop(&self);
}

impl TestBroker for sless_brokers::RabbitMq {
    fn kind(&self) -> QueueKind {
        QueueKind::Amqp
    }
    fn url(&self) -> String {
        sless_brokers::RabbitMq::url(self)
    }
    fn restart(&self) {
        sless_brokers::RabbitMq::restart(self).expect("rabbitmq starts");
    }
    fn stop(&self) {
        sless_brokers::RabbitMq::stop(self);
    }
}

impl TestBroker for sless_brokers::Nats {
    fn kind(&self) -> QueueKind {
        QueueKind::Nats
    }
    fn url(&self) -> String {
        sless_brokers::Nats::url(self)
    }
    fn restart(&self) {
        sless_brokers::Nats::restart(self).expect("nats-server starts");
    }
    fn stop(&self) {
        sless_brokers::Nats::stop(self);
    }
}

/// mosquitto behind a lock: its stop and start take `&mut`.
pub struct Mqtt {
    broker: std::sync::Mutex<sless_brokers::Mosquitto>,
    url: String,
}

impl Mqtt {
    fn lock(&self) -> std::sync::MutexGuard<'_, sless_brokers::Mosquitto> {
        self.broker.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl TestBroker for Mqtt {
    fn kind(&self) -> QueueKind {
        QueueKind::Mqtt
    }
    fn url(&self) -> String {
        self.url.clone()
    }
    fn restart(&self) {
        let mut b = self.lock();
        b.stop().expect("mosquitto stops");
        b.start_again().expect("mosquitto starts");
    }
    fn stop(&self) {
        self.lock().stop().expect("mosquitto stops");
    }
}

/// librdkafka's mock cluster (`kcat`): always running, and it cannot be restarted (it
/// keeps everything in memory), so the broker-restart scenarios do not run on Kafka.
#[cfg(feature = "kafka")]
pub struct Kafka {
    broker: sless_brokers::KafkaMock,
}

#[cfg(feature = "kafka")]
impl TestBroker for Kafka {
    fn kind(&self) -> QueueKind {
        QueueKind::Kafka
    }
    fn url(&self) -> String {
        self.broker.url()
    }
    /// The mock runs from its start; there is nothing to start again.
    fn restart(&self) {}
    fn stop(&self) {
        panic!("librdkafka's mock cluster cannot be stopped and started again");
    }
}

/// What the scenarios run against: a broker kind, and for MQTT the protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Amqp,
    Kafka,
    /// MQTT 3.1.1.
    Mqtt,
    /// MQTT 5 (`?version=5` on the URL), against the same mosquitto.
    Mqtt5,
    Nats,
}

impl Source {
    pub fn kind(self) -> QueueKind {
        match self {
            Source::Amqp => QueueKind::Amqp,
            Source::Kafka => QueueKind::Kafka,
            Source::Mqtt | Source::Mqtt5 => QueueKind::Mqtt,
            Source::Nats => QueueKind::Nats,
        }
    }

    /// Whether published headers reach a reader: every protocol but MQTT 3.1.1.
    pub fn has_headers(self) -> bool {
        self != Source::Mqtt
    }
}

/// A mosquitto spoken to in MQTT 5: the same broker, its URL asking for version 5.
pub struct Mqtt5(Arc<dyn TestBroker>);

impl TestBroker for Mqtt5 {
    fn kind(&self) -> QueueKind {
        QueueKind::Mqtt
    }
    fn url(&self) -> String {
        format!("{}?version=5", self.0.url())
    }
    fn restart(&self) {
        self.0.restart();
    }
    fn stop(&self) {
        self.0.stop();
    }
}

/// A broker for `source` not started yet (for tests that stop or start it themselves).
pub async fn own_broker(source: Source) -> Arc<dyn TestBroker> {
    let kind = source.kind();
    let broker = tokio::task::spawn_blocking(move || -> Arc<dyn TestBroker> {
        match kind {
            QueueKind::Amqp => Arc::new(sless_brokers::RabbitMq::prepare().expect("rabbitmq")),
            QueueKind::Nats => Arc::new(sless_brokers::Nats::prepare().expect("nats")),
            QueueKind::Mqtt => {
                // mosquitto has no "prepared" state: started once for its port and
                // data directory, then stopped.
                let mut b = sless_brokers::Mosquitto::start().expect("mosquitto");
                b.stop().expect("mosquitto stops");
                let url = b.url();
                Arc::new(Mqtt {
                    broker: std::sync::Mutex::new(b),
                    url,
                })
            }
            #[cfg(feature = "kafka")]
            QueueKind::Kafka => Arc::new(Kafka {
                broker: sless_brokers::KafkaMock::start().expect("kafka mock"),
            }),
            #[cfg(not(feature = "kafka"))]
            QueueKind::Kafka => panic!("this build has no Kafka support (feature `kafka`)"),
        }
    })
    .await
    .expect("prepare broker");
    if source == Source::Mqtt5 {
        return Arc::new(Mqtt5(broker));
    }
    broker
}

/// The broker of `kind` every test that leaves it running shares (started once per
/// test binary: RabbitMQ alone takes ~13 s).
pub async fn shared_broker(source: Source) -> Arc<dyn TestBroker> {
    let kind = source.kind();
    // MQTT 5 shares the MQTT 3.1.1 broker; only the URL differs.
    let base = if source == Source::Mqtt5 {
        Source::Mqtt
    } else {
        source
    };
    static AMQP: OnceCell<Arc<dyn TestBroker>> = OnceCell::const_new();
    static NATS: OnceCell<Arc<dyn TestBroker>> = OnceCell::const_new();
    static MQTT: OnceCell<Arc<dyn TestBroker>> = OnceCell::const_new();
    static KAFKA: OnceCell<Arc<dyn TestBroker>> = OnceCell::const_new();
    let cell = match kind {
        QueueKind::Amqp => &AMQP,
        QueueKind::Nats => &NATS,
        QueueKind::Mqtt => &MQTT,
        QueueKind::Kafka => &KAFKA,
    };
    let broker = cell
        .get_or_init(|| async move {
            let broker = own_broker(base).await;
            let b = broker.clone();
            tokio::task::spawn_blocking(move || b.restart())
                .await
                .expect("start broker");
            broker
        })
        .await
        .clone();
    if source == Source::Mqtt5 {
        return Arc::new(Mqtt5(broker));
    }
    broker
}

/// A unique name for this test's topics and runs.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand_u32())
}

fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).expect("random");
    u32::from_le_bytes(b)
}

/// A client of the broker outside the server: publishes, and reads one topic.
pub struct Client {
    connector: Arc<dyn Connector>,
    status: Arc<ConnectionStatus>,
    received: Mutex<mpsc::Receiver<Received>>,
    stop: CancellationToken,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Client {
    /// A client reading `topic` (a queue, topic or subject of its own when the test
    /// only publishes) from the earliest message its group has not consumed.
    pub async fn connect(broker: &dyn TestBroker, topic: &str) -> Client {
        let config = SourceConfig {
            kind: broker.kind(),
            url: broker.url(),
            topic: topic.to_string(),
            group: unique("test-reader"),
            start_from: StartFrom::Earliest,
            prefetch: 256,
            label: format!("test/{topic}"),
        };
        let connector = sless_queue::connector(config).expect("connector");
        let status = Arc::new(ConnectionStatus::default());
        let (tx, rx) = mpsc::channel(1024);
        let stop = CancellationToken::new();
        tokio::spawn(connector.clone().run(tx, status.clone(), stop.clone()));
        let client = Client {
            connector,
            status,
            received: Mutex::new(rx),
            stop,
        };
        client.wait_connected().await;
        client
    }

    async fn wait_connected(&self) {
        let deadline = Instant::now() + WAIT;
        while self.status.state() != sless_core::ConnectionState::Connected {
            assert!(
                Instant::now() < deadline,
                "test client never connected: {:?}",
                self.status.last_error()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Publishes, retrying (bounded) while the broker is away.
    pub async fn publish(&self, topic: &str, payload: impl Into<Bytes>) {
        let payload = payload.into();
        let deadline = Instant::now() + WAIT;
        loop {
            match self.connector.publish(topic, payload.clone(), &[]).await {
                Ok(()) => return,
                Err(e) => assert!(Instant::now() < deadline, "cannot publish: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `{"run": run, "n": i}` for every `i` in `range`, in order.
    pub async fn publish_run(&self, topic: &str, run: &str, range: std::ops::Range<u32>) {
        for n in range {
            self.publish(topic, json!({"run": run, "n": n}).to_string())
                .await;
        }
    }

    /// The next message on the client's topic (acknowledged).
    pub async fn next(&self) -> Message {
        let mut rx = self.received.lock().await;
        let r = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("a message in time")
            .expect("client running");
        let message = r.message.clone();
        r.ack.ack().await.expect("ack");
        message
    }
}

/// A server with the test function deployed and queue triggers created through the API.
pub struct Setup {
    pub server: Server,
    pub function: String,
}

impl Setup {
    pub async fn new(function: &str) -> Setup {
        // No generic instances: the tests share two cores with their brokers.
        let server = Server::start_with(&["--prewarm", "0"]).await;
        server
            .deploy(
                function,
                json!({"runtime": "python3", "min_instances": 0, "network": "none"}),
                &[("handler.py", HANDLER)],
            )
            .await;
        Setup {
            server,
            function: function.to_string(),
        }
    }

    /// Creates a queue trigger on `topic` of `broker`; `extra` adds or replaces fields.
    pub async fn trigger(&self, name: &str, broker: &dyn TestBroker, topic: &str, extra: Value) {
        let mut body = json!({
            "name": name, "function": self.function, "type": "queue",
            "source": {"kind": broker.kind().as_str(), "url": broker.url(), "topic": topic,
                       "start_from": "earliest"},
            "delivery": {"backoff_initial_ms": 50, "backoff_max_ms": 400}
        });
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let (status, t) = send(
            &self.server,
            reqwest::Method::POST,
            "/v1/namespaces/default/triggers",
            Some(body),
        )
        .await;
        assert_eq!(status, 201, "{t}");
    }

    pub async fn trigger_status(&self, name: &str) -> Value {
        let (status, t) = send(
            &self.server,
            reqwest::Method::GET,
            &format!("/v1/namespaces/default/triggers/{name}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{t}");
        t["status"].clone()
    }

    /// Waits (bounded) until the trigger's consumer is subscribed and positioned.
    pub async fn wait_connected(&self, name: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let status = self.trigger_status(name).await;
            if status["connection"] == "connected" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "trigger {name} never connected: {status}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The function's log lines.
    pub async fn log(&self) -> String {
        self.server
            .client
            .logs("default", &self.function, Some(100_000))
            .await
            .expect("logs")
    }

    /// How many times the function logged handling each `n` of `run`.
    pub async fn handled(&self, run: &str) -> BTreeMap<u32, usize> {
        let needle = format!("got {run} ");
        let mut seen = BTreeMap::new();
        for line in self.log().await.lines() {
            if let Some(rest) = line.split(&needle).nth(1)
                && let Ok(n) = rest.trim().parse::<u32>()
            {
                *seen.entry(n).or_insert(0) += 1;
            }
        }
        seen
    }

    /// Waits (bounded) until every `n` in `range` of `run` was handled at least
    /// once (at-least-once: a message may be handled again after a restart), and
    /// returns the counts.
    pub async fn wait_handled(
        &self,
        run: &str,
        range: std::ops::Range<u32>,
    ) -> BTreeMap<u32, usize> {
        let deadline = Instant::now() + WAIT;
        loop {
            let seen = self.handled(run).await;
            if range.clone().all(|n| seen.contains_key(&n)) {
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "run {run}: {} of {} handled; missing {:?}",
                range.clone().filter(|n| seen.contains_key(n)).count(),
                range.len(),
                range
                    .clone()
                    .filter(|n| !seen.contains_key(n))
                    .take(20)
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The function's invocation records from queue triggers (newest first).
    pub async fn queue_invocations(&self, limit: u32) -> Vec<sless_client::Invocation> {
        self.server
            .client
            .list_invocations(
                "default",
                &sless_client::InvocationQuery {
                    function: Some(self.function.clone()),
                    source: Some("queue".into()),
                    limit: Some(limit),
                    ..Default::default()
                },
            )
            .await
            .expect("invocations")
    }
}
