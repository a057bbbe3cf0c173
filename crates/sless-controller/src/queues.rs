//! Queue triggers at runtime: one consumer per enabled queue trigger (its broker
//! connector, a pump, and the trigger's delivery engine), restarted when its source
//! changes, stopped when it is disabled or deleted, and the hooks that publish
//! responses and write dead letters.
//!
//! Ack points: a message is acknowledged to its broker only after the engine settled
//! it, and the engine settles only after [`DeliveryHooks::settled`] returned `Ok`:
//! the response is on `response_topic` (when set), or the dead letter is written and
//! on `dead_letter_topic` (when set). A consumer that is stopped (disable, delete,
//! a changed source, server shutdown) drops what is unsettled without acknowledging
//! it, so the broker delivers it again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sless_core::invocation::InvocationSource;
use sless_core::{
    ConnectionState, DeadLetter, DeadLetterSource, DeliveryCounters, EventShape, QueueKind,
    QueueSource, TriggerKind, TriggerResult,
};
use sless_queue::{ConnectionStatus, Connector, Received, SourceConfig};
use sless_store::TriggerRecord;
use sless_triggers::Fire;
use sless_triggers::delivery::{Delivery, DeliveryHooks, Done, Engine, Settled, Target};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::secrets::SecretResolver;

/// Where dead letters are kept. The server binds it to the dead-letter store; without
/// one, dead letters are logged (and still published to `dead_letter_topic`).
#[async_trait]
pub trait DeadLetterSink: Send + Sync + 'static {
    /// Inserts the dead letter, or replaces the one with the same id (a redrive that
    /// failed again).
    async fn write(&self, dead_letter: DeadLetter) -> anyhow::Result<()>;
    /// Removes a dead letter (its redrive succeeded); a missing one is no error.
    async fn remove(&self, namespace: &str, id: &str) -> anyhow::Result<()>;
}

/// The server's dead-letter store.
#[async_trait]
impl DeadLetterSink for crate::dead_letters::DeadLetters {
    async fn write(&self, dead_letter: DeadLetter) -> anyhow::Result<()> {
        crate::dead_letters::DeadLetters::write(self, dead_letter).await
    }

    async fn remove(&self, namespace: &str, id: &str) -> anyhow::Result<()> {
        crate::dead_letters::DeadLetters::remove(self, namespace, id).await
    }
}

/// The sink of a server that keeps no dead letters: each is logged once.
struct LogDeadLetters;

#[async_trait]
impl DeadLetterSink for LogDeadLetters {
    async fn write(&self, dl: DeadLetter) -> anyhow::Result<()> {
        tracing::warn!(
            namespace = %dl.namespace,
            trigger = dl.trigger.as_deref().unwrap_or_default(),
            id = %dl.id,
            attempts = dl.attempts,
            last_status = dl.last_status,
            error = dl.error.as_deref().unwrap_or_default(),
            "dead letter (this server keeps no dead-letter store)"
        );
        Ok(())
    }

    async fn remove(&self, _namespace: &str, _id: &str) -> anyhow::Result<()> {
        Ok(())
    }
}

/// The broker-side prefetch for a trigger's concurrency: room for every slot plus
/// messages waiting for their retry (which hold no slot but are not acknowledged yet).
pub fn prefetch(concurrency: u32) -> u32 {
    concurrency.saturating_mul(4).saturating_add(16)
}

type Key = (String, String);

/// What of a queue trigger's spec the consumer is built from; a change of any of it
/// restarts the consumer (the engine's target, the connection, the prefetch).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ConsumerSpec {
    function: String,
    source: QueueSource,
    prefetch: u32,
    /// A device trigger's `devices` glob; `None` for a queue trigger.
    devices: Option<String>,
}

/// All queue triggers of the server.
pub struct Queues {
    fire: Arc<dyn Fire>,
    /// The server's own broker, for device triggers (its ingest account's URL).
    device_broker: Mutex<Option<String>>,
    secrets: Mutex<Option<Arc<SecretResolver>>>,
    dead_letters: Mutex<Arc<dyn DeadLetterSink>>,
    running: Arc<Mutex<HashMap<Key, Running>>>,
    shutdown: CancellationToken,
    /// How a connector is made; replaced in tests.
    make_connector: ConnectorFactory,
}

/// Makes the connector of a source.
pub type ConnectorFactory =
    Arc<dyn Fn(SourceConfig) -> Result<Arc<dyn Connector>, sless_queue::QueueError> + Send + Sync>;

/// One queue trigger: its engine, and its consumer while it is enabled.
struct Running {
    spec: ConsumerSpec,
    enabled: bool,
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    /// Cancels the consumer; `None` while the trigger is disabled.
    consumer: Option<CancellationToken>,
}

/// What the pump and the hooks of one trigger share, changed in place by a PATCH.
struct Shared {
    namespace: String,
    trigger: String,
    function: String,
    kind: QueueKind,
    topic: String,
    /// A device trigger's `devices` glob; `None` for a queue trigger.
    devices: Option<String>,
    settings: Mutex<Settings>,
    /// The live connector, for publishing (`None` until it is made).
    connector: Mutex<Option<Arc<dyn Connector>>>,
    /// The live connection's state (replaced when the consumer restarts).
    status: Mutex<Arc<ConnectionStatus>>,
    /// Payloads of deliveries not settled yet, by message id (with a count: a broker
    /// may hand out the same message again while the first copy is in flight).
    payloads: Mutex<HashMap<String, (Bytes, usize)>>,
    /// The dead-letter id of a delivery whose `settled` hook failed after writing it,
    /// so the hook's retry rewrites the same dead letter instead of adding another.
    pending_dead_letters: Mutex<HashMap<String, String>>,
    live: Mutex<Live>,
    dead_letters: Arc<dyn DeadLetterSink>,
}

#[derive(Debug, Clone)]
struct Settings {
    event: EventShape,
    response_topic: Option<String>,
    dead_letter_topic: Option<String>,
}

#[derive(Debug, Clone, Default)]
struct Live {
    last_fired_at: Option<DateTime<Utc>>,
    last_result: Option<TriggerResult>,
}

/// What a queue trigger reports in its `status`.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueStatus {
    /// `None` while the trigger is disabled (nothing is consuming).
    pub connection: Option<ConnectionState>,
    pub last_error: Option<String>,
    pub lag: Option<u64>,
    pub counters: DeliveryCounters,
    pub last_fired_at: Option<DateTime<Utc>>,
    pub last_result: Option<TriggerResult>,
}

/// Why a dead letter cannot be redriven.
#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    /// Its trigger no longer exists (or is not a queue trigger).
    #[error("trigger {0:?} no longer exists")]
    NoTrigger(String),
    /// Its trigger is disabled.
    #[error("trigger {0:?} is disabled; enable it to redrive its dead letters")]
    Disabled(String),
}

impl Queues {
    /// Queue triggers invoking through `fire`; consumers end when `shutdown` is cancelled.
    pub fn new(fire: Arc<dyn Fire>, shutdown: CancellationToken) -> Self {
        Self::with_connectors(fire, shutdown, Arc::new(sless_queue::connector))
    }

    /// As [`Queues::new`], with connectors made by `make_connector`.
    pub fn with_connectors(
        fire: Arc<dyn Fire>,
        shutdown: CancellationToken,
        make_connector: ConnectorFactory,
    ) -> Self {
        let running: Arc<Mutex<HashMap<Key, Running>>> = Arc::default();
        // At shutdown every engine stops at once, before the executor does: an
        // attempt that ran into a stopping executor would fail and be dead-lettered
        // (and acknowledged) instead of staying in the broker for the next start.
        let all = running.clone();
        let stopping = shutdown.clone();
        tokio::spawn(async move {
            stopping.cancelled().await;
            stop_all(&all);
        });
        Self {
            fire,
            device_broker: Mutex::new(None),
            secrets: Mutex::new(None),
            dead_letters: Mutex::new(Arc::new(LogDeadLetters)),
            running,
            shutdown,
            make_connector,
        }
    }

    /// Device triggers read from the server's own broker at `url` (consumers started
    /// from now on).
    pub fn set_device_broker(&self, url: String) {
        *lock(&self.device_broker) = Some(url);
    }

    /// Resolves `url_secret` through `resolver` (consumers started from now on).
    pub fn set_secrets(&self, resolver: Arc<SecretResolver>) {
        *lock(&self.secrets) = Some(resolver);
    }

    /// Keeps dead letters in `sink` (triggers applied from now on).
    pub fn set_dead_letters(&self, sink: Arc<dyn DeadLetterSink>) {
        *lock(&self.dead_letters) = sink;
    }

    /// Makes a stored trigger's consumer match it: started, restarted (its function,
    /// source or concurrency changed), stopped (disabled, or no longer a queue
    /// trigger), or changed in place (event shape, topics, delivery policy).
    pub fn apply(&self, t: &TriggerRecord) {
        let key = (t.namespace.clone(), t.name.clone());
        let (mut source, event, response_topic, dead_letter_topic, delivery, devices) =
            match &t.spec.kind {
                TriggerKind::Queue {
                    source,
                    event,
                    response_topic,
                    dead_letter_topic,
                    delivery,
                } => (
                    source.clone(),
                    event,
                    response_topic,
                    dead_letter_topic,
                    delivery,
                    None,
                ),
                // A device trigger is an MQTT consumer of the server's own broker: a
                // persistent session of its own on the namespace's telemetry, so the
                // broker keeps what the trigger has not settled, as for any queue.
                TriggerKind::Device {
                    devices,
                    event,
                    delivery,
                } => (
                    QueueSource {
                        kind: QueueKind::Mqtt,
                        url: lock(&self.device_broker).clone(),
                        url_secret: None,
                        topic: sless_core::device::telemetry_topic(&t.namespace, "+"),
                        group: Some(format!("sless-device-{}-{}", t.namespace, t.name)),
                        start_from: sless_core::StartFrom::Latest,
                    },
                    event,
                    &None,
                    &None,
                    delivery,
                    Some(devices.clone()),
                ),
                _ => {
                    self.remove(&t.namespace, &t.name);
                    return;
                }
            };
        source.fill_group(&t.namespace, &t.name);
        let spec = ConsumerSpec {
            function: t.spec.function.clone(),
            source,
            prefetch: prefetch(delivery.concurrency),
            devices,
        };
        let settings = Settings {
            event: *event,
            response_topic: response_topic.clone(),
            dead_letter_topic: dead_letter_topic.clone(),
        };
        let mut running = lock(&self.running);
        if let Some(r) = running.get_mut(&key)
            && r.spec == spec
        {
            *lock(&r.shared.settings) = settings;
            r.engine.set_policy(*delivery);
            if t.spec.enabled != r.enabled {
                r.enabled = t.spec.enabled;
                if let Some(cancel) = r.consumer.take() {
                    cancel.cancel();
                }
                if r.enabled {
                    r.consumer = Some(self.start_consumer(&r.spec, &r.engine, &r.shared));
                }
            }
            return;
        }
        if let Some(old) = running.remove(&key) {
            old.stop();
        }
        let shared = Arc::new(Shared {
            namespace: t.namespace.clone(),
            trigger: t.name.clone(),
            function: spec.function.clone(),
            kind: spec.source.kind,
            topic: spec.source.topic.clone(),
            devices: spec.devices.clone(),
            settings: Mutex::new(settings),
            connector: Mutex::new(None),
            status: Mutex::new(Arc::new(ConnectionStatus::default())),
            payloads: Mutex::default(),
            pending_dead_letters: Mutex::default(),
            live: Mutex::default(),
            dead_letters: lock(&self.dead_letters).clone(),
        });
        let engine = Engine::new(
            Target {
                namespace: t.namespace.clone(),
                function: spec.function.clone(),
                source: if spec.devices.is_some() {
                    InvocationSource::Device
                } else {
                    InvocationSource::Queue
                },
                trigger: Some(t.name.clone()),
            },
            *delivery,
            self.fire.clone(),
            Arc::new(Hooks {
                shared: shared.clone(),
            }),
        );
        let consumer = t
            .spec
            .enabled
            .then(|| self.start_consumer(&spec, &engine, &shared));
        running.insert(
            key,
            Running {
                spec,
                enabled: t.spec.enabled,
                engine,
                shared,
                consumer,
            },
        );
    }

    /// A secret was written: the running consumers whose `url_secret` names it start
    /// again, reading its new value (unsettled messages are delivered again).
    pub fn secret_changed(&self, namespace: &str, secret: &str) {
        let mut running = lock(&self.running);
        for ((ns, _), r) in running.iter_mut() {
            let uses = ns == namespace
                && r.spec
                    .source
                    .url_secret
                    .as_ref()
                    .is_some_and(|u| u.secret == secret);
            if !uses {
                continue;
            }
            if let Some(cancel) = r.consumer.take() {
                cancel.cancel();
                r.consumer = Some(self.start_consumer(&r.spec, &r.engine, &r.shared));
            }
        }
    }

    /// Stops a trigger's consumer and forgets it. A device trigger's session on the
    /// server's own broker goes too, with what the broker queued for it (a queue
    /// trigger's session on a user's broker is the user's to keep or end).
    pub fn remove(&self, namespace: &str, name: &str) {
        let Some(old) = lock(&self.running).remove(&(namespace.to_string(), name.to_string()))
        else {
            return;
        };
        let device_session = (old.spec.devices.is_some())
            .then(|| {
                old.spec
                    .source
                    .url
                    .clone()
                    .zip(old.spec.source.group.clone())
            })
            .flatten();
        old.stop();
        if let Some((url, group)) = device_session {
            tokio::spawn(async move {
                if let Err(e) = sless_queue::mqtt::discard_session(&url, &group).await {
                    tracing::warn!(session = %group, error = %e, "cannot end a deleted device trigger's broker session");
                }
            });
        }
    }

    /// The live status of a queue trigger; `None` when it is not running here.
    pub fn status(&self, namespace: &str, name: &str) -> Option<QueueStatus> {
        let running = lock(&self.running);
        let r = running.get(&(namespace.to_string(), name.to_string()))?;
        let status = lock(&r.shared.status).clone();
        let live = lock(&r.shared.live).clone();
        Some(QueueStatus {
            connection: r.consumer.is_some().then(|| status.state()),
            last_error: status.last_error(),
            lag: status.lag(),
            counters: r.engine.counters(),
            last_fired_at: live.last_fired_at,
            last_result: live.last_result,
        })
    }

    /// Delivers a dead letter of a queue trigger again, from attempt 1, through the
    /// trigger's engine (in the background: this returns once it is handed over).
    /// The dead letter goes away when the delivery succeeds, or is updated.
    pub fn redrive(&self, dl: DeadLetter) -> Result<(), RedriveError> {
        let name = dl.trigger.clone().unwrap_or_default();
        let running = lock(&self.running);
        let Some(r) = running.get(&(dl.namespace.clone(), name.clone())) else {
            return Err(RedriveError::NoTrigger(name));
        };
        if !r.enabled {
            return Err(RedriveError::Disabled(name));
        }
        let payload = Bytes::from(dl.payload);
        let mut message = dl.message;
        if let Some(m) = message.as_object_mut() {
            m.insert("attempt".into(), json!(1));
        }
        let id = message
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| dl.id.clone());
        let key = sless_queue::ordering_key(
            message.get("key").and_then(Value::as_str),
            message
                .get("partition")
                .and_then(Value::as_i64)
                .and_then(|p| i32::try_from(p).ok()),
            message
                .get("topic")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
        let shape = lock(&r.shared.settings).event;
        let delivery = Delivery {
            id: id.clone(),
            key,
            event: event_of(shape, &payload, &message),
            message: Some(message),
            call_id: None,
            redrive_of: Some(dl.id),
        };
        r.shared.hold(&id, payload);
        let engine = r.engine.clone();
        // A redrive has no broker message to acknowledge.
        let done: Done = Box::new(|| Box::pin(async {}));
        tokio::spawn(async move { engine.submit(delivery, done).await });
        Ok(())
    }

    /// Starts the consumer of `spec`: resolve the URL, make the connector, run it and
    /// pump what it receives into the engine, until the returned token is cancelled.
    fn start_consumer(
        &self,
        spec: &ConsumerSpec,
        engine: &Arc<Engine>,
        shared: &Arc<Shared>,
    ) -> CancellationToken {
        let cancel = self.shutdown.child_token();
        let status = Arc::new(ConnectionStatus::default());
        *lock(&shared.status) = status.clone();
        let consumer = Consumer {
            spec: spec.clone(),
            engine: engine.clone(),
            shared: shared.clone(),
            secrets: lock(&self.secrets).clone(),
            make_connector: self.make_connector.clone(),
            status,
            cancel: cancel.clone(),
        };
        tokio::spawn(consumer.run());
        cancel
    }

    /// Stops every consumer and engine (server shutdown): nothing unsettled is
    /// acknowledged.
    pub fn stop_all(&self) {
        stop_all(&self.running);
    }
}

fn stop_all(running: &Mutex<HashMap<Key, Running>>) {
    let all: Vec<Running> = lock(running).drain().map(|(_, r)| r).collect();
    for r in all {
        r.stop();
    }
}

impl Running {
    /// Stops consuming and drops what the engine holds without acknowledging it (the
    /// broker delivers it again to whoever consumes next).
    fn stop(self) {
        if let Some(cancel) = self.consumer {
            cancel.cancel();
        }
        self.engine.shutdown();
    }
}

/// One run of a trigger's consumer.
struct Consumer {
    spec: ConsumerSpec,
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    secrets: Option<Arc<SecretResolver>>,
    make_connector: ConnectorFactory,
    status: Arc<ConnectionStatus>,
    cancel: CancellationToken,
}

impl Consumer {
    async fn run(self) {
        if self.spec.devices.is_some() && self.spec.source.url.is_none() {
            self.status.failed(
                "this server runs no MQTT broker for devices: start it with --mqtt-listen".into(),
            );
            return;
        }
        let Some(url) = self.url().await else {
            return;
        };
        let label = format!("{}/{}", self.shared.namespace, self.shared.trigger);
        let config = SourceConfig {
            kind: self.spec.source.kind,
            url,
            topic: self.spec.source.topic.clone(),
            group: self.spec.source.group.clone().unwrap_or_else(|| {
                QueueSource::default_group(&self.shared.namespace, &self.shared.trigger)
            }),
            start_from: self.spec.source.start_from,
            prefetch: self.spec.prefetch,
            label: label.clone(),
        };
        let connector = match (self.make_connector)(config) {
            Ok(c) => c,
            Err(e) => {
                // The URL is checked when the trigger is written, so only a secret's
                // value can be refused here; the message never holds the URL.
                self.status.failed(e.to_string());
                tracing::warn!(trigger = %label, error = %e, "queue source refused");
                return;
            }
        };
        *lock(&self.shared.connector) = Some(connector.clone());
        let (tx, mut rx) = mpsc::channel::<Received>(self.spec.prefetch as usize);
        let running = tokio::spawn(connector.run(tx, self.status.clone(), self.cancel.clone()));
        loop {
            let received = tokio::select! {
                () = self.cancel.cancelled() => break,
                r = rx.recv() => match r {
                    Some(r) => r,
                    None => break,
                },
            };
            // A device trigger reads all of the namespace's telemetry; a device its
            // glob does not name is acknowledged and left alone.
            if let Some(glob) = &self.spec.devices {
                let named = sless_core::device::parse_telemetry_topic(&received.message.topic)
                    .is_some_and(|(_, d)| sless_core::device::glob_matches(glob, d));
                if !named {
                    let _ = received.ack.ack().await;
                    continue;
                }
            }
            let delivery = self.shared.delivery(&received.message);
            self.shared
                .hold(&delivery.id, received.message.payload.clone());
            let ack = received.ack;
            let trigger = label.clone();
            let done: Done = Box::new(move || {
                Box::pin(async move {
                    if let Err(e) = ack.ack().await {
                        // The broker delivers it again: a duplicate, never a loss.
                        tracing::warn!(%trigger, error = %e, "cannot acknowledge a settled message");
                    }
                })
            });
            tokio::select! {
                () = self.cancel.cancelled() => break,
                () = self.engine.submit(delivery, done) => {}
            }
        }
        drop(rx);
        let _ = running.await;
    }

    /// The broker URL: the source's own, or its secret's value, retried with back-off
    /// while the secret cannot be read (it may be created or fixed later).
    async fn url(&self) -> Option<String> {
        let source = &self.spec.source;
        if let Some(url) = &source.url {
            return Some(url.clone());
        }
        let r = source.url_secret.as_ref()?;
        let mut wait = Duration::from_millis(500);
        loop {
            let attempt = match &self.secrets {
                Some(resolver) => {
                    let env = std::iter::once((
                        "url".to_string(),
                        sless_core::EnvValue::Secret(r.clone()),
                    ))
                    .collect();
                    match resolver.resolve(&self.shared.namespace, &env).await {
                        Ok(resolved) => match resolved.secret_env.get("url") {
                            Some(v) => Ok(v.expose().to_string()),
                            None => Err(format!(
                                "source.url_secret: secret {:?} has no key {:?}",
                                r.secret, r.key
                            )),
                        },
                        // The resolver names the reference as the env variable it was given.
                        Err(e) => Err(format!(
                            "source.url_secret: {}",
                            e.to_string().trim_start_matches("env.url: ")
                        )),
                    }
                }
                None => Err("source.url_secret: this server keeps no secrets".to_string()),
            };
            match attempt {
                Ok(url) => return Some(url),
                Err(e) => self.status.failed(e),
            }
            tokio::select! {
                () = self.cancel.cancelled() => return None,
                () = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(Duration::from_secs(30));
        }
    }
}

impl Shared {
    /// The delivery of a message as received (attempt 1 in `context.message`: the
    /// engine numbers the attempts in the invocation record).
    fn delivery(&self, m: &sless_queue::Message) -> Delivery {
        let mut meta = m.meta(self.kind, 1);
        if self.devices.is_some()
            && let Some(obj) = meta.as_object_mut()
        {
            // `context.message` of a device trigger: the device, its topic, the id.
            let device =
                sless_core::device::parse_telemetry_topic(&m.topic).map(|(_, d)| d.to_string());
            obj.insert("kind".into(), json!("device"));
            obj.insert("device".into(), json!(device));
            obj.insert(
                "received_at".into(),
                json!(Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            );
        }
        let shape = lock(&self.settings).event;
        Delivery {
            id: m.id.clone(),
            key: m.ordering_key(),
            event: event_of(shape, &m.payload, &meta),
            message: Some(meta),
            call_id: None,
            redrive_of: None,
        }
    }

    fn hold(&self, id: &str, payload: Bytes) {
        let mut payloads = lock(&self.payloads);
        let entry = payloads.entry(id.to_string()).or_insert((payload, 0));
        entry.1 += 1;
    }

    fn payload(&self, id: &str) -> Bytes {
        lock(&self.payloads)
            .get(id)
            .map(|(p, _)| p.clone())
            .unwrap_or_default()
    }

    fn release(&self, id: &str) {
        let mut payloads = lock(&self.payloads);
        if let Some(entry) = payloads.get_mut(id) {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                payloads.remove(id);
            }
        }
    }

    fn connector(&self) -> anyhow::Result<Arc<dyn Connector>> {
        lock(&self.connector)
            .clone()
            .ok_or_else(|| anyhow::anyhow!("not connected to the broker"))
    }
}

/// The handler's event for `payload`, as the trigger's `event` says.
fn event_of(shape: EventShape, payload: &[u8], message: &Value) -> Value {
    let payload = sless_core::delivery::payload_event(payload);
    match shape {
        EventShape::Payload => payload,
        EventShape::Envelope => json!({"payload": payload, "message": message}),
    }
}

/// Publishes responses, writes dead letters.
struct Hooks {
    shared: Arc<Shared>,
}

#[async_trait]
impl DeliveryHooks for Hooks {
    async fn attempt_started(&self, _delivery: &Delivery, _attempt: u32) {
        lock(&self.shared.live).last_fired_at = Some(Utc::now());
    }

    async fn settled(&self, delivery: &Delivery, settled: &Settled) -> anyhow::Result<()> {
        let s = &self.shared;
        let settings = lock(&s.settings).clone();
        match settled {
            Settled::Succeeded { response, .. } => {
                lock(&s.live).last_result = Some(TriggerResult::Finished {
                    status: response.as_ref().map_or(200, |r| r.status),
                    error: None,
                });
                if let Some(topic) = &settings.response_topic {
                    let body = response
                        .as_ref()
                        .map(|r| r.body.clone())
                        .unwrap_or_default();
                    s.connector()?.publish(topic, body, &[]).await?;
                }
                if let Some(id) = &delivery.redrive_of {
                    s.dead_letters.remove(&s.namespace, id).await?;
                }
            }
            Settled::DeadLettered {
                attempts,
                last_status,
                error,
                ..
            } => {
                lock(&s.live).last_result = Some(TriggerResult::Finished {
                    status: *last_status,
                    error: error.clone(),
                });
                let payload = s.payload(&delivery.id);
                let id = match &delivery.redrive_of {
                    Some(id) => id.clone(),
                    None => lock(&s.pending_dead_letters)
                        .entry(delivery.id.clone())
                        .or_insert_with(sless_invoke::new_request_id)
                        .clone(),
                };
                let mut message = delivery.message.clone().unwrap_or(Value::Null);
                if let Some(m) = message.as_object_mut() {
                    m.insert("attempt".into(), json!(attempts));
                }
                s.dead_letters
                    .write(DeadLetter {
                        id,
                        namespace: s.namespace.clone(),
                        source: if s.devices.is_some() {
                            DeadLetterSource::Device
                        } else {
                            DeadLetterSource::Queue
                        },
                        trigger: Some(s.trigger.clone()),
                        function: s.function.clone(),
                        payload: payload.to_vec(),
                        message,
                        attempts: *attempts,
                        last_status: *last_status,
                        error: error.clone(),
                        failed_at: Utc::now(),
                    })
                    .await?;
                if let Some(topic) = &settings.dead_letter_topic {
                    let headers = vec![
                        ("x-sless-original-topic".to_string(), s.topic.clone()),
                        ("x-sless-attempts".to_string(), attempts.to_string()),
                        ("x-sless-last-status".to_string(), last_status.to_string()),
                        (
                            "x-sless-error".to_string(),
                            error.clone().unwrap_or_default(),
                        ),
                    ];
                    s.connector()?.publish(topic, payload, &headers).await?;
                }
                lock(&s.pending_dead_letters).remove(&delivery.id);
            }
        }
        s.release(&delivery.id);
        Ok(())
    }
}

/// Locks `m`, ignoring poisoning: every critical section here leaves the data whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
