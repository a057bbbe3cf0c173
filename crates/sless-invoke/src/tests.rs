//! The pipeline around the executor's call: the status table, the records built
//! for each kind of outcome, failed functions, and recording off.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use sless_records::{RecordSink, RecorderConfig, SinkError};

use super::*;
use crate::record::{MAX_ERROR_LEN, handler_error};

/// Keeps what the recorder writes.
#[derive(Default)]
struct Sink(Mutex<Vec<InvocationRecord>>);

#[async_trait]
impl RecordSink for Sink {
    async fn insert_batch(&self, records: &[InvocationRecord]) -> Result<(), SinkError> {
        self.0.lock().unwrap().extend_from_slice(records);
        Ok(())
    }
    async fn prune(&self, _: Duration, _: u64) -> Result<u64, SinkError> {
        Ok(0)
    }
}

struct Fixture {
    sink: Arc<Sink>,
    recorder: Arc<Recorder>,
    failed: FailedFunctions,
}

impl Fixture {
    fn new() -> Self {
        let sink = Arc::new(Sink::default());
        let recorder = Recorder::start(sink.clone(), RecorderConfig::default());
        Self {
            sink,
            recorder,
            failed: FailedFunctions::default(),
        }
    }

    fn pipeline(&self, recording: bool) -> Pipeline<'_> {
        Pipeline {
            recorder: recording.then_some(&*self.recorder),
            failed: &self.failed,
        }
    }

    /// Runs `result` through the pipeline as a call of `team/f` and finishes it
    /// with `status` (the pipeline's own when `None`).
    fn finish(
        &self,
        recording: bool,
        result: Result<InvokeResponse, InvokeError>,
        status: Option<u16>,
    ) -> u16 {
        let call = Call::new("team", "f", InvocationSource::Cron, "req-1", Bytes::new());
        let pipeline = self.pipeline(recording);
        let outcome = pipeline.conclude(&call, pipeline.start(), result);
        let status = status.unwrap_or_else(|| outcome.status());
        let _ = outcome.finish(status);
        status
    }

    async fn records(&self) -> Vec<InvocationRecord> {
        self.recorder.flush().await.unwrap();
        std::mem::take(&mut *self.sink.0.lock().unwrap())
    }
}

fn answer(ok: bool, body: &'static str) -> Result<InvokeResponse, InvokeError> {
    Ok(InvokeResponse {
        ok,
        body: Bytes::from_static(body.as_bytes()),
        cold_start: true,
        revision: 4,
    })
}

#[tokio::test]
async fn every_platform_failure_has_one_status_and_code() {
    let table = [
        (InvokeError::NotFound, 404, "not_found"),
        (
            InvokeError::QuotaExceeded(sless_executor::quota::Refusal {
                exceeded: sless_core::QuotaExceeded {
                    kind: sless_core::QuotaKind::InvocationsPerSec,
                    limit: 1,
                    used: 1,
                },
                retry_after: Some(1),
            }),
            429,
            "quota_exceeded",
        ),
        (InvokeError::Paused("f".into()), 503, "paused"),
        (InvokeError::Unavailable("full".into()), 503, "unavailable"),
        (
            InvokeError::Timeout {
                name: "f".into(),
                seconds: 3,
            },
            504,
            "timeout",
        ),
        (
            InvokeError::InstanceFailed("crashed".into()),
            502,
            "instance_failed",
        ),
    ];
    let fx = Fixture::new();
    let call = Call::new("team", "f", InvocationSource::Job, "r", Bytes::new());
    for (e, status, code) in table {
        assert_eq!(status_of(&e), (status, code), "{e:?}");
        // Every invoker's default status is the table's.
        let outcome = fx.pipeline(false).conclude(&call, None, Err(e));
        assert_eq!(outcome.status(), status);
    }
    let ok = fx.pipeline(false).conclude(&call, None, answer(true, "1"));
    assert_eq!(ok.status(), 200);
    let raised = fx
        .pipeline(false)
        .conclude(&call, None, answer(false, "{}"));
    assert_eq!(raised.status(), HANDLER_ERROR_STATUS);
}

#[tokio::test]
async fn an_answer_is_recorded_with_its_revision_cold_start_and_the_callers_status() {
    let fx = Fixture::new();
    // The gateway answers a `{"statusCode": 201}` with 201, and records that.
    fx.finish(true, answer(true, r#"{"statusCode": 201}"#), Some(201));
    let records = fx.records().await;
    let [r] = records.as_slice() else {
        panic!("{records:?}")
    };
    assert_eq!(
        (
            r.namespace.as_str(),
            r.function.as_str(),
            r.request_id.as_str()
        ),
        ("team", "f", "req-1")
    );
    assert_eq!(r.source, InvocationSource::Cron);
    assert_eq!((r.revision, r.status, r.cold_start), (4, 201, true));
    assert_eq!(r.error, None);
    assert_eq!(r.id.len(), 24);
}

#[tokio::test]
async fn a_handlers_exception_is_recorded_with_its_message() {
    let fx = Fixture::new();
    let status = fx.finish(
        true,
        answer(false, r#"{"error": "ValueError: kaput"}"#),
        None,
    );
    assert_eq!(status, 500);
    let records = fx.records().await;
    assert_eq!(records[0].status, 500);
    assert_eq!(records[0].revision, 4);
    assert_eq!(records[0].error.as_deref(), Some("ValueError: kaput"));
    assert_eq!(handler_error(b"not json"), "not json");
    assert_eq!(handler_error(b"{\"error\": {\"m\": 1}}"), "{\"m\":1}");
}

#[tokio::test]
async fn a_platform_failure_is_recorded_without_a_revision() {
    let fx = Fixture::new();
    let timeout = InvokeError::Timeout {
        name: "f".into(),
        seconds: 3,
    };
    assert_eq!(fx.finish(true, Err(timeout), None), 504);
    let records = fx.records().await;
    let r = &records[0];
    assert_eq!((r.revision, r.status, r.cold_start), (0, 504, false));
    assert_eq!(r.error.as_deref(), Some("function f timed out after 3 s"));
}

#[tokio::test]
async fn a_missing_function_leaves_no_record_and_a_failed_one_is_503_with_its_reason() {
    let fx = Fixture::new();
    assert_eq!(fx.finish(true, Err(InvokeError::NotFound), None), 404);
    assert!(fx.records().await.is_empty());

    fx.failed.set(
        "team",
        "f",
        Failure {
            message: "the stored code archive is missing".into(),
            private: false,
        },
    );
    assert_eq!(fx.finish(true, Err(InvokeError::NotFound), None), 503);
    let records = fx.records().await;
    assert_eq!(records[0].status, 503);
    assert_eq!(
        records[0].error.as_deref(),
        Some("function team/f failed: the stored code archive is missing")
    );
    // A start failure keeps the executor's wording, which public callers get summarised.
    let start = Failure {
        message: "revision 2 could not start: ValueError".into(),
        private: false,
    };
    assert_eq!(
        failed_error("team", "f", &start).to_string(),
        "revision 2 could not start: ValueError"
    );
}

#[tokio::test]
async fn recording_off_times_nothing_and_records_nothing() {
    let fx = Fixture::new();
    let off = fx.pipeline(false);
    assert!(off.start().is_none());
    assert_eq!(
        fx.finish(false, answer(false, r#"{"error": "x"}"#), None),
        500
    );
    assert_eq!(
        fx.finish(false, Err(InvokeError::Paused("f".into())), None),
        503
    );
    assert!(fx.records().await.is_empty());
}

#[tokio::test]
async fn a_job_records_the_function_it_ran_not_its_pool() {
    let fx = Fixture::new();
    let call = Call::new(
        "team",
        "job.nightly",
        InvocationSource::Job,
        "r",
        Bytes::new(),
    )
    .recorded_as("report");
    let pipeline = fx.pipeline(true);
    let _ = pipeline
        .conclude(&call, pipeline.start(), answer(true, "1"))
        .finish(200);
    let records = fx.records().await;
    assert_eq!(records[0].function, "report");
}

#[test]
fn long_errors_are_cut_on_a_char_boundary() {
    let e = record::truncate("é".repeat(MAX_ERROR_LEN));
    assert!(e.len() <= MAX_ERROR_LEN + '…'.len_utf8());
    assert!(e.ends_with('…'));
    assert_eq!(record::truncate("short".into()), "short");
}

#[test]
fn events_encode_and_request_ids_are_fresh_hex() {
    let v = serde_json::json!({"a": [1, 2]});
    assert_eq!(&encode_event(&v).unwrap()[..], br#"{"a":[1,2]}"#);
    let (a, b) = (new_request_id(), new_request_id());
    assert_eq!(a.len(), 32);
    assert!(
        a.bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    assert_ne!(a, b);
}

#[tokio::test]
async fn a_delivery_records_its_attempt_trigger_and_call() {
    let fx = Fixture::new();
    let pipeline = fx.pipeline(true);
    let queued = Call::new("team", "f", InvocationSource::Queue, "m-1", Bytes::new())
        .attempt(2)
        .trigger("orders-in")
        .message(Bytes::from_static(b"{}"));
    let _ = pipeline
        .conclude(&queued, pipeline.start(), answer(true, "1"))
        .finish(200);
    let called = Call::new("team", "f", InvocationSource::Async, "c-9", Bytes::new())
        .attempt(1)
        .call_id("c-9");
    let _ = pipeline
        .conclude(&called, pipeline.start(), answer(false, r#"{"error":"x"}"#))
        .finish(500);
    let plain = Call::new("team", "f", InvocationSource::Http, "r", Bytes::new());
    let _ = pipeline
        .conclude(&plain, pipeline.start(), answer(true, "1"))
        .finish(200);
    let records = fx.records().await;
    let fields: Vec<_> = records
        .iter()
        .map(|r| {
            (
                r.request_id.as_str(),
                r.attempt,
                r.trigger.as_deref(),
                r.call_id.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            ("m-1", Some(2), Some("orders-in"), None),
            ("c-9", Some(1), None, Some("c-9")),
            ("r", None, None, None),
        ]
    );
}

#[test]
fn messages_travel_as_ascii_json_and_huge_ones_lose_their_headers() {
    let m = serde_json::json!({"id": "m-1", "topic": "café/🦀", "attempt": 1});
    let encoded = encode_message(&m).unwrap();
    assert!(encoded.is_ascii(), "{encoded:?}");
    let text = std::str::from_utf8(&encoded).unwrap();
    assert!(
        text.contains(r#""topic":"caf\u00e9/\ud83e\udd80""#),
        "{text}"
    );
    let back: serde_json::Value = serde_json::from_slice(&encoded).unwrap();
    assert_eq!(back, m);

    let huge = serde_json::json!({
        "id": "m-2", "attempt": 3, "headers": {"h": "x".repeat(MAX_MESSAGE_BYTES)}
    });
    let slim: serde_json::Value = serde_json::from_slice(&encode_message(&huge).unwrap()).unwrap();
    assert_eq!(
        slim,
        serde_json::json!({"id": "m-2", "attempt": 3, "truncated": true})
    );
    let worse = serde_json::json!({
        "id": "m-3", "attempt": 1, "topic": "t", "other": "y".repeat(MAX_MESSAGE_BYTES)
    });
    let slim: serde_json::Value = serde_json::from_slice(&encode_message(&worse).unwrap()).unwrap();
    assert_eq!(
        slim,
        serde_json::json!({"id": "m-3", "attempt": 1, "topic": "t", "truncated": true})
    );
}
