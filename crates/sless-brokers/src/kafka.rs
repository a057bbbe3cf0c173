//! A Kafka broker for tests: librdkafka's mock cluster, run by Debian's `kcat` as a
//! separate process (`-X test.mock.num.brokers=1`). It speaks the real protocol
//! (topics, consumer groups, committed offsets) on a loopback TCP port, so the
//! server under test can be another process. Topics are created on first use
//! (4 partitions). The mock keeps everything in memory: it cannot be restarted with
//! its data, so "broker restarted" scenarios are not possible with it.

use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A running mock cluster; dropping it stops the process.
pub struct KafkaMock {
    child: Child,
    /// Closing it stops kcat.
    stdin: Option<ChildStdin>,
    /// Holds kcat's log.
    _dir: tempfile::TempDir,
    bootstrap: String,
}

impl KafkaMock {
    /// Starts `kcat` with a one-broker mock cluster and waits for its address.
    pub fn start() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let log_path = dir.path().join("kcat.log");
        // kcat as a producer of a topic of its own, fed from our end of its stdin: it
        // runs until that closes, so a mock held in a `static` (never dropped) still
        // ends with the test binary.
        let mut child = Command::new("kcat")
            .args([
                "-X",
                "test.mock.num.brokers=1",
                "-b",
                "mock",
                "-P",
                "-t",
                "sless-mock-keepalive",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path)?)
            .spawn()
            .context("starting kcat (Debian package `kcat`)")?;
        let stdin = child.stdin.take();
        // Its log (the address, and anything the mock complains about) goes to a file.
        let deadline = Instant::now() + Duration::from_secs(20);
        let bootstrap = loop {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(addr) = log.lines().find_map(|l| l.split("replaced with ").nth(1)) {
                break addr.trim().to_string();
            }
            if Instant::now() > deadline || child.try_wait()?.is_some() {
                drop(stdin);
                let _ = child.wait();
                bail!("kcat did not report the mock cluster's address:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(Self {
            child,
            stdin,
            bootstrap,
            _dir: dir,
        })
    }

    /// `host:port` of the mock broker.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// `kafka://host:port`, as a trigger's source names it.
    pub fn url(&self) -> String {
        format!("kafka://{}", self.bootstrap)
    }
}

impl Drop for KafkaMock {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
