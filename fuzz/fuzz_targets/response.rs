//! Mapping arbitrary handler answers to HTTP responses: never panics, a
//! failed handler is always a 500, and every answer has a content type unless
//! it is an explicit `statusCode` response.

#![no_main]

use axum::http::{StatusCode, header};
use bytes::Bytes;
use http_body::Body as _;
use libfuzzer_sys::fuzz_target;
use sless_gateway::result_response;

fuzz_target!(|data: &[u8]| {
    let Some((&flag, rest)) = data.split_first() else {
        return;
    };
    let ok = flag & 1 == 1;
    let answer = Bytes::copy_from_slice(rest);
    let response = result_response(ok, &answer);
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
    // Hop-by-hop headers never come from a handler.
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
});
