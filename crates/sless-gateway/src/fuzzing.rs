//! The properties the `event` and `response` fuzz targets in `fuzz/` check, as
//! functions the unit tests replay too (the seeds, the kept regressions and
//! generated inputs), so `cargo test` exercises them without cargo-fuzz. They
//! cover the request-path and event parsers and the response mapper on the
//! trust boundary. Not an API; nothing else calls these.
//!
//! Both functions panic when their property fails: that is how a fuzzer or a
//! test learns of it, so the `expect`s below are the point, not shortcuts.

use std::collections::BTreeMap;

use axum::body::HttpBody as _;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use bytes::Bytes;
use serde_json::value::RawValue;

/// Builds the handler's event from request parts read out of `data`, and reads
/// the request path as a `/fn/` path: neither panics, the event is a JSON
/// object with exactly the contract's keys and the request's method and path,
/// and a `/fn/` path never yields an empty namespace or name.
///
/// `data` is fields separated by NUL: method, path, query, then header
/// name/value pairs; the bytes after the last NUL are the body.
///
/// # Panics
///
/// When any of that does not hold.
pub fn check_event(data: &[u8]) {
    let mut fields: Vec<&[u8]> = data.split(|b| *b == 0).collect();
    let body = fields.pop().unwrap_or_default();
    let mut fields = fields.into_iter();
    let method = fields
        .next()
        .and_then(|m| Method::from_bytes(m).ok())
        .unwrap_or(Method::GET);
    let path = String::from_utf8_lossy(fields.next().unwrap_or(b"/")).into_owned();
    let query = fields
        .next()
        .map(|q| String::from_utf8_lossy(q).into_owned());
    let mut headers = HeaderMap::new();
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }

    let event = crate::event::http_event(&method, &path, query.as_deref(), &headers, body)
        .expect("every request encodes as an event");
    // Read as a map of raw values, not as a `serde_json::Value`: with the
    // `raw_value` feature, a `Value` parse treats an object key
    // `$serde_json::private::RawValue` as "parse my string as JSON", which a
    // query string can spell. `RawValue` still checks the syntax of each field.
    let event: BTreeMap<String, Box<RawValue>> =
        serde_json::from_slice(&event).expect("the event is a JSON object");
    let keys: Vec<&str> = event.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["_accept", "body", "headers", "method", "path", "query"]
    );
    let string = |key: &str| serde_json::from_str::<String>(event[key].get()).expect("a string");
    assert_eq!(string("method"), method.as_str());
    assert_eq!(string("path"), path);
    string("_accept");
    for key in ["query", "headers"] {
        assert!(
            event[key].get().starts_with('{'),
            "{key}: {}",
            event[key].get()
        );
    }

    if let Some((ns, name, rest)) = crate::fn_target(&path) {
        assert!(!ns.is_empty() && !name.is_empty());
        assert!(rest.starts_with('/'));
    }
}

/// Maps a handler's answer to a response: it never panics, a failed handler
/// is always a 500 with its answer as the body, every answer that is not an
/// explicit `statusCode` response has a content type, and no hop-by-hop or
/// `Content-Length` header comes from a handler.
///
/// `data` is a flag byte (lowest bit set: the handler returned; clear: it
/// raised) followed by the handler's answer.
///
/// # Panics
///
/// When any of that does not hold.
pub fn check_response(data: &[u8]) {
    let Some((&flag, rest)) = data.split_first() else {
        return;
    };
    let ok = flag & 1 == 1;
    let answer = Bytes::copy_from_slice(rest);
    let response = crate::result_response(ok, &answer);
    if !ok {
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            response.body().size_hint().exact(),
            Some(answer.len() as u64)
        );
    }
    let structured = serde_json::from_slice::<serde_json::Value>(&answer)
        .is_ok_and(|v| v.get("statusCode").is_some_and(serde_json::Value::is_u64));
    if !structured {
        assert!(
            response.headers().contains_key(header::CONTENT_TYPE),
            "{answer:?}"
        );
    }
    for name in [
        "connection",
        "transfer-encoding",
        "content-length",
        "upgrade",
    ] {
        assert!(
            !response.headers().contains_key(name),
            "{name} in {answer:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// Every file of `fuzz/seeds/<target>` and `fuzz/regressions/<target>`.
    fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
        let mut files = Vec::new();
        for dir in ["seeds", "regressions"] {
            let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("a directory entry").path();
                let data = std::fs::read(&path).expect("a readable corpus file");
                files.push((path, data));
            }
        }
        files.sort();
        files
    }

    fn replay(target: &str, check: fn(&[u8])) {
        let corpus = corpus(target);
        assert!(corpus.len() >= 3, "too few {target} inputs: {corpus:?}");
        for (path, data) in &corpus {
            eprintln!("replaying {}", path.display());
            check(data);
        }
    }

    #[test]
    fn the_event_corpus_holds() {
        let corpus = corpus("event");
        assert!(
            corpus
                .iter()
                .any(|(p, _)| p.ends_with("regressions/event/raw-value-token-in-query")),
            "the kept regression is not replayed"
        );
        replay("event", check_event);
    }

    #[test]
    fn the_response_corpus_holds() {
        replay("response", check_response);
    }

    /// Strings a handler or client is likely to trip the parsers with.
    fn tricky() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("$serde_json::private::RawValue".to_owned()),
            Just("statusCode".to_owned()),
            Just("/fn/".to_owned()),
            Just("%2F".to_owned()),
            Just("%".to_owned()),
            Just("\u{0}".to_owned()),
            Just("Connection".to_owned()),
            Just("content-length".to_owned()),
            Just("Transfer-Encoding".to_owned()),
            Just("upgrade".to_owned()),
            Just("Content-Type".to_owned()),
            "[a-zA-Z0-9/%?&=._-]{0,12}",
            any::<String>(),
        ]
    }

    fn text() -> impl Strategy<Value = String> {
        proptest::collection::vec(tricky(), 0..4).prop_map(|parts| parts.concat())
    }

    /// A request in `check_event`'s input format (NUL-separated fields).
    fn request() -> impl Strategy<Value = Vec<u8>> {
        let method = prop_oneof![
            Just("GET".to_owned()),
            Just("POST".to_owned()),
            "[A-Z]{1,8}",
            text(),
        ];
        let path = prop_oneof![
            text().prop_map(|p| format!("/fn/{p}")),
            (text(), text(), text()).prop_map(|(a, b, c)| format!("/fn/{a}/{b}/{c}")),
            text(),
        ];
        let headers = proptest::collection::vec((tricky(), text()), 0..4);
        let body = proptest::collection::vec(any::<u8>(), 0..64);
        (method, path, text(), headers, body).prop_map(|(method, path, query, headers, body)| {
            let mut fields = vec![method, path, query];
            for (name, value) in headers {
                fields.push(name);
                fields.push(value);
            }
            // Fields cannot hold the separator; the body (last) may.
            let mut data: Vec<u8> = fields
                .iter()
                .flat_map(|f| f.bytes().filter(|b| *b != 0).chain([0]))
                .collect();
            data.extend(body);
            data
        })
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            text().prop_map(serde_json::Value::from),
            proptest::collection::btree_map(tricky(), text(), 0..3).prop_map(|m| json!(m)),
        ]
    }

    /// A handler's answer, mostly `statusCode` responses, in `check_response`'s
    /// input format (flag byte first).
    fn answer() -> impl Strategy<Value = Vec<u8>> {
        let status = prop_oneof![100u64..600, any::<u64>()];
        let headers = proptest::collection::btree_map(tricky(), json_value(), 0..5);
        let structured = (status, headers, json_value(), any::<bool>(), any::<bool>()).prop_map(
            |(status, headers, body, base64, with_status)| {
                let mut answer = json!({
                    "headers": headers,
                    "body": body,
                    "isBase64Encoded": base64,
                });
                if with_status {
                    answer["statusCode"] = json!(status);
                }
                answer.to_string().into_bytes()
            },
        );
        let answer = prop_oneof![
            3 => structured,
            1 => json_value().prop_map(|v| v.to_string().into_bytes()),
            1 => text().prop_map(String::into_bytes),
            1 => proptest::collection::vec(any::<u8>(), 0..64),
        ];
        (any::<u8>(), answer).prop_map(|(flag, answer)| {
            let mut data = vec![flag];
            data.extend(answer);
            data
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn the_event_property_holds_on_generated_requests(data in request()) {
            check_event(&data);
        }

        #[test]
        fn the_response_property_holds_on_generated_answers(data in answer()) {
            check_response(&data);
        }
    }
}
