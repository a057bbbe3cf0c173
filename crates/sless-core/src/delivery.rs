//! Delivery without a waiting caller: the policy shared by queue triggers, device
//! triggers and async calls ([`DeliveryPolicy`]), what counts as success or as worth
//! a retry, the queue source of a trigger ([`QueueSource`]), async calls
//! ([`CallPhase`]) and dead letters ([`DeadLetterSource`]). Plain data, no IO.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Backoff, SecretRef, ValidationError};

/// How messages are delivered to a function: attempts, back-off, parallelism, order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryPolicy {
    /// Attempts per message, the first included (1..=100).
    #[serde(default = "defaults::max_attempts")]
    pub max_attempts: u32,
    /// The wait before the first retry (1..=3,600,000 ms).
    #[serde(default = "defaults::backoff_initial_ms")]
    pub backoff_initial_ms: u64,
    /// No wait between attempts is longer than this (≥ `backoff_initial_ms`, ≤ 1 h).
    #[serde(default = "defaults::backoff_max_ms")]
    pub backoff_max_ms: u64,
    /// Messages in flight at once (1..=1000). A message waiting for its retry holds no slot.
    #[serde(default = "defaults::concurrency")]
    pub concurrency: u32,
    /// `key`: one message in flight per key, in order.
    #[serde(default)]
    pub ordering: Ordering,
}

/// Whether messages with the same key are kept in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ordering {
    /// Any order; `concurrency` messages in flight regardless of their keys.
    #[default]
    None,
    /// Messages with the same key strictly in order, one in flight per key.
    Key,
}

impl Ordering {
    pub fn as_str(self) -> &'static str {
        match self {
            Ordering::None => "none",
            Ordering::Key => "key",
        }
    }
}

/// The longest back-off the policy allows, in milliseconds (one hour).
pub const MAX_BACKOFF_MS: u64 = 3_600_000;
/// The most attempts the policy allows.
pub const MAX_ATTEMPTS: u32 = 100;
/// The most messages in flight a policy allows.
pub const MAX_CONCURRENCY: u32 = 1000;

mod defaults {
    pub fn max_attempts() -> u32 {
        3
    }
    pub fn backoff_initial_ms() -> u64 {
        500
    }
    pub fn backoff_max_ms() -> u64 {
        60_000
    }
    pub fn concurrency() -> u32 {
        1
    }
}

impl Default for DeliveryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: defaults::max_attempts(),
            backoff_initial_ms: defaults::backoff_initial_ms(),
            backoff_max_ms: defaults::backoff_max_ms(),
            concurrency: defaults::concurrency(),
            ordering: Ordering::None,
        }
    }
}

/// Whether an attempt that ended with `status` counts as delivered.
pub fn is_success(status: u16) -> bool {
    status < 400
}

/// Whether an attempt that ended with `status` is worth another: an exception (500),
/// a crash (502), no instance (503), a timeout (504), 408 and 429. Any other status of
/// 400 and above is a failure without retry.
pub fn is_retryable(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
}

impl DeliveryPolicy {
    /// Checks every field; `prefix` is where the policy sits in the request
    /// (`delivery`), so errors name `delivery.max_attempts`.
    pub fn validate(&self, prefix: &str) -> Result<(), ValidationError> {
        let field = |name: &str| format!("{prefix}.{name}");
        if !(1..=MAX_ATTEMPTS).contains(&self.max_attempts) {
            return Err(ValidationError::new(
                field("max_attempts"),
                format!("must be between 1 and {MAX_ATTEMPTS}"),
            ));
        }
        if !(1..=MAX_BACKOFF_MS).contains(&self.backoff_initial_ms) {
            return Err(ValidationError::new(
                field("backoff_initial_ms"),
                format!("must be between 1 and {MAX_BACKOFF_MS}"),
            ));
        }
        if !(self.backoff_initial_ms..=MAX_BACKOFF_MS).contains(&self.backoff_max_ms) {
            return Err(ValidationError::new(
                field("backoff_max_ms"),
                format!("must be between backoff_initial_ms and {MAX_BACKOFF_MS}"),
            ));
        }
        if !(1..=MAX_CONCURRENCY).contains(&self.concurrency) {
            return Err(ValidationError::new(
                field("concurrency"),
                format!("must be between 1 and {MAX_CONCURRENCY}"),
            ));
        }
        Ok(())
    }

    /// The back-off between attempts.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(
            Duration::from_millis(self.backoff_initial_ms),
            Duration::from_millis(self.backoff_max_ms),
        )
    }

    /// The wait before attempt `next` (2 is the first retry), jittered over the upper
    /// half of the capped exponential delay; `unit` is a random number in `[0, 1)`.
    pub fn retry_delay(&self, next: u32, unit: f64) -> Duration {
        self.backoff().jittered(next.saturating_sub(1), unit)
    }

    /// Whether an attempt numbered `attempt` (1-based) that ended with `status` gets
    /// another one.
    pub fn retries(&self, attempt: u32, status: u16) -> bool {
        is_retryable(status) && attempt < self.max_attempts
    }
}

/// The broker a queue trigger reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueKind {
    /// RabbitMQ (AMQP 0-9-1): a durable queue, declared if missing.
    Amqp,
    /// Kafka: a topic read by a consumer group.
    Kafka,
    /// MQTT 3.1.1/5: a topic filter at QoS 1 in a persistent session.
    Mqtt,
    /// NATS JetStream: a subject read by a durable consumer.
    Nats,
}

impl QueueKind {
    pub const ALL: [QueueKind; 4] = [
        QueueKind::Amqp,
        QueueKind::Kafka,
        QueueKind::Mqtt,
        QueueKind::Nats,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            QueueKind::Amqp => "amqp",
            QueueKind::Kafka => "kafka",
            QueueKind::Mqtt => "mqtt",
            QueueKind::Nats => "nats",
        }
    }

    /// The URL schemes a source of this kind accepts.
    pub fn schemes(self) -> &'static [&'static str] {
        match self {
            QueueKind::Amqp => &["amqp", "amqps"],
            QueueKind::Kafka => &["kafka"],
            QueueKind::Mqtt => &["mqtt", "mqtts", "tcp", "ssl"],
            QueueKind::Nats => &["nats", "tls"],
        }
    }
}

/// Where a group that has never consumed starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// Messages published after the consumer is positioned.
    #[default]
    Latest,
    /// Everything the broker still holds.
    Earliest,
}

/// A queue trigger's `source`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSource {
    pub kind: QueueKind,
    /// The broker's URL, credentials included; or `url_secret` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A secret key holding the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_secret: Option<SecretRef>,
    /// Queue (amqp), topic (kafka), topic filter (mqtt) or subject (nats).
    pub topic: String,
    /// Consumer group (kafka), session (mqtt), durable consumer (nats); unused for
    /// amqp. Filled with `sless-{ns}-{trigger}` when the trigger is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default)]
    pub start_from: StartFrom,
}

impl QueueSource {
    /// The group a trigger uses when its source names none.
    pub fn default_group(namespace: &str, trigger: &str) -> String {
        format!("sless-{namespace}-{trigger}")
    }

    /// Fills `group` with [`QueueSource::default_group`] when it is unset.
    pub fn fill_group(&mut self, namespace: &str, trigger: &str) {
        if self.group.is_none() {
            self.group = Some(Self::default_group(namespace, trigger));
        }
    }

    /// Checks the fields (errors name `source.<field>`); an unset `group` is fine
    /// (see [`QueueSource::fill_group`]).
    pub fn validate(&self) -> Result<(), ValidationError> {
        match (&self.url, &self.url_secret) {
            (None, None) => {
                return Err(ValidationError::new(
                    "source.url",
                    "required (or url_secret naming a secret key that holds it)",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(ValidationError::new(
                    "source.url_secret",
                    "give either url or url_secret, not both",
                ));
            }
            (Some(url), None) => check_url(self.kind, url)?,
            (None, Some(r)) => {
                crate::validate_name("source.url_secret.secret", &r.secret)?;
                if r.key.is_empty() {
                    return Err(ValidationError::new("source.url_secret.key", "required"));
                }
            }
        }
        if self.topic.trim().is_empty() {
            return Err(ValidationError::new("source.topic", "required"));
        }
        if self.topic.len() > 255 || self.topic.contains(['\0', '\n', '\r']) {
            return Err(ValidationError::new(
                "source.topic",
                "must be at most 255 characters, without NUL or line breaks",
            ));
        }
        let Some(group) = &self.group else {
            return Ok(());
        };
        if group.is_empty()
            || group.len() > 200
            || !group
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(ValidationError::new(
                "source.group",
                "must be 1 to 200 of letters, digits, '-', '_' and '.'",
            ));
        }
        Ok(())
    }
}

/// Checks that `url` is a URL of one of `kind`'s schemes with a host.
pub fn check_url(kind: QueueKind, url: &str) -> Result<(), ValidationError> {
    let bad = |why: String| Err(ValidationError::new("source.url", why));
    let Some((scheme, rest)) = url.split_once("://") else {
        return bad(format!(
            "must be a URL like {}://host:port",
            kind.schemes()[0]
        ));
    };
    if !kind
        .schemes()
        .contains(&scheme.to_ascii_lowercase().as_str())
    {
        return bad(format!(
            "a {} source takes {} URLs, not {scheme:?}",
            kind.as_str(),
            kind.schemes().join(", ")
        ));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    if host.is_empty() || url.len() > 2048 || url.chars().any(char::is_whitespace) {
        return bad("must name a host, without spaces, in at most 2048 characters".to_string());
    }
    if kind == QueueKind::Mqtt
        && let Err(why) = MqttVersion::from_url(url)
    {
        return bad(why);
    }
    Ok(())
}

/// The MQTT protocol version a source speaks: `?version=5` on its URL, 3.1.1 without.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MqttVersion {
    /// MQTT 3.1.1 (protocol level 4): no properties, so no headers.
    #[default]
    V311,
    /// MQTT 5: user properties carry headers; the session has an expiry and the
    /// client a receive maximum.
    V5,
}

impl MqttVersion {
    /// Reads the version from an MQTT URL's query (`version=5`, `version=3.1.1`);
    /// any other query parameter is refused, naming it.
    pub fn from_url(url: &str) -> Result<Self, String> {
        let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
        let Some((_, query)) = after_scheme
            .split('#')
            .next()
            .unwrap_or_default()
            .split_once('?')
        else {
            return Ok(Self::V311);
        };
        let mut version = Self::V311;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if key != "version" {
                return Err(format!(
                    "unknown query parameter {key:?}: an MQTT URL takes only version=3.1.1 or version=5"
                ));
            }
            version = match value {
                "5" | "5.0" => Self::V5,
                "3.1.1" | "4" => Self::V311,
                _ => {
                    return Err(format!(
                        "version={value:?}: an MQTT URL takes version=3.1.1 or version=5"
                    ));
                }
            };
        }
        Ok(version)
    }
}

/// A queue trigger's `event`: what the handler receives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventShape {
    /// The payload: JSON, text, or `{"base64": ...}`.
    #[default]
    Payload,
    /// `{"payload": ..., "message": {...}}`.
    Envelope,
}

/// The phase of an async call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CallPhase {
    Queued,
    Running,
    Succeeded,
    Failed,
}

impl CallPhase {
    pub const ALL: [CallPhase; 4] = [
        CallPhase::Queued,
        CallPhase::Running,
        CallPhase::Succeeded,
        CallPhase::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CallPhase::Queued => "Queued",
            CallPhase::Running => "Running",
            CallPhase::Succeeded => "Succeeded",
            CallPhase::Failed => "Failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Whether the call has ended.
    pub fn is_terminal(self) -> bool {
        matches!(self, CallPhase::Succeeded | CallPhase::Failed)
    }
}

/// What a dead letter came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadLetterSource {
    Queue,
    Device,
    Async,
}

impl DeadLetterSource {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterSource::Queue => "queue",
            DeadLetterSource::Device => "device",
            DeadLetterSource::Async => "async",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Queue, Self::Device, Self::Async]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// A message or call that exhausted its delivery policy (or failed without retry),
/// kept until it is redriven or deleted. It holds what was delivered, never a
/// secret's value (URLs with credentials are not part of it).
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    pub id: String,
    pub namespace: String,
    pub source: DeadLetterSource,
    /// The queue or device trigger it came through; `None` for async calls.
    pub trigger: Option<String>,
    pub function: String,
    /// The message's payload as the broker gave it; for an async call, its event (JSON).
    pub payload: Vec<u8>,
    /// `context.message` of its last attempt (queue, device); for an async call
    /// `{"call_id": ...}`.
    pub message: serde_json::Value,
    pub attempts: u32,
    /// The status of the last attempt.
    pub last_status: u16,
    /// The last attempt's error (the handler's exception, the platform's reason).
    pub error: Option<String>,
    pub failed_at: chrono::DateTime<chrono::Utc>,
}

/// A payload mapped as a handler's event: parsed JSON when it is JSON, otherwise the
/// text (an empty payload is `""`), otherwise (not UTF-8) `{"base64": "..."}`.
pub fn payload_event(payload: &[u8]) -> serde_json::Value {
    use base64::Engine as _;
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(payload) {
        return v;
    }
    match std::str::from_utf8(payload) {
        Ok(text) => serde_json::Value::String(text.to_string()),
        Err(_) => serde_json::json!({
            "base64": base64::engine::general_purpose::STANDARD.encode(payload)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests_support::decode;
    use serde_json::json;

    #[test]
    fn defaults_are_the_contracts() {
        let p: DeliveryPolicy = decode(json!({})).unwrap();
        assert_eq!(p, DeliveryPolicy::default());
        assert_eq!(
            serde_json::to_value(p).unwrap(),
            json!({"max_attempts": 3, "backoff_initial_ms": 500, "backoff_max_ms": 60000,
                   "concurrency": 1, "ordering": "none"})
        );
    }

    #[test]
    fn unknown_fields_and_bad_values_name_the_field() {
        let e = decode::<DeliveryPolicy>(json!({"retries": 2})).unwrap_err();
        assert!(e.contains("unknown field `retries`"), "{e}");
        let e = decode::<DeliveryPolicy>(json!({"ordering": "fifo"})).unwrap_err();
        assert!(e.starts_with("ordering:"), "{e}");
        for (body, field) in [
            (json!({"max_attempts": 0}), "delivery.max_attempts"),
            (json!({"max_attempts": 101}), "delivery.max_attempts"),
            (
                json!({"backoff_initial_ms": 0}),
                "delivery.backoff_initial_ms",
            ),
            (
                json!({"backoff_initial_ms": 1000, "backoff_max_ms": 10}),
                "delivery.backoff_max_ms",
            ),
            (json!({"concurrency": 0}), "delivery.concurrency"),
            (json!({"concurrency": 1001}), "delivery.concurrency"),
        ] {
            let p: DeliveryPolicy = decode(body.clone()).unwrap();
            assert_eq!(p.validate("delivery").unwrap_err().field, field, "{body}");
        }
    }

    #[test]
    fn what_is_retried() {
        for s in [408, 429, 500, 502, 503, 504] {
            assert!(is_retryable(s), "{s}");
            assert!(!is_success(s));
        }
        for s in [400, 401, 403, 404, 409, 413, 422, 501] {
            assert!(!is_retryable(s), "{s}");
        }
        assert!(is_success(200) && is_success(302) && !is_success(400));
        let p = DeliveryPolicy::default();
        assert!(p.retries(1, 500) && p.retries(2, 429) && !p.retries(3, 500));
        assert!(!p.retries(1, 400));
    }

    #[test]
    fn retry_delays_grow_and_stop_at_the_cap() {
        let p = DeliveryPolicy {
            backoff_initial_ms: 100,
            backoff_max_ms: 1000,
            ..Default::default()
        };
        assert_eq!(p.retry_delay(2, 1.0), Duration::from_millis(100));
        assert_eq!(p.retry_delay(3, 1.0), Duration::from_millis(200));
        assert_eq!(p.retry_delay(3, 0.0), Duration::from_millis(100));
        assert_eq!(p.retry_delay(20, 1.0), Duration::from_millis(1000));
    }

    #[test]
    fn mqtt_urls_pick_their_protocol_version() {
        for (url, version) in [
            ("mqtt://h:1883", MqttVersion::V311),
            ("mqtt://h:1883/?version=5", MqttVersion::V5),
            ("mqtts://u:p@h?version=5#x", MqttVersion::V5),
            ("mqtt://h?version=3.1.1", MqttVersion::V311),
            ("mqtt://h?version=4", MqttVersion::V311),
        ] {
            assert_eq!(MqttVersion::from_url(url), Ok(version), "{url}");
            check_url(QueueKind::Mqtt, url).unwrap();
        }
        for (url, needle) in [
            ("mqtt://h?version=6", "version=\"6\""),
            ("mqtt://h?qos=2", "unknown query parameter \"qos\""),
        ] {
            let e = check_url(QueueKind::Mqtt, url).unwrap_err();
            assert_eq!(e.field, "source.url");
            assert!(e.message.contains(needle), "{url}: {}", e.message);
        }
        // Other kinds keep their own query strings.
        check_url(QueueKind::Amqp, "amqp://h/%2f?heartbeat=10").unwrap();
    }

    #[test]
    fn sources_are_checked_and_get_a_group() {
        let mut s: QueueSource =
            decode(json!({"kind": "amqp", "url": "amqp://guest:guest@127.0.0.1:5672/%2f", "topic": "orders"}))
                .unwrap();
        s.validate().unwrap();
        s.fill_group("default", "orders-in");
        assert_eq!(s.group.as_deref(), Some("sless-default-orders-in"));
        assert_eq!(s.start_from, StartFrom::Latest);
        for (body, field) in [
            (json!({"kind": "amqp", "topic": "t"}), "source.url"),
            (
                json!({"kind": "kafka", "url": "amqp://h:1", "topic": "t"}),
                "source.url",
            ),
            (
                json!({"kind": "nats", "url": "nats://", "topic": "t"}),
                "source.url",
            ),
            (
                json!({"kind": "mqtt", "url": "mqtt://h:1883", "topic": " "}),
                "source.topic",
            ),
            (
                json!({"kind": "mqtt", "url": "mqtt://h:1883", "topic": "a", "group": "no spaces"}),
                "source.group",
            ),
            (
                json!({"kind": "nats", "url": "nats://h", "topic": "a",
                       "url_secret": {"secret": "s", "key": "url"}}),
                "source.url_secret",
            ),
        ] {
            let s: QueueSource = decode(body.clone()).unwrap();
            assert_eq!(s.validate().unwrap_err().field, field, "{body}");
        }
        let e =
            decode::<QueueSource>(json!({"kind": "sqs", "url": "x", "topic": "t"})).unwrap_err();
        assert!(e.starts_with("kind:"), "{e}");
    }

    #[test]
    fn payloads_map_to_events() {
        assert_eq!(payload_event(br#"{"a":1}"#), json!({"a": 1}));
        assert_eq!(payload_event(b"42"), json!(42));
        assert_eq!(payload_event(b"hello"), json!("hello"));
        assert_eq!(payload_event(b""), json!(""));
        assert_eq!(payload_event(&[0xff, 0x00]), json!({"base64": "/wA="}));
    }

    #[test]
    fn call_phases_round_trip() {
        for p in CallPhase::ALL {
            assert_eq!(CallPhase::parse(p.as_str()), Some(p));
        }
        assert!(CallPhase::Failed.is_terminal() && !CallPhase::Running.is_terminal());
    }
}
