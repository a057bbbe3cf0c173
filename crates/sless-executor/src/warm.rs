//! Pre-started generic instances, one small pool per runtime family.
//!
//! A cold start is mostly the sandbox, the interpreter and the shim starting. A
//! generic instance has done all of that ahead of time; taking one for a function
//! costs linking the function's files into its code directory and importing the
//! user's module. The pool refills itself in the background.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sless_core::RuntimeFamily;
use sless_sandbox::Sandbox;

use crate::ExecutorConfig;
use crate::instance::Instance;

pub(crate) struct WarmPool {
    cfg: Arc<ExecutorConfig>,
    sandbox: Arc<Sandbox>,
    counter: Arc<AtomicU64>,
    target: usize,
    state: Mutex<WarmState>,
    me: Weak<WarmPool>,
}

#[derive(Default)]
struct WarmState {
    idle: HashMap<RuntimeFamily, Vec<Arc<Instance>>>,
    starting: HashMap<RuntimeFamily, usize>,
    /// Consecutive failed starts per family, for back-off.
    failures: HashMap<RuntimeFamily, u32>,
    closed: bool,
}

impl WarmPool {
    pub fn new(
        cfg: Arc<ExecutorConfig>,
        sandbox: Arc<Sandbox>,
        counter: Arc<AtomicU64>,
        target: usize,
    ) -> Arc<Self> {
        let pool = Arc::new_cyclic(|me| WarmPool {
            cfg,
            sandbox,
            counter,
            target,
            state: Mutex::new(WarmState::default()),
            me: me.clone(),
        });
        for family in [RuntimeFamily::Python3, RuntimeFamily::Nodejs] {
            pool.refill(family);
        }
        pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WarmState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A live generic instance of `family`, if one is ready.
    pub fn take(&self, family: RuntimeFamily) -> Option<Arc<Instance>> {
        let taken = {
            let mut st = self.lock();
            let idle = st.idle.entry(family).or_default();
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
        self.refill(family);
        taken
    }

    /// Starts generic instances until `target` are idle or starting.
    fn refill(&self, family: RuntimeFamily) {
        if self.target == 0 {
            return;
        }
        let mut st = self.lock();
        if st.closed {
            return;
        }
        let have = st.idle.get(&family).map_or(0, Vec::len)
            + st.starting.get(&family).copied().unwrap_or(0);
        let failures = st.failures.get(&family).copied().unwrap_or(0);
        for _ in have..self.target {
            *st.starting.entry(family).or_default() += 1;
            let Some(pool) = self.me.upgrade() else {
                return;
            };
            let id = format!("g{}", self.counter.fetch_add(1, Ordering::Relaxed));
            let delay = if failures == 0 {
                Duration::ZERO
            } else {
                (Duration::from_millis(200) * 2u32.saturating_pow(failures.min(10)))
                    .min(Duration::from_secs(60))
            };
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let started = Instance::start_generic(&pool.cfg, &pool.sandbox, family, id).await;
                let mut st = pool.lock();
                *st.starting.entry(family).or_default() -= 1;
                match started {
                    Ok(instance) if !st.closed => {
                        st.failures.remove(&family);
                        st.idle.entry(family).or_default().push(instance);
                    }
                    Ok(instance) => {
                        instance.kill();
                        instance.cleanup();
                    }
                    Err(e) => {
                        tracing::warn!(runtime = family.as_str(), error = %e, "cannot pre-start a generic instance");
                        *st.failures.entry(family).or_default() += 1;
                        drop(st);
                        pool.refill(family);
                    }
                }
            });
        }
    }

    /// Stops every idle generic instance and starts no more.
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
