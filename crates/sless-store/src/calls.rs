//! Async calls: one row per call to `/async/...` (or `/invoke?async=true`), inserted
//! before the caller is answered `202`, moved through `Queued → Running → Succeeded |
//! Failed` by the dispatcher, listed newest first, and pruned with the invocation
//! records' retention once finished. [`CallStore`] is the seam; [`SqlStore`]
//! implements it.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sless_core::CallPhase;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::db::Backend;
use crate::query::Builder;

use crate::{Result, SqlStore, StoreError};

/// The function's answer to a finished call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// One async call as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    pub id: String,
    pub namespace: String,
    pub function: String,
    pub phase: CallPhase,
    /// Attempts started so far (of the current series, after a redrive).
    pub attempts: u32,
    /// The handler's event, as JSON bytes.
    pub event: Vec<u8>,
    /// The request id of the request that queued it.
    pub request_id: String,
    pub callback_url: Option<String>,
    pub response: Option<CallResponse>,
    pub error: Option<String>,
    /// The dead letter this call's current attempt series redrives.
    pub redrive_of: Option<String>,
    pub queued_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// A call not finished yet, with its place in the queue.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingCall {
    /// Grows with every call queued, in commit order.
    pub seq: i64,
    pub call: CallRecord,
}

/// Which calls [`CallStore::list_calls`] returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallFilter {
    pub function: Option<String>,
    pub phase: Option<CallPhase>,
    /// At most this many: [`DEFAULT_CALL_LIMIT`] when `None`, capped at [`MAX_CALL_LIMIT`].
    pub limit: Option<u32>,
}

/// Calls listed when the filter names no limit.
pub const DEFAULT_CALL_LIMIT: u32 = 100;
/// The most calls one list returns.
pub const MAX_CALL_LIMIT: u32 = 1000;

/// The writes of calls' lifecycle, committed in groups: every caller waits for the
/// commit of the transaction its write went into, so each write is as durable when its
/// call returns as a write of its own, but many concurrent calls (a burst of `/async/`
/// requests, a dispatcher marking attempts) share one commit instead of paying one each.
pub(crate) struct CallWriter {
    tx: tokio::sync::mpsc::UnboundedSender<Pending>,
}

/// One write and whom to tell how it went.
struct Pending {
    write: CallWrite,
    done: tokio::sync::oneshot::Sender<Result<()>>,
}

/// The writes [`CallWriter`] groups.
pub(crate) enum CallWrite {
    Insert(CallRecord),
    Started {
        namespace: String,
        id: String,
        attempt: u32,
        at: DateTime<Utc>,
    },
    Finished {
        namespace: String,
        id: String,
        phase: CallPhase,
        attempts: u32,
        response: Option<CallResponse>,
        error: Option<String>,
        at: DateTime<Utc>,
    },
}

/// The most writes one transaction takes.
const MAX_GROUP: usize = 512;

impl CallWriter {
    /// Starts the writer's task on `pool`; it ends when the writer is dropped.
    pub(crate) fn start(pool: sqlx::AnyPool, backend: Backend) -> CallWriter {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Pending>();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut group = vec![first];
                while group.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(p) => group.push(p),
                        Err(_) => break,
                    }
                }
                commit_group(&pool, backend, group).await;
            }
        });
        CallWriter { tx }
    }

    /// Queues `write` and waits until the transaction holding it committed.
    pub(crate) async fn write(&self, write: CallWrite) -> Result<()> {
        let (done, answer) = tokio::sync::oneshot::channel();
        let gone = || StoreError::Database(sqlx::Error::PoolClosed);
        self.tx.send(Pending { write, done }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// Applies every write of `group` in one transaction. A write that fails alone (a
/// duplicate id, a call that is gone) gets its own error and is undone alone (SQLite
/// undoes the failed statement; PostgreSQL, which would abort the whole transaction,
/// runs each write under a savepoint); a transaction that cannot begin or commit
/// fails every write in it.
async fn commit_group(pool: &sqlx::AnyPool, backend: Backend, group: Vec<Pending>) {
    let applied = async {
        let mut tx = pool.begin().await?;
        let mut outcomes = Vec::with_capacity(group.len());
        for p in &group {
            let outcome = match backend {
                Backend::Sqlite => apply(&mut tx, &p.write).await,
                Backend::Postgres => {
                    sqlx::query("SAVEPOINT call_write")
                        .execute(&mut *tx)
                        .await?;
                    let outcome = apply(&mut tx, &p.write).await;
                    let end = if outcome.is_ok() {
                        "RELEASE SAVEPOINT call_write"
                    } else {
                        "ROLLBACK TO SAVEPOINT call_write"
                    };
                    sqlx::query(end).execute(&mut *tx).await?;
                    outcome
                }
            };
            outcomes.push(outcome);
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>(outcomes)
    }
    .await;
    match applied {
        Ok(outcomes) => {
            for (p, outcome) in group.into_iter().zip(outcomes) {
                let _ = p.done.send(outcome);
            }
        }
        Err(e) => {
            let text = e.to_string();
            for p in group {
                let _ = p.done.send(Err(StoreError::Database(sqlx::Error::Protocol(
                    text.clone(),
                ))));
            }
        }
    }
}

/// One write, inside the group's transaction.
async fn apply(conn: &mut sqlx::AnyConnection, write: &CallWrite) -> Result<()> {
    match write {
        CallWrite::Insert(c) => {
            let result = sqlx::query(
                "INSERT INTO async_calls (id, namespace, function, phase, attempts, event, \
                 request_id, callback_url, queued_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(&c.id)
            .bind(&c.namespace)
            .bind(&c.function)
            .bind(c.phase.as_str())
            .bind(i64::from(c.attempts))
            .bind(&c.event)
            .bind(&c.request_id)
            .bind(c.callback_url.as_deref())
            .bind(micros(c.queued_at))
            .execute(&mut *conn)
            .await;
            crate::inserted(result, "call", &c.namespace, &c.id)
        }
        CallWrite::Started {
            namespace,
            id,
            attempt,
            at,
        } => {
            let done = sqlx::query(
                "UPDATE async_calls SET phase = 'Running', attempts = $1, \
                 started_at = COALESCE(started_at, $2) WHERE namespace = $3 AND id = $4",
            )
            .bind(i64::from(*attempt))
            .bind(micros(*at))
            .bind(namespace)
            .bind(id)
            .execute(&mut *conn)
            .await?;
            if done.rows_affected() == 0 {
                return Err(not_found(id));
            }
            Ok(())
        }
        CallWrite::Finished {
            namespace,
            id,
            phase,
            attempts,
            response,
            error,
            at,
        } => {
            let headers = response
                .as_ref()
                .map(|r| serde_json::to_string(&r.headers))
                .transpose()?;
            let done = sqlx::query(
                "UPDATE async_calls SET phase = $1, attempts = $2, response_status = $3, \
                 response_headers = $4, response_body = $5, error = $6, finished_at = $7 \
                 WHERE namespace = $8 AND id = $9",
            )
            .bind(phase.as_str())
            .bind(i64::from(*attempts))
            .bind(response.as_ref().map(|r| i64::from(r.status)))
            .bind(headers)
            .bind(response.as_ref().map(|r| r.body.as_slice()))
            .bind(error.as_deref())
            .bind(micros(*at))
            .bind(namespace)
            .bind(id)
            .execute(&mut *conn)
            .await?;
            if done.rows_affected() == 0 {
                return Err(not_found(id));
            }
            Ok(())
        }
    }
}

/// Rows deleted per statement while pruning, so a prune never holds the write lock long.
const DELETE_CHUNK: i64 = 5000;

#[async_trait]
pub trait CallStore: Send + Sync + 'static {
    /// Stores a new call (phase `Queued`); it is durable when this returns.
    async fn insert_call(&self, call: &CallRecord) -> Result<()>;
    /// A namespace's call; `NotFound` for an unknown id or another namespace's.
    async fn get_call(&self, namespace: &str, id: &str) -> Result<CallRecord>;
    /// A namespace's calls matching `filter`, newest first.
    async fn list_calls(&self, namespace: &str, filter: &CallFilter) -> Result<Vec<CallRecord>>;
    /// Up to `limit` unfinished calls (`Queued` or `Running`) of one function whose
    /// place is after `after`, in queue order.
    async fn pending_calls(
        &self,
        namespace: &str,
        function: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<PendingCall>>;
    /// Every function with unfinished calls, and how many it has.
    async fn unfinished_counts(&self) -> Result<Vec<(String, String, u64)>>;
    /// Marks attempt `attempt` started (`Running`).
    async fn call_started(
        &self,
        namespace: &str,
        id: &str,
        attempt: u32,
        at: DateTime<Utc>,
    ) -> Result<()>;
    /// Records how the call ended (`Succeeded` or `Failed`).
    #[allow(clippy::too_many_arguments)]
    async fn call_finished(
        &self,
        namespace: &str,
        id: &str,
        phase: CallPhase,
        attempts: u32,
        response: Option<&CallResponse>,
        error: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<()>;
    /// Queues a finished call again from attempt 1, redriving dead letter `redrive_of`.
    async fn requeue_call(&self, namespace: &str, id: &str, redrive_of: &str)
    -> Result<CallRecord>;
    /// Deletes finished calls older than `max_age` and, per namespace, all but the
    /// newest `max_count` (zero turns a bound off). Unfinished calls always stay.
    async fn prune_calls(&self, max_age: Duration, max_count: u64) -> Result<u64>;
}

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn from_micros(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or_default()
}

macro_rules! call_columns {
    () => {
        "seq, id, namespace, function, phase, attempts, event, request_id, \
    callback_url, response_status, response_headers, response_body, error, redrive_of, \
    queued_at, started_at, finished_at"
    };
}

fn call_from_row(row: &AnyRow) -> Result<CallRecord> {
    let phase: String = row.try_get("phase")?;
    // The phases are stored by their serde names: an unknown one is a corrupt row.
    let phase: CallPhase = serde_json::from_value(serde_json::Value::String(phase))?;
    let status: Option<i64> = row.try_get("response_status")?;
    let response = match status {
        Some(status) => {
            let headers: Option<String> = row.try_get("response_headers")?;
            let headers: Vec<(String, String)> = match headers {
                Some(text) => serde_json::from_str(&text)?,
                None => Vec::new(),
            };
            let body: Option<Vec<u8>> = row.try_get("response_body")?;
            Some(CallResponse {
                status: u16::try_from(status).unwrap_or(0),
                headers,
                body: body.unwrap_or_default(),
            })
        }
        None => None,
    };
    let attempts: i64 = row.try_get("attempts")?;
    Ok(CallRecord {
        id: row.try_get("id")?,
        namespace: row.try_get("namespace")?,
        function: row.try_get("function")?,
        phase,
        attempts: u32::try_from(attempts).unwrap_or(0),
        event: row.try_get("event")?,
        request_id: row.try_get("request_id")?,
        callback_url: row.try_get("callback_url")?,
        response,
        error: row.try_get("error")?,
        redrive_of: row.try_get("redrive_of")?,
        queued_at: from_micros(row.try_get("queued_at")?),
        started_at: row
            .try_get::<Option<i64>, _>("started_at")?
            .map(from_micros),
        finished_at: row
            .try_get::<Option<i64>, _>("finished_at")?
            .map(from_micros),
    })
}

fn not_found(id: &str) -> StoreError {
    StoreError::NotFound {
        kind: "call",
        name: id.to_string(),
    }
}

#[async_trait]
impl CallStore for SqlStore {
    async fn insert_call(&self, c: &CallRecord) -> Result<()> {
        self.call_writer().write(CallWrite::Insert(c.clone())).await
    }

    async fn get_call(&self, namespace: &str, id: &str) -> Result<CallRecord> {
        let row = sqlx::query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM async_calls WHERE namespace = $1 AND id = $2"
        ))
        .bind(namespace)
        .bind(id)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| not_found(id))?;
        call_from_row(&row)
    }

    async fn list_calls(&self, namespace: &str, filter: &CallFilter) -> Result<Vec<CallRecord>> {
        let mut q = Builder::new(
            self.backend(),
            concat!(
                "SELECT ",
                call_columns!(),
                " FROM async_calls WHERE namespace = "
            ),
        );
        q.push_bind(namespace);
        if let Some(f) = &filter.function {
            q.push(" AND function = ").push_bind(f);
        }
        if let Some(p) = filter.phase {
            q.push(" AND phase = ").push_bind(p.as_str());
        }
        let limit = filter
            .limit
            .unwrap_or(DEFAULT_CALL_LIMIT)
            .clamp(1, MAX_CALL_LIMIT);
        q.push(" ORDER BY queued_at DESC, seq DESC LIMIT ")
            .push_bind(i64::from(limit));
        let rows = q.build()?.fetch_all(self.pool()).await?;
        rows.iter().map(call_from_row).collect()
    }

    async fn pending_calls(
        &self,
        namespace: &str,
        function: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<PendingCall>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM async_calls WHERE namespace = $1 AND function = $2 \
             AND phase IN ('Queued', 'Running') AND seq > $3 ORDER BY seq LIMIT $4"
        ))
        .bind(namespace)
        .bind(function)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(PendingCall {
                    seq: row.try_get("seq")?,
                    call: call_from_row(row)?,
                })
            })
            .collect()
    }

    async fn unfinished_counts(&self) -> Result<Vec<(String, String, u64)>> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(concat!(
            "SELECT namespace, function, COUNT(*) FROM async_calls \
             WHERE phase IN ('Queued', 'Running') AND ",
            live!("namespace"),
            " GROUP BY namespace, function"
        ))
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(ns, f, n)| (ns, f, u64::try_from(n).unwrap_or(0)))
            .collect())
    }

    async fn call_started(
        &self,
        namespace: &str,
        id: &str,
        attempt: u32,
        at: DateTime<Utc>,
    ) -> Result<()> {
        self.call_writer()
            .write(CallWrite::Started {
                namespace: namespace.to_string(),
                id: id.to_string(),
                attempt,
                at,
            })
            .await
    }

    async fn call_finished(
        &self,
        namespace: &str,
        id: &str,
        phase: CallPhase,
        attempts: u32,
        response: Option<&CallResponse>,
        error: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<()> {
        self.call_writer()
            .write(CallWrite::Finished {
                namespace: namespace.to_string(),
                id: id.to_string(),
                phase,
                attempts,
                response: response.cloned(),
                error: error.map(str::to_string),
                at,
            })
            .await
    }

    async fn requeue_call(
        &self,
        namespace: &str,
        id: &str,
        redrive_of: &str,
    ) -> Result<CallRecord> {
        let done = sqlx::query(
            "UPDATE async_calls SET phase = 'Queued', attempts = 0, response_status = NULL, \
             response_headers = NULL, response_body = NULL, error = NULL, started_at = NULL, \
             finished_at = NULL, redrive_of = $1 WHERE namespace = $2 AND id = $3",
        )
        .bind(redrive_of)
        .bind(namespace)
        .bind(id)
        .execute(self.pool())
        .await?;
        if done.rows_affected() == 0 {
            return Err(not_found(id));
        }
        self.get_call(namespace, id).await
    }

    async fn prune_calls(&self, max_age: Duration, max_count: u64) -> Result<u64> {
        let mut deleted = 0;
        if !max_age.is_zero() {
            let age = chrono::Duration::from_std(max_age).unwrap_or(chrono::Duration::MAX);
            let cutoff = micros(Utc::now().checked_sub_signed(age).unwrap_or_default());
            loop {
                let done = sqlx::query(
                    "DELETE FROM async_calls WHERE seq IN (SELECT seq FROM async_calls \
                     WHERE finished_at IS NOT NULL AND finished_at < $1 LIMIT $2)",
                )
                .bind(cutoff)
                .bind(DELETE_CHUNK)
                .execute(self.pool())
                .await?;
                deleted += done.rows_affected();
                if done.rows_affected() < DELETE_CHUNK as u64 {
                    break;
                }
            }
        }
        if max_count > 0 {
            let namespaces: Vec<String> =
                sqlx::query_scalar("SELECT DISTINCT namespace FROM async_calls")
                    .fetch_all(self.pool())
                    .await?;
            for ns in namespaces {
                let done = sqlx::query(
                    "DELETE FROM async_calls WHERE namespace = $1 AND finished_at IS NOT NULL \
                     AND seq NOT IN (SELECT seq FROM async_calls WHERE namespace = $1 \
                     ORDER BY queued_at DESC, seq DESC LIMIT $2)",
                )
                .bind(&ns)
                .bind(i64::try_from(max_count).unwrap_or(i64::MAX))
                .execute(self.pool())
                .await?;
                deleted += done.rows_affected();
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, ns: &str, f: &str, secs_ago: i64) -> CallRecord {
        CallRecord {
            id: id.into(),
            namespace: ns.into(),
            function: f.into(),
            phase: CallPhase::Queued,
            attempts: 0,
            event: br#"{"n":1}"#.to_vec(),
            request_id: format!("req-{id}"),
            callback_url: Some("http://127.0.0.1:9/cb".into()),
            response: None,
            error: None,
            redrive_of: None,
            queued_at: Utc::now() - chrono::Duration::seconds(secs_ago),
            started_at: None,
            finished_at: None,
        }
    }

    fn ids(calls: &[CallRecord]) -> Vec<&str> {
        calls.iter().map(|c| c.id.as_str()).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_share_commits_and_fail_alone() {
        let store = std::sync::Arc::new(crate::testing::store().await);
        store.insert_call(&call("dup", "a", "f", 0)).await.unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..200 {
            let store = store.clone();
            tasks.spawn(async move {
                let id = if i == 100 {
                    "dup".to_string()
                } else {
                    format!("c{i}")
                };
                let inserted = store.insert_call(&call(&id, "a", "f", 0)).await;
                let started = store
                    .call_started("a", &format!("c{i}"), 1, Utc::now())
                    .await;
                (i, inserted, started)
            });
        }
        let mut conflicts = 0;
        while let Some(done) = tasks.join_next().await {
            let (i, inserted, started) = done.unwrap();
            match inserted {
                Err(StoreError::Conflict { .. }) if i == 100 => conflicts += 1,
                other => assert!(other.is_ok(), "c{i}: {other:?}"),
            }
            // The one whose insert was the duplicate has no row of its own to start.
            if i == 100 {
                assert!(
                    matches!(started, Err(StoreError::NotFound { .. })),
                    "{started:?}"
                );
            } else {
                started.unwrap();
            }
        }
        assert_eq!(conflicts, 1);
        let running = store
            .list_calls(
                "a",
                &CallFilter {
                    phase: Some(CallPhase::Running),
                    limit: Some(1000),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(running.len(), 199);
    }

    #[tokio::test]
    async fn a_call_moves_through_its_phases_and_lists_newest_first() {
        let store = crate::testing::store().await;
        store.insert_call(&call("c1", "a", "f", 30)).await.unwrap();
        store.insert_call(&call("c2", "a", "g", 20)).await.unwrap();
        store.insert_call(&call("c3", "b", "f", 10)).await.unwrap();
        assert!(matches!(
            store.insert_call(&call("c1", "a", "f", 0)).await,
            Err(StoreError::Conflict { .. })
        ));
        let all = store.list_calls("a", &CallFilter::default()).await.unwrap();
        assert_eq!(ids(&all), ["c2", "c1"]);
        assert!(matches!(
            store.get_call("b", "c1").await,
            Err(StoreError::NotFound { .. })
        ));

        let pending = store.pending_calls("a", "f", 0, 10).await.unwrap();
        assert_eq!(pending.len(), 1);
        let seq = pending[0].seq;
        assert!(
            store
                .pending_calls("a", "f", seq, 10)
                .await
                .unwrap()
                .is_empty()
        );

        store.call_started("a", "c1", 1, Utc::now()).await.unwrap();
        let running = store.get_call("a", "c1").await.unwrap();
        assert_eq!((running.phase, running.attempts), (CallPhase::Running, 1));
        assert!(running.started_at.is_some());
        let response = CallResponse {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: br#"{"ok":true}"#.to_vec(),
        };
        store
            .call_finished(
                "a",
                "c1",
                CallPhase::Succeeded,
                2,
                Some(&response),
                None,
                Utc::now(),
            )
            .await
            .unwrap();
        let done = store.get_call("a", "c1").await.unwrap();
        assert_eq!(done.phase, CallPhase::Succeeded);
        assert_eq!(done.attempts, 2);
        assert_eq!(done.response, Some(response));
        assert!(
            store
                .pending_calls("a", "f", 0, 10)
                .await
                .unwrap()
                .is_empty()
        );

        let succeeded = CallFilter {
            phase: Some(CallPhase::Succeeded),
            ..CallFilter::default()
        };
        assert_eq!(
            ids(&store.list_calls("a", &succeeded).await.unwrap()),
            ["c1"]
        );
        let of_g = CallFilter {
            function: Some("g".into()),
            ..CallFilter::default()
        };
        assert_eq!(ids(&store.list_calls("a", &of_g).await.unwrap()), ["c2"]);

        let mut counts = store.unfinished_counts().await.unwrap();
        counts.sort();
        assert_eq!(
            counts,
            [("a".into(), "g".into(), 1), ("b".into(), "f".into(), 1)]
        );

        let again = store.requeue_call("a", "c1", "dl1").await.unwrap();
        assert_eq!(again.phase, CallPhase::Queued);
        assert_eq!(again.attempts, 0);
        assert_eq!(again.response, None);
        assert_eq!(again.redrive_of.as_deref(), Some("dl1"));
    }

    #[tokio::test]
    async fn pruning_takes_only_finished_calls() {
        let store = crate::testing::store().await;
        for (id, ago) in [("old", 7200), ("older", 20), ("new", 10), ("queued", 7200)] {
            store.insert_call(&call(id, "a", "f", ago)).await.unwrap();
        }
        let long_ago = Utc::now() - chrono::Duration::seconds(7000);
        store
            .call_finished(
                "a",
                "old",
                CallPhase::Failed,
                1,
                None,
                Some("boom"),
                long_ago,
            )
            .await
            .unwrap();
        for id in ["older", "new"] {
            store
                .call_finished("a", id, CallPhase::Succeeded, 1, None, None, Utc::now())
                .await
                .unwrap();
        }
        assert_eq!(
            store
                .prune_calls(Duration::from_secs(3600), 0)
                .await
                .unwrap(),
            1
        );
        assert_eq!(store.prune_calls(Duration::ZERO, 1).await.unwrap(), 1);
        let left = store.list_calls("a", &CallFilter::default()).await.unwrap();
        assert_eq!(
            ids(&left),
            ["new", "queued"],
            "an unfinished call is never pruned"
        );
    }
}
