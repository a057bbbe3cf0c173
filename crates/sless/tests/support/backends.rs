//! The metadata store the end-to-end tests run on: each test server's own SQLite
//! file (the default), or with `SLESS_TEST_DATABASE=postgres` its own database on a
//! PostgreSQL server started once for the test binary.

use std::sync::OnceLock;

/// `--database-url` for a new test server, or `None` for the default SQLite file.
/// Blocking (it creates the database): call it from `spawn_blocking` in async code.
pub fn database_url() -> Option<String> {
    if std::env::var("SLESS_TEST_DATABASE").as_deref() != Ok("postgres") {
        return None;
    }
    static SERVER: OnceLock<sless_brokers::Postgres> = OnceLock::new();
    let server =
        SERVER.get_or_init(|| sless_brokers::Postgres::start().expect("PostgreSQL started"));
    Some(server.create_database().expect("a test database"))
}

/// [`database_url`] from async code.
pub async fn new_database_url() -> Option<String> {
    tokio::task::spawn_blocking(database_url)
        .await
        .expect("creating a test database")
}
