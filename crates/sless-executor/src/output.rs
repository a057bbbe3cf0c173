//! Knowing when an instance's output is in its log: [`settled`] waits until each
//! stdout/stderr pump of a pool has found its pipe empty after the wait began.
//!
//! The shims write (flush into the pipe) everything a handler printed before they
//! answer the request. So a pipe found empty after the answer arrived holds nothing
//! more of that request: its lines (and every complete line written before) are in
//! the log. A line still missing its newline is held by the pump until its newline
//! comes, and is not counted.
//!
//! "Empty" is asked of the kernel (`poll(2)` with no timeout), not taken from the
//! reactor's readiness, which may not yet have seen bytes written just before the
//! answer. Only a pump with a waiter asks: without one, parking costs the pump an
//! atomic load and (when its task changed) a waker registration, and wakes nobody.

use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::task::AtomicWaker;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;

/// One output pipe of an instance, as its pump reports on it.
#[derive(Default)]
pub(crate) struct Pipe {
    /// Times the pump, asked by a waiter, found the pipe empty.
    drained: AtomicU64,
    /// The pump reached the end of the pipe (or stopped reading it).
    closed: AtomicBool,
    /// Waiters registered on this pipe; the pump looks into the pipe only when there are any.
    waiters: AtomicUsize,
    /// Poked when `drained` ticks or the pipe closes.
    changed: Notify,
    /// The pump's task while it is parked, so a waiter can have it look again.
    pump: AtomicWaker,
}

impl Pipe {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The pump has nothing to read and is about to park; `empty` asks whether the
    /// pipe really is empty (called only when someone waits).
    pub fn on_park(&self, waker: &Waker, empty: impl FnOnce() -> bool) {
        self.pump.register(waker);
        if self.waiters.load(Ordering::Acquire) > 0 && empty() {
            self.drained.fetch_add(1, Ordering::AcqRel);
            self.changed.notify_waiters();
        }
    }

    /// The pump is done with the pipe.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Resolves once the pump found the pipe empty after this call, or the pipe closed.
    async fn drained_from_now(&self) {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        let _registered = Registered(&self.waiters);
        let mut changed = std::pin::pin!(self.changed.notified());
        // Enabled before reading the counter, so a tick between the read and the
        // first wait is not missed.
        changed.as_mut().enable();
        let seen = self.drained.load(Ordering::Acquire);
        // A parked pump looks again, now that someone waits: into the pipe when it
        // has nothing to read, or it reads what arrived and looks once it has.
        self.pump.wake();
        loop {
            if self.closed.load(Ordering::Acquire) || self.drained.load(Ordering::Acquire) != seen {
                return;
            }
            changed.as_mut().await;
            changed.set(self.changed.notified());
            changed.as_mut().enable();
        }
    }
}

/// Unregisters a waiter when its wait ends (or is dropped).
struct Registered<'a>(&'a AtomicUsize);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Marks its pipe closed when the pump ends, however it ends.
pub(crate) struct CloseOnDrop(pub Arc<Pipe>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Wraps a pump's reader: a read that parks tells its [`Pipe`].
pub(crate) struct Watched<R> {
    inner: R,
    pipe: Arc<Pipe>,
}

impl<R> Watched<R> {
    pub fn new(inner: R, pipe: Arc<Pipe>) -> Self {
        Self { inner, pipe }
    }
}

/// Whether nothing can be read from `fd` right now: no bytes and no end of file.
/// An error says "not known to be empty", so a waiter waits on (up to its limit).
fn is_empty(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
}

impl<R: AsyncRead + AsFd + Unpin> AsyncRead for Watched<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if polled.is_pending() {
            let fd = this.inner.as_fd();
            this.pipe.on_park(cx.waker(), || is_empty(fd));
        }
        polled
    }
}

/// The output pipes of the instances a pool has run, kept while their pumps read.
#[derive(Default)]
pub(crate) struct Outputs(Mutex<Vec<Weak<Pipe>>>);

impl Outputs {
    /// Follows `pipes` (an instance's) until their pumps end.
    pub fn add(&self, pipes: &[Arc<Pipe>]) {
        if pipes.is_empty() {
            return;
        }
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|p| {
            p.upgrade()
                .is_some_and(|p| !p.closed.load(Ordering::Acquire))
        });
        all.extend(pipes.iter().map(Arc::downgrade));
    }

    /// The pipes still being read.
    fn live(&self) -> Vec<Arc<Pipe>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|p| !p.closed.load(Ordering::Acquire))
            .collect()
    }

    /// See [`settled`].
    pub fn settled(&self, limit: Duration) -> impl Future<Output = bool> + Send + 'static {
        settled(self.live(), limit)
    }
}

/// Resolves with `true` once each of `pipes` has been found empty (or closed) after
/// this call, or with `false` when `limit` passes first (a process that keeps
/// writing from a background thread never leaves its pipe empty for long).
pub(crate) async fn settled(pipes: Vec<Arc<Pipe>>, limit: Duration) -> bool {
    let all = futures::future::join_all(pipes.iter().map(|p| p.drained_from_now()));
    tokio::time::timeout(limit, all).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::unix::pipe;

    /// A real pipe whose read end is pumped into a channel of lines, as instance
    /// output is; the pump takes `per_line` over each line (the paused clock's time).
    fn pumped(
        per_line: Duration,
    ) -> (
        pipe::Sender,
        Arc<Pipe>,
        tokio::sync::mpsc::UnboundedReceiver<String>,
    ) {
        let (tx, rx) = pipe::pipe().expect("pipe");
        let state = Pipe::new();
        let (lines_tx, lines) = tokio::sync::mpsc::unbounded_channel();
        let watched = state.clone();
        tokio::spawn(async move {
            let _close = CloseOnDrop(watched.clone());
            let mut reader = BufReader::new(Watched::new(rx, watched));
            let mut line = String::new();
            while reader.read_line(&mut line).await.unwrap_or(0) > 0 {
                if !per_line.is_zero() {
                    tokio::time::sleep(per_line).await;
                }
                let _ = lines_tx.send(std::mem::take(&mut line));
            }
        });
        (tx, state, lines)
    }

    #[tokio::test]
    async fn settles_once_the_pump_has_read_everything_written_before() {
        let (mut tx, state, mut lines) = pumped(Duration::ZERO);
        for i in 0..200 {
            tx.write_all(format!("line {i}\n").as_bytes())
                .await
                .expect("write");
        }
        assert!(settled(vec![state.clone()], Duration::from_secs(10)).await);
        let mut got = 0;
        while lines.try_recv().is_ok() {
            got += 1;
        }
        assert_eq!(got, 200, "every line written before was read");
        // An idle pipe settles at once (the parked pump looks again), every time.
        for _ in 0..3 {
            assert!(settled(vec![state.clone()], Duration::from_secs(10)).await);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pipe_that_never_empties_times_out() {
        // Lines the pump needs 10 ms each for: 20 s of work, never an empty pipe.
        let (mut tx, state, _lines) = pumped(Duration::from_millis(10));
        // 10 KiB: fits the pipe, so the writes complete before the wait begins.
        for _ in 0..2048 {
            tx.write_all(b"busy\n").await.expect("write");
        }
        let started = tokio::time::Instant::now();
        assert!(!settled(vec![state.clone()], Duration::from_secs(1)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        // Once the pump catches up, it settles.
        assert!(settled(vec![state], Duration::from_secs(60)).await);
    }

    #[tokio::test]
    async fn closed_pipes_and_no_pipes_settle_at_once() {
        assert!(settled(Vec::new(), Duration::ZERO).await);
        let (tx, state, _lines) = pumped(Duration::ZERO);
        drop(tx);
        assert!(settled(vec![state.clone()], Duration::from_secs(5)).await);
        let outputs = Outputs::default();
        outputs.add(&[state]);
        assert!(outputs.settled(Duration::from_secs(5)).await);
    }
}
