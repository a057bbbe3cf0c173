//! A broker process that cannot outlive the test binary that started it.
//!
//! Tests keep their brokers in statics, and statics are never dropped, so `Drop`
//! alone would leave brokers running after every test binary. Instead each broker
//! runs under a small `sh` watchdog that leads its own process group and reads its
//! standard input from a pipe this process holds: when the pipe closes (on
//! [`Group::stop`], on drop, or because the test binary exited or was killed), the
//! watchdog stops the broker and kills everything left in the group (the `epmd`
//! RabbitMQ needs included).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// The watchdog. `$1` is the grace period in seconds, `$2` a directory to remove
/// when the owner is gone (empty: none); the rest is the command. `term` on stdin
/// asks for a graceful stop (SIGTERM to the group, SIGKILL after the grace period),
/// `kill` for an immediate one; either keeps the directory (for a restart). End of
/// file means the owner dropped it or died: everything is killed from a new session
/// (so the killer survives the kill), and once the group is gone the directory goes
/// too, since statics holding a broker are never dropped. The trap is set only after
/// the broker started, so the broker still dies of SIGTERM.
const WATCHDOG: &str = r#"
grace=$1; clean=$2; shift 2
"$@" </dev/null &
pid=$!
read -r how || how=gone
trap '' TERM
if [ "$how" = term ]; then
    ( sleep "$grace"; kill -KILL 0 ) &
    kill -TERM 0
    wait "$pid"
fi
if [ "$how" = gone ] && [ -n "$clean" ]; then
    exec setsid sh -c '
        kill -KILL "-$1"
        i=0
        while kill -0 "-$1" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i+1)); done
        rm -rf "$2"' sless-cleanup "$$" "$clean"
fi
kill -KILL 0
"#;

/// One supervised broker process (and whatever it started in its group).
#[derive(Debug)]
pub(crate) struct Group {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Group {
    /// Starts `command` with `args` and `env`, its output appended to `log`;
    /// `cleanup` is removed once the broker is gone because its owner is.
    pub(crate) fn spawn(
        command: &str,
        args: &[String],
        env: &[(String, String)],
        cwd: &Path,
        log: &Path,
        grace: Duration,
        cleanup: Option<&Path>,
    ) -> anyhow::Result<Group> {
        use std::os::unix::process::CommandExt;
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sless-broker")
            .arg(grace.as_secs().max(1).to_string())
            .arg(cleanup.map(|p| p.as_os_str()).unwrap_or_default())
            .arg(command)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {command}"))?;
        let stdin = child.stdin.take();
        Ok(Group { child, stdin })
    }

    /// Whether the watchdog (and so the broker) still runs.
    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` (a name `kill` knows, e.g. `STOP`, `CONT`) to the whole group.
    pub(crate) fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg("--")
            .arg(format!("-{}", self.child.id()))
            .status()
            .context("running kill")?;
        anyhow::ensure!(status.success(), "kill -{signal} failed: {status}");
        Ok(())
    }

    /// Stops the broker: gracefully (SIGTERM, then SIGKILL after the grace period)
    /// or at once, and waits until the watchdog is gone.
    pub(crate) fn stop(&mut self, graceful: bool) {
        if let Some(mut stdin) = self.stdin.take() {
            // A watchdog that already exited closed the pipe: nothing left to stop.
            let _ = stdin.write_all(if graceful { b"term\n" } else { b"kill\n" });
        }
        let _ = self.child.wait();
    }
}

impl Drop for Group {
    /// Closes the pipe without a word: the same path as the test binary dying.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// The running process of a service that is stopped and started again on the same
/// port and data (tests of restarts); empty while it is stopped.
#[derive(Debug, Default)]
pub(crate) struct Slot(std::sync::Mutex<Option<Group>>);

impl Slot {
    /// The process, locked (a test that panicked while holding it poisons nothing).
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Option<Group>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the process if it runs: gracefully (SIGTERM, then SIGKILL after the
    /// grace period) or at once.
    pub(crate) fn stop(&self, graceful: bool) {
        if let Some(mut group) = self.lock().take() {
            group.stop(graceful);
        }
    }

    /// For a (re)start: stops the process if it runs, gracefully, and keeps the slot
    /// locked until the new one is put in it.
    pub(crate) fn restarting(&self) -> std::sync::MutexGuard<'_, Option<Group>> {
        let mut process = self.lock();
        if let Some(mut group) = process.take() {
            group.stop(true);
        }
        process
    }
}

/// Waits until `ready` says yes, the process is gone, or `timeout` passes.
pub(crate) fn wait_until(
    group: &mut Group,
    timeout: Duration,
    what: &str,
    log: &Path,
    mut ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return Ok(());
        }
        if !group.running() {
            anyhow::bail!("{what} exited while starting; see {}", log.display());
        }
        if Instant::now() > deadline {
            anyhow::bail!("{what} not ready after {timeout:?}; see {}", log.display());
        }
        // Polling a process that gives no readiness signal; not test synchronisation.
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pids the script wrote, once it wrote both.
    fn pids(file: &Path) -> Vec<u32> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if pids.len() == 2 {
                return pids;
            }
            assert!(Instant::now() < deadline, "the script never wrote its pids");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn gone(pid: u32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // A killed process may linger as a zombie until its parent reaps it.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z ") {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A broker that forks a helper of its own (as RabbitMQ does with epmd).
    fn spawn_family(dir: &Path, grace: Duration, cleanup: Option<&Path>) -> (Group, Vec<u32>) {
        let pidfile = dir.join("pids");
        let script = format!(
            "sleep 1000 & echo $! > {p}; echo $$ >> {p}; exec sleep 1000",
            p = pidfile.display()
        );
        let group = Group::spawn(
            "sh",
            &["-c".to_owned(), script],
            &[],
            dir,
            &dir.join("log"),
            grace,
            cleanup,
        )
        .expect("spawned");
        (group, pids(&pidfile))
    }

    #[test]
    fn stopping_kills_the_broker_and_what_it_started() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("a data dir");
        let (mut group, pids) = spawn_family(dir.path(), Duration::from_secs(5), Some(&data));
        assert!(group.running());
        group.stop(true);
        assert!(!group.running());
        for pid in pids {
            assert!(gone(pid), "process {pid} survived the stop");
        }
        assert!(data.exists(), "a stop keeps the data for a restart");
    }

    #[test]
    fn closing_the_pipe_kills_at_once() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("a data dir");
        let (group, pids) = spawn_family(dir.path(), Duration::from_secs(600), Some(&data));
        drop(group);
        for pid in pids {
            assert!(gone(pid), "process {pid} survived the drop");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while data.exists() {
            assert!(Instant::now() < deadline, "the data dir outlived its owner");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
