//! Per-function logs: build output, instance stdout/stderr and platform messages,
//! kept in files bounded in size, with live following for `logs?follow=true`.
//!
//! Each function has `<dir>/<namespace>/<name>.log`; when it grows past half the
//! budget it is rotated to `.log.1`, so a function never holds more than the
//! budget on disk while the newest lines are always kept.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

/// How many lines a slow follower may fall behind before it skips ahead.
const FOLLOW_BUFFER: usize = 1024;
/// Longest line kept; longer output is cut so one runaway print cannot fill the log.
pub const MAX_LINE: usize = 16 * 1024;

/// All functions' logs.
pub struct LogStore {
    dir: PathBuf,
    max_bytes: u64,
    logs: Mutex<HashMap<(String, String), Arc<FunctionLog>>>,
}

struct FunctionLog {
    path: PathBuf,
    max_bytes: u64,
    file: Mutex<Option<(File, u64)>>,
    live: broadcast::Sender<String>,
}

/// A cheap handle that appends lines to one function's log.
#[derive(Clone)]
pub struct LogSink(Arc<FunctionLog>);

impl LogStore {
    /// Logs live under `dir`; each function keeps at most `max_bytes` on disk.
    pub fn new(dir: PathBuf, max_bytes: u64) -> io::Result<Self> {
        fs::create_dir_all(&dir)?;
        Ok(Self {
            dir,
            max_bytes: max_bytes.max(1024),
            logs: Mutex::new(HashMap::new()),
        })
    }

    fn get(&self, namespace: &str, name: &str) -> Arc<FunctionLog> {
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        logs.entry((namespace.to_string(), name.to_string()))
            .or_insert_with(|| {
                Arc::new(FunctionLog {
                    path: self.dir.join(namespace).join(format!("{name}.log")),
                    max_bytes: self.max_bytes,
                    file: Mutex::new(None),
                    live: broadcast::channel(FOLLOW_BUFFER).0,
                })
            })
            .clone()
    }

    /// A handle to append to a function's log.
    pub fn sink(&self, namespace: &str, name: &str) -> LogSink {
        LogSink(self.get(namespace, name))
    }

    /// The last `n` lines, oldest first.
    pub fn tail(&self, namespace: &str, name: &str, n: usize) -> io::Result<Vec<String>> {
        let log = self.get(namespace, name);
        // Hold the writer lock so a rotation cannot happen between the two reads.
        let _guard = log.file.lock().unwrap_or_else(|e| e.into_inner());
        let mut lines = Vec::new();
        for path in [rotated(&log.path), log.path.clone()] {
            match File::open(&path) {
                Ok(f) => {
                    for line in BufReader::new(f).lines() {
                        lines.push(line?);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let skip = lines.len().saturating_sub(n);
        lines.drain(..skip);
        Ok(lines)
    }

    /// New lines of a function's log as they are written.
    pub fn subscribe(&self, namespace: &str, name: &str) -> broadcast::Receiver<String> {
        self.get(namespace, name).live.subscribe()
    }

    /// Forgets a function's log and deletes its files (the function was deleted).
    pub fn remove(&self, namespace: &str, name: &str) {
        let log = self
            .logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(namespace.to_string(), name.to_string()));
        let path = log
            .map(|l| l.path.clone())
            .unwrap_or_else(|| self.dir.join(namespace).join(format!("{name}.log")));
        let _ = fs::remove_file(rotated(&path));
        let _ = fs::remove_file(&path);
    }
}

fn rotated(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

impl LogSink {
    /// Appends one line, stamped with the time and the stream it came from
    /// (`build`, `stdout`, `stderr`, `sless`). Failures to write are reported once
    /// through tracing and otherwise ignored: logging must never fail an invocation.
    pub fn line(&self, stream: &str, text: &str) {
        let text = text.trim_end_matches(['\n', '\r']);
        let text = if text.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            &text[..cut]
        } else {
            text
        };
        let stamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let line = format!("{stamp} [{stream}] {text}");
        if let Err(e) = self.append(&line) {
            tracing::warn!(path = %self.0.path.display(), error = %e, "cannot write function log");
        }
        let _ = self.0.live.send(line);
    }

    fn append(&self, line: &str) -> io::Result<()> {
        let log = &self.0;
        let mut guard = log.file.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            if let Some(parent) = log.path.parent() {
                fs::create_dir_all(parent)?;
            }
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log.path)?;
            let len = file.metadata()?.len();
            *guard = Some((file, len));
        }
        let Some((file, len)) = guard.as_mut() else {
            return Ok(());
        };
        if *len + line.len() as u64 + 1 > log.max_bytes / 2 {
            fs::rename(&log.path, rotated(&log.path))?;
            *file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log.path)?;
            *len = 0;
        }
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        file.write_all(&buf)?;
        *len += buf.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_returns_newest_lines_last() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_path_buf(), 1 << 20).unwrap();
        let sink = store.sink("default", "hello");
        for i in 0..10 {
            sink.line("stdout", &format!("line {i}\n"));
        }
        let tail = store.tail("default", "hello", 3).unwrap();
        assert_eq!(tail.len(), 3);
        assert!(tail[0].ends_with("[stdout] line 7"), "{tail:?}");
        assert!(tail[2].ends_with("[stdout] line 9"), "{tail:?}");
    }

    #[test]
    fn size_is_bounded_and_newest_lines_survive() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_path_buf(), 8 * 1024).unwrap();
        let sink = store.sink("ns", "f");
        for i in 0..2000 {
            sink.line("stderr", &format!("message number {i}"));
        }
        let total: u64 = fs::read_dir(dir.path().join("ns"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(total <= 8 * 1024, "{total} bytes on disk");
        let tail = store.tail("ns", "f", 1).unwrap();
        assert!(tail[0].ends_with("message number 1999"));
    }

    #[test]
    fn remove_deletes_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_path_buf(), 1 << 20).unwrap();
        store.sink("ns", "f").line("build", "x");
        store.remove("ns", "f");
        assert!(store.tail("ns", "f", 10).unwrap().is_empty());
    }

    #[tokio::test]
    async fn followers_receive_new_lines() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_path_buf(), 1 << 20).unwrap();
        let mut rx = store.subscribe("ns", "f");
        store.sink("ns", "f").line("stdout", "after subscribe");
        let got = rx.recv().await.unwrap();
        assert!(got.ends_with("[stdout] after subscribe"));
    }
}
