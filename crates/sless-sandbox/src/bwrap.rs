//! The bubblewrap command line for a [`ProcessSpec`]: namespaces, the mount layout of the
//! sandbox and the privilege drop. A pure function of its inputs, so it is unit-tested
//! without running anything.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::network::{self, Network};
use crate::{Mount, ProcessSpec};

/// Root-level entries that on a merged-/usr host are symlinks into `/usr` (and on an older
/// layout real directories). Programs and the dynamic loader look them up by these names.
const ROOT_ENTRIES: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// The files of `/etc` a sandboxed process may see: name resolution, TLS roots, time zone,
/// user names, the dynamic loader cache, MIME types. Everything else in `/etc` (credentials,
/// host configuration) stays out. Build steps that need more (e.g. `pip.conf`) pass it as a
/// mount in their [`ProcessSpec`]. Each entry is a mount bwrap sets up on every start
/// (~0.2 ms each), so the list stays short: `ld.so.conf*` are left out, only `ldconfig`
/// reads them.
const ETC_ENTRIES: &[&str] = &[
    "resolv.conf",
    "hosts",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "ssl",
    "ca-certificates",
    "localtime",
    "passwd",
    "group",
    "mime.types",
    "ld.so.cache",
    "alternatives",
    "os-release",
];

/// Facts about the host file system the sandbox layout depends on, read once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostLayout {
    /// How `/bin`, `/lib`, ... exist on the host.
    pub(crate) root_entries: Vec<RootEntry>,
    /// The entries of [`ETC_ENTRIES`] present on the host (absolute paths).
    pub(crate) etc: Vec<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootEntry {
    /// `link` is a symlink with this target (e.g. `/lib -> usr/lib`); recreated as is.
    Symlink { link: PathBuf, target: PathBuf },
    /// A real directory, bound read-only.
    Dir(PathBuf),
}

impl HostLayout {
    pub(crate) fn detect() -> HostLayout {
        let root_entries = ROOT_ENTRIES
            .iter()
            .filter_map(|name| {
                let link = Path::new("/").join(name);
                if let Ok(target) = fs::read_link(&link) {
                    return Some(RootEntry::Symlink { link, target });
                }
                link.is_dir().then_some(RootEntry::Dir(link))
            })
            .collect();
        let etc = ETC_ENTRIES
            .iter()
            .map(|name| Path::new("/etc").join(name))
            // `exists` follows symlinks: a dangling `/etc/resolv.conf` is left out.
            .filter(|path| path.exists())
            .collect();
        HostLayout { root_entries, etc }
    }
}

/// How the sandboxed program gets its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Privilege {
    /// bwrap runs as root (it can bind anything and set up cgroups); `setpriv` then switches
    /// to `uid`/`gid` with no supplementary groups, no capabilities and `no_new_privs`.
    Root {
        setpriv: PathBuf,
        uid: u32,
        gid: u32,
    },
    /// bwrap runs as the (unprivileged) server user inside a user namespace of its own.
    Unprivileged,
}

/// Checks what bwrap would otherwise reject late or, worse, interpret differently.
pub(crate) fn validate(spec: &ProcessSpec) -> Result<(), String> {
    let id_ok = !spec.id.is_empty()
        && spec.id.len() <= 128
        && spec.id != "."
        && spec.id != ".."
        && spec
            .id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !id_ok {
        return Err("id must be 1-128 characters of [A-Za-z0-9._-] (it names a cgroup)".into());
    }
    check_inside_path("program", &spec.program)?;
    check_inside_path("cwd", &spec.cwd)?;
    for mount in &spec.mounts {
        check_inside_path("mount target", &mount.target)?;
        if mount.target == Path::new("/") {
            return Err("a mount cannot replace the sandbox root".into());
        }
        if !mount.source.is_absolute() {
            return Err(format!(
                "mount source {} is not absolute",
                mount.source.display()
            ));
        }
    }
    for (key, value) in &spec.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(format!("invalid environment variable name {key:?}"));
        }
        if value.contains('\0') {
            return Err(format!("environment variable {key} contains a NUL byte"));
        }
        // bwrap and setpriv start with the program's environment, as root in root mode:
        // `LD_PRELOAD` there would run the function's code before the privilege drop.
        if sless_core::function::is_loader_variable(key) {
            return Err(format!(
                "environment variable {key} would act on bwrap and setpriv, which run privileged"
            ));
        }
    }
    Ok(())
}

/// A path inside the sandbox must be absolute and free of `..`, so it means what it says.
fn check_inside_path(what: &str, path: &Path) -> Result<(), String> {
    let clean = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if clean {
        Ok(())
    } else {
        Err(format!(
            "{what} {} must be an absolute path without `..`",
            path.display()
        ))
    }
}

/// The bwrap argv (without the `bwrap` itself) that runs `spec`.
pub(crate) fn build_args(
    spec: &ProcessSpec,
    layout: &HostLayout,
    privilege: &Privilege,
) -> Vec<OsString> {
    let mut args = Args::default();

    match privilege {
        // As root, bwrap needs no user namespace; creating one would map only root and
        // make the later switch to the unprivileged uid impossible.
        Privilege::Root { .. } => {
            args.push(["--unshare-ipc", "--unshare-pid", "--unshare-uts"]);
            args.push(["--unshare-cgroup-try"]);
            match spec.network {
                Network::Host => {}
                Network::None => args.push(["--unshare-net"]),
                // bwrap reports the namespace's init on INFO_FD and waits on BLOCK_FD
                // until `network` has connected the namespace.
                Network::Outbound => args.push([
                    "--unshare-net".to_owned(),
                    "--info-fd".to_owned(),
                    network::INFO_FD.to_string(),
                    "--block-fd".to_owned(),
                    network::BLOCK_FD.to_string(),
                ]),
            }
        }
        Privilege::Unprivileged => {
            args.push(["--unshare-all"]);
            // No root to connect a namespace: outbound shares the host's network.
            if spec.network != Network::None {
                args.push(["--share-net"]);
            }
        }
    }
    // The namespace's init dies with bwrap, and with the init the whole pid namespace, so
    // killing bwrap kills the instance. `--new-session` keeps the program away from any
    // controlling terminal (no TIOCSTI injection).
    args.push(["--die-with-parent", "--new-session"]);

    let mut mounted = Mounted::default();
    args.push(["--ro-bind", "/usr", "/usr"]);
    mounted.add("/usr");
    for entry in &layout.root_entries {
        match entry {
            RootEntry::Symlink { link, target } => {
                args.push(["--symlink".as_ref(), target.as_os_str(), link.as_os_str()]);
            }
            RootEntry::Dir(dir) => {
                args.push(["--ro-bind".as_ref(), dir.as_os_str(), dir.as_os_str()]);
            }
        }
        mounted.add(match entry {
            RootEntry::Symlink { link, .. } => link,
            RootEntry::Dir(dir) => dir,
        });
    }
    // bwrap makes tmpfs mounts 0755 root; the program (another uid in root mode) needs
    // `/tmp` and `/dev/shm` (POSIX semaphores, multiprocessing) writable, sticky like a
    // host's. Their pages are charged to the instance's memory cgroup.
    args.push(["--proc", "/proc", "--dev", "/dev"]);
    args.push(["--perms", "1777", "--tmpfs", "/dev/shm"]);
    args.push(["--perms", "1777", "--tmpfs", "/tmp"]);
    mounted.add("/proc");
    mounted.add("/dev");
    mounted.add("/tmp");
    args.push(["--dir", "/etc"]);
    mounted.add("/etc");
    for path in &layout.etc {
        // `-try`: an entry that vanished since start-up (resolv.conf being rewritten) must
        // not fail the start. bwrap follows symlinks in the source.
        args.push(["--ro-bind-try".as_ref(), path.as_os_str(), path.as_os_str()]);
    }

    // Parents before children, so `/code` does not cover a `/code/x` mounted earlier.
    let mut mounts: Vec<&Mount> = spec.mounts.iter().collect();
    mounts.sort_by_key(|m| m.target.components().count());
    for mount in mounts {
        for dir in missing_parents(&mount.target, &mounted) {
            args.push(["--dir".as_ref(), dir.as_os_str()]);
            mounted.add(dir);
        }
        let flag = if mount.writable {
            "--bind"
        } else {
            "--ro-bind"
        };
        args.push([
            flag.as_ref(),
            mount.source.as_os_str(),
            mount.target.as_os_str(),
        ]);
        mounted.add(&mount.target);
    }

    args.push(["--chdir".as_ref(), spec.cwd.as_os_str()]);
    // The environment is bwrap's own, passed on to the program (see `process::Launch`).
    // The filter is loaded last, after bwrap's setup, and applies to setpriv too.
    args.push(["--seccomp".to_owned(), crate::SECCOMP_FD.to_string()]);

    match privilege {
        Privilege::Root { setpriv, uid, gid } => {
            // setpriv needs CAP_SETUID/CAP_SETGID to switch; after the switch to a non-zero
            // uid the kernel clears the permitted set, so the program holds no capability.
            args.push(["--cap-drop", "ALL", "--cap-add", "CAP_SETUID"]);
            args.push(["--cap-add", "CAP_SETGID"]);
            args.push([setpriv.as_os_str()]);
            args.push([
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".to_owned(),
                "--inh-caps=-all".to_owned(),
                "--no-new-privs".to_owned(),
                "--".to_owned(),
            ]);
        }
        Privilege::Unprivileged => args.push(["--cap-drop", "ALL"]),
    }
    args.push([spec.program.as_os_str()]);
    for arg in &spec.args {
        args.push([arg.as_str()]);
    }
    args.0
}

/// The ancestors of `target` (outermost first, `/` excluded) that nothing set up so far
/// provides, and that therefore need a `--dir`.
fn missing_parents(target: &Path, mounted: &Mounted) -> Vec<PathBuf> {
    let mut parents: Vec<PathBuf> = target
        .ancestors()
        .skip(1)
        .filter(|p| *p != Path::new("/") && !mounted.covers(p))
        .map(Path::to_path_buf)
        .collect();
    parents.reverse();
    parents
}

/// Destinations set up so far in the sandbox.
#[derive(Default)]
struct Mounted(BTreeSet<PathBuf>);

impl Mounted {
    fn add(&mut self, path: impl AsRef<Path>) {
        self.0.insert(path.as_ref().to_path_buf());
    }

    /// True when `path` or one of its ancestors was set up: bwrap creates anything below
    /// an existing destination itself, and a read-only one could not take a `--dir` anyway.
    fn covers(&self, path: &Path) -> bool {
        path.ancestors().any(|p| self.0.contains(p))
    }
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn push<const N: usize, S: Into<OsString>>(&mut self, items: [S; N]) {
        self.0.extend(items.map(Into::into));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ProcessSpec {
        ProcessSpec {
            id: "fn-1".into(),
            program: "/usr/bin/python3".into(),
            args: vec!["-c".into(), "print(1)".into()],
            env: vec![("A".into(), "b c".into())],
            mounts: vec![
                Mount {
                    source: "/srv/sock".into(),
                    target: "/run/sless".into(),
                    writable: true,
                },
                Mount {
                    source: "/srv/code".into(),
                    target: "/code".into(),
                    writable: false,
                },
            ],
            cwd: "/code".into(),
            memory_mb: 64,
            max_pids: 16,
            network: Network::Host,
            ready_pipe: true,
            listen: None,
        }
    }

    fn layout() -> HostLayout {
        HostLayout {
            root_entries: vec![
                RootEntry::Symlink {
                    link: "/lib".into(),
                    target: "usr/lib".into(),
                },
                RootEntry::Dir("/lib64".into()),
            ],
            etc: vec!["/etc/resolv.conf".into(), "/etc/ssl".into()],
        }
    }

    fn root() -> Privilege {
        Privilege::Root {
            setpriv: "/usr/bin/setpriv".into(),
            uid: 65534,
            gid: 65533,
        }
    }

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter()
            .map(|a| a.into_string().expect("utf-8"))
            .collect()
    }

    /// The position of the window `needle` in `args`.
    fn find(args: &[String], needle: &[&str]) -> Option<usize> {
        args.windows(needle.len()).position(|w| w == needle)
    }

    #[test]
    fn root_layout_in_full() {
        let args = strings(build_args(&spec(), &layout(), &root()));
        let expected = [
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/lib",
            "/lib",
            "--ro-bind",
            "/lib64",
            "/lib64",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--perms",
            "1777",
            "--tmpfs",
            "/dev/shm",
            "--perms",
            "1777",
            "--tmpfs",
            "/tmp",
            "--dir",
            "/etc",
            "--ro-bind-try",
            "/etc/resolv.conf",
            "/etc/resolv.conf",
            "--ro-bind-try",
            "/etc/ssl",
            "/etc/ssl",
            "--ro-bind",
            "/srv/code",
            "/code",
            "--dir",
            "/run",
            "--bind",
            "/srv/sock",
            "/run/sless",
            "--chdir",
            "/code",
            "--seccomp",
            "5",
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
            "/usr/bin/setpriv",
            "--reuid=65534",
            "--regid=65533",
            "--clear-groups",
            "--inh-caps=-all",
            "--no-new-privs",
            "--",
            "/usr/bin/python3",
            "-c",
            "print(1)",
        ];
        // Written out in full once, so a reordering is a visible diff; the other tests
        // check single properties.
        assert_eq!(args, expected);
    }

    #[test]
    fn root_shares_network_only_when_asked() {
        let with = strings(build_args(&spec(), &layout(), &root()));
        assert!(!with.contains(&"--unshare-net".to_owned()));
        assert!(
            !with.contains(&"--unshare-all".to_owned()),
            "would add a user ns"
        );
        let mut isolated = spec();
        isolated.network = Network::None;
        let without = strings(build_args(&isolated, &layout(), &root()));
        assert!(without.contains(&"--unshare-net".to_owned()));
        assert!(!without.contains(&"--block-fd".to_owned()));
        isolated.network = Network::Outbound;
        let outbound = strings(build_args(&isolated, &layout(), &root()));
        let held = find(
            &outbound,
            &["--unshare-net", "--info-fd", "10", "--block-fd", "11"],
        );
        assert!(held.is_some(), "{outbound:?}");
    }

    #[test]
    fn unprivileged_uses_own_user_namespace_and_no_setpriv() {
        let args = strings(build_args(&spec(), &layout(), &Privilege::Unprivileged));
        assert_eq!(&args[..2], ["--unshare-all", "--share-net"]);
        assert!(!args.iter().any(|a| a.contains("setpriv")));
        assert!(!args.contains(&"CAP_SETUID".to_owned()));
        let tail = find(
            &args,
            &["--cap-drop", "ALL", "/usr/bin/python3", "-c", "print(1)"],
        );
        assert_eq!(tail, Some(args.len() - 5));
        let mut isolated = spec();
        isolated.network = Network::None;
        let args = strings(build_args(&isolated, &layout(), &Privilege::Unprivileged));
        assert!(!args.contains(&"--share-net".to_owned()));
    }

    #[test]
    fn program_runs_under_setpriv_as_the_configured_ids() {
        let args = strings(build_args(&spec(), &layout(), &root()));
        let at = find(
            &args,
            &[
                "/usr/bin/setpriv",
                "--reuid=65534",
                "--regid=65533",
                "--clear-groups",
                "--inh-caps=-all",
                "--no-new-privs",
                "--",
                "/usr/bin/python3",
                "-c",
                "print(1)",
            ],
        );
        assert_eq!(at, Some(args.len() - 10), "{args:?}");
        // Capabilities are dropped before the program, keeping only what setpriv needs.
        let caps = find(&args, &["--cap-drop", "ALL", "--cap-add", "CAP_SETUID"]);
        assert!(caps.is_some_and(|c| c < args.len() - 10));
    }

    #[test]
    fn mounts_parents_first_with_missing_dirs_created() {
        let mut s = spec();
        s.mounts = vec![
            Mount {
                source: "/srv/nm".into(),
                target: "/code/node_modules".into(),
                writable: false,
            },
            Mount {
                source: "/srv/code".into(),
                target: "/code".into(),
                writable: false,
            },
            Mount {
                source: "/srv/sock".into(),
                target: "/run/sless/sock".into(),
                writable: true,
            },
        ];
        let args = strings(build_args(&s, &layout(), &root()));
        let code = find(&args, &["--ro-bind", "/srv/code", "/code"]).expect("code");
        let nm = find(&args, &["--ro-bind", "/srv/nm", "/code/node_modules"]).expect("nm");
        assert!(code < nm, "parent mount must come first");
        let run = find(&args, &["--dir", "/run", "--dir", "/run/sless", "--bind"]);
        assert!(run.is_some(), "{args:?}");
        // `/code` exists once mounted: no `--dir` for it.
        assert_eq!(find(&args, &["--dir", "/code"]), None);
    }

    #[test]
    fn environment_never_appears_on_the_command_line() {
        let mut s = spec();
        s.env = vec![("SECRET".into(), "hunter2".into())];
        for privilege in [root(), Privilege::Unprivileged] {
            let args = strings(build_args(&s, &layout(), &privilege));
            assert!(
                !args
                    .iter()
                    .any(|a| a.contains("SECRET") || a.contains("hunter2"))
            );
            assert!(!args.iter().any(|a| a == "--setenv" || a == "--clearenv"));
        }
    }

    #[test]
    fn seccomp_filter_is_always_loaded() {
        for privilege in [root(), Privilege::Unprivileged] {
            let args = strings(build_args(&spec(), &layout(), &privilege));
            assert!(find(&args, &["--seccomp", "5"]).is_some(), "{args:?}");
        }
    }

    #[test]
    fn etc_is_an_allowlist() {
        let args = strings(build_args(&spec(), &layout(), &root()));
        let etc: Vec<&String> = args.iter().filter(|a| a.starts_with("/etc/")).collect();
        assert_eq!(
            etc,
            [
                "/etc/resolv.conf",
                "/etc/resolv.conf",
                "/etc/ssl",
                "/etc/ssl"
            ]
        );
        assert!(!ETC_ENTRIES.contains(&"shadow"));
    }

    #[test]
    fn validation_rejects_escapes_and_bad_ids() {
        assert_eq!(validate(&spec()), Ok(()));
        let bad: Vec<fn(&mut ProcessSpec)> = vec![
            |s| s.id = String::new(),
            |s| s.id = "..".into(),
            |s| s.id = "a/b".into(),
            |s| s.program = "python3".into(),
            |s| s.cwd = "/code/../etc".into(),
            |s| s.mounts[0].target = "/".into(),
            |s| s.mounts[0].target = "relative".into(),
            |s| s.mounts[0].source = "relative".into(),
            |s| s.env.push(("A=B".into(), "x".into())),
            |s| s.env.push(("A".into(), "x\0y".into())),
            |s| s.env.push(("LD_PRELOAD".into(), "/code/x.so".into())),
            |s| s.env.push(("GLIBC_TUNABLES".into(), "x".into())),
        ];
        for (i, breaker) in bad.into_iter().enumerate() {
            let mut s = spec();
            breaker(&mut s);
            assert!(validate(&s).is_err(), "case {i} accepted: {s:?}");
        }
    }
}
