//! Storage upkeep: the collector that removes code archives, builds and
//! installed dependencies nothing uses any more, and the per-namespace storage
//! quota checked before an upload is stored.
//!
//! What is kept: every archive a function or job names, the build of each
//! function's and self-contained job's current code (those of namespaces in the
//! trash included, so a restore reuses them), the builds each pool runs
//! and ran just before (old instances may be draining), builds of functions
//! deleted less than the grace period ago, and anything written, stored again or
//! reused less than the grace period ago. The last rule covers the gap between
//! storing an archive and recording it: an upload renews the blob before its
//! record names it, and a build renews what it reuses under the key's lock the
//! collector also takes, so neither is removed from under the other.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sless_blob::{BlobError, BlobStore};
use sless_build::{BuildError, Builder, build_key};
use sless_executor::Executor;
use sless_store::{CodeOwner, JobStore, StorageStore, Store, StoreError};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Controller;
use crate::jobs::pool_name;

/// After a nudge (a delete, an upload), wait this long for more before
/// collecting, so a burst of changes costs one pass.
const DEBOUNCE: Duration = Duration::from_secs(1);

/// How storage is kept in check.
#[derive(Debug, Clone, Copy)]
pub struct StorageConfig {
    /// Time between collections (besides the ones nudged by deletes and uploads).
    pub interval: Duration,
    /// Anything written or used more recently than this is kept, and so are
    /// the builds of functions deleted more recently. It covers the moments
    /// between storing and recording; builds in progress protect what they use
    /// themselves, however long they take.
    pub grace: Duration,
    /// The most bytes a namespace's code may take: each archive its functions
    /// and jobs name, compressed plus unpacked. `0`: no limit.
    pub namespace_quota: u64,
}

/// What one collection removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    pub blobs: usize,
    pub builds: usize,
    pub deps: usize,
    /// Bytes of the files removed.
    pub bytes: u64,
}

/// Why a collection stopped.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// The metadata store failed; nothing was removed after it.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The code store failed.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// Removing builds or dependencies failed.
    #[error(transparent)]
    Build(#[from] BuildError),
}

/// Why an upload may not be stored.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// Storing it would take the namespace over its storage quota.
    #[error(
        "storage quota exceeded: namespace {namespace:?} would use {} of code storage (archives plus their unpacked size), over its quota of {}; delete functions or jobs, or upload smaller code",
        mib(*.would_use), mib(*.quota)
    )]
    Exceeded {
        namespace: String,
        would_use: u64,
        quota: u64,
    },
    /// The metadata store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// When the next collection is due: the periodic tick, or sooner a follow-up
/// to a nudged pass once the grace period of what it kept has run out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Schedule {
    interval: Duration,
    grace: Duration,
    next_tick: Instant,
    follow_up: Option<Instant>,
}

impl Schedule {
    fn new(cfg: StorageConfig, now: Instant) -> Self {
        Schedule {
            interval: cfg.interval,
            grace: cfg.grace,
            next_tick: now + cfg.interval,
            follow_up: None,
        }
    }

    fn wake(&self) -> Instant {
        self.follow_up
            .map_or(self.next_tick, |f| f.min(self.next_tick))
    }

    /// The timer fired at `now` (a collection follows).
    fn woke(&mut self, now: Instant) {
        if now >= self.next_tick {
            self.next_tick = now + self.interval;
        }
        if self.follow_up.is_some_and(|f| f <= now) {
            self.follow_up = None;
        }
    }

    /// A nudge came and its debounce ended at `now` (a collection follows).
    fn nudged(&mut self, now: Instant) {
        self.follow_up = Some(now + self.grace + DEBOUNCE);
    }
}

/// Removes unused code storage, now, periodically and when nudged; checks quotas.
pub struct Collector {
    cfg: StorageConfig,
    store: Arc<dyn Store>,
    storage: Arc<dyn StorageStore>,
    jobs: Arc<dyn JobStore>,
    blobs: Arc<dyn BlobStore>,
    builder: Arc<Builder>,
    executor: Arc<Executor>,
    controller: Arc<Controller>,
    nudged: Notify,
    /// One collection at a time.
    running: tokio::sync::Mutex<()>,
}

impl Collector {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: StorageConfig,
        store: Arc<dyn Store>,
        storage: Arc<dyn StorageStore>,
        jobs: Arc<dyn JobStore>,
        blobs: Arc<dyn BlobStore>,
        builder: Arc<Builder>,
        executor: Arc<Executor>,
        controller: Arc<Controller>,
    ) -> Arc<Self> {
        Arc::new(Collector {
            cfg,
            store,
            storage,
            jobs,
            blobs,
            builder,
            executor,
            controller,
            nudged: Notify::new(),
            running: tokio::sync::Mutex::new(()),
        })
    }

    /// Asks for a collection soon (debounced).
    pub fn nudge(&self) {
        self.nudged.notify_one();
    }

    /// Collects every `interval`, shortly after each nudge, and once more when
    /// what a nudge found too fresh to take has aged past the grace period,
    /// until `shutdown`.
    pub fn spawn(self: &Arc<Self>, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut schedule = Schedule::new(this.cfg, Instant::now());
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep_until(schedule.wake()) => schedule.woke(Instant::now()),
                    () = this.nudged.notified() => {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(DEBOUNCE) => {}
                        }
                        schedule.nudged(Instant::now());
                    }
                }
                if let Err(e) = this.collect().await {
                    tracing::warn!(error = %e, "storage collection failed; trying again later");
                }
            }
        })
    }

    /// One collection pass; see the module documentation for what is kept.
    pub async fn collect(&self) -> Result<Report, GcError> {
        let _one = self.running.lock().await;
        // The cutoff is taken before the records are read: whatever is stored or
        // renewed after this instant is kept even if the records miss it.
        let cutoff = SystemTime::now()
            .checked_sub(self.cfg.grace)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let in_use = self.controller.builds_in_use(self.cfg.grace);
        let mut keep_blobs = self.storage.referenced_blobs().await?;
        let mut keep_builds = HashSet::new();
        for b in &in_use {
            keep_blobs.insert(b.code_sha256.clone());
            keep_builds.insert(b.build_key.clone());
        }
        let mut deployed = |ns: &str, pool: &str| {
            if let Some(d) = self.executor.deployment(ns, pool)
                && let Some(key) = d.code_dir.file_name()
            {
                keep_builds.insert(key.to_string_lossy().into_owned());
            }
        };
        let mut functions = self.store.list_functions(None).await?;
        let mut jobs = self.jobs.list_jobs(None).await?;
        for f in &functions {
            deployed(&f.namespace, &f.name);
        }
        for j in &jobs {
            deployed(&j.namespace, &pool_name(&j.name));
        }
        // A namespace in the trash keeps its builds for a restore (its archives are
        // among the referenced ones already); these name their original namespace.
        let (trashed_functions, trashed_jobs) = self.storage.trashed_code().await?;
        functions.extend(trashed_functions);
        jobs.extend(trashed_jobs);
        for f in &functions {
            if let Some(sha) = &f.code_sha256 {
                let family = f.spec.runtime.family;
                keep_builds.insert(build_key(&f.namespace, family, &f.spec.entrypoint, sha));
            }
        }
        for j in &jobs {
            if let (Some(sha), Some(rt)) = (&j.code_sha256, &j.spec.runtime) {
                let entrypoint = j
                    .spec
                    .entrypoint
                    .clone()
                    .unwrap_or_else(|| rt.family.default_entrypoint().to_string());
                keep_builds.insert(build_key(&j.namespace, rt.family, &entrypoint, sha));
            }
        }

        let built = self.builder.collect(&keep_builds, cutoff).await?;
        let mut report = Report {
            builds: built.builds,
            deps: built.deps,
            bytes: built.bytes,
            ..Report::default()
        };
        let mut removed = Vec::new();
        for blob in self.blobs.list().await? {
            if keep_blobs.contains(&blob.sha256) || blob.modified >= cutoff {
                continue;
            }
            if let Some(bytes) = self
                .blobs
                .remove_if_unused_since(&blob.sha256, cutoff)
                .await?
            {
                report.bytes += bytes;
                removed.push(blob.sha256);
            }
        }
        report.blobs = removed.len();
        self.storage.forget_blobs(&removed).await?;
        if report != Report::default() {
            tracing::info!(
                blobs = report.blobs,
                builds = report.builds,
                deps = report.deps,
                bytes = report.bytes,
                "collected unused code storage"
            );
        }
        Ok(report)
    }

    /// Whether `namespace` may store an archive of `sha256` (`compressed` bytes,
    /// `unpacked` once built) as the code of `owner`, whose current code it replaces.
    pub async fn admit(
        &self,
        namespace: &str,
        owner: CodeOwner<'_>,
        sha256: &str,
        compressed: u64,
        unpacked: u64,
    ) -> Result<(), QuotaError> {
        let quota = self.cfg.namespace_quota;
        self.admit_within(namespace, owner, sha256, compressed, unpacked, quota)
            .await
    }

    /// [`Collector::admit`] against `quota` bytes (the namespace's own storage
    /// quota; `0`: no limit).
    pub async fn admit_within(
        &self,
        namespace: &str,
        owner: CodeOwner<'_>,
        sha256: &str,
        compressed: u64,
        unpacked: u64,
        quota: u64,
    ) -> Result<(), QuotaError> {
        if quota == 0 {
            return Ok(());
        }
        let used = self
            .storage
            .namespace_storage(namespace, Some(owner))
            .await?;
        let counted = self
            .storage
            .namespace_references(namespace, sha256, Some(owner))
            .await?;
        let would_use = used + if counted { 0 } else { compressed + unpacked };
        if would_use > quota {
            return Err(QuotaError::Exceeded {
                namespace: namespace.to_string(),
                would_use,
                quota,
            });
        }
        Ok(())
    }

    /// Records the sizes of a stored archive, for later quota checks.
    pub async fn stored(
        &self,
        sha256: &str,
        compressed: u64,
        unpacked: u64,
    ) -> Result<(), StoreError> {
        self.storage.record_blob(sha256, compressed, unpacked).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives the schedule the way `spawn` does, on a paused clock, and
    /// returns the seconds (since start) at which collections ran.
    async fn runs(nudges_at: &[u64], until: u64) -> Vec<u64> {
        let cfg = StorageConfig {
            interval: Duration::from_secs(900),
            grace: Duration::from_secs(60),
            namespace_quota: 0,
        };
        let start = Instant::now();
        let mut schedule = Schedule::new(cfg, start);
        let mut nudges = nudges_at
            .iter()
            .map(|s| start + Duration::from_secs(*s))
            .peekable();
        let mut ran = Vec::new();
        loop {
            let wake = schedule.wake();
            match nudges.peek().copied() {
                Some(n) if n < wake => {
                    nudges.next();
                    tokio::time::sleep_until(n + DEBOUNCE).await;
                    schedule.nudged(Instant::now());
                }
                _ => {
                    tokio::time::sleep_until(wake).await;
                    schedule.woke(Instant::now());
                }
            }
            let at = (Instant::now() - start).as_secs();
            if at > until {
                return ran;
            }
            ran.push(at);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn collections_run_periodically_after_nudges_and_once_the_grace_has_passed() {
        assert_eq!(runs(&[], 2000).await, vec![900, 1800]);
        // A delete at 100 s: a pass a second later, another once what it found
        // too fresh is older than the grace period, then the periodic ones.
        assert_eq!(runs(&[100], 2000).await, vec![101, 162, 900, 1800]);
        // A burst of nudges moves the follow-up along with the last one.
        assert_eq!(runs(&[100, 130], 1000).await, vec![101, 131, 192, 900]);
    }
}
