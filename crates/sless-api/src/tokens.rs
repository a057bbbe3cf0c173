//! Namespace tokens listed (ids, creation, last use; never values) and revoked by
//! id, and the admin token rotated. Creating a token is in `namespaces.rs`.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use sless_api_types::{AdminToken, Items, TokenInfo, timestamp};

use crate::audit::Notes;
use crate::{ApiError, AppState, Caller, body};

#[derive(Deserialize)]
pub struct ListQuery {
    namespace: Option<String>,
}

/// `GET /v1/tokens[?namespace=]`: every token for an admin (or one namespace's), the
/// caller's own namespace's for anyone else.
#[utoipa::path(
    get,
    path = "/v1/tokens",
    tag = "namespaces",
    params(crate::openapi::TokenListParams),
    responses((status = 200, description = "Namespace tokens: ids, never values", body = sless_api_types::Items<sless_api_types::TokenInfo>), crate::openapi::ReadErrors)
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let asked = q.namespace.filter(|n| !n.is_empty());
    if let Some(ns) = &asked {
        sless_core::validate_name("namespace", ns)?;
        caller.check(ns)?;
    }
    let namespace = asked.or_else(|| caller.namespace().map(str::to_string));
    let items: Vec<_> = s
        .token_store
        .list_tokens(namespace.as_deref())
        .await?
        .into_iter()
        .map(|t| TokenInfo {
            id: t.id,
            namespace: t.namespace,
            created_at: timestamp(t.created_at),
            last_used_at: t.last_used_at.map(timestamp),
        })
        .collect();
    body(&Items::new(items))
}

/// `DELETE /v1/tokens/{id}`: revoked at once (the token cache is dropped). Another
/// namespace's token is `404`, as an unknown id is.
#[utoipa::path(
    delete,
    path = "/v1/tokens/{id}",
    tag = "namespaces",
    params(("id" = String, Path, description = "The token's id, as `GET /v1/tokens` lists it", pattern = "^[0-9a-f]{12}$", example = "0123456789ab")),
    responses((status = 204, description = "Revoked: refused from the next request on"), crate::openapi::DeleteErrors)
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    notes: Notes,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let deleted = s.token_store.delete_token(&id, caller.namespace()).await?;
    s.tokens.invalidate();
    notes.namespace(&deleted.namespace);
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/tokens/admin/rotate` (admins only; to others it does not exist, as
/// `POST /v1/tokens`): a new admin token, effective at once; the old one is refused.
#[utoipa::path(
    post,
    path = "/v1/tokens/admin/rotate",
    tag = "namespaces",
    responses((status = 201, description = "The new admin token, shown this once; the old one is refused from now on", body = sless_api_types::AdminToken), crate::openapi::WriteErrors)
)]
pub async fn rotate_admin(State(s): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    if !caller.is_admin() {
        return Err(ApiError::NotFound("no such endpoint".into()));
    }
    let token = s.tokens.rotate_admin()?;
    Ok((StatusCode::CREATED, body(&AdminToken { token })?).into_response())
}
