//! Functions: the user-editable spec with its defaults and limits, and the status
//! the platform reports back.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{EnvValue, Runtime, RuntimeFamily, ValidationError};

/// What a user asks for. Every field but `runtime` has the contract's default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionSpec {
    /// Checked as it is decoded: an unknown runtime is an error naming `runtime`.
    pub runtime: Runtime,
    #[serde(default)]
    pub entrypoint: String,
    /// Plain values, or references to a key of a secret of the namespace.
    #[serde(default)]
    pub env: BTreeMap<String, EnvValue>,
    #[serde(default = "defaults::memory_mb")]
    pub memory_mb: u32,
    /// CPU time per instance in millicores (1000 = one core's worth per period).
    #[serde(default = "defaults::cpu")]
    pub cpu: u32,
    #[serde(default = "defaults::timeout_sec")]
    pub timeout_sec: u32,
    #[serde(default)]
    pub min_instances: u32,
    #[serde(default = "defaults::max_instances")]
    pub max_instances: u32,
    #[serde(default = "defaults::concurrency")]
    pub concurrency: u32,
    #[serde(default = "defaults::idle_timeout_sec")]
    pub idle_timeout_sec: u32,
    #[serde(default)]
    pub paused: bool,
    #[serde(default)]
    pub private: bool,
    /// What the function's instances may reach (see [`NetworkMode`]).
    #[serde(default)]
    pub network: NetworkMode,
    /// The delivery policy of the function's async calls (default: the contract's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<crate::DeliveryPolicy>,
}

/// The network a function's instances get.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// The outside world (private ranges included), but not the host at any of its
    /// addresses and not other instances.
    #[default]
    Outbound,
    /// No network at all (loopback inside the instance only).
    None,
    /// The host's network, unfiltered; only an admin may choose it unless the server
    /// allows it for everyone.
    Host,
}

impl NetworkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::Outbound => "outbound",
            NetworkMode::None => "none",
            NetworkMode::Host => "host",
        }
    }
}

/// A function's (and a self-contained job's) memory limit when its spec says none, in MiB.
pub const DEFAULT_MEMORY_MB: u32 = 128;

/// A function's CPU limit when its spec says none: one CPU, in millicores.
pub const DEFAULT_CPU_MILLICORES: u32 = 1000;

mod defaults {
    pub fn memory_mb() -> u32 {
        super::DEFAULT_MEMORY_MB
    }
    pub fn cpu() -> u32 {
        super::DEFAULT_CPU_MILLICORES
    }
    pub fn timeout_sec() -> u32 {
        30
    }
    pub fn max_instances() -> u32 {
        10
    }
    pub fn concurrency() -> u32 {
        16
    }
    pub fn idle_timeout_sec() -> u32 {
        60
    }
}

/// Fields of [`FunctionSpec`] a client may set, for rejecting unknown ones with a named error.
pub const SPEC_FIELDS: &[&str] = &[
    "runtime",
    "entrypoint",
    "env",
    "memory_mb",
    "cpu",
    "timeout_sec",
    "min_instances",
    "max_instances",
    "concurrency",
    "idle_timeout_sec",
    "paused",
    "private",
    "network",
    "delivery",
];

impl FunctionSpec {
    /// Checks every field against the contract's limits and fills in the default
    /// entrypoint. Returns the runtime (a copy of `self.runtime`) for convenience.
    pub fn validate(&mut self) -> Result<Runtime, ValidationError> {
        let runtime = self.runtime.clone();
        if self.entrypoint.is_empty() {
            self.entrypoint = runtime.family.default_entrypoint().to_string();
        }
        validate_entrypoint(runtime.family, &self.entrypoint)?;
        for key in self.env.keys() {
            let valid = !key.is_empty()
                && !key.starts_with(|c: char| c.is_ascii_digit())
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(ValidationError::new(
                    format!("env.{key}"),
                    "environment variable names are letters, digits and '_', not starting with a digit",
                ));
            }
            if is_loader_variable(key) {
                return Err(ValidationError::new(
                    format!("env.{key}"),
                    "variables read by the dynamic loader and C library (LD_*, GLIBC_TUNABLES, \
                     GCONV_PATH, LOCPATH, ...) are reserved: the sandbox's privileged helpers \
                     start with the function's environment",
                ));
            }
            if key.starts_with("SLESS_") {
                return Err(ValidationError::new(
                    format!("env.{key}"),
                    "the SLESS_ prefix is reserved",
                ));
            }
        }
        if let Some((key, _)) = self
            .env
            .iter()
            .find(|(_, v)| v.as_plain().is_some_and(|v| v.contains('\0')))
        {
            return Err(ValidationError::new(
                format!("env.{key}"),
                "values may not contain NUL bytes",
            ));
        }
        validate_env_size(&self.env)?;
        crate::secret::validate_env_refs(&self.env)?;
        range("memory_mb", self.memory_mb, 32, 4096)?;
        range("cpu", self.cpu, 50, 8000)?;
        range("timeout_sec", self.timeout_sec, 0, 900)?;
        range("concurrency", self.concurrency, 1, 10_000)?;
        range("idle_timeout_sec", self.idle_timeout_sec, 1, 86_400)?;
        range("min_instances", self.min_instances, 0, 1000)?;
        let floor = self.min_instances.max(1);
        if self.max_instances < floor {
            return Err(ValidationError::new(
                "max_instances",
                format!(
                    "must be at least max(1, min_instances) = {floor}, got {}",
                    self.max_instances
                ),
            ));
        }
        range("max_instances", self.max_instances, floor, 1000)?;
        if let Some(delivery) = &self.delivery {
            delivery.validate("delivery")?;
        }
        Ok(runtime)
    }
}

/// The most a function's (or job's) `env` may hold: names plus values, in bytes.
///
/// A fraction of what `execve` accepts (128 KiB a string, 2 MiB in all by default), so
/// an instance always starts, with room left for the platform's own variables.
pub const ENV_MAX_BYTES: usize = 32 * 1024;

/// The most variables a function's `env` may hold.
pub const ENV_MAX_VARS: usize = 256;

fn validate_env_size(env: &BTreeMap<String, EnvValue>) -> Result<(), ValidationError> {
    if env.len() > ENV_MAX_VARS {
        return Err(ValidationError::new(
            "env",
            format!("at most {ENV_MAX_VARS} variables, got {}", env.len()),
        ));
    }
    let total: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > ENV_MAX_BYTES {
        return Err(ValidationError::new(
            "env",
            format!("at most {ENV_MAX_BYTES} bytes of names and values in total, got {total}"),
        ));
    }
    Ok(())
}

/// Names glibc's loader and C library act on before `main` (its list of variables
/// unsafe for privileged programs, less the harmless `TMPDIR`, `TZDIR` and resolver
/// ones). The sandbox's setup helpers run as root with the function's environment.
pub fn is_loader_variable(name: &str) -> bool {
    name.starts_with("LD_")
        || matches!(
            name,
            "GCONV_PATH"
                | "GETCONF_DIR"
                | "GLIBC_TUNABLES"
                | "HOSTALIASES"
                | "LOCPATH"
                | "MALLOC_TRACE"
                | "NIS_PATH"
                | "NLSPATH"
                | "RESOLV_HOST_CONF"
        )
}

fn range(field: &str, value: u32, lo: u32, hi: u32) -> Result<(), ValidationError> {
    if value < lo || value > hi {
        return Err(ValidationError::new(
            field,
            format!("must be between {lo} and {hi}, got {value}"),
        ));
    }
    Ok(())
}

fn validate_entrypoint(family: RuntimeFamily, entrypoint: &str) -> Result<(), ValidationError> {
    let ident = |s: &str| {
        !s.is_empty()
            && !s.starts_with(|c: char| c.is_ascii_digit())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    };
    let ok = match family {
        RuntimeFamily::Go => ident(entrypoint),
        RuntimeFamily::Custom => {
            !entrypoint.is_empty() && !entrypoint.contains("..") && !entrypoint.starts_with('/')
        }
        RuntimeFamily::Python3 | RuntimeFamily::Nodejs => match entrypoint.rsplit_once('.') {
            Some((module, func)) => {
                let module_ok = if family == RuntimeFamily::Python3 {
                    module.split('.').all(ident)
                } else {
                    module
                        .split('/')
                        .all(|seg| !seg.is_empty() && seg != ".." && seg != ".")
                        && !module.starts_with('/')
                };
                module_ok && ident(func)
            }
            None => false,
        },
    };
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(
            "entrypoint",
            format!(
                "{entrypoint:?} is not of the form module.function (for example handler.handle)"
            ),
        ))
    }
}

/// The lifecycle phase of a function's latest revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Phase {
    #[default]
    Pending,
    Building,
    Ready,
    Failed,
}

/// How many instances a function has right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct InstanceCounts {
    pub ready: u32,
    pub starting: u32,
}

/// What the platform reports about a function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FunctionStatus {
    pub phase: Phase,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub revision: u64,
    #[serde(default)]
    pub code_sha256: Option<String>,
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub instances: InstanceCounts,
    #[serde(default)]
    pub last_built_at: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> Result<FunctionSpec, String> {
        let mut s: FunctionSpec = crate::tests_support::decode(json)?;
        s.validate().map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn defaults_follow_the_contract() {
        let s = spec(serde_json::json!({"runtime": "python3"})).unwrap();
        assert_eq!(s.entrypoint, "handler.handle");
        assert_eq!((s.memory_mb, s.cpu, s.timeout_sec), (128, 1000, 30));
        assert_eq!(
            (
                s.min_instances,
                s.max_instances,
                s.concurrency,
                s.idle_timeout_sec
            ),
            (0, 10, 16, 60)
        );
        assert!(!s.paused && !s.private);
        assert_eq!(s.network, NetworkMode::Outbound);
        let go = spec(serde_json::json!({"runtime": "go1.23"})).unwrap();
        assert_eq!(go.entrypoint, "Handle");
    }

    #[test]
    fn network_modes_are_the_contract_words() {
        for (word, mode) in [
            ("outbound", NetworkMode::Outbound),
            ("none", NetworkMode::None),
            ("host", NetworkMode::Host),
        ] {
            let s = spec(serde_json::json!({"runtime": "python3", "network": word})).unwrap();
            assert_eq!(s.network, mode);
            assert_eq!(mode.as_str(), word);
            assert_eq!(serde_json::to_value(s).unwrap()["network"], word);
        }
        let err = spec(serde_json::json!({"runtime": "python3", "network": "bridge"})).unwrap_err();
        assert!(err.contains("unknown variant `bridge`"), "{err}");
        assert!(SPEC_FIELDS.contains(&"network"));
    }

    #[test]
    fn each_limit_names_its_field() {
        let cases = [
            (
                serde_json::json!({"runtime": "python3", "memory_mb": 16}),
                "memory_mb",
            ),
            (
                serde_json::json!({"runtime": "python3", "memory_mb": 5000}),
                "memory_mb",
            ),
            (serde_json::json!({"runtime": "python3", "cpu": 49}), "cpu"),
            (
                serde_json::json!({"runtime": "python3", "cpu": 8001}),
                "cpu",
            ),
            (
                serde_json::json!({"runtime": "python3", "timeout_sec": 901}),
                "timeout_sec",
            ),
            (
                serde_json::json!({"runtime": "python3", "concurrency": 0}),
                "concurrency",
            ),
            (
                serde_json::json!({"runtime": "python3", "idle_timeout_sec": 0}),
                "idle_timeout_sec",
            ),
            (
                serde_json::json!({"runtime": "python3", "min_instances": 3, "max_instances": 2}),
                "max_instances",
            ),
            (
                serde_json::json!({"runtime": "python3", "max_instances": 0}),
                "max_instances",
            ),
            (
                serde_json::json!({"runtime": "python3", "entrypoint": "handler"}),
                "entrypoint",
            ),
            (
                serde_json::json!({"runtime": "python3", "env": {"1A": "x"}}),
                "env.1A",
            ),
            (serde_json::json!({"runtime": "cobol"}), "runtime"),
        ];
        for (json, field) in cases {
            let err = spec(json.clone()).unwrap_err();
            assert!(err.starts_with(&format!("{field}:")), "{json}: {err}");
        }
    }

    #[test]
    fn env_is_bounded_in_size_and_count() {
        let value = |n: usize| "x".repeat(n);
        let at_limit =
            serde_json::json!({"runtime": "python3", "env": {"BIG": value(ENV_MAX_BYTES - 3)}});
        assert!(spec(at_limit).is_ok());
        let over =
            serde_json::json!({"runtime": "python3", "env": {"BIG": value(ENV_MAX_BYTES - 2)}});
        let err = spec(over).unwrap_err();
        assert!(err.starts_with("env: at most 32768 bytes"), "{err}");
        assert!(err.ends_with("got 32769"), "{err}");
        let many: serde_json::Map<String, serde_json::Value> = (0..=ENV_MAX_VARS)
            .map(|i| (format!("V{i}"), serde_json::json!("1")))
            .collect();
        let err = spec(serde_json::json!({"runtime": "python3", "env": many})).unwrap_err();
        assert!(err.starts_with("env: at most 256 variables"), "{err}");
    }

    #[test]
    fn loader_variables_are_reserved() {
        for name in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "GLIBC_TUNABLES",
            "GCONV_PATH",
            "LOCPATH",
        ] {
            let err = spec(serde_json::json!({"runtime": "python3", "env": {name: "/code/x"}}))
                .unwrap_err();
            assert!(err.starts_with(&format!("env.{name}: ")), "{err}");
        }
        for name in ["TMPDIR", "TZ", "LDAP_URI", "OLD_LD_PATH"] {
            assert!(spec(serde_json::json!({"runtime": "python3", "env": {name: "x"}})).is_ok());
        }
    }

    #[test]
    fn zero_timeout_means_no_limit_and_is_valid() {
        assert!(spec(serde_json::json!({"runtime": "nodejs20", "timeout_sec": 0})).is_ok());
    }
}
