//! Instance pools: the invoke path's engine.
//!
//! For every deployed function the executor keeps a [`pool::Pool`] of sandboxed
//! instances of its current revision. [`Executor::invoke`] picks a ready instance
//! with spare concurrency (starting one when none has room, up to
//! `max_instances`), forwards the event over the instance's Unix socket and
//! returns the answer. Deploying a new revision starts its instances before the
//! old ones are drained, so traffic never reaches stale code and no request drops.
//!
//! Invariant: nothing here touches the metadata store; the invoke path never
//! waits on control-plane work.

mod instance;
mod launcher;
mod liveness;
mod output;
mod pool;
pub mod quota;
mod warm;

#[cfg(test)]
mod fake;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use sless_core::{InstanceCounts, NetworkMode, RuntimeFamily};
use sless_logs::LogStore;
use sless_sandbox::Sandbox;

use crate::instance::SandboxLauncher;
pub use crate::liveness::{LIVENESS_FAILURES, LIVENESS_PERIOD};
use crate::pool::Pool;
use crate::warm::WarmPool;

/// The executor's pools, of sandboxed instances.
type SandboxPool = Pool<SandboxLauncher>;

/// Where things are and how long to wait for them.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Host directory holding `python/sless_runtime.py` and `node/sless_runtime.js`.
    pub runtime_dir: PathBuf,
    /// Host directory for per-instance socket directories.
    pub run_dir: PathBuf,
    pub python: PathBuf,
    pub node: PathBuf,
    /// How long an instance may take to load its code and answer the readiness check.
    pub start_timeout: Duration,
    /// How long a request may wait for an instance with room before `503`.
    pub queue_timeout: Duration,
    /// How many requests may wait per function before `503`.
    pub max_queue: usize,
    /// Process-count limit per instance.
    pub max_pids: u32,
    /// Generic instances kept pre-started per runtime family and network mode in use
    /// (0 disables the warm pool). `outbound` is kept from the start; another mode once
    /// a function with it has started.
    pub prewarm_per_runtime: usize,
    /// How long an instance must have been idle (no request in flight) before it is
    /// frozen: its processes get no CPU until the next request thaws it. Checked once a
    /// second; `None` never freezes.
    pub freeze_after: Option<Duration>,
    /// While an instance has requests in flight and none has been answered for this
    /// long, it is asked `GET /_sless/ready` once per period; after
    /// [`LIVENESS_FAILURES`] checks in a row go unanswered its serving loop counts as
    /// stopped (see `liveness`). `None` never checks.
    pub liveness_period: Option<Duration>,
    /// Host directory on a memory-backed filesystem (e.g. under `/dev/shm`) for the
    /// files of the secrets instances read: `<dir>/<instance>/{secret}/{key}`, bind-mounted
    /// read-only at `/run/secrets`, removed when the instance stops. `None`: no
    /// `/run/secrets` (a deployment with secret files then fails to start).
    pub secrets_dir: Option<PathBuf>,
}

/// CPU limit of an instance when nothing else says: the function spec's default.
pub use sless_core::function::DEFAULT_CPU_MILLICORES;

/// The default of [`ExecutorConfig::freeze_after`].
pub const FREEZE_AFTER: Duration = Duration::from_secs(1);

/// One revision of a function, as the executor runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    pub namespace: String,
    pub name: String,
    pub revision: u64,
    pub family: RuntimeFamily,
    pub entrypoint: String,
    pub env: BTreeMap<String, String>,
    pub memory_mb: u32,
    /// CPU limit per instance, in thousandths of a CPU.
    pub cpu: u32,
    pub timeout_sec: u32,
    pub min_instances: u32,
    pub max_instances: u32,
    pub concurrency: u32,
    pub idle_timeout_sec: u32,
    pub paused: bool,
    /// `/fn/` requires a token of the function's namespace.
    pub private: bool,
    /// What its instances may reach over the network.
    pub network: NetworkMode,
    pub code_dir: PathBuf,
    pub deps_dir: Option<PathBuf>,
    /// Environment variables whose values come from secrets (their `Debug` is redacted).
    pub secret_env: BTreeMap<String, sless_core::secret::Sensitive>,
    /// Every key of every secret the function references: secret → key → value, the
    /// files of `/run/secrets/{secret}/{key}`.
    pub secret_files: BTreeMap<String, BTreeMap<String, sless_core::secret::Sensitive>>,
    /// Changes whenever one of those secrets is replaced (empty without secrets).
    pub secrets_digest: String,
}

/// Why a deployment could not be made to serve.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// An instance of the new revision did not become ready; the message says why
    /// (its exit and the last lines it printed).
    #[error("{0}")]
    InstanceFailed(String),
    /// The function was removed or the executor is shutting down meanwhile.
    #[error("deployment was cancelled")]
    Cancelled,
}

/// What a caller hands to [`Executor::invoke`].
#[derive(Debug, Clone)]
pub struct InvokeRequest {
    /// The event, already encoded as JSON.
    pub event: Bytes,
    pub request_id: String,
    /// What started the invocation (sent to the instance as `X-Sless-Source`).
    pub source: sless_core::invocation::InvocationSource,
    /// A delivered message's `context.message`, as ASCII JSON (sent to the instance as
    /// `X-Sless-Message`); `None` for calls that are no delivery.
    pub message: Option<Bytes>,
}

/// The handler's answer.
#[derive(Debug, Clone)]
pub struct InvokeResponse {
    /// `true`: `body` is the return value as JSON; `false`: `body` is `{"error": ...}`.
    pub ok: bool,
    pub body: Bytes,
    /// The request had to wait for a new instance to start.
    pub cold_start: bool,
    pub revision: u64,
}

/// Why an invocation got no answer from the handler.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    /// No such function is deployed.
    #[error("function not found")]
    NotFound,
    /// The function is paused.
    #[error("function {0} is paused")]
    Paused(String),
    /// No instance could take the request in time, or the queue is full.
    #[error("{0}")]
    Unavailable(String),
    /// The handler ran past `timeout_sec`.
    #[error("function {name} timed out after {seconds} s")]
    Timeout { name: String, seconds: u32 },
    /// The instance failed without answering (crashed, was killed, broke the protocol).
    #[error("{0}")]
    InstanceFailed(String),
    /// Over one of the namespace's quotas (`429 quota_exceeded`): the invocation
    /// rate, or the instances or memory a new instance would need.
    #[error("{}", .0.exceeded)]
    QuotaExceeded(quota::Refusal),
}

/// All pools.
pub struct Executor {
    cfg: Arc<ExecutorConfig>,
    launcher: Arc<SandboxLauncher>,
    logs: Arc<LogStore>,
    /// Namespace → function → pool; nested so lookups by `&str` allocate nothing.
    pools: RwLock<HashMap<String, HashMap<String, Arc<SandboxPool>>>>,
    next_instance: Arc<AtomicU64>,
    warm: Option<Arc<WarmPool<SandboxLauncher>>>,
    /// Per-namespace quotas: instances, memory, invocation rate.
    quotas: Arc<quota::Quotas>,
}

impl Executor {
    pub fn new(
        cfg: ExecutorConfig,
        sandbox: Arc<Sandbox>,
        logs: Arc<LogStore>,
    ) -> std::io::Result<Arc<Self>> {
        // Instance directories of an earlier run are stale: their processes are gone.
        if cfg.run_dir.exists() {
            std::fs::remove_dir_all(&cfg.run_dir)?;
        }
        std::fs::create_dir_all(&cfg.run_dir)?;
        if let Some(dir) = &cfg.secrets_dir {
            // The server's alone; each instance's directory in it belongs to the sandbox user.
            use std::os::unix::fs::PermissionsExt;
            if dir.exists() {
                std::fs::remove_dir_all(dir)?;
            }
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let cfg = Arc::new(cfg);
        let next_instance = Arc::new(AtomicU64::new(1));
        let launcher = Arc::new(SandboxLauncher {
            cfg: cfg.clone(),
            sandbox,
        });
        let warm = (cfg.prewarm_per_runtime > 0).then(|| {
            WarmPool::new(
                launcher.clone(),
                next_instance.clone(),
                cfg.prewarm_per_runtime,
            )
        });
        let executor = Arc::new(Self {
            cfg,
            launcher,
            logs,
            pools: RwLock::new(HashMap::new()),
            next_instance,
            warm,
            quotas: Arc::new(quota::Quotas::default()),
        });
        // The reaper holds only a weak reference, so dropping the executor ends it.
        let weak = Arc::downgrade(&executor);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(executor) = weak.upgrade() else {
                    break;
                };
                for pool in executor.all_pools() {
                    pool.reap_idle();
                    pool.freeze_idle();
                }
            }
        });
        Ok(executor)
    }

    fn pool(&self, namespace: &str, name: &str) -> Option<Arc<SandboxPool>> {
        let pools = self.pools.read().unwrap_or_else(|e| e.into_inner());
        pools.get(namespace)?.get(name).cloned()
    }

    fn all_pools(&self) -> Vec<Arc<SandboxPool>> {
        self.pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .flat_map(|fns| fns.values().cloned())
            .collect()
    }

    /// Makes `deployment` the revision that serves its function. With
    /// `min_instances > 0` it returns once that many instances of it are ready and
    /// the old revision's instances are draining; a revision whose instances cannot
    /// start is not switched to, and the old one keeps serving.
    pub async fn deploy(&self, deployment: Deployment) -> Result<(), DeployError> {
        let pool = {
            let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
            pools
                .entry(deployment.namespace.clone())
                .or_default()
                .entry(deployment.name.clone())
                .or_insert_with(|| {
                    Pool::new(
                        self.cfg.clone(),
                        self.launcher.clone(),
                        self.logs.sink(&deployment.namespace, &deployment.name),
                        self.next_instance.clone(),
                        self.warm.clone(),
                        deployment.clone(),
                        self.quotas.account(&deployment.namespace),
                    )
                })
                .clone()
        };
        pool.deploy(deployment).await
    }

    /// The per-namespace quotas the invoke path enforces; the control plane sets
    /// their limits, and features counting usage elsewhere call [`quota::Quotas::check`].
    pub fn quotas(&self) -> &Arc<quota::Quotas> {
        &self.quotas
    }

    /// Whether a function is deployed here.
    pub fn is_deployed(&self, namespace: &str, name: &str) -> bool {
        self.pool(namespace, name).is_some()
    }

    /// The revision a function currently runs, as deployed.
    pub fn deployment(&self, namespace: &str, name: &str) -> Option<Deployment> {
        self.pool(namespace, name).map(|p| p.deployment())
    }

    /// Whether a deployed function is private (`None`: not deployed).
    pub fn is_private(&self, namespace: &str, name: &str) -> Option<bool> {
        self.pool(namespace, name).map(|p| p.is_private())
    }

    /// Stops serving a function: from now on it is unknown; its instances finish
    /// what they are doing and stop.
    pub fn remove(&self, namespace: &str, name: &str) {
        let pool = {
            let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
            let pool = pools.get_mut(namespace).and_then(|fns| fns.remove(name));
            if pools.get(namespace).is_some_and(HashMap::is_empty) {
                pools.remove(namespace);
            }
            pool
        };
        if let Some(pool) = pool {
            pool.close();
        }
    }

    /// Instance counts of a function's current revision.
    pub fn counts(&self, namespace: &str, name: &str) -> InstanceCounts {
        self.pool(namespace, name)
            .map(|p| p.counts())
            .unwrap_or_default()
    }

    /// The latest problem a function's instances had (crash, OOM kill), if any
    /// since its current revision was deployed.
    pub fn last_error(&self, namespace: &str, name: &str) -> Option<String> {
        self.pool(namespace, name).and_then(|p| p.last_error())
    }

    /// Sends one event to the function and waits for the handler's answer.
    pub async fn invoke(
        &self,
        namespace: &str,
        name: &str,
        request: InvokeRequest,
    ) -> Result<InvokeResponse, InvokeError> {
        self.invoke_metered(namespace, name, request).await.0
    }

    /// [`Executor::invoke`], also giving the function's invocation series (`None`
    /// when no pool serves it) so the caller records the outcome without looking
    /// them up.
    pub async fn invoke_metered(
        &self,
        namespace: &str,
        name: &str,
        request: InvokeRequest,
    ) -> (
        Result<InvokeResponse, InvokeError>,
        Option<Arc<sless_metrics::FunctionMetrics>>,
    ) {
        let Some(pool) = self.pool(namespace, name) else {
            return (Err(InvokeError::NotFound), None);
        };
        let metrics = pool.metrics().clone();
        if let Err(refusal) = pool.account().admit_call() {
            return (Err(InvokeError::QuotaExceeded(refusal)), Some(metrics));
        }
        (pool.invoke(request).await, Some(metrics))
    }

    /// Instances of every function by state, and the warm pool's generic ones:
    /// `(ready, starting, warm)`.
    pub fn instance_totals(&self) -> (u64, u64, u64) {
        let (mut ready, mut starting) = (0u64, 0u64);
        for pool in self.all_pools() {
            let c = pool.counts();
            ready += u64::from(c.ready);
            starting += u64::from(c.starting);
        }
        let warm = self.warm.as_ref().map_or(0, |w| w.idle() as u64);
        (ready, starting, warm)
    }

    /// Resolves once everything a function's instances wrote to stdout and stderr
    /// before this call is in its log: each of their output pipes was found empty
    /// (or closed) after the call began. The shims put a request's output in the
    /// pipes before answering it, so called after an answer arrived, every line of
    /// that request is in the log when this resolves with `true`; `false` means
    /// `limit` passed first (an instance kept its pipes busy). A function that is
    /// not deployed has nothing to wait for.
    pub async fn output_settled(&self, namespace: &str, name: &str, limit: Duration) -> bool {
        match self.pool(namespace, name) {
            Some(pool) => pool.output_settled(limit).await,
            None => true,
        }
    }

    /// Starts an instance of a function ahead of expected traffic, unless it has one.
    pub fn prewarm(&self, namespace: &str, name: &str) {
        if let Some(pool) = self.pool(namespace, name) {
            pool.prewarm();
        }
    }

    /// Stops every instance, letting in-flight requests finish for up to `grace`.
    pub async fn shutdown(&self, grace: Duration) {
        if let Some(warm) = &self.warm {
            warm.close();
        }
        let pools: Vec<_> = self
            .pools
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .flat_map(|(_, fns)| fns.into_values())
            .collect();
        for pool in &pools {
            pool.close();
        }
        let deadline = tokio::time::Instant::now() + grace;
        for pool in &pools {
            pool.wait_stopped(deadline).await;
        }
    }
}
