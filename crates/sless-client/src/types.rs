//! Response types of the API, decoded leniently: missing fields take defaults so a newer
//! server that adds or omits fields does not break an older client.

use bytes::Bytes;
use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};

/// A function object as the API returns it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Function {
    pub name: String,
    pub namespace: String,
    /// The spec as stored (runtime, entrypoint, env, limits...), kept as JSON so fields the
    /// server adds later survive a round trip.
    pub spec: serde_json::Value,
    pub status: FunctionStatus,
    pub created_at: String,
    pub updated_at: String,
}

impl Function {
    /// The spec's `runtime`, or `""` when absent.
    pub fn runtime(&self) -> &str {
        self.spec
            .get("runtime")
            .and_then(|v| v.as_str())
            .unwrap_or("")
    }
}

/// What the platform reports about a function's latest revision.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FunctionStatus {
    /// `Pending`, `Building`, `Ready` or `Failed`.
    pub phase: String,
    /// Why the phase is what it is; on `Failed`, the reason and the tail of the build log.
    pub message: String,
    /// The latest revision; `phase` describes this one.
    pub revision: u64,
    /// SHA-256 of the uploaded archive, `None` before the first upload.
    pub code_sha256: Option<String>,
    /// The public invoke URL, `/fn/{ns}/{name}` on the server.
    pub url: String,
    pub instances: InstanceCounts,
    /// When a build last ran (RFC 3339).
    pub last_built_at: Option<String>,
}

impl FunctionStatus {
    /// True when `phase` is one the platform leaves only on a new revision.
    pub fn is_settled(&self) -> bool {
        self.phase == "Ready" || self.phase == "Failed"
    }
}

/// Instances of a function by readiness.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct InstanceCounts {
    pub ready: u32,
    pub starting: u32,
}

/// A namespace as listed by `GET /v1/namespaces`. The server may list bare names or
/// objects with a `name`; both decode.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Namespace {
    pub name: String,
    /// When it was created (RFC 3339), when the server says.
    pub created_at: Option<String>,
}

impl<'de> Deserialize<'de> for Namespace {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Name(String),
            Object {
                name: String,
                #[serde(default)]
                created_at: Option<String>,
            },
        }
        Ok(match Wire::deserialize(d)? {
            Wire::Name(name) => Namespace {
                name,
                created_at: None,
            },
            Wire::Object { name, created_at } => Namespace { name, created_at },
        })
    }
}

/// The answer to a code upload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UploadResponse {
    /// The revision that carries this code.
    pub revision: u64,
    /// SHA-256 of the archive as the server computed it.
    pub code_sha256: String,
}

/// A function's answer to an authenticated invoke, whatever its status.
#[derive(Debug, Clone)]
pub struct InvokeResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl InvokeResponse {
    /// True for a 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body decoded as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// The body as text, invalid UTF-8 replaced.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The `{"items": [...]}` wrapper every list endpoint uses.
#[derive(Deserialize)]
pub(crate) struct Items<T> {
    #[serde(default = "Vec::new")]
    pub items: Vec<T>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_decodes_leniently() {
        let f: Function = serde_json::from_str(
            r#"{"name":"hello","namespace":"default","spec":{"runtime":"python3"},
                "status":{"phase":"Ready","revision":3,"url":"http://x/fn/default/hello",
                          "instances":{"ready":1}, "future_field": true}}"#,
        )
        .expect("decodes");
        assert_eq!(f.runtime(), "python3");
        assert_eq!(f.status.revision, 3);
        assert_eq!(
            f.status.instances,
            InstanceCounts {
                ready: 1,
                starting: 0
            }
        );
        assert_eq!(f.status.code_sha256, None);
        assert!(f.status.is_settled());
        assert_eq!(f.created_at, "");
    }

    #[test]
    fn namespaces_decode_as_names_or_objects() {
        let items: Items<Namespace> = serde_json::from_str(
            r#"{"items":["a",{"name":"b","created_at":"2024-01-01T00:00:00Z"}]}"#,
        )
        .expect("decodes");
        assert_eq!(
            items.items[0],
            Namespace {
                name: "a".into(),
                created_at: None
            }
        );
        assert_eq!(items.items[1].name, "b");
        assert_eq!(
            items.items[1].created_at.as_deref(),
            Some("2024-01-01T00:00:00Z")
        );
    }
}
