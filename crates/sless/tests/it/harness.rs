//! Starting and stopping a server, and building function archives.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sless_client::{Client, Function};

pub const TOKEN: &str = "test-admin-token";

/// A running `sless serve` with its own data directory.
pub struct Server {
    child: Option<tokio::process::Child>,
    pub port: u16,
    pub data_dir: PathBuf,
    _dir: Option<tempfile::TempDir>,
    pub client: Client,
    extra_args: Vec<String>,
    /// `--database-url`, kept across restarts (`None`: the SQLite file in `data_dir`).
    pub database_url: Option<String>,
}

/// Starts `cmd` (a `sless serve` that listens on `127.0.0.1:0`) and waits for its
/// start line, which names the address it bound: no port is picked in advance (a
/// port found free and released can be taken before the server binds it), and the
/// line is printed once stored functions are back, so the server is ready. The rest
/// of its stderr is passed on to the test's.
pub async fn spawn_serving(mut cmd: tokio::process::Command) -> (tokio::process::Child, u16) {
    use tokio::io::AsyncBufReadExt;
    let mut child = cmd
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sless serve");
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let started = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            eprintln!("{line}");
            if let Some(port) = bound_port(&line) {
                return Some(port);
            }
        }
        None
    })
    .await
    .expect("sless serve printed no start line within 120 s");
    let Some(port) = started else {
        let status = child.wait().await.expect("wait");
        panic!("sless serve exited during start: {status}");
    };
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
        }
    });
    (child, port)
}

/// The port in a start line: `sless serving on http://127.0.0.1:PORT (...)`, or the
/// `listening on 127.0.0.1:PORT` it carries when the public URL is elsewhere.
fn bound_port(line: &str) -> Option<u16> {
    let rest = line.strip_prefix("sless serving on ")?;
    let addr = match rest.split_once("(listening on ") {
        Some((_, after)) => after.split(',').next()?,
        None => rest.strip_prefix("http://")?.split_whitespace().next()?,
    };
    addr.parse::<std::net::SocketAddr>().ok().map(|a| a.port())
}

impl Server {
    pub async fn start() -> Server {
        Self::start_with(&[]).await
    }

    /// Starts a server with extra `sless serve` flags.
    pub async fn start_with(args: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let data_dir = dir.path().join("data");
        let mut server = Server {
            child: None,
            port: 0,
            data_dir,
            _dir: Some(dir),
            client: Client::new("http://127.0.0.1:0", Some(TOKEN.into())).expect("client"),
            extra_args: args.iter().map(|s| s.to_string()).collect(),
            database_url: backends::new_database_url().await,
        };
        server.spawn().await;
        server
    }

    /// Starts a server on an existing data directory (and database, when given),
    /// e.g. one a restore wrote. `dir` is kept alive by the caller.
    pub async fn start_on(
        data_dir: PathBuf,
        database_url: Option<String>,
        args: &[&str],
    ) -> Server {
        let mut server = Server {
            child: None,
            port: 0,
            data_dir,
            _dir: None,
            client: Client::new("http://127.0.0.1:0", Some(TOKEN.into())).expect("client"),
            extra_args: args.iter().map(|s| s.to_string()).collect(),
            database_url,
        };
        server.spawn().await;
        server
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts the binary on a port of the kernel's choosing; after a restart the
    /// server has a new port, and `port`, `url()` and `client` follow it.
    async fn spawn(&mut self) {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"));
        cmd.arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.extra_args)
            .args(self.database_url.iter().flat_map(|u| ["--database-url", u]))
            .env("SLESS_ADMIN_TOKEN", TOKEN)
            .env("SLESS_LOG", "warn")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(s3) = blob_store::for_server(&self.data_dir) {
            cmd.arg("--blob-url").arg(&s3.blob_url).envs(s3.env());
        }
        let (child, port) = spawn_serving(cmd).await;
        self.child = Some(child);
        self.port = port;
        self.client = Client::new(&self.url(), Some(TOKEN.into())).expect("client");
    }

    /// SIGTERM, then wait for a clean exit.
    pub async fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("server running");
        let pid = child.id().expect("pid") as i32;
        // SAFETY-free: `kill` via the command-line tool keeps the tests free of unsafe.
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .expect("server exits after SIGTERM")
            .expect("wait")
    }

    /// SIGKILL: the server gets no chance to clean up.
    pub async fn kill9(&mut self) {
        let mut child = self.child.take().expect("server running");
        child.kill().await.expect("kill");
    }

    pub async fn restart(&mut self) {
        self.spawn().await;
    }

    /// Creates (or updates) a function and uploads `files`, then waits until it settles.
    pub async fn deploy(&self, name: &str, spec: Value, files: &[(&str, &str)]) -> Function {
        self.deploy_in("default", name, spec, files).await
    }

    pub async fn deploy_in(
        &self,
        ns: &str,
        name: &str,
        spec: Value,
        files: &[(&str, &str)],
    ) -> Function {
        let mut body = spec.clone();
        body["name"] = json!(name);
        if self.client.get_function(ns, name).await.is_ok() {
            self.client
                .patch_function(ns, name, &spec)
                .await
                .expect("patch");
        } else {
            self.client
                .create_function(ns, &body)
                .await
                .unwrap_or_else(|e| panic!("create {name}: {e}"));
        }
        let up = self
            .client
            .upload_code(ns, name, zip(files))
            .await
            .expect("upload");
        self.wait_settled(ns, name, up.revision).await
    }

    pub async fn wait_settled(&self, ns: &str, name: &str, revision: u64) -> Function {
        self.client
            .wait_ready(ns, name, revision, Duration::from_secs(120), |_| {})
            .await
            .unwrap_or_else(|e| panic!("{name} did not settle: {e}"))
    }

    /// Waits (bounded) until the function runs no instance, so the next call is cold.
    pub async fn wait_idle(&self, ns: &str, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let f = self.client.get_function(ns, name).await.unwrap();
            if f.status.instances.ready == 0 && f.status.instances.starting == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "{name} never scaled to zero");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls the function (bounded) until its status has `phase`, and returns it.
    pub async fn wait_phase(&self, ns: &str, name: &str, phase: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (status, f) = send(
                self,
                reqwest::Method::GET,
                &format!("/v1/namespaces/{ns}/functions/{name}"),
                None,
            )
            .await;
            assert_eq!(status, 200, "{f}");
            if f["status"]["phase"] == phase {
                return f;
            }
            assert!(
                Instant::now() < deadline,
                "{name} never reached {phase}: {}",
                f["status"]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Calls `/fn/default/{name}{path}`.
    pub async fn call(
        &self,
        name: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, String, reqwest::header::HeaderMap) {
        let url = format!("{}/fn/default/{name}{path}", self.url());
        let mut req = self.client.http().request(method, url);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        (status, resp.text().await.expect("body"), headers)
    }

    pub async fn get(&self, name: &str, path: &str) -> (u16, String) {
        let (s, b, _) = self.call(name, reqwest::Method::GET, path, None).await;
        (s, b)
    }

    /// Waits (polling, bounded) until `cond` holds for the function's log.
    pub async fn wait_log(&self, name: &str, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let logs = self
                .client
                .logs("default", name, Some(1000))
                .await
                .expect("logs");
            if logs.contains(needle) {
                return logs;
            }
            assert!(
                Instant::now() < deadline,
                "log of {name} never contained {needle:?}:\n{logs}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill")
                    .arg("-TERM")
                    .arg(pid.to_string())
                    .status();
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    if matches!(child.try_wait(), Ok(Some(_))) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let _ = child.start_kill();
        }
    }
}

/// A zip archive of `(path, content)` pairs.
pub fn zip(files: &[(&str, &str)]) -> Vec<u8> {
    zip_bytes(
        &files
            .iter()
            .map(|(p, c)| (*p, c.as_bytes()))
            .collect::<Vec<_>>(),
    )
}

#[path = "../support/backends.rs"]
pub mod backends;

#[path = "../support/zip.rs"]
mod archive;
#[path = "../support/blob_store.rs"]
pub mod blob_store;
pub use archive::zip as zip_bytes;

/// Files of a folder in the repository (examples, fixtures), for deploying them.
pub fn dir_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for entry in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let entry = entry.expect("walk");
        if entry.file_type().is_file() {
            let rel = entry
                .path()
                .strip_prefix(dir)
                .expect("prefix")
                .to_string_lossy()
                .into_owned();
            if rel.contains("__pycache__") || rel.contains("node_modules") {
                continue;
            }
            files.push((rel, std::fs::read(entry.path()).expect("read")));
        }
    }
    files
}

pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// Deploys a folder of the repository.
pub async fn deploy_dir(server: &Server, name: &str, spec: Value, dir: &Path) -> Function {
    let files = dir_files(dir);
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_slice()))
        .collect();
    let mut body = spec.clone();
    body["name"] = json!(name);
    server
        .client
        .create_function("default", &body)
        .await
        .expect("create");
    let up = server
        .client
        .upload_code("default", name, zip_bytes(&refs))
        .await
        .expect("upload");
    server.wait_settled("default", name, up.revision).await
}

/// Interpreter processes on this machine running in a sandbox of the server
/// whose data directory is `data_dir` (their mount table names its paths).
pub fn processes_with(data_dir: &std::path::Path) -> Vec<u32> {
    let needle = data_dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let interpreter = std::fs::read_link(entry.path().join("exe")).is_ok_and(|exe| {
            exe.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("python") || n == "node"
            })
        });
        if interpreter
            && std::fs::read_to_string(entry.path().join("mountinfo"))
                .is_ok_and(|m| m.contains(&needle))
        {
            found.push(pid);
        }
    }
    found
}

/// An API request with the admin token; the answer's status and JSON body (`null` if none).
pub async fn send(
    server: &Server,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    send_as(server, TOKEN, method, path, body).await
}

/// An API request with `token`; the answer's status and JSON body (`null` if none).
pub async fn send_as(
    server: &Server,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = server
        .client
        .http()
        .request(method, format!("{}{path}", server.url()))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}
