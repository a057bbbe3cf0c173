//! The API's response bodies, as `sless-api-types` defines them for server and client
//! alike (decoded leniently: missing fields take defaults, unknown ones are ignored and an
//! unknown phase is `Unknown`, so a newer server does not break an older client), plus
//! what only the client has: invoke answers and invocation queries.

use bytes::Bytes;
use reqwest::header::HeaderMap;

pub use sless_api_types::Secret;
pub use sless_api_types::{
    CodeUploaded, Function, FunctionPhase, FunctionStatus, InstanceCounts, Invocation, Items, Job,
    JobPhase, JobStatus, Namespace, Trigger, TriggerKind, TriggerResult, TriggerSpec,
    TriggerStatus,
};

/// The answer to a code upload.
pub type UploadResponse = CodeUploaded;

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
        assert_eq!(t.kind(), "cron");
        assert!(t.spec.enabled, "enabled defaults to true as in the API");
        assert_eq!(
            t.status.next_fire_at.as_deref(),
            Some("2025-01-02T02:00:00Z")
        );
        assert_eq!(t.status.last_fired_at, None);
        assert!(t.methods().is_empty());
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
