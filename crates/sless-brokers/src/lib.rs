//! Real message brokers (and PostgreSQL, and moto's S3) for tests, started as processes from the Debian packages on
//! free loopback ports, each with its own temporary data directory, and stopped by
//! pid when dropped. Start a slow broker (RabbitMQ takes ~13 s) once per test binary.
//!
//! Nothing here is used by the server; it is a dev-dependency of the crates whose
//! tests need a broker.

pub mod kafka;
pub mod mosquitto;

pub use kafka::KafkaMock;
pub use mosquitto::Mosquitto;

use std::net::TcpListener;

mod group;
pub mod moto;
pub mod nats;
pub mod postgres;
pub mod rabbitmq;

pub use moto::Moto;
pub use nats::Nats;
pub use postgres::Postgres;
pub use rabbitmq::RabbitMq;

/// A free TCP port on 127.0.0.1 (bound, then released for the broker to take).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
