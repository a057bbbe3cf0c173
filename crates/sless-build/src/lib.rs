//! Per-runtime builds: unpack the code, install its dependencies in the sandbox,
//! check that the entrypoint loads, and keep the result under a content address.
//!
//! A build of the same (family, entrypoint, archive) is done once: its directory
//! `builds_dir/<build_key>/` holds the unpacked code and a `.sless-built` marker,
//! written before the directory is renamed into place, so a directory under its
//! final name is always complete. Dependencies live apart, in
//! `deps_dir/<deps_key>/`, keyed by the namespace, the installing toolchain and
//! every file of the code the install may read (see [`inputs`]); the install
//! runs on a copy holding only those files, so the key covers all it read, and
//! changing only the code reuses the dependencies. Both keys include the
//! namespace: tenants never share a build or an install.
//!
//! Layout seen by the sandboxed steps and later by the function: the code at
//! `/code` (read-only), the dependencies at `/deps` (Python: a `pip --target`
//! tree; Node: `node_modules/` inside), the shims at `/runtime`.
//!
//! Builds run as the sandbox user; their output is handed back to the server's
//! user and made world-readable but not writable, so a function can read its
//! dependencies and not change them.
//!
//! Installs run user code (npm scripts, `setup.py`), so they get what a function
//! with the `outbound` network gets: the outside world (registries) but not the
//! host (see [`install_network`]). Everything an install writes lands on a tmpfs
//! of [`BuildConfig::max_deps_bytes`] mounted for it (its pages are charged to the
//! install's memory cgroup), and only a finished tree within the limit is copied
//! to `deps_dir` (see [`scratch`]).

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod golang;
mod inputs;
mod keys;
mod scratch;
mod step;
mod tree;

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sless_blob::{ArchiveError, ArchiveLimits};
use sless_core::RuntimeFamily;
use sless_sandbox::{Mount, Network, ProcessSpec, Sandbox, SandboxError};
use tokio::sync::Semaphore;
use tokio::time::Instant;

pub use golang::BINARY as GO_BINARY;
pub use keys::{BUILDER_FORMAT_VERSION, build_key};
use step::{StepEnd, StepOutput};

/// Receives each line of build output as it happens.
pub type LogFn = Arc<dyn Fn(&str) + Send + Sync>;

/// The marker that makes `builds_dir/<key>` a finished build.
const BUILT_MARKER: &str = ".sless-built";
/// The marker that makes `deps_dir/<key>` a finished install.
const INSTALLED_MARKER: &str = ".sless-installed";
/// An always-empty directory mounted at `/deps` when a function has none.
const EMPTY_DEPS: &str = ".empty";
/// Tasks a build step may run (pip and npm start a few helpers each).
const BUILD_MAX_PIDS: u32 = 256;
/// `PATH` inside the sandbox; `npm` is a `#!/usr/bin/env node` script.
const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// Prints the interpreter's and pip's versions (part of the deps key).
const PYTHON_TOOLCHAIN: &str = "import sys\ntry:\n    import pip\n    v = pip.__version__\nexcept Exception:\n    v = 'none'\nprint(sys.version.split()[0], 'pip', v)";

/// Where builds go and what they may use.
#[derive(Debug, Clone)]
pub struct BuildConfig {
    /// `<data>/builds`: one directory of unpacked code per build key (mounted at `/code`).
    pub builds_dir: PathBuf,
    /// `<data>/deps`: one directory of installed dependencies per deps key (mounted at `/deps`).
    pub deps_dir: PathBuf,
    /// The host directory holding `python/sless_runtime.py` and
    /// `node/sless_runtime.js` (mounted at `/runtime`).
    pub runtime_dir: PathBuf,
    /// The Python interpreter (a path that is the same inside the sandbox, under `/usr`).
    pub python: PathBuf,
    /// The Node interpreter.
    pub node: PathBuf,
    /// npm.
    pub npm: PathBuf,
    /// The Go toolchain's `go` (Debian's `golang-go`).
    pub go: PathBuf,
    /// `<data>/go-cache`: the Go build cache every Go build shares (see `golang`).
    pub go_cache: PathBuf,
    /// Builds running at once; more wait their turn.
    pub max_parallel: usize,
    /// The longest one build may take (installs and check together).
    pub timeout: Duration,
    /// Limits on the code archive.
    pub limits: ArchiveLimits,
    /// Memory of a sandboxed build step, in MiB. An install gets
    /// `max_deps_bytes` more: the tmpfs it writes to is charged to it.
    pub memory_mb: u32,
    /// The most an install may write (the dependencies it produces, and for npm
    /// the copy of the project it runs in); past it the build fails.
    pub max_deps_bytes: u64,
    /// Whether a build ends by loading the entrypoint in a sandboxed shim. A server
    /// that proves every revision by starting an instance of it before calling it
    /// ready turns this off, saving an interpreter start per deploy.
    pub check_entrypoint: bool,
}

impl BuildConfig {
    /// The defaults, with the build and deps directories under `data_dir`.
    pub fn new(data_dir: &Path, runtime_dir: PathBuf) -> Self {
        BuildConfig {
            builds_dir: data_dir.join("builds"),
            deps_dir: data_dir.join("deps"),
            runtime_dir,
            python: PathBuf::from("/usr/bin/python3"),
            node: PathBuf::from("/usr/bin/node"),
            npm: PathBuf::from("/usr/bin/npm"),
            go: PathBuf::from("/usr/bin/go"),
            go_cache: data_dir.join("go-cache"),
            max_parallel: 2,
            timeout: Duration::from_secs(600),
            limits: ArchiveLimits::default(),
            memory_mb: 1024,
            max_deps_bytes: 1024 << 20,
            check_entrypoint: true,
        }
    }
}

/// One build to do.
#[derive(Clone)]
pub struct BuildRequest {
    /// The namespace the code belongs to; builds and installs are never shared
    /// across namespaces.
    pub namespace: String,
    pub family: RuntimeFamily,
    /// `module.function`.
    pub entrypoint: String,
    /// The sha256 of `archive` (checked).
    pub code_sha256: String,
    /// The zip archive as uploaded.
    pub archive: Bytes,
    /// Where the build output goes, line by line.
    pub log: LogFn,
}

impl std::fmt::Debug for BuildRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuildRequest")
            .field("namespace", &self.namespace)
            .field("family", &self.family)
            .field("entrypoint", &self.entrypoint)
            .field("code_sha256", &self.code_sha256)
            .field("archive_len", &self.archive.len())
            .finish_non_exhaustive()
    }
}

/// A finished build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildOutput {
    pub build_key: String,
    /// The unpacked code; mount it read-only at `/code`.
    pub code_dir: PathBuf,
    /// Installed dependencies, if the code has a manifest; mount read-only at `/deps`.
    pub deps_dir: Option<PathBuf>,
    /// `true`: this build existed already and nothing ran.
    pub reused: bool,
}

/// Why a build did not produce anything.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The user's code or manifest is at fault. The message names the problem
    /// and ends with the last lines of the build output; show it to the user.
    #[error("{message}")]
    Failed { message: String },
    /// The build ran longer than [`BuildConfig::timeout`] and was killed.
    #[error("the build did not finish within {} s", .0.as_secs())]
    TimedOut(Duration),
    /// The archive is unsafe or unreadable (normally refused at upload already).
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The sandbox could not start a build step.
    #[error("build sandbox: {0}")]
    Sandbox(#[from] SandboxError),
    /// File work on the server failed; `context` says which.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A broken invariant or installation (a missing runtime shim, a wrong sha256).
    #[error("internal build error: {0}")]
    Internal(String),
}

impl BuildError {
    /// Whether the code (or its manifest) is at fault, rather than the server.
    pub fn is_users(&self) -> bool {
        matches!(
            self,
            BuildError::Failed { .. } | BuildError::TimedOut(_) | BuildError::Archive(_)
        )
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> BuildError {
    let context = context.into();
    move |source| BuildError::Io { context, source }
}

/// What `.sless-built` records: enough to answer a reused build.
#[derive(serde::Serialize, serde::Deserialize)]
struct BuiltMarker {
    format: u32,
    deps_key: Option<String>,
}

/// Builds code into runnable directories; share one per server.
pub struct Builder {
    cfg: BuildConfig,
    sandbox: Arc<Sandbox>,
    permits: Semaphore,
    /// One async mutex per build or deps key, so the same work is never done twice
    /// at once; entries die with their last user.
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
    /// The server's own uid/gid (the owner of the builds directory): finished
    /// trees are handed back to it.
    owner: (u32, u32),
    /// Makes sandbox ids unique (they name cgroups).
    step_counter: AtomicU64,
    /// Deps keys that builds in progress use (with how many), which a
    /// collection must not take even though no finished build names them yet.
    building_with: Mutex<HashMap<String, usize>>,
    /// The Python and Node toolchain versions (interpreter, pip, npm), asked
    /// once: they are part of every deps key.
    toolchains: [tokio::sync::OnceCell<String>; 2],
    /// The network installs run with (see [`install_network`]).
    install_network: Network,
    /// Installs write to a size-limited tmpfs (root only: it is mounted by the server).
    bounded: bool,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// Creates the build and deps directories (mode 0700) and removes what builds
    /// interrupted by a crash left. Blocking; call it at start-up.
    pub fn new(cfg: BuildConfig, sandbox: Arc<Sandbox>) -> Result<Self, BuildError> {
        if cfg.max_parallel == 0 {
            return Err(BuildError::Internal(
                "max_parallel must be at least 1".into(),
            ));
        }
        for dir in [&cfg.builds_dir, &cfg.deps_dir] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io_err(format!("creating {}", dir.display())))?;
            // An install interrupted by a crash may have left its tmpfs mounted.
            scratch::unmount_stale(dir);
            let removed = tree::remove_stale_temps(dir)
                .map_err(io_err(format!("cleaning {}", dir.display())))?;
            if removed > 0 {
                tracing::info!(dir = %dir.display(), removed, "removed interrupted builds");
            }
        }
        let empty = cfg.deps_dir.join(EMPTY_DEPS);
        if !empty.is_dir() {
            std::fs::create_dir(&empty).map_err(io_err(format!("creating {}", empty.display())))?;
        }
        std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o755))
            .map_err(io_err(format!("setting the mode of {}", empty.display())))?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&cfg.go_cache)
            .map_err(io_err(format!("creating {}", cfg.go_cache.display())))?;
        // `go build` runs as the sandbox user and writes the cache.
        sandbox.grant_write(&cfg.go_cache)?;
        let meta = std::fs::metadata(&cfg.builds_dir)
            .map_err(io_err(format!("reading {}", cfg.builds_dir.display())))?;
        let caps = sandbox.capabilities();
        let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        let install_network = install_network(caps.outbound_isolation, &resolv);
        let bounded = caps.drops_privileges;
        if !bounded {
            tracing::warn!(
                limit_mb = cfg.max_deps_bytes >> 20,
                "not running as root: installs write to the disk directly and their size is checked only once they finish"
            );
        }
        Ok(Builder {
            install_network,
            bounded,
            permits: Semaphore::new(cfg.max_parallel),
            owner: (meta.uid(), meta.gid()),
            cfg,
            sandbox,
            locks: Mutex::new(HashMap::new()),
            step_counter: AtomicU64::new(0),
            building_with: Mutex::new(HashMap::new()),
            toolchains: Default::default(),
        })
    }

    /// Where the build `build_key` lives once finished.
    pub fn code_dir(&self, build_key: &str) -> PathBuf {
        self.cfg.builds_dir.join(build_key)
    }

    /// Where the dependencies `deps_key` live once installed.
    pub fn deps_dir(&self, deps_key: &str) -> PathBuf {
        self.cfg.deps_dir.join(deps_key)
    }

    /// The directory to mount at `/deps` for a function without dependencies.
    pub fn empty_deps_dir(&self) -> PathBuf {
        self.cfg.deps_dir.join(EMPTY_DEPS)
    }

    /// Builds `req`, or returns the finished build with the same key at once.
    pub async fn build(&self, req: BuildRequest) -> Result<BuildOutput, BuildError> {
        let key = build_key(
            &req.namespace,
            req.family,
            &req.entrypoint,
            &req.code_sha256,
        );
        // Under the key's lock, so a collection (which takes it too) either
        // removed the build before (and it is built again) or sees it renewed.
        let lock = self.lock(&format!("build/{key}"));
        let _same_key = lock.lock().await;
        if let Some(done) = self.finished(&key).await {
            renew(&done.code_dir);
            if let Some(deps) = &done.deps_dir {
                renew(deps);
            }
            (req.log)("==> code unchanged, reusing the previous build");
            sless_metrics::build(sless_metrics::BuildResult::Reused, None);
            return Ok(done);
        }
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| BuildError::Internal("the builder is shut down".into()))?;

        let started = Instant::now();
        let result = self.run(&key, &req, started + self.cfg.timeout).await;
        sless_metrics::build(
            match &result {
                Ok(_) => sless_metrics::BuildResult::Ok,
                Err(e) if e.is_users() => sless_metrics::BuildResult::Failed,
                Err(_) => sless_metrics::BuildResult::Error,
            },
            Some(started.elapsed()),
        );
        match &result {
            Ok(_) => (req.log)(&format!(
                "==> build finished in {:.1} s",
                started.elapsed().as_secs_f64()
            )),
            Err(err) => {
                tracing::info!(build_key = %key, %err, "build failed");
                (req.log)("==> build failed");
            }
        }
        result
    }

    /// The finished build `key`, if there is one whose dependencies are still there.
    async fn finished(&self, key: &str) -> Option<BuildOutput> {
        let code_dir = self.code_dir(key);
        let raw = tokio::fs::read(code_dir.join(BUILT_MARKER)).await.ok()?;
        let marker: BuiltMarker = serde_json::from_slice(&raw).ok()?;
        if marker.format != BUILDER_FORMAT_VERSION {
            return None;
        }
        let deps_dir = match marker.deps_key {
            Some(deps_key) => {
                let dir = self.deps_dir(&deps_key);
                // Deps removed behind our back: build again rather than run without.
                if !tokio::fs::try_exists(dir.join(INSTALLED_MARKER))
                    .await
                    .unwrap_or(false)
                {
                    return None;
                }
                Some(dir)
            }
            None => None,
        };
        Some(BuildOutput {
            build_key: key.to_string(),
            code_dir,
            deps_dir,
            reused: true,
        })
    }

    fn lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(lock) = locks.get(key).and_then(Weak::upgrade) {
            return lock;
        }
        locks.retain(|_, weak| weak.strong_count() > 0);
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(key.to_string(), Arc::downgrade(&lock));
        lock
    }

    async fn run(
        &self,
        key: &str,
        req: &BuildRequest,
        deadline: Instant,
    ) -> Result<BuildOutput, BuildError> {
        let log = &req.log;
        log(&format!(
            "==> unpacking the archive ({})",
            human(req.archive.len() as u64)
        ));
        // Removed on every early return (and if this future is dropped).
        let code = tempfile::Builder::new()
            .prefix(".tmp-build-")
            .tempdir_in(&self.cfg.builds_dir)
            .map_err(io_err("creating a build directory"))?;
        let (archive, dest, limits, sha) = (
            req.archive.clone(),
            code.path().to_path_buf(),
            self.cfg.limits,
            req.code_sha256.clone(),
        );
        let info = tokio::task::spawn_blocking(move || {
            let actual = sless_blob::sha256_hex(&archive);
            if actual != sha {
                return Err(BuildError::Internal(format!(
                    "the archive's sha256 is {actual}, the request says {sha}"
                )));
            }
            Ok(sless_blob::extract_zip(&archive, &dest, &limits)?)
        })
        .await
        .map_err(|e| BuildError::Internal(format!("unpacking task: {e}")))??;
        log(&format!(
            "    {} files, {} unpacked",
            info.files,
            human(info.unpacked_bytes)
        ));

        let deps_key = match req.family {
            RuntimeFamily::Python3 => self.python_deps(key, req, code.path(), deadline).await?,
            RuntimeFamily::Nodejs => self.node_deps(key, req, code.path(), deadline).await?,
            RuntimeFamily::Go => {
                self.go_build(key, req, code.path(), deadline).await?;
                None
            }
            RuntimeFamily::Custom => {
                self.check_bootstrap(req, code.path())?;
                None
            }
        };
        // Held until this build is published or abandoned; with the renewal
        // done under the lock just before, no collection can take the deps.
        let _using = deps_key.as_deref().map(|k| self.use_deps(k));
        let deps_dir = deps_key.as_deref().map(|k| self.deps_dir(k));

        if req.family == RuntimeFamily::Nodejs && deps_dir.is_some() {
            // ES modules ignore NODE_PATH; a `node_modules` next to the code makes
            // `import` find the dependencies too. The target only exists in the sandbox.
            let link = code.path().join("node_modules");
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink("/deps/node_modules", &link)
                    .map_err(io_err("linking node_modules"))?;
            }
        }

        if self.cfg.check_entrypoint {
            self.check(key, req, code.path(), deps_dir.as_deref(), deadline)
                .await?;
        }

        let marker = serde_json::to_vec(&BuiltMarker {
            format: BUILDER_FORMAT_VERSION,
            deps_key,
        })
        .map_err(|e| BuildError::Internal(format!("encoding the build marker: {e}")))?;
        let final_dir = self.code_dir(key);
        let dest = final_dir.clone();
        tokio::task::spawn_blocking(move || tree::publish(code, &dest, BUILT_MARKER, &marker))
            .await
            .map_err(|e| BuildError::Internal(format!("publishing task: {e}")))?
            .map_err(io_err(format!("publishing build {key}")))?;
        Ok(BuildOutput {
            build_key: key.to_string(),
            code_dir: final_dir,
            deps_dir,
            reused: false,
        })
    }

    /// Installs `requirements.txt`, if there is one; returns the deps key.
    async fn python_deps(
        &self,
        key: &str,
        req: &BuildRequest,
        code: &Path,
        deadline: Instant,
    ) -> Result<Option<String>, BuildError> {
        let log = &req.log;
        if !code.join("requirements.txt").is_file() {
            log("==> no requirements.txt, nothing to install");
            return Ok(None);
        }
        let (inputs, deps_key, _) = self
            .deps_inputs(req, code, RuntimeFamily::Python3, inputs::python)
            .await?;
        self.ensure_deps(&deps_key, "requirements.txt", 0, log, async |_, target| {
            // pip sees only the files the key covers, read-only.
            let staged = self
                .stage(code, inputs, &self.cfg.deps_dir, ".tmp-input-")
                .await?;
            let spec = self.spec(
                key,
                "pip",
                self.cfg.python.clone(),
                [
                    "-m",
                    "pip",
                    "install",
                    "--no-cache-dir",
                    "--disable-pip-version-check",
                    "--no-input",
                    "--progress-bar",
                    "off",
                    "--no-warn-script-location",
                    "--target",
                    "/deps",
                    "-r",
                    "requirements.txt",
                ],
                vec![ro(staged.path(), "/code"), rw(target, "/deps")],
                "/code",
                true,
                vec![("PYTHONUNBUFFERED".into(), "1".into())],
            );
            let out = step::run(&self.sandbox, &spec, log, deadline).await?;
            self.step_result(out, "installing requirements.txt")
        })
        .await
        .map(Some)
    }

    /// Installs `package.json`'s dependencies, if there is one; returns the deps key.
    async fn node_deps(
        &self,
        key: &str,
        req: &BuildRequest,
        code: &Path,
        deadline: Instant,
    ) -> Result<Option<String>, BuildError> {
        let log = &req.log;
        if !code.join("package.json").is_file() {
            log("==> no package.json, nothing to install");
            return Ok(None);
        }
        let (inputs, deps_key, input_bytes) = self
            .deps_inputs(req, code, RuntimeFamily::Nodejs, inputs::node)
            .await?;
        // The copy of the project lives on the install's tmpfs too, on top of the limit.
        let extra = input_bytes;
        self.ensure_deps(
            &deps_key,
            "package.json",
            extra,
            log,
            async |scratch, target| {
                // npm writes into the project (node_modules, the lock file, packed
                // `file:` folders), so it runs in a writable copy of the files the
                // key covers, and of nothing else, on the install's tmpfs.
                let work = self.stage(code, inputs, scratch, ".tmp-npm-").await?;
                let dst = work.path().to_path_buf();
                let sandbox = self.sandbox.clone();
                tokio::task::spawn_blocking(move || tree::grant_tree(&sandbox, &dst))
                    .await
                    .map_err(|e| BuildError::Internal(format!("copy task: {e}")))?
                    .map_err(io_err("preparing the npm work directory"))?;

                let spec = self.spec(
                    key,
                    "npm",
                    self.cfg.npm.clone(),
                    [
                        "install",
                        "--omit=dev",
                        "--no-audit",
                        "--no-fund",
                        "--no-update-notifier",
                        // Pack `file:` folders of dependencies instead of linking them into
                        // the work copy, which is deleted right after (npm still links the
                        // project's own ones; `materialize_links` copies those).
                        "--install-links",
                    ],
                    vec![rw(work.path(), "/work")],
                    "/work",
                    true,
                    vec![("npm_config_cache".into(), "/tmp/.npm".into())],
                );
                let out = step::run(&self.sandbox, &spec, log, deadline).await?;
                self.step_result(out, "installing package.json dependencies")?;

                let modules = work.path().join("node_modules");
                let into = target.join("node_modules");
                if modules.is_dir() {
                    let (project, m) = (work.path().to_path_buf(), modules.clone());
                    tokio::task::spawn_blocking(move || tree::materialize_links(&project, &m))
                        .await
                        .map_err(|e| BuildError::Internal(format!("copy task: {e}")))?
                        .map_err(io_err("copying linked file: dependencies"))?;
                    std::fs::rename(&modules, &into).map_err(io_err("moving node_modules"))?;
                } else {
                    std::fs::create_dir(&into).map_err(io_err("creating node_modules"))?;
                }
                Ok(())
            },
        )
        .await
        .map(Some)
    }

    /// The files `find` says the install reads, and the deps key over them, the
    /// namespace and the toolchain. A manifest reaching outside the archive
    /// fails the build with a message naming it.
    async fn deps_inputs(
        &self,
        req: &BuildRequest,
        code: &Path,
        family: RuntimeFamily,
        find: fn(&Path) -> Result<inputs::Inputs, inputs::InputError>,
    ) -> Result<(inputs::Inputs, String, u64), BuildError> {
        let toolchain = self.toolchain(family).await;
        let (code, ns) = (code.to_path_buf(), req.namespace.clone());
        tokio::task::spawn_blocking(move || {
            let found = find(&code).map_err(|e| match e {
                inputs::InputError::Refused(message) => BuildError::Failed { message },
                inputs::InputError::Io { path, source } => BuildError::Io {
                    context: format!("reading {path}"),
                    source,
                },
            })?;
            let mut key = keys::DepsKey::new(&ns, family, &toolchain);
            let mut total = 0u64;
            for rel in found.files() {
                let bytes =
                    std::fs::read(code.join(rel)).map_err(io_err(format!("reading {rel}")))?;
                total = total.saturating_add(bytes.len() as u64);
                key.add(&format!("file:{rel}"), &bytes);
            }
            Ok((found, key.finish(), total))
        })
        .await
        .map_err(|e| BuildError::Internal(format!("hashing task: {e}")))?
    }

    /// A fresh directory under `parent` holding a copy of `inputs`.
    async fn stage(
        &self,
        code: &Path,
        inputs: inputs::Inputs,
        parent: &Path,
        prefix: &str,
    ) -> Result<tempfile::TempDir, BuildError> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(parent)
            .map_err(io_err("creating the install directory"))?;
        let (src, dst) = (code.to_path_buf(), dir.path().to_path_buf());
        tokio::task::spawn_blocking(move || inputs::stage(&src, &inputs, &dst))
            .await
            .map_err(|e| BuildError::Internal(format!("copy task: {e}")))?
            .map_err(io_err("copying the install's files"))?;
        Ok(dir)
    }

    /// The version of what installs `family`'s dependencies, asked once per
    /// server: `3.11.2 pip 23.0.1`, `v20.20.2 npm 11.19.1`. A toolchain that cannot
    /// say is keyed as `unavailable` (its installs fail anyway).
    async fn toolchain(&self, family: RuntimeFamily) -> String {
        let (cell, queries): (_, Vec<(&Path, Vec<&str>)>) = match family {
            RuntimeFamily::Nodejs => (
                &self.toolchains[1],
                vec![
                    (self.cfg.node.as_path(), vec!["--version"]),
                    (self.cfg.npm.as_path(), vec!["--version"]),
                ],
            ),
            _ => (
                &self.toolchains[0],
                vec![(
                    self.cfg.python.as_path(),
                    vec!["-I", "-c", PYTHON_TOOLCHAIN],
                )],
            ),
        };
        cell.get_or_init(async || {
            let mut parts = Vec::new();
            for (program, args) in queries {
                let out = tokio::time::timeout(
                    Duration::from_secs(60),
                    tokio::process::Command::new(program)
                        .args(args)
                        .env_clear()
                        .env("PATH", SANDBOX_PATH)
                        .env("HOME", "/nonexistent")
                        .stdin(std::process::Stdio::null())
                        .kill_on_drop(true)
                        .output(),
                )
                .await;
                match out {
                    Ok(Ok(out)) if out.status.success() => {
                        parts.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
                    }
                    other => {
                        tracing::warn!(program = %program.display(), result = ?other.map(|r| r.map(|o| o.status)), "cannot tell the toolchain version");
                        parts.push("unavailable".into());
                    }
                }
            }
            let version = parts.join(" npm ");
            tracing::info!(family = family.as_str(), %version, "dependency toolchain");
            version
        })
        .await
        .clone()
    }

    /// Makes `deps_dir/<deps_key>` exist: reused when installed before, otherwise
    /// `install` fills a fresh directory (owned by the sandbox user) on a tmpfs of
    /// `max_deps_bytes` plus `extra` (its first argument is the tmpfs, for work
    /// files), and a tree within the limit is copied out, sealed and published.
    async fn ensure_deps(
        &self,
        deps_key: &str,
        manifest: &str,
        extra: u64,
        log: &LogFn,
        install: impl AsyncFnOnce(&Path, &Path) -> Result<(), BuildError>,
    ) -> Result<String, BuildError> {
        let final_dir = self.deps_dir(deps_key);
        let installed = || final_dir.join(INSTALLED_MARKER).is_file();
        let lock = self.lock(&format!("deps/{deps_key}"));
        let _same_key = lock.lock().await;
        if installed() {
            // Renewed under the lock: a collection keeps what a build is using.
            renew(&final_dir);
            log(&format!(
                "==> {manifest} unchanged, reusing the installed dependencies"
            ));
            return Ok(deps_key.to_string());
        }
        log(&format!("==> installing {manifest}"));
        let limit = self.cfg.max_deps_bytes;
        let scratch = scratch::Scratch::new(
            &self.cfg.deps_dir,
            limit.saturating_add(extra),
            self.bounded,
        )
        .await?;
        let target = scratch.path().join("deps");
        std::fs::create_dir(&target).map_err(io_err("creating a dependencies directory"))?;
        self.sandbox.grant_write(&target)?;
        if let Err(err) = install(scratch.path(), &target).await {
            return Err(scratch::explain_overflow(err, limit));
        }

        let tmp = tempfile::Builder::new()
            .prefix(".tmp-deps-")
            .tempdir_in(&self.cfg.deps_dir)
            .map_err(io_err("creating a dependencies directory"))?;
        let (uid, gid) = self.owner;
        let dest = final_dir.clone();
        let key = deps_key.to_string();
        tokio::task::spawn_blocking(move || {
            // Hard links and sparse files take less room on the tmpfs than on
            // disk: the copy is bounded by what it would write.
            let bytes = scratch::tree_bytes(&target)
                .map_err(io_err("measuring the installed dependencies"))?;
            if bytes > limit {
                return Err(scratch::over_limit(limit, ""));
            }
            let publish = || {
                tree::copy_tree(&target, tmp.path())?;
                tree::seal_tree(tmp.path(), uid, gid)?;
                tree::publish(tmp, &dest, INSTALLED_MARKER, b"sless dependencies\n")
            };
            publish().map_err(io_err(format!("publishing dependencies {key}")))
        })
        .await
        .map_err(|e| BuildError::Internal(format!("publishing task: {e}")))??;
        drop(scratch);
        Ok(deps_key.to_string())
    }

    /// Runs the runtime shim in check mode: does the entrypoint load?
    async fn check(
        &self,
        key: &str,
        req: &BuildRequest,
        code: &Path,
        deps: Option<&Path>,
        deadline: Instant,
    ) -> Result<(), BuildError> {
        (req.log)(&format!("==> checking the entrypoint {}", req.entrypoint));
        let (program, shim, extra_env): (PathBuf, &str, Vec<(String, String)>) = match req.family {
            RuntimeFamily::Python3 => (
                self.cfg.python.clone(),
                "python/sless_runtime.py",
                vec![("PYTHONDONTWRITEBYTECODE".into(), "1".into())],
            ),
            RuntimeFamily::Nodejs => (
                self.cfg.node.clone(),
                "node/sless_runtime.js",
                vec![("NODE_PATH".into(), "/deps/node_modules".into())],
            ),
            RuntimeFamily::Go | RuntimeFamily::Custom => return Ok(()),
        };
        if !self.cfg.runtime_dir.join(shim).is_file() {
            return Err(BuildError::Internal(format!(
                "the runtime shim {} is missing",
                self.cfg.runtime_dir.join(shim).display()
            )));
        }
        let deps = deps.map_or_else(|| self.empty_deps_dir(), Path::to_path_buf);
        let mut env = extra_env;
        env.extend([
            ("SLESS_ENTRYPOINT".to_string(), req.entrypoint.clone()),
            ("SLESS_CODE_DIR".into(), "/code".into()),
            ("SLESS_DEPS_DIR".into(), "/deps".into()),
        ]);
        let shim_arg = format!("/runtime/{shim}");
        let spec = self.spec(
            key,
            "check",
            program,
            [shim_arg.as_str(), "--check"],
            vec![
                ro(code, "/code"),
                ro(&deps, "/deps"),
                ro(&self.cfg.runtime_dir, "/runtime"),
            ],
            "/code",
            false,
            env,
        );
        let out = step::run(&self.sandbox, &spec, &req.log, deadline).await?;
        if let StepEnd::Exited(exit) = &out.end
            && !exit.success()
            && let Some(line) = &out.shim_line
        {
            // The shim named what is missing; that line leads the message, and the
            // rest of the output (a traceback) follows when there is more.
            let mut message = line.clone();
            let rest: Vec<&String> = out
                .tail
                .iter()
                .filter(|l| l.strip_prefix("sless: ") != Some(line))
                .collect();
            if !rest.is_empty() {
                message.push_str("\n\n");
                message.push_str(
                    &rest
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join("\n"),
                );
            }
            return Err(BuildError::Failed { message });
        }
        self.step_result(out, "the entrypoint check")
    }

    /// Turns a step's end into `Ok` or the user-facing error.
    fn step_result(&self, out: StepOutput, what: &str) -> Result<(), BuildError> {
        match out.end {
            StepEnd::Exited(exit) if exit.success() => Ok(()),
            StepEnd::Exited(exit) => {
                let mut message = format!("{what} failed ({exit})");
                if !out.tail.is_empty() {
                    message.push_str(":\n");
                    message.push_str(&out.tail.join("\n"));
                }
                Err(BuildError::Failed { message })
            }
            StepEnd::TimedOut => Err(BuildError::TimedOut(self.cfg.timeout)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn spec<const N: usize>(
        &self,
        key: &str,
        step: &str,
        program: PathBuf,
        args: [&str; N],
        mounts: Vec<Mount>,
        cwd: &str,
        network: bool,
        extra_env: Vec<(String, String)>,
    ) -> ProcessSpec {
        let n = self.step_counter.fetch_add(1, Ordering::Relaxed);
        // An install's tmpfs is charged to its memory cgroup: room for it on top.
        let memory_mb = if network && self.bounded {
            let deps_mb = u32::try_from(self.cfg.max_deps_bytes >> 20).unwrap_or(u32::MAX);
            self.cfg.memory_mb.saturating_add(deps_mb)
        } else {
            self.cfg.memory_mb
        };
        let mut env = vec![
            ("PATH".to_string(), SANDBOX_PATH.to_string()),
            ("HOME".into(), "/tmp".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        env.extend(extra_env);
        ProcessSpec {
            id: format!("build-{}-{step}-{n}", &key[..12]),
            program,
            args: args.iter().map(|a| a.to_string()).collect(),
            env,
            mounts,
            cwd: PathBuf::from(cwd),
            memory_mb,
            max_pids: BUILD_MAX_PIDS,
            // Installs reach the registries, not the host (see `install_network`).
            network: if network {
                self.install_network
            } else {
                Network::None
            },
            ready_pipe: false,
            listen: None,
        }
    }
}

/// The network installs run with. `Outbound` (the outside world, not the host's
/// addresses) where the sandbox can isolate and names resolve from there: the
/// namespace has no IPv6 and its own loopback, and slirp's DNS forwarder is
/// blocked, so `/etc/resolv.conf` must name an IPv4 nameserver off loopback.
/// Otherwise the host's network, with a warning at start.
fn install_network(outbound_isolation: bool, resolv_conf: &str) -> Network {
    if !outbound_isolation {
        tracing::warn!(
            "the sandbox cannot isolate the network here: installs (pip, npm) run with the host's network and can reach its services"
        );
        return Network::Host;
    }
    if !has_outside_resolver(resolv_conf) {
        tracing::warn!(
            "/etc/resolv.conf names no IPv4 nameserver off loopback (127.0.0.53, say): installs (pip, npm) run with the host's network to resolve names, and can reach its services"
        );
        return Network::Host;
    }
    Network::Outbound
}

/// Whether `resolv.conf` names an IPv4 nameserver outside loopback.
fn has_outside_resolver(resolv_conf: &str) -> bool {
    resolv_conf
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next())
                .flatten()
        })
        .filter_map(|addr| addr.parse::<std::net::Ipv4Addr>().ok())
        .any(|addr| !addr.is_loopback() && !addr.is_unspecified())
}

/// What [`Builder::collect`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Collected {
    pub builds: usize,
    pub deps: usize,
    /// Bytes of the files removed (their apparent sizes).
    pub bytes: u64,
}

impl Builder {
    /// Removes finished builds whose key is not in `keep` and that were last
    /// built or reused before `cutoff`, then installed dependencies that no
    /// remaining build names and that were last installed or reused before
    /// `cutoff`. Each removal takes the key's lock and renames the directory
    /// away first, so a build reusing it at the same moment either renews it
    /// (and it stays) or finds it gone (and builds it again).
    pub async fn collect(
        &self,
        keep: &HashSet<String>,
        cutoff: SystemTime,
    ) -> Result<Collected, BuildError> {
        let mut done = Collected::default();
        for key in self.entries(&self.cfg.builds_dir).await? {
            if keep.contains(&key) {
                continue;
            }
            if let Some(bytes) = self
                .remove_if_stale(&format!("build/{key}"), &self.code_dir(&key), cutoff)
                .await?
            {
                done.builds += 1;
                done.bytes += bytes;
            }
        }
        // Dependencies stay while any build that is left names them.
        let mut named = HashSet::new();
        for key in self.entries(&self.cfg.builds_dir).await? {
            let marker = tokio::fs::read(self.code_dir(&key).join(BUILT_MARKER)).await;
            if let Ok(raw) = marker
                && let Ok(BuiltMarker {
                    deps_key: Some(deps),
                    ..
                }) = serde_json::from_slice::<BuiltMarker>(&raw)
            {
                named.insert(deps);
            }
        }
        named.extend(self.deps_in_use());
        for key in self.entries(&self.cfg.deps_dir).await? {
            if named.contains(&key) {
                continue;
            }
            if let Some(bytes) = self
                .remove_if_stale(&format!("deps/{key}"), &self.deps_dir(&key), cutoff)
                .await?
            {
                done.deps += 1;
                done.bytes += bytes;
            }
        }
        Ok(done)
    }

    /// Marks `deps_key` as used by a build in progress until the guard drops.
    fn use_deps(&self, deps_key: &str) -> DepsInUse<'_> {
        *self
            .building_with
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(deps_key.to_string())
            .or_default() += 1;
        DepsInUse {
            builder: self,
            key: deps_key.to_string(),
        }
    }

    fn deps_in_use(&self) -> HashSet<String> {
        self.building_with
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// The names in `dir` that can be keys: directories not starting with `.`
    /// (temporary and reserved entries do).
    async fn entries(&self, dir: &Path) -> Result<Vec<String>, BuildError> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if !name.starts_with('.') && entry.file_type()?.is_dir() {
                    out.push(name);
                }
            }
            Ok(out)
        })
        .await
        .map_err(|e| BuildError::Internal(format!("listing task: {e}")))?
        .map_err(io_err("listing build outputs"))
    }

    /// Removes `dir` if it was last changed before `cutoff`; the bytes freed.
    async fn remove_if_stale(
        &self,
        lock_key: &str,
        dir: &Path,
        cutoff: SystemTime,
    ) -> Result<Option<u64>, BuildError> {
        let doomed = {
            let lock = self.lock(lock_key);
            let _same_key = lock.lock().await;
            let Ok(modified) = tokio::fs::metadata(dir).await.and_then(|m| m.modified()) else {
                return Ok(None);
            };
            if modified >= cutoff {
                return Ok(None);
            }
            let parent = dir.parent().unwrap_or(dir);
            let name = dir.file_name().unwrap_or_default().to_string_lossy();
            // `.tmp-` entries are removed at start-up if this is interrupted.
            let doomed = parent.join(format!(".tmp-gc-{name}"));
            tokio::fs::rename(dir, &doomed)
                .await
                .map_err(io_err(format!("moving {} away", dir.display())))?;
            doomed
        };
        tokio::task::spawn_blocking(move || {
            let bytes = walkdir::WalkDir::new(&doomed)
                .into_iter()
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_file())
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum::<u64>();
            std::fs::remove_dir_all(&doomed).map(|()| bytes)
        })
        .await
        .map_err(|e| BuildError::Internal(format!("removal task: {e}")))?
        .map(Some)
        .map_err(io_err(format!("removing {}", dir.display())))
    }
}

/// A build in progress's use of installed dependencies (see [`Builder::use_deps`]).
struct DepsInUse<'a> {
    builder: &'a Builder,
    key: String,
}

impl Drop for DepsInUse<'_> {
    fn drop(&mut self) {
        let mut using = self
            .builder
            .building_with
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = using.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                using.remove(&self.key);
            }
        }
    }
}

/// Marks a finished directory as used now (its modification time), which a
/// collection reads as "recently used". Best effort: a failure only makes the
/// directory look older.
fn renew(dir: &Path) {
    let now = SystemTime::now();
    if let Err(e) = std::fs::File::open(dir).and_then(|f| f.set_modified(now)) {
        tracing::debug!(dir = %dir.display(), error = %e, "could not renew");
    }
}

fn ro(source: &Path, target: &str) -> Mount {
    Mount {
        source: source.to_path_buf(),
        target: PathBuf::from(target),
        writable: false,
    }
}

fn rw(source: &Path, target: &str) -> Mount {
    Mount {
        source: source.to_path_buf(),
        target: PathBuf::from(target),
        writable: true,
    }
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests;
