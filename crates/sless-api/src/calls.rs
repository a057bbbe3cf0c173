//! Async calls: `GET /v1/namespaces/{ns}/calls[/{id}]`, and the adapter that lets
//! the gateway's `/async/` route queue calls in the controller's durable queue
//! ([`GatewayCalls`]).

use std::sync::Arc;

use async_trait::async_trait;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde_json::Value;
use sless_api_types::{Items, timestamp};
use sless_controller::calls::{Calls, EnqueueError, NewCall};
use sless_core::CallPhase;
use sless_store::{CallFilter, CallRecord, MAX_CALL_LIMIT};

use crate::{ApiError, AppState, Caller, body};

/// The gateway's [`sless_gateway::AsyncCalls`] seam, implemented with the
/// controller's queue.
pub struct GatewayCalls(pub Arc<Calls>);

#[async_trait]
impl sless_gateway::AsyncCalls for GatewayCalls {
    async fn enqueue(
        &self,
        call: sless_gateway::AsyncCall,
    ) -> Result<String, sless_gateway::EnqueueError> {
        self.0
            .enqueue(NewCall {
                namespace: call.namespace,
                function: call.function,
                event: call.event.to_vec(),
                request_id: call.request_id,
                callback_url: call.callback_url,
            })
            .await
            .map_err(gateway_error)
    }
}

fn gateway_error(e: EnqueueError) -> sless_gateway::EnqueueError {
    use sless_gateway::EnqueueError as G;
    match e {
        e @ EnqueueError::BadCallback(_) => G::Invalid(e.to_string()),
        e @ EnqueueError::QueueFull { .. } => G::QueueFull(e.to_string()),
        EnqueueError::Quota(q) => G::Quota(q.to_string()),
        EnqueueError::Store(e) => {
            tracing::error!(error = %e, "cannot queue an async call");
            G::Unavailable("the call could not be queued; try again".to_string())
        }
    }
}

/// The API's error for a call that was not queued.
pub(crate) fn enqueue_error(e: EnqueueError) -> ApiError {
    match e {
        e @ EnqueueError::BadCallback(_) => ApiError::bad(e.to_string()),
        e @ EnqueueError::QueueFull { .. } => ApiError::TooManyRequests {
            message: e.to_string(),
            retry_after: 1,
        },
        EnqueueError::Quota(q) => ApiError::QuotaExceeded(q.to_string()),
        EnqueueError::Store(e) => e.into(),
    }
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/calls/{id}",
    tag = "calls",
    params(crate::openapi::NsPath, crate::openapi::CallIdPath),
    responses((status = 200, description = "The call", body = sless_api_types::Call), crate::openapi::ReadErrors)
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    let call = s.call_store.get_call(&ns, &id).await.map_err(|e| match e {
        sless_store::StoreError::NotFound { .. } => ApiError::not_found("call", &id),
        e => e.into(),
    })?;
    body(&call_body(&call))
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/calls",
    tag = "calls",
    params(crate::openapi::NsPath, crate::openapi::CallParams),
    responses((status = 200, description = "Async calls, newest first", body = sless_api_types::Items<sless_api_types::Call>), crate::openapi::ReadErrors)
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    let Query(params) = query.map_err(|e| ApiError::bad(format!("query: {e}")))?;
    let mut filter = CallFilter::default();
    for (key, value) in &params {
        let value = (!value.is_empty()).then_some(value.as_str());
        match key.as_str() {
            "function" => {
                if let Some(f) = value {
                    sless_core::validate_name("function", f)?;
                }
                filter.function = value.map(str::to_string);
            }
            "phase" => {
                filter.phase = value
                    .map(|p| {
                        CallPhase::parse(p).ok_or_else(|| {
                            ApiError::bad(format!(
                                "phase: must be one of Queued, Running, Succeeded, Failed, got {p:?}"
                            ))
                        })
                    })
                    .transpose()?;
            }
            "limit" => {
                filter.limit = crate::ranged_param("limit", value, 1, u64::from(MAX_CALL_LIMIT))?
                    .map(|n| n as u32);
            }
            other => {
                return Err(ApiError::bad(format!(
                    "{other}: unknown query parameter (function, phase and limit are known)"
                )));
            }
        }
    }
    s.store.get_namespace(&ns).await?;
    let items = s
        .call_store
        .list_calls(&ns, &filter)
        .await?
        .iter()
        .map(call_body)
        .collect();
    body(&Items::new(items))
}

/// The wire shape of a call; the response body is JSON when the function said it
/// answered JSON (and it parses), otherwise its text.
pub(crate) fn call_body(c: &CallRecord) -> sless_api_types::Call {
    sless_api_types::Call {
        id: c.id.clone(),
        function: c.function.clone(),
        phase: c.phase.as_str().to_string(),
        attempts: c.attempts,
        response: c.response.as_ref().map(|r| {
            let is_json = r.headers.iter().any(|(k, v)| {
                k.eq_ignore_ascii_case("content-type")
                    && v.trim_start().starts_with("application/json")
            });
            let body = is_json
                .then(|| serde_json::from_slice::<Value>(&r.body).ok())
                .flatten()
                .unwrap_or_else(|| Value::String(String::from_utf8_lossy(&r.body).into_owned()));
            sless_api_types::CallResponse {
                status: r.status,
                headers: r
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
                    .collect(),
                body,
            }
        }),
        error: c.error.clone(),
        queued_at: timestamp(c.queued_at),
        started_at: c.started_at.map(timestamp),
        finished_at: c.finished_at.map(timestamp),
    }
}
