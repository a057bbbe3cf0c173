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

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}",
    tag = "namespaces",
    params(crate::openapi::NsPath),
    responses((status = 200, description = "The namespace", body = sless_api_types::Namespace), crate::openapi::ReadErrors)
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    body(&namespace_body(&s.store.get_namespace(&ns).await?))
}

#[utoipa::path(
    put,
    path = "/v1/namespaces/{ns}",
    tag = "namespaces",
    params(crate::openapi::NsPath),
    responses((status = 200, description = "It already existed", body = sless_api_types::Namespace), (status = 201, description = "Created", body = sless_api_types::Namespace), crate::openapi::WriteErrors)
)]
pub async fn ensure(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    sless_core::validate_name("name", &ns)?;
    let created = s.store.ensure_namespace(&ns).await?;
    let answer = body(&namespace_body(&s.store.get_namespace(&ns).await?))?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, answer).into_response())
}

#[derive(Deserialize)]
pub struct DeleteQuery {
    #[serde(default)]
    force: bool,
}

#[utoipa::path(
    delete,
    path = "/v1/namespaces/{ns}",
    tag = "namespaces",
    params(crate::openapi::NsPath, crate::openapi::ForceQuery),
    responses((status = 204, description = "Deleted"), crate::openapi::DeleteErrors)
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
    let removed = s.store.delete_namespace(&ns, q.force).await?;
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
    Ok(StatusCode::NO_CONTENT)
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
    let token = new_token();
    s.store.create_token(&hash_token(&token), &ns).await?;
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
