//! The MQTT connector (MQTT 3.1.1, rumqttc): a persistent session (clean session off,
//! client id = the trigger's group) subscribed to a topic filter at QoS 1, with manual
//! acknowledgements, so a message is PUBACKed only once its delivery ended and the
//! broker keeps (and redelivers) everything not acknowledged, including what is
//! published while the connector is away.
//!
//! How many unacknowledged messages the broker hands out at once is the broker's
//! setting (mosquitto `max_inflight_messages`, default 20); what it keeps for an
//! offline session is `max_queued_messages` (mosquitto's default, 1000, drops the
//! rest: a production broker needs it raised, or 0 for no limit).
//! MQTT 5 is not spoken yet: there are no headers, and message ids are fresh.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::Rng;
use rumqttc::{
    AsyncClient, ConnectReturnCode, ConnectionError, Event, EventLoop, MqttOptions, Outgoing,
    Packet, Publish, QoS, SubscribeReasonCode, Transport,
};
use sless_core::Backoff;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::{Ack, ConnectionStatus, Connector, Message, QueueError, Received, SourceConfig};

/// Reconnect delays: from 200 ms, doubling, at most 30 s, jittered.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
/// How long a publish waits for the broker's PUBACK.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// Room in rumqttc's request channel (acks, publishes, subscriptions).
const REQUEST_CAPACITY: usize = 1024;

/// Reads a topic filter in a persistent session named by the trigger's group.
pub struct MqttConnector {
    config: SourceConfig,
    options: MqttOptions,
    /// The client of the running session, for publishing; `None` when not running.
    live: std::sync::Mutex<Option<Live>>,
}

#[derive(Clone)]
struct Live {
    client: AsyncClient,
    waiters: Arc<std::sync::Mutex<Waiters>>,
    status: Arc<ConnectionStatus>,
    /// Serialises publishes so their order in the request channel is the order their
    /// waiters were queued in.
    order: Arc<tokio::sync::Mutex<()>>,
}

/// Publishes waiting for their PUBACK. rumqttc does not return the packet id of a
/// publish, but reports each outgoing publish in request order, so a waiter is
/// queued before its request and bound to the id of the next new outgoing publish.
#[derive(Default)]
struct Waiters {
    queued: VecDeque<oneshot::Sender<()>>,
    by_pkid: HashMap<u16, oneshot::Sender<()>>,
}

impl Waiters {
    fn outgoing(&mut self, pkid: u16) {
        // A packet id already bound is a retransmission after a reconnect.
        if pkid == 0 || self.by_pkid.contains_key(&pkid) {
            return;
        }
        if let Some(tx) = self.queued.pop_front() {
            self.by_pkid.insert(pkid, tx);
        }
    }

    fn acked(&mut self, pkid: u16) {
        if let Some(tx) = self.by_pkid.remove(&pkid) {
            let _ = tx.send(());
        }
    }
}

/// The parts of an `mqtt://[user:password@]host[:port]` URL.
#[derive(Debug, PartialEq, Eq)]
struct Endpoint {
    host: String,
    port: u16,
    tls: bool,
    credentials: Option<(String, String)>,
}

fn parse_url(url: &str) -> Result<Endpoint, QueueError> {
    let bad = |why: &str| QueueError::Config(format!("MQTT URL: {why}"));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let tls = match scheme {
        "mqtt" | "tcp" => false,
        "mqtts" | "ssl" => true,
        _ => return Err(bad("the scheme is mqtt, mqtts, tcp or ssl")),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let credentials = userinfo.map(|u| match u.split_once(':') {
        Some((user, pass)) => (decode(user), decode(pass)),
        None => (decode(u), String::new()),
    });
    let default_port = if tls { 8883 } else { 1883 };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
            (h, p.parse().map_err(|_| bad("the port is not a number"))?)
        }
        _ => (hostport, default_port),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok(Endpoint {
        host: host.to_string(),
        port,
        tls,
        credentials,
    })
}

impl MqttConnector {
    pub fn new(config: SourceConfig) -> Result<Self, QueueError> {
        let endpoint = parse_url(&config.url)?;
        if config.topic.is_empty() {
            return Err(QueueError::Config(
                "an MQTT source needs a topic filter".into(),
            ));
        }
        if config.group.is_empty() {
            return Err(QueueError::Config(
                "an MQTT source needs a group (its client id)".into(),
            ));
        }
        let mut options = MqttOptions::new(&config.group, &endpoint.host, endpoint.port);
        options
            .set_clean_session(false)
            .set_manual_acks(true)
            .set_keep_alive(Duration::from_secs(15))
            .set_request_channel_capacity(REQUEST_CAPACITY)
            // Large payloads are the function's business, not the connector's.
            .set_max_packet_size(256 * 1024 * 1024, 256 * 1024 * 1024);
        if let Some((user, pass)) = endpoint.credentials {
            options.set_credentials(user, pass);
        }
        if endpoint.tls {
            options.set_transport(Transport::tls_with_default_config());
        }
        Ok(Self {
            config,
            options,
            live: std::sync::Mutex::new(None),
        })
    }

    fn set_live(&self, live: Option<Live>) {
        *self.live.lock().unwrap_or_else(|e| e.into_inner()) = live;
    }
}

/// Acknowledges one message with a PUBACK, on the session it arrived in.
struct MqttAck {
    client: AsyncClient,
    publish: Publish,
    /// The connection it arrived on; a PUBACK on a later connection could name a
    /// packet id the broker has since given to another message, so it is dropped
    /// there (the broker redelivers the message, flagged DUP, and that copy is acked).
    connection: u64,
    current: Arc<AtomicU64>,
}

#[async_trait]
impl Ack for MqttAck {
    async fn ack(self: Box<Self>) -> Result<(), QueueError> {
        if self.current.load(Ordering::SeqCst) != self.connection {
            return Err(QueueError::NotConnected);
        }
        self.client
            .ack(&self.publish)
            .await
            .map_err(|e| QueueError::Broker(e.to_string()))
    }
}

/// A short random hex id: MQTT 3.1.1 messages carry none.
fn fresh_id() -> String {
    let n: u128 = rand::rng().random();
    format!("{n:032x}")
}

fn to_message(p: &Publish) -> Message {
    let topic = p.topic.clone();
    Message {
        id: fresh_id(),
        key: Some(topic.clone()),
        topic,
        partition: None,
        offset: None,
        headers: Vec::new(),
        published_at: None,
        redelivered: p.dup,
        payload: p.payload.clone(),
    }
}

/// Drives rumqttc's event loop: connects, subscribes after every CONNACK, hands
/// publishes to the forwarder, reconnects with jittered back-off after any error.
async fn drive(
    mut eventloop: EventLoop,
    live: Live,
    topic: String,
    label: String,
    forward: mpsc::UnboundedSender<(Publish, u64)>,
    connection: Arc<AtomicU64>,
    shutdown: CancellationToken,
) {
    let status = live.status.clone();
    let mut failures: u32 = 0;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => break,
            e = eventloop.poll() => e,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                connection.fetch_add(1, Ordering::SeqCst);
                // The session may already hold the subscription; subscribing again is
                // harmless and covers a session the broker lost.
                if let Err(e) = live.client.try_subscribe(&topic, QoS::AtLeastOnce) {
                    tracing::warn!(trigger = %label, error = %e, "mqtt: subscribe not queued");
                }
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                if ack
                    .return_codes
                    .iter()
                    .any(|c| matches!(c, SubscribeReasonCode::Failure))
                {
                    status.failed(format!("the broker refused the subscription to {topic}"));
                } else {
                    failures = 0;
                    status.connected();
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if forward
                    .send((p, connection.load(Ordering::SeqCst)))
                    .is_err()
                {
                    break;
                }
            }
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                live.waiters
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .acked(ack.pkid);
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                live.waiters
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .outgoing(pkid);
            }
            Ok(_) => {}
            Err(e) => {
                // Acks of messages received on the lost connection are void from now on.
                connection.fetch_add(1, Ordering::SeqCst);
                let message = e.to_string();
                match e {
                    ConnectionError::ConnectionRefused(
                        ConnectReturnCode::BadUserNamePassword | ConnectReturnCode::NotAuthorized,
                    ) => status.failed(message),
                    _ => status.connecting(Some(message)),
                }
                failures = failures.saturating_add(1);
                let wait = RECONNECT.jittered(failures, rand::rng().random());
                tracing::debug!(trigger = %label, error = %e, ?wait, "mqtt: reconnecting");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
    // A clean goodbye keeps the session (clean session is off); unacknowledged
    // messages stay with the broker.
    if live.client.try_disconnect().is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
}

#[async_trait]
impl Connector for MqttConnector {
    async fn run(
        self: Arc<Self>,
        deliver: mpsc::Sender<Received>,
        status: Arc<ConnectionStatus>,
        shutdown: CancellationToken,
    ) {
        status.connecting(None);
        let (client, eventloop) = AsyncClient::new(self.options.clone(), REQUEST_CAPACITY);
        let live = Live {
            client: client.clone(),
            waiters: Arc::default(),
            status: status.clone(),
            order: Arc::default(),
        };
        self.set_live(Some(live.clone()));
        let connection = Arc::new(AtomicU64::new(0));
        // Stops the event loop when this loop ends, also when the engine went away.
        let stop = shutdown.child_token();
        // Unbounded, yet bounded by the broker: it sends no more unacknowledged
        // messages than its in-flight limit. The event loop must never wait on the
        // engine, or keep-alives and acknowledgements would stall.
        let (forward_tx, mut forward_rx) = mpsc::unbounded_channel();
        let driver = tokio::spawn(drive(
            eventloop,
            live,
            self.config.topic.clone(),
            self.config.label.clone(),
            forward_tx,
            connection.clone(),
            stop.clone(),
        ));
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => break,
                n = forward_rx.recv() => n,
            };
            let Some((publish, conn)) = next else { break };
            let received = Received {
                message: to_message(&publish),
                ack: Box::new(MqttAck {
                    client: client.clone(),
                    publish,
                    connection: conn,
                    current: connection.clone(),
                }),
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                sent = deliver.send(received) => if sent.is_err() { break },
            }
        }
        stop.cancel();
        let _ = driver.await;
        self.set_live(None);
        status.connecting(None);
    }

    async fn publish(
        &self,
        topic: &str,
        payload: Bytes,
        _headers: &[(String, String)],
    ) -> Result<(), QueueError> {
        let live = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(QueueError::NotConnected)?;
        if live.status.state() != sless_core::ConnectionState::Connected {
            return Err(QueueError::NotConnected);
        }
        let (tx, rx) = oneshot::channel();
        {
            let _order = live.order.lock().await;
            live.waiters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .queued
                .push_back(tx);
            if let Err(e) = live
                .client
                .publish(topic, QoS::AtLeastOnce, false, payload.to_vec())
                .await
            {
                // Never reached the event loop: its waiter must not take another's id.
                live.waiters
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .queued
                    .pop_back();
                return Err(QueueError::Broker(e.to_string()));
            }
        }
        match tokio::time::timeout(PUBLISH_TIMEOUT, rx).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(QueueError::NotConnected),
            Err(_) => Err(QueueError::Broker(
                "no PUBACK from the broker in time".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("mqtt://127.0.0.1:1884").ok(),
            Some(Endpoint {
                host: "127.0.0.1".into(),
                port: 1884,
                tls: false,
                credentials: None
            })
        );
        assert_eq!(
            parse_url("mqtts://u%40x:p%3Aw@broker/").ok(),
            Some(Endpoint {
                host: "broker".into(),
                port: 8883,
                tls: true,
                credentials: Some(("u@x".into(), "p:w".into()))
            })
        );
        assert!(parse_url("amqp://x").is_err());
        assert!(parse_url("mqtt://:1883").is_err());
        assert!(parse_url("mqtt://h:port").is_err());
    }

    #[test]
    fn publish_waiters_bind_to_new_packet_ids_in_order() {
        let mut w = Waiters::default();
        let (a, mut ra) = oneshot::channel();
        let (b, mut rb) = oneshot::channel();
        w.queued.push_back(a);
        w.queued.push_back(b);
        w.outgoing(7);
        // A retransmission of 7 after a reconnect does not take b's place.
        w.outgoing(7);
        w.outgoing(8);
        w.acked(8);
        assert!(rb.try_recv().is_ok());
        assert!(ra.try_recv().is_err());
        w.acked(7);
        assert!(ra.try_recv().is_ok());
    }
}
