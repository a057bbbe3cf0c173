//! The controller: makes what runs match what is stored.
//!
//! Level-triggered and idempotent, in the manner of a Kubernetes controller:
//! [`Controller::enqueue`] asks for a function to be reconciled; [`reconcile`]
//! reads the function's latest record, builds its code if needed (the builder is
//! content-addressed, so unchanged code is not rebuilt), hands the result to the
//! executor and writes the status back. Running it twice changes nothing.
//! Reconciles of one function are serialised; of different functions they run
//! in parallel (builds are bounded by the builder).

pub mod jobs;
pub mod triggers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use sless_blob::BlobStore;
use sless_build::{BuildError, BuildRequest, Builder};
use sless_core::{FunctionStatus, Phase, Runtime};
use sless_executor::{Deployment, Executor};
use sless_logs::LogStore;
use sless_store::{FunctionRecord, Store, StoreError};

type Key = (String, String);

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
        })
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
        if settled && (deployed == Some(record.revision) || record.status.phase == Phase::Failed) {
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

        let runtime = match Runtime::parse(&record.spec.runtime) {
            Ok(r) => r,
            Err(e) => {
                status.phase = Phase::Failed;
                status.message = e.to_string();
                set(status).await?;
                return Ok(());
            }
        };
        let archive = self
            .blobs
            .get(&sha)
            .await
            .map_err(|e| ReconcileError::Blob(sha.clone(), e.to_string()))?;
        let sink = self.logs.sink(ns, name);
        let log_sink = sink.clone();
        let request = BuildRequest {
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
                set(status).await?;
                return Ok(());
            }
        };
        if !output.reused {
            status.last_built_at = Some(Utc::now());
        }
        let spec = &record.spec;
        let deployment = Deployment {
            namespace: ns.clone(),
            name: name.clone(),
            revision,
            family: runtime.family,
            entrypoint: spec.entrypoint.clone(),
            env: spec.env.clone(),
            memory_mb: spec.memory_mb,
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
            }
        }
        let still_current = set(status).await?;
        if !still_current {
            tracing::debug!(namespace = %ns, function = %name, revision, "a newer revision arrived during the build");
        }
        Ok(())
    }
}
