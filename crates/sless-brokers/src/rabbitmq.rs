//! RabbitMQ (Debian's `rabbitmq-server` 3.10) as a process: its own node name, loopback
//! ports, Erlang cookie, data and log directories, and its own `epmd` on a private
//! port, so several instances (and several test binaries) run side by side and
//! stopping one stops everything it started.
//!
//! The node runs as the user that starts it (the Debian wrapper in /usr/sbin, which
//! switches to the `rabbitmq` user, is bypassed), so its directories need no chown.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::free_port;
use crate::group::{Group, Slot, wait_until};

/// Where Debian keeps the unwrapped start script.
const SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
/// It opens its port in ~10-13 s on an idle machine; a loaded one needs more.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// A graceful stop that takes longer than this is finished with SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// A RabbitMQ node for tests. Stopped (everything in its process group killed) when
/// dropped, or when the test binary exits.
#[derive(Debug)]
pub struct RabbitMq {
    port: u16,
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    process: Slot,
}

impl RabbitMq {
    /// Starts a node and waits until it speaks AMQP.
    pub fn start() -> anyhow::Result<RabbitMq> {
        let broker = Self::prepare()?;
        broker.restart()?;
        Ok(broker)
    }

    /// A node with its ports and directories chosen but not started: [`RabbitMq::url`]
    /// refuses connections until [`RabbitMq::restart`].
    pub fn prepare() -> anyhow::Result<RabbitMq> {
        anyhow::ensure!(
            Path::new(SERVER).exists(),
            "{SERVER} is missing: install Debian's rabbitmq-server"
        );
        let dir = tempfile::Builder::new()
            .prefix("sless-rabbitmq-")
            .tempdir()?;
        let root = dir.path();
        for sub in ["home", "mnesia", "log"] {
            std::fs::create_dir_all(root.join(sub))?;
        }
        // No plugins (the management plugin alone adds seconds to every start), no
        // machine-wide environment file, guest allowed (from loopback only, its default).
        std::fs::write(root.join("enabled_plugins"), "[].\n")?;
        std::fs::write(root.join("rabbitmq-env.conf"), "")?;
        std::fs::write(
            root.join("rabbitmq.conf"),
            "loopback_users.guest = true\nlog.console = true\nlog.file = false\n",
        )?;
        // The cookie Erlang would otherwise create in $HOME; 0400 or Erlang refuses it.
        let cookie = root.join("home/.erlang.cookie");
        std::fs::write(&cookie, format!("SLESS{}", std::process::id()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o400))?;
        }

        let port = free_port()?;
        let dist_port = free_port()?;
        let epmd_port = free_port()?;
        let node = format!("sless{port}@localhost");
        let path = |p: &str| root.join(p).display().to_string();
        let env = vec![
            ("HOME".to_owned(), path("home")),
            (
                "RABBITMQ_CONF_ENV_FILE".to_owned(),
                path("rabbitmq-env.conf"),
            ),
            ("RABBITMQ_CONFIG_FILE".to_owned(), path("rabbitmq.conf")),
            (
                "RABBITMQ_ENABLED_PLUGINS_FILE".to_owned(),
                path("enabled_plugins"),
            ),
            (
                "RABBITMQ_PLUGINS_EXPAND_DIR".to_owned(),
                path("plugins-expand"),
            ),
            ("RABBITMQ_MNESIA_BASE".to_owned(), path("mnesia")),
            ("RABBITMQ_LOG_BASE".to_owned(), path("log")),
            ("RABBITMQ_NODENAME".to_owned(), node),
            (
                "RABBITMQ_NODE_IP_ADDRESS".to_owned(),
                "127.0.0.1".to_owned(),
            ),
            ("RABBITMQ_NODE_PORT".to_owned(), port.to_string()),
            ("RABBITMQ_DIST_PORT".to_owned(), dist_port.to_string()),
            ("ERL_EPMD_PORT".to_owned(), epmd_port.to_string()),
            ("ERL_EPMD_ADDRESS".to_owned(), "127.0.0.1".to_owned()),
        ];
        Ok(RabbitMq {
            port,
            dir,
            env,
            process: Slot::default(),
        })
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The node's data, logs and console output (`rabbitmq.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("rabbitmq.log")
    }

    /// Stops the node gracefully (its durable queues and persistent messages stay
    /// on disk). Does nothing if it is not running.
    pub fn stop(&self) {
        self.process.stop(true);
    }

    /// Kills the node at once (SIGKILL), as a crash would.
    pub fn kill(&self) {
        self.process.stop(false);
    }

    /// Stops the node if it runs, then starts it again on the same port with the
    /// same data, and waits until it speaks AMQP.
    pub fn restart(&self) -> anyhow::Result<()> {
        let mut process = self.process.restarting();
        let epmd_port = self
            .env
            .iter()
            .find(|(k, _)| k == "ERL_EPMD_PORT")
            .map(|(_, v)| v.clone())
            .context("no epmd port")?;
        // epmd first, in the node's process group, so stopping the node stops it too
        // (the one Erlang would start itself daemonizes out of the group).
        let script = format!("epmd -port {epmd_port} -address 127.0.0.1 & exec {SERVER}");
        let log = self.log();
        let mut group = Group::spawn(
            "sh",
            &["-c".to_owned(), script],
            &self.env,
            self.dir.path(),
            &log,
            STOP_GRACE,
            Some(self.dir.path()),
        )?;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        wait_until(&mut group, START_TIMEOUT, "rabbitmq-server", &log, || {
            speaks_amqp(addr)
        })?;
        *process = Some(group);
        Ok(())
    }
}

impl Drop for RabbitMq {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether the broker at `addr` answers an AMQP 0-9-1 protocol header with a
/// `connection.start` method frame (type 1, channel 0): the listener is up and the
/// broker behind it has booted.
fn speaks_amqp(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    if stream.write_all(b"AMQP\x00\x00\x09\x01").is_err() {
        return false;
    }
    let mut frame = [0u8; 7];
    stream.read_exact(&mut frame).is_ok() && frame[0] == 1 && frame[1..3] == [0, 0]
}
