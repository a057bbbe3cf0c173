//! Retention: a background task that prunes invocation records (or any other kind of
//! record, through [`spawn_pruning`]) by age and count.

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::pin::Pin;

use crate::{RecordSink, SinkError};
use tokio::task::JoinHandle;

/// How long and how many records are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Records older than this go; zero keeps them regardless of age.
    pub max_age: Duration,
    /// Each namespace keeps at most this many (the newest); zero means no bound.
    pub max_count: u64,
    /// How often to prune.
    pub every: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(168 * 3600),
            max_count: 100_000,
            every: Duration::from_secs(60),
        }
    }
}

/// Prunes `store` now and then every `retention.every`, until the task is aborted.
/// Failures are logged and retried at the next tick: retention is housekeeping,
/// and a busy database is no reason to stop the server.
pub fn spawn_retention(store: Arc<dyn RecordSink>, retention: Retention) -> JoinHandle<()> {
    spawn_pruning(
        "invocation records",
        retention,
        move |max_age, max_count| {
            let store = store.clone();
            Box::pin(async move { store.prune(max_age, max_count).await })
        },
    )
}

/// What [`spawn_pruning`] calls: prune by `(max_age, max_count)`, answering how many went.
pub type PruneFuture = Pin<Box<dyn Future<Output = Result<u64, SinkError>> + Send>>;

/// The retention loop for any kind of record (invocation records, the audit log):
/// calls `prune` now and then every `retention.every` until the task is aborted,
/// logging failures as `what` and retrying at the next tick. Does nothing when
/// both bounds are off.
pub fn spawn_pruning<F>(what: &'static str, retention: Retention, prune: F) -> JoinHandle<()>
where
    F: Fn(Duration, u64) -> PruneFuture + Send + Sync + 'static,
{
    tokio::spawn(async move {
        if retention.max_age.is_zero() && retention.max_count == 0 {
            return;
        }
        let mut tick = tokio::time::interval(retention.every.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match prune(retention.max_age, retention.max_count).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(deleted = n, "pruned {what}"),
                Err(e) => tracing::warn!(error = %e, "could not prune {what}"),
            }
        }
    })
}
