//! Devices: their registry (through the store), their broker accounts (through
//! [`sless_mqtt::Broker`]) and the ingest of their telemetry.
//!
//! The store is written first and the broker told after, so the broker never
//! admits a device the store does not have (its accounts are rewritten from the
//! store at every start; see `sless-mqtt`).
//!
//! **Ingest.** sless's own MQTT 5 client (`sless-ingest`, a persistent session that
//! never expires, QoS 1, receive maximum [`INGEST_PREFETCH`]) reads `+/telemetry/+`
//! through the queue connector (`sless_queue::mqtt`), so what the broker holds for it
//! while sless is away is delivered when it returns. Messages are written in batches
//! (up to [`MAX_BATCH`], one transaction) by a task of their own, so the MQTT event
//! loop never waits on the store; each message is acknowledged (PUBACK) only after
//! the batch that holds it committed — the **ack point**. A failed write is retried
//! with back-off and nothing is acknowledged meanwhile; a payload of any shape is
//! stored (JSON as JSON, other text as a string, binary as `{"base64"}`), so no
//! message can stop the pipeline.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use rand::Rng;
use sless_core::{Backoff, DeviceSpec, QueueKind, StartFrom, device};
use sless_mqtt::{
    Accounts, Broker, BrokerConfig, BrokerError, DeviceAccount, PasswordHash, dynsec,
};
use sless_queue::{ConnectionStatus, Connector, QueueError, Received, SourceConfig};
use sless_store::{DeviceRecord, DeviceStore, NewTelemetry, StoreError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The most messages one telemetry write holds.
pub const MAX_BATCH: usize = 1000;
/// QoS 1 messages the broker may have in flight to the ingest at once.
pub const INGEST_PREFETCH: u32 = 10_000;
/// Retries of a failed telemetry write: from 100 ms, doubling, at most 5 s.
const WRITE_RETRY: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
/// How long a start waits for the ingest to subscribe.
const INGEST_START: Duration = Duration::from_secs(15);

/// Where devices reach the broker, as device objects show it.
#[derive(Debug, Clone)]
pub struct Advertised {
    pub host: String,
    pub port: u16,
    /// `ws://host:port/mqtt`, when the server listens for MQTT over WebSocket.
    pub ws_url: Option<String>,
}

/// The broker's accounts, read from the store at every start of the broker.
struct StoreAccounts(Arc<dyn DeviceStore>);

#[async_trait::async_trait]
impl Accounts for StoreAccounts {
    async fn accounts(&self) -> Result<Vec<DeviceAccount>, String> {
        let devices = self.0.all_devices().await.map_err(|e| e.to_string())?;
        Ok(devices
            .into_iter()
            .filter_map(|d| {
                let Some(password) = PasswordHash::from_stored(&d.password_hash) else {
                    tracing::warn!(namespace = %d.namespace, device = %d.name,
                        "a device's stored password hash is unreadable; it cannot connect");
                    return None;
                };
                Some(DeviceAccount {
                    namespace: d.namespace,
                    name: d.name,
                    password,
                    enabled: d.spec.enabled,
                })
            })
            .collect())
    }
}

/// The device registry and its broker.
pub struct Devices {
    store: Arc<dyn DeviceStore>,
    broker: Arc<Broker>,
    ingest: Arc<dyn Connector>,
    ingest_status: Arc<ConnectionStatus>,
    advertised: Advertised,
}

impl Devices {
    /// Starts the broker (its accounts from `store`) and the ingest; returns once the
    /// ingest is subscribed, so nothing a device publishes from then on is missed.
    pub async fn start(
        store: Arc<dyn DeviceStore>,
        config: BrokerConfig,
        advertised: Advertised,
        shutdown: CancellationToken,
    ) -> Result<Arc<Devices>, BrokerError> {
        let broker = Broker::start(
            config,
            Arc::new(StoreAccounts(store.clone())),
            shutdown.child_token(),
        )
        .await?;
        let ingest = sless_queue::connector(SourceConfig {
            kind: QueueKind::Mqtt,
            url: broker.ingest_url(),
            topic: device::TELEMETRY_FILTER.to_string(),
            group: dynsec::INGEST_USER.to_string(),
            start_from: StartFrom::Earliest,
            prefetch: INGEST_PREFETCH,
            label: "devices/ingest".to_string(),
        })
        .map_err(|e| BrokerError::Setup(e.to_string()))?;
        let status = Arc::new(ConnectionStatus::default());
        let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
        tokio::spawn(ingest.clone().run(tx, status.clone(), shutdown.clone()));
        tokio::spawn(write_telemetry(store.clone(), rx, shutdown.clone()));
        let deadline = tokio::time::Instant::now() + INGEST_START;
        while status.state() != sless_core::ConnectionState::Connected {
            if tokio::time::Instant::now() > deadline {
                return Err(BrokerError::Start(format!(
                    "the telemetry ingest did not connect: {}",
                    status.last_error().unwrap_or_default()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Arc::new(Devices {
            store,
            broker,
            ingest,
            ingest_status: status,
            advertised,
        }))
    }

    pub fn advertised(&self) -> &Advertised {
        &self.advertised
    }

    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Whether the ingest is subscribed now.
    pub fn ingest_connected(&self) -> bool {
        self.ingest_status.state() == sless_core::ConnectionState::Connected
    }

    /// Creates a device with a new password, returned this once.
    pub async fn create(
        &self,
        namespace: &str,
        name: &str,
        spec: &DeviceSpec,
    ) -> Result<(DeviceRecord, String), StoreError> {
        let password = sless_mqtt::password::generate();
        let hash = PasswordHash::new(&password).to_stored();
        let record = self
            .store
            .create_device(namespace, name, spec, &hash)
            .await?;
        self.broker
            .apply(dynsec::upsert_device(
                namespace,
                name,
                &password,
                spec.enabled,
            ))
            .await;
        Ok((record, password))
    }

    /// Gives a device a new password (returned this once); the old one stops working
    /// at once and a device connected with it is disconnected.
    pub async fn rotate(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(DeviceRecord, String), StoreError> {
        let password = sless_mqtt::password::generate();
        let hash = PasswordHash::new(&password).to_stored();
        let record = self
            .store
            .set_device_password(namespace, name, &hash)
            .await?;
        self.broker
            .apply(vec![dynsec::set_password(
                &device::username(namespace, name),
                &password,
            )])
            .await;
        Ok((record, password))
    }

    /// Replaces a device's spec; disabling disconnects it and refuses it until enabled.
    pub async fn set_spec(
        &self,
        namespace: &str,
        name: &str,
        spec: &DeviceSpec,
    ) -> Result<DeviceRecord, StoreError> {
        let before = self.store.get_device(namespace, name).await?;
        let record = self.store.set_device_spec(namespace, name, spec).await?;
        if before.spec.enabled != spec.enabled {
            self.broker
                .apply(vec![dynsec::set_enabled(
                    &device::username(namespace, name),
                    spec.enabled,
                )])
                .await;
        }
        Ok(record)
    }

    /// Deletes a device and its telemetry; it is disconnected and refused from now on.
    pub async fn delete(&self, namespace: &str, name: &str) -> Result<(), StoreError> {
        self.store.delete_device(namespace, name).await?;
        self.broker
            .apply(dynsec::delete_device(&device::username(namespace, name)))
            .await;
        Ok(())
    }

    /// The broker forgets the devices of a namespace the store no longer has.
    pub async fn namespace_deleted(&self, names: &[(String, String)]) {
        for (ns, name) in names {
            self.broker
                .apply(dynsec::delete_device(&device::username(ns, name)))
                .await;
        }
    }

    /// Makes the broker take its accounts from the store again, for devices that
    /// came back with a namespace restored from the trash: the store keeps only their
    /// password hashes, which no `$CONTROL` command takes, so the broker is restarted
    /// (every client reconnects; sessions persist) and writes its account file from
    /// the store as at every start. Waits up to `patience` for it to serve again.
    pub async fn reload_accounts(&self, patience: Duration) {
        let mut starts = self.broker.starts();
        starts.borrow_and_update();
        self.broker.restart();
        if tokio::time::timeout(patience, starts.changed())
            .await
            .is_err()
        {
            tracing::warn!(
                "devices: the broker did not come back in time; restored devices connect once it does"
            );
        }
    }

    /// Whether the device is connected now.
    pub fn online(&self, namespace: &str, name: &str) -> bool {
        self.broker.is_online(&device::username(namespace, name))
    }

    /// Publishes `body` to the device's command topic at QoS 1, waiting for the
    /// broker's PUBACK; returns the topic.
    pub async fn send_command(
        &self,
        namespace: &str,
        name: &str,
        body: Bytes,
    ) -> Result<String, QueueError> {
        let topic = device::commands_topic(namespace, name);
        self.ingest.publish(&topic, body, &[]).await?;
        Ok(topic)
    }
}

/// The ingest's writer: batches what the connector received, writes each batch in
/// one transaction (retrying until it holds), then acknowledges its messages.
async fn write_telemetry(
    store: Arc<dyn DeviceStore>,
    mut rx: mpsc::Receiver<Received>,
    shutdown: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = rx.recv() => r,
        };
        let Some(first) = first else { return };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let received_at = Utc::now();
        let rows: Vec<NewTelemetry> = batch
            .iter()
            .filter_map(|r| {
                // The ACL lets only devices publish under `+/telemetry/+`, each on its
                // own topic; anything else is acknowledged and dropped.
                let (ns, name) = device::parse_telemetry_topic(&r.message.topic)?;
                Some(NewTelemetry {
                    namespace: ns.to_string(),
                    device: name.to_string(),
                    received_at,
                    payload: sless_core::delivery::payload_event(&r.message.payload),
                })
            })
            .collect();
        let mut failures = 0u32;
        loop {
            match store.insert_telemetry(&rows).await {
                Ok(_) => {
                    sless_metrics::telemetry_messages(rows.len() as u64);
                    break;
                }
                Err(e) => {
                    failures += 1;
                    let wait = WRITE_RETRY.jittered(failures, rand::rng().random());
                    tracing::warn!(error = %e, messages = rows.len(), ?wait,
                        "devices: telemetry not stored yet; retrying (nothing acknowledged)");
                    tokio::select! {
                        // Unacknowledged: the broker delivers them again next time.
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
        for r in batch {
            // A lost connection voids the ack; the broker then redelivers (a duplicate
            // row: at-least-once).
            let _ = r.ack.ack().await;
        }
    }
}
