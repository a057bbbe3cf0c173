//! Dead letters: `GET /v1/namespaces/{ns}/dead-letters`, redrive one
//! (`POST .../{id}/redrive`) or all of a trigger's (`POST .../redrive?trigger=`),
//! and `DELETE .../{id}`.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use sless_api_types::{Items, timestamp};
use sless_controller::dead_letters::RedriveFailure;
use sless_core::DeadLetter;
use sless_store::{DeadLetterFilter, MAX_DEAD_LETTER_LIMIT, StoreError};

use crate::{ApiError, AppState, Caller, body};

fn not_found(id: &str) -> ApiError {
    ApiError::not_found("dead letter", id)
}

fn redrive_error(id: &str, e: RedriveFailure) -> ApiError {
    match e {
        RedriveFailure::NotFound(_) => not_found(id),
        RedriveFailure::Conflict(m) => ApiError::Conflict(m),
        RedriveFailure::Store(e) => e.into(),
    }
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/dead-letters",
    tag = "dead-letters",
    params(crate::openapi::NsPath, crate::openapi::DeadLetterParams),
    responses((status = 200, description = "Dead letters, newest first", body = sless_api_types::Items<sless_api_types::DeadLetter>), crate::openapi::ReadErrors)
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    let Query(params) = query.map_err(|e| ApiError::bad(format!("query: {e}")))?;
    let mut filter = DeadLetterFilter::default();
    for (key, value) in &params {
        let value = (!value.is_empty()).then_some(value.as_str());
        match key.as_str() {
            "trigger" => {
                if let Some(t) = value {
                    sless_core::validate_name("trigger", t)?;
                }
                filter.trigger = value.map(str::to_string);
            }
            "function" => {
                if let Some(f) = value {
                    sless_core::validate_name("function", f)?;
                }
                filter.function = value.map(str::to_string);
            }
            "limit" => {
                filter.limit =
                    crate::ranged_param("limit", value, 1, u64::from(MAX_DEAD_LETTER_LIMIT))?
                        .map(|n| n as u32);
            }
            other => {
                return Err(ApiError::bad(format!(
                    "{other}: unknown query parameter (trigger, function and limit are known)"
                )));
            }
        }
    }
    s.store.get_namespace(&ns).await?;
    let items = s
        .dead_letters
        .list_dead_letters(&ns, &filter)
        .await?
        .iter()
        .map(dead_letter_body)
        .collect();
    body(&Items::new(items))
}

#[utoipa::path(
    post,
    path = "/v1/namespaces/{ns}/dead-letters/{id}/redrive",
    tag = "dead-letters",
    params(crate::openapi::NsPath, crate::openapi::DeadLetterIdPath),
    responses((status = 202, description = "Delivered again from attempt 1; the dead letter goes when that succeeds"), crate::openapi::DeleteErrors)
)]
pub async fn redrive(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    s.redrive
        .one(&ns, &id)
        .await
        .map_err(|e| redrive_error(&id, e))?;
    Ok(StatusCode::ACCEPTED.into_response())
}

#[utoipa::path(
    post,
    path = "/v1/namespaces/{ns}/dead-letters/redrive",
    tag = "dead-letters",
    params(crate::openapi::NsPath, crate::openapi::RedriveParams),
    responses((status = 202, description = "How many of the trigger's dead letters were sent again", body = sless_api_types::Redriven), crate::openapi::DeleteErrors)
)]
pub async fn redrive_trigger(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let Query(params) = query.map_err(|e| ApiError::bad(format!("query: {e}")))?;
    let mut trigger = None;
    for (key, value) in params {
        match key.as_str() {
            "trigger" => trigger = Some(value),
            other => {
                return Err(ApiError::bad(format!(
                    "{other}: unknown query parameter (trigger is known)"
                )));
            }
        }
    }
    let Some(trigger) = trigger.filter(|t| !t.is_empty()) else {
        return Err(ApiError::bad(
            "trigger: required (the trigger whose dead letters to redrive)",
        ));
    };
    sless_core::validate_name("trigger", &trigger)?;
    s.store.get_namespace(&ns).await?;
    let redriven = s
        .redrive
        .trigger(&ns, &trigger)
        .await
        .map_err(|e| redrive_error(&trigger, e))?;
    let shape = body(&sless_api_types::Redriven { redriven })?;
    Ok((StatusCode::ACCEPTED, shape).into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/namespaces/{ns}/dead-letters/{id}",
    tag = "dead-letters",
    params(crate::openapi::NsPath, crate::openapi::DeadLetterIdPath),
    responses((status = 204, description = "Deleted"), crate::openapi::DeleteErrors)
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    caller.check(&ns)?;
    match s.dead_letters.delete_dead_letter(&ns, &id).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(StoreError::NotFound { .. }) => Err(not_found(&id)),
        Err(e) => Err(e.into()),
    }
}

/// The wire shape of a dead letter; its payload mapped like an event.
pub(crate) fn dead_letter_body(d: &DeadLetter) -> sless_api_types::DeadLetter {
    sless_api_types::DeadLetter {
        id: d.id.clone(),
        source: d.source.as_str().to_string(),
        trigger: d.trigger.clone(),
        function: d.function.clone(),
        payload: sless_core::delivery::payload_event(&d.payload),
        message: d.message.clone(),
        attempts: d.attempts,
        last_status: d.last_status,
        error: d.error.clone(),
        failed_at: timestamp(d.failed_at),
    }
}
