//! The delivery engine: one per queue trigger, device trigger and function with async
//! calls. It takes [`Delivery`]s, invokes the function through [`Fire`] under a
//! [`DeliveryPolicy`] (bounded in flight, per-key order when asked, retries with capped
//! exponential back-off and jitter on retryable outcomes only), and settles each one
//! exactly once through [`DeliveryHooks::settled`] — success, or a dead letter — before
//! it runs the delivery's `done` (the broker acknowledgement).
//!
//! # How a delivery moves
//!
//! ```text
//! submit ──(room: at most `capacity` held)──► behind its key ─┐
//!    │                                                         ▼
//!    └──────────────────────────────────────────────────► ready ──(a slot: `concurrency`)──► attempt
//!                                                              ▲                                │
//!                                      waiting for its retry ──┘◄── retryable, attempts left ───┤
//!                                      (holds no slot)                                          ▼
//!                                                          settled hook (retried until Ok) ──► done
//! ```
//!
//! A delivery is *held* from the moment `submit` takes it until its `done` ran; `submit`
//! waits while `capacity` deliveries are held, which is what stops a connector reading
//! from its broker. With `ordering: key` one delivery per key is active (ready, in
//! flight, waiting for its retry, or settling); the others with that key wait behind it,
//! in order. After [`Engine::shutdown`] nothing more is attempted or settled: the
//! deliveries held are dropped with their `done`, so the broker redelivers them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use sless_core::delivery::Ordering;
use sless_core::invocation::InvocationSource;
use sless_core::{Backoff, DeliveryCounters, DeliveryPolicy};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

/// The back-off between calls of a failing [`DeliveryHooks::settled`] (its store or
/// broker is away): short at first, then no busier than twice a minute.
const SETTLE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));

/// The deliveries an engine holds by default: four times what may be in flight (so
/// the next ones are at hand when a slot frees), and never fewer than 64.
pub fn default_capacity(concurrency: u32) -> usize {
    (concurrency as usize).saturating_mul(4).max(64)
}

/// The engine of one trigger (or one function's async calls).
pub struct Engine {
    target: Target,
    fire: Arc<dyn Fire>,
    hooks: Arc<dyn DeliveryHooks>,
    state: Mutex<State>,
    /// One permit per delivery held; `submit` waits for one.
    room: Arc<Semaphore>,
    /// Cancelled by [`Engine::shutdown`]: every task of the engine stops.
    stop: CancellationToken,
    tasks: TaskTracker,
    /// The engine itself, for the tasks it spawns from `&self`.
    me: Weak<Engine>,
    /// Its Prometheus counters (as [`DeliveryCounters`], process-wide).
    metrics: sless_metrics::DeliveryMetrics,
}

/// What the engine's lock guards.
struct State {
    policy: DeliveryPolicy,
    counters: DeliveryCounters,
    /// Attempts running now (bounded by `policy.concurrency`).
    in_flight: usize,
    /// Deliveries taken and whose `done` has not run yet.
    held: usize,
    /// How many deliveries may be held; `None`: [`default_capacity`] of the policy.
    capacity: usize,
    fixed_capacity: bool,
    /// Deliveries ready for an attempt, waiting for a slot.
    ready: VecDeque<Job>,
    /// With `ordering: key`: the keys with an active delivery, and the deliveries
    /// waiting behind it, in the order they were taken.
    keys: HashMap<String, VecDeque<Job>>,
    shut_down: bool,
}

/// A delivery taken by the engine, between its attempts.
struct Job {
    delivery: Delivery,
    done: Done,
    /// The attempt it is at (or about to make), 1-based.
    attempt: u32,
    /// The policy when it was taken: a policy change applies to later deliveries.
    policy: DeliveryPolicy,
    /// Its key, when it was taken under `ordering: key`.
    ordered_key: Option<String>,
    /// Its place among the deliveries held; given back when it is dropped.
    _room: OwnedSemaphorePermit,
}

impl Engine {
    /// An engine holding up to [`default_capacity`] deliveries (following the
    /// policy's concurrency when it changes).
    pub fn new(
        target: Target,
        policy: DeliveryPolicy,
        fire: Arc<dyn Fire>,
        hooks: Arc<dyn DeliveryHooks>,
    ) -> Arc<Self> {
        Self::build(
            target,
            policy,
            fire,
            hooks,
            default_capacity(policy.concurrency),
            false,
        )
    }

    /// An engine holding up to `capacity` deliveries (at least one), whatever the
    /// policy's concurrency.
    pub fn with_capacity(
        target: Target,
        policy: DeliveryPolicy,
        fire: Arc<dyn Fire>,
        hooks: Arc<dyn DeliveryHooks>,
        capacity: usize,
    ) -> Arc<Self> {
        Self::build(target, policy, fire, hooks, capacity.max(1), true)
    }

    fn build(
        target: Target,
        policy: DeliveryPolicy,
        fire: Arc<dyn Fire>,
        hooks: Arc<dyn DeliveryHooks>,
        capacity: usize,
        fixed_capacity: bool,
    ) -> Arc<Self> {
        let metrics = match &target.trigger {
            Some(trigger) => sless_metrics::DeliveryMetrics::queue(&target.namespace, trigger),
            None => {
                sless_metrics::DeliveryMetrics::async_calls(&target.namespace, &target.function)
            }
        };
        Arc::new_cyclic(|me| Self {
            metrics,
            target,
            fire,
            hooks,
            state: Mutex::new(State {
                policy,
                counters: DeliveryCounters::default(),
                in_flight: 0,
                held: 0,
                capacity,
                fixed_capacity,
                ready: VecDeque::new(),
                keys: HashMap::new(),
                shut_down: false,
            }),
            room: Arc::new(Semaphore::new(capacity)),
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
            me: me.clone(),
        })
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent between statements: a panic elsewhere while
        // holding it leaves nothing half-done worth refusing.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a delivery: waits while the engine is at its bound of messages held
    /// (back-pressure for the connector), then delivers it in the background and
    /// runs `done` once it settled. After [`Engine::shutdown`] it returns at once and
    /// the delivery is dropped, `done` with it.
    pub async fn submit(self: &Arc<Self>, delivery: Delivery, done: Done) {
        let room = tokio::select! {
            // Closed by shutdown.
            room = self.room.clone().acquire_owned() => match room {
                Ok(room) => room,
                Err(_) => return,
            },
            () = self.stop.cancelled() => return,
        };
        let mut st = self.lock();
        if st.shut_down {
            return;
        }
        st.counters.received += 1;
        self.metrics.received.increment(1);
        st.held += 1;
        let policy = st.policy;
        let ordered_key = match policy.ordering {
            Ordering::Key => delivery.key.clone(),
            Ordering::None => None,
        };
        let job = Job {
            delivery,
            done,
            attempt: 1,
            policy,
            ordered_key,
            _room: room,
        };
        match &job.ordered_key {
            Some(key) => match st.keys.get_mut(key) {
                Some(behind) => behind.push_back(job),
                None => {
                    st.keys.insert(key.clone(), VecDeque::new());
                    st.ready.push_back(job);
                }
            },
            None => st.ready.push_back(job),
        }
        self.pump(&mut st);
    }

    /// Starts attempts of ready deliveries while slots are free.
    fn pump(&self, st: &mut State) {
        if st.shut_down {
            return;
        }
        let Some(me) = self.me.upgrade() else {
            return;
        };
        while st.in_flight < st.policy.concurrency as usize {
            let Some(job) = st.ready.pop_front() else {
                break;
            };
            st.in_flight += 1;
            let engine = me.clone();
            let stop = self.stop.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = engine.run(job) => {}
                }
            });
        }
    }

    /// One attempt of `job` (it holds a slot), then its retry or its settlement.
    async fn run(self: Arc<Self>, mut job: Job) {
        self.hooks.attempt_started(&job.delivery, job.attempt).await;
        let outcome = self.attempt(&job.delivery, job.attempt).await;
        let success = outcome.is_success();
        // A 404 the platform gave, not the handler (no pool serves the function yet: a
        // deploy in progress, calls resumed before their function is back), is worth
        // another attempt like a 503; a handler's own 404 is final.
        let status = if outcome.status == 404 && outcome.response.is_none() {
            503
        } else {
            outcome.status
        };
        let retry = !success && job.policy.retries(job.attempt, status);
        {
            let mut st = self.lock();
            st.in_flight -= 1;
            if !success {
                st.counters.failed += 1;
                self.metrics.failed.increment(1);
            }
            if retry {
                st.counters.retried += 1;
                self.metrics.retried.increment(1);
            }
            self.pump(&mut st);
        }
        if retry {
            let next = job.attempt + 1;
            tokio::time::sleep(job.policy.retry_delay(next, rand::random::<f64>())).await;
            job.attempt = next;
            let mut st = self.lock();
            if !st.shut_down {
                st.ready.push_back(job);
                self.pump(&mut st);
            }
            return;
        }
        let settled = if success {
            Settled::Succeeded {
                attempts: job.attempt,
                response: outcome.response,
            }
        } else {
            Settled::DeadLettered {
                attempts: job.attempt,
                last_status: outcome.status,
                error: outcome.error,
                response: outcome.response,
            }
        };
        self.settle(job, settled).await;
    }

    /// Settles `job` through the hooks (again and again until they succeed), lets
    /// the next delivery of its key go, and runs its `done`.
    async fn settle(&self, job: Job, settled: Settled) {
        let mut failures = 0;
        while let Err(e) = self.hooks.settled(&job.delivery, &settled).await {
            failures += 1;
            tracing::warn!(
                namespace = %self.target.namespace,
                function = %self.target.function,
                trigger = self.target.trigger.as_deref().unwrap_or(""),
                id = %job.delivery.id,
                error = %e,
                "cannot settle a delivery; trying again"
            );
            tokio::time::sleep(SETTLE_BACKOFF.jittered(failures, rand::random::<f64>())).await;
        }
        let Job {
            done,
            ordered_key,
            _room,
            ..
        } = job;
        {
            let mut st = self.lock();
            match settled {
                Settled::Succeeded { .. } => {
                    st.counters.succeeded += 1;
                    self.metrics.succeeded.increment(1);
                }
                Settled::DeadLettered { .. } => {
                    st.counters.dead_lettered += 1;
                    self.metrics.dead_lettered.increment(1);
                }
            }
            if let Some(key) = ordered_key {
                // The next delivery with this key may go; the key stays active for it.
                match st.keys.get_mut(&key).and_then(VecDeque::pop_front) {
                    Some(next) => {
                        st.ready.push_back(next);
                        self.pump(&mut st);
                    }
                    None => {
                        st.keys.remove(&key);
                    }
                }
            }
        }
        done().await;
        self.lock().held -= 1;
        // `_room` is dropped here: a waiting `submit` may take the next delivery.
    }

    async fn attempt(&self, delivery: &Delivery, attempt: u32) -> FireOutcome {
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

    /// Changes the policy: deliveries taken from now on follow it (those held finish
    /// under the one they were taken with), and its concurrency bounds the attempts
    /// started from now on.
    pub fn set_policy(&self, policy: DeliveryPolicy) {
        let mut st = self.lock();
        st.policy = policy;
        if !st.fixed_capacity {
            // The bound only grows: permits out with deliveries held cannot be taken back.
            let wanted = default_capacity(policy.concurrency);
            if wanted > st.capacity {
                self.room.add_permits(wanted - st.capacity);
                st.capacity = wanted;
            }
        }
        self.pump(&mut st);
    }

    pub fn policy(&self) -> DeliveryPolicy {
        self.lock().policy
    }

    /// What happened to the deliveries so far.
    pub fn counters(&self) -> DeliveryCounters {
        self.lock().counters
    }

    /// Deliveries taken and not settled yet (in flight, waiting for a slot, behind
    /// their key, waiting for a retry, or settling).
    pub fn pending(&self) -> usize {
        self.lock().held
    }

    /// How many deliveries the engine holds at most before `submit` waits.
    pub fn capacity(&self) -> usize {
        self.lock().capacity
    }

    /// Stops the engine: no attempt, retry or settlement starts any more, attempts in
    /// flight are abandoned, and the deliveries held are dropped without running their
    /// `done` (the broker redelivers them). `submit` returns at once from now on.
    pub fn shutdown(&self) {
        let dropped = {
            let mut st = self.lock();
            st.shut_down = true;
            let ready = std::mem::take(&mut st.ready);
            let keys = std::mem::take(&mut st.keys);
            (ready, keys)
        };
        self.stop.cancel();
        self.room.close();
        self.tasks.close();
        // Dropped outside the lock: a `Done` may own anything.
        drop(dropped);
    }

    /// Whether [`Engine::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Waits until, after [`Engine::shutdown`], every task of the engine has ended.
    pub async fn stopped(&self) {
        self.tasks.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering as AtomicOrdering};

    use futures::FutureExt;
    use serde_json::json;
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    use super::*;

    type Script = Box<dyn Fn(&str, u32) -> u16 + Send + Sync>;

    /// A function that answers with scripted statuses (by delivery id and attempt),
    /// takes `work` of (paused) time per attempt, and records what it saw.
    struct FakeFire {
        script: Script,
        work: Duration,
        /// When set, every attempt waits for a permit first.
        gate: Option<Arc<Semaphore>>,
        in_flight: AtomicUsize,
        high_water: AtomicUsize,
        /// Attempts in flight per key, to prove one at a time.
        per_key: Mutex<HashMap<String, usize>>,
        key_overlap: AtomicUsize,
        /// (id, attempt, when it started), in the order attempts started.
        log: Mutex<Vec<(String, u32, Instant)>>,
        /// How many attempts have finished.
        finished: tokio::sync::watch::Sender<usize>,
    }

    impl FakeFire {
        fn new(script: impl Fn(&str, u32) -> u16 + Send + Sync + 'static) -> Self {
            Self {
                script: Box::new(script),
                work: Duration::from_millis(10),
                gate: None,
                in_flight: AtomicUsize::new(0),
                high_water: AtomicUsize::new(0),
                per_key: Mutex::default(),
                key_overlap: AtomicUsize::new(0),
                log: Mutex::default(),
                finished: tokio::sync::watch::Sender::new(0),
            }
        }

        fn ok() -> Self {
            Self::new(|_, _| 200)
        }

        fn gated(mut self, gate: &Arc<Semaphore>) -> Self {
            self.gate = Some(gate.clone());
            self
        }

        fn log(&self) -> Vec<(String, u32, Instant)> {
            self.log.lock().unwrap().clone()
        }

        /// The ids of the first attempts, in the order they started.
        fn first_attempts(&self) -> Vec<String> {
            self.log()
                .into_iter()
                .filter(|(_, a, _)| *a == 1)
                .map(|(id, _, _)| id)
                .collect()
        }

        fn attempts_of(&self, id: &str) -> Vec<Instant> {
            self.log()
                .into_iter()
                .filter(|(i, _, _)| i == id)
                .map(|(_, _, at)| at)
                .collect()
        }
    }

    fn key_of(id: &str) -> String {
        id.split('-').next().unwrap().to_string()
    }

    #[async_trait]
    impl Fire for FakeFire {
        async fn fire(&self, req: FireRequest) -> FireOutcome {
            let info = req.delivery.expect("deliveries carry their info");
            if let Some(gate) = &self.gate {
                gate.acquire().await.unwrap().forget();
            }
            let now = self.in_flight.fetch_add(1, AtomicOrdering::SeqCst) + 1;
            self.high_water.fetch_max(now, AtomicOrdering::SeqCst);
            let key = key_of(&info.request_id);
            {
                let mut per_key = self.per_key.lock().unwrap();
                let n = per_key.entry(key.clone()).or_default();
                *n += 1;
                self.key_overlap.fetch_max(*n, AtomicOrdering::SeqCst);
            }
            self.log
                .lock()
                .unwrap()
                .push((info.request_id.clone(), info.attempt, Instant::now()));
            tokio::time::sleep(self.work).await;
            *self.per_key.lock().unwrap().get_mut(&key).unwrap() -= 1;
            self.in_flight.fetch_sub(1, AtomicOrdering::SeqCst);
            let scripted = (self.script)(&info.request_id, info.attempt);
            self.finished.send_modify(|n| *n += 1);
            // A scripted status above 1000 is the platform's (status − 1000): no handler
            // answered, so there is no response.
            if scripted > 1000 {
                let status = scripted - 1000;
                return FireOutcome {
                    status,
                    error: Some(format!("platform {status}")),
                    response: None,
                };
            }
            let status = scripted;
            FireOutcome {
                status,
                error: (status >= 500).then(|| format!("boom {status}")),
                response: Some(FireResponse {
                    status,
                    headers: vec![],
                    body: bytes::Bytes::from(format!("{{\"attempt\":{}}}", info.attempt)),
                }),
            }
        }

        async fn prewarm(&self, _: &str, _: &str) {}
    }

    /// Records settlements; the first `failures` calls of `settled` fail.
    #[derive(Default)]
    struct Hooks {
        failures: AtomicU32,
        calls: AtomicU32,
        settled: Mutex<Vec<(String, Settled)>>,
        started: Mutex<Vec<(String, u32)>>,
    }

    #[async_trait]
    impl DeliveryHooks for Hooks {
        async fn attempt_started(&self, delivery: &Delivery, attempt: u32) {
            self.started
                .lock()
                .unwrap()
                .push((delivery.id.clone(), attempt));
        }

        async fn settled(&self, delivery: &Delivery, settled: &Settled) -> anyhow::Result<()> {
            self.calls.fetch_add(1, AtomicOrdering::SeqCst);
            if self
                .failures
                .fetch_update(AtomicOrdering::SeqCst, AtomicOrdering::SeqCst, |n| {
                    n.checked_sub(1)
                })
                .is_ok()
            {
                anyhow::bail!("the store is away");
            }
            self.settled
                .lock()
                .unwrap()
                .push((delivery.id.clone(), settled.clone()));
            Ok(())
        }
    }

    impl Hooks {
        fn of(&self, id: &str) -> Vec<Settled> {
            self.settled
                .lock()
                .unwrap()
                .iter()
                .filter(|(i, _)| i == id)
                .map(|(_, s)| s.clone())
                .collect()
        }
    }

    fn target() -> Target {
        Target {
            namespace: "default".into(),
            function: "f".into(),
            source: InvocationSource::Queue,
            trigger: Some("t".into()),
        }
    }

    fn policy(concurrency: u32, ordering: Ordering) -> DeliveryPolicy {
        DeliveryPolicy {
            max_attempts: 3,
            backoff_initial_ms: 1000,
            backoff_max_ms: 60_000,
            concurrency,
            ordering,
        }
    }

    /// Delivery `id`; its key is the part of the id before the first `-`.
    fn delivery(id: &str) -> Delivery {
        Delivery {
            id: id.to_string(),
            key: Some(key_of(id)),
            event: json!({"id": id}),
            message: Some(json!({"id": id})),
            call_id: None,
            redrive_of: None,
        }
    }

    /// A `done` that reports the delivery's id on `tx`.
    fn done(tx: &mpsc::UnboundedSender<String>, id: &str) -> Done {
        let (tx, id) = (tx.clone(), id.to_string());
        Box::new(move || {
            async move {
                let _ = tx.send(id);
            }
            .boxed()
        })
    }

    struct Rig {
        engine: Arc<Engine>,
        fire: Arc<FakeFire>,
        hooks: Arc<Hooks>,
        tx: mpsc::UnboundedSender<String>,
        rx: mpsc::UnboundedReceiver<String>,
    }

    impl Rig {
        fn new(fire: FakeFire, policy: DeliveryPolicy) -> Self {
            Self::with(fire, Hooks::default(), policy, None)
        }

        fn with(
            fire: FakeFire,
            hooks: Hooks,
            policy: DeliveryPolicy,
            capacity: Option<usize>,
        ) -> Self {
            let fire = Arc::new(fire);
            let hooks = Arc::new(hooks);
            let engine = match capacity {
                Some(c) => Engine::with_capacity(target(), policy, fire.clone(), hooks.clone(), c),
                None => Engine::new(target(), policy, fire.clone(), hooks.clone()),
            };
            let (tx, rx) = mpsc::unbounded_channel();
            Self {
                engine,
                fire,
                hooks,
                tx,
                rx,
            }
        }

        async fn submit(&self, id: &str) {
            self.engine.submit(delivery(id), done(&self.tx, id)).await;
        }

        /// The ids of the next `n` deliveries whose `done` ran, in that order.
        async fn done(&mut self, n: usize) -> Vec<String> {
            let mut ids = Vec::new();
            for _ in 0..n {
                ids.push(self.rx.recv().await.expect("the engine keeps going"));
            }
            ids
        }
    }

    fn ids(prefix: &str, n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("{prefix}-{i}")).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_concurrency_attempts_run_at_once() {
        let mut rig = Rig::new(FakeFire::ok(), policy(3, Ordering::None));
        for (i, id) in ids("m", 20).iter().enumerate() {
            // Different keys: ordering none ignores them anyway.
            rig.submit(&format!("{i}{id}")).await;
        }
        assert_eq!(rig.done(20).await.len(), 20);
        assert_eq!(rig.fire.high_water.load(AtomicOrdering::SeqCst), 3);
        let c = rig.engine.counters();
        assert_eq!(
            (c.received, c.succeeded, c.failed, c.retried),
            (20, 20, 0, 0)
        );
        assert_eq!(rig.engine.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_one_never_runs_two_at_once_and_keeps_the_order() {
        let mut rig = Rig::new(FakeFire::ok(), policy(1, Ordering::None));
        let all: Vec<String> = (0..10).map(|i| format!("k{i}-1")).collect();
        for id in &all {
            rig.submit(id).await;
        }
        assert_eq!(rig.done(10).await, all);
        assert_eq!(rig.fire.high_water.load(AtomicOrdering::SeqCst), 1);
        assert_eq!(rig.fire.first_attempts(), all);
    }

    #[tokio::test(start_paused = true)]
    async fn ordering_key_keeps_each_keys_order_under_concurrency() {
        // b-2 fails twice before it succeeds: b-3.. must wait for it.
        let fire = FakeFire::new(|id, attempt| if id == "b-2" && attempt < 3 { 503 } else { 200 });
        let mut rig = Rig::new(fire, policy(4, Ordering::Key));
        let mut order = Vec::new();
        for i in 1..=5 {
            for k in ["a", "b", "c"] {
                order.push(format!("{k}-{i}"));
            }
        }
        for id in &order {
            rig.submit(id).await;
        }
        let done = rig.done(15).await;
        for k in ["a", "b", "c"] {
            let of_key = |v: &[String]| -> Vec<String> {
                v.iter().filter(|id| id.starts_with(k)).cloned().collect()
            };
            assert_eq!(of_key(&done), ids(k, 5), "settled in order");
            assert_eq!(
                of_key(&rig.fire.first_attempts()),
                ids(k, 5),
                "started in order"
            );
        }
        assert_eq!(rig.fire.key_overlap.load(AtomicOrdering::SeqCst), 1);
        // Keys ran side by side, and a, c did not wait for b's retries.
        assert_eq!(rig.fire.high_water.load(AtomicOrdering::SeqCst), 3);
        let last = |k: &str| done.iter().position(|id| id == &format!("{k}-5")).unwrap();
        assert!(last("a") < last("b") && last("c") < last("b"));
        assert_eq!(
            rig.hooks.of("b-2"),
            vec![Settled::Succeeded {
                attempts: 3,
                response: Some(FireResponse {
                    status: 200,
                    headers: vec![],
                    body: bytes::Bytes::from_static(b"{\"attempt\":3}"),
                }),
            }]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn deliveries_without_a_key_are_not_ordered() {
        let fire = FakeFire::new(|id, _| if id == "p" { 500 } else { 200 });
        let mut rig = Rig::new(fire, policy(2, Ordering::Key));
        for id in ["p", "q", "r"] {
            let mut d = delivery(id);
            d.key = None;
            rig.engine.submit(d, done(&rig.tx, id)).await;
        }
        assert_eq!(rig.done(3).await, vec!["q", "r", "p"]);
    }

    fn poison_script(id: &str, _: u32) -> u16 {
        if id.starts_with('p') { 500 } else { 200 }
    }

    #[tokio::test(start_paused = true)]
    async fn a_poison_message_does_not_delay_the_others() {
        let mut rig = Rig::new(FakeFire::new(poison_script), policy(2, Ordering::None));
        rig.submit("p-1").await;
        let others = ids("o", 9);
        for id in &others {
            rig.submit(id).await;
        }
        let done = rig.done(10).await;
        assert_eq!(done[..9], others[..]);
        assert_eq!(done[9], "p-1");
        // All others finished before the poison message's first retry.
        let first_retry = rig.fire.attempts_of("p-1")[1];
        for id in &others {
            assert!(rig.fire.attempts_of(id)[0] < first_retry, "{id}");
        }
        match &rig.hooks.of("p-1")[..] {
            [
                Settled::DeadLettered {
                    attempts: 3,
                    last_status: 500,
                    error: Some(e),
                    response: Some(_),
                },
            ] => assert_eq!(e, "boom 500"),
            other => panic!("{other:?}"),
        }
        let c = rig.engine.counters();
        assert_eq!(
            (
                c.received,
                c.succeeded,
                c.failed,
                c.retried,
                c.dead_lettered
            ),
            (10, 9, 3, 2, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_poison_message_delays_only_its_own_key_under_ordering_key() {
        // p-2 and p-3 have p-1's key; only p-1 is poison.
        let fire = FakeFire::new(|id, _| if id == "p-1" { 500 } else { 200 });
        let mut rig = Rig::new(fire, policy(2, Ordering::Key));
        for id in ["p-1", "p-2", "o-1", "p-3", "o-2", "o-3"] {
            rig.submit(id).await;
        }
        let done = rig.done(6).await;
        assert_eq!(done[..3], ["o-1", "o-2", "o-3"]);
        assert_eq!(done[3..], ["p-1", "p-2", "p-3"]);
        let p1_last = *rig.fire.attempts_of("p-1").last().unwrap();
        assert!(rig.fire.attempts_of("p-2")[0] > p1_last);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_only_retryable_statuses_with_growing_gaps() {
        for status in [408, 429, 500, 502, 503, 504] {
            let fire = FakeFire::new(move |_, _| status);
            let mut p = policy(1, Ordering::None);
            p.max_attempts = 4;
            p.backoff_initial_ms = 100;
            p.backoff_max_ms = 300;
            let mut rig = Rig::new(fire, p);
            rig.submit("m-1").await;
            rig.done(1).await;
            let at = rig.fire.attempts_of("m-1");
            assert_eq!(at.len(), 4, "{status}");
            // Each gap is the attempt's work (10 ms) plus the back-off: 100, 200,
            // then 400 capped at 300; each jittered over its upper half.
            let work = Duration::from_millis(10);
            for (i, full) in [100u64, 200, 300].into_iter().enumerate() {
                let gap = at[i + 1] - at[i] - work;
                let full = Duration::from_millis(full);
                assert!(
                    gap >= full / 2 && gap <= full,
                    "{status}: gap {i} is {gap:?}"
                );
            }
            let c = rig.engine.counters();
            assert_eq!(
                (c.failed, c.retried, c.dead_lettered),
                (4, 3, 1),
                "{status}"
            );
            assert!(matches!(
                rig.hooks.of("m-1")[..],
                [Settled::DeadLettered { attempts: 4, last_status, .. }] if last_status == status
            ));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn other_client_errors_are_dead_letters_after_one_attempt() {
        for status in [400, 401, 403, 404, 409, 422, 501] {
            let mut rig = Rig::new(FakeFire::new(move |_, _| status), policy(1, Ordering::None));
            rig.submit("m-1").await;
            rig.done(1).await;
            assert_eq!(rig.fire.attempts_of("m-1").len(), 1, "{status}");
            assert_eq!(
                rig.hooks.of("m-1"),
                vec![Settled::DeadLettered {
                    attempts: 1,
                    last_status: status,
                    error: (status >= 500).then(|| format!("boom {status}")),
                    response: Some(FireResponse {
                        status,
                        headers: vec![],
                        body: bytes::Bytes::from_static(b"{\"attempt\":1}"),
                    }),
                }],
                "{status}"
            );
            let c = rig.engine.counters();
            assert_eq!((c.failed, c.retried, c.dead_lettered), (1, 0, 1));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_404_of_the_platform_is_retried_but_a_handlers_is_not() {
        // No function serving yet (404 from the platform) twice, then the handler answers.
        let fire = FakeFire::new(|_, attempt| if attempt < 3 { 1404 } else { 200 });
        let mut rig = Rig::new(fire, policy(1, Ordering::None));
        rig.submit("m-1").await;
        rig.done(1).await;
        assert_eq!(rig.fire.attempts_of("m-1").len(), 3);
        assert!(matches!(
            rig.hooks.of("m-1")[..],
            [Settled::Succeeded { attempts: 3, .. }]
        ));
        let c = rig.engine.counters();
        assert_eq!((c.failed, c.retried, c.succeeded), (2, 2, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_settle_is_retried_and_done_waits_for_it() {
        let hooks = Hooks::default();
        hooks.failures.store(3, AtomicOrdering::SeqCst);
        let rig = Rig::with(FakeFire::ok(), hooks, policy(1, Ordering::None), None);
        let hooks = rig.hooks.clone();
        let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
        let on_done: Done = Box::new(move || {
            async move {
                // What the hooks had seen when the acknowledgement ran.
                let _ = seen_tx.send(hooks.calls.load(AtomicOrdering::SeqCst));
            }
            .boxed()
        });
        rig.engine.submit(delivery("m-1"), on_done).await;
        assert_eq!(seen_rx.recv().await, Some(4));
        assert_eq!(rig.hooks.of("m-1").len(), 1);
        assert_eq!(
            rig.fire.attempts_of("m-1").len(),
            1,
            "settling does not attempt again"
        );
        assert_eq!(rig.engine.counters().succeeded, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_waiting_for_its_retry_holds_no_slot() {
        let fire = FakeFire::new(|id, attempt| {
            if id == "p-1" && attempt == 1 {
                503
            } else {
                200
            }
        });
        let mut rig = Rig::new(fire, policy(1, Ordering::None));
        for id in ["p-1", "o-1", "o-2", "o-3"] {
            rig.submit(id).await;
        }
        assert_eq!(rig.done(4).await, vec!["o-1", "o-2", "o-3", "p-1"]);
        let p = rig.fire.attempts_of("p-1");
        for id in ["o-1", "o-2", "o-3"] {
            let at = rig.fire.attempts_of(id)[0];
            assert!(p[0] < at && at < p[1], "{id} ran while p-1 waited");
        }
        assert_eq!(rig.fire.high_water.load(AtomicOrdering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn submit_waits_while_the_engine_is_full() {
        let gate = Arc::new(Semaphore::new(0));
        let mut rig = Rig::with(
            FakeFire::ok().gated(&gate),
            Hooks::default(),
            policy(1, Ordering::None),
            Some(2),
        );
        rig.submit("a-1").await;
        rig.submit("b-1").await;
        assert_eq!(rig.engine.pending(), 2);
        {
            let third = rig.submit("c-1");
            tokio::pin!(third);
            assert!(futures::poll!(&mut third).is_pending());
            // One attempt may finish: room for the third.
            gate.add_permits(1);
            third.await;
        }
        assert_eq!(rig.done(1).await, vec!["a-1"]);
        assert_eq!(rig.engine.counters().received, 3);
        gate.add_permits(2);
        assert_eq!(rig.done(2).await, vec!["b-1", "c-1"]);
        assert_eq!(rig.engine.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_default_capacity_follows_concurrency() {
        assert_eq!(default_capacity(1), 64);
        assert_eq!(default_capacity(100), 400);
        let rig = Rig::new(FakeFire::ok(), policy(1, Ordering::None));
        assert_eq!(rig.engine.capacity(), 64);
        rig.engine.set_policy(policy(50, Ordering::None));
        assert_eq!(rig.engine.capacity(), 200);
    }

    #[tokio::test(start_paused = true)]
    async fn a_policy_change_bounds_attempts_at_once() {
        let gate = Arc::new(Semaphore::new(0));
        let mut rig = Rig::with(
            FakeFire::ok().gated(&gate),
            Hooks::default(),
            policy(1, Ordering::None),
            None,
        );
        for id in ids("m", 6) {
            rig.submit(&id).await;
        }
        rig.engine.set_policy(policy(3, Ordering::None));
        gate.add_permits(6);
        rig.done(6).await;
        assert_eq!(rig.fire.high_water.load(AtomicOrdering::SeqCst), 3);
        assert_eq!(rig.engine.policy().concurrency, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_attempts_and_retries_and_acknowledges_nothing() {
        let gate = Arc::new(Semaphore::new(0));
        let fire = FakeFire::new(|id, _| if id == "p-1" { 503 } else { 200 }).gated(&gate);
        let mut rig = Rig::new(fire, policy(1, Ordering::None));
        rig.submit("p-1").await;
        rig.submit("o-1").await;
        rig.submit("o-2").await;
        // p-1's first attempt fails; o-1 is in flight (gated), o-2 waits for a slot.
        gate.add_permits(1);
        rig.fire
            .finished
            .subscribe()
            .wait_for(|n| *n == 1)
            .await
            .unwrap();
        rig.engine.shutdown();
        assert!(rig.engine.is_shut_down());
        rig.engine.stopped().await;
        // Submitting after shutdown takes nothing.
        rig.submit("n-1").await;
        gate.add_permits(100);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(rig.fire.log().len(), 1, "no attempt after shutdown");
        drop(rig.tx);
        assert_eq!(rig.rx.recv().await, None, "nothing acknowledged");
        assert!(rig.hooks.settled.lock().unwrap().is_empty());
        assert_eq!(rig.engine.counters().received, 3);
        // No task holds the engine any more.
        assert_eq!(Arc::strong_count(&rig.engine), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_carry_the_delivery() {
        let mut rig = Rig::new(FakeFire::ok(), policy(1, Ordering::None));
        rig.submit("m-1").await;
        rig.done(1).await;
        assert_eq!(
            *rig.hooks.started.lock().unwrap(),
            vec![("m-1".to_string(), 1)]
        );
    }
}
