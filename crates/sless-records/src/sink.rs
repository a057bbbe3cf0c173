//! [`RecordSink`]: where the recorder's batches go. The records crate owns the seam
//! and a store implements it, so nothing on the invoke path links a database.

use std::time::Duration;

use async_trait::async_trait;
use sless_core::invocation::InvocationRecord;

/// Why a sink could not write or prune: the backend's own error, kept whole for the log.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct SinkError(Box<dyn std::error::Error + Send + Sync>);

impl SinkError {
    /// Wraps a backend's error.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(e))
    }
}

/// Durable storage for invocation records.
#[async_trait]
pub trait RecordSink: Send + Sync + 'static {
    /// Stores records, all or none (one transaction).
    async fn insert_batch(&self, records: &[InvocationRecord]) -> Result<(), SinkError>;

    /// Deletes records that started more than `max_age` ago, and in each namespace
    /// all but the newest `max_count`. The count bound is per namespace so that one
    /// busy namespace cannot push the records of the others out. A zero `max_age`
    /// or `max_count` turns that bound off. Returns how many records were deleted.
    async fn prune(&self, max_age: Duration, max_count: u64) -> Result<u64, SinkError>;
}
