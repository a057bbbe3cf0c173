//! The server's edge under hostile clients: idle and slow connections, running out
//! of file descriptors, a full disk or a deleted database, guessed tokens, and
//! errors that must keep the contract's shape.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{Server, TOKEN, send, spawn_serving};

/// A `sless serve` started by hand: under `prlimit`, in a given data directory,
/// or with a given admin token.
pub struct Proc {
    child: tokio::process::Child,
    pub port: u16,
    _dir: Option<tempfile::TempDir>,
}

pub struct Spawn<'a> {
    pub args: &'a [&'a str],
    /// `soft:hard` open-file limit.
    pub nofile: Option<&'a str>,
    pub data_dir: Option<PathBuf>,
    pub token: &'a str,
}

impl Default for Spawn<'_> {
    fn default() -> Self {
        Spawn {
            args: &[],
            nofile: None,
            data_dir: None,
            token: TOKEN,
        }
    }
}

/// `sless serve` as `s` asks, on a port the kernel picks (the start line names it).
fn command(s: &Spawn<'_>, data_dir: &Path) -> tokio::process::Command {
    let bin = env!("CARGO_BIN_EXE_sless");
    let mut cmd = match s.nofile {
        Some(n) => {
            let mut c = tokio::process::Command::new("prlimit");
            c.arg(format!("--nofile={n}")).arg("--").arg(bin);
            c
        }
        None => tokio::process::Command::new(bin),
    };
    cmd.arg("serve")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--prewarm")
        .arg("0")
        .args(s.args)
        .env("SLESS_ADMIN_TOKEN", s.token)
        .env("SLESS_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

impl Proc {
    pub async fn start(s: Spawn<'_>) -> Proc {
        let (dir, data_dir) = match &s.data_dir {
            Some(d) => (None, d.clone()),
            None => {
                let dir = tempfile::tempdir().unwrap();
                let d = dir.path().join("data");
                (Some(dir), d)
            }
        };
        let (child, port) = spawn_serving(command(&s, &data_dir)).await;
        Proc {
            child,
            port,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    pub async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// A client whose every request gives up after 5 s: nothing here may hang.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Sends raw bytes on a fresh connection and reads until the server closes it
/// (or `wait` passes): the status (0 when nothing came back) and the body.
pub async fn raw(port: u16, request: &[u8], wait: Duration) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let _ = s.write_all(request).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    parse_response(&out)
}

pub fn parse_response(out: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Whether the server closes `s` within `within` (EOF or reset).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

fn assert_contract_error(status: u16, body: &str, want_status: u16) -> Value {
    let v: Value = serde_json::from_str(body)
        .unwrap_or_else(|_| panic!("{status}: body is not JSON: {body:?}"));
    assert_eq!(status, want_status, "{body}");
    assert!(
        v["error"]["code"].is_string() && v["error"]["message"].is_string(),
        "not the contract's error shape: {v}"
    );
    v
}

#[tokio::test]
async fn idle_connections_past_the_fd_limit_do_not_lock_out_health_checks() {
    // Soft 64, hard 256: the server raises the soft limit itself, and serves at most
    // half of it as connections. The header timeout is long: health checks must
    // get in while the idle connections still hold their slots.
    let server = Proc::start(Spawn {
        nofile: Some("64:256"),
        args: &["--header-timeout-sec", "30"],
        ..Spawn::default()
    })
    .await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        line.split_whitespace().nth(3),
        Some("256"),
        "soft limit raised to the hard one: {line}"
    );

    let mut idle = Vec::new();
    for _ in 0..400 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_secs(2),
            TcpStream::connect(("127.0.0.1", server.port)),
        )
        .await
        {
            idle.push(s);
        }
    }
    assert!(idle.len() > 300, "only {} connections opened", idle.len());

    let http = client();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(10);
    loop {
        let r = http.get(format!("{}/healthz", server.url())).send().await;
        if matches!(&r, Ok(r) if r.status() == 200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz did not answer with 400 idle connections open: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The API answers too, with credentials.
    let r = http
        .get(format!("{}/v1/whoami", server.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // While new idle connections keep coming, every health check still gets in.
    let port = server.port;
    let flood = tokio::spawn(async move {
        let mut held = std::collections::VecDeque::new();
        loop {
            if let Ok(s) = TcpStream::connect(("127.0.0.1", port)).await {
                held.push_back(s);
                if held.len() > 600 {
                    held.pop_front();
                }
            }
            tokio::task::yield_now().await;
        }
    });
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for i in 0..20 {
        let r = fresh
            .get(format!("{}/healthz", server.url()))
            .send()
            .await
            .unwrap_or_else(|e| panic!("health check {i} during the flood: {e}"));
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    flood.abort();
    drop(idle);
    server.stop().await;
}

/// CPU time (user + system, in clock ticks) a process has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[tokio::test]
async fn out_of_descriptors_the_server_backs_off_and_recovers() {
    // A connection limit above what the open-file limit allows: accept itself fails
    // with EMFILE. The server must neither exit nor spin, and must serve again once
    // the idle connections time out.
    let server = Proc::start(Spawn {
        nofile: Some("128:128"),
        args: &["--max-connections", "10000", "--header-timeout-sec", "2"],
        ..Spawn::default()
    })
    .await;
    let before = cpu_ticks(server.pid());
    let started = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..300 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_secs(2),
            TcpStream::connect(("127.0.0.1", server.port)),
        )
        .await
        {
            idle.push(s);
        }
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = http.get(format!("{}/healthz", server.url())).send().await;
        if matches!(&r, Ok(r) if r.status() == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "never recovered: {r:?}");
    }
    let ticks = cpu_ticks(server.pid()) - before;
    let secs = started.elapsed().as_secs_f64();
    // 100 ticks a second is one core busy; backing off uses a small fraction of that.
    assert!(
        (ticks as f64) < 50.0 * secs,
        "{ticks} ticks of CPU in {secs:.1} s: the accept loop spins"
    );
    drop(idle);
    server.stop().await;
}

#[tokio::test]
async fn idle_slow_and_stalled_connections_are_closed_after_the_timeouts() {
    let server = Proc::start(Spawn {
        args: &["--header-timeout-sec", "1", "--body-timeout-sec", "1"],
        ..Spawn::default()
    })
    .await;
    // Idle from the start.
    let mut idle = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    // Headers that never end (slowloris).
    let mut slow = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n")
        .await
        .unwrap();
    // Idle after a request on a kept-alive connection.
    let mut kept = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), kept.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));

    let opened = Instant::now();
    for (what, s) in [
        ("idle", &mut idle),
        ("slow headers", &mut slow),
        ("kept alive", &mut kept),
    ] {
        assert!(
            closed_within(s, Duration::from_secs(6)).await,
            "{what} connection still open after {:?}",
            opened.elapsed()
        );
    }

    // A body that stops arriving: 408 in the contract's shape, on the API and the gateway.
    for path in ["/v1/namespaces/default/functions", "/fn/default/nothing"] {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"name\":"
        );
        let (status, body) = raw(server.port, req.as_bytes(), Duration::from_secs(6)).await;
        if path.starts_with("/fn/") {
            // No such function: answered before the body is read.
            assert_contract_error(status, &body, 404);
        } else {
            assert_contract_error(status, &body, 408);
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn a_short_admin_token_stops_the_server_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let s = Spawn {
        token: "short",
        ..Spawn::default()
    };
    let out = command(&s, &dir.path().join("data"))
        .stderr(Stdio::piped())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .unwrap()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SLESS_ADMIN_TOKEN is too short") && err.contains("at least 16"),
        "{err}"
    );
}

#[tokio::test]
async fn failed_authentication_is_limited_per_address_and_the_scheme_is_case_insensitive() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    let http = client();
    let whoami = format!("{}/v1/whoami", server.url());
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let r = http
            .get(&whoami)
            .header("authorization", format!("{scheme} {TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "scheme {scheme}");
    }
    // Successes do not count.
    for _ in 0..30 {
        let r = http.get(&whoami).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    // 20 failures a minute, then 429 with Retry-After.
    for i in 0..20 {
        let r = http
            .get(&whoami)
            .bearer_auth(format!("guess-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "failure {i}");
    }
    let r = http
        .get(&whoami)
        .bearer_auth("guess-x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let body = r.text().await.unwrap();
    assert_contract_error(429, &body, 429);
    // Requests without credentials are not affected.
    let r = http
        .get(format!("{}/healthz", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Another address is not affected (loopback has all of 127/8).
    let other = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let r = other.get(&whoami).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = other.get(&whoami).bearer_auth("nope").send().await.unwrap();
    assert_eq!(r.status(), 401);
}

const HELLO: &str = "def handle(event):\n    return {'path': event.get('path')}\n";

#[tokio::test]
async fn http_triggers_to_private_functions_need_a_token_of_their_namespace() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    server
        .deploy(
            "secret",
            json!({"runtime": "python3", "private": true}),
            &[("handler.py", HELLO)],
        )
        .await;
    let (status, _) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/triggers",
        Some(json!({"name": "open-door", "function": "secret", "type": "http", "path": "/door"})),
    )
    .await;
    assert_eq!(status, 201);
    let http = client();
    let url = format!("{}/t/default/door", server.url());
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_contract_error(401, &r.text().await.unwrap(), 401);
    let r = http.get(&url).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = http
        .get(&url)
        .header("authorization", format!("bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["path"], "/door");
    // Guessing through a private function is limited like the API.
    for _ in 0..25 {
        http.get(&url).bearer_auth("guess").send().await.unwrap();
    }
    let r = http.get(&url).bearer_auth("guess").send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn every_error_has_the_contract_shape() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    let ns = "/v1/namespaces/default";
    let (status, _) = send(
        &server,
        reqwest::Method::POST,
        &format!("{ns}/functions"),
        Some(json!({"name": "f", "runtime": "python3"})),
    )
    .await;
    assert_eq!(status, 201);
    let http = client();
    let cases: &[(&str, &str, u16)] = &[
        (
            "GET",
            "/v1/namespaces/default/functions/f/logs?tail=-1",
            400,
        ),
        ("GET", "/v1/namespaces/default/jobs/x?wait=-1", 400),
        ("GET", "/v1/namespaces/default/invocations?limit=1001", 400),
        ("GET", "/v1/namespaces/default/functions/%ff", 400),
        ("GET", "/fn/default/%ff", 400),
        ("GET", "/fn/%ff/x/y", 400),
        ("GET", "/t/%ff/x", 400),
        ("DELETE", "/v1/whoami", 405),
        ("POST", "/healthz", 405),
        ("GET", "/v1/nothing-here", 404),
    ];
    for (method, path, want) in cases {
        let r = http
            .request(method.parse().unwrap(), format!("{}{path}", server.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert_eq!(status, *want, "{method} {path}: {body}");
        assert_contract_error(status, &body, *want);
    }
    let (status, body) = send(
        &server,
        reqwest::Method::GET,
        &format!("{ns}/invocations?limit=1001"),
        None,
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1 to 1000"),
        "{body}"
    );
}

#[tokio::test]
async fn a_deleted_database_makes_the_server_unready_and_refuses_writes() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    let http = client();
    let r = http
        .get(format!("{}/readyz", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    std::fs::remove_file(server.data_dir.join("sless.db")).unwrap();
    let r = http
        .get(format!("{}/readyz", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert!(body.to_string().contains("removed"), "{body}");
    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/functions",
        Some(json!({"name": "lost", "runtime": "python3"})),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "unavailable");
}

/// A tmpfs of `mib` MiB mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u64) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount a tmpfs (the tests run as root)");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the disk is full.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[tokio::test]
async fn a_full_disk_makes_the_server_unready_and_writes_answer_507() {
    let disk = Tmpfs::mount(16);
    let server = Proc::start(Spawn {
        data_dir: Some(disk.path().join("data")),
        args: &["--min-free-mb", "2"],
        ..Spawn::default()
    })
    .await;
    let http = client();
    let create = |name: &str| {
        http.post(format!("{}/v1/namespaces/default/functions", server.url()))
            .bearer_auth(TOKEN)
            .json(&json!({"name": name, "runtime": "python3"}))
            .send()
    };
    assert_eq!(create("before").await.unwrap().status(), 201);
    let ready = || http.get(format!("{}/readyz", server.url())).send();
    assert_eq!(ready().await.unwrap().status(), 200);

    let filler = disk.fill();
    let r = ready().await.unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert!(body.to_string().contains("disk is full"), "{body}");
    let r = create("during").await.unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    let v = assert_contract_error(status, &body, 507);
    assert_eq!(v["error"]["code"], "insufficient_storage");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disk is full"),
        "{v}"
    );
    // Reads still work, and space coming back makes the server ready again.
    let r = http
        .get(format!("{}/v1/namespaces/default/functions", server.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(ready().await.unwrap().status(), 200);
    assert_eq!(create("after").await.unwrap().status(), 201);
    server.stop().await;
}

#[tokio::test]
async fn writes_the_disk_cannot_take_answer_507_not_500() {
    // No free-space margin: the store and the code store meet ENOSPC themselves.
    let disk = Tmpfs::mount(16);
    let server = Proc::start(Spawn {
        data_dir: Some(disk.path().join("data")),
        args: &["--min-free-mb", "0"],
        ..Spawn::default()
    })
    .await;
    let http = client();
    let url = server.url();
    let r = http
        .post(format!("{url}/v1/namespaces/default/functions"))
        .bearer_auth(TOKEN)
        .json(&json!({"name": "f", "runtime": "python3"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    disk.fill();
    // A code archive goes to the code store.
    let archive = crate::harness::zip(&[("main.py", &"# padding\n".repeat(20_000))]);
    let r = http
        .put(format!("{url}/v1/namespaces/default/functions/f/code"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/zip")
        .body(archive)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    let v = assert_contract_error(status, &body, 507);
    assert_eq!(v["error"]["code"], "insufficient_storage", "{v}");
    // Metadata writes until the database cannot grow: never a 500.
    let big = "x".repeat(4000);
    let mut refused = None;
    for i in 0..3000 {
        let r = http
            .post(format!("{url}/v1/namespaces/default/functions"))
            .bearer_auth(TOKEN)
            .json(&json!({"name": format!("g{i}"), "runtime": "python3", "env": {"PAD": big}}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        if status != 201 {
            refused = Some((status, r.text().await.unwrap()));
            break;
        }
    }
    let (status, body) = refused.expect("the full disk refused a write");
    let v = assert_contract_error(status, &body, 507);
    assert_eq!(v["error"]["code"], "insufficient_storage", "{v}");
    server.stop().await;
}

#[tokio::test]
async fn a_function_that_cannot_start_tells_anonymous_callers_no_internals() {
    // Cold starts (no pre-started instances): the start error carries the
    // instance's last output, a Python traceback.
    let server = Server::start_with(&["--prewarm", "0"]).await;
    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/functions",
        Some(json!({"name": "broken", "runtime": "python3"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let code = "SECRET = 'hunter2-' + 'pw'\n\
                raise ValueError('cannot read /srv/owner/config.ini with ' + SECRET)\n\
                def handle(event):\n    return 'never'\n";
    server
        .client
        .upload_code(
            "default",
            "broken",
            crate::harness::zip(&[("handler.py", code)]),
        )
        .await
        .expect("upload");
    let f = server.wait_phase("default", "broken", "Failed").await;
    // The owner sees everything in the status and the log.
    let reason = f["status"]["message"].as_str().unwrap().to_string();
    assert!(reason.contains("could not start"), "{reason}");
    assert!(reason.contains("hunter2"), "{reason}");
    server.wait_log("broken", "Traceback").await;

    // Anyone calling the URL learns that it could not start, the exception's type,
    // and where its owner looks; no path, source line or value. Twice: the second
    // call may meet a pool left from the failed deploy and start it afresh.
    let http = client();
    for _ in 0..2 {
        for url in [
            format!("{}/fn/default/broken", server.url()),
            format!("{}/fn/default/broken/some/path?q=1", server.url()),
        ] {
            let r = http.get(&url).send().await.unwrap();
            let status = r.status().as_u16();
            let body = r.text().await.unwrap();
            assert_eq!(status, 503, "{body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["error"]["code"], "unavailable", "{body}");
            let message = v["error"]["message"].as_str().unwrap();
            // The type is named when the reason at hand still has the runtime's
            // load error (the executor's does; a failed revision's summary may not).
            let said = [
                "function default/broken could not start (ValueError while loading its code): \
                 its owner finds the reason in the function's logs and status",
                "function default/broken could not start: its owner finds the reason in the \
                 function's logs and status",
            ];
            assert!(said.contains(&message), "{message}");
            for internal in [
                "hunter2",
                "/srv",
                "/code",
                "Traceback",
                "line ",
                "handler.py",
            ] {
                assert!(!message.contains(internal), "{internal:?} in {message}");
            }
        }
    }
}

#[tokio::test]
async fn out_of_range_query_values_are_refused_naming_the_parameter_and_range() {
    let server = Server::start_with(&["--prewarm", "0"]).await;
    let ns = "/v1/namespaces/default";
    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        &format!("{ns}/functions"),
        Some(json!({"name": "f", "runtime": "python3"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        &format!("{ns}/jobs"),
        Some(json!({"name": "j", "function": "f", "run_id": 0})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let refused = [
        ("functions/f/logs?tail=100001", "tail", "0 to 100000"),
        ("functions/f/logs?tail=-1", "tail", "0 to 100000"),
        (
            "functions/f/logs?tail=many&follow=true",
            "tail",
            "0 to 100000",
        ),
        ("jobs/j?wait=901", "wait", "0 to 900"),
        ("jobs/j?wait=1e9", "wait", "0 to 900"),
        ("jobs/j?wait=18446744073709551616", "wait", "0 to 900"),
        ("invocations?limit=1001", "limit", "1 to 1000"),
        ("invocations?limit=0", "limit", "1 to 1000"),
    ];
    for (path, parameter, range) in refused {
        let (status, body) =
            send(&server, reqwest::Method::GET, &format!("{ns}/{path}"), None).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], "invalid", "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("{parameter}: must be a whole number from {range}")),
            "{path}: {message}"
        );
    }
    // The bounds themselves are accepted.
    for path in [
        "functions/f/logs?tail=100000",
        "functions/f/logs?tail=0",
        "jobs/j?wait=900",
        "jobs/j?wait=",
        "invocations?limit=1000",
    ] {
        let r = client()
            .get(format!("{}{ns}/{path}", server.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
}
