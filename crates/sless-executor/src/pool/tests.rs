//! The pool's behaviour on tokio's paused clock, with fake instances: queueing,
//! limits, timeouts, draining, back-off, idle reaping, crash replacement and the
//! warm pool. Time only moves when every task waits, so timings are exact.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Pool;
use crate::fake::{BROKEN_ENTRYPOINT, FakeLauncher};
use crate::launcher::Instance;
use crate::warm::WarmPool;
use crate::{DeployError, Deployment, ExecutorConfig, InvokeError, InvokeRequest, InvokeResponse};

const START: Duration = Duration::from_millis(10);
const QUEUE_TIMEOUT: Duration = Duration::from_secs(10);

fn config(max_queue: usize) -> ExecutorConfig {
    ExecutorConfig {
        runtime_dir: "/nonexistent/runtime".into(),
        run_dir: "/nonexistent/run".into(),
        python: "/nonexistent/python3".into(),
        node: "/nonexistent/node".into(),
        start_timeout: Duration::from_secs(10),
        queue_timeout: QUEUE_TIMEOUT,
        max_queue,
        max_pids: 64,
        prewarm_per_runtime: 0,
        freeze_after: None,
        liveness_period: None,
        secrets_dir: None,
    }
}

fn deployment(revision: u64) -> Deployment {
    Deployment {
        namespace: "ns".into(),
        name: "f".into(),
        revision,
        family: sless_core::RuntimeFamily::Python3,
        entrypoint: "app:handler".into(),
        env: Default::default(),
        memory_mb: 128,
        cpu: 1000,
        timeout_sec: 0,
        min_instances: 0,
        max_instances: 10,
        concurrency: 1,
        idle_timeout_sec: 60,
        paused: false,
        private: false,
        network: Default::default(),
        code_dir: format!("/nonexistent/code/{revision}").into(),
        deps_dir: None,
        secret_env: Default::default(),
        secret_files: Default::default(),
        secrets_digest: String::new(),
    }
}

fn request(event: &'static str) -> InvokeRequest {
    InvokeRequest {
        event: Bytes::from_static(event.as_bytes()),
        request_id: "r".into(),
        source: sless_core::invocation::InvocationSource::Http,
        message: None,
    }
}

struct Harness {
    pool: Arc<Pool<FakeLauncher>>,
    launcher: Arc<FakeLauncher>,
    _logs: tempfile::TempDir,
}

impl Harness {
    fn new(cfg: ExecutorConfig, d: &Deployment) -> Self {
        Self::with(cfg, d, FakeLauncher::new(START), None)
    }

    fn with(
        cfg: ExecutorConfig,
        d: &Deployment,
        launcher: Arc<FakeLauncher>,
        warm: Option<Arc<WarmPool<FakeLauncher>>>,
    ) -> Self {
        Self::with_account(cfg, d, launcher, warm, crate::quota::Account::unlimited())
    }

    fn with_account(
        cfg: ExecutorConfig,
        d: &Deployment,
        launcher: Arc<FakeLauncher>,
        warm: Option<Arc<WarmPool<FakeLauncher>>>,
        account: Arc<crate::quota::Account>,
    ) -> Self {
        let logs = tempfile::tempdir().expect("tempdir");
        let store = sless_logs::LogStore::new(logs.path().to_path_buf(), 1 << 20).expect("logs");
        let pool = Pool::new(
            Arc::new(cfg),
            launcher.clone(),
            store.sink(&d.namespace, &d.name),
            Arc::new(AtomicU64::new(1)),
            warm,
            d.clone(),
            account,
        );
        Self {
            pool,
            launcher,
            _logs: logs,
        }
    }

    /// A pool already serving `d`.
    async fn deployed(cfg: ExecutorConfig, d: &Deployment) -> Self {
        let h = Self::new(cfg, d);
        h.pool.deploy(d.clone()).await.expect("deploy");
        h
    }

    fn invoke(&self, event: &'static str) -> JoinHandle<Result<InvokeResponse, InvokeError>> {
        let pool = self.pool.clone();
        tokio::spawn(async move { pool.invoke(request(event)).await })
    }

    fn ready(&self) -> u32 {
        self.pool.counts().ready
    }
}

/// Runs other tasks until `done` holds, without letting the clock move.
async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition never held");
}

/// Lets the paused clock run on by `by` (every task runs until it waits on time).
async fn pass(by: Duration) {
    tokio::time::sleep(by).await;
}

fn body(r: &InvokeResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

#[tokio::test(start_paused = true)]
async fn first_request_after_deploy_is_warm_and_the_instance_is_reused() {
    let d = deployment(1);
    let h = Harness::deployed(config(10), &d).await;
    assert_eq!(h.launcher.starts().len(), 1, "a deploy starts one instance");
    let a = h.pool.invoke(request("x")).await.expect("answer");
    let b = h.pool.invoke(request("x")).await.expect("answer");
    assert!(!a.cold_start && !b.cold_start);
    assert_eq!((a.revision, body(&a)), (1, body(&b)));
    assert_eq!(h.launcher.starts().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn deploy_starts_the_minimum_and_redeploying_the_same_revision_starts_nothing() {
    let mut d = deployment(1);
    d.min_instances = 3;
    let h = Harness::deployed(config(10), &d).await;
    assert_eq!(h.ready(), 3);
    h.pool.deploy(d.clone()).await.expect("same deploy");
    assert_eq!(h.launcher.starts().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn one_instance_takes_up_to_its_concurrency_at_once() {
    let mut d = deployment(1);
    d.concurrency = 3;
    let h = Harness::deployed(config(10), &d).await;
    let t0 = Instant::now();
    let calls: Vec<_> = (0..3).map(|_| h.invoke("ms:1000")).collect();
    let mut ids = Vec::new();
    for call in calls {
        let r = call.await.expect("join").expect("answer");
        ids.push(body(&r));
    }
    assert_eq!(
        t0.elapsed(),
        Duration::from_secs(1),
        "the three ran together"
    );
    ids.dedup();
    assert_eq!(ids.len(), 1, "one instance served them all");
    assert_eq!(h.launcher.starts().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_beyond_the_concurrency_starts_another_instance() {
    let mut d = deployment(1);
    d.concurrency = 2;
    let h = Harness::deployed(config(10), &d).await;
    let calls: Vec<_> = (0..3).map(|_| h.invoke("ms:1000")).collect();
    let mut cold = 0;
    for call in calls {
        cold += usize::from(call.await.expect("join").expect("answer").cold_start);
    }
    assert_eq!(cold, 1);
    assert_eq!(h.launcher.starts().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn max_instances_is_never_exceeded_and_the_rest_queue() {
    let mut d = deployment(1);
    d.max_instances = 3;
    let h = Harness::deployed(config(10), &d).await;
    let t0 = Instant::now();
    let calls: Vec<_> = (0..6).map(|_| h.invoke("ms:1000")).collect();
    for call in calls {
        call.await.expect("join").expect("answer");
    }
    assert_eq!(h.launcher.starts().len(), 3);
    assert_eq!(h.ready(), 3);
    // Two rounds of three; the two started instances took START to come up.
    assert_eq!(t0.elapsed(), Duration::from_secs(2) + START);
}

#[tokio::test(start_paused = true)]
async fn queued_requests_are_served_in_turn_on_a_single_instance() {
    let mut d = deployment(1);
    d.max_instances = 1;
    let h = Harness::deployed(config(10), &d).await;
    let t0 = Instant::now();
    let calls: Vec<_> = (0..3).map(|_| h.invoke("ms:1000")).collect();
    for call in calls {
        call.await.expect("join").expect("answer");
    }
    assert_eq!(t0.elapsed(), Duration::from_secs(3));
    assert_eq!(h.launcher.starts().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_answers_unavailable_at_once() {
    let mut d = deployment(1);
    d.max_instances = 1;
    let h = Harness::deployed(config(2), &d).await;
    let _busy = h.invoke("hang");
    until(|| h.launcher.instances()[0].life().inflight() == 1).await;
    let _queued: Vec<_> = (0..2).map(|_| h.invoke("x")).collect();
    until(|| h.pool.waiting() == 2).await;
    let t0 = Instant::now();
    match h.pool.invoke(request("x")).await {
        Err(InvokeError::Unavailable(m)) => assert!(m.contains("queue is full"), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_request_waiting_past_the_queue_timeout_is_unavailable() {
    let mut d = deployment(1);
    d.max_instances = 1;
    let h = Harness::deployed(config(10), &d).await;
    let _busy = h.invoke("hang");
    until(|| h.launcher.instances()[0].life().inflight() == 1).await;
    let t0 = Instant::now();
    match h.pool.invoke(request("x")).await {
        Err(InvokeError::Unavailable(m)) => assert!(m.contains("had room within 10 s"), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(t0.elapsed(), QUEUE_TIMEOUT);
    assert_eq!(h.pool.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_handler_past_its_timeout_is_a_timeout_and_its_instance_is_retired() {
    let mut d = deployment(1);
    d.timeout_sec = 2;
    let h = Harness::deployed(config(10), &d).await;
    let t0 = Instant::now();
    match h.pool.invoke(request("hang")).await {
        Err(InvokeError::Timeout { name, seconds }) => {
            assert_eq!((name.as_str(), seconds), ("f", 2))
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(t0.elapsed(), Duration::from_secs(2));
    let first = &h.launcher.instances()[0];
    assert!(first.was_killed(), "the timed-out instance is stopped");
    let next = h.pool.invoke(request("x")).await.expect("answer");
    assert!(next.cold_start);
    assert_ne!(body(&next), first.id());
}

#[tokio::test(start_paused = true)]
async fn an_instance_dying_mid_request_fails_it_and_says_how() {
    let d = deployment(1);
    let h = Harness::deployed(config(10), &d).await;
    match h.pool.invoke(request("crash")).await {
        Err(InvokeError::InstanceFailed(m)) => {
            assert!(m.contains("exited with status 1 without answering"), "{m}")
        }
        other => panic!("expected InstanceFailed, got {other:?}"),
    }
    until(|| h.pool.last_error().is_some()).await;
    assert!(
        h.pool
            .last_error()
            .unwrap_or_default()
            .contains("exited with status 1")
    );
}

#[tokio::test(start_paused = true)]
async fn crashed_instances_are_replaced_up_to_the_minimum_after_a_back_off() {
    let mut d = deployment(1);
    d.min_instances = 2;
    let h = Harness::deployed(config(10), &d).await;
    let crashed_at = Instant::now();
    h.launcher.instances()[0].crash();
    until(|| h.ready() == 1).await;
    pass(Duration::from_secs(1)).await;
    assert_eq!(h.ready(), 2);
    let starts = h.launcher.starts();
    assert_eq!(starts.len(), 3);
    assert_eq!(starts[2] - crashed_at, Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn a_crash_above_the_minimum_is_not_replaced() {
    let d = deployment(1);
    let h = Harness::deployed(config(10), &d).await;
    h.launcher.instances()[0].crash();
    pass(Duration::from_secs(5)).await;
    assert_eq!(h.ready(), 0);
    assert_eq!(h.launcher.starts().len(), 1);
    let r = h.pool.invoke(request("x")).await.expect("answer");
    assert!(r.cold_start);
}

#[tokio::test(start_paused = true)]
async fn restarts_back_off_doubling_up_to_the_cap_and_reset_after_a_success() {
    let mut d = deployment(1);
    d.min_instances = 1;
    let launcher = FakeLauncher::new(Duration::ZERO);
    let h = Harness::with(config(10), &d, launcher, None);
    h.pool.deploy(d.clone()).await.expect("deploy");
    h.launcher.fail_starts(12);
    let crashed_at = Instant::now();
    h.launcher.instances()[0].crash();
    pass(Duration::from_secs(600)).await;
    assert_eq!(h.ready(), 1, "the thirteenth restart succeeded");
    let mut times = vec![crashed_at];
    times.extend(&h.launcher.starts()[1..]);
    let gaps: Vec<u64> = times
        .windows(2)
        .map(|w| u64::try_from((w[1] - w[0]).as_millis()).expect("small"))
        .collect();
    let want: Vec<u64> = (0..13u32).map(|k| (100u64 << k).min(30_000)).collect();
    assert_eq!(gaps, want);

    // A success resets the back-off.
    let again = Instant::now();
    let live = h.launcher.instances().last().cloned().expect("instance");
    live.crash();
    pass(Duration::from_secs(1)).await;
    assert_eq!(h.ready(), 1);
    assert_eq!(
        *h.launcher.starts().last().expect("start") - again,
        Duration::from_millis(100)
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_start_fails_the_waiting_requests_without_waiting_for_the_queue_timeout() {
    let mut d = deployment(1);
    d.idle_timeout_sec = 1;
    let h = Harness::deployed(config(10), &d).await;
    pass(Duration::from_secs(2)).await;
    h.pool.reap_idle();
    until(|| h.ready() == 0).await;
    h.launcher.fail_starts(1);
    let t0 = Instant::now();
    match h.pool.invoke(request("x")).await {
        Err(InvokeError::Unavailable(m)) => {
            assert!(m.contains("could not start"), "{m}");
            assert!(m.contains("ImportError"), "{m}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(t0.elapsed(), START);
}

#[tokio::test(start_paused = true)]
async fn idle_instances_above_the_minimum_are_reaped_after_the_idle_timeout() {
    let mut d = deployment(1);
    d.min_instances = 1;
    d.idle_timeout_sec = 60;
    let h = Harness::deployed(config(10), &d).await;
    let calls: Vec<_> = (0..3).map(|_| h.invoke("ms:1000")).collect();
    for call in calls {
        call.await.expect("join").expect("answer");
    }
    assert_eq!(h.ready(), 3);
    pass(Duration::from_secs(59)).await;
    h.pool.reap_idle();
    assert_eq!(h.ready(), 3, "not idle long enough");
    pass(Duration::from_secs(2)).await;
    h.pool.reap_idle();
    assert_eq!(h.ready(), 1, "down to the minimum");
    until(|| h.launcher.alive() == 1).await;
}

#[tokio::test(start_paused = true)]
async fn at_min_zero_idle_reaping_scales_to_zero_and_the_next_request_is_cold() {
    let d = deployment(1);
    let h = Harness::deployed(config(10), &d).await;
    pass(Duration::from_secs(61)).await;
    h.pool.reap_idle();
    assert_eq!(h.ready(), 0);
    assert_eq!(h.launcher.alive(), 0);
    let r = h.pool.invoke(request("x")).await.expect("answer");
    assert!(r.cold_start);
}

#[tokio::test(start_paused = true)]
async fn a_busy_instance_is_not_reaped() {
    let mut d = deployment(1);
    d.idle_timeout_sec = 1;
    let h = Harness::deployed(config(10), &d).await;
    let busy = h.invoke("ms:5000");
    pass(Duration::from_secs(3)).await;
    h.pool.reap_idle();
    assert_eq!(h.ready(), 1);
    busy.await.expect("join").expect("answer");
}

#[tokio::test(start_paused = true)]
async fn redeploy_drains_old_instances_which_stop_once_idle() {
    let mut d1 = deployment(1);
    d1.min_instances = 1;
    let h = Harness::deployed(config(10), &d1).await;
    let old = h.launcher.instances()[0].clone();
    let inflight = h.invoke("ms:5000");
    until(|| old.life().inflight() == 1).await;

    let mut d2 = deployment(2);
    d2.min_instances = 1;
    h.pool.deploy(d2).await.expect("deploy 2");
    for _ in 0..3 {
        let r = h.pool.invoke(request("x")).await.expect("answer");
        assert_eq!(r.revision, 2);
        assert_ne!(body(&r), old.id(), "the old instance takes no new requests");
    }
    assert!(!old.was_killed(), "still finishing its request");
    let r = inflight.await.expect("join").expect("answer");
    assert_eq!(r.revision, 1);
    until(|| old.was_killed()).await;
    assert_eq!(h.ready(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_draining_instance_stuck_past_the_grace_period_is_killed() {
    let d1 = deployment(1);
    let h = Harness::deployed(config(10), &d1).await;
    let old = h.launcher.instances()[0].clone();
    let stuck = h.invoke("hang");
    until(|| old.life().inflight() == 1).await;
    h.pool.deploy(deployment(2)).await.expect("deploy 2");
    // Draining from now; at timeout_sec 0 the grace is 1 s + 5 s.
    pass(Duration::from_secs(6) - Duration::from_millis(1)).await;
    assert!(!old.was_killed());
    pass(Duration::from_millis(2)).await;
    assert!(old.was_killed());
    match stuck.await.expect("join") {
        Err(InvokeError::InstanceFailed(m)) => assert!(m.contains("killed by signal 9"), "{m}"),
        other => panic!("expected InstanceFailed, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_revision_that_cannot_start_is_not_switched_to() {
    let h = Harness::deployed(config(10), &deployment(1)).await;
    h.launcher.fail_starts(1);
    match h.pool.deploy(deployment(2)).await {
        Err(DeployError::InstanceFailed(m)) => assert!(m.contains("while starting"), "{m}"),
        other => panic!("expected InstanceFailed, got {other:?}"),
    }
    let r = h.pool.invoke(request("x")).await.expect("answer");
    assert_eq!(r.revision, 1);
}

#[tokio::test(start_paused = true)]
async fn paused_and_removed_functions_answer_without_starting_anything() {
    let mut d = deployment(1);
    d.paused = true;
    let h = Harness::deployed(config(10), &d).await;
    assert!(matches!(
        h.pool.invoke(request("x")).await,
        Err(InvokeError::Paused(name)) if name == "f"
    ));
    assert!(h.launcher.starts().is_empty());
    h.pool.close();
    assert!(matches!(
        h.pool.invoke(request("x")).await,
        Err(InvokeError::NotFound)
    ));
}

#[tokio::test(start_paused = true)]
async fn close_stops_every_instance() {
    let mut d = deployment(1);
    d.min_instances = 2;
    let h = Harness::deployed(config(10), &d).await;
    h.pool.close();
    h.pool
        .wait_stopped(Instant::now() + Duration::from_secs(30))
        .await;
    assert_eq!(h.launcher.alive(), 0);
    assert_eq!(h.ready(), 0);
}

#[tokio::test(start_paused = true)]
async fn prewarm_starts_one_instance_only_when_there_is_none() {
    let mut d = deployment(1);
    d.idle_timeout_sec = 1;
    let h = Harness::deployed(config(10), &d).await;
    h.pool.prewarm();
    assert_eq!(h.pool.counts().starting, 0, "one is running already");
    pass(Duration::from_secs(2)).await;
    h.pool.reap_idle();
    h.pool.prewarm();
    assert_eq!(h.pool.counts().starting, 1);
    pass(START * 2).await;
    assert_eq!(h.ready(), 1);
    assert_eq!(h.launcher.starts().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_cold_start_takes_a_generic_instance_and_the_warm_pool_refills() {
    let launcher = FakeLauncher::new(START);
    let warm = WarmPool::new(launcher.clone(), Arc::new(AtomicU64::new(1)), 1);
    pass(START * 2).await;
    assert_eq!(launcher.generic_starts().len(), 2, "one per runtime family");
    let d = deployment(7);
    let h = Harness::with(config(10), &d, launcher.clone(), Some(warm));
    h.pool.deploy(d.clone()).await.expect("deploy");
    assert!(launcher.starts().is_empty(), "no fresh start was needed");
    let r = h.pool.invoke(request("x")).await.expect("answer");
    assert_eq!(r.revision, 7);
    assert!(
        body(&r).starts_with('g'),
        "a generic instance: {}",
        body(&r)
    );
    // The taken one is replaced.
    until(|| launcher.generic_starts().len() == 3).await;
}

#[tokio::test(start_paused = true)]
async fn an_entrypoint_a_generic_instance_cannot_load_fails_the_deploy() {
    let launcher = FakeLauncher::new(START);
    let warm = WarmPool::new(launcher.clone(), Arc::new(AtomicU64::new(1)), 1);
    pass(START * 2).await;
    let mut d = deployment(1);
    d.entrypoint = BROKEN_ENTRYPOINT.into();
    let h = Harness::with(config(10), &d, launcher.clone(), Some(warm));
    match h.pool.deploy(d).await {
        Err(DeployError::InstanceFailed(m)) => assert!(m.contains("cannot load"), "{m}"),
        other => panic!("expected InstanceFailed, got {other:?}"),
    }
    let generic = &launcher.instances()[0];
    assert!(generic.was_killed(), "the generic instance is not reused");
}

#[tokio::test(start_paused = true)]
async fn the_warm_pool_backs_off_after_failed_starts() {
    let launcher = FakeLauncher::new(Duration::ZERO);
    launcher.fail_generic(3);
    let t0 = Instant::now();
    let _warm = WarmPool::new(launcher.clone(), Arc::new(AtomicU64::new(1)), 1);
    pass(Duration::from_secs(10)).await;
    let at: Vec<u128> = launcher
        .generic_starts()
        .iter()
        .map(|t| (*t - t0).as_millis())
        .collect();
    // Both kinds fail at once and retry after 400 ms; one fails again and retries
    // 800 ms later.
    assert_eq!(at, vec![0, 0, 400, 400, 1200]);
    assert_eq!(launcher.alive(), 2);
}

#[tokio::test(start_paused = true)]
async fn without_a_timeout_an_instance_whose_loop_stops_answering_is_killed_and_replaced() {
    let mut cfg = config(10);
    let period = Duration::from_secs(5);
    cfg.liveness_period = Some(period);
    let mut d = deployment(1);
    d.min_instances = 1;
    let h = Harness::deployed(cfg, &d).await;
    let t0 = Instant::now();
    match h.pool.invoke(request("stuck")).await {
        Err(InvokeError::InstanceFailed(m)) => assert!(m.contains("stopped responding"), "{m}"),
        other => panic!("expected InstanceFailed, got {other:?}"),
    }
    // One period to see it stalled, then LIVENESS_FAILURES unanswered checks.
    let limit = period * (crate::LIVENESS_FAILURES + 2);
    assert!(t0.elapsed() <= limit, "took {:?}", t0.elapsed());
    assert!(h.launcher.instances()[0].was_killed());
    pass(Duration::from_secs(1)).await;
    assert_eq!(h.ready(), 1, "the minimum is restored");
    assert!(
        h.pool
            .last_error()
            .unwrap_or_default()
            .contains("stopped responding")
    );
}

#[tokio::test(start_paused = true)]
async fn a_busy_instance_whose_loop_answers_is_left_alone() {
    let mut cfg = config(10);
    cfg.liveness_period = Some(Duration::from_secs(5));
    let h = Harness::deployed(cfg, &deployment(1)).await;
    let r = h.pool.invoke(request("ms:60000")).await.expect("answer");
    assert!(!r.cold_start);
    assert!(!h.launcher.instances()[0].was_killed());
}

#[tokio::test(start_paused = true)]
async fn output_settles_at_once_without_instances_and_when_their_pipes_are_empty() {
    let d = deployment(1);
    let h = Harness::new(config(10), &d);
    let t0 = Instant::now();
    assert!(h.pool.output_settled(Duration::from_secs(1)).await);
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "no instances: nothing to wait for"
    );
    h.pool.deploy(d.clone()).await.expect("deploy");
    h.pool.invoke(request("x")).await.expect("answer");
    let t0 = Instant::now();
    assert!(h.pool.output_settled(Duration::from_secs(1)).await);
    assert_eq!(t0.elapsed(), Duration::ZERO, "empty pipes settle at once");
}

#[tokio::test(start_paused = true)]
async fn output_that_never_settles_times_out_and_an_exit_ends_the_wait() {
    let d = deployment(1);
    let h = Harness::deployed(config(10), &d).await;
    let instance = h.launcher.instances()[0].clone();
    instance.keep_output_busy();
    let t0 = Instant::now();
    assert!(!h.pool.output_settled(Duration::from_secs(1)).await);
    assert_eq!(t0.elapsed(), Duration::from_secs(1), "bounded by the limit");
    // Once it exits its pumps end (the pipes close), and nothing is left to wait for,
    // though the pool has forgotten the instance.
    let waiting = {
        let pool = h.pool.clone();
        tokio::spawn(async move { pool.output_settled(Duration::from_secs(60)).await })
    };
    pass(Duration::from_millis(10)).await;
    assert!(!waiting.is_finished());
    instance.crash();
    let t0 = Instant::now();
    assert!(waiting.await.expect("join"));
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn over_the_instance_quota_a_request_waits_for_an_instance_or_is_refused_without_one() {
    let quotas = crate::quota::Quotas::new(sless_core::Quota {
        instances: 1,
        ..sless_core::Quota::default()
    });
    let account = quotas.account("ns");
    let d = deployment(1);
    let h = Harness::with_account(
        config(10),
        &d,
        FakeLauncher::new(START),
        None,
        account.clone(),
    );
    h.pool.deploy(d.clone()).await.expect("deploy");
    assert_eq!(account.usage().instances, 1);
    // At the quota, a request beyond the instance's concurrency waits for it.
    let calls: Vec<_> = (0..2).map(|_| h.invoke("ms:1000")).collect();
    for call in calls {
        call.await.expect("join").expect("answer");
    }
    assert_eq!(
        h.launcher.starts().len(),
        1,
        "no second instance was started"
    );

    // Scaled to zero, its reservation is returned.
    pass(Duration::from_secs(61)).await;
    h.pool.reap_idle();
    until(|| account.usage().instances == 0).await;
    // Another function of the namespace holds the only instance: nothing could serve.
    let other = account.force(128);
    match h.pool.invoke(request("x")).await {
        Err(InvokeError::QuotaExceeded(r)) => {
            assert_eq!(r.exceeded.kind, sless_core::QuotaKind::Instances);
            assert_eq!(
                r.exceeded.to_string(),
                "quota exceeded: instances 1 of 1 in use"
            );
        }
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    drop(other);
    let r = h.pool.invoke(request("x")).await.expect("answer");
    assert!(r.cold_start);
}
