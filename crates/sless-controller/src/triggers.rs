//! Running triggers: HTTP triggers become routes in the gateway's table, cron
//! triggers are handed to the cron scheduler, whose fires invoke the function
//! through the invocation pipeline and whose state is persisted in the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sless_core::{TriggerKind, TriggerStatus};
use sless_invoke::{Call, HttpRoute, HttpRoutes, Invoker};
use sless_store::{TriggerRecord, TriggerStore};
use sless_triggers::{
    CronScheduler, CronState, CronTrigger, Fire, FireOutcome, FireRequest, Schedule,
    SchedulerConfig, StateSink, SystemClock,
};

/// All triggers of the server.
pub struct Triggers {
    routes: Arc<HttpRoutes>,
    cron: CronScheduler,
    /// The generation of each trigger now live. Writers of one trigger may apply
    /// their records in another order than the store wrote them; an older one than
    /// what is live is ignored, so the newest spec always ends up running.
    applied: Mutex<HashMap<(String, String), u64>>,
}

impl Triggers {
    /// Starts the cron scheduler; it runs until `shutdown` is cancelled.
    pub fn start(
        invoker: Arc<Invoker>,
        store: Arc<dyn TriggerStore>,
        routes: Arc<HttpRoutes>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Arc<Self> {
        let fire = Arc::new(InvokerFire { invoker });
        let sink = Arc::new(StoreSink { store });
        let cron = CronScheduler::new(
            fire,
            sink,
            Arc::new(SystemClock),
            SchedulerConfig::default(),
        );
        let runner = cron.clone();
        tokio::spawn(async move {
            if let Err(e) = sless_triggers::TriggerSource::run(Box::new(runner), shutdown).await {
                tracing::error!(error = %e, "cron scheduler stopped");
            }
        });
        Arc::new(Self {
            routes,
            cron,
            applied: Mutex::default(),
        })
    }

    /// Makes a stored trigger live (or changes it in place), unless a newer
    /// generation of it is live already.
    pub fn apply(&self, t: &TriggerRecord) {
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        let key = (t.namespace.clone(), t.name.clone());
        if applied.get(&key).is_some_and(|&live| live > t.generation) {
            return;
        }
        applied.insert(key, t.generation);
        match &t.spec.kind {
            TriggerKind::Http { path, methods } => self.routes.upsert(
                &t.namespace,
                HttpRoute {
                    trigger: t.name.clone(),
                    path: path.clone(),
                    methods: methods.clone(),
                    function: t.spec.function.clone(),
                    enabled: t.spec.enabled,
                },
            ),
            TriggerKind::Cron {
                schedule,
                timezone,
                event,
                prewarm_sec,
            } => match Schedule::parse(schedule, timezone) {
                Ok(schedule) => {
                    self.cron.upsert(CronTrigger {
                        namespace: t.namespace.clone(),
                        name: t.name.clone(),
                        function: t.spec.function.clone(),
                        schedule,
                        event: event.clone(),
                        enabled: t.spec.enabled,
                        prewarm_sec: *prewarm_sec,
                        state: CronState {
                            last_fired_at: t.status.last_fired_at,
                            next_fire_at: t.status.next_fire_at,
                            last_result: t.status.last_result.clone(),
                        },
                    });
                }
                Err(e) => {
                    tracing::error!(namespace = %t.namespace, trigger = %t.name, error = %e, "stored schedule is invalid")
                }
            },
            TriggerKind::Queue { .. } | TriggerKind::Unknown => {}
        }
    }

    /// Stops a trigger.
    pub fn remove(&self, namespace: &str, name: &str) {
        self.applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(namespace.to_string(), name.to_string()));
        self.routes.remove(namespace, name);
        self.cron.remove(namespace, name);
    }

    /// Delivers a queue trigger's dead letter again, from attempt 1, through the
    /// trigger's engine; the dead letter is removed when it succeeds, or updated.
    pub async fn redrive(&self, dead_letter: sless_core::DeadLetter) -> Result<(), RedriveError> {
        Err(RedriveError::NoTrigger(
            dead_letter.trigger.unwrap_or_default(),
        ))
    }

    /// The trigger's status as it stands now (the scheduler's live view for cron).
    pub fn status(&self, t: &TriggerRecord) -> TriggerStatus {
        match self.cron.state(&t.namespace, &t.name) {
            Some(s) => TriggerStatus {
                last_fired_at: s.last_fired_at,
                next_fire_at: s.next_fire_at,
                last_result: s.last_result,
                ..Default::default()
            },
            None => t.status.clone(),
        }
    }
}

/// Why a dead letter cannot be redriven.
#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    /// Its trigger no longer exists (or is not a queue or device trigger).
    #[error("trigger {0:?} no longer exists")]
    NoTrigger(String),
    /// Its trigger is disabled.
    #[error("trigger {0:?} is disabled; enable it to redrive its dead letters")]
    Disabled(String),
}

/// The [`Fire`] every delivery engine fires into: the invocation pipeline.
pub fn invoker_fire(invoker: Arc<Invoker>) -> Arc<dyn Fire> {
    Arc::new(InvokerFire { invoker })
}

/// Fires go to the invocation pipeline, which records them.
struct InvokerFire {
    invoker: Arc<Invoker>,
}

#[async_trait]
impl Fire for InvokerFire {
    async fn fire(&self, req: FireRequest) -> FireOutcome {
        let event = match sless_invoke::encode_event(&req.event) {
            Ok(event) => event,
            Err(e) => {
                tracing::error!(namespace = %req.namespace, trigger = %req.trigger, error = %e, "cannot encode the trigger's event");
                return FireOutcome {
                    status: 500,
                    error: Some(e.to_string()),
                    response: None,
                };
            }
        };
        let source = req.source;
        let request_id = sless_invoke::new_request_id();
        let call = Call::new(&req.namespace, &req.function, source, &request_id, event);
        let done = self.invoker.run(call).await;
        FireOutcome {
            status: done.status,
            error: done.error,
            response: None,
        }
    }

    async fn prewarm(&self, namespace: &str, function: &str) {
        self.invoker.executor().prewarm(namespace, function);
    }
}

/// The scheduler's state goes to the store.
struct StoreSink {
    store: Arc<dyn TriggerStore>,
}

#[async_trait]
impl StateSink for StoreSink {
    async fn saved(&self, namespace: &str, name: &str, state: &CronState) {
        let status = TriggerStatus {
            last_fired_at: state.last_fired_at,
            next_fire_at: state.next_fire_at,
            last_result: state.last_result.clone(),
            ..Default::default()
        };
        if let Err(e) = self
            .store
            .set_trigger_status(namespace, name, &status)
            .await
        {
            tracing::warn!(namespace, trigger = name, error = %e, "cannot save the trigger's state");
        }
    }
}
