//! Running jobs: one-shot invocations of a function, or of self-contained code,
//! each in a private pool of its own (named `job.<name>`, which no `/fn/` URL can
//! reach), with an attempts limit, back-off, and result or failure capture.
//!
//! A run belongs to a `run_id`: raising it starts a new run (and stops an old one
//! still going); status writes of a stale run are ignored by the store.

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
    me: Weak<Jobs>,
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
            me: me.clone(),
        })
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
            self.store.set_job_status(ns, name, &status).await?;
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
        self.store.set_job_status(ns, name, &status).await?;

        let pool = deployment.name.clone();
        let timeout = deployment.timeout_sec;
        if let Err(e) = self.executor.deploy(deployment).await {
            status.phase = JobPhase::Failed;
            status.message = format!("the job could not start: {e}");
            status.finished_at = Some(Utc::now());
            self.executor.remove(ns, &pool);
            self.store.set_job_status(ns, name, &status).await?;
            return Ok(());
        }
        let event = match sless_invoke::encode_event(&job.spec.event) {
            Ok(event) => event,
            Err(e) => {
                status.phase = JobPhase::Failed;
                status.message = e.to_string();
                status.finished_at = Some(Utc::now());
                self.executor.remove(ns, &pool);
                self.store.set_job_status(ns, name, &status).await?;
                return Ok(());
            }
        };
        // Records name the function a job ran, or the job's pool for its own code.
        let label = job.spec.function.clone().unwrap_or_else(|| pool.clone());
        for attempt in 1..=job.spec.max_attempts {
            status.attempts = attempt;
            self.store.set_job_status(ns, name, &status).await?;
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
                        self.store.set_job_status(ns, name, &status).await?;
                        let backoff = ATTEMPT_BACKOFF.delay(attempt);
                        tokio::time::sleep(backoff).await;
                    }
                }
            }
        }
        status.finished_at = Some(Utc::now());
        self.executor.remove(ns, &pool);
        self.store.set_job_status(ns, name, &status).await?;
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
                self.store.set_job_status(ns, name, status).await?;
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
            self.store.set_job_status(ns, name, status).await?;
            return Ok(None);
        };
        status.phase = JobPhase::Building;
        self.store.set_job_status(ns, name, status).await?;
        let Some(runtime) = spec.runtime.clone() else {
            fail(
                status,
                "runtime: required for a self-contained job".to_string(),
            );
            self.store.set_job_status(ns, name, status).await?;
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
                self.store.set_job_status(ns, name, status).await?;
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
                self.store.set_job_status(ns, name, status).await?;
                return Ok(None);
            }
            Err(e) => {
                fail(status, format!("build failed: {e}"));
                self.store.set_job_status(ns, name, status).await?;
                return Ok(None);
            }
        };
        Ok(Some(Deployment {
            namespace: ns.clone(),
            name: pool_name(name),
            revision: spec.run_id,
            family: runtime.family,
            entrypoint,
            env: spec.env.clone(),
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
