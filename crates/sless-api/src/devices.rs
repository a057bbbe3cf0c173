//! Devices and their telemetry: create (credentials shown once), list, get, patch
//! (labels, enabled), delete, rotate credentials, telemetry queries and commands.
//! Without `--mqtt-listen` the server runs no broker and every endpoint says so
//! (`503`).

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sless_api_types::{CommandSent, Device, DeviceMqtt, DeviceStatus, Items, Telemetry, timestamp};
use sless_controller::devices::Devices;
use sless_core::{DeviceSpec, QuotaKind, device};
use sless_store::{DeviceRecord, MAX_TELEMETRY_LIMIT, StoreError, TelemetryFilter};

use crate::{ApiError, AppState, Caller, JsonBody, body};

/// The most bytes of a command's JSON body.
const MAX_COMMAND: usize = 256 * 1024;

fn devices(s: &AppState) -> Result<&Devices, ApiError> {
    s.devices.as_deref().ok_or_else(|| {
        ApiError::Unavailable(
            "this server runs no MQTT broker for devices: start it with --mqtt-listen HOST:PORT"
                .into(),
        )
    })
}

fn not_found(e: StoreError, name: &str) -> ApiError {
    match e {
        StoreError::NotFound { .. } => ApiError::not_found("device", name),
        StoreError::Conflict { .. } => {
            ApiError::Conflict(format!("device {name:?} already exists"))
        }
        e => e.into(),
    }
}

fn device_body(d: &Devices, r: &DeviceRecord, password: Option<String>) -> Device {
    let a = d.advertised();
    Device {
        name: r.name.clone(),
        namespace: r.namespace.clone(),
        labels: r.spec.labels.clone(),
        enabled: r.spec.enabled,
        mqtt: DeviceMqtt {
            host: a.host.clone(),
            port: a.port,
            ws_url: a.ws_url.clone(),
            client_id: device::username(&r.namespace, &r.name),
            username: device::username(&r.namespace, &r.name),
            password,
            publish_topic: device::telemetry_topic(&r.namespace, &r.name),
            subscribe_topic: device::commands_topic(&r.namespace, &r.name),
        },
        status: DeviceStatus {
            online: d.online(&r.namespace, &r.name),
            last_seen_at: r.last_seen_at.map(timestamp),
            messages: r.messages,
        },
        created_at: timestamp(r.created_at),
        updated_at: timestamp(r.updated_at),
    }
}

/// A create body's spec fields, decoded strictly and checked.
fn spec_of(fields: serde_json::Map<String, Value>) -> Result<DeviceSpec, ApiError> {
    let spec: DeviceSpec =
        serde_path_to_error::deserialize(Value::Object(fields)).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            ApiError::bad(if path.is_empty() || path == "." {
                inner
            } else {
                format!("{path}: {inner}")
            })
        })?;
    spec.validate()?;
    Ok(spec)
}

#[utoipa::path(
    post,
    path = "/v1/namespaces/{ns}/devices",
    tag = "devices",
    params(crate::openapi::NsPath),
    request_body(content = sless_api_types::schema::DeviceCreate, content_type = "application/json"),
    responses((status = 201, description = "Created; `mqtt.password` is shown only this once", body = sless_api_types::Device), crate::openapi::WriteErrors)
)]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    JsonBody(request): JsonBody,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let d = devices(&s)?;
    let (name, fields) = crate::take_name(request)?;
    let spec = spec_of(fields)?;
    s.store.get_namespace(&ns).await?;
    let quota = s.quotas.effective(&ns).await?;
    quota.check(QuotaKind::Devices, s.device_store.count_devices(&ns).await?)?;
    let (record, password) = d
        .create(&ns, &name, &spec)
        .await
        .map_err(|e| not_found(e, &name))?;
    Ok((
        StatusCode::CREATED,
        body(&device_body(d, &record, Some(password)))?,
    )
        .into_response())
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/devices",
    tag = "devices",
    params(crate::openapi::NsPath),
    responses((status = 200, description = "The namespace's devices, by name", body = sless_api_types::Items<sless_api_types::Device>), crate::openapi::ReadErrors)
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    let d = devices(&s)?;
    s.store.get_namespace(&ns).await?;
    let items = s
        .device_store
        .list_devices(&ns)
        .await?
        .iter()
        .map(|r| device_body(d, r, None))
        .collect();
    body(&Items::new(items))
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/devices/{name}",
    tag = "devices",
    params(crate::openapi::NsNamePath),
    responses((status = 200, description = "The device (no password)", body = sless_api_types::Device), crate::openapi::ReadErrors)
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    let d = devices(&s)?;
    let r = s
        .device_store
        .get_device(&ns, &name)
        .await
        .map_err(|e| not_found(e, &name))?;
    body(&device_body(d, &r, None))
}

#[utoipa::path(
    patch,
    path = "/v1/namespaces/{ns}/devices/{name}",
    tag = "devices",
    params(crate::openapi::NsNamePath),
    request_body(content = sless_api_types::schema::DevicePatch, content_type = "application/merge-patch+json"),
    responses((status = 200, description = "Changed; `enabled: false` disconnects it and refuses it until enabled", body = sless_api_types::Device), crate::openapi::WriteErrors)
)]
pub async fn patch(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    JsonBody(patch): JsonBody,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    let d = devices(&s)?;
    let current = s
        .device_store
        .get_device(&ns, &name)
        .await
        .map_err(|e| not_found(e, &name))?;
    let spec: DeviceSpec = sless_core::patch::apply(&current.spec, &patch, &["labels", "enabled"])
        .map_err(|e| match e.into_validation() {
            Ok(v) => ApiError::from(v),
            Err(e) => ApiError::Internal(e.into()),
        })?;
    spec.validate()?;
    let r = d
        .set_spec(&ns, &name, &spec)
        .await
        .map_err(|e| not_found(e, &name))?;
    body(&device_body(d, &r, None))
}

#[utoipa::path(
    delete,
    path = "/v1/namespaces/{ns}/devices/{name}",
    tag = "devices",
    params(crate::openapi::NsNamePath),
    responses((status = 204, description = "Deleted with its telemetry; disconnected and refused from now on"), crate::openapi::DeleteErrors)
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    caller.check(&ns)?;
    let d = devices(&s)?;
    d.delete(&ns, &name)
        .await
        .map_err(|e| not_found(e, &name))?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/v1/namespaces/{ns}/devices/{name}/credentials",
    tag = "devices",
    params(crate::openapi::NsNamePath),
    responses((status = 200, description = "A new password, shown only this once; the old one no longer works", body = sless_api_types::Device), crate::openapi::DeleteErrors)
)]
pub async fn rotate(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    let d = devices(&s)?;
    let (r, password) = d
        .rotate(&ns, &name)
        .await
        .map_err(|e| not_found(e, &name))?;
    body(&device_body(d, &r, Some(password)))
}

#[utoipa::path(
    post,
    path = "/v1/namespaces/{ns}/devices/{name}/commands",
    tag = "devices",
    params(crate::openapi::NsNamePath),
    request_body(content = serde_json::Value, description = "The command: any JSON value", content_type = "application/json"),
    responses((status = 202, description = "Published (QoS 1) to the device's subscribe_topic", body = sless_api_types::CommandSent), crate::openapi::WriteErrors)
)]
pub async fn command(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    JsonBody(command): JsonBody,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    let d = devices(&s)?;
    s.device_store
        .get_device(&ns, &name)
        .await
        .map_err(|e| not_found(e, &name))?;
    let bytes = serde_json::to_vec(&command).map_err(|e| ApiError::Internal(e.into()))?;
    if bytes.len() > MAX_COMMAND {
        return Err(ApiError::TooLarge(format!(
            "a command is at most {MAX_COMMAND} bytes of JSON"
        )));
    }
    let topic = d
        .send_command(&ns, &name, bytes.into())
        .await
        .map_err(|e| ApiError::Unavailable(format!("the command was not published: {e}")))?;
    Ok((StatusCode::ACCEPTED, body(&CommandSent { topic })?).into_response())
}

/// `since`, `until`, `limit` (and on the namespace's list, `device`); an empty value
/// filters nothing.
fn telemetry_filter(
    params: &[(String, String)],
    device_param: bool,
) -> Result<TelemetryFilter, ApiError> {
    let time = |name: &str, v: &str| -> Result<DateTime<Utc>, ApiError> {
        DateTime::parse_from_rfc3339(v)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| {
                ApiError::bad(format!(
                    "{name}: must be an RFC 3339 time such as 2025-01-31T12:00:00Z, got {v:?} ({e})"
                ))
            })
    };
    let mut filter = TelemetryFilter::default();
    for (key, value) in params {
        let value = (!value.is_empty()).then_some(value.as_str());
        match key.as_str() {
            "since" => filter.since = value.map(|v| time("since", v)).transpose()?,
            "until" => filter.until = value.map(|v| time("until", v)).transpose()?,
            "limit" => {
                filter.limit =
                    crate::ranged_param("limit", value, 1, u64::from(MAX_TELEMETRY_LIMIT))?
                        .map(|n| n as u32);
            }
            "device" if device_param => {
                if let Some(d) = value {
                    sless_core::validate_name("device", d)?;
                }
                filter.device = value.map(str::to_string);
            }
            other => {
                let known = if device_param {
                    "device, since, until and limit"
                } else {
                    "since, until and limit"
                };
                return Err(ApiError::bad(format!(
                    "{other}: unknown query parameter ({known} are known)"
                )));
            }
        }
    }
    Ok(filter)
}

fn telemetry_items(items: Vec<sless_store::TelemetryRecord>) -> Items<Telemetry> {
    Items::new(
        items
            .into_iter()
            .map(|t| Telemetry {
                device: t.device,
                received_at: timestamp(t.received_at),
                payload: t.payload,
            })
            .collect(),
    )
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/devices/{name}/telemetry",
    tag = "devices",
    params(crate::openapi::NsNamePath, crate::openapi::TelemetryParams),
    responses((status = 200, description = "The device's telemetry, newest first", body = sless_api_types::Items<sless_api_types::Telemetry>), crate::openapi::ReadErrors)
)]
pub async fn device_telemetry(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    devices(&s)?;
    let Query(params) = query.map_err(|e| ApiError::bad(format!("query: {e}")))?;
    let mut filter = telemetry_filter(&params, false)?;
    s.device_store
        .get_device(&ns, &name)
        .await
        .map_err(|e| not_found(e, &name))?;
    filter.device = Some(name);
    let items = s.device_store.list_telemetry(&ns, &filter).await?;
    body(&telemetry_items(items))
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/telemetry",
    tag = "devices",
    params(crate::openapi::NsPath, crate::openapi::NamespaceTelemetryParams),
    responses((status = 200, description = "The namespace's telemetry, newest first (an empty list when there is none yet)", body = sless_api_types::Items<sless_api_types::Telemetry>), crate::openapi::ReadErrors)
)]
pub async fn namespace_telemetry(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    devices(&s)?;
    let Query(params) = query.map_err(|e| ApiError::bad(format!("query: {e}")))?;
    let filter = telemetry_filter(&params, true)?;
    s.store.get_namespace(&ns).await?;
    let items = s.device_store.list_telemetry(&ns, &filter).await?;
    body(&telemetry_items(items))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn telemetry_filters_name_the_bad_parameter() {
        let f = telemetry_filter(
            &params(&[
                ("since", "2025-01-31T12:00:00Z"),
                ("limit", "5"),
                ("device", "d"),
            ]),
            true,
        )
        .unwrap();
        assert_eq!(f.limit, Some(5));
        assert_eq!(f.device.as_deref(), Some("d"));
        for (p, needle) in [
            (("since", "yesterday"), "since:"),
            (("until", "x"), "until:"),
            (("limit", "0"), "limit:"),
            (("limit", "1001"), "limit:"),
            (("colour", "red"), "colour: unknown"),
        ] {
            let e = telemetry_filter(&params(&[p]), false)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(needle), "{p:?}: {e}");
        }
        let e = telemetry_filter(&params(&[("device", "d")]), false)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("device: unknown"), "{e}");
        let e = telemetry_filter(&params(&[("device", "D!")]), true)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("device:"), "{e}");
    }
}
