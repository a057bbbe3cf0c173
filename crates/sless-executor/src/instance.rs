//! One running instance: its sandboxed process, its socket and a small pool of
//! keep-alive HTTP/1.1 connections to it (see docs/instance-protocol.md).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sless_core::RuntimeFamily;
use sless_logs::LogSink;
use sless_sandbox::{Exit, Killer, Mount, ProcessSpec, Sandbox};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::{Deployment, ExecutorConfig, InvokeRequest};

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
    pub revision: u64,
    socket: PathBuf,
    run_dir: PathBuf,
    conns: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    max_idle_conns: usize,
    pub inflight: AtomicU32,
    pub state: AtomicU8,
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
        prepare_run_dir(&run_dir, cfg.sandbox_uid, cfg.sandbox_gid).map_err(|e| {
            format!(
                "cannot prepare instance directory {}: {e}",
                run_dir.display()
            )
        })?;
        let spec = process_spec(cfg, d, &id, &run_dir);
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
            let exit =
                tokio::time::timeout(Duration::from_secs(2), exit_rx.wait_for(|e| e.is_some()))
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
            revision: d.revision,
            socket: run_dir.join("fn.sock"),
            run_dir,
            conns: Mutex::new(Vec::new()),
            max_idle_conns: d.concurrency.clamp(1, 64) as usize + 2,
            inflight: AtomicU32::new(0),
            state: AtomicU8::new(STARTING),
            killer,
            last_used: Mutex::new(Instant::now()),
            exit: exit_rx,
        });
        if let Err(e) = instance.readiness_check().await {
            instance.kill();
            return Err(explain(
                format!("instance failed its readiness check: {e}"),
                &tail,
            ));
        }
        instance.state.store(READY, Ordering::Release);
        Ok(instance)
    }

    async fn readiness_check(&self) -> Result<(), String> {
        let mut sender = self.checkout().await.map_err(describe)?;
        let req = hyper::Request::get("/_sless/ready")
            .header(hyper::header::HOST, "instance")
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        self.checkin(sender);
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("status {status}"))
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
            (now + t).as_millis().to_string()
        });
        let work = async {
            let mut sender = self.checkout().await?;
            let mut builder = hyper::Request::post("/_sless/invoke")
                .header(hyper::header::HOST, "instance")
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .header("x-sless-request-id", &req.request_id)
                .header("x-sless-source", req.source);
            if let Some(deadline) = &deadline_ms {
                builder = builder.header("x-sless-deadline-ms", deadline);
            }
            let request = builder
                .body(Full::new(req.event.clone()))
                .map_err(|e| CallError::Failed(e.to_string()))?;
            let resp = sender.send_request(request).await.map_err(|e| {
                CallError::Failed(format!("instance failed without answering ({e})"))
            })?;
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| CallError::Failed(format!("instance failed while answering ({e})")))?
                .to_bytes();
            self.checkin(sender);
            match status {
                200 => Ok((true, body)),
                500 => Ok((false, body)),
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

    async fn checkout(&self) -> Result<SendRequest<Full<Bytes>>, CallError> {
        loop {
            let idle = self.conns.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match idle {
                Some(sender) if sender.is_ready() => return Ok(sender),
                Some(_) => continue,
                None => break,
            }
        }
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|e| CallError::Failed(format!("cannot connect to instance ({e})")))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| CallError::Failed(format!("cannot talk to instance ({e})")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn checkin(&self, sender: SendRequest<Full<Bytes>>) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.len() < self.max_idle_conns {
            conns.push(sender);
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

    pub fn cleanup(&self) {
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

fn describe(e: CallError) -> String {
    match e {
        CallError::Timeout => "timed out".to_string(),
        CallError::Failed(m) => m,
    }
}

fn prepare_run_dir(dir: &std::path::Path, uid: u32, gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    // The shim creates its socket here as the sandbox user. Only root may chown;
    // an unprivileged server runs instances as itself and needs no change.
    match std::os::unix::fs::chown(dir, Some(uid), Some(gid)) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Ok(()),
        other => other,
    }
}

fn process_spec(
    cfg: &ExecutorConfig,
    d: &Deployment,
    id: &str,
    run_dir: &std::path::Path,
) -> ProcessSpec {
    let (program, shim) = match d.family {
        RuntimeFamily::Nodejs => (cfg.node.clone(), "/runtime/node/sless_runtime.js"),
        _ => (cfg.python.clone(), "/runtime/python/sless_runtime.py"),
    };
    let mut env: Vec<(String, String)> =
        d.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let fixed = [
        ("PATH", "/usr/local/bin:/usr/bin:/bin".to_string()),
        ("HOME", "/tmp".to_string()),
        ("LANG", "C.UTF-8".to_string()),
        ("PYTHONUNBUFFERED", "1".to_string()),
        ("PYTHONDONTWRITEBYTECODE", "1".to_string()),
        ("NODE_PATH", "/deps/node_modules".to_string()),
        ("SLESS_SOCKET", "/run/sless/fn.sock".to_string()),
        ("SLESS_READY_FD", "3".to_string()),
        ("SLESS_ENTRYPOINT", d.entrypoint.clone()),
        ("SLESS_CONCURRENCY", d.concurrency.to_string()),
        ("SLESS_NAMESPACE", d.namespace.clone()),
        ("SLESS_FUNCTION", d.name.clone()),
        ("SLESS_REVISION", d.revision.to_string()),
    ];
    for (k, v) in fixed {
        env.retain(|(key, _)| key != k);
        env.push((k.to_string(), v));
    }
    let mut mounts = vec![
        Mount {
            source: d.code_dir.clone(),
            target: "/code".into(),
            writable: false,
        },
        Mount {
            source: cfg.runtime_dir.clone(),
            target: "/runtime".into(),
            writable: false,
        },
        Mount {
            source: run_dir.to_path_buf(),
            target: "/run/sless".into(),
            writable: true,
        },
    ];
    if let Some(deps) = &d.deps_dir {
        mounts.push(Mount {
            source: deps.clone(),
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
        memory_mb: d.memory_mb,
        max_pids: cfg.max_pids,
        network: true,
        ready_pipe: true,
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

/// Copies an instance's output into its function's log, line by line.
async fn pump<R: AsyncRead + Unpin>(
    out: R,
    sink: LogSink,
    stream: &'static str,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
) {
    let mut lines = BufReader::new(out);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match lines.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                sink.line(stream, &line);
                if let Some(tail) = &tail {
                    let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                    if tail.len() == STDERR_TAIL {
                        tail.pop_front();
                    }
                    tail.push_back(line.trim_end().to_string());
                }
            }
        }
    }
}
