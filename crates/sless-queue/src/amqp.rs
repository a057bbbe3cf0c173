//! The AMQP 0-9-1 connector (RabbitMQ), on `lapin`.
//!
//! One connection per trigger, two channels on it: one consumes the queue `topic`
//! with manual acks and `basic.qos(prefetch)`, the other publishes with publisher
//! confirms (for `response_topic` and `dead_letter_topic`). A queue that exists is
//! used as it is (classic, quorum, with whatever arguments); a missing one is
//! declared durable. Those checks, and the queue depth read for `lag`, run on
//! short-lived channels of their own, since a failed check closes its channel. A lost connection is
//! re-established with jittered back-off (200 ms doubling to 30 s) for as long as the
//! connector runs; deliveries handed out on the old connection can no longer be
//! acked (their ack fails), and the broker redelivers them: at-least-once.
//!
//! Message ids: the `message_id` property when the publisher set one (stable across
//! redeliveries); otherwise a fresh `amqp-<random>` id per delivery, since AMQP gives
//! nothing else that identifies a message across redeliveries.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use lapin::Acker;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use sless_core::Backoff;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{ConnectionStatus, Connector, Message, QueueError, Received, SourceConfig};

/// Reconnect back-off: 200 ms doubling to 30 s, jittered.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
/// A TCP connect or handshake that takes longer than this is a failed attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the queue depth is read for `status.lag`.
const LAG_EVERY: Duration = Duration::from_secs(5);
/// AMQP `delivery_mode` for messages that survive a broker restart.
const PERSISTENT: u8 = 2;

/// Consumes one durable queue; see the module docs.
pub struct AmqpConnector {
    config: SourceConfig,
    queue: ShortString,
    /// The confirm-mode channel of the current connection, if connected.
    publisher: Mutex<Option<Arc<PublishChannel>>>,
}

/// The publishing side of one connection.
struct PublishChannel {
    connection: Arc<Connection>,
    channel: Channel,
    /// Queues declared on this connection, so each publish costs no declare.
    declared: Mutex<HashSet<String>>,
}

impl AmqpConnector {
    pub fn new(config: SourceConfig) -> Result<Self, QueueError> {
        let scheme = config.url.split("://").next().unwrap_or_default();
        if !matches!(scheme, "amqp" | "amqps") || !config.url.contains("://") {
            return Err(QueueError::Config(format!(
                "an amqp source needs an amqp:// or amqps:// url, not {:?}",
                redact(&config.url)
            )));
        }
        let queue = short(&config.topic)?;
        if config.topic.is_empty() {
            return Err(QueueError::Config("the queue name is empty".into()));
        }
        Ok(Self {
            config,
            queue,
            publisher: Mutex::new(None),
        })
    }

    fn set_publisher(&self, publisher: Option<Arc<PublishChannel>>) {
        *self.publisher.lock().unwrap_or_else(|e| e.into_inner()) = publisher;
    }

    fn current_publisher(&self) -> Option<Arc<PublishChannel>> {
        self.publisher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// One connection's life: connect, declare, consume until the connection fails
    /// (`Err`) or the connector is shut down or the engine has gone (`Ok`).
    async fn session(
        &self,
        deliver: &mpsc::Sender<Received>,
        status: &ConnectionStatus,
        shutdown: &CancellationToken,
        connected: &mut bool,
    ) -> Result<(), String> {
        let properties = ConnectionProperties::default()
            .with_connection_name(format!("sless {}", self.config.label).into());
        let connection = Arc::new(tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            c = tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(&self.config.url, properties)) => {
                c.map_err(|_| format!("no answer from the broker within {CONNECT_TIMEOUT:?}"))?
                    .map_err(|e| e.to_string())?
            }
        });
        let result = self
            .consume(&connection, deliver, status, shutdown, connected)
            .await;
        self.set_publisher(None);
        // Closing rather than dropping ends the broker's side cleanly (it requeues
        // what was not acked) and stops lapin's IO loop.
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            connection.close(200, "sless connector stopping".into()),
        )
        .await;
        result
    }

    async fn consume(
        &self,
        connection: &Arc<Connection>,
        deliver: &mpsc::Sender<Received>,
        status: &ConnectionStatus,
        shutdown: &CancellationToken,
        connected: &mut bool,
    ) -> Result<(), String> {
        let err = |e: lapin::Error| e.to_string();
        ensure_queue(connection, &self.queue).await.map_err(err)?;
        let consume_channel = connection.create_channel().await.map_err(err)?;
        let prefetch = u16::try_from(self.config.prefetch.max(1)).unwrap_or(u16::MAX);
        consume_channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(err)?;

        let publish_channel = connection.create_channel().await.map_err(err)?;
        publish_channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(err)?;
        let publisher = Arc::new(PublishChannel {
            connection: connection.clone(),
            channel: publish_channel,
            declared: Mutex::new(HashSet::from([self.config.topic.clone()])),
        });

        let tag = format!("sless-{:016x}", rand::random::<u64>());
        let mut consumer = consume_channel
            .basic_consume(
                self.queue.clone(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(err)?;

        self.set_publisher(Some(publisher.clone()));
        *connected = true;
        status.connected();
        tracing::info!(trigger = %self.config.label, queue = %self.config.topic, "amqp consumer subscribed");

        let mut lag = tokio::time::interval(LAG_EVERY);
        lag.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let delivery = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                _ = lag.tick() => {
                    // A broker slow to answer leaves the last figure in place.
                    if let Ok(depth) = tokio::time::timeout(LAG_EVERY, depth(connection, &self.queue)).await {
                        status.set_lag(depth);
                    }
                    continue;
                }
                next = consumer.next() => next,
            };
            let delivery = match delivery {
                Some(Ok(delivery)) => delivery,
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("the broker cancelled the consumer".into()),
            };
            let received = self.received(delivery);
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                sent = deliver.send(received) => if sent.is_err() {
                    // The engine is gone: nothing will ever ack; stop consuming.
                    return Ok(());
                },
            }
        }
    }

    fn received(&self, delivery: Delivery) -> Received {
        let Delivery {
            delivery_tag,
            routing_key,
            redelivered,
            properties,
            data,
            acker,
            ..
        } = delivery;
        let id = properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned())
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| format!("amqp-{:032x}", rand::random::<u128>()));
        let headers = properties
            .headers()
            .as_ref()
            .map(|table| {
                table
                    .inner()
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), text(v)))
                    .collect()
            })
            .unwrap_or_default();
        let published_at = properties
            .timestamp()
            .and_then(|secs| i64::try_from(secs).ok())
            .and_then(|secs| DateTime::<Utc>::from_timestamp(secs, 0));
        let message = Message {
            id,
            topic: self.config.topic.clone(),
            key: Some(routing_key.as_str().to_owned()),
            partition: None,
            offset: i64::try_from(delivery_tag).ok(),
            headers,
            published_at,
            redelivered,
            payload: Bytes::from(data),
        };
        Received {
            message,
            ack: Box::new(AmqpAck { acker }),
        }
    }
}

#[async_trait]
impl Connector for AmqpConnector {
    async fn run(
        self: Arc<Self>,
        deliver: mpsc::Sender<Received>,
        status: Arc<ConnectionStatus>,
        shutdown: CancellationToken,
    ) {
        status.connecting(None);
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
            tracing::warn!(trigger = %self.config.label, error = %error, "amqp connection lost; reconnecting");
            if is_refused(&error) {
                status.failed(error);
            } else {
                status.connecting(Some(error));
            }
            // A connection that got as far as consuming starts the back-off afresh.
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
        self.set_publisher(None);
    }

    async fn publish(
        &self,
        topic: &str,
        payload: Bytes,
        headers: &[(String, String)],
    ) -> Result<(), QueueError> {
        let publisher = self.current_publisher().ok_or(QueueError::NotConnected)?;
        let queue = short(topic)?;
        let broker = |e: lapin::Error| QueueError::Broker(e.to_string());
        let known = publisher
            .declared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(topic);
        if !known {
            // Publishing to the default exchange reaches a queue only if it exists:
            // declare it durable first, as the consumer of `topic` would.
            ensure_queue(&publisher.connection, &queue)
                .await
                .map_err(broker)?;
            publisher
                .declared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(topic.to_owned());
        }
        let mut table = FieldTable::default();
        for (k, v) in headers {
            table.insert(
                short(k)?,
                AMQPValue::LongString(LongString::from(v.as_bytes())),
            );
        }
        let properties = BasicProperties::default()
            .with_delivery_mode(PERSISTENT)
            .with_message_id(format!("sless-{:032x}", rand::random::<u128>()).into())
            .with_timestamp(u64::try_from(Utc::now().timestamp()).unwrap_or_default())
            .with_headers(table);
        let confirm = publisher
            .channel
            .basic_publish(
                ShortString::default(),
                queue,
                BasicPublishOptions::default(),
                &payload,
                properties,
            )
            .await
            .map_err(broker)?
            .await
            .map_err(broker)?;
        if confirm.is_nack() {
            return Err(QueueError::Broker(format!(
                "the broker refused the message for {topic}"
            )));
        }
        Ok(())
    }
}

/// Acks one delivery on the channel it came from.
struct AmqpAck {
    acker: Acker,
}

#[async_trait]
impl crate::Ack for AmqpAck {
    async fn ack(self: Box<Self>) -> Result<(), QueueError> {
        match self.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => Ok(()),
            // The channel closed since: the broker has requeued the message already.
            Ok(false) => Err(QueueError::Broker(
                "the channel this message came on is closed; the broker redelivers it".into(),
            )),
            Err(e) => Err(QueueError::Broker(e.to_string())),
        }
    }
}

/// Declares `queue` durable unless it exists: an existing queue is taken as it is,
/// whatever its type and arguments (a durable declare of a queue declared otherwise
/// fails with PRECONDITION_FAILED). Each check runs on a channel of its own, which
/// the broker closes when the check fails.
async fn ensure_queue(connection: &Connection, queue: &ShortString) -> Result<(), lapin::Error> {
    let probe = connection.create_channel().await?;
    let exists = probe
        .queue_declare(
            queue.clone(),
            QueueDeclareOptions::durable().passive(),
            FieldTable::default(),
        )
        .await
        .is_ok();
    if exists {
        let _ = probe.close(200, "checked".into()).await;
        return Ok(());
    }
    let declare = connection.create_channel().await?;
    declare
        .queue_declare(
            queue.clone(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await?;
    // Closing a channel that did its work; a failure here changes nothing.
    let _ = declare.close(200, "declared".into()).await;
    Ok(())
}

/// Messages ready in the queue (not those handed out and unacked).
async fn depth(connection: &Connection, queue: &ShortString) -> Option<u64> {
    let channel = connection.create_channel().await.ok()?;
    let declared = channel
        .queue_declare(
            queue.clone(),
            QueueDeclareOptions::durable().passive(),
            FieldTable::default(),
        )
        .await
        .ok();
    if declared.is_some() {
        let _ = channel.close(200, "read".into()).await;
    }
    Some(u64::from(declared?.message_count()))
}

/// A name as AMQP's short string (at most 255 bytes).
fn short(name: &str) -> Result<ShortString, QueueError> {
    ShortString::try_new(name).map_err(|e| QueueError::Config(format!("{name:?}: {e}")))
}

/// Whether the broker refused us (credentials, vhost, permissions): the source is
/// misconfigured, which the status shows as `failed` while the connector retries.
fn is_refused(error: &str) -> bool {
    error.contains("ACCESS_REFUSED") || error.contains("NOT_ALLOWED")
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// A header value as text: strings as they are, numbers and booleans printed,
/// arrays and tables as JSON.
fn text(value: &AMQPValue) -> String {
    match json(value) {
        serde_json::Value::String(s) => s,
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn json(value: &AMQPValue) -> serde_json::Value {
    use serde_json::Value;
    match value {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(n) => Value::from(*n),
        AMQPValue::ShortShortUInt(n) => Value::from(*n),
        AMQPValue::ShortInt(n) => Value::from(*n),
        AMQPValue::ShortUInt(n) => Value::from(*n),
        AMQPValue::LongInt(n) => Value::from(*n),
        AMQPValue::LongUInt(n) => Value::from(*n),
        AMQPValue::LongLongInt(n) => Value::from(*n),
        AMQPValue::Float(n) => Value::from(*n),
        AMQPValue::Double(n) => Value::from(*n),
        AMQPValue::DecimalValue(d) => {
            Value::from(f64::from(d.value) / 10f64.powi(i32::from(d.scale)))
        }
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_owned()),
        AMQPValue::LongString(s) => {
            Value::String(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
        AMQPValue::ByteArray(b) => {
            Value::String(String::from_utf8_lossy(b.as_slice()).into_owned())
        }
        AMQPValue::Timestamp(t) => Value::from(*t),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(json).collect()),
        AMQPValue::FieldTable(t) => Value::Object(
            t.inner()
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), json(v)))
                .collect(),
        ),
        AMQPValue::Void => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_read_as_text() {
        assert_eq!(text(&AMQPValue::LongString(LongString::from("v1"))), "v1");
        assert_eq!(text(&AMQPValue::LongInt(-3)), "-3");
        assert_eq!(text(&AMQPValue::Boolean(true)), "true");
        assert_eq!(text(&AMQPValue::Void), "");
        let mut table = FieldTable::default();
        table.insert("a".into(), AMQPValue::ShortUInt(1));
        assert_eq!(text(&AMQPValue::FieldTable(table)), r#"{"a":1}"#);
    }

    #[test]
    fn urls_are_checked_and_never_echo_passwords() {
        let config = |url: &str| SourceConfig {
            kind: sless_core::QueueKind::Amqp,
            url: url.into(),
            topic: "q".into(),
            group: "g".into(),
            start_from: sless_core::StartFrom::Latest,
            prefetch: 4,
            label: "ns/t".into(),
        };
        assert!(AmqpConnector::new(config("amqp://guest:guest@127.0.0.1:5672/%2f")).is_ok());
        let Err(QueueError::Config(message)) = AmqpConnector::new(config("http://u:secret@h/"))
        else {
            panic!("an http url is refused");
        };
        assert!(!message.contains("secret"), "{message}");
    }
}
