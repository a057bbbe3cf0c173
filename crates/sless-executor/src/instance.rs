//! One running instance: its sandboxed process, its socket and a small pool of
//! keep-alive HTTP/1.1 connections to it (see docs/instance-protocol.md).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
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

use crate::liveness::Activity;
use crate::{Deployment, ExecutorConfig, InvokeRequest};

/// Idle connections kept per instance (beyond them, finished connections close).
const MAX_IDLE_CONNS: usize = 64;

/// Lines of stderr kept to explain a failed start.
const STDERR_TAIL: usize = 12;

pub(crate) const STARTING: u8 = 0;
pub(crate) const READY: u8 = 1;
/// Takes no new requests; stopped once its in-flight requests are done.
pub(crate) const DRAINING: u8 = 2;
/// Killed on purpose; its exit is not a crash.
pub(crate) const STOPPING: u8 = 3;

pub(crate) struct Instance {
    pub id: String,
    /// The revision it serves; 0 while it is a generic (pre-started) instance.
    revision: AtomicU64,
    family: RuntimeFamily,
    network: NetworkMode,
    socket: PathBuf,
    run_dir: PathBuf,
    /// Where the function's files are linked in when a generic instance is specialised.
    slot: Option<(PathBuf, PathBuf)>,
    sink: Arc<SinkSlot>,
    conns: Mutex<Vec<Conn<UnixStream>>>,
    pub inflight: AtomicU32,
    /// Requests answered so far (any answer shows its serving loop alive).
    answered: AtomicU64,
    /// Its serving loop stopped answering liveness checks and it was killed for that;
    /// the requests it held fail with a message saying so.
    unresponsive: AtomicBool,
    pub state: AtomicU8,
    /// Its cgroup is frozen (see `ExecutorConfig::freeze_after`); changed only under the
    /// pool's lock, so a freeze never races the pick of a request.
    frozen: AtomicBool,
    killer: Killer,
    last_used: Mutex<Instant>,
    pub exit: watch::Receiver<Option<Exit>>,
}

pub(crate) enum CallError {
    Timeout,
    Failed(String),
}

impl Instance {
    /// Starts an instance of `d` and returns once it has answered the readiness check.
    pub async fn start(
        cfg: &ExecutorConfig,
        sandbox: &Sandbox,
        sink: &LogSink,
        d: &Deployment,
        id: String,
    ) -> Result<Arc<Instance>, String> {
        let run_dir = cfg.run_dir.join(&id);
        let sock_dir = run_dir.join("sock");
        prepare_run_dir(&run_dir, &sock_dir, None).map_err(|e| {
            format!(
                "cannot prepare instance directory {}: {e}",
                run_dir.display()
            )
        })?;
        let mut spec = process_spec(
            cfg,
            (d.family, d.network),
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
            (d.family, d.network),
            d.cpu,
        )
        .await?;
        instance.revision.store(d.revision, Ordering::Release);
        Ok(instance)
    }

    /// Starts a generic instance of a runtime family with a network mode: sandboxed
    /// (its network connected), interpreter and shim loaded, no function yet.
    /// [`Instance::specialise`] gives it one.
    pub async fn start_generic(
        cfg: &ExecutorConfig,
        sandbox: &Sandbox,
        family: RuntimeFamily,
        network: NetworkMode,
        id: String,
    ) -> Result<Arc<Instance>, String> {
        let run_dir = cfg.run_dir.join(&id);
        let sock_dir = run_dir.join("sock");
        let slot = (run_dir.join("code"), run_dir.join("deps"));
        prepare_run_dir(&run_dir, &sock_dir, Some(&slot)).map_err(|e| {
            format!(
                "cannot prepare instance directory {}: {e}",
                run_dir.display()
            )
        })?;
        let spec = process_spec(
            cfg,
            (family, network),
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
            (family, network),
            crate::DEFAULT_CPU_MILLICORES,
        )
        .await
    }

    /// Turns a generic instance into an instance of `d`: links the function's
    /// files into its (bind-mounted) code and deps directories, applies the memory
    /// limit and asks the shim to load the entrypoint. `Err(Load)` is the user's
    /// problem (the module or function is missing); anything else is the platform's.
    pub async fn specialise(&self, d: &Deployment, sink: &LogSink) -> Result<(), SpecialiseError> {
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
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            link_tree(&src_code, &dst_code)?;
            if let Some(src) = src_deps {
                link_tree(&src, &dst_deps)?;
            }
            Ok(())
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
        let body = serde_json::json!({
            "entrypoint": d.entrypoint,
            "env": d.env,
            "namespace": d.namespace,
            "function": d.name,
            "revision": d.revision,
            "concurrency": d.concurrency,
        });
        let mut conn = self
            .checkout()
            .await
            .map_err(|e| SpecialiseError::Platform(describe(e)))?;
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

    pub fn revision(&self) -> u64 {
        self.revision.load(Ordering::Acquire)
    }

    async fn readiness_check(&self) -> Result<(), String> {
        let mut conn = self.checkout().await.map_err(describe)?;
        let head = RequestHead::new("GET", "/_sless/ready")
            .header("host", "instance")
            .map_err(|e| e.to_string())?
            .finish(0);
        let resp = conn.exchange(&head, b"").await.map_err(|e| e.to_string())?;
        self.checkin(conn);
        if (200..300).contains(&resp.status) {
            Ok(())
        } else {
            Err(format!("status {}", resp.status))
        }
    }

    /// Sends one event and returns (handler returned normally, body).
    pub async fn call(
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
                        CallError::Failed(format!("instance failed without answering ({e})"))
                    }
                    e => CallError::Failed(format!("instance failed while answering ({e})")),
                })?;
            self.answered.fetch_add(1, Ordering::Relaxed);
            self.checkin(conn);
            match resp.status {
                200 => Ok((true, resp.body)),
                500 => Ok((false, resp.body)),
                other => Err(CallError::Failed(format!(
                    "instance answered status {other}, which the protocol does not allow"
                ))),
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
            .map_err(|e| CallError::Failed(format!("cannot connect to instance ({e})")))?;
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

    pub fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    /// Kills the instance on purpose (its exit will not count as a crash).
    pub fn kill(&self) {
        self.state.store(STOPPING, Ordering::Release);
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.killer.kill();
    }

    pub fn is_dead(&self) -> bool {
        self.exit.borrow().is_some()
    }

    /// What the liveness monitor samples; `None` once the instance is stopping.
    pub fn activity(&self) -> Option<Activity> {
        if self.state.load(Ordering::Acquire) == STOPPING || self.is_dead() {
            return None;
        }
        Some(Activity {
            inflight: self.inflight.load(Ordering::Acquire),
            answered: self.answered.load(Ordering::Relaxed),
        })
    }

    /// Asks the instance's serving loop whether it still answers (`GET /_sless/ready`
    /// on a connection of its own, never one a request is waiting on).
    pub async fn probe(&self) -> bool {
        self.readiness_check().await.is_ok()
    }

    /// Kills an instance whose serving loop stopped answering; the requests it holds
    /// then fail, saying so.
    pub fn kill_unresponsive(&self) {
        self.unresponsive.store(true, Ordering::Release);
        self.kill();
    }

    pub fn is_unresponsive(&self) -> bool {
        self.unresponsive.load(Ordering::Acquire)
    }

    /// Freezes the instance if it has been idle for `after`; call with the pool's
    /// lock held. Returns whether it froze it now.
    pub fn freeze_if_idle(&self, after: Duration) -> bool {
        if self.frozen.load(Ordering::Acquire)
            || self.inflight.load(Ordering::Acquire) != 0
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
    pub fn thaw(&self) -> std::io::Result<()> {
        if self.frozen.load(Ordering::Acquire) {
            self.killer.set_frozen(false)?;
            self.frozen.store(false, Ordering::Release);
        }
        Ok(())
    }

    pub fn cleanup(&self) {
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

/// The head of `POST /_sless/invoke` carrying `req`.
fn invoke_head(req: &InvokeRequest, deadline_ms: Option<u64>) -> Result<Vec<u8>, CallError> {
    let bad = |e: sless_wire::WireError| CallError::Failed(e.to_string());
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
    (family, network): (RuntimeFamily, NetworkMode),
    cpu_millicores: u32,
) -> Result<Arc<Instance>, String> {
    let id = spec.id.clone();
    let mut child = match sandbox.spawn(&spec) {
        Ok(child) => child,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run_dir);
            return Err(format!("cannot start instance: {e}"));
        }
    };
    let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
    if let Some(out) = child.stdout.take() {
        tokio::spawn(pump(out, sink.clone(), "stdout", None));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(pump(err, sink.clone(), "stderr", Some(tail.clone())));
    }
    let ready = child.ready.take();
    let killer = child.killer();
    // Set right after the start, before the shim has imported anything of the function.
    if let Err(e) = killer.set_cpu_millicores(cpu_millicores) {
        killer.kill();
        let _ = std::fs::remove_dir_all(&run_dir);
        return Err(format!("cannot set the CPU limit: {e}"));
    }
    let (exit_tx, mut exit_rx) = watch::channel(None);
    tokio::spawn(async move {
        let exit = child.wait().await;
        let _ = exit_tx.send(Some(exit));
        // Dropping the child removes its cgroup.
        drop(child);
    });

    let explain = |what: String, tail: &Mutex<VecDeque<String>>| {
        let lines: Vec<String> = tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        if lines.is_empty() {
            what
        } else {
            format!("{what}: {}", lines.join("\n"))
        }
    };
    let start_timeout = cfg.start_timeout;
    let signalled = tokio::select! {
        r = wait_ready_line(ready) => r,
        _ = exit_rx.changed() => Err(String::new()),
        _ = tokio::time::sleep(start_timeout) => Err(format!("did not become ready within {} s", start_timeout.as_secs())),
    };
    if let Err(why) = signalled {
        killer.kill();
        // Let the exit status and the last stderr lines arrive, to say why.
        let exit = tokio::time::timeout(Duration::from_secs(2), exit_rx.wait_for(|e| e.is_some()))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|e| e.clone()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = std::fs::remove_dir_all(&run_dir);
        let what = match (why.is_empty(), exit) {
            (false, _) => format!("instance {why}"),
            (true, Some(exit)) => format!("instance {exit} while starting"),
            (true, None) => "instance exited while starting".to_string(),
        };
        return Err(explain(what, &tail));
    }

    let instance = Arc::new(Instance {
        id,
        revision: AtomicU64::new(0),
        family,
        network,
        socket: run_dir.join("sock").join("fn.sock"),
        run_dir,
        slot,
        sink,
        conns: Mutex::new(Vec::new()),
        inflight: AtomicU32::new(0),
        answered: AtomicU64::new(0),
        unresponsive: AtomicBool::new(false),
        state: AtomicU8::new(STARTING),
        frozen: AtomicBool::new(false),
        killer,
        last_used: Mutex::new(Instant::now()),
        exit: exit_rx,
    });
    if let Err(e) = instance.readiness_check().await {
        instance.kill();
        instance.cleanup();
        return Err(explain(
            format!("instance failed its readiness check: {e}"),
            &tail,
        ));
    }
    instance.state.store(READY, Ordering::Release);
    Ok(instance)
}

/// Memory limit of a generic instance until it is given a function.
const GENERIC_MEMORY_MB: u32 = 256;

/// Why a generic instance could not take a function.
pub(crate) enum SpecialiseError {
    /// The function's entrypoint could not be loaded (the user's problem).
    Load(String),
    /// Anything else; the caller falls back to a fresh instance.
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

fn describe(e: CallError) -> String {
    match e {
        CallError::Timeout => "timed out".to_string(),
        CallError::Failed(m) => m,
    }
}

fn prepare_run_dir(
    run_dir: &std::path::Path,
    sock_dir: &std::path::Path,
    slot: Option<&(PathBuf, PathBuf)>,
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
    // shim its descriptor, so no function can write to the host's disk through it.
    std::fs::set_permissions(sock_dir, std::fs::Permissions::from_mode(0o700))
}

/// The function-specific environment of a cold-started instance (a generic
/// instance gets the same through its load request).
fn function_env(d: &Deployment) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        d.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
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
fn process_spec(
    cfg: &ExecutorConfig,
    (family, network): (RuntimeFamily, NetworkMode),
    id: &str,
    sock_dir: &std::path::Path,
    code: &std::path::Path,
    deps: Option<&std::path::Path>,
    memory_mb: u32,
) -> ProcessSpec {
    let (program, shim) = match family {
        RuntimeFamily::Nodejs => (cfg.node.clone(), "/runtime/node/sless_runtime.js"),
        _ => (cfg.python.clone(), "/runtime/python/sless_runtime.py"),
    };
    let env = [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("PYTHONUNBUFFERED", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("NODE_PATH", "/deps/node_modules"),
        ("SLESS_READY_FD", "3"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([(
        "SLESS_LISTEN_FD".to_string(),
        sless_sandbox::LISTEN_FD.to_string(),
    )])
    .collect();
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
    ProcessSpec {
        id: id.to_string(),
        program,
        args: vec![shim.to_string()],
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
        ready_pipe: true,
        listen: Some(sock_dir.join("fn.sock")),
    }
}

/// Waits for the shim's `ready` line on the readiness pipe.
async fn wait_ready_line(ready: Option<tokio::net::unix::pipe::Receiver>) -> Result<(), String> {
    let Some(mut ready) = ready else {
        return Err("has no readiness pipe".into());
    };
    let mut buf = [0u8; 16];
    let mut got = Vec::new();
    loop {
        let n = ready
            .read(&mut buf)
            .await
            .map_err(|e| format!("readiness pipe failed: {e}"))?;
        if n == 0 {
            return Err(String::new());
        }
        got.extend_from_slice(&buf[..n]);
        if got.starts_with(b"ready") {
            return Ok(());
        }
        if got.len() > 64 {
            return Err("wrote garbage to its readiness pipe".into());
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
async fn pump<R: AsyncRead + Unpin>(
    out: R,
    sink: Arc<SinkSlot>,
    stream: &'static str,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
) {
    let mut reader = BufReader::with_capacity(MAX_PIECE, out);
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

    async fn logged(output: &[u8]) -> Vec<String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = sless_logs::LogStore::new(dir.path().to_path_buf(), 1 << 24).expect("logs");
        let sink = Arc::new(SinkSlot::new(Some(store.sink("ns", "f"))));
        pump(output, sink, "stdout", None).await;
        store
            .tail("ns", "f", 100)
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
}
