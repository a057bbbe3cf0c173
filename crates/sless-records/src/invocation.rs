//! [`Invocation`]: the start of one call of a function, finished into an
//! [`InvocationRecord`] once the caller's status is known. Every invoker (the
//! gateway, `/invoke`, cron, queues, jobs) builds its records the same way.

use std::time::Instant;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sless_executor::{InvokeError, InvokeResponse};
use sless_store::{InvocationRecord, InvocationSource};

/// Longest error message kept in a record, in bytes; the rest is cut off so a
/// handler raising huge exceptions cannot bloat the database.
pub const MAX_ERROR_LEN: usize = 1024;

/// An invocation in progress.
#[derive(Debug, Clone)]
pub struct Invocation {
    namespace: String,
    function: String,
    source: InvocationSource,
    request_id: String,
    started_at: DateTime<Utc>,
    clock: Instant,
}

impl Invocation {
    /// Starts the clock of an invocation: call it just before handing the request
    /// to the executor.
    pub fn start(
        namespace: &str,
        function: &str,
        source: InvocationSource,
        request_id: &str,
    ) -> Self {
        Self {
            namespace: namespace.to_string(),
            function: function.to_string(),
            source,
            request_id: request_id.to_string(),
            started_at: Utc::now(),
            clock: Instant::now(),
        }
    }

    /// The record of an invocation the executor answered with `result`, whose
    /// caller saw `status`. The error is the handler's exception message (its
    /// `{"error": ...}`) or the platform's reason for failing; `revision` is `0`
    /// when no instance answered.
    pub fn finish(
        self,
        result: Result<&InvokeResponse, &InvokeError>,
        status: u16,
    ) -> InvocationRecord {
        match result {
            Ok(r) => {
                let error = (!r.ok).then(|| handler_error(&r.body));
                self.finish_with(r.revision, status, r.cold_start, error)
            }
            Err(e) => self.finish_with(0, status, false, Some(e.to_string())),
        }
    }

    /// The record of an invocation, with every outcome given.
    pub fn finish_with(
        self,
        revision: u64,
        status: u16,
        cold_start: bool,
        error: Option<String>,
    ) -> InvocationRecord {
        InvocationRecord {
            id: crate::new_id(),
            namespace: self.namespace,
            function: self.function,
            revision,
            source: self.source,
            request_id: self.request_id,
            started_at: self.started_at,
            duration: self.clock.elapsed(),
            status,
            cold_start,
            error: error.map(truncate),
        }
    }
}

/// The message of a handler's exception: the shims answer `{"error": "<message>"}`;
/// anything else is kept as it came.
pub fn handler_error(body: &[u8]) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(mut map)) => match map.remove("error") {
            Some(Value::String(s)) => s,
            Some(other) => other.to_string(),
            None => Value::Object(map).to_string(),
        },
        _ => String::from_utf8_lossy(body).into_owned(),
    }
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn start() -> Invocation {
        Invocation::start("team", "f", InvocationSource::Http, "req-1")
    }

    #[test]
    fn answers_keep_revision_and_cold_start() {
        let r = InvokeResponse {
            ok: true,
            body: Bytes::from_static(b"{\"a\":1}"),
            cold_start: true,
            revision: 4,
        };
        let rec = start().finish(Ok(&r), 200);
        assert_eq!(
            (
                rec.namespace.as_str(),
                rec.function.as_str(),
                rec.request_id.as_str()
            ),
            ("team", "f", "req-1")
        );
        assert_eq!((rec.revision, rec.status, rec.cold_start), (4, 200, true));
        assert_eq!(rec.error, None);
        assert_eq!(rec.id.len(), 24);
    }

    #[test]
    fn exceptions_keep_the_handlers_message() {
        let r = InvokeResponse {
            ok: false,
            body: Bytes::from_static(b"{\"error\": \"ValueError: kaput\"}"),
            cold_start: false,
            revision: 2,
        };
        let rec = start().finish(Ok(&r), 500);
        assert_eq!(rec.error.as_deref(), Some("ValueError: kaput"));
        assert_eq!(handler_error(b"not json"), "not json");
        assert_eq!(handler_error(b"{\"error\": {\"m\": 1}}"), "{\"m\":1}");
    }

    #[test]
    fn platform_failures_have_no_revision() {
        let e = InvokeError::Timeout {
            name: "f".into(),
            seconds: 3,
        };
        let rec = start().finish(Err(&e), 504);
        assert_eq!((rec.revision, rec.status, rec.cold_start), (0, 504, false));
        assert_eq!(rec.error.as_deref(), Some("function f timed out after 3 s"));
    }

    #[test]
    fn long_errors_are_cut_on_a_char_boundary() {
        let rec = start().finish_with(1, 500, false, Some("é".repeat(MAX_ERROR_LEN)));
        let e = rec.error.unwrap();
        assert!(e.len() <= MAX_ERROR_LEN + '…'.len_utf8());
        assert!(e.ends_with('…'));
    }
}
