//! A launcher whose instances are in-memory fakes, for unit tests of the pools on
//! tokio's paused clock: no root, no sandbox, no processes.
//!
//! A fake instance answers an event by what it says: `ms:N` answers after N ms
//! (of the paused clock), `hang` never answers, `stuck` never answers and stops the
//! instance's serving loop (liveness probes fail), `crash` makes the instance exit
//! without answering; anything else answers at once. The answer is the instance's id.
//! Its output pipes are always found empty, unless [`FakeInstance::keep_output_busy`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use sless_core::{NetworkMode, RuntimeFamily};
use sless_logs::LogSink;
use sless_sandbox::Exit;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::instance::{CallError, SpecialiseError, StartError, StderrTail};
use crate::launcher::{self, Instance, Launcher, Lifecycle, READY, STOPPING};
use crate::liveness::Activity;
use crate::output::{CloseOnDrop, Pipe};
use crate::{Deployment, InvokeRequest};

/// The entrypoint a fake generic instance refuses to load.
pub const BROKEN_ENTRYPOINT: &str = "broken:handler";

/// Starts [`FakeInstance`]s and remembers what it did.
#[derive(Default)]
pub struct FakeLauncher {
    state: Mutex<FakeState>,
}

#[derive(Default)]
struct FakeState {
    /// How long a start takes.
    start_delay: Duration,
    /// How many of the next function starts fail.
    fail_starts: u32,
    /// How many of the next generic starts fail.
    fail_generic: u32,
    /// When each function start began.
    starts: Vec<Instant>,
    /// When each generic start began.
    generic_starts: Vec<Instant>,
    /// Every instance started, in order.
    instances: Vec<Arc<FakeInstance>>,
}

impl FakeLauncher {
    pub fn new(start_delay: Duration) -> Arc<Self> {
        let launcher = Self::default();
        launcher.lock().start_delay = start_delay;
        Arc::new(launcher)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the next `n` function starts fail.
    pub fn fail_starts(&self, n: u32) {
        self.lock().fail_starts = n;
    }

    /// Makes the next `n` generic starts fail.
    pub fn fail_generic(&self, n: u32) {
        self.lock().fail_generic = n;
    }

    /// When each function start began.
    pub fn starts(&self) -> Vec<Instant> {
        self.lock().starts.clone()
    }

    /// When each generic start began.
    pub fn generic_starts(&self) -> Vec<Instant> {
        self.lock().generic_starts.clone()
    }

    /// Every instance started so far.
    pub fn instances(&self) -> Vec<Arc<FakeInstance>> {
        self.lock().instances.clone()
    }

    /// Instances started so far that have not exited.
    pub fn alive(&self) -> usize {
        self.lock()
            .instances
            .iter()
            .filter(|i| !i.is_dead())
            .count()
    }

    async fn launch(
        &self,
        id: String,
        revision: u64,
        generic: bool,
    ) -> Result<Arc<FakeInstance>, StartError> {
        let (delay, fail) = {
            let mut st = self.lock();
            let now = Instant::now();
            let fail = if generic {
                st.generic_starts.push(now);
                take_one(&mut st.fail_generic)
            } else {
                st.starts.push(now);
                take_one(&mut st.fail_starts)
            };
            (st.start_delay, fail)
        };
        tokio::time::sleep(delay).await;
        if fail {
            return Err(StartError::Exited {
                exit: Some(Exit {
                    code: Some(1),
                    signal: None,
                    oom_killed: false,
                }),
                output: StderrTail(vec!["ImportError: no module named app".into()]),
            });
        }
        let (exit_tx, exit_rx) = watch::channel(None);
        let output = [Pipe::new(), Pipe::new()];
        let busy_output = Arc::new(AtomicBool::new(false));
        for pipe in &output {
            tokio::spawn(fake_pump(
                pipe.clone(),
                busy_output.clone(),
                exit_rx.clone(),
            ));
        }
        let instance = Arc::new(FakeInstance {
            id,
            life: Lifecycle::new(),
            revision: AtomicU64::new(revision),
            answered: AtomicU64::new(0),
            unresponsive: AtomicBool::new(false),
            stuck: AtomicBool::new(false),
            last_used: Mutex::new(Instant::now()),
            exit_tx,
            exit_rx,
            output,
            busy_output,
        });
        instance.life.set_state(READY);
        self.lock().instances.push(instance.clone());
        Ok(instance)
    }
}

/// Stands in for the pump of an output pipe: finds it empty at every look, unless
/// `busy` (a writer that never lets up); ends when the instance exits.
async fn fake_pump(
    pipe: Arc<Pipe>,
    busy: Arc<AtomicBool>,
    mut exit: watch::Receiver<Option<Exit>>,
) {
    let _closed = CloseOnDrop(pipe.clone());
    let looks = std::future::poll_fn(|cx| {
        pipe.on_park(cx.waker(), || !busy.load(Ordering::Acquire));
        Poll::<()>::Pending
    });
    tokio::select! {
        () = looks => {}
        _ = exit.wait_for(|e| e.is_some()) => {}
    }
}

/// Uses up one of `n` planned failures; whether there was one.
fn take_one(n: &mut u32) -> bool {
    let had = *n > 0;
    *n = n.saturating_sub(1);
    had
}

impl Launcher for FakeLauncher {
    type Instance = FakeInstance;

    async fn start(
        &self,
        _sink: &LogSink,
        d: &Deployment,
        id: String,
    ) -> Result<Arc<FakeInstance>, StartError> {
        self.launch(id, d.revision, false).await
    }

    async fn start_generic(
        &self,
        _family: RuntimeFamily,
        _network: NetworkMode,
        id: String,
    ) -> Result<Arc<FakeInstance>, StartError> {
        self.launch(id, 0, true).await
    }
}

/// An instance that lives in memory.
pub struct FakeInstance {
    id: String,
    life: Lifecycle,
    revision: AtomicU64,
    answered: AtomicU64,
    unresponsive: AtomicBool,
    /// Its serving loop is blocked: probes go unanswered.
    stuck: AtomicBool,
    last_used: Mutex<Instant>,
    exit_tx: watch::Sender<Option<Exit>>,
    exit_rx: watch::Receiver<Option<Exit>>,
    output: [Arc<Pipe>; 2],
    busy_output: Arc<AtomicBool>,
}

impl FakeInstance {
    /// Makes the instance exit by itself with status 1, as a crash does.
    pub fn crash(&self) {
        self.exit_tx.send_replace(Some(Exit {
            code: Some(1),
            signal: None,
            oom_killed: false,
        }));
    }

    /// Makes its output pipes never empty, as a writer that never lets up would.
    pub fn keep_output_busy(&self) {
        self.busy_output.store(true, Ordering::Release);
    }

    /// Whether it was stopped on purpose.
    pub fn was_killed(&self) -> bool {
        self.life.state() == STOPPING
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }
}

impl Instance for FakeInstance {
    fn id(&self) -> &str {
        &self.id
    }

    fn life(&self) -> &Lifecycle {
        &self.life
    }

    fn revision(&self) -> u64 {
        self.revision.load(Ordering::Acquire)
    }

    async fn call(
        &self,
        req: &InvokeRequest,
        timeout: Option<Duration>,
    ) -> Result<(bool, Bytes), CallError> {
        let event = std::str::from_utf8(&req.event).unwrap_or("");
        let work = async {
            match event {
                "hang" => std::future::pending::<()>().await,
                "stuck" => {
                    self.stuck.store(true, Ordering::Release);
                    std::future::pending::<()>().await
                }
                "crash" => {
                    self.crash();
                    return Err(CallError::NoAnswer(sless_wire::WireError::Closed));
                }
                _ => {
                    if let Some(ms) = event.strip_prefix("ms:").and_then(|n| n.parse().ok()) {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                }
            }
            self.answered.fetch_add(1, Ordering::Relaxed);
            Ok((true, Bytes::from(self.id.clone())))
        };
        // A killed instance's connections close: its requests end without an answer.
        let mut exit = self.exit_rx.clone();
        let or_exit = async {
            tokio::select! {
                r = work => r,
                _ = exit.wait_for(|e| e.is_some()) => Err(CallError::NoAnswer(sless_wire::WireError::Closed)),
            }
        };
        let result = match timeout {
            Some(t) => tokio::time::timeout(t, or_exit)
                .await
                .unwrap_or(Err(CallError::Timeout)),
            None => or_exit.await,
        };
        self.touch();
        result
    }

    async fn specialise(&self, d: &Deployment, _sink: &LogSink) -> Result<(), SpecialiseError> {
        if d.entrypoint == BROKEN_ENTRYPOINT {
            return Err(SpecialiseError::Load(format!(
                "cannot load {BROKEN_ENTRYPOINT}"
            )));
        }
        self.revision.store(d.revision, Ordering::Release);
        Ok(())
    }

    async fn probe(&self) -> bool {
        !self.is_dead() && !self.stuck.load(Ordering::Acquire)
    }

    fn activity(&self) -> Option<Activity> {
        launcher::activity(
            &self.life,
            self.is_dead(),
            self.answered.load(Ordering::Relaxed),
        )
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    fn kill(&self) {
        self.life.set_state(STOPPING);
        if !self.is_dead() {
            self.exit_tx.send_replace(Some(Exit {
                code: None,
                signal: Some(9),
                oom_killed: false,
            }));
        }
    }

    fn kill_unresponsive(&self) {
        self.unresponsive.store(true, Ordering::Release);
        self.kill();
    }

    fn is_unresponsive(&self) -> bool {
        self.unresponsive.load(Ordering::Acquire)
    }

    fn is_dead(&self) -> bool {
        self.exit_rx.borrow().is_some()
    }

    fn exit(&self) -> watch::Receiver<Option<Exit>> {
        self.exit_rx.clone()
    }

    fn output(&self) -> &[Arc<Pipe>] {
        &self.output
    }

    fn freeze_if_idle(&self, _after: Duration) -> bool {
        false
    }

    fn thaw(&self) -> std::io::Result<()> {
        Ok(())
    }

    fn cleanup(&self) {}
}
