//! The embedded SQLite adapter (WAL mode, migrations run at open).

use std::path::Path;
use std::str::FromStr;

use async_trait::async_trait;
use chrono::Utc;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqlitePool};

use crate::cas::Cas;
use crate::{FunctionChange, FunctionRecord, Namespace, Result, Store, StoreError, time};

/// Metadata in one SQLite file.
///
/// No lock of its own: read-modify-write updates are compare-and-swaps on the
/// object's generation (see [`crate::cas`]), and SQLite serialises the writes, each
/// waiting up to the busy timeout for the one writer's lock. The transactions that
/// read before they write (deleting a namespace, moving it to and from the trash,
/// purging the trash) start with `BEGIN IMMEDIATE`, so each holds the write lock from
/// its first read and cannot fail with `SQLITE_BUSY` when another connection wrote
/// since that read.
pub struct SqliteStore {
    pool: SqlitePool,
    /// Group commits of async calls' writes (started with the store).
    calls: crate::calls::CallWriter,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and runs migrations.
    pub async fn open(path: &Path) -> Result<Self> {
        let options = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(std::time::Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Self::with_pool(pool))
    }

    fn with_pool(pool: SqlitePool) -> Self {
        let calls = crate::calls::CallWriter::start(pool.clone());
        Self { pool, calls }
    }

    /// The writer async calls' lifecycle writes go through.
    pub(crate) fn call_writer(&self) -> &crate::calls::CallWriter {
        &self.calls
    }

    /// The connection pool, for the other record kinds kept in the same database.
    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// An in-memory database, for tests.
    pub async fn in_memory() -> Result<Self> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:")?.foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Self::with_pool(pool))
    }
}

fn now() -> String {
    crate::stamp(Utc::now())
}

pub(crate) fn function_from_row(row: &SqliteRow) -> Result<FunctionRecord> {
    let spec: String = row.try_get("spec")?;
    let status: String = row.try_get("status")?;
    let revision: i64 = row.try_get("revision")?;
    Ok(FunctionRecord {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        spec: serde_json::from_str(&spec)?,
        status: serde_json::from_str(&status)?,
        revision: revision as u64,
        code_sha256: row.try_get("code_sha256")?,
        generation: row.try_get::<i64, _>("generation")? as u64,
        created_at: time(row.try_get::<&str, _>("created_at")?),
        updated_at: time(row.try_get::<&str, _>("updated_at")?),
    })
}

/// The columns of a function row, in the order `function_from_row` reads them.
macro_rules! function_columns {
    () => {
        "namespace, name, spec, status, revision, code_sha256, generation, created_at, updated_at"
    };
}

/// The functions of one namespace, inside a transaction.
pub(crate) async fn functions_of(
    conn: &mut sqlx::SqliteConnection,
    namespace: &str,
) -> Result<Vec<FunctionRecord>> {
    let rows = sqlx::query(concat!(
        "SELECT ",
        function_columns!(),
        " FROM functions WHERE namespace = ?"
    ))
    .bind(namespace)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(function_from_row).collect()
}

/// Deletes a namespace and everything in it (its quota overrides by the foreign
/// key's cascade), inside the caller's transaction. Invocation records stay.
pub(crate) async fn delete_namespace_rows(
    conn: &mut sqlx::SqliteConnection,
    name: &str,
) -> Result<()> {
    for sql in [
        "DELETE FROM functions WHERE namespace = ?",
        "DELETE FROM triggers WHERE namespace = ?",
        "DELETE FROM jobs WHERE namespace = ?",
        "DELETE FROM secrets WHERE namespace = ?",
        "DELETE FROM async_calls WHERE namespace = ?",
        "DELETE FROM dead_letters WHERE namespace = ?",
        "DELETE FROM telemetry WHERE namespace = ?",
        "DELETE FROM devices WHERE namespace = ?",
        "DELETE FROM tokens WHERE namespace = ?",
        "DELETE FROM namespaces WHERE name = ?",
    ] {
        sqlx::query(sql).bind(name).execute(&mut *conn).await?;
    }
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> Result<()> {
        // A read of the schema goes through the database file, unlike `SELECT 1`.
        sqlx::query("SELECT count(*) FROM sqlite_schema")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn ensure_namespace(&self, name: &str) -> Result<bool> {
        let done = sqlx::query(
            "INSERT INTO namespaces (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn get_namespace(&self, name: &str) -> Result<Namespace> {
        let row = sqlx::query("SELECT name, created_at FROM namespaces WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                kind: "namespace",
                name: name.to_string(),
            })?;
        Ok(Namespace {
            name: row.try_get("name")?,
            created_at: time(row.try_get::<&str, _>("created_at")?),
        })
    }

    async fn list_namespaces(&self) -> Result<Vec<Namespace>> {
        let rows = sqlx::query(concat!(
            "SELECT name, created_at FROM namespaces WHERE ",
            live!("name"),
            " ORDER BY name"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Namespace {
                    name: row.try_get("name")?,
                    created_at: time(row.try_get::<&str, _>("created_at")?),
                })
            })
            .collect()
    }

    async fn delete_namespace(&self, name: &str, force: bool) -> Result<Vec<FunctionRecord>> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let exists = sqlx::query("SELECT 1 FROM namespaces WHERE name = ?")
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        if exists.is_none() {
            return Err(StoreError::NotFound {
                kind: "namespace",
                name: name.to_string(),
            });
        }
        let functions = functions_of(&mut tx, name).await?;
        // Devices count as content too: their credentials cannot be made again.
        let devices: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM devices WHERE namespace = ?")
            .bind(name)
            .fetch_one(&mut *tx)
            .await?;
        if (!functions.is_empty() || devices > 0) && !force {
            return Err(StoreError::NotEmpty(name.to_string()));
        }
        delete_namespace_rows(&mut tx, name).await?;
        tx.commit().await?;
        Ok(functions)
    }

    async fn create_function(&self, r: &FunctionRecord) -> Result<()> {
        let result = sqlx::query(concat!(
            "INSERT INTO functions (",
            function_columns!(),
            ") VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?)"
        ))
        .bind(&r.namespace)
        .bind(&r.name)
        .bind(serde_json::to_string(&r.spec)?)
        .bind(serde_json::to_string(&r.status)?)
        .bind(r.revision as i64)
        .bind(&r.code_sha256)
        .bind(crate::stamp(r.created_at))
        .bind(crate::stamp(r.updated_at))
        .execute(&self.pool)
        .await;
        crate::inserted(result, "function", &r.namespace, &r.name)
    }

    async fn get_function(&self, namespace: &str, name: &str) -> Result<FunctionRecord> {
        let row = sqlx::query(concat!(
            "SELECT ",
            function_columns!(),
            " FROM functions WHERE namespace = ? AND name = ?"
        ))
        .bind(namespace)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound {
            kind: "function",
            name: name.to_string(),
        })?;
        function_from_row(&row)
    }

    async fn list_functions(&self, namespace: Option<&str>) -> Result<Vec<FunctionRecord>> {
        let rows = match namespace {
            Some(ns) => {
                sqlx::query(concat!(
                    "SELECT ",
                    function_columns!(),
                    " FROM functions WHERE namespace = ? ORDER BY name"
                ))
                .bind(ns)
                .fetch_all(&self.pool)
                .await?
            }
            None => {
                sqlx::query(concat!(
                    "SELECT ",
                    function_columns!(),
                    " FROM functions WHERE ",
                    live!("namespace"),
                    " ORDER BY namespace, name"
                ))
                .fetch_all(&self.pool)
                .await?
            }
        };
        rows.iter().map(function_from_row).collect()
    }

    async fn update_function(
        &self,
        namespace: &str,
        name: &str,
        expect: Option<u64>,
        change: FunctionChange,
    ) -> Result<FunctionRecord> {
        let mut cas = Cas::new("function", name, expect);
        loop {
            let current = self.get_function(namespace, name).await?;
            cas.check(current.generation)?;
            let mut record = current.clone();
            match &change {
                FunctionChange::Spec(spec) => record.spec = spec.clone(),
                FunctionChange::Patch(patch) => record.spec = apply_patch(&current.spec, patch)?,
                FunctionChange::Code(sha) => record.code_sha256 = Some(sha.clone()),
            }
            if record.spec == current.spec && record.code_sha256 == current.code_sha256 {
                return Ok(current);
            }
            record.revision += 1;
            record.generation += 1;
            record.updated_at = Utc::now();
            let done = sqlx::query(
                "UPDATE functions SET spec = ?, code_sha256 = ?, revision = ?, generation = ?, updated_at = ? \
                 WHERE namespace = ? AND name = ? AND generation = ?",
            )
            .bind(serde_json::to_string(&record.spec)?)
            .bind(&record.code_sha256)
            .bind(record.revision as i64)
            .bind(record.generation as i64)
            .bind(crate::stamp(record.updated_at))
            .bind(namespace)
            .bind(name)
            .bind(current.generation as i64)
            .execute(&self.pool)
            .await?;
            if done.rows_affected() == 1 {
                return Ok(record);
            }
            cas.lost().await?;
        }
    }

    async fn set_status(
        &self,
        namespace: &str,
        name: &str,
        revision: u64,
        status: &sless_core::FunctionStatus,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE functions SET status = ? WHERE namespace = ? AND name = ? AND revision = ?",
        )
        .bind(serde_json::to_string(status)?)
        .bind(namespace)
        .bind(name)
        .bind(revision as i64)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_function(&self, namespace: &str, name: &str) -> Result<()> {
        let done = sqlx::query("DELETE FROM functions WHERE namespace = ? AND name = ?")
            .bind(namespace)
            .bind(name)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                kind: "function",
                name: name.to_string(),
            });
        }
        Ok(())
    }

    async fn create_token(&self, hash: &str, namespace: &str) -> Result<()> {
        sqlx::query("INSERT INTO tokens (hash, namespace, created_at) VALUES (?, ?, ?)")
            .bind(hash)
            .bind(namespace)
            .bind(now())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn token_namespace(&self, hash: &str) -> Result<Option<String>> {
        let row = sqlx::query(concat!(
            "SELECT namespace FROM tokens WHERE hash = ? AND ",
            live!("namespace")
        ))
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| r.try_get("namespace")).transpose()?)
    }
}

/// Applies a merge patch to a spec: unknown fields and invalid values are named
/// in the error; `null` resets a field to its default.
fn apply_patch(
    spec: &sless_core::FunctionSpec,
    patch: &serde_json::Value,
) -> Result<sless_core::FunctionSpec> {
    let serde_json::Value::Object(fields) = patch else {
        return Err(
            sless_core::ValidationError::new("body", "a patch must be a JSON object").into(),
        );
    };
    let mut patched = sless_core::patch::apply(spec, patch, sless_core::function::SPEC_FIELDS)?;
    if !fields.contains_key("entrypoint") && patched.runtime.family != spec.runtime.family {
        // Moving to another language without naming an entrypoint takes its default.
        patched.entrypoint.clear();
    }
    patched.validate()?;
    Ok(patched)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sless_core::FunctionStatus;

    fn record(ns: &str, name: &str) -> FunctionRecord {
        let mut spec: sless_core::FunctionSpec =
            serde_json::from_value(serde_json::json!({"runtime": "python3"})).unwrap();
        spec.validate().unwrap();
        FunctionRecord {
            namespace: ns.into(),
            name: name.into(),
            spec,
            status: FunctionStatus::default(),
            revision: 1,
            code_sha256: None,
            generation: 1,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        }
    }

    #[tokio::test]
    async fn functions_round_trip_and_conflict() {
        let store = SqliteStore::in_memory().await.unwrap();
        assert!(store.ensure_namespace("default").await.unwrap());
        assert!(!store.ensure_namespace("default").await.unwrap());
        store
            .create_function(&record("default", "f"))
            .await
            .unwrap();
        let err = store
            .create_function(&record("default", "f"))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict { .. }));
        let err = store
            .create_function(&record("nope", "f"))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::NotFound {
                    kind: "namespace",
                    ..
                }
            ),
            "{err}"
        );
        let got = store.get_function("default", "f").await.unwrap();
        assert_eq!(got.spec.entrypoint, "handler.handle");
        assert_eq!(
            store.list_functions(Some("default")).await.unwrap().len(),
            1
        );
    }

    #[tokio::test]
    async fn identical_code_does_not_bump_the_revision_and_old_status_is_ignored() {
        let store = SqliteStore::in_memory().await.unwrap();
        store.ensure_namespace("default").await.unwrap();
        store
            .create_function(&record("default", "f"))
            .await
            .unwrap();
        let r = store
            .update_function("default", "f", None, FunctionChange::Code("aa".into()))
            .await
            .unwrap();
        assert_eq!(r.revision, 2);
        let r = store
            .update_function("default", "f", None, FunctionChange::Code("aa".into()))
            .await
            .unwrap();
        assert_eq!(r.revision, 2);
        let r = store
            .update_function("default", "f", None, FunctionChange::Code("bb".into()))
            .await
            .unwrap();
        assert_eq!(r.revision, 3);
        let status = FunctionStatus {
            message: "old".into(),
            ..Default::default()
        };
        assert!(!store.set_status("default", "f", 2, &status).await.unwrap());
        assert!(store.set_status("default", "f", 3, &status).await.unwrap());
        assert_eq!(
            store
                .get_function("default", "f")
                .await
                .unwrap()
                .status
                .message,
            "old"
        );
    }

    #[tokio::test]
    async fn patches_merge_validate_and_bump_the_revision_only_on_change() {
        let store = SqliteStore::in_memory().await.unwrap();
        store.ensure_namespace("default").await.unwrap();
        store
            .create_function(&record("default", "f"))
            .await
            .unwrap();
        let r = store
            .update_function(
                "default",
                "f",
                None,
                FunctionChange::Patch(serde_json::json!({"env": {"A": "x"}})),
            )
            .await
            .unwrap();
        assert_eq!(
            (r.revision, r.spec.env["A"].as_plain().unwrap_or_default()),
            (2, "x")
        );
        let r = store
            .update_function(
                "default",
                "f",
                None,
                FunctionChange::Patch(serde_json::json!({"memory_mb": 256})),
            )
            .await
            .unwrap();
        assert_eq!(
            (r.revision, r.spec.memory_mb, r.spec.env.len()),
            (3, 256, 1)
        );
        let r = store
            .update_function(
                "default",
                "f",
                None,
                FunctionChange::Patch(serde_json::json!({"memory_mb": 256})),
            )
            .await
            .unwrap();
        assert_eq!(r.revision, 3);
        let err = store
            .update_function(
                "default",
                "f",
                None,
                FunctionChange::Patch(serde_json::json!({"bogus": 1})),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().starts_with("bogus:"), "{err}");
        let err = store
            .update_function(
                "default",
                "f",
                None,
                FunctionChange::Patch(serde_json::json!({"memory_mb": 1})),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().starts_with("memory_mb:"), "{err}");
        let r = store
            .update_function(
                "default",
                "f",
                None,
                FunctionChange::Patch(serde_json::json!({"memory_mb": null})),
            )
            .await
            .unwrap();
        assert_eq!(r.spec.memory_mb, 128);
    }

    #[tokio::test]
    async fn namespace_delete_needs_force_when_not_empty() {
        let store = SqliteStore::in_memory().await.unwrap();
        store.ensure_namespace("team").await.unwrap();
        store.create_function(&record("team", "f")).await.unwrap();
        store.create_token("h", "team").await.unwrap();
        assert!(matches!(
            store.delete_namespace("team", false).await,
            Err(StoreError::NotEmpty(_))
        ));
        let gone = store.delete_namespace("team", true).await.unwrap();
        assert_eq!(gone.len(), 1);
        assert_eq!(store.token_namespace("h").await.unwrap(), None);
        assert!(matches!(
            store.delete_namespace("team", true).await,
            Err(StoreError::NotFound { .. })
        ));
    }
}
