//! Reconcile tests on tokio's paused clock, with fakes for the store, the code
//! store, the builder and the executor: each asserts on the status a user reads
//! and on the calls the reconcile made.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::Utc;
use sless_blob::{BlobError, BlobInfo, BlobStore, Stored, sha256_hex};
use sless_build::{BuildError, BuildOutput, BuildRequest};
use sless_core::{FunctionSpec, FunctionStatus, Phase};
use sless_executor::{DeployError, Deployment};
use sless_logs::LogStore;
use sless_store::{FunctionChange, FunctionRecord, Namespace, Store, StoreError};
use tokio::time::Instant;

use crate::{Build, Controller, Deploy, RECONCILE_BACKOFF};

const NS: &str = "team";
const FN: &str = "hello";

fn key() -> (String, String) {
    (NS.to_string(), FN.to_string())
}

/// A store error that goes away (the database was busy).
fn busy() -> StoreError {
    StoreError::Database(sqlx::Error::PoolTimedOut)
}

fn spec() -> FunctionSpec {
    serde_json::from_value(serde_json::json!({
        "runtime": "python3.12",
        "entrypoint": "main.handler",
    }))
    .expect("a valid spec")
}

/// The metadata store in memory: records, every status write it accepted, and
/// failures to inject into the next calls.
#[derive(Default)]
struct FakeStore {
    functions: Mutex<HashMap<(String, String), FunctionRecord>>,
    /// Accepted status writes, in order.
    statuses: Mutex<Vec<FunctionStatus>>,
    /// When each `get_function` was called.
    gets: Mutex<Vec<Instant>>,
    fail_gets: AtomicU32,
    fail_sets_of: Mutex<Option<(Phase, u32)>>,
}

impl FakeStore {
    /// Creates the function, or stores a new revision of it with `code`.
    fn put(&self, code: Option<&[u8]>) -> u64 {
        let mut functions = self.functions.lock().expect("lock");
        let now = Utc::now();
        let record = functions.entry(key()).or_insert_with(|| FunctionRecord {
            namespace: NS.into(),
            name: FN.into(),
            spec: spec(),
            status: FunctionStatus::default(),
            revision: 0,
            generation: 1,
            code_sha256: None,
            created_at: now,
            updated_at: now,
        });
        record.revision += 1;
        record.code_sha256 = code.map(sha256_hex);
        record.updated_at = now;
        record.revision
    }

    fn status(&self) -> FunctionStatus {
        self.functions.lock().expect("lock")[&key()].status.clone()
    }

    fn phases(&self) -> Vec<(Phase, u64)> {
        let statuses = self.statuses.lock().expect("lock");
        statuses.iter().map(|s| (s.phase, s.revision)).collect()
    }

    fn get_times(&self) -> Vec<Instant> {
        self.gets.lock().expect("lock").clone()
    }

    /// Takes one injected failure from `counter`, if any is left.
    fn take(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

fn unused(what: &str) -> StoreError {
    StoreError::NotFound {
        kind: "call the controller does not make",
        name: what.to_string(),
    }
}

#[async_trait]
impl Store for FakeStore {
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn ensure_namespace(&self, name: &str) -> Result<bool, StoreError> {
        Err(unused(name))
    }
    async fn get_namespace(&self, name: &str) -> Result<Namespace, StoreError> {
        Err(unused(name))
    }
    async fn list_namespaces(&self) -> Result<Vec<Namespace>, StoreError> {
        Err(unused("list_namespaces"))
    }
    async fn delete_namespace(
        &self,
        name: &str,
        _force: bool,
    ) -> Result<Vec<FunctionRecord>, StoreError> {
        Err(unused(name))
    }
    async fn create_function(&self, record: &FunctionRecord) -> Result<(), StoreError> {
        Err(unused(&record.name))
    }
    async fn get_function(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<FunctionRecord, StoreError> {
        self.gets.lock().expect("lock").push(Instant::now());
        if Self::take(&self.fail_gets) {
            return Err(busy());
        }
        let functions = self.functions.lock().expect("lock");
        functions
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| StoreError::NotFound {
                kind: "function",
                name: name.to_string(),
            })
    }
    async fn list_functions(
        &self,
        _namespace: Option<&str>,
    ) -> Result<Vec<FunctionRecord>, StoreError> {
        Ok(self
            .functions
            .lock()
            .expect("lock")
            .values()
            .cloned()
            .collect())
    }
    async fn update_function(
        &self,
        _namespace: &str,
        name: &str,
        _expect: Option<u64>,
        _change: FunctionChange,
    ) -> Result<FunctionRecord, StoreError> {
        Err(unused(name))
    }
    async fn set_status(
        &self,
        namespace: &str,
        name: &str,
        revision: u64,
        status: &FunctionStatus,
    ) -> Result<bool, StoreError> {
        {
            let mut fail = self.fail_sets_of.lock().expect("lock");
            if let Some((phase, n)) = fail.as_mut()
                && *phase == status.phase
                && *n > 0
            {
                *n -= 1;
                return Err(busy());
            }
        }
        let mut functions = self.functions.lock().expect("lock");
        match functions.get_mut(&(namespace.to_string(), name.to_string())) {
            Some(record) if record.revision == revision => {
                record.status = status.clone();
                self.statuses.lock().expect("lock").push(status.clone());
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    async fn delete_function(&self, namespace: &str, name: &str) -> Result<(), StoreError> {
        self.functions
            .lock()
            .expect("lock")
            .remove(&(namespace.to_string(), name.to_string()));
        Ok(())
    }
    async fn create_token(&self, hash: &str, _namespace: &str) -> Result<(), StoreError> {
        Err(unused(hash))
    }
    async fn token_namespace(&self, hash: &str) -> Result<Option<String>, StoreError> {
        Err(unused(hash))
    }
}

/// Code archives in memory; a key in `corrupt` reads as corrupt.
#[derive(Default)]
struct FakeBlobs {
    blobs: Mutex<HashMap<String, Bytes>>,
    corrupt: Mutex<Vec<String>>,
    gets: AtomicU32,
}

impl FakeBlobs {
    fn insert(&self, code: &[u8]) {
        self.blobs
            .lock()
            .expect("lock")
            .insert(sha256_hex(code), Bytes::copy_from_slice(code));
    }
}

#[async_trait]
impl BlobStore for FakeBlobs {
    async fn put(&self, bytes: Bytes) -> Result<(String, Stored), BlobError> {
        self.insert(&bytes);
        Ok((sha256_hex(&bytes), Stored::New))
    }
    async fn get(&self, sha256: &str) -> Result<Bytes, BlobError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        if self
            .corrupt
            .lock()
            .expect("lock")
            .iter()
            .any(|c| c == sha256)
        {
            return Err(BlobError::Corrupt {
                sha256: sha256.into(),
                actual: "0".repeat(64),
            });
        }
        let blobs = self.blobs.lock().expect("lock");
        blobs
            .get(sha256)
            .cloned()
            .ok_or_else(|| BlobError::NotFound(sha256.into()))
    }
    async fn list(&self) -> Result<Vec<BlobInfo>, BlobError> {
        Ok(Vec::new())
    }
    async fn remove_if_unused_since(
        &self,
        _sha256: &str,
        _cutoff: std::time::SystemTime,
    ) -> Result<Option<u64>, BlobError> {
        Ok(None)
    }
    async fn exists(&self, sha256: &str) -> Result<bool, BlobError> {
        Ok(self.blobs.lock().expect("lock").contains_key(sha256))
    }
    async fn ping(&self) -> Result<(), BlobError> {
        Ok(())
    }
}

/// A builder that answers at once (or when `held` is released) with the next
/// scripted failure, or else a build named after the code.
#[derive(Default)]
struct FakeBuild {
    calls: AtomicU32,
    failures: Mutex<VecDeque<BuildError>>,
    /// The next build panics (a bug somewhere below the reconcile).
    panic_next: std::sync::atomic::AtomicBool,
    /// While held, builds wait; `started` is notified when one begins.
    held: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    started: tokio::sync::Notify,
}

impl FakeBuild {
    fn hold(&self) -> Arc<tokio::sync::Semaphore> {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        *self.held.lock().expect("lock") = Some(gate.clone());
        gate
    }
}

#[async_trait]
impl Build for FakeBuild {
    async fn build(&self, request: BuildRequest) -> Result<BuildOutput, BuildError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.started.notify_one();
        let gate = self.held.lock().expect("lock").clone();
        if let Some(gate) = gate {
            let _go = gate.acquire().await.expect("the gate stays open");
        }
        if self.panic_next.swap(false, Ordering::SeqCst) {
            panic!("a bug in the builder");
        }
        if let Some(e) = self.failures.lock().expect("lock").pop_front() {
            return Err(e);
        }
        (request.log)("built");
        Ok(BuildOutput {
            build_key: format!("build-{}", request.code_sha256),
            code_dir: PathBuf::from(format!("/builds/{}", request.code_sha256)),
            deps_dir: None,
            reused: false,
        })
    }
}

/// An executor that records deployments and fails the next scripted ones.
#[derive(Default)]
struct FakeDeploy {
    deployments: Mutex<Vec<Deployment>>,
    serving: Mutex<HashMap<(String, String), u64>>,
    failures: Mutex<VecDeque<DeployError>>,
    removes: AtomicU32,
}

impl FakeDeploy {
    fn revisions(&self) -> Vec<u64> {
        let deployments = self.deployments.lock().expect("lock");
        deployments.iter().map(|d| d.revision).collect()
    }

    fn serving(&self) -> Option<u64> {
        self.serving.lock().expect("lock").get(&key()).copied()
    }
}

#[async_trait]
impl Deploy for FakeDeploy {
    async fn deploy(&self, deployment: Deployment) -> Result<(), DeployError> {
        self.deployments
            .lock()
            .expect("lock")
            .push(deployment.clone());
        if let Some(e) = self.failures.lock().expect("lock").pop_front() {
            return Err(e);
        }
        self.serving
            .lock()
            .expect("lock")
            .insert((deployment.namespace, deployment.name), deployment.revision);
        Ok(())
    }
    fn is_deployed(&self, namespace: &str, name: &str) -> bool {
        let serving = self.serving.lock().expect("lock");
        serving.contains_key(&(namespace.to_string(), name.to_string()))
    }
    fn remove(&self, namespace: &str, name: &str) {
        self.removes.fetch_add(1, Ordering::SeqCst);
        self.serving
            .lock()
            .expect("lock")
            .remove(&(namespace.to_string(), name.to_string()));
    }
}

struct World {
    store: Arc<FakeStore>,
    blobs: Arc<FakeBlobs>,
    build: Arc<FakeBuild>,
    deploy: Arc<FakeDeploy>,
    ctl: Arc<Controller>,
    _logs: tempfile::TempDir,
}

impl World {
    fn new() -> Self {
        let logs = tempfile::tempdir().expect("a temporary directory");
        let store = Arc::new(FakeStore::default());
        let blobs = Arc::new(FakeBlobs::default());
        let build = Arc::new(FakeBuild::default());
        let deploy = Arc::new(FakeDeploy::default());
        let ctl = Controller::new(
            store.clone(),
            blobs.clone(),
            build.clone(),
            deploy.clone(),
            Arc::new(LogStore::new(logs.path().to_path_buf(), 1 << 20).expect("a log store")),
            "http://sless.test/".into(),
        );
        Self {
            store,
            blobs,
            build,
            deploy,
            ctl,
            _logs: logs,
        }
    }

    /// Stores the function with code (also in the code store) as a new revision.
    fn upload(&self, code: &[u8]) -> u64 {
        self.blobs.insert(code);
        self.store.put(Some(code))
    }

    /// Enqueues the function and waits until its worker has nothing left to do.
    async fn reconcile(&self) {
        self.ctl.enqueue(NS, FN).settled().await;
    }

    fn builds(&self) -> u32 {
        self.build.calls.load(Ordering::SeqCst)
    }

    fn gateway_failure(&self) -> Option<String> {
        self.ctl.failed.get(NS, FN).map(|f| f.message)
    }
}

/// Lets every task run and timers up to `d` from now fire.
async fn advance(d: Duration) {
    tokio::time::sleep(d).await;
}

#[tokio::test(start_paused = true)]
async fn a_function_without_code_waits_pending_and_its_upload_builds_and_deploys_it() {
    let w = World::new();
    w.store.put(None);
    w.reconcile().await;
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Pending, 1));
    assert!(
        status.message.contains("upload a zip archive"),
        "{status:?}"
    );
    assert_eq!(w.builds(), 0);
    assert!(w.deploy.revisions().is_empty());

    let revision = w.upload(b"def handler(event): return 1");
    w.reconcile().await;
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Ready, revision));
    assert_eq!(status.message, "");
    assert_eq!(status.url, "http://sless.test/fn/team/hello");
    assert!(status.last_built_at.is_some());
    assert_eq!(
        w.store.phases(),
        [(Phase::Pending, 1), (Phase::Building, 2), (Phase::Ready, 2)]
    );
    let deployments = w.deploy.deployments.lock().expect("lock").clone();
    assert_eq!(deployments.len(), 1);
    let sha = sha256_hex(b"def handler(event): return 1");
    assert_eq!(deployments[0].revision, 2);
    assert_eq!(deployments[0].entrypoint, "main.handler");
    assert_eq!(
        deployments[0].code_dir,
        PathBuf::from(format!("/builds/{sha}"))
    );
    let in_use = w.ctl.builds_in_use(Duration::from_secs(60));
    assert_eq!(in_use.len(), 1);
    assert_eq!(in_use[0].build_key, format!("build-{sha}"));

    // Level-triggered: enqueueing a settled function changes nothing.
    w.reconcile().await;
    assert_eq!((w.builds(), w.deploy.revisions()), (1, vec![2]));
}

#[tokio::test(start_paused = true)]
async fn a_missing_archive_fails_once_and_is_not_retried_until_the_code_is_stored_again() {
    let w = World::new();
    let code = b"print('lost')";
    let revision = w.store.put(Some(code)); // recorded, but not in the code store
    w.reconcile().await;
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Failed, revision));
    assert!(
        status.message.contains("is missing; upload the code again"),
        "{status:?}"
    );
    // Nothing to serve: the function's URL tells why.
    let failure = w.gateway_failure().expect("a failure for the gateway");
    assert!(failure.contains("is missing"), "{failure}");

    // No retry loop: time passes, enqueues come (a restart's resync), nothing runs again.
    advance(Duration::from_secs(600)).await;
    w.reconcile().await;
    assert_eq!(
        w.ctl
            .resync_all(Duration::from_secs(1))
            .await
            .expect("resync"),
        1
    );
    assert_eq!(w.blobs.gets.load(Ordering::SeqCst), 1);
    assert_eq!(w.builds(), 0);
    assert_eq!(
        w.store.phases(),
        [(Phase::Building, revision), (Phase::Failed, revision)]
    );

    // Storing the same code again repairs it at the same revision.
    w.blobs.insert(code);
    w.ctl.enqueue_retry(NS, FN);
    w.reconcile().await;
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Ready, revision));
    assert_eq!(w.deploy.revisions(), [revision]);
    assert_eq!(w.gateway_failure(), None);
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_archive_fails_with_advice_to_upload_again() {
    let w = World::new();
    let code = b"print('flipped bit')";
    w.upload(code);
    w.blobs.corrupt.lock().expect("lock").push(sha256_hex(code));
    w.reconcile().await;
    let status = w.store.status();
    assert_eq!(status.phase, Phase::Failed);
    assert!(
        status.message.contains("is corrupt") && status.message.contains("upload the code again"),
        "{status:?}"
    );
    advance(Duration::from_secs(600)).await;
    assert_eq!(w.blobs.gets.load(Ordering::SeqCst), 1);
    assert_eq!(w.builds(), 0);
}

#[tokio::test(start_paused = true)]
async fn code_that_does_not_build_fails_once_and_a_new_revision_builds_again() {
    let w = World::new();
    w.build
        .failures
        .lock()
        .expect("lock")
        .push_back(BuildError::Failed {
            message: "main.py: SyntaxError: invalid syntax".into(),
        });
    let first = w.upload(b"def handler(:");
    w.reconcile().await;
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Failed, first));
    assert_eq!(status.message, "main.py: SyntaxError: invalid syntax");
    advance(Duration::from_secs(600)).await;
    w.reconcile().await;
    assert_eq!(w.builds(), 1);
    assert!(w.deploy.revisions().is_empty());

    let fixed = w.upload(b"def handler(event): return 1");
    w.reconcile().await;
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Ready, fixed));
    assert_eq!(w.builds(), 2);
    assert_eq!(w.deploy.revisions(), [fixed]);
}

#[tokio::test(start_paused = true)]
async fn a_revision_that_cannot_start_fails_while_the_old_one_keeps_serving() {
    let w = World::new();
    let good = w.upload(b"v1");
    w.reconcile().await;
    w.deploy
        .failures
        .lock()
        .expect("lock")
        .push_back(DeployError::InstanceFailed(
            "ImportError: no module named x".into(),
        ));
    let bad = w.upload(b"v2");
    w.reconcile().await;
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Failed, bad));
    assert_eq!(
        status.message,
        format!("revision {bad} could not start: ImportError: no module named x")
    );
    // The old revision still answers, so the URL does not report a failure.
    assert_eq!(w.deploy.serving(), Some(good));
    assert_eq!(w.gateway_failure(), None);
    advance(Duration::from_secs(600)).await;
    assert_eq!(w.deploy.revisions(), [good, bad]);
}

#[tokio::test(start_paused = true)]
async fn store_trouble_is_retried_with_growing_back_off_until_it_clears() {
    let w = World::new();
    let revision = w.upload(b"v1");
    w.store.fail_gets.store(4, Ordering::SeqCst);
    let start = Instant::now();
    w.reconcile().await;
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Ready, revision));
    assert_eq!(w.deploy.revisions(), [revision]);

    // Four failed reads, then the pass that worked (it reads twice: before and after the build).
    let times = w.store.get_times();
    assert_eq!(times.len(), 6, "{times:?}");
    assert_eq!(times[0], start);
    let mut previous = Duration::ZERO;
    for retry in 1..=4u32 {
        let gap = times[retry as usize] - times[retry as usize - 1];
        let full = RECONCILE_BACKOFF.delay(retry);
        assert!(
            gap >= full / 2 && gap <= full,
            "retry {retry} waited {gap:?}, expected {:?}..={full:?}",
            full / 2
        );
        assert!(
            gap >= previous,
            "back-off shrank: {gap:?} after {previous:?}"
        );
        previous = gap;
    }
}

#[tokio::test(start_paused = true)]
async fn a_status_that_could_not_be_written_is_written_again_without_redeploying() {
    let w = World::new();
    let revision = w.upload(b"v1");
    *w.store.fail_sets_of.lock().expect("lock") = Some((Phase::Ready, 2));
    w.reconcile().await;
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Ready, revision));
    // Built again (a reuse, for a real builder) but deployed once.
    assert_eq!(w.builds(), 3);
    assert_eq!(w.deploy.revisions(), [revision]);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_deploy_and_a_server_side_build_error_are_retried() {
    let w = World::new();
    w.build
        .failures
        .lock()
        .expect("lock")
        .push_back(BuildError::Io {
            context: "creating a build directory".into(),
            source: std::io::Error::other("no space left on device"),
        });
    w.deploy
        .failures
        .lock()
        .expect("lock")
        .push_back(DeployError::Cancelled);
    let revision = w.upload(b"v1");
    let enqueued = w.ctl.enqueue(NS, FN);

    // While the server's trouble lasts, the owner reads `Building` and why, not the details.
    advance(Duration::from_millis(1)).await;
    let status = w.store.status();
    assert_eq!(status.phase, Phase::Building);
    assert!(
        status.message.contains("server error and will be retried"),
        "{status:?}"
    );
    assert!(!status.message.contains("no space"), "{status:?}");

    enqueued.settled().await;
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Ready, revision));
    assert_eq!(status.message, "");
    assert_eq!(w.builds(), 3);
    assert_eq!(w.deploy.revisions(), [revision, revision]);
    assert!(!w.store.phases().iter().any(|(p, _)| *p == Phase::Failed));
}

#[tokio::test(start_paused = true)]
async fn a_newer_revision_during_a_build_wins_and_the_old_result_is_dropped() {
    let w = World::new();
    let gate = w.build.hold();
    let old = w.upload(b"v1");
    let first = w.ctl.enqueue(NS, FN);
    w.build.started.notified().await;

    let new = w.upload(b"v2");
    let second = w.ctl.enqueue(NS, FN);
    gate.add_permits(2);
    first.settled().await;
    second.settled().await;

    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Ready, new));
    assert_eq!(
        w.deploy.revisions(),
        [new],
        "the old build was never deployed"
    );
    assert_eq!(w.deploy.serving(), Some(new));
    assert!(!w.store.phases().contains(&(Phase::Ready, old)));
}

#[tokio::test(start_paused = true)]
async fn a_function_deleted_during_its_build_is_never_deployed() {
    let w = World::new();
    let gate = w.build.hold();
    w.upload(b"v1");
    let enqueued = w.ctl.enqueue(NS, FN);
    w.build.started.notified().await;

    w.store.delete_function(NS, FN).await.expect("delete");
    w.ctl.forget(NS, FN);
    gate.add_permits(1);
    enqueued.settled().await;

    assert!(w.deploy.revisions().is_empty());
    assert_eq!(w.deploy.serving(), None);
    assert!(w.ctl.builds_in_use(Duration::from_secs(60)).is_empty());
    assert_eq!(w.gateway_failure(), None);
    assert!(
        w.ctl.work.lock().expect("lock").is_empty(),
        "no worker is left"
    );
}

#[tokio::test(start_paused = true)]
async fn enqueues_during_a_pass_coalesce_into_one_more_pass() {
    let w = World::new();
    let gate = w.build.hold();
    let revision = w.upload(b"v1");
    let first = w.ctl.enqueue(NS, FN);
    w.build.started.notified().await;
    let more: Vec<_> = (0..5).map(|_| w.ctl.enqueue(NS, FN)).collect();
    gate.add_permits(1);
    first.settled().await;
    for enqueued in more {
        enqueued.settled().await;
    }
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Ready, revision));
    assert_eq!(w.builds(), 1);
    assert_eq!(w.deploy.revisions(), [revision]);
    // The first pass (two reads) and one more that found nothing to do.
    assert_eq!(w.store.get_times().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_enqueue_during_a_back_off_runs_at_once() {
    let w = World::new();
    let revision = w.upload(b"v1");
    w.store.fail_gets.store(6, Ordering::SeqCst);
    let enqueued = w.ctl.enqueue(NS, FN);
    advance(Duration::from_secs(5)).await;
    let before = w.store.get_times().len();
    assert!((2..=6).contains(&before), "{before} reads");
    w.store.fail_gets.store(0, Ordering::SeqCst);
    let at = Instant::now();
    w.ctl.enqueue(NS, FN).settled().await;
    enqueued.settled().await;
    assert_eq!(
        w.store.get_times()[before],
        at,
        "ran without waiting out the back-off"
    );
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Ready, revision));
}

#[tokio::test(start_paused = true)]
async fn a_restart_redeploys_ready_functions_and_waits_no_longer_than_its_patience() {
    let w = World::new();
    let revision = w.upload(b"v1");
    // As a previous server left it: ready, but nothing runs in this process.
    w.store
        .functions
        .lock()
        .expect("lock")
        .get_mut(&key())
        .expect("stored")
        .status = FunctionStatus {
        phase: Phase::Ready,
        revision,
        ..FunctionStatus::default()
    };
    assert_eq!(
        w.ctl
            .resync_all(Duration::from_secs(60))
            .await
            .expect("resync"),
        1
    );
    assert_eq!(w.deploy.revisions(), [revision]);
    assert_eq!(w.store.status().phase, Phase::Ready);

    // A store that keeps failing does not hold the start-up past its patience.
    let other = World::new();
    other.upload(b"v1");
    other.store.fail_gets.store(u32::MAX, Ordering::SeqCst);
    let start = Instant::now();
    other
        .ctl
        .resync_all(Duration::from_secs(5))
        .await
        .expect("resync");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(other.deploy.revisions().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_pass_that_panics_does_not_stall_the_function() {
    let w = World::new();
    let revision = w.upload(b"v1");
    w.build.panic_next.store(true, Ordering::SeqCst);
    w.reconcile().await;
    assert_eq!(w.store.status().phase, Phase::Building);
    assert!(w.ctl.work.lock().expect("lock").is_empty());

    w.reconcile().await;
    let status = w.store.status();
    assert_eq!((status.phase, status.revision), (Phase::Ready, revision));
    assert_eq!(w.deploy.revisions(), [revision]);
}
