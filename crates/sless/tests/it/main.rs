//! End-to-end tests: each starts the real `sless serve` binary on loopback with
//! its own data directory, deploys real Python and Node functions through the
//! API, and checks what a user sees (status codes, bodies, logs, status).
//!
//! They need root (the sandbox manages cgroups), bubblewrap, /usr/bin/python3
//! and node, as `.ci/run` installs.

mod api;
mod harness;
mod invoke;
mod lifecycle;
mod sandbox;
