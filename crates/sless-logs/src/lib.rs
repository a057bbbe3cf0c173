//! Per-function logs: build output, instance stdout/stderr and platform messages,
//! kept in files bounded in size, with live following for `logs?follow=true`.
//!
//! Each function has `<dir>/<namespace>/<name>.log`; when it grows past half the
//! budget it is rotated to `.log.1`, so a function never holds more than the
//! budget on disk while the newest lines are always kept.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

/// How many lines a slow follower may fall behind before it skips ahead.
const FOLLOW_BUFFER: usize = 1024;
/// Longest line kept; longer output is cut so one runaway print cannot fill the log.
pub const MAX_LINE: usize = 16 * 1024;
/// How much of a log file [`LogStore::tail`] reads at a time, from the end backwards.
const TAIL_CHUNK: u64 = 64 * 1024;

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

    /// The last `n` lines, oldest first. Reads only as much of the files as those
    /// lines take, from the end, on a blocking thread.
    pub async fn tail(&self, namespace: &str, name: &str, n: usize) -> io::Result<Vec<String>> {
        let log = self.get(namespace, name);
        tokio::task::spawn_blocking(move || log.tail(n, TAIL_CHUNK))
            .await
            .map_err(io::Error::other)?
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

impl FunctionLog {
    /// The last `n` lines of the rotated and the current file, reading `chunk`
    /// bytes at a time from the end. Blocking.
    fn tail(&self, n: usize, chunk: u64) -> io::Result<Vec<String>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        // Open both files under the writers' lock, so no rotation falls between the two
        // opens, and note how long the current one is: what is appended later is not
        // part of this tail. The reads happen after the lock is released; a rotation
        // meanwhile renames the files, which leaves open descriptors reading the same data.
        let (mut current, rotated) = {
            let _guard = self.file.lock().unwrap_or_else(|e| e.into_inner());
            (
                open_with_len(&self.path)?,
                open_with_len(&rotated(&self.path))?,
            )
        };
        let mut lines = match &mut current {
            Some((file, len)) => last_lines(file, *len, n, chunk)?,
            None => Vec::new(),
        };
        match rotated {
            Some((mut file, len)) if lines.len() < n => {
                let mut older = last_lines(&mut file, len, n - lines.len(), chunk)?;
                older.append(&mut lines);
                Ok(older)
            }
            _ => Ok(lines),
        }
    }
}

/// Opens `path` with its current length; `None` when it does not exist.
fn open_with_len(path: &Path) -> io::Result<Option<(File, u64)>> {
    match File::open(path) {
        Ok(file) => {
            let len = file.metadata()?.len();
            Ok(Some((file, len)))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The last `n` lines in the first `len` bytes of `file`, oldest first, read
/// backwards `chunk` bytes at a time until `n` whole lines are in hand.
fn last_lines(file: &mut File, len: u64, n: usize, chunk: u64) -> io::Result<Vec<String>> {
    // The final newline ends the last line; it separates nothing.
    let end = len;
    let mut start = end;
    // Chunks newest first, joined once at the end (joining as they come would copy
    // everything read so far again with every chunk).
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut separators = 0usize;
    while start > 0 && separators < n {
        let from = start.saturating_sub(chunk.max(1));
        let mut piece = vec![0u8; usize::try_from(start - from).map_err(io::Error::other)?];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(&mut piece)?;
        let last = if start == end {
            piece.len().saturating_sub(1)
        } else {
            piece.len()
        };
        separators += piece[..last].iter().filter(|&&b| b == b'\n').count();
        chunks.push(piece);
        start = from;
    }
    chunks.reverse();
    let buf = chunks.concat();
    if buf.is_empty() {
        return Ok(Vec::new());
    }
    let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
    let mut pieces: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    // Unless the read reached the start of the file, the first piece is the end of
    // a line that began before it.
    if start > 0 {
        pieces.remove(0);
    }
    let skip = pieces.len().saturating_sub(n);
    Ok(pieces[skip..]
        .iter()
        .map(|line| String::from_utf8_lossy(line).into_owned())
        .collect())
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

    #[tokio::test]
    async fn tail_returns_newest_lines_last() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_path_buf(), 1 << 20).unwrap();
        let sink = store.sink("default", "hello");
        for i in 0..10 {
            sink.line("stdout", &format!("line {i}\n"));
        }
        let tail = store.tail("default", "hello", 3).await.unwrap();
        assert_eq!(tail.len(), 3);
        assert!(tail[0].ends_with("[stdout] line 7"), "{tail:?}");
        assert!(tail[2].ends_with("[stdout] line 9"), "{tail:?}");
    }

    #[tokio::test]
    async fn size_is_bounded_and_newest_lines_survive() {
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
        let tail = store.tail("ns", "f", 1).await.unwrap();
        assert!(tail[0].ends_with("message number 1999"));
    }

    #[tokio::test]
    async fn remove_deletes_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_path_buf(), 1 << 20).unwrap();
        store.sink("ns", "f").line("build", "x");
        store.remove("ns", "f");
        assert!(store.tail("ns", "f", 10).await.unwrap().is_empty());
    }

    /// Every line of both files, oldest first: what `tail` must agree with.
    fn all_lines(log: &FunctionLog) -> Vec<String> {
        let mut lines = Vec::new();
        for path in [rotated(&log.path), log.path.clone()] {
            if let Ok(text) = fs::read_to_string(&path) {
                lines.extend(text.lines().map(str::to_string));
            }
        }
        lines
    }

    #[test]
    fn tail_spans_the_rotated_file_for_any_chunk_size() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_path_buf(), 4 * 1024).unwrap();
        let sink = store.sink("ns", "f");
        for i in 0..100 {
            sink.line("stdout", &format!("line {i}"));
        }
        let log = store.get("ns", "f");
        assert!(rotated(&log.path).exists(), "the log has rotated");
        let all = all_lines(&log);
        let current = fs::read_to_string(&log.path).unwrap().lines().count();
        assert!(all.len() > current, "both files hold lines");
        for chunk in [1, 7, 64, 1000, TAIL_CHUNK] {
            for n in [
                1,
                current - 1,
                current,
                current + 1,
                all.len(),
                all.len() + 5,
            ] {
                let want = &all[all.len().saturating_sub(n)..];
                assert_eq!(log.tail(n, chunk).unwrap(), want, "n={n} chunk={chunk}");
            }
        }
        assert!(all.last().unwrap().ends_with("line 99"));
    }

    #[test]
    fn tail_reads_lines_longer_than_a_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_path_buf(), 1 << 20).unwrap();
        let sink = store.sink("ns", "f");
        let long = "x".repeat(5000);
        sink.line("stdout", "first");
        sink.line("stdout", &long);
        sink.line("stdout", "");
        sink.line("stdout", &long);
        let log = store.get("ns", "f");
        let all = all_lines(&log);
        for chunk in [3, 100, 4999, 5000, 5001] {
            for n in 1..=5 {
                let want = &all[all.len().saturating_sub(n)..];
                assert_eq!(log.tail(n, chunk).unwrap(), want, "n={n} chunk={chunk}");
            }
        }
        assert!(log.tail(1, 100).unwrap()[0].ends_with(&long));
    }

    #[test]
    fn tail_of_nothing_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_path_buf(), 1 << 20).unwrap();
        let log = store.get("ns", "never-written");
        assert!(log.tail(10, 16).unwrap().is_empty());
        store.sink("ns", "f").line("stdout", "one");
        assert!(store.get("ns", "f").tail(0, 16).unwrap().is_empty());
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
