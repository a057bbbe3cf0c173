//! Triggers: http routes and cron schedules for functions.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde_json::{Value, json};
use sless_core::{TriggerFields, TriggerKind, TriggerSpec, TriggerStatus};
use sless_store::TriggerRecord;

use crate::functions::spec_error;
use crate::{ApiError, AppState, Caller, JsonBody};

fn time(t: chrono::DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The wire shape: the spec's fields at the top level, plus status and times.
fn trigger_json(s: &AppState, t: &TriggerRecord) -> Value {
    let status: TriggerStatus = s.triggers.status(t);
    let mut v = serde_json::to_value(&t.spec).unwrap_or_default();
    if let Value::Object(map) = &mut v {
        map.insert("name".into(), json!(t.name));
        map.insert("namespace".into(), json!(t.namespace));
        map.insert(
            "status".into(),
            json!({
                "last_fired_at": status.last_fired_at.map(time),
                "next_fire_at": status.next_fire_at.map(time),
                "last_result": status.last_result,
            }),
        );
        map.insert("created_at".into(), json!(time(t.created_at)));
        map.insert("updated_at".into(), json!(time(t.updated_at)));
    }
    v
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
    if s.store.get_function(ns, &spec.function).await.is_err() {
        return Err(ApiError::bad(format!(
            "function: {:?} does not exist in namespace {ns}",
            spec.function
        )));
    }
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
    let items: Vec<Value> = s
        .trigger_store
        .list_triggers(Some(&ns))
        .await?
        .iter()
        .map(|t| trigger_json(&s, t))
        .collect();
    Ok(Json(json!({"items": items})))
}

pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let (name, fields) = crate::take_name(body)?;
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
        created_at: now,
        updated_at: now,
    };
    s.trigger_store.create_trigger(&record).await?;
    s.triggers.apply(&record);
    Ok((StatusCode::CREATED, Json(trigger_json(&s, &record))).into_response())
}

pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    Ok(Json(trigger_json(
        &s,
        &s.trigger_store.get_trigger(&ns, &name).await?,
    )))
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
        .update_trigger_spec(&ns, &name, &spec)
        .await?;
    s.triggers.apply(&record);
    Ok(Json(trigger_json(&s, &record)))
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
