//! Mapping a handler's return value (or the platform's failure) to an HTTP response.

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use serde_json::Value;
use sless_executor::InvokeError;

use crate::event::HOP_BY_HOP;

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
const HTML: &str = "text/html; charset=utf-8";

/// The platform's own error shape: `{"error": {"code", "message"}}`.
pub fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    plain(status, JSON, Bytes::from(body.to_string()))
}

/// The status and error a failed invocation answers with.
pub fn invoke_error_response(e: &InvokeError) -> Response {
    let (status, code) = match e {
        InvokeError::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        InvokeError::Paused(_) => (StatusCode::SERVICE_UNAVAILABLE, "paused"),
        InvokeError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        InvokeError::Timeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
        InvokeError::InstanceFailed(_) => (StatusCode::BAD_GATEWAY, "instance_failed"),
    };
    error_response(status, code, &e.to_string())
}

fn plain(status: StatusCode, content_type: &'static str, body: Bytes) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn text_type(s: &str) -> &'static str {
    if s.trim_start().starts_with('<') {
        HTML
    } else {
        TEXT
    }
}

/// Maps the shim's answer to a response: `ok == false` is the handler's exception
/// (`500 {"error": ...}`); otherwise the return value, per the handler conventions.
pub fn result_response(ok: bool, body: &Bytes) -> Response {
    if !ok {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, JSON, body.clone());
    }
    let first = body.iter().copied().find(|b| !b.is_ascii_whitespace());
    // Only objects (which may be a statusCode response) and strings need a look
    // inside; every other JSON value is passed through as it came.
    // An object without a "statusCode" key anywhere in it maps to itself: no need
    // to parse it (the common case, on every request's path).
    if first == Some(b'{') && !contains(body, b"\"statusCode\"") {
        return plain(StatusCode::OK, JSON, body.clone());
    }
    let value: Value = match first {
        Some(b'{') | Some(b'"') => match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(_) => return plain(StatusCode::OK, JSON, body.clone()),
        },
        None => return plain(StatusCode::OK, JSON, Bytes::from_static(b"null")),
        _ => return plain(StatusCode::OK, JSON, body.clone()),
    };
    match value {
        Value::String(s) => {
            let ct = text_type(&s);
            plain(StatusCode::OK, ct, Bytes::from(s))
        }
        Value::Object(map) if map.get("statusCode").is_some_and(|v| v.is_u64()) => structured(map),
        _ => plain(StatusCode::OK, JSON, body.clone()),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `{"statusCode": N, "headers": {...}, "body": ..., "isBase64Encoded": bool}`.
fn structured(mut map: serde_json::Map<String, Value>) -> Response {
    let code = map.get("statusCode").and_then(Value::as_u64).unwrap_or(200);
    let Some(status) = u16::try_from(code)
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
    else {
        return crate::error_response(
            StatusCode::BAD_GATEWAY,
            "bad_status",
            &format!("the function returned statusCode {code}, which is not an HTTP status"),
        );
    };
    let base64 = map
        .get("isBase64Encoded")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let (body, default_type): (Bytes, Option<&'static str>) = match map.remove("body") {
        None | Some(Value::Null) => (Bytes::new(), None),
        Some(Value::String(s)) if base64 => {
            match base64::engine::general_purpose::STANDARD.decode(s.as_bytes()) {
                Ok(raw) => (Bytes::from(raw), Some("application/octet-stream")),
                Err(_) => {
                    return crate::error_response(
                        StatusCode::BAD_GATEWAY,
                        "bad_body",
                        "the function's isBase64Encoded body is not valid base64",
                    );
                }
            }
        }
        Some(Value::String(s)) => {
            let ct = text_type(&s);
            (Bytes::from(s), Some(ct))
        }
        Some(other) => (Bytes::from(other.to_string()), Some(JSON)),
    };
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    if let Some(Value::Object(headers)) = map.get("headers") {
        for (k, v) in headers {
            let value = match v {
                Value::String(s) => s.clone(),
                Value::Null => continue,
                other => other.to_string(),
            };
            let Ok(name) = HeaderName::from_bytes(k.as_bytes()) else {
                continue;
            };
            if HOP_BY_HOP.contains(&name.as_str()) || name == header::CONTENT_LENGTH {
                continue;
            }
            if let Ok(value) = HeaderValue::from_str(&value) {
                r.headers_mut().append(name, value);
            }
        }
    }
    if !r.headers().contains_key(header::CONTENT_TYPE)
        && let Some(ct) = default_type
    {
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn map(ok: bool, body: &str) -> (u16, Option<String>, String, Response) {
        let r = result_response(ok, &Bytes::from(body.to_string()));
        let status = r.status().as_u16();
        let ct = r
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string());
        let (parts, b) = r.into_parts();
        let bytes = b.collect().await.unwrap().to_bytes();
        (
            status,
            ct,
            String::from_utf8(bytes.to_vec()).unwrap(),
            Response::from_parts(parts, Body::empty()),
        )
    }

    #[tokio::test]
    async fn values_map_to_json() {
        for v in [r#"{"a":1}"#, "[1,2]", "42", "true", "null"] {
            let (s, ct, b, _) = map(true, v).await;
            assert_eq!((s, ct.as_deref(), b.as_str()), (200, Some(JSON), v));
        }
    }

    #[tokio::test]
    async fn strings_are_text_or_html() {
        assert_eq!(map(true, r#""hello""#).await.1.as_deref(), Some(TEXT));
        let (s, ct, b, _) = map(true, r#""<h1>hi</h1>""#).await;
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (200, Some(HTML), "<h1>hi</h1>")
        );
    }

    #[tokio::test]
    async fn status_code_objects_are_exact_responses() {
        let (s, ct, b, r) =
            map(true, r#"{"statusCode": 201, "headers": {"X-A": "b", "Content-Type": "text/csv"}, "body": "a,b"}"#).await;
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (201, Some("text/csv"), "a,b")
        );
        assert_eq!(r.headers()["x-a"], "b");
        let (s, ct, b, _) = map(true, r#"{"statusCode": 404, "body": {"missing": true}}"#).await;
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (404, Some(JSON), r#"{"missing":true}"#)
        );
        let (s, _, b, _) = map(true, r#"{"statusCode": 204}"#).await;
        assert_eq!((s, b.as_str()), (204, ""));
        let (s, _, b, _) = map(
            true,
            r#"{"statusCode": 200, "body": "aGk=", "isBase64Encoded": true}"#,
        )
        .await;
        assert_eq!((s, b.as_str()), (200, "hi"));
        let (s, _, _, _) = map(true, r#"{"statusCode": 99}"#).await;
        assert_eq!(s, 502);
    }

    #[tokio::test]
    async fn exceptions_are_500_with_the_message() {
        let (s, ct, b, _) = map(false, r#"{"error": "boom"}"#).await;
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (500, Some(JSON), r#"{"error": "boom"}"#)
        );
    }
}
