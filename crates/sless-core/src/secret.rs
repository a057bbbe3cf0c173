//! Secrets: named sets of key/value pairs a function reads from its environment
//! (`{"secret": NAME, "key": KEY}` in `env`) and from `/run/secrets/{secret}/{key}`.
//! The rules for names, keys and sizes; the values themselves never pass through here.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use crate::ValidationError;

/// The most bytes one value may hold.
pub const SECRET_VALUE_MAX_BYTES: usize = 64 * 1024;
/// The most bytes of keys and values one secret may hold.
pub const SECRET_MAX_BYTES: usize = 1024 * 1024;
/// The most keys one secret may hold.
pub const SECRET_MAX_KEYS: usize = 256;
/// The longest key.
pub const SECRET_KEY_MAX_LEN: usize = 253;

/// A value in a function's or job's `env`: a plain string, or a reference to one key
/// of a secret of the same namespace. On the wire a plain value stays a JSON string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub enum EnvValue {
    Plain(String),
    Secret(SecretRef),
}

/// `{"secret": NAME, "key": KEY}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    pub secret: String,
    pub key: String,
}

impl EnvValue {
    /// The plain value, `None` for a reference.
    pub fn as_plain(&self) -> Option<&str> {
        match self {
            EnvValue::Plain(s) => Some(s),
            EnvValue::Secret(_) => None,
        }
    }

    pub fn as_secret(&self) -> Option<&SecretRef> {
        match self {
            EnvValue::Plain(_) => None,
            EnvValue::Secret(r) => Some(r),
        }
    }

    /// The bytes it counts for in the env's size limit (a reference: its names).
    pub fn len(&self) -> usize {
        match self {
            EnvValue::Plain(s) => s.len(),
            EnvValue::Secret(r) => r.secret.len() + r.key.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<&str> for EnvValue {
    fn from(s: &str) -> Self {
        EnvValue::Plain(s.to_string())
    }
}

impl From<String> for EnvValue {
    fn from(s: String) -> Self {
        EnvValue::Plain(s)
    }
}

impl<'de> Deserialize<'de> for EnvValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = EnvValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"a string or {"secret": NAME, "key": KEY}"#)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<EnvValue, E> {
                Ok(EnvValue::Plain(v.to_string()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<EnvValue, E> {
                Ok(EnvValue::Plain(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<EnvValue, A::Error> {
                SecretRef::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(EnvValue::Secret)
            }
        }
        d.deserialize_any(V)
    }
}

/// A resolved secret value on its way to an instance: shown as `<redacted>` by
/// `Debug`, so no log line or error that formats a deployment can carry it.
#[derive(Clone, PartialEq, Eq)]
pub struct Sensitive(std::sync::Arc<String>);

impl Sensitive {
    pub fn new(value: String) -> Self {
        Sensitive(std::sync::Arc::new(value))
    }

    /// The value itself; hand it only to the instance.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The secret references of an `env`: `(variable, reference)`.
pub fn env_refs(env: &BTreeMap<String, EnvValue>) -> impl Iterator<Item = (&str, &SecretRef)> {
    env.iter()
        .filter_map(|(k, v)| v.as_secret().map(|r| (k.as_str(), r)))
}

/// The names of the secrets an `env` references.
pub fn referenced_secrets(env: &BTreeMap<String, EnvValue>) -> BTreeSet<String> {
    env_refs(env).map(|(_, r)| r.secret.clone()).collect()
}

/// Checks the names in the references of an `env` (`env.VAR.secret`, `env.VAR.key`).
pub fn validate_env_refs(env: &BTreeMap<String, EnvValue>) -> Result<(), ValidationError> {
    for (var, r) in env_refs(env) {
        crate::validate_name(&format!("env.{var}.secret"), &r.secret)?;
        validate_key(&format!("env.{var}.key"), &r.key)?;
    }
    Ok(())
}

/// A secret's key: like an environment variable name, also `.` and `-`
/// (`[A-Za-z_][A-Za-z0-9_.-]*`); it is a file name under `/run/secrets/{secret}/`.
pub fn validate_key(field: &str, key: &str) -> Result<(), ValidationError> {
    let valid = !key.is_empty()
        && key.len() <= SECRET_KEY_MAX_LEN
        && key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && !key.contains("..");
    if valid {
        Ok(())
    } else {
        Err(ValidationError::new(
            field,
            format!(
                "keys are letters, digits, '_', '.' and '-', starting with a letter or '_', \
                 without '..', at most {SECRET_KEY_MAX_LEN} characters"
            ),
        ))
    }
}

/// Checks the `data` of a secret: at least one key, every key valid, values within bounds.
/// Messages name the field (`data.KEY`) and never include a value.
pub fn validate_data(data: &BTreeMap<String, String>) -> Result<(), ValidationError> {
    if data.is_empty() {
        return Err(ValidationError::new("data", "at least one key is required"));
    }
    if data.len() > SECRET_MAX_KEYS {
        return Err(ValidationError::new(
            "data",
            format!("at most {SECRET_MAX_KEYS} keys, got {}", data.len()),
        ));
    }
    let mut total = 0;
    for (key, value) in data {
        validate_key(&format!("data.{key}"), key)?;
        if value.len() > SECRET_VALUE_MAX_BYTES {
            return Err(ValidationError::new(
                format!("data.{key}"),
                format!(
                    "at most {SECRET_VALUE_MAX_BYTES} bytes per value, got {}",
                    value.len()
                ),
            ));
        }
        if value.contains('\0') {
            return Err(ValidationError::new(
                format!("data.{key}"),
                "values may not contain NUL bytes",
            ));
        }
        total += key.len() + value.len();
    }
    if total > SECRET_MAX_BYTES {
        return Err(ValidationError::new(
            "data",
            format!("at most {SECRET_MAX_BYTES} bytes of keys and values in total, got {total}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests_support::decode;
    use serde_json::json;

    #[test]
    fn env_values_are_strings_or_references() {
        let env: BTreeMap<String, EnvValue> =
            decode(json!({"A": "x", "B": {"secret": "db", "key": "dsn"}})).unwrap();
        assert_eq!(env["A"], EnvValue::Plain("x".into()));
        assert_eq!(
            env["B"].as_secret(),
            Some(&SecretRef {
                secret: "db".into(),
                key: "dsn".into()
            })
        );
        // Plain values stay strings on the wire.
        assert_eq!(
            serde_json::to_value(&env).unwrap(),
            json!({"A": "x", "B": {"secret": "db", "key": "dsn"}})
        );
        let err = decode::<BTreeMap<String, EnvValue>>(json!({"B": 3})).unwrap_err();
        assert!(err.starts_with("B: invalid type"), "{err}");
        let err = decode::<BTreeMap<String, EnvValue>>(json!({"B": {"secret": "a", "kee": "b"}}))
            .unwrap_err();
        assert!(err.contains("unknown field `kee`"), "{err}");
    }

    #[test]
    fn keys_are_file_names_and_data_is_bounded() {
        for ok in ["dsn", "A_B", "_x", "tls.crt", "a-b"] {
            assert!(validate_key("k", ok).is_ok(), "{ok}");
        }
        for bad in ["", "1a", "a/b", "..", "a..b", ".x", "a b", "é"] {
            assert!(validate_key("k", bad).is_err(), "{bad}");
        }
        let data = |k: &str, v: String| BTreeMap::from([(k.to_string(), v)]);
        assert!(validate_data(&data("a", "x".repeat(SECRET_VALUE_MAX_BYTES))).is_ok());
        let err = validate_data(&data("a", "x".repeat(SECRET_VALUE_MAX_BYTES + 1))).unwrap_err();
        assert_eq!(err.field, "data.a");
        assert!(!err.message.contains("xxx"));
        assert_eq!(
            validate_data(&data("a/b", "x".into())).unwrap_err().field,
            "data.a/b"
        );
        assert_eq!(validate_data(&BTreeMap::new()).unwrap_err().field, "data");
    }
}
