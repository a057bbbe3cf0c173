//! Invocation records off the invoke path: [`Recorder::record`] hands a record to a
//! bounded channel without waiting, and one background task writes them to a
//! [`RecordSink`] (the store implements it) in batches (up to `batch_size`
//! records, or whatever arrived within `batch_interval` of the first). When the channel is full the record is
//! dropped and counted: recording must never slow or fail an invocation.
//!
//! The writer wakes once per batch, not once per record: while a batch gathers it
//! sleeps until the batch's deadline, and a sender nudges it early only when a full
//! batch is queued or a flush is asked for. (Waking a task per record cost more
//! CPU on a busy gateway than writing the records.)
//! [`spawn_retention`] prunes old records.

mod id;
mod retention;
mod sink;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sless_core::invocation::InvocationRecord;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

pub use id::new_id;
pub use retention::{PruneFuture, Retention, spawn_pruning, spawn_retention};
pub use sink::{RecordSink, SinkError};

/// Errors of the recorder.
#[derive(Debug, thiserror::Error)]
pub enum RecorderError {
    /// The writer task is gone (the runtime is shutting down, or it panicked), so
    /// nothing more can be written.
    #[error("the invocation record writer has stopped")]
    Stopped,
}

/// How the recorder buffers and batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecorderConfig {
    /// Records that may wait to be written; more are dropped.
    pub capacity: usize,
    /// Most records written in one transaction.
    pub batch_size: usize,
    /// Longest a record waits for others to share its batch.
    pub batch_interval: Duration,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        Self {
            capacity: 100_000,
            batch_size: 500,
            batch_interval: Duration::from_millis(200),
        }
    }
}

/// Drops are reported in the log at most this often.
const DROP_WARNING_EVERY: Duration = Duration::from_secs(60);

// Nearly every message is a record: boxing it would allocate once per invocation to
// shrink the rare flush.
#[allow(clippy::large_enum_variant)]
enum Message {
    Record(InvocationRecord),
    /// Write everything received so far, then answer.
    Flush(oneshot::Sender<()>),
}

/// Buffers invocation records and writes them in the background.
pub struct Recorder {
    tx: mpsc::Sender<Message>,
    /// Wakes the writer before its batch's deadline (a full batch or a flush).
    nudge: Arc<Notify>,
    batch_size: usize,
    stats: Arc<Stats>,
    /// When drops were last reported in the log.
    last_drop_warning: Mutex<Option<Instant>>,
}

#[derive(Default)]
struct Stats {
    /// Records queued or gathered and not yet handed to the store.
    pending: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    written: AtomicU64,
}

impl Recorder {
    /// Starts the writer task (on the current Tokio runtime). It ends once the
    /// recorder is dropped and every buffered record is written.
    pub fn start(sink: Arc<dyn RecordSink>, config: RecorderConfig) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(config.capacity.max(1));
        let stats = Arc::new(Stats::default());
        let nudge = Arc::new(Notify::new());
        tokio::spawn(write_loop(rx, sink, config, stats.clone(), nudge.clone()));
        Arc::new(Self {
            tx,
            nudge,
            batch_size: config.batch_size.max(1),
            stats,
            last_drop_warning: Mutex::new(None),
        })
    }

    /// Queues a record for writing. Never waits: when the buffer is full the
    /// record is dropped and counted (see [`Recorder::dropped`]).
    pub fn record(&self, record: InvocationRecord) {
        // Counted before it can reach the writer, which uncounts what it writes.
        let pending = self.stats.pending.fetch_add(1, Ordering::Relaxed) + 1;
        match self.tx.try_send(Message::Record(record)) {
            Ok(()) => {
                if pending >= self.batch_size as u64 {
                    self.nudge.notify_one();
                }
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.stats.pending.fetch_sub(1, Ordering::Relaxed);
                let dropped = self.stats.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                self.warn_dropped(dropped);
            }
            // The writer is gone only when the runtime is going down.
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.stats.pending.fetch_sub(1, Ordering::Relaxed);
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits until every record queued before this call has been written (or
    /// failed to be). For shutdown, and for tests.
    pub async fn flush(&self) -> Result<(), RecorderError> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Message::Flush(done))
            .await
            .map_err(|_| RecorderError::Stopped)?;
        self.nudge.notify_one();
        wait.await.map_err(|_| RecorderError::Stopped)
    }

    /// Records dropped because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.stats.dropped.load(Ordering::Relaxed)
    }

    /// Records lost because the store failed to write their batch.
    pub fn failed(&self) -> u64 {
        self.stats.failed.load(Ordering::Relaxed)
    }

    /// Records written.
    pub fn written(&self) -> u64 {
        self.stats.written.load(Ordering::Relaxed)
    }

    fn warn_dropped(&self, total: u64) {
        // A contended lock means another caller is reporting right now.
        let Ok(mut last) = self.last_drop_warning.try_lock() else {
            return;
        };
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < DROP_WARNING_EVERY) {
            return;
        }
        *last = Some(now);
        tracing::warn!(
            dropped_total = total,
            "invocation records are arriving faster than they can be written; dropping some"
        );
    }
}

async fn write_loop(
    mut rx: mpsc::Receiver<Message>,
    store: Arc<dyn RecordSink>,
    config: RecorderConfig,
    stats: Arc<Stats>,
    nudge: Arc<Notify>,
) {
    let batch_size = config.batch_size.max(1);
    let mut pending = Pending {
        batch: Vec::with_capacity(batch_size),
        flushes: Vec::new(),
        batch_size,
    };
    let mut open = true;
    while open {
        // A batch starts with its first message and gathers more until it is
        // full, its interval has passed, or someone asks for a flush.
        let Some(first) = rx.recv().await else {
            break;
        };
        let deadline = Instant::now() + config.batch_interval;
        pending.take(first);
        loop {
            open = pending.take_queued(&mut rx);
            if !open || pending.ready() {
                break;
            }
            tokio::select! {
                () = nudge.notified() => {}
                () = tokio::time::sleep_until(deadline) => {
                    open = pending.take_queued(&mut rx);
                    break;
                }
            }
        }
        // Also when the recorder is gone: the channel reports that only once it is empty.
        pending.write(&*store, &stats).await;
    }
}

/// The batch being gathered, and the flushes waiting for it.
struct Pending {
    batch: Vec<InvocationRecord>,
    flushes: Vec<oneshot::Sender<()>>,
    batch_size: usize,
}

impl Pending {
    fn take(&mut self, message: Message) {
        match message {
            Message::Record(r) => self.batch.push(r),
            Message::Flush(done) => self.flushes.push(done),
        }
    }

    /// Full, or a flush is waiting for it.
    fn ready(&self) -> bool {
        self.batch.len() >= self.batch_size || !self.flushes.is_empty()
    }

    /// Takes what is queued already, without waiting, until the batch is ready.
    /// Returns false once every sender is gone.
    fn take_queued(&mut self, rx: &mut mpsc::Receiver<Message>) -> bool {
        while !self.ready() {
            match rx.try_recv() {
                Ok(message) => self.take(message),
                Err(mpsc::error::TryRecvError::Empty) => return true,
                Err(mpsc::error::TryRecvError::Disconnected) => return false,
            }
        }
        true
    }

    async fn write(&mut self, store: &dyn RecordSink, stats: &Stats) {
        write(store, &mut self.batch, stats).await;
        for done in self.flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

async fn write(store: &dyn RecordSink, batch: &mut Vec<InvocationRecord>, stats: &Stats) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len() as u64;
    stats.pending.fetch_sub(n, Ordering::Relaxed);
    match store.insert_batch(batch).await {
        Ok(()) => {
            stats.written.fetch_add(n, Ordering::Relaxed);
        }
        Err(e) => {
            // Not retried: the next batch is already waiting, and records are
            // observability, not data the user handed us.
            stats.failed.fetch_add(n, Ordering::Relaxed);
            tracing::warn!(error = %e, records = n, "could not write invocation records");
        }
    }
    batch.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use sless_core::invocation::InvocationSource;
    use tokio::sync::{Notify, Semaphore};

    /// Remembers each batch; writes wait for a permit when `gated`.
    #[derive(Default)]
    struct FakeStore {
        batches: Mutex<Vec<Vec<InvocationRecord>>>,
        written: Notify,
        gate: Option<Semaphore>,
        fail: bool,
        prunes: AtomicU64,
    }

    impl FakeStore {
        fn sizes(&self) -> Vec<usize> {
            self.batches.lock().unwrap().iter().map(Vec::len).collect()
        }
    }

    #[async_trait]
    impl RecordSink for FakeStore {
        async fn insert_batch(&self, records: &[InvocationRecord]) -> Result<(), SinkError> {
            if let Some(gate) = &self.gate {
                gate.acquire().await.unwrap().forget();
            }
            if self.fail {
                return Err(SinkError::new(std::io::Error::other(
                    "no table invocations",
                )));
            }
            self.batches.lock().unwrap().push(records.to_vec());
            self.written.notify_waiters();
            Ok(())
        }
        async fn prune(&self, _: Duration, _: u64) -> Result<u64, SinkError> {
            self.prunes.fetch_add(1, Ordering::Relaxed);
            Ok(0)
        }
    }

    fn rec(i: usize) -> InvocationRecord {
        InvocationRecord {
            id: new_id(),
            namespace: "team".into(),
            function: "f".into(),
            revision: 1,
            source: InvocationSource::Http,
            request_id: format!("req-{i}"),
            started_at: chrono::Utc::now(),
            duration: Duration::from_millis(1),
            status: 200,
            cold_start: false,
            error: None,
            attempt: None,
            trigger: None,
            call_id: None,
        }
    }

    fn config(capacity: usize) -> RecorderConfig {
        RecorderConfig {
            capacity,
            ..RecorderConfig::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn full_batches_are_written_at_once_and_flush_writes_the_rest() {
        let store = Arc::new(FakeStore::default());
        let recorder = Recorder::start(store.clone(), config(10_000));
        let start = Instant::now();
        for i in 0..1200 {
            recorder.record(rec(i));
        }
        recorder.flush().await.unwrap();
        assert_eq!(store.sizes(), [500, 500, 200]);
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "neither full batches nor a flush wait for the timer"
        );
        let batches = store.batches.lock().unwrap();
        let order: Vec<&str> = batches
            .iter()
            .flatten()
            .map(|r| r.request_id.as_str())
            .collect();
        assert_eq!(order[0], "req-0");
        assert_eq!(order[1199], "req-1199");
        assert_eq!((recorder.written(), recorder.dropped()), (1200, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_filled_one_record_at_a_time_is_written_when_it_fills() {
        let store = Arc::new(FakeStore::default());
        let recorder = Recorder::start(store.clone(), config(10_000));
        let start = Instant::now();
        for i in 0..499 {
            recorder.record(rec(i));
            tokio::task::yield_now().await;
        }
        let written = store.written.notified();
        assert!(store.sizes().is_empty(), "a partial batch waits");
        recorder.record(rec(499));
        written.await;
        assert_eq!(store.sizes(), [500]);
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "the 500th record woke the writer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_record_is_written_when_its_interval_ends() {
        let store = Arc::new(FakeStore::default());
        let recorder = Recorder::start(store.clone(), config(100));
        let start = Instant::now();
        let written = store.written.notified();
        recorder.record(rec(0));
        tokio::time::sleep(Duration::from_millis(150)).await;
        recorder.record(rec(1));
        assert!(
            store.sizes().is_empty(),
            "nothing is written before the interval ends"
        );
        // The paused clock jumps to the writer's deadline once everything is idle.
        written.await;
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        assert_eq!(
            store.sizes(),
            [2],
            "the second record joined the first one's batch"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_buffer_drops_without_waiting() {
        let store = Arc::new(FakeStore {
            gate: Some(Semaphore::new(0)),
            ..FakeStore::default()
        });
        let recorder = Recorder::start(store.clone(), config(10));
        recorder.record(rec(0));
        // Let the writer take the first record and block inside the store.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let start = Instant::now();
        for i in 1..=25 {
            recorder.record(rec(i));
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(recorder.dropped(), 15, "10 fit in the buffer, 15 did not");
        store.gate.as_ref().unwrap().add_permits(100);
        recorder.flush().await.unwrap();
        assert_eq!(store.sizes().iter().sum::<usize>(), 11);
        assert_eq!(recorder.written(), 11);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_writes_are_counted_and_later_flushes_still_answer() {
        let store = Arc::new(FakeStore {
            fail: true,
            ..FakeStore::default()
        });
        let recorder = Recorder::start(store, config(100));
        recorder.record(rec(0));
        recorder.record(rec(1));
        recorder.flush().await.unwrap();
        assert_eq!((recorder.failed(), recorder.written()), (2, 0));
        recorder.flush().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_writer_writes_what_is_left_when_the_recorder_goes() {
        let store = Arc::new(FakeStore::default());
        let recorder = Recorder::start(store.clone(), config(100));
        let written = store.written.notified();
        recorder.record(rec(0));
        drop(recorder);
        written.await;
        assert_eq!(store.sizes(), [1]);
    }

    #[tokio::test(start_paused = true)]
    async fn retention_prunes_every_interval_unless_unbounded() {
        let store = Arc::new(FakeStore::default());
        let task = spawn_retention(store.clone(), Retention::default());
        tokio::time::sleep(Duration::from_secs(121)).await;
        assert_eq!(
            store.prunes.load(Ordering::Relaxed),
            3,
            "at 0, 60 and 120 s"
        );
        task.abort();

        let store = Arc::new(FakeStore::default());
        let unbounded = Retention {
            max_age: Duration::ZERO,
            max_count: 0,
            ..Retention::default()
        };
        spawn_retention(store.clone(), unbounded).await.unwrap();
        assert_eq!(store.prunes.load(Ordering::Relaxed), 0);
    }
}
