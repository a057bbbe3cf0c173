//! Broker connectors for queue triggers: one [`Connector`] per trigger, behind the same
//! seam for every kind (AMQP 0-9-1, Kafka, MQTT, NATS JetStream).
//!
//! A connector owns its connection. It connects (retrying with back-off for as long
//! as it runs: a broker that is down is not an error), subscribes, reports its
//! [`ConnectionStatus`], and hands every message to the delivery engine as a
//! [`Received`]: the message plus an [`Ack`] the engine calls once the delivery
//! succeeded or was dead-lettered. Nothing is acknowledged before that, so a message
//! whose delivery never ended is delivered again after a restart (at-least-once).
//!
//! Each connector also gives a [`Publisher`] for `response_topic` and
//! `dead_letter_topic`.

pub mod amqp;
pub mod kafka;
pub mod mqtt;
pub mod nats;
mod status;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use sless_core::{QueueKind, StartFrom};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use status::ConnectionStatus;

/// What a connector needs to know: where to connect and what to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    pub kind: QueueKind,
    /// The broker's URL, credentials included (already resolved from a secret).
    pub url: String,
    /// Queue (amqp), topic (kafka), topic filter (mqtt), subject (nats).
    pub topic: String,
    /// Consumer group (kafka), session / client id (mqtt), durable consumer (nats).
    pub group: String,
    /// Where a group that has never consumed starts.
    pub start_from: StartFrom,
    /// At most this many messages are handed out and not yet acknowledged (the
    /// broker-side prefetch: AMQP `basic.qos`, NATS `max_ack_pending`, MQTT receive
    /// maximum). The engine sets it from the trigger's concurrency, with room for
    /// messages waiting for a retry.
    pub prefetch: u32,
    /// For logs: `namespace/trigger`.
    pub label: String,
}

/// One message as the broker gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Stable across redeliveries of the same message where the broker allows it:
    /// AMQP `message_id` (or a fresh one), Kafka `topic/partition/offset`, NATS
    /// `stream:sequence`, MQTT 5 user property `message-id` (or a fresh one).
    pub id: String,
    /// The topic (or queue, or subject) it arrived on.
    pub topic: String,
    /// The ordering key: Kafka partition key, MQTT topic, AMQP routing key, NATS subject.
    pub key: Option<String>,
    /// Kafka only.
    pub partition: Option<i32>,
    /// Kafka offset, NATS stream sequence, AMQP delivery tag.
    pub offset: Option<i64>,
    /// Headers (AMQP headers, Kafka headers, MQTT 5 user properties, NATS headers),
    /// as text.
    pub headers: Vec<(String, String)>,
    /// When the broker says it was published, where it does.
    pub published_at: Option<DateTime<Utc>>,
    /// The broker redelivered it (AMQP `redelivered`, NATS delivery count > 1, MQTT DUP).
    pub redelivered: bool,
    pub payload: Bytes,
}

impl Message {
    /// What `ordering: key` orders by: the message's key; for a Kafka message without
    /// one, its partition (`topic#partition`), Kafka's own unit of order.
    pub fn ordering_key(&self) -> Option<String> {
        ordering_key(self.key.as_deref(), self.partition, &self.topic)
    }

    /// `context.message` as the contract words it, for the handler and dead letters.
    pub fn meta(&self, kind: QueueKind, attempt: u32) -> serde_json::Value {
        let headers: serde_json::Map<String, serde_json::Value> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        serde_json::json!({
            "kind": kind.as_str(),
            "topic": self.topic,
            "key": self.key,
            "partition": self.partition,
            "offset": self.offset,
            "id": self.id,
            "headers": headers,
            "attempt": attempt,
            "published_at": self.published_at.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        })
    }
}

/// What `ordering: key` orders a message by, from its parts (as [`Message::ordering_key`];
/// also for a dead letter's stored `context.message` at redrive).
pub fn ordering_key(key: Option<&str>, partition: Option<i32>, topic: &str) -> Option<String> {
    key.map(str::to_string)
        .or_else(|| partition.map(|p| format!("{topic}#{p}")))
}

/// Acknowledges one message to its broker. Called exactly once per message, after
/// its delivery succeeded or was dead-lettered; dropping it without calling leaves
/// the message unacknowledged (the broker redelivers it after a reconnect).
#[async_trait]
pub trait Ack: Send + 'static {
    async fn ack(self: Box<Self>) -> Result<(), QueueError>;
}

/// A message and the way to acknowledge it.
pub struct Received {
    pub message: Message,
    pub ack: Box<dyn Ack>,
}

impl std::fmt::Debug for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("message", &self.message)
            .finish_non_exhaustive()
    }
}

/// One trigger's consumer.
#[async_trait]
pub trait Connector: Send + Sync + 'static {
    /// Connects, subscribes and sends every message to `deliver` until `shutdown`
    /// is cancelled, reconnecting with back-off after any failure, and keeps
    /// `status` current. The channel's capacity is the engine's back-pressure: a full
    /// channel stops the connector reading. Returns once shut down.
    async fn run(
        self: Arc<Self>,
        deliver: mpsc::Sender<Received>,
        status: Arc<ConnectionStatus>,
        shutdown: CancellationToken,
    );

    /// Publishes to `topic` on the same broker (for `response_topic` and
    /// `dead_letter_topic`). Waits for the broker's confirmation where the protocol
    /// has one; errors when not connected.
    async fn publish(
        &self,
        topic: &str,
        payload: Bytes,
        headers: &[(String, String)],
    ) -> Result<(), QueueError>;
}

/// The connector for `config.kind`.
pub fn connector(config: SourceConfig) -> Result<Arc<dyn Connector>, QueueError> {
    Ok(match config.kind {
        QueueKind::Amqp => Arc::new(amqp::AmqpConnector::new(config)?),
        QueueKind::Kafka => Arc::new(kafka::KafkaConnector::new(config)?),
        QueueKind::Mqtt => Arc::new(mqtt::MqttConnector::new(config)?),
        QueueKind::Nats => Arc::new(nats::NatsConnector::new(config)?),
    })
}

/// Errors of connectors.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The configuration cannot work (a URL the client library refuses).
    #[error("invalid source: {0}")]
    Config(String),
    /// Not connected to the broker now.
    #[error("not connected to the broker")]
    NotConnected,
    /// The broker or the connection failed.
    #[error("{0}")]
    Broker(String),
}
