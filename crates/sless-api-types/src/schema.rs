//! OpenAPI schemas for the shapes whose types live in `sless-core` (which does not
//! depend on utoipa) or whose serde form no derive describes: the function and job
//! specs, and the trigger with its spec flattened in. Written as JSON Schema, each
//! checked against the golden bodies in `tests.rs`.

use serde_json::{Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::Schema;

/// A schema from its JSON form.
pub fn from_json(schema: Value) -> RefOr<Schema> {
    // The schemas are constants of this crate; a test decodes every one of them.
    #[allow(clippy::expect_used)]
    serde_json::from_value(schema).expect("a valid OpenAPI schema")
}

/// A DNS label, as `sless_core::validate_name` accepts it.
pub const NAME_PATTERN: &str = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$";

/// A runtime name, as `sless_core::Runtime::parse` accepts it: a family and an
/// optional version of digits and dots.
pub const RUNTIME_PATTERN: &str = r"^(python3\.?(\.?[0-9]+)*|python\.?(\.[0-9]+|[013-9][0-9]*)(\.?[0-9]+)*|(nodejs|node|go)\.?(\.?[0-9]+)*|custom\.?)$";

/// A secret's key, as `sless_core::secret::validate_key` accepts it: letters, digits,
/// `_`, `.` and `-`, starting with a letter or `_`, never two dots in a row.
pub const SECRET_KEY_PATTERN: &str = r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*\.?$";

/// A device's labels, as `sless_core::DeviceSpec::validate` accepts them: at most 64,
/// keys of 1 to 253 and values of at most 253 characters, without control characters.
fn device_labels() -> Value {
    let text = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";
    json!({
        "type": "object",
        "maxProperties": 64,
        "propertyNames": {"type": "string", "minLength": 1, "maxLength": 253, "pattern": text},
        "additionalProperties": {"type": "string", "maxLength": 253, "pattern": text}
    })
}

macro_rules! json_schema {
    ($(#[$doc:meta])* $name:ident, $schema:expr) => {
        $(#[$doc])*
        pub struct $name;

        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                from_json($schema)
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

/// `env`: each value a string, or a reference to a key of a secret of the namespace.
fn env_schema() -> Value {
    json!({"type": "object", "additionalProperties": {"oneOf": [
        {"type": "string"},
        {"type": "object", "required": ["secret", "key"], "additionalProperties": false,
         "properties": {"secret": {"type": "string", "pattern": NAME_PATTERN}, "key": {"type": "string"}}}
    ]}})
}

fn function_spec_properties() -> Value {
    json!({
        "runtime": {"type": "string", "pattern": RUNTIME_PATTERN, "description": "python3, nodejs, go or custom; a version alias such as python3.11 or nodejs20 is accepted"},
        "entrypoint": {"type": "string", "description": "python3/nodejs: module.function; go: an identifier; custom: empty"},
        "env": env_schema(),
        "memory_mb": {"type": "integer", "minimum": 32, "maximum": 4096},
        "cpu": {"type": "integer", "minimum": 50, "maximum": 8000, "description": "millicores"},
        "timeout_sec": {"type": "integer", "minimum": 0, "maximum": 900},
        "min_instances": {"type": "integer", "minimum": 0, "maximum": 1000},
        "max_instances": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "at least max(1, min_instances)"},
        "concurrency": {"type": "integer", "minimum": 1, "maximum": 10000},
        "idle_timeout_sec": {"type": "integer", "minimum": 1, "maximum": 86400},
        "paused": {"type": "boolean"},
        "private": {"type": "boolean"},
        "network": {"type": "string", "enum": ["outbound", "none", "host"]}
    })
}

fn job_spec_properties() -> Value {
    json!({
        "function": {"type": "string", "pattern": NAME_PATTERN, "description": "the function the job runs (it must exist); absent for a self-contained job"},
        "runtime": {"type": "string", "pattern": RUNTIME_PATTERN, "description": "self-contained jobs: the runtime of the uploaded code"},
        "entrypoint": {"type": "string"},
        "env": env_schema(),
        "memory_mb": {"type": "integer", "minimum": 0},
        "event": {"type": null, "description": "the event the handler gets"},
        "run_id": {"type": "integer", "minimum": 0, "description": "raise it to run again; 0: do not run"},
        "timeout_sec": {"type": "integer", "minimum": 0},
        "max_attempts": {"type": "integer", "minimum": 0}
    })
}

fn trigger_spec_properties() -> Value {
    json!({
        "function": {"type": "string", "pattern": NAME_PATTERN, "description": "the function it calls (it must exist)"},
        "type": {"type": "string", "enum": ["http", "cron", "queue", "device"]},
        "enabled": {"type": "boolean"},
        "path": {"type": "string", "description": "http: the route below /t/{ns}"},
        "methods": {"type": "array", "items": {"type": "string"}, "description": "http"},
        "schedule": {"type": "string", "description": "cron: the schedule expression"},
        "timezone": {"type": "string", "description": "cron: an IANA time zone"},
        "event": {"type": null, "description": "cron: the event the handler gets"},
        "prewarm_sec": {"type": "integer", "minimum": 0, "description": "cron"},
        "source": {"type": "object", "description": "queue: {kind, url, topic}"},
        "devices": {"type": "string", "description": "device: \"*\", a device name or a glob of names"}
    })
}

json_schema!(
    /// A function's spec as the server answers it (`Function.spec`).
    FunctionSpecSchema,
    json!({"type": "object", "required": ["runtime"], "properties": function_spec_properties()})
);

json_schema!(
    /// A job's spec as the server answers it (`Job.spec`).
    JobSpecSchema,
    json!({"type": "object", "properties": job_spec_properties()})
);

/// A function; `spec` as the server fills it.
impl<S> utoipa::PartialSchema for crate::Function<S> {
    fn schema() -> RefOr<Schema> {
        from_json(json!({
            "type": "object",
            "required": ["name", "namespace", "spec", "status", "created_at", "updated_at"],
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "spec": {"$ref": "#/components/schemas/FunctionSpecSchema"},
                "status": {"$ref": "#/components/schemas/FunctionStatus"},
                "created_at": {"type": "string"},
                "updated_at": {"type": "string"}
            }
        }))
    }
}

impl<S> utoipa::ToSchema for crate::Function<S> {
    fn name() -> std::borrow::Cow<'static, str> {
        "Function".into()
    }
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        use utoipa::PartialSchema;
        schemas.push(("FunctionSpecSchema".into(), FunctionSpecSchema::schema()));
        schemas.push(("FunctionStatus".into(), crate::FunctionStatus::schema()));
        schemas.push(("InstanceCounts".into(), crate::InstanceCounts::schema()));
        schemas.push(("FunctionPhase".into(), crate::FunctionPhase::schema()));
    }
}

/// A job; `spec` as the server fills it.
impl<S> utoipa::PartialSchema for crate::Job<S> {
    fn schema() -> RefOr<Schema> {
        from_json(json!({
            "type": "object",
            "required": ["name", "namespace", "spec", "status", "code_sha256", "created_at", "updated_at"],
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "spec": {"$ref": "#/components/schemas/JobSpecSchema"},
                "status": {"$ref": "#/components/schemas/JobStatus"},
                "code_sha256": {"type": ["string", "null"], "description": "self-contained jobs: SHA-256 of the uploaded archive"},
                "created_at": {"type": "string"},
                "updated_at": {"type": "string"}
            }
        }))
    }
}

impl<S> utoipa::ToSchema for crate::Job<S> {
    fn name() -> std::borrow::Cow<'static, str> {
        "Job".into()
    }
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        use utoipa::PartialSchema;
        schemas.push(("JobSpecSchema".into(), JobSpecSchema::schema()));
        schemas.push(("JobStatus".into(), crate::JobStatus::schema()));
        schemas.push(("JobPhase".into(), crate::JobPhase::schema()));
    }
}

/// The trigger: its spec's fields at the top level, plus name, namespace, status, times.
impl utoipa::PartialSchema for crate::Trigger {
    fn schema() -> RefOr<Schema> {
        let mut properties = trigger_spec_properties();
        if let Some(p) = properties.as_object_mut() {
            p.insert("name".into(), json!({"type": "string"}));
            p.insert("namespace".into(), json!({"type": "string"}));
            p.insert(
                "status".into(),
                json!({"$ref": "#/components/schemas/TriggerStatus"}),
            );
            p.insert("created_at".into(), json!({"type": "string"}));
            p.insert("updated_at".into(), json!({"type": "string"}));
        }
        from_json(json!({
            "type": "object",
            "required": ["name", "namespace", "function", "type", "enabled", "status", "created_at", "updated_at"],
            "properties": properties
        }))
    }
}

impl utoipa::ToSchema for crate::Trigger {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        use utoipa::PartialSchema;
        schemas.push(("TriggerStatus".into(), crate::TriggerStatus::schema()));
    }
}

json_schema!(
    /// `POST .../functions`: the name and the spec's fields.
    FunctionCreate,
    {
        let mut p = function_spec_properties();
        if let Some(p) = p.as_object_mut() {
            p.insert("name".into(), json!({"type": "string", "pattern": NAME_PATTERN}));
        }
        json!({"type": "object", "required": ["name", "runtime"], "additionalProperties": false, "properties": p})
    }
);

json_schema!(
    /// `PATCH .../functions/{name}`: a JSON merge patch of the spec.
    FunctionPatch,
    json!({"type": "object", "additionalProperties": false, "properties": function_spec_properties()})
);

json_schema!(
    /// `POST .../triggers`: the name and the spec's fields.
    TriggerCreate,
    {
        let mut p = trigger_spec_properties();
        if let Some(p) = p.as_object_mut() {
            p.insert("name".into(), json!({"type": "string", "pattern": NAME_PATTERN}));
        }
        json!({"type": "object", "required": ["name", "function", "type"], "additionalProperties": false, "properties": p})
    }
);

json_schema!(
    /// `PATCH .../triggers/{name}`: a JSON merge patch of the spec.
    TriggerPatch,
    json!({"type": "object", "additionalProperties": false, "properties": trigger_spec_properties()})
);

json_schema!(
    /// `POST .../jobs`: the name and the spec's fields.
    JobCreate,
    {
        let mut p = job_spec_properties();
        if let Some(p) = p.as_object_mut() {
            p.insert("name".into(), json!({"type": "string", "pattern": NAME_PATTERN}));
        }
        json!({"type": "object", "required": ["name"], "additionalProperties": false, "properties": p})
    }
);

json_schema!(
    /// `PATCH .../jobs/{name}`: a JSON merge patch of the spec.
    JobPatch,
    json!({"type": "object", "additionalProperties": false, "properties": job_spec_properties()})
);

json_schema!(
    /// `POST /v1/tokens`.
    TokenCreate,
    json!({
        "type": "object",
        "required": ["namespace"],
        "additionalProperties": false,
        "properties": {"namespace": {"type": "string", "pattern": NAME_PATTERN}}
    })
);

json_schema!(
    /// `PUT .../secrets/{name}`: every key of the secret with its value.
    SecretPut,
    json!({
        "type": "object",
        "required": ["data"],
        "additionalProperties": false,
        "properties": {"data": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 256,
            "propertyNames": {"type": "string", "pattern": SECRET_KEY_PATTERN, "maxLength": 253},
            "additionalProperties": {"type": "string", "pattern": "^[^\\u0000]*$", "maxLength": 16384}
        }}
    })
);

json_schema!(
    /// `POST .../devices`: the device's name, and optionally labels and whether it may
    /// connect.
    DeviceCreate,
    json!({
        "type": "object",
        "required": ["name"],
        "additionalProperties": false,
        "properties": {
            "name": {"type": "string", "pattern": NAME_PATTERN, "maxLength": 63},
            "labels": device_labels(),
            "enabled": {"type": "boolean"}
        }
    })
);

json_schema!(
    /// `PATCH .../devices/{name}`: a merge patch of labels and enabled (`null` resets
    /// a field: no labels, enabled).
    DevicePatch,
    {
        let mut labels = device_labels();
        labels["type"] = json!(["object", "null"]);
        json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "labels": labels,
                "enabled": {"type": ["boolean", "null"]}
            }
        })
    }
);

json_schema!(
    /// `PUT /v1/namespaces/{ns}`: optionally the namespace's quotas (admins only);
    /// a field set to `null` goes back to the server's default.
    NamespacePut,
    {
        let q = json!({"type": ["integer", "null"], "minimum": 0});
        json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {"quota": {"type": "object", "additionalProperties": false, "properties": {
                "functions": q, "instances": q, "memory_mb": q, "invocations_per_sec": q,
                "queued_calls": q, "devices": q, "storage_mb": q
            }}}
        })
    }
);

json_schema!(
    /// A code upload: `multipart/form-data` with the zip archive in field `code`.
    CodeUpload,
    json!({
        "type": "object",
        "required": ["code"],
        "properties": {"code": {"type": "string", "format": "binary"}}
    })
);

json_schema!(
    /// A zip archive sent as the whole body.
    ZipArchive,
    json!({"type": "string", "format": "binary"})
);

#[cfg(test)]
mod tests {
    use utoipa::PartialSchema;

    #[test]
    fn every_hand_written_schema_decodes() {
        super::FunctionSpecSchema::schema();
        super::JobSpecSchema::schema();
        crate::Function::<serde_json::Value>::schema();
        crate::Job::<serde_json::Value>::schema();
        crate::Trigger::schema();
        super::SecretPut::schema();
        super::NamespacePut::schema();
        super::DeviceCreate::schema();
        super::DevicePatch::schema();
        super::FunctionCreate::schema();
        super::FunctionPatch::schema();
        super::TriggerCreate::schema();
        super::TriggerPatch::schema();
        super::JobCreate::schema();
        super::JobPatch::schema();
        super::TokenCreate::schema();
        super::CodeUpload::schema();
        super::ZipArchive::schema();
    }
}
