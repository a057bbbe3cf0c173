//! Per-namespace quotas on the invoke path: the instances and memory a
//! namespace's pools hold, the rate of its invocations, and [`Quotas::check`] for
//! counts kept elsewhere (queued calls, devices).
//!
//! The control plane pushes each namespace's limits in ([`Quotas::set`]); nothing
//! here reads the metadata store. Counters are atomics reserved with a
//! compare-and-swap loop, so two starts racing for the last unit never both get it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sless_core::{Quota, QuotaExceeded, QuotaKind};
use tokio::time::Instant;

/// A refused invocation: over a quota, with how long to wait when waiting helps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub exceeded: QuotaExceeded,
    /// Whole seconds until a retry may succeed (rate limits only).
    pub retry_after: Option<u64>,
}

/// What a namespace uses now, as the executor sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub instances: u64,
    pub memory_mb: u64,
    /// Invocations admitted during the last whole second.
    pub invocations_per_sec: u64,
}

/// Every namespace's limits and counters.
#[derive(Debug)]
pub struct Quotas {
    default: RwLock<Quota>,
    accounts: RwLock<HashMap<String, Arc<Account>>>,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas::new(Quota::default())
    }
}

impl Quotas {
    pub fn new(default: Quota) -> Self {
        Quotas {
            default: RwLock::new(default),
            accounts: RwLock::new(HashMap::new()),
        }
    }

    /// The limits of namespaces that have no quota of their own (set at start).
    pub fn set_default(&self, quota: Quota) {
        *self.default.write().unwrap_or_else(|e| e.into_inner()) = quota;
    }

    /// The limits in force for `namespace` from now on.
    pub fn set(&self, namespace: &str, quota: Quota) {
        self.account(namespace).set(quota);
    }

    /// The account of `namespace`, made with the default limits when new.
    pub fn account(&self, namespace: &str) -> Arc<Account> {
        if let Some(a) = self
            .accounts
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(namespace)
        {
            return a.clone();
        }
        let default = *self.default.read().unwrap_or_else(|e| e.into_inner());
        self.accounts
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(namespace.to_string())
            .or_insert_with(|| Arc::new(Account::new(default)))
            .clone()
    }

    /// What `namespace` uses now.
    pub fn usage(&self, namespace: &str) -> Usage {
        self.account(namespace).usage()
    }

    /// The limits in force for `namespace`.
    pub fn quota(&self, namespace: &str) -> Quota {
        self.account(namespace).quota()
    }

    /// Whether one more unit of `kind` fits next to `current_usage` (counted by
    /// the caller) in `namespace`: `Err` names the quota, its limit and the usage.
    /// For the features whose counts live outside the executor (queued calls,
    /// devices), which call this before adding one.
    pub fn check(
        &self,
        namespace: &str,
        kind: QuotaKind,
        current_usage: u64,
    ) -> Result<(), QuotaExceeded> {
        self.quota(namespace).check(kind, current_usage)
    }
}

/// One namespace: its limits, the instances and memory its pools hold, its rate limiter.
#[derive(Debug)]
pub struct Account {
    quota: RwLock<Quota>,
    instances: AtomicU64,
    memory_mb: AtomicU64,
    rate: Mutex<Rate>,
}

impl Account {
    fn new(quota: Quota) -> Self {
        Account {
            quota: RwLock::new(quota),
            instances: AtomicU64::new(0),
            memory_mb: AtomicU64::new(0),
            rate: Mutex::new(Rate::new(quota.invocations_per_sec)),
        }
    }

    /// An account with the default limits, for pools made outside an executor.
    #[cfg(test)]
    pub(crate) fn unlimited() -> Arc<Self> {
        Arc::new(Account::new(Quota {
            instances: u64::MAX,
            memory_mb: u64::MAX,
            invocations_per_sec: u64::MAX / 2,
            ..Quota::default()
        }))
    }

    fn set(&self, quota: Quota) {
        *self.quota.write().unwrap_or_else(|e| e.into_inner()) = quota;
        self.rate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set_rate(quota.invocations_per_sec);
    }

    pub fn quota(&self) -> Quota {
        *self.quota.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn usage(&self) -> Usage {
        Usage {
            instances: self.instances.load(Ordering::Acquire),
            memory_mb: self.memory_mb.load(Ordering::Acquire),
            invocations_per_sec: self
                .rate
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .last_second(Instant::now()),
        }
    }

    /// Admits one invocation, or refuses it with the time until one would be admitted.
    pub fn admit_call(&self) -> Result<(), Refusal> {
        let limit = self.quota().invocations_per_sec;
        self.rate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(Instant::now())
            .map_err(|(used, wait)| Refusal {
                exceeded: QuotaExceeded {
                    kind: QuotaKind::InvocationsPerSec,
                    limit,
                    used,
                },
                retry_after: Some(wait.as_secs_f64().ceil().max(1.0) as u64),
            })
    }

    /// Reserves one instance of `memory_mb` if both fit the quotas.
    pub fn reserve(self: &Arc<Self>, memory_mb: u64) -> Result<Reservation, QuotaExceeded> {
        let quota = self.quota();
        take(&self.instances, 1, quota.instances, QuotaKind::Instances)?;
        if let Err(e) = take(
            &self.memory_mb,
            memory_mb,
            quota.memory_mb,
            QuotaKind::MemoryMb,
        ) {
            self.instances.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
        Ok(Reservation {
            account: self.clone(),
            memory_mb,
        })
    }

    /// Counts one instance of `memory_mb` whatever the quotas say: replacements and
    /// rollouts of what was admitted already.
    pub fn force(self: &Arc<Self>, memory_mb: u64) -> Reservation {
        self.instances.fetch_add(1, Ordering::AcqRel);
        self.memory_mb.fetch_add(memory_mb, Ordering::AcqRel);
        Reservation {
            account: self.clone(),
            memory_mb,
        }
    }
}

/// Adds `n` to `counter` unless that takes it over `limit`.
fn take(counter: &AtomicU64, n: u64, limit: u64, kind: QuotaKind) -> Result<(), QuotaExceeded> {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(n).filter(|after| *after <= limit)
        })
        .map(|_| ())
        .map_err(|used| QuotaExceeded { kind, limit, used })
}

/// One instance counted against its namespace's quotas until dropped (when the
/// instance has exited, or its start failed).
#[derive(Debug)]
pub struct Reservation {
    account: Arc<Account>,
    memory_mb: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.account.instances.fetch_sub(1, Ordering::AcqRel);
        self.account
            .memory_mb
            .fetch_sub(self.memory_mb, Ordering::AcqRel);
    }
}

/// A GCRA limiter (a token bucket kept as one time stamp): `per_sec` calls a
/// second on average, bursts of up to one second's worth.
#[derive(Debug)]
struct Rate {
    per_sec: u64,
    /// When the bucket would be empty again (the theoretical arrival time).
    tat: Option<Instant>,
    /// Calls admitted in the current window, and the last full window's count.
    window: (Option<Instant>, u64, u64),
}

impl Rate {
    fn new(per_sec: u64) -> Self {
        Rate {
            per_sec,
            tat: None,
            window: (None, 0, 0),
        }
    }

    fn set_rate(&mut self, per_sec: u64) {
        if per_sec != self.per_sec {
            self.per_sec = per_sec;
            self.tat = None;
        }
    }

    /// Admits a call at `now`, or says how many were admitted in the last second
    /// and how long until the next would be.
    fn admit(&mut self, now: Instant) -> Result<(), (u64, Duration)> {
        if self.per_sec == 0 {
            return Err((self.last_second(now), Duration::from_secs(1)));
        }
        let interval = Duration::from_secs(1) / u32::try_from(self.per_sec).unwrap_or(u32::MAX);
        let burst = Duration::from_secs(1);
        let tat = self.tat.map_or(now, |t| t.max(now));
        let next = tat + interval.max(Duration::from_nanos(1));
        // Full when the bucket would hold more than one second's worth.
        if next > now + burst {
            return Err((self.last_second(now), next - (now + burst)));
        }
        self.tat = Some(next);
        self.count(now);
        Ok(())
    }

    fn roll(&mut self, now: Instant) {
        let (start, count, _) = self.window;
        match start {
            Some(s) if now.duration_since(s) < Duration::from_secs(1) => {}
            Some(s) if now.duration_since(s) < Duration::from_secs(2) => {
                self.window = (Some(s + Duration::from_secs(1)), 0, count);
            }
            _ => self.window = (Some(now), 0, 0),
        }
    }

    fn count(&mut self, now: Instant) {
        self.roll(now);
        self.window.1 += 1;
    }

    /// Calls admitted in the current or, if more, the last full second.
    fn last_second(&mut self, now: Instant) -> u64 {
        self.roll(now);
        self.window.1.max(self.window.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(q: Quota) -> Quotas {
        Quotas::new(q)
    }

    #[tokio::test(start_paused = true)]
    async fn the_limiter_allows_a_second_s_burst_then_the_rate() {
        let q = quotas(Quota {
            invocations_per_sec: 5,
            ..Quota::default()
        });
        let a = q.account("a");
        for i in 0..5 {
            assert!(a.admit_call().is_ok(), "call {i} of the burst");
        }
        let refused = a.admit_call().unwrap_err();
        assert_eq!(refused.exceeded.kind, QuotaKind::InvocationsPerSec);
        assert_eq!(refused.exceeded.limit, 5);
        assert_eq!(refused.exceeded.used, 5);
        assert_eq!(refused.retry_after, Some(1));
        assert_eq!(
            refused.exceeded.to_string(),
            "quota exceeded: invocations_per_sec 5 of 5 in use"
        );
        // Another namespace is not affected.
        assert!(q.account("b").admit_call().is_ok());
        // One interval later one more call fits, and only one.
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(a.admit_call().is_ok());
        assert!(a.admit_call().is_err());
        // After a quiet second the whole burst is back.
        tokio::time::advance(Duration::from_secs(2)).await;
        for _ in 0..5 {
            assert!(a.admit_call().is_ok());
        }
        assert!(a.admit_call().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_sustained_rate_is_held_to_the_limit() {
        let q = quotas(Quota {
            invocations_per_sec: 10,
            ..Quota::default()
        });
        let a = q.account("a");
        let mut admitted = 0;
        // 100 calls a second for 10 seconds.
        for _ in 0..1000 {
            if a.admit_call().is_ok() {
                admitted += 1;
            }
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        // 10 a second plus the initial burst of 10.
        assert!((100..=111).contains(&admitted), "{admitted}");
        assert!(q.usage("a").invocations_per_sec <= 11);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_rate_refuses_and_a_new_limit_applies_at_once() {
        let q = quotas(Quota {
            invocations_per_sec: 0,
            ..Quota::default()
        });
        assert!(q.account("a").admit_call().is_err());
        q.set(
            "a",
            Quota {
                invocations_per_sec: 1,
                ..Quota::default()
            },
        );
        assert!(q.account("a").admit_call().is_ok());
    }

    #[test]
    fn reservations_stop_at_the_quota_and_are_returned_on_drop() {
        let q = Quotas::default();
        q.set(
            "a",
            Quota {
                instances: 2,
                memory_mb: 300,
                ..Quota::default()
            },
        );
        let a = q.account("a");
        let one = a.reserve(128).unwrap();
        let e = a.reserve(256).unwrap_err();
        assert_eq!(e.to_string(), "quota exceeded: memory_mb 128 of 300 in use");
        let two = a.reserve(128).unwrap();
        let e = a.reserve(1).unwrap_err();
        assert_eq!(e.to_string(), "quota exceeded: instances 2 of 2 in use");
        assert_eq!(
            q.usage("a"),
            Usage {
                instances: 2,
                memory_mb: 256,
                invocations_per_sec: 0
            }
        );
        assert_eq!(q.usage("b").instances, 0, "namespaces are counted apart");
        drop(one);
        let _forced = a.force(128);
        assert!(a.reserve(1).is_err(), "forced instances count");
        drop(two);
        assert_eq!(q.usage("a").instances, 1);
    }

    #[test]
    fn racing_reservations_never_pass_the_limit() {
        let q = Arc::new(Quotas::default());
        q.set(
            "a",
            Quota {
                instances: 3,
                ..Quota::default()
            },
        );
        let held = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (q, held) = (q.clone(), held.clone());
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        if let Ok(r) = q.account("a").reserve(1) {
                            held.lock().unwrap().push(r);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(held.lock().unwrap().len(), 3);
        assert_eq!(q.usage("a").instances, 3);
    }

    #[test]
    fn check_serves_the_kinds_counted_elsewhere() {
        let q = Quotas::default();
        q.set(
            "a",
            Quota {
                queued_calls: 2,
                devices: 1,
                ..Quota::default()
            },
        );
        assert!(q.check("a", QuotaKind::QueuedCalls, 1).is_ok());
        let e = q.check("a", QuotaKind::QueuedCalls, 2).unwrap_err();
        assert_eq!(e.to_string(), "quota exceeded: queued_calls 2 of 2 in use");
        assert!(q.check("a", QuotaKind::Devices, 1).is_err());
        assert!(q.check("b", QuotaKind::Devices, 1).is_ok(), "defaults");
    }
}
