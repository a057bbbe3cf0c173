//! moto's server (`moto_server`, from PyPI's `moto[server]`) as a real S3 API on a
//! loopback port, for the S3 blob store's tests. It keeps everything in memory: a
//! restart (same port) comes back empty, so tests create their buckets again.
//!
//! The executable: `SLESS_MOTO_SERVER`, else `~/.cache/sless/moto/bin/moto_server`
//! (the virtualenv `.ci/run` makes), else `moto_server` on `PATH`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::free_port;
use crate::group::{Group, Slot, wait_until};

const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The access key, secret and region moto accepts (it checks no signature).
pub const ACCESS_KEY_ID: &str = "sless-test";
pub const SECRET_ACCESS_KEY: &str = "sless-test-secret";
pub const REGION: &str = "us-east-1";

/// A moto S3 server for tests. Stopped when dropped, or when the test binary exits.
#[derive(Debug)]
pub struct Moto {
    port: u16,
    dir: tempfile::TempDir,
    process: Slot,
}

/// The `moto_server` to run (see the module's doc).
pub fn moto_server() -> PathBuf {
    if let Some(path) = std::env::var_os("SLESS_MOTO_SERVER") {
        return PathBuf::from(path);
    }
    if let Some(home) = std::env::var_os("HOME") {
        let venv = PathBuf::from(home).join(".cache/sless/moto/bin/moto_server");
        if venv.is_file() {
            return venv;
        }
    }
    PathBuf::from("moto_server")
}

impl Moto {
    /// Starts a server and waits until it answers HTTP.
    pub fn start() -> anyhow::Result<Moto> {
        let moto = Moto {
            port: free_port()?,
            dir: tempfile::Builder::new().prefix("sless-moto-").tempdir()?,
            process: Slot::default(),
        };
        moto.start_again()?;
        Ok(moto)
    }

    /// `http://127.0.0.1:PORT`, the endpoint to give an S3 client.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The standard AWS variables that point a client at this server.
    pub fn aws_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY.to_string()),
            ("AWS_REGION", REGION.to_string()),
            ("AWS_ENDPOINT_URL", self.endpoint()),
        ]
    }

    /// Stops the server (SIGTERM). Does nothing if it is not running.
    pub fn stop(&self) {
        self.process.stop(true);
    }

    /// Freezes the server (SIGSTOP): connections are still accepted by the kernel
    /// but nothing answers, as with a hung backend. [`Moto::resume`] undoes it.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal("STOP")
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal("CONT")
    }

    fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let process = self.process.lock();
        match process.as_ref() {
            Some(group) => group.signal(signal),
            None => bail!("moto_server is not running"),
        }
    }

    /// Starts the server on its port (stopping it first if it runs), empty, and
    /// waits until it answers.
    pub fn start_again(&self) -> anyhow::Result<()> {
        let mut process = self.process.restarting();
        let program = moto_server();
        let args = ["-H", "127.0.0.1", "-p", &self.port.to_string()].map(str::to_owned);
        let log = self.dir.path().join("moto.log");
        let mut group = Group::spawn(
            &program.to_string_lossy(),
            &args,
            &[],
            self.dir.path(),
            &log,
            STOP_GRACE,
            Some(self.dir.path()),
        )
        .with_context(|| {
            format!(
                "starting {} (pip install 'moto[server]'; see .ci/run)",
                program.display()
            )
        })?;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        wait_until(&mut group, START_TIMEOUT, "moto_server", &log, || {
            request(addr, "GET", "/").is_ok()
        })
        .with_context(|| {
            format!(
                "{} did not start (is moto[server] installed? see .ci/run)",
                program.display()
            )
        })?;
        *process = Some(group);
        Ok(())
    }

    /// Creates `bucket` (object_store cannot): a plain `PUT /bucket`, which moto
    /// takes unsigned. A bucket that exists already is fine.
    pub fn create_bucket(&self, bucket: &str) -> anyhow::Result<()> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let (status, body) = request(addr, "PUT", &format!("/{bucket}"))?;
        if status == 200 || body.contains("BucketAlreadyOwnedByYou") {
            return Ok(());
        }
        bail!("creating bucket {bucket}: HTTP {status}: {body}")
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.process.stop(false);
    }
}

/// One HTTP/1.1 request with no body; the status and the body.
fn request(addr: SocketAddr, method: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP response: {response:?}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
