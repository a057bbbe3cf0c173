//! Building the handler's event from arbitrary request parts, and reading
//! `/fn/` request paths: never panics, and the event is always the contract's
//! JSON object with the request's method and path. The property lives in
//! `sless_gateway::fuzzing`, whose unit tests replay it.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| sless_gateway::fuzzing::check_event(data));
