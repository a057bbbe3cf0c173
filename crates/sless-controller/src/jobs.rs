//! Running jobs: one-shot invocations of a function, or of self-contained code,
//! each in a private pool of its own (named `job.<name>`, which no `/fn/` URL can
//! reach), with an attempts limit, back-off, and result or failure capture.
//!
//! A run belongs to a `run_id`: raising it starts a new run (and stops an old one
//! still going); status writes of a stale run are ignored by the store.
//!
//! Every status write, start, stop and delete rings the job's [`StatusSignal`], so a
//! reader waiting for a run to end (`GET .../jobs/{name}?wait=`) reads the record
//! again only when it may have changed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::Utc;
use sless_blob::BlobStore;
use sless_build::{BuildError, BuildRequest, Builder};
use sless_core::invocation::InvocationSource;
use sless_core::{JobPhase, JobStatus};
use sless_executor::{Deployment, Executor, InvokeError};
use sless_invoke::{Call, Invoker};
use sless_logs::LogStore;
use sless_store::{JobRecord, JobStore, StoreError};

type Key = (String, String);

/// Default bound of one attempt of a self-contained job.
const SELF_CONTAINED_TIMEOUT: u32 = 600;
/// Lines of the run's output kept in a failure message.
const OUTPUT_TAIL: usize = 20;
/// How long a failed attempt waits for its output to reach the log.
const OUTPUT_SETTLE_LIMIT: Duration = Duration::from_secs(1);
/// The wait before attempt n + 1 after attempt n failed: 1 s, 2 s, 4 s … 32 s.
const ATTEMPT_BACKOFF: sless_core::Backoff =
    sless_core::Backoff::new(Duration::from_secs(1), Duration::from_secs(32));

pub struct Jobs {
    store: Arc<dyn JobStore>,
    blobs: Arc<dyn BlobStore>,
    builder: Arc<Builder>,
    executor: Arc<Executor>,
    logs: Arc<LogStore>,
    /// Attempts go through the invocation pipeline, which records them.
    invoker: Arc<Invoker>,
    running: Mutex<HashMap<Key, tokio::task::JoinHandle<()>>>,
    /// Rung after every change of a job's record this process makes.
    changes: StatusSignal,
    me: Weak<Jobs>,
    /// Resolves the secret references of self-contained jobs (see `Controller::set_secrets`).
    secrets: std::sync::OnceLock<Arc<crate::secrets::SecretResolver>>,
}

/// The executor pool a job runs in.
pub fn pool_name(job: &str) -> String {
    format!("job.{job}")
}

impl Jobs {
    pub fn new(
        store: Arc<dyn JobStore>,
        blobs: Arc<dyn BlobStore>,
        builder: Arc<Builder>,
        executor: Arc<Executor>,
        logs: Arc<LogStore>,
        invoker: Arc<Invoker>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Jobs {
            store,
            blobs,
            builder,
            executor,
            logs,
            invoker,
            running: Mutex::new(HashMap::new()),
            changes: StatusSignal::default(),
            me: me.clone(),
            secrets: std::sync::OnceLock::new(),
        })
    }

    /// Gives the jobs the secret store and key (once, at start).
    pub fn set_secrets(&self, resolver: Arc<crate::secrets::SecretResolver>) {
        let _ = self.secrets.set(resolver);
    }

    /// Runs again every job whose run had not finished when the server stopped.
    pub async fn resume_all(&self) -> Result<usize, StoreError> {
        let jobs = self.store.list_jobs(None).await?;
        let mut resumed = 0;
        for job in jobs.iter().filter(|j| !j.status.phase.is_terminal()) {
            self.start(&job.namespace, &job.name);
            resumed += 1;
        }
        Ok(resumed)
    }

    /// Runs again every job of `namespace` whose run had not finished when it was
    /// moved to the trash (it was restored), as a server start does for all.
    pub async fn resume_namespace(&self, namespace: &str) -> Result<usize, StoreError> {
        let jobs = self.store.list_jobs(Some(namespace)).await?;
        let mut resumed = 0;
        for job in jobs.iter().filter(|j| !j.status.phase.is_terminal()) {
            self.start(&job.namespace, &job.name);
            resumed += 1;
        }
        Ok(resumed)
    }

    /// Starts (or restarts) the job's current run in the background.
    pub fn start(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let Some(me) = self.me.upgrade() else { return };
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = running.remove(&key) {
            old.abort();
            self.executor.remove(namespace, &pool_name(name));
        }
        let task_key = key.clone();
        let handle = tokio::spawn(async move {
            if let Err(e) = me.run(&task_key).await {
                tracing::warn!(namespace = %task_key.0, job = %task_key.1, error = %e, "job run could not record its status");
            }
            me.running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&task_key);
        });
        running.insert(key, handle);
        drop(running);
        // The caller wrote the run's first status (or a new run_id) before starting it.
        self.changes.notify(namespace, name);
    }

    /// Stops a job's run, if one is going (the job is being deleted).
    pub fn stop(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        if let Some(run) = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
        {
            run.abort();
        }
        self.executor.remove(namespace, &pool_name(name));
        self.changes.notify(namespace, name);
    }

    /// A handle that wakes when the job's record may have changed: take it before
    /// reading the record, so no change after that read goes unseen.
    pub fn watch(&self, namespace: &str, name: &str) -> StatusWatch<'_> {
        self.changes.watch(namespace, name)
    }

    /// Tells readers waiting on the job that its record changed by a path that did
    /// not go through [`Jobs::start`] or [`Jobs::stop`] (e.g. it was deleted).
    pub fn changed(&self, namespace: &str, name: &str) {
        self.changes.notify(namespace, name);
    }

    /// Writes a run's status (`false`: ignored, the job moved on to another run),
    /// then wakes the readers waiting on the job.
    async fn set_status(
        &self,
        ns: &str,
        name: &str,
        status: &JobStatus,
    ) -> Result<bool, StoreError> {
        let written = self.store.set_job_status(ns, name, status).await;
        self.changes.notify(ns, name);
        written
    }

    async fn run(&self, key: &Key) -> Result<(), StoreError> {
        let (ns, name) = (&key.0, &key.1);
        let job = match self.store.get_job(ns, name).await {
            Ok(job) => job,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let run_id = job.spec.run_id;
        let mut status = JobStatus {
            run_id,
            ..Default::default()
        };
        if run_id == 0 {
            status.phase = JobPhase::Skipped;
            status.message = "run_id is 0: not run".into();
            self.set_status(ns, name, &status).await?;
            return Ok(());
        }
        if job.status.run_id == run_id && job.status.phase.is_terminal() {
            return Ok(());
        }
        let deployment = match self.deployment(&job, &mut status).await? {
            Some(d) => d,
            None => return Ok(()),
        };
        status.phase = JobPhase::Running;
        status.started_at = Some(Utc::now());
        self.set_status(ns, name, &status).await?;

        let pool = deployment.name.clone();
        let timeout = deployment.timeout_sec;
        if let Err(e) = self.executor.deploy(deployment).await {
            status.phase = JobPhase::Failed;
            status.message = format!("the job could not start: {e}");
            status.finished_at = Some(Utc::now());
            self.executor.remove(ns, &pool);
            self.set_status(ns, name, &status).await?;
            return Ok(());
        }
        let event = match sless_invoke::encode_event(&job.spec.event) {
            Ok(event) => event,
            Err(e) => {
                status.phase = JobPhase::Failed;
                status.message = e.to_string();
                status.finished_at = Some(Utc::now());
                self.executor.remove(ns, &pool);
                self.set_status(ns, name, &status).await?;
                return Ok(());
            }
        };
        // Records name the function a job ran, or the job's pool for its own code.
        let label = job.spec.function.clone().unwrap_or_else(|| pool.clone());
        for attempt in 1..=job.spec.max_attempts {
            status.attempts = attempt;
            self.set_status(ns, name, &status).await?;
            let request_id = sless_invoke::new_request_id();
            let call = Call::new(ns, &pool, InvocationSource::Job, &request_id, event.clone())
                .recorded_as(&label);
            let done = self.invoker.run(call).await;
            let error = match &done.result {
                // The job's own words: its pool's name means nothing to its owner.
                Err(InvokeError::Timeout { .. }) => Some(format!("timed out after {timeout} s")),
                _ => done.error,
            };
            match (done.result, error) {
                (Ok(r), None) => {
                    status.phase = JobPhase::Succeeded;
                    status.result = serde_json::from_slice(&r.body).ok();
                    status.message = String::new();
                    break;
                }
                (_, error) => {
                    let error = error.unwrap_or_default();
                    // The shim put the attempt's output in the instance's pipes before
                    // answering; once they are found empty, all of it is in the log.
                    // Bounded, as a handler may go on printing from a background thread.
                    self.executor
                        .output_settled(ns, &pool, OUTPUT_SETTLE_LIMIT)
                        .await;
                    status.message = self
                        .failure_message(ns, &pool, &request_id, attempt, &error)
                        .await;
                    status.phase = JobPhase::Failed;
                    if attempt < job.spec.max_attempts {
                        status.phase = JobPhase::Running;
                        self.set_status(ns, name, &status).await?;
                        let backoff = ATTEMPT_BACKOFF.delay(attempt);
                        tokio::time::sleep(backoff).await;
                    }
                }
            }
        }
        status.finished_at = Some(Utc::now());
        self.executor.remove(ns, &pool);
        self.set_status(ns, name, &status).await?;
        Ok(())
    }

    /// What the job runs: its function's current revision, or its own code
    /// (built first). `None` when it cannot run yet or failed (status written).
    async fn deployment(
        &self,
        job: &JobRecord,
        status: &mut JobStatus,
    ) -> Result<Option<Deployment>, StoreError> {
        let (ns, name) = (&job.namespace, &job.name);
        let spec = &job.spec;
        let fail = |status: &mut JobStatus, message: String| {
            status.phase = JobPhase::Failed;
            status.message = message;
            status.finished_at = Some(Utc::now());
        };
        if let Some(function) = &spec.function {
            let Some(mut d) = self.executor.deployment(ns, function) else {
                fail(
                    status,
                    format!(
                        "function {function} has no revision that can run (is it deployed and Ready?)"
                    ),
                );
                self.set_status(ns, name, status).await?;
                return Ok(None);
            };
            d.name = pool_name(name);
            if let Some(t) = spec.timeout_sec {
                d.timeout_sec = t;
            }
            d.min_instances = 0;
            d.max_instances = 1;
            d.concurrency = 1;
            d.paused = false;
            d.private = true;
            return Ok(Some(d));
        }
        let Some(sha) = &job.code_sha256 else {
            status.phase = JobPhase::Pending;
            status.message = "waiting for code: upload a zip archive to .../code".into();
            self.set_status(ns, name, status).await?;
            return Ok(None);
        };
        status.phase = JobPhase::Building;
        self.set_status(ns, name, status).await?;
        let Some(runtime) = spec.runtime.clone() else {
            fail(
                status,
                "runtime: required for a self-contained job".to_string(),
            );
            self.set_status(ns, name, status).await?;
            return Ok(None);
        };
        let archive = match self.blobs.get(sha).await {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(namespace = %ns, job = %name, error = %e, "job archive unusable");
                let message = match e {
                    sless_blob::BlobError::Corrupt { .. } => format!(
                        "the stored code archive {sha} is corrupt (its bytes no longer match its sha256); upload the code again to repair it"
                    ),
                    sless_blob::BlobError::NotFound(_) => format!(
                        "the stored code archive {sha} is missing; upload the code again to repair it"
                    ),
                    _ => "the job's code could not be read; the server log has the details".into(),
                };
                fail(status, message);
                self.set_status(ns, name, status).await?;
                return Ok(None);
            }
        };
        let sink = self.logs.sink(ns, &pool_name(name));
        let entrypoint = spec
            .entrypoint
            .clone()
            .unwrap_or_else(|| runtime.family.default_entrypoint().to_string());
        let built = self
            .builder
            .build(BuildRequest {
                namespace: ns.to_string(),
                family: runtime.family,
                entrypoint: entrypoint.clone(),
                code_sha256: sha.clone(),
                archive,
                log: Arc::new(move |line: &str| sink.line("build", line)),
            })
            .await;
        let output = match built {
            Ok(o) => o,
            Err(BuildError::Failed { message }) => {
                fail(status, message);
                self.set_status(ns, name, status).await?;
                return Ok(None);
            }
            Err(e) => {
                fail(status, format!("build failed: {e}"));
                self.set_status(ns, name, status).await?;
                return Ok(None);
            }
        };
        let resolved =
            crate::secrets::resolve_env(self.secrets.get().map(|r| r.as_ref()), ns, &spec.env)
                .await;
        let resolved = match resolved {
            Ok(r) => r,
            Err(crate::secrets::ResolveError::Store(e)) => return Err(e),
            Err(crate::secrets::ResolveError::Invalid(message)) => {
                fail(status, message);
                self.set_status(ns, name, status).await?;
                return Ok(None);
            }
        };
        Ok(Some(Deployment {
            namespace: ns.clone(),
            name: pool_name(name),
            revision: spec.run_id,
            family: runtime.family,
            entrypoint,
            env: resolved.env,
            secret_env: resolved.secret_env,
            secret_files: resolved.files,
            secrets_digest: resolved.digest,
            memory_mb: spec.memory_mb.unwrap_or(128),
            cpu: sless_executor::DEFAULT_CPU_MILLICORES,
            timeout_sec: spec.timeout_sec.unwrap_or(SELF_CONTAINED_TIMEOUT),
            min_instances: 0,
            max_instances: 1,
            concurrency: 1,
            idle_timeout_sec: 3600,
            paused: false,
            private: true,
            network: sless_core::NetworkMode::default(),
            code_dir: output.code_dir,
            deps_dir: output.deps_dir,
        }))
    }

    /// The error plus the tail of what the attempt printed.
    async fn failure_message(
        &self,
        ns: &str,
        pool: &str,
        request_id: &str,
        attempt: u32,
        error: &str,
    ) -> String {
        let lines = self.logs.tail(ns, pool, 2000).await.unwrap_or_default();
        let tagged = format!("[{request_id}]");
        let mut output: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains(&tagged) || l.contains("[sless]"))
            .collect();
        let skip = output.len().saturating_sub(OUTPUT_TAIL);
        output.drain(..skip);
        let mut message = format!("attempt {attempt}: {error}");
        if !output.is_empty() {
            message.push_str("\n--- output ---\n");
            message.push_str(
                &output
                    .iter()
                    .map(|l| l.as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
        }
        message
    }
}

/// A change signal per job: readers [`watch`](StatusSignal::watch) a job and are woken
/// by every [`notify`](StatusSignal::notify) of it after that. Only jobs someone is
/// watching have an entry; the last watch to go removes it.
#[derive(Default)]
pub struct StatusSignal {
    watched: Mutex<HashMap<Key, tokio::sync::watch::Sender<()>>>,
}

/// One reader's subscription to a job's changes (see [`StatusSignal`]).
pub struct StatusWatch<'a> {
    signal: &'a StatusSignal,
    key: Key,
    changes: Option<tokio::sync::watch::Receiver<()>>,
}

impl StatusSignal {
    /// Subscribes to the job's changes from now on.
    pub fn watch(&self, namespace: &str, name: &str) -> StatusWatch<'_> {
        let key = (namespace.to_string(), name.to_string());
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        let changes = watched
            .entry(key.clone())
            .or_insert_with(|| tokio::sync::watch::channel(()).0)
            .subscribe();
        StatusWatch {
            signal: self,
            key,
            changes: Some(changes),
        }
    }

    /// Wakes every reader watching the job; nothing when no one is.
    pub fn notify(&self, namespace: &str, name: &str) {
        let watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = watched.get(&(namespace.to_string(), name.to_string())) {
            sender.send_replace(());
        }
    }

    /// How many jobs are being watched.
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.watched.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl StatusWatch<'_> {
    /// Returns once the job was notified since the watch was taken or this last
    /// returned (at once if that already happened).
    pub async fn changed(&mut self) {
        let Some(changes) = self.changes.as_mut() else {
            return;
        };
        // The sender lives in the signal's map while this receiver does, so this
        // cannot fail; if it did, returning makes the caller read the record again.
        let _ = changes.changed().await;
    }
}

impl Drop for StatusWatch<'_> {
    fn drop(&mut self) {
        let mut watched = self
            .signal
            .watched
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Under the lock, so no new watch of the job can come between.
        self.changes = None;
        if watched
            .get(&self.key)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            watched.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::StatusSignal;

    /// The watch wakes for a change after it was taken, and only then.
    #[tokio::test(start_paused = true)]
    async fn a_watch_wakes_on_its_jobs_change_only() {
        let signal = StatusSignal::default();
        signal.notify("team", "nightly"); // before the watch: not seen
        let mut watch = signal.watch("team", "nightly");
        let quiet = tokio::time::timeout(Duration::from_secs(60), watch.changed()).await;
        assert!(quiet.is_err(), "no change since the watch was taken");

        signal.notify("team", "other");
        signal.notify("elsewhere", "nightly");
        let quiet = tokio::time::timeout(Duration::from_secs(60), watch.changed()).await;
        assert!(quiet.is_err(), "other jobs' changes do not wake it");

        signal.notify("team", "nightly");
        tokio::time::timeout(Duration::from_millis(1), watch.changed())
            .await
            .expect("a change made after the watch is seen, even before the wait");
        let quiet = tokio::time::timeout(Duration::from_secs(60), watch.changed()).await;
        assert!(quiet.is_err(), "a change is seen once");
    }

    /// A reader parked on the watch is woken by a later change, at that moment.
    #[tokio::test(start_paused = true)]
    async fn a_parked_reader_wakes_when_the_job_changes() {
        let signal = std::sync::Arc::new(StatusSignal::default());
        let notifier = signal.clone();
        let start = tokio::time::Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(7)).await;
            notifier.notify("team", "nightly");
        });
        let mut watch = signal.watch("team", "nightly");
        watch.changed().await;
        assert_eq!(start.elapsed(), Duration::from_secs(7));
    }

    /// Watches of one job share an entry, both are woken, and the last one to go removes it.
    #[tokio::test(start_paused = true)]
    async fn the_last_watch_of_a_job_removes_its_entry() {
        let signal = StatusSignal::default();
        let mut a = signal.watch("team", "nightly");
        let mut b = signal.watch("team", "nightly");
        assert_eq!(signal.watched(), 1);
        signal.notify("team", "nightly");
        a.changed().await;
        b.changed().await;
        drop(a);
        assert_eq!(signal.watched(), 1);
        drop(b);
        assert_eq!(signal.watched(), 0);
        signal.notify("team", "nightly"); // no one watching: nothing kept
        assert_eq!(signal.watched(), 0);
    }
}
