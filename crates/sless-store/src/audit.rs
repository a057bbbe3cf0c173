//! The audit log: one entry per control-plane change the API was asked for (who did
//! what to which object, when, from where, and the HTTP status it got). Entries
//! never hold request bodies. Listed newest first, pruned by age and count like
//! invocation records. [`AuditStore`] is the seam; [`SqlStore`] implements it.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::query::Builder;

use crate::{Result, SqlStore};

/// One audited request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// Unique, and sortable by the time it was made.
    pub id: String,
    pub at: DateTime<Utc>,
    /// `admin`, `token:<id>`, `jwt:<sub>`, or `anonymous` when authentication failed.
    pub actor: String,
    /// The namespace acted in, when there is one.
    pub namespace: Option<String>,
    /// What was asked, e.g. `function.create`, `secret.put`, `token.delete`.
    pub action: String,
    /// The kind of object acted on (`function`, `token`, ...).
    pub object_kind: String,
    /// Its name (or id), when known.
    pub object_name: Option<String>,
    /// The client's address.
    pub address: Option<String>,
    /// The HTTP status of the answer.
    pub status: u16,
}

/// Which entries [`AuditStore::list_audit`] returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuditFilter {
    pub namespace: Option<String>,
    /// Entries at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// At most this many: [`DEFAULT_AUDIT_LIMIT`] when `None`, capped at [`MAX_AUDIT_LIMIT`].
    pub limit: Option<u32>,
}

/// Entries listed when the filter names no limit.
pub const DEFAULT_AUDIT_LIMIT: u32 = 100;
/// The most entries one list returns.
pub const MAX_AUDIT_LIMIT: u32 = 1000;

/// Rows deleted per statement while pruning, so a prune never holds the write lock long.
const DELETE_CHUNK: i64 = 5000;

#[async_trait]
pub trait AuditStore: Send + Sync + 'static {
    async fn record_audit(&self, entry: &AuditEntry) -> Result<()>;
    /// Entries matching `filter`, newest first.
    async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>>;
    /// Deletes entries older than `max_age` and all but the newest `max_count` (zero
    /// turns a bound off). The count bound is over the whole log, not per namespace:
    /// entries such as an admin token rotation belong to none. Returns how many went.
    async fn prune_audit(&self, max_age: Duration, max_count: u64) -> Result<u64>;
}

fn entry_from_row(row: &sqlx::any::AnyRow) -> Result<AuditEntry> {
    let at: i64 = row.try_get("at_us")?;
    let status: i64 = row.try_get("status")?;
    Ok(AuditEntry {
        id: row.try_get("id")?,
        at: DateTime::from_timestamp_micros(at).unwrap_or_default(),
        actor: row.try_get("actor")?,
        namespace: row.try_get("namespace")?,
        action: row.try_get("action")?,
        object_kind: row.try_get("object_kind")?,
        object_name: row.try_get("object_name")?,
        address: row.try_get("address")?,
        status: u16::try_from(status).unwrap_or(0),
    })
}

#[async_trait]
impl AuditStore for SqlStore {
    async fn record_audit(&self, e: &AuditEntry) -> Result<()> {
        sqlx::query(
            "INSERT INTO audit (id, at_us, actor, namespace, action, object_kind, object_name, \
             address, status) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&e.id)
        .bind(e.at.timestamp_micros())
        .bind(&e.actor)
        .bind(e.namespace.as_deref())
        .bind(&e.action)
        .bind(&e.object_kind)
        .bind(e.object_name.as_deref())
        .bind(e.address.as_deref())
        .bind(i64::from(e.status))
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
        let mut q = Builder::new(
            self.backend(),
            "SELECT id, at_us, actor, namespace, action, object_kind, object_name, address, \
             status FROM audit WHERE 1 = 1",
        );
        if let Some(ns) = &filter.namespace {
            q.push(" AND namespace = ").push_bind(ns);
        }
        if let Some(since) = filter.since {
            q.push(" AND at_us >= ").push_bind(since.timestamp_micros());
        }
        let limit = filter
            .limit
            .unwrap_or(DEFAULT_AUDIT_LIMIT)
            .clamp(1, MAX_AUDIT_LIMIT);
        q.push(" ORDER BY at_us DESC, id DESC LIMIT ")
            .push_bind(i64::from(limit));
        let rows = q.build()?.fetch_all(self.pool()).await?;
        rows.iter().map(entry_from_row).collect()
    }

    async fn prune_audit(&self, max_age: Duration, max_count: u64) -> Result<u64> {
        let age_cutoff = (!max_age.is_zero()).then(|| {
            let age = chrono::Duration::from_std(max_age).unwrap_or(chrono::Duration::MAX);
            Utc::now()
                .checked_sub_signed(age)
                .unwrap_or_default()
                .timestamp_micros()
        });
        // The newest entry past the count bound: it and everything older go.
        let over: Option<(i64, String)> = if max_count == 0 {
            None
        } else {
            sqlx::query_as(
                "SELECT at_us, id FROM audit ORDER BY at_us DESC, id DESC LIMIT 1 OFFSET $1",
            )
            .bind(i64::try_from(max_count).unwrap_or(i64::MAX))
            .fetch_optional(self.pool())
            .await?
        };
        let (time, last_id) = match (age_cutoff, over) {
            (None, None) => return Ok(0),
            (Some(age), None) => (age, None),
            (None, Some((t, id))) => (t, Some(id)),
            (Some(age), Some((t, id))) if t >= age => (t, Some(id)),
            (Some(age), Some(_)) => (age, None),
        };
        let mut deleted = 0;
        loop {
            let done = sqlx::query(
                "DELETE FROM audit WHERE id IN (SELECT id FROM audit \
                 WHERE at_us < $1 OR (at_us = $1 AND id <= $2) ORDER BY at_us, id LIMIT $3)",
            )
            .bind(time)
            .bind(last_id.as_deref())
            .bind(DELETE_CHUNK)
            .execute(self.pool())
            .await?;
            deleted += done.rows_affected();
            if done.rows_affected() < DELETE_CHUNK as u64 {
                return Ok(deleted);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, ns: Option<&str>, secs_ago: i64) -> AuditEntry {
        AuditEntry {
            id: id.into(),
            at: Utc::now() - chrono::Duration::seconds(secs_ago),
            actor: "jwt:alice@example.com".into(),
            namespace: ns.map(Into::into),
            action: "function.create".into(),
            object_kind: "function".into(),
            object_name: Some("hello".into()),
            address: Some("127.0.0.1".into()),
            status: 201,
        }
    }

    fn ids(entries: &[AuditEntry]) -> Vec<&str> {
        entries.iter().map(|e| e.id.as_str()).collect()
    }

    #[tokio::test]
    async fn entries_round_trip_newest_first_and_filter() {
        let store = crate::testing::store().await;
        store
            .record_audit(&entry("1", Some("a"), 30))
            .await
            .unwrap();
        store
            .record_audit(&entry("2", Some("b"), 20))
            .await
            .unwrap();
        store.record_audit(&entry("3", None, 10)).await.unwrap();
        let all = store.list_audit(&AuditFilter::default()).await.unwrap();
        assert_eq!(ids(&all), ["3", "2", "1"]);
        assert_eq!(
            all[1].actor, "jwt:alice@example.com",
            "a JWT subject is stored as is"
        );
        assert_eq!(all[1], {
            let mut e = entry("2", Some("b"), 0);
            e.at = all[1].at;
            e
        });
        let a = AuditFilter {
            namespace: Some("a".into()),
            ..AuditFilter::default()
        };
        assert_eq!(ids(&store.list_audit(&a).await.unwrap()), ["1"]);
        let recent = AuditFilter {
            since: Some(Utc::now() - chrono::Duration::seconds(15)),
            ..AuditFilter::default()
        };
        assert_eq!(ids(&store.list_audit(&recent).await.unwrap()), ["3"]);
        let one = AuditFilter {
            limit: Some(1),
            ..AuditFilter::default()
        };
        assert_eq!(ids(&store.list_audit(&one).await.unwrap()), ["3"]);
    }

    #[tokio::test]
    async fn pruning_keeps_the_newest_within_age_and_count() {
        let store = crate::testing::store().await;
        for (i, ago) in [(1, 7200), (2, 50), (3, 40), (4, 30)] {
            store
                .record_audit(&entry(&i.to_string(), Some("a"), ago))
                .await
                .unwrap();
        }
        assert_eq!(store.prune_audit(Duration::ZERO, 0).await.unwrap(), 0);
        assert_eq!(
            store
                .prune_audit(Duration::from_secs(3600), 0)
                .await
                .unwrap(),
            1
        );
        assert_eq!(store.prune_audit(Duration::ZERO, 2).await.unwrap(), 1);
        let left = store.list_audit(&AuditFilter::default()).await.unwrap();
        assert_eq!(ids(&left), ["4", "3"]);
    }
}
