//! End-to-end tests: each starts the real `sless serve` binary on loopback with
//! its own data directory, deploys real Python and Node functions through the
//! API, and checks what a user sees (status codes, bodies, logs, status).
//!
//! They need root (the sandbox manages cgroups), bubblewrap, /usr/bin/python3
//! and node, as `.ci/run` installs.

// Helpers shared by the tests panic on failure just as the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api;
mod async_calls;
mod audit;
mod backup;
mod cli;
mod config_file;
mod console;
mod dead_letters;
mod device_scenarios;
mod devices;
mod harness;
mod hostile_builds;
mod hostile_deps;
mod hostile_edge;
mod hostile_input;
mod hostile_instances;
mod hostile_network;
mod hostile_sandbox;
mod hostile_storage;
mod invoke;
mod jobs;
mod jwt;
mod lifecycle;
mod metrics;
mod namespace_trash;
mod queue_amqp;
mod queue_harness;
#[cfg(feature = "kafka")]
mod queue_kafka;
mod queue_mqtt;
mod queue_nats;
mod queue_scenarios;
mod quotas;
mod records;
mod runtimes_go;
mod sandbox;
mod scaling;
mod secrets;
mod terraform;
mod tls;
mod triggers;
