//! Triggers: extra public HTTP routes to a function, cron schedules, and (later)
//! queue subscriptions. Type-specific rules that need a cron parser live with the
//! scheduler; everything else is checked here.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ValidationError;

/// The kind of a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TriggerKind {
    Http,
    Cron,
    Queue,
}

/// What a user asks for. Fields of other kinds than `type` must be absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerSpec {
    pub function: String,
    #[serde(rename = "type")]
    pub kind: TriggerKind,
    #[serde(default = "enabled_default")]
    pub enabled: bool,
    /// http: the route below `/t/{ns}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// http: allowed methods (default: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// cron: 5 fields, or 6 with seconds first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// cron: an IANA time zone (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// cron: the event passed to the handler (with `fired_at` added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<Value>,
    /// cron: start an instance this many seconds before each fire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prewarm_sec: Option<u32>,
    /// queue: `{"kind", "url", "topic"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Value>,
}

fn enabled_default() -> bool {
    true
}

/// Fields a client may set on a trigger.
pub const TRIGGER_FIELDS: &[&str] = &[
    "function",
    "type",
    "enabled",
    "path",
    "methods",
    "schedule",
    "timezone",
    "event",
    "prewarm_sec",
    "source",
];

const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

impl TriggerSpec {
    /// Checks the fields of the trigger's kind and fills defaults (`methods`:
    /// all, `timezone`: UTC, `event`: `{}`). The cron expression itself is parsed
    /// by the caller, which has the scheduler.
    pub fn validate(&mut self) -> Result<(), ValidationError> {
        crate::validate_name("function", &self.function)?;
        let foreign = |field: &str, present: bool| {
            if present {
                Err(ValidationError::new(
                    field,
                    format!("not a field of {:?} triggers", self.kind_name()),
                ))
            } else {
                Ok(())
            }
        };
        match self.kind {
            TriggerKind::Http => {
                foreign("schedule", self.schedule.is_some())?;
                foreign("timezone", self.timezone.is_some())?;
                foreign("event", self.event.is_some())?;
                foreign("prewarm_sec", self.prewarm_sec.is_some())?;
                foreign("source", self.source.is_some())?;
                let path = self
                    .path
                    .as_deref()
                    .ok_or_else(|| ValidationError::new("path", "required for http triggers"))?;
                self.path = Some(normalise_path(path)?);
                let methods = self
                    .methods
                    .get_or_insert_with(|| METHODS.iter().map(|m| m.to_string()).collect());
                if methods.is_empty() {
                    return Err(ValidationError::new(
                        "methods",
                        "must name at least one method",
                    ));
                }
                for m in methods.iter_mut() {
                    let upper = m.to_ascii_uppercase();
                    if !METHODS.contains(&upper.as_str()) {
                        return Err(ValidationError::new(
                            "methods",
                            format!("{m:?} is not one of {}", METHODS.join(", ")),
                        ));
                    }
                    *m = upper;
                }
                methods.sort();
                methods.dedup();
            }
            TriggerKind::Cron => {
                foreign("path", self.path.is_some())?;
                foreign("methods", self.methods.is_some())?;
                foreign("source", self.source.is_some())?;
                if self.schedule.as_deref().is_none_or(|s| s.trim().is_empty()) {
                    return Err(ValidationError::new(
                        "schedule",
                        "required for cron triggers",
                    ));
                }
                self.timezone.get_or_insert_with(|| "UTC".to_string());
                self.event
                    .get_or_insert_with(|| Value::Object(Default::default()));
                if self.prewarm_sec.is_some_and(|s| s > 3600) {
                    return Err(ValidationError::new(
                        "prewarm_sec",
                        "must be between 0 and 3600",
                    ));
                }
                self.prewarm_sec.get_or_insert(0);
            }
            TriggerKind::Queue => {
                return Err(ValidationError::new(
                    "type",
                    "queue triggers are not supported by this server yet",
                ));
            }
        }
        Ok(())
    }

    fn kind_name(&self) -> &'static str {
        match self.kind {
            TriggerKind::Http => "http",
            TriggerKind::Cron => "cron",
            TriggerKind::Queue => "queue",
        }
    }
}

/// `/orders/` → `/orders`; must start with `/`, no `..`, `//`, query or fragment.
fn normalise_path(path: &str) -> Result<String, ValidationError> {
    let bad = |why: &str| Err(ValidationError::new("path", format!("{path:?} {why}")));
    if !path.starts_with('/') {
        return bad("must start with '/'");
    }
    if path.contains(['?', '#', ' ', '\\']) || path.contains("//") {
        return bad("may not contain '?', '#', spaces, backslashes or '//'");
    }
    if path.split('/').any(|seg| seg == ".." || seg == ".") {
        return bad("may not contain '.' or '..' segments");
    }
    if path.len() > 512 {
        return bad("is longer than 512 characters");
    }
    let trimmed = path.trim_end_matches('/');
    Ok(if trimmed.is_empty() {
        "/".to_string()
    } else {
        trimmed.to_string()
    })
}

/// What the platform reports about a trigger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TriggerStatus {
    pub last_fired_at: Option<DateTime<Utc>>,
    pub next_fire_at: Option<DateTime<Utc>>,
    pub last_result: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> Result<TriggerSpec, String> {
        let mut s: TriggerSpec = serde_json::from_value(v).map_err(|e| e.to_string())?;
        s.validate().map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn http_defaults_and_normalisation() {
        let s = spec(json!({"function": "f", "type": "http", "path": "/orders/", "methods": ["post", "GET", "get"]})).unwrap();
        assert_eq!(s.path.as_deref(), Some("/orders"));
        assert_eq!(s.methods.unwrap(), vec!["GET", "POST"]);
        assert!(s.enabled);
        let all = spec(json!({"function": "f", "type": "http", "path": "/"})).unwrap();
        assert_eq!(all.methods.unwrap().len(), METHODS.len());
    }

    #[test]
    fn cron_defaults() {
        let s = spec(json!({"function": "f", "type": "cron", "schedule": "*/5 * * * *"})).unwrap();
        assert_eq!(s.timezone.as_deref(), Some("UTC"));
        assert_eq!(s.event, Some(json!({})));
        assert_eq!(s.prewarm_sec, Some(0));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({"function": "f", "type": "http"}), "path:"),
            (
                json!({"function": "f", "type": "http", "path": "orders"}),
                "path:",
            ),
            (
                json!({"function": "f", "type": "http", "path": "/a/../b"}),
                "path:",
            ),
            (
                json!({"function": "f", "type": "http", "path": "/a", "methods": ["BREW"]}),
                "methods:",
            ),
            (
                json!({"function": "f", "type": "http", "path": "/a", "schedule": "* * * * *"}),
                "schedule:",
            ),
            (json!({"function": "f", "type": "cron"}), "schedule:"),
            (
                json!({"function": "f", "type": "cron", "schedule": "* * * * *", "path": "/x"}),
                "path:",
            ),
            (
                json!({"function": "F", "type": "cron", "schedule": "* * * * *"}),
                "function:",
            ),
            (
                json!({"function": "f", "type": "queue", "source": {}}),
                "type:",
            ),
        ];
        for (v, field) in cases {
            let err = spec(v.clone()).unwrap_err();
            assert!(err.starts_with(field), "{v}: {err}");
        }
        assert!(spec(json!({"function": "f", "type": "ftp"})).is_err());
        assert!(spec(json!({"function": "f", "type": "http", "path": "/", "colour": 1})).is_err());
    }
}
