//! The cron scheduler: keeps every cron trigger of the server on one timer and fires them into
//! a [`Fire`] sink, reporting each trigger's status through a [`StateSink`].
//!
//! # Shape
//!
//! [`CronScheduler`] is a cheap, cloneable handle. The server keeps one clone to [`upsert`] and
//! [`remove`] triggers as the API changes them, and runs another as a [`TriggerSource`]. One
//! driver task sleeps until the earliest due time over all triggers (at most
//! [`MAX_SLEEP`], so a jump of the wall clock is noticed within a minute), evaluates what is
//! due, and spawns each invocation as its own task so a slow function never delays other
//! triggers. Time comes from a [`Clock`] and sleeping from `tokio::time`, so tests drive the
//! scheduler with paused Tokio time and a clock tied to it.
//!
//! # Policies
//!
//! - **Persist before firing.** When a slot is due, `next_fire_at` moves to the following slot
//!   and the state is handed to [`StateSink::saved`] (awaited) *before* [`Fire::fire`] is
//!   called. A server restarted right after a fire therefore finds `next_fire_at` past that slot
//!   and never fires it twice. The cost is the opposite edge: a crash between the save and the
//!   fire loses that one run (at most once, never twice). Saves are serialised and each writes
//!   the trigger's latest state, so a slow save can never overwrite a newer one.
//! - **Late and missed runs.** A slot is fired if the scheduler gets to it at most
//!   [`SchedulerConfig::late_grace`] (5 s by default) after its time. Older slots, such as those
//!   that passed while the server was down (a trigger upserted with a `next_fire_at` in the
//!   past) or while the process was suspended, are not fired: the trigger moves on to the next
//!   future slot and records `last_result: "missed N run(s) while the server was down (last due
//!   <time>)"`. Catching up would hammer a function with a burst of stale events.
//! - **Overlap.** If the previous invocation of the same trigger is still running when a slot
//!   comes, the slot is skipped (`last_result: "skipped: previous run still running"`); the
//!   schedule carries on with the following slot.
//! - **Prewarm.** With `prewarm_sec > 0`, [`Fire::prewarm`] is called once per slot,
//!   `prewarm_sec` seconds before it (or at once, if the trigger is upserted inside that window).
//! - **Event.** The handler's event is the trigger's `event` object with `"fired_at"` (RFC 3339,
//!   UTC, whole seconds) added, replacing any `fired_at` key of its own. A `null` event becomes
//!   `{"fired_at": ..}`; any other non-object value is wrapped as `{"event": <value>, "fired_at": ..}`.
//!   `fired_at` is the scheduled slot, not the moment the timer woke.
//! - **Disabled triggers** do not fire, are not prewarmed and show `next_fire_at: None`.
//!   Enabling one schedules the next slot after now; the disabled time does not count as missed.
//! - **Updates.** Upserting an existing trigger keeps the scheduler's live state (the caller's
//!   copy from the store may be older) and recomputes `next_fire_at` only when the schedule or
//!   time zone changed or the trigger was re-enabled. An invocation in flight keeps counting for
//!   the overlap rule. Removing a trigger lets an invocation in flight finish; its result is dropped.
//! - **Shutdown.** [`TriggerSource::run`] stops firing when its token is cancelled, then waits up
//!   to [`SchedulerConfig::drain_timeout`] for invocations in flight, so their results are saved.
//!
//! `last_result` is `"running"` while an invocation is in flight, then [`FireOutcome::result`]
//! (a typed [`TriggerResult`], stored and served as the same one-line text as ever).
//!
//! [`upsert`]: CronScheduler::upsert
//! [`remove`]: CronScheduler::remove
//! [`FireOutcome::result`]: crate::FireOutcome::result

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use sless_core::{MissedRuns, TriggerResult};

use crate::cron::Schedule;
use crate::{Fire, FireRequest, TriggerSource};

/// The longest the driver sleeps before looking at the clock again. Sleeping is measured on the
/// monotonic clock while fire times are wall-clock times; waking at least this often bounds how
/// late a fire can be after the wall clock is stepped forward.
pub const MAX_SLEEP: Duration = Duration::from_secs(60);

/// How many missed slots are counted one by one before the count is reported as "more than".
const MAX_COUNTED_SLOTS: u64 = 1000;

/// The source name of cron invocations ([`TriggerSource::kind`] and [`FireRequest::source`]).
pub const KIND: &str = "cron";

/// Errors of the scheduler's own operation (not of the functions it fires).
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// [`TriggerSource::run`] was called on a second clone of the same scheduler; two drivers
    /// would fire every slot twice.
    #[error("the cron scheduler is already running")]
    AlreadyRunning,
}

/// Where the scheduler reads the current wall-clock time. Production uses [`SystemClock`];
/// tests use a clock that advances with paused Tokio time.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
}

/// The system wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// The status of a cron trigger, as the API shows it and the store persists it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CronState {
    /// The slot of the last invocation started (not of skipped or missed slots).
    pub last_fired_at: Option<DateTime<Utc>>,
    /// The next slot; `None` when the trigger is disabled or its schedule has no next time.
    pub next_fire_at: Option<DateTime<Utc>>,
    /// What happened last: running, an outcome, a skip or a missed-runs note.
    pub last_result: Option<TriggerResult>,
}

/// A cron trigger as the scheduler needs it.
#[derive(Debug, Clone)]
pub struct CronTrigger {
    /// Namespace of the trigger and its function.
    pub namespace: String,
    /// The trigger's name, unique in its namespace.
    pub name: String,
    /// The function to invoke.
    pub function: String,
    /// When to fire.
    pub schedule: Schedule,
    /// The event handed to the function, before `fired_at` is added.
    pub event: Value,
    /// Whether the trigger fires at all.
    pub enabled: bool,
    /// Seconds before each slot to prewarm the function; 0 for none.
    pub prewarm_sec: u32,
    /// The state last persisted (a fresh trigger: `CronState::default()`).
    pub state: CronState,
}

/// Receives every change of a trigger's [`CronState`] so that the server can persist it.
#[async_trait]
pub trait StateSink: Send + Sync + 'static {
    /// Persists `state` for the trigger `namespace`/`name`. The scheduler awaits this before it
    /// fires a slot (see the module's policies), so it should be quick, a single row update;
    /// calls never overlap. A failure is the implementation's to log: the scheduler keeps going.
    async fn saved(&self, namespace: &str, name: &str, state: &CronState);
}

/// Tunables of the scheduler.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// How late after its time a slot may still be fired; older slots count as missed.
    pub late_grace: Duration,
    /// How long shutdown waits for invocations in flight.
    pub drain_timeout: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            late_grace: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Identifies a trigger: (namespace, name).
type Key = (String, String);

/// Manages all cron triggers of the server. Clones share the same triggers and driver.
#[derive(Clone)]
pub struct CronScheduler {
    shared: Arc<Shared>,
}

struct Shared {
    fire: Arc<dyn Fire>,
    sink: Arc<dyn StateSink>,
    clock: Arc<dyn Clock>,
    late_grace: TimeDelta,
    drain_timeout: Duration,
    entries: Mutex<HashMap<Key, Entry>>,
    /// Tells the driver that triggers changed, so it recomputes its wake time.
    changed: Notify,
    /// Serialises `StateSink::saved` calls (see `persist`).
    save_lock: tokio::sync::Mutex<()>,
    /// Invocations, prewarms and saves in flight, awaited on shutdown.
    tasks: TaskTracker,
    next_incarnation: AtomicU64,
    started: AtomicBool,
    stopped: AtomicBool,
}

/// A trigger with the scheduler's bookkeeping.
struct Entry {
    trigger: CronTrigger,
    /// Distinguishes this entry from an earlier one of the same name that was removed, so a
    /// late result of the old one is not recorded on the new one.
    incarnation: u64,
    /// Whether an invocation of this trigger is in flight (the overlap rule).
    running: bool,
    /// The slot whose prewarm was already requested.
    prewarmed_slot: Option<DateTime<Utc>>,
}

/// Work the evaluation of a trigger asks for, done outside the lock.
enum Action {
    Prewarm { namespace: String, function: String },
    Fire { incarnation: u64, req: FireRequest },
}

/// What evaluating one trigger produced.
#[derive(Default)]
struct Evaluation {
    actions: Vec<Action>,
    /// The state changed and must be persisted.
    changed: bool,
}

impl Entry {
    /// Brings the trigger up to `now`: computes a missing next slot, fires or skips a due one,
    /// counts missed ones and asks for a prewarm. Pure bookkeeping; the caller performs the
    /// returned actions.
    fn evaluate(&mut self, now: DateTime<Utc>, late_grace: TimeDelta) -> Evaluation {
        let mut eval = Evaluation::default();
        let t = &mut self.trigger;
        if !t.enabled {
            self.prewarmed_slot = None;
            if t.state.next_fire_at.take().is_some() {
                eval.changed = true;
            }
            return eval;
        }
        let slot = match t.state.next_fire_at {
            Some(slot) => slot,
            None => {
                let Some(next) = t.schedule.next_after(now) else {
                    return eval;
                };
                t.state.next_fire_at = Some(next);
                eval.changed = true;
                next
            }
        };
        if slot <= now {
            // Walk the slots that are due, up to a bound: a seconds schedule after a long
            // outage could have many thousands.
            let mut last = slot;
            let mut count: u64 = 1;
            let mut capped = false;
            while let Some(n) = t.schedule.next_after(last) {
                if n > now {
                    break;
                }
                if count == MAX_COUNTED_SLOTS {
                    capped = true;
                    break;
                }
                last = n;
                count += 1;
            }
            t.state.next_fire_at = t.schedule.next_after(now);
            self.prewarmed_slot = None;
            eval.changed = true;

            let fire = !capped && now - last <= late_grace;
            let missed = if fire { count - 1 } else { count };
            if missed > 0 {
                let runs = if capped {
                    MissedRuns::MoreThan(MAX_COUNTED_SLOTS)
                } else {
                    MissedRuns::Exactly(missed)
                };
                let note = TriggerResult::Missed {
                    runs,
                    last_due: last,
                };
                tracing::warn!(namespace = %t.namespace, trigger = %t.name, "{note}");
                t.state.last_result = Some(note);
            }
            if fire {
                if self.running {
                    tracing::info!(
                        namespace = %t.namespace, trigger = %t.name, slot = %rfc3339(last),
                        "cron slot skipped: previous run still running"
                    );
                    t.state.last_result = Some(TriggerResult::SkippedOverlap);
                } else {
                    self.running = true;
                    t.state.last_fired_at = Some(last);
                    t.state.last_result = Some(TriggerResult::Running);
                    eval.actions.push(Action::Fire {
                        incarnation: self.incarnation,
                        req: FireRequest {
                            namespace: t.namespace.clone(),
                            function: t.function.clone(),
                            trigger: t.name.clone(),
                            source: sless_core::invocation::InvocationSource::Cron,
                            event: cron_event(&t.event, last),
                            fired_at: last,
                            delivery: None,
                        },
                    });
                }
            }
        }
        // Prewarm for the upcoming slot once we are inside its window.
        if let Some(slot) = t.state.next_fire_at
            && t.prewarm_sec > 0
            && self.prewarmed_slot != Some(slot)
            && now >= slot - TimeDelta::seconds(i64::from(t.prewarm_sec))
        {
            self.prewarmed_slot = Some(slot);
            eval.actions.push(Action::Prewarm {
                namespace: t.namespace.clone(),
                function: t.function.clone(),
            });
        }
        eval
    }

    /// When this trigger next needs the driver: its prewarm time or its slot.
    fn wake_at(&self) -> Option<DateTime<Utc>> {
        let t = &self.trigger;
        if !t.enabled {
            return None;
        }
        let slot = t.state.next_fire_at?;
        if t.prewarm_sec > 0 && self.prewarmed_slot != Some(slot) {
            Some(slot - TimeDelta::seconds(i64::from(t.prewarm_sec)))
        } else {
            Some(slot)
        }
    }
}

/// The handler's event for a slot: see the module's policies.
pub fn cron_event(event: &Value, fired_at: DateTime<Utc>) -> Value {
    let stamp = Value::String(rfc3339(fired_at));
    match event {
        Value::Object(map) => {
            let mut map = map.clone();
            map.insert("fired_at".to_string(), stamp);
            Value::Object(map)
        }
        Value::Null => serde_json::json!({ "fired_at": stamp }),
        other => serde_json::json!({ "event": other, "fired_at": stamp }),
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl CronScheduler {
    /// A scheduler with no triggers. It fires nothing until [`TriggerSource::run`] is started,
    /// except that [`CronScheduler::upsert`] fires a slot that is due at once.
    pub fn new(
        fire: Arc<dyn Fire>,
        sink: Arc<dyn StateSink>,
        clock: Arc<dyn Clock>,
        config: SchedulerConfig,
    ) -> CronScheduler {
        CronScheduler {
            shared: Arc::new(Shared {
                fire,
                sink,
                clock,
                // A grace beyond chrono's range is as good as unbounded.
                late_grace: TimeDelta::from_std(config.late_grace).unwrap_or(TimeDelta::MAX),
                drain_timeout: config.drain_timeout,
                entries: Mutex::new(HashMap::new()),
                changed: Notify::new(),
                save_lock: tokio::sync::Mutex::new(()),
                tasks: TaskTracker::new(),
                next_incarnation: AtomicU64::new(1),
                started: AtomicBool::new(false),
                stopped: AtomicBool::new(false),
            }),
        }
    }

    /// Adds a trigger or replaces the one of the same namespace and name (see the module's
    /// policies for how state is merged), and returns its state after evaluation: a `next_fire_at`
    /// in the past has been resolved into missed runs or a late fire. The new state is persisted
    /// through the [`StateSink`] in the background. Must be called inside a Tokio runtime.
    pub fn upsert(&self, trigger: CronTrigger) -> CronState {
        let shared = &self.shared;
        let key = (trigger.namespace.clone(), trigger.name.clone());
        let now = shared.clock.now();
        let (eval, state) = {
            let mut entries = shared.entries();
            let entry = match entries.get_mut(&key) {
                Some(entry) => {
                    let old = &entry.trigger;
                    let retime =
                        old.schedule != trigger.schedule || (!old.enabled && trigger.enabled);
                    let state = if retime {
                        CronState {
                            next_fire_at: None,
                            ..old.state.clone()
                        }
                    } else {
                        old.state.clone()
                    };
                    if retime {
                        entry.prewarmed_slot = None;
                    }
                    entry.trigger = CronTrigger { state, ..trigger };
                    entry
                }
                None => {
                    let incarnation = shared.next_incarnation.fetch_add(1, Ordering::Relaxed);
                    entries.entry(key.clone()).or_insert(Entry {
                        trigger,
                        incarnation,
                        running: false,
                        prewarmed_slot: None,
                    })
                }
            };
            let eval = if shared.stopped.load(Ordering::Acquire) {
                // After shutdown nothing fires; leave the state as given for the next start.
                Evaluation::default()
            } else {
                entry.evaluate(now, shared.late_grace)
            };
            (eval, entry.trigger.state.clone())
        };
        shared.dispatch(key, eval.actions, true);
        shared.changed.notify_one();
        state
    }

    /// Removes a trigger; `false` if there was none. An invocation in flight finishes, but its
    /// result is not recorded.
    pub fn remove(&self, namespace: &str, name: &str) -> bool {
        let removed = self
            .shared
            .entries()
            .remove(&(namespace.to_string(), name.to_string()))
            .is_some();
        self.shared.changed.notify_one();
        removed
    }

    /// The live state of a trigger, for the API's `status`.
    pub fn state(&self, namespace: &str, name: &str) -> Option<CronState> {
        self.shared
            .entries()
            .get(&(namespace.to_string(), name.to_string()))
            .map(|e| e.trigger.state.clone())
    }

    /// The number of triggers managed.
    pub fn len(&self) -> usize {
        self.shared.entries().len()
    }

    /// Whether no trigger is managed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Shared {
    fn entries(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        // Every critical section leaves the map consistent before anything that could panic,
        // so a poisoned lock still guards usable data.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Performs the actions of one trigger's evaluation: persists its state (if `changed`, and
    /// always before a fire), then fires; prewarms run on their own.
    fn dispatch(self: &Arc<Self>, key: Key, actions: Vec<Action>, changed: bool) {
        let mut fire = None;
        for action in actions {
            match action {
                Action::Prewarm {
                    namespace,
                    function,
                } => {
                    let shared = Arc::clone(self);
                    self.tasks.spawn(async move {
                        shared.fire.prewarm(&namespace, &function).await;
                    });
                }
                Action::Fire { incarnation, req } => fire = Some((incarnation, req)),
            }
        }
        if !changed && fire.is_none() {
            return;
        }
        let shared = Arc::clone(self);
        self.tasks.spawn(async move {
            shared.persist(&key).await;
            if let Some((incarnation, req)) = fire {
                shared.run_one(key, incarnation, req).await;
            }
        });
    }

    /// Runs one invocation and records its outcome.
    async fn run_one(self: Arc<Self>, key: Key, incarnation: u64, req: FireRequest) {
        // Clears the running flag even if the invocation panics or is cancelled, so the
        // trigger is never stuck skipping every slot.
        let mut guard = RunGuard {
            shared: &self,
            key: &key,
            incarnation,
            result: None,
        };
        let outcome = self.fire.fire(req).await;
        tracing::debug!(namespace = %key.0, trigger = %key.1, status = outcome.status, "cron run finished");
        guard.result = Some(outcome.result());
        drop(guard);
        self.persist(&key).await;
    }

    /// Hands the trigger's current state to the sink. Saves are serialised and each reads the
    /// state only once it holds the save lock, so the last save always carries the newest state.
    async fn persist(&self, key: &Key) {
        let _serial = self.save_lock.lock().await;
        let state = self.entries().get(key).map(|e| e.trigger.state.clone());
        if let Some(state) = state {
            self.sink.saved(&key.0, &key.1, &state).await;
        }
    }

    /// The driver: evaluates all triggers, performs what is due, sleeps until the next due time.
    async fn drive(self: &Arc<Self>, shutdown: &CancellationToken) {
        loop {
            let now = self.clock.now();
            let mut work = Vec::new();
            let mut wake: Option<DateTime<Utc>> = None;
            {
                let mut entries = self.entries();
                for (key, entry) in entries.iter_mut() {
                    let eval = entry.evaluate(now, self.late_grace);
                    if eval.changed || !eval.actions.is_empty() {
                        work.push((key.clone(), eval));
                    }
                    if let Some(at) = entry.wake_at() {
                        wake = Some(wake.map_or(at, |w| w.min(at)));
                    }
                }
            }
            for (key, eval) in work {
                self.dispatch(key, eval.actions, eval.changed);
            }
            let sleep_for = wake
                .map(|at| (at - now).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(MAX_SLEEP)
                .min(MAX_SLEEP);
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = self.changed.notified() => {}
                () = tokio::time::sleep(sleep_for) => {}
            }
        }
    }
}

/// Records the end of an invocation on its trigger when dropped.
struct RunGuard<'a> {
    shared: &'a Shared,
    key: &'a Key,
    incarnation: u64,
    result: Option<TriggerResult>,
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        let mut entries = self.shared.entries();
        if let Some(entry) = entries.get_mut(self.key)
            && entry.incarnation == self.incarnation
        {
            entry.running = false;
            entry.trigger.state.last_result =
                Some(self.result.take().unwrap_or(TriggerResult::Aborted));
        }
    }
}

#[async_trait]
impl TriggerSource for CronScheduler {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn run(self: Box<Self>, shutdown: CancellationToken) -> anyhow::Result<()> {
        let shared = &self.shared;
        if shared.started.swap(true, Ordering::AcqRel) {
            return Err(SchedulerError::AlreadyRunning.into());
        }
        tracing::info!(triggers = self.len(), "cron scheduler started");
        shared.drive(&shutdown).await;
        shared.stopped.store(true, Ordering::Release);
        shared.tasks.close();
        if tokio::time::timeout(shared.drain_timeout, shared.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                timeout = ?shared.drain_timeout,
                "cron scheduler stopped with invocations still in flight"
            );
        }
        tracing::info!("cron scheduler stopped");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    fn ok_200() -> TriggerResult {
        TriggerResult::Finished {
            status: 200,
            error: None,
        }
    }

    use super::*;
    use crate::FireOutcome;
    use serde_json::json;
    use tokio::sync::{Semaphore, mpsc};

    /// A wall clock that advances with Tokio's (paused) time, starting at `base`.
    struct TokioClock {
        base: DateTime<Utc>,
        start: tokio::time::Instant,
    }

    impl Clock for TokioClock {
        fn now(&self) -> DateTime<Utc> {
            let elapsed = tokio::time::Instant::now() - self.start;
            self.base + TimeDelta::from_std(elapsed).expect("test durations are small")
        }
    }

    /// What the fake executor saw.
    #[derive(Debug, Clone, PartialEq)]
    enum Seen {
        Prewarm {
            at: DateTime<Utc>,
            function: String,
        },
        Fire {
            at: DateTime<Utc>,
            req: FireRequest,
            /// `next_fire_at` the sink held for the trigger when the fire began.
            persisted_next: Option<DateTime<Utc>>,
        },
    }

    struct FakeFire {
        clock: Arc<TokioClock>,
        sink: Arc<FakeSink>,
        seen: mpsc::UnboundedSender<Seen>,
        /// When set, each fire waits for a permit, so tests can hold a run open.
        gate: Option<Arc<Semaphore>>,
    }

    #[async_trait]
    impl Fire for FakeFire {
        async fn fire(&self, req: FireRequest) -> FireOutcome {
            let persisted_next = self
                .sink
                .latest(&req.namespace, &req.trigger)
                .and_then(|s| s.next_fire_at);
            let _ = self.seen.send(Seen::Fire {
                at: self.clock.now(),
                req,
                persisted_next,
            });
            if let Some(gate) = &self.gate {
                gate.acquire().await.expect("gate is never closed").forget();
            }
            FireOutcome {
                status: 200,
                error: None,
                response: None,
            }
        }

        async fn prewarm(&self, _namespace: &str, function: &str) {
            let _ = self.seen.send(Seen::Prewarm {
                at: self.clock.now(),
                function: function.to_string(),
            });
        }
    }

    #[derive(Default)]
    struct FakeSink {
        states: Mutex<HashMap<Key, CronState>>,
        saves: Mutex<Option<mpsc::UnboundedSender<(String, CronState)>>>,
    }

    impl FakeSink {
        fn latest(&self, ns: &str, name: &str) -> Option<CronState> {
            self.states
                .lock()
                .expect("test lock")
                .get(&(ns.to_string(), name.to_string()))
                .cloned()
        }
    }

    #[async_trait]
    impl StateSink for FakeSink {
        async fn saved(&self, namespace: &str, name: &str, state: &CronState) {
            self.states
                .lock()
                .expect("test lock")
                .insert((namespace.to_string(), name.to_string()), state.clone());
            if let Some(tx) = self.saves.lock().expect("test lock").as_ref() {
                let _ = tx.send((name.to_string(), state.clone()));
            }
        }
    }

    struct Harness {
        sched: CronScheduler,
        clock: Arc<TokioClock>,
        seen: mpsc::UnboundedReceiver<Seen>,
        saves: mpsc::UnboundedReceiver<(String, CronState)>,
        shutdown: CancellationToken,
        driver: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("test timestamp is RFC 3339")
            .with_timezone(&Utc)
    }

    fn harness(base: &str, gate: Option<Arc<Semaphore>>) -> Harness {
        let clock = Arc::new(TokioClock {
            base: utc(base),
            start: tokio::time::Instant::now(),
        });
        let (seen_tx, seen) = mpsc::unbounded_channel();
        let (saves_tx, saves) = mpsc::unbounded_channel();
        let sink = Arc::new(FakeSink::default());
        *sink.saves.lock().expect("test lock") = Some(saves_tx);
        let fire = Arc::new(FakeFire {
            clock: Arc::clone(&clock),
            sink: Arc::clone(&sink),
            seen: seen_tx,
            gate,
        });
        let sched = CronScheduler::new(fire, sink, clock.clone(), SchedulerConfig::default());
        Harness {
            sched,
            clock,
            seen,
            saves,
            shutdown: CancellationToken::new(),
            driver: None,
        }
    }

    impl Harness {
        fn start(&mut self) {
            let source: Box<dyn TriggerSource> = Box::new(self.sched.clone());
            self.driver = Some(tokio::spawn(source.run(self.shutdown.clone())));
        }

        async fn next_seen(&mut self) -> Seen {
            self.seen.recv().await.expect("fake executor is alive")
        }

        /// The next fire, as (clock time it happened, the request).
        async fn next_fire(&mut self) -> (DateTime<Utc>, FireRequest) {
            match self.next_seen().await {
                Seen::Fire { at, req, .. } => (at, req),
                other => panic!("expected a fire, got {other:?}"),
            }
        }

        /// Waits for the next save of a state satisfying `pred`.
        async fn saved_where(&mut self, pred: impl Fn(&CronState) -> bool) -> CronState {
            loop {
                let (_, state) = self.saves.recv().await.expect("sink is alive");
                if pred(&state) {
                    return state;
                }
            }
        }

        /// Asserts that nothing reaches the executor for `secs` seconds of (paused) time.
        async fn assert_quiet_for(&mut self, secs: u64) {
            let got = tokio::time::timeout(Duration::from_secs(secs), self.seen.recv()).await;
            assert!(got.is_err(), "expected no activity, got {got:?}");
        }

        async fn stop(mut self) {
            self.shutdown.cancel();
            if let Some(driver) = self.driver.take() {
                driver
                    .await
                    .expect("driver task does not panic")
                    .expect("driver ends cleanly");
            }
        }
    }

    fn trigger(name: &str, expr: &str) -> CronTrigger {
        CronTrigger {
            namespace: "default".to_string(),
            name: name.to_string(),
            function: "hello".to_string(),
            schedule: Schedule::parse(expr, "UTC").expect("test schedule parses"),
            event: json!({"kind": "tick"}),
            enabled: true,
            prewarm_sec: 0,
            state: CronState::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn seconds_schedule_fires_three_times_in_three_seconds() {
        let mut h = harness("2025-01-01T10:00:00Z", None);
        let state = h.sched.upsert(trigger("tick", "* * * * * *"));
        assert_eq!(state.next_fire_at, Some(utc("2025-01-01T10:00:01Z")));
        h.start();
        for s in 1..=3 {
            let (at, req) = h.next_fire().await;
            let slot = utc(&format!("2025-01-01T10:00:0{s}Z"));
            assert_eq!(at, slot, "fire {s} happened at its slot");
            assert_eq!(req.fired_at, slot);
            assert_eq!(req.source, sless_core::invocation::InvocationSource::Cron);
            assert_eq!(req.trigger, "tick");
            assert_eq!(req.function, "hello");
            assert_eq!(
                req.event,
                json!({"kind": "tick", "fired_at": format!("2025-01-01T10:00:0{s}Z")})
            );
        }
        assert_eq!(h.clock.now(), utc("2025-01-01T10:00:03Z"));
        let state = h.saved_where(|s| s.last_result == Some(ok_200())).await;
        assert_eq!(state.last_fired_at, Some(utc("2025-01-01T10:00:01Z")));
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn state_is_persisted_before_each_fire() {
        let mut h = harness("2025-01-01T10:00:00Z", None);
        h.sched.upsert(trigger("tick", "*/2 * * * * *"));
        h.start();
        for _ in 0..3 {
            match h.next_seen().await {
                Seen::Fire {
                    req,
                    persisted_next,
                    ..
                } => {
                    let next = persisted_next.expect("a state was saved before the fire");
                    assert_eq!(next, req.fired_at + TimeDelta::seconds(2));
                }
                other => panic!("expected a fire, got {other:?}"),
            }
        }
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn disable_and_enable() {
        let mut h = harness("2025-01-01T10:00:00Z", None);
        h.start();
        h.sched.upsert(trigger("tick", "* * * * * *"));
        let (at, _) = h.next_fire().await;
        assert_eq!(at, utc("2025-01-01T10:00:01Z"));

        let state = h.sched.upsert(CronTrigger {
            enabled: false,
            ..trigger("tick", "* * * * * *")
        });
        assert_eq!(state.next_fire_at, None, "disabled shows no next fire");
        assert_eq!(state.last_fired_at, Some(utc("2025-01-01T10:00:01Z")));
        h.saved_where(|s| s.next_fire_at.is_none()).await;
        h.assert_quiet_for(10).await;

        let now = h.clock.now();
        let state = h.sched.upsert(trigger("tick", "* * * * * *"));
        let next = state.next_fire_at.expect("enabled has a next fire");
        assert!(
            next > now && next - now <= TimeDelta::seconds(1),
            "{next} after {now}"
        );
        assert!(
            state
                .last_result
                .as_ref()
                .is_none_or(|r| !matches!(r, TriggerResult::Missed { .. })),
            "the disabled time is not counted as missed: {state:?}"
        );
        let (at, _) = h.next_fire().await;
        assert_eq!(at, next);
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn overlapping_slot_is_skipped() {
        let gate = Arc::new(Semaphore::new(0));
        let mut h = harness("2025-01-01T10:00:00Z", Some(Arc::clone(&gate)));
        h.sched.upsert(trigger("slow", "* * * * * *"));
        h.start();
        let (at, _) = h.next_fire().await;
        assert_eq!(at, utc("2025-01-01T10:00:01Z"));

        // The run is held open; the 10:00:02 slot comes and is skipped.
        let state = h
            .saved_where(|s| s.last_result == Some(TriggerResult::SkippedOverlap))
            .await;
        assert_eq!(state.last_fired_at, Some(utc("2025-01-01T10:00:01Z")));
        assert_eq!(state.next_fire_at, Some(utc("2025-01-01T10:00:03Z")));
        assert_eq!(h.clock.now(), utc("2025-01-01T10:00:02Z"));

        // Finish the first run; the next slot fires again.
        gate.add_permits(1);
        h.saved_where(|s| s.last_result == Some(ok_200())).await;
        let (at, _) = h.next_fire().await;
        assert_eq!(at, utc("2025-01-01T10:00:03Z"));
        gate.add_permits(10);
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn prewarm_comes_before_the_fire() {
        let mut h = harness("2025-01-01T10:00:30Z", None);
        h.sched.upsert(CronTrigger {
            prewarm_sec: 10,
            ..trigger("warm", "0 * * * * *")
        });
        h.start();
        assert_eq!(
            h.next_seen().await,
            Seen::Prewarm {
                at: utc("2025-01-01T10:00:50Z"),
                function: "hello".to_string()
            }
        );
        let (at, _) = h.next_fire().await;
        assert_eq!(at, utc("2025-01-01T10:01:00Z"));
        // Exactly one prewarm per slot.
        assert_eq!(
            h.next_seen().await,
            Seen::Prewarm {
                at: utc("2025-01-01T10:01:50Z"),
                function: "hello".to_string()
            }
        );
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn restart_skips_missed_runs_and_fires_the_next() {
        let mut h = harness("2025-01-01T10:03:00Z", None);
        // Persisted before a 63-minute outage: 09:00 .. 10:00 are 7 slots of */10.
        let state = h.sched.upsert(CronTrigger {
            state: CronState {
                last_fired_at: Some(utc("2025-01-01T08:50:00Z")),
                next_fire_at: Some(utc("2025-01-01T09:00:00Z")),
                last_result: Some(ok_200()),
            },
            ..trigger("report", "*/10 * * * *")
        });
        assert_eq!(state.next_fire_at, Some(utc("2025-01-01T10:10:00Z")));
        assert_eq!(state.last_fired_at, Some(utc("2025-01-01T08:50:00Z")));
        assert_eq!(
            state
                .last_result
                .as_ref()
                .map(ToString::to_string)
                .as_deref(),
            Some("missed 7 run(s) while the server was down (last due 2025-01-01T10:00:00Z)")
        );
        let saved = h.saved_where(|_| true).await;
        assert_eq!(saved, state, "the missed note is persisted");

        h.start();
        let (at, req) = h.next_fire().await;
        assert_eq!(at, utc("2025-01-01T10:10:00Z"), "missed runs are not fired");
        assert_eq!(req.fired_at, at);
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn slot_within_late_grace_still_fires() {
        let mut h = harness("2025-01-01T10:00:03Z", None);
        let state = h.sched.upsert(CronTrigger {
            state: CronState {
                next_fire_at: Some(utc("2025-01-01T10:00:00Z")),
                ..CronState::default()
            },
            ..trigger("report", "*/10 * * * *")
        });
        assert_eq!(state.last_fired_at, Some(utc("2025-01-01T10:00:00Z")));
        assert_eq!(state.next_fire_at, Some(utc("2025-01-01T10:10:00Z")));
        let (at, req) = h.next_fire().await;
        assert_eq!(at, utc("2025-01-01T10:00:03Z"), "fired at once, 3 s late");
        assert_eq!(
            req.fired_at,
            utc("2025-01-01T10:00:00Z"),
            "with its slot time"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_double_fire_when_restarted_at_the_fire_instant() {
        // The previous process fired 10:00:01 and had persisted next_fire_at = 10:00:02 first;
        // the new one starts at that very instant with the persisted state.
        let mut h = harness("2025-01-01T10:00:01Z", None);
        let state = h.sched.upsert(CronTrigger {
            state: CronState {
                last_fired_at: Some(utc("2025-01-01T10:00:01Z")),
                next_fire_at: Some(utc("2025-01-01T10:00:02Z")),
                last_result: Some(TriggerResult::Running),
            },
            ..trigger("tick", "* * * * * *")
        });
        assert_eq!(state.next_fire_at, Some(utc("2025-01-01T10:00:02Z")));
        h.start();
        let (at, req) = h.next_fire().await;
        assert_eq!(at, utc("2025-01-01T10:00:02Z"));
        assert_eq!(req.fired_at, at, "10:00:01 was not fired again");
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn removed_trigger_stops_firing() {
        let mut h = harness("2025-01-01T10:00:00Z", None);
        h.start();
        h.sched.upsert(trigger("tick", "* * * * * *"));
        h.next_fire().await;
        assert!(h.sched.remove("default", "tick"));
        assert!(!h.sched.remove("default", "tick"));
        assert!(h.sched.state("default", "tick").is_none());
        h.assert_quiet_for(5).await;
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn changing_the_schedule_recomputes_next_fire() {
        let h = harness("2025-01-01T10:00:00Z", None);
        let state = h.sched.upsert(trigger("t", "0 * * * *"));
        assert_eq!(state.next_fire_at, Some(utc("2025-01-01T11:00:00Z")));
        // Same schedule, other event: next fire kept.
        let state = h.sched.upsert(CronTrigger {
            event: json!({"x": 1}),
            ..trigger("t", "0 * * * *")
        });
        assert_eq!(state.next_fire_at, Some(utc("2025-01-01T11:00:00Z")));
        let state = h.sched.upsert(trigger("t", "*/15 * * * *"));
        assert_eq!(state.next_fire_at, Some(utc("2025-01-01T10:15:00Z")));
        assert_eq!(h.sched.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn second_run_is_refused() {
        let mut h = harness("2025-01-01T10:00:00Z", None);
        h.sched.upsert(trigger("tick", "* * * * * *"));
        h.start();
        // Only the running driver can fire this slot, so after it the first run has begun.
        h.next_fire().await;
        let again: Box<dyn TriggerSource> = Box::new(h.sched.clone());
        assert_eq!(again.kind(), "cron");
        let err = again
            .run(CancellationToken::new())
            .await
            .expect_err("a second driver is refused");
        assert_eq!(err.to_string(), "the cron scheduler is already running");
        h.stop().await;
    }

    #[test]
    fn event_gets_fired_at() {
        let t = utc("2025-01-01T10:00:00Z");
        assert_eq!(
            cron_event(&json!({"a": 1, "fired_at": "old"}), t),
            json!({"a": 1, "fired_at": "2025-01-01T10:00:00Z"})
        );
        assert_eq!(
            cron_event(&Value::Null, t),
            json!({"fired_at": "2025-01-01T10:00:00Z"})
        );
        assert_eq!(
            cron_event(&json!([1, 2]), t),
            json!({"event": [1, 2], "fired_at": "2025-01-01T10:00:00Z"})
        );
    }
}
