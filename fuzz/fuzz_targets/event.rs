//! Building the handler's event from arbitrary request parts, and reading
//! `/fn/` request paths: never panics, and the event is always the contract's
//! JSON object with the request's method and path.

#![no_main]

use std::collections::BTreeMap;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;
use sless_gateway::fuzzing::{fn_target, http_event};

fuzz_target!(|data: &[u8]| {
    // Fields separated by NUL: method, path, query, then header name/value
    // pairs; the bytes after the last NUL are the body.
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

    let event = http_event(&method, &path, query.as_deref(), &headers, body);
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

    if let Some((ns, name, rest)) = fn_target(&path) {
        assert!(!ns.is_empty() && !name.is_empty());
        assert!(rest.starts_with('/'));
    }
});
