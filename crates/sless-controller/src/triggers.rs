//! Running triggers: HTTP triggers become routes in the gateway's table, cron
//! triggers are handed to the cron scheduler, whose fires invoke the function
//! through the invocation pipeline and whose state is persisted in the store, and
//! queue triggers get a consumer and a delivery engine ([`crate::queues`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use crate::queues::RedriveError;
use crate::queues::{DeadLetterSink, Queues};
use crate::secrets::SecretResolver;
use async_trait::async_trait;
use sless_core::{TriggerKind, TriggerStatus};
use sless_invoke::{Call, HttpRoute, HttpRoutes, Invoker};
use sless_store::{TriggerRecord, TriggerStore};
use sless_triggers::{
    CronScheduler, CronState, CronTrigger, Fire, FireOutcome, FireRequest, FireResponse, Schedule,
    SchedulerConfig, StateSink, SystemClock,
};

/// All triggers of the server.
pub struct Triggers {
    routes: Arc<HttpRoutes>,
    cron: CronScheduler,
    queues: Queues,
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
        let queues = Queues::new(fire.clone(), shutdown.child_token());
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
            queues,
            applied: Mutex::default(),
        })
    }

    /// Queue triggers resolve `url_secret` through `resolver` (set before stored
    /// triggers are applied).
    pub fn set_secrets(&self, resolver: Arc<SecretResolver>) {
        self.queues.set_secrets(resolver);
    }

    /// Queue triggers keep their dead letters in `sink` (set before stored triggers
    /// are applied).
    pub fn set_dead_letters(&self, sink: Arc<dyn DeadLetterSink>) {
        self.queues.set_dead_letters(sink);
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
        // A trigger whose type changed no longer consumes (a queue trigger stays one,
        // so this only stops one that is gone).
        if !matches!(t.spec.kind, TriggerKind::Queue { .. }) {
            self.queues.remove(&t.namespace, &t.name);
        }
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
            TriggerKind::Queue { .. } => self.queues.apply(t),
            TriggerKind::Unknown => {}
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
        self.queues.remove(namespace, name);
    }

    /// Delivers a queue trigger's dead letter again, from attempt 1, through the
    /// trigger's engine; the dead letter is removed when it succeeds, or updated.
    /// Returns once the delivery is handed to the engine.
    pub async fn redrive(&self, dead_letter: sless_core::DeadLetter) -> Result<(), RedriveError> {
        self.queues.redrive(dead_letter)
    }

    /// Stops every queue consumer (server shutdown); unsettled messages are not
    /// acknowledged and stay in their brokers.
    pub fn stop(&self) {
        self.queues.stop_all();
    }

    /// The trigger's status as it stands now (the scheduler's live view for cron).
    pub fn status(&self, t: &TriggerRecord) -> TriggerStatus {
        if let TriggerKind::Queue { .. } = t.spec.kind {
            let Some(q) = self.queues.status(&t.namespace, &t.name) else {
                return t.status.clone();
            };
            return TriggerStatus {
                last_fired_at: q.last_fired_at.or(t.status.last_fired_at),
                last_result: q.last_result.or_else(|| t.status.last_result.clone()),
                connection: q.connection,
                last_error: q.last_error,
                counters: Some(q.counters),
                lag: q.lag,
                ..Default::default()
            };
        }
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

/// Fires go to the invocation pipeline, which records them. A delivery (queue and
/// device triggers, async calls) is recorded with its attempt, trigger or call and
/// the message's id as its request id, and answers with the handler's answer mapped
/// to HTTP as the gateway maps it: a handler returning `{"statusCode": 400}` is a 400.
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
        let Some(delivery) = &req.delivery else {
            let request_id = sless_invoke::new_request_id();
            let call = Call::new(&req.namespace, &req.function, source, &request_id, event);
            let done = self.invoker.run(call).await;
            return FireOutcome {
                status: done.status,
                error: done.error,
                response: None,
            };
        };
        let mut call = Call::new(
            &req.namespace,
            &req.function,
            source,
            &delivery.request_id,
            event,
        )
        .attempt(delivery.attempt);
        if !req.trigger.is_empty() {
            call = call.trigger(&req.trigger);
        }
        if let Some(id) = &delivery.call_id {
            call = call.call_id(id);
        }
        if let Some(message) = &delivery.message {
            match sless_invoke::encode_message(message) {
                Ok(message) => call = call.message(message),
                // A message is built from JSON values; the handler still gets its event.
                Err(e) => {
                    tracing::warn!(namespace = %req.namespace, function = %req.function, error = %e, "cannot encode the message for the handler's context")
                }
            }
        }
        let outcome = self.invoker.invoke(call).await;
        let error = outcome.error();
        let (status, response) = match &outcome.result {
            Ok(answer) => {
                let mapped = sless_invoke::response::map_answer(answer.ok, &answer.body);
                let status = mapped.status().as_u16();
                let headers = sless_invoke::response::header_pairs(&mapped);
                let response = FireResponse {
                    status,
                    headers,
                    body: mapped.into_body(),
                };
                (status, Some(response))
            }
            Err(e) => (sless_invoke::status_of(e).0, None),
        };
        // The record keeps the mapped status, as the gateway's do.
        let _ = outcome.finish(status);
        FireOutcome {
            status,
            error,
            response,
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
