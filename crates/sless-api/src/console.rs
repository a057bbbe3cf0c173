//! The web console's server side: its page and assets, compiled into the binary, and its
//! sessions.
//!
//! The console is a small page (`crates/sless-api/console/`, plain HTML, CSS and
//! JavaScript: no build step) that works through the same `/v1` API as every client.
//! Signing in trades a token for a session: an `HttpOnly; SameSite=Strict` cookie naming
//! a random session id the server maps to the token, so the page's script never holds
//! the token. A request carrying the cookie instead of `Authorization` is authenticated
//! exactly as the token would be (resolved again on every request: a revoked token or an
//! expired JWT ends the session), and one that changes anything must also carry the
//! session's CSRF token in `X-Sless-Csrf`. The cookie's path is `/v1`, so it never goes
//! with a request to a function (`/fn/`, `/t/`, `/async/`).

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;

use crate::AppState;
use crate::auth::AuthLimiter;
use crate::error::ApiError;

/// The session cookie's name.
pub const COOKIE: &str = "sless_session";
/// The header a cookie-authenticated request that changes anything carries.
pub const CSRF_HEADER: &str = "x-sless-csrf";
/// How long a session lasts from sign-in.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at once; past it the least recently used one ends.
const MAX_SESSIONS: usize = 10_000;

/// The page, its style and its script.
const INDEX: &str = include_str!("../console/index.html");
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../console/app.css"),
    ),
];

/// Only the console's own files; the emulator's WebSocket goes to the broker's port.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

struct Session {
    token: String,
    csrf: String,
    expires: Instant,
}

/// The console's signed-in sessions, in memory: a server restart signs everyone out.
pub struct Sessions(Mutex<lru::LruCache<String, Session>>);

impl Default for Sessions {
    fn default() -> Self {
        Sessions(Mutex::new(lru::LruCache::new(
            NonZeroUsize::new(MAX_SESSIONS).unwrap_or(NonZeroUsize::MIN),
        )))
    }
}

impl Sessions {
    /// Starts a session for `token`: `(session id, csrf token)`.
    fn create(&self, token: &str) -> (String, String) {
        let id = crate::auth::new_token();
        let csrf = crate::auth::new_token();
        if let Ok(mut all) = self.0.lock() {
            all.put(
                id.clone(),
                Session {
                    token: token.to_string(),
                    csrf: csrf.clone(),
                    expires: Instant::now() + SESSION_TTL,
                },
            );
        }
        (id, csrf)
    }

    /// The token and csrf token of a live session.
    pub fn get(&self, id: &str) -> Option<(String, String)> {
        let mut all = self.0.lock().ok()?;
        let live = all.get(id).is_some_and(|s| s.expires > Instant::now());
        if !live {
            all.pop(id);
            return None;
        }
        all.get(id).map(|s| (s.token.clone(), s.csrf.clone()))
    }

    fn remove(&self, id: &str) {
        if let Ok(mut all) = self.0.lock() {
            all.pop(id);
        }
    }
}

/// The session id a request's `Cookie` header names.
pub fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// The console's routes.
pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/console", get(index))
        .route("/console/", get(index))
        .route("/console/assets/{file}", get(asset))
        .route(
            "/v1/console/session",
            get(current).post(sign_in).delete(sign_out),
        )
}

fn page_headers(content_type: &'static str) -> [(header::HeaderName, HeaderValue); 4] {
    [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
    ]
}

async fn index() -> Response {
    (page_headers("text/html; charset=utf-8"), INDEX).into_response()
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, body)) => (page_headers(content_type), *body).into_response(),
        None => ApiError::NotFound(format!("no console asset {file:?}")).into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    token: String,
}

fn cookie(value: &str, max_age: u64) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/v1; HttpOnly; SameSite=Strict; Max-Age={max_age}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("sless_session=; Max-Age=0"))
}

/// `POST /v1/console/session` `{"token"}`: a session for any token the API takes.
async fn sign_in(
    State(s): State<AppState>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let peer = request
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    let body = axum::body::to_bytes(request.into_body(), 64 * 1024)
        .await
        .map_err(|_| ApiError::TooLarge("a sign-in body is at most 64 KiB".into()))?;
    let SignIn { token } = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("expected {{\"token\": \"...\"}}: {e}")))?;
    let token = token.trim().to_string();
    let ip = peer.map(|a| a.ip());
    let limiter = &s.tokens.limiter;
    if let Some(ip) = ip {
        limiter.check(ip).map_err(AuthLimiter::too_many)?;
    }
    let resolved = if token.is_empty() {
        Ok(None)
    } else {
        s.tokens.resolve(&token).await
    };
    match resolved {
        Ok(Some(_)) => {}
        Ok(None) | Err(ApiError::Unauthorized(_)) => {
            if let Some(ip) = ip {
                limiter.failed(ip);
            }
            let why = match resolved {
                Err(e) => e.to_string(),
                _ => "unknown token".to_string(),
            };
            return Err(ApiError::Unauthorized(why));
        }
        Err(e) => return Err(e),
    }
    let (id, csrf) = s.tokens.sessions.create(&token);
    let mut response = (StatusCode::CREATED, Json(json!({ "csrf": csrf }))).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie(&id, SESSION_TTL.as_secs()));
    Ok(response)
}

/// `GET /v1/console/session`: the session's csrf token (the page asks after a reload),
/// `null` when not signed in (not a 401, which a browser would log as an error).
async fn current(State(s): State<AppState>, headers: HeaderMap) -> Response {
    let session = session_id(&headers).and_then(|id| s.tokens.sessions.get(&id));
    Json(json!({ "csrf": session.map(|(_, csrf)| csrf) })).into_response()
}

/// `DELETE /v1/console/session`: signs out (the session's csrf token required).
async fn sign_out(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    if let Some(id) = session_id(&headers) {
        if let Some((_, csrf)) = s.tokens.sessions.get(&id) {
            check_csrf(&headers, &csrf)?;
        }
        s.tokens.sessions.remove(&id);
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie("", 0));
    Ok(response)
}

/// Refuses a request that changes something without the session's csrf token.
pub fn check_csrf(headers: &HeaderMap, csrf: &str) -> Result<(), ApiError> {
    let sent = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    if sent == Some(csrf) {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "a console request that changes something needs the session's {CSRF_HEADER} header"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; sless_session=abc; b=2"),
        );
        assert_eq!(session_id(&h).as_deref(), Some("abc"));
        assert_eq!(session_id(&HeaderMap::new()), None);
    }

    #[test]
    fn a_session_maps_to_its_token_until_it_is_removed() {
        let s = Sessions::default();
        let (id, csrf) = s.create("tok");
        assert_eq!(s.get(&id), Some(("tok".into(), csrf.clone())));
        assert_eq!(s.get("other"), None);
        s.remove(&id);
        assert_eq!(s.get(&id), None);
    }

    #[test]
    fn a_change_without_the_csrf_token_is_refused() {
        let mut h = HeaderMap::new();
        assert!(check_csrf(&h, "x").is_err());
        h.insert(CSRF_HEADER, HeaderValue::from_static("y"));
        assert!(check_csrf(&h, "x").is_err());
        h.insert(CSRF_HEADER, HeaderValue::from_static("x"));
        assert!(check_csrf(&h, "x").is_ok());
    }
}
