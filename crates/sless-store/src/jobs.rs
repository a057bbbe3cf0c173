//! Jobs as stored: spec, status of the current run, and (self-contained jobs) code.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sless_core::{JobSpec, JobStatus};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::cas::Cas;
use crate::db::Backend;
use crate::{Edit, Result, SqlStore, StoreError, stamp, time};

/// A job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    pub namespace: String,
    pub name: String,
    pub spec: JobSpec,
    pub status: JobStatus,
    /// SHA-256 of a self-contained job's archive, once uploaded.
    pub code_sha256: Option<String>,
    /// Grows by one with every change of the spec or the code (through
    /// [`JobStore::update_job`] or [`JobStore::set_job_code`]); the runner's status
    /// writes leave it alone. A new job is at 1, whatever the record passed to create says.
    pub generation: u64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[async_trait]
pub trait JobStore: Send + Sync + 'static {
    async fn create_job(&self, record: &JobRecord) -> Result<()>;
    async fn get_job(&self, namespace: &str, name: &str) -> Result<JobRecord>;
    async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>>;
    /// Changes the job by `edit` (given the current record) and returns the record
    /// as it now stands (its status as `edit` left it). Spec and code are written,
    /// and the status if `edit` changed it (a patch that starts a new run), but only
    /// when the spec or the code changed: then the generation grows. An edit of the
    /// status alone writes nothing (that is [`JobStore::set_job_status`]). A compare-and-swap on the generation:
    /// with `expect`, only if the job is still at that generation (else
    /// [`StoreError::PreconditionFailed`]); without, `edit` runs again on the newer
    /// record when a concurrent writer got there first, so no edit is lost.
    async fn update_job(
        &self,
        namespace: &str,
        name: &str,
        expect: Option<u64>,
        edit: &mut Edit<'_, JobRecord>,
    ) -> Result<JobRecord>;
    /// Records a run's progress; ignored (returns `false`) if the job has moved on
    /// to another `run_id` meanwhile, so a stale run never overwrites a new one.
    /// The generation stays.
    async fn set_job_status(&self, namespace: &str, name: &str, status: &JobStatus)
    -> Result<bool>;
    /// Names the job's uploaded archive, through [`JobStore::update_job`] (the same
    /// archive again changes nothing).
    async fn set_job_code(
        &self,
        namespace: &str,
        name: &str,
        sha256: &str,
        expect: Option<u64>,
    ) -> Result<JobRecord>;
    async fn delete_job(&self, namespace: &str, name: &str) -> Result<()>;
}

pub(crate) fn from_row(row: &AnyRow) -> Result<JobRecord> {
    Ok(JobRecord {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        spec: serde_json::from_str(row.try_get::<&str, _>("spec")?)?,
        status: serde_json::from_str(row.try_get::<&str, _>("status")?)?,
        code_sha256: row.try_get("code_sha256")?,
        generation: row.try_get::<i64, _>("generation")? as u64,
        created_at: time(row.try_get::<&str, _>("created_at")?),
        updated_at: time(row.try_get::<&str, _>("updated_at")?),
    })
}

#[async_trait]
impl JobStore for SqlStore {
    async fn create_job(&self, r: &JobRecord) -> Result<()> {
        let result = sqlx::query(
            "INSERT INTO jobs (namespace, name, spec, status, code_sha256, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
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
        let row = sqlx::query("SELECT * FROM jobs WHERE namespace = $1 AND name = $2")
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
                sqlx::query("SELECT * FROM jobs WHERE namespace = $1 ORDER BY name")
                    .bind(ns)
                    .fetch_all(self.pool())
                    .await?
            }
            None => {
                sqlx::query(concat!(
                    "SELECT * FROM jobs WHERE ",
                    live!("namespace"),
                    " ORDER BY namespace, name"
                ))
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
        expect: Option<u64>,
        edit: &mut Edit<'_, JobRecord>,
    ) -> Result<JobRecord> {
        let mut cas = Cas::new("job", name, expect);
        loop {
            let current = self.get_job(namespace, name).await?;
            cas.check(current.generation)?;
            let mut edited = current.clone();
            edit(&mut edited)?;
            if edited.spec == current.spec && edited.code_sha256 == current.code_sha256 {
                return Ok(current);
            }
            let record = JobRecord {
                spec: edited.spec,
                status: edited.status,
                code_sha256: edited.code_sha256,
                generation: current.generation + 1,
                updated_at: Utc::now(),
                ..current.clone()
            };
            // The runner's status writes do not move the generation, so the status is
            // written only when the edit changed it (a new run): an edit of the spec
            // alone must not put back a status read before the runner's last write.
            let status = if record.status != current.status {
                Some(serde_json::to_string(&record.status)?)
            } else {
                None
            };
            let done = sqlx::query(
                "UPDATE jobs SET spec = $1, status = coalesce($2, status), code_sha256 = $3, generation = $4, \
                 updated_at = $5 WHERE namespace = $6 AND name = $7 AND generation = $8",
            )
            .bind(serde_json::to_string(&record.spec)?)
            .bind(status)
            .bind(&record.code_sha256)
            .bind(record.generation as i64)
            .bind(stamp(record.updated_at))
            .bind(namespace)
            .bind(name)
            .bind(current.generation as i64)
            .execute(self.pool())
            .await?;
            if done.rows_affected() == 1 {
                return Ok(record);
            }
            cas.lost().await?;
        }
    }

    async fn set_job_status(
        &self,
        namespace: &str,
        name: &str,
        status: &JobStatus,
    ) -> Result<bool> {
        // Only while the job is still at that run (a newer run's status wins).
        let sql = match self.backend() {
            Backend::Sqlite => {
                "UPDATE jobs SET status = $1 WHERE namespace = $2 AND name = $3 \
                 AND json_extract(spec, '$.run_id') = $4"
            }
            Backend::Postgres => {
                "UPDATE jobs SET status = $1 WHERE namespace = $2 AND name = $3 \
                 AND (CAST(spec AS jsonb) ->> 'run_id')::bigint = $4"
            }
        };
        let done = sqlx::query(sql)
            .bind(serde_json::to_string(status)?)
            .bind(namespace)
            .bind(name)
            .bind(status.run_id as i64)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn set_job_code(
        &self,
        namespace: &str,
        name: &str,
        sha256: &str,
        expect: Option<u64>,
    ) -> Result<JobRecord> {
        self.update_job(namespace, name, expect, &mut |job| {
            job.code_sha256 = Some(sha256.to_string());
            Ok(())
        })
        .await
    }

    async fn delete_job(&self, namespace: &str, name: &str) -> Result<()> {
        let done = sqlx::query("DELETE FROM jobs WHERE namespace = $1 AND name = $2")
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
