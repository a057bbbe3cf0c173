//! Function networks: the host's own (`Host`), none but loopback (`None`), or the outside
//! world without the host (`Outbound`).
//!
//! `Outbound` gives every instance a network namespace of its own (bwrap's
//! `--unshare-net`) and connects it to the outside with `slirp4netns`: a user-space TCP/IP
//! stack on the host side that turns the instance's packets into ordinary sockets of its
//! own. No host interface, route, `ip_forward` or firewall rule changes. Before the
//! program starts (bwrap waits on its `--block-fd`), root adds `prohibit` routes inside
//! the namespace for every IPv4 address the host has and for slirp's host alias and DNS
//! forwarder, so connections to the host at any of its addresses fail with `EACCES`.
//! The program runs without `CAP_NET_ADMIN` and cannot remove them. Other instances are
//! unreachable because each lives in its own namespace and slirp forwards no ports in.
//! slirp4netns itself runs in its own mount namespace with its capabilities dropped and a
//! seccomp filter (`--enable-sandbox --enable-seccomp`), and exits when the instance's
//! [`Child`](crate::Child) is dropped or the server dies (`--exit-fd`).

use std::fs::File;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use crate::process::{Killer, map_fds};

/// What a sandboxed process may reach over the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Network {
    /// The host's network namespace, unfiltered (builds, `network: host`).
    Host,
    /// A namespace of its own reaching the outside world but not the host.
    Outbound,
    /// A namespace of its own with loopback only.
    None,
}

/// The descriptor bwrap writes its JSON info (with the namespace init's pid) to.
pub(crate) const INFO_FD: RawFd = 10;
/// The descriptor bwrap reads one byte from before it starts the program.
pub(crate) const BLOCK_FD: RawFd = 11;

/// slirp's alias for the host's loopback and its DNS forwarder: both are the host.
const SLIRP_HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
const SLIRP_DNS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// The instance's address on slirp's network (slirp's default guest address).
const GUEST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);
/// slirp4netns's largest MTU: fewer, larger packets through the user-space stack.
const MTU: u32 = 65520;

/// How long the namespace may take to be connected before the start fails.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The programs outbound networking needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tools {
    slirp4netns: PathBuf,
    ip: PathBuf,
}

impl Tools {
    /// Finds `slirp4netns` and iproute2's `ip` where Debian and others install them.
    pub fn detect() -> Result<Tools, String> {
        let find = |candidates: &[&str], package: &str| {
            candidates
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
                .ok_or_else(|| format!("{} is missing (install {package})", candidates[0]))
        };
        Ok(Tools {
            slirp4netns: find(
                &["/usr/bin/slirp4netns", "/usr/sbin/slirp4netns"],
                "slirp4netns",
            )?,
            ip: find(
                &["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"],
                "iproute2",
            )?,
        })
    }
}

/// The pipes of an outbound instance's setup, made before bwrap starts.
pub(crate) struct Pending {
    info_read: OwnedFd,
    info_child: OwnedFd,
    block_write: OwnedFd,
    block_child: OwnedFd,
    exit_keep: OwnedFd,
    exit_slirp: OwnedFd,
}

impl Pending {
    pub fn new() -> io::Result<Pending> {
        let (info_read, info_child) = io::pipe()?;
        let (block_child, block_write) = io::pipe()?;
        let (exit_slirp, exit_keep) = io::pipe()?;
        Ok(Pending {
            info_read: info_read.into(),
            info_child: info_child.into(),
            block_write: block_write.into(),
            block_child: block_child.into(),
            exit_keep: exit_keep.into(),
            exit_slirp: exit_slirp.into(),
        })
    }

    /// The descriptors bwrap gets (copies of ours), each with its number there.
    pub fn child_fds(&self) -> io::Result<[(OwnedFd, RawFd); 2]> {
        Ok([
            (self.info_child.try_clone()?, INFO_FD),
            (self.block_child.try_clone()?, BLOCK_FD),
        ])
    }

    /// Connects the namespace of the bwrap just started, then lets it run the program.
    /// Returns the descriptor whose closing ends slirp4netns; keep it as long as the
    /// instance. A failed setup is logged and kills the instance, whose program never ran.
    pub fn start(self, tools: Arc<Tools>, id: String, killer: Killer) -> OwnedFd {
        let Pending {
            info_read,
            info_child,
            block_write,
            block_child,
            exit_keep,
            exit_slirp,
        } = self;
        // bwrap has its copies; ours would keep the pipes from reporting EOF.
        drop((info_child, block_child));
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let setup = attach(&tools, info_read, exit_slirp, &id);
            let result = match tokio::time::timeout(SETUP_TIMEOUT, setup).await {
                Ok(r) => r,
                Err(_) => Err(format!(
                    "not connected within {} s",
                    SETUP_TIMEOUT.as_secs()
                )),
            };
            match result {
                Ok(()) => {
                    let ms = started.elapsed().as_secs_f64() * 1000.0;
                    tracing::debug!(%id, ms, "outbound network connected");
                    let mut block = File::from(block_write);
                    match block.write_all(b"1") {
                        Ok(()) => {}
                        // The sandbox was killed meanwhile (a stop, a shutdown).
                        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => {
                            tracing::debug!(%id, "sandbox gone before its network was ready");
                        }
                        Err(err) => {
                            tracing::warn!(%id, %err, "cannot release the sandbox after network setup");
                            killer.kill();
                        }
                    }
                }
                Err(err) => {
                    // Without the byte bwrap would go on at EOF: kill first, then close.
                    tracing::warn!(%id, %err, "cannot set up the instance's outbound network");
                    killer.kill();
                    drop(block_write);
                }
            }
        });
        exit_keep
    }
}

/// Reads bwrap's info, blocks the host's addresses in the namespace and starts slirp4netns.
async fn attach(tools: &Tools, info: OwnedFd, exit: OwnedFd, id: &str) -> Result<(), String> {
    let (pid, ns_inode) = read_info(info).await?;
    let ns_path = format!("/proc/{pid}/ns/net");
    let ns = File::open(&ns_path).map_err(|e| format!("{ns_path}: {e}"))?;
    // The init is blocked on BLOCK_FD and so alive, but make sure the pid was not recycled.
    let inode = ns.metadata().map_err(|e| format!("{ns_path}: {e}"))?.ino();
    if inode != ns_inode {
        return Err(format!("{ns_path} is not the sandbox's namespace"));
    }
    // 127.0.0.0/8 inside is the namespace's own loopback; the host's is out of reach.
    let mut blocked = host_ipv4_addresses().map_err(|e| format!("host addresses: {e}"))?;
    blocked.retain(|a| !a.is_loopback());
    blocked.extend([SLIRP_HOST, SLIRP_DNS]);
    blocked.sort();
    blocked.dedup();
    // slirp4netns only creates tap0; `ip` configures it. (slirp's own `--configure` also
    // brings `lo` up, racing with bwrap, which sets up `lo` meanwhile and fails if the
    // kernel got there first.)
    start_slirp(&tools.slirp4netns, &ns, exit, id).await?;
    configure(&tools.ip, &ns, &blocked).await
}

/// Reads the JSON bwrap writes to `--info-fd`: the init's pid and its network namespace.
async fn read_info(info: OwnedFd) -> Result<(u32, u64), String> {
    let mut info =
        pipe::Receiver::from_owned_fd(info).map_err(|e| format!("bwrap info pipe: {e}"))?;
    let mut text = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let n = info
            .read(&mut buf)
            .await
            .map_err(|e| format!("bwrap info pipe: {e}"))?;
        text.extend_from_slice(&buf[..n]);
        if n == 0 || text.contains(&b'}') || text.len() > 4096 {
            break;
        }
    }
    let text = String::from_utf8_lossy(&text);
    let pid = json_number(&text, "child-pid");
    let ns = json_number(&text, "net-namespace");
    match (pid.and_then(|p| u32::try_from(p).ok()), ns) {
        (Some(pid), Some(ns)) if pid > 0 => Ok((pid, ns)),
        _ => Err(format!(
            "bwrap reported no child pid and namespace: {text:?}"
        )),
    }
}

/// The unsigned number after `"key":` in bwrap's flat JSON object.
fn json_number(text: &str, key: &str) -> Option<u64> {
    let at = text.find(&format!("\"{key}\""))?;
    let rest = text[at + key.len() + 2..].trim_start().strip_prefix(':')?;
    let rest = rest.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Every IPv4 address on the host's interfaces (loopback included).
pub(crate) fn host_ipv4_addresses() -> io::Result<Vec<Ipv4Addr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let entry = unsafe { &*cur };
        let addr = entry.ifa_addr;
        // SAFETY: a non-null ifa_addr points to a sockaddr whose family says its type;
        // AF_INET ones are sockaddr_in.
        if !addr.is_null() && i32::from(unsafe { (*addr).sa_family }) == libc::AF_INET {
            let sin = unsafe { &*addr.cast::<libc::sockaddr_in>() };
            found.push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
        }
        cur = entry.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(found)
}

/// Gives tap0 slirp's guest address and default route, then adds a `prohibit` route for
/// each of `blocked` (after the default route: its gateway is one of them).
async fn configure(ip: &Path, ns: &File, blocked: &[Ipv4Addr]) -> Result<(), String> {
    let mut batch = format!(
        "link set tap0 mtu {MTU} up\naddr add {GUEST}/24 dev tap0\nroute add default via {SLIRP_HOST} dev tap0\n"
    );
    for a in blocked {
        batch.push_str(&format!("route add prohibit {a}/32\n"));
    }
    let mut cmd = tokio::process::Command::new(ip);
    cmd.args(["-batch", "-"])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let ns_fd = ns.as_raw_fd();
    // SAFETY: the hook only calls setns, a raw syscall, on a descriptor the parent keeps
    // open until the spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(ns_fd, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("{}: {e}", ip.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(batch.as_bytes())
            .await
            .map_err(|e| format!("{}: {e}", ip.display()))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("{}: {e}", ip.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} failed ({}): {}",
            ip.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The descriptors slirp4netns gets: the namespace, its ready pipe and its exit pipe.
const SLIRP_NS_FD: RawFd = 3;
const SLIRP_READY_FD: RawFd = 4;
const SLIRP_EXIT_FD: RawFd = 5;

/// Starts slirp4netns on the namespace `ns` and waits until it has created `tap0` there.
/// It exits when `exit`'s write end closes.
async fn start_slirp(slirp: &Path, ns: &File, exit: OwnedFd, id: &str) -> Result<(), String> {
    let (ready_read, ready_write) = io::pipe().map_err(|e| format!("slirp ready pipe: {e}"))?;
    let mut cmd = tokio::process::Command::new(slirp);
    cmd.args([
        "--mtu=65520",
        "--disable-host-loopback",
        "--enable-sandbox",
        "--enable-seccomp",
        "--netns-type=path",
    ])
    .arg(format!("--ready-fd={SLIRP_READY_FD}"))
    .arg(format!("--exit-fd={SLIRP_EXIT_FD}"))
    .arg(format!("/proc/self/fd/{SLIRP_NS_FD}"))
    .arg("tap0")
    .env_clear()
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let fds = [
        (ns.as_raw_fd(), SLIRP_NS_FD),
        (ready_write.as_raw_fd(), SLIRP_READY_FD),
        (exit.as_raw_fd(), SLIRP_EXIT_FD),
    ];
    // SAFETY: the hook makes only raw unshare/mount/fcntl/dup2 calls (with a static path)
    // on descriptors the parent keeps open until the spawn returns, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            private_mounts()?;
            map_fds(&fds)
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", slirp.display()))?;
    drop((ready_write, exit));
    let mut ready = pipe::Receiver::from_owned_fd(ready_read.into())
        .map_err(|e| format!("slirp ready pipe: {e}"))?;
    let mut byte = [0u8; 1];
    let signalled = ready.read(&mut byte).await;
    let mut stderr = child.stderr.take();
    if !matches!(signalled, Ok(1)) {
        let _ = child.start_kill();
        let mut said = String::new();
        if let Some(err) = stderr.as_mut() {
            let _ =
                tokio::time::timeout(Duration::from_secs(1), err.read_to_string(&mut said)).await;
        }
        return Err(format!("slirp4netns did not start: {}", said.trim()));
    }
    // It lives until the instance goes; reap it then, and keep its stderr drained.
    let id = id.to_owned();
    tokio::spawn(async move {
        if let Some(mut err) = stderr {
            let mut said = String::new();
            let _ = err.read_to_string(&mut said).await;
            for line in said.lines().filter(|l| !l.is_empty()) {
                tracing::debug!(%id, "slirp4netns: {line}");
            }
        }
        let _ = child.wait().await;
    });
    Ok(())
}

/// Puts the calling process in a mount namespace of its own whose mounts propagate
/// nothing back. slirp4netns's `--enable-sandbox` unshares the mount namespace, makes only
/// `/` private and detaches the old root after its `pivot_root`: on a host whose mounts
/// are shared (systemd's default), that unmount propagates and takes the host's mounts
/// below shared ones with it (named network namespaces in /run/netns, for one).
/// Async-signal-safe: two raw syscalls.
fn private_mounts() -> io::Result<()> {
    // SAFETY: unshare and mount with integer flags and static C strings.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bwrap_info_is_read_for_pid_and_namespace() {
        let text = "{\n    \"child-pid\": 26590,\n    \"mnt-namespace\": 4026532177,\n    \"net-namespace\": 4026532179\n}";
        assert_eq!(json_number(text, "child-pid"), Some(26590));
        assert_eq!(json_number(text, "net-namespace"), Some(4026532179));
        assert_eq!(json_number(text, "pid-namespace"), None);
        assert_eq!(json_number("{\"child-pid\": \"x\"}", "child-pid"), None);
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no arguments and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    /// Runs `script` with `network` in a real sandbox: its exit, stdout and stderr.
    async fn run(network: Network, script: &str) -> (crate::Exit, String, String) {
        let cfg = crate::SandboxConfig {
            cgroup_name: format!("sless-test-{}-net", std::process::id()),
            ..crate::SandboxConfig::default()
        };
        let sandbox = crate::Sandbox::new(cfg).expect("sandbox");
        let spec = crate::ProcessSpec {
            id: format!("net-{}", rand_id()),
            program: "/usr/bin/python3".into(),
            args: vec!["-c".into(), script.into()],
            env: Vec::new(),
            mounts: Vec::new(),
            cwd: "/".into(),
            memory_mb: 128,
            max_pids: 32,
            network,
            ready_pipe: false,
            listen: None,
        };
        let mut child = sandbox.spawn(&spec).expect("spawn");
        let (mut out, mut err) = (String::new(), String::new());
        let mut stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let (_, _, exit) = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err),
            child.wait()
        );
        drop(child);
        // Best effort: a parent another test of this process still uses stays.
        for dir in sandbox.cgroup_parents() {
            let _ = std::fs::remove_dir(dir);
        }
        (exit, out, err)
    }

    fn rand_id() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }

    /// Tries to connect to each `ip:port` and prints one word per target.
    const PROBE: &str = r#"
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        print("connected")
    except OSError as e:
        print(type(e).__name__)
"#;

    #[tokio::test]
    async fn outbound_cannot_reach_the_host_at_any_address() {
        if !is_root() {
            return;
        }
        let listener = std::net::TcpListener::bind("0.0.0.0:0").expect("listen");
        let port = listener.local_addr().expect("addr").port();
        let mut targets: Vec<String> = host_ipv4_addresses()
            .expect("addresses")
            .iter()
            .map(|a| format!("{a}:{port}"))
            .collect();
        targets.push(format!("10.0.2.2:{port}"));
        let script = format!(
            "import sys; sys.argv = ['x'] + {targets:?}\n{PROBE}\nprint(open('/proc/net/tcp').read().count(':{port:04X} '))"
        );
        let (exit, out, err) = run(Network::Outbound, &script).await;
        assert!(exit.success(), "{exit}: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), targets.len() + 1, "{out}");
        for (target, word) in targets.iter().zip(&lines) {
            // 127.0.0.1 is the instance's own loopback, where nothing listens.
            let expected = if target.starts_with("127.") {
                "ConnectionRefusedError"
            } else {
                "PermissionError"
            };
            assert_eq!(*word, expected, "{target}: {out}");
        }
        // The host's listening socket is not in the instance's view of the network.
        assert_eq!(lines[targets.len()], "0", "{out}");
        // The host, with the same program, does reach it: the probe can fail.
        let host = run(
            Network::Host,
            &format!("import sys; sys.argv = ['x', '127.0.0.1:{port}']\n{PROBE}"),
        )
        .await;
        assert_eq!(host.1.trim(), "connected", "{host:?}");
    }

    #[tokio::test]
    async fn none_has_no_route_anywhere() {
        if !is_root() {
            return;
        }
        let (exit, out, err) = run(
            Network::None,
            &format!("import sys; sys.argv = ['x', '192.0.2.1:80', '10.0.2.2:80']\n{PROBE}"),
        )
        .await;
        assert!(exit.success(), "{exit}: {err}");
        assert_eq!(out, "OSError\nOSError\n");
    }

    #[tokio::test]
    async fn outbound_setup_leaves_the_host_mounts_alone() {
        if !is_root() {
            return;
        }
        // A shared mount with a mount below it, like /run/netns with a named namespace.
        let dir = tempfile::tempdir().expect("tempdir");
        let top = dir.path().join("shared");
        let below = top.join("file");
        std::fs::create_dir(&top).expect("mkdir");
        std::fs::write(&below, "").expect("file");
        let source = dir.path().join("source");
        std::fs::write(&source, "").expect("source");
        let mount = |args: &[&std::ffi::OsStr]| {
            let status = std::process::Command::new("mount").args(args).status();
            assert!(status.is_ok_and(|s| s.success()), "mount {args:?}");
        };
        mount(&["--bind".as_ref(), top.as_os_str(), top.as_os_str()]);
        mount(&["--make-shared".as_ref(), top.as_os_str()]);
        mount(&["--bind".as_ref(), source.as_os_str(), below.as_os_str()]);
        let mounted = || {
            std::fs::read_to_string("/proc/self/mountinfo")
                .expect("mountinfo")
                .lines()
                .any(|l| l.split(' ').nth(4) == below.to_str())
        };
        assert!(mounted());
        let (exit, _, err) = run(Network::Outbound, "pass").await;
        let still = mounted();
        for path in [&below, &top] {
            let _ = std::process::Command::new("umount").arg(path).status();
        }
        assert!(exit.success(), "{exit}: {err}");
        assert!(still, "starting slirp4netns unmounted a host mount");
    }

    #[test]
    fn host_addresses_include_loopback() {
        let found = host_ipv4_addresses().expect("getifaddrs");
        assert!(found.contains(&Ipv4Addr::LOCALHOST), "{found:?}");
    }
}
