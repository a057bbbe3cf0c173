//! Functions that attack their own instance or the server: deeply nested bodies and
//! results, a broken or blocked serving loop, endless output, entrypoints that fail to
//! load, and work left running after the response.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Server, send};

/// A handler that reports what it was given, and misbehaves on request.
const PY_ECHO: &str = r#"
import __main__

def handle(event):
    if not (isinstance(event, dict) and "path" in event):
        event = {"path": "/", "body": event}
    path = event["path"]
    if path == "/deep-result":
        value = []
        for _ in range(100000):
            value = [value]
        return value
    if path == "/break":
        # Breaks the shim's server itself (it runs as __main__), not just this request.
        __main__.build_response = None
    if path == "/garble":
        # From now on the shim answers every request without a Content-Length, which
        # breaks the instance protocol, while the process lives on.
        __main__.build_response = lambda *args, **kwargs: b"HTTP/1.1 200 OK\r\n\r\n"
    body = event["body"]
    return {"type": type(body).__name__, "len": len(body) if isinstance(body, (str, list)) else None}
"#;

const NODE_ECHO: &str = r#"
exports.handle = async (event) => {
  if (!(event && typeof event === 'object' && 'path' in event)) event = { path: '/', body: event };
  if (event.path === '/break') {
    // Breaks how the shim frames its answer, i.e. the server itself.
    Buffer.byteLength = () => { throw new Error('framing is broken'); };
  }
  if (event.path === '/deep-result') {
    let value = [];
    for (let i = 0; i < 1e6; i++) value = [value];
    return value;
  }
  const body = event.body;
  return { type: Array.isArray(body) ? 'list' : typeof body === 'string' ? 'str' : typeof body, len: body.length };
};
"#;

/// POSTs `body` as JSON to `/fn/default/{name}{path}`; a client timeout turns a
/// hang into a failure instead of a stuck test.
async fn post_raw(server: &Server, name: &str, path: &str, body: Vec<u8>) -> (u16, String) {
    let resp = server
        .client
        .http()
        .post(format!("{}/fn/default/{name}{path}", server.url()))
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(20))
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {name}{path}: {e}"));
    (resp.status().as_u16(), resp.text().await.unwrap())
}

fn nested(depth: usize, closed: bool) -> Vec<u8> {
    let mut body = "[".repeat(depth);
    if closed {
        body.push_str(&"]".repeat(depth));
    }
    body.into_bytes()
}

#[tokio::test]
async fn deeply_nested_bodies_and_results_get_an_answer_and_the_instance_keeps_serving() {
    let server = Server::start().await;
    for (name, runtime, file, code) in [
        ("deep-py", "python3", "handler.py", PY_ECHO),
        ("deep-node", "nodejs20", "handler.js", NODE_ECHO),
    ] {
        // No timeout: an instance that stops answering would hang this test, not 504.
        let f = server
            .deploy(
                name,
                json!({"runtime": runtime, "timeout_sec": 0, "min_instances": 1, "max_instances": 1}),
                &[(file, code)],
            )
            .await;
        assert_eq!(f.status.phase, "Ready", "{name}: {f:?}");

        // JSON nested deeper than the gateway parses reaches the handler as its text,
        // as broken JSON does; nesting within the limit is JSON.
        for (body, kind) in [
            (nested(1000, true), "str"),
            (nested(1000, false), "str"),
            (nested(2_000_000, true), "str"),
            (nested(2_000_000, false), "str"),
            (nested(128, true), "list"),
        ] {
            let len = body.len();
            let (status, text) = post_raw(&server, name, "/", body).await;
            assert_eq!(status, 200, "{name} {len} bytes: {text}");
            let answer: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(answer["type"], kind, "{name} {len} bytes: {text}");
        }

        // A result nested too deeply to encode is that request's error.
        let (status, text) = post_raw(&server, name, "/deep-result", b"{}".to_vec()).await;
        assert_eq!(status, 500, "{name}: {text}");
        assert!(text.contains("nested too deeply"), "{name}: {text}");

        let (status, text) = post_raw(&server, name, "/", b"[1,2]".to_vec()).await;
        assert_eq!(status, 200, "{name}: {text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(answer, json!({"len": 2, "type": "list"}), "{name}");

        // The invoke API refuses an event nested deeper than the limit, in the contract's shape.
        let event: Value = serde_json::from_slice(&nested(100, true)).unwrap();
        let (status, _) = send(
            &server,
            reqwest::Method::POST,
            &format!("/v1/namespaces/default/functions/{name}/invoke"),
            Some(event),
        )
        .await;
        assert_eq!(status, 200, "{name}: 100 levels are fine");
        let resp = server
            .client
            .http()
            .post(format!(
                "{}/v1/namespaces/default/functions/{name}/invoke",
                server.url()
            ))
            .bearer_auth(crate::harness::TOKEN)
            .header("content-type", "application/json")
            .timeout(Duration::from_secs(20))
            .body(nested(1000, true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400);
        let err: Value = resp.json().await.unwrap();
        assert_eq!(err["error"]["code"], "invalid", "{err}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains("nested"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn an_instance_whose_serving_loop_died_is_replaced_even_without_a_timeout() {
    let server = Server::start().await;
    for (name, runtime, file, code, path, log) in [
        (
            "breaks-py",
            "python3",
            "handler.py",
            PY_ECHO,
            "/break",
            "serving loop failed; exiting",
        ),
        (
            "breaks-node",
            "nodejs20",
            "handler.js",
            NODE_ECHO,
            "/break",
            "serving loop failed; exiting",
        ),
        // Alive but answering outside the protocol: the executor retires it.
        (
            "garbles",
            "python3",
            "handler.py",
            PY_ECHO,
            "/garble",
            "is recycled after a request failed without an answer",
        ),
    ] {
        server
            .deploy(
                name,
                json!({"runtime": runtime, "timeout_sec": 0, "min_instances": 1, "max_instances": 1}),
                &[(file, code)],
            )
            .await;
        // The request that breaks the server gets a 502, not a hang.
        let (status, text) = post_raw(&server, name, path, b"{}".to_vec()).await;
        assert_eq!(status, 502, "{name}: {text}");
        // A replacement serves the following requests.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, text) = post_raw(&server, name, "/", b"[1]".to_vec()).await;
            if status == 200 {
                let answer: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(answer, json!({"len": 1, "type": "list"}), "{name}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name} never served again: {status} {text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server.wait_log(name, log).await;
    }
}

/// The `sless serve` process of `server` (its command line names the data dir).
fn server_pid(server: &Server) -> u32 {
    let needle = server.data_dir.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "serve") && args.contains(&needle) {
            return pid;
        }
    }
    panic!("no server process for {needle}");
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test]
async fn output_without_newlines_keeps_server_memory_bounded_and_is_logged_in_pieces() {
    let server = Server::start().await;
    // Straight to file descriptor 1, past the shim's own line handling: the server's
    // pump sees one 50 MB line.
    let code = r#"
import os

def handle(event):
    chunk = b"x" * (1 << 20)
    for _ in range(50):
        os.write(1, chunk)
    return "done"
"#;
    server
        .deploy(
            "chatty",
            json!({"runtime": "python3", "min_instances": 1}),
            &[("handler.py", code)],
        )
        .await;
    let pid = server_pid(&server);
    let before = rss_kib(pid);
    let (status, text) = post_raw(&server, "chatty", "/", b"{}".to_vec()).await;
    assert_eq!((status, text.as_str()), (200, "done"));
    // The handler's writes return only once the server has read them (a pipe holds
    // 64 KiB), so by now the server has taken in nearly all 50 MB. Buffering that as
    // one line would take 50 MB or more.
    let after = rss_kib(pid);
    assert!(
        after < before + 24 * 1024,
        "server RSS grew from {before} KiB to {after} KiB"
    );
    // The log has the line in pieces, each within the log's line limit.
    let logs = server.wait_log("chatty", " [continues]").await;
    let piece = logs
        .lines()
        .find(|l| l.ends_with(" [continues]"))
        .expect("a split line");
    assert!(piece.len() <= 16 * 1024 + 64, "{} bytes", piece.len());
}

#[tokio::test]
async fn entrypoints_that_fail_to_load_leave_no_instance_directory() {
    let server = Server::start_with(&["--prewarm", "1"]).await;
    let run = server.data_dir.join("run");
    let bad = [
        (
            "bad-py",
            "python3",
            "handler.py",
            "def other(e):\n    return 1\n",
        ),
        (
            "bad-py2",
            "python3",
            "handler.py",
            "raise RuntimeError('at import')\n",
        ),
        (
            "bad-node",
            "nodejs20",
            "handler.js",
            "exports.other = () => 1;\n",
        ),
    ];
    for (name, runtime, file, code) in bad {
        let f = server
            .deploy(name, json!({"runtime": runtime}), &[(file, code)])
            .await;
        assert_eq!(f.status.phase, "Failed", "{name}: {f:?}");
    }
    // What remains is the warm pool: one generic instance per runtime.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dirs = dir_names(&run);
        if dirs.len() <= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "instance directories left behind: {dirs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The parent cgroup of this server's instances, named as `sless serve` names it.
fn cgroup_name(server: &Server) -> String {
    use sha2::Digest;
    let canonical = server.data_dir.canonicalize().unwrap();
    let digest = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    format!("sless-{}", &hex::encode(digest)[..12])
}

/// Where this server's instance cgroups live for `controller` on cgroup v1, or in
/// the unified hierarchy on v2.
fn cgroup_parent(server: &Server, controller: &str) -> PathBuf {
    let root = Path::new("/sys/fs/cgroup");
    if root.join(controller).is_dir() {
        root.join(controller).join(cgroup_name(server))
    } else {
        root.join(cgroup_name(server))
    }
}

/// The cgroup directories of the function instances (`i<n>`) under `parent`.
fn instance_cgroups(parent: &Path) -> Vec<PathBuf> {
    dir_names(parent)
        .into_iter()
        .filter(|n| n.starts_with('i'))
        .map(|n| parent.join(n))
        .collect()
}

/// The one function instance's cgroup under `parent`, once there is exactly one.
async fn only_instance(parent: &Path) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = instance_cgroups(parent);
        if found.len() == 1 {
            return found.into_iter().next().unwrap();
        }
        assert!(Instant::now() < deadline, "instances: {found:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// CPU time used by the instance cgroup `cpu_dir`, in nanoseconds (v1
/// `cpuacct.usage`, where cpuacct may be mounted on its own; v2 `cpu.stat`).
fn cpu_usage_ns(cpu_dir: &Path) -> u64 {
    let id = cpu_dir.file_name().unwrap();
    let parent = cpu_dir.parent().unwrap().file_name().unwrap();
    let cpuacct = Path::new("/sys/fs/cgroup/cpuacct").join(parent).join(id);
    for dir in [cpu_dir, cpuacct.as_path()] {
        if let Ok(text) = std::fs::read_to_string(dir.join("cpuacct.usage")) {
            return text.trim().parse().unwrap();
        }
    }
    let dir = cpu_dir;
    let stat = std::fs::read_to_string(dir.join("cpu.stat")).unwrap();
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .map(|v| v.trim().parse::<u64>().unwrap() * 1000)
        .unwrap()
}

/// The CPU quota of an instance cgroup in microseconds per 100 ms period.
fn cpu_quota_us(dir: &Path) -> u64 {
    if let Ok(text) = std::fs::read_to_string(dir.join("cpu.cfs_quota_us")) {
        return text.trim().parse().unwrap();
    }
    let max = std::fs::read_to_string(dir.join("cpu.max")).unwrap();
    max.split_whitespace().next().unwrap().parse().unwrap()
}

fn is_frozen(server: &Server, id: &str) -> bool {
    let v1 = cgroup_parent(server, "freezer")
        .join(id)
        .join("freezer.state");
    match std::fs::read_to_string(&v1) {
        Ok(state) => state.trim() == "FROZEN",
        Err(_) => {
            let v2 = Path::new("/sys/fs/cgroup")
                .join(cgroup_name(server))
                .join(id);
            std::fs::read_to_string(v2.join("cgroup.events"))
                .is_ok_and(|e| e.lines().any(|l| l == "frozen 1"))
        }
    }
}

#[tokio::test]
async fn the_cpu_field_is_validated_patchable_and_applied_to_new_instances() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    for bad in [json!(49), json!(8001), json!("lots")] {
        let (status, body) = send(
            &server,
            reqwest::Method::POST,
            "/v1/namespaces/default/functions",
            Some(json!({"name": "cpu", "runtime": "python3", "cpu": bad})),
        )
        .await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("cpu"),
            "{body}"
        );
    }
    let code = [("handler.py", "def handle(e):\n    return 1\n")];
    let f = server
        .deploy(
            "cpu",
            json!({"runtime": "python3", "cpu": 250, "min_instances": 1}),
            &code,
        )
        .await;
    assert_eq!(f.spec["cpu"], 250, "{:?}", f.spec);
    let parent = cgroup_parent(&server, "cpu");
    let first = only_instance(&parent).await;
    assert_eq!(cpu_quota_us(&first), 25_000);

    let (status, body) = send(
        &server,
        reqwest::Method::PATCH,
        "/v1/namespaces/default/functions/cpu",
        Some(json!({"cpu": 1500})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["spec"]["cpu"], 1500, "{body}");
    // The new instance replaces the old one and has the new limit.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = instance_cgroups(&parent);
        if now.len() == 1 && now[0] != first {
            assert_eq!(cpu_quota_us(&now[0]), 150_000);
            break;
        }
        assert!(Instant::now() < deadline, "instances: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = server.get("cpu", "/").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn work_left_running_after_a_response_gets_its_cpu_share_and_then_stops() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    // Starts four busy-looping children and answers at once.
    let code = r#"
import subprocess, sys

def handle(event):
    for _ in range(4):
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
    return "started"
"#;
    server
        .deploy(
            "hog",
            json!({"runtime": "python3", "cpu": 200, "min_instances": 1, "max_instances": 1}),
            &[("handler.py", code)],
        )
        .await;
    let cpu = only_instance(&cgroup_parent(&server, "cpu")).await;
    let id = cpu.file_name().unwrap().to_string_lossy().into_owned();

    let (t0, u0) = (Instant::now(), cpu_usage_ns(&cpu));
    let (status, text) = server.get("hog", "/").await;
    assert_eq!((status, text.as_str()), (200, "started"));
    // Idle after its response, the instance is frozen...
    let deadline = Instant::now() + Duration::from_secs(15);
    while !is_frozen(&server, &id) {
        assert!(Instant::now() < deadline, "instance {id} never froze");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (t1, u1) = (Instant::now(), cpu_usage_ns(&cpu));
    // ...and until then it got no more than its 0.2 CPU (plus a period of slack),
    // where four busy processes would take every core there is.
    let allowed = (t1 - t0).as_nanos() as u64 / 5 + 50_000_000;
    assert!(
        u1 - u0 <= allowed,
        "used {} ms of CPU in {} ms at 200 millicores",
        (u1 - u0) / 1_000_000,
        (t1 - t0).as_millis()
    );
    // Frozen, it uses nothing: measured over half a second.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let u2 = cpu_usage_ns(&cpu);
    assert!(
        u2 - u1 < 5_000_000,
        "a frozen instance used {} µs of CPU",
        (u2 - u1) / 1000
    );
    // The next request thaws it and is served.
    let (status, text) = server.get("hog", "/").await;
    assert_eq!((status, text.as_str()), (200, "started"));
}

/// How often the liveness tests' servers check busy instances: short, so a stuck
/// serving loop is found within seconds.
const LIVENESS_PERIOD_MS: &str = "1000";

/// Like [`post_raw`], with a longer client timeout: the request is expected to be held
/// for a while, and a hang still fails the test rather than blocking it.
async fn post_slow(server: &Server, name: &str, path: &str) -> (u16, String) {
    let resp = server
        .client
        .http()
        .post(format!("{}/fn/default/{name}{path}", server.url()))
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(60))
        .body("{}")
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {name}{path}: {e}"));
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// Asserts that `text` is the gateway's answer for a request held by an instance whose
/// serving loop stopped: `502 {"error": {"code": "instance_failed", ...}}` saying so.
fn assert_stopped_responding(name: &str, status: u16, text: &str) {
    assert_eq!(status, 502, "{name}: {text}");
    let err: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}: {text}"));
    assert_eq!(err["error"]["code"], "instance_failed", "{name}: {err}");
    let message = err["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("stopped responding"), "{name}: {err}");
}

/// Deploys `code` (which prints `blocking` and then blocks its runtime's serving loop on
/// `/block`) with no timeout and room for four requests, sends a request that blocks and
/// one more meanwhile, and checks that neither hangs and the function serves again.
async fn a_blocked_serving_loop_is_found_and_replaced(
    server: &Server,
    name: &str,
    spec: Value,
    file: &str,
    code: &str,
) {
    let f = server.deploy(name, spec, &[(file, code)]).await;
    assert_eq!(f.status.phase, "Ready", "{name}: {f:?}");
    let (status, text) = post_slow(server, name, "/").await;
    assert_eq!((status, text.as_str()), (200, "ok"), "{name}");

    let started = Instant::now();
    let blocked = post_slow(server, name, "/block");
    let later = async {
        // Sent once the first request is in the handler, so it lands on the stuck instance.
        server.wait_log(name, "blocking").await;
        post_slow(server, name, "/").await
    };
    let ((status, text), (later_status, later_text)) = tokio::join!(blocked, later);
    assert_stopped_responding(name, status, &text);
    if later_status != 200 {
        assert_stopped_responding(name, later_status, &later_text);
    }
    // Found within a few periods, far from the client's 60 s.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{name}: took {:?}",
        started.elapsed()
    );
    server.wait_log(name, "stopped responding").await;

    // A replacement serves, and keeps serving.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, text) = post_slow(server, name, "/").await;
        if status == 200 {
            assert_eq!(text, "ok", "{name}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never served again: {status} {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..3 {
        let (status, text) = post_slow(server, name, "/").await;
        assert_eq!((status, text.as_str()), (200, "ok"), "{name}");
    }
}

#[tokio::test]
async fn a_python_async_handler_that_blocks_the_loop_is_failed_and_replaced_without_a_timeout() {
    let server = Server::start_with(&["--liveness-period-ms", LIVENESS_PERIOD_MS]).await;
    // `time.sleep` in an `async def` handler blocks the asyncio loop the shim serves on:
    // the process lives, nothing it holds is ever answered.
    let code = r#"
import time

async def handle(event):
    if event.get("path") == "/block":
        print("blocking", flush=True)
        time.sleep(3600)
    return "ok"
"#;
    a_blocked_serving_loop_is_found_and_replaced(
        &server,
        "blocks-py",
        json!({"runtime": "python3", "timeout_sec": 0, "concurrency": 4,
               "min_instances": 1, "max_instances": 1}),
        "handler.py",
        code,
    )
    .await;
}

#[tokio::test]
async fn a_node_handler_that_spins_synchronously_is_failed_and_replaced_without_a_timeout() {
    let server = Server::start_with(&["--liveness-period-ms", LIVENESS_PERIOD_MS]).await;
    // A synchronous busy loop blocks Node's one event loop, the shim's server with it.
    let code = r#"
exports.handle = async (event) => {
  if (event.path === '/block') {
    console.log('blocking');
    for (;;) {}
  }
  return 'ok';
};
"#;
    a_blocked_serving_loop_is_found_and_replaced(
        &server,
        "blocks-node",
        // A quarter of a CPU, so the spinning instance leaves the machine some.
        json!({"runtime": "nodejs20", "timeout_sec": 0, "concurrency": 4, "cpu": 250,
               "min_instances": 1, "max_instances": 1}),
        "handler.js",
        code,
    )
    .await;
}

#[tokio::test]
async fn long_handlers_whose_loop_still_answers_run_to_the_end_without_a_timeout() {
    let server = Server::start_with(&["--liveness-period-ms", LIVENESS_PERIOD_MS]).await;
    // Eight liveness periods each: a Python `def` handler sleeps on its own thread, a Node
    // handler awaits a timer; both shims keep answering the checks meanwhile.
    let py = r#"
import time

def handle(event):
    time.sleep(8)
    return "slept"
"#;
    let node = r#"
exports.handle = async () => {
  await new Promise((resolve) => setTimeout(resolve, 8000));
  return 'slept';
};
"#;
    for (name, runtime, file, code) in [
        ("sleeps-py", "python3", "handler.py", py),
        ("sleeps-node", "nodejs20", "handler.js", node),
    ] {
        let f = server
            .deploy(
                name,
                json!({"runtime": runtime, "timeout_sec": 0, "min_instances": 1, "max_instances": 1}),
                &[(file, code)],
            )
            .await;
        assert_eq!(f.status.phase, "Ready", "{name}: {f:?}");
    }
    let started = Instant::now();
    let (py, node) = tokio::join!(
        post_slow(&server, "sleeps-py", "/"),
        post_slow(&server, "sleeps-node", "/")
    );
    assert_eq!((py.0, py.1.as_str()), (200, "slept"), "python");
    assert_eq!((node.0, node.1.as_str()), (200, "slept"), "node");
    assert!(started.elapsed() >= Duration::from_secs(8));
    for name in ["sleeps-py", "sleeps-node"] {
        let logs = server
            .client
            .logs("default", name, Some(1000))
            .await
            .expect("logs");
        assert!(!logs.contains("stopped responding"), "{name}:\n{logs}");
        assert!(!logs.contains("recycled"), "{name}:\n{logs}");
    }
}

#[tokio::test]
async fn with_a_timeout_a_blocked_instance_takes_no_new_requests_before_its_request_times_out() {
    let server = Server::start_with(&["--liveness-period-ms", LIVENESS_PERIOD_MS]).await;
    let code = r#"
import time

async def handle(event):
    if event.get("path") == "/block":
        print("blocking", flush=True)
        time.sleep(3600)
    return "ok"
"#;
    let name = "blocks-timeout";
    server
        .deploy(
            name,
            json!({"runtime": "python3", "timeout_sec": 60, "concurrency": 4,
                   "min_instances": 1, "max_instances": 2}),
            &[("handler.py", code)],
        )
        .await;
    let url = server.url();
    let http = server.client.http().clone();
    let blocked = tokio::spawn(async move {
        http.post(format!("{url}/fn/default/{name}/block"))
            .header("content-type", "application/json")
            .timeout(Duration::from_secs(90))
            .body("{}")
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    server.wait_log(name, "blocking").await;
    // Its request runs on towards its 60 s timeout, but the instance is taken out of
    // rotation once it stops answering liveness checks...
    server
        .wait_log(
            name,
            "is recycled after it stopped responding to liveness checks",
        )
        .await;
    // ...so the next request is served by a replacement, not queued behind it.
    let (status, text) = post_slow(&server, name, "/").await;
    assert_eq!((status, text.as_str()), (200, "ok"));
    assert!(!blocked.is_finished(), "the blocked request ended early");
    blocked.abort();
}
