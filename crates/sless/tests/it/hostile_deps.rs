//! Dependency installs under hostile manifests: one namespace must never run a
//! package another namespace vendored, a changed vendored file is reinstalled,
//! and manifests that name files outside the archive fail the build clearly.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sless_client::{Client, Function};

use crate::harness::{Server, repo_path, zip_bytes};

const WHEEL: &str = "tinylib-0.1-py3-none-any.whl";

/// The fixture wheel with `tinylib/__init__.py` replaced by `module` (and a
/// RECORD that matches), under the same file name.
fn wheel_with(module: &str) -> Vec<u8> {
    let original = std::fs::read(repo_path(&format!("tests/fixtures/{WHEEL}"))).unwrap();
    let mut zin = zip::ZipArchive::new(std::io::Cursor::new(original)).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for i in 0..zin.len() {
        let mut f = zin.by_index(i).unwrap();
        let name = f.name().unwrap().to_string();
        let mut data = Vec::new();
        f.read_to_end(&mut data).unwrap();
        files.push((name, data));
    }
    for (name, data) in &mut files {
        if name == "tinylib/__init__.py" {
            *data = module.as_bytes().to_vec();
        }
    }
    let record: String = files
        .iter()
        .map(|(name, data)| {
            if name.ends_with("/RECORD") {
                format!("{name},,\n")
            } else {
                let digest = base64_url(&Sha256::digest(data));
                format!("{name},sha256={digest},{}\n", data.len())
            }
        })
        .collect();
    for (name, data) in &mut files {
        if name.ends_with("/RECORD") {
            *data = record.clone().into_bytes();
        }
    }
    let mut out = std::io::Cursor::new(Vec::new());
    {
        let mut w = zip::ZipWriter::new(&mut out);
        let opts = zip::write::SimpleFileOptions::default();
        for (name, data) in &files {
            w.start_file(name.as_str(), opts).unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap();
    }
    out.into_inner()
}

/// Unpadded URL-safe base64, as wheel RECORD files write digests.
fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn greeting_module(word: &str) -> String {
    format!("def greet(name):\n    return f\"{word} {{name}}\"\n")
}

const HANDLER: &str =
    "import tinylib\n\ndef handle(event):\n    return {'greeting': tinylib.greet('x')}\n";

/// A function archive whose `requirements.txt` only names `more.txt`, which
/// names the vendored wheel.
fn nested_requirements_archive(handler: &str, wheel: &[u8]) -> Vec<u8> {
    let wheel_path = format!("vendor/{WHEEL}");
    let more = format!("./vendor/{WHEEL}\n");
    zip_bytes(&[
        ("handler.py", handler.as_bytes()),
        ("requirements.txt", b"-rmore.txt\n"),
        ("more.txt", more.as_bytes()),
        (&wheel_path, wheel),
    ])
}

/// Creates (first time) or updates `ns/name` with `archive` through `client`
/// and waits until that revision settles.
async fn deploy(
    server: &Server,
    client: &Client,
    ns: &str,
    name: &str,
    runtime: &str,
    archive: Vec<u8>,
) -> Function {
    if client.get_function(ns, name).await.is_err() {
        client
            .create_function(ns, &json!({"name": name, "runtime": runtime}))
            .await
            .unwrap_or_else(|e| panic!("create {ns}/{name}: {e}"));
    }
    let up = client.upload_code(ns, name, archive).await.unwrap();
    let f = server.wait_settled(ns, name, up.revision).await;
    assert_eq!(f.status.revision, up.revision);
    f
}

async fn call(server: &Server, ns: &str, name: &str) -> (u16, Value) {
    let resp = server
        .client
        .http()
        .get(format!("{}/fn/{ns}/{name}", server.url()))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The function's log once it contains `needle` (polled with a deadline).
async fn log_with(client: &Client, ns: &str, name: &str, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let logs = client.logs(ns, name, Some(1000)).await.unwrap();
        if logs.contains(needle) {
            return logs;
        }
        assert!(
            Instant::now() < deadline,
            "log of {ns}/{name} never contained {needle:?}:\n{logs}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client holding a token of `ns` only.
async fn tenant(server: &Server, ns: &str) -> Client {
    server.client.ensure_namespace(ns).await.unwrap();
    let token = server.client.create_token(ns).await.unwrap();
    Client::new(&server.url(), Some(token)).unwrap()
}

#[tokio::test]
async fn a_namespace_never_runs_a_wheel_another_namespace_vendored() {
    let server = Server::start().await;
    let attacker = tenant(&server, "team-a").await;
    let victim = tenant(&server, "team-b").await;

    // The attacker deploys first: same requirements.txt and more.txt as the
    // victim will have, a wheel of the same name with planted code.
    let planted = wheel_with(&greeting_module("planted by team-a for"));
    let f = deploy(
        &server,
        &attacker,
        "team-a",
        "lib",
        "python3",
        nested_requirements_archive(HANDLER, &planted),
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    assert_eq!(
        call(&server, "team-a", "lib").await,
        (200, json!({"greeting": "planted by team-a for x"}))
    );

    let own = wheel_with(&greeting_module("team-b's own greeting for"));
    let f = deploy(
        &server,
        &victim,
        "team-b",
        "lib",
        "python3",
        nested_requirements_archive(HANDLER, &own),
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    assert_eq!(
        call(&server, "team-b", "lib").await,
        (200, json!({"greeting": "team-b's own greeting for x"})),
        "team-b must run its own wheel"
    );
    let logs = log_with(&victim, "team-b", "lib", "==> installing requirements.txt").await;
    assert!(
        !logs.contains("reusing the installed dependencies"),
        "{logs}"
    );

    // Even byte-identical archives do not share installed dependencies across
    // namespaces: team-c uploads exactly what team-a did and gets its own install.
    let other = tenant(&server, "team-c").await;
    let f = deploy(
        &server,
        &other,
        "team-c",
        "lib",
        "python3",
        nested_requirements_archive(HANDLER, &planted),
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    let logs = log_with(&other, "team-c", "lib", "==> installing requirements.txt").await;
    assert!(!logs.contains("reusing"), "{logs}");
    // The attacker still runs what it deployed.
    assert_eq!(
        call(&server, "team-a", "lib").await,
        (200, json!({"greeting": "planted by team-a for x"}))
    );
}

#[tokio::test]
async fn a_changed_vendored_wheel_is_installed_and_a_code_change_reuses_deps() {
    let server = Server::start().await;
    let client = &server.client;
    let v1 = wheel_with(&greeting_module("first"));
    let f = deploy(
        &server,
        client,
        "default",
        "wheel",
        "python3",
        nested_requirements_archive(HANDLER, &v1),
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    assert_eq!(
        call(&server, "default", "wheel").await,
        (200, json!({"greeting": "first x"}))
    );

    // Only the handler changes: the installed dependencies are reused.
    let handler_v2 =
        "import tinylib\n\ndef handle(event):\n    return {'greeting': tinylib.greet('y')}\n";
    let f = deploy(
        &server,
        client,
        "default",
        "wheel",
        "python3",
        nested_requirements_archive(handler_v2, &v1),
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    assert_eq!(
        call(&server, "default", "wheel").await,
        (200, json!({"greeting": "first y"}))
    );
    log_with(
        client,
        "default",
        "wheel",
        "requirements.txt unchanged, reusing the installed dependencies",
    )
    .await;

    // The vendored wheel changes, the requirement files do not: it is installed.
    let v2 = wheel_with(&greeting_module("second"));
    let f = deploy(
        &server,
        client,
        "default",
        "wheel",
        "python3",
        nested_requirements_archive(handler_v2, &v2),
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    assert_eq!(
        call(&server, "default", "wheel").await,
        (200, json!({"greeting": "second y"}))
    );
}

/// A Node function whose dependency is a folder named by a bare relative path
/// (no `file:` prefix), holding `index.js` = `source`.
fn node_folder_archive(source: &str, npmrc: Option<&str>) -> Vec<u8> {
    let mut files: Vec<(&str, &[u8])> = vec![
        (
            "handler.js",
            b"const l = require('localdep');\nexports.handle = async () => ({ word: l.word });\n",
        ),
        (
            "package.json",
            br#"{"name": "fn", "version": "1.0.0", "dependencies": {"localdep": "./libs/localdep"}}"#,
        ),
        (
            "libs/localdep/package.json",
            br#"{"name": "localdep", "version": "1.0.0", "main": "index.js"}"#,
        ),
        ("libs/localdep/index.js", source.as_bytes()),
    ];
    if let Some(npmrc) = npmrc {
        files.push((".npmrc", npmrc.as_bytes()));
    }
    zip_bytes(&files)
}

#[tokio::test]
async fn node_folder_dependencies_are_per_namespace_and_follow_their_files() {
    let server = Server::start().await;
    let a = tenant(&server, "team-a").await;
    let b = tenant(&server, "team-b").await;
    let f = deploy(
        &server,
        &a,
        "team-a",
        "dep",
        "nodejs",
        node_folder_archive("exports.word = 'planted';\n", None),
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    let f = deploy(
        &server,
        &b,
        "team-b",
        "dep",
        "nodejs",
        node_folder_archive("exports.word = 'own';\n", None),
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    assert_eq!(
        call(&server, "team-b", "dep").await,
        (200, json!({"word": "own"}))
    );
    assert_eq!(
        call(&server, "team-a", "dep").await,
        (200, json!({"word": "planted"}))
    );

    // The same tenant edits the folder: the new files are installed.
    let f = deploy(
        &server,
        &b,
        "team-b",
        "dep",
        "nodejs",
        node_folder_archive("exports.word = 'edited';\n", None),
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    assert_eq!(
        call(&server, "team-b", "dep").await,
        (200, json!({"word": "edited"}))
    );
    // An .npmrc is an input of the install too: adding one reinstalls.
    let f = deploy(
        &server,
        &b,
        "team-b",
        "dep",
        "nodejs",
        node_folder_archive("exports.word = 'edited';\n", Some("fund=false\n")),
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    let logs = b.logs("team-b", "dep", Some(1000)).await.unwrap();
    assert_eq!(
        logs.matches("==> installing package.json").count(),
        3,
        "{logs}"
    );
}

#[tokio::test]
async fn manifests_that_reach_outside_the_archive_fail_the_build() {
    let server = Server::start().await;
    let client = &server.client;
    let handler = "def handle(event):\n    return 1\n";
    let python_cases: &[(&str, &str, &str)] = &[
        ("abs-r", "-r /etc/passwd\n", "/etc/passwd"),
        (
            "up-r",
            "-r ../../../../etc/passwd\n",
            "../../../../etc/passwd",
        ),
        (
            "index-file",
            "--index-url file:///usr/lib/python3/dist-packages\ntinylib\n",
            "file:///usr/lib/python3/dist-packages",
        ),
        (
            "find-links",
            "--find-links=/usr/share/python-wheels\ntinylib\n",
            "/usr/share/python-wheels",
        ),
        (
            "abs-wheel",
            "/usr/share/python-wheels/pip-23.0.1-py3-none-any.whl\n",
            "/usr/share/python-wheels/pip-23.0.1-py3-none-any.whl",
        ),
        (
            "file-url",
            "tinylib @ file:///root/tinylib-0.1-py3-none-any.whl\n",
            "file:///root/tinylib-0.1-py3-none-any.whl",
        ),
        ("env-var", "-r ${HOME}/x.txt\n", "${HOME}"),
        ("missing-r", "-r nested/more.txt\n", "nested/more.txt"),
    ];
    for (name, requirements, named) in python_cases {
        let archive = zip_bytes(&[
            ("handler.py", handler.as_bytes()),
            ("requirements.txt", requirements.as_bytes()),
        ]);
        let f = deploy(&server, client, "default", name, "python3", archive).await;
        assert_eq!(f.status.phase, "Failed", "{name}: {}", f.status.message);
        assert!(
            f.status.message.starts_with("requirements.txt") && f.status.message.contains(named),
            "{name}: {}",
            f.status.message
        );
    }

    let node_cases: &[(&str, &str, Option<&str>, &str)] = &[
        (
            "node-up",
            r#"{"dependencies": {"x": "file:../../../etc"}}"#,
            None,
            "file:../../../etc",
        ),
        (
            "node-abs",
            r#"{"dependencies": {"x": "/usr/lib/node_modules/npm"}}"#,
            None,
            "/usr/lib/node_modules/npm",
        ),
        (
            "node-git-file",
            r#"{"dependencies": {"x": "git+file:///root/repo.git"}}"#,
            None,
            "git+file:///root/repo.git",
        ),
        (
            "node-npmrc",
            r#"{"dependencies": {}}"#,
            Some("cafile=/etc/ssl/private/key.pem\n"),
            "/etc/ssl/private/key.pem",
        ),
    ];
    for (name, package, npmrc, named) in node_cases {
        let mut files: Vec<(&str, &[u8])> = vec![
            ("handler.js", b"exports.handle = async () => 1;\n"),
            ("package.json", package.as_bytes()),
        ];
        if let Some(npmrc) = npmrc {
            files.push((".npmrc", npmrc.as_bytes()));
        }
        let f = deploy(
            &server,
            client,
            "default",
            name,
            "nodejs",
            zip_bytes(&files),
        )
        .await;
        assert_eq!(f.status.phase, "Failed", "{name}: {}", f.status.message);
        assert!(
            f.status.message.contains(named),
            "{name}: {}",
            f.status.message
        );
    }
}
