//! mosquitto (Debian's 2.0) for tests: a loopback listener on a free port, anonymous
//! access, persistence in its own temporary directory, and no limit on the messages
//! queued for an offline persistent session (mosquitto's default, 1000, silently drops
//! the rest). It can be stopped and started again on the same port with its data.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::free_port;

/// A running (or stopped) mosquitto; dropping it stops the process.
pub struct Mosquitto {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    /// Closing it stops mosquitto.
    stdin: Option<ChildStdin>,
}

impl Mosquitto {
    /// Starts mosquitto and waits until it accepts connections.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with("")
    }

    /// [`Mosquitto::start`] with more configuration lines, e.g.
    /// `max_inflight_messages 1000` for a benchmark (mosquitto hands a session at most
    /// 20 unacknowledged QoS 1 messages at once by default).
    pub fn start_with(extra_config: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let conf = format!(
            "listener {port} 127.0.0.1\n\
             allow_anonymous true\n\
             # Started as root, mosquitto would switch to its own user and lose the\n\
             # temporary directory; tests run it as whoever runs them.\n\
             user root\n\
             persistence true\n\
             persistence_location {dir}/\n\
             max_queued_messages 0\n\
             log_dest file {dir}/mosquitto.log\n\
             log_type error\n\
             log_type warning\n\
             log_type notice\n\
             {extra_config}\n",
            dir = dir.path().display()
        );
        std::fs::write(dir.path().join("mosquitto.conf"), conf)?;
        let mut broker = Self {
            dir,
            port,
            child: None,
            stdin: None,
        };
        broker.spawn()?;
        Ok(broker)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        // mosquitto runs under a shell that stops it (SIGTERM: it saves its data)
        // once our end of the shell's stdin closes, so it never outlives the tests.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("mosquitto -c \"$1\" </dev/null & m=$!; read -r _; kill $m; wait $m")
            .arg("sh")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting mosquitto (Debian package `mosquitto`)")?;
        self.stdin = child.stdin.take();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "mosquitto exited ({status}); log:\n{}",
                    std::fs::read_to_string(self.log_path()).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!("mosquitto did not open port {} in time", self.port);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `mqtt://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// mosquitto's own log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("mosquitto.log")
    }

    /// Stops it gracefully (SIGTERM), so it writes its persistence file.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(15);
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("mosquitto did not stop in time");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Starts it again on the same port with the same data.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        self.spawn()
    }

    /// Starts it again after [`Mosquitto::stop`].
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        self.spawn()
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }
}
