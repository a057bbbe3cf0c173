//! Typed HTTP client for the sless API v1, used by the CLI and the end-to-end tests.
//!
//! Every call maps a non-success answer to [`ClientError::Api`] with the server's own
//! `code` and `message`, so callers can show users what the server said. The one exception
//! is [`Client::invoke`]: a function's answer is data, whatever its status.

pub mod archive;
mod error;
mod types;

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::{Method, RequestBuilder, Response, Url, header};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

pub use error::ClientError;
pub use reqwest::header::HeaderMap;
pub use sless_api_types::{Call, CallQueued, CallResponse, DeadLetter, Redriven};
pub use sless_api_types::{CommandSent, Device, DeviceMqtt, DeviceStatus, Telemetry};
pub use types::Secret;
pub use types::{
    CodeUploaded, Function, FunctionPhase, FunctionStatus, InstanceCounts, Invocation,
    InvocationQuery, InvokeResponse, Job, JobPhase, JobStatus, Namespace, Trigger, TriggerKind,
    TriggerResult, TriggerSpec, TriggerStatus, UploadResponse,
};

use types::Items;

/// Result of every client call.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// How often [`Client::wait_ready`] polls the function's status.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The longest `?wait=` one [`Client::wait_job`] request asks the server to block for; short
/// enough that proxies with idle timeouts in between do not cut the request off.
const JOB_WAIT_SECS: u64 = 30;

/// A connection to one sless server with one (optional) bearer token.
///
/// Cheap to clone: the underlying connection pool is shared.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The server's base URL, normalised to have no trailing slash.
    base: String,
    /// `base` parsed, the starting point of every request URL.
    base_url: Url,
    token: Option<String>,
}

impl Client {
    /// Creates a client for `server` (`http://host:port`, `https://host/prefix`, or a bare
    /// `host:port`, which means plain HTTP). `token` is sent as `Authorization: Bearer`.
    pub fn new(server: &str, token: Option<String>) -> Result<Client> {
        Client::with_ca_cert(server, token, None)
    }

    /// Like [`Client::new`]; with `ca_pem` (one or more PEM certificates), an `https://`
    /// server is trusted only if its certificate chains to one of them, instead of to the
    /// system's trust store (as `curl --cacert` does): for a server with a private CA.
    pub fn with_ca_cert(
        server: &str,
        token: Option<String>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Client> {
        let invalid = |reason: &str| ClientError::InvalidUrl {
            url: server.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = server.trim();
        if trimmed.is_empty() {
            return Err(invalid("it is empty"));
        }
        let with_scheme = if trimmed.contains("://") {
            trimmed.to_string()
        } else {
            format!("http://{trimmed}")
        };
        let url = Url::parse(&with_scheme).map_err(|e| invalid(&e.to_string()))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(invalid("only http:// and https:// are supported"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(invalid("it may not have a query or fragment"));
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("sless-client/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
                ClientError::InvalidCaCert {
                    reason: format!("it is not PEM: {e}"),
                }
            })?;
            if certs.is_empty() {
                return Err(ClientError::InvalidCaCert {
                    reason: "it holds no `-----BEGIN CERTIFICATE-----` block".to_string(),
                });
            }
            builder = builder.tls_certs_only(certs);
        }
        let http = builder.build().map_err(|source| ClientError::Http {
            url: server.to_string(),
            source,
        })?;
        let base = url.as_str().trim_end_matches('/').to_string();
        Ok(Client {
            http,
            base,
            base_url: url,
            token: token.filter(|t| !t.is_empty()),
        })
    }

    /// The server's base URL without a trailing slash, e.g. `http://127.0.0.1:8080`.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The underlying HTTP client, for requests this type has no method for (e.g. `/fn/` calls).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The public URL of a function: `{base}/fn/{ns}/{name}`.
    pub fn function_url(&self, ns: &str, name: &str) -> String {
        self.url(&["fn", ns, name]).to_string()
    }

    /// `GET /v1/whoami`: `{"admin": bool, "namespaces": [...]}` for the presented token.
    pub async fn whoami(&self) -> Result<Value> {
        self.get_json(self.url(&["v1", "whoami"])).await
    }

    /// `PUT /v1/namespaces/{ns}`: true when the namespace was created, false when it existed.
    pub async fn ensure_namespace(&self, ns: &str) -> Result<bool> {
        let url = self.url(&["v1", "namespaces", ns]);
        let resp = self.send(self.http.put(url.clone()), &url).await?;
        Ok(resp.status() == reqwest::StatusCode::CREATED)
    }

    /// `GET /v1/namespaces`: the namespaces the token may see.
    pub async fn list_namespaces(&self) -> Result<Vec<Namespace>> {
        let items: Items<Namespace> = self.get_json(self.url(&["v1", "namespaces"])).await?;
        Ok(items.items)
    }

    /// `DELETE /v1/namespaces/{ns}`: deletes an empty namespace; with `force` the
    /// namespace and everything in it go to the server's trash instead, from which
    /// [`Client::restore_namespace`] brings them back.
    pub async fn delete_namespace(&self, ns: &str, force: bool) -> Result<()> {
        let mut url = self.url(&["v1", "namespaces", ns]);
        if force {
            url.query_pairs_mut().append_pair("force", "true");
        }
        self.send(self.http.delete(url.clone()), &url).await?;
        Ok(())
    }

    /// `POST /v1/namespaces/{ns}/restore` (admin only): brings back the namespace most
    /// recently force-deleted under this name, with everything it held; answers once
    /// its functions serve again. 404 when none is in the trash, 409 when a namespace
    /// of that name was created since.
    pub async fn restore_namespace(&self, ns: &str) -> Result<sless_api_types::NamespaceDetail> {
        let url = self.url(&["v1", "namespaces", ns, "restore"]);
        let resp = self.send(self.http.post(url.clone()), &url).await?;
        decode(resp, &url).await
    }

    /// `POST /v1/namespaces/{ns}/functions` with `body` (`name`, `runtime` and spec fields).
    pub async fn create_function(&self, ns: &str, body: &Value) -> Result<Function> {
        let url = self.url(&["v1", "namespaces", ns, "functions"]);
        let resp = self
            .send(self.http.post(url.clone()).json(body), &url)
            .await?;
        decode(resp, &url).await
    }

    /// `GET /v1/namespaces/{ns}/functions/{name}`.
    pub async fn get_function(&self, ns: &str, name: &str) -> Result<Function> {
        self.get_json(self.url(&["v1", "namespaces", ns, "functions", name]))
            .await
    }

    /// `GET /v1/namespaces/{ns}/functions`.
    pub async fn list_functions(&self, ns: &str) -> Result<Vec<Function>> {
        let items: Items<Function> = self
            .get_json(self.url(&["v1", "namespaces", ns, "functions"]))
            .await?;
        Ok(items.items)
    }

    /// `PATCH /v1/namespaces/{ns}/functions/{name}` with a JSON merge patch of spec fields.
    pub async fn patch_function(&self, ns: &str, name: &str, patch: &Value) -> Result<Function> {
        self.merge_patch(
            self.url(&["v1", "namespaces", ns, "functions", name]),
            patch,
        )
        .await
    }

    /// `DELETE /v1/namespaces/{ns}/functions/{name}`.
    pub async fn delete_function(&self, ns: &str, name: &str) -> Result<()> {
        self.delete(self.url(&["v1", "namespaces", ns, "functions", name]))
            .await
    }

    /// `PUT /v1/namespaces/{ns}/functions/{name}/code` with a zip archive.
    pub async fn upload_code(&self, ns: &str, name: &str, zip: Vec<u8>) -> Result<UploadResponse> {
        let url = self.url(&["v1", "namespaces", ns, "functions", name, "code"]);
        let req = self
            .http
            .put(url.clone())
            .header(header::CONTENT_TYPE, "application/zip")
            .body(zip);
        let resp = self.send(req, &url).await?;
        decode(resp, &url).await
    }

    /// `POST /v1/namespaces/{ns}/functions/{name}/invoke` with `event` as the body.
    ///
    /// Returns the function's answer whatever its status (a handler may answer 4xx/5xx on
    /// purpose); only transport failures are errors. Check [`InvokeResponse::is_success`].
    pub async fn invoke(&self, ns: &str, name: &str, event: &Value) -> Result<InvokeResponse> {
        let url = self.url(&["v1", "namespaces", ns, "functions", name, "invoke"]);
        let req = self.authorize(self.http.post(url.clone()).json(event));
        let resp = req.send().await.map_err(|e| http_error(&url, e))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.map_err(|e| http_error(&url, e))?;
        Ok(InvokeResponse {
            status,
            headers,
            body,
        })
    }

    /// `POST .../functions/{name}/invoke?async=true`: queues a call of `name` with
    /// `event`, its result POSTed to `callback` when it ends; answers with the call's id.
    pub async fn invoke_async(
        &self,
        ns: &str,
        name: &str,
        event: &Value,
        callback: Option<&str>,
    ) -> Result<CallQueued> {
        let mut url = self.url(&["v1", "namespaces", ns, "functions", name, "invoke"]);
        url.query_pairs_mut().append_pair("async", "true");
        let mut req = self.http.post(url.clone()).json(event);
        if let Some(callback) = callback {
            req = req.header("x-callback-url", callback);
        }
        let resp = self.send(req, &url).await?;
        decode(resp, &url).await
    }

    /// `GET /v1/namespaces/{ns}/calls/{id}`.
    pub async fn get_call(&self, ns: &str, id: &str) -> Result<Call> {
        self.get_json(self.url(&["v1", "namespaces", ns, "calls", id]))
            .await
    }

    /// `GET /v1/namespaces/{ns}/calls?function=&phase=&limit=`, newest first.
    pub async fn list_calls(
        &self,
        ns: &str,
        function: Option<&str>,
        phase: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Vec<Call>> {
        let mut url = self.url(&["v1", "namespaces", ns, "calls"]);
        {
            let mut q = url.query_pairs_mut();
            if let Some(f) = function {
                q.append_pair("function", f);
            }
            if let Some(p) = phase {
                q.append_pair("phase", p);
            }
            if let Some(l) = limit {
                q.append_pair("limit", &l.to_string());
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        let items: Items<Call> = self.get_json(url).await?;
        Ok(items.items)
    }

    /// `GET /v1/namespaces/{ns}/dead-letters?trigger=&function=`, newest first.
    pub async fn list_dead_letters(
        &self,
        ns: &str,
        trigger: Option<&str>,
        function: Option<&str>,
    ) -> Result<Vec<DeadLetter>> {
        let mut url = self.url(&["v1", "namespaces", ns, "dead-letters"]);
        {
            let mut q = url.query_pairs_mut();
            if let Some(t) = trigger {
                q.append_pair("trigger", t);
            }
            if let Some(f) = function {
                q.append_pair("function", f);
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        let items: Items<DeadLetter> = self.get_json(url).await?;
        Ok(items.items)
    }

    /// `POST /v1/namespaces/{ns}/dead-letters/{id}/redrive`.
    pub async fn redrive_dead_letter(&self, ns: &str, id: &str) -> Result<()> {
        let url = self.url(&["v1", "namespaces", ns, "dead-letters", id, "redrive"]);
        self.send(self.http.post(url.clone()), &url).await?;
        Ok(())
    }

    /// `POST /v1/namespaces/{ns}/dead-letters/redrive?trigger=`: how many went.
    pub async fn redrive_trigger_dead_letters(&self, ns: &str, trigger: &str) -> Result<Redriven> {
        let mut url = self.url(&["v1", "namespaces", ns, "dead-letters", "redrive"]);
        url.query_pairs_mut().append_pair("trigger", trigger);
        let resp = self.send(self.http.post(url.clone()), &url).await?;
        decode(resp, &url).await
    }

    /// `DELETE /v1/namespaces/{ns}/dead-letters/{id}`.
    pub async fn delete_dead_letter(&self, ns: &str, id: &str) -> Result<()> {
        let url = self.url(&["v1", "namespaces", ns, "dead-letters", id]);
        self.send(self.http.delete(url.clone()), &url).await?;
        Ok(())
    }

    /// `GET .../logs?tail=N`: the function's build and instance output, newest last.
    pub async fn logs(&self, ns: &str, name: &str, tail: Option<u32>) -> Result<String> {
        let url = self.logs_url(ns, name, tail, false);
        let resp = self.send(self.http.get(url.clone()), &url).await?;
        resp.text().await.map_err(|e| http_error(&url, e))
    }

    /// `GET .../logs?follow=true`: the log as a stream of chunks that ends when the server
    /// closes it. Chunks are not aligned to lines.
    pub async fn follow_logs(
        &self,
        ns: &str,
        name: &str,
        tail: Option<u32>,
    ) -> Result<impl Stream<Item = Result<Bytes>> + Send + 'static + use<>> {
        let url = self.logs_url(ns, name, tail, true);
        let resp = self.send(self.http.get(url.clone()), &url).await?;
        Ok(resp
            .bytes_stream()
            .map(move |chunk| chunk.map_err(|e| http_error(&url, e))))
    }

    /// `POST /v1/tokens`: a new token for namespace `ns` (admin only). It is shown only once.
    pub async fn create_token(&self, ns: &str) -> Result<String> {
        #[derive(serde::Deserialize)]
        struct Created {
            token: String,
        }
        let url = self.url(&["v1", "tokens"]);
        let resp = self
            .send(
                self.http
                    .post(url.clone())
                    .json(&json!({ "namespace": ns })),
                &url,
            )
            .await?;
        let created: Created = decode(resp, &url).await?;
        Ok(created.token)
    }

    // Token listing, revocation and admin rotation; the audit log.

    /// `GET /v1/tokens[?namespace=ns]`: tokens by id, creation and last use (never values).
    pub async fn list_tokens(&self, ns: Option<&str>) -> Result<Vec<sless_api_types::TokenInfo>> {
        let mut url = self.url(&["v1", "tokens"]);
        if let Some(ns) = ns {
            url.query_pairs_mut().append_pair("namespace", ns);
        }
        let items: Items<sless_api_types::TokenInfo> = self.get_json(url).await?;
        Ok(items.items)
    }

    /// `DELETE /v1/tokens/{id}`: revokes the token at once.
    pub async fn delete_token(&self, id: &str) -> Result<()> {
        self.delete(self.url(&["v1", "tokens", id])).await
    }

    /// `POST /v1/tokens/admin/rotate` (admin only): the new admin token; the one this
    /// client holds stops working.
    pub async fn rotate_admin_token(&self) -> Result<String> {
        let url = self.url(&["v1", "tokens", "admin", "rotate"]);
        let resp = self.send(self.http.post(url.clone()), &url).await?;
        let created: sless_api_types::AdminToken = decode(resp, &url).await?;
        Ok(created.token)
    }

    /// `GET /v1/audit` (admin only): audit log entries, newest first.
    pub async fn list_audit(
        &self,
        ns: Option<&str>,
        since: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Vec<sless_api_types::AuditEntry>> {
        let mut url = self.url(&["v1", "audit"]);
        {
            let mut q = url.query_pairs_mut();
            if let Some(ns) = ns {
                q.append_pair("namespace", ns);
            }
            if let Some(since) = since {
                q.append_pair("since", since);
            }
            if let Some(limit) = limit {
                q.append_pair("limit", &limit.to_string());
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        let items: Items<sless_api_types::AuditEntry> = self.get_json(url).await?;
        Ok(items.items)
    }

    /// `GET /v1/backup` (admin only): the server's backup, a zip to read from the
    /// response as it streams (`reqwest::Response::chunk`).
    pub async fn backup(&self) -> Result<Response> {
        let url = self.url(&["v1", "backup"]);
        self.send(self.http.get(url.clone()), &url).await
    }

    /// `POST /v1/namespaces/{ns}/triggers` with `body` (`name`, `function`, `type` and the
    /// type's fields).
    pub async fn create_trigger(&self, ns: &str, body: &Value) -> Result<Trigger> {
        self.post_json(self.url(&["v1", "namespaces", ns, "triggers"]), body)
            .await
    }

    /// `GET /v1/namespaces/{ns}/triggers`.
    pub async fn list_triggers(&self, ns: &str) -> Result<Vec<Trigger>> {
        let items: Items<Trigger> = self
            .get_json(self.url(&["v1", "namespaces", ns, "triggers"]))
            .await?;
        Ok(items.items)
    }

    /// `GET /v1/namespaces/{ns}/triggers/{name}`.
    pub async fn get_trigger(&self, ns: &str, name: &str) -> Result<Trigger> {
        self.get_json(self.url(&["v1", "namespaces", ns, "triggers", name]))
            .await
    }

    /// `PATCH /v1/namespaces/{ns}/triggers/{name}` with a JSON merge patch, e.g.
    /// `{"enabled": false}`.
    pub async fn patch_trigger(&self, ns: &str, name: &str, patch: &Value) -> Result<Trigger> {
        self.merge_patch(self.url(&["v1", "namespaces", ns, "triggers", name]), patch)
            .await
    }

    /// `DELETE /v1/namespaces/{ns}/triggers/{name}`.
    pub async fn delete_trigger(&self, ns: &str, name: &str) -> Result<()> {
        self.delete(self.url(&["v1", "namespaces", ns, "triggers", name]))
            .await
    }

    /// `POST /v1/namespaces/{ns}/jobs` with `body`: `name` and either `function` or
    /// `runtime` (self-contained, code uploaded with [`Client::upload_job_code`]), plus
    /// `event`, `run_id`, `timeout_sec`, `max_attempts`.
    pub async fn create_job(&self, ns: &str, body: &Value) -> Result<Job> {
        self.post_json(self.url(&["v1", "namespaces", ns, "jobs"]), body)
            .await
    }

    /// `GET /v1/namespaces/{ns}/jobs`.
    pub async fn list_jobs(&self, ns: &str) -> Result<Vec<Job>> {
        let items: Items<Job> = self
            .get_json(self.url(&["v1", "namespaces", ns, "jobs"]))
            .await?;
        Ok(items.items)
    }

    /// `GET /v1/namespaces/{ns}/jobs/{name}`; with `wait: Some(n)` the server holds the answer
    /// up to `n` seconds until the current run reaches a terminal phase.
    pub async fn get_job(&self, ns: &str, name: &str, wait: Option<u64>) -> Result<Job> {
        let mut url = self.url(&["v1", "namespaces", ns, "jobs", name]);
        if let Some(wait) = wait {
            url.query_pairs_mut().append_pair("wait", &wait.to_string());
        }
        self.get_json(url).await
    }

    /// `PATCH /v1/namespaces/{ns}/jobs/{name}` with a JSON merge patch; raising `run_id`
    /// runs the job again.
    pub async fn patch_job(&self, ns: &str, name: &str, patch: &Value) -> Result<Job> {
        self.merge_patch(self.url(&["v1", "namespaces", ns, "jobs", name]), patch)
            .await
    }

    /// `DELETE /v1/namespaces/{ns}/jobs/{name}`.
    pub async fn delete_job(&self, ns: &str, name: &str) -> Result<()> {
        self.delete(self.url(&["v1", "namespaces", ns, "jobs", name]))
            .await
    }

    /// `PUT /v1/namespaces/{ns}/jobs/{name}/code` with a zip archive, for a self-contained
    /// job. Returns the server's answer as JSON (`Value::Null` when it has no body).
    pub async fn upload_job_code(&self, ns: &str, name: &str, zip: Vec<u8>) -> Result<Value> {
        let url = self.url(&["v1", "namespaces", ns, "jobs", name, "code"]);
        let req = self
            .http
            .put(url.clone())
            .header(header::CONTENT_TYPE, "application/zip")
            .body(zip);
        let resp = self.send(req, &url).await?;
        decode_or_null(resp, &url).await
    }

    /// `GET /v1/namespaces/{ns}/invocations` with the filters in `query`, newest first.
    pub async fn list_invocations(
        &self,
        ns: &str,
        query: &InvocationQuery,
    ) -> Result<Vec<Invocation>> {
        let mut url = self.url(&["v1", "namespaces", ns, "invocations"]);
        let pairs = query.pairs();
        if !pairs.is_empty() {
            url.query_pairs_mut().extend_pairs(pairs);
        }
        let items: Items<Invocation> = self.get_json(url).await?;
        Ok(items.items)
    }

    /// Waits until the job's run `run_id` (or a later one) reaches a terminal phase, with
    /// long polls of `GET ...?wait=30`, calling `on_progress` with every answer. A `Failed`
    /// or `Skipped` run is returned as `Ok`: the caller decides what it means. `timeout:
    /// None` waits as long as the run takes.
    pub async fn wait_job(
        &self,
        ns: &str,
        name: &str,
        run_id: u64,
        timeout: Option<Duration>,
        mut on_progress: impl FnMut(&Job),
    ) -> Result<Job> {
        let start = tokio::time::Instant::now();
        loop {
            let remaining = timeout.map(|t| t.saturating_sub(start.elapsed()));
            // Whole seconds, at least one, so the last request does not outlast the timeout
            // by more than a second.
            let wait = remaining.map_or(JOB_WAIT_SECS, |r| {
                r.as_secs_f64().ceil().clamp(1.0, JOB_WAIT_SECS as f64) as u64
            });
            let job = self.get_job(ns, name, Some(wait)).await?;
            on_progress(&job);
            let current = job.status.run_id >= run_id;
            if current && job.status.is_terminal() {
                return Ok(job);
            }
            let waited = start.elapsed();
            if let Some(timeout) = timeout
                && waited >= timeout
            {
                return Err(ClientError::JobWaitTimeout {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    run_id,
                    waited,
                    last_phase: job.status.phase.to_string(),
                });
            }
            // The server answers at once when the run it sees is already over; if that is an
            // earlier run (ours not started yet), pause instead of spinning.
            if !current && job.status.is_terminal() {
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
    }

    /// Polls the function every ~100 ms until `status.revision >= revision` and the phase is
    /// `Ready` or `Failed`, calling `on_progress` with every observation. A `Failed` function
    /// is returned as `Ok`: the caller decides what failure means.
    pub async fn wait_ready(
        &self,
        ns: &str,
        name: &str,
        revision: u64,
        timeout: Duration,
        mut on_progress: impl FnMut(&Function),
    ) -> Result<Function> {
        let start = tokio::time::Instant::now();
        loop {
            let function = self.get_function(ns, name).await?;
            on_progress(&function);
            if function.status.revision >= revision && function.status.is_settled() {
                return Ok(function);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(ClientError::WaitTimeout {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    revision,
                    waited,
                    last_phase: function.status.phase.to_string(),
                });
            }
            tokio::time::sleep(POLL_INTERVAL.min(timeout - waited)).await;
        }
    }

    // --- Secrets ---

    /// `PUT /v1/namespaces/{ns}/secrets/{name}` with `{"data": data}`: creates or
    /// replaces the secret; the answer lists its keys, never a value.
    pub async fn put_secret(
        &self,
        ns: &str,
        name: &str,
        data: &std::collections::BTreeMap<String, String>,
    ) -> Result<Secret> {
        let url = self.url(&["v1", "namespaces", ns, "secrets", name]);
        let body = serde_json::json!({ "data": data });
        let resp = self
            .send(self.http.put(url.clone()).json(&body), &url)
            .await?;
        decode(resp, &url).await
    }

    /// `GET /v1/namespaces/{ns}/secrets`.
    pub async fn list_secrets(&self, ns: &str) -> Result<Vec<Secret>> {
        let items: Items<Secret> = self
            .get_json(self.url(&["v1", "namespaces", ns, "secrets"]))
            .await?;
        Ok(items.items)
    }

    /// `DELETE /v1/namespaces/{ns}/secrets/{name}` (409 while something references it).
    pub async fn delete_secret(&self, ns: &str, name: &str) -> Result<()> {
        self.delete(self.url(&["v1", "namespaces", ns, "secrets", name]))
            .await
    }

    // --- Devices and telemetry ---

    /// `POST /v1/namespaces/{ns}/devices` with `{"name", "labels", "enabled"}`. The answer's
    /// `mqtt.password` is the only time the device's password is shown.
    pub async fn create_device(
        &self,
        ns: &str,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
        enabled: bool,
    ) -> Result<Device> {
        let body = json!({ "name": name, "labels": labels, "enabled": enabled });
        self.post_json(self.url(&["v1", "namespaces", ns, "devices"]), &body)
            .await
    }

    /// `GET /v1/namespaces/{ns}/devices` (no passwords).
    pub async fn list_devices(&self, ns: &str) -> Result<Vec<Device>> {
        let items: Items<Device> = self
            .get_json(self.url(&["v1", "namespaces", ns, "devices"]))
            .await?;
        Ok(items.items)
    }

    /// `GET /v1/namespaces/{ns}/devices/{name}` (no password).
    pub async fn get_device(&self, ns: &str, name: &str) -> Result<Device> {
        self.get_json(self.url(&["v1", "namespaces", ns, "devices", name]))
            .await
    }

    /// `PATCH /v1/namespaces/{ns}/devices/{name}` with a JSON merge patch of `labels` and
    /// `enabled`; `{"enabled": false}` disconnects the device and the broker refuses it.
    pub async fn patch_device(&self, ns: &str, name: &str, patch: &Value) -> Result<Device> {
        self.merge_patch(self.url(&["v1", "namespaces", ns, "devices", name]), patch)
            .await
    }

    /// `DELETE /v1/namespaces/{ns}/devices/{name}`, with its telemetry.
    pub async fn delete_device(&self, ns: &str, name: &str) -> Result<()> {
        self.delete(self.url(&["v1", "namespaces", ns, "devices", name]))
            .await
    }

    /// `POST /v1/namespaces/{ns}/devices/{name}/credentials`: a new password, in the
    /// answer's `mqtt.password` (shown only this once); the old one stops working at once.
    pub async fn rotate_device_credentials(&self, ns: &str, name: &str) -> Result<Device> {
        let url = self.url(&["v1", "namespaces", ns, "devices", name, "credentials"]);
        let resp = self.send(self.http.post(url.clone()), &url).await?;
        decode(resp, &url).await
    }

    /// `GET /v1/namespaces/{ns}/devices/{name}/telemetry?since=&until=&limit=`, newest
    /// first. `since` (inclusive) and `until` (exclusive) are RFC 3339; `limit` 1 to 1000.
    pub async fn device_telemetry(
        &self,
        ns: &str,
        name: &str,
        since: Option<&str>,
        until: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Vec<Telemetry>> {
        let url = self.url(&["v1", "namespaces", ns, "devices", name, "telemetry"]);
        let url = with_query(url, &[("since", since), ("until", until)], limit);
        let items: Items<Telemetry> = self.get_json(url).await?;
        Ok(items.items)
    }

    /// `GET /v1/namespaces/{ns}/telemetry?device=&since=&until=&limit=`: every device's
    /// telemetry (or one's), newest first; the bounds as in [`Client::device_telemetry`].
    pub async fn namespace_telemetry(
        &self,
        ns: &str,
        device: Option<&str>,
        since: Option<&str>,
        until: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Vec<Telemetry>> {
        let url = self.url(&["v1", "namespaces", ns, "telemetry"]);
        let url = with_query(
            url,
            &[("device", device), ("since", since), ("until", until)],
            limit,
        );
        let items: Items<Telemetry> = self.get_json(url).await?;
        Ok(items.items)
    }

    /// `POST /v1/namespaces/{ns}/devices/{name}/commands` with `command` as the body:
    /// published to the device's command topic, which the answer names.
    pub async fn send_device_command(
        &self,
        ns: &str,
        name: &str,
        command: &Value,
    ) -> Result<CommandSent> {
        self.post_json(
            self.url(&["v1", "namespaces", ns, "devices", name, "commands"]),
            command,
        )
        .await
    }

    /// Sends `method path` (relative to the base URL, e.g. `/v1/namespaces/x/triggers`) with an
    /// optional JSON body and returns the decoded answer, `Value::Null` for an empty one.
    /// For endpoints without a typed method.
    pub async fn request_json(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value> {
        let url = Url::parse(&format!("{}/{}", self.base, path.trim_start_matches('/'))).map_err(
            |e| ClientError::InvalidUrl {
                url: path.to_string(),
                reason: e.to_string(),
            },
        )?;
        let mut req = self.http.request(method, url.clone());
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = self.send(req, &url).await?;
        decode_or_null(resp, &url).await
    }

    /// The base URL with `segments` appended, each percent-encoded as one path segment.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base_url.clone();
        // `new` accepts only http(s) URLs, which always have path segments, so this cannot fail.
        url.path_segments_mut()
            .expect("http(s) URLs have a path")
            .pop_if_empty()
            .extend(segments);
        url
    }

    fn logs_url(&self, ns: &str, name: &str, tail: Option<u32>, follow: bool) -> Url {
        let mut url = self.url(&["v1", "namespaces", ns, "functions", name, "logs"]);
        {
            let mut query = url.query_pairs_mut();
            if let Some(tail) = tail {
                query.append_pair("tail", &tail.to_string());
            }
            if follow {
                query.append_pair("follow", "true");
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        url
    }

    fn authorize(&self, req: RequestBuilder) -> RequestBuilder {
        match &self.token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    /// Sends the request with the token and turns a non-success answer into [`ClientError::Api`].
    async fn send(&self, req: RequestBuilder, url: &Url) -> Result<Response> {
        let resp = self
            .authorize(req)
            .send()
            .await
            .map_err(|e| http_error(url, e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(|e| http_error(url, e))?;
        Err(ClientError::from_response(status, &body))
    }

    async fn post_json<T: DeserializeOwned>(&self, url: Url, body: &Value) -> Result<T> {
        let resp = self
            .send(self.http.post(url.clone()).json(body), &url)
            .await?;
        decode(resp, &url).await
    }

    /// Sends `patch` as `application/merge-patch+json`, the media type that says how the
    /// server must read it.
    async fn merge_patch<T: DeserializeOwned>(&self, url: Url, patch: &Value) -> Result<T> {
        let req = self
            .http
            .patch(url.clone())
            .header(header::CONTENT_TYPE, "application/merge-patch+json")
            .body(patch.to_string());
        let resp = self.send(req, &url).await?;
        decode(resp, &url).await
    }

    async fn delete(&self, url: Url) -> Result<()> {
        self.send(self.http.delete(url.clone()), &url).await?;
        Ok(())
    }

    async fn get_json<T: DeserializeOwned>(&self, url: Url) -> Result<T> {
        let resp = self.send(self.http.get(url.clone()), &url).await?;
        decode(resp, &url).await
    }
}

async fn decode<T: DeserializeOwned>(resp: Response, url: &Url) -> Result<T> {
    let bytes = resp.bytes().await.map_err(|e| http_error(url, e))?;
    serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
        url: url.to_string(),
        source,
    })
}

/// Decodes a JSON body, or `Value::Null` when there is none.
async fn decode_or_null(resp: Response, url: &Url) -> Result<Value> {
    let bytes = resp.bytes().await.map_err(|e| http_error(url, e))?;
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
        url: url.to_string(),
        source,
    })
}

/// `url` with the query pairs that are set (and `limit`), in the order given; no `?` when
/// none is.
fn with_query(mut url: Url, pairs: &[(&str, Option<&str>)], limit: Option<u32>) -> Url {
    {
        let mut q = url.query_pairs_mut();
        for (key, value) in pairs {
            if let Some(value) = value {
                q.append_pair(key, value);
            }
        }
        if let Some(limit) = limit {
            q.append_pair("limit", &limit.to_string());
        }
    }
    if url.query() == Some("") {
        url.set_query(None);
    }
    url
}

/// Wraps a transport error; the URL is ours to print, so reqwest's copy is dropped.
fn http_error(url: &Url, e: reqwest::Error) -> ClientError {
    ClientError::Http {
        url: url.to_string(),
        source: e.without_url(),
    }
}

#[cfg(test)]
mod tests;
