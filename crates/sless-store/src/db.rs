//! The SQL adapter: one implementation of the store traits over sqlx's `Any`
//! driver, on SQLite (embedded, the default: WAL mode, one file) or PostgreSQL
//! (`--database-url postgres://...`). Migrations run at open, from `migrations/`
//! or `migrations-postgres/` (the same schema, written for each).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

use crate::cas::Cas;
use crate::{FunctionChange, FunctionRecord, Namespace, Result, Store, StoreError, time};

/// Which database a [`SqlStore`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Metadata, records, telemetry and queued calls in one SQL database.
///
/// No lock of its own: read-modify-write updates are compare-and-swaps on the
/// object's generation (see [`crate::cas`]). The transactions that read before they
/// write (deleting a namespace, moving it to and from the trash, purging the trash)
/// start with [`SqlStore::begin_write`]: on SQLite `BEGIN IMMEDIATE`, which holds the
/// one writer's lock from the first read (so it cannot fail with `SQLITE_BUSY` when
/// another connection wrote since that read); on PostgreSQL a transaction-scoped
/// advisory lock, which serialises those transactions the same way.
pub struct SqlStore {
    pool: AnyPool,
    backend: Backend,
    /// Group commits of async calls' writes (started with the store).
    calls: crate::calls::CallWriter,
}

/// The advisory lock key [`SqlStore::begin_write`] takes on PostgreSQL.
const WRITE_LOCK: i64 = 0x0073_6c65_7373; // "sless"

impl SqlStore {
    /// Opens (creating if needed) the SQLite database at `path` and runs migrations.
    pub async fn open(path: &Path) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let path = path
            .to_str()
            .ok_or_else(|| StoreError::Config(format!("{}: not a UTF-8 path", path.display())))?;
        // `Any` takes its options as a URL (the path percent-encoded, so a data directory
        // may hold spaces, `%`, `?` or `#`); `mode=rwc` creates the file if missing.
        const PATH: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
            .add(b' ')
            .add(b'%')
            .add(b'?')
            .add(b'#');
        let path = percent_encoding::utf8_percent_encode(path, PATH);
        let options = AnyConnectOptions::from_str(&format!("sqlite://{path}?mode=rwc"))?;
        let pool = AnyPoolOptions::new()
            .max_connections(4)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    for pragma in [
                        "PRAGMA journal_mode = WAL",
                        "PRAGMA synchronous = NORMAL",
                        "PRAGMA foreign_keys = ON",
                        "PRAGMA busy_timeout = 10000",
                    ] {
                        sqlx::query(pragma).execute(&mut *conn).await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Self::with_pool(pool, Backend::Sqlite))
    }

    /// Connects to the PostgreSQL database at `url` (`postgres://user:password@host/db`)
    /// and runs migrations.
    pub async fn connect_postgres(url: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let options = AnyConnectOptions::from_str(url)?;
        let pool = AnyPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations-postgres").run(&pool).await?;
        Ok(Self::with_pool(pool, Backend::Postgres))
    }

    /// Opens the store a `--database-url` names: `postgres://` (or `postgresql://`)
    /// for PostgreSQL, `sqlite://PATH` for a SQLite file.
    pub async fn from_url(url: &str) -> Result<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Self::connect_postgres(url).await
        } else if let Some(path) = sqlite_file(url) {
            Self::open(Path::new(path)).await
        } else {
            Err(StoreError::Config(
                "--database-url: expected postgres://user:password@host/db or sqlite://PATH".into(),
            ))
        }
    }

    fn with_pool(pool: AnyPool, backend: Backend) -> Self {
        let calls = crate::calls::CallWriter::start(pool.clone(), backend);
        Self {
            pool,
            backend,
            calls,
        }
    }

    /// The database this store runs on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The writer async calls' lifecycle writes go through.
    pub(crate) fn call_writer(&self) -> &crate::calls::CallWriter {
        &self.calls
    }

    /// The connection pool, for the other record kinds kept in the same database.
    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// A transaction that reads before it writes, serialised with every other such
    /// transaction (see the type's doc).
    pub(crate) async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>> {
        match self.backend {
            Backend::Sqlite => Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?),
            Backend::Postgres => {
                let mut tx = self.pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(WRITE_LOCK)
                    .execute(&mut *tx)
                    .await?;
                Ok(tx)
            }
        }
    }

    /// An in-memory SQLite database, for tests.
    pub async fn in_memory() -> Result<Self> {
        sqlx::any::install_default_drivers();
        let options = AnyConnectOptions::from_str("sqlite::memory:")?;
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query("PRAGMA foreign_keys = ON")
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                })
            })
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Self::with_pool(pool, Backend::Sqlite))
    }
}

/// The file a `sqlite://PATH` (or `sqlite:PATH`) URL names.
pub fn sqlite_file(url: &str) -> Option<&str> {
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = path.split('?').next().unwrap_or(path);
    (!path.is_empty()).then_some(path)
}

fn now() -> String {
    crate::stamp(Utc::now())
}

pub(crate) fn function_from_row(row: &AnyRow) -> Result<FunctionRecord> {
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
    conn: &mut sqlx::AnyConnection,
    namespace: &str,
) -> Result<Vec<FunctionRecord>> {
    let rows = sqlx::query(concat!(
        "SELECT ",
        function_columns!(),
        " FROM functions WHERE namespace = $1"
    ))
    .bind(namespace)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(function_from_row).collect()
}

/// Deletes a namespace and everything in it (its quota overrides by the foreign
/// key's cascade), inside the caller's transaction. Invocation records stay.
pub(crate) async fn delete_namespace_rows(
    conn: &mut sqlx::AnyConnection,
    name: &str,
) -> Result<()> {
    for sql in [
        "DELETE FROM functions WHERE namespace = $1",
        "DELETE FROM triggers WHERE namespace = $1",
        "DELETE FROM jobs WHERE namespace = $1",
        "DELETE FROM secrets WHERE namespace = $1",
        "DELETE FROM async_calls WHERE namespace = $1",
        "DELETE FROM dead_letters WHERE namespace = $1",
        "DELETE FROM telemetry WHERE namespace = $1",
        "DELETE FROM devices WHERE namespace = $1",
        "DELETE FROM tokens WHERE namespace = $1",
        "DELETE FROM namespaces WHERE name = $1",
    ] {
        sqlx::query(sql).bind(name).execute(&mut *conn).await?;
    }
    Ok(())
}

#[async_trait]
impl Store for SqlStore {
    async fn ping(&self) -> Result<()> {
        // A read of the schema goes through the database file, unlike `SELECT 1`.
        let sql = match self.backend {
            Backend::Sqlite => "SELECT count(*) FROM sqlite_schema",
            Backend::Postgres => "SELECT count(*) FROM namespaces",
        };
        sqlx::query(sql).execute(&self.pool).await?;
        Ok(())
    }

    async fn ensure_namespace(&self, name: &str) -> Result<bool> {
        let done = sqlx::query(
            "INSERT INTO namespaces (name, created_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn get_namespace(&self, name: &str) -> Result<Namespace> {
        let row = sqlx::query("SELECT name, created_at FROM namespaces WHERE name = $1")
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
        let mut tx = self.begin_write().await?;
        let exists = sqlx::query("SELECT 1 FROM namespaces WHERE name = $1")
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
        let devices: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM devices WHERE namespace = $1")
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
            ") VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $8)"
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
            " FROM functions WHERE namespace = $1 AND name = $2"
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
                    " FROM functions WHERE namespace = $1 ORDER BY name"
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
                "UPDATE functions SET spec = $1, code_sha256 = $2, revision = $3, generation = $4, updated_at = $5 \
                 WHERE namespace = $6 AND name = $7 AND generation = $8",
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
            "UPDATE functions SET status = $1 WHERE namespace = $2 AND name = $3 AND revision = $4",
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
        let done = sqlx::query("DELETE FROM functions WHERE namespace = $1 AND name = $2")
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
        sqlx::query("INSERT INTO tokens (hash, namespace, created_at) VALUES ($1, $2, $3)")
            .bind(hash)
            .bind(namespace)
            .bind(now())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn token_namespace(&self, hash: &str) -> Result<Option<String>> {
        let row = sqlx::query(concat!(
            "SELECT namespace FROM tokens WHERE hash = $1 AND ",
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
        let store = crate::testing::store().await;
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
        let store = crate::testing::store().await;
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
        let store = crate::testing::store().await;
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
        let store = crate::testing::store().await;
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

    #[tokio::test]
    async fn a_sqlite_file_may_have_any_name() {
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("data dir #1 %20 ?x");
        std::fs::create_dir(&odd).unwrap();
        let store = SqlStore::open(&odd.join("sless.db")).await.unwrap();
        crate::Store::ensure_namespace(&store, "team")
            .await
            .unwrap();
        drop(store);
        assert!(odd.join("sless.db").is_file());
        let again = SqlStore::open(&odd.join("sless.db")).await.unwrap();
        assert_eq!(
            crate::Store::list_namespaces(&again).await.unwrap().len(),
            1
        );
    }
}
