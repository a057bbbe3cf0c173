//! Dead letters at runtime: [`DeadLetters`] writes them (the async-call dispatcher
//! and the queue triggers' engines call it when a delivery is dead-lettered) and
//! removes them once a redrive succeeded; [`Redrive`] sends one (or all of a
//! trigger's) back to where it came from — an async call is queued again from
//! attempt 1, a queue or device message goes through its trigger's engine.

use std::sync::Arc;

use sless_core::{DeadLetter, DeadLetterSource};
use sless_store::{DeadLetterFilter, DeadLetterStore, MAX_DEAD_LETTER_LIMIT, StoreError};

use crate::calls::Calls;
use crate::triggers::{RedriveError, Triggers};

/// Writes and removes dead letters.
pub struct DeadLetters {
    store: Arc<dyn DeadLetterStore>,
}

impl DeadLetters {
    pub fn new(store: Arc<dyn DeadLetterStore>) -> Arc<Self> {
        Arc::new(Self { store })
    }

    /// The store dead letters are kept in.
    pub fn store(&self) -> &Arc<dyn DeadLetterStore> {
        &self.store
    }

    /// Keeps `dl`: a new dead letter, or an update of the one with its id (a redrive
    /// that failed again). The caller acknowledges the message only after this
    /// returned `Ok`. A dead letter holds what was delivered, never a secret's value:
    /// the trigger's URL (which may carry credentials) is not part of it.
    pub async fn write(&self, dl: DeadLetter) -> anyhow::Result<()> {
        self.store.put_dead_letter(&dl).await?;
        tracing::info!(namespace = %dl.namespace, function = %dl.function, id = %dl.id,
            source = dl.source.as_str(), attempts = dl.attempts, last_status = dl.last_status,
            "dead-lettered");
        Ok(())
    }

    /// Removes a dead letter whose redrive succeeded; one already gone is fine.
    pub async fn remove(&self, namespace: &str, id: &str) -> anyhow::Result<()> {
        match self.store.delete_dead_letter(namespace, id).await {
            Ok(()) | Err(StoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Why a dead letter was not redriven.
#[derive(Debug, thiserror::Error)]
pub enum RedriveFailure {
    /// No dead letter of that id in the namespace.
    #[error("dead letter {0:?} not found")]
    NotFound(String),
    /// It cannot go back now (its trigger is gone or disabled, its call unreadable).
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for RedriveFailure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { name, .. } => RedriveFailure::NotFound(name),
            e => RedriveFailure::Store(e),
        }
    }
}

impl From<RedriveError> for RedriveFailure {
    fn from(e: RedriveError) -> Self {
        RedriveFailure::Conflict(e.to_string())
    }
}

/// Sends dead letters back to be delivered again.
pub struct Redrive {
    dead_letters: Arc<DeadLetters>,
    calls: Arc<Calls>,
    triggers: Arc<Triggers>,
}

impl Redrive {
    pub fn new(dead_letters: Arc<DeadLetters>, calls: Arc<Calls>, triggers: Arc<Triggers>) -> Self {
        Self {
            dead_letters,
            calls,
            triggers,
        }
    }

    /// Delivers dead letter `id` again from attempt 1. It goes away when that
    /// succeeds, or comes back updated when it fails again.
    pub async fn one(&self, namespace: &str, id: &str) -> Result<(), RedriveFailure> {
        let dl = self
            .dead_letters
            .store
            .get_dead_letter(namespace, id)
            .await?;
        self.send(dl).await
    }

    /// Redrives every dead letter of `trigger`; answers how many went.
    pub async fn trigger(&self, namespace: &str, trigger: &str) -> Result<u64, RedriveFailure> {
        let filter = DeadLetterFilter {
            trigger: Some(trigger.to_string()),
            limit: Some(MAX_DEAD_LETTER_LIMIT),
            ..DeadLetterFilter::default()
        };
        let mut sent = 0;
        let mut seen = std::collections::HashSet::new();
        loop {
            let batch = self
                .dead_letters
                .store
                .list_dead_letters(namespace, &filter)
                .await?;
            let fresh: Vec<_> = batch
                .into_iter()
                .filter(|dl| seen.insert(dl.id.clone()))
                .collect();
            if fresh.is_empty() {
                return Ok(sent);
            }
            for dl in fresh {
                self.send(dl).await?;
                sent += 1;
            }
        }
    }

    async fn send(&self, dl: DeadLetter) -> Result<(), RedriveFailure> {
        match dl.source {
            DeadLetterSource::Async => {
                let call_id = dl
                    .message
                    .get("call_id")
                    .and_then(|v| v.as_str())
                    .unwrap_or(&dl.id)
                    .to_string();
                self.calls.redrive(&dl, &call_id).await?;
                Ok(())
            }
            DeadLetterSource::Queue | DeadLetterSource::Device => {
                self.triggers.redrive(dl).await?;
                Ok(())
            }
        }
    }
}
