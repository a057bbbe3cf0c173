//! Functions that attack their sandbox: filling the host's disk, reaching for the kernel
//! (namespaces, mounts, ptrace), oversized environments.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Server, send};

/// The start of a response body, for assertion messages (an echoed env is 200 kB).
fn short(body: &Value) -> String {
    body.to_string().chars().take(300).collect()
}

/// Bytes of regular files under `dir` (what lands on the host's disk).
fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        if meta.is_dir() {
            total += disk_usage(&entry.path());
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    total
}

/// Writes up to `mb` MiB into a file in each directory of the event, keeps what it wrote
/// until all are done (so the host can be measured meanwhile), and reports per directory
/// how much went in and the error that stopped it.
const FILLER: &str = r#"
import os, time

def fill(path, mb):
    chunk = b"x" * (1 << 20)
    written = 0
    try:
        with open(path, "wb") as f:
            for _ in range(mb):
                f.write(chunk)
                f.flush()
                written += 1
            os.fsync(f.fileno())
        return {"mb": written, "error": None}
    except OSError as e:
        return {"mb": written, "error": e.strerror}

def handle(event):
    body = event["body"]
    out = {}
    for d in body["dirs"]:
        out[d] = fill(os.path.join(d, "fill.bin"), body["mb"])
        # Memory-backed directories count against memory_mb: give it back before the next.
        if d in ("/tmp", "/dev/shm"):
            try:
                os.unlink(os.path.join(d, "fill.bin"))
            except OSError:
                pass
    return out
"#;

#[tokio::test]
async fn a_function_cannot_write_to_the_host_disk() {
    let server = Server::start().await;
    server
        .deploy(
            "filler",
            json!({"runtime": "python3", "memory_mb": 128}),
            &[("handler.py", FILLER)],
        )
        .await;
    let before = disk_usage(&server.data_dir);
    let dirs = [
        "/run/sless",
        "/run",
        "/code",
        "/deps",
        "/runtime",
        "/",
        "/etc",
        "/var/tmp",
        "/tmp",
        "/dev/shm",
    ];
    let (status, text, _) = server
        .call(
            "filler",
            reqwest::Method::POST,
            "",
            Some(json!({"dirs": dirs, "mb": 50})),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let seen: Value = serde_json::from_str(&text).unwrap();
    // The instance is still up (its run directory exists): measure now.
    let after = disk_usage(&server.data_dir);
    for dir in &dirs[..8] {
        assert_eq!(seen[dir]["mb"], 0, "{dir} took writes: {seen}");
        assert!(seen[dir]["error"].is_string(), "{dir}: {seen}");
    }
    // The private, memory-backed scratch space works.
    for dir in ["/tmp", "/dev/shm"] {
        assert_eq!(seen[dir], json!({"mb": 50, "error": null}), "{seen}");
    }
    // Logs and records may grow a little; 50 MiB never lands.
    assert!(
        after < before + (4 << 20),
        "data dir grew from {before} to {after} bytes"
    );
}

#[tokio::test]
async fn scratch_space_counts_against_the_memory_limit() {
    let server = Server::start().await;
    server
        .deploy(
            "tmp-hog",
            json!({"runtime": "python3", "memory_mb": 64}),
            &[("handler.py", FILLER)],
        )
        .await;
    let (status, text, _) = server
        .call(
            "tmp-hog",
            reqwest::Method::POST,
            "",
            Some(json!({"dirs": ["/tmp"], "mb": 300})),
        )
        .await;
    // Either the write fails inside or the instance is killed: it never gets 300 MiB.
    if status == 200 {
        let seen: Value = serde_json::from_str(&text).unwrap();
        assert!(seen["/tmp"]["mb"].as_u64().unwrap() < 64, "{seen}");
    } else {
        assert_eq!(status, 502, "{text}");
        server.wait_log("tmp-hog", "OOMKilled").await;
    }
}

/// Tries the first steps of kernel exploits; reports each call's errno (0: allowed).
const ESCAPE_PY: &str = r#"
import ctypes, os, platform, subprocess

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
X86 = platform.machine() == "x86_64"

def errno_of(result):
    return 0 if result >= 0 else ctypes.get_errno()

def sys(nr, *args):
    return errno_of(libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args]))

def handle(event):
    out = {
        "unshare_user": errno_of(libc.unshare(0x10000000)),
        "unshare_net": errno_of(libc.unshare(0x40000000)),
        "mount": errno_of(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
        "ptrace": errno_of(libc.ptrace(0, 0, 0, 0)),
        "keyctl": sys(250 if X86 else 219, 0, -3, 0),
        "bpf": sys(321 if X86 else 280, 0, 0, 0),
        "perf_event_open": sys(298 if X86 else 241, 0, 0, -1, -1, 0),
    }
    p = subprocess.run(["unshare", "-Ur", "true"], capture_output=True, text=True)
    out["unshare_cmd"] = {"status": p.returncode, "stderr": p.stderr.strip()}
    out["threads_and_children"] = subprocess.run(["python3", "-c", "import threading; t = threading.Thread(target=print); t.start(); t.join()"]).returncode
    return out
"#;

const ESCAPE_JS: &str = r#"
const { spawnSync } = require('node:child_process');
const { Worker } = require('node:worker_threads');
exports.handle = async () => {
  const p = spawnSync('unshare', ['-Ur', 'true'], { encoding: 'utf8' });
  // A worker thread: Node's threads are created with clone3 or clone, both filtered.
  const worker = await new Promise((resolve) => {
    const w = new Worker('require("node:worker_threads").parentPort.postMessage(6 * 7)', { eval: true });
    w.on('message', resolve);
    w.on('error', (e) => resolve(String(e)));
  });
  return { status: p.status, stderr: p.stderr.trim(), worker };
};
"#;

#[tokio::test]
async fn namespaces_mounts_and_ptrace_are_refused() {
    let server = Server::start().await;
    server
        .deploy(
            "escape-py",
            json!({"runtime": "python3"}),
            &[("handler.py", ESCAPE_PY)],
        )
        .await;
    let (status, text) = server.get("escape-py", "").await;
    assert_eq!(status, 200, "{text}");
    let seen: Value = serde_json::from_str(&text).unwrap();
    let eperm = 1;
    for call in [
        "unshare_user",
        "unshare_net",
        "mount",
        "ptrace",
        "keyctl",
        "bpf",
        "perf_event_open",
    ] {
        assert_eq!(seen[call], eperm, "{call} was not refused: {seen}");
    }
    assert_eq!(seen["unshare_cmd"]["status"], 1, "{seen}");
    assert!(
        seen["unshare_cmd"]["stderr"]
            .as_str()
            .unwrap()
            .contains("Operation not permitted"),
        "{seen}"
    );
    assert_eq!(seen["threads_and_children"], 0, "{seen}");

    server
        .deploy(
            "escape-js",
            json!({"runtime": "nodejs"}),
            &[("handler.js", ESCAPE_JS)],
        )
        .await;
    let (status, text) = server.get("escape-js", "").await;
    assert_eq!(status, 200, "{text}");
    let seen: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(seen["status"], 1, "{seen}");
    assert!(
        seen["stderr"]
            .as_str()
            .unwrap()
            .contains("Operation not permitted"),
        "{seen}"
    );
    assert_eq!(seen["worker"], 42, "{seen}");
}

const ENV_PY: &str = r#"
import os

def handle(event):
    return {k: len(v) for k, v in os.environ.items() if k.startswith("BIG_")}
"#;

#[tokio::test]
async fn oversized_env_is_refused_at_create_patch_and_for_jobs() {
    let server = Server::start().await;
    let functions = "/v1/namespaces/default/functions";
    let huge = "x".repeat(200_000);
    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        functions,
        Some(json!({"name": "huge", "runtime": "python3", "env": {"BIG": huge}})),
    )
    .await;
    assert_eq!(status, 400, "{}", short(&body));
    assert_eq!(body["error"]["code"], "invalid");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("env: at most 32768 bytes"), "{message}");

    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        functions,
        Some(json!({"name": "fine", "runtime": "python3", "env": {"A": "1"}})),
    )
    .await;
    assert_eq!(status, 201, "{}", short(&body));
    let (status, body) = send(
        &server,
        reqwest::Method::PATCH,
        &format!("{functions}/fine"),
        Some(json!({"env": {"BIG": "x".repeat(40_000)}})),
    )
    .await;
    assert_eq!(status, 400, "{}", short(&body));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("env: at most 32768 bytes"),
        "{}",
        short(&body)
    );
    // The rejected patch changed nothing.
    let fine = server.client.get_function("default", "fine").await.unwrap();
    assert_eq!(fine.spec["env"], json!({"A": "1"}));

    // Variables that would act on the sandbox's privileged helpers are refused by name.
    let (status, body) = send(
        &server,
        reqwest::Method::PATCH,
        &format!("{functions}/fine"),
        Some(json!({"env": {"LD_PRELOAD": "/code/x.so"}})),
    )
    .await;
    assert_eq!(status, 400, "{}", short(&body));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("env.LD_PRELOAD: "),
        "{}",
        short(&body)
    );

    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/jobs",
        Some(json!({"name": "big-job", "runtime": "python3", "env": {"BIG": "x".repeat(40_000)}})),
    )
    .await;
    assert_eq!(status, 400, "{}", short(&body));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("env: at most 32768 bytes"),
        "{}",
        short(&body)
    );
}

#[tokio::test]
async fn a_large_env_within_the_limit_starts_cold_and_after_a_restart() {
    // No warm pool: every instance is started from scratch with the env in its process.
    let mut server = Server::start_with(&["--prewarm", "0"]).await;
    let env: serde_json::Map<String, Value> = (0..4)
        .map(|i| (format!("BIG_{i}"), json!("v".repeat(8_000))))
        .collect();
    let expected = json!({"BIG_0": 8000, "BIG_1": 8000, "BIG_2": 8000, "BIG_3": 8000});
    server
        .deploy(
            "big-env",
            json!({"runtime": "python3", "env": env}),
            &[("handler.py", ENV_PY)],
        )
        .await;
    let (status, text) = server.get("big-env", "").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), expected);

    server.stop().await;
    server.restart().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let f = server
            .client
            .get_function("default", "big-env")
            .await
            .unwrap();
        let phase = f.status.phase.as_str();
        if phase == "Ready" {
            break;
        }
        assert_ne!(phase, "Failed", "{:?}", f.status);
        assert!(
            Instant::now() < deadline,
            "not ready after restart: {:?}",
            f.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, text) = server.get("big-env", "").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), expected);
}
