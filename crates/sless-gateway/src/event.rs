//! Building the handler's `event` from an HTTP request, as the contract defines it:
//! `{"method", "path", "query", "headers", "body", "_accept"}`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use axum::http::{HeaderMap, Method};
use bytes::Bytes;
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::value::RawValue;

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

/// How deeply a JSON request body may nest (serde_json's own recursion limit). A
/// deeper body is passed to the handler as text: the runtimes cannot decode
/// arbitrarily deep events, and `RawValue` checks no depth.
pub const MAX_JSON_DEPTH: usize = 128;

/// Whether the JSON text `body` opens more than `limit` arrays and objects at once.
/// One pass over the bytes; strings (and escapes in them) are skipped.
pub fn json_nests_deeper_than(body: &[u8], limit: usize) -> bool {
    if body.len() <= limit {
        return false;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Encodes the event as JSON bytes. This is on every request's path, so it is
/// serialised straight from the request's parts, borrowing wherever it can. An
/// event that cannot be encoded is an error, never an empty event.
pub(crate) fn http_event(
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Bytes, serde_json::Error> {
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
    let event = HttpEvent {
        method: method.as_str(),
        path,
        query: Form(query.map(str::as_bytes).unwrap_or_default()),
        headers: Headers(headers),
        body: EventBody::parse(&content_type, body),
        _accept: accept,
    };
    serde_json::to_vec(&event).map(Bytes::from)
}

#[derive(Serialize)]
struct HttpEvent<'a> {
    method: &'a str,
    path: &'a str,
    query: Form<'a>,
    headers: Headers<'a>,
    body: EventBody<'a>,
    _accept: &'a str,
}

/// `application/x-www-form-urlencoded` pairs as a map; the last value of a key wins.
struct Form<'a>(&'a [u8]);

impl Serialize for Form<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let pairs: BTreeMap<Cow<'_, str>, Cow<'_, str>> = form_urlencoded::parse(self.0).collect();
        s.collect_map(pairs)
    }
}

/// Header names (lowercase) to values, hop-by-hop headers left out and repeated
/// headers joined with `, `, as HTTP allows for list-valued fields.
struct Headers<'a>(&'a HeaderMap);

impl Serialize for Headers<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for name in self.0.keys() {
            if HOP_BY_HOP.contains(&name.as_str()) {
                continue;
            }
            let mut values = self.0.get_all(name).iter();
            let first = values
                .next()
                .map(|v| String::from_utf8_lossy(v.as_bytes()))
                .unwrap_or_default();
            match values.next() {
                None => map.serialize_entry(name.as_str(), &first)?,
                Some(second) => {
                    let mut joined = first.into_owned();
                    for v in std::iter::once(second).chain(values) {
                        joined.push_str(", ");
                        joined.push_str(&String::from_utf8_lossy(v.as_bytes()));
                    }
                    map.serialize_entry(name.as_str(), &joined)?;
                }
            }
        }
        map.end()
    }
}

/// The body as the handler sees it: parsed JSON, a form map, or text.
enum EventBody<'a> {
    Json(&'a RawValue),
    Form(Form<'a>),
    Text(Cow<'a, str>),
}

impl<'a> EventBody<'a> {
    fn parse(content_type: &str, body: &'a [u8]) -> Self {
        let is_json = content_type == "application/json" || content_type.ends_with("+json");
        if is_json
            && !body.is_empty()
            && let Ok(raw) = serde_json::from_slice::<&RawValue>(body)
            && !json_nests_deeper_than(body, MAX_JSON_DEPTH)
        {
            return EventBody::Json(raw);
        }
        if content_type == "application/x-www-form-urlencoded" {
            return EventBody::Form(Form(body));
        }
        EventBody::Text(String::from_utf8_lossy(body))
    }
}

impl Serialize for EventBody<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            EventBody::Json(raw) => raw.serialize(s),
            EventBody::Form(form) => form.serialize(s),
            EventBody::Text(text) => s.serialize_str(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use serde_json::Value;

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
        serde_json::from_slice(&http_event(&method, path, query, &map, body).unwrap()).unwrap()
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
    fn json_nested_deeper_than_the_limit_stays_text() {
        let json = [("content-type", "application/json")];
        let deep = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
        let e = event(Method::POST, "/", None, &json, deep.as_bytes());
        assert_eq!(e["body"], deep.as_str());
        // (The helper decodes the whole event with serde_json, whose own limit is 128
        // levels, the event object included.)
        let ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
        let e = event(Method::POST, "/", None, &json, ok.as_bytes());
        assert!(e["body"].is_array());
        // Brackets inside strings (escaped quotes included) are text, not nesting.
        let text = format!(r#"{{"a":"\"{}"}}"#, "[".repeat(1000));
        let e = event(Method::POST, "/", None, &json, text.as_bytes());
        assert!(e["body"].is_object());
        assert!(!json_nests_deeper_than(b"[[]]", 2));
        assert!(json_nests_deeper_than(b"[[[]]]", 2));
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
