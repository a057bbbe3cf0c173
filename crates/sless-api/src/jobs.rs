//! Jobs: one-shot runs of a function or of self-contained code.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use chrono::Utc;
use serde::Deserialize;
use serde_json::Value;
use sless_api_types::{Items, Job, JobCodeUploaded, timestamp};
use sless_core::{JobPhase, JobSpec, JobStatus};
use sless_store::JobRecord;

use crate::etag::{IfMatch, tagged};
use crate::functions::spec_error;
use crate::{ApiError, AppState, Caller, JsonBody, body, read_limited};

fn job_body(j: &JobRecord) -> Job<JobSpec> {
    Job {
        name: j.name.clone(),
        namespace: j.namespace.clone(),
        spec: j.spec.clone(),
        status: j.status.clone().into(),
        code_sha256: j.code_sha256.clone(),
        created_at: timestamp(j.created_at),
        updated_at: timestamp(j.updated_at),
    }
}

/// The status a run starts from: Pending, or Skipped for `run_id: 0`.
fn initial_status(spec: &JobSpec) -> JobStatus {
    JobStatus {
        phase: if spec.run_id == 0 {
            JobPhase::Skipped
        } else {
            JobPhase::Pending
        },
        run_id: spec.run_id,
        message: if spec.run_id == 0 {
            "run_id is 0: not run".into()
        } else {
            String::new()
        },
        ..Default::default()
    }
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/jobs",
    tag = "jobs",
    params(crate::openapi::NsPath),
    responses((status = 200, description = "The namespace's jobs", body = sless_api_types::Items<sless_api_types::Job>), crate::openapi::ReadErrors)
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    s.store.get_namespace(&ns).await?;
    let items = s
        .job_store
        .list_jobs(Some(&ns))
        .await?
        .iter()
        .map(job_body)
        .collect();
    body(&Items::new(items))
}

#[utoipa::path(
    post,
    path = "/v1/namespaces/{ns}/jobs",
    tag = "jobs",
    params(crate::openapi::NsPath),
    request_body(content = sless_api_types::schema::JobCreate, content_type = "application/json"),
    responses((status = 201, description = "Created; the run starts unless run_id is 0 (ETag: its version)", body = sless_api_types::Job), crate::openapi::WriteErrors)
)]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    JsonBody(request): JsonBody,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let (name, fields) = crate::take_name(request)?;
    s.store.get_namespace(&ns).await?;
    let mut spec: JobSpec = serde_path_to_error::deserialize(Value::Object(fields))
        .map_err(|e| ApiError::bad(spec_error(e)))?;
    spec.validate()?;
    crate::secrets::check_env_refs(&s, &ns, &crate::secrets::env_refs(&spec.env)).await?;
    if let Some(function) = &spec.function {
        s.store
            .get_function(&ns, function)
            .await
            .map_err(|e| ApiError::named_function(e, &ns, function))?;
    }
    let now = Utc::now();
    let status = initial_status(&spec);
    let record = JobRecord {
        namespace: ns.clone(),
        name: name.clone(),
        spec,
        status,
        code_sha256: None,
        generation: 1,
        created_at: now,
        updated_at: now,
    };
    s.job_store.create_job(&record).await?;
    if record.spec.run_id != 0 {
        s.jobs.start(&ns, &name);
    }
    Ok(tagged(
        StatusCode::CREATED,
        record.generation,
        body(&job_body(&record))?,
    ))
}

/// Longest `?wait=` a job read blocks for, in seconds.
const MAX_JOB_WAIT_SECS: u64 = 900;

#[derive(Deserialize)]
pub struct WaitQuery {
    wait: Option<String>,
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/jobs/{name}",
    tag = "jobs",
    params(crate::openapi::NsNamePath, crate::openapi::WaitParams),
    responses((status = 200, description = "The job (ETag: its version)", body = sless_api_types::Job), crate::openapi::ReadErrors)
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<WaitQuery>,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let wait = crate::ranged_param("wait", q.wait.as_deref(), 0, MAX_JOB_WAIT_SECS)?;
    // Taken before the first read, so a change right after it still wakes the wait.
    let mut changes = wait.map(|_| s.jobs.watch(&ns, &name));
    let mut job = s.job_store.get_job(&ns, &name).await?;
    if let (Some(wait), Some(changes)) = (wait, changes.as_mut()) {
        // Bounded; the record is read again each time the job's runner, a PATCH
        // or a delete says it changed.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait);
        while !(job.status.run_id == job.spec.run_id && job.status.phase.is_terminal()) {
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                break;
            }
            job = s.job_store.get_job(&ns, &name).await?;
        }
    }
    Ok(tagged(
        StatusCode::OK,
        job.generation,
        body(&job_body(&job))?,
    ))
}

/// The patched job: its spec merged and validated, and a new run's status when
/// `run_id` changed (refused when lowered other than to 0). Whether `run_id` changed.
fn patched(job: &mut JobRecord, patch: &Value) -> Result<bool, ApiError> {
    let mut spec: JobSpec =
        sless_core::patch::apply(&job.spec, patch, sless_core::job::JOB_FIELDS)?;
    spec.validate()?;
    let rerun = spec.run_id != job.spec.run_id;
    if rerun && spec.run_id != 0 && spec.run_id < job.spec.run_id {
        return Err(ApiError::bad(format!(
            "run_id: raise it above {} to run the job again",
            job.spec.run_id
        )));
    }
    // A new run_id is Pending (or Skipped) before the PATCH answers.
    if rerun {
        job.status = initial_status(&spec);
    }
    job.spec = spec;
    Ok(rerun)
}

/// A merge patch, applied by the store to the job as it stands when it writes (see
/// the trigger's); a changed `run_id` starts (or, at 0, stops) a run once written.
#[utoipa::path(
    patch,
    path = "/v1/namespaces/{ns}/jobs/{name}",
    tag = "jobs",
    params(crate::openapi::NsNamePath, crate::openapi::IfMatchHeader),
    request_body(content = sless_api_types::schema::JobPatch, content_type = "application/merge-patch+json"),
    responses((status = 200, description = "Patched; a raised run_id runs it again (ETag: its version)", body = sless_api_types::Job), crate::openapi::MatchedWriteErrors)
)]
pub async fn patch(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    if_match: IfMatch,
    JsonBody(patch): JsonBody,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let expect = if_match
        .expect("job", &name, async {
            Ok(s.job_store.get_job(&ns, &name).await?.generation)
        })
        .await?;
    if let Some(Value::String(function)) = patch.get("function") {
        crate::functions::check_exists(&s, &ns, function).await?;
    }
    let refs = crate::secrets::patch_refs(&patch);
    crate::secrets::check_env_refs(&s, &ns, &refs).await?;
    // Set by the attempt that was written (the edit runs once per attempt).
    let mut rerun = false;
    let job = s
        .job_store
        .update_job(&ns, &name, expect, &mut |job| {
            rerun = patched(job, &patch).map_err(ApiError::reject)?;
            Ok(())
        })
        .await?;
    // The answer is the state this PATCH wrote, even if a fast run is over by now.
    // A new run_id (0 included) restarts the runner, which stops the old run and
    // reads the job as it stands then: concurrent PATCHes may get here in either
    // order, and the last restart still acts on the latest run_id (0: Skipped).
    if rerun {
        s.jobs.start(&ns, &name);
    }
    Ok(tagged(
        StatusCode::OK,
        job.generation,
        body(&job_body(&job))?,
    ))
}

#[utoipa::path(
    delete,
    path = "/v1/namespaces/{ns}/jobs/{name}",
    tag = "jobs",
    params(crate::openapi::NsNamePath),
    responses((status = 204, description = "Deleted"), crate::openapi::DeleteErrors)
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    caller.check(&ns)?;
    s.job_store.get_job(&ns, &name).await?;
    s.jobs.stop(&ns, &name);
    s.job_store.delete_job(&ns, &name).await?;
    // Readers waiting on the job read it again and find it gone.
    s.jobs.changed(&ns, &name);
    s.collector.nudge();
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    put,
    path = "/v1/namespaces/{ns}/jobs/{name}/code",
    tag = "jobs",
    params(crate::openapi::NsNamePath, crate::openapi::IfMatchHeader),
    request_body(content = sless_api_types::schema::ZipArchive, content_type = "application/zip"),
    responses((status = 202, description = "Stored; the run starts", body = sless_api_types::JobCodeUploaded), crate::openapi::MatchedWriteErrors)
)]
pub async fn upload_code(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    if_match: IfMatch,
    req: Request,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let job = s.job_store.get_job(&ns, &name).await?;
    let expect = if_match
        .expect("job", &name, async { Ok(job.generation) })
        .await?;
    if job.spec.function.is_some() {
        return Err(ApiError::Conflict(format!(
            "job {name} runs function {:?}; only self-contained jobs take code",
            job.spec.function.unwrap_or_default()
        )));
    }
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if !content_type.starts_with("application/zip") {
        return Err(ApiError::UnsupportedMediaType(format!(
            "expected Content-Type: application/zip, got {content_type:?}"
        )));
    }
    let archive = read_limited(
        req,
        s.archive_limits.max_compressed as usize,
        s.body_timeout,
    )
    .await?;
    let (sha, _) =
        crate::functions::store_archive(&s, archive, &ns, sless_store::CodeOwner::Job(&name))
            .await?;
    // Checked again on the record the store writes: a PATCH naming a function may
    // have landed since the read above.
    let record = s
        .job_store
        .update_job(&ns, &name, expect, &mut |job| {
            if let Some(function) = &job.spec.function {
                return Err(ApiError::Conflict(format!(
                    "job {name} runs function {function:?}; only self-contained jobs take code"
                ))
                .reject());
            }
            job.code_sha256 = Some(sha.clone());
            Ok(())
        })
        .await?;
    if record.spec.run_id != 0
        && !(record.status.run_id == record.spec.run_id && record.status.phase.is_terminal())
    {
        s.jobs.start(&ns, &name);
    }
    Ok(tagged(
        StatusCode::ACCEPTED,
        record.generation,
        body(&JobCodeUploaded {
            code_sha256: sha,
            run_id: record.spec.run_id,
        })?,
    ))
}
