//! cgroups v1 and v2 behind one trait: one cgroup per instance, for its memory,
//! process-count and CPU limits, for freezing it between requests, for killing
//! everything it started and for its OOM and CPU-time counters.
//!
//! Layout: `<hierarchy root>/<cgroup_name>/<instance id>` (on v1 once per controller,
//! e.g. `/sys/fs/cgroup/memory/sless/<id>`, `/sys/fs/cgroup/pids/sless/<id>`,
//! `/sys/fs/cgroup/cpu/sless/<id>` and `/sys/fs/cgroup/freezer/sless/<id>`).

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::CgroupVersion;

/// Upper bound on kill rounds for v1, where a process may fork while we read `cgroup.procs`.
/// The pids limit bounds how many new processes each round can find, so this is never reached
/// in practice; it only keeps a misbehaving kernel from turning a kill into an endless loop.
const MAX_KILL_ROUNDS: usize = 64;

/// The CFS period CPU quotas are expressed in (the kernel's default, 100 ms).
const CPU_PERIOD_US: u64 = 100_000;

/// The CFS quota per [`CPU_PERIOD_US`] for `millicores` (1000 = one CPU).
pub(crate) fn cpu_quota_us(millicores: u32) -> u64 {
    // The kernel refuses quotas under 1 ms.
    (u64::from(millicores) * CPU_PERIOD_US / 1000).max(1000)
}

/// One instance's cgroup (on v1: the same directory name under each controller used).
pub(crate) trait Cgroup: Send + Sync + fmt::Debug {
    /// The files a freshly forked (single-threaded) process writes `0` into to join.
    fn join_files(&self) -> Vec<PathBuf>;
    /// Caps memory (and swap, so the limit cannot be dodged by swapping) at `bytes`.
    fn set_memory_limit(&self, bytes: u64) -> io::Result<()>;
    /// Caps the number of tasks (processes and threads) at `max`.
    fn set_pids_limit(&self, max: u32) -> io::Result<()>;
    /// Caps CPU time at `millicores` thousandths of one CPU; `Ok(false)` when there is
    /// no cpu controller.
    fn set_cpu_limit(&self, millicores: u32) -> io::Result<bool>;
    /// Freezes (stops scheduling) or thaws every process; `Ok(false)` when there is no
    /// freezer.
    fn set_frozen(&self, frozen: bool) -> io::Result<bool>;
    /// CPU time used by the cgroup's processes so far, in nanoseconds.
    fn cpu_usage_ns(&self) -> Option<u64>;
    /// Host pids of the processes currently in the cgroup.
    fn pids(&self) -> Vec<i32>;
    /// SIGKILLs every process in the cgroup, including ones forked while we do it.
    /// Returns how many distinct processes were signalled (0 when v2 `cgroup.kill` did it).
    fn kill_all(&self) -> usize;
    /// How many times the kernel's OOM killer killed a process of this cgroup.
    fn oom_kills(&self) -> u64;
    /// Removes the cgroup directories; fails with `EBUSY` while processes remain.
    fn remove(&self) -> io::Result<()>;
    /// The directories, for logs and tests.
    fn dirs(&self) -> Vec<PathBuf>;
}

/// A mounted cgroup hierarchy usable for limits, as detected at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Hierarchy {
    /// Legacy: one mount per controller.
    V1 {
        memory: Option<PathBuf>,
        pids: Option<PathBuf>,
        cpu: Option<PathBuf>,
        /// Only when mounted apart from `cpu` (co-mounted, `cpu` holds its files).
        cpuacct: Option<PathBuf>,
        freezer: Option<PathBuf>,
    },
    /// Unified: one mount, controllers listed in `cgroup.controllers` (the freezer is
    /// built in: `cgroup.freeze`).
    V2 {
        root: PathBuf,
        memory: bool,
        pids: bool,
        cpu: bool,
    },
}

/// The cgroup mounts found in a mount table (`/proc/self/mounts`).
#[derive(Debug, Default, PartialEq, Eq)]
struct Mounts {
    /// v1 memory controller mount point.
    v1_memory: Option<PathBuf>,
    /// v1 pids controller mount point.
    v1_pids: Option<PathBuf>,
    /// v1 cpu controller mount point (usually shared with cpuacct).
    v1_cpu: Option<PathBuf>,
    /// v1 cpuacct controller mount point (often the same as `v1_cpu`).
    v1_cpuacct: Option<PathBuf>,
    /// v1 freezer controller mount point.
    v1_freezer: Option<PathBuf>,
    /// cgroup2 mount points, in table order.
    v2: Vec<PathBuf>,
}

/// Parses `/proc/self/mounts` text for cgroup mounts.
fn parse_mounts(text: &str) -> Mounts {
    let mut mounts = Mounts::default();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_src), Some(dir), Some(fstype), Some(opts)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        match fstype {
            "cgroup" => {
                for opt in opts.split(',') {
                    match opt {
                        "memory" if mounts.v1_memory.is_none() => {
                            mounts.v1_memory = Some(PathBuf::from(dir));
                        }
                        "pids" if mounts.v1_pids.is_none() => {
                            mounts.v1_pids = Some(PathBuf::from(dir));
                        }
                        "cpu" if mounts.v1_cpu.is_none() => {
                            mounts.v1_cpu = Some(PathBuf::from(dir));
                        }
                        "cpuacct" if mounts.v1_cpuacct.is_none() => {
                            mounts.v1_cpuacct = Some(PathBuf::from(dir));
                        }
                        "freezer" if mounts.v1_freezer.is_none() => {
                            mounts.v1_freezer = Some(PathBuf::from(dir));
                        }
                        _ => {}
                    }
                }
            }
            "cgroup2" => mounts.v2.push(PathBuf::from(dir)),
            _ => {}
        }
    }
    mounts
}

impl Hierarchy {
    /// Finds the hierarchy holding the memory and pids controllers.
    ///
    /// v1 controllers win when mounted: on a "hybrid" host (this one) a cgroup2 mount exists
    /// too, at `/sys/fs/cgroup/unified`, but with no controllers attached to it.
    pub(crate) fn detect() -> Option<Hierarchy> {
        let text = fs::read_to_string("/proc/self/mounts").ok()?;
        let mounts = parse_mounts(&text);
        if mounts.v1_memory.is_some() || mounts.v1_pids.is_some() {
            return Some(Hierarchy::V1 {
                memory: mounts.v1_memory,
                pids: mounts.v1_pids,
                cpuacct: mounts
                    .v1_cpuacct
                    .filter(|dir| Some(dir) != mounts.v1_cpu.as_ref()),
                cpu: mounts.v1_cpu,
                freezer: mounts.v1_freezer,
            });
        }
        mounts.v2.into_iter().find_map(|root| {
            let controllers = fs::read_to_string(root.join("cgroup.controllers")).ok()?;
            let memory = has_word(&controllers, "memory");
            let pids = has_word(&controllers, "pids");
            let cpu = has_word(&controllers, "cpu");
            (memory || pids).then_some(Hierarchy::V2 {
                root,
                memory,
                pids,
                cpu,
            })
        })
    }

    pub(crate) fn version(&self) -> CgroupVersion {
        match self {
            Hierarchy::V1 { .. } => CgroupVersion::V1,
            Hierarchy::V2 { .. } => CgroupVersion::V2,
        }
    }

    pub(crate) fn memory(&self) -> bool {
        match self {
            Hierarchy::V1 { memory, .. } => memory.is_some(),
            Hierarchy::V2 { memory, .. } => *memory,
        }
    }

    pub(crate) fn pids(&self) -> bool {
        match self {
            Hierarchy::V1 { pids, .. } => pids.is_some(),
            Hierarchy::V2 { pids, .. } => *pids,
        }
    }

    pub(crate) fn cpu(&self) -> bool {
        match self {
            Hierarchy::V1 { cpu, .. } => cpu.is_some(),
            Hierarchy::V2 { cpu, .. } => *cpu,
        }
    }

    /// Whether instances can be frozen (v2 always has `cgroup.freeze`, Linux 5.2+).
    pub(crate) fn freezer(&self) -> bool {
        match self {
            Hierarchy::V1 { freezer, .. } => freezer.is_some(),
            Hierarchy::V2 { root, .. } => root.join("cgroup.stat").exists(),
        }
    }

    /// The v1 controller mounts in use, in a fixed order.
    fn v1_roots(&self) -> Vec<&PathBuf> {
        match self {
            Hierarchy::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => [memory, pids, cpu, cpuacct, freezer]
                .into_iter()
                .flatten()
                .collect(),
            Hierarchy::V2 { .. } => Vec::new(),
        }
    }

    /// The `<root>/<name>` parent directories (one per v1 controller).
    pub(crate) fn parents(&self, name: &str) -> Vec<PathBuf> {
        match self {
            Hierarchy::V1 { .. } => self
                .v1_roots()
                .into_iter()
                .map(|root| root.join(name))
                .collect(),
            Hierarchy::V2 { root, .. } => vec![root.join(name)],
        }
    }

    /// Creates the `<name>` parent cgroup and turns on the controllers its children need.
    pub(crate) fn prepare(&self, name: &str) -> io::Result<()> {
        match self {
            Hierarchy::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => {
                if let Some(root) = memory {
                    let parent = root.join(name);
                    create_dir(&parent)?;
                    // Hierarchical accounting makes a future limit on `<name>` itself cover
                    // all instances. The kernel only lets it change while the cgroup has no
                    // children, and most hosts already inherit 1 from the root, so failing
                    // here is not fatal: per-instance limits work either way.
                    let flag = parent.join("memory.use_hierarchy");
                    if fs::read_to_string(&flag).is_ok_and(|v| v.trim() == "0")
                        && let Err(err) = fs::write(&flag, "1")
                    {
                        tracing::debug!(path = %flag.display(), %err, "cannot enable memory.use_hierarchy");
                    }
                }
                if let Some(root) = pids {
                    create_dir(&root.join(name))?;
                }
                // Optional: where these cannot be made, instances start without them.
                for root in [cpu, cpuacct, freezer].into_iter().flatten() {
                    if let Err(err) = create_dir(&root.join(name)) {
                        tracing::warn!(%err, "cannot create the instances' parent cgroup; its limit is NOT enforced");
                    }
                }
                Ok(())
            }
            Hierarchy::V2 {
                root,
                memory,
                pids,
                cpu,
            } => {
                let wanted: Vec<&str> = [(*memory, "memory"), (*pids, "pids")]
                    .into_iter()
                    .filter_map(|(on, c)| on.then_some(c))
                    .collect();
                // v2 only offers a controller to a cgroup when its parent enables it in
                // `cgroup.subtree_control`: first the root for `<name>`, then `<name>` for
                // the instances.
                enable_controllers(root, &wanted)?;
                let parent = root.join(name);
                create_dir(&parent)?;
                enable_controllers(&parent, &wanted)?;
                // The cpu controller came later than the memory and pids limits: without it
                // instances still start, and `set_cpu_limit` finds no `cpu.max`.
                if *cpu
                    && let Err(err) = enable_controllers(root, &["cpu"])
                        .and_then(|()| enable_controllers(&parent, &["cpu"]))
                {
                    tracing::warn!(%err, "cannot enable the cpu controller; CPU limits are NOT enforced");
                }
                Ok(())
            }
        }
    }

    /// Creates the cgroup of one instance. Fails if it exists already: ids are unique, so an
    /// existing one belongs to someone else (or to a crashed run, which `reap_stale` cleans).
    pub(crate) fn create(&self, name: &str, id: &str) -> io::Result<Arc<dyn Cgroup>> {
        match self.create_once(name, id) {
            // Another `Sandbox` with this name removed the empty parent when it was
            // dropped; set it up again.
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                self.prepare(name)?;
                self.create_once(name, id)
            }
            other => other,
        }
    }

    fn create_once(&self, name: &str, id: &str) -> io::Result<Arc<dyn Cgroup>> {
        match self {
            Hierarchy::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => {
                let at = |root: &Option<PathBuf>| root.as_ref().map(|r| r.join(name).join(id));
                let mut cgroup = V1Cgroup {
                    memory: at(memory),
                    pids: at(pids),
                    cpu: None,
                    cpuacct: None,
                    freezer: None,
                };
                for dir in cgroup.dirs() {
                    if let Err(err) = fs::create_dir(&dir) {
                        // Undo the half that was made so a retry starts clean.
                        let _ = cgroup.remove();
                        return Err(with_path(err, &dir));
                    }
                }
                // CPU and freezer came later than the memory and pids limits: an instance
                // still starts (without them) where their cgroups cannot be made.
                let optional = |root: &Option<PathBuf>| {
                    let dir = at(root)?;
                    match fs::create_dir(&dir) {
                        Ok(()) => Some(dir),
                        Err(err) => {
                            tracing::warn!(path = %dir.display(), %err, "cannot create an instance cgroup; its limit is NOT enforced");
                            None
                        }
                    }
                };
                cgroup.cpu = optional(cpu);
                cgroup.cpuacct = optional(cpuacct);
                cgroup.freezer = optional(freezer);
                Ok(Arc::new(cgroup))
            }
            Hierarchy::V2 { root, cpu, .. } => {
                let dir = root.join(name).join(id);
                fs::create_dir(&dir).map_err(|err| with_path(err, &dir))?;
                Ok(Arc::new(V2Cgroup { dir, cpu: *cpu }))
            }
        }
    }

    /// The instance cgroups currently under `<name>` (left by this or an earlier run).
    pub(crate) fn existing(&self, name: &str) -> Vec<Arc<dyn Cgroup>> {
        let ids: Vec<String> = {
            let mut ids = HashSet::new();
            for parent in self.parents(name) {
                let Ok(entries) = fs::read_dir(&parent) else {
                    continue;
                };
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir())
                        && let Some(id) = entry.file_name().to_str()
                    {
                        ids.insert(id.to_owned());
                    }
                }
            }
            let mut ids: Vec<String> = ids.into_iter().collect();
            ids.sort();
            ids
        };
        ids.into_iter()
            .map(|id| -> Arc<dyn Cgroup> {
                match self {
                    Hierarchy::V1 {
                        memory,
                        pids,
                        cpu,
                        cpuacct,
                        freezer,
                    } => {
                        let at = |root: &Option<PathBuf>| {
                            root.as_ref()
                                .map(|r| r.join(name).join(&id))
                                .filter(|dir| dir.is_dir())
                        };
                        Arc::new(V1Cgroup {
                            memory: at(memory),
                            pids: at(pids),
                            cpu: at(cpu),
                            cpuacct: at(cpuacct),
                            freezer: at(freezer),
                        })
                    }
                    Hierarchy::V2 { root, cpu, .. } => Arc::new(V2Cgroup {
                        dir: root.join(name).join(&id),
                        cpu: *cpu,
                    }),
                }
            })
            .collect()
    }
}

/// Kills everything in `cgroup`, waits (bounded) until it is empty and removes it.
/// Returns how many processes were signalled.
pub(crate) fn kill_and_remove(cgroup: &dyn Cgroup, timeout: Duration) -> io::Result<usize> {
    // v2's `cgroup.kill` does not say how many it killed; the listing just before does.
    let listed = cgroup.pids().len();
    let killed = cgroup.kill_all().max(listed);
    let deadline = Instant::now() + timeout;
    // SIGKILLed processes leave `cgroup.procs` only once the kernel has torn them down
    // (freeing a large address space takes a moment), and `rmdir` fails until then.
    while !cgroup.pids().is_empty() {
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "processes still in {:?} {timeout:?} after SIGKILL",
                    cgroup.dirs()
                ),
            ));
        }
        cgroup.kill_all();
        std::thread::sleep(Duration::from_millis(1));
    }
    cgroup.remove()?;
    Ok(killed)
}

/// cgroup v1: a directory under each controller mount in use.
#[derive(Debug)]
struct V1Cgroup {
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
    cpu: Option<PathBuf>,
    /// Set only when cpuacct is mounted apart from cpu.
    cpuacct: Option<PathBuf>,
    freezer: Option<PathBuf>,
}

impl Cgroup for V1Cgroup {
    fn join_files(&self) -> Vec<PathBuf> {
        // `tasks` moves only the writing thread, which for a just-forked child is the whole
        // process. The kernel then skips the global threadgroup lock that a `cgroup.procs`
        // write takes, whose RCU grace period costs 5-15 ms per start here.
        self.dirs().into_iter().map(|d| d.join("tasks")).collect()
    }

    fn set_memory_limit(&self, bytes: u64) -> io::Result<()> {
        let Some(dir) = &self.memory else {
            return Ok(());
        };
        let limit = dir.join("memory.limit_in_bytes");
        // Without swap accounting (`swapaccount=0`) the memsw files do not exist and the
        // memory limit alone applies. The kernel keeps memory <= memsw at every step, so
        // lowering sets the memory limit first and raising sets memsw first.
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        if !memsw.exists() {
            return write_file(&limit, &bytes.to_string());
        }
        match write_file(&limit, &bytes.to_string()) {
            Ok(()) => write_file(&memsw, &bytes.to_string()),
            Err(_) => {
                write_file(&memsw, &bytes.to_string())?;
                write_file(&limit, &bytes.to_string())
            }
        }
    }

    fn set_pids_limit(&self, max: u32) -> io::Result<()> {
        match &self.pids {
            Some(dir) => write_file(&dir.join("pids.max"), &max.to_string()),
            None => Ok(()),
        }
    }

    fn set_cpu_limit(&self, millicores: u32) -> io::Result<bool> {
        let Some(dir) = &self.cpu else {
            return Ok(false);
        };
        write_file(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
        write_file(
            &dir.join("cpu.cfs_quota_us"),
            &cpu_quota_us(millicores).to_string(),
        )?;
        Ok(true)
    }

    fn set_frozen(&self, frozen: bool) -> io::Result<bool> {
        let Some(dir) = &self.freezer else {
            return Ok(false);
        };
        let state = if frozen { "FROZEN" } else { "THAWED" };
        write_file(&dir.join("freezer.state"), state)?;
        Ok(true)
    }

    fn cpu_usage_ns(&self) -> Option<u64> {
        let dir = self.cpuacct.as_ref().or(self.cpu.as_ref())?;
        let text = fs::read_to_string(dir.join("cpuacct.usage")).ok()?;
        text.trim().parse().ok()
    }

    fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .dirs()
            .iter()
            .flat_map(|dir| read_procs(&dir.join("cgroup.procs")))
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    fn kill_all(&self) -> usize {
        let killed = kill_in_rounds(|| self.pids());
        // On v1 a frozen process acts on SIGKILL only once thawed.
        if let Err(err) = self.set_frozen(false) {
            tracing::debug!(%err, "cannot thaw a cgroup being killed");
        }
        killed
    }

    fn oom_kills(&self) -> u64 {
        self.memory
            .as_ref()
            .and_then(|dir| fs::read_to_string(dir.join("memory.oom_control")).ok())
            .and_then(|text| keyed_value(&text, "oom_kill"))
            .unwrap_or(0)
    }

    fn remove(&self) -> io::Result<()> {
        remove_dirs(&self.dirs())
    }

    fn dirs(&self) -> Vec<PathBuf> {
        [
            &self.memory,
            &self.pids,
            &self.cpu,
            &self.cpuacct,
            &self.freezer,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
    }
}

/// cgroup v2: one directory in the unified hierarchy.
#[derive(Debug)]
struct V2Cgroup {
    dir: PathBuf,
    /// The cpu controller is enabled for it.
    cpu: bool,
}

impl Cgroup for V2Cgroup {
    fn join_files(&self) -> Vec<PathBuf> {
        // v2 has no per-thread move across domains; `cgroup.procs` it is.
        vec![self.dir.join("cgroup.procs")]
    }

    fn set_memory_limit(&self, bytes: u64) -> io::Result<()> {
        write_file(&self.dir.join("memory.max"), &bytes.to_string())?;
        // Absent when the kernel has no swap support; then there is nothing to dodge into.
        let swap = self.dir.join("memory.swap.max");
        if swap.exists() {
            write_file(&swap, "0")?;
        }
        // An instance is one unit: when the OOM killer strikes, take all of it down
        // rather than leave a server process whose worker was shot.
        let group = self.dir.join("memory.oom.group");
        if group.exists() {
            write_file(&group, "1")?;
        }
        Ok(())
    }

    fn set_pids_limit(&self, max: u32) -> io::Result<()> {
        write_file(&self.dir.join("pids.max"), &max.to_string())
    }

    fn set_cpu_limit(&self, millicores: u32) -> io::Result<bool> {
        let file = self.dir.join("cpu.max");
        if !self.cpu || !file.exists() {
            return Ok(false);
        }
        let max = format!("{} {CPU_PERIOD_US}", cpu_quota_us(millicores));
        write_file(&file, &max)?;
        Ok(true)
    }

    fn set_frozen(&self, frozen: bool) -> io::Result<bool> {
        let file = self.dir.join("cgroup.freeze");
        if !file.exists() {
            return Ok(false);
        }
        write_file(&file, if frozen { "1" } else { "0" })?;
        Ok(true)
    }

    fn cpu_usage_ns(&self) -> Option<u64> {
        let text = fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
        keyed_value(&text, "usage_usec").map(|us| us.saturating_mul(1000))
    }

    fn pids(&self) -> Vec<i32> {
        read_procs(&self.dir.join("cgroup.procs"))
    }

    fn kill_all(&self) -> usize {
        // `cgroup.kill` (Linux 5.14+) kills atomically, forks in flight included.
        let kill = self.dir.join("cgroup.kill");
        if kill.exists() && fs::write(&kill, "1").is_ok() {
            return 0;
        }
        kill_in_rounds(|| self.pids())
    }

    fn oom_kills(&self) -> u64 {
        fs::read_to_string(self.dir.join("memory.events"))
            .ok()
            .and_then(|text| keyed_value(&text, "oom_kill"))
            .unwrap_or(0)
    }

    fn remove(&self) -> io::Result<()> {
        remove_dirs(std::slice::from_ref(&self.dir))
    }

    fn dirs(&self) -> Vec<PathBuf> {
        vec![self.dir.clone()]
    }
}

/// SIGKILLs the listed processes until a listing shows no process not yet signalled.
///
/// A process that has a SIGKILL pending cannot complete a fork, so once every listed
/// process has been signalled, nothing new can appear (a child created just before its
/// parent got the signal shows up in the next listing and is signalled in turn).
fn kill_in_rounds(list: impl Fn() -> Vec<i32>) -> usize {
    let mut signalled = HashSet::new();
    for _ in 0..MAX_KILL_ROUNDS {
        let mut fresh = false;
        for pid in list() {
            // `kill(0, ..)` and negative pids address process groups (`-1`: everything we
            // may signal); a garbled listing must never turn into one of those.
            if pid <= 0 || !signalled.insert(pid) {
                continue;
            }
            fresh = true;
            // SAFETY: kill(2) takes plain integers and has no memory effects; `pid` is a
            // positive process id read from this cgroup's `cgroup.procs`.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        if !fresh {
            break;
        }
    }
    signalled.len()
}

/// Reads a `cgroup.procs` file; a missing cgroup reads as empty.
fn read_procs(path: &Path) -> Vec<i32> {
    fs::read_to_string(path)
        .map(|text| parse_procs(&text))
        .unwrap_or_default()
}

fn parse_procs(text: &str) -> Vec<i32> {
    text.lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

/// The value of `key` in a flat-keyed file such as `memory.events` (`oom_kill 3`).
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn has_word(text: &str, word: &str) -> bool {
    text.split_whitespace().any(|w| w == word)
}

fn create_dir(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(err) if err.kind() != io::ErrorKind::AlreadyExists => Err(with_path(err, dir)),
        _ => Ok(()),
    }
}

fn enable_controllers(dir: &Path, controllers: &[&str]) -> io::Result<()> {
    let file = dir.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&file).map_err(|err| with_path(err, &file))?;
    for controller in controllers {
        if !has_word(&enabled, controller) {
            write_file(&file, &format!("+{controller}"))?;
        }
    }
    Ok(())
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|err| with_path(err, path))
}

/// Removes every directory, returning the first error; a directory already gone is fine.
fn remove_dirs(dirs: &[PathBuf]) -> io::Result<()> {
    let mut first = None;
    for dir in dirs {
        match fs::remove_dir(dir) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => {
                first.get_or_insert(with_path(err, dir));
            }
            _ => {}
        }
    }
    first.map_or(Ok(()), Err)
}

/// cgroupfs errors are terse (`EBUSY`, `EINVAL`); keep the file they came from.
fn with_path(err: io::Error, path: &Path) -> io::Error {
    io::Error::new(err.kind(), format!("{}: {err}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hybrid_v1_mounts() {
        let table = "\
sysfs /sys sysfs rw,nosuid 0 0
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
";
        let mounts = parse_mounts(table);
        assert_eq!(
            mounts,
            Mounts {
                v1_memory: Some("/sys/fs/cgroup/memory".into()),
                v1_pids: Some("/sys/fs/cgroup/pids".into()),
                v1_cpu: Some("/sys/fs/cgroup/cpu,cpuacct".into()),
                v1_cpuacct: Some("/sys/fs/cgroup/cpu,cpuacct".into()),
                v1_freezer: Some("/sys/fs/cgroup/freezer".into()),
                v2: vec!["/sys/fs/cgroup/unified".into()],
            }
        );
    }

    #[test]
    fn parses_unified_mounts() {
        let table =
            "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n";
        let mounts = parse_mounts(table);
        assert_eq!(mounts.v1_memory, None);
        assert_eq!(mounts.v1_pids, None);
        assert_eq!(mounts.v2, vec![PathBuf::from("/sys/fs/cgroup")]);
    }

    #[test]
    fn reads_oom_kill_counters() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(keyed_value(v1, "oom_kill"), Some(2));
        let v2 = "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed_value(v2, "oom_kill"), Some(1));
        assert_eq!(keyed_value(v2, "oom"), Some(1));
        assert_eq!(keyed_value("oom 1\n", "oom_kill"), None);
    }

    #[test]
    fn parses_procs_and_skips_garbage() {
        assert_eq!(parse_procs("12\n 34\n\nx\n"), vec![12, 34]);
    }

    #[test]
    fn kill_rounds_never_signal_groups_and_stop_when_nothing_is_new() {
        use std::cell::Cell;
        let calls = Cell::new(0);
        // Only non-positive pids are listed, so nothing is signalled and the first round
        // finds nothing fresh.
        let n = kill_in_rounds(|| {
            calls.set(calls.get() + 1);
            vec![0, -1]
        });
        assert_eq!(n, 0);
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn creates_and_lists_cgroups_in_a_fake_v2_tree() {
        // A plain directory stands in for the cgroup2 mount: enough to check the paths and
        // the controller files written, without touching the real hierarchy.
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        fs::write(root.join("cgroup.subtree_control"), "").expect("write");
        fs::create_dir(root.join("sless")).expect("mkdir");
        fs::write(root.join("sless/cgroup.subtree_control"), "memory pids").expect("write");
        let h = Hierarchy::V2 {
            root: root.clone(),
            memory: true,
            pids: true,
            cpu: false,
        };
        h.prepare("sless").expect("prepare");
        // The root had nothing enabled, so the last write there is `+pids`; `sless` had
        // both already and was left alone.
        assert_eq!(
            fs::read_to_string(root.join("cgroup.subtree_control")).expect("read"),
            "+pids"
        );
        assert_eq!(
            fs::read_to_string(root.join("sless/cgroup.subtree_control")).expect("read"),
            "memory pids"
        );

        let cg = h.create("sless", "i-1").expect("create");
        assert_eq!(cg.dirs(), vec![root.join("sless/i-1")]);
        assert!(h.create("sless", "i-1").is_err(), "ids must not be reused");
        cg.set_pids_limit(16).expect("pids");
        assert_eq!(
            fs::read_to_string(root.join("sless/i-1/pids.max")).expect("read"),
            "16"
        );
        let listed: Vec<PathBuf> = h.existing("sless").iter().flat_map(|c| c.dirs()).collect();
        assert_eq!(listed, vec![root.join("sless/i-1")]);
    }

    #[test]
    fn cpu_quota_is_millicores_of_the_period_with_the_kernel_floor() {
        assert_eq!(cpu_quota_us(1000), 100_000);
        assert_eq!(cpu_quota_us(250), 25_000);
        assert_eq!(cpu_quota_us(8000), 800_000);
        assert_eq!(cpu_quota_us(5), 1000);
    }

    #[test]
    fn v2_cpu_limit_freezer_and_usage_go_to_their_files() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        fs::write(root.join("cgroup.subtree_control"), "").expect("write");
        fs::create_dir(root.join("sless")).expect("mkdir");
        fs::write(root.join("sless/cgroup.subtree_control"), "").expect("write");
        let h = Hierarchy::V2 {
            root: root.clone(),
            memory: false,
            pids: true,
            cpu: true,
        };
        h.prepare("sless").expect("prepare");
        // The cpu controller is handed down to the instances like the others.
        assert_eq!(
            fs::read_to_string(root.join("sless/cgroup.subtree_control")).expect("read"),
            "+cpu"
        );
        let cg = h.create("sless", "i-1").expect("create");
        let dir = root.join("sless/i-1");
        // No `cpu.max` (the controller could not be enabled): not applied, no error.
        assert!(!cg.set_cpu_limit(250).expect("cpu"));
        fs::write(dir.join("cpu.max"), "max 100000").expect("write");
        assert!(cg.set_cpu_limit(250).expect("cpu"));
        assert_eq!(
            fs::read_to_string(dir.join("cpu.max")).expect("read"),
            "25000 100000"
        );
        // No `cgroup.freeze` (a kernel before 5.2): nothing to freeze, and no error.
        assert!(!cg.set_frozen(true).expect("freeze"));
        fs::write(dir.join("cgroup.freeze"), "0").expect("write");
        assert!(cg.set_frozen(true).expect("freeze"));
        assert_eq!(
            fs::read_to_string(dir.join("cgroup.freeze")).expect("read"),
            "1"
        );
        assert!(cg.set_frozen(false).expect("thaw"));
        assert_eq!(
            fs::read_to_string(dir.join("cgroup.freeze")).expect("read"),
            "0"
        );
        fs::write(
            dir.join("cpu.stat"),
            "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
        )
        .expect("write");
        assert_eq!(cg.cpu_usage_ns(), Some(1_500_000));

        // Without the cpu controller the limit is reported as not applied.
        let without = V2Cgroup {
            dir: dir.clone(),
            cpu: false,
        };
        assert!(!without.set_cpu_limit(250).expect("cpu"));
    }

    #[test]
    fn v1_cpu_limit_freezer_and_usage_go_to_their_files() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        for ctrl in ["pids", "cpu", "freezer"] {
            fs::create_dir(root.join(ctrl)).expect("mkdir");
        }
        let h = Hierarchy::V1 {
            memory: None,
            pids: Some(root.join("pids")),
            cpu: Some(root.join("cpu")),
            cpuacct: None,
            freezer: Some(root.join("freezer")),
        };
        h.prepare("sless").expect("prepare");
        let cg = h.create("sless", "i-1").expect("create");
        assert_eq!(
            cg.dirs(),
            vec![
                root.join("pids/sless/i-1"),
                root.join("cpu/sless/i-1"),
                root.join("freezer/sless/i-1"),
            ]
        );
        // A new process joins every controller's cgroup.
        assert_eq!(cg.join_files().len(), 3);
        assert!(cg.set_cpu_limit(1500).expect("cpu"));
        let cpu = root.join("cpu/sless/i-1");
        assert_eq!(
            fs::read_to_string(cpu.join("cpu.cfs_quota_us")).expect("read"),
            "150000"
        );
        assert_eq!(
            fs::read_to_string(cpu.join("cpu.cfs_period_us")).expect("read"),
            "100000"
        );
        let state = root.join("freezer/sless/i-1/freezer.state");
        assert!(cg.set_frozen(true).expect("freeze"));
        assert_eq!(fs::read_to_string(&state).expect("read"), "FROZEN");
        // Killing thaws, or a frozen process would never act on its SIGKILL.
        cg.kill_all();
        assert_eq!(fs::read_to_string(&state).expect("read"), "THAWED");
        fs::write(cpu.join("cpuacct.usage"), "123456789\n").expect("write");
        assert_eq!(cg.cpu_usage_ns(), Some(123_456_789));
    }
}
