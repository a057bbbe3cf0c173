//! Tests that start real sandboxes on this host (root: cgroups and the uid switch; not
//! root: the user-namespace mode, where limits are checked to be reported as missing).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use super::*;

const PYTHON: &str = "/usr/bin/python3";

fn is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A sandbox with a cgroup parent of its own, so tests running in parallel (and a real
/// server on this host) never see each other's instances. Removes the parent when done.
struct TestSandbox(Sandbox, Vec<PathBuf>);

impl TestSandbox {
    fn new(tag: &str) -> TestSandbox {
        let cfg = SandboxConfig {
            cgroup_name: format!("sless-test-{}-{tag}", std::process::id()),
            ..SandboxConfig::default()
        };
        let sandbox = Sandbox::new(cfg).expect("sandbox");
        let parents = sandbox.cgroup_parents();
        TestSandbox(sandbox, parents)
    }
}

impl std::ops::Deref for TestSandbox {
    type Target = Sandbox;
    fn deref(&self) -> &Sandbox {
        &self.0
    }
}

impl Drop for TestSandbox {
    fn drop(&mut self) {
        // Best effort: a parent shared by a test still running stays.
        for dir in &self.1 {
            let _ = fs::remove_dir(dir);
        }
    }
}

fn python(id: &str, script: &str) -> ProcessSpec {
    ProcessSpec {
        id: id.to_owned(),
        program: PYTHON.into(),
        args: vec!["-c".to_owned(), script.to_owned()],
        env: vec![("PATH".to_owned(), "/usr/bin".to_owned())],
        mounts: Vec::new(),
        cwd: "/".into(),
        memory_mb: 256,
        max_pids: 64,
        network: Network::Host,
        ready_pipe: false,
        listen: None,
    }
}

/// Runs the child to its end, collecting stdout and stderr.
async fn finish(child: &mut Child) -> (Exit, String, String) {
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (r1, r2, exit) = tokio::join!(
        stdout.read_to_end(&mut out),
        stderr.read_to_end(&mut err),
        child.wait()
    );
    r1.expect("read stdout");
    r2.expect("read stderr");
    (
        exit,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// Reads the ready pipe up to the first newline (bwrap keeps its own copy of fd 3 open,
/// so EOF only comes when the whole sandbox is gone).
async fn read_ready(child: &mut Child) -> String {
    let ready = child.ready.as_mut().expect("ready pipe");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") {
        let n = ready.read(&mut byte).await.expect("read ready pipe");
        if n == 0 {
            break;
        }
        line.push(byte[0]);
    }
    String::from_utf8_lossy(&line).into_owned()
}

/// The host pids below `pid`, from the ppid field of `/proc/*/stat`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for entry in fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces, so split after the last `)`.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parents.entry(ppid).or_default().push(child);
        }
    }
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        for &c in parents.get(&p).map(Vec::as_slice).unwrap_or_default() {
            found.push(c);
            queue.push(c);
        }
    }
    found
}

/// A process is gone once `/proc/<pid>` is, or it is a zombie nobody has reaped yet.
fn is_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Polls `cond` until it holds or `limit` passes. For conditions the kernel settles on
/// its own (a SIGKILLed process finishing its exit); nothing here waits on a guess.
fn eventually(limit: Duration, cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !cond() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

fn dir_with_mode(mode: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(mode)).expect("chmod");
    dir
}

const ISOLATION_SCRIPT: &str = r#"
import json, os
def attempt(f):
    try:
        return f()
    except OSError as e:
        return "errno:%d" % e.errno
status = open("/proc/self/status").read()
r = {
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "pid": os.getpid(),
    "env": dict(os.environ), "cwd": os.getcwd(),
    "ro_read": attempt(lambda: open("/data/data.txt").read()),
    "ro_write": attempt(lambda: open("/data/new.txt", "w").write("x")),
    "private": attempt(lambda: open("/data/private/secret.txt").read()),
    "hidden_exists": os.path.exists(os.environ["HIDDEN"]),
    "tmp": attempt(lambda: (open("/tmp/x", "w").write("abc"), open("/tmp/x").read())[1]),
    "shm": attempt(lambda: open("/dev/shm/x", "w").write("abc")),
    "out": attempt(lambda: open("/out/written", "w").write("ok")),
    "root_home": os.path.exists("/root"),
    "shadow": os.path.exists("/etc/shadow"),
    "caps": {l.split(":")[0]: l.split(":")[1].strip() for l in status.splitlines()
             if l.startswith(("CapEff", "CapPrm", "NoNewPrivs"))},
}
print(json.dumps(r))
"#;

#[tokio::test]
async fn runs_unprivileged_and_isolated() {
    let sandbox = TestSandbox::new("iso");
    let caps = sandbox.capabilities();
    assert_eq!(caps.drops_privileges, is_root());

    // World-writable, so only the read-only mount can refuse the write below.
    let public = dir_with_mode(0o777);
    fs::write(public.path().join("data.txt"), "hello").expect("write");
    fs::set_permissions(
        public.path().join("data.txt"),
        fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");
    let private = public.path().join("private");
    fs::create_dir(&private).expect("mkdir");
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).expect("chmod");
    fs::write(private.join("secret.txt"), "secret").expect("write");
    // A 0700 directory with a secret that is not mounted at all.
    let hidden = dir_with_mode(0o700);
    fs::write(hidden.path().join("secret.txt"), "secret").expect("write");
    let out = dir_with_mode(0o700);
    sandbox.grant_write(out.path()).expect("grant_write");

    let mut spec = python("iso", ISOLATION_SCRIPT);
    spec.env
        .push(("HIDDEN".to_owned(), hidden.path().display().to_string()));
    spec.env
        .push(("GREETING".to_owned(), "hi there".to_owned()));
    spec.mounts = vec![
        Mount {
            source: public.path().to_path_buf(),
            target: "/data".into(),
            writable: false,
        },
        Mount {
            source: out.path().to_path_buf(),
            target: "/out".into(),
            writable: true,
        },
    ];
    spec.cwd = "/data".into();
    let mut child = sandbox.spawn(&spec).expect("spawn");
    let (exit, stdout, stderr) = finish(&mut child).await;
    assert!(exit.success(), "{exit}: {stderr}");
    let r: serde_json::Value = serde_json::from_str(&stdout).expect("json");

    if caps.drops_privileges {
        assert_eq!(r["uid"], 65534);
        assert_eq!(r["gid"], 65534);
        assert_eq!(r["groups"], serde_json::json!([]));
        assert_eq!(r["caps"]["CapEff"], "0000000000000000");
        assert_eq!(r["caps"]["CapPrm"], "0000000000000000");
        assert_eq!(r["caps"]["NoNewPrivs"], "1");
        // Mounted, but the directory is 0700 root: the uid switch keeps it closed.
        assert_eq!(r["private"], "errno:13");
    }
    // bwrap's init is pid 1 of the new pid namespace.
    assert!(
        r["pid"].as_u64().is_some_and(|p| p < 10),
        "pid {}",
        r["pid"]
    );
    assert_eq!(r["cwd"], "/data");
    assert_eq!(r["ro_read"], "hello");
    assert_eq!(r["ro_write"], format!("errno:{}", libc::EROFS));
    assert_eq!(r["hidden_exists"], false);
    assert_eq!(r["tmp"], "abc");
    assert_eq!(r["shm"], 3);
    assert_eq!(r["out"], 2);
    assert_eq!(
        fs::read_to_string(out.path().join("written")).expect("written through the mount"),
        "ok"
    );
    if caps.drops_privileges {
        let owner = fs::metadata(out.path().join("written"))
            .expect("meta")
            .uid();
        assert_eq!(owner, 65534);
    }
    assert_eq!(r["root_home"], false);
    assert_eq!(r["shadow"], false);

    // Exactly the given environment, plus what bwrap (PWD) and Python's C-locale
    // coercion (LC_CTYPE) set themselves; nothing of the server's.
    let mut env: BTreeMap<String, String> =
        serde_json::from_value(r["env"].clone()).expect("env map");
    assert_eq!(env.remove("PWD").as_deref(), Some("/data"));
    env.remove("LC_CTYPE");
    let expected: BTreeMap<String, String> = spec.env.iter().cloned().collect();
    assert_eq!(env, expected);
    assert!(std::env::vars().any(|(k, _)| !expected.contains_key(&k)));
}

#[tokio::test]
async fn ready_pipe_is_fd_3() {
    let sandbox = TestSandbox::new("ready");
    let mut spec = python(
        "ready",
        "import os, sys\nos.write(3, b'ready\\n')\nos.close(3)\nprint('after')",
    );
    spec.ready_pipe = true;
    let mut child = sandbox.spawn(&spec).expect("spawn");
    assert_eq!(read_ready(&mut child).await, "ready\n");
    let (exit, stdout, stderr) = finish(&mut child).await;
    assert!(exit.success(), "{exit}: {stderr}");
    assert_eq!(stdout, "after\n");

    // Without `ready_pipe` there is no fd 3 inside.
    let spec = python("no-ready", "import os\nos.fstat(3)");
    let mut child = sandbox.spawn(&spec).expect("spawn");
    assert!(child.ready.is_none());
    let (exit, _, stderr) = finish(&mut child).await;
    assert_eq!(exit.code, Some(1), "{stderr}");
    assert!(stderr.contains("Bad file descriptor"), "{stderr}");
}

#[tokio::test]
async fn memory_limit_ends_in_oom_kill() {
    let sandbox = TestSandbox::new("oom");
    let mut spec = python("oom", "x = b'a' * (200 << 20)\nprint('survived', len(x))");
    spec.memory_mb = 64;
    let mut child = sandbox.spawn(&spec).expect("spawn");
    let (exit, stdout, stderr) = finish(&mut child).await;
    if !sandbox.capabilities().memory_limit {
        assert!(
            !is_root(),
            "root must be able to enforce memory limits here"
        );
        return;
    }
    assert_eq!(
        exit,
        Exit {
            code: None,
            signal: Some(libc::SIGKILL),
            oom_killed: true
        },
        "stdout {stdout:?} stderr {stderr:?}"
    );
    assert_eq!(exit.to_string(), "OOMKilled: exceeded its memory limit");
    assert!(stdout.is_empty());
}

#[tokio::test]
async fn pids_limit_stops_forks() {
    let sandbox = TestSandbox::new("pids");
    let script = r#"
import subprocess
procs, err = [], None
for _ in range(50):
    try:
        procs.append(subprocess.Popen(["/usr/bin/sleep", "60"]))
    except OSError as e:
        err = e.errno
        break
print(len(procs), err)
"#;
    let mut spec = python("pids", script);
    spec.max_pids = 16;
    let mut child = sandbox.spawn(&spec).expect("spawn");
    let (exit, stdout, stderr) = finish(&mut child).await;
    assert!(exit.success(), "{exit}: {stderr}");
    let mut fields = stdout.split_whitespace();
    let started: usize = fields.next().and_then(|n| n.parse().ok()).expect("count");
    let err = fields.next().expect("errno");
    if !sandbox.capabilities().pids_limit {
        assert!(
            !is_root(),
            "root must be able to enforce process limits here"
        );
        assert_eq!((started, err), (50, "None"));
        return;
    }
    // bwrap, its init and python take 3 of the 16.
    assert!(started <= 13, "{started} sleeps started under max_pids 16");
    assert_eq!(err, libc::EAGAIN.to_string());
}

const STUBBORN_SCRIPT: &str = r#"
import os, signal, subprocess
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["/usr/bin/python3", "-c",
    "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('x', flush=True)\ntime.sleep(600)"],
    stdout=subprocess.PIPE)
child.stdout.readline()
os.write(3, b"ready\n")
child.wait()
"#;

/// Killer ends a program that ignores SIGTERM, and its child; `mode` picks the cgroup
/// path or (as without root) the pidfd/process-group path.
async fn killer_ends_everything(tag: &str, with_cgroup: bool) {
    let mut sandbox = TestSandbox::new(tag);
    if !with_cgroup {
        sandbox.0.hierarchy = None;
    }
    let mut spec = python(tag, STUBBORN_SCRIPT);
    spec.ready_pipe = true;
    let mut child = sandbox.spawn(&spec).expect("spawn");
    assert_eq!(read_ready(&mut child).await, "ready\n");
    let bwrap = child.pid().expect("pid");
    let tree = descendants(bwrap);
    // bwrap's init, python (after setpriv's exec) and the child python.
    assert!(tree.len() >= 3, "{tree:?}");
    let cgroup_dirs = child.cgroup_dirs();
    assert_eq!(
        !cgroup_dirs.is_empty(),
        with_cgroup && sandbox.capabilities().cgroup.is_some()
    );

    let killer = child.killer();
    let waiter = tokio::spawn(async move {
        let exit = child.wait().await;
        (exit, child)
    });
    killer.kill();
    killer.kill(); // idempotent
    let (exit, child) = waiter.await.expect("join");
    assert_eq!(exit.signal, Some(libc::SIGKILL), "{exit}");
    assert!(!exit.oom_killed);
    assert!(
        eventually(Duration::from_secs(5), || tree.iter().all(|&p| is_gone(p))),
        "still running: {:?}",
        tree.iter().filter(|&&p| !is_gone(p)).collect::<Vec<_>>()
    );
    for dir in &cgroup_dirs {
        assert!(dir.is_dir(), "the cgroup stays until the Child is dropped");
    }
    drop(child);
    for dir in &cgroup_dirs {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    killer.kill(); // after the drop: still harmless
}

#[tokio::test]
async fn killer_ends_program_and_children_via_cgroup() {
    killer_ends_everything("kill-cg", true).await;
}

#[tokio::test]
async fn killer_ends_program_and_children_without_cgroup() {
    killer_ends_everything("kill-nocg", false).await;
}

#[tokio::test]
async fn drop_without_wait_kills_and_removes_cgroup() {
    let sandbox = TestSandbox::new("drop");
    let mut spec = python(
        "drop",
        "import os, time\nos.write(3, b'ready\\n')\ntime.sleep(600)",
    );
    spec.ready_pipe = true;
    let mut child = sandbox.spawn(&spec).expect("spawn");
    assert_eq!(read_ready(&mut child).await, "ready\n");
    let tree = descendants(child.pid().expect("pid"));
    let dirs = child.cgroup_dirs();
    assert_eq!(dirs.is_empty(), sandbox.capabilities().cgroup.is_none());
    drop(child);
    for dir in &dirs {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    assert!(eventually(Duration::from_secs(5), || tree
        .iter()
        .all(|&p| is_gone(p))));
}

#[tokio::test]
async fn reap_stale_kills_what_a_crashed_run_left() {
    let first = TestSandbox::new("reap");
    let mut spec = python(
        "stale",
        "import os, time\nos.write(3, b'ready\\n')\ntime.sleep(600)",
    );
    spec.ready_pipe = true;
    let mut child = first.spawn(&spec).expect("spawn");
    assert_eq!(read_ready(&mut child).await, "ready\n");
    let pid = child.pid().expect("pid");
    let dirs = child.cgroup_dirs();
    // What a SIGKILLed server leaves: no Drop ran, the cgroup and its processes remain.
    std::mem::forget(child);

    // The crashed run's Sandbox is gone too; its parent cgroup stays, as it is not empty.
    drop(first);
    for dir in &dirs {
        assert!(dir.is_dir());
    }
    let second = TestSandbox::new("reap");
    let killed = second.reap_stale();
    if second.capabilities().cgroup.is_none() {
        assert!(!is_root());
        assert_eq!(killed, 0);
        return;
    }
    // bwrap, its init and python.
    assert!(killed >= 3, "killed {killed}");
    for dir in &dirs {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    let mut status = 0;
    // SAFETY: waitpid on our own (leaked, never reaped) child with a valid status pointer.
    let reaped = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
    assert_eq!(reaped, pid as libc::pid_t);
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL);
    assert_eq!(second.reap_stale(), 0, "nothing left the second time");
}

#[tokio::test]
async fn instance_outlives_the_thread_that_spawned_it() {
    let sandbox = TestSandbox::new("thread");
    let gate = dir_with_mode(0o755);
    let script = "import os, time\nos.write(3, b'ready\\n')\n\
                  while not os.path.exists('/gate/go'):\n    time.sleep(0.01)\nprint('done')";
    let mut spec = python("thread", script);
    spec.ready_pipe = true;
    spec.mounts.push(Mount {
        source: gate.path().to_path_buf(),
        target: "/gate".into(),
        writable: false,
    });
    let handle = tokio::runtime::Handle::current();
    let (child, tid) = std::thread::scope(|s| {
        s.spawn(|| {
            let _runtime = handle.enter();
            // SAFETY: gettid has no arguments and cannot fail.
            let tid = unsafe { libc::gettid() };
            (sandbox.spawn(&spec), tid)
        })
        .join()
        .expect("thread")
    });
    let mut child = child.expect("spawn");
    // Once the task is gone from /proc the kernel has finished the thread's exit,
    // including any parent-death signal it would send.
    let task = PathBuf::from(format!("/proc/self/task/{tid}"));
    assert!(eventually(Duration::from_secs(5), || !task.exists()));
    assert_eq!(read_ready(&mut child).await, "ready\n");
    fs::write(gate.path().join("go"), "").expect("open the gate");
    let (exit, stdout, stderr) = finish(&mut child).await;
    assert!(exit.success(), "{exit}: {stderr}");
    assert_eq!(stdout, "done\n");
}

#[tokio::test]
async fn bad_specs_fail_before_anything_starts() {
    let sandbox = TestSandbox::new("bad");
    let mut spec = python("../escape", "pass");
    let err = sandbox.spawn(&spec).expect_err("bad id");
    assert!(matches!(err, SandboxError::InvalidSpec { .. }), "{err}");
    spec.id = "missing-program".into();
    spec.program = "/usr/bin/does-not-exist".into();
    let mut child = sandbox
        .spawn(&spec)
        .expect("bwrap starts; the exec inside fails");
    let (exit, _, stderr) = finish(&mut child).await;
    assert!(!exit.success());
    assert!(stderr.contains("does-not-exist"), "{stderr}");
    let dirs = child.cgroup_dirs();
    drop(child);
    for dir in dirs {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}

#[test]
fn spawn_outside_a_runtime_is_an_error() {
    let sandbox = TestSandbox::new("nort");
    let err = sandbox
        .spawn(&python("nort", "pass"))
        .expect_err("no runtime");
    assert!(matches!(err, SandboxError::NoRuntime), "{err}");
    // Refused before any cgroup was made for it.
    for dir in sandbox.cgroup_parents() {
        assert!(!dir.join("nort").exists());
    }
}

#[test]
fn config_is_checked() {
    let bad_name = SandboxConfig {
        cgroup_name: "a/b".into(),
        ..SandboxConfig::default()
    };
    assert!(matches!(
        Sandbox::new(bad_name),
        Err(SandboxError::InvalidConfig(_))
    ));
    let no_bwrap = SandboxConfig {
        bwrap: "/nonexistent/bwrap".into(),
        ..SandboxConfig::default()
    };
    assert!(matches!(
        Sandbox::new(no_bwrap),
        Err(SandboxError::BwrapUnavailable { .. })
    ));
    if is_root() {
        let as_root = SandboxConfig {
            uid: 0,
            ..SandboxConfig::default()
        };
        assert!(matches!(
            Sandbox::new(as_root),
            Err(SandboxError::InvalidConfig(_))
        ));
    }
}

#[tokio::test]
async fn dropping_one_sandbox_does_not_break_another_of_the_same_name() {
    let first = TestSandbox::new("shared");
    let second = TestSandbox::new("shared");
    let parents = first.cgroup_parents();
    drop(first);
    for dir in &parents {
        assert!(
            !dir.exists(),
            "the empty parent {} is removed",
            dir.display()
        );
    }
    let mut child = second
        .spawn(&python("shared", "print('ok')"))
        .expect("spawn recreates the parent");
    assert_eq!(
        child.cgroup_dirs().is_empty(),
        second.capabilities().cgroup.is_none()
    );
    let (exit, stdout, stderr) = finish(&mut child).await;
    assert!(exit.success(), "{exit}: {stderr}");
    assert_eq!(stdout, "ok\n");
}

/// Tries what a kernel exploit starts with; prints `name errno` lines (0 when allowed).
const HOSTILE_SCRIPT: &str = r#"
import ctypes, os, subprocess, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(f, *args):
    r = f(*args)
    return 0 if r >= 0 else ctypes.get_errno()
def sys(nr, *args):
    return call(libc.syscall, ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
out = {
    "unshare_user": call(libc.unshare, 0x10000000),
    "unshare_mount": call(libc.unshare, 0x00020000),
    "ptrace_traceme": call(libc.ptrace, 0, 0, 0, 0),
    "keyctl": sys(250, 0, -3, 0),          # KEYCTL_GET_KEYRING_ID, the session keyring
    "io_uring_setup": sys(425, 1, ctypes.addressof(ctypes.create_string_buffer(120))),
    "personality_no_aslr": call(libc.personality, 0x0040000),
    "mount": call(libc.mount, b"none", b"/tmp", b"tmpfs", 0, None),
}
p = subprocess.run(["unshare", "-Ur", "true"], capture_output=True, text=True)
out["unshare_cmd"] = [p.returncode, p.stderr.strip()]
# Ordinary work still goes: threads, a child process, fork.
import threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
out["child"] = subprocess.run(["true"]).returncode
out["fds"] = sorted(int(f) for f in os.listdir("/proc/self/fd"))

print(json.dumps(out))
"#;

#[tokio::test]
async fn seccomp_refuses_namespaces_ptrace_and_kernel_interfaces() {
    // The numbers in the script are x86_64's.
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let sandbox = TestSandbox::new("seccomp");
    let mut child = sandbox
        .spawn(&python("seccomp", HOSTILE_SCRIPT))
        .expect("spawn");
    let (exit, stdout, stderr) = finish(&mut child).await;
    assert!(exit.success(), "{exit}: {stderr}");
    let r: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let (eperm, enosys) = (libc::EPERM, libc::ENOSYS);
    for (name, errno) in [
        ("unshare_user", eperm),
        ("unshare_mount", eperm),
        ("ptrace_traceme", eperm),
        ("keyctl", eperm),
        ("io_uring_setup", enosys),
        ("personality_no_aslr", eperm),
        ("mount", eperm),
    ] {
        assert_eq!(r[name], errno, "{name}: {r}");
    }
    assert_eq!(r["unshare_cmd"][0], 1, "{r}");
    assert!(
        r["unshare_cmd"][1]
            .as_str()
            .is_some_and(|e| e.contains("Operation not permitted")),
        "{r}"
    );
    assert_eq!(r["child"], 0);
    // bwrap closed the filter's descriptor, and nothing the server inherited from its own
    // parent leaks in: the program has its stdio and the listing's own descriptor.
    assert_eq!(r["fds"], serde_json::json!([0, 1, 2, 3]), "{r}");
}

#[tokio::test]
async fn environment_arrives_intact_and_off_the_command_line() {
    let sandbox = TestSandbox::new("env");
    let big = "v".repeat(100_000);
    let mut spec = python(
        "env",
        "import os, json\nprint(json.dumps({'big': len(os.environ['BIG']), 'odd': os.environ['ODD'], \
         'cmdline': 'v' * 64 in open('/proc/1/cmdline').read(), 'keys': sorted(os.environ)}))",
    );
    spec.env.push(("BIG".to_owned(), big));
    spec.env.push(("ODD".to_owned(), "a b\n'c\"=".to_owned()));
    let mut child = sandbox.spawn(&spec).expect("spawn");
    let (exit, stdout, stderr) = finish(&mut child).await;
    assert!(exit.success(), "{exit}: {stderr}");
    let r: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(r["big"], 100_000);
    assert_eq!(r["odd"], "a b\n'c\"=");
    // bwrap's argv, which the host shows to every user, does not carry the values.
    assert_eq!(r["cmdline"], false);
    // bwrap adds `PWD`, Python its `LC_CTYPE` coercion; nothing of the server gets in.
    assert_eq!(
        r["keys"],
        serde_json::json!(["BIG", "LC_CTYPE", "ODD", "PATH", "PWD"])
    );
}

#[tokio::test]
async fn listen_socket_is_created_outside_and_passed_as_fd_4() {
    use std::io::{Read, Write};
    let sandbox = TestSandbox::new("listen");
    let dir = dir_with_mode(0o700);
    let path = dir.path().join("fn.sock");
    // A stale socket from an earlier instance is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("stale"));
    let mut spec = python(
        "listen",
        "import socket\ns = socket.socket(fileno=4)\nc, _ = s.accept()\nc.sendall(c.recv(10)[::-1])",
    );
    spec.listen = Some(path.clone());
    let mut child = sandbox.spawn(&spec).expect("spawn");
    let mut conn = std::os::unix::net::UnixStream::connect(&path).expect("connect");
    conn.write_all(b"olleh").expect("write");
    let mut back = String::new();
    conn.read_to_string(&mut back).expect("read");
    assert_eq!(back, "hello");
    let (exit, _, stderr) = finish(&mut child).await;
    assert!(exit.success(), "{exit}: {stderr}");
    let meta = fs::symlink_metadata(&path).expect("socket stays");
    assert_eq!(meta.uid(), unsafe { libc::geteuid() });

    // Anything else at the path is left alone and the start fails.
    let file = dir.path().join("file");
    fs::write(&file, "keep").expect("write");
    spec.listen = Some(file.clone());
    assert!(matches!(
        sandbox.spawn(&spec),
        Err(SandboxError::Listen { .. })
    ));
    assert_eq!(fs::read_to_string(&file).expect("read"), "keep");
}
