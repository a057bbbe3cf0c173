//! The archive checker on arbitrary bytes: never panics, and whatever it lets
//! `extract_zip` write stays inside the destination and within the limits.
//! The property lives in `sless_blob::fuzzing`, whose unit tests replay it.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| sless_blob::fuzzing::check_archive(data));
