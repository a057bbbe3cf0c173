//! The NATS JetStream connector, on `async-nats`, built without its `server_2_10+`
//! features (the Debian server is 2.9.10, and the calls used here are tested
//! against it).
//!
//! The subject `topic` is read through a durable pull consumer named `group` on the
//! stream that covers the subject, which is created (file storage, named
//! `SLESS_<subject>_<hash>`) when no stream does. `start_from` picks the deliver
//! policy of a consumer created here (`new` or `all`); an existing one resumes.
//!
//! Acks: explicit, double-acked (the server confirms). `max_ack_pending` is the
//! prefetch. `ack_wait` is 15 s, and every message the engine holds gets an
//! in-progress ack every 5 s, so a slow delivery is not redelivered while a crashed
//! server's messages come back within 15 s. When the connector shuts down it naks
//! what it still holds, and a message dropped without an ack is nak'd too, so
//! those come back at once rather than after `ack_wait`.
//!
//! Any connection trouble ends the session (the client is dropped) and a new one
//! is made with jittered back-off (200 ms doubling to 30 s) for as long as the
//! connector runs. JetStream acks name the message, not the connection, so a
//! message handed out before a reconnect can still be acked after it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer, stream};
use async_nats::{ConnectOptions, HeaderMap};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use sless_core::{Backoff, StartFrom};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{ConnectionStatus, Connector, Message, QueueError, Received, SourceConfig};

/// Reconnect back-off: 200 ms doubling to 30 s, jittered.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
/// A connect (or a JetStream API call) that takes longer than this fails the session.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The server redelivers a message not acked (nor marked in progress) for this long.
const ACK_WAIT: Duration = Duration::from_secs(15);
/// How often messages held by the engine are marked in progress (well within `ACK_WAIT`).
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How often the consumer's pending count is read for `status.lag`.
const LAG_EVERY: Duration = Duration::from_secs(5);
/// Idle heartbeat of the pull stream: a server gone silent is noticed within ~2×.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// Reads one subject through a durable consumer; see the module docs.
pub struct NatsConnector {
    config: SourceConfig,
    durable: String,
    /// The JetStream context of the current connection, if connected.
    context: Mutex<Option<jetstream::Context>>,
    /// Subjects known to be covered by a stream on this connection (for publish).
    covered: Mutex<HashSet<String>>,
    /// Messages handed to the engine and not yet acked, by stream sequence.
    held: Arc<Mutex<HashMap<u64, Arc<jetstream::message::Acker>>>>,
}

impl NatsConnector {
    pub fn new(config: SourceConfig) -> Result<Self, QueueError> {
        if !config.url.contains("://")
            || !matches!(config.url.split("://").next(), Some("nats" | "tls"))
        {
            return Err(QueueError::Config(
                "a nats source needs a nats:// or tls:// url".into(),
            ));
        }
        if config.topic.is_empty() || config.topic.contains(char::is_whitespace) {
            return Err(QueueError::Config(format!(
                "{:?} is not a NATS subject",
                config.topic
            )));
        }
        let durable = sanitize(&config.group);
        if durable.is_empty() {
            return Err(QueueError::Config("the consumer group is empty".into()));
        }
        Ok(Self {
            config,
            durable,
            context: Mutex::new(None),
            covered: Mutex::new(HashSet::new()),
            held: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    fn set_context(&self, context: Option<jetstream::Context>) {
        *self.context.lock().unwrap_or_else(|e| e.into_inner()) = context;
        self.covered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<jetstream::message::Acker>>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One connection's life; `Ok` when shut down or the engine has gone, `Err`
    /// with the reason when the connection or the consumer failed.
    async fn session(
        &self,
        deliver: &mpsc::Sender<Received>,
        status: &ConnectionStatus,
        shutdown: &CancellationToken,
        connected: &mut bool,
    ) -> Result<(), String> {
        let (lost_tx, mut lost) = mpsc::unbounded_channel::<String>();
        let options = ConnectOptions::new()
            .name(format!("sless {}", self.config.label))
            .connection_timeout(CONNECT_TIMEOUT)
            .event_callback(move |event| {
                let lost_tx = lost_tx.clone();
                async move {
                    if matches!(
                        event,
                        async_nats::Event::Disconnected | async_nats::Event::Closed
                    ) {
                        // The session may have ended already; nobody to tell then.
                        let _ = lost_tx.send(format!("connection {event}"));
                    }
                }
            });
        let client = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            c = tokio::time::timeout(CONNECT_TIMEOUT, options.connect(self.config.url.as_str())) => {
                c.map_err(|_| format!("no answer from the server within {CONNECT_TIMEOUT:?}"))?
                    .map_err(|e| e.to_string())?
            }
        };
        let context = jetstream::new(client.clone());
        let setup = async {
            let stream = self.stream_for(&context, &self.config.topic).await?;
            let config = consumer::pull::Config {
                durable_name: Some(self.durable.clone()),
                deliver_policy: match self.config.start_from {
                    StartFrom::Earliest => consumer::DeliverPolicy::All,
                    StartFrom::Latest => consumer::DeliverPolicy::New,
                },
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_ack_pending: i64::from(self.config.prefetch.max(1)),
                filter_subject: self.config.topic.clone(),
                ..Default::default()
            };
            let consumer = stream
                .get_or_create_consumer(&self.durable, config)
                .await
                .map_err(|e| format!("consumer {}: {e}", self.durable))?;
            let messages = consumer
                .stream()
                .max_messages_per_batch(usize::try_from(self.config.prefetch.max(1)).unwrap_or(1))
                .heartbeat(HEARTBEAT)
                .messages()
                .await
                .map_err(|e| format!("pulling from {}: {e}", self.durable))?;
            Ok::<_, String>((consumer, messages))
        };
        let (mut consumer, mut messages) = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            r = tokio::time::timeout(CONNECT_TIMEOUT, setup) => {
                r.map_err(|_| format!("no answer from JetStream within {CONNECT_TIMEOUT:?}"))??
            }
        };

        self.set_context(Some(context));
        *connected = true;
        status.connected();
        tracing::info!(trigger = %self.config.label, subject = %self.config.topic, consumer = %self.durable, "nats consumer subscribed");

        let mut lag = tokio::time::interval(LAG_EVERY);
        lag.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let result = loop {
            let next = tokio::select! {
                () = shutdown.cancelled() => break Ok(()),
                reason = lost.recv() => break Err(reason.unwrap_or_else(|| "connection lost".into())),
                _ = lag.tick() => {
                    if let Ok(Ok(info)) = tokio::time::timeout(CONNECT_TIMEOUT, consumer.info()).await {
                        status.set_lag(Some(info.num_pending));
                    }
                    continue;
                }
                next = messages.next() => next,
            };
            let message = match next {
                Some(Ok(message)) => message,
                Some(Err(e)) => break Err(e.to_string()),
                None => break Err("the message stream ended".into()),
            };
            let received = match self.received(message) {
                Ok(received) => received,
                Err(e) => {
                    tracing::warn!(trigger = %self.config.label, error = %e, "skipping a message without JetStream metadata");
                    continue;
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break Ok(()),
                sent = deliver.send(received) => if sent.is_err() {
                    break Ok(());
                },
            }
        };
        self.set_context(None);
        result
    }

    /// The stream covering `subject`, created when none does.
    async fn stream_for(
        &self,
        context: &jetstream::Context,
        subject: &str,
    ) -> Result<stream::Stream, String> {
        let name = match context.stream_by_subject(subject).await {
            Ok(name) => name,
            Err(_) => {
                let name = stream_name(subject);
                match context
                    .create_stream(stream::Config {
                        name: name.clone(),
                        subjects: vec![subject.to_owned()],
                        storage: stream::StorageType::File,
                        ..Default::default()
                    })
                    .await
                {
                    Ok(_) => {
                        tracing::info!(subject, stream = %name, "created a JetStream stream");
                        name
                    }
                    // Another connector may have created it meanwhile: look again.
                    Err(create) => context
                        .stream_by_subject(subject)
                        .await
                        .map_err(|_| format!("creating stream {name}: {create}"))?,
                }
            }
        };
        context
            .get_stream(&name)
            .await
            .map_err(|e| format!("stream {name}: {e}"))
    }

    fn received(&self, message: jetstream::Message) -> Result<Received, String> {
        let info = message.info().map_err(|e| e.to_string())?;
        let stream = info.stream.to_owned();
        let sequence = info.stream_sequence;
        let redelivered = info.delivered > 1;
        let published_at = Some(info.published);
        let (message, acker) = message.split();
        let acker = Arc::new(acker);
        self.held().insert(sequence, acker.clone());
        let headers = message.headers.as_ref().map(headers).unwrap_or_default();
        let message = Message {
            id: format!("{stream}:{sequence}"),
            topic: self.config.topic.clone(),
            key: Some(message.subject.to_string()),
            partition: None,
            offset: i64::try_from(sequence).ok(),
            headers,
            published_at,
            redelivered,
            payload: message.payload,
        };
        Ok(Received {
            message,
            ack: Box::new(NatsAck {
                acker,
                sequence,
                held: self.held.clone(),
                settled: false,
            }),
        })
    }

    /// Marks every held message in progress, so the server does not redeliver it.
    async fn keep_alive(&self) {
        let held: Vec<_> = self.held().values().cloned().collect();
        let marks = held.iter().map(|acker| acker.ack_with(AckKind::Progress));
        // A missed mark only risks a redelivery (at-least-once): nothing to do.
        let _ = tokio::time::timeout(PROGRESS_EVERY, futures::future::join_all(marks)).await;
    }

    /// Hands back every held message for redelivery (at shutdown), all at once and
    /// bounded, so a server that is down does not hold up the shutdown.
    async fn release(&self) {
        let held: Vec<_> = self.held().drain().map(|(_, acker)| acker).collect();
        // Confirmed (double) so they are sent before the client goes away; without
        // them the server redelivers after ACK_WAIT instead.
        let naks = held
            .iter()
            .map(|acker| acker.double_ack_with(AckKind::Nak(None)));
        let _ = tokio::time::timeout(Duration::from_secs(2), futures::future::join_all(naks)).await;
    }

    /// Publishes and waits for the stream's PubAck, creating a stream for `topic`
    /// first if none covers it (or the publish would have no responder).
    async fn publish_on(
        &self,
        context: &jetstream::Context,
        topic: &str,
        payload: Bytes,
        headers: &[(String, String)],
    ) -> Result<(), QueueError> {
        let known = self
            .covered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(topic);
        if !known {
            self.stream_for(context, topic)
                .await
                .map_err(QueueError::Broker)?;
            self.covered
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(topic.to_owned());
        }
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(k.as_str(), v.as_str());
        }
        context
            .publish_with_headers(topic.to_owned(), map, payload)
            .await
            .map_err(|e| QueueError::Broker(e.to_string()))?
            .await
            .map_err(|e| QueueError::Broker(e.to_string()))?;
        Ok(())
    }
}

#[async_trait]
impl Connector for NatsConnector {
    async fn run(
        self: Arc<Self>,
        deliver: mpsc::Sender<Received>,
        status: Arc<ConnectionStatus>,
        shutdown: CancellationToken,
    ) {
        status.connecting(None);
        let keeper = {
            let this = self.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(PROGRESS_EVERY);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        _ = every.tick() => this.keep_alive().await,
                    }
                }
            })
        };
        let mut retry = 0u32;
        while !shutdown.is_cancelled() {
            let mut connected = false;
            let result = self
                .session(&deliver, &status, &shutdown, &mut connected)
                .await;
            if shutdown.is_cancelled() || deliver.is_closed() {
                break;
            }
            let error = match result {
                Ok(()) => "the connection ended".to_owned(),
                Err(e) => e,
            };
            tracing::warn!(trigger = %self.config.label, error = %error, "nats session ended; reconnecting");
            if is_refused(&error) {
                status.failed(error);
            } else {
                status.connecting(Some(error));
            }
            retry = if connected {
                1
            } else {
                retry.saturating_add(1)
            };
            let wait = RECONNECT.jittered(retry, rand::random::<f64>());
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        keeper.abort();
        self.release().await;
    }

    async fn publish(
        &self,
        topic: &str,
        payload: Bytes,
        headers: &[(String, String)],
    ) -> Result<(), QueueError> {
        let context = self
            .context
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(QueueError::NotConnected)?;
        tokio::time::timeout(
            CONNECT_TIMEOUT,
            self.publish_on(&context, topic, payload, headers),
        )
        .await
        .map_err(|_| QueueError::Broker(format!("no PubAck within {CONNECT_TIMEOUT:?}")))?
    }
}

/// Acks one message (double ack: the server confirms it).
struct NatsAck {
    acker: Arc<jetstream::message::Acker>,
    sequence: u64,
    held: Arc<Mutex<HashMap<u64, Arc<jetstream::message::Acker>>>>,
    /// Acked (or tried): nothing left to do on drop.
    settled: bool,
}

impl NatsAck {
    /// No longer kept alive with in-progress acks (unless a redelivery of the same
    /// message replaced this one meanwhile).
    fn forget(&self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held
            .get(&self.sequence)
            .is_some_and(|current| Arc::ptr_eq(current, &self.acker))
        {
            held.remove(&self.sequence);
        }
    }
}

#[async_trait]
impl crate::Ack for NatsAck {
    async fn ack(mut self: Box<Self>) -> Result<(), QueueError> {
        self.settled = true;
        let result = tokio::time::timeout(CONNECT_TIMEOUT, self.acker.double_ack())
            .await
            .map_err(|_| QueueError::Broker("no answer to the ack".into()))
            .and_then(|r| r.map_err(|e| QueueError::Broker(e.to_string())));
        // Acked or not, it is no longer ours to keep alive: a failed ack means the
        // server redelivers after ACK_WAIT.
        self.forget();
        result
    }
}

impl Drop for NatsAck {
    /// Dropped without an ack (the engine gave it up, or it never reached the
    /// engine): stop keeping it alive and hand it back for redelivery now rather
    /// than after ACK_WAIT.
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        self.forget();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let acker = self.acker.clone();
            runtime.spawn(async move {
                // Without it the server redelivers after ACK_WAIT: nothing is lost.
                let _ = acker.ack_with(AckKind::Nak(None)).await;
            });
        }
    }
}

/// Message headers as text, repeated values as repeated pairs.
fn headers(map: &HeaderMap) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = map
        .iter()
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |v| (name.to_string(), v.as_str().to_owned()))
        })
        .collect();
    pairs.sort();
    pairs
}

/// A stream name for `subject`: readable, and unique through a hash of the subject
/// (two subjects that sanitize alike still get two streams).
fn stream_name(subject: &str) -> String {
    let readable: String = sanitize(subject).chars().take(32).collect();
    format!("SLESS_{readable}_{:016x}", fnv1a(subject.as_bytes()))
}

/// A name NATS accepts for streams and durables: no `.`, `*`, `>`, whitespace or
/// path separators.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// FNV-1a, 64 bits: stable across builds (the std hasher is not).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Whether the server refused us (credentials, permissions) or cannot serve the
/// source at all (JetStream off): shown as `failed` while the connector retries.
fn is_refused(error: &str) -> bool {
    let error = error.to_ascii_lowercase();
    error.contains("authorization violation")
        || error.contains("permissions violation")
        || error.contains("jetstream not enabled")
        || error.contains("jetstream unavailable")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_jetstream_or_refusing_us_is_a_failed_source() {
        assert!(is_refused("creating stream SLESS_x: jetstream unavailable"));
        assert!(is_refused("Authorization Violation"));
        assert!(!is_refused("connection refused (os error 111)"));
    }

    #[test]
    fn stream_names_are_valid_and_distinct() {
        let a = stream_name("orders.in");
        let b = stream_name("orders_in");
        assert!(a.starts_with("SLESS_orders_in_"), "{a}");
        assert_ne!(a, b);
        assert_eq!(a, stream_name("orders.in"));
        assert!(!stream_name("a.*.>").contains(['.', '*', '>']));
    }
}
