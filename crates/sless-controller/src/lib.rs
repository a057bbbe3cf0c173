//! The controller: makes what runs match what is stored.
//!
//! Level-triggered and idempotent, in the manner of a Kubernetes controller:
//! [`Controller::enqueue`] asks for a function to be reconciled; [`reconcile`]
//! reads the function's latest record, builds its code if needed (the builder is
//! content-addressed, so unchanged code is not rebuilt), hands the result to the
//! executor and writes the status back. Running it twice changes nothing.
//! Reconciles of one function are serialised; of different functions they run
//! in parallel (builds are bounded by the builder).
//!
//! [`gc`] collects the code, builds and dependencies nothing uses any more, and
//! answers how much storage a namespace's code takes.

pub mod gc;
pub mod jobs;
pub mod triggers;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use chrono::Utc;
use sless_blob::BlobError;
use sless_blob::BlobStore;
use sless_build::{BuildError, BuildRequest, Builder};
use sless_core::{FunctionStatus, Phase};
use sless_executor::{Deployment, Executor};
use sless_gateway::{FailedFunctions, Failure};
use sless_logs::LogStore;
use sless_store::{FunctionRecord, Store, StoreError};

type Key = (String, String);

/// One built revision's inputs on disk: its archive and its build directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BuildRef {
    pub code_sha256: String,
    pub build_key: String,
}

/// What a function's pool runs and ran just before (its old instances may
/// still be draining), so a collection never takes either.
#[derive(Debug, Clone, Default)]
struct Served {
    current: Option<BuildRef>,
    previous: Option<BuildRef>,
}

/// What reconciling needs.
pub struct Controller {
    store: Arc<dyn Store>,
    blobs: Arc<dyn BlobStore>,
    builder: Arc<Builder>,
    executor: Arc<Executor>,
    logs: Arc<LogStore>,
    /// Base of every function URL, e.g. `http://127.0.0.1:8080`.
    public_url: String,
    /// One lock per function so its reconciles never overlap.
    locks: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
    /// The revision each function's executor pool runs, as deployed by us.
    deployed: Mutex<HashMap<Key, u64>>,
    /// The builds each function's pool runs and ran (see [`Served`]).
    served: Mutex<HashMap<Key, Served>>,
    /// Builds of deleted functions, with when they were let go: their last
    /// requests may still be running, so they are kept for a grace period.
    released: Mutex<Vec<(std::time::Instant, BuildRef)>>,
    /// Functions to reconcile even though their revision settled as `Failed`
    /// (their code was stored again after being found corrupt or missing).
    retry: Mutex<HashSet<Key>>,
    /// Functions with nothing to serve because their latest revision failed;
    /// the gateway answers their URL with `503` and the reason.
    failed: Arc<FailedFunctions>,
}

/// Errors that stop a reconcile before it can record a status.
async fn join_all_handles(handles: Vec<tokio::task::JoinHandle<()>>) {
    for handle in handles {
        let _ = handle.await;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The store failed; the reconcile is retried later.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The function's archive is missing from the code store.
    #[error("code archive {0} is missing: {1}")]
    Blob(String, String),
}

impl Controller {
    pub fn new(
        store: Arc<dyn Store>,
        blobs: Arc<dyn BlobStore>,
        builder: Arc<Builder>,
        executor: Arc<Executor>,
        logs: Arc<LogStore>,
        public_url: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            blobs,
            builder,
            executor,
            logs,
            public_url: public_url.trim_end_matches('/').to_string(),
            locks: Mutex::new(HashMap::new()),
            deployed: Mutex::new(HashMap::new()),
            served: Mutex::new(HashMap::new()),
            released: Mutex::new(Vec::new()),
            retry: Mutex::new(HashSet::new()),
            failed: Arc::new(FailedFunctions::default()),
        })
    }

    /// The failures the gateway reports for functions with nothing to serve.
    pub fn failed_functions(&self) -> Arc<FailedFunctions> {
        self.failed.clone()
    }

    /// Reconciles a function even if its revision settled as `Failed`: its code
    /// archive was just stored again (repairing a corrupt or missing copy), so a
    /// build that failed for want of it can now succeed.
    pub fn enqueue_retry(self: &Arc<Self>, namespace: &str, name: &str) {
        self.retry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((namespace.to_string(), name.to_string()));
        self.enqueue(namespace, name);
    }

    /// Builds that pools run or ran just before, and builds of functions deleted
    /// less than `grace` ago: a collection keeps all of them.
    pub fn builds_in_use(&self, grace: std::time::Duration) -> Vec<BuildRef> {
        let mut out: Vec<BuildRef> = self
            .served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .flat_map(|s| s.current.iter().chain(s.previous.iter()).cloned())
            .collect();
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        released.retain(|(at, _)| at.elapsed() < grace);
        out.extend(released.iter().map(|(_, b)| b.clone()));
        out
    }

    /// Records a failure for the gateway when the function has nothing to serve.
    fn note_failure(&self, ns: &str, name: &str, private: bool, message: &str) {
        if self.executor.is_deployed(ns, name) {
            // An older revision still serves; the URL keeps answering with it.
            self.failed.clear(ns, name);
        } else {
            // Anyone may call a public URL: tell them the reason's first line,
            // not the build log's tail that follows it (the owner sees all of
            // it in the function's status).
            let mut summary: String = message
                .lines()
                .next()
                .unwrap_or_default()
                .trim_end_matches(':')
                .chars()
                .take(300)
                .collect();
            if summary.is_empty() {
                summary = "its latest revision failed".into();
            }
            self.failed.set(
                ns,
                name,
                Failure {
                    message: summary,
                    private,
                },
            );
        }
    }

    /// The public URL of a function.
    pub fn url(&self, namespace: &str, name: &str) -> String {
        format!("{}/fn/{namespace}/{name}", self.public_url)
    }

    /// Reconciles a function in the background.
    pub fn enqueue(self: &Arc<Self>, namespace: &str, name: &str) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        let key = (namespace.to_string(), name.to_string());
        tokio::spawn(async move {
            let mut delay = std::time::Duration::from_millis(500);
            loop {
                match this.reconcile(&key).await {
                    Ok(()) => break,
                    Err(e) => {
                        // Store trouble is transient by nature here; try again with back-off.
                        tracing::warn!(namespace = %key.0, function = %key.1, error = %e, "reconcile failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(std::time::Duration::from_secs(30));
                    }
                }
            }
        })
    }

    /// Reconciles every stored function (at start-up) and waits up to `patience`
    /// for them, so that a restarted server serves its functions from its first
    /// request instead of answering 404 until they are redeployed. Reconciles
    /// still running then (real builds) go on in the background.
    pub async fn resync_all(
        self: &Arc<Self>,
        patience: std::time::Duration,
    ) -> Result<usize, StoreError> {
        let all = self.store.list_functions(None).await?;
        let pending: Vec<_> = all
            .iter()
            .map(|f| self.enqueue(&f.namespace, &f.name))
            .collect();
        if tokio::time::timeout(patience, join_all_handles(pending))
            .await
            .is_err()
        {
            tracing::warn!("some functions are still being rebuilt; they will serve when ready");
        }
        Ok(all.len())
    }

    /// Stops serving a deleted function and forgets it.
    pub fn forget(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        self.executor.remove(namespace, name);
        self.deployed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        self.failed.clear(namespace, name);
        if let Some(served) = self
            .served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
        {
            let now = std::time::Instant::now();
            self.released
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(
                    served
                        .current
                        .into_iter()
                        .chain(served.previous)
                        .map(|b| (now, b)),
                );
        }
        self.logs.remove(namespace, name);
    }

    /// Makes one function's running state match its record.
    pub async fn reconcile(&self, key: &Key) -> Result<(), ReconcileError> {
        let lock = self
            .locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let _serial = lock.lock().await;
        let record = match self.store.get_function(&key.0, &key.1).await {
            Ok(r) => r,
            Err(StoreError::NotFound { .. }) => {
                self.executor.remove(&key.0, &key.1);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        let deployed = self
            .deployed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied();
        let settled = matches!(record.status.phase, Phase::Ready | Phase::Failed)
            && record.status.revision == record.revision;
        let retry = self
            .retry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        if settled && deployed == Some(record.revision) {
            return Ok(());
        }
        if settled && record.status.phase == Phase::Failed && !retry {
            self.note_failure(&key.0, &key.1, record.spec.private, &record.status.message);
            return Ok(());
        }
        let Some(sha) = record.code_sha256.clone() else {
            let status = FunctionStatus {
                phase: Phase::Pending,
                message: "waiting for code: upload a zip archive to .../code".into(),
                revision: record.revision,
                url: self.url(&key.0, &key.1),
                ..Default::default()
            };
            self.store
                .set_status(&key.0, &key.1, record.revision, &status)
                .await?;
            return Ok(());
        };
        self.build_and_deploy(key, record, sha).await
    }

    async fn build_and_deploy(
        &self,
        key: &Key,
        record: FunctionRecord,
        sha: String,
    ) -> Result<(), ReconcileError> {
        let (ns, name) = (&key.0, &key.1);
        let revision = record.revision;
        let mut status = FunctionStatus {
            phase: Phase::Building,
            message: String::new(),
            revision,
            code_sha256: Some(sha.clone()),
            url: self.url(ns, name),
            last_built_at: record.status.last_built_at,
            ..Default::default()
        };
        let set = |status: FunctionStatus| async move {
            self.store.set_status(ns, name, revision, &status).await
        };
        set(status.clone()).await?;

        let private = record.spec.private;
        let runtime = record.spec.runtime.clone();
        let archive = match self.blobs.get(&sha).await {
            Ok(archive) => archive,
            // Nothing a retry can fix: the owner must upload the code again.
            Err(e @ (BlobError::Corrupt { .. } | BlobError::NotFound(_))) => {
                tracing::error!(namespace = %ns, function = %name, revision, error = %e, "cannot build: code archive unusable");
                let what = if matches!(e, BlobError::Corrupt { .. }) {
                    "is corrupt (its bytes no longer match its sha256)"
                } else {
                    "is missing"
                };
                status.phase = Phase::Failed;
                status.message = format!(
                    "the stored code archive {sha} {what}; upload the code again to repair it"
                );
                self.logs
                    .sink(ns, name)
                    .line("sless", &format!("revision {revision}: {}", status.message));
                self.note_failure(ns, name, private, &status.message);
                set(status).await?;
                return Ok(());
            }
            Err(e) => return Err(ReconcileError::Blob(sha.clone(), e.to_string())),
        };
        let sink = self.logs.sink(ns, name);
        let log_sink = sink.clone();
        let request = BuildRequest {
            namespace: ns.to_string(),
            family: runtime.family,
            entrypoint: record.spec.entrypoint.clone(),
            code_sha256: sha.clone(),
            archive,
            log: Arc::new(move |line: &str| log_sink.line("build", line)),
        };
        let output = match self.builder.build(request).await {
            Ok(output) => output,
            Err(e) => {
                let message = match e {
                    BuildError::Failed { message } => message,
                    e @ (BuildError::TimedOut(_)
                    | BuildError::Unsupported(_)
                    | BuildError::Archive(_)) => e.to_string(),
                    // Server-side trouble: the details (paths, errno) go to the
                    // server log, not to the function's owner.
                    other => {
                        tracing::error!(namespace = %ns, function = %name, revision, error = %other, "build failed");
                        "the build failed because of a server error; the server log has the details"
                            .to_string()
                    }
                };
                sink.line("sless", &format!("revision {revision} failed to build"));
                status.phase = Phase::Failed;
                status.message = message;
                self.note_failure(ns, name, private, &status.message);
                set(status).await?;
                return Ok(());
            }
        };
        if !output.reused {
            status.last_built_at = Some(Utc::now());
        }
        let spec = &record.spec;
        let built = BuildRef {
            code_sha256: sha.clone(),
            build_key: output.build_key.clone(),
        };
        let deployment = Deployment {
            namespace: ns.clone(),
            name: name.clone(),
            revision,
            family: runtime.family,
            entrypoint: spec.entrypoint.clone(),
            env: spec.env.clone(),
            memory_mb: spec.memory_mb,
            cpu: spec.cpu,
            timeout_sec: spec.timeout_sec,
            min_instances: spec.min_instances,
            max_instances: spec.max_instances,
            concurrency: spec.concurrency,
            idle_timeout_sec: spec.idle_timeout_sec,
            paused: spec.paused,
            private: spec.private,
            network: spec.network,
            code_dir: output.code_dir,
            deps_dir: output.deps_dir,
        };
        match self.executor.deploy(deployment).await {
            Ok(()) => {
                self.deployed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key.clone(), revision);
                {
                    let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
                    let entry = served.entry(key.clone()).or_default();
                    if entry.current.as_ref() != Some(&built) {
                        entry.previous = entry.current.replace(built);
                    }
                }
                self.failed.clear(ns, name);
                status.phase = Phase::Ready;
                status.message = if spec.paused {
                    "paused".into()
                } else {
                    String::new()
                };
                sink.line("sless", &format!("revision {revision} is ready"));
            }
            Err(e) => {
                status.phase = Phase::Failed;
                status.message = format!("revision {revision} could not start: {e}");
                self.note_failure(ns, name, private, &status.message);
            }
        }
        let still_current = set(status).await?;
        if !still_current {
            tracing::debug!(namespace = %ns, function = %name, revision, "a newer revision arrived during the build");
        }
        Ok(())
    }
}
