//! JSON merge patch (RFC 7386), used by every `PATCH` endpoint.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::ValidationError;

/// Why a merge patch could not be applied to a spec.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch is not a JSON object (a spec is patched field by field).
    #[error("body: a patch must be a JSON object")]
    NotAnObject,
    /// The patch names a field that does not exist or cannot be changed with `PATCH`.
    #[error("{0}: unknown field (it cannot be changed with PATCH)")]
    UnknownField(String),
    /// The patched document does not decode; `field` is the path to the offending
    /// value (`memory_mb`, `env.FOO`), or `body` when the whole document is at fault.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// The current value could not be written as JSON: a bug, not the client's fault.
    #[error("the current value cannot be written as JSON: {0}")]
    Current(#[source] serde_json::Error),
}

impl PatchError {
    /// The error as a client's mistake naming its field, or `Err` with the
    /// serialisation failure when it is not the client's fault.
    pub fn into_validation(self) -> Result<ValidationError, serde_json::Error> {
        Ok(match self {
            PatchError::NotAnObject => {
                ValidationError::new("body", "a patch must be a JSON object")
            }
            PatchError::UnknownField(field) => {
                ValidationError::new(field, "unknown field (it cannot be changed with PATCH)")
            }
            PatchError::Invalid { field, message } => ValidationError::new(field, message),
            PatchError::Current(e) => return Err(e),
        })
    }
}

/// Applies the merge patch `patch` to `current` and decodes the result: the patch
/// must be an object naming only `allowed` top-level fields, and a value the type
/// refuses is reported with the path to it. `null` resets a field to its default
/// (or, for a required field, fails naming it). The caller validates the result;
/// `current` is left alone, so a retry can apply the patch again to a newer value.
pub fn apply<T>(current: &T, patch: &Value, allowed: &[&str]) -> Result<T, PatchError>
where
    T: Serialize + DeserializeOwned,
{
    let Value::Object(fields) = patch else {
        return Err(PatchError::NotAnObject);
    };
    if let Some(unknown) = fields.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(PatchError::UnknownField(unknown.clone()));
    }
    let mut doc = serde_json::to_value(current).map_err(PatchError::Current)?;
    merge(&mut doc, patch);
    serde_path_to_error::deserialize(doc).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        // Errors of a `Value` carry no position, but strip one should it appear.
        let message = match message.split_once(" at line") {
            Some((head, _)) => head.to_string(),
            None => message,
        };
        PatchError::Invalid {
            field: if path.is_empty() || path == "." {
                "body".into()
            } else {
                path
            },
            message,
        }
    })
}

/// Applies `patch` to `target` in place: objects merge key by key, `null` removes
/// a key, anything else replaces the value.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    if let Value::Object(map) = target {
        for (key, value) in patch {
            if value.is_null() {
                map.remove(key);
            } else {
                merge(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rfc_7386_examples() {
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a"]), json!({"a": "b"}), json!({"a": "b"})),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ];
        for (mut target, patch, want) in cases {
            merge(&mut target, &patch);
            assert_eq!(target, want);
        }
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Spec {
        name: String,
        #[serde(default)]
        size: u32,
        #[serde(default)]
        env: std::collections::BTreeMap<String, String>,
    }

    fn spec() -> Spec {
        Spec {
            name: "a".into(),
            size: 7,
            env: [("A".to_string(), "1".to_string())].into(),
        }
    }

    const ALLOWED: &[&str] = &["name", "size", "env"];

    #[test]
    fn apply_merges_and_resets_with_null() {
        let got = apply(&spec(), &json!({"env": {"B": "2"}, "size": null}), ALLOWED).unwrap();
        assert_eq!(got.size, 0);
        assert_eq!(got.env.len(), 2);
        assert_eq!(got.name, "a");
        let got = apply(&spec(), &json!({"env": {"A": null}}), ALLOWED).unwrap();
        assert!(got.env.is_empty());
        assert_eq!(apply(&spec(), &json!({}), ALLOWED).unwrap(), spec());
    }

    #[test]
    fn apply_names_the_field_at_fault() {
        let err = apply(&spec(), &json!({"size": "big"}), ALLOWED).unwrap_err();
        assert!(err.to_string().starts_with("size: invalid type"), "{err}");
        let err = apply(&spec(), &json!({"env": {"B": 3}}), ALLOWED).unwrap_err();
        assert!(err.to_string().starts_with("env.B: invalid type"), "{err}");
        let err = apply(&spec(), &json!({"bogus": 1}), ALLOWED).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bogus: unknown field (it cannot be changed with PATCH)"
        );
        let err = apply(&spec(), &json!({"size": 1}), &["env"]).unwrap_err();
        assert!(matches!(err, PatchError::UnknownField(f) if f == "size"));
        let err = apply(&spec(), &json!([1]), ALLOWED).unwrap_err();
        assert_eq!(err.to_string(), "body: a patch must be a JSON object");
        let err = apply(&spec(), &json!({"name": null}), ALLOWED).unwrap_err();
        let v = err.into_validation().unwrap();
        assert_eq!(v.field, "body");
        assert!(v.message.contains("name"), "{v}");
    }
}
