//! The `/fn/{ns}/{name}[/path]` gateway: turns an HTTP request into the handler's
//! event, invokes the function through the invocation pipeline (`sless_invoke::Invoker`)
//! and maps the handler's return
//! value back to an HTTP response, following the contract's handler conventions.
//!
//! `/async/{ns}/{name}[/path]` maps the request the same way, then hands the event to
//! the [`AsyncCalls`] seam (the control plane's durable queue) and answers `202` with
//! the call's id once it is queued.
//!
//! Invariant: nothing here touches the metadata store (the crate graph makes sure:
//! `scripts/check-layers`). Private functions are checked through the [`Authorizer`]
//! seam, which caches; calls and their records go through the [`Invoker`], whose
//! recorder never waits.

mod body;
mod event;
mod response;

use std::sync::Arc;

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use sless_core::invocation::InvocationSource;
use sless_executor::InvokeError;
use sless_invoke::{Call, HttpRoutes, Invoker, RouteMatch, Target};

pub use body::{BodyError, read_body};
pub use event::{MAX_JSON_DEPTH, json_nests_deeper_than};
pub use response::{
    error_body, error_response, invoke_error_response, public_invoke_error_response,
    result_response,
};

/// Whether a caller may invoke a private function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Allowed,
    /// Unknown token, or one of another namespace.
    Denied,
    /// Too many failed attempts from the caller's address: retry after that many seconds.
    Limited(u64),
}

#[doc(hidden)]
pub mod fuzzing;

/// Decides whether a bearer token may call a private function of a namespace.
#[async_trait]
pub trait Authorizer: Send + Sync + 'static {
    /// `peer` is the client's address, for limiting failed attempts.
    async fn may_invoke(
        &self,
        token: &str,
        namespace: &str,
        peer: Option<std::net::IpAddr>,
    ) -> Access;
}

/// The token of an `Authorization: Bearer <token>` header; the scheme is
/// case-insensitive (RFC 7235).
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A call for `/async/`: what to queue.
#[derive(Debug, Clone)]
pub struct AsyncCall {
    pub namespace: String,
    pub function: String,
    /// The handler's event, as JSON bytes.
    pub event: bytes::Bytes,
    pub request_id: String,
    /// `X-Callback-Url`, unchecked.
    pub callback_url: Option<String>,
}

/// Why an async call was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnqueueError {
    /// The request is at fault (a callback URL that is not one), `400`.
    #[error("{0}")]
    Invalid(String),
    /// The function's queue is full, `429` with `Retry-After`.
    #[error("{0}")]
    QueueFull(String),
    /// Over the namespace's `queued_calls` quota, `429 quota_exceeded`.
    #[error("{0}")]
    Quota(String),
    /// The queue could not be written, `503`.
    #[error("{0}")]
    Unavailable(String),
}

/// The durable queue of async calls, kept by the control plane (the gateway never
/// touches the store).
#[async_trait]
pub trait AsyncCalls: Send + Sync + 'static {
    /// Queues `call`; `Ok` with its id only once the call is durable.
    async fn enqueue(&self, call: AsyncCall) -> Result<String, EnqueueError>;
}

/// The answer to a queued call: `202 {"call_id"}` with `X-Call-Id`.
pub fn queued_response(call_id: &str) -> Response {
    let body = serde_json::to_vec(&sless_api_types::CallQueued {
        call_id: call_id.to_string(),
    })
    .unwrap_or_default();
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::ACCEPTED;
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::from_str(call_id) {
        r.headers_mut().insert("x-call-id", v);
    }
    r
}

/// The answer to a call that was not queued.
pub fn enqueue_error_response(e: &EnqueueError) -> Response {
    match e {
        EnqueueError::Invalid(m) => error_response(StatusCode::BAD_REQUEST, "invalid", m),
        EnqueueError::QueueFull(m) => {
            let mut r = error_response(StatusCode::TOO_MANY_REQUESTS, "too_many_requests", m);
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                HeaderValue::from_static("1"),
            );
            r
        }
        EnqueueError::Quota(m) => {
            error_response(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", m)
        }
        EnqueueError::Unavailable(m) => {
            error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable", m)
        }
    }
}

/// What the gateway needs.
#[derive(Clone)]
pub struct Gateway {
    /// Invokes functions and records the invocations.
    pub invoker: Arc<Invoker>,
    pub authorizer: Arc<dyn Authorizer>,
    /// Largest request body accepted, in bytes (default 6 MiB).
    pub max_body: usize,
    /// A request body that sends nothing for this long is refused with `408`.
    pub body_timeout: std::time::Duration,
    /// HTTP triggers' routes under `/t/`.
    pub routes: Arc<HttpRoutes>,
    /// The queue `/async/` calls go to; `None`: `/async/` answers `404`.
    pub async_calls: Option<Arc<dyn AsyncCalls>>,
}

/// `app` with `/fn/{ns}/{name}[/path]` answered before routing: the invoke path is the
/// hottest there is, and axum's routing (a path match, percent-decoded parameters,
/// extensions) cost a tenth of the gateway's work per request. Anything else, and any
/// `/fn/` path this does not recognise, goes to `app`, whose routes answer exactly as
/// before.
///
/// Every request is counted in `sless_http_requests_total` by its route template
/// (when metrics are on): the fast path's with handles it keeps, the router's from
/// the route it matched (`unmatched` for none), so raw paths never become labels.
pub fn with_fast_path(gateway: Gateway, app: Router) -> FastPath {
    let app = if sless_metrics::enabled() {
        app.layer(axum::middleware::from_fn(count_request))
    } else {
        app
    };
    FastPath { gateway, app }
}

/// The route label of `/fn/` requests, whether the fast path or the router answers.
const FN_ROUTE: &str = "/fn/{ns}/{name}";

/// `/fn/` requests by status, counted without a lookup.
static FN_REQUESTS: sless_metrics::RouteCounters = sless_metrics::RouteCounters::new(FN_ROUTE);

/// Counts a request the router answered, by the template of the route it matched.
async fn count_request(req: Request, next: axum::middleware::Next) -> Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_owned());
    let response = next.run(req).await;
    let status = response.status().as_u16();
    match route.as_deref() {
        // The router's `/fn/` routes (paths the fast path left to it) count as one.
        Some(r) if r.starts_with("/fn/") => FN_REQUESTS.request(status),
        route => sless_metrics::http_request(route, status),
    }
    response
}

/// See [`with_fast_path`].
#[derive(Clone)]
pub struct FastPath {
    gateway: Gateway,
    app: Router,
}

impl tower::Service<Request> for FastPath {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response, Self::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> <Self as tower::Service<Request>>::Future {
        self.dispatch(req)
    }
}

impl FastPath {
    /// Answers `req`; the same as [`tower::Service::call`], but through `&self`, so a
    /// caller holding the service need not clone it per request.
    pub fn dispatch(&self, req: Request) -> <Self as tower::Service<Request>>::Future {
        if let Some((ns, name, path)) = fn_target(req.uri().path()) {
            let gw = self.gateway.clone();
            return Box::pin(async move {
                let response = handle(gw, ns, name, path, req).await;
                FN_REQUESTS.request(response.status().as_u16());
                Ok(response)
            });
        }
        let mut app = self.app.clone();
        Box::pin(async move { tower::Service::call(&mut app, req).await })
    }
}

/// `(namespace, name, path)` of a `/fn/{ns}/{name}[/{path}]` request path, percent-decoded
/// as the router's parameters are; `None` for anything the router should decide.
fn fn_target(uri_path: &str) -> Option<(String, String, String)> {
    let rest = uri_path.strip_prefix("/fn/")?;
    let (ns, rest) = rest.split_once('/')?;
    let (name, path) = match rest.split_once('/') {
        Some((name, path)) => (name, path),
        None => (rest, ""),
    };
    if ns.is_empty() || name.is_empty() {
        return None;
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(std::borrow::Cow::into_owned)
    };
    let path = if path.is_empty() {
        "/".to_string()
    } else {
        format!("/{}", decode(path)?)
    };
    Some((decode(ns)?, decode(name)?, path))
}

/// The routes `/fn/{ns}/{name}` and `/fn/{ns}/{name}/{*path}`.
pub fn router(gateway: Gateway) -> Router {
    Router::new()
        .route("/fn/{ns}/{name}", any(invoke_root))
        .route("/fn/{ns}/{name}/", any(invoke_root))
        .route("/fn/{ns}/{name}/{*path}", any(invoke_path))
        .route("/async/{ns}/{name}", any(async_root))
        .route("/async/{ns}/{name}/", any(async_root))
        .route("/async/{ns}/{name}/{*path}", any(async_path))
        .route("/t/{ns}", any(trigger_root))
        .route("/t/{ns}/", any(trigger_root))
        .route("/t/{ns}/{*path}", any(trigger_path))
        .with_state(gateway)
}

type PathResult<T> = Result<Path<T>, axum::extract::rejection::PathRejection>;

/// A path that cannot be decoded (`%ff` is not UTF-8) names nothing: `400` in the
/// platform's error shape.
fn bad_path(e: axum::extract::rejection::PathRejection) -> Response {
    error_response(StatusCode::BAD_REQUEST, "invalid", &e.body_text())
}

async fn invoke_root(
    State(gw): State<Gateway>,
    path: PathResult<(String, String)>,
    req: Request,
) -> Response {
    match path {
        Ok(Path((ns, name))) => handle(gw, ns, name, "/".to_string(), req).await,
        Err(e) => bad_path(e),
    }
}

async fn invoke_path(
    State(gw): State<Gateway>,
    path: PathResult<(String, String, String)>,
    req: Request,
) -> Response {
    match path {
        Ok(Path((ns, name, path))) => handle(gw, ns, name, format!("/{path}"), req).await,
        Err(e) => bad_path(e),
    }
}

async fn async_root(
    State(gw): State<Gateway>,
    path: PathResult<(String, String)>,
    req: Request,
) -> Response {
    match path {
        Ok(Path((ns, name))) => queue_call(gw, ns, name, "/".to_string(), req).await,
        Err(e) => bad_path(e),
    }
}

async fn async_path(
    State(gw): State<Gateway>,
    path: PathResult<(String, String, String)>,
    req: Request,
) -> Response {
    match path {
        Ok(Path((ns, name, path))) => queue_call(gw, ns, name, format!("/{path}"), req).await,
        Err(e) => bad_path(e),
    }
}

/// `/async/{ns}/{name}[/path]`: the request mapped as on `/fn/`, queued; `202` once
/// the call is durable.
async fn queue_call(gw: Gateway, ns: String, name: String, path: String, req: Request) -> Response {
    let request_id = request_id(req.headers());
    let mut response = match enqueue(&gw, &ns, &name, path, req, &request_id).await {
        Ok(call_id) => queued_response(&call_id),
        Err(r) => r,
    };
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

async fn enqueue(
    gw: &Gateway,
    ns: &str,
    name: &str,
    path: String,
    req: Request,
    request_id: &str,
) -> Result<String, Response> {
    let Some(calls) = gw.async_calls.clone() else {
        return Err(error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            "async calls are not served here",
        ));
    };
    let callback_url = match req.headers().get("x-callback-url") {
        None => None,
        Some(v) => match v.to_str() {
            Ok(url) => Some(url.trim().to_string()),
            Err(_) => {
                return Err(error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid",
                    "X-Callback-Url: must be an http or https URL",
                ));
            }
        },
    };
    let (_, event) = admit(gw, ns, name, path, req).await?;
    calls
        .enqueue(AsyncCall {
            namespace: ns.to_string(),
            function: name.to_string(),
            event,
            request_id: request_id.to_string(),
            callback_url,
        })
        .await
        .map_err(|e| enqueue_error_response(&e))
}

async fn trigger_root(
    State(gw): State<Gateway>,
    path: PathResult<String>,
    req: Request,
) -> Response {
    match path {
        Ok(Path(ns)) => trigger(gw, ns, "/".to_string(), req).await,
        Err(e) => bad_path(e),
    }
}

async fn trigger_path(
    State(gw): State<Gateway>,
    path: PathResult<(String, String)>,
    req: Request,
) -> Response {
    match path {
        Ok(Path((ns, path))) => trigger(gw, ns, format!("/{path}"), req).await,
        Err(e) => bad_path(e),
    }
}

/// `/t/{ns}/{path}`: the HTTP trigger owning the path sends the request to its
/// function; the event's `path` is the whole path below `/t/{ns}`.
async fn trigger(gw: Gateway, ns: String, path: String, req: Request) -> Response {
    let method = if req.method() == Method::HEAD {
        "GET"
    } else {
        req.method().as_str()
    };
    let route = match gw.routes.resolve(&ns, &path, method) {
        RouteMatch::Found(route) => route,
        RouteMatch::NotFound => {
            return error_response(
                StatusCode::NOT_FOUND,
                "not_found",
                &format!("no trigger serves /t/{ns}{path}"),
            );
        }
        RouteMatch::MethodNotAllowed(allowed) => {
            let mut r = error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                &format!("/t/{ns}{path} accepts {}", allowed.join(", ")),
            );
            if let Ok(v) = HeaderValue::from_str(&allowed.join(", ")) {
                r.headers_mut().insert(axum::http::header::ALLOW, v);
            }
            return r;
        }
    };
    let request_id = request_id(req.headers());
    let mut response = serve(&gw, &ns, &route.function, path, req, &request_id).await;
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

/// The request id the caller sent, or a fresh one.
pub fn request_id(headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 200)
        .map(str::to_string)
        .unwrap_or_else(sless_invoke::new_request_id)
}

async fn handle(gw: Gateway, ns: String, name: String, path: String, req: Request) -> Response {
    let request_id = request_id(req.headers());
    let mut response = serve(&gw, &ns, &name, path, req, &request_id).await;
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

/// Everything before a call of `ns/name` is made: the function exists (and serves),
/// a private one's token is checked, the body is read and the event built. Gives
/// whether it was a `HEAD` (served as `GET`) and the event; `Err` is the answer.
async fn admit(
    gw: &Gateway,
    ns: &str,
    name: &str,
    path: String,
    req: Request,
) -> Result<(bool, bytes::Bytes), Response> {
    let not_found = || {
        error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("function {ns}/{name} not found"),
        )
    };
    // Only functions are reachable here: other pools (a job's run) have names that
    // are not DNS labels.
    if sless_core::validate_name("name", name).is_err() {
        return Err(not_found());
    }
    // Nothing to serve: a function that failed says so, with the reason (after the
    // same token check as a running private function).
    let mut failed = None;
    let private = match gw.invoker.target(ns, name) {
        Some(Target::Serving { private }) => Some(private),
        Some(Target::Failed(failure)) => {
            let private = failure.private;
            failed = Some(failure);
            Some(private)
        }
        None => None,
    };
    match private {
        None => return Err(not_found()),
        Some(true) => {
            let Some(token) = bearer_token(req.headers()) else {
                return Err(error_response(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "this function is private: send a bearer token of its namespace",
                ));
            };
            let peer = req
                .extensions()
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip());
            match gw.authorizer.may_invoke(token, ns, peer).await {
                Access::Allowed => {}
                // A token of another namespace must not learn that the function exists.
                Access::Denied => return Err(not_found()),
                Access::Limited(retry_after) => {
                    let mut r = error_response(
                        StatusCode::TOO_MANY_REQUESTS,
                        "too_many_requests",
                        &format!(
                            "too many failed authentications from this address: retry in {retry_after} s"
                        ),
                    );
                    r.headers_mut()
                        .insert(axum::http::header::RETRY_AFTER, retry_after.into());
                    return Err(r);
                }
            }
        }
        Some(false) => {}
    }
    if let Some(failure) = failed {
        // The same answer as a call finding the function failed (a revision that
        // could not start is summarised without its traceback), before the body is
        // read: nothing was invoked, so nothing is recorded.
        let e = sless_invoke::failed_error(ns, name, &failure);
        return Err(public_invoke_error_response(&e, ns, name));
    }

    let (parts, body) = req.into_parts();
    let body = match read_body(&parts.headers, body, gw.max_body, gw.body_timeout).await {
        Ok(body) => body,
        Err(e @ BodyError::TooLarge(_)) => {
            return Err(error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                &e.to_string(),
            ));
        }
        Err(e @ BodyError::TimedOut(_)) => {
            return Err(error_response(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                &e.to_string(),
            ));
        }
        Err(e) => {
            return Err(error_response(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &e.to_string(),
            ));
        }
    };

    let is_head = parts.method == Method::HEAD;
    let method = if is_head {
        Method::GET
    } else {
        parts.method.clone()
    };
    let event = match event::http_event(&method, &path, parts.uri.query(), &parts.headers, &body) {
        Ok(event) => event,
        Err(e) => {
            tracing::error!(namespace = ns, function = name, error = %e, "cannot encode the request as an event");
            return Err(error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the request could not be encoded as the function's event",
            ));
        }
    };
    Ok((is_head, event))
}

async fn serve(
    gw: &Gateway,
    ns: &str,
    name: &str,
    path: String,
    req: Request,
    request_id: &str,
) -> Response {
    let not_found = || {
        error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("function {ns}/{name} not found"),
        )
    };
    let (is_head, event) = match admit(gw, ns, name, path, req).await {
        Ok(admitted) => admitted,
        Err(response) => return response,
    };
    // Only requests that reach the executor are invocations: a refused body or a
    // failed authorisation never ran the function.
    let call = Call::new(ns, name, InvocationSource::Http, request_id, event);
    let outcome = gw.invoker.invoke(call).await;
    let mut response = match &outcome.result {
        Ok(r) => result_response(r.ok, &r.body),
        // A function that went away meanwhile answers as if it had never existed
        // (and the pipeline leaves no record of it).
        Err(InvokeError::NotFound) => not_found(),
        Err(e) => public_invoke_error_response(e, ns, name),
    };
    // The record keeps the status the caller gets (a handler's `statusCode`).
    let _ = outcome.finish(response.status().as_u16());
    if is_head {
        *response.body_mut() = Body::empty();
    }
    response.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fn_paths_are_split_and_decoded_like_the_routes() {
        let t = |p: &str| fn_target(p);
        let own = |a: &str, b: &str, c: &str| Some((a.to_string(), b.to_string(), c.to_string()));
        assert_eq!(t("/fn/team/hello"), own("team", "hello", "/"));
        assert_eq!(t("/fn/team/hello/"), own("team", "hello", "/"));
        assert_eq!(t("/fn/team/hello/a/b/"), own("team", "hello", "/a/b/"));
        assert_eq!(t("/fn/team/hell%6F/x%20y"), own("team", "hello", "/x y"));
        for other in [
            "/fn/team",
            "/fn/team/",
            "/fn//hello",
            "/fn/team//x",
            "/v1/fn/a/b",
            "/fn/a/%ff",
        ] {
            assert_eq!(t(other), None, "{other}");
        }
    }

    #[test]
    fn bearer_schemes_are_case_insensitive() {
        let token = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                axum::http::header::AUTHORIZATION,
                HeaderValue::from_str(v).unwrap(),
            );
            bearer_token(&h).map(str::to_string)
        };
        for v in ["Bearer abc", "bearer abc", "BEARER  abc ", "bEaReR abc"] {
            assert_eq!(token(v).as_deref(), Some("abc"), "{v}");
        }
        for v in ["Bearer", "Bearer ", "Basic abc", "Bearerabc", "Token abc"] {
            assert_eq!(token(v), None, "{v}");
        }
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn request_ids_are_the_callers_or_fresh_hex() {
        let mut headers = HeaderMap::new();
        let a = request_id(&headers);
        let b = request_id(&headers);
        assert_eq!(a.len(), 32);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, b);
        headers.insert("x-request-id", HeaderValue::from_static("trace-42"));
        assert_eq!(request_id(&headers), "trace-42");
        headers.insert(
            "x-request-id",
            HeaderValue::from_str(&"x".repeat(201)).unwrap(),
        );
        assert_eq!(
            request_id(&headers).len(),
            32,
            "an over-long id is replaced"
        );
    }
}
