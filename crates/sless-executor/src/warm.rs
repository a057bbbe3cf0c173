//! Pre-started generic instances, one small pool per runtime family.
//!
//! A cold start is mostly the sandbox, the interpreter and the shim starting. A
//! generic instance has done all of that ahead of time; taking one for a function
//! costs linking the function's files into its code directory and importing the
//! user's module. The pool refills itself in the background.
//!
//! Instances differ by network mode (an outbound one has its namespace connected
//! before its interpreter starts), so pools are per (runtime family, network mode):
//! the default `outbound` ones fill at start, another mode's on its first use.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sless_core::{Backoff, NetworkMode, RuntimeFamily};

use crate::launcher::{Instance, Launcher};

/// Retries of a kind whose generic instances fail to start: 400 ms, doubling, at most a minute.
const REFILL_BACKOFF: Backoff = Backoff::new(Duration::from_millis(400), Duration::from_secs(60));

pub(crate) struct WarmPool<L: Launcher> {
    launcher: Arc<L>,
    counter: Arc<AtomicU64>,
    target: usize,
    state: Mutex<WarmState<L::Instance>>,
    me: Weak<WarmPool<L>>,
}

/// What makes generic instances interchangeable.
type Kind = (RuntimeFamily, NetworkMode);

struct WarmState<I> {
    idle: HashMap<Kind, Vec<Arc<I>>>,
    starting: HashMap<Kind, usize>,
    /// Consecutive failed starts per kind, for back-off.
    failures: HashMap<Kind, u32>,
    closed: bool,
}

impl<I> Default for WarmState<I> {
    fn default() -> Self {
        Self {
            idle: HashMap::new(),
            starting: HashMap::new(),
            failures: HashMap::new(),
            closed: false,
        }
    }
}

impl<L: Launcher> WarmPool<L> {
    pub fn new(launcher: Arc<L>, counter: Arc<AtomicU64>, target: usize) -> Arc<Self> {
        let pool = Arc::new_cyclic(|me| WarmPool {
            launcher,
            counter,
            target,
            state: Mutex::new(WarmState::default()),
            me: me.clone(),
        });
        for family in [RuntimeFamily::Python3, RuntimeFamily::Nodejs] {
            pool.refill((family, NetworkMode::default()));
        }
        pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WarmState<L::Instance>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A live generic instance of `family` with `network`, if one is ready.
    pub fn take(&self, family: RuntimeFamily, network: NetworkMode) -> Option<Arc<L::Instance>> {
        // A Go function is its own binary and a custom runtime its own executable: no
        // generic process can become one (see ARCHITECTURE.md, "Warm pool").
        if matches!(family, RuntimeFamily::Go | RuntimeFamily::Custom) {
            return None;
        }
        let kind = (family, network);
        let taken = {
            let mut st = self.lock();
            let idle = st.idle.entry(kind).or_default();
            let mut taken = None;
            while let Some(instance) = idle.pop() {
                if instance.is_dead() {
                    instance.cleanup();
                    continue;
                }
                taken = Some(instance);
                break;
            }
            taken
        };
        self.refill(kind);
        taken
    }

    /// Starts generic instances until `target` are idle or starting.
    fn refill(&self, kind: Kind) {
        if self.target == 0 {
            return;
        }
        let mut st = self.lock();
        if st.closed {
            return;
        }
        let have =
            st.idle.get(&kind).map_or(0, Vec::len) + st.starting.get(&kind).copied().unwrap_or(0);
        let failures = st.failures.get(&kind).copied().unwrap_or(0);
        for _ in have..self.target {
            *st.starting.entry(kind).or_default() += 1;
            let Some(pool) = self.me.upgrade() else {
                return;
            };
            let id = format!("g{}", self.counter.fetch_add(1, Ordering::Relaxed));
            let delay = REFILL_BACKOFF.delay(failures);
            tokio::spawn(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let (family, network) = kind;
                let started = pool.launcher.start_generic(family, network, id).await;
                let mut st = pool.lock();
                *st.starting.entry(kind).or_default() -= 1;
                match started {
                    Ok(instance) if !st.closed => {
                        st.failures.remove(&kind);
                        st.idle.entry(kind).or_default().push(instance);
                    }
                    Ok(instance) => {
                        instance.kill();
                        instance.cleanup();
                    }
                    Err(e) => {
                        tracing::warn!(runtime = family.as_str(), network = network.as_str(), error = %e, "cannot pre-start a generic instance");
                        *st.failures.entry(kind).or_default() += 1;
                        drop(st);
                        pool.refill(kind);
                    }
                }
            });
        }
    }

    /// Stops every idle generic instance and starts no more.
    /// Generic instances ready to be taken.
    pub fn idle(&self) -> usize {
        self.lock().idle.values().map(Vec::len).sum()
    }

    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        for (_, idle) in st.idle.drain() {
            for instance in idle {
                instance.kill();
                instance.cleanup();
            }
        }
    }
}
