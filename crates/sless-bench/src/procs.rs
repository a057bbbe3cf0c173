//! The processes the bench starts — the `sless serve` under test and the baselines — each
//! behind a guard that stops it (SIGTERM, then SIGKILL) however the bench ends.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sless_client::Client;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use crate::error::{BenchError, Result, io};

/// How long `sless serve` may take to answer `/healthz` after start.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the server may take to stop after SIGTERM (it drains and stops instances).
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(45);
/// How long a baseline may take to become ready or to stop.
const BASELINE_TIMEOUT: Duration = Duration::from_secs(15);

/// A child process that is stopped when the guard goes away.
///
/// [`ChildGuard::stop`] is the normal way out; dropping the guard (an error, an interrupt)
/// sends SIGTERM and waits up to `drop_grace` before SIGKILL, so even an aborted run leaves
/// nothing behind and the server still gets to stop its sandboxed instances.
pub struct ChildGuard {
    what: String,
    child: Option<Child>,
    pid: u32,
    log: PathBuf,
    drop_grace: Duration,
}

impl ChildGuard {
    /// Starts `cmd` with stdin closed and stderr to `log`; stdout too unless `pipe_stdout`,
    /// when the caller reads it (a port, readiness).
    pub fn spawn(
        what: impl Into<String>,
        cmd: &mut Command,
        log: &Path,
        pipe_stdout: bool,
        drop_grace: Duration,
    ) -> Result<ChildGuard> {
        let what = what.into();
        let file = std::fs::File::create(log).map_err(io(format!("create {}", log.display())))?;
        let err_file = file
            .try_clone()
            .map_err(io(format!("reopen {}", log.display())))?;
        cmd.stdin(Stdio::null())
            .stderr(Stdio::from(err_file))
            .stdout(if pipe_stdout {
                Stdio::piped()
            } else {
                Stdio::from(file)
            })
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|source| BenchError::Spawn {
            what: what.clone(),
            source,
        })?;
        let pid = child.id().ok_or_else(|| BenchError::ProcessFailed {
            what: what.clone(),
            reason: "exited immediately".into(),
            log_tail: String::new(),
        })?;
        Ok(ChildGuard {
            what,
            child: Some(child),
            pid,
            log: log.to_path_buf(),
            drop_grace,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The child, e.g. to read its piped stdout.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// An error saying the process failed, with the end of its output.
    pub fn failed(&self, reason: impl Into<String>) -> BenchError {
        BenchError::ProcessFailed {
            what: self.what.clone(),
            reason: reason.into(),
            log_tail: log_tail(&self.log, 30),
        }
    }

    /// Fails when the process has already exited.
    pub fn check_running(&mut self) -> Result<()> {
        let status = match self.child.as_mut() {
            Some(child) => child.try_wait().ok().flatten(),
            None => return Err(self.failed("already stopped")),
        };
        match status {
            Some(status) => Err(self.failed(format!("exited: {status}"))),
            None => Ok(()),
        }
    }

    /// SIGTERM, wait up to `timeout`, then SIGKILL. An exit other than success after SIGTERM,
    /// or needing SIGKILL, is an error: the process did not stop the way it promises to.
    pub async fn stop(&mut self, timeout: Duration) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Ok(Some(status)) = child.try_wait() {
            // A Ctrl-C in a terminal signals the whole process group, so the child may
            // have stopped cleanly on its own already.
            return if status.success() {
                Ok(())
            } else {
                Err(self.failed(format!("had already exited: {status}")))
            };
        }
        signal(self.pid, Signal::SIGTERM);
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(self.failed(format!("exited with {status} after SIGTERM"))),
            Ok(Err(e)) => Err(io(format!("wait for {}", self.what))(e)),
            Err(_) => {
                let _ = child.kill().await;
                Err(self.failed(format!(
                    "did not stop within {timeout:?} of SIGTERM; killed"
                )))
            }
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        signal(self.pid, Signal::SIGTERM);
        // Drop cannot await; this is the error path, so polling the exit is acceptable here.
        let deadline = Instant::now() + self.drop_grace;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "sless-bench: {} did not stop after SIGTERM; killing it",
            self.what
        );
        // `kill_on_drop` sends SIGKILL when `child` goes out of scope here.
    }
}

/// Sends `sig` to `pid`, ignoring a process that is already gone.
fn signal(pid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(raw), sig);
    }
}

/// The last `lines` lines of a log file, or an empty string when it cannot be read.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A `sless serve` on a free loopback port with its own data directory and admin token.
pub struct Server {
    guard: ChildGuard,
    /// Where the server listens.
    pub addr: std::net::SocketAddr,
    /// Its data directory (`run/<instance>/fn.sock` lives under it).
    pub data_dir: PathBuf,
    /// An API client with the admin token.
    pub client: Client,
}

/// What to start the server with.
pub struct ServerConfig<'a> {
    pub binary: &'a Path,
    pub python: &'a Path,
    pub node: &'a Path,
    /// A directory of the bench's own; the data directory and the log go below it.
    pub scratch: &'a Path,
    /// Run the devices' MQTT broker on this address (`--mqtt-listen`).
    pub mqtt_listen: Option<std::net::SocketAddr>,
    /// More `sless serve` flags (e.g. `--metrics=false`).
    pub extra_args: &'a [&'a str],
}

impl Server {
    /// Starts the server and waits until `/healthz` answers.
    pub async fn start(config: &ServerConfig<'_>) -> Result<Server> {
        let data_dir = config.scratch.join("data");
        let token = random_token()?;
        // Taking a free port and handing it over is racy, but only against other loopback
        // users of this machine; a lost race shows up as the server exiting with its reason.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(io("find a free loopback port"))?
            .port();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut cmd = Command::new(config.binary);
        cmd.arg("serve")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--python")
            .arg(config.python)
            .arg("--node")
            .arg(config.node)
            // The direct baseline talks to an instance behind the executor's back, so the
            // executor would see it idle and freeze it mid-round; nothing is frozen here.
            .arg("--freeze-idle-ms")
            .arg("0")
            .env("SLESS_ADMIN_TOKEN", &token)
            .env("SLESS_LOG", "warn");
        if let Some(mqtt) = config.mqtt_listen {
            cmd.arg("--mqtt-listen").arg(mqtt.to_string());
        }
        cmd.args(config.extra_args);
        let log = config.scratch.join("server.log");
        let mut guard =
            ChildGuard::spawn("sless serve", &mut cmd, &log, false, SERVER_STOP_TIMEOUT)?;
        let client = Client::new(&format!("http://{addr}"), Some(token))
            .map_err(|e| BenchError::Setup(format!("cannot make an API client: {e}")))?;
        let start = Instant::now();
        loop {
            guard.check_running()?;
            let healthy = client
                .http()
                .get(format!("http://{addr}/healthz"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if healthy {
                break;
            }
            if start.elapsed() > SERVER_START_TIMEOUT {
                return Err(guard.failed(format!(
                    "/healthz did not answer within {SERVER_START_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(Server {
            guard,
            addr,
            data_dir,
            client,
        })
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// The server's resident set size in MiB, from `/proc/<pid>/status`.
    pub fn rss_mib(&self) -> Result<f64> {
        let path = format!("/proc/{}/status", self.guard.pid());
        let status = std::fs::read_to_string(&path).map_err(io(format!("read {path}")))?;
        parse_vm_rss_kib(&status)
            .map(|kib| kib as f64 / 1024.0)
            .ok_or_else(|| BenchError::Setup(format!("no VmRSS line in {path}")))
    }

    /// Fails when the server has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.guard.check_running()
    }

    /// SIGTERM and wait for a clean exit.
    pub async fn stop(&mut self) -> Result<()> {
        self.guard.stop(SERVER_STOP_TIMEOUT).await
    }
}

/// The `VmRSS` of a `/proc/<pid>/status` text, in KiB.
fn parse_vm_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// 128 random bits as hex, from the kernel; the token only guards a loopback server that
/// lives as long as the run.
fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    let mut file = std::fs::File::open("/dev/urandom").map_err(io("open /dev/urandom"))?;
    std::io::Read::read_exact(&mut file, &mut bytes).map_err(io("read /dev/urandom"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A process serving the instance protocol outside the sandbox: the Python shim or the
/// `ThreadingHTTPServer` baseline, started with the same environment the platform gives.
pub struct ProtocolServer {
    guard: ChildGuard,
    /// The Unix socket it listens on.
    pub socket: PathBuf,
}

/// What a [`ProtocolServer`] runs.
pub struct ProtocolConfig<'a> {
    /// A name for messages, e.g. `python shim`.
    pub what: &'a str,
    pub python: &'a Path,
    pub script: &'a Path,
    /// The function's code directory (`SLESS_CODE_DIR`).
    pub code_dir: &'a Path,
    /// A directory for the socket and the log.
    pub run_dir: &'a Path,
    pub entrypoint: &'a str,
    pub concurrency: usize,
}

impl ProtocolServer {
    /// Starts the server and waits for `ready\n` on its readiness fd.
    ///
    /// The readiness fd must be a descriptor the child inherits. Without `unsafe` (`pre_exec`)
    /// a pipe cannot be placed at a chosen fd number, so the process is started through
    /// `sh -c 'exec "$@" 3>&1 1>&2'`: the shell makes fd 3 the piped stdout and stdout a copy of
    /// stderr (the log), then replaces itself with the server, whose pid is the guard's.
    pub async fn start(config: &ProtocolConfig<'_>) -> Result<ProtocolServer> {
        let socket = config.run_dir.join("fn.sock");
        let log = config.run_dir.join("server.log");
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(r#"exec "$@" 3>&1 1>&2"#)
            .arg("sh")
            .arg(config.python)
            .arg(config.script)
            .current_dir(config.code_dir)
            .env("SLESS_SOCKET", &socket)
            .env("SLESS_READY_FD", "3")
            .env("SLESS_ENTRYPOINT", config.entrypoint)
            .env("SLESS_CODE_DIR", config.code_dir)
            .env("SLESS_DEPS_DIR", config.run_dir.join("deps"))
            .env("SLESS_CONCURRENCY", config.concurrency.to_string())
            .env("SLESS_NAMESPACE", "bench")
            .env("SLESS_FUNCTION", "bench")
            .env("SLESS_REVISION", "1");
        let mut guard = ChildGuard::spawn(config.what, &mut cmd, &log, true, BASELINE_TIMEOUT)?;
        let stdout = guard.child_mut().and_then(|c| c.stdout.take());
        let Some(mut ready) = stdout else {
            return Err(guard.failed("its readiness pipe is missing"));
        };
        let mut said = Vec::new();
        let read = tokio::time::timeout(BASELINE_TIMEOUT, ready.read_to_end(&mut said)).await;
        match read {
            Ok(Ok(_)) if said == b"ready\n" => Ok(ProtocolServer { guard, socket }),
            Ok(Ok(_)) => Err(guard.failed(format!(
                "wrote {:?} to its readiness fd instead of \"ready\\n\"",
                String::from_utf8_lossy(&said)
            ))),
            Ok(Err(e)) => Err(io(format!("read the readiness fd of {}", config.what))(e)),
            Err(_) => Err(guard.failed(format!("not ready within {BASELINE_TIMEOUT:?}"))),
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub async fn stop(mut self) -> Result<()> {
        self.guard.stop(BASELINE_TIMEOUT).await
    }
}

/// A plain Node `http` server on a loopback port, running a handler outside the sandbox.
pub struct PlainNode {
    guard: ChildGuard,
    /// Where it listens.
    pub addr: std::net::SocketAddr,
}

impl PlainNode {
    /// Starts `node script code_dir` and reads `listening <port>` from its stdout.
    pub async fn start(
        node: &Path,
        script: &Path,
        code_dir: &Path,
        run_dir: &Path,
    ) -> Result<PlainNode> {
        let mut cmd = Command::new(node);
        cmd.arg(script).arg(code_dir);
        let log = run_dir.join("plain-node.log");
        let mut guard =
            ChildGuard::spawn("plain node server", &mut cmd, &log, true, BASELINE_TIMEOUT)?;
        let stdout = guard.child_mut().and_then(|c| c.stdout.take());
        let Some(mut out) = stdout else {
            return Err(guard.failed("its stdout pipe is missing"));
        };
        let mut line = Vec::new();
        let read = tokio::time::timeout(BASELINE_TIMEOUT, async {
            let mut byte = [0u8; 1];
            while out.read(&mut byte).await? == 1 && byte[0] != b'\n' {
                line.push(byte[0]);
            }
            Ok::<_, std::io::Error>(())
        })
        .await;
        if !matches!(read, Ok(Ok(()))) {
            return Err(guard.failed("did not say which port it listens on"));
        }
        let text = String::from_utf8_lossy(&line).into_owned();
        let port = text
            .strip_prefix("listening ")
            .and_then(|p| p.trim().parse::<u16>().ok());
        match port {
            Some(port) => Ok(PlainNode {
                guard,
                addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            }),
            None => Err(guard.failed(format!("printed {text:?} instead of its port"))),
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub async fn stop(mut self) -> Result<()> {
        self.guard.stop(BASELINE_TIMEOUT).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_kib() {
        let status = "Name:\tsless\nVmPeak:\t  90000 kB\nVmRSS:\t   23456 kB\nThreads:\t5\n";
        assert_eq!(parse_vm_rss_kib(status), Some(23456));
        assert_eq!(parse_vm_rss_kib("Name:\tx\n"), None);
    }

    #[test]
    fn tokens_are_random_hex() {
        let a = random_token().expect("token");
        let b = random_token().expect("token");
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        std::fs::write(&path, "a\nb\nc\n").expect("write");
        assert_eq!(log_tail(&path, 2), "b\nc");
        assert_eq!(log_tail(&dir.path().join("missing"), 2), "");
    }

    #[tokio::test]
    async fn a_guard_stops_its_process_with_sigterm() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new("/bin/sh");
        // `exec sleep` so SIGTERM reaches sleep itself, whose default action is to exit.
        cmd.arg("-c").arg("echo started; exec sleep 30");
        let log = dir.path().join("log");
        let mut guard = ChildGuard::spawn("sleeper", &mut cmd, &log, false, Duration::from_secs(5))
            .expect("spawn");
        guard.check_running().expect("running");
        // Death by SIGTERM is not a success exit, which `stop` reports with the log.
        let err = guard
            .stop(Duration::from_secs(5))
            .await
            .expect_err("killed by a signal");
        assert!(err.to_string().contains("after SIGTERM"), "{err}");
        assert!(guard.check_running().is_err());
    }

    #[tokio::test]
    async fn dropping_a_guard_stops_its_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg("exec sleep 30");
        let guard = ChildGuard::spawn(
            "sleeper",
            &mut cmd,
            &dir.path().join("log"),
            false,
            Duration::from_secs(5),
        )
        .expect("spawn");
        let pid = Pid::from_raw(i32::try_from(guard.pid()).expect("pid fits"));
        drop(guard);
        // Drop waited for the exit and reaped the child, so the pid no longer exists.
        assert!(kill(pid, None).is_err());
    }

    #[tokio::test]
    async fn a_process_that_never_signals_readiness_is_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("bad.py");
        std::fs::write(&script, "import os\nos.write(3, b'nope\\n')\n").expect("write");
        let err = ProtocolServer::start(&ProtocolConfig {
            what: "bad server",
            python: Path::new("/usr/bin/python3"),
            script: &script,
            code_dir: dir.path(),
            run_dir: dir.path(),
            entrypoint: "handler.handle",
            concurrency: 1,
        })
        .await
        .err()
        .expect("not ready");
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
