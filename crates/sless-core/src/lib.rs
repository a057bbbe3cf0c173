//! Domain types of sless (functions, runtimes, names) and their validation rules.
//!
//! This crate does no IO: everything here is plain data and pure functions, so the
//! rules of the API contract are stated (and tested) once.

pub mod backoff;
pub mod delivery;
pub mod device;
pub mod function;
pub mod invocation;
pub mod job;
pub mod name;
pub mod patch;
pub mod quota;
pub mod runtime;
pub mod secret;
pub mod trigger;

pub use backoff::Backoff;
pub use delivery::{
    CallPhase, DeadLetter, DeadLetterSource, DeliveryPolicy, EventShape, MqttVersion, Ordering,
    QueueKind, QueueSource, StartFrom,
};
pub use device::DeviceSpec;
pub use function::{FunctionSpec, FunctionStatus, InstanceCounts, NetworkMode, Phase};
pub use job::{JobPhase, JobSpec, JobStatus};
pub use name::validate_name;
pub use quota::{Quota, QuotaExceeded, QuotaKind, QuotaOverrides};
pub use runtime::{GO_BINARY, Runtime, RuntimeFamily};
pub use secret::{EnvValue, SecretRef};
pub use trigger::{
    ConnectionState, DeliveryCounters, MissedRuns, TriggerFields, TriggerKind, TriggerResult,
    TriggerSpec, TriggerStatus, TriggerType,
};

/// A validation failure: which field is wrong and why, in words a user can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// The offending field, as it is spelled in the API (`memory_mb`, `env.FOO`).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Decoding as the API does it, for the tests of the spec modules.
#[cfg(test)]
pub(crate) mod tests_support {
    /// Decodes `v`, naming the offending field as `path: message`.
    pub fn decode<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, String> {
        serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            if path.is_empty() || path == "." {
                inner
            } else {
                format!("{path}: {inner}")
            }
        })
    }
}
