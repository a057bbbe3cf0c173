//! The Kafka connector on librdkafka: a consumer group member that commits only what
//! the engine acknowledged (see [`super::offsets`]) and a producer for publishing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use rand::Rng;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, ClientContext, Message as _};
use sless_core::{Backoff, StartFrom};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::offsets::{OffsetTracker, TopicPartition};
use crate::{Ack, ConnectionStatus, Connector, Message, QueueError, Received, SourceConfig};

/// How often acknowledged positions are committed (and at revocation and shutdown).
const COMMIT_INTERVAL: Duration = Duration::from_millis(200);
/// Bound on the broker round trips made while a new assignment is positioned.
const POSITION_TIMEOUT: Duration = Duration::from_secs(10);
/// Delays between looks for the topic, and after consumer errors: from 200 ms, doubling, at most 30 s, jittered.
const TOPIC_RETRY: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
/// How long a publish waits for room in the producer's queue.
const PUBLISH_QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads `topic` as the consumer group `group`.
pub struct KafkaConnector {
    config: SourceConfig,
    bootstrap: String,
    producer: FutureProducer,
}

impl KafkaConnector {
    pub fn new(config: SourceConfig) -> Result<Self, QueueError> {
        let bootstrap = bootstrap_servers(&config.url)?;
        if config.topic.is_empty() {
            return Err(QueueError::Config("a Kafka source needs a topic".into()));
        }
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            // A publish that cannot reach the broker fails instead of waiting for ever.
            .set("message.timeout.ms", "30000")
            .set("linger.ms", "5")
            .create()
            .map_err(|e| QueueError::Config(e.to_string()))?;
        Ok(Self {
            config,
            bootstrap,
            producer,
        })
    }

    fn consumer(&self, context: GroupContext) -> Result<StreamConsumer<GroupContext>, KafkaError> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", &self.config.group)
            .set("enable.auto.commit", "false")
            // Offsets are committed explicitly from the tracker, never stored implicitly.
            .set("enable.auto.offset.store", "false")
            .set(
                "auto.offset.reset",
                match self.config.start_from {
                    StartFrom::Latest => "latest",
                    StartFrom::Earliest => "earliest",
                },
            )
            // A trigger on a topic nobody produced to yet still gets its assignment
            // (where the broker allows topic creation).
            .set("allow.auto.create.topics", "true")
            // Lag and broker state come from the statistics.
            .set("statistics.interval.ms", "1000")
            // A member that vanished (a killed server) hands its partitions over
            // after 10 s instead of librdkafka's 45 s; a restarting server finds its
            // old membership gone sooner. (The mock cluster in the tests also keeps a
            // member that left until its session times out.)
            .set("session.timeout.ms", "10000")
            .create_with_context(context)
    }
}

impl KafkaConnector {
    /// Waits until the topic exists with partitions. Asking for its metadata as a
    /// producer lets a broker that creates topics on demand create it; a consumer
    /// subscribed to a missing topic would only notice it minutes after it appears,
    /// and reading from the latest offset it would then miss what came before.
    /// Returns false when shut down first.
    async fn wait_for_topic(
        &self,
        status: &ConnectionStatus,
        shutdown: &CancellationToken,
    ) -> bool {
        let mut failures = 0u32;
        loop {
            let producer = self.producer.clone();
            let topic = self.config.topic.clone();
            let looked = tokio::task::spawn_blocking(move || {
                producer
                    .client()
                    .fetch_metadata(Some(&topic), POSITION_TIMEOUT)
                    .map(|m| {
                        m.topics()
                            .first()
                            .map(|t| (t.error(), t.partitions().len()))
                    })
            })
            .await;
            match looked {
                Ok(Ok(Some((None, n)))) if n > 0 => return true,
                Ok(Ok(Some((
                    Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART),
                    _,
                )))) => {
                    status.failed(format!(
                        "topic {} does not exist and the broker does not create it",
                        self.config.topic
                    ));
                }
                Ok(Ok(Some((Some(e), _)))) => {
                    status.connecting(Some(format!("topic {}: {e:?}", self.config.topic)))
                }
                Ok(Ok(_)) => status.connecting(Some(format!(
                    "topic {} has no partitions yet",
                    self.config.topic
                ))),
                Ok(Err(e)) => status.connecting(Some(e.to_string())),
                Err(e) => status.connecting(Some(e.to_string())),
            }
            failures = failures.saturating_add(1);
            let wait = TOPIC_RETRY.jittered(failures, rand::rng().random());
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// `kafka://host:port[,host:port][/]` → `host:port,host:port`.
fn bootstrap_servers(url: &str) -> Result<String, QueueError> {
    let rest = url
        .strip_prefix("kafka://")
        .ok_or_else(|| QueueError::Config("a Kafka URL starts with kafka://".into()))?;
    let rest = rest.split(['/', '?']).next().unwrap_or_default();
    let servers: Vec<&str> = rest.split(',').map(str::trim).collect();
    if servers.iter().any(|s| s.is_empty() || !s.contains(':')) {
        return Err(QueueError::Config(
            "a Kafka URL is kafka://host:port[,host:port]".into(),
        ));
    }
    Ok(servers.join(","))
}

/// What the rebalance, error and statistics callbacks share with the connector.
struct GroupContext {
    tracker: Arc<Mutex<OffsetTracker>>,
    status: Arc<ConnectionStatus>,
    start_from: StartFrom,
    label: String,
    /// The partitions assigned now; empty before the first assignment.
    assigned: Mutex<Option<Vec<TopicPartition>>>,
}

impl GroupContext {
    fn tracker(&self) -> std::sync::MutexGuard<'_, OffsetTracker> {
        self.tracker.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// For a group that never committed on a partition and starts from the latest
    /// message, commits the partition's current end now, so the position is fixed
    /// at assignment: a message published after the trigger reports `connected`
    /// is read even if the consumer restarts before reading anything.
    fn position_new_partitions(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        if self.start_from != StartFrom::Latest || tpl.count() == 0 {
            return;
        }
        let committed = match consumer.committed_offsets(tpl.clone(), POSITION_TIMEOUT) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(trigger = %self.label, error = %e, "kafka: reading committed offsets failed");
                return;
            }
        };
        let mut fix = TopicPartitionList::new();
        for e in committed.elements() {
            if matches!(e.offset(), Offset::Offset(_)) {
                continue;
            }
            match consumer.fetch_watermarks(e.topic(), e.partition(), POSITION_TIMEOUT) {
                Ok((_, high)) => {
                    if let Err(err) =
                        fix.add_partition_offset(e.topic(), e.partition(), Offset::Offset(high))
                    {
                        tracing::warn!(trigger = %self.label, error = %err, "kafka: positioning failed");
                    }
                }
                Err(err) => {
                    tracing::warn!(trigger = %self.label, error = %err, "kafka: reading the end offset failed");
                }
            }
        }
        if fix.count() > 0
            && let Err(e) = consumer.commit(&fix, CommitMode::Sync)
        {
            tracing::warn!(trigger = %self.label, error = %e, "kafka: committing the start position failed");
        }
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

fn commit_list(points: &[(TopicPartition, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(points.len());
    for ((topic, partition), offset) in points {
        // Only fails for an offset librdkafka cannot represent; ours are read offsets + 1.
        let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset));
    }
    tpl
}

impl ClientContext for GroupContext {
    fn stats(&self, stats: Statistics) {
        let lag: i64 = stats
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            .filter(|p| p.partition >= 0 && p.consumer_lag > 0)
            .map(|p| p.consumer_lag)
            .sum();
        self.status.set_lag(u64::try_from(lag).ok());
        // Back after a broker outage without a rebalance: the assignment still holds.
        let up = stats
            .brokers
            .values()
            .any(|b| b.nodeid >= 0 && b.state == "UP");
        let assigned = self
            .assigned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if up && assigned && self.status.state() != sless_core::ConnectionState::Connected {
            self.status.connected();
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(trigger = %self.label, error = %error, reason, "kafka");
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.status.connecting(Some(format!("{error}: {reason}")));
        }
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => self.position_new_partitions(consumer, tpl),
            Rebalance::Revoke(tpl) => {
                // Commit what is finished while the partitions are still ours, then
                // forget them: whoever gets them next reads the rest again.
                let revoked = partitions(tpl);
                let points = self.tracker().take_commits_for(&revoked);
                if !points.is_empty()
                    && let Err(e) = consumer.commit(&commit_list(&points), CommitMode::Sync)
                {
                    tracing::warn!(trigger = %self.label, error = %e, "kafka: commit at revocation failed");
                }
                let mut tracker = self.tracker();
                for tp in &revoked {
                    tracker.revoke(tp);
                }
            }
            Rebalance::Error(e) => {
                self.status.connecting(Some(format!("rebalance: {e}")));
            }
        }
    }

    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        offsets: &TopicPartitionList,
    ) {
        if let Err(e) = result {
            // Handed back to the tracker so the next round commits them again
            // (otherwise only a later position would, and a restart would repeat more).
            tracing::debug!(trigger = %self.label, error = %e, "kafka: commit failed");
            let failed: Vec<(TopicPartition, i64)> = offsets
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                    _ => None,
                })
                .collect();
            self.tracker().commit_failed(&failed);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let parts = partitions(tpl);
                self.tracker().assign(parts.clone());
                *self.assigned.lock().unwrap_or_else(|e| e.into_inner()) = Some(parts);
                self.status.connected();
            }
            Rebalance::Revoke(_) => {
                *self.assigned.lock().unwrap_or_else(|e| e.into_inner()) = None;
                self.status.connecting(None);
            }
            Rebalance::Error(_) => {}
        }
    }
}

/// Acknowledges one message: marks its offset finished; the commit loop commits
/// the partition's position once everything below it is finished too.
struct KafkaAck {
    tracker: Arc<Mutex<OffsetTracker>>,
    tp: TopicPartition,
    offset: i64,
    generation: u64,
}

#[async_trait]
impl Ack for KafkaAck {
    async fn ack(self: Box<Self>) -> Result<(), QueueError> {
        self.tracker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .acked(&self.tp, self.offset, self.generation);
        Ok(())
    }
}

fn to_message(m: &BorrowedMessage<'_>) -> Message {
    let topic = m.topic().to_string();
    let headers = m
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    let value = h
                        .value
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default();
                    (h.key.to_string(), value)
                })
                .collect()
        })
        .unwrap_or_default();
    Message {
        id: format!("{topic}/{}/{}", m.partition(), m.offset()),
        key: m
            .key()
            .and_then(|k| std::str::from_utf8(k).ok())
            .map(str::to_string),
        partition: Some(m.partition()),
        offset: Some(m.offset()),
        headers,
        published_at: m
            .timestamp()
            .to_millis()
            .and_then(DateTime::<Utc>::from_timestamp_millis),
        redelivered: false,
        payload: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
        topic,
    }
}

/// Commits the finished positions.
fn commit(
    consumer: &StreamConsumer<GroupContext>,
    tracker: &Mutex<OffsetTracker>,
    mode: CommitMode,
) {
    let points = tracker
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take_commits();
    if points.is_empty() {
        return;
    }
    if let Err(e) = consumer.commit(&commit_list(&points), mode) {
        tracing::debug!(error = %e, "kafka: commit failed, retried at the next round");
        tracker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .commit_failed(&points);
    }
}

#[async_trait]
impl Connector for KafkaConnector {
    async fn run(
        self: Arc<Self>,
        deliver: mpsc::Sender<Received>,
        status: Arc<ConnectionStatus>,
        shutdown: CancellationToken,
    ) {
        status.connecting(None);
        if !self.wait_for_topic(&status, &shutdown).await {
            return;
        }
        let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
        let context = GroupContext {
            tracker: tracker.clone(),
            status: status.clone(),
            start_from: self.config.start_from,
            label: self.config.label.clone(),
            assigned: Mutex::new(None),
        };
        // Creating a consumer only fails on a configuration librdkafka refuses;
        // connecting happens in the background and is retried by librdkafka itself.
        let consumer = match self.consumer(context) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                status.failed(e.to_string());
                shutdown.cancelled().await;
                return;
            }
        };
        if let Err(e) = consumer.subscribe(&[&self.config.topic]) {
            status.failed(e.to_string());
            shutdown.cancelled().await;
            return;
        }

        let committer = {
            let consumer = consumer.clone();
            let tracker = tracker.clone();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(COMMIT_INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => commit(&consumer, &tracker, CommitMode::Async),
                    }
                }
            })
        };

        let mut errors = 0u32;
        loop {
            let received = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = consumer.recv() => r.map(|m| to_message(&m)),
            };
            let message = match received {
                Ok(m) => {
                    errors = 0;
                    m
                }
                Err(e) => {
                    // librdkafka reconnects on its own; errors here are informative
                    // (a broker gone, a topic deleted), never a reason to stop, but
                    // repeated ones are waited out instead of spun on.
                    tracing::debug!(trigger = %self.config.label, error = %e, "kafka: consumer error");
                    errors = errors.saturating_add(1);
                    let wait = TOPIC_RETRY.jittered(errors, rand::rng().random());
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
            };
            let (Some(partition), Some(offset)) = (message.partition, message.offset) else {
                continue;
            };
            let tp = (message.topic.clone(), partition);
            let Some(generation) = tracker
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .received(&tp, offset)
            else {
                // A message of a partition revoked meanwhile: its next owner reads it.
                continue;
            };
            let ack = Box::new(KafkaAck {
                tracker: tracker.clone(),
                tp,
                offset,
                generation,
            });
            tokio::select! {
                _ = shutdown.cancelled() => break,
                sent = deliver.send(Received { message, ack }) => {
                    if sent.is_err() {
                        break;
                    }
                }
            }
        }

        let _ = committer.await;
        // Whatever finished is committed before the group is left.
        commit(&consumer, &tracker, CommitMode::Sync);
        consumer.unsubscribe();
        status.connecting(None);
    }

    async fn publish(
        &self,
        topic: &str,
        payload: Bytes,
        headers: &[(String, String)],
    ) -> Result<(), QueueError> {
        let mut owned = OwnedHeaders::new_with_capacity(headers.len());
        for (k, v) in headers {
            owned = owned.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        let record: FutureRecord<'_, (), [u8]> =
            FutureRecord::to(topic).payload(&payload[..]).headers(owned);
        self.producer
            .send(record, PUBLISH_QUEUE_TIMEOUT)
            .await
            .map(|_| ())
            .map_err(|(e, _)| QueueError::Broker(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_servers_come_from_the_url() {
        assert_eq!(
            bootstrap_servers("kafka://a:9092,b:9093").ok().as_deref(),
            Some("a:9092,b:9093")
        );
        assert_eq!(
            bootstrap_servers("kafka://127.0.0.1:1/").ok().as_deref(),
            Some("127.0.0.1:1")
        );
        assert!(bootstrap_servers("amqp://x:1").is_err());
        assert!(bootstrap_servers("kafka://nohost").is_err());
        assert!(bootstrap_servers("kafka://").is_err());
    }
}
