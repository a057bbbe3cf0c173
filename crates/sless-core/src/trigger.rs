//! Triggers: extra public HTTP routes to a function, cron schedules, and (later)
//! queue subscriptions, as a typed spec (one variant per `type`) with its defaults,
//! and the typed `last_result` of their status. Type-specific rules that need a cron
//! parser live with the scheduler; everything else is checked here.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{DeliveryPolicy, EventShape, QueueSource, ValidationError};

/// The type of a trigger, the wire's `type` word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TriggerType {
    Http,
    Cron,
    Queue,
    Device,
}

impl TriggerType {
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerType::Http => "http",
            TriggerType::Cron => "cron",
            TriggerType::Queue => "queue",
            TriggerType::Device => "device",
        }
    }
}

/// A trigger as stored and served: the fields every trigger has plus those of its
/// type, flat on the wire (`{"function", "type", "enabled", "path", ...}`).
///
/// Decoding is lenient (fields it does not know are ignored, so a client reads a newer
/// server's answers); requests are decoded strictly through [`TriggerFields`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriggerSpec {
    /// The function it invokes.
    pub function: String,
    /// `false` stops firing without deleting anything.
    #[serde(default = "defaults::enabled")]
    pub enabled: bool,
    /// The type and its fields.
    #[serde(flatten)]
    pub kind: TriggerKind,
}

/// A trigger's type with the fields that belong to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum TriggerKind {
    /// A public route below `/t/{ns}` to the function.
    Http {
        /// The route, normalised (`/orders/` → `/orders`).
        path: String,
        /// The methods it accepts, upper case, sorted (default: all).
        #[serde(default = "defaults::methods")]
        methods: Vec<String>,
    },
    /// A schedule.
    Cron {
        /// 5 fields, or 6 with seconds first.
        schedule: String,
        /// An IANA time zone (default `UTC`).
        #[serde(default = "defaults::timezone")]
        timezone: String,
        /// The event passed to the handler (with `fired_at` added; default `{}`).
        #[serde(default = "defaults::event")]
        event: Value,
        /// Start an instance this many seconds before each fire (default 0).
        #[serde(default)]
        prewarm_sec: u32,
    },
    /// Messages from a broker, delivered under a [`DeliveryPolicy`].
    Queue {
        source: QueueSource,
        /// What the handler receives (default: the payload).
        #[serde(default)]
        event: EventShape,
        /// The handler's return value is published here after success.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        response_topic: Option<String>,
        /// Dead letters are also published here.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dead_letter_topic: Option<String>,
        /// The trigger's own policy (default: the contract's defaults).
        #[serde(default)]
        delivery: DeliveryPolicy,
    },
    /// Every telemetry message of the namespace's devices whose name matches
    /// `devices`, delivered under a [`DeliveryPolicy`].
    Device {
        /// `*`, a device name, or a glob (`*` any run of characters, `?` one).
        #[serde(default = "defaults::devices")]
        devices: String,
        /// What the handler receives (default: the payload).
        #[serde(default)]
        event: EventShape,
        /// The trigger's own policy (default: the contract's defaults).
        #[serde(default)]
        delivery: DeliveryPolicy,
    },
    /// A type this build does not know: a newer server's answer, or a record a newer
    /// build stored. Requests go through [`TriggerFields`], which refuses it.
    #[serde(other, rename = "unknown")]
    Unknown,
}

impl TriggerKind {
    /// The type word; `None` for [`TriggerKind::Unknown`].
    pub fn trigger_type(&self) -> Option<TriggerType> {
        match self {
            TriggerKind::Http { .. } => Some(TriggerType::Http),
            TriggerKind::Cron { .. } => Some(TriggerType::Cron),
            TriggerKind::Queue { .. } => Some(TriggerType::Queue),
            TriggerKind::Device { .. } => Some(TriggerType::Device),
            TriggerKind::Unknown => None,
        }
    }
}

/// The defaults of a trigger's optional fields: the only place they are written.
mod defaults {
    use serde_json::Value;

    pub fn enabled() -> bool {
        true
    }
    pub fn methods() -> Vec<String> {
        super::METHODS.iter().map(|m| m.to_string()).collect()
    }
    pub fn timezone() -> String {
        "UTC".to_string()
    }
    pub fn event() -> Value {
        Value::Object(Default::default())
    }
    pub fn devices() -> String {
        "*".to_string()
    }
}

/// A trigger as a request states it: every field of every type, checked strictly
/// (`deny_unknown_fields`, so an unknown field is an error naming it). Turned into a
/// [`TriggerSpec`] with `TryFrom`, which refuses fields of another type and fills defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerFields {
    pub function: String,
    #[serde(rename = "type")]
    pub kind: TriggerType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prewarm_sec: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<QueueSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_topic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_topic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<DeliveryPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<String>,
}

/// Fields a client may set on a trigger.
pub const TRIGGER_FIELDS: &[&str] = &[
    "function",
    "type",
    "enabled",
    "path",
    "methods",
    "schedule",
    "timezone",
    "event",
    "prewarm_sec",
    "source",
    "response_topic",
    "dead_letter_topic",
    "delivery",
    "devices",
];

const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

impl TryFrom<TriggerFields> for TriggerSpec {
    type Error = ValidationError;

    /// Refuses fields of another type than `type` and missing required ones; fills
    /// the defaults. Values are checked by [`TriggerSpec::validate`].
    fn try_from(f: TriggerFields) -> Result<Self, ValidationError> {
        crate::validate_name("function", &f.function)?;
        let foreign = |field: &str, present: bool| {
            if present {
                Err(ValidationError::new(
                    field,
                    format!("not a field of {:?} triggers", f.kind.as_str()),
                ))
            } else {
                Ok(())
            }
        };
        let kind = match f.kind {
            TriggerType::Http => {
                foreign("schedule", f.schedule.is_some())?;
                foreign("timezone", f.timezone.is_some())?;
                foreign("event", f.event.is_some())?;
                foreign("prewarm_sec", f.prewarm_sec.is_some())?;
                foreign("source", f.source.is_some())?;
                foreign("devices", f.devices.is_some())?;
                foreign_queue(&f)?;
                TriggerKind::Http {
                    path: f.path.clone().ok_or_else(|| {
                        ValidationError::new("path", "required for http triggers")
                    })?,
                    methods: f.methods.clone().unwrap_or_else(defaults::methods),
                }
            }
            TriggerType::Cron => {
                foreign("path", f.path.is_some())?;
                foreign("methods", f.methods.is_some())?;
                foreign("source", f.source.is_some())?;
                foreign("devices", f.devices.is_some())?;
                foreign_queue(&f)?;
                TriggerKind::Cron {
                    schedule: f.schedule.clone().ok_or_else(|| {
                        ValidationError::new("schedule", "required for cron triggers")
                    })?,
                    timezone: f.timezone.clone().unwrap_or_else(defaults::timezone),
                    event: f.event.clone().unwrap_or_else(defaults::event),
                    prewarm_sec: f.prewarm_sec.unwrap_or_default(),
                }
            }
            TriggerType::Queue => {
                foreign("path", f.path.is_some())?;
                foreign("methods", f.methods.is_some())?;
                foreign("schedule", f.schedule.is_some())?;
                foreign("timezone", f.timezone.is_some())?;
                foreign("prewarm_sec", f.prewarm_sec.is_some())?;
                foreign("devices", f.devices.is_some())?;
                let event = event_shape(&f)?;
                TriggerKind::Queue {
                    source: f.source.clone().ok_or_else(|| {
                        ValidationError::new("source", "required for queue triggers")
                    })?,
                    event,
                    response_topic: f.response_topic.clone(),
                    dead_letter_topic: f.dead_letter_topic.clone(),
                    delivery: f.delivery.unwrap_or_default(),
                }
            }
            TriggerType::Device => {
                foreign("path", f.path.is_some())?;
                foreign("methods", f.methods.is_some())?;
                foreign("schedule", f.schedule.is_some())?;
                foreign("timezone", f.timezone.is_some())?;
                foreign("prewarm_sec", f.prewarm_sec.is_some())?;
                foreign("source", f.source.is_some())?;
                foreign("response_topic", f.response_topic.is_some())?;
                foreign("dead_letter_topic", f.dead_letter_topic.is_some())?;
                TriggerKind::Device {
                    devices: f.devices.clone().unwrap_or_else(defaults::devices),
                    event: event_shape(&f)?,
                    delivery: f.delivery.unwrap_or_default(),
                }
            }
        };
        Ok(TriggerSpec {
            function: f.function,
            enabled: f.enabled.unwrap_or_else(defaults::enabled),
            kind,
        })
    }
}

impl TriggerSpec {
    /// Decodes a request's fields strictly ([`TriggerFields`]) and checks them
    /// ([`TriggerSpec::validate`]); for callers that need no field path in decoding errors.
    pub fn from_fields(fields: TriggerFields) -> Result<Self, ValidationError> {
        let mut spec = TriggerSpec::try_from(fields)?;
        spec.validate()?;
        Ok(spec)
    }

    /// The type word; `None` for a type this build does not know.
    pub fn trigger_type(&self) -> Option<TriggerType> {
        self.kind.trigger_type()
    }

    /// Checks the values of the trigger's fields and normalises them (the http path,
    /// methods upper case and sorted). The cron expression itself is parsed by the
    /// caller, which has the scheduler.
    pub fn validate(&mut self) -> Result<(), ValidationError> {
        crate::validate_name("function", &self.function)?;
        match &mut self.kind {
            TriggerKind::Http { path, methods } => {
                *path = normalise_path(path)?;
                if methods.is_empty() {
                    return Err(ValidationError::new(
                        "methods",
                        "must name at least one method",
                    ));
                }
                for m in methods.iter_mut() {
                    let upper = m.to_ascii_uppercase();
                    if !METHODS.contains(&upper.as_str()) {
                        return Err(ValidationError::new(
                            "methods",
                            format!("{m:?} is not one of {}", METHODS.join(", ")),
                        ));
                    }
                    *m = upper;
                }
                methods.sort();
                methods.dedup();
            }
            TriggerKind::Cron {
                schedule,
                prewarm_sec,
                ..
            } => {
                if schedule.trim().is_empty() {
                    return Err(ValidationError::new(
                        "schedule",
                        "required for cron triggers",
                    ));
                }
                if *prewarm_sec > 3600 {
                    return Err(ValidationError::new(
                        "prewarm_sec",
                        "must be between 0 and 3600",
                    ));
                }
            }
            TriggerKind::Queue {
                source,
                response_topic,
                dead_letter_topic,
                delivery,
                ..
            } => {
                source.validate()?;
                for (field, topic) in [
                    ("response_topic", response_topic),
                    ("dead_letter_topic", dead_letter_topic),
                ] {
                    if let Some(t) = topic
                        && (t.trim().is_empty()
                            || t.len() > 255
                            || t.contains(['\0', '\n', '\r', '#', '+', '*', '>']))
                    {
                        return Err(ValidationError::new(
                            field,
                            "must be 1 to 255 characters, without NUL, line breaks or wildcards",
                        ));
                    }
                }
                delivery.validate("delivery")?;
            }
            TriggerKind::Device {
                devices, delivery, ..
            } => {
                if devices.is_empty()
                    || devices.len() > 63
                    || !devices.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"-*?".contains(&b)
                    })
                {
                    return Err(ValidationError::new(
                        "devices",
                        "must be \"*\", a device name, or a glob of one (lowercase letters, digits, '-', '*' and '?'; at most 63 characters)",
                    ));
                }
                delivery.validate("delivery")?;
            }
            TriggerKind::Unknown => {
                return Err(ValidationError::new(
                    "type",
                    "must be one of http, cron, queue, device",
                ));
            }
        }
        Ok(())
    }
}

/// A queue or device trigger's `event`: `payload` (the default) or `envelope`.
fn event_shape(f: &TriggerFields) -> Result<EventShape, ValidationError> {
    match &f.event {
        None => Ok(EventShape::default()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            ValidationError::new(
                "event",
                format!(
                    "must be \"payload\" or \"envelope\" for {} triggers",
                    f.kind.as_str()
                ),
            )
        }),
    }
}

/// Refuses the queue-only fields on another type of trigger.
fn foreign_queue(f: &TriggerFields) -> Result<(), ValidationError> {
    for (field, present) in [
        ("response_topic", f.response_topic.is_some()),
        ("dead_letter_topic", f.dead_letter_topic.is_some()),
        ("delivery", f.delivery.is_some()),
    ] {
        if present {
            return Err(ValidationError::new(
                field,
                format!("not a field of {:?} triggers", f.kind.as_str()),
            ));
        }
    }
    Ok(())
}

/// `/orders/` → `/orders`; must start with `/`, no `..`, `//`, query or fragment.
fn normalise_path(path: &str) -> Result<String, ValidationError> {
    let bad = |why: &str| Err(ValidationError::new("path", format!("{path:?} {why}")));
    if !path.starts_with('/') {
        return bad("must start with '/'");
    }
    if path.contains(['?', '#', ' ', '\\']) || path.contains("//") {
        return bad("may not contain '?', '#', spaces, backslashes or '//'");
    }
    if path.split('/').any(|seg| seg == ".." || seg == ".") {
        return bad("may not contain '.' or '..' segments");
    }
    if path.len() > 512 {
        return bad("is longer than 512 characters");
    }
    let trimmed = path.trim_end_matches('/');
    Ok(if trimmed.is_empty() {
        "/".to_string()
    } else {
        trimmed.to_string()
    })
}

/// What the platform reports about a trigger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TriggerStatus {
    pub last_fired_at: Option<DateTime<Utc>>,
    pub next_fire_at: Option<DateTime<Utc>>,
    pub last_result: Option<TriggerResult>,
    /// Queue and device triggers: the consumer's connection to the broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<ConnectionState>,
    /// Queue and device triggers: why the connection last failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Queue and device triggers: what happened to the messages since the server started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<DeliveryCounters>,
    /// Queue triggers: messages waiting in the broker, where the broker tells it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
}

/// The state of a queue trigger's consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectionState {
    /// Subscribed and positioned: every message published from now on is delivered.
    Connected,
    /// Connecting, or waiting to connect again after a failure.
    Connecting,
    /// The source cannot work as configured (for example its credentials were refused);
    /// it keeps retrying, with back-off.
    Failed,
}

impl ConnectionState {
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionState::Connected => "connected",
            ConnectionState::Connecting => "connecting",
            ConnectionState::Failed => "failed",
        }
    }
}

/// What happened to a trigger's messages: `received` counts each message once
/// (a redelivery by the broker again), the others count attempts and outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeliveryCounters {
    pub received: u64,
    pub succeeded: u64,
    pub retried: u64,
    pub failed: u64,
    pub dead_lettered: u64,
}

/// How many scheduled runs were missed while the server was down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissedRuns {
    /// Exactly this many.
    Exactly(u64),
    /// More than this many (counting stopped there).
    MoreThan(u64),
}

/// What happened last to a trigger: its `status.last_result`. On the wire (and in the
/// store) it is the one-line text of its `Display`, as it always was; text this build
/// does not recognise (a newer server's) decodes as [`TriggerResult::Other`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TriggerResult {
    /// An invocation is in flight: `running`.
    Running,
    /// A slot came while the previous run was still going:
    /// `skipped: previous run still running`.
    SkippedOverlap,
    /// Slots passed while the server was down:
    /// `missed 3 run(s) while the server was down (last due 2025-01-01T00:00:00Z)`.
    Missed {
        runs: MissedRuns,
        last_due: DateTime<Utc>,
    },
    /// An invocation ended: `ok: status 200`, `error: status 500` or
    /// `error: status 504: timed out after 30s` (an error, or a status of 400 and above, fails).
    Finished { status: u16, error: Option<String> },
    /// The invocation's task ended without an outcome: `error: the invocation was aborted`.
    Aborted,
    /// Any other text.
    Other(String),
}

impl TriggerResult {
    /// Whether this is a finished invocation that succeeded.
    pub fn is_success(&self) -> bool {
        matches!(self, TriggerResult::Finished { status, error: None } if *status < 400)
    }

    /// Reads the text [`Display`](std::fmt::Display) writes; anything else is `Other`.
    pub fn parse(text: &str) -> TriggerResult {
        let parsed = Self::parse_known(text);
        // Only a form that writes back to the very same text counts as recognised.
        match parsed {
            Some(r) if r.to_string() == text => r,
            _ => TriggerResult::Other(text.to_string()),
        }
    }

    fn parse_known(text: &str) -> Option<TriggerResult> {
        Some(match text {
            "running" => TriggerResult::Running,
            "skipped: previous run still running" => TriggerResult::SkippedOverlap,
            "error: the invocation was aborted" => TriggerResult::Aborted,
            _ => {
                if let Some(status) = text.strip_prefix("ok: status ") {
                    TriggerResult::Finished {
                        status: status.parse().ok()?,
                        error: None,
                    }
                } else if let Some(rest) = text.strip_prefix("error: status ") {
                    let (status, error) = match rest.split_once(": ") {
                        Some((status, error)) => (status, Some(error.to_string())),
                        None => (rest, None),
                    };
                    TriggerResult::Finished {
                        status: status.parse().ok()?,
                        error,
                    }
                } else {
                    let rest = text.strip_prefix("missed ")?;
                    let (runs, rest) =
                        rest.split_once(" run(s) while the server was down (last due ")?;
                    let due = rest.strip_suffix(')')?;
                    let runs = match runs.strip_prefix("more than ") {
                        Some(n) => MissedRuns::MoreThan(n.parse().ok()?),
                        None => MissedRuns::Exactly(runs.parse().ok()?),
                    };
                    TriggerResult::Missed {
                        runs,
                        last_due: DateTime::parse_from_rfc3339(due).ok()?.with_timezone(&Utc),
                    }
                }
            }
        })
    }
}

impl std::fmt::Display for TriggerResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TriggerResult::Running => f.write_str("running"),
            TriggerResult::SkippedOverlap => f.write_str("skipped: previous run still running"),
            TriggerResult::Missed { runs, last_due } => {
                let due = last_due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                match runs {
                    MissedRuns::Exactly(n) => write!(f, "missed {n}")?,
                    MissedRuns::MoreThan(n) => write!(f, "missed more than {n}")?,
                }
                write!(f, " run(s) while the server was down (last due {due})")
            }
            TriggerResult::Finished { status, error } => match error {
                Some(err) => write!(f, "error: status {status}: {err}"),
                None if *status < 400 => write!(f, "ok: status {status}"),
                None => write!(f, "error: status {status}"),
            },
            TriggerResult::Aborted => f.write_str("error: the invocation was aborted"),
            TriggerResult::Other(text) => f.write_str(text),
        }
    }
}

impl Serialize for TriggerResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TriggerResult {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(TriggerResult::parse(&String::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> Result<TriggerSpec, String> {
        let fields: TriggerFields = serde_json::from_value(v).map_err(|e| e.to_string())?;
        TriggerSpec::from_fields(fields).map_err(|e| e.to_string())
    }

    #[test]
    fn http_defaults_and_normalisation() {
        let s = spec(json!({"function": "f", "type": "http", "path": "/orders/", "methods": ["post", "GET", "get"]})).unwrap();
        assert_eq!(
            s.kind,
            TriggerKind::Http {
                path: "/orders".into(),
                methods: vec!["GET".into(), "POST".into()]
            }
        );
        assert!(s.enabled);
        let all = spec(json!({"function": "f", "type": "http", "path": "/"})).unwrap();
        let TriggerKind::Http { methods, .. } = all.kind else {
            panic!("http")
        };
        assert_eq!(methods.len(), METHODS.len());
    }

    #[test]
    fn cron_defaults() {
        let s = spec(json!({"function": "f", "type": "cron", "schedule": "*/5 * * * *"})).unwrap();
        assert_eq!(
            s.kind,
            TriggerKind::Cron {
                schedule: "*/5 * * * *".into(),
                timezone: "UTC".into(),
                event: json!({}),
                prewarm_sec: 0
            }
        );
    }

    #[test]
    fn strict_and_lenient_decoding_fill_the_same_defaults() {
        for v in [
            json!({"function": "f", "type": "cron", "schedule": "* * * * *"}),
            json!({"function": "f", "type": "http", "path": "/a"}),
            json!({"function": "f", "type": "http", "path": "/a", "enabled": false}),
        ] {
            let strict =
                TriggerSpec::try_from(serde_json::from_value::<TriggerFields>(v.clone()).unwrap())
                    .unwrap();
            let lenient: TriggerSpec = serde_json::from_value(v).unwrap();
            assert_eq!(strict, lenient);
        }
    }

    #[test]
    fn the_wire_shape_is_flat_with_a_type() {
        let s = spec(json!({"function": "f", "type": "cron", "schedule": "0 3 * * *", "timezone": "Europe/Berlin"})).unwrap();
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!({"function": "f", "type": "cron", "enabled": true, "schedule": "0 3 * * *",
                   "timezone": "Europe/Berlin", "event": {}, "prewarm_sec": 0})
        );
        let h = spec(json!({"function": "f", "type": "http", "path": "/a", "methods": ["GET"]}))
            .unwrap();
        assert_eq!(
            serde_json::to_value(&h).unwrap(),
            json!({"function": "f", "type": "http", "enabled": true, "path": "/a", "methods": ["GET"]})
        );
        // What it writes, it reads back; a type and fields from a newer server still decode.
        assert_eq!(
            serde_json::from_value::<TriggerSpec>(serde_json::to_value(&s).unwrap()).unwrap(),
            s
        );
        let newer: TriggerSpec =
            serde_json::from_value(json!({"function": "f", "type": "webhook", "url": "x"}))
                .unwrap();
        let device = spec(json!({"function": "f", "type": "device"})).unwrap();
        assert_eq!(
            device.kind,
            TriggerKind::Device {
                devices: "*".into(),
                event: EventShape::Payload,
                delivery: DeliveryPolicy::default()
            }
        );
        let queue = spec(json!({"function": "f", "type": "queue",
            "source": {"kind": "nats", "url": "nats://127.0.0.1:4222", "topic": "orders.>"}}))
        .unwrap();
        match &queue.kind {
            TriggerKind::Queue {
                event, delivery, ..
            } => {
                assert_eq!(*event, EventShape::Payload);
                assert_eq!(*delivery, DeliveryPolicy::default());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(newer.kind, TriggerKind::Unknown);
        assert_eq!(newer.trigger_type(), None);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({"function": "f", "type": "http"}), "path:"),
            (
                json!({"function": "f", "type": "http", "path": "orders"}),
                "path:",
            ),
            (
                json!({"function": "f", "type": "http", "path": "/a/../b"}),
                "path:",
            ),
            (
                json!({"function": "f", "type": "http", "path": "/a", "methods": ["BREW"]}),
                "methods:",
            ),
            (
                json!({"function": "f", "type": "http", "path": "/a", "methods": []}),
                "methods:",
            ),
            (
                json!({"function": "f", "type": "http", "path": "/a", "schedule": "* * * * *"}),
                "schedule: not a field of \"http\" triggers",
            ),
            (json!({"function": "f", "type": "cron"}), "schedule:"),
            (
                json!({"function": "f", "type": "cron", "schedule": " "}),
                "schedule:",
            ),
            (
                json!({"function": "f", "type": "cron", "schedule": "* * * * *", "path": "/x"}),
                "path: not a field of \"cron\" triggers",
            ),
            (
                json!({"function": "f", "type": "cron", "schedule": "* * * * *", "prewarm_sec": 3601}),
                "prewarm_sec:",
            ),
            (
                json!({"function": "F", "type": "cron", "schedule": "* * * * *", "path": "/x"}),
                "function:",
            ),
            (json!({"function": "f", "type": "queue"}), "source:"),
            (
                json!({"function": "f", "type": "queue", "source": {"kind": "amqp", "topic": "q"}}),
                "source.url:",
            ),
            (
                json!({"function": "f", "type": "queue", "event": "raw",
                       "source": {"kind": "amqp", "url": "amqp://h", "topic": "q"}}),
                "event:",
            ),
            (
                json!({"function": "f", "type": "queue", "delivery": {"concurrency": 0},
                       "source": {"kind": "amqp", "url": "amqp://h", "topic": "q"}}),
                "delivery.concurrency:",
            ),
            (
                json!({"function": "f", "type": "queue", "dead_letter_topic": "a/#",
                       "source": {"kind": "mqtt", "url": "mqtt://h", "topic": "q"}}),
                "dead_letter_topic:",
            ),
            (
                json!({"function": "f", "type": "queue", "schedule": "* * * * *",
                       "source": {"kind": "amqp", "url": "amqp://h", "topic": "q"}}),
                "schedule: not a field of \"queue\" triggers",
            ),
            (
                json!({"function": "f", "type": "http", "path": "/", "delivery": {}}),
                "delivery: not a field of \"http\" triggers",
            ),
            (
                json!({"function": "f", "type": "device", "devices": "T*"}),
                "devices:",
            ),
            (
                json!({"function": "f", "type": "device", "source": {"kind": "mqtt", "url": "mqtt://h", "topic": "t"}}),
                "source: not a field of \"device\" triggers",
            ),
            (
                json!({"function": "f", "type": "device", "event": "raw"}),
                "event:",
            ),
            (
                json!({"function": "f", "type": "queue", "devices": "*",
                       "source": {"kind": "amqp", "url": "amqp://h", "topic": "q"}}),
                "devices: not a field of \"queue\" triggers",
            ),
            (
                json!({"function": "f", "type": "http", "path": "/", "colour": 1}),
                "unknown field `colour`, expected one of `function`, `type`, `enabled`, `path`, `methods`, `schedule`, `timezone`, `event`, `prewarm_sec`, `source`, `response_topic`, `dead_letter_topic`, `delivery`, `devices`",
            ),
            (
                json!({"function": "f", "type": "ftp"}),
                "unknown variant `ftp`, expected one of `http`, `cron`, `queue`",
            ),
        ];
        for (v, field) in cases {
            let err = spec(v.clone()).unwrap_err();
            assert!(err.starts_with(field), "{v}: {err}");
        }
    }

    #[test]
    fn last_results_round_trip_as_the_same_text() {
        let due: DateTime<Utc> = "2025-01-01T03:00:00Z".parse().unwrap();
        for (result, text) in [
            (TriggerResult::Running, "running"),
            (
                TriggerResult::SkippedOverlap,
                "skipped: previous run still running",
            ),
            (TriggerResult::Aborted, "error: the invocation was aborted"),
            (
                TriggerResult::Finished {
                    status: 200,
                    error: None,
                },
                "ok: status 200",
            ),
            (
                TriggerResult::Finished {
                    status: 500,
                    error: None,
                },
                "error: status 500",
            ),
            (
                TriggerResult::Finished {
                    status: 504,
                    error: Some("timed out after 30s: x".into()),
                },
                "error: status 504: timed out after 30s: x",
            ),
            (
                TriggerResult::Missed {
                    runs: MissedRuns::Exactly(3),
                    last_due: due,
                },
                "missed 3 run(s) while the server was down (last due 2025-01-01T03:00:00Z)",
            ),
            (
                TriggerResult::Missed {
                    runs: MissedRuns::MoreThan(1000),
                    last_due: due,
                },
                "missed more than 1000 run(s) while the server was down (last due 2025-01-01T03:00:00Z)",
            ),
            (TriggerResult::Other("200".into()), "200"),
            (
                TriggerResult::Other("ok: status 2xx".into()),
                "ok: status 2xx",
            ),
            (
                TriggerResult::Other(
                    "missed 1 run(s) while the server was down (last due 2025-01-01T03:00:00.5Z)"
                        .into(),
                ),
                "missed 1 run(s) while the server was down (last due 2025-01-01T03:00:00.5Z)",
            ),
        ] {
            assert_eq!(result.to_string(), text);
            assert_eq!(TriggerResult::parse(text), result, "{text}");
            assert_eq!(serde_json::to_value(&result).unwrap(), json!(text));
            assert_eq!(
                serde_json::from_value::<TriggerResult>(json!(text)).unwrap(),
                result
            );
        }
        assert!(TriggerResult::parse("ok: status 204").is_success());
        assert!(!TriggerResult::parse("error: status 500").is_success());
    }
}
