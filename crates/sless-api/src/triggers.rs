//! Triggers: http routes and cron schedules for functions.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde_json::Value;
use sless_api_types::{Items, Trigger, timestamp};
use sless_core::{TriggerFields, TriggerKind, TriggerSpec, TriggerStatus};
use sless_store::TriggerRecord;

use crate::functions::spec_error;
use crate::{ApiError, AppState, Caller, JsonBody, body};

/// The wire shape: the spec's fields at the top level, plus status and times.
fn trigger_body(s: &AppState, t: &TriggerRecord) -> Trigger {
    Trigger {
        name: t.name.clone(),
        namespace: t.namespace.clone(),
        spec: t.spec.clone(),
        status: s.triggers.status(t).into(),
        created_at: timestamp(t.created_at),
        updated_at: timestamp(t.updated_at),
    }
}

/// Checks what the spec's type cannot say alone: the cron expression, that the
/// function exists (`400` otherwise) and that no other http trigger owns the path (`409`).
async fn check(s: &AppState, ns: &str, name: &str, spec: &TriggerSpec) -> Result<(), ApiError> {
    if let TriggerKind::Cron {
        schedule, timezone, ..
    } = &spec.kind
    {
        sless_triggers::Schedule::parse(schedule, timezone)
            .map_err(|e| ApiError::bad(e.to_string()))?;
    }
    s.store
        .get_function(ns, &spec.function)
        .await
        .map_err(|e| ApiError::named_function(e, ns, &spec.function))?;
    if let TriggerKind::Http { path, .. } = &spec.kind
        && let Some(owner) = s.triggers.path_owner(ns, path, name)
    {
        return Err(ApiError::Conflict(format!(
            "path {path:?} is already served by trigger {owner}"
        )));
    }
    Ok(())
}

pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    s.store.get_namespace(&ns).await?;
    let items = s
        .trigger_store
        .list_triggers(Some(&ns))
        .await?
        .iter()
        .map(|t| trigger_body(&s, t))
        .collect();
    body(&Items::new(items))
}

pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    JsonBody(request): JsonBody,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let (name, fields) = crate::take_name(request)?;
    s.store.get_namespace(&ns).await?;
    let fields: TriggerFields = serde_path_to_error::deserialize(Value::Object(fields))
        .map_err(|e| ApiError::bad(spec_error(e)))?;
    let spec = TriggerSpec::from_fields(fields)?;
    check(&s, &ns, &name, &spec).await?;
    let now = Utc::now();
    let record = TriggerRecord {
        namespace: ns.clone(),
        name,
        spec,
        status: TriggerStatus::default(),
        generation: 1,
        created_at: now,
        updated_at: now,
    };
    s.trigger_store.create_trigger(&record).await?;
    s.triggers.apply(&record);
    Ok((StatusCode::CREATED, body(&trigger_body(&s, &record))?).into_response())
}

pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    body(&trigger_body(
        &s,
        &s.trigger_store.get_trigger(&ns, &name).await?,
    ))
}

pub async fn patch(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    JsonBody(patch): JsonBody,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    // Patches of one trigger are applied one at a time so none is lost.
    let _serial = s.trigger_patch_lock.lock().await;
    let current = s.trigger_store.get_trigger(&ns, &name).await?;
    let fields: TriggerFields =
        crate::patch_spec(&current.spec, &patch, sless_core::trigger::TRIGGER_FIELDS)?;
    if Some(fields.kind) != current.spec.trigger_type() {
        return Err(ApiError::bad(
            "type: a trigger's type cannot change; create a new trigger",
        ));
    }
    let spec = TriggerSpec::from_fields(fields)?;
    check(&s, &ns, &name, &spec).await?;
    let record = s
        .trigger_store
        .update_trigger(&ns, &name, None, &mut |t| {
            t.spec = spec.clone();
            Ok(())
        })
        .await?;
    s.triggers.apply(&record);
    body(&trigger_body(&s, &record))
}

pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    caller.check(&ns)?;
    s.trigger_store.delete_trigger(&ns, &name).await?;
    s.triggers.remove(&ns, &name);
    Ok(StatusCode::NO_CONTENT)
}
