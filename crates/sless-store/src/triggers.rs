//! Triggers as stored: spec (desired) and status (reported by the scheduler).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sless_core::{TriggerKind, TriggerSpec, TriggerStatus};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::cas::Cas;
use crate::{Edit, Result, SqlStore, StoreError, stamp, time};

/// A trigger as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerRecord {
    pub namespace: String,
    pub name: String,
    pub spec: TriggerSpec,
    pub status: TriggerStatus,
    /// Grows by one with every change of the spec (through
    /// [`TriggerStore::update_trigger`]); the scheduler's status writes leave it alone.
    /// A new trigger is at 1, whatever the record passed to create says.
    pub generation: u64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[async_trait]
pub trait TriggerStore: Send + Sync + 'static {
    async fn create_trigger(&self, record: &TriggerRecord) -> Result<()>;
    async fn get_trigger(&self, namespace: &str, name: &str) -> Result<TriggerRecord>;
    /// Triggers of one namespace, or of all when `None`, ordered by name.
    async fn list_triggers(&self, namespace: Option<&str>) -> Result<Vec<TriggerRecord>>;
    /// Changes the spec by `edit` (given the current record; only its spec is
    /// written) and returns the record as it now stands. A change bumps the
    /// generation; an edit that changes nothing writes nothing. A compare-and-swap on
    /// the generation: with `expect`, only if the trigger is still at that generation
    /// (else [`StoreError::PreconditionFailed`]); without, `edit` runs again on the
    /// newer record when a concurrent writer got there first, so no edit is lost.
    async fn update_trigger(
        &self,
        namespace: &str,
        name: &str,
        expect: Option<u64>,
        edit: &mut Edit<'_, TriggerRecord>,
    ) -> Result<TriggerRecord>;
    /// Records the scheduler's view; never touches the spec or the generation.
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

fn from_row(row: &AnyRow) -> Result<TriggerRecord> {
    Ok(TriggerRecord {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        spec: serde_json::from_str(row.try_get::<&str, _>("spec")?)?,
        status: serde_json::from_str(row.try_get::<&str, _>("status")?)?,
        generation: row.try_get::<i64, _>("generation")? as u64,
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
impl TriggerStore for SqlStore {
    async fn create_trigger(&self, r: &TriggerRecord) -> Result<()> {
        // An HTTP trigger claims its path in the transaction that writes it, which
        // holds SQLite's write lock from its first read: two writers cannot both
        // find a path free.
        let mut tx = self.begin_write().await?;
        claim_path(&mut tx, &r.namespace, &r.name, &r.spec).await?;
        let result = sqlx::query(
            "INSERT INTO triggers (namespace, name, function, kind, spec, status, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&r.namespace)
        .bind(&r.name)
        .bind(&r.spec.function)
        .bind(kind(&r.spec))
        .bind(serde_json::to_string(&r.spec)?)
        .bind(serde_json::to_string(&r.status)?)
        .bind(stamp(r.created_at))
        .bind(stamp(r.updated_at))
        .execute(&mut *tx)
        .await;
        crate::inserted(result, "trigger", &r.namespace, &r.name)?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_trigger(&self, namespace: &str, name: &str) -> Result<TriggerRecord> {
        let row = sqlx::query("SELECT * FROM triggers WHERE namespace = $1 AND name = $2")
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
                sqlx::query("SELECT * FROM triggers WHERE namespace = $1 ORDER BY name")
                    .bind(ns)
                    .fetch_all(self.pool())
                    .await?
            }
            None => {
                sqlx::query(concat!(
                    "SELECT * FROM triggers WHERE ",
                    live!("namespace"),
                    " ORDER BY namespace, name"
                ))
                .fetch_all(self.pool())
                .await?
            }
        };
        rows.iter().map(from_row).collect()
    }

    async fn update_trigger(
        &self,
        namespace: &str,
        name: &str,
        expect: Option<u64>,
        edit: &mut Edit<'_, TriggerRecord>,
    ) -> Result<TriggerRecord> {
        let mut cas = Cas::new("trigger", name, expect);
        loop {
            let current = self.get_trigger(namespace, name).await?;
            cas.check(current.generation)?;
            let mut edited = current.clone();
            edit(&mut edited)?;
            if edited.spec == current.spec {
                return Ok(current);
            }
            let record = TriggerRecord {
                spec: edited.spec,
                generation: current.generation + 1,
                updated_at: Utc::now(),
                ..current.clone()
            };
            let spec = &record.spec;
            let mut tx = self.begin_write().await?;
            claim_path(&mut tx, namespace, name, spec).await?;
            let done = sqlx::query(
                "UPDATE triggers SET spec = $1, function = $2, generation = $3, updated_at = $4 \
                 WHERE namespace = $5 AND name = $6 AND generation = $7",
            )
            .bind(serde_json::to_string(spec)?)
            .bind(&spec.function)
            .bind(record.generation as i64)
            .bind(stamp(record.updated_at))
            .bind(namespace)
            .bind(name)
            .bind(current.generation as i64)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 1 {
                tx.commit().await?;
                return Ok(record);
            }
            drop(tx);
            cas.lost().await?;
        }
    }

    async fn set_trigger_status(
        &self,
        namespace: &str,
        name: &str,
        status: &TriggerStatus,
    ) -> Result<()> {
        sqlx::query("UPDATE triggers SET status = $1 WHERE namespace = $2 AND name = $3")
            .bind(serde_json::to_string(status)?)
            .bind(namespace)
            .bind(name)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn delete_trigger(&self, namespace: &str, name: &str) -> Result<()> {
        let done = sqlx::query("DELETE FROM triggers WHERE namespace = $1 AND name = $2")
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
        let rows = sqlx::query(
            "DELETE FROM triggers WHERE namespace = $1 AND function = $2 RETURNING name",
        )
        .bind(namespace)
        .bind(function)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(|r| Ok(r.try_get("name")?)).collect()
    }
}

/// Fails with [`StoreError::PathTaken`] when `spec` is an HTTP trigger whose path
/// another trigger of the namespace already routes. Run inside the writing
/// transaction (begun `IMMEDIATE`), so the answer holds until the write commits.
async fn claim_path(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    namespace: &str,
    name: &str,
    spec: &TriggerSpec,
) -> Result<()> {
    let TriggerKind::Http { path, .. } = &spec.kind else {
        return Ok(());
    };
    // The namespace's other HTTP triggers, their paths compared here: portable
    // across the backends' JSON functions, and a namespace holds few of them.
    let rows = sqlx::query(
        "SELECT name, spec FROM triggers WHERE namespace = $1 AND name <> $2 AND kind = 'http' \
         ORDER BY name",
    )
    .bind(namespace)
    .bind(name)
    .fetch_all(&mut **tx)
    .await?;
    let mut owner = None;
    for row in rows {
        let other: TriggerSpec = serde_json::from_str(&row.try_get::<String, _>("spec")?)?;
        if matches!(&other.kind, TriggerKind::Http { path: p, .. } if p == path) {
            owner = Some(row.try_get::<String, _>("name")?);
            break;
        }
    }
    match owner {
        Some(owner) => Err(StoreError::PathTaken {
            path: path.clone(),
            owner,
        }),
        None => Ok(()),
    }
}
