//! Jobs: one-shot runs of a function, or of self-contained code, with an event.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{EnvValue, Runtime, ValidationError};

/// What a user asks for: either `function`, or `runtime` (+ code uploaded later).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// Self-contained jobs: checked as it is decoded, like a function's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, EnvValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u32>,
    #[serde(default = "empty_event")]
    pub event: Value,
    #[serde(default = "one")]
    pub run_id: u64,
    /// Bounds each attempt; default: the function's (self-contained: 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_sec: Option<u32>,
    #[serde(default = "one_u32")]
    pub max_attempts: u32,
}

fn empty_event() -> Value {
    Value::Object(Default::default())
}
fn one() -> u64 {
    1
}
fn one_u32() -> u32 {
    1
}

/// Fields a client may set on a job.
pub const JOB_FIELDS: &[&str] = &[
    "function",
    "runtime",
    "entrypoint",
    "env",
    "memory_mb",
    "event",
    "run_id",
    "timeout_sec",
    "max_attempts",
];

impl JobSpec {
    /// Checks the fields; for a self-contained job returns its parsed runtime.
    pub fn validate(&mut self) -> Result<Option<Runtime>, ValidationError> {
        if let Some(t) = self.timeout_sec
            && t > 86_400
        {
            return Err(ValidationError::new(
                "timeout_sec",
                format!("must be between 0 and 86400, got {t}"),
            ));
        }
        if self.max_attempts == 0 || self.max_attempts > 100 {
            return Err(ValidationError::new(
                "max_attempts",
                format!("must be between 1 and 100, got {}", self.max_attempts),
            ));
        }
        match (&self.function, &self.runtime) {
            (Some(f), None) => {
                crate::validate_name("function", f)?;
                for (field, set) in [
                    ("entrypoint", self.entrypoint.is_some()),
                    ("env", !self.env.is_empty()),
                    ("memory_mb", self.memory_mb.is_some()),
                ] {
                    if set {
                        return Err(ValidationError::new(
                            field,
                            "only for self-contained jobs (with runtime); a function job uses its function's",
                        ));
                    }
                }
                Ok(None)
            }
            (None, Some(runtime)) => {
                // Reuse the function rules for runtime, entrypoint, env and memory.
                let mut as_fn: crate::FunctionSpec = serde_json::from_value(serde_json::json!({
                    "runtime": runtime,
                    "entrypoint": self.entrypoint.clone().unwrap_or_default(),
                    "env": self.env,
                    "memory_mb": self.memory_mb.unwrap_or(crate::function::DEFAULT_MEMORY_MB),
                }))
                .map_err(|e| ValidationError::new("body", e.to_string()))?;
                let runtime = as_fn.validate()?;
                self.entrypoint = Some(as_fn.entrypoint);
                Ok(Some(runtime))
            }
            (Some(_), Some(_)) => Err(ValidationError::new(
                "function",
                "give either function or runtime, not both",
            )),
            (None, None) => Err(ValidationError::new(
                "function",
                "required (or runtime, for a self-contained job)",
            )),
        }
    }
}

/// The lifecycle phase of a job's current run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum JobPhase {
    #[default]
    Pending,
    Building,
    Running,
    Succeeded,
    Failed,
    Skipped,
}

impl JobPhase {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobPhase::Succeeded | JobPhase::Failed | JobPhase::Skipped
        )
    }
}

/// What the platform reports about a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct JobStatus {
    pub phase: JobPhase,
    pub run_id: u64,
    pub result: Option<Value>,
    pub message: String,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub attempts: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> Result<JobSpec, String> {
        let mut s: JobSpec = crate::tests_support::decode(v)?;
        s.validate().map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn function_jobs_default_sensibly() {
        let s = spec(json!({"function": "hello"})).unwrap();
        assert_eq!(
            (s.run_id, s.max_attempts, s.event.clone()),
            (1, 1, json!({}))
        );
        let s = spec(json!({"runtime": "python3"})).unwrap();
        assert_eq!(s.entrypoint.as_deref(), Some("handler.handle"));
    }

    #[test]
    fn errors_name_the_field() {
        for (v, field) in [
            (json!({}), "function:"),
            (json!({"function": "a", "runtime": "python3"}), "function:"),
            (json!({"function": "a", "max_attempts": 0}), "max_attempts:"),
            (json!({"function": "a", "env": {"A": "b"}}), "env:"),
            (json!({"runtime": "cobol"}), "runtime:"),
            (json!({"runtime": "python3", "memory_mb": 1}), "memory_mb:"),
            (
                json!({"function": "a", "timeout_sec": 100000}),
                "timeout_sec:",
            ),
        ] {
            let err = spec(v.clone()).unwrap_err();
            assert!(err.starts_with(field), "{v}: {err}");
        }
    }
}
