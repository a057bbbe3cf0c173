//! Triggers: http routes, cron schedules and queue consumers for functions.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::Value;
use sless_api_types::{Items, Trigger, timestamp};
use sless_core::{SecretRef, TriggerFields, TriggerKind, TriggerSpec, TriggerStatus, TriggerType};
use sless_store::{StoreError, TriggerRecord};

use crate::etag::{IfMatch, tagged};
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

/// Checks what the spec's type cannot say alone: [`check_spec`], that the
/// function exists and that a queue source's `url_secret` names a secret key that
/// exists (`400` otherwise). That no other http trigger owns the path (`409`) the
/// store checks as it writes. A broker that cannot be reached is no error: the
/// trigger connects when it can.
async fn check(s: &AppState, ns: &str, spec: &TriggerSpec) -> Result<(), ApiError> {
    check_spec(spec)?;
    s.store
        .get_function(ns, &spec.function)
        .await
        .map_err(|e| ApiError::named_function(e, ns, &spec.function))?;
    if let TriggerKind::Queue { source, .. } = &spec.kind
        && let Some(r) = &source.url_secret
    {
        check_url_secret(s, ns, r).await?;
    }
    if matches!(spec.kind, TriggerKind::Device { .. }) && s.devices.is_none() {
        return Err(ApiError::bad(
            "type: device triggers need the server's MQTT broker: start it with --mqtt-listen",
        ));
    }
    Ok(())
}

/// `400` naming `source.url_secret` when `r` names a secret or key that does not
/// exist in `ns`.
async fn check_url_secret(s: &AppState, ns: &str, r: &SecretRef) -> Result<(), ApiError> {
    match s.secret_store.get_secret(ns, &r.secret).await {
        Ok(record) if record.sealed.contains_key(&r.key) => Ok(()),
        Ok(_) => Err(ApiError::bad(format!(
            "source.url_secret: secret {:?} has no key {:?}",
            r.secret, r.key
        ))),
        Err(StoreError::NotFound { .. }) => Err(ApiError::bad(format!(
            "source.url_secret: secret {:?} does not exist in namespace {ns:?}",
            r.secret
        ))),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/triggers",
    tag = "triggers",
    params(crate::openapi::NsPath),
    responses((status = 200, description = "The namespace's triggers", body = sless_api_types::Items<sless_api_types::Trigger>), crate::openapi::ReadErrors)
)]
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

#[utoipa::path(
    post,
    path = "/v1/namespaces/{ns}/triggers",
    tag = "triggers",
    params(crate::openapi::NsPath),
    request_body(content = sless_api_types::schema::TriggerCreate, content_type = "application/json"),
    responses((status = 201, description = "Created (ETag: its version)", body = sless_api_types::Trigger), crate::openapi::WriteErrors)
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
    let fields: TriggerFields = serde_path_to_error::deserialize(Value::Object(fields))
        .map_err(|e| ApiError::bad(spec_error(e)))?;
    let mut spec = TriggerSpec::from_fields(fields)?;
    if let TriggerKind::Queue { source, .. } = &mut spec.kind {
        source.fill_group(&ns, &name);
    }
    check(&s, &ns, &spec).await?;
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
    Ok(tagged(
        StatusCode::CREATED,
        record.generation,
        body(&trigger_body(&s, &record))?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/triggers/{name}",
    tag = "triggers",
    params(crate::openapi::NsNamePath),
    responses((status = 200, description = "The trigger (ETag: its version)", body = sless_api_types::Trigger), crate::openapi::ReadErrors)
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let record = s.trigger_store.get_trigger(&ns, &name).await?;
    Ok(tagged(
        StatusCode::OK,
        record.generation,
        body(&trigger_body(&s, &record))?,
    ))
}

/// A stored spec as the fields a request states, so a patch is decoded as strictly
/// as a create.
fn fields_of(spec: &TriggerSpec) -> Result<TriggerFields, ApiError> {
    let mut fields = TriggerFields {
        function: spec.function.clone(),
        kind: TriggerType::Http,
        enabled: Some(spec.enabled),
        path: None,
        methods: None,
        schedule: None,
        timezone: None,
        event: None,
        prewarm_sec: None,
        source: None,
        response_topic: None,
        dead_letter_topic: None,
        delivery: None,
        devices: None,
    };
    match &spec.kind {
        TriggerKind::Http { path, methods } => {
            fields.path = Some(path.clone());
            fields.methods = Some(methods.clone());
        }
        TriggerKind::Cron {
            schedule,
            timezone,
            event,
            prewarm_sec,
        } => {
            fields.kind = TriggerType::Cron;
            fields.schedule = Some(schedule.clone());
            fields.timezone = Some(timezone.clone());
            fields.event = Some(event.clone());
            fields.prewarm_sec = Some(*prewarm_sec);
        }
        TriggerKind::Queue {
            source,
            event,
            response_topic,
            dead_letter_topic,
            delivery,
        } => {
            fields.kind = TriggerType::Queue;
            fields.source = Some(source.clone());
            fields.event = Some(serde_json::to_value(event).map_err(anyhow::Error::from)?);
            fields.response_topic = response_topic.clone();
            fields.dead_letter_topic = dead_letter_topic.clone();
            fields.delivery = Some(*delivery);
        }
        TriggerKind::Device {
            devices,
            event,
            delivery,
        } => {
            fields.kind = TriggerType::Device;
            fields.devices = Some(devices.clone());
            fields.event = Some(serde_json::to_value(event).map_err(anyhow::Error::from)?);
            fields.delivery = Some(*delivery);
        }
        TriggerKind::Unknown => {
            return Err(ApiError::Internal(anyhow::anyhow!(
                "stored trigger has a type this server does not know"
            )));
        }
    }
    Ok(fields)
}

/// The checks that need no IO (the cron expression), so that they run on the spec
/// as it is about to be written.
fn check_spec(spec: &TriggerSpec) -> Result<(), ApiError> {
    if let TriggerKind::Cron {
        schedule, timezone, ..
    } = &spec.kind
    {
        sless_triggers::Schedule::parse(schedule, timezone)
            .map_err(|e| ApiError::bad(e.to_string()))?;
    }
    Ok(())
}

/// The patched spec of `current`: merged, decoded strictly, validated and checked.
fn patched(current: &TriggerRecord, patch: &Value) -> Result<TriggerSpec, ApiError> {
    let fields = sless_core::patch::apply(
        &fields_of(&current.spec)?,
        patch,
        sless_core::trigger::TRIGGER_FIELDS,
    )?;
    if Some(fields.kind) != current.spec.trigger_type() {
        return Err(ApiError::bad(
            "type: a trigger's type cannot change; create a new trigger",
        ));
    }
    let spec = TriggerSpec::from_fields(fields)?;
    check_spec(&spec)?;
    Ok(spec)
}

/// A merge patch, applied by the store to the trigger as it stands when it writes
/// (again, should another writer get there first), so concurrent patches never lose
/// each other's edits; with `If-Match`, only to the version it names.
#[utoipa::path(
    patch,
    path = "/v1/namespaces/{ns}/triggers/{name}",
    tag = "triggers",
    params(crate::openapi::NsNamePath, crate::openapi::IfMatchHeader),
    request_body(content = sless_api_types::schema::TriggerPatch, content_type = "application/merge-patch+json"),
    responses((status = 200, description = "Patched (ETag: its version)", body = sless_api_types::Trigger), crate::openapi::MatchedWriteErrors)
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
        .expect("trigger", &name, async {
            Ok(s.trigger_store.get_trigger(&ns, &name).await?.generation)
        })
        .await?;
    if let Some(Value::String(function)) = patch.get("function") {
        crate::functions::check_exists(&s, &ns, function).await?;
    }
    // A secret reference the patch makes is checked before the write, on the spec
    // as it stands now (a concurrent patch may still change it: the consumer then
    // reports the missing secret in the trigger's status).
    if patch.get("source").is_some() {
        let current = s.trigger_store.get_trigger(&ns, &name).await?;
        if let Ok(TriggerSpec {
            kind: TriggerKind::Queue { source, .. },
            ..
        }) = patched(&current, &patch)
            && let Some(r) = &source.url_secret
        {
            check_url_secret(&s, &ns, r).await?;
        }
    }
    let record = s
        .trigger_store
        .update_trigger(&ns, &name, expect, &mut |t| {
            t.spec = patched(t, &patch).map_err(ApiError::reject)?;
            Ok(())
        })
        .await?;
    s.triggers.apply(&record);
    Ok(tagged(
        StatusCode::OK,
        record.generation,
        body(&trigger_body(&s, &record))?,
    ))
}

#[utoipa::path(
    delete,
    path = "/v1/namespaces/{ns}/triggers/{name}",
    tag = "triggers",
    params(crate::openapi::NsNamePath),
    responses((status = 204, description = "Deleted"), crate::openapi::DeleteErrors)
)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_spec_reads_back_as_the_fields_that_make_it() {
        for request in [
            serde_json::json!({"function": "f", "type": "http", "path": "/x/", "methods": ["get"]}),
            serde_json::json!({"function": "f", "type": "http", "path": "/x", "enabled": false}),
            serde_json::json!({"function": "f", "type": "cron", "schedule": "* * * * *"}),
            serde_json::json!({"function": "f", "type": "cron", "schedule": "0 1 * * *",
                "timezone": "Europe/Paris", "event": {"a": 1}, "prewarm_sec": 5}),
        ] {
            let fields: TriggerFields = serde_json::from_value(request.clone()).unwrap();
            let spec = TriggerSpec::from_fields(fields).unwrap();
            let again = TriggerSpec::from_fields(fields_of(&spec).unwrap()).unwrap();
            assert_eq!(again, spec, "{request}");
        }
    }
}
