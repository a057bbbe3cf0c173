//! The MQTT connector (rumqttc), MQTT 3.1.1 or, with `?version=5` on the URL, MQTT 5: a
//! persistent session (client id = the trigger's group; clean session off, and on MQTT 5
//! a session that never expires) subscribed to a topic filter at QoS 1, with manual
//! acknowledgements, so a message is PUBACKed only once its delivery ended and the
//! broker keeps (and redelivers) everything not acknowledged, including what is
//! published while the connector is away.
//!
//! How many unacknowledged messages the broker hands out at once: on MQTT 5 the
//! client's receive maximum, set from the source's prefetch; on 3.1.1 the broker's
//! setting (mosquitto `max_inflight_messages`, default 20). What the broker keeps for
//! an offline session is its own limit (mosquitto `max_queued_messages`, default 1000,
//! drops the rest: a production broker needs it raised, or 0 for no limit).
//!
//! MQTT 5 carries headers as user properties, both ways: a message's user properties
//! are its headers (`message-id` among them, if the publisher set one, is its id), and
//! what this connector publishes (responses, dead letters with their `x-sless-*`
//! headers) carries the given headers as user properties. MQTT 3.1.1 has neither:
//! message ids are fresh on every delivery and published headers are dropped.
//! The two versions differ only in rumqttc's types; [`Client`], [`Session`] and
//! [`Event`] give the rest of this module one shape for both.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::Rng;
use rumqttc::v5;
use rumqttc::v5::mqttbytes::v5 as packet5;
use rumqttc::{ConnectReturnCode, ConnectionError, MqttOptions, Outgoing, Packet, QoS, Transport};
use sless_core::{Backoff, MqttVersion};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::{Ack, ConnectionStatus, Connector, Message, QueueError, Received, SourceConfig};

/// Reconnect delays: from 200 ms, doubling, at most 30 s, jittered.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
/// How long a publish waits for the broker's PUBACK.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// Room in rumqttc's request channel (acks, publishes, subscriptions).
const REQUEST_CAPACITY: usize = 1024;
/// Large payloads are the function's business, not the connector's.
const MAX_PACKET: u32 = 256 * 1024 * 1024;
/// The MQTT 5 user property a publisher may set to give a message a stable id.
const MESSAGE_ID: &str = "message-id";

/// Reads a topic filter in a persistent session named by the trigger's group.
pub struct MqttConnector {
    config: SourceConfig,
    options: Options,
    /// The client of the running session, for publishing; `None` when not running.
    live: std::sync::Mutex<Option<Live>>,
}

/// rumqttc's options, of the version the URL asked for.
#[derive(Clone)]
enum Options {
    V311(Box<MqttOptions>),
    V5(Box<v5::MqttOptions>),
}

/// The client side of a session: requests (subscribe, publish, ack) to its event loop.
#[derive(Clone)]
enum Client {
    V311(rumqttc::AsyncClient),
    V5(v5::AsyncClient),
}

/// The event loop of a session.
enum Session {
    V311(Box<rumqttc::EventLoop>),
    V5(Box<v5::EventLoop>),
}

/// A message as it arrived, kept for its PUBACK.
enum Incoming {
    V311(rumqttc::Publish),
    V5(packet5::Publish),
}

/// What a session's event loop reported, the same for both versions.
enum Event {
    /// Connected (again): subscribe.
    ConnAck,
    /// The answer to the subscription.
    SubAck {
        refused: bool,
    },
    /// A message for the subscription.
    Publish(Incoming),
    /// The broker's answer to one of our publishes; `Err` with the reason it refused
    /// it (MQTT 5 only; 3.1.1 cannot refuse a publish).
    PubAck {
        pkid: u16,
        result: Result<(), String>,
    },
    /// One of our publishes went out with this packet id.
    OutgoingPublish(u16),
    /// Our DISCONNECT went out.
    OutgoingDisconnect,
    Other,
    /// The connection failed or ended; `refused` when the broker refused the
    /// credentials (a configuration fault, not a passing one).
    Failed {
        message: String,
        refused: bool,
    },
}

impl Options {
    fn new(config: &SourceConfig, endpoint: Endpoint) -> Self {
        let transport = endpoint.tls.then(Transport::tls_with_default_config);
        match endpoint.version {
            MqttVersion::V311 => {
                let mut o = MqttOptions::new(&config.group, &endpoint.host, endpoint.port);
                o.set_clean_session(false)
                    .set_manual_acks(true)
                    .set_keep_alive(Duration::from_secs(15))
                    .set_request_channel_capacity(REQUEST_CAPACITY)
                    .set_max_packet_size(MAX_PACKET as usize, MAX_PACKET as usize);
                if let Some((user, pass)) = endpoint.credentials {
                    o.set_credentials(user, pass);
                }
                if let Some(t) = transport {
                    o.set_transport(t);
                }
                Options::V311(Box::new(o))
            }
            MqttVersion::V5 => {
                let mut o = v5::MqttOptions::new(&config.group, &endpoint.host, endpoint.port);
                let receive_maximum = config.prefetch.clamp(1, u32::from(u16::MAX)) as u16;
                o.set_clean_start(false)
                    // 0xFFFFFFFF: the session never expires, as a 3.1.1 persistent one.
                    .set_session_expiry_interval(Some(u32::MAX))
                    .set_receive_maximum(Some(receive_maximum))
                    .set_manual_acks(true)
                    .set_keep_alive(Duration::from_secs(15))
                    .set_request_channel_capacity(REQUEST_CAPACITY)
                    .set_max_packet_size(Some(MAX_PACKET));
                if let Some((user, pass)) = endpoint.credentials {
                    o.set_credentials(user, pass);
                }
                if let Some(t) = transport {
                    o.set_transport(t);
                }
                Options::V5(Box::new(o))
            }
        }
    }

    fn session(&self) -> (Client, Session) {
        match self {
            Options::V311(o) => {
                let (c, e) = rumqttc::AsyncClient::new((**o).clone(), REQUEST_CAPACITY);
                (Client::V311(c), Session::V311(Box::new(e)))
            }
            Options::V5(o) => {
                let (c, e) = v5::AsyncClient::new((**o).clone(), REQUEST_CAPACITY);
                (Client::V5(c), Session::V5(Box::new(e)))
            }
        }
    }
}

impl Session {
    async fn poll(&mut self) -> Event {
        match self {
            Session::V311(e) => match e.poll().await {
                Ok(rumqttc::Event::Incoming(p)) => match p {
                    Packet::ConnAck(_) => Event::ConnAck,
                    Packet::SubAck(ack) => Event::SubAck {
                        refused: ack
                            .return_codes
                            .iter()
                            .any(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure)),
                    },
                    Packet::Publish(p) => Event::Publish(Incoming::V311(p)),
                    Packet::PubAck(ack) => Event::PubAck {
                        pkid: ack.pkid,
                        result: Ok(()),
                    },
                    _ => Event::Other,
                },
                Ok(rumqttc::Event::Outgoing(o)) => outgoing(o),
                Err(e) => Event::Failed {
                    refused: matches!(
                        e,
                        ConnectionError::ConnectionRefused(
                            ConnectReturnCode::BadUserNamePassword
                                | ConnectReturnCode::NotAuthorized
                        )
                    ),
                    message: e.to_string(),
                },
            },
            Session::V5(e) => match e.poll().await {
                Ok(v5::Event::Incoming(p)) => match p {
                    packet5::Packet::ConnAck(_) => Event::ConnAck,
                    packet5::Packet::SubAck(ack) => Event::SubAck {
                        refused: ack
                            .return_codes
                            .iter()
                            .any(|c| !matches!(c, packet5::SubscribeReasonCode::Success(_))),
                    },
                    packet5::Packet::Publish(p) => Event::Publish(Incoming::V5(p)),
                    packet5::Packet::PubAck(ack) => Event::PubAck {
                        pkid: ack.pkid,
                        result: match ack.reason {
                            packet5::PubAckReason::Success
                            | packet5::PubAckReason::NoMatchingSubscribers => Ok(()),
                            reason => Err(format!("the broker refused the publish: {reason:?}")),
                        },
                    },
                    _ => Event::Other,
                },
                Ok(v5::Event::Outgoing(o)) => outgoing(o),
                Err(e) => Event::Failed {
                    refused: matches!(
                        e,
                        v5::ConnectionError::ConnectionRefused(
                            packet5::ConnectReturnCode::BadUserNamePassword
                                | packet5::ConnectReturnCode::NotAuthorized
                                | packet5::ConnectReturnCode::Banned
                                | packet5::ConnectReturnCode::BadAuthenticationMethod
                        )
                    ),
                    message: e.to_string(),
                },
            },
        }
    }
}

fn outgoing(o: Outgoing) -> Event {
    match o {
        Outgoing::Publish(pkid) => Event::OutgoingPublish(pkid),
        Outgoing::Disconnect => Event::OutgoingDisconnect,
        _ => Event::Other,
    }
}

impl Client {
    fn try_subscribe(&self, topic: &str) -> Result<(), String> {
        match self {
            Client::V311(c) => c
                .try_subscribe(topic, QoS::AtLeastOnce)
                .map_err(|e| e.to_string()),
            Client::V5(c) => c
                .try_subscribe(topic, v5::mqttbytes::QoS::AtLeastOnce)
                .map_err(|e| e.to_string()),
        }
    }

    async fn ack(&self, publish: &Incoming) -> Result<(), String> {
        match (self, publish) {
            (Client::V311(c), Incoming::V311(p)) => c.ack(p).await.map_err(|e| e.to_string()),
            (Client::V5(c), Incoming::V5(p)) => c.ack(p).await.map_err(|e| e.to_string()),
            // A session speaks one version; its messages are of that version.
            _ => Err("a message acknowledged on a session of another MQTT version".into()),
        }
    }

    /// Queues a QoS 1 publish; on MQTT 5 `headers` become user properties.
    async fn publish(
        &self,
        topic: &str,
        payload: Bytes,
        headers: &[(String, String)],
    ) -> Result<(), String> {
        match self {
            Client::V311(c) => c
                .publish(topic, QoS::AtLeastOnce, false, payload.to_vec())
                .await
                .map_err(|e| e.to_string()),
            Client::V5(c) => {
                let properties = packet5::PublishProperties {
                    user_properties: headers.to_vec(),
                    ..Default::default()
                };
                c.publish_with_properties(
                    topic,
                    v5::mqttbytes::QoS::AtLeastOnce,
                    false,
                    payload,
                    properties,
                )
                .await
                .map_err(|e| e.to_string())
            }
        }
    }

    fn try_disconnect(&self) -> bool {
        match self {
            Client::V311(c) => c.try_disconnect().is_ok(),
            Client::V5(c) => c.try_disconnect().is_ok(),
        }
    }
}

#[derive(Clone)]
struct Live {
    client: Client,
    waiters: Arc<std::sync::Mutex<Waiters>>,
    status: Arc<ConnectionStatus>,
    /// Serialises publishes so their order in the request channel is the order their
    /// waiters were queued in.
    order: Arc<tokio::sync::Mutex<()>>,
}

/// The broker's answer to one publish.
type PubAckResult = Result<(), String>;

/// Publishes waiting for their PUBACK. rumqttc does not return the packet id of a
/// publish, but reports each outgoing publish in request order, so a waiter is
/// queued before its request and bound to the id of the next new outgoing publish.
#[derive(Default)]
struct Waiters {
    queued: VecDeque<oneshot::Sender<PubAckResult>>,
    by_pkid: HashMap<u16, oneshot::Sender<PubAckResult>>,
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

    fn acked(&mut self, pkid: u16, result: PubAckResult) {
        if let Some(tx) = self.by_pkid.remove(&pkid) {
            let _ = tx.send(result);
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
    version: MqttVersion,
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
    let version = MqttVersion::from_url(url).map_err(|e| bad(&e))?;
    Ok(Endpoint {
        host: host.to_string(),
        port,
        tls,
        credentials,
        version,
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
        let options = Options::new(&config, endpoint);
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
    client: Client,
    publish: Incoming,
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
            .map_err(QueueError::Broker)
    }
}

/// A random hex id, for messages that carry none.
fn fresh_id() -> String {
    let n: u128 = rand::rng().random();
    format!("{n:032x}")
}

fn to_message(p: &Incoming) -> Message {
    let (topic, headers, dup, payload) = match p {
        Incoming::V311(p) => (p.topic.clone(), Vec::new(), p.dup, p.payload.clone()),
        Incoming::V5(p) => (
            String::from_utf8_lossy(&p.topic).into_owned(),
            p.properties
                .as_ref()
                .map(|props| props.user_properties.clone())
                .unwrap_or_default(),
            p.dup,
            p.payload.clone(),
        ),
    };
    let id = headers
        .iter()
        .find(|(k, v)| k == MESSAGE_ID && !v.is_empty())
        .map_or_else(fresh_id, |(_, v)| v.clone());
    Message {
        id,
        key: Some(topic.clone()),
        topic,
        partition: None,
        offset: None,
        headers,
        published_at: None,
        redelivered: dup,
        payload,
    }
}

/// Drives rumqttc's event loop: connects, subscribes after every CONNACK, hands
/// publishes to the forwarder, reconnects with jittered back-off after any error.
async fn drive(
    mut session: Session,
    live: Live,
    topic: String,
    label: String,
    forward: mpsc::UnboundedSender<(Incoming, u64)>,
    connection: Arc<AtomicU64>,
    shutdown: CancellationToken,
) {
    let status = live.status.clone();
    let mut failures: u32 = 0;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => break,
            e = session.poll() => e,
        };
        match event {
            Event::ConnAck => {
                connection.fetch_add(1, Ordering::SeqCst);
                // The session may already hold the subscription; subscribing again is
                // harmless and covers a session the broker lost.
                if let Err(e) = live.client.try_subscribe(&topic) {
                    tracing::warn!(trigger = %label, error = %e, "mqtt: subscribe not queued");
                }
            }
            Event::SubAck { refused: true } => {
                status.failed(format!("the broker refused the subscription to {topic}"));
            }
            Event::SubAck { refused: false } => {
                failures = 0;
                status.connected();
            }
            Event::Publish(p) => {
                if forward
                    .send((p, connection.load(Ordering::SeqCst)))
                    .is_err()
                {
                    break;
                }
            }
            Event::PubAck { pkid, result } => {
                live.waiters
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .acked(pkid, result);
            }
            Event::OutgoingPublish(pkid) => {
                live.waiters
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .outgoing(pkid);
            }
            Event::OutgoingDisconnect | Event::Other => {}
            Event::Failed { message, refused } => {
                // Acks of messages received on the lost connection are void from now on.
                connection.fetch_add(1, Ordering::SeqCst);
                tracing::debug!(trigger = %label, error = %message, "mqtt: reconnecting");
                if refused {
                    status.failed(message);
                } else {
                    status.connecting(Some(message));
                }
                failures = failures.saturating_add(1);
                let wait = RECONNECT.jittered(failures, rand::rng().random());
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
    // A clean goodbye keeps the session (clean session is off); unacknowledged
    // messages stay with the broker.
    if live.client.try_disconnect() {
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                match session.poll().await {
                    Event::OutgoingDisconnect | Event::Failed { .. } => break,
                    _ => {}
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
        let (client, session) = self.options.session();
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
        // messages than its in-flight limit (MQTT 5: our receive maximum). The event
        // loop must never wait on the engine, or keep-alives and acknowledgements
        // would stall.
        let (forward_tx, mut forward_rx) = mpsc::unbounded_channel();
        let driver = tokio::spawn(drive(
            session,
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

    /// Publishes at QoS 1 and waits for the PUBACK; on MQTT 5 `headers` go as user
    /// properties (on 3.1.1, which has none, they are dropped).
    async fn publish(
        &self,
        topic: &str,
        payload: Bytes,
        headers: &[(String, String)],
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
            if let Err(e) = live.client.publish(topic, payload, headers).await {
                // Never reached the event loop: its waiter must not take another's id.
                live.waiters
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .queued
                    .pop_back();
                return Err(QueueError::Broker(e));
            }
        }
        match tokio::time::timeout(PUBLISH_TIMEOUT, rx).await {
            Ok(Ok(result)) => result.map_err(QueueError::Broker),
            Ok(Err(_)) => Err(QueueError::NotConnected),
            Err(_) => Err(QueueError::Broker(
                "no PUBACK from the broker in time".into(),
            )),
        }
    }
}

/// Ends the persistent session `client_id` keeps on the broker at `url` (a deleted
/// trigger's): connects once with a clean session, so the broker discards the old one
/// and what it queued, and disconnects.
pub async fn discard_session(url: &str, client_id: &str) -> Result<(), QueueError> {
    let endpoint = parse_url(url)?;
    let transport = endpoint.tls.then(Transport::tls_with_default_config);
    let mut o = MqttOptions::new(client_id, &endpoint.host, endpoint.port);
    o.set_clean_session(true);
    if let Some((user, pass)) = endpoint.credentials {
        o.set_credentials(user, pass);
    }
    if let Some(t) = transport {
        o.set_transport(t);
    }
    let (client, mut eventloop) = rumqttc::AsyncClient::new(o, 4);
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match eventloop.poll().await {
                Ok(rumqttc::Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = client.try_disconnect();
                }
                Ok(rumqttc::Event::Outgoing(Outgoing::Disconnect)) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(QueueError::Broker(e.to_string())),
            }
        }
    })
    .await
    .map_err(|_| QueueError::Broker("no answer from the broker in time".into()))?
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
                credentials: None,
                version: MqttVersion::V311,
            })
        );
        assert_eq!(
            parse_url("mqtts://u%40x:p%3Aw@broker/").ok(),
            Some(Endpoint {
                host: "broker".into(),
                port: 8883,
                tls: true,
                credentials: Some(("u@x".into(), "p:w".into())),
                version: MqttVersion::V311,
            })
        );
        assert_eq!(
            parse_url("mqtt://h?version=5").map(|e| e.version).ok(),
            Some(MqttVersion::V5)
        );
        assert!(parse_url("mqtt://h?version=9").is_err());
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
        w.acked(8, Err("refused".into()));
        assert_eq!(rb.try_recv(), Ok(Err("refused".to_string())));
        assert!(ra.try_recv().is_err());
        w.acked(7, Ok(()));
        assert_eq!(ra.try_recv(), Ok(Ok(())));
    }
}
