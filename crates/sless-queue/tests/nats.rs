//! The NATS JetStream connector against a real nats-server (Debian's 2.9.10), started
//! once for this test binary; the tests that stop the server start their own. Every
//! test reads its own subject, so they run side by side.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;
use sless_brokers::Nats;
use sless_core::{ConnectionState, QueueKind, StartFrom};
use sless_queue::{ConnectionStatus, Connector, Received, SourceConfig, connector};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Every wait in these tests is bounded by this: a failing test fails, it does not hang.
const WAIT: Duration = Duration::from_secs(60);

fn server() -> &'static Nats {
    static SERVER: OnceLock<Nats> = OnceLock::new();
    SERVER.get_or_init(|| Nats::start().expect("nats-server starts"))
}

fn config(url: &str, subject: &str, group: &str) -> SourceConfig {
    SourceConfig {
        kind: QueueKind::Nats,
        url: url.to_owned(),
        topic: subject.to_owned(),
        group: group.to_owned(),
        start_from: StartFrom::Latest,
        prefetch: 64,
        label: format!("test/{group}"),
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

/// A plain JetStream client, as any other publisher would have.
async fn plain(url: &str) -> jetstream::Context {
    jetstream::new(
        async_nats::connect(url)
            .await
            .expect("a plain client connects"),
    )
}

/// Publishes and waits for the stream's PubAck.
async fn publish_all(url: &str, subject: &str, payloads: &[&str]) {
    let js = plain(url).await;
    for payload in payloads {
        js.publish(subject.to_owned(), Bytes::from(payload.to_string()))
            .await
            .expect("published")
            .await
            .expect("acknowledged by the stream");
    }
}

fn text(received: &Received) -> String {
    String::from_utf8_lossy(&received.message.payload).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn delivered_and_acked_messages_are_not_delivered_again() {
    let url = server().url();
    let (subject, group) = ("acked", "g-acked");
    let mut running = Running::start(config(&url, subject, group))
        .connected()
        .await;
    publish_all(&url, subject, &["one", "two", "three"]).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let received = running.next().await;
        seen.push(text(&received));
        assert!(!received.message.redelivered);
        received.ack.ack().await.expect("acked");
    }
    assert_eq!(seen, ["one", "two", "three"]);
    running.stop().await;

    let mut again = Running::start(config(&url, subject, group))
        .connected()
        .await;
    publish_all(&url, subject, &["four"]).await;
    let received = again.next().await;
    assert_eq!(text(&received), "four", "acked messages do not come back");
    received.ack.ack().await.expect("acked");
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_not_acked_is_redelivered_to_the_next_connector() {
    let url = server().url();
    let (subject, group) = ("unacked", "g-unacked");
    let mut running = Running::start(config(&url, subject, group))
        .connected()
        .await;
    publish_all(&url, subject, &["done", "pending"]).await;
    let done = running.next().await;
    let pending = running.next().await;
    assert_eq!(
        (text(&done), text(&pending)),
        ("done".into(), "pending".into())
    );
    done.ack.ack().await.expect("acked");
    let pending_id = pending.message.id.clone();
    running.stop().await;
    drop(pending);

    let mut again = Running::start(config(&url, subject, group))
        .connected()
        .await;
    let redelivered = again.next().await;
    assert_eq!(text(&redelivered), "pending");
    // The same message keeps its id, so the duplicate is visible as such. (Its
    // `redelivered` flag is not asserted: nats-server 2.9 counts a message nak'd
    // while no pull request waits as delivered once.)
    assert_eq!(
        redelivered.message.id, pending_id,
        "the same message, the same id"
    );
    redelivered.ack.ack().await.expect("acked");
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_group_starts_from_latest_or_earliest() {
    let url = server().url();
    let subject = "positions";
    // The first connector creates the stream; then two messages go in before the
    // other two groups exist.
    Running::start(config(&url, subject, "g-creator"))
        .connected()
        .await
        .stop()
        .await;
    publish_all(&url, subject, &["old-1", "old-2"]).await;

    let mut latest = Running::start(config(&url, subject, "g-latest"))
        .connected()
        .await;
    let mut earliest_config = config(&url, subject, "g-earliest");
    earliest_config.start_from = StartFrom::Earliest;
    let mut earliest = Running::start(earliest_config).connected().await;
    publish_all(&url, subject, &["new"]).await;

    let first = latest.next().await;
    assert_eq!(text(&first), "new", "latest skips what came before");
    first.ack.ack().await.expect("acked");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let received = earliest.next().await;
        seen.push(text(&received));
        received.ack.ack().await.expect("acked");
    }
    assert_eq!(
        seen,
        ["old-1", "old-2", "new"],
        "earliest reads from the start"
    );
    latest.stop().await;
    earliest.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn subject_headers_and_metadata_arrive_with_the_message() {
    let url = server().url();
    let mut running = Running::start(config(&url, "hdr.*", "g-headers"))
        .connected()
        .await;
    let js = plain(&url).await;
    let mut headers = HeaderMap::new();
    headers.insert("tenant", "acme");
    headers.insert("trace", "t-1");
    let ack = js
        .publish_with_headers("hdr.eu", headers, Bytes::from_static(br#"{"order":17}"#))
        .await
        .expect("published")
        .await
        .expect("acknowledged");

    let received = running.next().await;
    let message = &received.message;
    assert_eq!(message.id, format!("{}:{}", ack.stream, ack.sequence));
    assert_eq!(message.topic, "hdr.*");
    assert_eq!(message.key.as_deref(), Some("hdr.eu"));
    assert_eq!(message.offset, i64::try_from(ack.sequence).ok());
    assert_eq!(
        message.headers,
        [
            ("tenant".into(), "acme".into()),
            ("trace".into(), "t-1".into())
        ]
    );
    assert_eq!(message.payload, Bytes::from_static(br#"{"order":17}"#));
    let published = message.published_at.expect("the server's timestamp");
    assert!((chrono::Utc::now() - published).num_seconds().abs() < 60);
    assert!(!message.redelivered);
    received.ack.ack().await.expect("acked");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_reaches_a_plain_subscriber_with_headers() {
    let url = server().url();
    let running = Running::start(config(&url, "publisher.in", "g-publisher"))
        .connected()
        .await;
    let client = async_nats::connect(&url).await.expect("connects");
    let mut subscriber = client.subscribe("publisher.out").await.expect("subscribed");
    client
        .flush()
        .await
        .expect("the subscription is registered");
    running
        .connector
        .publish(
            "publisher.out",
            Bytes::from_static(b"result"),
            &[("x-sless-original-topic".into(), "publisher.in".into())],
        )
        .await
        .expect("published and acknowledged by a stream");

    let got = tokio::time::timeout(WAIT, subscriber.next())
        .await
        .expect("arrives in time")
        .expect("subscribed");
    assert_eq!(got.payload, Bytes::from_static(b"result"));
    let headers = got.headers.expect("headers");
    assert_eq!(
        headers.get("x-sless-original-topic").map(|v| v.as_str()),
        Some("publisher.in")
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_without_a_connection_fails() {
    let connector =
        connector(config("nats://127.0.0.1:1", "nowhere", "g-nowhere")).expect("a valid source");
    let result = connector.publish("q", Bytes::new(), &[]).await;
    assert!(matches!(result, Err(sless_queue::QueueError::NotConnected)));
}

#[tokio::test(flavor = "multi_thread")]
async fn lag_is_the_number_of_messages_the_consumer_has_not_been_given() {
    let url = server().url();
    let subject = "lag";
    let mut config = config(&url, subject, "g-lag");
    config.prefetch = 1;
    let mut running = Running::start(config).connected().await;
    publish_all(&url, subject, &["1", "2", "3", "4", "5"]).await;
    // One is handed out (max_ack_pending), four wait in the stream.
    let first = running.next().await;
    until("the lag is read", || running.status.lag() == Some(4)).await;
    first.ack.ack().await.expect("acked");
    let second = running.next().await;
    assert_eq!(text(&second), "2");
    second.ack.ack().await.expect("acked");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_dropped_without_an_ack_comes_back_at_once() {
    let url = server().url();
    let (subject, group) = ("dropped", "g-dropped");
    let mut running = Running::start(config(&url, subject, group))
        .connected()
        .await;
    publish_all(&url, subject, &["given-up"]).await;
    let first = running.next().await;
    let id = first.message.id.clone();
    drop(first);
    // Well before the 15 s ack_wait would bring it back.
    let again = tokio::time::timeout(Duration::from_secs(5), running.rx.recv())
        .await
        .expect("redelivered at once")
        .expect("running");
    assert_eq!(again.message.id, id);
    assert_eq!(text(&again), "given-up");
    again.ack.ack().await.expect("acked");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_down_at_start_is_waited_for() {
    let server = Arc::new(Nats::prepare().expect("a port and a directory"));
    let subject = "late.server";
    let running = Running::start(config(&server.url(), subject, "g-late"));
    until("a connection attempt failed", || {
        running.status.last_error().is_some()
    })
    .await;
    assert_eq!(running.status.state(), ConnectionState::Connecting);

    let starting = server.clone();
    tokio::task::spawn_blocking(move || starting.restart())
        .await
        .expect("no panic")
        .expect("nats-server starts");
    let mut running = running.connected().await;
    publish_all(&server.url(), subject, &["hello"]).await;
    let received = running.next().await;
    assert_eq!(text(&received), "hello");
    received.ack.ack().await.expect("acked");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_restart_mid_stream_loses_nothing() {
    restart_mid_stream(false).await;
}

/// Killed with SIGKILL, as a crash: what it confirmed is on disk all the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_crash_mid_stream_loses_nothing() {
    restart_mid_stream(true).await;
}

/// Publishes N messages with confirms while the nats-server restarts (gracefully, or
/// killed first), and checks every one of them is delivered at least once.
async fn restart_mid_stream(crash: bool) {
    const N: usize = 200;
    let server = Arc::new(
        tokio::task::spawn_blocking(Nats::start)
            .await
            .expect("no panic")
            .expect("nats-server starts"),
    );
    let url = server.url();
    let subject = "restarted";
    let mut running = Running::start(config(&url, subject, "g-restarted"))
        .connected()
        .await;

    // The publisher retries each message until the stream acknowledged it, as a
    // careful producer does; the server restarts once a quarter is through.
    let (confirmed_tx, mut confirmed_rx) = mpsc::unbounded_channel::<usize>();
    let publisher = tokio::spawn({
        let js = plain(&url).await;
        async move {
            for i in 0..N {
                loop {
                    let sent = tokio::time::timeout(Duration::from_secs(5), async {
                        js.publish(subject, Bytes::from(format!("m{i}")))
                            .await?
                            .await
                            .map_err(async_nats::Error::from)
                    })
                    .await;
                    if matches!(sent, Ok(Ok(_))) {
                        break;
                    }
                    // The server is restarting: a producer's retry pause.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let _ = confirmed_tx.send(i);
            }
        }
    });

    let restarter = tokio::spawn({
        let server = server.clone();
        async move {
            let mut confirmed = 0;
            while confirmed < N / 4 {
                confirmed_rx.recv().await.expect("the publisher runs");
                confirmed += 1;
            }
            tokio::task::spawn_blocking(move || {
                if crash {
                    server.kill();
                }
                server.restart()
            })
            .await
            .expect("no panic")
            .expect("nats-server restarts");
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
        // An ack the restart swallowed means a redelivery, not a loss.
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
    until("reconnected", || {
        running.status.state() == ConnectionState::Connected
    })
    .await;
    running.stop().await;
}

/// Not a timed assertion: the figure is printed (`--nocapture`) for the record.
#[tokio::test(flavor = "multi_thread")]
async fn throughput_through_the_connector() {
    const N: usize = 10_000;
    let url = server().url();
    let subject = "throughput";
    let mut config = config(&url, subject, "g-throughput");
    config.prefetch = 256;
    let connector = connector(config).expect("a valid source");
    let status = Arc::new(ConnectionStatus::default());
    let (tx, mut rx) = mpsc::channel(256);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(connector.clone().run(tx, status.clone(), shutdown.clone()));
    until("connected", || status.state() == ConnectionState::Connected).await;

    let js = plain(&url).await;
    let started = Instant::now();
    // Acks are awaited a thousand at a time: the client bounds the PubAcks in flight.
    let publisher = tokio::spawn(async move {
        for chunk in 0..N / 1000 {
            let mut confirms = futures::stream::FuturesUnordered::new();
            for i in chunk * 1000..(chunk + 1) * 1000 {
                let confirm = js
                    .publish(subject, Bytes::from(format!("m{i}")))
                    .await
                    .expect("published");
                confirms.push(confirm.into_future());
            }
            while let Some(confirm) = confirms.next().await {
                confirm.expect("acknowledged by the stream");
            }
        }
        started.elapsed()
    });
    let mut acks = futures::stream::FuturesUnordered::new();
    let mut received = 0;
    while received < N {
        tokio::select! {
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
    let published = tokio::time::timeout(WAIT, publisher)
        .await
        .expect("published in time")
        .expect("no panic");
    let elapsed = started.elapsed();
    println!(
        "nats: {N} messages published in {published:?}, consumed and acked through the connector in {elapsed:?}: {:.0} msg/s",
        N as f64 / elapsed.as_secs_f64()
    );
    shutdown.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("stops")
        .expect("no panic");

    // The same with a plain client (a durable pull consumer of its own on a subject
    // of its own, double acks as the connector's): the server's own rate, to see
    // what the connector costs.
    let plain_subject = "throughput-plain";
    let js = plain(&url).await;
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: "PLAIN".into(),
            subjects: vec![plain_subject.into()],
            ..Default::default()
        })
        .await
        .expect("a stream");
    let consumer = stream
        .get_or_create_consumer(
            "plain",
            jetstream::consumer::pull::Config {
                durable_name: Some("plain".into()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                max_ack_pending: 256,
                ..Default::default()
            },
        )
        .await
        .expect("a consumer");
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(256)
        .messages()
        .await
        .expect("pulling");
    let started = Instant::now();
    let publisher = tokio::spawn(async move {
        for chunk in 0..N / 1000 {
            let mut confirms = futures::stream::FuturesUnordered::new();
            for i in chunk * 1000..(chunk + 1) * 1000 {
                let confirm = js
                    .publish(plain_subject, Bytes::from(format!("m{i}")))
                    .await
                    .expect("published");
                confirms.push(confirm.into_future());
            }
            while let Some(confirm) = confirms.next().await {
                confirm.expect("acknowledged by the stream");
            }
        }
    });
    let mut acks = futures::stream::FuturesUnordered::new();
    let mut received = 0;
    while received < N {
        tokio::select! {
            Some(result) = acks.next(), if !acks.is_empty() => {
                let result: Result<(), async_nats::Error> = result;
                result.expect("acked");
            }
            message = tokio::time::timeout(WAIT, messages.next()) => {
                let message = message.expect("messages keep coming").expect("pulling").expect("a message");
                received += 1;
                acks.push(async move { message.double_ack().await });
            }
        }
    }
    while let Some(result) = acks.next().await {
        result.expect("acked");
    }
    let plain = started.elapsed();
    tokio::time::timeout(WAIT, publisher)
        .await
        .expect("published in time")
        .expect("no panic");
    println!(
        "nats: the same with a plain client: {plain:?}: {:.0} msg/s",
        N as f64 / plain.as_secs_f64()
    );
}
