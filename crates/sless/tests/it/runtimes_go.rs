//! The `go` and `custom` runtimes end to end: Go functions built offline with the
//! shim compiled in, and custom runtimes whose `bootstrap` serves the instance protocol.

use std::io::Write;
use std::time::Instant;

use serde_json::{Value, json};

use crate::harness::Server;

/// Every server of this test binary shares one Go build cache (in the target
/// directory, kept between runs), so only the first build compiles the standard library.
fn go_cache() -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("sless-it-go-cache");
    std::fs::create_dir_all(&dir).unwrap();
    dir.to_string_lossy().into_owned()
}

async fn go_server() -> Server {
    Server::start_with(&["--go-cache", &go_cache()]).await
}

const GO_HANDLER: &str = r#"package main

import (
	"context"
	"errors"
	"time"
)

func HandleContext(ctx context.Context, event map[string]any) (any, error) {
	switch event["path"] {
	case "/error":
		return nil, errors.New("no such order")
	case "/panic":
		var orders []string
		return orders[3], nil
	case "/slow":
		time.Sleep(5 * time.Second)
		return "late", nil
	case "/deadline":
		deadline, ok := ctx.Deadline()
		return map[string]any{"has_deadline": ok, "in_future": time.Until(deadline) > 0}, nil
	case "/event":
		return event, nil
	}
	return map[string]any{"hello": "go", "request_id": SlessContextFrom(ctx).RequestID != ""}, nil
}
"#;

#[tokio::test]
async fn go_functions_answer_errors_panics_and_timeouts() {
    let server = go_server().await;
    let f = server
        .deploy(
            "hello-go",
            json!({"runtime": "go1.23", "timeout_sec": 1}),
            &[("handler.go", GO_HANDLER)],
        )
        .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);

    let (status, body) = server.get("hello-go", "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"hello": "go", "request_id": true})
    );

    // The event has the same shape as for every runtime.
    let (status, body, _) = server
        .call(
            "hello-go",
            reqwest::Method::PUT,
            "/event?x=1",
            Some(json!({"k": [1, 2]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let event: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(event["method"], "PUT");
    assert_eq!(event["path"], "/event");
    assert_eq!(event["query"], json!({"x": "1"}));
    assert_eq!(event["body"], json!({"k": [1, 2]}));
    assert_eq!(event["headers"]["content-type"], "application/json");

    let (status, body) = server.get("hello-go", "/deadline").await;
    assert_eq!(
        (status, serde_json::from_str::<Value>(&body).unwrap()),
        (200, json!({"has_deadline": true, "in_future": true}))
    );

    // A returned error is a 500 with its message.
    let (status, body) = server.get("hello-go", "/error").await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"],
        "no such order"
    );

    // A panic is a 500, and the same instance goes on serving.
    let (status, body) = server.get("hello-go", "/panic").await;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("index out of range"), "{body}");
    let (status, _) = server.get("hello-go", "").await;
    assert_eq!(status, 200);
    server
        .wait_log("hello-go", "panic: runtime error: index out of range")
        .await;

    // An async call runs it through the delivery engine.
    let resp = server
        .client
        .http()
        .post(format!("{}/async/default/hello-go", server.url()))
        .json(&json!({"n": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let accepted: Value = resp.json().await.unwrap();
    let id = accepted["call_id"].as_str().expect("call id").to_string();
    let call = crate::async_calls::ended(&server, &id).await;
    assert_eq!(call["phase"], "Succeeded", "{call}");

    // Past timeout_sec the caller gets 504, and the function serves again after.
    let (status, body) = server.get("hello-go", "/slow").await;
    assert_eq!(status, 504, "{body}");
    let (status, _) = server.get("hello-go", "").await;
    assert_eq!(status, 200);
}

/// A zip whose entries carry the given Unix modes.
fn zip_with_modes(files: &[(&str, &str, u32)]) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    {
        let mut w = zip::ZipWriter::new(&mut out);
        for (path, content, mode) in files {
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated)
                .unix_permissions(*mode);
            w.start_file(*path, opts).unwrap();
            w.write_all(content.as_bytes()).unwrap();
        }
        w.finish().unwrap();
    }
    out.into_inner()
}

/// Creates `name` with `spec` (or patches it) and uploads `archive`; the settled function.
async fn upload(server: &Server, name: &str, spec: Value, archive: Vec<u8>) -> Value {
    if server.client.get_function("default", name).await.is_err() {
        let mut body = spec;
        body["name"] = json!(name);
        server
            .client
            .create_function("default", &body)
            .await
            .unwrap();
    }
    let up = server
        .client
        .upload_code("default", name, archive)
        .await
        .unwrap();
    let f = server.wait_settled("default", name, up.revision).await;
    serde_json::to_value(f).unwrap()
}

#[tokio::test]
async fn go_builds_are_offline_vendored_and_quick_after_a_code_change() {
    let server = go_server().await;
    let vendored = [
        (
            "go.mod",
            "module example.com/fn\n\ngo 1.19\n\nrequire example.com/greet v0.1.0\n",
        ),
        (
            "handler.go",
            "package main\n\nimport \"example.com/greet\"\n\nfunc Handle(event map[string]any) (any, error) {\n\treturn greet.Hello(\"vendor\"), nil\n}\n",
        ),
        (
            "vendor/modules.txt",
            "# example.com/greet v0.1.0\n## explicit\nexample.com/greet\n",
        ),
        (
            "vendor/example.com/greet/greet.go",
            "package greet\n\nfunc Hello(name string) string { return \"hello, \" + name }\n",
        ),
    ];
    let f = server
        .deploy("vendored", json!({"runtime": "go"}), &vendored)
        .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    assert_eq!(
        server.get("vendored", "").await,
        (200, "hello, vendor".to_string())
    );

    // A dependency that is not vendored cannot be fetched: the build says so.
    let f = server
        .deploy(
            "unvendored",
            json!({"runtime": "go"}),
            &[vendored[0], vendored[1]],
        )
        .await;
    assert_eq!(f.status.phase, "Failed");
    assert!(
        f.status.message.contains("example.com/greet"),
        "{}",
        f.status.message
    );

    // A code-only change builds again with the warm cache.
    let changed = [
        vendored[0],
        (
            "handler.go",
            "package main\n\nimport \"example.com/greet\"\n\nfunc Handle(event map[string]any) (any, error) {\n\treturn greet.Hello(\"again\"), nil\n}\n",
        ),
        vendored[2],
        vendored[3],
    ];
    let started = Instant::now();
    let f = server
        .deploy("vendored", json!({"runtime": "go"}), &changed)
        .await;
    println!(
        "code-only change of a Go function: Ready in {:?}",
        started.elapsed()
    );
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    assert_eq!(
        server.get("vendored", "").await,
        (200, "hello, again".to_string())
    );

    // A compile error fails the revision with the compiler's message.
    let f = server
        .deploy(
            "broken",
            json!({"runtime": "go"}),
            &[(
                "handler.go",
                "package main\n\nfunc Handle(event map[string]any) (any, error) {\n\treturn undefinedThing, nil\n}\n",
            )],
        )
        .await;
    assert_eq!(f.status.phase, "Failed");
    assert!(
        f.status
            .message
            .contains("handler.go:4:9: undefined: undefinedThing"),
        "{}",
        f.status.message
    );
    // A Handle with the wrong signature is the compiler's complaint too.
    let f = server
        .deploy(
            "wrong-signature",
            json!({"runtime": "go"}),
            &[(
                "handler.go",
                "package main\n\nfunc Handle(event string) string { return event }\n",
            )],
        )
        .await;
    assert_eq!(f.status.phase, "Failed");
    assert!(
        f.status.message.contains("cannot use Handle"),
        "{}",
        f.status.message
    );
}

/// A custom runtime written in Python: the protocol's minimum, on `$SLESS_SOCKET`.
const BOOTSTRAP: &str = r#"#!/usr/bin/python3
import json, os, socketserver
from http.server import BaseHTTPRequestHandler

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.answer(200 if self.path == "/_sless/ready" else 404, "ok")

    def do_POST(self):
        event = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"null")
        if event and event.get("path") == "/fail":
            return self.answer(500, {"error": "custom failure"})
        self.answer(200, {"runtime": "custom", "path": event and event.get("path"),
                          "function": os.environ["SLESS_FUNCTION"],
                          "request_id": self.headers["x-sless-request-id"]})

    def log_message(self, *args):
        pass

class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

print("bootstrap listening", flush=True)
Server(os.environ["SLESS_SOCKET"], Handler).serve_forever()
"#;

#[tokio::test]
async fn custom_bootstraps_serve_and_bad_ones_fail_clearly() {
    // A short start timeout: one bootstrap here never becomes ready.
    let server = Server::start_with(&["--start-timeout-sec", "3"]).await;
    let f = upload(
        &server,
        "custom",
        json!({"runtime": "custom"}),
        zip_with_modes(&[("bootstrap", BOOTSTRAP, 0o755)]),
    )
    .await;
    assert_eq!(f["status"]["phase"], "Ready", "{}", f["status"]);
    let (status, body) = server.get("custom", "/hi").await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["runtime"], "custom");
    assert_eq!(answer["path"], "/hi");
    assert_eq!(answer["function"], "custom");
    assert!(answer["request_id"].as_str().is_some_and(|s| !s.is_empty()));
    let (status, body) = server.get("custom", "/fail").await;
    assert_eq!(status, 500, "{body}");
    server.wait_log("custom", "bootstrap listening").await;

    // Invoked through the API as well (records, sources: the same pipeline).
    let (status, body) = crate::harness::send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/functions/custom/invoke",
        Some(json!({"path": "/api"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // Not executable: the build fails naming the file and the fix.
    let f = upload(
        &server,
        "not-executable",
        json!({"runtime": "custom"}),
        zip_with_modes(&[("bootstrap", BOOTSTRAP, 0o644)]),
    )
    .await;
    assert_eq!(f["status"]["phase"], "Failed");
    let message = f["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("bootstrap: is not executable"),
        "{message}"
    );

    // Never listens: the revision fails saying what a bootstrap must do.
    let f = upload(
        &server,
        "never-ready",
        json!({"runtime": "custom"}),
        zip_with_modes(&[(
            "bootstrap",
            "#!/bin/sh\necho waiting forever\nexec sleep 600\n",
            0o755,
        )]),
    )
    .await;
    assert_eq!(f["status"]["phase"], "Failed");
    let message = f["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("bootstrap did not become ready") && message.contains("$SLESS_SOCKET"),
        "{message}"
    );
}

#[tokio::test]
async fn a_self_contained_go_job_runs_its_own_code() {
    let server = go_server().await;
    let jobs = "/v1/namespaces/default/jobs";
    let (status, job) = crate::harness::send(
        &server,
        reqwest::Method::POST,
        jobs,
        Some(json!({"name": "go-job", "runtime": "go", "event": {"n": 7}})),
    )
    .await;
    assert_eq!(status, 201, "{job}");
    let code = crate::harness::zip(&[(
        "handler.go",
        "package main\n\nfunc Handle(event map[string]any) (any, error) {\n\treturn map[string]any{\"doubled\": event[\"n\"].(float64) * 2}, nil\n}\n",
    )]);
    let resp = server
        .client
        .http()
        .put(format!("{}{jobs}/go-job/code", server.url()))
        .bearer_auth(crate::harness::TOKEN)
        .header("content-type", "application/zip")
        .body(code)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let (status, job) = crate::harness::send(
        &server,
        reqwest::Method::GET,
        &format!("{jobs}/go-job?wait=60"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(job["status"]["phase"], "Succeeded", "{job}");
    assert_eq!(job["status"]["result"], json!({"doubled": 14}));
}

/// A folder of the repository as a zip, with each file's mode.
fn example_zip(rel: &str) -> Vec<u8> {
    use std::os::unix::fs::PermissionsExt;
    let dir = crate::harness::repo_path(rel);
    let files: Vec<(String, String, u32)> = crate::harness::dir_files(&dir)
        .into_iter()
        .map(|(path, content)| {
            let mode = std::fs::metadata(dir.join(&path))
                .unwrap()
                .permissions()
                .mode()
                & 0o777;
            (path, String::from_utf8(content).unwrap(), mode)
        })
        .collect();
    let refs: Vec<(&str, &str, u32)> = files
        .iter()
        .map(|(p, c, m)| (p.as_str(), c.as_str(), *m))
        .collect();
    zip_with_modes(&refs)
}

#[tokio::test]
async fn the_go_and_custom_examples_serve() {
    let server = go_server().await;
    let f = upload(
        &server,
        "hello-go",
        json!({"runtime": "go"}),
        example_zip("examples/hello-go"),
    )
    .await;
    assert_eq!(f["status"]["phase"], "Ready", "{}", f["status"]);
    let (status, body) = server.get("hello-go", "?name=gopher").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["hello"],
        "gopher"
    );

    let f = upload(
        &server,
        "custom-shell",
        json!({"runtime": "custom"}),
        example_zip("examples/custom-shell"),
    )
    .await;
    assert_eq!(f["status"]["phase"], "Ready", "{}", f["status"]);
    let (status, body) = server.get("custom-shell", "").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("you sent "), "{body}");
    server
        .wait_log("custom-shell", "hello from sh, request")
        .await;
}
