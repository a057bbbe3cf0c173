//! The instances of one function: choosing one for a request, starting more when
//! all are busy, replacing crashed ones, draining old revisions, stopping idle ones.
//!
//! All state sits behind one `std::sync::Mutex` that is never held across an
//! `.await`; waiting requests park on a `Notify` that is poked on every change.
//! A pool is generic over its [`Launcher`], so its unit tests (in `pool/tests.rs`)
//! run it with fake instances on a paused clock.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sless_core::{Backoff, InstanceCounts};
use sless_logs::LogSink;
use tokio::sync::Notify;

use crate::instance::{CallError, SpecialiseError, StartError};
use crate::launcher::{DRAINING, Instance, Launcher, READY, STOPPING};
use crate::liveness::{self, LIVENESS_FAILURES, Outcome};
use crate::output::Outputs;
use crate::quota::{Account, Refusal, Reservation};
use crate::warm::WarmPool;
use crate::{DeployError, Deployment, ExecutorConfig, InvokeError, InvokeRequest, InvokeResponse};

/// Longest wait between restarts of an instance that keeps failing.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Restarts after crashes or failed starts: 100 ms, doubling, at most [`MAX_BACKOFF`].
const RESTART_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), MAX_BACKOFF);

/// How long a request whose connection failed waits for the instance's exit status,
/// so its error can say how the instance ended. An instance whose serving loop died
/// while the process lives on never exits, so this is a real time limit.
const EXIT_REPORT_WAIT: Duration = Duration::from_millis(200);

pub(crate) struct Pool<L: Launcher> {
    cfg: Arc<ExecutorConfig>,
    launcher: Arc<L>,
    sink: LogSink,
    counter: Arc<AtomicU64>,
    warm: Option<Arc<WarmPool<L>>>,
    state: Mutex<State<L::Instance>>,
    notify: Notify,
    /// The output pipes of its instances, while their pumps read them.
    outputs: Outputs,
    /// The namespace's quotas: every instance holds a [`Reservation`] until it exits.
    account: Arc<Account>,
    /// The function's invocation series, kept here so the invoke path finds them
    /// with the pool (see `sless_metrics`).
    metrics: Arc<sless_metrics::FunctionMetrics>,
    me: Weak<Pool<L>>,
}

struct State<I> {
    deployment: Arc<Deployment>,
    /// Whether `deploy` has run for `deployment` (the pool is created with it).
    activated: bool,
    /// Serving instances of the current revision.
    instances: Vec<Arc<I>>,
    /// Instances being started for the current revision.
    starting: u32,
    /// Instances of old revisions (or retired ones) finishing their requests.
    draining: Vec<Arc<I>>,
    waiters: usize,
    closed: bool,
    last_error: Option<String>,
    /// Bumped whenever an on-demand start fails, so waiting requests can fail fast.
    failed_starts: u64,
    /// Consecutive failures (crashes or failed starts), for back-off.
    failures: u32,
}

impl<L: Launcher> Pool<L> {
    pub fn new(
        cfg: Arc<ExecutorConfig>,
        launcher: Arc<L>,
        sink: LogSink,
        counter: Arc<AtomicU64>,
        warm: Option<Arc<WarmPool<L>>>,
        deployment: Deployment,
        account: Arc<Account>,
    ) -> Arc<Self> {
        let metrics = Arc::new(sless_metrics::FunctionMetrics::new(
            &deployment.namespace,
            &deployment.name,
        ));
        Arc::new_cyclic(|me| Pool {
            metrics,
            cfg,
            launcher,
            sink,
            counter,
            warm,
            state: Mutex::new(State {
                deployment: Arc::new(deployment),
                activated: false,
                instances: Vec::new(),
                starting: 0,
                draining: Vec::new(),
                waiters: 0,
                closed: false,
                last_error: None,
                failed_starts: 0,
                failures: 0,
            }),
            notify: Notify::new(),
            outputs: Outputs::default(),
            account,
            me: me.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<L::Instance>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_id(&self) -> String {
        format!("i{}", self.counter.fetch_add(1, Ordering::Relaxed))
    }

    pub fn counts(&self) -> InstanceCounts {
        let st = self.lock();
        InstanceCounts {
            ready: st.instances.len() as u32,
            starting: st.starting,
        }
    }

    pub fn deployment(&self) -> Deployment {
        (*self.lock().deployment).clone()
    }

    pub fn is_private(&self) -> bool {
        self.lock().deployment.private
    }

    /// The function's invocation series.
    pub fn metrics(&self) -> &Arc<sless_metrics::FunctionMetrics> {
        &self.metrics
    }

    /// The namespace's quotas.
    pub fn account(&self) -> &Arc<Account> {
        &self.account
    }

    pub fn last_error(&self) -> Option<String> {
        self.lock().last_error.clone()
    }

    /// Resolves with `true` once every output pipe of its instances (those serving,
    /// draining, or gone but still being read) has been found empty after this call,
    /// or with `false` once `limit` has passed.
    pub fn output_settled(&self, limit: Duration) -> impl Future<Output = bool> + Send + 'static {
        self.outputs.settled(limit)
    }

    /// A ready instance of `d`: a pre-started generic one given the function when
    /// the warm pool has one, otherwise a freshly started one.
    async fn obtain(&self, d: &Deployment, id: String) -> Result<Arc<L::Instance>, StartError> {
        if let Some(generic) = self.warm.as_ref().and_then(|w| w.take(d.family, d.network)) {
            match generic.specialise(d, &self.sink).await {
                Ok(()) => return Ok(generic),
                Err(SpecialiseError::Load(message)) => {
                    generic.kill();
                    generic.cleanup();
                    return Err(StartError::Load(message));
                }
                Err(SpecialiseError::Platform(why)) => {
                    tracing::warn!(function = %d.name, "generic instance unusable ({why}); starting a fresh one");
                    generic.kill();
                    generic.cleanup();
                }
            }
        }
        self.launcher.start(&self.sink, d, id).await
    }

    /// Starts an instance ahead of expected traffic (a cron trigger about to fire)
    /// unless one is already running or starting.
    pub fn prewarm(&self) {
        let mut st = self.lock();
        if !st.closed && !st.deployment.paused && st.instances.is_empty() && st.starting == 0 {
            // Ahead of traffic only within the quotas.
            if let Ok(reservation) = self.account.reserve(u64::from(st.deployment.memory_mb)) {
                self.start_one(&mut st, reservation);
            }
        }
    }

    pub async fn deploy(&self, d: Deployment) -> Result<(), DeployError> {
        let d = Arc::new(d);
        {
            let mut st = self.lock();
            if st.closed {
                return Err(DeployError::Cancelled);
            }
            let same = *st.deployment == *d;
            if same && st.activated {
                return Ok(());
            }
            // A paused revision runs nothing.
            if d.paused {
                self.switch(&mut st, d.clone(), Vec::new());
                return Ok(());
            }
        }

        // Start the new revision's minimum before it takes traffic, and at least one
        // instance even at `min_instances: 0`: it proves the revision loads (a missing
        // entrypoint fails the deploy, and the old revision keeps serving) and makes
        // the first request warm. Above the minimum it idles out like any other.
        let starts = (0..d.min_instances.max(1)).map(|_| {
            let id = self.next_id();
            let d = d.clone();
            async move { self.obtain(&d, id).await }
        });
        let results = futures::future::join_all(starts).await;
        let mut fresh = Vec::new();
        let mut error = None;
        for r in results {
            match r {
                Ok(instance) => fresh.push(instance),
                Err(e) => error = Some(e),
            }
        }
        if let Some(e) = error {
            for instance in fresh {
                instance.kill();
                instance.cleanup();
            }
            self.sink.line(
                "sless",
                &format!("revision {} did not start: {e}", d.revision),
            );
            return Err(DeployError::InstanceFailed(e.to_string()));
        }
        let mut st = self.lock();
        if st.closed {
            for instance in fresh {
                instance.kill();
            }
            return Err(DeployError::Cancelled);
        }
        for instance in &fresh {
            // A rollout replaces what was admitted: counted, never refused.
            let reservation = self.account.force(u64::from(d.memory_mb));
            self.watch(instance, reservation);
        }
        self.switch(&mut st, d, fresh);
        Ok(())
    }

    /// Makes `d` current with the `fresh` instances already started for it: old
    /// instances drain, and the minimum is topped up.
    fn switch(
        &self,
        st: &mut State<L::Instance>,
        d: Arc<Deployment>,
        fresh: Vec<Arc<L::Instance>>,
    ) {
        let revision_changed =
            st.deployment.revision != d.revision || st.deployment.code_dir != d.code_dir;
        let same_instances_fit = !revision_changed && *st.deployment == *d;
        st.deployment = d;
        st.activated = true;
        if !same_instances_fit || st.deployment.paused {
            for instance in std::mem::take(&mut st.instances) {
                self.drain(st, instance);
            }
            st.last_error = None;
            st.failures = 0;
        }
        st.instances.extend(fresh);
        self.ensure_min(st);
        self.notify.notify_waiters();
    }

    /// Stops taking requests on `instance`; kills it once idle (or after a grace).
    fn drain(&self, st: &mut State<L::Instance>, instance: Arc<L::Instance>) {
        instance.life().set_state(DRAINING);
        if instance.life().inflight() == 0 {
            instance.kill();
        } else {
            // The last request to end kills it (see `Permit`); requests past the
            // function's timeout are answered with 504 anyway, so one that never
            // ends cannot keep it alive past this grace period.
            let grace = Duration::from_secs(u64::from(st.deployment.timeout_sec.max(1)) + 5);
            let straggler = instance.clone();
            let mut exit = instance.exit();
            tokio::spawn(async move {
                if tokio::time::timeout(grace, exit.wait_for(|e| e.is_some()))
                    .await
                    .is_err()
                {
                    straggler.kill();
                }
            });
        }
        st.draining.push(instance);
    }

    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        for instance in std::mem::take(&mut st.instances) {
            self.drain(&mut st, instance);
        }
        drop(st);
        self.notify.notify_waiters();
    }

    /// Waits until every instance has stopped, killing what remains at `deadline`.
    pub async fn wait_stopped(&self, deadline: tokio::time::Instant) {
        loop {
            let notified = self.notify.notified();
            {
                let st = self.lock();
                if st.instances.is_empty() && st.draining.is_empty() && st.starting == 0 {
                    return;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let st = self.lock();
                for instance in st.instances.iter().chain(st.draining.iter()) {
                    instance.kill();
                }
                return;
            }
        }
    }

    /// Starts instances until the current revision has its minimum.
    fn ensure_min(&self, st: &mut State<L::Instance>) {
        if st.closed || st.deployment.paused {
            return;
        }
        while (st.instances.len() as u32 + st.starting) < st.deployment.min_instances {
            // The minimum was checked against the quotas when it was set.
            let reservation = self.account.force(u64::from(st.deployment.memory_mb));
            self.start_one(st, reservation);
        }
    }

    /// Starts one instance of the current revision in the background; it holds
    /// `reservation` until it exits (a failed start returns it at once).
    fn start_one(&self, st: &mut State<L::Instance>, reservation: Reservation) {
        st.starting += 1;
        let d = st.deployment.clone();
        let delay = RESTART_BACKOFF.delay(st.failures);
        let id = self.next_id();
        let Some(pool) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let result = pool.obtain(&d, id).await;
            let mut st = pool.lock();
            st.starting -= 1;
            match result {
                Ok(instance) => {
                    pool.watch(&instance, reservation);
                    let current = st.deployment.revision == d.revision
                        && st.deployment.code_dir == d.code_dir
                        && st.deployment.secrets_digest == d.secrets_digest;
                    if st.closed || !current || st.deployment.paused {
                        pool.drain(&mut st, instance);
                    } else {
                        st.failures = 0;
                        st.instances.push(instance);
                    }
                }
                Err(e) => {
                    let e = e.to_string();
                    pool.sink.line("sless", &e);
                    st.last_error = Some(e);
                    st.failed_starts += 1;
                    st.failures += 1;
                    pool.ensure_min(&mut st);
                }
            }
            drop(st);
            pool.notify.notify_waiters();
        });
    }

    /// Follows an instance until it exits, then forgets it and, if it was not
    /// stopped on purpose, reports the crash and replaces it as needed. Meanwhile
    /// checks that its serving loop still answers while it is busy.
    fn watch(&self, instance: &Arc<L::Instance>, reservation: Reservation) {
        self.outputs.add(instance.output());
        let Some(pool) = self.me.upgrade() else {
            return;
        };
        if let Some(period) = self.cfg.liveness_period {
            let monitored = instance.clone();
            let weak = self.me.clone();
            tokio::spawn(async move {
                let instance = &monitored;
                let outcome = liveness::monitor(
                    period,
                    LIVENESS_FAILURES,
                    || instance.activity(),
                    || instance.probe(),
                )
                .await;
                if let (Outcome::Unresponsive { silent_for }, Some(pool)) =
                    (outcome, weak.upgrade())
                {
                    pool.unresponsive(instance, silent_for);
                }
            });
        }
        let instance = instance.clone();
        tokio::spawn(async move {
            let mut exit = instance.exit();
            let exit = match exit.wait_for(|e| e.is_some()).await {
                Ok(e) => e.clone(),
                Err(_) => None,
            };
            instance.cleanup();
            drop(reservation);
            let on_purpose = instance.life().state() == STOPPING;
            let mut st = pool.lock();
            st.instances.retain(|i| !Arc::ptr_eq(i, &instance));
            st.draining.retain(|i| !Arc::ptr_eq(i, &instance));
            if !on_purpose {
                let what = match &exit {
                    Some(exit) => format!("instance {} {exit}", instance.id()),
                    None => format!("instance {} vanished", instance.id()),
                };
                pool.sink.line("sless", &what);
                tracing::warn!(function = %st.deployment.name, "{what}");
                st.last_error = Some(what);
                st.failures += 1;
                pool.ensure_min(&mut st);
            }
            drop(st);
            pool.notify.notify_waiters();
        });
    }

    /// Stops instances above the minimum that have been idle too long.
    pub fn reap_idle(&self) {
        let mut st = self.lock();
        let idle_limit = Duration::from_secs(u64::from(st.deployment.idle_timeout_sec));
        let min = st.deployment.min_instances as usize;
        while st.instances.len() > min {
            let victim = st
                .instances
                .iter()
                .filter(|i| i.life().inflight() == 0 && i.idle_for() >= idle_limit)
                .max_by_key(|i| i.idle_for())
                .cloned();
            let Some(victim) = victim else { break };
            st.instances.retain(|i| !Arc::ptr_eq(i, &victim));
            self.drain(&mut st, victim);
        }
    }

    /// Freezes the serving instances that have been idle for the configured time:
    /// what a handler left running after its response gets no CPU until the next
    /// request thaws the instance.
    pub fn freeze_idle(&self) {
        let Some(after) = self.cfg.freeze_after else {
            return;
        };
        let st = self.lock();
        for instance in &st.instances {
            instance.freeze_if_idle(after);
        }
    }

    pub async fn invoke(&self, request: InvokeRequest) -> Result<InvokeResponse, InvokeError> {
        let deadline = tokio::time::Instant::now() + self.cfg.queue_timeout;
        let mut cold_start = false;
        let (instance, timeout_sec) = loop {
            let notified = self.notify.notified();
            let seen_failures;
            {
                let mut st = self.lock();
                if st.closed {
                    return Err(InvokeError::NotFound);
                }
                if st.deployment.paused {
                    return Err(InvokeError::Paused(st.deployment.name.clone()));
                }
                if let Some(instance) = pick(&st) {
                    // Under the lock, so the freezer cannot freeze it again meanwhile.
                    if let Err(e) = instance.thaw() {
                        tracing::warn!(instance = %instance.id(), error = %e, "cannot thaw an instance; replacing it");
                        st.instances.retain(|i| !Arc::ptr_eq(i, &instance));
                        self.drain(&mut st, instance);
                        self.ensure_min(&mut st);
                        continue;
                    }
                    instance.life().inflight.fetch_add(1, Ordering::AcqRel);
                    break (instance, st.deployment.timeout_sec);
                }
                if st.waiters >= self.cfg.max_queue {
                    return Err(InvokeError::Unavailable(format!(
                        "function {} is at capacity and its queue is full ({} waiting)",
                        st.deployment.name, st.waiters
                    )));
                }
                // Start another instance unless those already starting will have
                // room for every waiting request.
                let d = &st.deployment;
                let room_coming = st.starting as usize * d.concurrency as usize;
                let total = st.instances.len() as u32 + st.starting;
                if room_coming <= st.waiters && total < d.max_instances {
                    match self.account.reserve(u64::from(d.memory_mb)) {
                        Ok(reservation) => self.start_one(&mut st, reservation),
                        // Over the namespace's quotas: a request that an instance of
                        // this function may yet serve waits for it; one that nothing
                        // could serve is refused.
                        Err(exceeded) if st.instances.is_empty() && st.starting == 0 => {
                            return Err(InvokeError::QuotaExceeded(Refusal {
                                exceeded,
                                retry_after: None,
                            }));
                        }
                        Err(_) => {}
                    }
                }
                cold_start = true;
                seen_failures = st.failed_starts;
                st.waiters += 1;
            }
            let waited = tokio::time::timeout_at(deadline, notified).await;
            let mut st = self.lock();
            st.waiters -= 1;
            if waited.is_err() {
                return Err(InvokeError::Unavailable(format!(
                    "no instance of function {} had room within {} s",
                    st.deployment.name,
                    self.cfg.queue_timeout.as_secs()
                )));
            }
            if st.failed_starts != seen_failures && st.instances.is_empty() && st.starting == 0 {
                let why = st.last_error.clone().unwrap_or_default();
                return Err(InvokeError::Unavailable(format!(
                    "function {} could not start: {why}",
                    st.deployment.name
                )));
            }
        };

        let _permit = Permit {
            pool: self,
            instance: &instance,
        };
        let timeout = match timeout_sec {
            0 => None,
            s => Some(Duration::from_secs(u64::from(s))),
        };
        match instance.call(&request, timeout).await {
            Ok((ok, body)) => Ok(InvokeResponse {
                ok,
                body,
                cold_start,
                revision: instance.revision(),
            }),
            Err(CallError::Timeout) => {
                // The handler may be stuck (a busy loop cannot be interrupted), so the
                // instance takes no more requests and is replaced.
                let name = self.retire(&instance, "a request timed out");
                Err(InvokeError::Timeout {
                    name,
                    seconds: timeout_sec,
                })
            }
            // Nothing reached the instance: the request itself could not be written,
            // which says nothing about the instance, so it keeps serving.
            Err(why @ CallError::Request(_)) => Err(InvokeError::InstanceFailed(why.to_string())),
            Err(_) if instance.is_unresponsive() => {
                Err(InvokeError::InstanceFailed(STOPPED_RESPONDING.to_string()))
            }
            Err(why) => {
                // Give the exit status a moment to arrive so the error can say what happened.
                let mut exit = instance.exit();
                let exited = tokio::time::timeout(EXIT_REPORT_WAIT, exit.wait_for(|e| e.is_some()))
                    .await
                    .ok()
                    .and_then(|r| r.ok().and_then(|e| e.clone()));
                match exited {
                    // The watcher reports the exit and replaces the instance.
                    Some(exit) => Err(InvokeError::InstanceFailed(format!(
                        "function instance {exit} without answering"
                    ))),
                    None => {
                        // Alive, yet the connection failed or the answer broke the
                        // protocol: its server is not serving as it should (its loop may
                        // be dead while the process lives on), so it takes no more
                        // requests and is replaced.
                        self.retire(&instance, "a request failed without an answer");
                        Err(InvokeError::InstanceFailed(why.to_string()))
                    }
                }
            }
        }
    }
}

/// What a request held by an instance whose serving loop stopped answering gets.
const STOPPED_RESPONDING: &str = "function instance stopped responding: its serving loop \
    answered no liveness check while this request ran, so the instance was replaced";

impl<L: Launcher> Pool<L> {
    /// Handles an instance whose serving loop has not answered liveness checks for
    /// `silent_for` while it had requests in flight. With a `timeout_sec` its requests
    /// end at their timeout (or with their answer, should the loop recover): it only
    /// takes no new ones and is replaced. Without one nothing would ever end them, so
    /// it is killed: its requests fail with [`STOPPED_RESPONDING`] and a fresh
    /// instance takes its place.
    fn unresponsive(&self, instance: &Arc<L::Instance>, silent_for: Duration) {
        let mut st = self.lock();
        let what = format!(
            "instance {} stopped responding: {LIVENESS_FAILURES} liveness checks in a row \
             went unanswered over {} s while requests were in flight",
            instance.id(),
            silent_for.as_secs()
        );
        tracing::warn!(function = %st.deployment.name, "{what}");
        st.last_error = Some(what.clone());
        if st.deployment.timeout_sec > 0 {
            drop(st);
            self.retire(instance, "it stopped responding to liveness checks");
            return;
        }
        self.sink.line(
            "sless",
            &format!("{what}; its requests fail and it is replaced"),
        );
        if let Some(pos) = st.instances.iter().position(|i| Arc::ptr_eq(i, instance)) {
            let gone = st.instances.remove(pos);
            st.draining.push(gone);
        }
        instance.kill_unresponsive();
        self.ensure_min(&mut st);
        drop(st);
        self.notify.notify_waiters();
    }

    /// Takes `instance` out of service (it drains, then is killed) and tops the pool
    /// back up; returns the function's name.
    fn retire(&self, instance: &Arc<L::Instance>, why: &str) -> String {
        let mut st = self.lock();
        if let Some(pos) = st.instances.iter().position(|i| Arc::ptr_eq(i, instance)) {
            let retired = st.instances.remove(pos);
            self.sink.line(
                "sless",
                &format!("instance {} is recycled after {why}", retired.id()),
            );
            self.drain(&mut st, retired);
            self.ensure_min(&mut st);
        }
        st.deployment.name.clone()
    }
}

/// The least busy serving instance with room, if any.
fn pick<I: Instance>(st: &State<I>) -> Option<Arc<I>> {
    let limit = st.deployment.concurrency;
    st.instances
        .iter()
        .filter(|i| i.life().state() == READY && !i.is_dead())
        .map(|i| (i.life().inflight(), i))
        .filter(|(n, _)| *n < limit)
        .min_by_key(|(n, _)| *n)
        .map(|(_, i)| i.clone())
}

/// Holds one unit of an instance's concurrency for the length of a request.
struct Permit<'a, L: Launcher> {
    pool: &'a Pool<L>,
    instance: &'a Arc<L::Instance>,
}

impl<L: Launcher> Drop for Permit<'_, L> {
    fn drop(&mut self) {
        let left = self.instance.life().inflight.fetch_sub(1, Ordering::AcqRel) - 1;
        if left == 0 && self.instance.life().state() == DRAINING {
            self.instance.kill();
        }
        self.pool.notify.notify_waiters();
    }
}

#[cfg(test)]
impl<L: Launcher> Pool<L> {
    /// Requests waiting for an instance with room.
    fn waiting(&self) -> usize {
        self.lock().waiters
    }
}

#[cfg(test)]
mod tests;
