//! The AMQP connector against a real RabbitMQ (Debian's rabbitmq-server), started once
//! for this test binary; the tests that stop the broker start their own. Every test
//! reads its own queue, so they run side by side.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use sless_brokers::RabbitMq;
use sless_core::{ConnectionState, QueueKind, StartFrom};
use sless_queue::{ConnectionStatus, Connector, Received, SourceConfig, connector};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Every wait in these tests is bounded by this: a failing test fails, it does not hang.
const WAIT: Duration = Duration::from_secs(60);

fn broker() -> &'static RabbitMq {
    static BROKER: OnceLock<RabbitMq> = OnceLock::new();
    BROKER.get_or_init(|| RabbitMq::start().expect("rabbitmq-server starts"))
}

fn config(url: &str, queue: &str) -> SourceConfig {
    SourceConfig {
        kind: QueueKind::Amqp,
        url: url.to_owned(),
        topic: queue.to_owned(),
        group: format!("sless-test-{queue}"),
        start_from: StartFrom::Latest,
        prefetch: 64,
        label: format!("test/{queue}"),
    }
}

/// A running connector, as the delivery engine would hold it.
struct Running {
    connector: Arc<dyn Connector>,
    status: Arc<ConnectionStatus>,
    rx: mpsc::Receiver<Received>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    fn start(config: SourceConfig) -> Running {
        let connector = connector(config).expect("a valid source");
        let status = Arc::new(ConnectionStatus::default());
        let (tx, rx) = mpsc::channel(16);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(connector.clone().run(tx, status.clone(), shutdown.clone()));
        Running {
            connector,
            status,
            rx,
            shutdown,
            task,
        }
    }

    async fn connected(self) -> Running {
        until("the connector is connected", || {
            self.status.state() == ConnectionState::Connected
        })
        .await;
        self
    }

    async fn next(&mut self) -> Received {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("a message arrives in time")
            .expect("the connector is running")
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the connector stops in time")
            .expect("the connector does not panic");
    }
}

/// Waits (bounded) until `done` holds, looking every 20 ms.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A plain client's confirm-mode channel, as any other publisher would have.
async fn plain_channel(url: &str) -> (Connection, Channel) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("a plain client connects");
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm mode");
    (connection, channel)
}

async fn declare(channel: &Channel, queue: &str) {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .expect("queue declared");
}

/// Publishes persistently and waits for the broker's confirm.
async fn publish(channel: &Channel, queue: &str, payload: &[u8], properties: BasicProperties) {
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            payload,
            properties.with_delivery_mode(2),
        )
        .await
        .expect("published")
        .await
        .expect("confirmed");
    assert!(confirm.is_ack(), "the broker took the message");
}

async fn publish_all(url: &str, queue: &str, payloads: &[&str]) {
    let (connection, channel) = plain_channel(url).await;
    declare(&channel, queue).await;
    for payload in payloads {
        publish(
            &channel,
            queue,
            payload.as_bytes(),
            BasicProperties::default(),
        )
        .await;
    }
    let _ = connection.close(200, "done".into()).await;
}

fn text(received: &Received) -> String {
    String::from_utf8_lossy(&received.message.payload).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn delivered_and_acked_messages_are_not_delivered_again() {
    let url = broker().url();
    let queue = "acked";
    let running = Running::start(config(&url, queue)).connected().await;
    let mut running = running;
    publish_all(&url, queue, &["one", "two", "three"]).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let received = running.next().await;
        seen.push(text(&received));
        assert!(!received.message.redelivered);
        assert_eq!(received.message.key.as_deref(), Some(queue));
        received.ack.ack().await.expect("acked");
    }
    assert_eq!(seen, ["one", "two", "three"]);
    running.stop().await;

    let mut again = Running::start(config(&url, queue)).connected().await;
    publish_all(&url, queue, &["four"]).await;
    let received = again.next().await;
    assert_eq!(text(&received), "four", "acked messages do not come back");
    received.ack.ack().await.expect("acked");
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_not_acked_is_redelivered_to_the_next_connector() {
    let url = broker().url();
    let queue = "unacked";
    let mut running = Running::start(config(&url, queue)).connected().await;
    publish_all(&url, queue, &["done", "pending"]).await;
    let done = running.next().await;
    let pending = running.next().await;
    assert_eq!(
        (text(&done), text(&pending)),
        ("done".into(), "pending".into())
    );
    done.ack.ack().await.expect("acked");
    running.stop().await;
    // The connection it came on is gone: acking now fails, and the broker keeps it.
    assert!(pending.ack.ack().await.is_err());

    let mut again = Running::start(config(&url, queue)).connected().await;
    let redelivered = again.next().await;
    assert_eq!(text(&redelivered), "pending");
    assert!(redelivered.message.redelivered);
    redelivered.ack.ack().await.expect("acked");
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn properties_and_headers_arrive_with_the_message() {
    let url = broker().url();
    let queue = "headers";
    let mut running = Running::start(config(&url, queue)).connected().await;
    let (connection, channel) = plain_channel(&url).await;
    let mut headers = FieldTable::default();
    headers.insert(
        "tenant".into(),
        AMQPValue::LongString(LongString::from("acme")),
    );
    headers.insert("retries".into(), AMQPValue::LongInt(2));
    let properties = BasicProperties::default()
        .with_message_id("order-17".into())
        .with_timestamp(1_700_000_000)
        .with_headers(headers);
    publish(&channel, queue, br#"{"order":17}"#, properties).await;
    publish(&channel, queue, b"no id", BasicProperties::default()).await;

    let first = running.next().await;
    let message = &first.message;
    assert_eq!(message.id, "order-17");
    assert_eq!(message.topic, queue);
    assert_eq!(message.key.as_deref(), Some(queue));
    assert_eq!(message.payload, Bytes::from_static(br#"{"order":17}"#));
    assert_eq!(
        message.headers,
        [
            ("retries".into(), "2".into()),
            ("tenant".into(), "acme".into())
        ]
    );
    assert_eq!(
        message.published_at.map(|t| t.timestamp()),
        Some(1_700_000_000)
    );
    assert!(message.offset.is_some());
    let meta = message.meta(QueueKind::Amqp, 1);
    assert_eq!(meta["headers"]["tenant"], "acme");
    assert_eq!(meta["published_at"], "2023-11-14T22:13:20.000Z");

    let second = running.next().await;
    assert!(
        second.message.id.starts_with("amqp-"),
        "a fresh id: {}",
        second.message.id
    );
    assert_ne!(second.message.offset, first.message.offset);
    first.ack.ack().await.expect("acked");
    second.ack.ack().await.expect("acked");
    let _ = connection.close(200, "done".into()).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_reaches_a_plain_consumer_with_headers() {
    let url = broker().url();
    let running = Running::start(config(&url, "publisher-in"))
        .connected()
        .await;
    running
        .connector
        .publish(
            "publisher-out",
            Bytes::from_static(b"result"),
            &[("x-sless-original-topic".into(), "publisher-in".into())],
        )
        .await
        .expect("published and confirmed");

    let (connection, channel) = plain_channel(&url).await;
    let got = channel
        .basic_get("publisher-out".into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
        .expect("the message is in the queue");
    assert_eq!(got.delivery.data, b"result");
    assert_eq!(got.delivery.properties.delivery_mode(), &Some(2));
    let headers = got.delivery.properties.headers().clone().expect("headers");
    assert_eq!(
        headers.inner().get("x-sless-original-topic"),
        Some(&AMQPValue::LongString(LongString::from("publisher-in")))
    );
    let _ = connection.close(200, "done".into()).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_without_a_connection_fails() {
    let connector =
        connector(config("amqp://guest:guest@127.0.0.1:1/%2f", "nowhere")).expect("a valid source");
    let result = connector.publish("q", Bytes::new(), &[]).await;
    assert!(matches!(result, Err(sless_queue::QueueError::NotConnected)));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_existing_queue_of_another_type_is_used_as_it_is() {
    let url = broker().url();
    let (connection, channel) = plain_channel(&url).await;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    for queue in ["quorum-in", "quorum-out"] {
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::durable(),
                arguments.clone(),
            )
            .await
            .expect("a quorum queue");
    }
    let mut running = Running::start(config(&url, "quorum-in")).connected().await;
    publish(&channel, "quorum-in", b"q", BasicProperties::default()).await;
    let received = running.next().await;
    assert_eq!(text(&received), "q");
    received.ack.ack().await.expect("acked");
    running
        .connector
        .publish("quorum-out", Bytes::from_static(b"out"), &[])
        .await
        .expect("published to the existing queue");
    let got = channel
        .basic_get("quorum-out".into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
        .expect("the message is in the queue");
    assert_eq!(got.delivery.data, b"out");
    assert!(
        running.status.last_error().is_none(),
        "{:?}",
        running.status.last_error()
    );
    let _ = connection.close(200, "done".into()).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lag_is_the_number_of_messages_waiting_in_the_queue() {
    let url = broker().url();
    let queue = "lag";
    let mut config = config(&url, queue);
    config.prefetch = 1;
    let mut running = Running::start(config).connected().await;
    publish_all(&url, queue, &["1", "2", "3", "4", "5"]).await;
    // One is handed out (the prefetch), four wait in the broker.
    let first = running.next().await;
    until("the lag is read", || running.status.lag() == Some(4)).await;
    first.ack.ack().await.expect("acked");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_credentials_show_as_failed_and_are_retried() {
    let url = broker().url().replace("guest:guest", "guest:wrong");
    let running = Running::start(config(&url, "refused"));
    until("the source shows as failed", || {
        running.status.state() == ConnectionState::Failed
    })
    .await;
    let error = running.status.last_error().expect("the reason");
    assert!(!error.contains("wrong"), "no password in {error}");
    assert!(!running.task.is_finished(), "it keeps retrying");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_down_at_start_is_waited_for() {
    let broker = Arc::new(RabbitMq::prepare().expect("ports and directories"));
    let queue = "late-broker";
    let running = Running::start(config(&broker.url(), queue));
    until("a connection attempt failed", || {
        running.status.last_error().is_some()
    })
    .await;
    assert_eq!(running.status.state(), ConnectionState::Connecting);

    let starting = broker.clone();
    tokio::task::spawn_blocking(move || starting.restart())
        .await
        .expect("no panic")
        .expect("rabbitmq-server starts");
    let mut running = running.connected().await;
    publish_all(&broker.url(), queue, &["hello"]).await;
    let received = running.next().await;
    assert_eq!(text(&received), "hello");
    received.ack.ack().await.expect("acked");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_restart_mid_stream_loses_nothing() {
    restart_mid_stream(false).await;
}

/// Killed with SIGKILL, as a crash: what it confirmed is on disk all the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_crash_mid_stream_loses_nothing() {
    restart_mid_stream(true).await;
}

/// Publishes N messages with confirms while the rabbitmq-server restarts (gracefully, or
/// killed first), and checks every one of them is delivered at least once.
async fn restart_mid_stream(crash: bool) {
    const N: usize = 200;
    let broker = Arc::new(
        tokio::task::spawn_blocking(RabbitMq::start)
            .await
            .expect("no panic")
            .expect("rabbitmq-server starts"),
    );
    let url = broker.url();
    let queue = "restarted";
    let mut running = Running::start(config(&url, queue)).connected().await;

    // The publisher retries each message until the broker confirmed it, as a
    // careful producer does; the broker restarts once a quarter is through.
    let (confirmed_tx, mut confirmed_rx) = mpsc::unbounded_channel::<usize>();
    let publisher = tokio::spawn({
        let url = url.clone();
        async move {
            let mut channel: Option<(Connection, Channel)> = None;
            for i in 0..N {
                let payload = format!("m{i}");
                loop {
                    if channel.is_none() {
                        channel = try_channel(&url, queue).await;
                    }
                    let Some((_, ch)) = &channel else {
                        // The broker is restarting: a producer's retry pause.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    let confirmed = match ch
                        .basic_publish(
                            "".into(),
                            queue.into(),
                            BasicPublishOptions::default(),
                            payload.as_bytes(),
                            BasicProperties::default().with_delivery_mode(2),
                        )
                        .await
                    {
                        Ok(confirm) => matches!(confirm.await, Ok(c) if c.is_ack()),
                        Err(_) => false,
                    };
                    if confirmed {
                        break;
                    }
                    channel = None;
                }
                let _ = confirmed_tx.send(i);
            }
        }
    });

    let restarter = tokio::spawn({
        let broker = broker.clone();
        async move {
            let mut confirmed = 0;
            while confirmed < N / 4 {
                confirmed_rx.recv().await.expect("the publisher runs");
                confirmed += 1;
            }
            tokio::task::spawn_blocking(move || {
                if crash {
                    broker.kill();
                }
                broker.restart()
            })
            .await
            .expect("no panic")
            .expect("rabbitmq-server restarts");
        }
    });

    let mut distinct = HashSet::new();
    let mut deliveries = 0;
    let deadline = Instant::now() + Duration::from_secs(180);
    while distinct.len() < N {
        let left = deadline.saturating_duration_since(Instant::now());
        let received = tokio::time::timeout(left, running.rx.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {N} delivered", distinct.len()))
            .expect("the connector runs");
        deliveries += 1;
        distinct.insert(text(&received));
        // An ack on the connection the restart cut fails; the broker redelivers.
        let _ = received.ack.ack().await;
    }
    tokio::time::timeout(WAIT, restarter)
        .await
        .expect("restarted in time")
        .expect("no panic");
    tokio::time::timeout(WAIT, publisher)
        .await
        .expect("published in time")
        .expect("no panic");
    assert_eq!(distinct.len(), N);
    assert!(deliveries >= N);
    assert!(
        running.status.last_error().is_some(),
        "the restart cut the connection and the connector came back"
    );
    assert_eq!(running.status.state(), ConnectionState::Connected);
    running.stop().await;
}

/// A confirm-mode channel with `queue` declared, or `None` while the broker is away.
async fn try_channel(url: &str, queue: &str) -> Option<(Connection, Channel)> {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .ok()?;
    let channel = connection.create_channel().await.ok()?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .ok()?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .ok()?;
    Some((connection, channel))
}

/// Not a timed assertion: the figure is printed (`--nocapture`) for the record.
#[tokio::test(flavor = "multi_thread")]
async fn throughput_through_the_connector() {
    const N: usize = 10_000;
    let url = broker().url();
    let queue = "throughput";
    let mut config = config(&url, queue);
    config.prefetch = 256;
    let connector = connector(config).expect("a valid source");
    let status = Arc::new(ConnectionStatus::default());
    let (tx, mut rx) = mpsc::channel(256);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(connector.clone().run(tx, status.clone(), shutdown.clone()));
    until("connected", || status.state() == ConnectionState::Connected).await;

    let (connection, channel) = plain_channel(&url).await;
    let started = Instant::now();
    let mut confirms = futures::stream::FuturesUnordered::new();
    for i in 0..N {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("published");
        confirms.push(confirm);
    }
    let published = started.elapsed();
    let mut acks = futures::stream::FuturesUnordered::new();
    let mut received = 0;
    while received < N {
        tokio::select! {
            Some(_) = confirms.next(), if !confirms.is_empty() => {}
            Some(result) = acks.next(), if !acks.is_empty() => {
                let result: Result<(), sless_queue::QueueError> = result;
                result.expect("acked");
            }
            message = tokio::time::timeout(WAIT, rx.recv()) => {
                let message = message.expect("messages keep coming").expect("running");
                received += 1;
                acks.push(message.ack.ack());
            }
        }
    }
    while let Some(result) = acks.next().await {
        result.expect("acked");
    }
    let elapsed = started.elapsed();
    println!(
        "amqp: {N} messages published in {published:?}, consumed and acked through the connector in {elapsed:?}: {:.0} msg/s",
        N as f64 / elapsed.as_secs_f64()
    );
    shutdown.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("stops")
        .expect("no panic");

    // The same with a plain client on a queue of its own: the broker's own rate,
    // to see what the connector costs.
    let plain_queue = "throughput-plain";
    declare(&channel, plain_queue).await;
    let consume_channel = connection.create_channel().await.expect("a channel");
    consume_channel
        .basic_qos(256, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = consume_channel
        .basic_consume(
            plain_queue.into(),
            "plain".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consuming");
    let started = Instant::now();
    let mut confirms = futures::stream::FuturesUnordered::new();
    for i in 0..N {
        let confirm = channel
            .basic_publish(
                "".into(),
                plain_queue.into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("published");
        confirms.push(confirm);
    }
    let mut acks = futures::stream::FuturesUnordered::new();
    let mut received = 0;
    while received < N {
        tokio::select! {
            Some(_) = confirms.next(), if !confirms.is_empty() => {}
            Some(result) = acks.next(), if !acks.is_empty() => {
                let result: lapin::Result<bool> = result;
                result.expect("acked");
            }
            delivery = tokio::time::timeout(WAIT, consumer.next()) => {
                let delivery = delivery.expect("messages keep coming").expect("consuming").expect("a delivery");
                received += 1;
                acks.push(async move { delivery.acker.ack(BasicAckOptions::default()).await });
            }
        }
    }
    while let Some(result) = acks.next().await {
        result.expect("acked");
    }
    let plain = started.elapsed();
    println!(
        "amqp: the same with a plain client: {plain:?}: {:.0} msg/s",
        N as f64 / plain.as_secs_f64()
    );
    let _ = connection.close(200, "done".into()).await;
}
