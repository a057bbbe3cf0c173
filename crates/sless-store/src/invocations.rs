//! Invocation records: one row per call of a function (over `/fn/`, `/invoke`,
//! cron, queues or jobs), written in batches, listed newest first and pruned by
//! age and count. Writing and pruning is `sless-records`' [`RecordSink`] seam;
//! listing is [`InvocationStore`]. [`SqlStore`] implements both in the same
//! database file as the rest of the metadata.

use std::sync::OnceLock;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sless_core::invocation::{InvocationRecord, InvocationSource};
use sless_records::{RecordSink, SinkError};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::db::Backend;
use crate::query::{Builder, placeholders};

use crate::{Result, SqlStore};

/// Which records [`InvocationStore::list`] returns. Every field narrows the result.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InvocationFilter {
    pub function: Option<String>,
    /// Deliveries of this queue or device trigger.
    pub trigger: Option<String>,
    /// Attempts of this async call.
    pub call_id: Option<String>,
    pub status: Option<u16>,
    pub source: Option<InvocationSource>,
    /// Records that started at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// At most this many records: [`DEFAULT_INVOCATION_LIMIT`] when `None`, capped at [`MAX_INVOCATION_LIMIT`].
    pub limit: Option<u32>,
}

/// Records listed when the filter names no limit.
pub const DEFAULT_INVOCATION_LIMIT: u32 = 100;
/// The most records one list returns.
pub const MAX_INVOCATION_LIMIT: u32 = 1000;

impl InvocationFilter {
    /// The limit that applies: the default when unset, at least 1, at most [`MAX_INVOCATION_LIMIT`].
    pub fn effective_limit(&self) -> u32 {
        self.limit
            .unwrap_or(DEFAULT_INVOCATION_LIMIT)
            .clamp(1, MAX_INVOCATION_LIMIT)
    }
}

/// The read side of the records (the API's listing); writes go through [`RecordSink`].
#[async_trait]
pub trait InvocationStore: Send + Sync + 'static {
    /// A namespace's records matching `filter`, newest first (by `started_at`,
    /// ties broken by id).
    async fn list(
        &self,
        namespace: &str,
        filter: &InvocationFilter,
    ) -> Result<Vec<InvocationRecord>>;
}

/// Rows per `INSERT` statement. A batch is cut into chunks of these sizes (largest
/// first), so only these few statements are ever prepared and they stay in the
/// connection's statement cache: preparing a statement of a new length for every
/// batch cost more than inserting its rows. At 14 parameters a row the largest
/// stays well below SQLite's limit of 32766 variables per statement.
const INSERT_CHUNKS: [usize; 5] = [256, 64, 16, 4, 1];

/// The `INSERT` of `rows` records, `rows` one of [`INSERT_CHUNKS`]; built once per
/// size and backend.
fn insert_sql(rows: usize, backend: Backend) -> &'static str {
    static SQL: [OnceLock<Vec<String>>; 2] = [OnceLock::new(), OnceLock::new()];
    let all = SQL[backend as usize].get_or_init(|| {
        INSERT_CHUNKS
            .iter()
            .map(|&n| {
                let rows: Vec<String> = (0..n)
                    .map(|i| format!("({})", placeholders(backend, 1 + i * COLUMNS, COLUMNS)))
                    .collect();
                format!(
                    "INSERT INTO invocations (id, namespace, function, revision, source, \
                     request_id, started_at, duration_us, status, cold_start, error, \
                     attempt, trigger, call_id) VALUES {}",
                    rows.join(", ")
                )
            })
            .collect()
    });
    let index = INSERT_CHUNKS.iter().position(|&n| n == rows).unwrap_or(0);
    &all[index]
}

/// Values an inserted record binds.
const COLUMNS: usize = 14;

/// `records` cut into chunks whose lengths are all in [`INSERT_CHUNKS`].
fn insert_chunks(mut records: &[InvocationRecord]) -> impl Iterator<Item = &[InvocationRecord]> {
    std::iter::from_fn(move || {
        let size = INSERT_CHUNKS.into_iter().find(|&n| n <= records.len())?;
        let (chunk, rest) = records.split_at(size);
        records = rest;
        Some(chunk)
    })
}
/// Rows deleted per statement while pruning, so a large prune never holds the
/// database's write lock long enough to stall the recorder's inserts.
const DELETE_CHUNK: i64 = 5000;

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn record_from_row(row: &AnyRow) -> Result<InvocationRecord> {
    let source: String = row.try_get("source")?;
    // Decoding through serde names the unexpected value in the error.
    let source: InvocationSource = serde_json::from_value(serde_json::Value::String(source))?;
    let started_at: i64 = row.try_get("started_at")?;
    let duration_us: i64 = row.try_get("duration_us")?;
    let revision: i64 = row.try_get("revision")?;
    let status: i64 = row.try_get("status")?;
    Ok(InvocationRecord {
        id: row.try_get("id")?,
        namespace: row.try_get("namespace")?,
        function: row.try_get("function")?,
        revision: revision.max(0) as u64,
        source,
        request_id: row.try_get("request_id")?,
        started_at: DateTime::from_timestamp_micros(started_at).unwrap_or_default(),
        duration: Duration::from_micros(duration_us.max(0) as u64),
        status: u16::try_from(status).unwrap_or(0),
        cold_start: row.try_get::<i64, _>("cold_start")? != 0,
        error: row.try_get("error")?,
        attempt: row
            .try_get::<Option<i64>, _>("attempt")?
            .map(|a| u32::try_from(a).unwrap_or(0)),
        trigger: row.try_get("trigger")?,
        call_id: row.try_get("call_id")?,
    })
}

#[async_trait]
impl RecordSink for SqlStore {
    async fn insert_batch(
        &self,
        records: &[InvocationRecord],
    ) -> std::result::Result<(), SinkError> {
        self.insert_records(records).await.map_err(SinkError::new)
    }

    async fn prune(
        &self,
        max_age: Duration,
        max_count: u64,
    ) -> std::result::Result<u64, SinkError> {
        self.prune_records(max_age, max_count)
            .await
            .map_err(SinkError::new)
    }
}

#[async_trait]
impl InvocationStore for SqlStore {
    async fn list(
        &self,
        namespace: &str,
        filter: &InvocationFilter,
    ) -> Result<Vec<InvocationRecord>> {
        self.list_records(namespace, filter).await
    }
}

impl SqlStore {
    /// Stores records, all or none (one transaction).
    async fn insert_records(&self, records: &[InvocationRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool().begin().await?;
        for chunk in insert_chunks(records) {
            let mut insert = sqlx::query(insert_sql(chunk.len(), self.backend()));
            // `&str` binds copy each text once; binding `&String` would copy it twice.
            for r in chunk {
                insert = insert
                    .bind(r.id.as_str())
                    .bind(r.namespace.as_str())
                    .bind(r.function.as_str())
                    .bind(i64::try_from(r.revision).unwrap_or(i64::MAX))
                    .bind(r.source.as_str())
                    .bind(r.request_id.as_str())
                    .bind(micros(r.started_at))
                    .bind(i64::try_from(r.duration.as_micros()).unwrap_or(i64::MAX))
                    .bind(i64::from(r.status))
                    .bind(i64::from(r.cold_start))
                    .bind(r.error.as_deref())
                    .bind(r.attempt.map(i64::from))
                    .bind(r.trigger.as_deref())
                    .bind(r.call_id.as_deref());
            }
            insert.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn list_records(
        &self,
        namespace: &str,
        filter: &InvocationFilter,
    ) -> Result<Vec<InvocationRecord>> {
        let mut q = Builder::new(
            self.backend(),
            "SELECT id, namespace, function, revision, source, request_id, started_at, \
             duration_us, status, cold_start, error, attempt, trigger, call_id \
             FROM invocations WHERE namespace = ",
        );
        q.push_bind(namespace);
        if let Some(function) = &filter.function {
            q.push(" AND function = ").push_bind(function);
        }
        if let Some(trigger) = &filter.trigger {
            q.push(" AND trigger = ").push_bind(trigger);
        }
        if let Some(call_id) = &filter.call_id {
            q.push(" AND call_id = ").push_bind(call_id);
        }
        if let Some(status) = filter.status {
            q.push(" AND status = ").push_bind(i64::from(status));
        }
        if let Some(source) = filter.source {
            q.push(" AND source = ").push_bind(source.as_str());
        }
        if let Some(since) = filter.since {
            q.push(" AND started_at >= ").push_bind(micros(since));
        }
        q.push(" ORDER BY started_at DESC, id DESC LIMIT ")
            .push_bind(i64::from(filter.effective_limit()));
        let rows = q.build()?.fetch_all(self.pool()).await?;
        rows.iter().map(record_from_row).collect()
    }

    /// See [`RecordSink::prune`].
    async fn prune_records(&self, max_age: Duration, max_count: u64) -> Result<u64> {
        let age_cutoff = if max_age.is_zero() {
            None
        } else {
            let age = chrono::Duration::from_std(max_age).unwrap_or(chrono::Duration::MAX);
            Some(micros(
                Utc::now().checked_sub_signed(age).unwrap_or_default(),
            ))
        };
        let namespaces: Vec<String> =
            sqlx::query_scalar("SELECT DISTINCT namespace FROM invocations")
                .fetch_all(self.pool())
                .await?;
        let mut deleted = 0;
        for ns in namespaces {
            // The newest record past the count bound, in list order: it and all
            // older records go.
            let over: Option<(i64, String)> = if max_count == 0 {
                None
            } else {
                sqlx::query_as(
                    "SELECT started_at, id FROM invocations WHERE namespace = $1 \
                     ORDER BY started_at DESC, id DESC LIMIT 1 OFFSET $2",
                )
                .bind(&ns)
                .bind(i64::try_from(max_count).unwrap_or(i64::MAX))
                .fetch_optional(self.pool())
                .await?
            };
            // Records older than the age cutoff go too. When both bounds apply,
            // deleting everything before the later of the two covers both.
            let (time, last_id) = match (age_cutoff, over) {
                (None, None) => continue,
                (Some(age), None) => (age, None),
                (None, Some((t, id))) => (t, Some(id)),
                (Some(age), Some((t, id))) if t >= age => (t, Some(id)),
                (Some(age), Some(_)) => (age, None),
            };
            loop {
                // `id` breaks ties of `started_at` exactly as the list order does.
                let done = sqlx::query(
                    "DELETE FROM invocations WHERE namespace = $1 AND (started_at, id) IN \
                     (SELECT started_at, id FROM invocations WHERE namespace = $1 \
                     AND (started_at < $2 OR (started_at = $2 AND id <= $3)) \
                     ORDER BY started_at, id LIMIT $4)",
                )
                .bind(&ns)
                .bind(time)
                .bind(last_id.as_deref())
                .bind(DELETE_CHUNK)
                .execute(self.pool())
                .await?;
                deleted += done.rows_affected();
                if done.rows_affected() < DELETE_CHUNK as u64 {
                    break;
                }
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs_ago: i64) -> DateTime<Utc> {
        Utc::now() - chrono::Duration::seconds(secs_ago)
    }

    fn rec(id: &str, ns: &str, function: &str, started_at: DateTime<Utc>) -> InvocationRecord {
        InvocationRecord {
            id: id.into(),
            namespace: ns.into(),
            function: function.into(),
            revision: 3,
            source: InvocationSource::Http,
            request_id: format!("req-{id}"),
            started_at,
            duration: Duration::from_micros(1234),
            status: 200,
            cold_start: false,
            error: None,
            attempt: None,
            trigger: None,
            call_id: None,
        }
    }

    fn ids(records: &[InvocationRecord]) -> Vec<&str> {
        records.iter().map(|r| r.id.as_str()).collect()
    }

    #[test]
    fn batches_are_cut_into_the_few_cached_statement_sizes() {
        let records: Vec<_> = (0..597)
            .map(|i| rec(&format!("{i}"), "t", "f", at(0)))
            .collect();
        let sizes: Vec<usize> = insert_chunks(&records).map(<[_]>::len).collect();
        assert_eq!(sizes, [256, 256, 64, 16, 4, 1]);
        assert_eq!(insert_chunks(&records[..0]).count(), 0);
        // Every record is in exactly one chunk, in order.
        let back: Vec<&str> = insert_chunks(&records).flat_map(ids).collect();
        assert_eq!(back, ids(&records));
    }

    #[tokio::test]
    async fn a_batch_of_several_chunks_is_written_whole() {
        let store = crate::testing::store().await;
        let records: Vec<_> = (0..341)
            .map(|i| rec(&format!("{i:04}"), "team", "f", at(1000 - i)))
            .collect();
        store.insert_batch(&records).await.unwrap();
        let filter = InvocationFilter {
            limit: Some(1000),
            ..InvocationFilter::default()
        };
        let got = store.list("team", &filter).await.unwrap();
        assert_eq!(got.len(), 341);
        assert_eq!(got[0].id, "0340");
        assert_eq!(got[340].id, "0000");
    }

    #[tokio::test]
    async fn batches_round_trip_newest_first() {
        let store = crate::testing::store().await;
        let mut a = rec("a", "team", "f", at(30));
        a.error = Some("boom".into());
        a.status = 500;
        a.cold_start = true;
        a.source = InvocationSource::Invoke;
        let batch = vec![
            a.clone(),
            rec("c", "team", "f", at(10)),
            rec("b", "team", "g", at(20)),
        ];
        store.insert_batch(&batch).await.unwrap();
        store.insert_batch(&[]).await.unwrap();
        let got = store
            .list("team", &InvocationFilter::default())
            .await
            .unwrap();
        assert_eq!(ids(&got), ["c", "b", "a"]);
        // Every field survives, at microsecond precision.
        let mut expected = a;
        expected.started_at = DateTime::from_timestamp_micros(micros(expected.started_at)).unwrap();
        assert_eq!(got[2], expected);
        assert!(
            store
                .list("other", &InvocationFilter::default())
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn deliveries_keep_their_attempt_trigger_and_call() {
        let store = crate::testing::store().await;
        let mut queued = rec("q2", "team", "f", at(10));
        queued.source = InvocationSource::Queue;
        queued.attempt = Some(2);
        queued.trigger = Some("orders-in".into());
        let mut first = queued.clone();
        first.id = "q1".into();
        first.attempt = Some(1);
        first.started_at = at(20);
        let mut call = rec("a1", "team", "f", at(5));
        call.source = InvocationSource::Async;
        call.attempt = Some(1);
        call.call_id = Some("c-123".into());
        store
            .insert_batch(&[
                queued.clone(),
                first,
                call.clone(),
                rec("h", "team", "f", at(1)),
            ])
            .await
            .unwrap();
        let by_trigger = InvocationFilter {
            trigger: Some("orders-in".into()),
            ..Default::default()
        };
        let got = store.list("team", &by_trigger).await.unwrap();
        assert_eq!(ids(&got), ["q2", "q1"]);
        queued.started_at = DateTime::from_timestamp_micros(micros(queued.started_at)).unwrap();
        assert_eq!(got[0], queued);
        let by_call = InvocationFilter {
            call_id: Some("c-123".into()),
            ..Default::default()
        };
        let got = store.list("team", &by_call).await.unwrap();
        assert_eq!(ids(&got), ["a1"]);
        assert_eq!((got[0].attempt, got[0].trigger.as_deref()), (Some(1), None));
        let all = store
            .list("team", &InvocationFilter::default())
            .await
            .unwrap();
        assert_eq!(
            (all[0].attempt, &all[0].call_id),
            (None, &None),
            "an HTTP call has neither"
        );
    }

    #[tokio::test]
    async fn a_batch_is_all_or_nothing_and_larger_than_one_statement() {
        let store = crate::testing::store().await;
        let now = Utc::now();
        let mut batch: Vec<InvocationRecord> = (0..1200)
            .map(|i| rec(&format!("{i:05}"), "team", "f", now))
            .collect();
        store.insert_batch(&batch).await.unwrap();
        let all = InvocationFilter {
            limit: Some(5000),
            ..Default::default()
        };
        assert_eq!(
            store.list("team", &all).await.unwrap().len(),
            1000,
            "capped at MAX_INVOCATION_LIMIT"
        );
        // A duplicate id in the last chunk fails the whole batch.
        batch.iter_mut().for_each(|r| r.id = format!("x{}", r.id));
        batch[1100].id = "00001".into();
        assert!(store.insert_batch(&batch).await.is_err());
        assert_eq!(
            store.prune(Duration::ZERO, 1).await.unwrap(),
            1199,
            "only the first batch was stored"
        );
    }

    #[tokio::test]
    async fn filters_narrow_and_limit_caps() {
        let store = crate::testing::store().await;
        let mut records = Vec::new();
        for i in 0..10i64 {
            let mut r = rec(
                &format!("{i:02}"),
                "team",
                if i % 2 == 0 { "even" } else { "odd" },
                at(100 - i),
            );
            r.status = if i == 7 { 500 } else { 200 };
            r.source = if i < 5 {
                InvocationSource::Http
            } else {
                InvocationSource::Cron
            };
            records.push(r);
        }
        store.insert_batch(&records).await.unwrap();
        let list = |f: InvocationFilter| {
            let store = &store;
            async move {
                ids(&store.list("team", &f).await.unwrap())
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(
            list(InvocationFilter {
                function: Some("odd".into()),
                ..Default::default()
            })
            .await,
            ["09", "07", "05", "03", "01"]
        );
        assert_eq!(
            list(InvocationFilter {
                status: Some(500),
                ..Default::default()
            })
            .await,
            ["07"]
        );
        assert_eq!(
            list(InvocationFilter {
                source: Some(InvocationSource::Http),
                limit: Some(2),
                ..Default::default()
            })
            .await,
            ["04", "03"]
        );
        assert_eq!(
            list(InvocationFilter {
                since: Some(records[8].started_at),
                ..Default::default()
            })
            .await,
            ["09", "08"],
            "since is inclusive"
        );
        assert_eq!(
            list(InvocationFilter {
                function: Some("even".into()),
                source: Some(InvocationSource::Cron),
                ..Default::default()
            })
            .await,
            ["08", "06"]
        );
        assert_eq!(
            list(InvocationFilter {
                limit: Some(0),
                ..Default::default()
            })
            .await,
            ["09"]
        );
    }

    #[tokio::test]
    async fn prune_by_age_and_by_count_per_namespace() {
        let store = crate::testing::store().await;
        let mut records = Vec::new();
        for i in 0..6i64 {
            records.push(rec(&format!("a{i}"), "a", "f", at(3600 * i)));
        }
        // Same start time for all of b: ids decide which survive, as in the list order.
        let same = at(10);
        for i in 0..4 {
            records.push(rec(&format!("b{i}"), "b", "f", same));
        }
        store.insert_batch(&records).await.unwrap();
        let all = InvocationFilter::default();

        // No bounds: nothing goes.
        assert_eq!(store.prune(Duration::ZERO, 0).await.unwrap(), 0);
        // By age: older than 2.5 h goes (a3, a4, a5).
        assert_eq!(store.prune(Duration::from_secs(9000), 0).await.unwrap(), 3);
        assert_eq!(
            ids(&store.list("a", &all).await.unwrap()),
            ["a0", "a1", "a2"]
        );
        assert_eq!(store.list("b", &all).await.unwrap().len(), 4);
        // By count, per namespace: two newest of each stay.
        assert_eq!(store.prune(Duration::from_secs(9000), 2).await.unwrap(), 3);
        assert_eq!(ids(&store.list("a", &all).await.unwrap()), ["a0", "a1"]);
        assert_eq!(ids(&store.list("b", &all).await.unwrap()), ["b3", "b2"]);
        // Both bounds: whichever cuts more wins.
        assert_eq!(store.prune(Duration::from_secs(1800), 2).await.unwrap(), 1);
        assert_eq!(ids(&store.list("a", &all).await.unwrap()), ["a0"]);
    }

    #[tokio::test]
    async fn prune_deletes_in_chunks() {
        let store = crate::testing::store().await;
        let old = at(7200);
        let batch: Vec<_> = (0..(DELETE_CHUNK as usize * 2 + 7))
            .map(|i| rec(&format!("{i:06}"), "a", "f", old))
            .collect();
        store.insert_batch(&batch).await.unwrap();
        assert_eq!(
            store.prune(Duration::from_secs(60), 0).await.unwrap(),
            batch.len() as u64
        );
        assert!(
            store
                .list("a", &InvocationFilter::default())
                .await
                .unwrap()
                .is_empty()
        );
    }

    /// The cost of a burst through the recorder into SQLite: from the first
    /// `record` to `flush` returning (printed; run with `--nocapture`).
    #[tokio::test]
    async fn a_burst_of_1000_reaches_sqlite_quickly() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(SqlStore::open(&dir.path().join("t.db")).await.unwrap());
        let recorder =
            sless_records::Recorder::start(store.clone(), sless_records::RecorderConfig::default());
        let records: Vec<_> = (0..1000)
            .map(|i| rec(&format!("{i:04}"), "team", "f", at(0)))
            .collect();
        let start = std::time::Instant::now();
        for r in records {
            recorder.record(r);
        }
        let queued = start.elapsed();
        recorder.flush().await.unwrap();
        let total = start.elapsed();
        println!("1000 records: queued in {queued:?}, written (flush done) in {total:?}");
        let all = InvocationFilter {
            limit: Some(1000),
            ..InvocationFilter::default()
        };
        assert_eq!(store.list("team", &all).await.unwrap().len(), 1000);
        assert_eq!(recorder.written(), 1000);
    }
}
