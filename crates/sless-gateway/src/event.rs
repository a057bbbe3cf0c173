//! Building the handler's `event` from an HTTP request, as the contract defines it:
//! `{"method", "path", "query", "headers", "body", "_accept"}`.

use axum::http::{HeaderMap, Method};
use bytes::Bytes;
use serde_json::{Map, Value};

/// Headers that describe one hop, not the request; they never reach a function.
pub(crate) const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Encodes the event as JSON bytes.
pub(crate) fn http_event(
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Bytes {
    let mut q = Map::new();
    if let Some(query) = query {
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            q.insert(k.into_owned(), Value::String(v.into_owned()));
        }
    }
    let mut h = Map::new();
    for (name, value) in headers {
        let name = name.as_str();
        if HOP_BY_HOP.contains(&name) {
            continue;
        }
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match h.get_mut(name) {
            // Repeated headers are joined, as HTTP allows for list-valued fields.
            Some(Value::String(existing)) => {
                existing.push_str(", ");
                existing.push_str(&value);
            }
            _ => {
                h.insert(name.to_string(), Value::String(value));
            }
        }
    }
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let accept = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let event = serde_json::json!({
        "method": method.as_str(),
        "path": path,
        "query": q,
        "headers": h,
        "body": parse_body(&content_type, body),
        "_accept": accept,
    });
    Bytes::from(serde_json::to_vec(&event).unwrap_or_default())
}

fn parse_body(content_type: &str, body: &[u8]) -> Value {
    let is_json = content_type == "application/json" || content_type.ends_with("+json");
    if is_json
        && !body.is_empty()
        && let Ok(v) = serde_json::from_slice(body)
    {
        return v;
    }
    if content_type == "application/x-www-form-urlencoded" {
        let mut form = Map::new();
        for (k, v) in form_urlencoded::parse(body) {
            form.insert(k.into_owned(), Value::String(v.into_owned()));
        }
        return Value::Object(form);
    }
    Value::String(String::from_utf8_lossy(body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn event(
        method: Method,
        path: &str,
        query: Option<&str>,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Value {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        serde_json::from_slice(&http_event(&method, path, query, &map, body)).unwrap()
    }

    #[test]
    fn json_bodies_are_parsed() {
        let e = event(
            Method::POST,
            "/",
            None,
            &[("content-type", "application/json; charset=utf-8")],
            br#"{"name":"Ada"}"#,
        );
        assert_eq!(e["body"], serde_json::json!({"name": "Ada"}));
        assert_eq!(e["method"], "POST");
        assert_eq!(e["path"], "/");
    }

    #[test]
    fn form_bodies_become_maps_last_value_wins() {
        let e = event(
            Method::POST,
            "/",
            None,
            &[("content-type", "application/x-www-form-urlencoded")],
            b"a=1&b=x+y&a=2",
        );
        assert_eq!(e["body"], serde_json::json!({"a": "2", "b": "x y"}));
    }

    #[test]
    fn other_bodies_are_text_and_broken_json_stays_text() {
        let e = event(
            Method::PUT,
            "/x/y",
            None,
            &[("content-type", "text/plain")],
            b"hello",
        );
        assert_eq!(e["body"], "hello");
        let e = event(
            Method::PUT,
            "/",
            None,
            &[("content-type", "application/json")],
            b"{nope",
        );
        assert_eq!(e["body"], "{nope");
        let e = event(Method::GET, "/", None, &[], b"");
        assert_eq!(e["body"], "");
    }

    #[test]
    fn query_last_value_wins_and_headers_are_lowercase_without_hop_by_hop() {
        let e = event(
            Method::GET,
            "/p",
            Some("a=1&b=two%20words&a=3"),
            &[
                ("X-Custom", "v"),
                ("Connection", "keep-alive"),
                ("Accept", "text/html"),
                ("transfer-encoding", "chunked"),
            ],
            b"",
        );
        assert_eq!(e["query"], serde_json::json!({"a": "3", "b": "two words"}));
        assert_eq!(e["headers"]["x-custom"], "v");
        assert!(e["headers"].get("connection").is_none());
        assert!(e["headers"].get("transfer-encoding").is_none());
        assert_eq!(e["_accept"], "text/html");
        assert_eq!(e["path"], "/p");
    }
}
