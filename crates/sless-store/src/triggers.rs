//! Triggers as stored: spec (desired) and status (reported by the scheduler).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sless_core::{TriggerSpec, TriggerStatus};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use crate::{Result, SqliteStore, StoreError, stamp, time};

/// A trigger as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerRecord {
    pub namespace: String,
    pub name: String,
    pub spec: TriggerSpec,
    pub status: TriggerStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[async_trait]
pub trait TriggerStore: Send + Sync + 'static {
    async fn create_trigger(&self, record: &TriggerRecord) -> Result<()>;
    async fn get_trigger(&self, namespace: &str, name: &str) -> Result<TriggerRecord>;
    /// Triggers of one namespace, or of all when `None`, ordered by name.
    async fn list_triggers(&self, namespace: Option<&str>) -> Result<Vec<TriggerRecord>>;
    /// Replaces the spec (after the caller merged and validated a patch).
    async fn update_trigger_spec(
        &self,
        namespace: &str,
        name: &str,
        spec: &TriggerSpec,
    ) -> Result<TriggerRecord>;
    /// Records the scheduler's view; never touches the spec.
    async fn set_trigger_status(
        &self,
        namespace: &str,
        name: &str,
        status: &TriggerStatus,
    ) -> Result<()>;
    async fn delete_trigger(&self, namespace: &str, name: &str) -> Result<()>;
    /// Deletes the triggers of a function (the function was deleted); returns their names.
    async fn delete_function_triggers(
        &self,
        namespace: &str,
        function: &str,
    ) -> Result<Vec<String>>;
}

fn from_row(row: &SqliteRow) -> Result<TriggerRecord> {
    Ok(TriggerRecord {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        spec: serde_json::from_str(row.try_get::<&str, _>("spec")?)?,
        status: serde_json::from_str(row.try_get::<&str, _>("status")?)?,
        created_at: time(row.try_get::<&str, _>("created_at")?),
        updated_at: time(row.try_get::<&str, _>("updated_at")?),
    })
}

fn kind(spec: &TriggerSpec) -> &'static str {
    // Stored specs were validated, so their type is always known.
    spec.trigger_type()
        .map_or("unknown", sless_core::TriggerType::as_str)
}

#[async_trait]
impl TriggerStore for SqliteStore {
    async fn create_trigger(&self, r: &TriggerRecord) -> Result<()> {
        let result = sqlx::query(
            "INSERT INTO triggers (namespace, name, function, kind, spec, status, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&r.namespace)
        .bind(&r.name)
        .bind(&r.spec.function)
        .bind(kind(&r.spec))
        .bind(serde_json::to_string(&r.spec)?)
        .bind(serde_json::to_string(&r.status)?)
        .bind(stamp(r.created_at))
        .bind(stamp(r.updated_at))
        .execute(self.pool())
        .await;
        crate::inserted(result, "trigger", &r.namespace, &r.name)
    }

    async fn get_trigger(&self, namespace: &str, name: &str) -> Result<TriggerRecord> {
        let row = sqlx::query("SELECT * FROM triggers WHERE namespace = ? AND name = ?")
            .bind(namespace)
            .bind(name)
            .fetch_optional(self.pool())
            .await?
            .ok_or_else(|| StoreError::NotFound {
                kind: "trigger",
                name: name.to_string(),
            })?;
        from_row(&row)
    }

    async fn list_triggers(&self, namespace: Option<&str>) -> Result<Vec<TriggerRecord>> {
        let rows = match namespace {
            Some(ns) => {
                sqlx::query("SELECT * FROM triggers WHERE namespace = ? ORDER BY name")
                    .bind(ns)
                    .fetch_all(self.pool())
                    .await?
            }
            None => {
                sqlx::query("SELECT * FROM triggers ORDER BY namespace, name")
                    .fetch_all(self.pool())
                    .await?
            }
        };
        rows.iter().map(from_row).collect()
    }

    async fn update_trigger_spec(
        &self,
        namespace: &str,
        name: &str,
        spec: &TriggerSpec,
    ) -> Result<TriggerRecord> {
        let done = sqlx::query("UPDATE triggers SET spec = ?, function = ?, updated_at = ? WHERE namespace = ? AND name = ?")
            .bind(serde_json::to_string(spec)?)
            .bind(&spec.function)
            .bind(stamp(Utc::now()))
            .bind(namespace)
            .bind(name)
            .execute(self.pool())
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                kind: "trigger",
                name: name.to_string(),
            });
        }
        self.get_trigger(namespace, name).await
    }

    async fn set_trigger_status(
        &self,
        namespace: &str,
        name: &str,
        status: &TriggerStatus,
    ) -> Result<()> {
        sqlx::query("UPDATE triggers SET status = ? WHERE namespace = ? AND name = ?")
            .bind(serde_json::to_string(status)?)
            .bind(namespace)
            .bind(name)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn delete_trigger(&self, namespace: &str, name: &str) -> Result<()> {
        let done = sqlx::query("DELETE FROM triggers WHERE namespace = ? AND name = ?")
            .bind(namespace)
            .bind(name)
            .execute(self.pool())
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                kind: "trigger",
                name: name.to_string(),
            });
        }
        Ok(())
    }

    async fn delete_function_triggers(
        &self,
        namespace: &str,
        function: &str,
    ) -> Result<Vec<String>> {
        let rows =
            sqlx::query("DELETE FROM triggers WHERE namespace = ? AND function = ? RETURNING name")
                .bind(namespace)
                .bind(function)
                .fetch_all(self.pool())
                .await?;
        rows.iter().map(|r| Ok(r.try_get("name")?)).collect()
    }
}
