//! One running instance: its sandboxed process, its socket and a small pool of
//! keep-alive HTTP/1.1 connections to it (see docs/instance-protocol.md).

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sless_core::{NetworkMode, RuntimeFamily};
use sless_logs::LogSink;
use sless_sandbox::{Exit, Killer, Mount, Network, ProcessSpec, Sandbox};
use sless_wire::{Conn, RequestHead};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::launcher::{self, Launcher, Lifecycle, READY, STOPPING};
use crate::liveness::Activity;
use crate::output::{CloseOnDrop, Pipe, Watched};
use crate::{Deployment, ExecutorConfig, InvokeRequest};

/// Idle connections kept per instance (beyond them, finished connections close).
const MAX_IDLE_CONNS: usize = 64;

/// Lines of stderr kept to explain a failed start.
const STDERR_TAIL: usize = 12;

/// How long a failed start waits for the process's exit and its last stderr lines,
/// to say why it failed (the sandbox kills the whole cgroup, so both come quickly).
const FAILED_START_REPORT: Duration = Duration::from_secs(2);

/// Starts sandboxed instances: the executor's [`Launcher`].
pub(crate) struct SandboxLauncher {
    pub cfg: Arc<ExecutorConfig>,
    pub sandbox: Arc<Sandbox>,
}

impl Launcher for SandboxLauncher {
    type Instance = SandboxInstance;

    async fn start(
        &self,
        sink: &LogSink,
        d: &Deployment,
        id: String,
    ) -> Result<Arc<SandboxInstance>, StartError> {
        SandboxInstance::start(&self.cfg, &self.sandbox, sink, d, id).await
    }

    async fn start_generic(
        &self,
        family: RuntimeFamily,
        network: NetworkMode,
        id: String,
    ) -> Result<Arc<SandboxInstance>, StartError> {
        SandboxInstance::start_generic(&self.cfg, &self.sandbox, family, network, id).await
    }
}

/// A sandboxed process serving the instance protocol.
pub(crate) struct SandboxInstance {
    pub id: String,
    /// The revision it serves; 0 while it is a generic (pre-started) instance.
    revision: AtomicU64,
    family: RuntimeFamily,
    network: NetworkMode,
    socket: PathBuf,
    run_dir: PathBuf,
    /// Where the function's files are linked in when a generic instance is specialised.
    slot: Option<(PathBuf, PathBuf)>,
    /// Its `/run/secrets` on the host, and who owns the files in it.
    secrets: Option<SecretsDir>,
    sink: Arc<SinkSlot>,
    /// Its stdout and stderr, as their pumps report on them.
    output: [Arc<Pipe>; 2],
    conns: Mutex<Vec<Conn<UnixStream>>>,
    life: Lifecycle,
    /// Requests answered so far (any answer shows its serving loop alive).
    answered: AtomicU64,
    /// Its serving loop stopped answering liveness checks and it was killed for that;
    /// the requests it held fail with a message saying so.
    unresponsive: AtomicBool,
    /// Its cgroup is frozen (see `ExecutorConfig::freeze_after`); changed only under the
    /// pool's lock, so a freeze never races the pick of a request.
    frozen: AtomicBool,
    killer: Killer,
    last_used: Mutex<Instant>,
    exit: watch::Receiver<Option<Exit>>,
}

/// Why a request got no answer from an instance.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// The handler ran past the request's timeout.
    #[error("timed out")]
    Timeout,
    /// No connection to the instance's socket could be made.
    #[error("cannot connect to instance ({0})")]
    Connect(std::io::Error),
    /// The request head could not be written (a header held a control character).
    #[error("{0}")]
    Request(sless_wire::WireError),
    /// The connection failed before any of the answer arrived.
    #[error("instance failed without answering ({0})")]
    NoAnswer(sless_wire::WireError),
    /// The connection failed, or the answer was malformed, while it arrived.
    #[error("instance failed while answering ({0})")]
    BrokenAnswer(sless_wire::WireError),
    /// The instance answered a status the protocol does not allow.
    #[error("instance answered status {0}, which the protocol does not allow")]
    BadStatus(u16),
}

/// Why an instance could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// Its run directory (socket, code and deps slots) could not be made.
    #[error("cannot prepare instance directory {}: {source}", dir.display())]
    Prepare {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The sandbox refused to start the process.
    #[error("cannot start instance: {0}")]
    Spawn(sless_sandbox::SandboxError),
    /// The CPU limit could not be applied to its cgroup.
    #[error("cannot set the CPU limit: {0}")]
    CpuLimit(std::io::Error),
    /// The process exited before it said it was ready (`None`: its exit status
    /// did not arrive in time).
    #[error("instance {} while starting{output}", exit.as_ref().map_or_else(|| "exited".to_string(), Exit::to_string))]
    Exited {
        exit: Option<Exit>,
        output: StderrTail,
    },
    /// It did not say it was ready within the start timeout.
    #[error("instance did not become ready within {seconds} s{output}")]
    NotReady { seconds: u64, output: StderrTail },
    /// A custom runtime's bootstrap did not listen on its socket within the start timeout.
    #[error(
        "bootstrap did not become ready within {seconds} s: it must listen on the Unix socket $SLESS_SOCKET and answer GET /_sless/ready{output}"
    )]
    BootstrapNotReady { seconds: u64, output: StderrTail },
    /// Its readiness pipe was missing, failed or carried something else than `ready`.
    #[error("instance {why}{output}")]
    ReadyPipe {
        why: ReadyPipeError,
        output: StderrTail,
    },
    /// It said it was ready but did not answer `GET /_sless/ready` with 2xx.
    #[error("instance failed its readiness check: {why}{output}")]
    ReadinessCheck { why: ProbeError, output: StderrTail },
    /// A generic instance could not load the function's entrypoint (the user's
    /// problem; the message is the shim's).
    #[error("{0}")]
    Load(String),
}

/// Why the readiness pipe did not carry `ready`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadyPipeError {
    /// The sandbox gave the instance no readiness pipe.
    #[error("has no readiness pipe")]
    Missing,
    /// Reading the pipe failed.
    #[error("readiness pipe failed: {0}")]
    Io(std::io::Error),
    /// The pipe closed without `ready`: the process exited (or closed it).
    #[error("closed its readiness pipe")]
    Closed,
    /// Something else than `ready` arrived.
    #[error("wrote garbage to its readiness pipe")]
    Garbage,
    /// A custom runtime put something else than a Unix socket at `SLESS_SOCKET`.
    #[error("put something else than a listening Unix socket at $SLESS_SOCKET")]
    NotASocket,
}

/// Why `GET /_sless/ready` (or `/_sless/load`) did not succeed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    /// The exchange failed.
    #[error("{0}")]
    Call(#[from] CallError),
    /// The instance answered with a status other than 2xx.
    #[error("status {0}")]
    Status(u16),
}

/// The last lines an instance wrote to stderr, shown after a failed start as
/// `": line\nline"` (nothing when it wrote nothing).
#[derive(Debug, Default)]
pub(crate) struct StderrTail(pub Vec<String>);

impl std::fmt::Display for StderrTail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, ": {}", self.0.join("\n"))
        }
    }
}

impl SandboxInstance {
    /// Starts an instance of `d` and returns once it has answered the readiness check.
    pub async fn start(
        cfg: &ExecutorConfig,
        sandbox: &Sandbox,
        sink: &LogSink,
        d: &Deployment,
        id: String,
    ) -> Result<Arc<SandboxInstance>, StartError> {
        let run_dir = cfg.run_dir.join(&id);
        let sock_dir = run_dir.join("sock");
        prepare_run_dir(&run_dir, &sock_dir, None, d.family == RuntimeFamily::Custom).map_err(
            |source| StartError::Prepare {
                dir: run_dir.clone(),
                source,
            },
        )?;
        let secrets = SecretsDir::prepare(cfg, sandbox, &id).map_err(|source| {
            let _ = std::fs::remove_dir_all(&run_dir);
            StartError::Prepare {
                dir: run_dir.clone(),
                source,
            }
        })?;
        let written = match &secrets {
            Some(dir) => dir.write(&d.secret_files),
            None if d.secret_files.is_empty() => Ok(()),
            None => Err(std::io::Error::other(
                "the server has no directory for secret files (--secrets-dir)",
            )),
        };
        if let Err(source) = written {
            let _ = std::fs::remove_dir_all(&run_dir);
            if let Some(dir) = &secrets {
                dir.remove();
            }
            return Err(StartError::Prepare {
                dir: run_dir.clone(),
                source,
            });
        }
        let mut spec = process_spec(
            cfg,
            (d.family, d.network),
            &d.entrypoint,
            &id,
            &sock_dir,
            &d.code_dir,
            d.deps_dir.as_deref(),
            d.memory_mb,
        );
        spec.env.extend(function_env(d));
        let instance = launch(
            cfg,
            sandbox,
            spec,
            Arc::new(SinkSlot::new(Some(sink.clone()))),
            run_dir,
            None,
            secrets,
            (d.family, d.network),
            d.cpu,
        )
        .await?;
        instance.revision.store(d.revision, Ordering::Release);
        Ok(instance)
    }

    /// Starts a generic instance of a runtime family with a network mode: sandboxed
    /// (its network connected), interpreter and shim loaded, no function yet.
    /// [`launcher::Instance::specialise`] gives it one.
    pub async fn start_generic(
        cfg: &ExecutorConfig,
        sandbox: &Sandbox,
        family: RuntimeFamily,
        network: NetworkMode,
        id: String,
    ) -> Result<Arc<SandboxInstance>, StartError> {
        let run_dir = cfg.run_dir.join(&id);
        let sock_dir = run_dir.join("sock");
        let slot = (run_dir.join("code"), run_dir.join("deps"));
        prepare_run_dir(&run_dir, &sock_dir, Some(&slot), false).map_err(|source| {
            StartError::Prepare {
                dir: run_dir.clone(),
                source,
            }
        })?;
        let secrets = SecretsDir::prepare(cfg, sandbox, &id).map_err(|source| {
            let _ = std::fs::remove_dir_all(&run_dir);
            StartError::Prepare {
                dir: run_dir.clone(),
                source,
            }
        })?;
        let spec = process_spec(
            cfg,
            (family, network),
            "",
            &id,
            &sock_dir,
            &slot.0,
            Some(&slot.1),
            GENERIC_MEMORY_MB,
        );
        launch(
            cfg,
            sandbox,
            spec,
            Arc::new(SinkSlot::new(None)),
            run_dir,
            Some(slot),
            secrets,
            (family, network),
            crate::DEFAULT_CPU_MILLICORES,
        )
        .await
    }

    async fn readiness_check(&self) -> Result<(), ProbeError> {
        let mut conn = self.checkout().await?;
        let head = RequestHead::new("GET", "/_sless/ready")
            .header("host", "instance")
            .map_err(CallError::Request)?
            .finish(0);
        let resp = conn
            .exchange(&head, b"")
            .await
            .map_err(CallError::BrokenAnswer)?;
        self.checkin(conn);
        if (200..300).contains(&resp.status) {
            Ok(())
        } else {
            Err(ProbeError::Status(resp.status))
        }
    }

    async fn checkout(&self) -> Result<Conn<UnixStream>, CallError> {
        loop {
            let idle = self.conns.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match idle {
                Some(conn) if !conn.peer_gone() => return Ok(conn),
                Some(_) => continue,
                None => break,
            }
        }
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(CallError::Connect)?;
        Ok(Conn::new(stream))
    }

    fn checkin(&self, conn: Conn<UnixStream>) {
        if !conn.reusable() {
            return;
        }
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.len() < MAX_IDLE_CONNS {
            conns.push(conn);
        }
    }
}

impl launcher::Instance for SandboxInstance {
    fn id(&self) -> &str {
        &self.id
    }

    fn life(&self) -> &Lifecycle {
        &self.life
    }

    /// Turns a generic instance into an instance of `d`: links the function's
    /// files into its (bind-mounted) code and deps directories, applies the memory
    /// limit and asks the shim to load the entrypoint. `Err(Load)` is the user's
    /// problem (the module or function is missing); anything else is the platform's.
    async fn specialise(&self, d: &Deployment, sink: &LogSink) -> Result<(), SpecialiseError> {
        let Some((code, deps)) = &self.slot else {
            return Err(SpecialiseError::Platform("not a generic instance".into()));
        };
        if self.family != d.family {
            return Err(SpecialiseError::Platform("runtime family differs".into()));
        }
        if self.network != d.network {
            return Err(SpecialiseError::Platform("network mode differs".into()));
        }
        let (src_code, src_deps) = (d.code_dir.clone(), d.deps_dir.clone());
        let (dst_code, dst_deps) = (code.clone(), deps.clone());
        let secrets = self.secrets.clone();
        let secret_files = d.secret_files.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            link_tree(&src_code, &dst_code)?;
            if let Some(src) = src_deps {
                link_tree(&src, &dst_deps)?;
            }
            match secrets {
                Some(dir) => dir.write(&secret_files),
                None if secret_files.is_empty() => Ok(()),
                None => Err(std::io::Error::other(
                    "the server has no directory for secret files (--secrets-dir)",
                )),
            }
        })
        .await
        .map_err(|e| SpecialiseError::Platform(e.to_string()))?
        .map_err(|e| SpecialiseError::Platform(format!("cannot link the function's files: {e}")))?;
        self.killer
            .set_memory_mb(d.memory_mb)
            .map_err(|e| SpecialiseError::Platform(format!("cannot set the memory limit: {e}")))?;
        self.killer
            .set_cpu_millicores(d.cpu)
            .map_err(|e| SpecialiseError::Platform(format!("cannot set the CPU limit: {e}")))?;
        self.sink.set(sink.clone());
        let mut env: serde_json::Map<String, serde_json::Value> = d
            .env
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
            .collect();
        for (k, v) in &d.secret_env {
            env.insert(k.clone(), serde_json::Value::from(v.expose()));
        }
        let body = serde_json::json!({
            "entrypoint": d.entrypoint,
            "env": env,
            "namespace": d.namespace,
            "function": d.name,
            "revision": d.revision,
            "concurrency": d.concurrency,
        });
        let mut conn = self
            .checkout()
            .await
            .map_err(|e| SpecialiseError::Platform(e.to_string()))?;
        let body = body.to_string();
        let head = RequestHead::new("POST", "/_sless/load")
            .header("host", "instance")
            .and_then(|h| h.header("content-type", "application/json"))
            .map_err(|e| SpecialiseError::Platform(e.to_string()))?
            .finish(body.len());
        let resp = conn.exchange(&head, body.as_bytes()).await.map_err(|e| {
            SpecialiseError::Platform(format!("instance failed while loading ({e})"))
        })?;
        let (status, answer) = (resp.status, resp.body);
        if (200..300).contains(&status) {
            self.checkin(conn);
            self.revision.store(d.revision, Ordering::Release);
            return Ok(());
        }
        let message = serde_json::from_slice::<serde_json::Value>(&answer)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
            .unwrap_or_else(|| format!("loading the function failed with status {status}"));
        if status == 500 {
            Err(SpecialiseError::Load(message))
        } else {
            Err(SpecialiseError::Platform(message))
        }
    }

    fn revision(&self) -> u64 {
        self.revision.load(Ordering::Acquire)
    }

    /// Sends one event and returns (handler returned normally, body).
    async fn call(
        &self,
        req: &InvokeRequest,
        timeout: Option<Duration>,
    ) -> Result<(bool, Bytes), CallError> {
        let deadline_ms = timeout.map(|t| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            u64::try_from((now + t).as_millis()).unwrap_or(u64::MAX)
        });
        let work = async {
            let mut conn = self.checkout().await?;
            let head = invoke_head(req, deadline_ms)?;
            let resp = conn
                .exchange(&head, &req.event)
                .await
                .map_err(|e| match e {
                    sless_wire::WireError::Send(_) | sless_wire::WireError::Closed => {
                        CallError::NoAnswer(e)
                    }
                    e => CallError::BrokenAnswer(e),
                })?;
            self.answered.fetch_add(1, Ordering::Relaxed);
            self.checkin(conn);
            match resp.status {
                200 => Ok((true, resp.body)),
                500 => Ok((false, resp.body)),
                other => Err(CallError::BadStatus(other)),
            }
        };
        let result = match timeout {
            Some(t) => tokio::time::timeout(t, work)
                .await
                .unwrap_or(Err(CallError::Timeout)),
            None => work.await,
        };
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        result
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    /// Kills the instance on purpose (its exit will not count as a crash).
    fn kill(&self) {
        self.life.set_state(STOPPING);
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.killer.kill();
    }

    fn is_dead(&self) -> bool {
        self.exit.borrow().is_some()
    }

    fn output(&self) -> &[Arc<Pipe>] {
        &self.output
    }

    fn exit(&self) -> watch::Receiver<Option<Exit>> {
        self.exit.clone()
    }

    /// What the liveness monitor samples; `None` once the instance is stopping.
    fn activity(&self) -> Option<Activity> {
        launcher::activity(
            &self.life,
            self.is_dead(),
            self.answered.load(Ordering::Relaxed),
        )
    }

    /// Asks the instance's serving loop whether it still answers (`GET /_sless/ready`
    /// on a connection of its own, never one a request is waiting on).
    async fn probe(&self) -> bool {
        self.readiness_check().await.is_ok()
    }

    /// Kills an instance whose serving loop stopped answering; the requests it holds
    /// then fail, saying so.
    fn kill_unresponsive(&self) {
        self.unresponsive.store(true, Ordering::Release);
        self.kill();
    }

    fn is_unresponsive(&self) -> bool {
        self.unresponsive.load(Ordering::Acquire)
    }

    /// Freezes the instance if it has been idle for `after`; call with the pool's
    /// lock held. Returns whether it froze it now.
    fn freeze_if_idle(&self, after: Duration) -> bool {
        if self.frozen.load(Ordering::Acquire)
            || self.life.inflight() != 0
            || self.idle_for() < after
        {
            return false;
        }
        match self.killer.set_frozen(true) {
            Ok(true) => {
                self.frozen.store(true, Ordering::Release);
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(instance = %self.id, error = %e, "cannot freeze an idle instance");
                false
            }
        }
    }

    /// Thaws the instance if it is frozen; call with the pool's lock held, before a
    /// request is sent to it.
    fn thaw(&self) -> std::io::Result<()> {
        if self.frozen.load(Ordering::Acquire) {
            self.killer.set_frozen(false)?;
            self.frozen.store(false, Ordering::Release);
        }
        Ok(())
    }

    fn cleanup(&self) {
        // Best effort: a directory left behind is removed with the run directory at the next start.
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

/// The head of `POST /_sless/invoke` carrying `req`.
fn invoke_head(req: &InvokeRequest, deadline_ms: Option<u64>) -> Result<Vec<u8>, CallError> {
    let bad = CallError::Request;
    let mut head = RequestHead::new("POST", "/_sless/invoke")
        .header("host", "instance")
        .and_then(|h| h.header("content-type", "application/json"))
        .and_then(|h| h.header("x-sless-request-id", &req.request_id))
        .and_then(|h| h.header("x-sless-source", req.source.as_str()))
        .map_err(bad)?;
    if let Some(deadline) = deadline_ms {
        head = head
            .header("x-sless-deadline-ms", &deadline.to_string())
            .map_err(bad)?;
    }
    if let Some(message) = &req.message {
        // Not UTF-8 is not JSON: no message is better than a request refused.
        if let Ok(message) = std::str::from_utf8(message) {
            head = head.header("x-sless-message", message).map_err(bad)?;
        }
    }
    Ok(head.finish(req.event.len()))
}

/// Spawns `spec` in the sandbox, copies its output into `sink`, waits for its
/// `ready` line and its readiness check.
#[allow(clippy::too_many_arguments)] // one call per kind of instance; a struct would only rename them
async fn launch(
    cfg: &ExecutorConfig,
    sandbox: &Sandbox,
    spec: ProcessSpec,
    sink: Arc<SinkSlot>,
    run_dir: PathBuf,
    slot: Option<(PathBuf, PathBuf)>,
    secrets: Option<SecretsDir>,
    (family, network): (RuntimeFamily, NetworkMode),
    cpu_millicores: u32,
) -> Result<Arc<SandboxInstance>, StartError> {
    let id = spec.id.clone();
    let mut child = match sandbox.spawn(&spec) {
        Ok(child) => child,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run_dir);
            if let Some(dir) = &secrets {
                dir.remove();
            }
            return Err(StartError::Spawn(e));
        }
    };
    let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
    let output = [Pipe::new(), Pipe::new()];
    match child.stdout.take() {
        Some(out) => {
            let pipe = output[0].clone();
            tokio::spawn(pump(out, sink.clone(), "stdout", None, pipe));
        }
        None => output[0].close(),
    }
    // Joined after a failed start: it ends once the process's stderr closes, so by
    // then every line it wrote is in `tail`.
    let stderr_pump: Option<JoinHandle<()>> = match child.stderr.take() {
        Some(err) => {
            let pipe = output[1].clone();
            let tail = Some(tail.clone());
            Some(tokio::spawn(pump(err, sink.clone(), "stderr", tail, pipe)))
        }
        None => {
            output[1].close();
            None
        }
    };
    let ready = child.ready.take();
    let killer = child.killer();
    // Set right after the start, before the shim has imported anything of the function.
    if let Err(e) = killer.set_cpu_millicores(cpu_millicores) {
        killer.kill();
        let _ = std::fs::remove_dir_all(&run_dir);
        return Err(StartError::CpuLimit(e));
    }
    let (exit_tx, mut exit_rx) = watch::channel(None);
    let secrets_on_exit = secrets.clone();
    tokio::spawn(async move {
        let exit = child.wait().await;
        // Its secret files go with it, whatever ended it.
        if let Some(dir) = secrets_on_exit {
            let _ = tokio::task::spawn_blocking(move || dir.remove()).await;
        }
        let _ = exit_tx.send(Some(exit));
        // Dropping the child removes its cgroup.
        drop(child);
    });

    let stderr_tail = |tail: &Mutex<VecDeque<String>>| {
        StderrTail(
            tail.lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned()
                .collect(),
        )
    };
    let start_timeout = cfg.start_timeout;
    /// What ended the wait for the `ready` line, when it did not arrive.
    enum NotReady {
        Exited,
        Pipe(ReadyPipeError),
        TimedOut,
    }
    let custom = family == RuntimeFamily::Custom;
    let sock_dir = run_dir.join("sock");
    let ready_signal = async {
        if custom {
            wait_bootstrap(&sock_dir).await
        } else {
            wait_ready_line(ready).await
        }
    };
    let signalled = tokio::select! {
        r = ready_signal => match r {
            Ok(()) => Ok(()),
            Err(ReadyPipeError::Closed) => Err(NotReady::Exited),
            Err(e) => Err(NotReady::Pipe(e)),
        },
        _ = exit_rx.changed() => Err(NotReady::Exited),
        _ = tokio::time::sleep(start_timeout) => Err(NotReady::TimedOut),
    };
    if let Err(why) = signalled {
        killer.kill();
        // Let the exit status and the last stderr lines arrive, to say why: the
        // stderr pump ends when the (killed) process's pipe closes.
        let report = async {
            let exit = exit_rx
                .wait_for(|e| e.is_some())
                .await
                .ok()
                .and_then(|e| e.clone());
            if let Some(pump) = stderr_pump {
                let _ = pump.await;
            }
            exit
        };
        let exit = tokio::time::timeout(FAILED_START_REPORT, report)
            .await
            .ok()
            .flatten()
            .or_else(|| exit_rx.borrow().clone());
        let _ = std::fs::remove_dir_all(&run_dir);
        let output = stderr_tail(&tail);
        return Err(match why {
            NotReady::Exited => StartError::Exited { exit, output },
            NotReady::Pipe(why) => StartError::ReadyPipe { why, output },
            NotReady::TimedOut if custom => StartError::BootstrapNotReady {
                seconds: start_timeout.as_secs(),
                output,
            },
            NotReady::TimedOut => StartError::NotReady {
                seconds: start_timeout.as_secs(),
                output,
            },
        });
    }

    let instance = Arc::new(SandboxInstance {
        id,
        revision: AtomicU64::new(0),
        family,
        network,
        socket: run_dir.join("sock").join("fn.sock"),
        run_dir,
        slot,
        secrets,
        sink,
        output,
        conns: Mutex::new(Vec::new()),
        life: Lifecycle::new(),
        answered: AtomicU64::new(0),
        unresponsive: AtomicBool::new(false),
        frozen: AtomicBool::new(false),
        killer,
        last_used: Mutex::new(Instant::now()),
        exit: exit_rx,
    });
    if let Err(why) = instance.readiness_check().await {
        launcher::Instance::kill(&*instance);
        launcher::Instance::cleanup(&*instance);
        return Err(StartError::ReadinessCheck {
            why,
            output: stderr_tail(&tail),
        });
    }
    instance.life.set_state(READY);
    Ok(instance)
}

/// Memory limit of a generic instance until it is given a function.
const GENERIC_MEMORY_MB: u32 = 256;

/// Why a generic instance could not take a function.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpecialiseError {
    /// The function's entrypoint could not be loaded (the user's problem).
    #[error("{0}")]
    Load(String),
    /// Anything else; the caller falls back to a fresh instance.
    #[error("{0}")]
    Platform(String),
}

/// Where an instance's output goes: nowhere until a generic instance has a function.
pub(crate) struct SinkSlot(Mutex<Option<LogSink>>);

impl SinkSlot {
    fn new(sink: Option<LogSink>) -> Self {
        Self(Mutex::new(sink))
    }

    fn set(&self, sink: LogSink) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink);
    }

    fn line(&self, stream: &str, text: &str) {
        let sink = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match sink {
            Some(sink) => sink.line(stream, text),
            None => tracing::debug!(stream, "generic instance: {}", text.trim_end()),
        }
    }
}

/// Mirrors the tree at `src` into the empty directory `dst` with hard links
/// (symbolic links are recreated), so a function's files appear inside an
/// already-running sandbox at the cost of a few metadata writes.
fn link_tree(src: &std::path::Path, dst: &std::path::Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            std::fs::create_dir(&to)?;
            link_tree(&from, &to)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
        } else {
            std::fs::hard_link(&from, &to)?;
        }
    }
    Ok(())
}

fn prepare_run_dir(
    run_dir: &std::path::Path,
    sock_dir: &std::path::Path,
    slot: Option<&(PathBuf, PathBuf)>,
    custom: bool,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(sock_dir)?;
    std::fs::set_permissions(run_dir, std::fs::Permissions::from_mode(0o755))?;
    if let Some((code, deps)) = slot {
        for dir in [code, deps] {
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    // The server's alone: the sandbox creates the listening socket here and hands the
    // shim its descriptor, so no function can write to the host's disk through it. A
    // custom runtime binds its own socket here: others may add entries (not list them)
    // until `wait_bootstrap` closes it again.
    let mode = if custom { 0o733 } else { 0o700 };
    std::fs::set_permissions(sock_dir, std::fs::Permissions::from_mode(mode))
}

/// An instance's `/run/secrets` on the host: `<secrets_dir>/<instance>`, 0700 and owned
/// by the sandbox user, its files 0400; on a memory-backed filesystem.
#[derive(Debug, Clone)]
struct SecretsDir {
    dir: PathBuf,
    owner: Option<(u32, u32)>,
}

impl SecretsDir {
    /// Creates the (empty) directory when the server keeps secret files.
    fn prepare(
        cfg: &ExecutorConfig,
        sandbox: &Sandbox,
        id: &str,
    ) -> std::io::Result<Option<SecretsDir>> {
        let Some(root) = &cfg.secrets_dir else {
            return Ok(None);
        };
        let me = SecretsDir {
            dir: root.join(id),
            owner: sandbox.program_owner(),
        };
        me.make_dir(&me.dir)?;
        Ok(Some(me))
    }

    fn make_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new().mode(0o700).create(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        self.chown(dir)
    }

    fn chown(&self, path: &std::path::Path) -> std::io::Result<()> {
        match self.owner {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid)),
            None => Ok(()),
        }
    }

    /// Writes `/run/secrets/{secret}/{key}` for every key (names were validated as
    /// file names when the secret and the function were written).
    fn write(
        &self,
        files: &BTreeMap<String, BTreeMap<String, sless_core::secret::Sensitive>>,
    ) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        for (secret, keys) in files {
            let dir = self.dir.join(secret);
            self.make_dir(&dir)?;
            for (key, value) in keys {
                let path = dir.join(key);
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o400)
                    .open(&path)?;
                file.write_all(value.expose().as_bytes())?;
                self.chown(&path)?;
            }
        }
        Ok(())
    }

    /// Best effort: the whole secrets directory is removed at the next start anyway.
    fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The function-specific environment of a cold-started instance (a generic
/// instance gets the same through its load request).
fn function_env(d: &Deployment) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = d
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain(
            d.secret_env
                .iter()
                .map(|(k, v)| (k.clone(), v.expose().to_string())),
        )
        .collect();
    for (k, v) in [
        ("SLESS_ENTRYPOINT", d.entrypoint.clone()),
        ("SLESS_CONCURRENCY", d.concurrency.to_string()),
        ("SLESS_NAMESPACE", d.namespace.clone()),
        ("SLESS_FUNCTION", d.name.clone()),
        ("SLESS_REVISION", d.revision.to_string()),
    ] {
        env.retain(|(key, _)| key != k);
        env.push((k.to_string(), v));
    }
    env
}

/// The sandbox spec of an instance of `family` with `network` whose code is at `code` (and
/// dependencies at `deps`); the function-specific environment is added by the caller.
#[allow(clippy::too_many_arguments)]
fn process_spec(
    cfg: &ExecutorConfig,
    (family, network): (RuntimeFamily, NetworkMode),
    entrypoint: &str,
    id: &str,
    sock_dir: &std::path::Path,
    code: &std::path::Path,
    deps: Option<&std::path::Path>,
    memory_mb: u32,
) -> ProcessSpec {
    // A Go function is its own binary (the shim compiled in); a custom runtime is the
    // archive's executable, which binds `SLESS_SOCKET` itself (see `wait_bootstrap`).
    let (program, args) = match family {
        RuntimeFamily::Nodejs => (
            cfg.node.clone(),
            vec!["/runtime/node/sless_runtime.js".to_string()],
        ),
        RuntimeFamily::Python3 => (
            cfg.python.clone(),
            vec!["/runtime/python/sless_runtime.py".to_string()],
        ),
        RuntimeFamily::Go => (
            std::path::Path::new("/code").join(sless_core::GO_BINARY),
            Vec::new(),
        ),
        RuntimeFamily::Custom => (std::path::Path::new("/code").join(entrypoint), Vec::new()),
    };
    let custom = family == RuntimeFamily::Custom;
    let mut env: Vec<(String, String)> = [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("PYTHONUNBUFFERED", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("NODE_PATH", "/deps/node_modules"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if custom {
        env.push((
            "SLESS_SOCKET".into(),
            format!("{CUSTOM_SOCKET_DIR}/fn.sock"),
        ));
    } else {
        env.push(("SLESS_READY_FD".into(), "3".into()));
        env.push((
            "SLESS_LISTEN_FD".into(),
            sless_sandbox::LISTEN_FD.to_string(),
        ));
    }
    let mut mounts = vec![
        Mount {
            source: code.to_path_buf(),
            target: "/code".into(),
            writable: false,
        },
        Mount {
            source: cfg.runtime_dir.clone(),
            target: "/runtime".into(),
            writable: false,
        },
    ];
    if let Some(deps) = deps {
        mounts.push(Mount {
            source: deps.to_path_buf(),
            target: "/deps".into(),
            writable: false,
        });
    }
    if let Some(dir) = &cfg.secrets_dir {
        mounts.push(Mount {
            source: dir.join(id),
            target: "/run/secrets".into(),
            writable: false,
        });
    }
    if custom {
        mounts.push(Mount {
            source: sock_dir.to_path_buf(),
            target: CUSTOM_SOCKET_DIR.into(),
            writable: true,
        });
    }
    ProcessSpec {
        id: id.to_string(),
        program,
        args,
        env,
        mounts,
        cwd: "/code".into(),
        memory_mb,
        max_pids: cfg.max_pids,
        network: match network {
            NetworkMode::Outbound => Network::Outbound,
            NetworkMode::None => Network::None,
            NetworkMode::Host => Network::Host,
        },
        ready_pipe: !custom,
        listen: (!custom).then(|| sock_dir.join("fn.sock")),
    }
}

/// Where a custom runtime's socket directory is mounted (`SLESS_SOCKET` is `fn.sock` in it).
const CUSTOM_SOCKET_DIR: &str = "/run/sless";

/// Waits until a custom runtime's bootstrap listens on its socket. It binds the socket
/// itself, in a directory the sandbox user may write to; once a socket is there the
/// directory is closed to it (0700, the server's), so nothing can put a link to some
/// other socket in its place, and only then does the server connect.
async fn wait_bootstrap(sock_dir: &std::path::Path) -> Result<(), ReadyPipeError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let sock = sock_dir.join("fn.sock");
    let mut closed = false;
    let mut delay = Duration::from_millis(1);
    loop {
        let is_socket = std::fs::symlink_metadata(&sock).is_ok_and(|m| m.file_type().is_socket());
        if is_socket && !closed {
            std::fs::set_permissions(sock_dir, std::fs::Permissions::from_mode(0o700))
                .map_err(ReadyPipeError::Io)?;
            closed = true;
            // Looked at again below, now that it can no longer change.
            continue;
        }
        if closed {
            if !is_socket {
                return Err(ReadyPipeError::NotASocket);
            }
            if UnixStream::connect(&sock).await.is_ok() {
                return Ok(());
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(20));
    }
}

/// Waits for the shim's `ready` line on the readiness pipe.
async fn wait_ready_line(
    ready: Option<tokio::net::unix::pipe::Receiver>,
) -> Result<(), ReadyPipeError> {
    let Some(mut ready) = ready else {
        return Err(ReadyPipeError::Missing);
    };
    let mut buf = [0u8; 16];
    let mut got = Vec::new();
    loop {
        let n = ready.read(&mut buf).await.map_err(ReadyPipeError::Io)?;
        if n == 0 {
            return Err(ReadyPipeError::Closed);
        }
        got.extend_from_slice(&buf[..n]);
        if got.starts_with(b"ready") {
            return Ok(());
        }
        if got.len() > 64 {
            return Err(ReadyPipeError::Garbage);
        }
    }
}

/// Ends each piece of a line that was too long for one log line.
pub(crate) const SPLIT_MARKER: &str = " [continues]";

/// Longest piece of output logged as one line (the marker included, it fits the log's
/// line limit, so nothing is cut).
const MAX_PIECE: usize = sless_logs::MAX_LINE - SPLIT_MARKER.len();

/// Copies an instance's output into its function's log, line by line. A line longer
/// than [`MAX_PIECE`] is logged in pieces, each but the last ending with
/// [`SPLIT_MARKER`], so the pump holds at most one piece whatever the instance writes.
/// Each time it finds the pipe empty it tells `pipe` (see [`crate::output`]).
async fn pump<R: AsyncRead + std::os::fd::AsFd + Unpin>(
    out: R,
    sink: Arc<SinkSlot>,
    stream: &'static str,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
    pipe: Arc<Pipe>,
) {
    let _closed = CloseOnDrop(pipe.clone());
    let mut reader = BufReader::with_capacity(MAX_PIECE, Watched::new(out, pipe));
    let mut line: Vec<u8> = Vec::new();
    let emit = |bytes: &[u8], split: bool| {
        let text = String::from_utf8_lossy(bytes);
        if split {
            sink.line(stream, &format!("{text}{SPLIT_MARKER}"));
        } else {
            sink.line(stream, &text);
        }
        if let Some(tail) = &tail {
            let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
            if tail.len() == STDERR_TAIL {
                tail.pop_front();
            }
            tail.push_back(text.trim_end().to_string());
        }
    };
    loop {
        let available = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(bytes) => bytes,
        };
        let room = MAX_PIECE - line.len();
        let window = &available[..available.len().min(room)];
        if let Some(pos) = window.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&window[..=pos]);
            reader.consume(pos + 1);
            emit(&line, false);
            line.clear();
            continue;
        }
        let n = window.len();
        line.extend_from_slice(window);
        reader.consume(n);
        if line.len() >= MAX_PIECE {
            let cut = utf8_cut(&line);
            emit(&line[..cut], true);
            line.drain(..cut);
        }
    }
    if !line.is_empty() {
        emit(&line, false);
    }
}

/// Where to cut `bytes` so no UTF-8 character is split: before a character left
/// incomplete at the end, otherwise at the end.
fn utf8_cut(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => e.valid_up_to(),
        _ => bytes.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivered_message_travels_as_a_header() {
        let mut req = InvokeRequest {
            event: Bytes::from_static(b"{}"),
            request_id: "m-1".into(),
            source: sless_core::invocation::InvocationSource::Queue,
            message: Some(Bytes::from_static(br#"{"id":"m-1","attempt":2}"#)),
        };
        let head = String::from_utf8(invoke_head(&req, None).expect("head")).expect("utf-8");
        assert!(
            head.contains("\r\nx-sless-message: {\"id\":\"m-1\",\"attempt\":2}\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nx-sless-source: queue\r\n"), "{head}");
        req.message = None;
        let head = String::from_utf8(invoke_head(&req, None).expect("head")).expect("utf-8");
        assert!(!head.contains("x-sless-message"), "{head}");
    }

    async fn logged(output: &[u8]) -> Vec<String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = sless_logs::LogStore::new(dir.path().to_path_buf(), 1 << 24).expect("logs");
        let sink = Arc::new(SinkSlot::new(Some(store.sink("ns", "f"))));
        let (mut tx, rx) = tokio::net::unix::pipe::pipe().expect("pipe");
        let output = output.to_vec();
        let writer = tokio::spawn(async move {
            tokio::io::AsyncWriteExt::write_all(&mut tx, &output)
                .await
                .expect("write");
        });
        pump(rx, sink, "stdout", None, Pipe::new()).await;
        writer.await.expect("writer");
        store
            .tail("ns", "f", 100)
            .await
            .expect("tail")
            .into_iter()
            .map(|line| {
                // `<time> [stdout] <text>`
                let text = line.split_once(" [stdout] ").expect("stream tag").1;
                text.to_string()
            })
            .collect()
    }

    #[tokio::test]
    async fn once_output_settles_every_line_written_before_is_in_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = sless_logs::LogStore::new(dir.path().to_path_buf(), 1 << 24).expect("logs");
        let sink = Arc::new(SinkSlot::new(Some(store.sink("ns", "f"))));
        let mut pipes = Vec::new();
        let mut writers = Vec::new();
        for stream in ["stdout", "stderr"] {
            let (tx, rx) = tokio::net::unix::pipe::pipe().expect("pipe");
            let pipe = Pipe::new();
            tokio::spawn(pump(rx, sink.clone(), stream, None, pipe.clone()));
            pipes.push(pipe);
            writers.push(tx);
        }
        for round in 0..20 {
            for (i, tx) in writers.iter_mut().enumerate() {
                let text = format!("[r{round}] line of {i}\n").repeat(50);
                tokio::io::AsyncWriteExt::write_all(tx, text.as_bytes())
                    .await
                    .expect("write");
            }
            assert!(crate::output::settled(pipes.clone(), Duration::from_secs(10)).await);
            let tail = store.tail("ns", "f", 100_000).await.expect("tail");
            let tagged = format!("[r{round}]");
            let logged = tail.iter().filter(|l| l.contains(&tagged)).count();
            assert_eq!(
                logged, 100,
                "round {round}: both pipes' lines are in the log"
            );
        }
    }

    #[tokio::test]
    async fn long_lines_are_logged_in_pieces_with_a_marker() {
        let mut output = vec![b'x'; 2 * MAX_PIECE + 10];
        output.extend_from_slice(b"\nshort\nno newline at the end");
        let lines = logged(&output).await;
        let piece = format!("{}{SPLIT_MARKER}", "x".repeat(MAX_PIECE));
        assert_eq!(
            lines,
            vec![
                piece.clone(),
                piece,
                "x".repeat(10),
                "short".to_string(),
                "no newline at the end".to_string(),
            ]
        );
        assert!(lines[0].len() <= sless_logs::MAX_LINE);
    }

    #[tokio::test]
    async fn pieces_never_split_a_character() {
        // One ASCII byte first, so the piece boundary falls inside a 3-byte character.
        let mut output = b"a".to_vec();
        output.extend("€".repeat(MAX_PIECE / 3 + 5).as_bytes());
        let lines = logged(&output).await;
        assert_eq!(lines.len(), 2);
        for line in &lines {
            assert!(!line.contains('\u{fffd}'), "a character was cut");
        }
        let joined = lines[0].trim_end_matches(SPLIT_MARKER).to_string() + &lines[1];
        assert_eq!(joined.as_bytes(), output.as_slice());
    }

    #[test]
    fn start_errors_say_what_happened_and_what_the_instance_printed() {
        let exit = Exit {
            code: Some(1),
            signal: None,
            oom_killed: false,
        };
        let output = StderrTail(vec!["Traceback".into(), "ImportError: app".into()]);
        let exited = StartError::Exited {
            exit: Some(exit),
            output,
        };
        assert_eq!(
            exited.to_string(),
            "instance exited with status 1 while starting: Traceback\nImportError: app"
        );
        let unknown = StartError::Exited {
            exit: None,
            output: StderrTail::default(),
        };
        assert_eq!(unknown.to_string(), "instance exited while starting");
        let slow = StartError::NotReady {
            seconds: 30,
            output: StderrTail::default(),
        };
        assert_eq!(
            slow.to_string(),
            "instance did not become ready within 30 s"
        );
        let garbage = StartError::ReadyPipe {
            why: ReadyPipeError::Garbage,
            output: StderrTail::default(),
        };
        assert_eq!(
            garbage.to_string(),
            "instance wrote garbage to its readiness pipe"
        );
        let check = StartError::ReadinessCheck {
            why: ProbeError::Status(503),
            output: StderrTail::default(),
        };
        assert_eq!(
            check.to_string(),
            "instance failed its readiness check: status 503"
        );
    }
}
