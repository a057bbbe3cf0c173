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

pub async fn list(State(s): State<AppState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    let all = s.store.list_namespaces().await?;
    let items: Vec<_> = all
        .iter()
        .filter(|n| caller.may_access(&n.name))
        .map(namespace_body)
        .collect();
    body(&Items::new(items))
}

pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    body(&namespace_body(&s.store.get_namespace(&ns).await?))
}

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
