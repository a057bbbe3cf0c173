//! Async calls: a durable queue in the store, a dispatcher, and callbacks.
//!
//! [`Calls::enqueue`] reserves room (the per-function queue limit and the
//! namespace's `queued_calls` quota, counted here in memory), inserts the call and
//! only then answers with its id: a call the caller was told about is in SQLite,
//! so a restart or a `kill -9` does not lose it. It then wakes the function's
//! worker, which reads the function's unfinished calls from the store in queue
//! order and submits them to the function's delivery [`Engine`] (policy: the
//! function spec's `delivery`, or the default). The engine's hooks mark the call
//! `Running`, then `Succeeded` or `Failed` with the function's response; a
//! `Failed` call also becomes a dead letter (whose id is the call's, so writing it
//! twice after a crash is one dead letter). Then the result is POSTed to the
//! call's callback URL in a task of its own, retried with back-off a bounded
//! number of times.
//!
//! At start ([`Calls::resume`]) every `Queued` or `Running` call is submitted again: a call that was
//! running when the server stopped had not finished, so it runs again
//! (at-least-once). A periodic sweep re-reads the store as a safety net; wake-ups
//! do not depend on it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use sless_core::invocation::InvocationSource;
use sless_core::{
    CallPhase, DeadLetter, DeadLetterSource, DeliveryPolicy, QuotaExceeded, QuotaKind,
};
use sless_executor::quota::Quotas;
use sless_store::{CallRecord, CallResponse, CallStore, Store, StoreError};
use sless_triggers::delivery::{Delivery, DeliveryHooks, Engine, Settled, Target};
use sless_triggers::{Fire, FireResponse};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::dead_letters::DeadLetters;

/// How the dispatcher and callbacks behave.
#[derive(Debug, Clone)]
pub struct CallsConfig {
    /// Unfinished calls one function may have; past it `enqueue` refuses (`429`).
    pub queue_limit: u64,
    /// Attempts to POST a call's result to its callback URL.
    pub callback_attempts: u32,
    /// The wait before the second callback attempt; doubled for each after it.
    pub callback_backoff: Duration,
    /// The longest one callback attempt may take.
    pub callback_timeout: Duration,
    /// Whether callbacks may go to loopback, private and link-local addresses.
    pub allow_private_callbacks: bool,
    /// How often each worker re-reads the store, should a wake-up ever be missed.
    pub sweep: Duration,
}

/// The default per-function queue limit.
pub const DEFAULT_QUEUE_LIMIT: u64 = 10_000;

impl Default for CallsConfig {
    fn default() -> Self {
        Self {
            queue_limit: DEFAULT_QUEUE_LIMIT,
            callback_attempts: 5,
            callback_backoff: Duration::from_secs(1),
            callback_timeout: Duration::from_secs(10),
            allow_private_callbacks: true,
            sweep: Duration::from_secs(30),
        }
    }
}

/// A call to queue.
#[derive(Debug, Clone)]
pub struct NewCall {
    pub namespace: String,
    pub function: String,
    /// The handler's event, as JSON bytes.
    pub event: Vec<u8>,
    /// The id of the request that queued it.
    pub request_id: String,
    /// Where the result is POSTed when the call ends.
    pub callback_url: Option<String>,
}

/// Why a call was not queued.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// The function has as many unfinished calls as the queue limit allows.
    #[error("function {function} has {limit} calls queued, the most it may have: retry later")]
    QueueFull { function: String, limit: u64 },
    /// The namespace's `queued_calls` quota.
    #[error(transparent)]
    Quota(#[from] QuotaExceeded),
    /// The callback URL is not one calls may report to.
    #[error("X-Callback-Url: {0}")]
    BadCallback(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Checks a callback URL: absolute `http` or `https` with a host; with
/// `allow_private` off, not a loopback, private or link-local address literal, nor
/// `localhost` (names are not resolved here: a name pointing inside is not caught).
pub fn check_callback_url(url: &str, allow_private: bool) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "must be an http or https URL, not {:?}",
            parsed.scheme()
        ));
    }
    let Some(host) = parsed.host_str() else {
        return Err("must name a host".to_string());
    };
    if !allow_private {
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        let inside = match literal.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(ip)) => {
                ip.is_loopback()
                    || ip.is_private()
                    || ip.is_link_local()
                    || ip.is_unspecified()
                    || ip.is_broadcast()
            }
            Ok(std::net::IpAddr::V6(ip)) => {
                ip.is_loopback()
                    || ip.is_unspecified()
                    || (ip.segments()[0] & 0xfe00) == 0xfc00
                    || (ip.segments()[0] & 0xffc0) == 0xfe80
                    || ip
                        .to_ipv4_mapped()
                        .is_some_and(|v4| v4.is_loopback() || v4.is_private())
            }
            Err(_) => host.eq_ignore_ascii_case("localhost") || host.ends_with(".localhost"),
        };
        if inside {
            return Err(
                "callbacks to loopback and private addresses are turned off on this server"
                    .to_string(),
            );
        }
    }
    Ok(parsed)
}

/// The async calls of every function.
pub struct Calls {
    store: Arc<dyn CallStore>,
    functions: Arc<dyn Store>,
    dead_letters: Arc<DeadLetters>,
    fire: Arc<dyn Fire>,
    quotas: Arc<Quotas>,
    config: CallsConfig,
    http: reqwest::Client,
    /// Unfinished calls per function and per namespace (reserved before the insert).
    counts: Mutex<Counts>,
    workers: Mutex<HashMap<(String, String), Arc<Worker>>>,
    /// Calls handed to an engine and not settled yet: a call is never submitted
    /// twice (a redrive and the store's scan may both find it).
    in_flight: Mutex<HashSet<String>>,
    shutdown: CancellationToken,
    me: Weak<Calls>,
}

#[derive(Default)]
struct Counts {
    functions: HashMap<(String, String), u64>,
    namespaces: HashMap<String, u64>,
}

impl Counts {
    fn add(&mut self, ns: &str, function: &str) {
        *self
            .functions
            .entry((ns.to_string(), function.to_string()))
            .or_default() += 1;
        *self.namespaces.entry(ns.to_string()).or_default() += 1;
    }

    fn release(&mut self, ns: &str, function: &str) {
        if let Some(n) = self
            .functions
            .get_mut(&(ns.to_string(), function.to_string()))
        {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = self.namespaces.get_mut(ns) {
            *n = n.saturating_sub(1);
        }
    }
}

/// One function's dispatcher.
struct Worker {
    namespace: String,
    function: String,
    engine: Arc<Engine>,
    wake: Notify,
    /// Calls queued again by a redrive: their place in the queue is behind the cursor.
    redriven: Mutex<VecDeque<CallRecord>>,
    /// Calls this worker took from `redriven`: the store's scan leaves them alone (a
    /// worker started by a redrive scans from the start, and could meet one again
    /// just after it settled).
    redriven_ids: Mutex<HashSet<String>>,
    /// Read the queue from its start again at the next pass (the namespace came
    /// back from the trash: calls behind the cursor are unfinished again).
    rescan: AtomicBool,
}

impl Calls {
    /// Makes the dispatcher and counts the unfinished calls (the queue limit and
    /// the quota hold from the start). Nothing runs until [`Calls::resume`], which
    /// the server calls once stored functions are back: a call run before its
    /// function serves again would fail as if the function did not exist.
    pub async fn start(
        store: Arc<dyn CallStore>,
        functions: Arc<dyn Store>,
        dead_letters: Arc<DeadLetters>,
        fire: Arc<dyn Fire>,
        quotas: Arc<Quotas>,
        config: CallsConfig,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>, StoreError> {
        let unfinished = store.unfinished_counts().await?;
        let http = reqwest::Client::builder()
            .timeout(config.callback_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        let calls = Arc::new_cyclic(|me| Calls {
            store,
            functions,
            dead_letters,
            fire,
            quotas,
            config,
            http,
            counts: Mutex::default(),
            workers: Mutex::default(),
            in_flight: Mutex::default(),
            shutdown,
            me: me.clone(),
        });
        {
            let mut counts = calls.lock_counts();
            for (ns, function, n) in &unfinished {
                *counts
                    .functions
                    .entry((ns.clone(), function.clone()))
                    .or_default() += n;
                *counts.namespaces.entry(ns.clone()).or_default() += n;
            }
        }
        Ok(calls)
    }

    /// Starts a worker for every function with unfinished calls: each submits them
    /// again, `Running` ones included (they had not finished: at-least-once).
    pub async fn resume(&self) -> Result<usize, StoreError> {
        let unfinished = self.store.unfinished_counts().await?;
        let functions = unfinished.len();
        for (ns, function, n) in unfinished {
            tracing::info!(namespace = %ns, function = %function, calls = n, "resuming unfinished async calls");
            self.worker(&ns, &function).wake.notify_one();
        }
        Ok(functions)
    }

    /// Counts and runs again the unfinished calls of a namespace restored from the
    /// trash, as [`Calls::resume`] does at start (call it once its functions are back).
    /// Calls in flight when it was trashed were dropped unsettled; a worker that
    /// had passed them reads its queue from the start again.
    pub async fn resume_namespace(&self, namespace: &str) -> Result<usize, StoreError> {
        let unfinished: Vec<_> = self
            .store
            .unfinished_counts()
            .await?
            .into_iter()
            .filter(|(ns, _, _)| ns == namespace)
            .collect();
        {
            let mut counts = self.lock_counts();
            counts.namespaces.remove(namespace);
            counts.functions.retain(|(ns, _), _| ns != namespace);
            for (ns, function, n) in &unfinished {
                *counts
                    .functions
                    .entry((ns.clone(), function.clone()))
                    .or_default() += n;
                *counts.namespaces.entry(ns.clone()).or_default() += n;
            }
        }
        for (ns, function, n) in &unfinished {
            tracing::info!(namespace = %ns, function = %function, calls = n, "resuming the restored namespace's unfinished async calls");
            let worker = self.worker(ns, function);
            worker.rescan.store(true, Ordering::Relaxed);
            worker.wake.notify_one();
        }
        Ok(unfinished.len())
    }

    fn lock_counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets the counts of a deleted namespace (its calls were deleted with it).
    pub fn forget(&self, namespace: &str) {
        let mut counts = self.lock_counts();
        counts.namespaces.remove(namespace);
        counts.functions.retain(|(ns, _), _| ns != namespace);
    }

    /// Unfinished calls of a namespace (its `queued_calls` usage).
    pub fn queued(&self, namespace: &str) -> u64 {
        self.lock_counts()
            .namespaces
            .get(namespace)
            .copied()
            .unwrap_or(0)
    }

    /// Unfinished (queued or running) calls of every namespace.
    pub fn queued_total(&self) -> u64 {
        self.lock_counts().namespaces.values().sum()
    }

    /// Queues a call. When this returns `Ok` the call is committed in the store and
    /// its worker woken; the id is the call's.
    pub async fn enqueue(&self, call: NewCall) -> Result<String, EnqueueError> {
        if let Some(url) = &call.callback_url {
            check_callback_url(url, self.config.allow_private_callbacks)
                .map_err(EnqueueError::BadCallback)?;
        }
        {
            let mut counts = self.lock_counts();
            let key = (call.namespace.clone(), call.function.clone());
            if counts.functions.get(&key).copied().unwrap_or(0) >= self.config.queue_limit {
                return Err(EnqueueError::QueueFull {
                    function: call.function,
                    limit: self.config.queue_limit,
                });
            }
            let used = counts.namespaces.get(&call.namespace).copied().unwrap_or(0);
            self.quotas
                .check(&call.namespace, QuotaKind::QueuedCalls, used)?;
            counts.add(&call.namespace, &call.function);
        }
        let record = CallRecord {
            id: sless_invoke::new_request_id(),
            namespace: call.namespace,
            function: call.function,
            phase: CallPhase::Queued,
            attempts: 0,
            event: call.event,
            request_id: call.request_id,
            callback_url: call.callback_url,
            response: None,
            error: None,
            redrive_of: None,
            queued_at: Utc::now(),
            started_at: None,
            finished_at: None,
        };
        if let Err(e) = self.store.insert_call(&record).await {
            self.lock_counts()
                .release(&record.namespace, &record.function);
            return Err(e.into());
        }
        self.worker(&record.namespace, &record.function)
            .wake
            .notify_one();
        Ok(record.id)
    }

    /// Queues the call a dead letter came from again, from attempt 1; the dead
    /// letter goes when it succeeds. A call pruned meanwhile is queued anew from
    /// the dead letter's payload, under the same id.
    pub async fn redrive(&self, dl: &DeadLetter, call_id: &str) -> Result<(), StoreError> {
        if self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(call_id)
        {
            // Already being delivered again (an earlier redrive of it).
            return Ok(());
        }
        let call = match self
            .store
            .requeue_call(&dl.namespace, call_id, &dl.id)
            .await
        {
            Ok(call) => call,
            Err(StoreError::NotFound { .. }) => {
                let call = CallRecord {
                    id: call_id.to_string(),
                    namespace: dl.namespace.clone(),
                    function: dl.function.clone(),
                    phase: CallPhase::Queued,
                    attempts: 0,
                    event: dl.payload.clone(),
                    request_id: sless_invoke::new_request_id(),
                    callback_url: None,
                    response: None,
                    error: None,
                    redrive_of: Some(dl.id.clone()),
                    queued_at: Utc::now(),
                    started_at: None,
                    finished_at: None,
                };
                self.store.insert_call(&call).await?;
                call
            }
            Err(e) => return Err(e),
        };
        self.lock_counts().add(&call.namespace, &call.function);
        let worker = self.worker(&call.namespace, &call.function);
        worker
            .redriven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(call);
        worker.wake.notify_one();
        Ok(())
    }

    /// The worker of one function, started when first needed.
    fn worker(&self, ns: &str, function: &str) -> Arc<Worker> {
        let key = (ns.to_string(), function.to_string());
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = workers.get(&key) {
            return w.clone();
        }
        let hooks = Arc::new(Hooks {
            calls: self.me.clone(),
            namespace: ns.to_string(),
            function: function.to_string(),
        });
        let engine = Engine::new(
            Target {
                namespace: ns.to_string(),
                function: function.to_string(),
                source: InvocationSource::Async,
                trigger: None,
            },
            DeliveryPolicy::default(),
            self.fire.clone(),
            hooks,
        );
        let worker = Arc::new(Worker {
            namespace: ns.to_string(),
            function: function.to_string(),
            engine,
            wake: Notify::new(),
            redriven: Mutex::default(),
            redriven_ids: Mutex::default(),
            rescan: AtomicBool::new(false),
        });
        workers.insert(key, worker.clone());
        tokio::spawn(run_worker(
            self.me.clone(),
            worker.clone(),
            self.shutdown.clone(),
        ));
        worker
    }

    /// The function's delivery policy as its spec says now.
    async fn policy(&self, ns: &str, function: &str) -> Option<DeliveryPolicy> {
        match self.functions.get_function(ns, function).await {
            Ok(f) => Some(f.spec.delivery.unwrap_or_default()),
            Err(_) => None,
        }
    }
}

/// Reads one function's unfinished calls in queue order and submits them.
async fn run_worker(calls: Weak<Calls>, worker: Arc<Worker>, shutdown: CancellationToken) {
    const BATCH: u32 = 256;
    let mut cursor = 0i64;
    loop {
        let Some(c) = calls.upgrade() else { return };
        if let Some(policy) = c.policy(&worker.namespace, &worker.function).await {
            worker.engine.set_policy(policy);
        }
        let sweep = c.config.sweep;
        if worker.rescan.swap(false, Ordering::Relaxed) {
            cursor = 0;
        }
        loop {
            let next = worker
                .redriven
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            let Some(call) = next else { break };
            worker
                .redriven_ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(call.id.clone());
            submit(&c, &worker, call).await;
        }
        let batch = match c
            .store
            .pending_calls(&worker.namespace, &worker.function, cursor, BATCH)
            .await
        {
            Ok(batch) => batch,
            Err(e) => {
                tracing::warn!(namespace = %worker.namespace, function = %worker.function, error = %e, "cannot read queued calls");
                Vec::new()
            }
        };
        if !batch.is_empty() {
            for pending in batch {
                cursor = pending.seq;
                let taken = worker
                    .redriven_ids
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains(&pending.call.id);
                if !taken {
                    submit(&c, &worker, pending.call).await;
                }
            }
            continue;
        }
        drop(c);
        tokio::select! {
            () = worker.wake.notified() => {}
            () = tokio::time::sleep(sweep) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

async fn submit(calls: &Calls, worker: &Worker, call: CallRecord) {
    if !calls
        .in_flight
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(call.id.clone())
    {
        return;
    }
    // The event was JSON when it was queued; a stored one that is not any more is
    // delivered as its text, like any payload.
    let event = sless_core::delivery::payload_event(&call.event);
    let delivery = Delivery {
        id: call.id.clone(),
        key: None,
        event,
        message: None,
        call_id: Some(call.id),
        redrive_of: call.redrive_of,
    };
    worker
        .engine
        .submit(delivery, Box::new(|| Box::pin(async {})))
        .await;
}

/// What the engine of one function's calls does around each call.
struct Hooks {
    calls: Weak<Calls>,
    namespace: String,
    function: String,
}

#[async_trait]
impl DeliveryHooks for Hooks {
    async fn attempt_started(&self, delivery: &Delivery, attempt: u32) {
        let Some(calls) = self.calls.upgrade() else {
            return;
        };
        if let Err(e) = calls
            .store
            .call_started(&self.namespace, &delivery.id, attempt, Utc::now())
            .await
        {
            tracing::warn!(namespace = %self.namespace, call = %delivery.id, error = %e, "cannot mark the call running");
        }
    }

    async fn settled(&self, delivery: &Delivery, settled: &Settled) -> anyhow::Result<()> {
        let Some(calls) = self.calls.upgrade() else {
            anyhow::bail!("the server is stopping");
        };
        let (phase, attempts, status, error, response) = match settled {
            Settled::Succeeded { attempts, response } => (
                CallPhase::Succeeded,
                *attempts,
                response.as_ref().map_or(200, |r| r.status),
                None,
                response,
            ),
            Settled::DeadLettered {
                attempts,
                last_status,
                error,
                response,
            } => (
                CallPhase::Failed,
                *attempts,
                *last_status,
                error.clone(),
                response,
            ),
        };
        let response = response.as_ref().map(call_response);
        // A call deleted meanwhile (with its namespace) has nothing left to record.
        if let Err(StoreError::NotFound { .. }) =
            calls.store.get_call(&self.namespace, &delivery.id).await
        {
            calls
                .in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&delivery.id);
            return Ok(());
        }
        if phase == CallPhase::Failed {
            // Written before the call is marked failed: a crash in between runs the
            // call again and writes the same dead letter (its id is the call's).
            let payload = serde_json::to_vec(&delivery.event)?;
            calls
                .dead_letters
                .write(DeadLetter {
                    id: delivery
                        .redrive_of
                        .clone()
                        .unwrap_or_else(|| delivery.id.clone()),
                    namespace: self.namespace.clone(),
                    source: DeadLetterSource::Async,
                    trigger: None,
                    function: self.function.clone(),
                    payload,
                    message: serde_json::json!({"call_id": delivery.id}),
                    attempts,
                    last_status: status,
                    error: error.clone(),
                    failed_at: Utc::now(),
                })
                .await?;
        }
        let finished_at = Utc::now();
        calls
            .store
            .call_finished(
                &self.namespace,
                &delivery.id,
                phase,
                attempts,
                response.as_ref(),
                error.as_deref(),
                finished_at,
            )
            .await?;
        if phase == CallPhase::Succeeded
            && let Some(dl) = &delivery.redrive_of
        {
            calls.dead_letters.remove(&self.namespace, dl).await?;
        }
        calls.lock_counts().release(&self.namespace, &self.function);
        calls
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&delivery.id);
        // The callback never holds up the next call.
        match calls.store.get_call(&self.namespace, &delivery.id).await {
            Ok(call) if call.callback_url.is_some() => {
                let http = calls.http.clone();
                let config = calls.config.clone();
                tokio::spawn(async move {
                    post_callback(&http, &config, &call, status, error.as_deref()).await;
                });
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(namespace = %self.namespace, call = %delivery.id, error = %e, "cannot read the finished call for its callback");
            }
        }
        Ok(())
    }
}

fn call_response(r: &FireResponse) -> CallResponse {
    CallResponse {
        status: r.status,
        headers: r.headers.clone(),
        body: r.body.to_vec(),
    }
}

/// Headers of the function's response that describe a connection, not the
/// response: the callback's own request sets them.
const NOT_FORWARDED: [&str; 8] = [
    "connection",
    "content-length",
    "host",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
];

/// POSTs a finished call's result to its callback URL: the function's body and
/// headers, with `X-Function-Status`, `X-Call-Id` and `X-Duration-Seconds`.
/// Retried on no answer or a 5xx, up to the configured attempts, with back-off.
async fn post_callback(
    http: &reqwest::Client,
    config: &CallsConfig,
    call: &CallRecord,
    status: u16,
    error: Option<&str>,
) {
    let Some(url) = &call.callback_url else {
        return;
    };
    let duration = match (call.started_at, call.finished_at) {
        (Some(s), Some(f)) => (f - s).num_microseconds().unwrap_or(0).max(0) as f64 / 1e6,
        _ => 0.0,
    };
    let (headers, body) = match &call.response {
        Some(r) => (r.headers.clone(), r.body.clone()),
        // No answer from the handler (a timeout, a crash): the platform's error shape.
        None => (
            vec![("content-type".to_string(), "application/json".to_string())],
            serde_json::to_vec(&serde_json::json!({"error": {
                "code": "call_failed",
                "message": error.unwrap_or("the call failed"),
            }}))
            .unwrap_or_default(),
        ),
    };
    let mut delay = config.callback_backoff;
    for attempt in 1..=config.callback_attempts.max(1) {
        let mut req = http.post(url.as_str());
        for (name, value) in &headers {
            if NOT_FORWARDED.contains(&name.to_ascii_lowercase().as_str()) {
                continue;
            }
            req = req.header(name.as_str(), value.as_str());
        }
        let req = req
            .header("x-function-status", status.to_string())
            .header("x-call-id", call.id.as_str())
            .header("x-duration-seconds", format!("{duration:.6}"))
            .body(body.clone());
        let retry = match req.send().await {
            Ok(r) if r.status().is_server_error() => {
                format!("the callback answered {}", r.status())
            }
            Ok(_) => return,
            Err(e) => format!("the callback failed: {e}"),
        };
        if attempt == config.callback_attempts.max(1) {
            tracing::warn!(namespace = %call.namespace, call = %call.id, attempts = attempt, error = %retry, "giving up on the callback");
            return;
        }
        tracing::debug!(namespace = %call.namespace, call = %call.id, attempt, error = %retry, "retrying the callback");
        tokio::time::sleep(delay).await;
        delay = delay.saturating_mul(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sless_core::Quota;
    use sless_store::{DeadLetterStore, SqlStore};
    use sless_triggers::{FireOutcome, FireRequest};

    /// Answers fires with the scripted statuses (then 200), remembering each request.
    #[derive(Default)]
    struct FakeFire {
        statuses: Mutex<VecDeque<u16>>,
        seen: Mutex<Vec<FireRequest>>,
    }

    #[async_trait]
    impl Fire for FakeFire {
        async fn fire(&self, req: FireRequest) -> FireOutcome {
            self.seen.lock().unwrap().push(req);
            let status = self.statuses.lock().unwrap().pop_front().unwrap_or(200);
            FireOutcome {
                status,
                error: (status >= 400).then(|| format!("status {status}")),
                response: Some(FireResponse {
                    status,
                    headers: vec![("content-type".into(), "application/json".into())],
                    body: bytes::Bytes::from_static(br#"{"ok":true}"#),
                }),
            }
        }

        async fn prewarm(&self, _: &str, _: &str) {}
    }

    async fn start(fire: Arc<FakeFire>, quota: Quota, limit: u64) -> (Arc<Calls>, Arc<SqlStore>) {
        let store = Arc::new(SqlStore::in_memory().await.unwrap());
        let calls = Calls::start(
            store.clone(),
            store.clone(),
            DeadLetters::new(store.clone()),
            fire,
            Arc::new(Quotas::new(quota)),
            CallsConfig {
                queue_limit: limit,
                ..CallsConfig::default()
            },
            CancellationToken::new(),
        )
        .await
        .unwrap();
        calls.resume().await.unwrap();
        (calls, store)
    }

    fn new_call(event: &str) -> NewCall {
        NewCall {
            namespace: "default".into(),
            function: "f".into(),
            event: event.as_bytes().to_vec(),
            request_id: "r1".into(),
            callback_url: None,
        }
    }

    /// Waits (bounded) until the call has ended.
    async fn ended(store: &SqlStore, id: &str) -> CallRecord {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let call = store.get_call("default", id).await.unwrap();
                if call.phase.is_terminal() {
                    return call;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the call ends")
    }

    #[tokio::test]
    async fn a_queued_call_runs_once_with_its_id_and_keeps_the_response() {
        let fire = Arc::new(FakeFire::default());
        let (calls, store) = start(fire.clone(), Quota::default(), 10).await;
        let id = calls.enqueue(new_call(r#"{"n":1}"#)).await.unwrap();
        let call = ended(&store, &id).await;
        assert_eq!(call.phase, CallPhase::Succeeded);
        assert_eq!(call.attempts, 1);
        assert_eq!(call.response.unwrap().body, br#"{"ok":true}"#);
        let seen = fire.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].source, InvocationSource::Async);
        assert_eq!(seen[0].event, serde_json::json!({"n": 1}));
        let info = seen[0].delivery.clone().unwrap();
        assert_eq!((info.attempt, info.call_id), (1, Some(id.clone())));
        assert_eq!(calls.queued("default"), 0);
    }

    /// Holds every fire until a permit is added, then answers 200.
    struct GatedFire {
        open: tokio::sync::Semaphore,
        fired: std::sync::atomic::AtomicU32,
    }

    #[async_trait]
    impl Fire for GatedFire {
        async fn fire(&self, _: FireRequest) -> FireOutcome {
            self.fired.fetch_add(1, Ordering::SeqCst);
            self.open.acquire().await.unwrap().forget();
            FireOutcome {
                status: 200,
                error: None,
                response: None,
            }
        }

        async fn prewarm(&self, _: &str, _: &str) {}
    }

    #[tokio::test]
    async fn a_call_in_flight_when_its_namespace_was_trashed_runs_again_once_restored() {
        use sless_store::{Store, TrashStore};
        let fire = Arc::new(GatedFire {
            open: tokio::sync::Semaphore::new(0),
            fired: Default::default(),
        });
        let store = Arc::new(SqlStore::in_memory().await.unwrap());
        store.ensure_namespace("default").await.unwrap();
        let calls = Calls::start(
            store.clone(),
            store.clone(),
            DeadLetters::new(store.clone()),
            fire.clone(),
            Arc::new(Quotas::new(Quota::default())),
            CallsConfig::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        let id = calls.enqueue(new_call("{}")).await.unwrap();
        let in_flight = |calls: &Calls| calls.in_flight.lock().unwrap().contains(&id);
        tokio::time::timeout(Duration::from_secs(10), async {
            while fire.fired.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the call is fired");
        // Trashed while its attempt runs: the answer settles into nothing.
        store.trash_namespace("default").await.unwrap();
        calls.forget("default");
        fire.open.add_permits(1);
        tokio::time::timeout(Duration::from_secs(10), async {
            while in_flight(&calls) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the attempt settles");
        assert_eq!(calls.queued("default"), 0);

        // Back, it is unfinished again, behind the worker's cursor: it runs once more.
        store.restore_namespace("default").await.unwrap();
        let call = store.get_call("default", &id).await.unwrap();
        assert!(!call.phase.is_terminal(), "{:?}", call.phase);
        assert_eq!(calls.resume_namespace("default").await.unwrap(), 1);
        assert_eq!(calls.queued("default"), 1);
        fire.open.add_permits(1);
        assert_eq!(ended(&store, &id).await.phase, CallPhase::Succeeded);
        assert_eq!(fire.fired.load(Ordering::SeqCst), 2);
        assert_eq!(calls.queued("default"), 0);
    }

    #[tokio::test]
    async fn a_failed_call_is_a_dead_letter_until_its_redrive_succeeds() {
        let fire = Arc::new(FakeFire::default());
        fire.statuses.lock().unwrap().push_back(400);
        let (calls, store) = start(fire.clone(), Quota::default(), 10).await;
        let id = calls.enqueue(new_call(r#"{"n":2}"#)).await.unwrap();
        assert_eq!(ended(&store, &id).await.phase, CallPhase::Failed);
        let dl = store.get_dead_letter("default", &id).await.unwrap();
        assert_eq!(dl.source, DeadLetterSource::Async);
        assert_eq!(dl.payload, br#"{"n":2}"#);
        assert_eq!(dl.message, serde_json::json!({"call_id": id}));
        assert_eq!(dl.last_status, 400);

        calls.redrive(&dl, &id).await.unwrap();
        let call = ended(&store, &id).await;
        assert_eq!((call.phase, call.attempts), (CallPhase::Succeeded, 1));
        assert!(matches!(
            store.get_dead_letter("default", &id).await,
            Err(StoreError::NotFound { .. })
        ));
    }

    #[tokio::test]
    async fn the_queue_limit_the_quota_and_the_callback_url_are_checked_before_storing() {
        let fire = Arc::new(FakeFire::default());
        let none = Quota {
            queued_calls: 0,
            ..Quota::default()
        };
        let (calls, store) = start(fire.clone(), none, 10).await;
        assert!(matches!(
            calls.enqueue(new_call("{}")).await,
            Err(EnqueueError::Quota(_))
        ));
        let mut bad = new_call("{}");
        bad.callback_url = Some("ftp://example.com/".into());
        let (calls, _) = start(fire.clone(), Quota::default(), 0).await;
        assert!(matches!(
            calls.enqueue(bad).await,
            Err(EnqueueError::BadCallback(_))
        ));
        assert!(matches!(
            calls.enqueue(new_call("{}")).await,
            Err(EnqueueError::QueueFull { limit: 0, .. })
        ));
        let nothing = store
            .list_calls("default", &sless_store::CallFilter::default())
            .await
            .unwrap();
        assert!(nothing.is_empty());
        assert!(fire.seen.lock().unwrap().is_empty());
    }

    /// Serves raw HTTP on loopback: answers the first request 503, the others 200,
    /// and hands each request's text to the test.
    async fn flaky_listener() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            for n in 1.. {
                let (mut sock, _) = listener.accept().await.unwrap();
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let read = sock.read(&mut chunk).await.unwrap();
                    buf.extend_from_slice(&chunk[..read]);
                    let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + length || read == 0 {
                            break;
                        }
                    }
                }
                let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
                let status = if n == 1 {
                    "503 Service Unavailable"
                } else {
                    "200 OK"
                };
                let answer =
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = sock.write_all(answer.as_bytes()).await;
            }
        });
        (format!("http://{addr}/cb"), rx)
    }

    #[tokio::test]
    async fn a_callback_carries_the_response_and_is_retried_after_a_5xx() {
        let (url, mut requests) = flaky_listener().await;
        let started = Utc::now();
        let call = CallRecord {
            id: "c1".into(),
            namespace: "default".into(),
            function: "f".into(),
            phase: CallPhase::Succeeded,
            attempts: 1,
            event: b"{}".to_vec(),
            request_id: "r1".into(),
            callback_url: Some(url),
            response: Some(CallResponse {
                status: 201,
                headers: vec![
                    ("content-type".into(), "application/json".into()),
                    ("x-custom".into(), "yes".into()),
                    ("content-length".into(), "999".into()),
                ],
                body: br#"{"ok":true}"#.to_vec(),
            }),
            error: None,
            redrive_of: None,
            queued_at: started,
            started_at: Some(started),
            finished_at: Some(started + chrono::Duration::milliseconds(1500)),
        };
        let config = CallsConfig {
            callback_backoff: Duration::from_millis(10),
            ..CallsConfig::default()
        };
        post_callback(&reqwest::Client::new(), &config, &call, 201, None).await;
        let first = requests.recv().await.unwrap();
        let second = requests.recv().await.unwrap();
        assert!(requests.try_recv().is_err(), "no attempt after a 200");
        for request in [&first, &second] {
            let lower = request.to_ascii_lowercase();
            assert!(lower.starts_with("post /cb "), "{request}");
            for header in [
                "x-function-status: 201",
                "x-call-id: c1",
                "x-duration-seconds: 1.500000",
                "x-custom: yes",
                "content-type: application/json",
                "content-length: 11",
            ] {
                assert!(lower.contains(header), "{header} in {request}");
            }
            assert!(request.ends_with(r#"{"ok":true}"#), "{request}");
        }
    }

    #[test]
    fn callback_urls_are_http_and_may_be_kept_outside() {
        assert!(check_callback_url("http://127.0.0.1:9/cb", true).is_ok());
        assert!(check_callback_url("https://example.com/cb", false).is_ok());
        for bad in [
            "ftp://example.com/x",
            "not a url",
            "/relative",
            "file:///etc/passwd",
        ] {
            assert!(check_callback_url(bad, true).is_err(), "{bad}");
        }
        for inside in [
            "http://127.0.0.1/cb",
            "http://localhost:8080/",
            "http://10.1.2.3/",
            "http://192.168.0.1/",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]/",
            "http://[fd00::1]/",
        ] {
            assert!(check_callback_url(inside, false).is_err(), "{inside}");
            assert!(check_callback_url(inside, true).is_ok(), "{inside}");
        }
    }
}
