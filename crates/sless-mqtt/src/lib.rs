//! sless's MQTT broker for devices: Debian's mosquitto 2.0 run as a child process
//! with its dynamic-security plugin, supervised (restarted with back-off when it
//! exits), its files under `<data>/mqtt/`.
//!
//! sless's metadata store is the one truth about devices. Before every start of
//! mosquitto the supervisor writes the plugin's account file from it ([`Accounts`]:
//! every device's password hash, in the plugin's own format, and its role); while
//! mosquitto runs, changes reach it as `$CONTROL/dynamic-security/v1` commands
//! ([`Broker::apply`]). Starts and commands take the same lock, so a change the store
//! took is either in the file the next start writes or applied to the running broker
//! (commands are idempotent, so both is fine). A command that fails against a running
//! broker restarts it, so it never keeps an account the store no longer has.
//!
//! The ingest's persistent session (`sless-ingest`, subscribed to every device's
//! telemetry) must be in mosquitto's persistence file before any device can publish:
//! a broker that comes up without it acknowledges telemetry that matches no
//! subscription and drops it, until the ingest subscribes again. A start that finds
//! no persistence file (a new data directory, or the file lost) first seeds one
//! ([`Broker::seed_ingest_session`]), so a crash at any time after, even before the
//! first autosave, restarts with the subscription in place.
//!
//! mosquitto's log (stderr) is read line by line: connections give each device's
//! `online`, and refusals (a denied publish or subscription, a refused login) are
//! written to the server's log ([`logwatch`]).

pub mod control;
pub mod dynsec;
pub mod logwatch;
pub mod password;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rand::Rng;
use rumqttc::v5;
use rumqttc::v5::mqttbytes::v5::{Packet as Packet5, SubscribeReasonCode};
use serde_json::Value;
use sless_core::Backoff;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;

pub use control::ControlError;
pub use dynsec::{DeviceAccount, INGEST_USER};
pub use password::PasswordHash;

use control::Control;
use logwatch::{Presence, Refusal};

/// Where the dynamic-security plugin is on Debian (and Ubuntu) for this architecture.
const PLUGIN_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib",
    "/usr/local/lib",
];
const PLUGIN_FILE: &str = "mosquitto_dynamic_security.so";
/// Restarts after an exit: from 200 ms, doubling, at most 30 s, jittered.
const RESTART: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
/// A broker that served this long before it exited starts again without delay.
const STABLE: Duration = Duration::from_secs(60);
/// How long one start may take until the control client is connected.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// mosquitto's persistence file in its directory (its default name).
const DB_FILE: &str = "mosquitto.db";

/// How the broker is set up.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The MQTT listener (TCP; MQTT 3.1.1 and 5).
    pub listen: SocketAddr,
    /// The MQTT-over-WebSocket listener, if any (path `/mqtt`).
    pub ws_listen: Option<SocketAddr>,
    /// The broker's own directory (config, account file, persistence), `<data>/mqtt`.
    pub dir: PathBuf,
    /// The mosquitto executable.
    pub mosquitto: PathBuf,
    /// The largest MQTT packet a client may send, in bytes.
    pub max_packet_bytes: u32,
}

/// Where the supervisor reads every device's account before a start.
#[async_trait]
pub trait Accounts: Send + Sync + 'static {
    async fn accounts(&self) -> Result<Vec<DeviceAccount>, String>;
}

/// Errors starting the broker.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// mosquitto or its plugin is not installed, or its directory cannot be written.
    #[error("{0}")]
    Setup(String),
    /// It did not come up.
    #[error("the MQTT broker did not start: {0}")]
    Start(String),
}

/// The running broker and its supervisor.
pub struct Broker {
    config: BrokerConfig,
    plugin: PathBuf,
    ingest_password: String,
    control_password: String,
    accounts: Arc<dyn Accounts>,
    /// The control client of the running mosquitto; `None` while it is down. Held
    /// across a whole start and across each command list.
    control: Mutex<Option<Control>>,
    presence: Arc<std::sync::Mutex<Presence>>,
    /// The running child's pid, for a forced restart.
    pid: std::sync::Mutex<Option<u32>>,
    /// Increments with every start that came up.
    starts: watch::Sender<u64>,
    shutdown: CancellationToken,
    /// Ended once the supervisor has stopped mosquitto for good.
    stopped: CancellationToken,
}

impl Broker {
    /// Starts mosquitto and its supervisor; returns once it serves (its control client
    /// connected), or with the reason it could not start. `shutdown` stops it.
    pub async fn start(
        config: BrokerConfig,
        accounts: Arc<dyn Accounts>,
        shutdown: CancellationToken,
    ) -> Result<Arc<Broker>, BrokerError> {
        let plugin = find_plugin()?;
        check_executable(&config.mosquitto)?;
        std::fs::create_dir_all(&config.dir).map_err(|e| {
            BrokerError::Setup(format!("cannot create {}: {e}", config.dir.display()))
        })?;
        let broker = Arc::new(Broker {
            config,
            plugin,
            ingest_password: password::generate(),
            control_password: password::generate(),
            accounts,
            control: Mutex::new(None),
            presence: Arc::default(),
            pid: std::sync::Mutex::new(None),
            starts: watch::channel(0).0,
            shutdown,
            stopped: CancellationToken::new(),
        });
        let mut child = broker.start_once().await.map_err(BrokerError::Start)?;
        let b = broker.clone();
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                let began = Instant::now();
                let status = tokio::select! {
                    s = child.wait() => Some(s),
                    _ = b.shutdown.cancelled() => None,
                };
                *b.control.lock().await = None;
                b.presence.lock().unwrap_or_else(|e| e.into_inner()).clear();
                let Some(status) = status else {
                    b.stop_child(&mut child).await;
                    break;
                };
                let status = status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string());
                failures = if began.elapsed() > STABLE {
                    0
                } else {
                    failures + 1
                };
                tracing::warn!(%status, "mqtt: the broker exited; starting it again");
                loop {
                    let wait = if failures == 0 {
                        Duration::ZERO
                    } else {
                        RESTART.jittered(failures, rand::rng().random())
                    };
                    tokio::select! {
                        _ = b.shutdown.cancelled() => {
                            b.stopped.cancel();
                            return;
                        }
                        _ = tokio::time::sleep(wait) => {}
                    }
                    match b.start_once().await {
                        Ok(c) => {
                            child = c;
                            break;
                        }
                        Err(e) => {
                            failures += 1;
                            tracing::warn!(error = %e, "mqtt: the broker did not start");
                        }
                    }
                }
            }
            b.stopped.cancel();
        });
        Ok(broker)
    }

    /// Writes the files, starts mosquitto and connects the control client, all under
    /// the control lock.
    async fn start_once(self: &Arc<Self>) -> Result<Child, String> {
        let mut control = self.control.lock().await;
        *control = None;
        let accounts = self.accounts.accounts().await?;
        stop_leftover(&self.pid_file()).await;
        if !self.config.dir.join(DB_FILE).exists() {
            self.seed_ingest_session()
                .await
                .map_err(|e| format!("seeding the ingest's session: {e}"))?;
        }
        self.write_files(&self.config, &accounts)
            .map_err(|e| format!("writing its files: {e}"))?;
        let mut child = Command::new(&self.config.mosquitto)
            .arg("-c")
            .arg(self.conf_file())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", self.config.mosquitto.display()))?;
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = child.id();
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(watch_log(stderr, self.presence.clone()));
        }
        let (host, port) = self.local_endpoint();
        let deadline = Instant::now() + START_TIMEOUT;
        let connected = loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "mosquitto exited at start ({status}); its reasons are in the server's log"
                ));
            }
            match Control::connect(&host, port, &self.control_password, Duration::from_secs(2))
                .await
            {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => {
                    let _ = child.start_kill();
                    return Err(e.to_string());
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        *control = Some(connected);
        self.starts.send_modify(|n| *n += 1);
        tracing::info!(listen = %self.config.listen, ws = ?self.config.ws_listen, "mqtt: broker serving");
        Ok(child)
    }

    /// Writes a persistence file holding the ingest's session, subscribed to every
    /// device's telemetry: runs mosquitto privately (its one listener on a free
    /// loopback port, no device accounts, so no device can reach it), connects as the
    /// ingest does (MQTT 5, client id `sless-ingest`, a session that never expires),
    /// subscribes, and stops it with SIGTERM, on which it saves. The ingest resumes
    /// that session when it connects to the real start.
    async fn seed_ingest_session(&self) -> Result<(), String> {
        let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port: {e}"))?
            .port();
        let private = BrokerConfig {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            ws_listen: None,
            ..self.config.clone()
        };
        self.write_files(&private, &[])
            .map_err(|e| format!("writing its files: {e}"))?;
        let mut child = Command::new(&self.config.mosquitto)
            .arg("-c")
            .arg(self.conf_file())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", self.config.mosquitto.display()))?;
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(watch_log(stderr, Arc::default()));
        }
        let subscribed = tokio::time::timeout(
            START_TIMEOUT,
            subscribe_ingest(port, &self.ingest_password, &mut child),
        )
        .await
        .unwrap_or_else(|_| Err("no subscription in time".into()));
        if let Some(pid) = child.id() {
            terminate(pid);
        }
        let exited = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        if exited.is_err() {
            let _ = child.kill().await;
        }
        subscribed?;
        match exited {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => return Err(format!("mosquitto exited with {status}")),
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("mosquitto did not stop in time".into()),
        }
        if !self.config.dir.join(DB_FILE).exists() {
            return Err(format!("mosquitto wrote no {DB_FILE}"));
        }
        tracing::debug!("mqtt: seeded the ingest's session");
        Ok(())
    }

    /// Stops the child gracefully (SIGTERM: it saves its persistence), then for good.
    async fn stop_child(&self, child: &mut Child) {
        if let Some(pid) = child.id() {
            terminate(pid);
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = child.kill().await;
    }

    /// Waits until the supervisor stopped mosquitto after shutdown.
    pub async fn stopped(&self) {
        self.stopped.cancelled().await;
    }

    /// Sends dynamic-security commands to the running broker. With no broker running
    /// there is nothing to do: its next start writes the store's state. A failure
    /// against a running one restarts it, for the same reason.
    pub async fn apply(&self, commands: Vec<Value>) {
        let control = self.control.lock().await;
        let Some(c) = control.as_ref() else {
            return;
        };
        if let Err(e) = c.run(commands).await {
            tracing::warn!(error = %e, "mqtt: a change did not reach the broker; restarting it to resync");
            drop(control);
            self.restart();
        }
    }

    /// Makes the supervisor start mosquitto again (its state from the store).
    pub fn restart(&self) {
        if let Some(pid) = *self.pid.lock().unwrap_or_else(|e| e.into_inner()) {
            terminate(pid);
        }
    }

    /// The starts that came up so far (tests wait on it after a restart).
    pub fn starts(&self) -> watch::Receiver<u64> {
        self.starts.subscribe()
    }

    /// Whether a client with this username is connected now.
    pub fn is_online(&self, username: &str) -> bool {
        self.presence
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_online(username)
    }

    /// The URL sless's ingest client connects with (MQTT 5, its own credentials).
    pub fn ingest_url(&self) -> String {
        let (host, port) = self.local_endpoint();
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        format!(
            "mqtt://{INGEST_USER}:{}@{host}:{port}?version=5",
            self.ingest_password
        )
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    /// The listener as a local client reaches it (loopback for a wildcard address).
    fn local_endpoint(&self) -> (String, u16) {
        let ip = match self.config.listen.ip() {
            IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        (ip.to_string(), self.config.listen.port())
    }

    fn conf_file(&self) -> PathBuf {
        self.config.dir.join("mosquitto.conf")
    }

    fn pid_file(&self) -> PathBuf {
        self.config.dir.join("mosquitto.pid")
    }

    /// The account file and the configuration, for `config`'s listeners.
    fn write_files(
        &self,
        config: &BrokerConfig,
        accounts: &[DeviceAccount],
    ) -> std::io::Result<()> {
        let dir = &self.config.dir;
        let accounts_file = dir.join("dynamic-security.json");
        let file = dynsec::account_file(
            &PasswordHash::new(&self.ingest_password),
            &PasswordHash::new(&self.control_password),
            accounts,
        );
        write_private(&accounts_file, file.to_string().as_bytes())?;
        let conf = mosquitto_conf(config, &self.plugin, &accounts_file, &self.pid_file());
        write_private(&self.conf_file(), conf.as_bytes())
    }
}

/// Connects to the private mosquitto on `port` as the ingest does and subscribes to
/// the telemetry filter; then disconnects, keeping the session. Retries the
/// connection until mosquitto listens (the caller bounds it in time).
async fn subscribe_ingest(port: u16, password: &str, child: &mut Child) -> Result<(), String> {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "mosquitto exited at start ({status}); its reasons are in the server's log"
            ));
        }
        let mut o = v5::MqttOptions::new(INGEST_USER, Ipv4Addr::LOCALHOST.to_string(), port);
        o.set_clean_start(false)
            .set_session_expiry_interval(Some(u32::MAX))
            .set_credentials(INGEST_USER, password)
            .set_keep_alive(Duration::from_secs(15));
        let (client, mut el) = v5::AsyncClient::new(o, 8);
        let mut connected = false;
        loop {
            match el.poll().await {
                Ok(v5::Event::Incoming(Packet5::ConnAck(_))) => {
                    connected = true;
                    client
                        .try_subscribe(
                            sless_core::device::TELEMETRY_FILTER,
                            v5::mqttbytes::QoS::AtLeastOnce,
                        )
                        .map_err(|e| e.to_string())?;
                }
                Ok(v5::Event::Incoming(Packet5::SubAck(ack))) => {
                    if !ack
                        .return_codes
                        .iter()
                        .all(|c| matches!(c, SubscribeReasonCode::Success(_)))
                    {
                        return Err(format!("the subscription was refused: {ack:?}"));
                    }
                    client.try_disconnect().map_err(|e| e.to_string())?;
                }
                Ok(v5::Event::Outgoing(rumqttc::Outgoing::Disconnect)) => return Ok(()),
                Ok(_) => {}
                Err(e) if connected => return Err(e.to_string()),
                Err(v5::ConnectionError::ConnectionRefused(code)) => {
                    return Err(format!("the broker refused the ingest: {code:?}"));
                }
                // Not listening yet.
                Err(_) => break,
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The broker's configuration file.
fn mosquitto_conf(config: &BrokerConfig, plugin: &Path, accounts: &Path, pid: &Path) -> String {
    let mut conf = String::new();
    let mut line = |s: String| {
        conf.push_str(&s);
        conf.push('\n');
    };
    line("# Written by sless at every start of the broker; edits are lost.".into());
    line("per_listener_settings false".into());
    line("allow_anonymous false".into());
    line(format!("plugin {}", plugin.display()));
    line(format!("plugin_opt_config_file {}", accounts.display()));
    line(format!("pid_file {}", pid.display()));
    line("persistence true".into());
    line(format!("persistence_location {}/", config.dir.display()));
    // Queued messages of offline sessions (sless's ingest while sless restarts) are
    // written out every second, so a crash of the broker loses at most that much.
    line("autosave_interval 1".into());
    // No limit on what an offline session keeps (the default, 1000, drops the rest),
    // nor on QoS 1 messages in flight to a 3.1.1 client (MQTT 5 clients say their own).
    line("max_queued_messages 0".into());
    line("max_inflight_messages 0".into());
    line(format!("max_packet_size {}", config.max_packet_bytes));
    // Started by root, mosquitto would switch to its own user, which cannot reach
    // files under the server's private data directory.
    if nix::unistd::Uid::effective().is_root() {
        line("user root".into());
    }
    line("log_dest stderr".into());
    line("log_timestamp false".into());
    for t in ["error", "warning", "notice", "information", "debug"] {
        line(format!("log_type {t}"));
    }
    line(format!(
        "listener {} {}",
        config.listen.port(),
        config.listen.ip()
    ));
    if let Some(ws) = config.ws_listen {
        line(format!("listener {} {}", ws.port(), ws.ip()));
        line("protocol websockets".into());
    }
    conf
}

/// Reads mosquitto's log: presence, and refusals and errors to the server's log.
async fn watch_log(stderr: tokio::process::ChildStderr, presence: Arc<std::sync::Mutex<Presence>>) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let refusal = presence
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .line(&line);
        match refusal {
            Some(Refusal::Publish { username, topic }) => {
                tracing::warn!(%username, %topic, "mqtt: publish denied by the ACL (dropped)");
            }
            Some(Refusal::Subscribe { username, filter }) => {
                tracing::warn!(%username, %filter, "mqtt: subscription denied by the ACL");
            }
            Some(Refusal::Login) => {
                tracing::warn!("mqtt: a client was refused: bad username or password, or disabled");
            }
            None if line.starts_with("Error") || line.starts_with("Warning") => {
                if !line.contains("should not be run as root") {
                    tracing::warn!(broker = %line, "mqtt");
                }
            }
            None => tracing::trace!(broker = %line, "mqtt"),
        }
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn find_plugin() -> Result<PathBuf, BrokerError> {
    PLUGIN_DIRS
        .iter()
        .map(|d| Path::new(d).join(PLUGIN_FILE))
        .find(|p| p.exists())
        .ok_or_else(|| {
            BrokerError::Setup(format!(
                "--mqtt-listen needs mosquitto 2.0 with its dynamic-security plugin ({PLUGIN_FILE}); \
                 install Debian's package `mosquitto`"
            ))
        })
}

fn check_executable(program: &Path) -> Result<(), BrokerError> {
    let found = if program.components().count() > 1 {
        program.exists()
    } else {
        std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).exists()))
            || Path::new("/usr/sbin").join(program).exists()
    };
    if found {
        Ok(())
    } else {
        Err(BrokerError::Setup(format!(
            "--mqtt-listen needs the mosquitto broker ({} not found); install Debian's package `mosquitto`",
            program.display()
        )))
    }
}

/// The mosquitto executable: on PATH, else Debian's `/usr/sbin/mosquitto`.
pub fn default_mosquitto() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join("mosquitto").exists()));
    if on_path {
        PathBuf::from("mosquitto")
    } else {
        PathBuf::from("/usr/sbin/mosquitto")
    }
}

fn terminate(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
}

/// A mosquitto a killed server left running with this directory's config holds the
/// port: stop it.
async fn stop_leftover(pid_file: &Path) {
    let Some(pid) = std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    else {
        return;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let ours = pid_file
        .parent()
        .map(|d| d.join("mosquitto.conf"))
        .is_some_and(|conf| {
            let conf = conf.to_string_lossy().into_owned();
            String::from_utf8_lossy(&cmdline).contains(&conf)
        });
    if !ours {
        return;
    }
    tracing::warn!(
        pid,
        "mqtt: stopping a broker an earlier server left running"
    );
    terminate(pid);
    for _ in 0..100 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    struct OneDevice;

    #[async_trait]
    impl Accounts for OneDevice {
        async fn accounts(&self) -> Result<Vec<DeviceAccount>, String> {
            Ok(vec![DeviceAccount {
                namespace: "default".into(),
                name: "t1".into(),
                password: PasswordHash::new("device-password"),
                enabled: true,
            }])
        }
    }

    /// Runs `poll` until it gives something (bounded).
    async fn until<T>(what: &str, mut poll: impl AsyncFnMut() -> Option<T>) -> T {
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if let Some(t) = poll().await {
                    return t;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}: not in time"))
    }

    /// A broker that crashes before it ever saved (autosave is every second) comes
    /// back with the ingest's session: a device publishing before the ingest
    /// reconnected is not acknowledged into the void.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_ingests_session_is_saved_before_any_device_can_publish() {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let shutdown = CancellationToken::new();
        let broker = Broker::start(
            BrokerConfig {
                listen: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                ws_listen: None,
                dir: dir.path().join("mqtt"),
                mosquitto: default_mosquitto(),
                max_packet_bytes: 1 << 20,
            },
            Arc::new(OneDevice),
            shutdown.clone(),
        )
        .await
        .expect("the broker starts");
        assert!(dir.path().join("mqtt").join(DB_FILE).exists());
        let mut starts = broker.starts();
        let first = *starts.borrow_and_update();
        let pid = broker.pid.lock().expect("pid").expect("running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill -9");
        tokio::time::timeout(Duration::from_secs(20), starts.wait_for(|n| *n > first))
            .await
            .expect("started again in time")
            .expect("supervisor running");

        // The device publishes while no ingest is connected.
        let mut o = rumqttc::MqttOptions::new("t1", "127.0.0.1", port);
        o.set_credentials("default_t1", "device-password");
        let (device, mut el) = rumqttc::AsyncClient::new(o, 8);
        device
            .publish(
                "default/telemetry/t1",
                rumqttc::QoS::AtLeastOnce,
                false,
                b"kept".to_vec(),
            )
            .await
            .expect("queued");
        until("the PUBACK", async || match el.poll().await {
            Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) => Some(()),
            Ok(_) => None,
            Err(e) => panic!("device: {e}"),
        })
        .await;

        // The ingest resumes its session and gets it.
        let mut o = v5::MqttOptions::new(INGEST_USER, "127.0.0.1", port);
        o.set_clean_start(false)
            .set_session_expiry_interval(Some(u32::MAX))
            .set_credentials(INGEST_USER, broker.ingest_password.clone());
        let (_ingest, mut el) = v5::AsyncClient::new(o, 8);
        let payload = until("the message at the ingest", async || {
            match el.poll().await {
                Ok(v5::Event::Incoming(Packet5::Publish(p))) => Some(p.payload),
                Ok(_) => None,
                Err(e) => panic!("ingest: {e}"),
            }
        })
        .await;
        assert_eq!(&payload[..], b"kept");
        shutdown.cancel();
        broker.stopped().await;
    }

    #[test]
    fn the_config_denies_anonymous_clients_and_loads_the_plugin() {
        let config = BrokerConfig {
            listen: "127.0.0.1:1883".parse().unwrap(),
            ws_listen: Some("127.0.0.1:8083".parse().unwrap()),
            dir: "/data/mqtt".into(),
            mosquitto: "mosquitto".into(),
            max_packet_bytes: 1 << 20,
        };
        let conf = mosquitto_conf(
            &config,
            Path::new("/usr/lib/x/mosquitto_dynamic_security.so"),
            Path::new("/data/mqtt/dynamic-security.json"),
            Path::new("/data/mqtt/mosquitto.pid"),
        );
        for line in [
            "allow_anonymous false",
            "plugin /usr/lib/x/mosquitto_dynamic_security.so",
            "plugin_opt_config_file /data/mqtt/dynamic-security.json",
            "listener 1883 127.0.0.1",
            "listener 8083 127.0.0.1\nprotocol websockets",
            "max_queued_messages 0",
            "log_dest stderr",
        ] {
            assert!(conf.contains(line), "{line} not in\n{conf}");
        }
    }
}
