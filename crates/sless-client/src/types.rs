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

/// A trigger as the API returns it: what fires the function (`type` and its fields) plus
/// what happened last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Trigger {
    pub name: String,
    pub namespace: String,
    /// The function it calls.
    pub function: String,
    /// `http`, `cron` or `queue`.
    #[serde(rename = "type")]
    pub kind: String,
    pub enabled: bool,
    /// http: the route below `/t/{ns}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// http: the methods the route accepts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// cron: the schedule expression.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// cron: the IANA time zone the schedule is read in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// cron: the event the handler gets (plus `fired_at`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<serde_json::Value>,
    /// cron: seconds before each fire at which an instance is started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prewarm_sec: Option<u32>,
    /// queue: `{"kind", "url", "topic"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<serde_json::Value>,
    pub status: TriggerStatus,
    pub created_at: String,
    pub updated_at: String,
}

impl Default for Trigger {
    /// Everything empty except `enabled`, which the API defaults to true.
    fn default() -> Self {
        Trigger {
            name: String::new(),
            namespace: String::new(),
            function: String::new(),
            kind: String::new(),
            enabled: true,
            path: None,
            methods: Vec::new(),
            schedule: None,
            timezone: None,
            event: None,
            prewarm_sec: None,
            source: None,
            status: TriggerStatus::default(),
            created_at: String::new(),
            updated_at: String::new(),
        }
    }
}

/// What the platform reports about a trigger's firing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TriggerStatus {
    /// When it last fired (RFC 3339).
    pub last_fired_at: Option<String>,
    /// When it fires next (RFC 3339); `None` for http triggers and disabled ones.
    pub next_fire_at: Option<String>,
    /// How the last firing went, e.g. `200` or an error.
    pub last_result: Option<String>,
}

/// A job as the API returns it: its spec, kept as JSON, and the state of its current run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Job {
    pub name: String,
    pub namespace: String,
    /// `function` or `runtime`/`entrypoint`/`env`, plus `event`, `run_id`, `timeout_sec`,
    /// `max_attempts`.
    pub spec: serde_json::Value,
    pub status: JobStatus,
    pub created_at: String,
    pub updated_at: String,
}

impl Job {
    /// The spec's `function`, `None` for a self-contained job.
    pub fn function(&self) -> Option<&str> {
        self.spec.get("function").and_then(|v| v.as_str())
    }

    /// The spec's `runtime` (self-contained jobs), `None` for a function job.
    pub fn runtime(&self) -> Option<&str> {
        self.spec.get("runtime").and_then(|v| v.as_str())
    }

    /// The spec's `run_id`: the run the user asked for last.
    pub fn spec_run_id(&self) -> u64 {
        self.spec
            .get("run_id")
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
    }

    /// The spec's `max_attempts` (1 when absent, the API's default).
    pub fn max_attempts(&self) -> u64 {
        self.spec
            .get("max_attempts")
            .and_then(|v| v.as_u64())
            .unwrap_or(1)
    }
}

/// What the platform reports about a job's current run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobStatus {
    /// `Pending`, `Building`, `Running`, `Succeeded`, `Failed` or `Skipped`.
    pub phase: String,
    /// The run this status describes.
    pub run_id: u64,
    /// The handler's return value once the run succeeded.
    pub result: Option<serde_json::Value>,
    /// On failure, the error and the tail of the output.
    pub message: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// Attempts made for this run so far.
    pub attempts: u32,
}

impl JobStatus {
    /// True for the phases a run does not leave: `Succeeded`, `Failed`, `Skipped`.
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed" | "Skipped")
    }
}

/// One recorded invocation of a function.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Invocation {
    pub id: String,
    pub function: String,
    /// The revision that answered; 0 when no instance did.
    pub revision: u64,
    /// `http`, `invoke`, `cron`, `queue` or `job`.
    pub source: String,
    pub request_id: String,
    /// RFC 3339.
    pub started_at: String,
    /// How long the call took, in milliseconds (fractional: the server measures finer).
    pub duration_ms: f64,
    /// The HTTP status the caller saw.
    pub status: u16,
    /// The call waited for a new instance to start.
    pub cold_start: bool,
    /// The platform's error, or the handler's exception message.
    pub error: Option<String>,
}

/// Filters of `GET .../invocations`; every field set narrows the list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InvocationQuery {
    pub function: Option<String>,
    /// HTTP status code.
    pub status: Option<u16>,
    /// `http`, `invoke`, `cron`, `queue` or `job`.
    pub source: Option<String>,
    /// RFC 3339; records that started at or after it.
    pub since: Option<String>,
    /// At most this many records (the server caps it).
    pub limit: Option<u32>,
}

impl InvocationQuery {
    /// The query string pairs for the fields that are set, in the contract's order.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        let mut push = |key, value: Option<String>| {
            if let Some(value) = value {
                pairs.push((key, value));
            }
        };
        push("function", self.function.clone());
        push("status", self.status.map(|s| s.to_string()));
        push("source", self.source.clone());
        push("since", self.since.clone());
        push("limit", self.limit.map(|l| l.to_string()));
        pairs
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
    fn triggers_decode_leniently() {
        let t: Trigger = serde_json::from_str(
            r#"{"name":"nightly","namespace":"default","function":"report","type":"cron",
                "schedule":"0 3 * * *","timezone":"Europe/Berlin","event":{"k":1},
                "status":{"next_fire_at":"2025-01-02T02:00:00Z"}}"#,
        )
        .expect("decodes");
        assert_eq!(t.kind, "cron");
        assert!(t.enabled, "enabled defaults to true as in the API");
        assert_eq!(
            t.status.next_fire_at.as_deref(),
            Some("2025-01-02T02:00:00Z")
        );
        assert_eq!(t.status.last_fired_at, None);
        assert!(t.methods.is_empty());
        // Absent type fields stay absent when the trigger is printed as JSON again.
        let back = serde_json::to_value(&t).expect("encodes");
        assert!(
            back.get("path").is_none() && back.get("methods").is_none(),
            "{back}"
        );
        assert_eq!(back["type"], "cron");
    }

    #[test]
    fn jobs_decode_leniently() {
        let j: Job = serde_json::from_str(
            r#"{"name":"once","spec":{"function":"hello","run_id":3,"max_attempts":2},
                "status":{"phase":"Succeeded","run_id":3,"result":{"ok":true},"attempts":1}}"#,
        )
        .expect("decodes");
        assert_eq!(j.function(), Some("hello"));
        assert_eq!(j.runtime(), None);
        assert_eq!((j.spec_run_id(), j.max_attempts()), (3, 2));
        assert!(j.status.is_terminal());
        assert_eq!(j.status.result, Some(serde_json::json!({"ok": true})));
        let pending: Job =
            serde_json::from_str(r#"{"status":{"phase":"Running"}}"#).expect("decodes");
        assert!(!pending.status.is_terminal());
        assert_eq!((pending.spec_run_id(), pending.max_attempts()), (0, 1));
    }

    #[test]
    fn invocation_query_sends_only_what_is_set() {
        assert!(InvocationQuery::default().pairs().is_empty());
        let q = InvocationQuery {
            function: Some("hello".into()),
            status: Some(500),
            limit: Some(5),
            ..InvocationQuery::default()
        };
        assert_eq!(
            q.pairs(),
            [
                ("function", "hello".to_string()),
                ("status", "500".to_string()),
                ("limit", "5".to_string())
            ]
        );
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
