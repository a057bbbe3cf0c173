//! Jobs as stored: spec, status of the current run, and (self-contained jobs) code.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sless_core::{JobSpec, JobStatus};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use crate::{Result, SqliteStore, StoreError, stamp, time};

/// A job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    pub namespace: String,
    pub name: String,
    pub spec: JobSpec,
    pub status: JobStatus,
    /// SHA-256 of a self-contained job's archive, once uploaded.
    pub code_sha256: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[async_trait]
pub trait JobStore: Send + Sync + 'static {
    async fn create_job(&self, record: &JobRecord) -> Result<()>;
    async fn get_job(&self, namespace: &str, name: &str) -> Result<JobRecord>;
    async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>>;
    /// Replaces spec and status together (a patch that may start a new run).
    async fn update_job(
        &self,
        namespace: &str,
        name: &str,
        spec: &JobSpec,
        status: &JobStatus,
    ) -> Result<()>;
    /// Records a run's progress; ignored (returns `false`) if the job has moved on
    /// to another `run_id` meanwhile, so a stale run never overwrites a new one.
    async fn set_job_status(&self, namespace: &str, name: &str, status: &JobStatus)
    -> Result<bool>;
    async fn set_job_code(&self, namespace: &str, name: &str, sha256: &str) -> Result<()>;
    async fn delete_job(&self, namespace: &str, name: &str) -> Result<()>;
}

fn from_row(row: &SqliteRow) -> Result<JobRecord> {
    Ok(JobRecord {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        spec: serde_json::from_str(row.try_get::<&str, _>("spec")?)?,
        status: serde_json::from_str(row.try_get::<&str, _>("status")?)?,
        code_sha256: row.try_get("code_sha256")?,
        created_at: time(row.try_get::<&str, _>("created_at")?),
        updated_at: time(row.try_get::<&str, _>("updated_at")?),
    })
}

#[async_trait]
impl JobStore for SqliteStore {
    async fn create_job(&self, r: &JobRecord) -> Result<()> {
        let result = sqlx::query(
            "INSERT INTO jobs (namespace, name, spec, status, code_sha256, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&r.namespace)
        .bind(&r.name)
        .bind(serde_json::to_string(&r.spec)?)
        .bind(serde_json::to_string(&r.status)?)
        .bind(&r.code_sha256)
        .bind(stamp(r.created_at))
        .bind(stamp(r.updated_at))
        .execute(self.pool())
        .await;
        crate::inserted(result, "job", &r.namespace, &r.name)
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<JobRecord> {
        let row = sqlx::query("SELECT * FROM jobs WHERE namespace = ? AND name = ?")
            .bind(namespace)
            .bind(name)
            .fetch_optional(self.pool())
            .await?
            .ok_or_else(|| StoreError::NotFound {
                kind: "job",
                name: name.to_string(),
            })?;
        from_row(&row)
    }

    async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>> {
        let rows = match namespace {
            Some(ns) => {
                sqlx::query("SELECT * FROM jobs WHERE namespace = ? ORDER BY name")
                    .bind(ns)
                    .fetch_all(self.pool())
                    .await?
            }
            None => {
                sqlx::query("SELECT * FROM jobs ORDER BY namespace, name")
                    .fetch_all(self.pool())
                    .await?
            }
        };
        rows.iter().map(from_row).collect()
    }

    async fn update_job(
        &self,
        namespace: &str,
        name: &str,
        spec: &JobSpec,
        status: &JobStatus,
    ) -> Result<()> {
        let done = sqlx::query(
            "UPDATE jobs SET spec = ?, status = ?, updated_at = ? WHERE namespace = ? AND name = ?",
        )
        .bind(serde_json::to_string(spec)?)
        .bind(serde_json::to_string(status)?)
        .bind(stamp(Utc::now()))
        .bind(namespace)
        .bind(name)
        .execute(self.pool())
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                kind: "job",
                name: name.to_string(),
            });
        }
        Ok(())
    }

    async fn set_job_status(
        &self,
        namespace: &str,
        name: &str,
        status: &JobStatus,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE jobs SET status = ? WHERE namespace = ? AND name = ? AND json_extract(spec, '$.run_id') = ?",
        )
        .bind(serde_json::to_string(status)?)
        .bind(namespace)
        .bind(name)
        .bind(status.run_id as i64)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn set_job_code(&self, namespace: &str, name: &str, sha256: &str) -> Result<()> {
        let done = sqlx::query(
            "UPDATE jobs SET code_sha256 = ?, updated_at = ? WHERE namespace = ? AND name = ?",
        )
        .bind(sha256)
        .bind(stamp(Utc::now()))
        .bind(namespace)
        .bind(name)
        .execute(self.pool())
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                kind: "job",
                name: name.to_string(),
            });
        }
        Ok(())
    }

    async fn delete_job(&self, namespace: &str, name: &str) -> Result<()> {
        let done = sqlx::query("DELETE FROM jobs WHERE namespace = ? AND name = ?")
            .bind(namespace)
            .bind(name)
            .execute(self.pool())
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                kind: "job",
                name: name.to_string(),
            });
        }
        Ok(())
    }
}
