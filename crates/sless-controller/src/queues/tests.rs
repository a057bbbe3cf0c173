//! Queue triggers against an in-memory connector and function: what is delivered,
//! acknowledged, published and dead-lettered, and how enable/disable/redrive behave.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use sless_core::{SecretRef, TriggerSpec, TriggerStatus};
use sless_queue::{Ack, Message, QueueError};
use sless_triggers::{FireOutcome, FireRequest, FireResponse};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::*;

/// A publish: topic, payload, headers.
type Published = (String, Bytes, Vec<(String, String)>);

/// A broker in memory: the test pushes messages, sees acks and publishes.
#[derive(Default)]
struct Broker {
    /// The running connector's channel (the newest run's).
    deliver: Mutex<Option<mpsc::Sender<Received>>>,
    runs: AtomicUsize,
    stopped: AtomicUsize,
    published: Mutex<Vec<Published>>,
    fail_publish: std::sync::atomic::AtomicBool,
    events: Mutex<Option<UnboundedSender<&'static str>>>,
}

impl Broker {
    fn note(&self, what: &'static str) {
        if let Some(tx) = lock(&self.events).as_ref() {
            let _ = tx.send(what);
        }
    }
}

struct FakeConnector(Arc<Broker>);

#[async_trait]
impl Connector for FakeConnector {
    async fn run(
        self: Arc<Self>,
        deliver: mpsc::Sender<Received>,
        status: Arc<ConnectionStatus>,
        shutdown: CancellationToken,
    ) {
        *lock(&self.0.deliver) = Some(deliver);
        self.0.runs.fetch_add(1, Ordering::SeqCst);
        status.connected();
        self.0.note("connected");
        shutdown.cancelled().await;
        self.0.stopped.fetch_add(1, Ordering::SeqCst);
        self.0.note("stopped");
    }

    async fn publish(
        &self,
        topic: &str,
        payload: Bytes,
        headers: &[(String, String)],
    ) -> Result<(), QueueError> {
        if self.0.fail_publish.load(Ordering::SeqCst) {
            self.0.note("publish failed");
            return Err(QueueError::NotConnected);
        }
        lock(&self.0.published).push((topic.to_string(), payload, headers.to_vec()));
        Ok(())
    }
}

struct FakeAck(String, UnboundedSender<String>);

#[async_trait]
impl Ack for FakeAck {
    async fn ack(self: Box<Self>) -> Result<(), QueueError> {
        let _ = self.1.send(self.0);
        Ok(())
    }
}

/// The function: answers 400 to `"bad"`, 200 with `{"echo": event}` otherwise.
#[derive(Default)]
struct FakeFire {
    requests: Mutex<Vec<FireRequest>>,
}

#[async_trait]
impl Fire for FakeFire {
    async fn fire(&self, req: FireRequest) -> FireOutcome {
        let bad = req.event == json!("bad") || req.event["payload"] == json!("bad");
        let echo = json!({"echo": req.event}).to_string();
        lock(&self.requests).push(req);
        if bad {
            FireOutcome {
                status: 400,
                error: None,
                response: Some(FireResponse {
                    status: 400,
                    headers: vec![],
                    body: Bytes::from_static(b"no"),
                }),
            }
        } else {
            FireOutcome {
                status: 200,
                error: None,
                response: Some(FireResponse {
                    status: 200,
                    headers: vec![],
                    body: Bytes::from(echo),
                }),
            }
        }
    }

    async fn prewarm(&self, _namespace: &str, _function: &str) {}
}

#[derive(Default)]
struct MemoryDeadLetters {
    items: Mutex<Vec<DeadLetter>>,
    removed: Mutex<Vec<String>>,
    events: Mutex<Option<UnboundedSender<&'static str>>>,
}

#[async_trait]
impl DeadLetterSink for MemoryDeadLetters {
    async fn write(&self, dl: DeadLetter) -> anyhow::Result<()> {
        let mut items = lock(&self.items);
        items.retain(|d| d.id != dl.id);
        items.push(dl);
        if let Some(tx) = lock(&self.events).as_ref() {
            let _ = tx.send("written");
        }
        Ok(())
    }

    async fn remove(&self, _namespace: &str, id: &str) -> anyhow::Result<()> {
        lock(&self.items).retain(|d| d.id != id);
        lock(&self.removed).push(id.to_string());
        if let Some(tx) = lock(&self.events).as_ref() {
            let _ = tx.send("removed");
        }
        Ok(())
    }
}

struct World {
    queues: Queues,
    broker: Arc<Broker>,
    fire: Arc<FakeFire>,
    dead: Arc<MemoryDeadLetters>,
    acks_tx: UnboundedSender<String>,
    acks: UnboundedReceiver<String>,
    events: UnboundedReceiver<&'static str>,
}

fn world() -> World {
    let broker = Arc::new(Broker::default());
    let fire = Arc::new(FakeFire::default());
    let dead = Arc::new(MemoryDeadLetters::default());
    let (events_tx, events) = unbounded_channel();
    *lock(&broker.events) = Some(events_tx.clone());
    *lock(&dead.events) = Some(events_tx);
    let b = broker.clone();
    let queues = Queues::with_connectors(
        fire.clone(),
        CancellationToken::new(),
        Arc::new(move |_config| Ok(Arc::new(FakeConnector(b.clone())) as Arc<dyn Connector>)),
    );
    queues.set_dead_letters(dead.clone());
    let (acks_tx, acks) = unbounded_channel();
    World {
        queues,
        broker,
        fire,
        dead,
        acks_tx,
        acks,
        events,
    }
}

fn record(spec: serde_json::Value, generation: u64) -> TriggerRecord {
    let spec = TriggerSpec::from_fields(serde_json::from_value(spec).expect("fields"))
        .expect("valid trigger");
    TriggerRecord {
        namespace: "default".into(),
        name: "orders-in".into(),
        spec,
        status: TriggerStatus::default(),
        generation,
        created_at: Utc::now(),
        updated_at: Utc::now(),
    }
}

fn queue_trigger(extra: serde_json::Value) -> TriggerRecord {
    let mut spec = json!({"function": "process", "type": "queue",
        "source": {"kind": "amqp", "url": "amqp://127.0.0.1:5672/%2f", "topic": "orders"}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    record(spec, 1)
}

impl World {
    async fn event(&mut self, want: &'static str) {
        loop {
            let got = tokio::time::timeout(Duration::from_secs(10), self.events.recv())
                .await
                .expect("event in time")
                .expect("events open");
            if got == want {
                return;
            }
        }
    }

    async fn send(&self, id: &str, payload: &[u8]) {
        let tx = lock(&self.broker.deliver)
            .clone()
            .expect("connector running");
        tx.send(Received {
            message: Message {
                id: id.into(),
                topic: "orders".into(),
                key: Some("orders".into()),
                partition: None,
                offset: Some(7),
                headers: vec![("h".into(), "v".into())],
                published_at: None,
                redelivered: false,
                payload: Bytes::copy_from_slice(payload),
            },
            ack: Box::new(FakeAck(id.into(), self.acks_tx.clone())),
        })
        .await
        .expect("pump takes it");
    }

    async fn acked(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(10), self.acks.recv())
            .await
            .expect("ack in time")
            .expect("acks open")
    }
}

#[tokio::test]
async fn a_message_is_delivered_then_acknowledged_and_its_response_published() {
    let mut w = world();
    w.queues
        .apply(&queue_trigger(json!({"response_topic": "orders.done"})));
    w.event("connected").await;
    w.send("m-1", br#"{"n": 1}"#).await;
    assert_eq!(w.acked().await, "m-1");

    let req = lock(&w.fire.requests)[0].clone();
    assert_eq!(req.function, "process");
    assert_eq!(req.trigger, "orders-in");
    assert_eq!(req.source, InvocationSource::Queue);
    assert_eq!(req.event, json!({"n": 1}));
    let info = req.delivery.expect("delivery info");
    assert_eq!((info.attempt, info.request_id.as_str()), (1, "m-1"));
    let meta = info.message.expect("context.message");
    assert_eq!(meta["kind"], "amqp");
    assert_eq!(meta["topic"], "orders");
    assert_eq!(meta["id"], "m-1");
    assert_eq!(meta["offset"], 7);
    assert_eq!(meta["headers"], json!({"h": "v"}));

    let published = lock(&w.broker.published).clone();
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].0, "orders.done");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&published[0].1).expect("json"),
        json!({"echo": {"n": 1}})
    );

    let status = w.queues.status("default", "orders-in").expect("running");
    assert_eq!(status.connection, Some(ConnectionState::Connected));
    assert_eq!(status.counters.received, 1);
    assert!(status.last_fired_at.is_some());
    assert_eq!(
        status.last_result.map(|r| r.to_string()).as_deref(),
        Some("ok: status 200")
    );
}

#[tokio::test]
async fn payloads_that_are_not_json_and_envelopes_map_as_the_contract_says() {
    let mut w = world();
    w.queues.apply(&queue_trigger(json!({})));
    w.event("connected").await;
    for (i, payload) in [&b"plain text"[..], b"", &[0xff, 0xfe]].iter().enumerate() {
        w.send(&format!("m-{i}"), payload).await;
        w.acked().await;
    }
    let events: Vec<_> = lock(&w.fire.requests)
        .iter()
        .map(|r| r.event.clone())
        .collect();
    assert_eq!(
        events,
        [json!("plain text"), json!(""), json!({"base64": "//4="})]
    );

    w.queues.apply(&queue_trigger(json!({"event": "envelope"})));
    w.send("m-env", b"hi").await;
    w.acked().await;
    let last = lock(&w.fire.requests).last().cloned().expect("fired");
    assert_eq!(last.event["payload"], "hi");
    assert_eq!(last.event["message"]["id"], "m-env");
    assert_eq!(
        w.broker.runs.load(Ordering::SeqCst),
        1,
        "changing the event shape does not reconnect"
    );
}

#[tokio::test]
async fn a_failure_without_retry_is_dead_lettered_published_and_acknowledged() {
    let mut w = world();
    w.queues.apply(&queue_trigger(
        json!({"dead_letter_topic": "orders.dlq", "response_topic": "orders.done"}),
    ));
    w.event("connected").await;
    w.send("m-bad", b"bad").await;
    assert_eq!(w.acked().await, "m-bad");

    let dls = lock(&w.dead.items).clone();
    assert_eq!(dls.len(), 1);
    let dl = &dls[0];
    assert_eq!(dl.source, DeadLetterSource::Queue);
    assert_eq!(dl.trigger.as_deref(), Some("orders-in"));
    assert_eq!(dl.function, "process");
    assert_eq!(dl.payload, b"bad");
    assert_eq!((dl.attempts, dl.last_status), (1, 400));
    assert_eq!(dl.message["id"], "m-bad");
    assert_eq!(dl.message["attempt"], 1);

    let published = lock(&w.broker.published).clone();
    assert_eq!(
        published.len(),
        1,
        "no response for a failure: {published:?}"
    );
    let (topic, payload, headers) = &published[0];
    assert_eq!(topic, "orders.dlq");
    assert_eq!(&payload[..], b"bad");
    let header = |k: &str| {
        headers
            .iter()
            .find(|(h, _)| h == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header("x-sless-original-topic"), Some("orders"));
    assert_eq!(header("x-sless-attempts"), Some("1"));
    assert_eq!(header("x-sless-last-status"), Some("400"));
    assert_eq!(header("x-sless-error"), Some(""));
}

#[tokio::test]
async fn a_response_that_cannot_be_published_is_not_acknowledged() {
    let mut w = world();
    w.broker.fail_publish.store(true, Ordering::SeqCst);
    w.queues
        .apply(&queue_trigger(json!({"response_topic": "orders.done"})));
    w.event("connected").await;
    w.send("m-1", b"{}").await;
    w.event("publish failed").await;
    // An ack comes only after a publish that worked, and none has.
    assert!(w.acks.try_recv().is_err(), "m-1 stays unacknowledged");
}

#[tokio::test]
async fn disabling_stops_consuming_and_enabling_starts_again() {
    let mut w = world();
    w.queues.apply(&queue_trigger(json!({})));
    w.event("connected").await;
    let mut off = queue_trigger(json!({"enabled": false}));
    off.generation = 2;
    w.queues.apply(&off);
    w.event("stopped").await;
    let status = w.queues.status("default", "orders-in").expect("known");
    assert_eq!(status.connection, None, "nothing consumes while disabled");
    assert!(matches!(
        w.queues.redrive(dead_letter("x")),
        Err(RedriveError::Disabled(_))
    ));

    let mut on = queue_trigger(json!({}));
    on.generation = 3;
    w.queues.apply(&on);
    w.event("connected").await;
    assert_eq!(w.broker.runs.load(Ordering::SeqCst), 2);
    w.send("m-1", b"1").await;
    assert_eq!(w.acked().await, "m-1");

    // A changed source restarts the consumer; a delete stops it.
    let mut moved = queue_trigger(json!({}));
    if let TriggerKind::Queue { source, .. } = &mut moved.spec.kind {
        source.topic = "elsewhere".into();
    }
    w.queues.apply(&moved);
    w.event("stopped").await;
    w.event("connected").await;
    w.queues.remove("default", "orders-in");
    w.event("stopped").await;
    assert!(w.queues.status("default", "orders-in").is_none());
    assert!(matches!(
        w.queues.redrive(dead_letter("x")),
        Err(RedriveError::NoTrigger(_))
    ));
}

fn dead_letter(id: &str) -> DeadLetter {
    DeadLetter {
        id: id.into(),
        namespace: "default".into(),
        source: DeadLetterSource::Queue,
        trigger: Some("orders-in".into()),
        function: "process".into(),
        payload: br#"{"fixed": true}"#.to_vec(),
        message: json!({"kind": "amqp", "topic": "orders", "id": "m-9", "key": "orders", "attempt": 3}),
        attempts: 3,
        last_status: 500,
        error: Some("boom".into()),
        failed_at: Utc::now(),
    }
}

#[tokio::test]
async fn a_redrive_that_succeeds_removes_its_dead_letter_and_one_that_fails_updates_it() {
    let mut w = world();
    w.queues.apply(&queue_trigger(json!({})));
    w.event("connected").await;
    lock(&w.dead.items).push(dead_letter("dl-1"));
    w.queues.redrive(dead_letter("dl-1")).expect("redriven");
    w.event("removed").await;
    assert!(lock(&w.dead.items).is_empty());
    let req = lock(&w.fire.requests).last().cloned().expect("fired");
    assert_eq!(req.event, json!({"fixed": true}));
    let info = req.delivery.expect("delivery");
    assert_eq!((info.attempt, info.request_id.as_str()), (1, "m-9"));
    assert_eq!(info.message.expect("meta")["attempt"], 1);

    let mut bad = dead_letter("dl-2");
    bad.payload = b"bad".to_vec();
    lock(&w.dead.items).push(bad.clone());
    w.queues.redrive(bad).expect("redriven");
    w.event("written").await;
    let items = lock(&w.dead.items).clone();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].id, "dl-2", "the same dead letter, updated");
    assert_eq!(items[0].last_status, 400);
    assert_eq!(items[0].attempts, 1);
}

#[tokio::test]
async fn a_url_secret_that_cannot_be_read_leaves_the_trigger_failed_not_gone() {
    let w = world();
    let mut t = queue_trigger(json!({}));
    if let TriggerKind::Queue { source, .. } = &mut t.spec.kind {
        source.url = None;
        source.url_secret = Some(SecretRef {
            secret: "rabbit".into(),
            key: "url".into(),
        });
    }
    tokio::time::pause();
    w.queues.apply(&t);
    let status = loop {
        let s = w.queues.status("default", "orders-in").expect("known");
        if s.connection == Some(ConnectionState::Failed) {
            break s;
        }
        tokio::time::advance(Duration::from_millis(10)).await;
    };
    let error = status.last_error.expect("why");
    assert!(error.starts_with("source.url_secret:"), "{error}");
    assert_eq!(w.broker.runs.load(Ordering::SeqCst), 0);
}

#[test]
fn prefetch_leaves_room_for_retries() {
    assert_eq!(prefetch(1), 20);
    assert_eq!(prefetch(4), 32);
    assert_eq!(prefetch(u32::MAX), u32::MAX);
}
