//! The metadata store: namespaces, functions and tokens. [`Store`] is the seam;
//! [`SqlStore`] implements it on SQLite (the embedded default) and PostgreSQL.
//!
//! Functions, triggers and jobs carry a `generation` that grows by one with every
//! change of their spec or code (never with the status the server reports about
//! them). Every such change is a compare-and-swap on it, retried internally when
//! another writer got there first, and a caller can make it conditional on the
//! generation it last saw (`If-Match`).

/// SQL: the column `$col` names no namespace in the trash (see [`trash`]); every
/// enumeration across namespaces says so.
macro_rules! live {
    ($col:literal) => {
        concat!($col, " NOT LIKE '~trash~%'")
    };
}

mod audit;
pub mod backup;
mod calls;
mod cas;
mod db;
mod dead_letters;
mod devices;
mod invocations;
mod jobs;
#[cfg(test)]
mod plans;
mod query;
mod quotas;
mod secrets;
mod storage;
#[cfg(test)]
pub(crate) mod testing;
mod tokens;
pub mod trash;
mod triggers;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sless_core::{FunctionSpec, FunctionStatus};

pub use calls::{
    CallFilter, CallRecord, CallResponse, CallStore, DEFAULT_CALL_LIMIT, MAX_CALL_LIMIT,
    PendingCall,
};
pub use db::{Backend, SqlStore, sqlite_file};
pub use dead_letters::{
    DEFAULT_DEAD_LETTER_LIMIT, DeadLetterFilter, DeadLetterStore, MAX_DEAD_LETTER_LIMIT,
};
pub use devices::{
    DEFAULT_TELEMETRY_LIMIT, DeviceRecord, DeviceStore, MAX_TELEMETRY_LIMIT, NewTelemetry,
    TelemetryFilter, TelemetryRecord,
};
pub use invocations::{
    DEFAULT_INVOCATION_LIMIT, InvocationFilter, InvocationStore, MAX_INVOCATION_LIMIT,
};
pub use jobs::{JobRecord, JobStore};
pub use quotas::QuotaStore;
pub use secrets::{SecretRecord, SecretReferences, SecretStore};
/// The record types, where the listing's callers expect them.
pub use sless_core::invocation::{InvocationRecord, InvocationSource};
pub use storage::{CodeOwner, StorageStore};
pub use trash::{TrashStore, TrashedNamespace, is_trash_name};
pub use triggers::{TriggerRecord, TriggerStore};
// Token listing and revocation, and the audit log.
pub use audit::{AuditEntry, AuditFilter, AuditStore, DEFAULT_AUDIT_LIMIT, MAX_AUDIT_LIMIT};
pub use tokens::{TOKEN_ID_LEN, TokenInfo, TokenStore, is_token_id, token_id};

/// Errors of the metadata store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The object does not exist.
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    /// An object with that name exists already.
    #[error("{kind} {name:?} already exists")]
    Conflict { kind: &'static str, name: String },
    /// The update was conditional on a generation the object no longer has: it
    /// changed since the caller read it. Nothing was written; `current` is the
    /// generation it has now. Never retried by the store.
    #[error("{kind} {name:?} has changed (it is at generation {current})")]
    PreconditionFailed {
        kind: &'static str,
        name: String,
        current: u64,
    },
    /// Other writers kept changing the object while this update was being applied,
    /// more often than the store retries; nothing was written and the caller may try again.
    #[error("{kind} {name:?} is being changed by others; try again")]
    Contended { kind: &'static str, name: String },
    /// The caller's edit refused the change; its own error, handed back untouched
    /// (downcast it to recover the caller's type).
    #[error("{0}")]
    Rejected(Box<dyn std::error::Error + Send + Sync>),
    /// Another HTTP trigger of the namespace already routes this path.
    #[error("path {path:?} is already served by trigger {owner}")]
    PathTaken { path: String, owner: String },
    /// The namespace still holds functions and `force` was not given.
    #[error("namespace {0:?} is not empty")]
    NotEmpty(String),
    /// The database failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A stored document could not be decoded (written by an incompatible version?).
    #[error("corrupt record: {0}")]
    Corrupt(#[from] serde_json::Error),
    /// A patch produced an invalid spec.
    #[error(transparent)]
    Invalid(#[from] sless_core::ValidationError),
    /// The store's configuration (its URL) is unusable.
    #[error("{0}")]
    Config(String),
    /// Migrations failed at start-up.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl StoreError {
    /// The disk under the database is full (`SQLITE_FULL`, PostgreSQL's
    /// `disk_full`, `ENOSPC`).
    pub fn is_storage_full(&self) -> bool {
        self.sqlite_code().is_some_and(|c| c & 0xff == 13)
            || self.postgres_code() == Some("53100")
            || matches!(self, StoreError::Database(sqlx::Error::Io(e)) if e.kind() == std::io::ErrorKind::StorageFull)
    }

    /// The database file was deleted or replaced under the running server
    /// (`SQLITE_READONLY_DBMOVED`), or cannot be opened any more (`SQLITE_CANTOPEN`).
    pub fn is_store_gone(&self) -> bool {
        self.sqlite_code()
            .is_some_and(|c| c == 1032 || c & 0xff == 14)
    }

    fn sqlite_code(&self) -> Option<i64> {
        let StoreError::Database(e) = self else {
            return None;
        };
        let e = e.as_database_error()?;
        e.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
        e.code()?.parse().ok()
    }

    fn postgres_code(&self) -> Option<&str> {
        let StoreError::Database(e) = self else {
            return None;
        };
        let e = e.as_database_error()?;
        e.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .map(|e| e.code())
    }
}

impl From<sless_core::patch::PatchError> for StoreError {
    fn from(e: sless_core::patch::PatchError) -> Self {
        match e.into_validation() {
            Ok(invalid) => StoreError::Invalid(invalid),
            Err(e) => StoreError::Corrupt(e),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// A function as stored: the desired spec, the latest revision and what the
/// controller last reported about it.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionRecord {
    pub namespace: String,
    pub name: String,
    pub spec: FunctionSpec,
    pub status: FunctionStatus,
    /// Grows with every code upload and every spec change.
    pub revision: u64,
    /// SHA-256 of the latest uploaded archive, if any code was uploaded.
    pub code_sha256: Option<String>,
    /// Grows by one with every change of the spec or the code (every update through
    /// [`Store::update_function`] that changes something); status writes leave it
    /// alone. A new function is at 1, whatever the record passed to create says.
    pub generation: u64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// An edit of a stored record, for the compare-and-swap updates of triggers and jobs:
/// it changes the record it is given (the current one) in place. It may run more
/// than once (once per attempt, each time on a fresh copy of the then current
/// record), so it must not have side effects beyond its own captured state. Its
/// error is returned as is; wrap a foreign error in [`StoreError::Rejected`].
pub type Edit<'a, R> = dyn FnMut(&mut R) -> Result<()> + Send + 'a;

/// How a function changed, for [`Store::update_function`].
#[derive(Debug, Clone)]
pub enum FunctionChange {
    /// A new spec: the revision grows.
    Spec(FunctionSpec),
    /// New code: the revision grows only when the archive differs from the current one.
    Code(String),
    /// A JSON merge patch of the spec, applied and validated against the current
    /// spec (again, should another writer change it meanwhile), so concurrent
    /// patches never lose each other's edits. The revision grows only when the spec
    /// actually changes.
    Patch(serde_json::Value),
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Checks the database answers (for `/readyz`).
    async fn ping(&self) -> Result<()>;

    /// Creates the namespace if missing; `true` when it was created.
    async fn ensure_namespace(&self, name: &str) -> Result<bool>;
    async fn get_namespace(&self, name: &str) -> Result<Namespace>;
    /// Every namespace (none in the trash), by name.
    async fn list_namespaces(&self) -> Result<Vec<Namespace>>;
    /// Deletes a namespace for good; with `force` its functions and tokens go too, and
    /// their records are returned so the caller can stop them. (The API's forced
    /// delete moves it to the trash instead: [`TrashStore::trash_namespace`].)
    async fn delete_namespace(&self, name: &str, force: bool) -> Result<Vec<FunctionRecord>>;

    async fn create_function(&self, record: &FunctionRecord) -> Result<()>;
    async fn get_function(&self, namespace: &str, name: &str) -> Result<FunctionRecord>;
    /// Functions of one namespace, or of all when `None` (those in the trash left
    /// out), ordered by namespace and name.
    async fn list_functions(&self, namespace: Option<&str>) -> Result<Vec<FunctionRecord>>;
    /// Applies a change and returns the record as it now stands. A change that
    /// changes something bumps `revision` and `generation`; one that changes nothing
    /// writes nothing. It is a compare-and-swap on the generation: with `expect`,
    /// only if the function is still at that generation (else
    /// [`StoreError::PreconditionFailed`]); without, it is applied to whatever is
    /// current, recomputed when a concurrent writer got there first, so no edit is lost.
    async fn update_function(
        &self,
        namespace: &str,
        name: &str,
        expect: Option<u64>,
        change: FunctionChange,
    ) -> Result<FunctionRecord>;
    /// Records the controller's view of `revision`. Ignored (returns `false`) when
    /// the function has moved on to a newer revision meanwhile, so a slow build of
    /// old code can never overwrite the status of newer code. The generation stays.
    async fn set_status(
        &self,
        namespace: &str,
        name: &str,
        revision: u64,
        status: &FunctionStatus,
    ) -> Result<bool>;
    async fn delete_function(&self, namespace: &str, name: &str) -> Result<()>;

    /// Stores a namespace token by the hash of its secret.
    async fn create_token(&self, hash: &str, namespace: &str) -> Result<()>;
    /// The namespace a token hash belongs to, if any.
    async fn token_namespace(&self, hash: &str) -> Result<Option<String>>;
}

/// Timestamps are stored as RFC 3339 text with milliseconds.
/// The outcome of an `INSERT` of a `kind` record named `name` in `namespace`: a taken name
/// is `Conflict`, a missing namespace (the foreign key) is `NotFound`.
pub(crate) fn inserted(
    result: std::result::Result<sqlx::any::AnyQueryResult, sqlx::Error>,
    kind: &'static str,
    namespace: &str,
    name: &str,
) -> Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(StoreError::Conflict {
            kind,
            name: name.to_string(),
        }),
        Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => {
            Err(StoreError::NotFound {
                kind: "namespace",
                name: namespace.to_string(),
            })
        }
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Reads a stored timestamp (an unreadable one, which this crate never writes, is the epoch).
pub(crate) fn time(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_default()
}
