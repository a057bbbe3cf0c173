//! Functions: create, read, patch, delete, code uploads, source, logs and the
//! authenticated invoke.

use std::convert::Infallible;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde::Deserialize;
use serde_json::Value;
use sless_api_types::{CodeUploaded, Function, Items, SourceFile, timestamp};
use sless_blob::{BlobError, Stored};
use sless_core::invocation::InvocationSource;
use sless_core::{FunctionSpec, FunctionStatus, NetworkMode, Phase};
use sless_executor::InvokeError;
use sless_invoke::Call;
use sless_store::{CodeOwner, FunctionChange, FunctionRecord};

use crate::etag::{IfMatch, tagged};
use crate::{ApiError, AppState, Caller, JsonBody, body, read_limited};

/// The wire shape of a function, with live instance counts and crash reports.
fn function_body(s: &AppState, r: &FunctionRecord) -> Function<FunctionSpec> {
    let mut status: FunctionStatus = r.status.clone();
    if status.revision < r.revision {
        // The controller has not picked up the latest revision yet: its phase is
        // not known, and the status of an older one must not pass for it.
        status = FunctionStatus {
            phase: Phase::Pending,
            message: format!("revision {} is queued", r.revision),
            revision: r.revision,
            last_built_at: status.last_built_at,
            ..Default::default()
        };
    }
    status.instances = s.executor.counts(&r.namespace, &r.name);
    status.url = s.controller.url(&r.namespace, &r.name);
    if status.phase == Phase::Ready
        && let Some(problem) = s.executor.last_error(&r.namespace, &r.name)
    {
        status.message = problem;
    }
    Function {
        name: r.name.clone(),
        namespace: r.namespace.clone(),
        spec: r.spec.clone(),
        status: sless_api_types::FunctionStatus {
            phase: status.phase.into(),
            message: status.message,
            revision: status.revision,
            code_sha256: status.code_sha256.or_else(|| r.code_sha256.clone()),
            url: status.url,
            instances: status.instances.into(),
            last_built_at: status.last_built_at.map(timestamp),
        },
        created_at: timestamp(r.created_at),
        updated_at: timestamp(r.updated_at),
    }
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/functions",
    tag = "functions",
    params(crate::openapi::NsPath),
    responses((status = 200, description = "The namespace's functions", body = sless_api_types::Items<sless_api_types::Function>), crate::openapi::ReadErrors)
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    s.store.get_namespace(&ns).await?;
    let items = s
        .store
        .list_functions(Some(&ns))
        .await?
        .iter()
        .map(|r| function_body(&s, r))
        .collect();
    body(&Items::new(items))
}

#[utoipa::path(
    post,
    path = "/v1/namespaces/{ns}/functions",
    tag = "functions",
    params(crate::openapi::NsPath),
    request_body(content = sless_api_types::schema::FunctionCreate, content_type = "application/json"),
    responses((status = 201, description = "Created (ETag: its version)", body = sless_api_types::Function), (status = 403, description = "Only the admin may give functions host networking", body = sless_api_types::ErrorBody), crate::openapi::WriteErrors)
)]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    JsonBody(request): JsonBody,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let (name, fields) = crate::take_name(request)?;
    if !fields.contains_key("runtime") {
        return Err(ApiError::bad(
            "runtime: required (python3, nodejs, go or custom)",
        ));
    }
    let mut spec: FunctionSpec = serde_path_to_error::deserialize(Value::Object(fields))
        .map_err(|e| ApiError::bad(spec_error(e)))?;
    spec.validate()?;
    check_network(&s, &caller, spec.network)?;
    s.store.get_namespace(&ns).await?;
    s.quotas.check_minimum(&ns, &spec).await?;
    // The count and the insert happen under the namespace's lock, so two creates
    // at the limit cannot both pass.
    let _creating = s.quotas.creating(&ns).await;
    s.quotas.check_functions(s.store.as_ref(), &ns).await?;
    crate::secrets::check_env_refs(&s, &ns, &crate::secrets::env_refs(&spec.env)).await?;
    let now = Utc::now();
    let record = FunctionRecord {
        namespace: ns.clone(),
        name: name.clone(),
        spec,
        status: FunctionStatus {
            phase: Phase::Pending,
            message: "waiting for code: upload a zip archive to .../code".into(),
            revision: 1,
            ..Default::default()
        },
        revision: 1,
        code_sha256: None,
        generation: 1,
        created_at: now,
        updated_at: now,
    };
    s.store.create_function(&record).await?;
    Ok(tagged(
        StatusCode::CREATED,
        record.generation,
        body(&function_body(&s, &record))?,
    ))
}

/// `400` naming the field when a trigger or job names a `function` that does not
/// exist in `ns`; a store that fails is reported as what it is.
pub(crate) async fn check_exists(s: &AppState, ns: &str, function: &str) -> Result<(), ApiError> {
    match s.store.get_function(ns, function).await {
        Ok(_) => Ok(()),
        Err(e) => Err(ApiError::named_function(e, ns, function)),
    }
}

/// `"network": "host"` puts a function on the host's network, with the server's own
/// API and every service on the host in reach: the admin's decision unless the server
/// was started with `--allow-host-network`.
fn check_network(s: &AppState, caller: &Caller, network: NetworkMode) -> Result<(), ApiError> {
    if network == NetworkMode::Host && !caller.is_admin() && !s.allow_host_network {
        return Err(ApiError::Forbidden(
            "network: \"host\" needs the admin token (or a server started with --allow-host-network); use \"outbound\" or \"none\"".into(),
        ));
    }
    Ok(())
}

/// Names the offending field: `memory_mb: invalid type: string "lots", expected u32`.
/// (An unknown field sits at the top level, and serde's message names it.)
pub(crate) fn spec_error(e: serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    let inner = e.into_inner().to_string();
    let inner = inner
        .split_once(" at line")
        .map(|(head, _)| head.to_string())
        .unwrap_or(inner);
    if path.is_empty() || path == "." {
        inner
    } else {
        format!("{path}: {inner}")
    }
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/functions/{name}",
    tag = "functions",
    params(crate::openapi::NsNamePath),
    responses((status = 200, description = "The function (ETag: its version)", body = sless_api_types::Function), crate::openapi::ReadErrors)
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let record = s.store.get_function(&ns, &name).await?;
    Ok(tagged(
        StatusCode::OK,
        record.generation,
        body(&function_body(&s, &record))?,
    ))
}

/// A merge patch, applied by the store to the spec as it stands when it writes;
/// with `If-Match`, only to the version it names.
#[utoipa::path(
    patch,
    path = "/v1/namespaces/{ns}/functions/{name}",
    tag = "functions",
    params(crate::openapi::NsNamePath, crate::openapi::IfMatchHeader),
    request_body(content = sless_api_types::schema::FunctionPatch, content_type = "application/merge-patch+json"),
    responses((status = 200, description = "Patched (ETag: its version)", body = sless_api_types::Function), (status = 403, description = "Only the admin may give functions host networking", body = sless_api_types::ErrorBody), crate::openapi::MatchedWriteErrors)
)]
pub async fn patch(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    if_match: IfMatch,
    JsonBody(request): JsonBody,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let before = s.store.get_function(&ns, &name).await?;
    let expect = if_match
        .expect("function", &name, async { Ok(before.generation) })
        .await?;
    if request.get("network").and_then(Value::as_str) == Some(NetworkMode::Host.as_str()) {
        check_network(&s, &caller, NetworkMode::Host)?;
    }
    check_patched_minimum(&s, &ns, &before.spec, &request).await?;
    let refs = crate::secrets::patch_refs(&request);
    crate::secrets::check_env_refs(&s, &ns, &refs).await?;
    let record = s
        .store
        .update_function(&ns, &name, expect, FunctionChange::Patch(request))
        .await?;
    if record.revision != before.revision {
        s.controller.enqueue(&ns, &name);
    }
    Ok(tagged(
        StatusCode::OK,
        record.generation,
        body(&function_body(&s, &record))?,
    ))
}

/// `429` when a patch raises `min_instances` or `memory_mb` so that the minimum
/// alone would not fit the namespace's quotas (invalid values are left to the store's
/// validation, which names them).
async fn check_patched_minimum(
    s: &AppState,
    ns: &str,
    before: &FunctionSpec,
    request: &Value,
) -> Result<(), ApiError> {
    let mut spec = before.clone();
    if let Some(n) = request.get("min_instances").and_then(Value::as_u64) {
        spec.min_instances = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(n) = request.get("memory_mb").and_then(Value::as_u64) {
        spec.memory_mb = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if spec.min_instances > before.min_instances || spec.memory_mb > before.memory_mb {
        s.quotas.check_minimum(ns, &spec).await?;
    }
    Ok(())
}

#[utoipa::path(
    delete,
    path = "/v1/namespaces/{ns}/functions/{name}",
    tag = "functions",
    params(crate::openapi::NsNamePath),
    responses((status = 204, description = "Deleted"), crate::openapi::DeleteErrors)
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    caller.check(&ns)?;
    s.store.delete_function(&ns, &name).await?;
    s.controller.forget(&ns, &name);
    // Its code, build and dependencies may now be unused.
    s.collector.nudge();
    // A function's triggers go with it (its jobs' records are kept).
    for trigger in s.trigger_store.delete_function_triggers(&ns, &name).await? {
        s.triggers.remove(&ns, &trigger);
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    put,
    path = "/v1/namespaces/{ns}/functions/{name}/code",
    tag = "functions",
    params(crate::openapi::NsNamePath, crate::openapi::IfMatchHeader),
    request_body(content((sless_api_types::schema::CodeUpload = "multipart/form-data"), (sless_api_types::schema::ZipArchive = "application/zip"))),
    responses((status = 202, description = "Stored; a new revision builds", body = sless_api_types::CodeUploaded), crate::openapi::MatchedWriteErrors)
)]
pub async fn upload_code(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    if_match: IfMatch,
    req: Request,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let current = s.store.get_function(&ns, &name).await?;
    let expect = if_match
        .expect("function", &name, async { Ok(current.generation) })
        .await?;
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let limit = s.archive_limits.max_compressed as usize;
    let archive = if content_type.starts_with("multipart/form-data") {
        // Allow the multipart framing around a maximum-size archive. The body is read
        // first so that a stalled upload times out like any other body.
        let (parts, body) = req.into_parts();
        let bytes = crate::read_parts(&parts, body, limit + 64 * 1024, s.body_timeout).await?;
        let req = Request::from_parts(parts, Body::from(bytes));
        let mut multipart = axum::extract::Multipart::from_request(req, &())
            .await
            .map_err(|e| ApiError::bad(format!("not a valid multipart body: {e}")))?;
        let mut found = None;
        loop {
            match multipart.next_field().await {
                Ok(Some(field)) if field.name() == Some("code") => {
                    let bytes = field.bytes().await.map_err(|e| {
                        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                            ApiError::TooLarge(format!(
                                "archive is larger than the limit of {limit} bytes"
                            ))
                        } else {
                            ApiError::bad(format!("could not read field code: {e}"))
                        }
                    })?;
                    found = Some(bytes);
                    break;
                }
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    return Err(ApiError::TooLarge(format!(
                        "archive is larger than the limit of {limit} bytes"
                    )));
                }
                Err(e) => return Err(ApiError::bad(format!("not a valid multipart body: {e}"))),
            }
        }
        found.ok_or_else(|| {
            ApiError::bad("code: multipart field 'code' with the zip archive is required")
        })?
    } else if content_type.starts_with("application/zip")
        || content_type.starts_with("application/x-zip-compressed")
    {
        read_limited(req, limit, s.body_timeout).await?
    } else {
        return Err(ApiError::UnsupportedMediaType(format!(
            "expected Content-Type: application/zip (or multipart/form-data with field 'code'), got {:?}",
            if content_type.is_empty() {
                "nothing"
            } else {
                &content_type
            }
        )));
    };
    if archive.len() > limit {
        return Err(ApiError::TooLarge(format!(
            "archive is larger than the limit of {limit} bytes"
        )));
    }
    let (sha, stored) = store_archive(&s, archive, &ns, CodeOwner::Function(&name)).await?;
    let record = s
        .store
        .update_function(&ns, &name, expect, FunctionChange::Code(sha.clone()))
        .await?;
    if stored != Stored::Existing {
        // The archive was missing or corrupt and is whole again: functions that
        // failed for want of it (this one, or others with the same code) build
        // again, even though their revision did not change.
        for f in s.store.list_functions(None).await? {
            if f.code_sha256.as_deref() == Some(sha.as_str())
                && f.status.phase == Phase::Failed
                && f.status.revision == f.revision
            {
                s.controller.enqueue_retry(&f.namespace, &f.name);
            }
        }
    }
    s.controller.enqueue(&ns, &name);
    // The code it replaced may now be unused.
    s.collector.nudge();
    Ok(tagged(
        StatusCode::ACCEPTED,
        record.generation,
        body(&CodeUploaded {
            revision: record.revision,
            code_sha256: sha,
        })?,
    ))
}

/// Checks an uploaded archive without unpacking it (unsafe paths and links are
/// `400`, size limits `413`), checks that it fits the namespace's storage quota
/// as `owner`'s new code (`429`, nothing stored), and stores it by its sha256,
/// which it returns with what the store did.
pub(crate) async fn store_archive(
    s: &AppState,
    archive: Bytes,
    ns: &str,
    owner: CodeOwner<'_>,
) -> Result<(String, Stored), ApiError> {
    let limits = s.archive_limits;
    let inspected = {
        let archive = archive.clone();
        tokio::task::spawn_blocking(move || {
            sless_blob::inspect_zip(&archive, &limits)
                .map(|info| (info, sless_blob::sha256_hex(&archive)))
        })
        .await
        .map_err(|e| ApiError::Internal(e.into()))?
    };
    let (info, sha) = inspected.map_err(|e| match e {
        sless_blob::ArchiveError::TooLarge(m) => ApiError::TooLarge(m),
        other => ApiError::bad(format!("code: {other}")),
    })?;
    let compressed = archive.len() as u64;
    let quota = s.quotas.storage_bytes(ns).await?;
    s.collector
        .admit_within(ns, owner, &sha, compressed, info.unpacked_bytes, quota)
        .await
        .map_err(|e| match e {
            e @ sless_controller::gc::QuotaError::Exceeded { .. } => {
                ApiError::QuotaExceeded(e.to_string())
            }
            sless_controller::gc::QuotaError::Store(e) => e.into(),
        })?;
    let stored = s.blobs.put(archive).await?;
    s.collector
        .stored(&stored.0, compressed, info.unpacked_bytes)
        .await?;
    Ok(stored)
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/functions/{name}/source",
    tag = "functions",
    params(crate::openapi::NsNamePath),
    responses((status = 200, description = "The files of the latest uploaded archive", body = sless_api_types::Items<sless_api_types::SourceFile>), (status = 409, description = "No code uploaded, or the stored archive is unreadable", body = sless_api_types::ErrorBody), crate::openapi::ReadErrors)
)]
pub async fn source(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    let record = s.store.get_function(&ns, &name).await?;
    let Some(sha) = record.code_sha256 else {
        return body(&Items::<SourceFile>::new(Vec::new()));
    };
    let archive = s.blobs.get(&sha).await.map_err(|e| match e {
        // The owner can fix both by uploading the code again; say so.
        BlobError::Corrupt { .. } => ApiError::Conflict(format!(
            "the stored code archive of function {name} is corrupt (its bytes no longer match its sha256 {sha}); upload the code again to repair it"
        )),
        BlobError::NotFound(_) => ApiError::Conflict(format!(
            "the stored code archive of function {name} is missing; upload the code again to repair it"
        )),
        other => ApiError::Internal(other.into()),
    })?;
    let limits = s.archive_limits;
    let files = tokio::task::spawn_blocking(move || sless_blob::list_source(&archive, &limits))
        .await
        .map_err(|e| ApiError::Internal(e.into()))?
        .map_err(|e| {
            ApiError::Internal(anyhow::anyhow!("stored archive {sha} is unreadable: {e}"))
        })?;
    let files = files
        .into_iter()
        .map(|f| SourceFile {
            name: f.name,
            content: f.content,
            binary: f.binary,
        })
        .collect();
    body(&Items::new(files))
}

/// Most lines `logs?tail=` returns.
const MAX_LOG_TAIL: u64 = 100_000;

#[derive(Deserialize)]
pub struct LogsQuery {
    tail: Option<String>,
    #[serde(default)]
    follow: bool,
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/functions/{name}/logs",
    tag = "functions",
    params(crate::openapi::NsNamePath, crate::openapi::LogsParams),
    responses((status = 200, description = "The last lines of the function's output; with follow, then new lines as they come", body = String, content_type = "text/plain"), crate::openapi::ReadErrors)
)]
pub async fn logs(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<LogsQuery>,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let tail = crate::ranged_param("tail", q.tail.as_deref(), 0, MAX_LOG_TAIL)?.unwrap_or(200);
    s.store.get_function(&ns, &name).await?;
    // Subscribe before reading the tail so no line falls between the two.
    let live = q.follow.then(|| s.logs.subscribe(&ns, &name));
    let tail = tail as usize;
    let lines = s
        .logs
        .tail(&ns, &name, tail)
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    let mut text = lines.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    let Some(live) = live else {
        return Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response());
    };
    use futures::StreamExt;
    let first = futures::stream::once(async move { Ok::<_, Infallible>(Bytes::from(text)) });
    let rest = futures::stream::unfold(live, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(mut line) => {
                    line.push('\n');
                    return Some((Ok(Bytes::from(line)), rx));
                }
                // A slow reader skips what it missed rather than stalling writers.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(first.chain(rest)),
    )
        .into_response())
}

#[utoipa::path(
    post,
    path = "/v1/namespaces/{ns}/functions/{name}/invoke",
    tag = "functions",
    params(crate::openapi::NsNamePath, crate::openapi::InvokeParams),
    request_body(content = serde_json::Value, description = "The event (JSON; empty is null)", content_type = "application/json"),
    responses((status = 200, description = "The handler's return value", body = serde_json::Value, content_type = "application/json"), (status = 202, description = "With async=true: the call is queued (X-Call-Id)", body = sless_api_types::CallQueued), (status = 500, description = "The handler raised: its error", body = serde_json::Value, content_type = "application/json"), (status = 502, description = "The instance failed", body = sless_api_types::ErrorBody), (status = 503, description = "The function cannot serve (not built, paused, no capacity)", body = sless_api_types::ErrorBody), (status = 504, description = "The handler timed out", body = sless_api_types::ErrorBody), crate::openapi::WriteErrors)
)]
pub async fn invoke(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    query: Result<
        axum::extract::Query<Vec<(String, String)>>,
        axum::extract::rejection::QueryRejection,
    >,
    headers: axum::http::HeaderMap,
    req: Request,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    // Only functions: a job's private pool has a name that is not a DNS label.
    sless_core::validate_name("name", &name).map_err(|_| ApiError::not_found("function", &name))?;
    let axum::extract::Query(params) = query.map_err(|e| ApiError::bad(format!("query: {e}")))?;
    let mut queue = false;
    for (key, value) in &params {
        if key == "async" {
            queue = match value.as_str() {
                "true" => true,
                "false" | "" => false,
                other => {
                    return Err(ApiError::bad(format!(
                        "async: must be true or false, got {other:?}"
                    )));
                }
            };
        }
    }
    let callback_url = match headers.get("x-callback-url") {
        Some(v) if queue => Some(
            v.to_str()
                .map_err(|_| ApiError::bad("X-Callback-Url: must be an http or https URL"))?
                .trim()
                .to_string(),
        ),
        _ => None,
    };
    let body = read_limited(req, s.max_invoke_body, s.body_timeout).await?;
    let event = if body.iter().all(u8::is_ascii_whitespace) {
        Bytes::from_static(b"null")
    } else {
        serde_json::from_slice::<serde::de::IgnoredAny>(&body)
            .map_err(|e| ApiError::bad(format!("the event must be JSON: {e}")))?;
        // `IgnoredAny` checks no depth, and the runtimes cannot decode any depth.
        if sless_gateway::json_nests_deeper_than(&body, sless_gateway::MAX_JSON_DEPTH) {
            return Err(ApiError::bad(format!(
                "the event must be JSON nested at most {} levels deep",
                sless_gateway::MAX_JSON_DEPTH
            )));
        }
        body
    };
    let request_id = sless_gateway::request_id(&headers);
    if queue {
        s.store
            .get_function(&ns, &name)
            .await
            .map_err(|e| match e {
                sless_store::StoreError::NotFound { .. } => ApiError::not_found("function", &name),
                e => e.into(),
            })?;
        let call_id = s
            .calls
            .enqueue(sless_controller::calls::NewCall {
                namespace: ns.clone(),
                function: name.clone(),
                event: event.to_vec(),
                request_id: request_id.clone(),
                callback_url,
            })
            .await
            .map_err(crate::calls::enqueue_error)?;
        let mut response = sless_gateway::queued_response(&call_id);
        if let Ok(v) = header::HeaderValue::from_str(&request_id) {
            response.headers_mut().insert("x-request-id", v);
        }
        return Ok(response);
    }
    let call = Call::new(&ns, &name, InvocationSource::Invoke, &request_id, event);
    let mut outcome = s.invoker.invoke(call).await;
    if let Err(InvokeError::NotFound) = outcome.result {
        // A function that exists but cannot serve yet is a failed invocation
        // (recorded); one that does not exist is a 404 (not recorded).
        let record = s.store.get_function(&ns, &name).await?;
        outcome.result = Err(InvokeError::Unavailable(format!(
            "function {name} has no revision that can serve yet (phase {:?}: {})",
            record.status.phase, record.status.message
        )));
    }
    let mut response = match &outcome.result {
        Ok(r) => {
            let status = if r.ok {
                StatusCode::OK
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                r.body.clone(),
            )
                .into_response()
        }
        Err(e) => sless_gateway::invoke_error_response(e),
    };
    let _ = outcome.finish(response.status().as_u16());
    if let Ok(v) = header::HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", v);
    }
    Ok(response)
}
