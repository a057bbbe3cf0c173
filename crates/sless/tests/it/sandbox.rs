//! The sandbox as a function sees it: what it may read and write, and limits.

use serde_json::{Value, json};

use crate::harness::Server;

const PROBE: &str = r#"
import json, os

def can_read(path):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        return True
    except OSError:
        return False

def can_write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        return True
    except OSError:
        return False

def handle(event):
    targets = event["body"]
    return {
        "uid": os.getuid(),
        "pid": os.getpid(),
        "read": {p: can_read(p) for p in targets["read"]},
        "write": {p: can_write(p) for p in targets["write"]},
    }
"#;

#[tokio::test]
async fn functions_cannot_reach_the_data_dir_other_code_or_root() {
    let server = Server::start().await;
    server
        .deploy(
            "victim",
            json!({"runtime": "python3"}),
            &[("handler.py", "SECRET = 1\ndef handle(e):\n    return 1\n")],
        )
        .await;
    server
        .deploy(
            "probe",
            json!({"runtime": "python3"}),
            &[("handler.py", PROBE)],
        )
        .await;

    let data = server.data_dir.to_string_lossy().into_owned();
    let builds: Vec<String> = std::fs::read_dir(server.data_dir.join("builds"))
        .unwrap()
        .flatten()
        .map(|e| e.path().to_string_lossy().into_owned())
        .collect();
    let mut read = vec![
        data.clone(),
        format!("{data}/sless.db"),
        format!("{data}/admin-token"),
        "/root".to_string(),
        "/etc/shadow".to_string(),
    ];
    read.extend(builds.iter().map(|b| format!("{b}/handler.py")));
    read.push("/code/handler.py".to_string());
    let body = json!({"read": read, "write": ["/code/handler.py", "/code/new.py", "/tmp/scratch", "/usr/evil"]});
    let (status, text, _) = server
        .call("probe", reqwest::Method::POST, "", Some(body))
        .await;
    assert_eq!(status, 200, "{text}");
    let seen: Value = serde_json::from_str(&text).unwrap();

    assert_ne!(seen["uid"], 0, "functions must not run as root");
    assert!(
        seen["pid"].as_u64().unwrap() < 100,
        "a pid namespace hides the host's processes: {}",
        seen["pid"]
    );
    for path in &read[..read.len() - 1] {
        assert_eq!(
            seen["read"][path], false,
            "{path} must not be readable from a function"
        );
    }
    assert_eq!(
        seen["read"]["/code/handler.py"], true,
        "its own code is readable"
    );
    assert_eq!(
        seen["write"]["/code/handler.py"], false,
        "code is read-only"
    );
    assert_eq!(seen["write"]["/code/new.py"], false);
    assert_eq!(seen["write"]["/usr/evil"], false);
    assert_eq!(
        seen["write"]["/tmp/scratch"], true,
        "/tmp is private and writable"
    );
}

#[tokio::test]
async fn a_memory_hog_is_killed_and_reported() {
    let server = Server::start().await;
    let hog = "def handle(e):\n    if e['path'] == '/hog':\n        blocks = [bytearray(16 << 20) for _ in range(32)]\n        return len(blocks)\n    return 'fine'\n";
    server
        .deploy(
            "hog",
            json!({"runtime": "python3", "memory_mb": 64}),
            &[("handler.py", hog)],
        )
        .await;
    assert_eq!(server.get("hog", "/").await, (200, "fine".to_string()));
    let (status, body) = server.get("hog", "/hog").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("OOMKilled"), "{body}");
    server.wait_log("hog", "OOMKilled").await;
    let f = server.client.get_function("default", "hog").await.unwrap();
    assert!(
        f.status.message.contains("OOMKilled"),
        "{}",
        f.status.message
    );
    // The function recovers with a fresh instance.
    assert_eq!(server.get("hog", "/").await, (200, "fine".to_string()));
}
