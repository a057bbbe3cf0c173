//! The MQTT connector against a real mosquitto (Debian's 2.0), one broker per test
//! so a test may stop and restart its own.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use sless_brokers::Mosquitto;
use sless_core::{ConnectionState, QueueKind, StartFrom};
use sless_queue::{ConnectionStatus, Connector, Received, SourceConfig, connector};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

fn config(broker: &Mosquitto, topic: &str, group: &str) -> SourceConfig {
    SourceConfig {
        kind: QueueKind::Mqtt,
        url: broker.url(),
        topic: topic.to_string(),
        group: group.to_string(),
        start_from: StartFrom::Latest,
        prefetch: 100,
        label: format!("test/{group}"),
    }
}

/// As [`config`], spoken in MQTT 5.
fn config5(broker: &Mosquitto, topic: &str, group: &str) -> SourceConfig {
    SourceConfig {
        url: format!("{}?version=5", broker.url()),
        ..config(broker, topic, group)
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
    fn spawn(config: SourceConfig) -> Self {
        let connector = connector(config).expect("a valid source");
        let status = Arc::new(ConnectionStatus::default());
        let (tx, rx) = mpsc::channel(1024);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(connector.clone().run(tx, status.clone(), shutdown.clone()));
        Self {
            connector,
            status,
            rx,
            shutdown,
            task,
        }
    }

    async fn start(config: SourceConfig) -> Self {
        let running = Self::spawn(config);
        running.wait_for(ConnectionState::Connected).await;
        running
    }

    async fn wait_for(&self, state: ConnectionState) {
        tokio::time::timeout(WAIT, async {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            while self.status.state() != state {
                tick.tick().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the connector reports {state:?}"));
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

fn text(r: &Received) -> String {
    String::from_utf8_lossy(&r.message.payload).into_owned()
}

fn payloads(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// A plain QoS 1 publisher: sends each payload and waits for its PUBACK; after a
/// lost connection it reconnects and sends the unacknowledged one again.
async fn publish(port: u16, topic: &str, payloads: &[String]) {
    let id = format!("pub-{}", rand_suffix());
    let mut options = MqttOptions::new(id, "127.0.0.1", port);
    options.set_clean_session(true);
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    tokio::time::timeout(WAIT * 2, async {
        let mut connected = false;
        for payload in payloads {
            let mut sent = false;
            loop {
                if connected && !sent {
                    client
                        .publish(topic, QoS::AtLeastOnce, false, payload.clone())
                        .await
                        .expect("queued");
                    sent = true;
                }
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        connected = true;
                    }
                    Ok(Event::Incoming(Packet::PubAck(_))) if sent => break,
                    Ok(_) => {}
                    Err(_) => {
                        // A clean session forgets the publish: send it again.
                        connected = false;
                        sent = false;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
    })
    .await
    .expect("published in time");
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_messages_are_not_delivered_again_after_a_restart() {
    let broker = Mosquitto::start().expect("mosquitto");
    let mut c = Running::start(config(&broker, "orders/#", "g1")).await;
    publish(broker.port(), "orders/a", &payloads("m", 5)).await;
    let got = c.take(5).await;
    assert_eq!(got.iter().map(text).collect::<Vec<_>>(), payloads("m", 5));
    let m = &got[0].message;
    assert_eq!(m.key.as_deref(), Some("orders/a"));
    assert_eq!(m.topic, "orders/a");
    assert!(!m.redelivered);
    for r in got {
        r.ack.ack().await.expect("acked");
    }
    c.stop().await;

    publish(broker.port(), "orders/a", &["after".to_string()]).await;
    let mut c = Running::start(config(&broker, "orders/#", "g1")).await;
    assert_eq!(text(&c.next().await), "after");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledgements_in_any_order_settle_exactly_their_messages() {
    let broker = Mosquitto::start().expect("mosquitto");
    let mut c = Running::start(config(&broker, "orders", "g1")).await;
    publish(broker.port(), "orders", &payloads("m", 6)).await;
    let mut got = c.take(6).await;
    // m-2 never finishes; the others finish last first.
    let unfinished = got.remove(2);
    while let Some(r) = got.pop() {
        r.ack.ack().await.expect("acked");
    }
    drop(unfinished);
    c.stop().await;

    let mut c = Running::start(config(&broker, "orders", "g1")).await;
    let again = c.next().await;
    assert_eq!(text(&again), "m-2");
    assert!(again.message.redelivered);
    again.ack.ack().await.expect("acked");
    publish(broker.port(), "orders", &["after".to_string()]).await;
    assert_eq!(text(&c.next().await), "after", "nothing else came back");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unacknowledged_messages_are_delivered_again_after_a_restart() {
    let broker = Mosquitto::start().expect("mosquitto");
    let mut c = Running::start(config(&broker, "orders", "g1")).await;
    publish(broker.port(), "orders", &payloads("m", 3)).await;
    let first = c.take(3).await;
    assert_eq!(first.iter().map(text).collect::<Vec<_>>(), payloads("m", 3));
    drop(first);
    c.stop().await;

    let mut c = Running::start(config(&broker, "orders", "g1")).await;
    let again = c.take(3).await;
    assert_eq!(again.iter().map(text).collect::<Vec<_>>(), payloads("m", 3));
    assert!(again.iter().all(|r| r.message.redelivered), "flagged DUP");
    for r in again {
        r.ack.ack().await.expect("acked");
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_published_while_the_connector_is_away_are_delivered_when_it_is_back() {
    let broker = Mosquitto::start().expect("mosquitto");
    let c = Running::start(config(&broker, "orders", "g1")).await;
    c.stop().await;
    publish(broker.port(), "orders", &payloads("away", 50)).await;
    let mut c = Running::start(config(&broker, "orders", "g1")).await;
    let mut got = Vec::new();
    // More than the broker hands out unacknowledged at once (20): acks free the way.
    for _ in 0..50 {
        let r = c.next().await;
        got.push(text(&r));
        r.ack.ack().await.expect("acked");
    }
    assert_eq!(got, payloads("away", 50));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_that_is_down_at_start_is_connected_to_once_it_is_up() {
    let mut broker = Mosquitto::start().expect("mosquitto");
    broker.stop().expect("stopped");
    let mut c = Running::spawn(config(&broker, "orders", "g1"));
    tokio::time::timeout(WAIT, async {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        while c.status.last_error().is_none() {
            tick.tick().await;
        }
    })
    .await
    .expect("the outage is reported");
    assert_eq!(c.status.state(), ConnectionState::Connecting);

    broker.start_again().expect("started");
    c.wait_for(ConnectionState::Connected).await;
    publish(broker.port(), "orders", &["hello".to_string()]).await;
    assert_eq!(text(&c.next().await), "hello");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_restarted_mid_stream_loses_nothing() {
    const N: usize = 200;
    let mut broker = Mosquitto::start().expect("mosquitto");
    let mut c = Running::start(config(&broker, "orders", "g1")).await;
    let port = broker.port();
    let publisher = tokio::spawn(async move {
        publish(port, "orders", &payloads("m", N)).await;
    });
    let mut seen = HashSet::new();
    let mut restarted = false;
    while seen.len() < N {
        let r = c.next().await;
        seen.insert(text(&r));
        // The ack may find the connection gone: the broker then redelivers it.
        let _ = r.ack.ack().await;
        if !restarted && seen.len() >= N / 4 {
            tokio::task::block_in_place(|| broker.restart()).expect("restarted");
            restarted = true;
        }
    }
    tokio::time::timeout(WAIT, publisher)
        .await
        .expect("publisher done")
        .expect("no panic");
    assert!(restarted);
    assert!(
        c.status.last_error().is_some(),
        "the connection was lost and made again"
    );
    let expected: HashSet<String> = payloads("m", N).into_iter().collect();
    assert_eq!(seen, expected);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_reaches_a_plain_subscriber() {
    let broker = Mosquitto::start().expect("mosquitto");
    let c = Running::start(config(&broker, "in", "g1")).await;

    let mut options = MqttOptions::new("plain-sub", "127.0.0.1", broker.port());
    options.set_clean_session(true);
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    client
        .subscribe("out/#", QoS::AtLeastOnce)
        .await
        .expect("subscribe queued");
    tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(Event::Incoming(Packet::SubAck(_))) = eventloop.poll().await {
                break;
            }
        }
    })
    .await
    .expect("subscribed");

    c.connector
        .publish("out/x", Bytes::from_static(b"result"), &[])
        .await
        .expect("published and PUBACKed");
    let got = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(Event::Incoming(Packet::Publish(p))) = eventloop.poll().await {
                break p;
            }
        }
    })
    .await
    .expect("received");
    assert_eq!(got.topic, "out/x");
    assert_eq!(&got.payload[..], b"result");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn throughput_of_the_connector_alone() {
    const N: usize = 10_000;
    let broker = Mosquitto::start().expect("mosquitto");
    // The session exists and is offline: mosquitto queues everything for it.
    let c = Running::start(config(&broker, "bulk", "g1")).await;
    c.stop().await;
    let mut options = MqttOptions::new("bulk-pub", "127.0.0.1", broker.port());
    options.set_clean_session(true).set_inflight(100);
    let (client, mut eventloop) = AsyncClient::new(options, 1024);
    tokio::time::timeout(WAIT * 2, async {
        let sender = tokio::spawn(async move {
            for i in 0..N {
                client
                    .publish("bulk", QoS::AtLeastOnce, false, format!("{{\"i\":{i}}}"))
                    .await
                    .expect("queued");
            }
            client
        });
        let mut acked = 0;
        while acked < N {
            if let Event::Incoming(Packet::PubAck(_)) = eventloop.poll().await.expect("publishing")
            {
                acked += 1;
            }
        }
        sender.await.expect("no panic");
    })
    .await
    .expect("published in time");

    let started = Instant::now();
    let mut c = Running::start(config(&broker, "bulk", "g1")).await;
    let mut seen = HashSet::new();
    while seen.len() < N {
        let r = c.next().await;
        seen.insert(text(&r));
        r.ack.ack().await.expect("acked");
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "mqtt connector: {N} messages received and acked in {secs:.2} s = {:.0} msg/s",
        N as f64 / secs
    );
    c.stop().await;
}

fn header<'a>(r: &'a Received, key: &str) -> Option<&'a str> {
    r.message
        .headers
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread")]
async fn mqtt5_headers_travel_as_user_properties_and_a_message_id_is_kept_across_redelivery() {
    let broker = Mosquitto::start().expect("mosquitto");
    let publisher = Running::start(config5(&broker, "unused", "pub5")).await;
    let mut c = Running::start(config5(&broker, "orders/#", "g5")).await;
    let headers = [
        ("message-id".to_string(), "order-42".to_string()),
        (
            "x-sless-original-topic".to_string(),
            "orders.in".to_string(),
        ),
    ];
    publisher
        .connector
        .publish("orders/a", Bytes::from_static(b"first"), &headers)
        .await
        .expect("published and PUBACKed");
    publisher
        .connector
        .publish("orders/a", Bytes::from_static(b"second"), &[])
        .await
        .expect("published and PUBACKed");
    let first = c.next().await;
    assert_eq!(text(&first), "first");
    assert_eq!(first.message.id, "order-42");
    assert_eq!(header(&first, "x-sless-original-topic"), Some("orders.in"));
    assert_eq!(first.message.topic, "orders/a");
    assert!(!first.message.redelivered);
    let second = c.next().await;
    assert_eq!(text(&second), "second");
    assert!(second.message.headers.is_empty());
    assert_eq!(second.message.id.len(), 32, "a fresh id");
    second.ack.ack().await.expect("acked");
    // Not acknowledged: the persistent MQTT 5 session keeps it for the next connection,
    // which sees the same id, flagged DUP.
    drop(first);
    c.stop().await;

    let mut c = Running::start(config5(&broker, "orders/#", "g5")).await;
    let again = c.next().await;
    assert_eq!(text(&again), "first");
    assert_eq!(again.message.id, "order-42");
    assert!(again.message.redelivered);
    again.ack.ack().await.expect("acked");
    publisher
        .connector
        .publish("orders/a", Bytes::from_static(b"after"), &[])
        .await
        .expect("published");
    assert_eq!(text(&c.next().await), "after", "nothing else came back");
    c.stop().await;
    publisher.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mqtt5_receive_maximum_is_the_prefetch() {
    let broker = Mosquitto::start().expect("mosquitto");
    let config = SourceConfig {
        prefetch: 4,
        ..config5(&broker, "bounded", "g5")
    };
    // The session exists and is offline: mosquitto queues the 12 for it.
    Running::start(config.clone()).await.stop().await;
    publish(broker.port(), "bounded", &payloads("m", 12)).await;
    let mut c = Running::start(config).await;
    let first = c.take(4).await;
    assert_eq!(first.iter().map(text).collect::<Vec<_>>(), payloads("m", 4));
    // Four unacknowledged: the broker sends no fifth until one is acknowledged.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), c.rx.recv())
            .await
            .is_err(),
        "a fifth message past a receive maximum of 4"
    );
    let mut got = Vec::new();
    for r in first {
        r.ack.ack().await.expect("acked");
    }
    for _ in 0..8 {
        let r = c.next().await;
        got.push(text(&r));
        r.ack.ack().await.expect("acked");
    }
    assert_eq!(got, payloads("m", 12)[4..]);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mqtt5_and_mqtt311_clients_share_a_broker() {
    let broker = Mosquitto::start().expect("mosquitto");
    let mut old = Running::start(config(&broker, "mixed", "g311")).await;
    let mut new = Running::start(config5(&broker, "mixed", "g5")).await;
    // A 3.1.1 publish reaches both; its headers are dropped (3.1.1 has none).
    old.connector
        .publish(
            "mixed",
            Bytes::from_static(b"from-311"),
            &[("x-a".into(), "1".into())],
        )
        .await
        .expect("published");
    let a = new.next().await;
    assert_eq!(text(&a), "from-311");
    assert!(a.message.headers.is_empty());
    assert_eq!(text(&old.next().await), "from-311");
    // A 5 publish reaches the 3.1.1 reader as the payload alone.
    new.connector
        .publish(
            "mixed",
            Bytes::from_static(b"from-5"),
            &[("x-a".into(), "1".into())],
        )
        .await
        .expect("published");
    let b = old.next().await;
    assert_eq!(text(&b), "from-5");
    assert!(b.message.headers.is_empty());
    let c = new.next().await;
    assert_eq!(header(&c, "x-a"), Some("1"));
    old.stop().await;
    new.stop().await;
}
