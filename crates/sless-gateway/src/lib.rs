//! The `/fn/{ns}/{name}[/path]` gateway: turns an HTTP request into the handler's
//! event, invokes the function through the executor and maps the handler's return
//! value back to an HTTP response, following the contract's handler conventions.
//!
//! Invariant: nothing here touches the metadata store. Private functions are
//! checked through the [`Authorizer`] seam, which caches.

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
use sless_executor::{Executor, InvokeError, InvokeRequest};

pub use body::{BodyError, read_body};
pub use response::{error_response, invoke_error_response, result_response};

/// Decides whether a bearer token may call a private function of a namespace.
#[async_trait]
pub trait Authorizer: Send + Sync + 'static {
    async fn may_invoke(&self, token: &str, namespace: &str) -> bool;
}

/// What the gateway needs.
#[derive(Clone)]
pub struct Gateway {
    pub executor: Arc<Executor>,
    pub authorizer: Arc<dyn Authorizer>,
    /// Largest request body accepted, in bytes (default 6 MiB).
    pub max_body: usize,
}

/// The routes `/fn/{ns}/{name}` and `/fn/{ns}/{name}/{*path}`.
pub fn router(gateway: Gateway) -> Router {
    Router::new()
        .route("/fn/{ns}/{name}", any(invoke_root))
        .route("/fn/{ns}/{name}/", any(invoke_root))
        .route("/fn/{ns}/{name}/{*path}", any(invoke_path))
        .with_state(gateway)
}

async fn invoke_root(
    State(gw): State<Gateway>,
    Path((ns, name)): Path<(String, String)>,
    req: Request,
) -> Response {
    handle(gw, ns, name, "/".to_string(), req).await
}

async fn invoke_path(
    State(gw): State<Gateway>,
    Path((ns, name, path)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    handle(gw, ns, name, format!("/{path}"), req).await
}

/// The request id the caller sent, or a fresh one.
pub fn request_id(headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 200)
        .map(str::to_string)
        .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()))
}

async fn handle(gw: Gateway, ns: String, name: String, path: String, req: Request) -> Response {
    let request_id = request_id(req.headers());
    let mut response = serve(&gw, &ns, &name, path, req, &request_id).await;
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
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
    match gw.executor.is_private(ns, name) {
        None => return not_found(),
        Some(true) => {
            let token = req
                .headers()
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            match token {
                None => {
                    return error_response(
                        StatusCode::UNAUTHORIZED,
                        "unauthorized",
                        "this function is private: send a bearer token of its namespace",
                    );
                }
                // A token of another namespace must not learn that the function exists.
                Some(token) if !gw.authorizer.may_invoke(token, ns).await => return not_found(),
                Some(_) => {}
            }
        }
        Some(false) => {}
    }

    let (parts, body) = req.into_parts();
    let body = match read_body(&parts.headers, body, gw.max_body).await {
        Ok(body) => body,
        Err(e @ BodyError::TooLarge(_)) => {
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                &e.to_string(),
            );
        }
        Err(e) => return error_response(StatusCode::BAD_REQUEST, "bad_request", &e.to_string()),
    };

    let is_head = parts.method == Method::HEAD;
    let method = if is_head {
        Method::GET
    } else {
        parts.method.clone()
    };
    let event = event::http_event(&method, &path, parts.uri.query(), &parts.headers, &body);
    let request = InvokeRequest {
        event,
        request_id: request_id.to_string(),
        source: "http",
    };
    let mut response = match gw.executor.invoke(ns, name, request).await {
        Ok(r) => result_response(r.ok, &r.body),
        Err(InvokeError::NotFound) => not_found(),
        Err(e) => invoke_error_response(&e),
    };
    if is_head {
        *response.body_mut() = Body::empty();
    }
    response.into_response()
}
