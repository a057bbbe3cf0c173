//! Dead letters: messages of queue and device triggers, and async calls, that
//! exhausted their delivery policy. Kept until redriven (successfully) or deleted;
//! listed newest first. [`DeadLetterStore`] is the seam; [`SqlStore`] implements it.

use async_trait::async_trait;
use chrono::DateTime;
use sless_core::{DeadLetter, DeadLetterSource};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::query::Builder;

use crate::{Result, SqlStore, StoreError};

/// Which dead letters [`DeadLetterStore::list_dead_letters`] returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadLetterFilter {
    pub trigger: Option<String>,
    pub function: Option<String>,
    /// At most this many: [`DEFAULT_DEAD_LETTER_LIMIT`] when `None`, capped at
    /// [`MAX_DEAD_LETTER_LIMIT`].
    pub limit: Option<u32>,
}

/// Dead letters listed when the filter names no limit.
pub const DEFAULT_DEAD_LETTER_LIMIT: u32 = 100;
/// The most dead letters one list returns.
pub const MAX_DEAD_LETTER_LIMIT: u32 = 1000;

#[async_trait]
pub trait DeadLetterStore: Send + Sync + 'static {
    /// Stores a dead letter, or replaces the one with its id (a redrive that failed again).
    async fn put_dead_letter(&self, dl: &DeadLetter) -> Result<()>;
    /// A namespace's dead letter; `NotFound` for an unknown id or another namespace's.
    async fn get_dead_letter(&self, namespace: &str, id: &str) -> Result<DeadLetter>;
    /// A namespace's dead letters matching `filter`, newest first.
    async fn list_dead_letters(
        &self,
        namespace: &str,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetter>>;
    /// Deletes a dead letter; `NotFound` when there is none of that id in the namespace.
    async fn delete_dead_letter(&self, namespace: &str, id: &str) -> Result<()>;
    /// How many dead letters live namespaces hold (the `sless_dead_letters` gauge).
    async fn count_dead_letters(&self) -> Result<u64>;
}

fn dead_letter_from_row(row: &AnyRow) -> Result<DeadLetter> {
    let source: String = row.try_get("source")?;
    let source: DeadLetterSource = serde_json::from_value(serde_json::Value::String(source))?;
    let message: String = row.try_get("message")?;
    let attempts: i64 = row.try_get("attempts")?;
    let last_status: i64 = row.try_get("last_status")?;
    Ok(DeadLetter {
        id: row.try_get("id")?,
        namespace: row.try_get("namespace")?,
        source,
        trigger: row.try_get("trigger")?,
        function: row.try_get("function")?,
        payload: row.try_get("payload")?,
        message: serde_json::from_str(&message)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        last_status: u16::try_from(last_status).unwrap_or(0),
        error: row.try_get("error")?,
        failed_at: DateTime::from_timestamp_micros(row.try_get("failed_at")?).unwrap_or_default(),
    })
}

macro_rules! dead_letter_columns {
    () => {
        "id, namespace, source, trigger, function, payload, message, attempts, \
    last_status, error, failed_at"
    };
}

fn not_found(id: &str) -> StoreError {
    StoreError::NotFound {
        kind: "dead letter",
        name: id.to_string(),
    }
}

#[async_trait]
impl DeadLetterStore for SqlStore {
    async fn put_dead_letter(&self, dl: &DeadLetter) -> Result<()> {
        sqlx::query(concat!(
            "INSERT INTO dead_letters (",
            dead_letter_columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT (id) DO UPDATE SET payload = excluded.payload, \
             message = excluded.message, attempts = excluded.attempts, \
             last_status = excluded.last_status, error = excluded.error, \
             failed_at = excluded.failed_at"
        ))
        .bind(&dl.id)
        .bind(&dl.namespace)
        .bind(dl.source.as_str())
        .bind(dl.trigger.as_deref())
        .bind(&dl.function)
        .bind(&dl.payload)
        .bind(serde_json::to_string(&dl.message)?)
        .bind(i64::from(dl.attempts))
        .bind(i64::from(dl.last_status))
        .bind(dl.error.as_deref())
        .bind(dl.failed_at.timestamp_micros())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn get_dead_letter(&self, namespace: &str, id: &str) -> Result<DeadLetter> {
        let row = sqlx::query(concat!(
            "SELECT ",
            dead_letter_columns!(),
            " FROM dead_letters WHERE namespace = $1 AND id = $2"
        ))
        .bind(namespace)
        .bind(id)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| not_found(id))?;
        dead_letter_from_row(&row)
    }

    async fn list_dead_letters(
        &self,
        namespace: &str,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetter>> {
        let mut q = Builder::new(
            self.backend(),
            concat!(
                "SELECT ",
                dead_letter_columns!(),
                " FROM dead_letters WHERE namespace = "
            ),
        );
        q.push_bind(namespace);
        if let Some(t) = &filter.trigger {
            q.push(" AND trigger = ").push_bind(t);
        }
        if let Some(f) = &filter.function {
            q.push(" AND function = ").push_bind(f);
        }
        let limit = filter
            .limit
            .unwrap_or(DEFAULT_DEAD_LETTER_LIMIT)
            .clamp(1, MAX_DEAD_LETTER_LIMIT);
        q.push(" ORDER BY failed_at DESC, id DESC LIMIT ")
            .push_bind(i64::from(limit));
        let rows = q.build()?.fetch_all(self.pool()).await?;
        rows.iter().map(dead_letter_from_row).collect()
    }

    async fn delete_dead_letter(&self, namespace: &str, id: &str) -> Result<()> {
        let done = sqlx::query("DELETE FROM dead_letters WHERE namespace = $1 AND id = $2")
            .bind(namespace)
            .bind(id)
            .execute(self.pool())
            .await?;
        if done.rows_affected() == 0 {
            return Err(not_found(id));
        }
        Ok(())
    }
    async fn count_dead_letters(&self) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(concat!(
            "SELECT COUNT(*) FROM dead_letters WHERE ",
            live!("namespace")
        ))
        .fetch_one(self.pool())
        .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn dl(id: &str, trigger: Option<&str>, secs_ago: i64) -> DeadLetter {
        DeadLetter {
            id: id.into(),
            namespace: "a".into(),
            source: if trigger.is_some() {
                DeadLetterSource::Queue
            } else {
                DeadLetterSource::Async
            },
            trigger: trigger.map(Into::into),
            function: "f".into(),
            payload: vec![0xff, 0x00],
            message: serde_json::json!({"topic": "orders"}),
            attempts: 3,
            last_status: 500,
            error: Some("boom".into()),
            failed_at: Utc::now() - chrono::Duration::seconds(secs_ago),
        }
    }

    #[tokio::test]
    async fn dead_letters_round_trip_update_and_go() {
        let store = crate::testing::store().await;
        store
            .put_dead_letter(&dl("d1", Some("orders-in"), 20))
            .await
            .unwrap();
        store.put_dead_letter(&dl("d2", None, 10)).await.unwrap();
        let all = store
            .list_dead_letters("a", &DeadLetterFilter::default())
            .await
            .unwrap();
        let ids: Vec<_> = all.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["d2", "d1"]);
        assert_eq!(store.count_dead_letters().await.unwrap(), 2);
        assert_eq!(all[1].payload, vec![0xff, 0x00]);
        assert_eq!(all[1].source, DeadLetterSource::Queue);
        let by_trigger = DeadLetterFilter {
            trigger: Some("orders-in".into()),
            ..DeadLetterFilter::default()
        };
        assert_eq!(
            store
                .list_dead_letters("a", &by_trigger)
                .await
                .unwrap()
                .len(),
            1
        );
        assert!(
            store
                .list_dead_letters("b", &DeadLetterFilter::default())
                .await
                .unwrap()
                .is_empty()
        );

        let mut again = dl("d1", Some("orders-in"), 0);
        again.attempts = 5;
        again.error = Some("still failing".into());
        store.put_dead_letter(&again).await.unwrap();
        let got = store.get_dead_letter("a", "d1").await.unwrap();
        assert_eq!(
            (got.attempts, got.error.as_deref()),
            (5, Some("still failing"))
        );

        assert!(matches!(
            store.get_dead_letter("b", "d1").await,
            Err(StoreError::NotFound { .. })
        ));
        store.delete_dead_letter("a", "d1").await.unwrap();
        assert!(matches!(
            store.delete_dead_letter("a", "d1").await,
            Err(StoreError::NotFound { .. })
        ));
    }
}
