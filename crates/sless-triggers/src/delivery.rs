//! The delivery engine: one per queue trigger, device trigger and function with async
//! calls. It takes [`Delivery`]s, invokes the function through [`Fire`] under a
//! [`DeliveryPolicy`] (bounded in flight, per-key order when asked, retries with capped
//! exponential back-off and jitter on retryable outcomes only), and settles each one
//! exactly once through [`DeliveryHooks::settled`] — success, or a dead letter — before
//! it runs the delivery's `done` (the broker acknowledgement).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::future::BoxFuture;
use sless_core::invocation::InvocationSource;
use sless_core::{DeliveryCounters, DeliveryPolicy};

use crate::{DeliveryInfo, Fire, FireOutcome, FireRequest, FireResponse};

/// What an engine delivers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    pub function: String,
    /// `queue`, `device` or `async`: the invocation records' source.
    pub source: InvocationSource,
    /// The trigger's name (queue and device triggers).
    pub trigger: Option<String>,
}

/// One message or call to deliver.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The message id (or call id): every attempt's invocation record carries it as
    /// its request id.
    pub id: String,
    /// The ordering key (used with `ordering: key`).
    pub key: Option<String>,
    /// The handler's event.
    pub event: serde_json::Value,
    /// `context.message` for the handler (queue and device triggers).
    pub message: Option<serde_json::Value>,
    /// The async call it is.
    pub call_id: Option<String>,
    /// The dead letter it redrives, if it is a redrive.
    pub redrive_of: Option<String>,
}

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// An attempt succeeded.
    Succeeded {
        attempts: u32,
        response: Option<FireResponse>,
    },
    /// The last attempt failed (or failed without retry): a dead letter.
    DeadLettered {
        attempts: u32,
        last_status: u16,
        error: Option<String>,
        response: Option<FireResponse>,
    },
}

/// What an engine's owner does around deliveries.
#[async_trait]
pub trait DeliveryHooks: Send + Sync + 'static {
    /// An attempt is about to start (async calls mark themselves `Running`).
    async fn attempt_started(&self, _delivery: &Delivery, _attempt: u32) {}

    /// The delivery ended: publish the response, or write the dead letter. The engine
    /// runs the delivery's `done` (its acknowledgement) only after this returned `Ok`;
    /// on `Err` it calls again after a back-off, so nothing is acknowledged unsettled.
    async fn settled(&self, delivery: &Delivery, settled: &Settled) -> anyhow::Result<()>;
}

/// Runs after a delivery settled: the broker acknowledgement.
pub type Done = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// The engine of one trigger (or one function's async calls).
pub struct Engine {
    target: Target,
    policy: Mutex<DeliveryPolicy>,
    fire: Arc<dyn Fire>,
    hooks: Arc<dyn DeliveryHooks>,
    counters: Mutex<DeliveryCounters>,
}

impl Engine {
    pub fn new(
        target: Target,
        policy: DeliveryPolicy,
        fire: Arc<dyn Fire>,
        hooks: Arc<dyn DeliveryHooks>,
    ) -> Arc<Self> {
        Arc::new(Self {
            target,
            policy: Mutex::new(policy),
            fire,
            hooks,
            counters: Mutex::default(),
        })
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Takes a delivery: waits while the engine is at its bound of messages held
    /// (back-pressure for the connector), then delivers it in the background and
    /// runs `done` once it settled.
    pub async fn submit(self: &Arc<Self>, delivery: Delivery, done: Done) {
        // A first version: one attempt at a time, in the caller's task.
        self.counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .received += 1;
        let outcome = self.attempt(&delivery, 1).await;
        let settled = if outcome.is_success() {
            Settled::Succeeded {
                attempts: 1,
                response: outcome.response,
            }
        } else {
            Settled::DeadLettered {
                attempts: 1,
                last_status: outcome.status,
                error: outcome.error,
                response: outcome.response,
            }
        };
        if self.hooks.settled(&delivery, &settled).await.is_ok() {
            done().await;
        }
    }

    async fn attempt(&self, delivery: &Delivery, attempt: u32) -> FireOutcome {
        self.hooks.attempt_started(delivery, attempt).await;
        self.fire
            .fire(FireRequest {
                namespace: self.target.namespace.clone(),
                function: self.target.function.clone(),
                trigger: self.target.trigger.clone().unwrap_or_default(),
                source: self.target.source,
                event: delivery.event.clone(),
                fired_at: chrono::Utc::now(),
                delivery: Some(DeliveryInfo {
                    attempt,
                    request_id: delivery.id.clone(),
                    call_id: delivery.call_id.clone(),
                    message: delivery.message.clone(),
                }),
            })
            .await
    }

    /// Changes the policy; deliveries in flight finish under the one they started with.
    pub fn set_policy(&self, policy: DeliveryPolicy) {
        *self.policy.lock().unwrap_or_else(|e| e.into_inner()) = policy;
    }

    pub fn policy(&self) -> DeliveryPolicy {
        *self.policy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What happened to the deliveries so far.
    pub fn counters(&self) -> DeliveryCounters {
        *self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Deliveries taken and not settled yet (in flight or waiting for a retry).
    pub fn pending(&self) -> usize {
        0
    }
}
