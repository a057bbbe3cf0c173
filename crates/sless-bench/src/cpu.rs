//! CPU time of the processes under load, read from `/proc` and from cgroup accounting, so a
//! load round can say how many CPU microseconds each request cost the server and the instance.
//!
//! Throughput ratios move with whatever else the machine runs; CPU time per request moves
//! much less, because time spent waiting for a core is not CPU time.

use std::path::{Path, PathBuf};

use nix::unistd::{SysconfVar, sysconf};

use crate::error::{BenchError, Result, io};

/// Where a CPU counter is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuSource {
    /// One process (all its threads, including threads that have exited): `utime + stime`
    /// of `/proc/<pid>/stat`, in clock ticks of `tick_ns` nanoseconds.
    ///
    /// The kernel keeps these exactly (they are `sum_exec_runtime` split by sampling) but
    /// reports them in ticks, so each reading is low by up to one tick (10 ms at 100 Hz); a
    /// round whose process uses hundreds of milliseconds of CPU keeps that error to a few
    /// percent, and a full run's rounds to about one.
    Process { pid: u32, tick_ns: u64 },
    /// A cgroup's CPU accounting: every process and thread that ran in it, exited ones
    /// included, in nanoseconds (v1 `cpuacct.usage`) or microseconds (v2 `cpu.stat`).
    Cgroup { file: PathBuf, format: CgroupFormat },
    /// A process and its children alive at each reading (a PostgreSQL postmaster and
    /// its connections' backends), as [`CpuSource::Process`] each.
    Children { pid: u32, tick_ns: u64 },
}

/// A CPU counter with a name for messages, e.g. `server`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meter {
    pub name: &'static str,
    pub source: CpuSource,
}

/// Which cgroup accounting file a [`CpuSource::Cgroup`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupFormat {
    /// v1 `cpuacct.usage`: one number, nanoseconds.
    V1Usage,
    /// v2 `cpu.stat`: `usage_usec <n>` among other keys.
    V2Stat,
}

impl CpuSource {
    /// The process `pid`, with the clock tick from `sysconf(_SC_CLK_TCK)`.
    pub fn process(pid: u32) -> Result<CpuSource> {
        Ok(CpuSource::Process {
            pid,
            tick_ns: tick_ns()?,
        })
    }

    /// The process `pid` and its children.
    pub fn with_children(pid: u32) -> Result<CpuSource> {
        Ok(CpuSource::Children {
            pid,
            tick_ns: tick_ns()?,
        })
    }

    /// CPU time used so far, in nanoseconds.
    pub fn read_ns(&self) -> Result<u64> {
        match self {
            CpuSource::Children { pid, tick_ns } => {
                let mut ticks = 0;
                let entries = std::fs::read_dir("/proc").map_err(io("read /proc"))?;
                for entry in entries.flatten() {
                    let Ok(text) = std::fs::read_to_string(entry.path().join("stat")) else {
                        continue;
                    };
                    if let Some(stat) = parse_stat(&text)
                        && (stat.pid == *pid || stat.ppid == *pid)
                    {
                        ticks += stat.utime + stat.stime;
                    }
                }
                Ok(ticks.saturating_mul(*tick_ns))
            }
            CpuSource::Process { pid, tick_ns } => {
                let path = format!("/proc/{pid}/stat");
                let text = std::fs::read_to_string(&path).map_err(io(format!("read {path}")))?;
                let stat = parse_stat(&text)
                    .ok_or_else(|| BenchError::Setup(format!("cannot parse {path}: {text:?}")))?;
                Ok((stat.utime + stat.stime).saturating_mul(*tick_ns))
            }
            CpuSource::Cgroup { file, format } => {
                let text = std::fs::read_to_string(file)
                    .map_err(io(format!("read {}", file.display())))?;
                parse_cgroup_usage_ns(&text, *format).ok_or_else(|| {
                    BenchError::Setup(format!("cannot parse {}: {text:?}", file.display()))
                })
            }
        }
    }
}

/// Nanoseconds per clock tick, the unit of `utime` and `stime`.
fn tick_ns() -> Result<u64> {
    let ticks = sysconf(SysconfVar::CLK_TCK)
        .map_err(|e| BenchError::Setup(format!("sysconf(_SC_CLK_TCK) failed: {e}")))?
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
        .ok_or_else(|| BenchError::Setup("sysconf(_SC_CLK_TCK) has no value".into()))?;
    Ok(1_000_000_000 / ticks)
}

/// What the bench uses of one `/proc/<pid>/stat` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: u32,
    /// The command name, which may hold spaces and parentheses.
    pub comm: String,
    pub ppid: u32,
    /// User-mode CPU time, in clock ticks.
    pub utime: u64,
    /// Kernel-mode CPU time, in clock ticks.
    pub stime: u64,
}

/// Parses `pid (comm) state ppid ... utime stime ...` (proc(5) fields 1-4, 14 and 15).
///
/// The command name is whatever the process set, up to 15 bytes, spaces and `)` included,
/// so it ends at the *last* `)` of the line: every field after it is a number or the state.
pub fn parse_stat(line: &str) -> Option<ProcStat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    if close < open {
        return None;
    }
    let pid = line[..open].trim().parse().ok()?;
    let comm = line[open + 1..close].to_string();
    // Fields from 3 (state) on; field n is at index n - 3.
    let rest: Vec<&str> = line[close + 1..].split_whitespace().collect();
    let field = |n: usize| rest.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    Some(ProcStat {
        pid,
        comm,
        ppid: u32::try_from(field(4)?).ok()?,
        utime: field(14)?,
        stime: field(15)?,
    })
}

/// The CPU usage in nanoseconds of a cgroup accounting file's text.
pub fn parse_cgroup_usage_ns(text: &str, format: CgroupFormat) -> Option<u64> {
    match format {
        CgroupFormat::V1Usage => text.trim().parse().ok(),
        CgroupFormat::V2Stat => text
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|us| us.saturating_mul(1000)),
    }
}

/// Every process that descends from `root` (not `root` itself), given all processes' stats.
pub fn descendants(all: &[ProcStat], root: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for p in all.iter().filter(|p| p.ppid == parent && p.pid != parent) {
            if !found.contains(&p.pid) {
                found.push(p.pid);
                frontier.push(p.pid);
            }
        }
    }
    found.sort_unstable();
    found
}

/// The instance id of an instance socket: the run directory's name in
/// `<run>/<id>/sock/fn.sock` or `<run>/<id>/fn.sock`. The executor names the instance's
/// cgroup after the same id.
pub fn instance_id(socket: &Path) -> Option<String> {
    let mut dir = socket.parent()?;
    if dir.file_name()? == "sock" {
        dir = dir.parent()?;
    }
    Some(dir.file_name()?.to_str()?.to_string())
}

/// The cgroup that holds a process's CPU accounting, from its `/proc/<pid>/cgroup` text:
/// the v1 hierarchy with the `cpuacct` controller when there is one, else the v2 one.
/// Returns whether it is v2, and the path inside the hierarchy.
pub fn cpu_cgroup_of(proc_cgroup: &str) -> Option<(bool, String)> {
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(hier), Some(controllers), Some(path)) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "cpuacct") {
            return Some((false, path.to_string()));
        }
        if hier == "0" && controllers.is_empty() {
            v2 = Some((true, path.to_string()));
        }
    }
    v2
}

/// A cgroup mount from `/proc/self/mountinfo`: the hierarchy path it shows at its mount point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// Whether it is a cgroup2 mount.
    pub v2: bool,
    /// The path inside the hierarchy that the mount point shows (`/` unless in a container).
    pub root: String,
    pub mount_point: PathBuf,
}

/// The cgroup mount that holds CPU accounting in a `/proc/self/mountinfo` text: a v1 mount
/// with `cpuacct` among its super options, or (`want_v2`) the cgroup2 mount.
pub fn cpu_mount(mountinfo: &str, want_v2: bool) -> Option<CgroupMount> {
    mountinfo.lines().find_map(|line| {
        // `id parent maj:min root mount-point options [optional...] - fstype source super`
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (root, mount_point) = (*left.get(3)?, *left.get(4)?);
        let fstype = *right.first()?;
        let matches = if want_v2 {
            fstype == "cgroup2"
        } else {
            fstype == "cgroup" && right.get(2)?.split(',').any(|o| o == "cpuacct")
        };
        matches.then(|| CgroupMount {
            v2: want_v2,
            root: unescape_mount_path(root),
            mount_point: PathBuf::from(unescape_mount_path(mount_point)),
        })
    })
}

/// Undoes mountinfo's octal escapes of space, tab, newline and backslash (`\040` etc.).
fn unescape_mount_path(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 4);
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The accounting file of cgroup `path` (as `/proc/<pid>/cgroup` shows it) under `mount`.
pub fn accounting_file(mount: &CgroupMount, path: &str) -> Option<(PathBuf, CgroupFormat)> {
    let inside = if mount.root == "/" {
        path
    } else {
        path.strip_prefix(mount.root.as_str())?
    };
    let dir = mount.mount_point.join(inside.trim_start_matches('/'));
    Some(if mount.v2 {
        (dir.join("cpu.stat"), CgroupFormat::V2Stat)
    } else {
        (dir.join("cpuacct.usage"), CgroupFormat::V1Usage)
    })
}

/// The CPU accounting of the instance serving `socket`, a descendant of the server `server_pid`.
///
/// The instance's cgroup is the exact measure: it holds every process of the instance (the
/// sandbox's own and the runtime's, forks included) and nothing else, and it keeps counting
/// processes that exited. Summing `/proc` of the server's descendants instead would also
/// count the warm pool's generic instances and the network helpers. The cgroup is found
/// through a descendant process whose CPU cgroup is named after the instance id, so the
/// bench depends on no cgroup naming beyond the executor's "one cgroup per instance, named
/// by its id".
pub fn instance_cgroup(server_pid: u32, socket: &Path) -> Result<CpuSource> {
    let id = instance_id(socket).ok_or_else(|| {
        BenchError::Setup(format!(
            "no instance id in the socket path {}",
            socket.display()
        ))
    })?;
    let all = all_processes()?;
    let mut cgroup = None;
    for pid in descendants(&all, server_pid) {
        // A process may exit between the listing and this read; skip it.
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        if let Some((v2, path)) = cpu_cgroup_of(&text)
            && path.rsplit('/').next() == Some(id.as_str())
        {
            cgroup = Some((v2, path));
            break;
        }
    }
    let (v2, path) = cgroup.ok_or_else(|| {
        BenchError::Setup(format!(
            "no process of the server (pid {server_pid}) is in a CPU cgroup named {id}: \
             the sandbox runs without cgroup CPU accounting"
        ))
    })?;
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(io("read /proc/self/mountinfo"))?;
    let (file, format) = cpu_mount(&mountinfo, v2)
        .and_then(|mount| accounting_file(&mount, &path))
        .ok_or_else(|| BenchError::Setup(format!("no mounted cgroup hierarchy shows {path}")))?;
    let source = CpuSource::Cgroup { file, format };
    // Fail here, not in the middle of a load round, when the file cannot be read.
    source.read_ns()?;
    Ok(source)
}

/// The stats of every process on the machine (those that exit meanwhile are skipped).
fn all_processes() -> Result<Vec<ProcStat>> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").map_err(io("list /proc"))? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(entry.path().join("stat"))
            && let Some(stat) = parse_stat(&text)
        {
            all.push(stat);
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real line's shape: 52 fields, utime 1234 and stime 567 at fields 14 and 15.
    fn stat_line(pid: u32, comm: &str, ppid: u32) -> String {
        format!(
            "{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 1893 0 0 0 1234 567 0 0 20 0 9 0 \
             4102 1157627904 5421 18446744073709551615 1 1 0 0 0 0 0 4096 17610 0 0 0 17 1 0 0 \
             0 0 0 0 0 0 0 0 0 0 0"
        )
    }

    #[test]
    fn stat_lines_parse_with_any_command_name() {
        for comm in [
            "sless",
            "tokio-runtime-w",
            "a b",
            "x) S 99 (y",
            ")",
            "(",
            "",
        ] {
            let line = stat_line(4242, comm, 17);
            let stat = parse_stat(&line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!(
                stat,
                ProcStat {
                    pid: 4242,
                    comm: comm.to_string(),
                    ppid: 17,
                    utime: 1234,
                    stime: 567
                },
                "{line}"
            );
        }
    }

    #[test]
    fn truncated_or_garbled_stat_lines_are_refused() {
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("12 (x) S 1 2 3"), None);
        assert_eq!(parse_stat("12 x S 1"), None);
        assert_eq!(parse_stat(") 12 (x"), None);
        assert_eq!(
            parse_stat(&stat_line(1, "x", 0).replace(" 1234 ", " -5 ")),
            None
        );
    }

    #[test]
    fn cgroup_usage_is_read_in_nanoseconds() {
        assert_eq!(
            parse_cgroup_usage_ns("123456789\n", CgroupFormat::V1Usage),
            Some(123_456_789)
        );
        let stat = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\n";
        assert_eq!(
            parse_cgroup_usage_ns(stat, CgroupFormat::V2Stat),
            Some(1_500_000)
        );
        assert_eq!(
            parse_cgroup_usage_ns("user_usec 1\n", CgroupFormat::V2Stat),
            None
        );
        assert_eq!(parse_cgroup_usage_ns("", CgroupFormat::V1Usage), None);
    }

    #[test]
    fn descendants_follow_every_generation_but_not_siblings() {
        let p = |pid, ppid| ProcStat {
            pid,
            comm: String::new(),
            ppid,
            utime: 0,
            stime: 0,
        };
        // 1 → 10 (server) → 11 (bwrap) → 12 (bwrap) → 13 (node); 10 → 14; 1 → 20 → 21.
        let all = [
            p(1, 0),
            p(10, 1),
            p(11, 10),
            p(12, 11),
            p(13, 12),
            p(14, 10),
            p(20, 1),
            p(21, 20),
        ];
        assert_eq!(descendants(&all, 10), vec![11, 12, 13, 14]);
        assert_eq!(descendants(&all, 13), Vec::<u32>::new());
    }

    #[test]
    fn instance_ids_come_from_both_socket_layouts() {
        assert_eq!(
            instance_id(Path::new("/d/run/fn-7-abc/sock/fn.sock")).as_deref(),
            Some("fn-7-abc")
        );
        assert_eq!(
            instance_id(Path::new("/d/run/g-3/fn.sock")).as_deref(),
            Some("g-3")
        );
    }

    #[test]
    fn the_cpu_cgroup_prefers_v1_cpuacct_over_v2() {
        let hybrid = "9:name=systemd:/\n4:memory:/sless-ab/i1\n2:cpuacct:/sless-ab/i1\n\
                      1:cpu:/sless-ab/i1\n0::/\n";
        assert_eq!(cpu_cgroup_of(hybrid), Some((false, "/sless-ab/i1".into())));
        let comounted = "3:cpu,cpuacct:/x/i2\n0::/\n";
        assert_eq!(cpu_cgroup_of(comounted), Some((false, "/x/i2".into())));
        assert_eq!(
            cpu_cgroup_of("0::/sless-ab/i3\n"),
            Some((true, "/sless-ab/i3".into()))
        );
        assert_eq!(cpu_cgroup_of("4:memory:/a\n"), None);
    }

    #[test]
    fn accounting_files_are_found_through_mountinfo() {
        let mountinfo = "\
30 24 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
31 30 0:27 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw\n\
33 30 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:7 - cgroup cgroup rw,cpu\n\
34 30 0:30 /outer /sys/fs/cgroup/cpu\\040acct rw,relatime - cgroup cgroup rw,cpuacct\n";
        let v1 = cpu_mount(mountinfo, false).expect("v1 mount");
        assert_eq!(
            v1,
            CgroupMount {
                v2: false,
                root: "/outer".into(),
                mount_point: "/sys/fs/cgroup/cpu acct".into()
            }
        );
        assert_eq!(
            accounting_file(&v1, "/outer/sless-ab/i1"),
            Some((
                PathBuf::from("/sys/fs/cgroup/cpu acct/sless-ab/i1/cpuacct.usage"),
                CgroupFormat::V1Usage
            ))
        );
        assert_eq!(accounting_file(&v1, "/elsewhere/i1"), None);
        let v2 = cpu_mount(mountinfo, true).expect("v2 mount");
        assert_eq!(
            accounting_file(&v2, "/sless-ab/i3"),
            Some((
                PathBuf::from("/sys/fs/cgroup/unified/sless-ab/i3/cpu.stat"),
                CgroupFormat::V2Stat
            ))
        );
        assert_eq!(cpu_mount("", false), None);
    }

    #[test]
    fn this_process_has_a_readable_cpu_counter() {
        let me = CpuSource::process(std::process::id()).expect("clock tick");
        let first = me.read_ns().expect("read own stat");
        // Burn a little CPU; the counter must not go backwards.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(me.read_ns().expect("read again") >= first);
    }
}
