//! PostgreSQL from the machine's own binaries (`initdb`, `postgres`; Debian's
//! `postgresql` package): a cluster in a temp dir, listening on a loopback port,
//! run as the `postgres` user (the server refuses to run as root). Tests create a
//! database each with [`Postgres::create_database`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::Context;

use crate::free_port;
use crate::group::{Group, Slot, wait_until};

const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_GRACE: Duration = Duration::from_secs(15);
/// The superuser the cluster is created with (trust authentication on loopback).
const USER: &str = "sless";

/// A PostgreSQL server for tests. Stopped when dropped, or when the test binary exits.
#[derive(Debug)]
pub struct Postgres {
    port: u16,
    dir: tempfile::TempDir,
    process: Slot,
    databases: AtomicU32,
}

impl Postgres {
    /// Creates a cluster and starts the server; waits until it accepts connections.
    pub fn start() -> anyhow::Result<Postgres> {
        let dir = tempfile::Builder::new()
            .prefix("sless-postgres-")
            .tempdir()?;
        let pg = Postgres {
            port: free_port()?,
            dir,
            process: Slot::default(),
            databases: AtomicU32::new(0),
        };
        // The server runs as `postgres`: it must reach its directory.
        set_mode(pg.dir.path(), 0o755)?;
        std::fs::create_dir(pg.data())?;
        chown_postgres(&pg.data())?;
        set_mode(&pg.data(), 0o700)?;
        let out = as_postgres(&bin("initdb"))
            .args(["-D", &pg.data().display().to_string()])
            .args([
                "-U",
                USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .output()
            .context("running initdb (is the postgresql package installed?)")?;
        anyhow::ensure!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.restart()?;
        Ok(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's pid (its connections' backends are its children), while it runs.
    pub fn pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// `postgres://sless@127.0.0.1:PORT/database`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a new empty database and returns its URL.
    pub fn create_database(&self) -> anyhow::Result<String> {
        let n = self.databases.fetch_add(1, Ordering::Relaxed);
        let name = format!("t{}_{n}", std::process::id());
        self.psql(&format!("CREATE DATABASE {name}"))?;
        Ok(self.url(&name))
    }

    /// Runs one SQL command in the `postgres` database.
    pub fn psql(&self, sql: &str) -> anyhow::Result<String> {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
            .args(["-d", "postgres", "-v", "ON_ERROR_STOP=1", "-At", "-c", sql])
            .output()
            .context("running psql")?;
        anyhow::ensure!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
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
    /// data, and waits until it accepts connections.
    pub fn restart(&self) -> anyhow::Result<()> {
        let mut process = self.process.restarting();
        let data = self.data().display().to_string();
        let args: Vec<String> = [
            "-u",
            "postgres",
            "--",
            &bin("postgres"),
            "-D",
            &data,
            "-p",
            &self.port.to_string(),
            "-h",
            "127.0.0.1",
            "-k",
            &data,
            // A test cluster: durability traded for speed.
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=300",
        ]
        .map(str::to_owned)
        .into();
        let log = self.log();
        let mut group = Group::spawn(
            "runuser",
            &args,
            &[],
            self.dir.path(),
            &log,
            STOP_GRACE,
            Some(self.dir.path()),
        )?;
        let port = self.port.to_string();
        wait_until(&mut group, START_TIMEOUT, "postgres", &log, || {
            Command::new("pg_isready")
                .args(["-q", "-h", "127.0.0.1", "-p", &port])
                .status()
                .is_ok_and(|s| s.success())
        })?;
        *process = Some(group);
        Ok(())
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A server binary: from `SLESS_PG_BIN` (a directory), PATH, or Debian's
/// `/usr/lib/postgresql/<version>/bin`.
fn bin(name: &str) -> String {
    if let Ok(dir) = std::env::var("SLESS_PG_BIN") {
        return Path::new(&dir).join(name).display().to_string();
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let path = Path::new(dir).join(name);
        if path.is_file() {
            return path.display().to_string();
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    versions.sort();
    versions
        .last()
        .map(|v| v.join("bin").join(name).display().to_string())
        .unwrap_or_else(|| name.to_string())
}

fn as_postgres(program: &str) -> Command {
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "postgres", "--", program]);
    cmd
}

fn chown_postgres(path: &Path) -> anyhow::Result<()> {
    let status = Command::new("chown")
        .args(["postgres:postgres", &path.display().to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "chown postgres {}", path.display());
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))
}
