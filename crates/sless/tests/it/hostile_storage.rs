//! Storage under abuse and damage: corrupt code archives are detected, reported
//! and repaired by uploading the original again; unused archives, builds and
//! dependencies are collected; a namespace's code storage has a quota.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Server, repo_path, send, zip, zip_bytes};

const HELLO: &str = "def handle(event):\n    return 'hello'\n";

/// Polls `cond` every 50 ms until it holds, failing after `secs` seconds.
async fn wait_for<F: AsyncFnMut() -> bool>(what: &str, secs: u64, mut cond: F) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The function as the API shows it.
async fn function(server: &Server, ns: &str, name: &str) -> Value {
    let (status, body) = send(
        server,
        reqwest::Method::GET,
        &format!("/v1/namespaces/{ns}/functions/{name}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn upload(server: &Server, ns: &str, name: &str, archive: Vec<u8>) -> (u16, Value) {
    let resp = server
        .client
        .http()
        .put(format!(
            "{}/v1/namespaces/{ns}/functions/{name}/code",
            server.url()
        ))
        .bearer_auth(crate::harness::TOKEN)
        .header("content-type", "application/zip")
        .body(archive)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn create(server: &Server, ns: &str, name: &str) {
    let (status, body) = send(
        server,
        reqwest::Method::POST,
        &format!("/v1/namespaces/{ns}/functions"),
        Some(json!({"name": name, "runtime": "python3"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

fn blob_path(data: &Path, sha: &str) -> PathBuf {
    data.join("blobs")
        .join(&sha[..2])
        .join(format!("{sha}.zip"))
}

/// Names of the entries of `dir` that are not hidden (`.empty`, `.tmp-*`).
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Stored archives (`blobs/ab/<sha>.zip`).
fn blobs(data: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for fan in entries(&data.join("blobs")) {
        for name in entries(&data.join("blobs").join(fan)) {
            if let Some(sha) = name.strip_suffix(".zip") {
                out.push(sha.to_string());
            }
        }
    }
    out.sort();
    out
}

/// Apparent size of every file under `dir`.
fn du(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

#[tokio::test]
async fn a_corrupt_archive_is_reported_and_the_same_upload_repairs_it() {
    let mut server = Server::start_with(&["--prewarm", "0"]).await;
    let archive = zip(&[("handler.py", HELLO)]);
    create(&server, "default", "victim").await;
    let (status, up) = upload(&server, "default", "victim", archive.clone()).await;
    assert_eq!(status, 202, "{up}");
    let sha = up["code_sha256"].as_str().unwrap().to_string();
    let revision = up["revision"].as_u64().unwrap();
    server.wait_phase("default", "victim", "Ready").await;
    assert_eq!(server.get("victim", "").await, (200, "hello".to_string()));

    // The disk goes bad while the server is down: the archive's bytes change
    // (same length) and the builds are gone, so the code must be read again.
    server.stop().await;
    let path = blob_path(&server.data_dir, &sha);
    let junk: Vec<u8> = (0..archive.len()).map(|i| (i * 7 + 13) as u8).collect();
    std::fs::write(&path, &junk).unwrap();
    for key in entries(&server.data_dir.join("builds")) {
        std::fs::remove_dir_all(server.data_dir.join("builds").join(key)).unwrap();
    }
    server.restart().await;

    let f = server.wait_phase("default", "victim", "Failed").await;
    let message = f["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("corrupt") && message.contains("upload the code again"),
        "{message}"
    );
    assert_eq!(f["status"]["revision"], revision);

    // The function's URL says it failed and why; it does not claim it is missing.
    let (status, body) = server.get("victim", "").await;
    assert_eq!(status, 503, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    let text = body["error"]["message"].as_str().unwrap();
    assert!(
        text.contains("failed") && text.contains("corrupt"),
        "{text}"
    );
    // So does an HTTP trigger's route to it.
    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/triggers",
        Some(json!({"name": "web", "function": "victim", "type": "http", "path": "/v"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let t = reqwest::get(format!("{}/t/default/v", server.url()))
        .await
        .unwrap();
    assert_eq!(t.status().as_u16(), 503);

    // The source view answers in the contract's shape, not with a bare 500.
    let (status, body) = send(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces/default/functions/victim/source",
        None,
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("upload the code again"),
        "{body}"
    );

    // Uploading the original bytes repairs the archive and rebuilds the function,
    // though the revision does not change.
    let (status, up) = upload(&server, "default", "victim", archive.clone()).await;
    assert_eq!(status, 202, "{up}");
    assert_eq!(up["revision"].as_u64(), Some(revision));
    server.wait_phase("default", "victim", "Ready").await;
    assert_eq!(std::fs::read(&path).unwrap(), archive);
    assert_eq!(server.get("victim", "").await, (200, "hello".to_string()));
    let (status, body) = send(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces/default/functions/victim/source",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["items"][0]["name"], "handler.py");

    // With the archive intact, the same bytes again change nothing.
    let built = function(&server, "default", "victim").await["status"]["last_built_at"].clone();
    let (status, up) = upload(&server, "default", "victim", archive.clone()).await;
    assert_eq!((status, up["revision"].as_u64()), (202, Some(revision)));
    let f = function(&server, "default", "victim").await;
    assert_eq!(
        (
            f["status"]["phase"].clone(),
            f["status"]["last_built_at"].clone()
        ),
        (json!("Ready"), built)
    );
}

#[tokio::test]
async fn a_corrupt_archive_is_repaired_by_recreating_the_function() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    let archive = zip(&[("handler.py", HELLO)]);
    create(&server, "default", "again").await;
    let (_, up) = upload(&server, "default", "again", archive.clone()).await;
    let sha = up["code_sha256"].as_str().unwrap().to_string();
    server.wait_phase("default", "again", "Ready").await;

    std::fs::write(blob_path(&server.data_dir, &sha), b"not a zip at all").unwrap();
    for key in entries(&server.data_dir.join("builds")) {
        std::fs::remove_dir_all(server.data_dir.join("builds").join(key)).unwrap();
    }
    let (status, _) = send(
        &server,
        reqwest::Method::DELETE,
        "/v1/namespaces/default/functions/again",
        None,
    )
    .await;
    assert_eq!(status, 204);
    create(&server, "default", "again").await;
    let (status, _) = upload(&server, "default", "again", archive.clone()).await;
    assert_eq!(status, 202);
    let f = server.wait_phase("default", "again", "Ready").await;
    assert_eq!(f["status"]["code_sha256"], sha.as_str());
    assert_eq!(server.get("again", "").await, (200, "hello".to_string()));
    assert_eq!(
        std::fs::read(blob_path(&server.data_dir, &sha)).unwrap(),
        archive
    );
}

/// A Python function whose archive is `filler` bytes bigger than the others.
fn archive_with(tag: &str, filler: usize, deps: bool) -> Vec<u8> {
    let handler = format!("def handle(event):\n    return '{tag}'\n");
    let pad = vec![b'#'; filler];
    let wheel = std::fs::read(repo_path("tests/fixtures/tinylib-0.1-py3-none-any.whl")).unwrap();
    let requirements = format!("./vendor/tinylib-0.1-py3-none-any.whl\n# {tag}\n");
    let mut files: Vec<(&str, &[u8])> = vec![("handler.py", handler.as_bytes()), ("pad.txt", &pad)];
    if deps {
        files.push(("requirements.txt", requirements.as_bytes()));
        files.push(("vendor/tinylib-0.1-py3-none-any.whl", &wheel));
    }
    zip_bytes(&files)
}

#[tokio::test]
async fn unused_archives_builds_and_dependencies_are_collected() {
    let server = Server::start_with(&["--prewarm", "0", "--gc-grace-sec", "0"]).await;
    let data = server.data_dir.clone();
    // Three functions with their own code and dependencies, and one that stays.
    for (i, name) in ["tmp-a", "tmp-b", "tmp-c"].iter().enumerate() {
        create(&server, "default", name).await;
        let (status, body) = upload(
            &server,
            "default",
            name,
            archive_with(name, 100_000 * (i + 1), true),
        )
        .await;
        assert_eq!(status, 202, "{body}");
    }
    create(&server, "default", "keeper").await;
    let (_, v1) = upload(&server, "default", "keeper", archive_with("v1", 10, false)).await;
    for name in ["tmp-a", "tmp-b", "tmp-c", "keeper"] {
        let f = server.wait_phase("default", name, "Ready").await;
        assert_eq!(f["status"]["phase"], "Ready");
    }
    assert_eq!(blobs(&data).len(), 4);
    assert_eq!(entries(&data.join("builds")).len(), 4);
    assert_eq!(entries(&data.join("deps")).len(), 3);
    let before = du(&data.join("blobs")) + du(&data.join("builds")) + du(&data.join("deps"));

    for name in ["tmp-a", "tmp-b", "tmp-c"] {
        let (status, _) = send(
            &server,
            reqwest::Method::DELETE,
            &format!("/v1/namespaces/default/functions/{name}"),
            None,
        )
        .await;
        assert_eq!(status, 204);
    }
    // Deleting nudges a collection: only the keeper's code is left.
    let v1_sha = v1["code_sha256"].as_str().unwrap().to_string();
    wait_for("the deleted functions' storage to go", 30, async || {
        blobs(&data) == vec![v1_sha.clone()]
            && entries(&data.join("builds")).len() == 1
            && entries(&data.join("deps")).is_empty()
    })
    .await;
    let after = du(&data.join("blobs")) + du(&data.join("builds")) + du(&data.join("deps"));
    assert!(after * 10 < before, "before {before} bytes, after {after}");
    assert_eq!(server.get("keeper", "").await, (200, "v1".to_string()));

    // New code: the previous revision's archive and build stay (its instances
    // may be draining); the one before that goes.
    let (_, v2) = upload(&server, "default", "keeper", archive_with("v2", 20, false)).await;
    wait_for("v2 to serve", 60, async || {
        server.get("keeper", "").await == (200, "v2".to_string())
    })
    .await;
    let (_, v3) = upload(&server, "default", "keeper", archive_with("v3", 30, false)).await;
    wait_for("v3 to serve", 60, async || {
        server.get("keeper", "").await == (200, "v3".to_string())
    })
    .await;
    let (v2_sha, v3_sha) = (
        v2["code_sha256"].as_str().unwrap().to_string(),
        v3["code_sha256"].as_str().unwrap().to_string(),
    );
    let mut expected = vec![v2_sha, v3_sha];
    expected.sort();
    wait_for("v1's storage to go", 30, async || {
        blobs(&data) == expected && entries(&data.join("builds")).len() == 2
    })
    .await;
    assert_eq!(server.get("keeper", "").await, (200, "v3".to_string()));
}

#[tokio::test]
async fn uploads_over_the_namespace_storage_quota_are_refused() {
    let server = Server::start_with(&["--prewarm", "0", "--namespace-storage-mb", "1"]).await;
    let data = server.data_dir.clone();
    create(&server, "default", "first").await;
    create(&server, "default", "second").await;
    // 400 kB unpacked each (padding compresses to almost nothing).
    let a = archive_with("a", 400_000, false);
    let (status, body) = upload(&server, "default", "first", a).await;
    assert_eq!(status, 202, "{body}");
    // Replacing a function's code does not count the old code.
    let b = archive_with("b", 600_000, false);
    let (status, body) = upload(&server, "default", "first", b.clone()).await;
    assert_eq!(status, 202, "{body}");
    // The same archive in a second function is stored once and counted once.
    let (status, body) = upload(&server, "default", "second", b).await;
    assert_eq!(status, 202, "{body}");

    // 600 kB + 500 kB is over 1 MiB: refused, and nothing is stored.
    let c = archive_with("c", 500_000, false);
    let stored_before = blobs(&data);
    let (status, body) = upload(&server, "default", "second", c.clone()).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("storage") && message.contains("1.0 MiB"),
        "{message}"
    );
    assert_eq!(blobs(&data), stored_before);
    let f = function(&server, "default", "second").await;
    assert_eq!(
        f["status"]["revision"], 2,
        "the refused upload made no revision"
    );

    // Another namespace has its own quota.
    let (status, _) = send(&server, reqwest::Method::PUT, "/v1/namespaces/other", None).await;
    assert!(status == 200 || status == 201, "{status}");
    create(&server, "other", "third").await;
    let (status, body) = upload(&server, "other", "third", c).await;
    assert_eq!(status, 202, "{body}");
}

#[tokio::test]
async fn a_failed_function_answers_503_with_the_first_line_of_its_reason() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    create(&server, "default", "broken").await;
    // A dependency install that fails: the reason is a summary line followed by
    // pip's output, which only the owner should see.
    let archive = zip(&[
        ("handler.py", HELLO),
        (
            "requirements.txt",
            "./vendor/missing-0.1-py3-none-any.whl\n",
        ),
    ]);
    let (status, _) = upload(&server, "default", "broken", archive).await;
    assert_eq!(status, 202);
    let f = server.wait_phase("default", "broken", "Failed").await;
    let reason = f["status"]["message"].as_str().unwrap().to_string();
    let first = reason.lines().next().unwrap().trim_end_matches(':');
    assert!(reason.lines().count() > 1, "{reason}");

    let (status, body) = server.get("broken", "/x").await;
    assert_eq!(status, 503, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "unavailable");
    assert_eq!(
        body["error"]["message"].as_str().unwrap(),
        format!("function default/broken failed: {first}"),
        "full reason: {reason}"
    );
    // A function that does not exist is still 404.
    assert_eq!(server.get("nobody", "").await.0, 404);
    // Deleting it frees the name: 404 again.
    let (status, _) = send(
        &server,
        reqwest::Method::DELETE,
        "/v1/namespaces/default/functions/broken",
        None,
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(server.get("broken", "").await.0, 404);
}
