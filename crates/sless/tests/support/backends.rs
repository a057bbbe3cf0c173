//! The metadata store the end-to-end tests run on: each test server's own SQLite
//! file (the default), or with `SLESS_TEST_DATABASE=postgres` its own database on a
//! PostgreSQL server started once for the test binary.

use std::sync::OnceLock;

/// The test binary's PostgreSQL server, started on first use; `None` when the
/// machine cannot run one.
fn postgres() -> Option<&'static sless_brokers::Postgres> {
    static SERVER: OnceLock<Option<sless_brokers::Postgres>> = OnceLock::new();
    SERVER
        .get_or_init(|| match sless_brokers::Postgres::start() {
            Ok(server) => Some(server),
            Err(e) => {
                eprintln!("PostgreSQL cannot start here: {e:#}");
                None
            }
        })
        .as_ref()
}

/// `--database-url` for a new test server, or `None` for the default SQLite file.
/// Blocking (it creates the database): call it from `spawn_blocking` in async code.
pub fn database_url() -> Option<String> {
    if std::env::var("SLESS_TEST_DATABASE").as_deref() != Ok("postgres") {
        return None;
    }
    let server = postgres().expect("SLESS_TEST_DATABASE=postgres needs PostgreSQL");
    Some(server.create_database().expect("a test database"))
}

/// [`database_url`] from async code.
pub async fn new_database_url() -> Option<String> {
    tokio::task::spawn_blocking(database_url)
        .await
        .expect("creating a test database")
}

/// A new database on the test binary's PostgreSQL server whatever the backend under
/// test, or `None` when the machine has no PostgreSQL.
#[allow(dead_code)] // Not every test binary restores onto PostgreSQL.
pub async fn postgres_database_url() -> Option<String> {
    tokio::task::spawn_blocking(|| {
        postgres().map(|s| s.create_database().expect("a test database"))
    })
    .await
    .expect("creating a test database")
}
