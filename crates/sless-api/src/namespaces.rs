//! Namespaces, tokens and `whoami`.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use sless_api_types::{Items, TokenCreated, Whoami, timestamp};
use sless_store::Namespace;

use crate::{ApiError, AppState, Caller, JsonBody, body, hash_token, new_token};

fn namespace_body(ns: &Namespace) -> sless_api_types::Namespace {
    sless_api_types::Namespace {
        name: ns.name.clone(),
        created_at: Some(timestamp(ns.created_at)),
    }
}

#[utoipa::path(
    get,
    path = "/v1/whoami",
    tag = "namespaces",
    responses((status = 200, description = "Who the token is and the namespaces it sees", body = sless_api_types::Whoami), crate::openapi::ReadErrors)
)]
pub async fn whoami(State(s): State<AppState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    let namespaces: Vec<String> = match &caller {
        Caller::Admin => s
            .store
            .list_namespaces()
            .await?
            .into_iter()
            .map(|n| n.name)
            .collect(),
        Caller::Namespace { namespace, .. } => vec![namespace.clone()],
    };
    body(&Whoami {
        admin: caller.is_admin(),
        namespaces,
    })
}

#[utoipa::path(
    get,
    path = "/v1/namespaces",
    tag = "namespaces",
    responses((status = 200, description = "The namespaces the token sees", body = sless_api_types::Items<sless_api_types::Namespace>), crate::openapi::ReadErrors)
)]
pub async fn list(State(s): State<AppState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    let all = s.store.list_namespaces().await?;
    let items: Vec<_> = all
        .iter()
        .filter(|n| caller.may_access(&n.name))
        .map(namespace_body)
        .collect();
    body(&Items::new(items))
}

/// The namespace with the quotas in force for it and what it uses now.
async fn namespace_detail(
    s: &AppState,
    ns: &Namespace,
) -> Result<sless_api_types::NamespaceDetail, ApiError> {
    let quota = s.quotas.effective(&ns.name).await?;
    Ok(sless_api_types::NamespaceDetail {
        name: ns.name.clone(),
        created_at: Some(timestamp(ns.created_at)),
        quota: crate::quotas::counts(&quota),
        usage: s.quotas.usage(s.store.as_ref(), &ns.name).await?,
    })
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}",
    tag = "namespaces",
    params(crate::openapi::NsPath),
    responses((status = 200, description = "The namespace, its quotas and its usage", body = sless_api_types::NamespaceDetail), crate::openapi::ReadErrors)
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    let record = s.store.get_namespace(&ns).await?;
    body(&namespace_detail(&s, &record).await?)
}

/// `PUT /v1/namespaces/{ns}`: creates the namespace if missing; an admin may send
/// `{"quota": {...}}` to set its quotas (a namespace caller doing so gets `403`).
#[utoipa::path(
    put,
    path = "/v1/namespaces/{ns}",
    tag = "namespaces",
    params(crate::openapi::NsPath),
    request_body(content = Option<sless_api_types::schema::NamespacePut>, content_type = "application/json", description = "Optional; only an admin may set quotas"),
    responses((status = 200, description = "It already existed", body = sless_api_types::NamespaceDetail), (status = 201, description = "Created", body = sless_api_types::NamespaceDetail), (status = 403, description = "A namespace token or JWT tried to set quotas", body = sless_api_types::ErrorBody), crate::openapi::WriteErrors)
)]
pub async fn ensure(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    sless_core::validate_name("name", &ns)?;
    let quota = quota_request(&s, request).await?;
    if quota.is_some() && !caller.is_admin() {
        return Err(ApiError::Forbidden(
            "quota: only an admin may set a namespace's quotas".into(),
        ));
    }
    if let Some(patch) = &quota {
        // Checked before anything is created.
        sless_core::QuotaOverrides::default().merge(patch)?;
    }
    let created = s.store.ensure_namespace(&ns).await?;
    if let Some(patch) = &quota {
        s.quotas.set(&ns, patch).await?;
    }
    let record = s.store.get_namespace(&ns).await?;
    let answer = body(&namespace_detail(&s, &record).await?)?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, answer).into_response())
}

/// The `quota` object of a `PUT`'s body, if it has one: no body (or an empty one)
/// is none; otherwise a JSON object whose only field is `quota`.
async fn quota_request(
    s: &AppState,
    request: axum::extract::Request,
) -> Result<Option<Value>, ApiError> {
    let content_type = crate::media_type(request.headers());
    let bytes = crate::read_limited(request, 64 * 1024, s.body_timeout).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if content_type != "application/json" {
        return Err(ApiError::UnsupportedMediaType(format!(
            "expected Content-Type: application/json, got {:?}",
            if content_type.is_empty() {
                "nothing"
            } else {
                &content_type
            }
        )));
    }
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad(format!("body is not valid JSON: {e}")))?;
    // `null`, like no body, asks for nothing but the namespace.
    if value.is_null() {
        return Ok(None);
    }
    let Some(fields) = value.as_object() else {
        return Err(ApiError::bad("body: must be a JSON object"));
    };
    if let Some(unknown) = fields.keys().find(|k| *k != "quota") {
        return Err(ApiError::bad(format!("{unknown}: unknown field")));
    }
    Ok(fields.get("quota").cloned())
}

#[derive(Deserialize)]
pub struct DeleteQuery {
    #[serde(default)]
    force: bool,
}

/// `DELETE /v1/namespaces/{ns}`: an empty namespace is deleted; with `?force=true`
/// the namespace and everything in it stop and go to the trash, from which
/// `POST /v1/namespaces/{ns}/restore` brings them back.
#[utoipa::path(
    delete,
    path = "/v1/namespaces/{ns}",
    tag = "namespaces",
    params(crate::openapi::NsPath, crate::openapi::ForceQuery),
    responses((status = 204, description = "Deleted (with `force`: moved to the trash)"), crate::openapi::DeleteErrors)
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    Query(q): Query<DeleteQuery>,
) -> Result<StatusCode, ApiError> {
    caller.check(&ns)?;
    let triggers = s.trigger_store.list_triggers(Some(&ns)).await?;
    let jobs = s.job_store.list_jobs(Some(&ns)).await?;
    let devices = s.device_store.list_devices(&ns).await?;
    let removed = if q.force {
        s.trash.trash_namespace(&ns).await?
    } else {
        s.store.delete_namespace(&ns, false).await?
    };
    for t in triggers {
        s.triggers.remove(&ns, &t.name);
    }
    for j in jobs {
        s.jobs.stop(&ns, &j.name);
    }
    for f in removed {
        s.controller.forget(&f.namespace, &f.name);
    }
    s.collector.nudge();
    s.tokens.invalidate();
    // Its stored quota went with it (to the trash, or for good): a namespace made
    // again under the name starts from the defaults.
    s.quotas.forget(&ns);
    // Its async calls went with it (calls in flight settle into nothing).
    s.calls.forget(&ns);
    // Its devices went with it: the broker forgets them (and disconnects them).
    if let Some(d) = &s.devices {
        let names: Vec<(String, String)> =
            devices.into_iter().map(|r| (r.namespace, r.name)).collect();
        d.namespace_deleted(&names).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// How long a restore waits for the namespace's functions to serve again before it
/// answers (as a server start waits for stored functions).
const RESTORE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);
/// How long a restore waits for the devices' broker to serve again.
const BROKER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(15);

/// `POST /v1/namespaces/{ns}/restore` (admin only): brings the namespace most
/// recently moved to the trash under this name back whole, and everything of it
/// running again as a server start would: its quotas and tokens hold again, its
/// functions are deployed from their (reused) builds, then its triggers, unfinished
/// async calls and job runs resume, and the devices' broker takes their accounts
/// from the store again. Answers once its functions serve (or a minute passed).
#[utoipa::path(
    post,
    path = "/v1/namespaces/{ns}/restore",
    tag = "namespaces",
    params(crate::openapi::NsPath),
    responses(
        (status = 200, description = "Restored: the namespace, its quotas and its usage", body = sless_api_types::NamespaceDetail),
        (status = 409, description = "A namespace of that name exists again (it was created after the delete)", body = sless_api_types::ErrorBody),
        crate::openapi::ReadErrors
    )
)]
pub async fn restore(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
) -> Result<Json<Value>, ApiError> {
    // A namespace token's own namespace is gone while it is in the trash, and it
    // may not bring back another's.
    if !caller.is_admin() {
        return Err(ApiError::NotFound("no such endpoint".into()));
    }
    sless_core::validate_name("name", &ns).map_err(|_| ApiError::not_found("namespace", &ns))?;
    let record = s.trash.restore_namespace(&ns).await.map_err(|e| match e {
        sless_store::StoreError::NotFound { .. } => {
            ApiError::NotFound(format!("namespace {ns:?} is not in the trash"))
        }
        sless_store::StoreError::Conflict { .. } => ApiError::Conflict(format!(
            "namespace {ns:?} exists again (it was created after the delete): \
             delete it (DELETE /v1/namespaces/{ns}?force=true moves it to the trash too) \
             before restoring the one in the trash"
        )),
        other => other.into(),
    })?;
    tracing::info!(namespace = %ns, "restored a namespace from the trash");
    s.quotas.reload(&ns).await?;
    s.tokens.invalidate();
    // The broker restarts (its account file from the store) while the functions deploy.
    let broker = async {
        if let Some(d) = &s.devices
            && !s.device_store.list_devices(&ns).await?.is_empty()
        {
            d.reload_accounts(BROKER_PATIENCE).await;
        }
        Ok::<_, ApiError>(())
    };
    let (functions, broker) =
        tokio::join!(s.controller.resync_namespace(&ns, RESTORE_PATIENCE), broker);
    functions?;
    broker?;
    for t in s.trigger_store.list_triggers(Some(&ns)).await? {
        s.triggers.apply(&t);
    }
    // Once its functions serve, as at start: a call run before would find none.
    s.calls.resume_namespace(&ns).await?;
    s.jobs.resume_namespace(&ns).await?;
    body(&namespace_detail(&s, &record).await?)
}

#[utoipa::path(
    post,
    path = "/v1/tokens",
    tag = "namespaces",
    request_body(content = sless_api_types::schema::TokenCreate, content_type = "application/json"),
    responses((status = 201, description = "The token, shown this once", body = sless_api_types::TokenCreated), crate::openapi::WriteErrors)
)]
pub async fn create_token(
    State(s): State<AppState>,
    caller: Caller,
    notes: crate::audit::Notes,
    JsonBody(request): JsonBody,
) -> Result<Response, ApiError> {
    if !caller.is_admin() {
        return Err(ApiError::NotFound("no such endpoint".into()));
    }
    let ns = match request.get("namespace") {
        Some(Value::String(ns)) => ns.clone(),
        _ => return Err(ApiError::bad("namespace: required, a string")),
    };
    if let Some(unknown) = request
        .as_object()
        .and_then(|o| o.keys().find(|k| *k != "namespace"))
    {
        return Err(ApiError::bad(format!("{unknown}: unknown field")));
    }
    sless_core::validate_name("namespace", &ns)?;
    s.store.get_namespace(&ns).await?;
    notes.namespace(&ns);
    let token = new_token();
    let hash = hash_token(&token);
    s.store.create_token(&hash, &ns).await?;
    notes.object(&sless_store::token_id(&hash));
    s.tokens.invalidate();
    Ok((
        StatusCode::CREATED,
        body(&TokenCreated {
            token,
            namespace: ns,
        })?,
    )
        .into_response())
}
