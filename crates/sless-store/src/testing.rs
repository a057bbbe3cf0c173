//! The store unit tests run on: SQLite in memory, or with
//! `SLESS_TEST_DATABASE=postgres` a new database on a PostgreSQL server started
//! once for the test binary (from the machine's own binaries).

use std::sync::OnceLock;

use crate::SqlStore;

/// Whether the tests run on PostgreSQL.
pub(crate) fn on_postgres() -> bool {
    std::env::var("SLESS_TEST_DATABASE").is_ok_and(|v| v == "postgres")
}

/// An empty store of the backend under test.
pub(crate) async fn store() -> SqlStore {
    if on_postgres() {
        let url = tokio::task::spawn_blocking(|| server().create_database())
            .await
            .expect("creating a database")
            .expect("creating a database");
        SqlStore::connect_postgres(&url)
            .await
            .expect("a PostgreSQL store")
    } else {
        SqlStore::in_memory().await.expect("an in-memory store")
    }
}

fn server() -> &'static sless_brokers::Postgres {
    static SERVER: OnceLock<sless_brokers::Postgres> = OnceLock::new();
    SERVER.get_or_init(|| sless_brokers::Postgres::start().expect("PostgreSQL started"))
}

/// A store as the server runs it, with a pool of connections: a SQLite file (in the
/// returned directory) or, on PostgreSQL, a new database.
pub(crate) async fn pooled_store() -> (tempfile::TempDir, SqlStore) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = if on_postgres() {
        store().await
    } else {
        SqlStore::open(&dir.path().join("sless.db"))
            .await
            .expect("a SQLite store")
    };
    (dir, store)
}
