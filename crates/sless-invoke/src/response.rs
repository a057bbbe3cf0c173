//! A handler's answer as the HTTP response a caller sees: the one mapping the gateway
//! (`/fn/`, `/t/`) and the deliveries (queue and device triggers, async calls) share,
//! so a handler returning `{"statusCode": 400}` is a 400 wherever it runs.
//!
//! - The handler raised (`ok == false`): `500`, the shim's `{"error": ...}` as it came.
//! - An object with a numeric `statusCode`: that response (`headers`, `body`,
//!   `isBase64Encoded`); a status outside 100..=999 or a bad base64 body is `502`.
//! - A string: `text/html` when it starts with `<`, otherwise `text/plain`.
//! - Any other value (or no value, `null`): `200` with the JSON.

use base64::Engine as _;
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use serde_json::Value;

/// `Content-Type` of JSON answers.
pub const JSON: &str = "application/json";
/// `Content-Type` of string answers.
pub const TEXT: &str = "text/plain; charset=utf-8";
/// `Content-Type` of string answers that look like HTML.
pub const HTML: &str = "text/html; charset=utf-8";

/// Headers a handler may not set: they describe one connection, not the response.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Maps the shim's answer to a response: `ok == false` is the handler's exception
/// (`500 {"error": ...}`); otherwise the return value, per the handler conventions.
pub fn map_answer(ok: bool, body: &Bytes) -> Response<Bytes> {
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

/// The platform's error shape, `{"error": {"code", "message"}}`, as bytes.
pub fn error_body(code: &str, message: &str) -> Bytes {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    Bytes::from(body.to_string())
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Bytes> {
    plain(status, JSON, error_body(code, message))
}

fn plain(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Bytes> {
    let mut r = Response::new(body);
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

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `{"statusCode": N, "headers": {...}, "body": ..., "isBase64Encoded": bool}`.
fn structured(mut map: serde_json::Map<String, Value>) -> Response<Bytes> {
    let code = map.get("statusCode").and_then(Value::as_u64).unwrap_or(200);
    let Some(status) = u16::try_from(code)
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
    else {
        return error(
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
                    return error(
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
    let mut r = Response::new(body);
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

/// A response's headers as `(name, value)` text pairs, in order (a value that is not
/// UTF-8 is kept with replacement characters): for callbacks, response topics and
/// the records of async calls, which carry headers as text.
pub fn header_pairs(response: &Response<Bytes>) -> Vec<(String, String)> {
    response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(ok: bool, body: &str) -> (u16, Option<String>, String, Response<Bytes>) {
        let r = map_answer(ok, &Bytes::from(body.to_string()));
        let status = r.status().as_u16();
        let ct = r
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string());
        let text = String::from_utf8(r.body().to_vec()).unwrap();
        (status, ct, text, r)
    }

    #[test]
    fn values_map_to_json() {
        for v in [r#"{"a":1}"#, "[1,2]", "42", "true", "null"] {
            let (s, ct, b, _) = map(true, v);
            assert_eq!((s, ct.as_deref(), b.as_str()), (200, Some(JSON), v));
        }
        let (s, _, b, _) = map(true, "");
        assert_eq!((s, b.as_str()), (200, "null"));
    }

    #[test]
    fn strings_are_text_or_html() {
        assert_eq!(map(true, r#""hello""#).1.as_deref(), Some(TEXT));
        let (s, ct, b, _) = map(true, r#""<h1>hi</h1>""#);
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (200, Some(HTML), "<h1>hi</h1>")
        );
    }

    #[test]
    fn status_code_objects_are_exact_responses() {
        let (s, ct, b, r) = map(
            true,
            r#"{"statusCode": 201, "headers": {"X-A": "b", "Content-Type": "text/csv", "Connection": "close"}, "body": "a,b"}"#,
        );
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (201, Some("text/csv"), "a,b")
        );
        assert_eq!(r.headers()["x-a"], "b");
        assert!(!r.headers().contains_key("connection"));
        let mut pairs = header_pairs(&r);
        pairs.sort();
        assert_eq!(
            pairs,
            [
                ("content-type".to_string(), "text/csv".to_string()),
                ("x-a".to_string(), "b".to_string()),
            ]
        );
        let (s, ct, b, _) = map(true, r#"{"statusCode": 400, "body": {"missing": true}}"#);
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (400, Some(JSON), r#"{"missing":true}"#)
        );
        let (s, _, b, _) = map(true, r#"{"statusCode": 204}"#);
        assert_eq!((s, b.as_str()), (204, ""));
        let (s, _, b, _) = map(
            true,
            r#"{"statusCode": 200, "body": "aGk=", "isBase64Encoded": true}"#,
        );
        assert_eq!((s, b.as_str()), (200, "hi"));
        let (s, _, b, _) = map(true, r#"{"statusCode": 99}"#);
        assert_eq!(s, 502);
        assert!(b.contains("\"bad_status\""), "{b}");
    }

    #[test]
    fn exceptions_are_500_with_the_message() {
        let (s, ct, b, _) = map(false, r#"{"error": "boom"}"#);
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (500, Some(JSON), r#"{"error": "boom"}"#)
        );
    }
}
