//! Invocation records: what started a call of a function ([`InvocationSource`]) and
//! what it came to ([`InvocationRecord`]). Plain data: the pipeline in `sless-invoke`
//! builds them, `sless-records` buffers them and a store keeps them.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What started an invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InvocationSource {
    /// A request to the function's public URL, `/fn/{ns}/{name}`, or to an HTTP trigger's `/t/` route.
    Http,
    /// The authenticated `POST .../functions/{name}/invoke`.
    Invoke,
    /// A cron trigger firing.
    Cron,
    /// A message from a queue trigger.
    Queue,
    /// A job's attempt.
    Job,
    /// A telemetry message from a device trigger.
    Device,
    /// An async call (`/async/...` or `invoke?async=true`).
    Async,
}

impl InvocationSource {
    /// Every source, in the order the contract lists them.
    pub const ALL: [InvocationSource; 7] = [
        InvocationSource::Http,
        InvocationSource::Invoke,
        InvocationSource::Cron,
        InvocationSource::Queue,
        InvocationSource::Job,
        InvocationSource::Device,
        InvocationSource::Async,
    ];

    /// The name used on the wire, in the database and in the instance protocol's
    /// `X-Sless-Source` header.
    pub fn as_str(self) -> &'static str {
        match self {
            InvocationSource::Http => "http",
            InvocationSource::Invoke => "invoke",
            InvocationSource::Cron => "cron",
            InvocationSource::Queue => "queue",
            InvocationSource::Job => "job",
            InvocationSource::Device => "device",
            InvocationSource::Async => "async",
        }
    }

    /// The source named `s`, if it is one.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

impl std::fmt::Display for InvocationSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One finished invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct InvocationRecord {
    /// Unique and sortable by creation time (see `sless-records`).
    pub id: String,
    pub namespace: String,
    pub function: String,
    /// The revision that answered; `0` when no instance answered.
    pub revision: u64,
    pub source: InvocationSource,
    /// The `X-Request-Id` the caller sent or was given.
    pub request_id: String,
    pub started_at: DateTime<Utc>,
    pub duration: Duration,
    /// The HTTP status the caller saw.
    pub status: u16,
    /// The request had to wait for a new instance to start.
    pub cold_start: bool,
    /// The platform's error for a failed invocation, or the handler's exception message.
    pub error: Option<String>,
    /// Deliveries (queue, device, async): which attempt this was, 1-based. A message
    /// the broker delivered again starts at 1 again, under the same `request_id`.
    pub attempt: Option<u32>,
    /// The queue or device trigger that delivered it.
    pub trigger: Option<String>,
    /// The async call it was an attempt of.
    pub call_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_round_trip_by_name_and_serde() {
        for s in InvocationSource::ALL {
            assert_eq!(InvocationSource::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::Value::String(s.as_str().into())
            );
        }
        assert_eq!(InvocationSource::parse("HTTP"), None);
    }
}
