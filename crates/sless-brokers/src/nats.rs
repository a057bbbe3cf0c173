//! nats-server (Debian's 2.9) with JetStream as a process on a loopback port with
//! its own store directory; stopped and restarted on the same port with the same
//! store for broker-restart tests.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::free_port;
use crate::group::{Group, Slot, wait_until};

const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_GRACE: Duration = Duration::from_secs(15);

/// A nats-server with JetStream for tests. Stopped when dropped, or when the test
/// binary exits.
#[derive(Debug)]
pub struct Nats {
    port: u16,
    dir: tempfile::TempDir,
    process: Slot,
}

impl Nats {
    /// Starts a server and waits until it greets clients.
    pub fn start() -> anyhow::Result<Nats> {
        let nats = Self::prepare()?;
        nats.restart()?;
        Ok(nats)
    }

    /// A server with its port and store chosen but not started.
    pub fn prepare() -> anyhow::Result<Nats> {
        let dir = tempfile::Builder::new().prefix("sless-nats-").tempdir()?;
        std::fs::create_dir_all(dir.path().join("store"))?;
        Ok(Nats {
            port: free_port()?,
            dir,
            process: Slot::default(),
        })
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("nats.log")
    }

    /// Stops the server gracefully. Does nothing if it is not running.
    pub fn stop(&self) {
        self.process.stop(true);
    }

    /// Kills the server at once (SIGKILL).
    pub fn kill(&self) {
        self.process.stop(false);
    }

    /// Stops the server if it runs, starts it again on the same port with the same
    /// store, and waits until it greets clients.
    pub fn restart(&self) -> anyhow::Result<()> {
        let mut process = self.process.restarting();
        let store = self.dir.path().join("store").display().to_string();
        let args = [
            "-js",
            "-sd",
            &store,
            "-p",
            &self.port.to_string(),
            "-a",
            "127.0.0.1",
            "-n",
            &format!("sless-test-{}", self.port),
        ]
        .map(str::to_owned);
        let log = self.log();
        let mut group = Group::spawn(
            "nats-server",
            &args,
            &[],
            self.dir.path(),
            &log,
            STOP_GRACE,
            Some(self.dir.path()),
        )?;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        wait_until(&mut group, START_TIMEOUT, "nats-server", &log, || {
            greets(addr)
        })?;
        *process = Some(group);
        Ok(())
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether the server at `addr` sends its `INFO` greeting.
fn greets(addr: SocketAddr) -> bool {
    let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("INFO ")
}
