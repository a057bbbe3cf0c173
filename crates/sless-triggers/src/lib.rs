//! Trigger machinery of sless: the seams every trigger uses, cron schedules and the cron scheduler.
//!
//! Two seams connect triggers to the rest of the platform:
//!
//! - [`TriggerSource`] is one kind of event source (the cron scheduler today, queue consumers
//!   later). The binary starts each source with [`TriggerSource::run`] and a shutdown token.
//! - [`Fire`] is the sink every source fires into. The server implements it with the executor,
//!   so trigger code never knows about instances, sandboxes or HTTP.
//!
//! Cron triggers additionally report their status (`last_fired_at`, `next_fire_at`,
//! `last_result`) through [`scheduler::StateSink`], which the server persists.
//!
//! # Wiring
//!
//! ```text
//! let sched = CronScheduler::new(fire, sink, Arc::new(SystemClock), SchedulerConfig::default());
//! for t in store.cron_triggers() { sched.upsert(t); }       // with their persisted CronState
//! tokio::spawn(Box::new(sched.clone()).run(shutdown.child_token()));
//! // API: Schedule::parse(expr, tz) validates (400 with its message), then upsert / remove;
//! // GET status: sched.state(ns, name).
//! ```

pub mod cron;
pub mod delivery;
pub mod scheduler;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

pub use crate::cron::{DEFAULT_TIMEZONE, Schedule, ScheduleError};
pub use crate::scheduler::{
    Clock, CronScheduler, CronState, CronTrigger, SchedulerConfig, SchedulerError, StateSink,
    SystemClock,
};

/// One kind of event source, started once by the binary and run until `shutdown` is cancelled.
///
/// A queue consumer (MQTT, NATS, AMQP) is one more implementation: it owns its connections,
/// turns each message into a [`FireRequest`] and hands it to its [`Fire`] sink.
#[async_trait]
pub trait TriggerSource: Send + Sync {
    /// A short name for logs and metrics, also the invocation `source` (`"cron"`, `"queue"`).
    fn kind(&self) -> &'static str;

    /// Runs until `shutdown` is cancelled, then stops taking new events and returns. An error
    /// means the source cannot work at all (for example it was started twice).
    async fn run(self: Box<Self>, shutdown: CancellationToken) -> anyhow::Result<()>;
}

/// One invocation a trigger asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct FireRequest {
    /// Namespace of the trigger and of the function.
    pub namespace: String,
    /// The function to invoke.
    pub function: String,
    /// Name of the trigger that fired, for the invocation record and logs.
    pub trigger: String,
    /// What fired it, the invocation record's `source`.
    pub source: sless_core::invocation::InvocationSource,
    /// The handler's event.
    pub event: serde_json::Value,
    /// When the trigger fired. For cron this is the scheduled slot, not the moment the timer
    /// woke, so handlers may use it as an idempotency key.
    pub fired_at: DateTime<Utc>,
    /// Deliveries (queue, device, async): which attempt this is (1-based), the id the
    /// invocation record carries as its request id (the message id, so a redelivered
    /// message is visible as such), the async call it belongs to, and the handler's
    /// `context.message`. All `None` for cron.
    pub delivery: Option<DeliveryInfo>,
}

/// What a delivery adds to a [`FireRequest`].
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryInfo {
    pub attempt: u32,
    pub request_id: String,
    pub call_id: Option<String>,
    /// `context.message` (queue and device triggers).
    pub message: Option<serde_json::Value>,
}

/// How an invocation ended, as far as the trigger needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireOutcome {
    /// The HTTP status the handler's response had (or the platform's, e.g. `504` on timeout).
    pub status: u16,
    /// Why it failed, if it did; `None` for a handled request.
    pub error: Option<String>,
    /// The response as a caller of `/fn/` would have seen it, when the handler
    /// answered (for async calls' callbacks and `response_topic`); `None` otherwise.
    pub response: Option<FireResponse>,
}

/// A function's answer mapped to HTTP, as the gateway maps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: bytes::Bytes,
}

impl FireOutcome {
    /// Whether the invocation counts as a success: no error and a status below 400.
    pub fn is_success(&self) -> bool {
        self.error.is_none() && self.status < 400
    }

    /// What a trigger's `last_result` shows for it; its text is `ok: status 200`,
    /// `error: status 500` or `error: status 504: timed out after 30s`.
    pub fn result(&self) -> sless_core::TriggerResult {
        sless_core::TriggerResult::Finished {
            status: self.status,
            error: self.error.clone(),
        }
    }
}

/// The sink every trigger fires into; the server implements it with the executor.
#[async_trait]
pub trait Fire: Send + Sync + 'static {
    /// Invokes `req.function` with `req.event` and waits for it to finish.
    async fn fire(&self, req: FireRequest) -> FireOutcome;

    /// Gets an instance of the function ready ahead of an expected invocation. Best effort:
    /// errors are the implementation's to log, the trigger fires regardless.
    async fn prewarm(&self, namespace: &str, function: &str);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_summaries() {
        let ok = FireOutcome {
            status: 200,
            error: None,
            response: None,
        };
        assert!(ok.is_success());
        assert_eq!(ok.result().to_string(), "ok: status 200");
        let bad = FireOutcome {
            status: 500,
            error: None,
            response: None,
        };
        assert!(!bad.is_success());
        assert_eq!(bad.result().to_string(), "error: status 500");
        let timeout = FireOutcome {
            status: 504,
            error: Some("timed out after 30s".to_string()),
            response: None,
        };
        assert_eq!(
            timeout.result().to_string(),
            "error: status 504: timed out after 30s"
        );
    }
}
