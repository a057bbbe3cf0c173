//! An in-process server in a temporary data directory, driven through its
//! service with `tower::ServiceExt::oneshot`: no socket, no spawned binary.

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use serde_json::Value;
use sless::serve::{ServeArgs, Server};
use tower::ServiceExt;

#[path = "../support/blob_store.rs"]
pub mod blob_store;

/// The admin token every test server is started with.
pub const ADMIN: &str = "api-test-admin-token";

/// Largest code archive the test servers accept (1 MiB), so `413` is cheap to reach.
pub const MAX_ARCHIVE_MB: u64 = 1;

/// A server built in-process: no instance is ever started (no warm pool, and no
/// test uploads code that would be built).
pub struct App {
    pub server: Server,
    /// `--database-url` (`None`: the SQLite file in the data directory).
    pub database_url: Option<String>,
    _dir: tempfile::TempDir,
}

/// One request to the app.
pub struct Req {
    method: Method,
    path: String,
    token: Option<String>,
    /// A raw `Authorization` header, sent instead of `Bearer <token>`.
    authorization: Option<String>,
    content_type: Option<String>,
    /// Other headers (`If-Match`).
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Req {
    pub fn new(method: Method, path: &str) -> Req {
        Req {
            method,
            path: path.to_string(),
            token: Some(ADMIN.to_string()),
            authorization: None,
            content_type: None,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }
    pub fn get(path: &str) -> Req {
        Req::new(Method::GET, path)
    }
    pub fn delete(path: &str) -> Req {
        Req::new(Method::DELETE, path)
    }
    /// `method path` with a JSON body.
    pub fn json(method: Method, path: &str, body: &Value) -> Req {
        Req::new(method, path).body("application/json", body.to_string().into_bytes())
    }
    pub fn body(mut self, content_type: &str, body: Vec<u8>) -> Req {
        self.content_type = Some(content_type.to_string());
        self.body = body;
        self
    }
    pub fn token(mut self, token: Option<&str>) -> Req {
        self.token = token.map(str::to_string);
        self
    }
    /// Adds a header (may be repeated).
    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
    pub fn authorization(mut self, value: &str) -> Req {
        self.authorization = Some(value.to_string());
        self
    }
    /// `METHOD path`, for messages.
    pub fn what(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// Builds a server as [`App::start_with`] does; the error that stopped it.
pub async fn start_error(flags: &[&str]) -> anyhow::Error {
    match App::build(flags).await {
        Ok(_) => panic!("the server started with {flags:?}"),
        Err(e) => e,
    }
}

impl App {
    /// Builds a server as `sless serve` would, with `flags` added.
    pub async fn start_with(flags: &[&str]) -> App {
        App::build(flags).await.expect("server builds")
    }

    async fn build(flags: &[&str]) -> anyhow::Result<App> {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("data dir");
        // The server reads its admin token from here when SLESS_ADMIN_TOKEN is unset.
        std::fs::write(data.join("admin-token"), ADMIN).expect("admin token");
        let archive_mb = MAX_ARCHIVE_MB.to_string();
        let mut argv = vec!["--data-dir", data.to_str().expect("utf-8 path")];
        // Defaults for tests, each unless `flags` sets it.
        for (flag, value) in [
            ("--listen", "127.0.0.1:0"),
            ("--prewarm", "0"),
            ("--max-archive-mb", archive_mb.as_str()),
            ("--max-body-mb", "1"),
            ("--min-free-mb", "0"),
        ] {
            if !flags.contains(&flag) {
                argv.extend([flag, value]);
            }
        }
        argv.extend_from_slice(flags);
        let database_url = backends::new_database_url().await;
        if let Some(url) = &database_url {
            argv.extend(["--database-url", url.as_str()]);
        }
        let s3 = (!flags.contains(&"--blob-url"))
            .then(|| blob_store::for_server(&data).map(|s3| s3.flags()))
            .flatten();
        argv.extend(s3.iter().flatten().map(String::as_str));
        let args = ServeArgs::from_flags(argv).expect("flags");
        let server = Server::build(args).await?;
        Ok(App {
            server,
            database_url,
            _dir: dir,
        })
    }

    /// A second connection to the server's metadata store, for looking behind the API.
    pub async fn open_store(&self) -> sless_store::SqlStore {
        match &self.database_url {
            Some(url) => sless_store::SqlStore::from_url(url).await,
            None => sless_store::SqlStore::open(&self.server.data_dir().join("sless.db")).await,
        }
        .expect("the store opens")
    }

    pub async fn start() -> App {
        App::start_with(&[]).await
    }

    /// Sends `req`; the status and the body as JSON (`Value::String` if it is not JSON).
    pub async fn send(&self, req: Req) -> (StatusCode, Value) {
        let (status, _, body) = self.send_full(req).await;
        (status, body)
    }

    /// Sends `req`; the status, the headers and the body as [`App::send`] reads it.
    pub async fn send_full(&self, req: Req) -> (StatusCode, HeaderMap, Value) {
        let mut builder = Request::builder().method(req.method).uri(&req.path);
        if let Some(value) = &req.authorization {
            builder = builder.header("authorization", value);
        } else if let Some(token) = &req.token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        if let Some(ct) = &req.content_type {
            builder = builder.header("content-type", ct);
        }
        for (name, value) in &req.headers {
            builder = builder.header(name, value);
        }
        let request = builder.body(Body::from(req.body)).expect("request");
        let response = self
            .server
            .app()
            .oneshot(request)
            .await
            .expect("infallible");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), 16 << 20)
            .await
            .expect("body");
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, headers, body)
    }

    /// Sends `req` and asserts the contract's error: `status`, `{"error": {"code",
    /// "message"}}` with that `code`, and a message containing every one of `names`
    /// (the field or object at fault).
    pub async fn expect_error(&self, req: Req, status: u16, code: &str, names: &[&str]) -> String {
        let what = req.what();
        let (got, body) = self.send(req).await;
        assert_eq!(got.as_u16(), status, "{what}: {body}");
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no error.message in {body}"));
        assert_eq!(body["error"]["code"], code, "{what}: {body}");
        let keys: Vec<&String> = body
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        assert_eq!(keys, ["error"], "{what}: only `error` at the top: {body}");
        for name in names {
            assert!(
                message.contains(name),
                "{what}: message {message:?} does not name {name:?}"
            );
        }
        message.to_string()
    }

    /// Sends `req` and asserts it succeeded with `status`; the body.
    pub async fn expect(&self, req: Req, status: u16) -> Value {
        let what = req.what();
        let (got, body) = self.send(req).await;
        assert_eq!(got.as_u16(), status, "{what}: {body}");
        body
    }

    /// Creates a python3 function named `name` in `ns` (no code: it stays `Pending`).
    pub async fn function(&self, ns: &str, name: &str) {
        let body = serde_json::json!({"name": name, "runtime": "python3"});
        self.expect(
            Req::json(
                Method::POST,
                &format!("/v1/namespaces/{ns}/functions"),
                &body,
            ),
            201,
        )
        .await;
    }

    /// Creates a trigger (HTTP route `/t/default/<name>`) or a job (`run_id: 0`,
    /// so it never runs) of function `function` in the default namespace.
    pub async fn trigger(&self, name: &str, function: &str) {
        let body = serde_json::json!({"name": name, "function": function, "type": "http", "path": format!("/{name}")});
        self.expect(
            Req::json(Method::POST, "/v1/namespaces/default/triggers", &body),
            201,
        )
        .await;
    }

    pub async fn job(&self, name: &str, spec: Value) {
        let mut body = spec;
        body["name"] = Value::from(name);
        self.expect(
            Req::json(Method::POST, "/v1/namespaces/default/jobs", &body),
            201,
        )
        .await;
    }

    /// A token of namespace `ns` (created if need be).
    pub async fn namespace_token(&self, ns: &str) -> String {
        self.send(Req::new(Method::PUT, &format!("/v1/namespaces/{ns}")))
            .await;
        let body = self
            .expect(
                Req::json(
                    Method::POST,
                    "/v1/tokens",
                    &serde_json::json!({"namespace": ns}),
                ),
                201,
            )
            .await;
        body["token"].as_str().expect("token").to_string()
    }
}

#[path = "../support/backends.rs"]
pub mod backends;

#[path = "../support/zip.rs"]
mod archive;
pub use archive::zip;
