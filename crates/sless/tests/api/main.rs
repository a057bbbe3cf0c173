//! The REST API's error paths, in-process: a server built from its configuration in
//! a temporary data directory and driven through `tower::ServiceExt::oneshot`. No
//! root, no socket, no function instance: every answer here comes from the API's
//! validation, auth and store, and must have the contract's status and
//! `{"error": {"code", "message"}}` body, the message naming what is wrong.

// Helpers shared by the tests panic on failure just as the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod auth;
mod calls;
mod concurrency;
mod console;
mod functions;
mod harness;
mod job_wait;
mod namespaces;
mod objects;
mod openapi;
mod readiness;
mod serving;
mod trash;
