//! Golden files of every response body (in `src/snapshots/`), and the lenient decoding
//! a client relies on. With `CI=true` a mismatch fails instead of writing a new file.

use super::*;
use serde_json::json;
use sless_core::{FunctionSpec, JobSpec};

const T0: &str = "2025-01-31T12:00:00.123Z";
const T1: &str = "2025-01-31T12:05:00.456Z";

fn at(t: &str) -> DateTime<Utc> {
    t.parse().expect("a valid time")
}

fn function_spec() -> FunctionSpec {
    let mut spec: FunctionSpec = serde_json::from_value(json!({
        "runtime": "python3.12", "env": {"GREETING": "hi"}, "min_instances": 1
    }))
    .expect("decodes");
    spec.validate().expect("valid");
    spec
}

fn function() -> Function<FunctionSpec> {
    Function {
        name: "hello".into(),
        namespace: "default".into(),
        spec: function_spec(),
        status: FunctionStatus {
            phase: sless_core::Phase::Ready.into(),
            message: String::new(),
            revision: 3,
            code_sha256: Some("ab".repeat(32)),
            url: "http://127.0.0.1:8080/fn/default/hello".into(),
            instances: sless_core::InstanceCounts {
                ready: 1,
                starting: 0,
            }
            .into(),
            last_built_at: Some(timestamp(at(T0))),
        },
        created_at: timestamp(at(T0)),
        updated_at: timestamp(at(T1)),
    }
}

fn trigger(v: Value) -> Trigger {
    let fields: sless_core::TriggerFields = serde_json::from_value(v).expect("decodes");
    Trigger {
        name: "nightly".into(),
        namespace: "default".into(),
        spec: TriggerSpec::from_fields(fields).expect("valid"),
        status: sless_core::TriggerStatus {
            last_fired_at: Some(at(T0)),
            next_fire_at: Some(at(T1)),
            last_result: Some(TriggerResult::Finished {
                status: 200,
                error: None,
            }),
            ..Default::default()
        }
        .into(),
        created_at: timestamp(at(T0)),
        updated_at: timestamp(at(T1)),
    }
}

fn job(v: Value) -> Job<JobSpec> {
    let mut spec: JobSpec = serde_json::from_value(v).expect("decodes");
    spec.validate().expect("valid");
    Job {
        name: "once".into(),
        namespace: "default".into(),
        spec,
        status: sless_core::JobStatus {
            phase: sless_core::JobPhase::Succeeded,
            run_id: 1,
            result: Some(json!({"ok": true})),
            message: String::new(),
            started_at: Some(at(T0)),
            finished_at: Some(at(T1)),
            attempts: 1,
        }
        .into(),
        code_sha256: None,
        created_at: timestamp(at(T0)),
        updated_at: timestamp(at(T1)),
    }
}

fn body<T: Serialize>(v: &T) -> Value {
    to_body(v).expect("serialises")
}

#[test]
fn function_bodies() {
    insta::assert_json_snapshot!("function", body(&function()));
    insta::assert_json_snapshot!("function_list", body(&Items::new(vec![function()])));
    let pending = Function {
        status: FunctionStatus {
            phase: FunctionPhase::Pending,
            message: "waiting for code: upload a zip archive to .../code".into(),
            revision: 1,
            ..FunctionStatus::default()
        },
        ..function()
    };
    insta::assert_json_snapshot!("function_pending", body(&pending));
    insta::assert_json_snapshot!(
        "code_uploaded",
        body(&CodeUploaded {
            revision: 4,
            code_sha256: "cd".repeat(32)
        })
    );
    insta::assert_json_snapshot!(
        "source",
        body(&Items::new(vec![
            SourceFile {
                name: "handler.py".into(),
                content: "def handle(event):\n    return event\n".into(),
                binary: false
            },
            SourceFile {
                name: "data.bin".into(),
                content: "AAE=".into(),
                binary: true
            }
        ]))
    );
}

#[test]
fn trigger_bodies() {
    let http = trigger(
        json!({"function": "hello", "type": "http", "path": "/orders/", "methods": ["post", "get"]}),
    );
    insta::assert_json_snapshot!(
        "trigger_http",
        body(&Trigger {
            status: TriggerStatus::default(),
            ..http
        })
    );
    let cron = trigger(
        json!({"function": "report", "type": "cron", "schedule": "0 3 * * *", "timezone": "Europe/Berlin", "event": {"k": 1}}),
    );
    insta::assert_json_snapshot!("trigger_cron", body(&cron));
    insta::assert_json_snapshot!("trigger_list", body(&Items::new(vec![cron])));
}

#[test]
fn job_bodies() {
    let by_function = job(json!({"function": "hello", "event": {"n": 1}, "timeout_sec": 60}));
    insta::assert_json_snapshot!("job_function", body(&by_function));
    let contained = Job {
        code_sha256: Some("ef".repeat(32)),
        status: sless_core::JobStatus {
            phase: sless_core::JobPhase::Failed,
            run_id: 2,
            message: "error: boom\n--- output ---\nTraceback".into(),
            attempts: 3,
            ..Default::default()
        }
        .into(),
        ..job(json!({"runtime": "python3", "env": {"A": "1"}, "run_id": 2, "max_attempts": 3}))
    };
    insta::assert_json_snapshot!("job_self_contained", body(&contained));
    insta::assert_json_snapshot!("job_list", body(&Items::new(vec![by_function])));
    insta::assert_json_snapshot!(
        "job_code_uploaded",
        body(&JobCodeUploaded {
            code_sha256: "ef".repeat(32),
            run_id: 2
        })
    );
}

#[test]
fn namespace_token_and_health_bodies() {
    let ns = Namespace {
        name: "team-a".into(),
        created_at: Some(timestamp(at(T0))),
    };
    insta::assert_json_snapshot!("namespace", body(&ns));
    insta::assert_json_snapshot!("namespace_list", body(&Items::new(vec![ns])));
    insta::assert_json_snapshot!(
        "whoami",
        body(&Whoami {
            admin: false,
            namespaces: vec!["team-a".into()]
        })
    );
    insta::assert_json_snapshot!(
        "token_created",
        body(&TokenCreated {
            token: "slt_0123456789abcdef".into(),
            namespace: "team-a".into()
        })
    );
    insta::assert_json_snapshot!(
        "healthz",
        body(&Health {
            status: "ok".into(),
            problems: None
        })
    );
    insta::assert_json_snapshot!(
        "readyz_unavailable",
        body(&Health {
            status: "unavailable".into(),
            problems: Some(vec!["metadata store: gone".into()])
        })
    );
    insta::assert_json_snapshot!(
        "error",
        body(&ErrorBody::new(
            "invalid",
            "memory_mb: must be between 32 and 4096, got 16"
        ))
    );
}

#[test]
fn invocation_bodies() {
    let r = Invocation {
        id: "0001".into(),
        function: "hello".into(),
        revision: 2,
        source: "http".into(),
        request_id: "req".into(),
        started_at: timestamp(at("2025-01-31T12:00:00.123456Z")),
        duration_ms: 1.5,
        status: 500,
        cold_start: true,
        error: Some("boom".into()),
        ..Invocation::default()
    };
    insta::assert_json_snapshot!("invocation_list", body(&Items::new(vec![r])));
}

#[test]
fn sources_travel_as_their_names_and_unknown_ones_still_decode() {
    for source in InvocationSource::ALL {
        let wire = body(&Source::from(source));
        assert_eq!(wire, json!(source.as_str()));
        let back: Source = serde_json::from_value(wire).expect("decodes");
        assert_eq!(back, Source::Known(source));
    }
    let newer: Invocation =
        serde_json::from_value(json!({"id": "1", "source": "pigeon"})).expect("decodes");
    assert_eq!(newer.source, Source::Unknown("pigeon".into()));
    assert_eq!(newer.source, "pigeon");
    assert_eq!(body(&newer)["source"], "pigeon");
    assert_eq!(Source::from("cron"), Source::Known(InvocationSource::Cron));
}

#[test]
fn bodies_are_sent_with_sorted_keys_as_before() {
    let text = serde_json::to_string(&body(&function())).expect("text");
    assert!(text.starts_with(r#"{"created_at":"#), "{text}");
    assert!(
        text.contains(r#""spec":{"concurrency":16,"cpu":1000,"entrypoint":"#),
        "{text}"
    );
}

#[test]
fn what_the_server_writes_the_client_reads() {
    let f: Function = serde_json::from_value(body(&function())).expect("decodes");
    assert_eq!(f.runtime(), "python3.12");
    assert_eq!(f.status, function().status);
    let t = trigger(json!({"function": "report", "type": "cron", "schedule": "0 3 * * *"}));
    let back: Trigger = serde_json::from_value(body(&t)).expect("decodes");
    assert_eq!(back, t);
    assert_eq!(
        (back.kind(), back.schedule(), back.timezone()),
        ("cron", Some("0 3 * * *"), Some("UTC"))
    );
    let j = job(json!({"function": "hello"}));
    let back: Job = serde_json::from_value(body(&j)).expect("decodes");
    assert_eq!(
        (back.function(), back.spec_run_id(), back.max_attempts()),
        (Some("hello"), 1, 1)
    );
    assert_eq!(back.status, j.status);
}

#[test]
fn a_newer_server_does_not_break_the_client() {
    let f: Function = serde_json::from_value(json!({
        "name": "hello", "spec": {"runtime": "python3", "delivery": {}},
        "status": {"phase": "Hibernating", "instances": {"ready": 1}, "future_field": true}
    }))
    .expect("decodes");
    assert_eq!(f.status.phase, FunctionPhase::Unknown("Hibernating".into()));
    assert_eq!(f.status.phase, "Hibernating");
    assert!(!f.status.is_settled());
    assert_eq!(
        f.status.instances,
        InstanceCounts {
            ready: 1,
            starting: 0
        }
    );
    let j: Job =
        serde_json::from_value(json!({"status": {"phase": "Cancelled"}})).expect("decodes");
    assert!(!j.status.is_terminal());
    assert_eq!(
        serde_json::to_value(&j.status.phase).expect("encodes"),
        json!("Cancelled")
    );
    let t: Trigger = serde_json::from_value(json!({
        "name": "d", "function": "f", "type": "webhook", "url": "https://example.com",
        "status": {"last_result": "delivered 3"}
    }))
    .expect("decodes");
    assert_eq!(
        (t.kind(), t.path(), t.methods().len()),
        ("unknown", None, 0)
    );
    assert!(t.spec.enabled);
    assert_eq!(
        t.status.last_result,
        Some(TriggerResult::Other("delivered 3".into()))
    );
    let ns: Items<Namespace> =
        serde_json::from_value(json!({"items": ["a", {"name": "b", "created_at": T0}]}))
            .expect("decodes");
    assert_eq!(ns.items[0].name, "a");
    assert_eq!(ns.items[1].created_at.as_deref(), Some(T0));
}

#[test]
fn token_and_audit_bodies() {
    insta::assert_json_snapshot!(
        "token_list",
        body(&Items::new(vec![
            TokenInfo {
                id: "0123456789ab".into(),
                namespace: "team-a".into(),
                created_at: T0.into(),
                last_used_at: Some(T1.into()),
            },
            TokenInfo {
                id: "ba9876543210".into(),
                namespace: "team-a".into(),
                created_at: T0.into(),
                last_used_at: None,
            },
        ]))
    );
    insta::assert_json_snapshot!(
        "admin_token",
        body(&AdminToken {
            token: "sless_0123456789abcdef".into()
        })
    );
    insta::assert_json_snapshot!(
        "audit_list",
        body(&Items::new(vec![AuditEntry {
            id: "0000018d5e1c2b3a00000001".into(),
            time: T1.into(),
            actor: "token:0123456789ab".into(),
            namespace: Some("team-a".into()),
            action: "function.patch".into(),
            object: AuditObject {
                kind: "function".into(),
                name: Some("hello".into()),
            },
            address: Some("127.0.0.1".into()),
            status: 200,
        }]))
    );
}

#[test]
fn namespace_detail_body() {
    let detail = NamespaceDetail {
        name: "team-a".into(),
        created_at: Some(timestamp(at(T0))),
        quota: QuotaCounts {
            functions: 100,
            instances: 50,
            memory_mb: 8192,
            invocations_per_sec: 1000,
            queued_calls: 10000,
            devices: 1000,
            storage_mb: 2048,
        },
        usage: QuotaCounts {
            functions: 3,
            instances: 1,
            memory_mb: 128,
            ..QuotaCounts::default()
        },
    };
    insta::assert_json_snapshot!("namespace_detail", body(&detail));
}
