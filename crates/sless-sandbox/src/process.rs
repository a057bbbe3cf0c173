//! Starting one sandboxed process (the `pre_exec` hook that joins its cgroup and arms the
//! parent-death signal), waiting for its exit and killing it.

use std::ffi::OsString;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread;
use std::time::Duration;

use tokio::net::unix::pipe;
use tokio::process::{ChildStderr, ChildStdout};

use crate::SandboxError;
use crate::cgroup::{self, Cgroup};

/// How long dropping a [`Child`] waits for its SIGKILLed processes to leave the cgroup
/// before giving up on removing it (the next start's `reap_stale` then removes it).
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The file descriptor the ready pipe is passed as (see the instance protocol).
const READY_FD: RawFd = 3;

/// Descriptors handed to the child are first moved at least this high in the parent, so
/// moving them to their final numbers (3, 4, ...) in the child never overwrites another.
const STAGING_FD_MIN: RawFd = 10;

/// A running sandboxed process.
///
/// Dropping it SIGKILLs whatever is left of the instance and removes its cgroup. That
/// blocks until the killed processes are gone (normally well under a millisecond after
/// `wait`, a few milliseconds otherwise; at most 2 s).
#[derive(Debug)]
pub struct Child {
    /// The program's stdout (a pipe).
    pub stdout: Option<ChildStdout>,
    /// The program's stderr (a pipe).
    pub stderr: Option<ChildStderr>,
    /// Read end of the pipe the program has as fd 3, when `ProcessSpec::ready_pipe` is set.
    /// bwrap keeps its own copy of fd 3 open, so EOF comes only when the whole sandbox has
    /// exited, not when the program closes it: read up to the newline.
    pub ready: Option<pipe::Receiver>,
    inner: tokio::process::Child,
    id: String,
    cgroup: Option<Arc<dyn Cgroup>>,
    killer: Killer,
    /// Closing it ends the instance's slirp4netns (outbound network only).
    pub(crate) net_exit: Option<OwnedFd>,
}

/// A handle that kills an instance, usable while another task owns the [`Child`] and
/// waits for it.
#[derive(Debug, Clone)]
pub struct Killer {
    target: Arc<KillTarget>,
}

#[derive(Debug)]
struct KillTarget {
    /// When present, every process of the instance is in it.
    cgroup: Option<Arc<dyn Cgroup>>,
    /// A pidfd for the bwrap process: signals through it can never hit a recycled pid.
    pidfd: Option<OwnedFd>,
    /// bwrap's pid, which is also its process group id (it calls `setsid` first).
    pgid: libc::pid_t,
    /// Set once bwrap has been reaped, after which its pgid may belong to someone else.
    reaped: AtomicBool,
}

impl Killer {
    /// Changes the memory limit of the running instance, e.g. when a pre-started
    /// generic instance is given a function with its own `memory_mb`. `Ok(false)`
    /// when there is no memory cgroup to change.
    pub fn set_memory_mb(&self, mb: u32) -> std::io::Result<bool> {
        match &self.target.cgroup {
            Some(cgroup) if mb > 0 => {
                cgroup.set_memory_limit(u64::from(mb) * 1024 * 1024)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Caps the instance's CPU time at `millicores` thousandths of a CPU. `Ok(false)`
    /// when there is no cpu cgroup to change.
    pub fn set_cpu_millicores(&self, millicores: u32) -> std::io::Result<bool> {
        match &self.target.cgroup {
            Some(cgroup) if millicores > 0 => cgroup.set_cpu_limit(millicores),
            _ => Ok(false),
        }
    }

    /// Freezes every process of the instance (nothing of it is scheduled until it is
    /// thawed) or thaws it. `Ok(false)` when there is no freezer.
    pub fn set_frozen(&self, frozen: bool) -> std::io::Result<bool> {
        match &self.target.cgroup {
            Some(cgroup) => cgroup.set_frozen(frozen),
            None => Ok(false),
        }
    }

    /// CPU time the instance's processes used so far, in nanoseconds (`None` without
    /// a cpu accounting cgroup).
    pub fn cpu_usage_ns(&self) -> Option<u64> {
        self.target.cgroup.as_ref()?.cpu_usage_ns()
    }

    /// SIGKILLs every process of the instance. Idempotent, and harmless after the exit.
    ///
    /// With a cgroup, that is every process in it. Without one, bwrap itself: its namespace
    /// init dies with it (`--die-with-parent`), and the kernel kills the rest of a pid
    /// namespace when its init dies.
    pub fn kill(&self) {
        let target = &self.target;
        if let Some(cgroup) = &target.cgroup {
            cgroup.kill_all();
        }
        if let Some(pidfd) = &target.pidfd {
            // SAFETY: pidfd_send_signal takes a descriptor we own (open for the life of
            // `target`), a signal number and a null siginfo; it touches no memory of ours.
            // ESRCH after the exit is expected and ignored.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
        } else if target.cgroup.is_none()
            && target.pgid > 0
            && !target.reaped.load(Ordering::SeqCst)
        {
            // Kernels before 5.3 have no pidfds. Until we reap bwrap its pid (and so its
            // process group id) cannot be reused, so the group is still ours. (A kill racing
            // the reap itself could in theory hit a recycled group; pidfds close that gap.)
            // SAFETY: plain integer arguments; a negative pid addresses bwrap's group.
            unsafe {
                libc::kill(-target.pgid, libc::SIGKILL);
            }
        }
    }
}

/// How a sandboxed process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// Exit status, when it exited by itself.
    pub code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// Killed by the kernel for exceeding its memory limit.
    pub oom_killed: bool,
}

impl Exit {
    /// Exited with status 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.oom_killed {
            f.write_str("OOMKilled: exceeded its memory limit")
        } else if let Some(signal) = self.signal {
            write!(f, "killed by signal {signal}")
        } else if let Some(code) = self.code {
            write!(f, "exited with status {code}")
        } else {
            f.write_str("exited with unknown status")
        }
    }
}

/// Builds an [`Exit`] from bwrap's wait status and the cgroup's OOM counter.
///
/// bwrap reports a program killed by signal N as exit status 128+N (as shells do), so such
/// statuses are read back as the signal. A program that itself calls `exit(137)` is
/// therefore reported as killed by signal 9: the convention is the price of the sandbox.
/// The OOM killer uses SIGKILL, so only a SIGKILL death with the counter raised counts as
/// an OOM kill (a worker subprocess OOM-killed earlier does not mislabel a later exit).
pub(crate) fn exit_from_status(code: Option<i32>, signal: Option<i32>, oom_kills: u64) -> Exit {
    let (code, signal) = match (code, signal) {
        (Some(c), None) if (129..=128 + 64).contains(&c) => (None, Some(c - 128)),
        other => other,
    };
    Exit {
        code,
        signal,
        oom_killed: oom_kills > 0 && signal == Some(libc::SIGKILL),
    }
}

impl Child {
    /// bwrap's pid on the host, until it has been waited for.
    pub fn pid(&self) -> Option<u32> {
        self.inner.id()
    }

    /// The [`ProcessSpec::id`](crate::ProcessSpec::id) it was started with.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A handle to kill the instance from another task.
    pub fn killer(&self) -> Killer {
        self.killer.clone()
    }

    /// Waits for the process to exit (cancel-safe), then reads its cgroup's OOM counter.
    pub async fn wait(&mut self) -> Exit {
        let status = self.inner.wait().await;
        self.killer.target.reaped.store(true, Ordering::SeqCst);
        let oom_kills = self.cgroup.as_ref().map_or(0, |c| c.oom_kills());
        match status {
            Ok(status) => exit_from_status(status.code(), status.signal(), oom_kills),
            Err(err) => {
                tracing::warn!(id = %self.id, %err, "cannot wait for sandboxed process");
                Exit {
                    code: None,
                    signal: None,
                    oom_killed: oom_kills > 0,
                }
            }
        }
    }

    /// The cgroup directories, for tests.
    #[cfg(test)]
    pub(crate) fn cgroup_dirs(&self) -> Vec<std::path::PathBuf> {
        self.cgroup.as_ref().map(|c| c.dirs()).unwrap_or_default()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.killer.kill();
        if let Some(cgroup) = &self.cgroup
            && let Err(err) = cgroup::kill_and_remove(cgroup.as_ref(), DRAIN_TIMEOUT)
        {
            tracing::warn!(id = %self.id, %err, "cannot remove the instance cgroup");
        }
    }
}

/// What [`spawn`] starts.
pub(crate) struct Launch<'a> {
    pub(crate) bwrap: &'a Path,
    pub(crate) argv: Vec<OsString>,
    /// bwrap's environment, which it hands on to the program (never its argv: that is
    /// readable by every user of the host in `/proc/<pid>/cmdline`, and bounded).
    pub(crate) env: &'a [(String, String)],
    pub(crate) id: &'a str,
    pub(crate) ready_pipe: bool,
    /// Further descriptors bwrap inherits, each as the given number.
    pub(crate) fds: Vec<(OwnedFd, RawFd)>,
    pub(crate) cgroup: Option<Arc<dyn Cgroup>>,
}

/// Starts bwrap as `launch` says, inside its cgroup when given.
pub(crate) fn spawn(
    handle: tokio::runtime::Handle,
    launch: Launch<'_>,
) -> Result<Child, SandboxError> {
    let Launch {
        bwrap,
        argv,
        env,
        id,
        ready_pipe,
        fds,
        cgroup,
    } = launch;
    let spawn_err = |source: io::Error| SandboxError::Spawn {
        id: id.to_owned(),
        source,
    };

    // Opened here, because opening files is not async-signal-safe and so not allowed
    // between fork and exec. They are close-on-exec, so bwrap does not inherit them.
    let join: Vec<File> = match &cgroup {
        Some(cgroup) => cgroup
            .join_files()
            .iter()
            .map(|path| {
                OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|err| SandboxError::Cgroup {
                        id: id.to_owned(),
                        path: path.clone(),
                        source: err,
                    })
            })
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let join_fds: Vec<RawFd> = join.iter().map(AsRawFd::as_raw_fd).collect();

    let (ready, ready_writer) = if ready_pipe {
        let pipe_err = |source| SandboxError::ReadyPipe {
            id: id.to_owned(),
            source,
        };
        let (reader, writer) = io::pipe().map_err(pipe_err)?;
        let receiver = pipe::Receiver::from_owned_fd(OwnedFd::from(reader)).map_err(pipe_err)?;
        (Some(receiver), Some(writer))
    } else {
        (None, None)
    };
    let mut inherit: Vec<(OwnedFd, RawFd)> = fds;
    if let Some(writer) = ready_writer {
        inherit.push((OwnedFd::from(writer), READY_FD));
    }
    let inherit: Vec<(OwnedFd, RawFd)> = inherit
        .into_iter()
        .map(|(fd, target)| Ok((staged(&fd)?, target)))
        .collect::<io::Result<_>>()
        .map_err(spawn_err)?;
    let moves: Vec<(RawFd, RawFd)> = inherit
        .iter()
        .map(|(fd, target)| (fd.as_raw_fd(), *target))
        .collect();
    let parent = std::process::id() as libc::pid_t;

    let mut cmd = tokio::process::Command::new(bwrap);
    cmd.args(argv)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    // SAFETY: the hook runs in the forked child, where only async-signal-safe calls are
    // allowed: it makes raw write/prctl/getppid/setsid/fcntl/dup2 calls on descriptors the
    // parent keeps open until `spawn` returns, reads captured integers and allocates nothing
    // (`io::Error::last_os_error` only wraps an errno).
    unsafe {
        cmd.pre_exec(move || child_setup(&join_fds, &moves, parent));
    }

    let child = on_spawner_thread(move || {
        // Registers the child with the caller's runtime (SIGCHLD or pidfd reaping) although
        // the fork happens on the spawner thread.
        let _runtime = handle.enter();
        cmd.spawn()
    })
    .and_then(|r| r)
    .map_err(spawn_err)?;
    // The child has its copies now; ours would only keep the ready pipe from reporting EOF
    // when the program closes fd 3.
    drop(join);
    drop(inherit);
    let mut child = child;

    let pgid = child
        .id()
        .and_then(|pid| libc::pid_t::try_from(pid).ok())
        .unwrap_or(0);
    let killer = Killer {
        target: Arc::new(KillTarget {
            cgroup: cgroup.clone(),
            pidfd: pidfd_open(pgid),
            pgid,
            reaped: AtomicBool::new(false),
        }),
    };
    Ok(Child {
        stdout: child.stdout.take(),
        stderr: child.stderr.take(),
        ready,
        inner: child,
        id: id.to_owned(),
        cgroup,
        killer,
        net_exit: None,
    })
}

/// Makes a blocking `Command` (the start-up probe) pass `fd` to its child as `target`.
/// The returned descriptor must stay open until the command has been spawned.
pub(crate) fn pass_fd(
    cmd: &mut std::process::Command,
    fd: &OwnedFd,
    target: RawFd,
) -> io::Result<OwnedFd> {
    use std::os::unix::process::CommandExt;
    let staged = staged(fd)?;
    let moves = [(staged.as_raw_fd(), target)];
    // SAFETY: the hook only makes fcntl/close_range/dup2 calls (async-signal-safe) on a descriptor the
    // caller keeps open until the spawn, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            cloexec_from(3)?;
            if libc::dup2(moves[0].0, moves[0].1) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(staged)
}

/// A close-on-exec duplicate of `fd` numbered at least [`STAGING_FD_MIN`].
fn staged(fd: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl on a descriptor we own; F_DUPFD_CLOEXEC returns a new one or -1.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, STAGING_FD_MIN) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// Runs in the forked child before exec. Async-signal-safe calls only (see `spawn`).
/// `moves` are (staged descriptor, number the child gets it as); every staged one is at
/// least [`STAGING_FD_MIN`] and every target below, so no move overwrites another's source.
fn child_setup(
    join_fds: &[RawFd],
    moves: &[(RawFd, RawFd)],
    parent: libc::pid_t,
) -> io::Result<()> {
    // Joining before exec means bwrap and everything it starts are accounted and limited
    // from the first instruction; nothing can fork outside the cgroup.
    for &fd in join_fds {
        // SAFETY: writes one byte from a static buffer to an open descriptor.
        if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
            return Err(io::Error::last_os_error());
        }
    }
    // If the server dies, even by SIGKILL, bwrap gets SIGKILL and takes the namespace down.
    // SAFETY: prctl with integer arguments.
    if unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // The server may have died between fork and prctl; then nobody will ever send the
    // signal, so give up now.
    // SAFETY: getppid has no arguments and cannot fail.
    if unsafe { libc::getppid() } != parent {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // Own session and process group: the server's terminal signals do not reach the
    // instance, and without cgroups the group is what `Killer` signals.
    // SAFETY: setsid has no arguments.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    cloexec_from(3)?;
    for &(fd, target) in moves {
        // SAFETY: dup2 between two descriptor numbers; the new one is not close-on-exec
        // (the staged source is, and goes away at exec).
        if unsafe { libc::dup2(fd, target) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Marks every descriptor from `first` up close-on-exec, so bwrap (and so the program)
/// gets only the ones moved into place afterwards: nothing the server inherited from its
/// own parent without close-on-exec leaks into a sandbox. Marking rather than closing
/// keeps the standard library's exec-error pipe working. Async-signal-safe.
fn cloexec_from(first: RawFd) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range with integer arguments (Linux 5.11 for the CLOEXEC flag).
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    // Older kernels: one fcntl per possible descriptor, up to the soft limit.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let last = RawFd::try_from(limit.rlim_cur.min(1 << 20)).unwrap_or(RawFd::MAX);
    for fd in first..last {
        // SAFETY: fcntl with integer arguments; EBADF for unused numbers is ignored.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    Ok(())
}

/// Most descriptors [`map_fds`] moves at once.
pub(crate) const MAX_MAPPED_FDS: usize = 4;

/// Makes each `(from, to)` descriptor available as `to` in the program about to be
/// executed (not close-on-exec). Async-signal-safe: fcntl and dup2 only, no allocation.
///
/// Every `from` is first copied to 64 or above (every target is lower), so moving one onto
/// a number another still occupies cannot clobber it.
pub(crate) fn map_fds(fds: &[(RawFd, RawFd)]) -> io::Result<()> {
    if fds.len() > MAX_MAPPED_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut moved = [-1; MAX_MAPPED_FDS];
    for (slot, &(from, _)) in moved.iter_mut().zip(fds) {
        // SAFETY: fcntl on an open descriptor with integer arguments; the copy is
        // close-on-exec, so it does not leak into the program.
        let copy = unsafe { libc::fcntl(from, libc::F_DUPFD_CLOEXEC, 64) };
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        *slot = copy;
    }
    for (&copy, &(_, to)) in moved.iter().zip(fds) {
        // SAFETY: dup2 between two descriptor numbers; the new `to` is not close-on-exec.
        if unsafe { libc::dup2(copy, to) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Opens a pidfd for `pid`, a child not yet reaped (so `pid` is certainly it).
fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    if pid <= 0 {
        return None;
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

type Job = Box<dyn FnOnce() + Send>;

/// The queue of the spawner thread, started on first use and never stopped.
static SPAWNER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);

/// Runs `f` on the one long-lived spawner thread and returns its result.
///
/// The parent-death signal fires when the *thread* that forked the child exits, not the
/// process. Runtime threads come and go (the blocking pool retires idle threads after
/// seconds; `block_in_place` hands a worker's role to a new thread), so forking from the
/// caller's thread would eventually SIGKILL healthy instances. This thread lives as long
/// as the server.
fn on_spawner_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    let sender = {
        let mut slot = SPAWNER.lock().unwrap_or_else(PoisonError::into_inner);
        match slot.as_ref() {
            Some(sender) => sender.clone(),
            None => {
                let (sender, jobs) = mpsc::channel::<Job>();
                thread::Builder::new()
                    .name("sless-spawner".into())
                    .spawn(move || {
                        for job in jobs {
                            // A panicking job must not end this thread: that would kill
                            // every instance it ever started.
                            let _ = panic::catch_unwind(AssertUnwindSafe(job));
                        }
                    })?;
                *slot = Some(sender.clone());
                sender
            }
        }
    };
    let (result_tx, result_rx) = mpsc::sync_channel(1);
    sender
        .send(Box::new(move || {
            let _ = result_tx.send(f());
        }))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    result_rx
        .recv()
        .map_err(|_| io::Error::other("the spawner thread dropped the job"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_reads_folded_signals_back() {
        assert_eq!(
            exit_from_status(Some(1), None, 0),
            Exit {
                code: Some(1),
                signal: None,
                oom_killed: false
            }
        );
        assert_eq!(
            exit_from_status(Some(137), None, 0),
            Exit {
                code: None,
                signal: Some(9),
                oom_killed: false
            }
        );
        assert_eq!(exit_from_status(Some(128), None, 0).code, Some(128));
        assert_eq!(exit_from_status(Some(200), None, 0).code, Some(200));
        assert_eq!(exit_from_status(None, Some(15), 0).signal, Some(15));
    }

    #[test]
    fn oom_needs_sigkill_and_the_counter() {
        assert!(exit_from_status(Some(137), None, 1).oom_killed);
        assert!(exit_from_status(None, Some(9), 2).oom_killed);
        assert!(!exit_from_status(Some(1), None, 1).oom_killed);
        assert!(!exit_from_status(Some(137), None, 0).oom_killed);
    }

    #[test]
    fn exit_display() {
        let exit = |code, signal, oom_killed| Exit {
            code,
            signal,
            oom_killed,
        };
        assert_eq!(
            exit(Some(1), None, false).to_string(),
            "exited with status 1"
        );
        assert_eq!(exit(None, Some(9), false).to_string(), "killed by signal 9");
        assert_eq!(
            exit(None, Some(9), true).to_string(),
            "OOMKilled: exceeded its memory limit"
        );
        assert_eq!(
            exit(None, None, false).to_string(),
            "exited with unknown status"
        );
        assert!(exit(Some(0), None, false).success());
        assert!(!exit(None, Some(9), false).success());
    }

    #[test]
    fn spawner_thread_runs_jobs_and_survives_panics() {
        let name = on_spawner_thread(|| thread::current().name().map(str::to_owned));
        assert_eq!(name.expect("job ran").as_deref(), Some("sless-spawner"));
        let first = on_spawner_thread(|| thread::current().id()).expect("job ran");
        assert!(on_spawner_thread::<()>(|| panic!("job panics")).is_err());
        let after = on_spawner_thread(|| thread::current().id()).expect("job ran");
        assert_eq!(first, after, "one thread, still alive after a panic");
    }
}
