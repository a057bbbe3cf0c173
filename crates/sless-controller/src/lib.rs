//! The controller: makes what runs match what is stored.
//!
//! Level-triggered and idempotent, in the manner of a Kubernetes controller:
//! [`Controller::enqueue`] asks for a function to be reconciled; [`reconcile`]
//! reads the function's latest record, builds its code if needed (the builder is
//! content-addressed, so unchanged code is not rebuilt), hands the result to the
//! executor and writes the status back. Running it twice changes nothing.
//! Reconciles of one function are serialised (one worker per function, and
//! enqueues while it runs coalesce); of different functions they run in
//! parallel (builds are bounded by the builder). A pass ends with an
//! [`Action`]; a failed one is retried with back-off when the trouble is the
//! server's, or reported once as `Failed` when the function's own code or spec
//! is at fault ([`error_policy`]). The builder and the executor are reached
//! through the [`Build`] and [`Deploy`] seams, so all of this is unit-tested
//! with fakes.
//!
//! [`gc`] collects the code, builds and dependencies nothing uses any more, and
//! answers how much storage a namespace's code takes.

pub mod calls;
pub mod dead_letters;
pub mod devices;
pub mod gc;
pub mod jobs;
mod policy;
pub mod queues;
mod seams;
pub mod secrets;
#[cfg(test)]
mod tests;
pub mod triggers;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use sless_blob::BlobError;
use sless_blob::BlobStore;
use sless_build::{BuildError, BuildRequest};
use sless_core::{FunctionStatus, Phase};
use sless_executor::{DeployError, Deployment};
use sless_invoke::{FailedFunctions, Failure};
use sless_logs::LogStore;
use sless_store::{FunctionRecord, Store, StoreError};
use tokio::sync::{Notify, watch};

pub use policy::{Action, RECONCILE_BACKOFF, ReconcileError, error_policy};
pub use seams::{Build, Deploy};

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

/// A function's reconcile worker, while it has one (see [`Controller::enqueue`]).
struct Work {
    /// Enqueued again since the running pass started: run one more pass.
    again: bool,
    /// Wakes the worker out of a back-off wait when the function is enqueued.
    wake: Arc<Notify>,
    /// Set to `true` when the worker ends with nothing left to do.
    idle: watch::Sender<bool>,
}

/// A request to reconcile a function; [`Enqueued::settled`] waits for it.
pub struct Enqueued(watch::Receiver<bool>);

impl Enqueued {
    /// Waits until the function's worker has nothing left to do: its last pass
    /// ended with [`Action::Done`] (success or a permanent failure) and nothing
    /// was enqueued meanwhile. A function whose reconcile keeps meeting
    /// transient trouble does not settle.
    pub async fn settled(mut self) {
        // An error means the worker is gone, which happens only once it is idle.
        let _ = self.0.wait_for(|idle| *idle).await;
    }
}

/// What reconciling needs.
pub struct Controller {
    store: Arc<dyn Store>,
    blobs: Arc<dyn BlobStore>,
    builder: Arc<dyn Build>,
    executor: Arc<dyn Deploy>,
    logs: Arc<LogStore>,
    /// Base of every function URL, e.g. `http://127.0.0.1:8080`.
    public_url: String,
    /// The worker of each function being reconciled; at most one per function,
    /// so its passes never overlap.
    work: Mutex<HashMap<Key, Work>>,
    /// The revision each function's executor pool runs, as deployed by us.
    /// With the digest of the secrets it was deployed with (see `secrets`).
    deployed: Mutex<HashMap<Key, (u64, String)>>,
    /// Resolves secret references at deploy time; unset: a function that references
    /// a secret fails to deploy, saying so.
    secrets: std::sync::OnceLock<Arc<secrets::SecretResolver>>,
    /// The builds each function's pool runs and ran (see [`Served`]).
    served: Mutex<HashMap<Key, Served>>,
    /// Builds of deleted functions, with when they were let go: their last
    /// requests may still be running, so they are kept for a grace period.
    released: Mutex<Vec<(std::time::Instant, BuildRef)>>,
    /// Functions to reconcile even though their revision settled as `Failed`
    /// (their code was stored again after being found corrupt or missing).
    retry: Mutex<HashSet<Key>>,
    /// Functions with nothing to serve because their latest revision failed;
    /// every invoker answers a call of them with `503` and the reason.
    failed: Arc<FailedFunctions>,
}

/// A worker's entry in [`Controller::work`]. Should the worker end without
/// removing it (a pass panicked, the runtime stopped), the entry goes anyway, so that the next
/// enqueue starts a new worker instead of waiting on a dead one.
struct Registered<'a> {
    work: &'a Mutex<HashMap<Key, Work>>,
    key: &'a Key,
    armed: bool,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if self.armed {
            if std::thread::panicking() {
                tracing::error!(namespace = %self.key.0, function = %self.key.1, "a reconcile pass panicked");
            }
            let mut work = self.work.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = work.remove(self.key) {
                w.idle.send_replace(true);
            }
        }
    }
}

async fn settle_all(pending: Vec<Enqueued>) {
    for enqueued in pending {
        enqueued.settled().await;
    }
}

impl Controller {
    /// The server passes its `Arc<Builder>` and `Arc<Executor>` as `builder`
    /// and `executor`; tests pass fakes.
    pub fn new(
        store: Arc<dyn Store>,
        blobs: Arc<dyn BlobStore>,
        builder: Arc<dyn Build>,
        executor: Arc<dyn Deploy>,
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
            work: Mutex::new(HashMap::new()),
            deployed: Mutex::new(HashMap::new()),
            secrets: std::sync::OnceLock::new(),
            served: Mutex::new(HashMap::new()),
            released: Mutex::new(Vec::new()),
            retry: Mutex::new(HashSet::new()),
            failed: Arc::new(FailedFunctions::default()),
        })
    }

    /// Gives the controller the secret store and key (once, at start).
    pub fn set_secrets(&self, resolver: Arc<secrets::SecretResolver>) {
        let _ = self.secrets.set(resolver);
    }

    /// A secret a function references was created or replaced: the function is
    /// reconciled (even if it had failed for want of it) and, when the secret's
    /// version differs from what its instances run, redeployed with a rolling
    /// replacement.
    pub fn secret_changed(self: &Arc<Self>, namespace: &str, name: &str) {
        self.enqueue_retry(namespace, name);
    }

    /// The failures the invocation pipeline reports for functions with nothing to serve.
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

    /// Records a failure for the invokers when the function has nothing to serve.
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

    /// Asks for a function to be reconciled and returns at once. Each function
    /// has at most one worker, so its passes never overlap: an enqueue while a
    /// pass runs, or while the worker waits out a back-off, makes it run one
    /// more pass as soon as the current one ends. Any number of enqueues thus
    /// coalesce into passes that each read the latest record. The worker ends
    /// when a pass ends with [`Action::Done`] and nothing was enqueued meanwhile;
    /// a failed pass is followed as [`error_policy`] says.
    pub fn enqueue(self: &Arc<Self>, namespace: &str, name: &str) -> Enqueued {
        let key = (namespace.to_string(), name.to_string());
        let mut work = self.work.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(running) = work.get_mut(&key) {
            running.again = true;
            running.wake.notify_waiters();
            return Enqueued(running.idle.subscribe());
        }
        let (idle, settled) = watch::channel(false);
        let wake = Arc::new(Notify::new());
        work.insert(
            key.clone(),
            Work {
                again: false,
                wake: wake.clone(),
                idle,
            },
        );
        drop(work);
        tokio::spawn(self.clone().work(key, wake));
        Enqueued(settled)
    }

    /// A function's worker: runs passes until one ends with nothing left to do.
    async fn work(self: Arc<Self>, key: Key, wake: Arc<Notify>) {
        let mut registered = Registered {
            work: &self.work,
            key: &key,
            armed: true,
        };
        let mut failures = 0u32;
        loop {
            // Enqueues from here on may come after the record this pass reads.
            if let Some(w) = self
                .work
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&key)
            {
                w.again = false;
            }
            let action = match self.reconcile(&key).await {
                Ok(action) => {
                    failures = 0;
                    action
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let action = error_policy(&e, failures);
                    match action {
                        Action::Done => {
                            failures = 0;
                            tracing::warn!(namespace = %key.0, function = %key.1, error = %e, "reconcile failed; not retried until the function changes");
                        }
                        Action::RequeueAfter(delay) => {
                            tracing::warn!(namespace = %key.0, function = %key.1, error = %e, retry = failures, delay_ms = delay.as_millis() as u64, "reconcile failed; retrying");
                        }
                    }
                    action
                }
            };
            // Listening before looking at `again`, so no enqueue goes unseen.
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let delay = {
                let mut work = self.work.lock().unwrap_or_else(|e| e.into_inner());
                if work.get(&key).is_some_and(|w| w.again) {
                    continue;
                }
                match action {
                    Action::RequeueAfter(delay) => delay,
                    Action::Done => {
                        registered.armed = false;
                        if let Some(w) = work.remove(&key) {
                            w.idle.send_replace(true);
                        }
                        return;
                    }
                }
            };
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = &mut notified => {}
            }
        }
    }

    /// Reconciles every stored function (at start-up) and waits up to `patience`
    /// for them, so that a restarted server serves its functions from its first
    /// request instead of answering 404 until they are redeployed. Reconciles
    /// still running then (real builds, retries) go on in the background.
    pub async fn resync_all(self: &Arc<Self>, patience: Duration) -> Result<usize, StoreError> {
        let all = self.store.list_functions(None).await?;
        let pending: Vec<_> = all
            .iter()
            .map(|f| self.enqueue(&f.namespace, &f.name))
            .collect();
        if tokio::time::timeout(patience, settle_all(pending))
            .await
            .is_err()
        {
            tracing::warn!("some functions are still being rebuilt; they will serve when ready");
        }
        Ok(all.len())
    }

    /// Reconciles every function of `namespace` (restored from the trash) and waits
    /// up to `patience` for them, as [`Controller::resync_all`] does at start.
    pub async fn resync_namespace(
        self: &Arc<Self>,
        namespace: &str,
        patience: Duration,
    ) -> Result<usize, StoreError> {
        let all = self.store.list_functions(Some(namespace)).await?;
        let pending: Vec<_> = all
            .iter()
            .map(|f| self.enqueue(&f.namespace, &f.name))
            .collect();
        if tokio::time::timeout(patience, settle_all(pending))
            .await
            .is_err()
        {
            tracing::warn!(
                namespace,
                "some restored functions are still being rebuilt; they will serve when ready"
            );
        }
        Ok(all.len())
    }

    /// Stops serving a deleted function and forgets it. A pass still running
    /// for it (a build) is followed by one that finds it gone and undoes
    /// whatever that pass deployed.
    pub fn forget(self: &Arc<Self>, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        self.release(&key);
        self.enqueue(namespace, name);
    }

    /// Stops serving a function that no longer exists, lets go of its builds
    /// (after the grace period) and deletes its log.
    fn release(&self, key: &Key) {
        let (namespace, name) = (&key.0, &key.1);
        self.executor.remove(namespace, name);
        self.deployed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        self.failed.clear(namespace, name);
        if let Some(served) = self
            .served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
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

    /// One pass making a function's running state match its record. Only the
    /// function's worker runs it (see [`Controller::enqueue`]). A permanent
    /// failure of the function's code or spec is written as the `Failed` status of
    /// the revision before it is returned; a record the store cannot read has no
    /// status to write to and is only returned; a transient failure leaves the
    /// status as it was (`Building`).
    async fn reconcile(&self, key: &Key) -> Result<Action, ReconcileError> {
        let record = match self.store.get_function(&key.0, &key.1).await {
            Ok(r) => r,
            Err(StoreError::NotFound { .. }) => {
                self.release(key);
                return Ok(Action::Done);
            }
            Err(e) => return Err(e.into()),
        };
        let deployed = self
            .deployed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned();
        let secrets_digest = match self.secrets.get() {
            Some(resolver)
                if sless_core::secret::env_refs(&record.spec.env)
                    .next()
                    .is_some() =>
            {
                resolver.digest(&key.0, &record.spec.env).await?
            }
            _ => String::new(),
        };
        let settled = matches!(record.status.phase, Phase::Ready | Phase::Failed)
            && record.status.revision == record.revision;
        let retry = self
            .retry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        if settled && deployed == Some((record.revision, secrets_digest)) {
            return Ok(Action::Done);
        }
        if settled && record.status.phase == Phase::Failed && !retry {
            self.note_failure(&key.0, &key.1, record.spec.private, &record.status.message);
            return Ok(Action::Done);
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
            return Ok(Action::Done);
        };
        let mut status = FunctionStatus {
            phase: Phase::Building,
            message: String::new(),
            revision: record.revision,
            code_sha256: Some(sha.clone()),
            url: self.url(&key.0, &key.1),
            last_built_at: record.status.last_built_at,
            ..Default::default()
        };
        // `status` is left as the pass had it (with a fresh build's time).
        match self.build_and_deploy(key, &record, sha, &mut status).await {
            Err(e) if e.is_permanent() => {
                let failed = FunctionStatus {
                    phase: Phase::Failed,
                    message: e.to_string(),
                    ..status
                };
                self.note_failure(&key.0, &key.1, record.spec.private, &failed.message);
                if !self
                    .store
                    .set_status(&key.0, &key.1, record.revision, &failed)
                    .await?
                {
                    // The failure is of a revision that is no longer the latest.
                    return Ok(Action::RequeueAfter(Duration::ZERO));
                }
                Err(e)
            }
            Err(e) => {
                if retry {
                    // The retry asked for has not happened yet.
                    self.retry
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(key.clone());
                }
                Err(e)
            }
            Ok(action) => Ok(action),
        }
    }

    async fn build_and_deploy(
        &self,
        key: &Key,
        record: &FunctionRecord,
        sha: String,
        status: &mut FunctionStatus,
    ) -> Result<Action, ReconcileError> {
        let (ns, name) = (&key.0, &key.1);
        let revision = record.revision;
        let set = |status: FunctionStatus| async move {
            self.store.set_status(ns, name, revision, &status).await
        };
        if !set(status.clone()).await? {
            // A newer revision, or a delete, came after the record was read.
            return Ok(Action::RequeueAfter(Duration::ZERO));
        }

        let runtime = record.spec.runtime.clone();
        let archive = match self.blobs.get(&sha).await {
            Ok(archive) => archive,
            // Nothing a retry can fix: the owner must upload the code again.
            Err(
                e @ (BlobError::Corrupt { .. } | BlobError::NotFound(_) | BlobError::InvalidKey(_)),
            ) => {
                tracing::error!(namespace = %ns, function = %name, revision, error = %e, "cannot build: code archive unusable");
                let e = if matches!(e, BlobError::Corrupt { .. }) {
                    ReconcileError::CodeCorrupt(sha)
                } else {
                    ReconcileError::CodeMissing(sha)
                };
                self.logs
                    .sink(ns, name)
                    .line("sless", &format!("revision {revision}: {e}"));
                return Err(e);
            }
            Err(source @ BlobError::Io { .. }) => {
                return Err(ReconcileError::Blob {
                    sha256: sha,
                    source,
                });
            }
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
            Err(
                e @ (BuildError::Failed { .. } | BuildError::TimedOut(_) | BuildError::Archive(_)),
            ) => {
                sink.line("sless", &format!("revision {revision} failed to build"));
                return Err(ReconcileError::BuildFailed(match e {
                    BuildError::Failed { message } => message,
                    e => e.to_string(),
                }));
            }
            // Server-side trouble: the details (paths, errno) go to the server
            // log, not to the function's owner, and the build is tried again.
            Err(e @ (BuildError::Sandbox(_) | BuildError::Io { .. } | BuildError::Internal(_))) => {
                status.message = "the build failed because of a server error and will be retried; the server log has the details".into();
                set(status.clone()).await?;
                return Err(ReconcileError::BuildServer(e));
            }
        };
        // The build may have taken long: after a newer revision or a delete this
        // result is stale, and the next pass acts on what is stored now.
        match self.store.get_function(ns, name).await {
            Ok(now) if now.revision == revision => {}
            Ok(_) | Err(StoreError::NotFound { .. }) => {
                return Ok(Action::RequeueAfter(Duration::ZERO));
            }
            Err(e) => return Err(e.into()),
        }
        if !output.reused {
            status.last_built_at = Some(Utc::now());
        }
        let spec = &record.spec;
        let resolved =
            secrets::resolve_env(self.secrets.get().map(|r| r.as_ref()), ns, &spec.env).await;
        let resolved = match resolved {
            Ok(r) => r,
            Err(secrets::ResolveError::Store(e)) => return Err(e.into()),
            Err(secrets::ResolveError::Invalid(message)) => {
                sink.line("sless", &format!("revision {revision}: {message}"));
                return Err(ReconcileError::Secret(message));
            }
        };
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
            env: resolved.env,
            secret_env: resolved.secret_env,
            secret_files: resolved.files,
            secrets_digest: resolved.digest.clone(),
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
        // A pass that deployed but could not write the status is followed by
        // one that only writes it: deploying the same revision again would
        // start and drain instances for nothing.
        let serving = self
            .deployed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            == Some(&(revision, resolved.digest.clone()))
            && self.executor.is_deployed(ns, name);
        if !serving {
            match self.executor.deploy(deployment).await {
                Ok(()) => {}
                Err(DeployError::InstanceFailed(message)) => {
                    return Err(ReconcileError::StartFailed { revision, message });
                }
                Err(DeployError::Cancelled) => {
                    return Err(ReconcileError::DeployCancelled(revision));
                }
            }
            self.deployed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone(), (revision, resolved.digest));
            {
                let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
                let entry = served.entry(key.clone()).or_default();
                if entry.current.as_ref() != Some(&built) {
                    entry.previous = entry.current.replace(built);
                }
            }
            sink.line("sless", &format!("revision {revision} is ready"));
        }
        self.failed.clear(ns, name);
        status.phase = Phase::Ready;
        status.message = if spec.paused {
            "paused".into()
        } else {
            String::new()
        };
        if !set(status.clone()).await? {
            tracing::debug!(namespace = %ns, function = %name, revision, "a newer revision arrived during the deploy");
            return Ok(Action::RequeueAfter(Duration::ZERO));
        }
        Ok(Action::Done)
    }
}
