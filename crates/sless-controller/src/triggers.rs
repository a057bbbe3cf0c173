//! Running triggers: HTTP triggers become routes in the gateway's table, cron
//! triggers are handed to the cron scheduler, whose fires invoke the function
//! through the executor and whose state is persisted in the store.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use sless_core::{TriggerKind, TriggerStatus};
use sless_executor::{Executor, InvokeError, InvokeRequest};
use sless_gateway::{HttpRoute, HttpRoutes};
use sless_store::{TriggerRecord, TriggerStore};
use sless_triggers::{
    CronScheduler, CronState, CronTrigger, Fire, FireOutcome, FireRequest, Schedule,
    SchedulerConfig, StateSink, SystemClock,
};

/// Called with every invocation a trigger makes, for the invocation records.
pub type OnInvoke = Arc<dyn Fn(&FireRequest, &str, &InvokeOutcome) + Send + Sync>;

/// What one triggered invocation came to.
#[derive(Debug, Clone)]
pub struct InvokeOutcome {
    pub status: u16,
    pub error: Option<String>,
    pub revision: u64,
    pub cold_start: bool,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub duration: std::time::Duration,
}

/// All triggers of the server.
pub struct Triggers {
    routes: Arc<HttpRoutes>,
    cron: CronScheduler,
}

impl Triggers {
    /// Starts the cron scheduler; it runs until `shutdown` is cancelled.
    pub fn start(
        executor: Arc<Executor>,
        store: Arc<dyn TriggerStore>,
        routes: Arc<HttpRoutes>,
        on_invoke: Option<OnInvoke>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Arc<Self> {
        let fire = Arc::new(ExecutorFire {
            executor,
            on_invoke,
        });
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
        Arc::new(Self { routes, cron })
    }

    /// Makes a stored trigger live (or changes it in place).
    pub fn apply(&self, t: &TriggerRecord) {
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
        self.routes.remove(namespace, name);
        self.cron.remove(namespace, name);
    }

    /// The trigger's status as it stands now (the scheduler's live view for cron).
    pub fn status(&self, t: &TriggerRecord) -> TriggerStatus {
        match self.cron.state(&t.namespace, &t.name) {
            Some(s) => TriggerStatus {
                last_fired_at: s.last_fired_at,
                next_fire_at: s.next_fire_at,
                last_result: s.last_result,
            },
            None => t.status.clone(),
        }
    }

    /// The HTTP trigger other than `except` that already owns `path`.
    pub fn path_owner(&self, namespace: &str, path: &str, except: &str) -> Option<String> {
        self.routes.owner_of(namespace, path, except)
    }
}

/// Cron fires go to the executor.
struct ExecutorFire {
    executor: Arc<Executor>,
    on_invoke: Option<OnInvoke>,
}

#[async_trait]
impl Fire for ExecutorFire {
    async fn fire(&self, req: FireRequest) -> FireOutcome {
        let request_id = format!("{:032x}", rand::random::<u128>());
        let started_at = chrono::Utc::now();
        let clock = std::time::Instant::now();
        let event = Bytes::from(serde_json::to_vec(&req.event).unwrap_or_default());
        let invoke = InvokeRequest {
            event,
            request_id: request_id.clone(),
            source: req.source,
        };
        let (status, error, revision, cold_start) = match self
            .executor
            .invoke(&req.namespace, &req.function, invoke)
            .await
        {
            Ok(r) if r.ok => (200, None, r.revision, r.cold_start),
            Ok(r) => {
                let message = serde_json::from_slice::<serde_json::Value>(&r.body)
                    .ok()
                    .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
                    .unwrap_or_else(|| "the handler failed".into());
                (500, Some(message), r.revision, r.cold_start)
            }
            Err(e) => {
                let status = match e {
                    InvokeError::NotFound => 404,
                    InvokeError::Paused(_) | InvokeError::Unavailable(_) => 503,
                    InvokeError::Timeout { .. } => 504,
                    InvokeError::InstanceFailed(_) => 502,
                };
                (status, Some(e.to_string()), 0, false)
            }
        };
        if let Some(on_invoke) = &self.on_invoke {
            let outcome = InvokeOutcome {
                status,
                error: error.clone(),
                revision,
                cold_start,
                started_at,
                duration: clock.elapsed(),
            };
            on_invoke(&req, &request_id, &outcome);
        }
        FireOutcome { status, error }
    }

    async fn prewarm(&self, namespace: &str, function: &str) {
        self.executor.prewarm(namespace, function);
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
