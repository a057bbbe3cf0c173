//! Mapping arbitrary handler answers to HTTP responses: never panics, a
//! failed handler is always a 500, and every answer has a content type unless
//! it is an explicit `statusCode` response. The property lives in
//! `sless_gateway::fuzzing`, whose unit tests replay it.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| sless_gateway::fuzzing::check_response(data));
