//! Per-runtime builds: unpack the code, install its dependencies in the sandbox,
//! check that the entrypoint loads, and keep the result under a content address.
//!
//! A build of the same (family, entrypoint, archive) is done once: its directory
//! `builds_dir/<build_key>/` holds the unpacked code and a `.sless-built` marker,
//! written before the directory is renamed into place, so a directory under its
//! final name is always complete. Dependencies live apart, in
//! `deps_dir/<deps_key>/` keyed by the manifest (and any local packages it names),
//! so changing only the code reuses them.
//!
//! Layout seen by the sandboxed steps and later by the function: the code at
//! `/code` (read-only), the dependencies at `/deps` (Python: a `pip --target`
//! tree; Node: `node_modules/` inside), the shims at `/runtime`.
//!
//! Builds run as the sandbox user; their output is handed back to the server's
//! user and made world-readable but not writable, so a function can read its
//! dependencies and not change them.

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod keys;
mod step;
mod tree;

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use sless_blob::{ArchiveError, ArchiveLimits};
use sless_core::RuntimeFamily;
use sless_sandbox::{Mount, ProcessSpec, Sandbox, SandboxError};
use tokio::sync::Semaphore;
use tokio::time::Instant;

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
    /// Builds running at once; more wait their turn.
    pub max_parallel: usize,
    /// The longest one build may take (installs and check together).
    pub timeout: Duration,
    /// Limits on the code archive.
    pub limits: ArchiveLimits,
    /// Memory of a sandboxed build step, in MiB.
    pub memory_mb: u32,
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
            max_parallel: 2,
            timeout: Duration::from_secs(600),
            limits: ArchiveLimits::default(),
            memory_mb: 1024,
            check_entrypoint: true,
        }
    }
}

/// One build to do.
#[derive(Clone)]
pub struct BuildRequest {
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
    /// The runtime family cannot be built here (yet).
    #[error("{0}")]
    Unsupported(String),
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
        let meta = std::fs::metadata(&cfg.builds_dir)
            .map_err(io_err(format!("reading {}", cfg.builds_dir.display())))?;
        Ok(Builder {
            permits: Semaphore::new(cfg.max_parallel),
            owner: (meta.uid(), meta.gid()),
            cfg,
            sandbox,
            locks: Mutex::new(HashMap::new()),
            step_counter: AtomicU64::new(0),
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
        if matches!(req.family, RuntimeFamily::Go | RuntimeFamily::Custom) {
            return Err(BuildError::Unsupported(format!(
                "runtime {} is not supported yet",
                req.family.as_str()
            )));
        }
        let key = build_key(req.family, &req.entrypoint, &req.code_sha256);
        if let Some(done) = self.finished(&key).await {
            (req.log)("==> code unchanged, reusing the previous build");
            return Ok(done);
        }
        let lock = self.lock(&format!("build/{key}"));
        let _same_key = lock.lock().await;
        // Someone may have finished it while we waited for the lock.
        if let Some(done) = self.finished(&key).await {
            (req.log)("==> code unchanged, reusing the previous build");
            return Ok(done);
        }
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| BuildError::Internal("the builder is shut down".into()))?;

        let started = Instant::now();
        let result = self.run(&key, &req, started + self.cfg.timeout).await;
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
            RuntimeFamily::Python3 => self.python_deps(key, code.path(), log, deadline).await?,
            RuntimeFamily::Nodejs => self.node_deps(key, code.path(), log, deadline).await?,
            RuntimeFamily::Go | RuntimeFamily::Custom => None,
        };
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
        code: &Path,
        log: &LogFn,
        deadline: Instant,
    ) -> Result<Option<String>, BuildError> {
        let manifest = code.join("requirements.txt");
        if !manifest.is_file() {
            log("==> no requirements.txt, nothing to install");
            return Ok(None);
        }
        let bytes = std::fs::read(&manifest).map_err(io_err("reading requirements.txt"))?;
        let mut deps_key = keys::DepsKey::new(RuntimeFamily::Python3);
        deps_key.add("requirements.txt", &bytes);
        for path in keys::requirement_paths(&String::from_utf8_lossy(&bytes)) {
            deps_key
                .add_local(code, &path)
                .map_err(io_err(format!("reading {path}")))?;
        }
        let deps_key = deps_key.finish();
        self.ensure_deps(&deps_key, "requirements.txt", log, async |target| {
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
                vec![ro(code, "/code"), rw(target, "/deps")],
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
        code: &Path,
        log: &LogFn,
        deadline: Instant,
    ) -> Result<Option<String>, BuildError> {
        let manifest = code.join("package.json");
        if !manifest.is_file() {
            log("==> no package.json, nothing to install");
            return Ok(None);
        }
        let bytes = std::fs::read(&manifest).map_err(io_err("reading package.json"))?;
        let mut deps_key = keys::DepsKey::new(RuntimeFamily::Nodejs);
        deps_key.add("package.json", &bytes);
        let lock = code.join("package-lock.json");
        if lock.is_file() {
            deps_key.add(
                "package-lock.json",
                &std::fs::read(&lock).map_err(io_err("reading package-lock.json"))?,
            );
        }
        for path in keys::package_json_paths(&bytes) {
            deps_key
                .add_local(code, &path)
                .map_err(io_err(format!("reading {path}")))?;
        }
        let deps_key = deps_key.finish();
        self.ensure_deps(&deps_key, "package.json", log, async |target| {
            // npm writes into the project (node_modules, the lock file, packed
            // `file:` folders), so it runs in a writable copy of the code.
            let work = tempfile::Builder::new()
                .prefix(".tmp-npm-")
                .tempdir_in(&self.cfg.deps_dir)
                .map_err(io_err("creating the npm work directory"))?;
            let (src, dst) = (code.to_path_buf(), work.path().to_path_buf());
            let sandbox = self.sandbox.clone();
            tokio::task::spawn_blocking(move || {
                tree::copy_tree(&src, &dst)?;
                tree::grant_tree(&sandbox, &dst)
            })
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
        })
        .await
        .map(Some)
    }

    /// Makes `deps_dir/<deps_key>` exist: reused when installed before, otherwise
    /// `install` fills a fresh directory (owned by the sandbox user) which is then
    /// sealed and published.
    async fn ensure_deps(
        &self,
        deps_key: &str,
        manifest: &str,
        log: &LogFn,
        install: impl AsyncFnOnce(&Path) -> Result<(), BuildError>,
    ) -> Result<String, BuildError> {
        let final_dir = self.deps_dir(deps_key);
        let installed = || final_dir.join(INSTALLED_MARKER).is_file();
        if installed() {
            log(&format!(
                "==> {manifest} unchanged, reusing the installed dependencies"
            ));
            return Ok(deps_key.to_string());
        }
        let lock = self.lock(&format!("deps/{deps_key}"));
        let _same_key = lock.lock().await;
        if installed() {
            log(&format!(
                "==> {manifest} unchanged, reusing the installed dependencies"
            ));
            return Ok(deps_key.to_string());
        }
        log(&format!("==> installing {manifest}"));
        let tmp = tempfile::Builder::new()
            .prefix(".tmp-deps-")
            .tempdir_in(&self.cfg.deps_dir)
            .map_err(io_err("creating a dependencies directory"))?;
        self.sandbox.grant_write(tmp.path())?;
        install(tmp.path()).await?;

        let (uid, gid) = self.owner;
        let dest = final_dir.clone();
        tokio::task::spawn_blocking(move || {
            tree::seal_tree(tmp.path(), uid, gid)?;
            tree::publish(tmp, &dest, INSTALLED_MARKER, b"sless dependencies\n")
        })
        .await
        .map_err(|e| BuildError::Internal(format!("publishing task: {e}")))?
        .map_err(io_err(format!("publishing dependencies {deps_key}")))?;
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
            memory_mb: self.cfg.memory_mb,
            max_pids: BUILD_MAX_PIDS,
            // Installs keep the host's network (registries, and resolvers on the host);
            // see docs/security-notes/network.md.
            network: if network {
                sless_sandbox::Network::Host
            } else {
                sless_sandbox::Network::None
            },
            ready_pipe: false,
        }
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
