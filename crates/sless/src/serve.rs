//! `sless serve`: wires the store, code store, builder, sandbox, executor,
//! controller, API and gateway into one process, and shuts them down in order.
//!
//! Two steps, so tests can use either: [`Server::build`] makes every part from a
//! [`ServeArgs`] and exposes the HTTP surface as a service ([`Server::app`]);
//! [`Server::run`] serves a listener the caller bound until the caller's shutdown
//! future completes. [`main`] is `sless serve`: bind, build, print the start line
//! with the bound address, run until SIGINT/SIGTERM.
//!
//! Configuration: defaults < environment (`SLESS_*`) < flags.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sless_api::{AppState, Tokens};
use sless_blob::{ArchiveLimits, BlobLocation, BlobStore, LocalBlobStore, S3BlobStore, S3Config};
use sless_build::{BuildConfig, Builder};
use sless_controller::Controller;
use sless_controller::gc::{Collector, StorageConfig};
use sless_controller::jobs::Jobs;
use sless_controller::triggers::Triggers;
use sless_core::Quota;
use sless_executor::{Executor, ExecutorConfig};
use sless_invoke::{HttpRoutes, Invoker};
use sless_logs::LogStore;
use sless_records::{RecordSink, Recorder, RecorderConfig, Retention};
use sless_sandbox::{Sandbox, SandboxConfig};
use sless_store::{InvocationStore, JobStore, SqlStore, Store, TriggerStore};
use tokio_util::sync::CancellationToken;

const PYTHON_SHIM: &str = include_str!("../../../runtimes/python/sless_runtime.py");
const NODE_SHIM: &str = include_str!("../../../runtimes/node/sless_runtime.js");
const GO_SHIM: &str = include_str!("../../../runtimes/go/sless_main.go");
const MIB: u64 = 1024 * 1024;

/// Run the server: the REST API under /v1, functions under /fn.
///
/// Every flag can also be set in the environment (`SLESS_*`) or, under its long
/// name, in the `--config` file (see crate::config).
#[derive(clap::Args, Debug, Clone, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ServeArgs {
    /// A TOML file of settings: keys are these flags' long names (`max-body-mb = 8`);
    /// the environment and flags override it.
    #[arg(long, env = "SLESS_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (defaults, file, environment and flags
    /// resolved; secrets redacted) as TOML and exit.
    #[arg(long)]
    #[serde(skip)]
    pub print_config: bool,
    /// How the server's own log lines are written to stderr: `text` or `json` (one
    /// object a line).
    #[arg(long, env = "SLESS_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Address to listen on.
    #[arg(long, env = "SLESS_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Where metadata, code, builds and logs live [default: $XDG_DATA_HOME/sless or ~/.local/share/sless].
    #[arg(long, env = "SLESS_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Where metadata, invocation records, telemetry and queued calls are kept:
    /// `postgres://user:password@host:5432/db` for PostgreSQL, or `sqlite://PATH`.
    /// Without it, the SQLite file `<data-dir>/sless.db`.
    #[arg(long, env = "SLESS_DATABASE_URL", value_name = "URL")]
    pub database_url: Option<String>,
    /// Base URL that function URLs are reported with [default: http://<listen>].
    #[arg(long, env = "SLESS_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Python interpreter functions run with.
    #[arg(long, env = "SLESS_PYTHON", default_value = "/usr/bin/python3")]
    pub python: PathBuf,
    /// Node.js binary functions run with.
    #[arg(long, env = "SLESS_NODE", default_value = "/usr/bin/node")]
    pub node: PathBuf,
    /// npm binary used to install Node dependencies.
    #[arg(long, env = "SLESS_NPM", default_value = "/usr/bin/npm")]
    pub npm: PathBuf,
    /// Go toolchain Go functions are built with.
    #[arg(long, env = "SLESS_GO", default_value = "/usr/bin/go")]
    pub go: PathBuf,
    /// Go build cache shared by every Go build [default: <data-dir>/go-cache].
    #[arg(long, env = "SLESS_GO_CACHE", value_name = "DIR")]
    pub go_cache: Option<PathBuf>,
    /// Largest request body a function accepts, in MiB.
    #[arg(long, env = "SLESS_MAX_BODY_MB", default_value_t = 6)]
    pub max_body_mb: u64,
    /// Largest code archive accepted, in MiB (compressed).
    #[arg(long, env = "SLESS_MAX_ARCHIVE_MB", default_value_t = 64)]
    pub max_archive_mb: u64,
    /// Largest code archive accepted, in MiB (unpacked).
    #[arg(long, env = "SLESS_MAX_UNPACKED_MB", default_value_t = 512)]
    pub max_unpacked_mb: u64,
    /// Most a dependency install (pip, npm) may write, in MiB; past it the build fails.
    #[arg(long, env = "SLESS_MAX_DEPS_MB", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_deps_mb: u64,
    /// Builds that may run at once.
    #[arg(long, env = "SLESS_BUILDS", default_value_t = 2)]
    pub builds: usize,
    /// Longest a build may take, in seconds.
    #[arg(long, env = "SLESS_BUILD_TIMEOUT_SEC", default_value_t = 600)]
    pub build_timeout_sec: u64,
    /// Longest an instance may take to start and answer its readiness check, in seconds.
    #[arg(long, env = "SLESS_START_TIMEOUT_SEC", default_value_t = 30)]
    pub start_timeout_sec: u64,
    /// Longest a request waits for an instance with room before 503, in seconds.
    #[arg(long, env = "SLESS_QUEUE_TIMEOUT_SEC", default_value_t = 30)]
    pub queue_timeout_sec: u64,
    /// Requests that may wait per function before 503.
    #[arg(long, env = "SLESS_MAX_QUEUE", default_value_t = 1000)]
    pub max_queue: usize,
    /// On SIGTERM, how long in-flight requests may take to finish, in seconds.
    #[arg(long, env = "SLESS_SHUTDOWN_GRACE_SEC", default_value_t = 30)]
    pub shutdown_grace_sec: u64,
    /// Log budget per function, in KiB (older lines are dropped).
    #[arg(long, env = "SLESS_LOG_BUDGET_KB", default_value_t = 4096)]
    pub log_budget_kb: u64,
    /// Generic instances kept pre-started per runtime, so cold starts skip the
    /// sandbox and interpreter start-up (0 turns this off).
    #[arg(long, env = "SLESS_PREWARM", default_value_t = 2)]
    pub prewarm: usize,
    /// An instance idle this long (milliseconds) is frozen until its next request, so
    /// work a handler leaves running gets no CPU (0: never freeze).
    #[arg(long, env = "SLESS_FREEZE_IDLE_MS", default_value_t = 1000)]
    pub freeze_idle_ms: u64,
    /// While an instance has requests in flight and has answered none for this long
    /// (milliseconds), its serving loop is checked once per period; three unanswered
    /// checks in a row and it is replaced (0: never check).
    #[arg(long, env = "SLESS_LIVENESS_PERIOD_MS", default_value_t = sless_executor::LIVENESS_PERIOD.as_millis() as u64)]
    pub liveness_period_ms: u64,
    /// Unprivileged uid (and gid) that functions and builds run as.
    #[arg(long, env = "SLESS_SANDBOX_UID", default_value_t = 65534)]
    pub sandbox_uid: u32,
    /// Invocation records older than this many hours are deleted (0 keeps them regardless of age).
    #[arg(long, env = "SLESS_INVOCATION_RETENTION_HOURS", default_value_t = 168)]
    pub invocation_retention_hours: u64,
    /// Each namespace keeps at most this many invocation records, the newest (0: no bound).
    #[arg(
        long,
        env = "SLESS_INVOCATION_RETENTION_COUNT",
        default_value_t = 100_000
    )]
    pub invocation_retention_count: u64,
    /// Do not record invocations (records already stored stay listable until retention removes them).
    /// (The variable takes true/false, 1/0, yes/no, on/off.)
    #[arg(
        long,
        env = "SLESS_NO_INVOCATION_RECORDS",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_invocation_records: bool,
    // The audit log's retention.
    /// Audit log entries older than this many hours are deleted (0 keeps them regardless of age).
    #[arg(long, env = "SLESS_AUDIT_RETENTION_HOURS", default_value_t = 2160)]
    pub audit_retention_hours: u64,
    /// The audit log keeps at most this many entries, the newest (0: no bound).
    #[arg(long, env = "SLESS_AUDIT_RETENTION_COUNT", default_value_t = 1_000_000)]
    pub audit_retention_count: u64,
    /// A namespace deleted with ?force=true stays in the trash (restorable with
    /// POST /v1/namespaces/{ns}/restore) this many hours, then is deleted for good
    /// (0 keeps it forever).
    #[arg(long, env = "SLESS_TRASH_RETENTION_HOURS", default_value_t = 72)]
    pub trash_retention_hours: u64,
    /// Connections open at once [default: half the open-file limit, at most 65536].
    /// At the limit a new connection takes the place of the oldest idle one.
    #[arg(long, env = "SLESS_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// A connection idle between requests, or still sending a request's headers,
    /// for this many seconds is closed.
    #[arg(long, env = "SLESS_HEADER_TIMEOUT_SEC", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_sec: u64,
    /// A request body that sends nothing for this many seconds is refused with 408.
    #[arg(long, env = "SLESS_BODY_TIMEOUT_SEC", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_sec: u64,
    /// Free space the data directory must keep, in MiB: below it `/readyz` answers
    /// 503 and API writes 507.
    #[arg(long, env = "SLESS_MIN_FREE_MB", default_value_t = 64)]
    pub min_free_mb: u64,
    /// The most code storage one namespace may use, in MiB: each stored archive its
    /// functions and jobs name, compressed plus unpacked. 0 turns the quota off.
    #[arg(long, env = "SLESS_NAMESPACE_STORAGE_MB", default_value_t = 2048)]
    pub namespace_storage_mb: u64,
    /// Seconds between collections of unused code archives, builds and dependencies
    /// (a collection also runs at start and shortly after deletes and uploads).
    #[arg(long, env = "SLESS_GC_INTERVAL_SEC", default_value_t = 900)]
    pub gc_interval_sec: u64,
    /// Code storage written or used less than this many seconds ago is never
    /// collected, nor are builds of functions deleted less than this long ago
    /// (their last requests may still be running).
    #[arg(long, env = "SLESS_GC_GRACE_SEC", default_value_t = 60)]
    pub gc_grace_sec: u64,
    /// Let namespace tokens give functions `"network": "host"`, the host's network
    /// unfiltered (otherwise only the admin token may). (true/false, 1/0, yes/no, on/off.)
    #[arg(
        long,
        env = "SLESS_ALLOW_HOST_NETWORK",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub allow_host_network: bool,

    // Devices: sless's own MQTT broker (see the README's "Devices").
    /// Run an MQTT broker for devices on this address (MQTT 3.1.1 and 5 over TCP):
    /// Debian's mosquitto 2.0 with its dynamic-security plugin, supervised by sless,
    /// whose accounts and topic ACL sless keeps. Without it there are no devices.
    #[arg(long, env = "SLESS_MQTT_LISTEN", value_name = "HOST:PORT")]
    pub mqtt_listen: Option<std::net::SocketAddr>,
    /// Also serve MQTT over WebSocket (path `/mqtt`) on this address.
    #[arg(
        long,
        env = "SLESS_MQTT_WS_LISTEN",
        value_name = "HOST:PORT",
        requires = "mqtt_listen"
    )]
    pub mqtt_ws_listen: Option<std::net::SocketAddr>,
    /// The host name devices are told to connect to [default: the --mqtt-listen
    /// address, or this machine's loopback address when it listens on all of them].
    #[arg(long, env = "SLESS_MQTT_PUBLIC_HOST", requires = "mqtt_listen")]
    pub mqtt_public_host: Option<String>,
    /// The mosquitto executable [default: `mosquitto` on PATH, else /usr/sbin/mosquitto].
    #[arg(long, env = "SLESS_MOSQUITTO")]
    pub mosquitto: Option<PathBuf>,
    /// The largest MQTT message a device may send, in KiB.
    #[arg(long, env = "SLESS_MQTT_MAX_MESSAGE_KB", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=262_144))]
    pub mqtt_max_message_kb: u32,
    /// Telemetry older than this many hours is deleted (0 keeps it regardless of age).
    #[arg(long, env = "SLESS_TELEMETRY_RETENTION_HOURS", default_value_t = 168)]
    pub telemetry_retention_hours: u64,
    /// Each device keeps at most this many telemetry messages, the newest (0: no bound).
    #[arg(
        long,
        env = "SLESS_TELEMETRY_RETENTION_COUNT",
        default_value_t = 100_000
    )]
    pub telemetry_retention_count: u64,

    // JWT sign-in (see the README's "Signing in with a JWT").
    /// A file holding the HS256 shared secret JWTs may be signed with (at least 32
    /// bytes; a trailing newline is not part of it).
    #[arg(long, env = "SLESS_JWT_HS256_SECRET_FILE")]
    pub jwt_hs256_secret_file: Option<PathBuf>,
    /// A JWKS file whose RS256, ES256 and EdDSA keys verify JWTs, picked by `kid`.
    #[arg(long, env = "SLESS_JWT_JWKS_FILE")]
    pub jwt_jwks_file: Option<PathBuf>,
    /// A URL serving a JWKS whose keys verify JWTs: fetched at start, refetched when
    /// a token names an unknown `kid`.
    #[arg(long, env = "SLESS_JWT_JWKS_URL")]
    pub jwt_jwks_url: Option<String>,
    /// The least number of seconds between two fetches of the JWKS URL.
    #[arg(long, env = "SLESS_JWT_JWKS_MIN_REFETCH_SEC", default_value_t = 60)]
    pub jwt_jwks_min_refetch_sec: u64,
    /// The issuer (`iss`) JWTs must name.
    #[arg(long, env = "SLESS_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// The audience (`aud`) JWTs must name.
    #[arg(long, env = "SLESS_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// The claim whose value names a JWT's namespace.
    #[arg(long, env = "SLESS_JWT_NAMESPACE_CLAIM", default_value = "sub")]
    pub jwt_namespace_claim: String,
    // --- TLS on the listener ---
    /// Serve over TLS with this PEM certificate chain (the server's certificate
    /// first); needs --tls-key. Re-read, with the key, on SIGHUP.
    #[arg(long, env = "SLESS_TLS_CERT", value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key (PKCS#8, RSA or EC) of --tls-cert's certificate.
    #[arg(long, env = "SLESS_TLS_KEY", value_name = "PATH")]
    pub tls_key: Option<PathBuf>,
    // Quotas: the server-wide defaults of every namespace without its own
    // (`--namespace-storage-mb` above is the default storage quota).
    /// Default quota: functions per namespace.
    #[arg(long, env = "SLESS_QUOTA_FUNCTIONS", default_value_t = Quota::default().functions)]
    pub quota_functions: u64,
    /// Default quota: instances running at once per namespace (all its functions).
    #[arg(long, env = "SLESS_QUOTA_INSTANCES", default_value_t = Quota::default().instances)]
    pub quota_instances: u64,
    /// Default quota: MiB of instance memory (each instance's `memory_mb`) per namespace.
    #[arg(long, env = "SLESS_QUOTA_MEMORY_MB", default_value_t = Quota::default().memory_mb)]
    pub quota_memory_mb: u64,
    /// Default quota: invocations per second per namespace (bursts of one second's worth).
    #[arg(long, env = "SLESS_QUOTA_INVOCATIONS_PER_SEC", default_value_t = Quota::default().invocations_per_sec)]
    pub quota_invocations_per_sec: u64,
    /// Default quota: calls queued per namespace.
    #[arg(long, env = "SLESS_QUOTA_QUEUED_CALLS", default_value_t = Quota::default().queued_calls)]
    pub quota_queued_calls: u64,
    /// Default quota: devices per namespace.
    #[arg(long, env = "SLESS_QUOTA_DEVICES", default_value_t = Quota::default().devices)]
    pub quota_devices: u64,
    /// Failed authentications (unknown tokens) one client address may make in a
    /// minute before the API answers it `429` until the minute is over.
    #[arg(long, env = "SLESS_AUTH_FAILURES_PER_MINUTE", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub auth_failures_per_minute: u32,
    // --- Secrets ---
    /// Memory-backed host directory under which the server keeps the files instances
    /// read at /run/secrets/{secret}/{key}: in <DIR>/<server id>-secrets, one
    /// subdirectory per instance, removed when it stops. Default: /dev/shm. The server's key comes from
    /// SLESS_SECRET_KEY (64 hex characters or base64 of 32 bytes) or
    /// <data-dir>/secret.key, generated on first start.
    #[arg(long, env = "SLESS_SECRETS_DIR", value_name = "DIR")]
    pub secrets_dir: Option<PathBuf>,
    // --- Async calls ---
    /// Unfinished async calls one function may have; past it `/async/` answers 429.
    #[arg(long, env = "SLESS_ASYNC_QUEUE_LIMIT", default_value_t = sless_controller::calls::DEFAULT_QUEUE_LIMIT,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub async_queue_limit: u64,
    /// Let async calls' X-Callback-Url name loopback, private and link-local
    /// addresses (and localhost). Turn off where callers must not reach the
    /// server's own network through callbacks. (true/false, 1/0, yes/no, on/off.)
    #[arg(
        long,
        env = "SLESS_ASYNC_CALLBACK_ALLOW_PRIVATE",
        default_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub async_callback_allow_private: bool,
    // --- Metrics ---
    /// Record Prometheus metrics and serve them at GET /metrics (false: nothing is
    /// recorded and /metrics answers 404). (true/false, 1/0, yes/no, on/off.)
    #[arg(
        long,
        env = "SLESS_METRICS",
        default_value = "true",
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub metrics: bool,
    /// A token GET /metrics requires as `Authorization: Bearer <token>` (401
    /// without it); unset, /metrics is open to anyone who reaches the listener.
    #[arg(long, env = "SLESS_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    // --- Code archives ---
    #[command(flatten)]
    #[serde(flatten)]
    pub blobs: BlobFlags,
}

/// `--log-format`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line (time, level, target, message, fields).
    Json,
}

impl ServeArgs {
    /// The server-wide default quotas these flags give.
    pub fn default_quota(&self) -> Quota {
        Quota {
            functions: self.quota_functions,
            instances: self.quota_instances,
            memory_mb: self.quota_memory_mb,
            invocations_per_sec: self.quota_invocations_per_sec,
            queued_calls: self.quota_queued_calls,
            devices: self.quota_devices,
            storage_mb: self.namespace_storage_mb,
        }
    }

    /// The configuration `sless serve` would run with given these flags (and the
    /// `SLESS_*` environment), for starting a server in-process.
    pub fn from_flags<I, T>(flags: I) -> Result<ServeArgs, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            args: ServeArgs,
        }
        let argv = std::iter::once(std::ffi::OsString::from("sless-serve"))
            .chain(flags.into_iter().map(Into::into));
        <Flags as clap::Parser>::try_parse_from(argv).map(|f| f.args)
    }
}

/// `sless serve`: bind, build, then serve until SIGINT or SIGTERM.
pub async fn main(mut args: ServeArgs) -> Result<()> {
    if args.print_config {
        print!("{}", crate::config::render(&args)?);
        return Ok(());
    }
    init_tracing(args.log_format);
    let mut shutdown = Box::pin(shutdown_signal()?);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    // With port 0 the kernel picks one: everything after this (function URLs,
    // the start line) reports the address actually bound.
    let bound = listener
        .local_addr()
        .context("cannot read the bound address")?;
    args.listen = bound;
    // Stored functions come back before traffic is taken: connections wait in
    // the listen backlog meanwhile rather than meeting a 404.
    // Start-up may take a while (up to a minute bringing functions back): a signal
    // meanwhile stops the process instead of waiting for it.
    let server = tokio::select! {
        server = Server::build(args) => server?,
        () = &mut shutdown => {
            tracing::info!("stopped while starting");
            return Ok(());
        }
    };
    // The start line names the bound address (a spawner waits for it to learn the
    // port); with a --public-url elsewhere, the listening address follows.
    let scheme = if server.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let listening = if server.public_url == format!("{scheme}://{bound}") {
        String::new()
    } else {
        format!("listening on {bound}, ")
    };
    eprintln!(
        "sless serving on {} ({listening}data in {}, {} functions)",
        server.public_url,
        server.data_dir.display(),
        server.functions
    );
    server.run(listener, shutdown).await
}

/// A server built from its configuration, every part started and stored functions
/// brought back, but not yet accepting connections: [`Server::app`] answers requests
/// in-process and [`Server::run`] serves them on a listener.
pub struct Server {
    app: sless_gateway::FastPath,
    data_dir: PathBuf,
    public_url: String,
    functions: usize,
    conn_limits: crate::accept::ConnLimits,
    /// The listener's TLS, when `--tls-cert`/`--tls-key` are given.
    tls: Option<Arc<crate::tls::Tls>>,
    grace: Duration,
    shutdown: CancellationToken,
    recorder: Option<Arc<Recorder>>,
    executor: Arc<Executor>,
    triggers: Arc<Triggers>,
    retention: tokio::task::JoinHandle<()>,
    collecting: tokio::task::JoinHandle<()>,
    /// The devices' broker, stopped (and its state saved) before the process exits.
    devices: Option<Arc<sless_controller::devices::Devices>>,
    /// Stops the background work of a server dropped without [`Server::run`] (tests
    /// that only use [`Server::app`]).
    _stop: StopOnDrop,
}

/// Cancels the server's background work (triggers, jobs, collection, retention)
/// when dropped.
struct StopOnDrop {
    shutdown: CancellationToken,
    tasks: [tokio::task::AbortHandle; 6],
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.shutdown.cancel();
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Server {
    /// Builds every part from `args`: store, code store, sandbox, builder, executor,
    /// recorder, triggers, jobs, controller, API and gateway; then brings stored
    /// functions, triggers and unfinished jobs back and collects unused storage.
    ///
    /// `args.listen` is only used for the default public URL: [`main`] binds first
    /// and passes the bound address. Root is not required (the sandbox warns and runs
    /// functions as the current user), but bubblewrap must run.
    pub async fn build(args: ServeArgs) -> Result<Server> {
        build(args).await
    }

    /// The whole HTTP surface (`/v1`, `/fn`, `/t`, `/healthz`, `/readyz`) as one
    /// service, e.g. for `tower::ServiceExt::oneshot`.
    pub fn app(&self) -> sless_gateway::FastPath {
        self.app.clone()
    }

    /// The data directory this server keeps its state in.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The base URL function URLs are reported with.
    pub fn public_url(&self) -> &str {
        &self.public_url
    }

    /// Serves `listener` until `shutdown` completes, then stops in order: no new
    /// connections, in-flight requests finish (up to `--shutdown-grace-sec`),
    /// background work stops, the last invocation records are written, and the
    /// executor stops every instance.
    pub async fn run(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<()> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut server = tokio::spawn(crate::accept::serve(
            listener,
            self.app,
            self.conn_limits,
            self.tls.clone(),
            stop_rx,
        ));
        tokio::select! {
            result = &mut server => {
                result.context("server task failed")?;
                return Ok(());
            }
            () = shutdown => {}
        }
        tracing::info!(
            "shutting down: finishing in-flight requests (up to {} s)",
            self.grace.as_secs()
        );
        let _ = stop_tx.send(true);
        self.shutdown.cancel();
        // Queue deliveries stop now, unacknowledged: they are delivered again after
        // the restart instead of failing against an executor that is stopping.
        self.triggers.stop();
        if tokio::time::timeout(self.grace, &mut server).await.is_err() {
            tracing::warn!("in-flight requests did not finish within the grace period");
            server.abort();
        }
        // The last invocations' records are written before the process goes.
        self.retention.abort();
        self.collecting.abort();
        if let Some(recorder) = &self.recorder
            && tokio::time::timeout(Duration::from_secs(5), recorder.flush())
                .await
                .is_err()
        {
            tracing::warn!("invocation records were still being written at shutdown");
        }
        if let Some(devices) = &self.devices
            && tokio::time::timeout(Duration::from_secs(10), devices.broker().stopped())
                .await
                .is_err()
        {
            tracing::warn!("the MQTT broker did not stop in time");
        }
        self.executor.shutdown(Duration::from_secs(5)).await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// See [`Server::build`].
async fn build(args: ServeArgs) -> Result<Server> {
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(crate::cli::default_data_dir);
    // TLS is checked first: a bad certificate or key stops the start at once.
    let tls = match crate::tls::TlsFiles::from_flags(args.tls_cert.clone(), args.tls_key.clone())? {
        Some(files) => Some(Arc::new(crate::tls::Tls::load(files)?)),
        None => None,
    };
    for (what, path) in [("python", &args.python), ("node", &args.node)] {
        if !path.is_file() {
            bail!(
                "{what} not found at {} (set --{what} or SLESS_{})",
                path.display(),
                what.to_uppercase()
            );
        }
    }
    create_private_dir(&data_dir)?;
    let admin_token = admin_token(&data_dir)?;
    // Before anything records: the invoke path keeps the handles it is given now.
    let metrics = sless_api::MetricsEndpoint {
        exporter: if args.metrics {
            Some(sless_metrics::install().context("cannot start recording metrics")?)
        } else {
            None
        },
        token: args.metrics_token.clone().filter(|t| !t.trim().is_empty()),
    };
    // Before anything starts: a key that is malformed or unsafe stops the server.
    let cipher = Arc::new(
        sless_secrets::Cipher::load(std::env::var("SLESS_SECRET_KEY").ok().as_deref(), &data_dir)
            .context("cannot load the secret key")?,
    );
    // A directory of this server's own inside the one given: it is emptied at start.
    let secrets_dir = args
        .secrets_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/dev/shm"))
        .join(format!("{}-secrets", cgroup_name(&data_dir)));

    // The SQLite file the store keeps (watched for being removed while serving).
    let db_file = match &args.database_url {
        None => Some(data_dir.join("sless.db")),
        Some(url) => sless_store::sqlite_file(url).map(PathBuf::from),
    };
    let sqlite = Arc::new(match &args.database_url {
        Some(url) => SqlStore::from_url(url).await.with_context(|| {
            format!(
                "cannot open the metadata store at {}",
                crate::config::redact_url(url)
            )
        })?,
        None => SqlStore::open(&data_dir.join("sless.db"))
            .await
            .with_context(|| format!("cannot open the metadata store in {}", data_dir.display()))?,
    });
    let invocations: Arc<dyn InvocationStore> = sqlite.clone();
    let record_sink: Arc<dyn RecordSink> = sqlite.clone();
    let trigger_store: Arc<dyn TriggerStore> = sqlite.clone();
    let job_store: Arc<dyn JobStore> = sqlite.clone();
    let secret_store: Arc<dyn sless_store::SecretStore> = sqlite.clone();
    let storage_store: Arc<dyn sless_store::StorageStore> = sqlite.clone();
    let token_store: Arc<dyn sless_store::TokenStore> = sqlite.clone();
    let audit_store: Arc<dyn sless_store::AuditStore> = sqlite.clone();
    let quota_store: Arc<dyn sless_store::QuotaStore> = sqlite.clone();
    let call_store: Arc<dyn sless_store::CallStore> = sqlite.clone();
    let dead_letter_store: Arc<dyn sless_store::DeadLetterStore> = sqlite.clone();
    let device_store: Arc<dyn sless_store::DeviceStore> = sqlite.clone();
    let trash_store: Arc<dyn sless_store::TrashStore> = sqlite.clone();
    let backup_store = sqlite.clone();
    let store: Arc<dyn Store> = sqlite;
    // The one writer of dead letters, for async calls and queue triggers alike.
    let dead_letters = sless_controller::dead_letters::DeadLetters::new(dead_letter_store.clone());
    store.ensure_namespace("default").await?;
    let blobs = open_blob_store(&args, &data_dir).await?;
    let runtime_dir = write_shims(&data_dir.join("runtime"))?;

    let sandbox = Arc::new(
        Sandbox::new(SandboxConfig {
            uid: args.sandbox_uid,
            gid: args.sandbox_uid,
            cgroup_name: cgroup_name(&data_dir),
            ..SandboxConfig::default()
        })
        .context("cannot set up the sandbox")?,
    );
    let reaped = sandbox.reap_stale();
    if reaped > 0 {
        tracing::warn!(
            processes = reaped,
            "stopped instances left over by an earlier server"
        );
    }
    let logs = Arc::new(LogStore::new(
        data_dir.join("logs"),
        args.log_budget_kb * 1024,
    )?);
    let limits = ArchiveLimits {
        max_compressed: args.max_archive_mb * MIB,
        max_unpacked: args.max_unpacked_mb * MIB,
        ..ArchiveLimits::default()
    };
    let builder = Arc::new(
        Builder::new(
            BuildConfig {
                builds_dir: data_dir.join("builds"),
                deps_dir: data_dir.join("deps"),
                runtime_dir: runtime_dir.clone(),
                python: args.python.clone(),
                node: args.node.clone(),
                npm: args.npm.clone(),
                go: args.go.clone(),
                // Shared by every Go build, so a code-only change compiles in about a second.
                go_cache: args
                    .go_cache
                    .clone()
                    .unwrap_or_else(|| data_dir.join("go-cache")),
                max_parallel: args.builds.max(1),
                timeout: Duration::from_secs(args.build_timeout_sec),
                limits,
                memory_mb: 1024,
                max_deps_bytes: args.max_deps_mb * MIB,
                // Every revision is proven by starting an instance of it (see the executor).
                check_entrypoint: false,
            },
            sandbox.clone(),
        )
        .context("cannot set up the builder")?,
    );
    let executor = Executor::new(
        ExecutorConfig {
            runtime_dir,
            run_dir: data_dir.join("run"),
            python: args.python.clone(),
            node: args.node.clone(),
            start_timeout: Duration::from_secs(args.start_timeout_sec),
            queue_timeout: Duration::from_secs(args.queue_timeout_sec),
            max_queue: args.max_queue,
            max_pids: 256,
            prewarm_per_runtime: args.prewarm,
            freeze_after: (args.freeze_idle_ms > 0)
                .then(|| Duration::from_millis(args.freeze_idle_ms)),
            liveness_period: (args.liveness_period_ms > 0)
                .then(|| Duration::from_millis(args.liveness_period_ms)),
            secrets_dir: Some(secrets_dir),
        },
        sandbox.clone(),
        logs.clone(),
    )?;
    let public_url = args.public_url.clone().unwrap_or_else(|| {
        let scheme = if tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", args.listen)
    });
    let controller = Controller::new(
        store.clone(),
        blobs.clone(),
        builder.clone(),
        executor.clone(),
        logs.clone(),
        public_url.clone(),
    );
    let mut tokens = Tokens::with_limiter(
        &admin_token,
        store.clone(),
        sless_api::AuthLimiter::new(
            args.auth_failures_per_minute,
            std::time::Duration::from_secs(60),
            10_000,
        ),
    )
    .with_token_store(token_store.clone());
    // An admin token set by SLESS_ADMIN_TOKEN cannot be rotated by the server.
    if !admin_token_from_env() {
        tokens = tokens.with_admin_file(data_dir.join("admin-token"));
    }
    if let Some(jwt) = jwt_verifier(&args).await? {
        tokens = tokens.with_jwt(Arc::new(jwt));
    }
    let tokens = Arc::new(tokens);
    let audit_retention = {
        let audit_store = audit_store.clone();
        sless_records::spawn_pruning(
            "audit log entries",
            Retention {
                max_age: Duration::from_secs(args.audit_retention_hours.saturating_mul(3600)),
                max_count: args.audit_retention_count,
                ..Retention::default()
            },
            move |max_age, max_count| {
                let audit_store = audit_store.clone();
                Box::pin(async move {
                    audit_store
                        .prune_audit(max_age, max_count)
                        .await
                        .map_err(sless_records::SinkError::new)
                })
            },
        )
    };
    // Finished async calls are kept as long as invocation records.
    let call_retention = {
        let call_store = call_store.clone();
        sless_records::spawn_pruning(
            "async calls",
            Retention {
                max_age: Duration::from_secs(args.invocation_retention_hours.saturating_mul(3600)),
                max_count: args.invocation_retention_count,
                ..Retention::default()
            },
            move |max_age, max_count| {
                let call_store = call_store.clone();
                Box::pin(async move {
                    call_store
                        .prune_calls(max_age, max_count)
                        .await
                        .map_err(sless_records::SinkError::new)
                })
            },
        )
    };
    let recorder = (!args.no_invocation_records)
        .then(|| Recorder::start(record_sink.clone(), RecorderConfig::default()));
    // Retention runs even with recording off, so earlier records still age out.
    let retention = sless_records::spawn_retention(
        record_sink,
        Retention {
            max_age: Duration::from_secs(args.invocation_retention_hours.saturating_mul(3600)),
            max_count: args.invocation_retention_count,
            ..Retention::default()
        },
    );

    // The gateway, triggers and jobs invoke functions through one pipeline, which
    // records every invocation alike.
    let invoker = Arc::new(Invoker::new(
        executor.clone(),
        recorder.clone(),
        controller.failed_functions(),
    ));
    let shutdown = CancellationToken::new();
    // From here on SIGHUP re-reads the TLS pair (instead of ending a starting
    // server); the task ends with the server's background work.
    if let Some(tls) = &tls {
        tls.reload_on_sighup(shutdown.clone())?;
    }
    let routes = Arc::new(HttpRoutes::default());
    let triggers = Triggers::start(
        invoker.clone(),
        trigger_store.clone(),
        routes.clone(),
        shutdown.clone(),
    );
    let collector = Collector::new(
        StorageConfig {
            interval: Duration::from_secs(args.gc_interval_sec.max(1)),
            grace: Duration::from_secs(args.gc_grace_sec),
            namespace_quota: args.namespace_storage_mb.saturating_mul(MIB),
        },
        store.clone(),
        storage_store.clone(),
        job_store.clone(),
        blobs.clone(),
        builder.clone(),
        executor.clone(),
        controller.clone(),
    );
    // Namespaces in the trash past their retention go for good, and their code with
    // them at the next collection.
    let trash_retention = {
        let trash_store = trash_store.clone();
        let collector = collector.clone();
        sless_records::spawn_pruning(
            "the namespace trash",
            Retention {
                max_age: Duration::from_secs(args.trash_retention_hours.saturating_mul(3600)),
                max_count: 0,
                ..Retention::default()
            },
            move |max_age, _| {
                let trash_store = trash_store.clone();
                let collector = collector.clone();
                Box::pin(async move {
                    let purged = trash_store
                        .purge_trash(sless_store::trash::purge_cutoff(max_age))
                        .await
                        .map_err(sless_records::SinkError::new)?;
                    if purged > 0 {
                        tracing::info!(
                            namespaces = purged,
                            "deleted namespaces past the trash's retention for good"
                        );
                        collector.nudge();
                    }
                    Ok(purged)
                })
            },
        )
    };
    let jobs = Jobs::new(
        job_store.clone(),
        blobs.clone(),
        builder,
        executor.clone(),
        logs.clone(),
        invoker.clone(),
    );

    let quotas = sless_api::quotas::Quotas::load(
        args.default_quota(),
        quota_store,
        storage_store.clone(),
        executor.clone(),
    )
    .await
    .context("cannot read the namespaces' quotas")?;
    let resolver = Arc::new(sless_controller::secrets::SecretResolver::new(
        secret_store.clone(),
        cipher.clone(),
    ));
    controller.set_secrets(resolver.clone());
    triggers.set_secrets(resolver.clone());
    triggers.set_dead_letters(dead_letters.clone());
    jobs.set_secrets(resolver);

    // Async calls: the queue is read back before traffic is taken, and its
    // unfinished calls are submitted again.
    let calls = sless_controller::calls::Calls::start(
        call_store.clone(),
        store.clone(),
        dead_letters.clone(),
        sless_controller::triggers::invoker_fire(invoker.clone()),
        executor.quotas().clone(),
        sless_controller::calls::CallsConfig {
            queue_limit: args.async_queue_limit,
            allow_private_callbacks: args.async_callback_allow_private,
            ..Default::default()
        },
        shutdown.clone(),
    )
    .await
    .context("cannot read the queue of async calls")?;
    quotas.count_queued_calls(calls.clone());
    let redrive = Arc::new(sless_controller::dead_letters::Redrive::new(
        dead_letters,
        calls.clone(),
        triggers.clone(),
    ));

    // Devices: the broker and the ingest, when the server runs a broker.
    let devices = match args.mqtt_listen {
        None => None,
        Some(listen) => Some(
            start_devices(
                &args,
                listen,
                &data_dir,
                device_store.clone(),
                shutdown.clone(),
            )
            .await?,
        ),
    };
    // Device triggers consume the server's own broker, as the ingest does.
    if let Some(d) = &devices {
        triggers.set_device_broker(d.broker().ingest_url());
    }
    let telemetry_retention = {
        let device_store = device_store.clone();
        sless_records::spawn_pruning(
            "telemetry",
            Retention {
                max_age: Duration::from_secs(args.telemetry_retention_hours.saturating_mul(3600)),
                max_count: args.telemetry_retention_count,
                ..Retention::default()
            },
            move |max_age, max_count| {
                let device_store = device_store.clone();
                Box::pin(async move {
                    device_store
                        .prune_telemetry(max_age, max_count)
                        .await
                        .map_err(sless_records::SinkError::new)
                })
            },
        )
    };

    let api = sless_api::router(AppState {
        store: store.clone(),
        blobs,
        controller: controller.clone(),
        collector: collector.clone(),
        executor: executor.clone(),
        logs,
        tokens: tokens.clone(),
        archive_limits: limits,
        body_timeout: Duration::from_secs(args.body_timeout_sec),
        storage: Arc::new(sless_api::Storage::new(
            data_dir.clone(),
            db_file,
            args.min_free_mb * MIB,
        )),
        max_invoke_body: (args.max_body_mb * MIB) as usize,
        invocations,
        recorder: recorder.clone(),
        invoker: invoker.clone(),
        trigger_store: trigger_store.clone(),
        job_store,
        triggers: triggers.clone(),
        jobs: jobs.clone(),
        allow_host_network: args.allow_host_network,
        token_store,
        audit: audit_store,
        quotas,
        secret_store: secret_store.clone(),
        cipher: Some(cipher.clone()),
        calls: calls.clone(),
        call_store,
        dead_letters: dead_letter_store,
        redrive,
        devices: devices.clone(),
        device_store,
        trash: trash_store,
        backup: Some(backup_store),
        metrics,
    });
    let devices_handle = devices;
    let gateway = sless_gateway::Gateway {
        invoker,
        authorizer: tokens,
        max_body: (args.max_body_mb * MIB) as usize,
        body_timeout: Duration::from_secs(args.body_timeout_sec),
        routes,
        async_calls: Some(Arc::new(sless_api::calls::GatewayCalls(calls.clone()))),
    };
    let app =
        sless_gateway::with_fast_path(gateway.clone(), sless_gateway::router(gateway).merge(api));

    let nofile = crate::accept::raise_nofile_limit();
    let conn_limits = crate::accept::ConnLimits::from_nofile(
        nofile,
        args.max_connections,
        Duration::from_secs(args.header_timeout_sec),
    );
    let functions = controller.resync_all(Duration::from_secs(60)).await?;
    for trigger in trigger_store.list_triggers(None).await? {
        triggers.apply(&trigger);
    }
    calls
        .resume()
        .await
        .context("cannot resume the queued async calls")?;
    let resumed = jobs.resume_all().await?;
    if resumed > 0 {
        tracing::info!(jobs = resumed, "resumed unfinished jobs");
    }
    // Storage left unused while the server was down goes now, then periodically.
    if let Err(e) = collector.collect().await {
        tracing::warn!(error = %e, "storage collection at start failed");
    }
    let collecting = collector.spawn(shutdown.clone());
    Ok(Server {
        app,
        data_dir,
        public_url,
        functions,
        conn_limits,
        tls,
        grace: Duration::from_secs(args.shutdown_grace_sec),
        _stop: StopOnDrop {
            shutdown: shutdown.clone(),
            tasks: [
                retention.abort_handle(),
                collecting.abort_handle(),
                audit_retention.abort_handle(),
                call_retention.abort_handle(),
                telemetry_retention.abort_handle(),
                trash_retention.abort_handle(),
            ],
        },
        shutdown,
        recorder,
        executor,
        triggers,
        retention,
        collecting,
        devices: devices_handle,
    })
}

/// The code archives' store `--blob-url` names (the data directory's `blobs/` without
/// it). A URL that does not parse, or an S3 bucket that does not answer, stops the start.
async fn open_blob_store(args: &ServeArgs, data_dir: &Path) -> Result<Arc<dyn BlobStore>> {
    args.blobs.open(data_dir).await
}

/// Where code archives are kept, as `sless serve` is told (for `sless restore`, which
/// fills the store a server will start with).
#[derive(clap::Args, Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct BlobFlags {
    /// Where code archives are kept: s3://bucket/prefix (an S3 bucket, reached with the
    /// standard AWS variables or the --s3-* flags) or file:///dir [default: <data-dir>/blobs].
    #[arg(long, env = "SLESS_BLOB_URL", value_name = "URL")]
    pub blob_url: Option<String>,
    /// The S3 endpoint, for S3-compatible stores (http:// is allowed) [default: AWS's for the region].
    #[arg(long, env = "AWS_ENDPOINT_URL", value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// The S3 region [default: AWS_DEFAULT_REGION, else us-east-1].
    #[arg(long, env = "AWS_REGION")]
    pub s3_region: Option<String>,
    /// The S3 access key id [default: AWS's credential chain].
    #[arg(long, env = "AWS_ACCESS_KEY_ID", hide_env_values = true)]
    pub s3_access_key_id: Option<String>,
    /// The S3 secret access key; prefer the variable or the config file to the flag,
    /// which other users can read in the process list.
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub s3_secret_access_key: Option<String>,
}

impl BlobFlags {
    /// Opens the store and checks that it answers.
    pub async fn open(&self, data_dir: &Path) -> Result<Arc<dyn BlobStore>> {
        let location = match &self.blob_url {
            None => BlobLocation::Local(data_dir.join("blobs")),
            Some(url) => BlobLocation::parse(url).context("--blob-url (SLESS_BLOB_URL)")?,
        };
        let blobs: Arc<dyn BlobStore> = match &location {
            BlobLocation::Local(dir) => Arc::new(
                LocalBlobStore::new(dir.clone())
                    .with_context(|| format!("cannot open the code store in {}", dir.display()))?,
            ),
            BlobLocation::S3 { bucket, prefix } => Arc::new(
                S3BlobStore::new(S3Config {
                    bucket: bucket.clone(),
                    prefix: prefix.clone(),
                    endpoint: self.s3_endpoint.clone(),
                    region: self.s3_region.clone(),
                    access_key_id: self.s3_access_key_id.clone(),
                    secret_access_key: self.s3_secret_access_key.clone(),
                })
                .with_context(|| format!("--blob-url {location}"))?,
            ),
        };
        tokio::time::timeout(Duration::from_secs(30), blobs.ping())
            .await
            .map_err(|_| anyhow::anyhow!("no answer within 30 s"))
            .and_then(|r| r.map_err(anyhow::Error::from))
            .with_context(|| format!("cannot reach the code store --blob-url {location}"))?;
        Ok(blobs)
    }
}

/// The parent cgroup of this server's instances, unique per data directory, so
/// that several servers on one machine never touch each other's instances while a
/// restarted server still finds (and stops) what its predecessor left behind.
fn cgroup_name(data_dir: &Path) -> String {
    use sha2::Digest;
    let canonical = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let digest = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    format!("sless-{}", &hex::encode(digest)[..12])
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLESS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        // Fields at the top level beside `message`, as log shippers expect.
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Completes at the first SIGTERM or SIGINT; the handlers are installed before it
/// returns, so a signal that comes while the server is still starting is not lost.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Starts the broker for devices on `listen` and the telemetry ingest; a server told
/// to run one does not start without it.
async fn start_devices(
    args: &ServeArgs,
    listen: std::net::SocketAddr,
    data_dir: &Path,
    store: Arc<dyn sless_store::DeviceStore>,
    shutdown: CancellationToken,
) -> Result<Arc<sless_controller::devices::Devices>> {
    let listen = with_free_port(listen).context("--mqtt-listen")?;
    let ws_listen = args
        .mqtt_ws_listen
        .map(with_free_port)
        .transpose()
        .context("--mqtt-ws-listen")?;
    let host = args.mqtt_public_host.clone().unwrap_or_else(|| {
        if listen.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            listen.ip().to_string()
        }
    });
    let ws_url = ws_listen.map(|ws| {
        let ws_host = if args.mqtt_public_host.is_some() || ws.ip().is_unspecified() {
            host.clone()
        } else {
            ws.ip().to_string()
        };
        format!("ws://{ws_host}:{}/mqtt", ws.port())
    });
    let config = sless_mqtt::BrokerConfig {
        listen,
        ws_listen,
        dir: data_dir.join("mqtt"),
        mosquitto: args
            .mosquitto
            .clone()
            .unwrap_or_else(sless_mqtt::default_mosquitto),
        max_packet_bytes: args
            .mqtt_max_message_kb
            .saturating_mul(1024)
            .saturating_add(1024),
    };
    let devices = sless_controller::devices::Devices::start(
        store,
        config,
        sless_controller::devices::Advertised {
            host,
            port: listen.port(),
            ws_url,
        },
        shutdown,
    )
    .await
    .with_context(|| format!("cannot run the MQTT broker on --mqtt-listen {listen}"))?;
    tracing::info!(%listen, ws = ?ws_listen, "devices: MQTT broker and telemetry ingest running");
    Ok(devices)
}

/// `addr`, or with port 0 the address with a port free now (mosquitto takes no port 0).
fn with_free_port(addr: std::net::SocketAddr) -> Result<std::net::SocketAddr> {
    if addr.port() != 0 {
        return Ok(addr);
    }
    let probe = std::net::TcpListener::bind(addr)
        .with_context(|| format!("cannot find a free port on {}", addr.ip()))?;
    Ok(probe.local_addr()?)
}

pub(crate) fn create_private_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create data directory {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot restrict data directory {}", dir.display()))?;
    Ok(())
}

/// Shortest admin token accepted from the environment: a short one is guessable.
const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// Whether the admin token comes from `SLESS_ADMIN_TOKEN` (as [`admin_token`] reads it).
fn admin_token_from_env() -> bool {
    std::env::var("SLESS_ADMIN_TOKEN").is_ok_and(|t| !t.trim().is_empty())
}

/// JWT sign-in as the `--jwt-*` flags configure it; `None` when no key is given.
/// A file that cannot be read or a key set that is not valid stops the server,
/// naming the flag.
async fn jwt_verifier(args: &ServeArgs) -> Result<Option<sless_api::jwt::JwtVerifier>> {
    if args.jwt_hs256_secret_file.is_none()
        && args.jwt_jwks_file.is_none()
        && args.jwt_jwks_url.is_none()
    {
        if args.jwt_issuer.is_some() || args.jwt_audience.is_some() {
            bail!(
                "--jwt-issuer/--jwt-audience need a key: --jwt-hs256-secret-file, --jwt-jwks-file or --jwt-jwks-url"
            );
        }
        return Ok(None);
    }
    let hs256_secret = match &args.jwt_hs256_secret_file {
        Some(path) => {
            let mut secret = std::fs::read(path).with_context(|| {
                format!("--jwt-hs256-secret-file: cannot read {}", path.display())
            })?;
            while secret.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                secret.pop();
            }
            Some(secret)
        }
        None => None,
    };
    let jwks = match &args.jwt_jwks_file {
        Some(path) => {
            let text = std::fs::read(path)
                .with_context(|| format!("--jwt-jwks-file: cannot read {}", path.display()))?;
            Some(
                sless_api::jwt::parse_jwks(&text)
                    .map_err(|e| anyhow::anyhow!("--jwt-jwks-file {}: {e}", path.display()))?,
            )
        }
        None => None,
    };
    let config = sless_api::jwt::JwtConfig {
        hs256_secret,
        jwks,
        jwks_url: args.jwt_jwks_url.clone(),
        issuer: args.jwt_issuer.clone(),
        audience: args.jwt_audience.clone(),
        namespace_claim: args.jwt_namespace_claim.clone(),
        min_refetch: Duration::from_secs(args.jwt_jwks_min_refetch_sec),
    };
    Ok(Some(sless_api::jwt::JwtVerifier::new(config).await?))
}

/// `SLESS_ADMIN_TOKEN` (at least 16 characters), or the token stored in `<data>/admin-token` (created with
/// mode 0600 on first start).
fn admin_token(data_dir: &Path) -> Result<String> {
    if let Ok(token) = std::env::var("SLESS_ADMIN_TOKEN")
        && !token.trim().is_empty()
    {
        let token = token.trim();
        let chars = token.chars().count();
        if chars < MIN_ADMIN_TOKEN_CHARS {
            bail!(
                "SLESS_ADMIN_TOKEN is too short ({chars} characters): use at least \
                 {MIN_ADMIN_TOKEN_CHARS}, e.g. a random one from `openssl rand -hex 32`, or unset it \
                 to have one generated"
            );
        }
        return Ok(token.to_string());
    }
    let path = data_dir.join("admin-token");
    match std::fs::read_to_string(&path) {
        Ok(token) if !token.trim().is_empty() => return Ok(token.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    let token = sless_api::new_token();
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(format!("{token}\n").as_bytes())?;
    eprintln!("generated an admin token in {}", path.display());
    Ok(token)
}

use std::os::unix::fs::OpenOptionsExt;

/// Writes the language shims that ship inside this binary, readable by the sandbox user.
fn write_shims(dir: &Path) -> Result<PathBuf> {
    for (sub, file, text) in [
        ("python", "sless_runtime.py", PYTHON_SHIM),
        ("node", "sless_runtime.js", NODE_SHIM),
        ("go", "sless_main.go", GO_SHIM),
    ] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
        let path = d.join(file);
        let tmp = d.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(dir.to_path_buf())
}
