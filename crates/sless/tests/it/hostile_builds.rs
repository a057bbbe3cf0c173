//! Builds running hostile install scripts: an npm `postinstall` cannot reach the
//! host's services, and an install that writes without end fails at the deps
//! limit instead of filling the host's disk.

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sless_client::Function;

use crate::harness::{Server, repo_path, zip_bytes};

const TINYPKG: &str = "tinypkg-0.1.0.tgz";

/// Creates `name` (Node) and uploads `files`; the settled function.
async fn deploy_node(server: &Server, name: &str, files: &[(&str, &[u8])]) -> Function {
    server
        .client
        .create_function("default", &json!({"name": name, "runtime": "nodejs"}))
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    let up = server
        .client
        .upload_code("default", name, zip_bytes(files))
        .await
        .unwrap();
    server.wait_settled("default", name, up.revision).await
}

/// A `package.json` depending on the fixture package, with `postinstall`.
fn package_json(name: &str, postinstall: &str) -> String {
    json!({
        "name": name,
        "version": "1.0.0",
        "dependencies": {"tinypkg": format!("file:./vendor/{TINYPKG}")},
        "scripts": {"postinstall": postinstall},
    })
    .to_string()
}

/// Bytes the files under `dir` take on `dev`, the file system of the data
/// directory (other mounts below it are not the host's disk). Entries vanishing
/// meanwhile are skipped: this runs while builds come and go.
fn disk_bytes(dir: &Path, dev: u64) -> u64 {
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for entry in entries.flatten() {
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if meta.dev() != dev {
            continue;
        }
        if meta.is_dir() {
            total += disk_bytes(&entry.path(), dev);
        } else {
            total += meta.blocks() * 512;
        }
    }
    total
}

/// Samples `disk_bytes(dir)` every 20 ms until the returned flag is set; the
/// task answers the largest value seen.
fn watch_disk(dir: PathBuf) -> (Arc<AtomicBool>, tokio::task::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let dev = std::fs::metadata(&dir).unwrap().dev();
        let mut most = 0;
        while !flag.load(Ordering::Relaxed) {
            most = most.max(disk_bytes(&dir, dev));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        most
    });
    (stop, task)
}

#[tokio::test]
async fn an_install_script_cannot_reach_the_host() {
    let server = Server::start().await;
    // A service of the host's on loopback, like a database would be.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!(
        r#"const net = require('net'), fs = require('fs');
const targets = [['api', '127.0.0.1', {api}], ['listener', '127.0.0.1', {port}], ['listener_via_slirp', '10.0.2.2', {port}]];
const results = {{}};
let pending = targets.length;
for (const [name, host, port] of targets) {{
  const s = net.connect({{host, port}});
  const done = (outcome) => {{
    if (name in results) return;
    results[name] = outcome;
    s.destroy();
    if (--pending === 0) {{
      fs.mkdirSync('node_modules', {{recursive: true}});
      fs.writeFileSync('node_modules/probe-result.json', JSON.stringify(results));
    }}
  }};
  s.on('connect', () => done('connected'));
  s.on('error', (e) => done(e.code || String(e)));
  s.setTimeout(5000, () => done('timeout'));
}}
"#,
        api = server.port,
    );
    let tgz = std::fs::read(repo_path(&format!("tests/fixtures/{TINYPKG}"))).unwrap();
    let pkg = package_json("probe", "node probe.js");
    let f = deploy_node(
        &server,
        "probe",
        &[
            (
                "handler.js",
                b"exports.handle = async () => JSON.parse(require('fs').readFileSync('/deps/node_modules/probe-result.json', 'utf8'));\n",
            ),
            ("probe.js", probe.as_bytes()),
            ("package.json", pkg.as_bytes()),
            (&format!("vendor/{TINYPKG}"), &tgz),
        ],
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);

    let (status, body) = server.get("probe", "").await;
    assert_eq!(status, 200, "{body}");
    let results: Value = serde_json::from_str(&body).unwrap();
    // 127.0.0.1 in the build's namespace is its own loopback, where nothing listens;
    // slirp's alias for the host is a prohibited route.
    assert_eq!(
        results,
        json!({"api": "ECONNREFUSED", "listener": "ECONNREFUSED", "listener_via_slirp": "EACCES"}),
    );
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the install reached the host's listener: {other:?}"),
    }
}

#[tokio::test]
async fn an_install_past_the_deps_limit_fails_and_leaves_the_disk_alone() {
    let server = Server::start_with(&["--max-deps-mb", "20"]).await;
    let tgz = std::fs::read(repo_path(&format!("tests/fixtures/{TINYPKG}"))).unwrap();
    // 40 MiB into the package's own node_modules, a MiB at a time.
    let fill = "const fs = require('fs');\nfs.mkdirSync('node_modules', {recursive: true});\nconst fd = fs.openSync('node_modules/fill.bin', 'w');\nconst mib = Buffer.alloc(1 << 20, 120);\nfor (let i = 0; i < 40; i++) fs.writeSync(fd, mib);\nfs.closeSync(fd);\n";
    let pkg = package_json("fill", "node fill.js");
    let deps = server.data_dir.join("deps");
    let (stop, most) = watch_disk(deps.clone());
    let f = deploy_node(
        &server,
        "fill",
        &[
            (
                "handler.js",
                b"exports.handle = async () => ({ ok: true });\n",
            ),
            ("fill.js", fill.as_bytes()),
            ("package.json", pkg.as_bytes()),
            (&format!("vendor/{TINYPKG}"), &tgz),
        ],
    )
    .await;
    assert_eq!(f.status.phase, "Failed", "{}", f.status.message);
    assert!(
        f.status.message.starts_with(
            "the installed dependencies exceed the limit of 20 MiB (the server's --max-deps-mb)"
        ),
        "{}",
        f.status.message
    );
    stop.store(true, Ordering::Relaxed);
    let most = most.await.unwrap();
    assert!(
        most < 20 << 20,
        "{} took up to {most} bytes of the disk",
        deps.display()
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let data = server.data_dir.canonicalize().unwrap();
    assert!(
        !mounts.contains(data.to_str().unwrap()),
        "a mount under the data directory is left:\n{mounts}"
    );

    // An install within the limit still works on the same server.
    let pkg = json!({"name": "small", "version": "1.0.0", "dependencies": {"tinypkg": format!("file:./vendor/{TINYPKG}")}}).to_string();
    let f = deploy_node(
        &server,
        "small",
        &[
            ("handler.js", b"const t = require('tinypkg');\nexports.handle = async () => ({ pkg: typeof t });\n"),
            ("package.json", pkg.as_bytes()),
            (&format!("vendor/{TINYPKG}"), &tgz),
        ],
    )
    .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    let (status, body) = server.get("small", "").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"pkg\""), "{body}");
}
