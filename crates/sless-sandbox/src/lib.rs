//! Linux process jail for function instances and builds: bubblewrap for the
//! namespaces and mounts, cgroups (v1 or v2) for memory and process-count limits.
//!
//! This is the only crate allowed `unsafe` (for the `pre_exec` hook that joins the
//! cgroup and arms the parent-death signal, and a few raw syscalls).
//!
//! Two modes, picked at start:
//! - **root** (the server's normal case): bwrap runs as root, so it can bind any host path
//!   and the instance can be put in a cgroup with limits; the program itself runs through
//!   `setpriv` as an unprivileged uid/gid with no capabilities and `no_new_privs`.
//! - **not root** (development): bwrap builds a user namespace itself; no cgroups, so memory
//!   and process limits are not enforced (logged once at start).
//!
//! Code run in the sandbox sees `/usr`, a small `/etc`, fresh `/proc`, `/dev` and `/tmp`,
//! and the spec's mounts; nothing else of the host. Mount sources must be readable (and
//! for writable mounts, writable) by the sandbox uid: see [`Sandbox::grant_write`].

#![allow(unsafe_code)]

mod bwrap;
mod cgroup;
mod network;
mod process;
mod seccomp;
#[cfg(test)]
mod tests;

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use network::Network;
pub use process::{Child, Exit, Killer};

use crate::bwrap::{HostLayout, Privilege};
use crate::cgroup::{Cgroup, Hierarchy};

/// Where util-linux installs `setpriv` (Debian, Fedora, Alpine's util-linux-misc alike).
const SETPRIV: &str = "/usr/bin/setpriv";

/// The descriptor a program gets its listening socket as (see [`ProcessSpec::listen`]).
pub const LISTEN_FD: i32 = 4;

/// The descriptor bwrap reads the seccomp filter from (it closes it before the program).
const SECCOMP_FD: i32 = 5;

/// A directory made visible inside the sandbox.
#[derive(Debug, Clone)]
pub struct Mount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub writable: bool,
}

/// Everything needed to start one sandboxed process.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// Unique id, used for the cgroup name (`sless/<id>`); `[A-Za-z0-9._-]`, at most 128.
    pub id: String,
    /// Program path as seen inside the sandbox (e.g. `/usr/bin/python3`).
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The complete environment (nothing is inherited from the server). It reaches the
    /// program through the process environment, never a command line. Variables the
    /// dynamic loader acts on (`LD_*`, `GLIBC_TUNABLES`, ...) are refused: the setup
    /// helpers run privileged with this environment.
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    /// Working directory inside the sandbox.
    pub cwd: PathBuf,
    /// Memory limit (swap included); 0 means none.
    pub memory_mb: u32,
    /// Limit on tasks (processes and threads, bwrap's two included); 0 means none.
    pub max_pids: u32,
    /// What the process may reach over the network (see [`Network`]).
    pub network: Network,
    /// Pass a pipe as fd 3 and expose its read end as [`Child::ready`].
    pub ready_pipe: bool,
    /// A host path where the sandbox creates a listening Unix socket (replacing a stale
    /// socket there) and hands it to the program as fd [`LISTEN_FD`]. The program never
    /// needs a writable view of the socket's directory that way; the socket file is owned
    /// by the server.
    pub listen: Option<PathBuf>,
}

/// How to build sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// The bubblewrap binary.
    pub bwrap: PathBuf,
    /// The uid sandboxed programs run as when the server is root (default 65534, `nobody`).
    pub uid: u32,
    /// The gid sandboxed programs run as when the server is root (default 65534, `nogroup`).
    pub gid: u32,
    /// The parent cgroup of all instances (`<hierarchy>/<cgroup_name>/<id>`).
    pub cgroup_name: String,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            bwrap: PathBuf::from("/usr/bin/bwrap"),
            uid: 65534,
            gid: 65534,
            cgroup_name: "sless".to_owned(),
        }
    }
}

/// The cgroup hierarchy in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// What this host lets the sandbox enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The cgroup hierarchy instances are put in; `None` when not root or none is usable.
    pub cgroup: Option<CgroupVersion>,
    /// `ProcessSpec::memory_mb` is enforced.
    pub memory_limit: bool,
    /// `ProcessSpec::max_pids` is enforced.
    pub pids_limit: bool,
    /// [`Killer::set_cpu_millicores`] is enforced.
    pub cpu_limit: bool,
    /// [`Killer::set_frozen`] can stop an instance's processes between requests.
    pub freezer: bool,
    /// Programs run as `SandboxConfig::uid`/`gid` without capabilities (root mode).
    pub drops_privileges: bool,
    /// [`Network::Outbound`] keeps the host out (root mode with slirp4netns and `ip`);
    /// otherwise it is refused in root mode and means the host's network when not root.
    pub outbound_isolation: bool,
}

/// Errors of the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The bubblewrap binary is missing or does not run.
    #[error("bubblewrap at {path} cannot be run: {source}")]
    BwrapUnavailable { path: PathBuf, source: io::Error },
    /// bubblewrap runs but cannot build a sandbox here (e.g. user namespaces are disabled).
    #[error("bubblewrap at {path} cannot create a sandbox: {stderr}")]
    BwrapBroken { path: PathBuf, stderr: String },
    /// Running as root without `setpriv`, so programs would keep running as root.
    #[error("{path} is missing; it is needed to run functions unprivileged (install util-linux)")]
    SetprivMissing { path: PathBuf },
    /// The configuration is unusable.
    #[error("invalid sandbox configuration: {0}")]
    InvalidConfig(String),
    /// The process spec is not valid.
    #[error("invalid process spec {id:?}: {reason}")]
    InvalidSpec { id: String, reason: String },
    /// Creating, limiting or joining the instance's cgroup failed.
    #[error("cgroup of {id:?} at {path}: {source}")]
    Cgroup {
        id: String,
        path: PathBuf,
        source: io::Error,
    },
    /// Creating the ready pipe failed.
    #[error("ready pipe of {id:?}: {source}")]
    ReadyPipe { id: String, source: io::Error },
    /// Starting bwrap failed (fork, exec, or the `pre_exec` setup).
    #[error("cannot start the sandbox of {id:?}: {source}")]
    Spawn { id: String, source: io::Error },
    /// `spawn` was called outside a tokio runtime.
    #[error("Sandbox::spawn must be called inside a tokio runtime")]
    NoRuntime,
    /// Creating the listening socket of [`ProcessSpec::listen`] failed.
    #[error("listening socket {path} of {id:?}: {source}")]
    Listen {
        id: String,
        path: PathBuf,
        source: io::Error,
    },
    /// Handing the seccomp filter to bwrap failed.
    #[error("seccomp filter of {id:?}: {source}")]
    Seccomp { id: String, source: io::Error },
    /// [`Network::Outbound`] was asked for but cannot be provided here.
    #[error("cannot give {id:?} an outbound network: {reason}")]
    NetworkUnavailable { id: String, reason: String },
    /// Creating the pipes of the network setup failed.
    #[error("network setup pipes of {id:?}: {source}")]
    NetworkPipes { id: String, source: io::Error },
    /// Changing the owner of a directory for the sandbox user failed.
    #[error("cannot hand {path} to the sandbox user: {source}")]
    Chown { path: PathBuf, source: io::Error },
}

/// Starts sandboxed processes. Build one at start-up and share it (`Send + Sync`).
#[derive(Debug)]
pub struct Sandbox {
    cfg: SandboxConfig,
    privilege: Privilege,
    layout: HostLayout,
    hierarchy: Option<Hierarchy>,
    /// The compiled seccomp filter (see `seccomp.rs`).
    seccomp: Vec<u8>,
    /// The tools of [`Network::Outbound`], or why they are unusable.
    net_tools: Result<Arc<network::Tools>, String>,
}

impl Sandbox {
    /// Checks that bubblewrap works here and finds out what can be enforced.
    ///
    /// Blocking (runs bubblewrap once); call it at start-up.
    pub fn new(cfg: SandboxConfig) -> Result<Sandbox, SandboxError> {
        let name_ok = !cfg.cgroup_name.is_empty()
            && cfg.cgroup_name != "."
            && cfg.cgroup_name != ".."
            && !cfg.cgroup_name.contains('/');
        if !name_ok {
            return Err(SandboxError::InvalidConfig(format!(
                "cgroup_name {:?} must be a single path component",
                cfg.cgroup_name
            )));
        }
        check_bwrap_runs(&cfg.bwrap)?;

        // SAFETY: geteuid has no arguments and cannot fail.
        let is_root = unsafe { libc::geteuid() } == 0;
        let privilege = if is_root {
            if cfg.uid == 0 || cfg.gid == 0 {
                return Err(SandboxError::InvalidConfig(
                    "uid and gid must not be 0: sandboxed code never runs as root".into(),
                ));
            }
            let setpriv = PathBuf::from(SETPRIV);
            if !setpriv.is_file() {
                return Err(SandboxError::SetprivMissing { path: setpriv });
            }
            Privilege::Root {
                setpriv,
                uid: cfg.uid,
                gid: cfg.gid,
            }
        } else {
            Privilege::Unprivileged
        };

        let hierarchy = if is_root {
            match Hierarchy::detect() {
                Some(h) => match h.prepare(&cfg.cgroup_name) {
                    Ok(()) => Some(h),
                    Err(err) => {
                        tracing::warn!(%err, "cannot set up the instance cgroups; memory and process limits are NOT enforced");
                        None
                    }
                },
                None => {
                    tracing::warn!(
                        "no cgroup hierarchy with the memory or pids controller; limits are NOT enforced"
                    );
                    None
                }
            }
        } else {
            tracing::warn!(
                "not running as root: functions run as this user, memory and process limits are NOT enforced"
            );
            None
        };

        let net_tools = match privilege {
            Privilege::Root { .. } => network::Tools::detect().map(Arc::new),
            Privilege::Unprivileged => Err("not running as root".to_owned()),
        };
        match (&privilege, &net_tools) {
            (Privilege::Root { .. }, Err(why)) => tracing::warn!(
                "{why}: functions with the outbound network (the default) cannot start"
            ),
            (Privilege::Unprivileged, _) => tracing::warn!(
                "not running as root: functions with the outbound network share the host's network"
            ),
            _ => {}
        }
        let sandbox = Sandbox {
            layout: HostLayout::detect(),
            cfg,
            privilege,
            hierarchy,
            seccomp: seccomp::program(),
            net_tools,
        };
        sandbox.probe()?;
        let caps = sandbox.capabilities();
        if caps.cgroup.is_some() && !caps.memory_limit {
            tracing::warn!(
                "the memory cgroup controller is unavailable; memory limits are NOT enforced"
            );
        }
        if caps.cgroup.is_some() && !caps.pids_limit {
            tracing::warn!(
                "the pids cgroup controller is unavailable; process limits are NOT enforced"
            );
        }
        tracing::info!(?caps, "sandbox ready");
        Ok(sandbox)
    }

    /// What this host lets the sandbox enforce.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            cgroup: self.hierarchy.as_ref().map(Hierarchy::version),
            memory_limit: self.hierarchy.as_ref().is_some_and(Hierarchy::memory),
            pids_limit: self.hierarchy.as_ref().is_some_and(Hierarchy::pids),
            cpu_limit: self.hierarchy.as_ref().is_some_and(Hierarchy::cpu),
            freezer: self.hierarchy.as_ref().is_some_and(Hierarchy::freezer),
            drops_privileges: matches!(self.privilege, Privilege::Root { .. }),
            outbound_isolation: self.net_tools.is_ok(),
        }
    }

    /// Kills the processes left in `<cgroup_name>` cgroups by an earlier run (one that was
    /// SIGKILLed, say) and removes those cgroups. Returns how many processes were killed.
    ///
    /// Call it at start-up, before the first `spawn`: it cannot tell an earlier run's
    /// instances from this one's, nor from another server's sharing the same `cgroup_name`.
    /// Blocking (waits briefly for the killed processes to go).
    pub fn reap_stale(&self) -> usize {
        let Some(hierarchy) = &self.hierarchy else {
            return 0;
        };
        let mut killed = 0;
        for stale in hierarchy.existing(&self.cfg.cgroup_name) {
            match cgroup::kill_and_remove(stale.as_ref(), process::DRAIN_TIMEOUT) {
                Ok(n) => killed += n,
                Err(err) => tracing::warn!(%err, "cannot remove a stale instance cgroup"),
            }
        }
        if killed > 0 {
            tracing::info!(killed, "killed processes left by an earlier run");
        }
        killed
    }

    /// Starts `spec` in a new sandbox.
    ///
    /// Must be called inside a tokio runtime (the child is reaped by it). It blocks for the
    /// fork and exec of bwrap (about a millisecond). The fork happens on a dedicated thread
    /// that lives as long as the process, because the parent-death signal that ties
    /// instances to the server fires when the *forking thread* exits.
    pub fn spawn(&self, spec: &ProcessSpec) -> Result<Child, SandboxError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| SandboxError::NoRuntime)?;
        bwrap::validate(spec).map_err(|reason| SandboxError::InvalidSpec {
            id: spec.id.clone(),
            reason,
        })?;
        // In root mode an outbound instance waits, before its program starts, for its
        // namespace to be connected (see `network`).
        let net = match (&self.privilege, spec.network) {
            (Privilege::Root { .. }, Network::Outbound) => {
                let tools =
                    self.net_tools
                        .as_ref()
                        .map_err(|reason| SandboxError::NetworkUnavailable {
                            id: spec.id.clone(),
                            reason: reason.clone(),
                        })?;
                let pending =
                    network::Pending::new().map_err(|source| SandboxError::NetworkPipes {
                        id: spec.id.clone(),
                        source,
                    })?;
                Some((tools.clone(), pending))
            }
            _ => None,
        };
        let argv = bwrap::build_args(spec, &self.layout, &self.privilege);
        let mut fds = vec![(self.seccomp_fd(&spec.id)?, SECCOMP_FD)];
        if let Some(path) = &spec.listen {
            fds.push((listen(&spec.id, path)?, LISTEN_FD));
        }
        let cgroup = match &self.hierarchy {
            Some(h) => Some(self.create_cgroup(h, spec)?),
            None => None,
        };
        if let Some((_, pending)) = &net {
            fds.extend(
                pending
                    .child_fds()
                    .map_err(|source| SandboxError::NetworkPipes {
                        id: spec.id.clone(),
                        source,
                    })?,
            );
        }
        let result = process::spawn(
            handle,
            process::Launch {
                bwrap: &self.cfg.bwrap,
                argv,
                env: &spec.env,
                id: &spec.id,
                ready_pipe: spec.ready_pipe,
                fds,
                cgroup: cgroup.clone(),
            },
        );
        let result = result.map(|mut child| {
            if let Some((tools, pending)) = net {
                child.net_exit = Some(pending.start(tools, spec.id.clone(), child.killer()));
            }
            child
        });
        if result.is_err()
            && let Some(cgroup) = cgroup
            && let Err(err) = cgroup::kill_and_remove(cgroup.as_ref(), process::DRAIN_TIMEOUT)
        {
            tracing::warn!(id = %spec.id, %err, "cannot remove the cgroup of a failed start");
        }
        result
    }

    /// A pipe holding the seccomp filter, for bwrap to read to its end.
    fn seccomp_fd(&self, id: &str) -> Result<OwnedFd, SandboxError> {
        let err = |source| SandboxError::Seccomp {
            id: id.to_owned(),
            source,
        };
        let (reader, mut writer) = io::pipe().map_err(err)?;
        // Under a kilobyte: far below the pipe's buffer, so this never blocks.
        writer.write_all(&self.seccomp).map_err(err)?;
        drop(writer);
        Ok(OwnedFd::from(reader))
    }

    /// Makes `dir` owned by the sandbox uid/gid, so a writable mount of it is writable
    /// inside (for example the directory of the instance socket, or a build's output).
    /// Not recursive. A no-op when not root, where the sandbox runs as the server user.
    /// The uid and gid sandboxed programs run as, when the server is root (else they
    /// run as the server's own user).
    pub fn program_owner(&self) -> Option<(u32, u32)> {
        match &self.privilege {
            Privilege::Root { uid, gid, .. } => Some((*uid, *gid)),
            Privilege::Unprivileged => None,
        }
    }

    pub fn grant_write(&self, dir: &Path) -> Result<(), SandboxError> {
        match &self.privilege {
            Privilege::Root { uid, gid, .. } => {
                std::os::unix::fs::chown(dir, Some(*uid), Some(*gid)).map_err(|source| {
                    SandboxError::Chown {
                        path: dir.to_path_buf(),
                        source,
                    }
                })
            }
            Privilege::Unprivileged => Ok(()),
        }
    }

    fn create_cgroup(
        &self,
        hierarchy: &Hierarchy,
        spec: &ProcessSpec,
    ) -> Result<Arc<dyn Cgroup>, SandboxError> {
        let err = |path: PathBuf, source| SandboxError::Cgroup {
            id: spec.id.clone(),
            path,
            source,
        };
        let parent = || {
            hierarchy
                .parents(&self.cfg.cgroup_name)
                .into_iter()
                .next()
                .unwrap_or_default()
                .join(&spec.id)
        };
        let cgroup = hierarchy
            .create(&self.cfg.cgroup_name, &spec.id)
            .map_err(|source| err(parent(), source))?;
        let limits = (|| {
            if spec.memory_mb > 0 && hierarchy.memory() {
                cgroup.set_memory_limit(u64::from(spec.memory_mb) << 20)?;
            }
            if spec.max_pids > 0 && hierarchy.pids() {
                cgroup.set_pids_limit(spec.max_pids)?;
            }
            Ok(())
        })();
        if let Err(source) = limits {
            let _ = cgroup.remove();
            return Err(err(parent(), source));
        }
        Ok(cgroup)
    }

    /// Runs `/usr/bin/true` in a sandbox like the real ones, so a host where bwrap cannot
    /// work (no user namespaces, seccomp-restricted container) fails at start, not at the
    /// first invocation.
    fn probe(&self) -> Result<(), SandboxError> {
        let program = PathBuf::from("/usr/bin/true");
        if !program.is_file() {
            tracing::debug!("no /usr/bin/true; skipping the sandbox self-test");
            return Ok(());
        }
        let spec = ProcessSpec {
            id: "probe".to_owned(),
            program,
            args: Vec::new(),
            env: Vec::new(),
            mounts: Vec::new(),
            cwd: PathBuf::from("/"),
            memory_mb: 0,
            max_pids: 0,
            network: Network::None,
            ready_pipe: false,
            listen: None,
        };
        // The filter goes in as the real ones do: a bwrap that cannot load it fails here.
        let filter = self.seccomp_fd("probe")?;
        let mut command = std::process::Command::new(&self.cfg.bwrap);
        command
            .args(bwrap::build_args(&spec, &self.layout, &self.privilege))
            .env_clear()
            .stdin(std::process::Stdio::null());
        let _staged = process::pass_fd(&mut command, &filter, SECCOMP_FD).map_err(|source| {
            SandboxError::Seccomp {
                id: "probe".to_owned(),
                source,
            }
        })?;
        let output = command
            .output()
            .map_err(|source| SandboxError::BwrapUnavailable {
                path: self.cfg.bwrap.clone(),
                source,
            })?;
        if output.status.success() {
            Ok(())
        } else {
            Err(SandboxError::BwrapBroken {
                path: self.cfg.bwrap.clone(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
    }

    #[cfg(test)]
    pub(crate) fn cgroup_parents(&self) -> Vec<PathBuf> {
        self.hierarchy
            .as_ref()
            .map(|h| h.parents(&self.cfg.cgroup_name))
            .unwrap_or_default()
    }
}

impl Drop for Sandbox {
    /// Removes the `<cgroup_name>` parent cgroups if no instance is left in them (the kernel
    /// refuses to remove a cgroup with children, so live instances are safe).
    fn drop(&mut self) {
        if let Some(hierarchy) = &self.hierarchy {
            for dir in hierarchy.parents(&self.cfg.cgroup_name) {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

fn check_bwrap_runs(bwrap: &Path) -> Result<(), SandboxError> {
    let unavailable = |source| SandboxError::BwrapUnavailable {
        path: bwrap.to_path_buf(),
        source,
    };
    let output = std::process::Command::new(bwrap)
        .arg("--version")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(unavailable)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(unavailable(io::Error::other(format!(
            "`--version` failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))))
    }
}

/// Binds and listens on `path`, replacing a stale socket there but no other kind of file.
fn listen(id: &str, path: &Path) -> Result<OwnedFd, SandboxError> {
    let err = |source| SandboxError::Listen {
        id: id.to_owned(),
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path).map_err(err)?,
        Ok(_) => {
            return Err(err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a socket",
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    Ok(OwnedFd::from(listener))
}
