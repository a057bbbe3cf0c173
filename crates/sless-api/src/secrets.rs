//! Secrets: set (create or replace), list, read (keys only) and delete; and the
//! check that a function's or job's env references secrets and keys that exist.
//!
//! Values are sealed here, before the store sees them, and never appear in an
//! answer, an error or a log line: errors name the field (`data.KEY`), not the value.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use sless_api_types::{Items, Secret, timestamp};
use sless_core::{EnvValue, SecretRef};
use sless_secrets::Slot;
use sless_store::{SecretRecord, StoreError};

use crate::{ApiError, AppState, Caller, body, read_limited};

/// The largest `PUT .../secrets/{name}` body: a full secret (1 MiB) with room for
/// JSON escaping.
const MAX_SECRET_BODY: usize = 4 * sless_core::secret::SECRET_MAX_BYTES;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretBody {
    data: BTreeMap<String, String>,
}

fn secret_body(r: &SecretRecord) -> Secret {
    Secret {
        name: r.name.clone(),
        keys: r.keys(),
        created_at: timestamp(r.created_at),
        updated_at: timestamp(r.updated_at),
    }
}

fn cipher(s: &AppState) -> Result<&sless_secrets::Cipher, ApiError> {
    s.cipher
        .as_deref()
        .ok_or_else(|| ApiError::Unavailable("this server keeps no secrets".into()))
}

#[utoipa::path(
    put,
    path = "/v1/namespaces/{ns}/secrets/{name}",
    tag = "secrets",
    params(crate::openapi::NsNamePath),
    request_body(content = sless_api_types::schema::SecretPut, content_type = "application/json"),
    responses((status = 200, description = "Replaced", body = sless_api_types::Secret), (status = 201, description = "Created", body = sless_api_types::Secret), crate::openapi::WriteErrors)
)]
pub async fn put(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    caller.check(&ns)?;
    sless_core::validate_name("name", &name)?;
    let content_type = crate::media_type(req.headers());
    if content_type != "application/json" {
        return Err(ApiError::UnsupportedMediaType(
            "expected Content-Type: application/json".into(),
        ));
    }
    let bytes = read_limited(req, MAX_SECRET_BODY, s.body_timeout).await?;
    // serde's messages may quote what they could not read: only the field is named.
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad(format!(
            "body is not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    let request: SecretBody = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let what = if e.inner().to_string().starts_with("unknown field") {
            "unknown field; a secret is {\"data\": {\"KEY\": \"value\", ...}}"
        } else {
            "must be a string"
        };
        if path.is_empty() || path == "." {
            ApiError::bad("body: must be {\"data\": {\"KEY\": \"value\", ...}}")
        } else {
            ApiError::bad(format!("{path}: {what}"))
        }
    })?;
    sless_core::secret::validate_data(&request.data)?;
    let cipher = cipher(&s)?;
    s.store.get_namespace(&ns).await?;
    let sealed = request
        .data
        .iter()
        .map(|(key, value)| {
            let slot = Slot {
                namespace: &ns,
                secret: &name,
                key,
            };
            (key.clone(), cipher.seal(slot, value.as_bytes()))
        })
        .collect();
    drop(request);
    let (record, created) = s.secret_store.put_secret(&ns, &name, sealed).await?;
    // Functions that use it run the new values (a rolling replacement), and those
    // that failed for want of it are tried again.
    let users = s.secret_store.secret_references(&ns, &name).await?;
    for function in &users.functions {
        s.controller.secret_changed(&ns, function);
    }
    // Queue triggers whose broker URL it holds reconnect with the new value.
    s.triggers.secret_changed(&ns, &name);
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, body(&secret_body(&record))?).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/secrets",
    tag = "secrets",
    params(crate::openapi::NsPath),
    responses((status = 200, description = "The namespace's secrets: names and keys, never values", body = sless_api_types::Items<sless_api_types::Secret>), crate::openapi::ReadErrors)
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    s.store.get_namespace(&ns).await?;
    let items = s
        .secret_store
        .list_secrets(&ns)
        .await?
        .iter()
        .map(secret_body)
        .collect();
    body(&Items::new(items))
}

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/secrets/{name}",
    tag = "secrets",
    params(crate::openapi::NsNamePath),
    responses((status = 200, description = "The secret's keys, never its values", body = sless_api_types::Secret), crate::openapi::ReadErrors)
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    body(&secret_body(&s.secret_store.get_secret(&ns, &name).await?))
}

#[utoipa::path(
    delete,
    path = "/v1/namespaces/{ns}/secrets/{name}",
    tag = "secrets",
    params(crate::openapi::NsNamePath),
    responses((status = 204, description = "Deleted"), crate::openapi::DeleteErrors)
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    caller.check(&ns)?;
    match s.secret_store.delete_secret(&ns, &name).await? {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(refs) => Err(ApiError::Conflict(format!(
            "secret {name:?} is still referenced by {refs}; remove those references first"
        ))),
    }
}

/// `400` naming the variable when a reference in `env` names a secret or key that
/// does not exist in `ns`.
pub(crate) async fn check_env_refs(
    s: &AppState,
    ns: &str,
    refs: &[(String, SecretRef)],
) -> Result<(), ApiError> {
    for (var, r) in refs {
        match s.secret_store.get_secret(ns, &r.secret).await {
            Ok(record) if record.sealed.contains_key(&r.key) => {}
            Ok(_) => {
                return Err(ApiError::bad(format!(
                    "env.{var}: secret {:?} has no key {:?}",
                    r.secret, r.key
                )));
            }
            Err(StoreError::NotFound { .. }) => {
                return Err(ApiError::bad(format!(
                    "env.{var}: secret {:?} does not exist in namespace {ns:?}",
                    r.secret
                )));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The references of an env, owned.
pub(crate) fn env_refs(env: &BTreeMap<String, EnvValue>) -> Vec<(String, SecretRef)> {
    sless_core::secret::env_refs(env)
        .map(|(var, r)| (var.to_string(), r.clone()))
        .collect()
}

/// The references a merge patch sets in `env` (entries that are not references
/// are left to the spec's own validation).
pub(crate) fn patch_refs(patch: &Value) -> Vec<(String, SecretRef)> {
    patch
        .get("env")
        .and_then(Value::as_object)
        .map(|env| {
            env.iter()
                .filter_map(
                    |(var, v)| match serde_json::from_value::<EnvValue>(v.clone()) {
                        Ok(EnvValue::Secret(r)) => Some((var.clone(), r)),
                        _ => None,
                    },
                )
                .collect()
        })
        .unwrap_or_default()
}
