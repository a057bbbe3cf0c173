//! The namespace trash. A force-deleted namespace is not deleted but renamed, rows
//! and all, to a hidden name `~trash~<deleted at, µs since the epoch>~<name>`: in one
//! `BEGIN IMMEDIATE` transaction a `namespaces` row of that name is inserted (with the
//! original `created_at`), every table with a `namespace` column but the audit log is
//! moved to it ([`TABLES`]) and the old row goes. The hidden name is not a DNS label,
//! so no API path names it and no new namespace can take it; a namespace of the old
//! name may be created meanwhile. [`TrashStore::restore_namespace`] renames the newest
//! trashed copy back, refusing while the name is in use again, and
//! [`TrashStore::purge_trash`] deletes for good what was trashed before a cutoff.
//!
//! Every enumeration across namespaces leaves trashed namespaces out (the
//! namespace list, functions, triggers and jobs of all namespaces, unfinished calls,
//! the broker's accounts, quota overrides, tokens), so nothing of a trashed namespace
//! runs, serves or authenticates. The exceptions keep what a restore needs: the
//! archives a trashed function or job names stay referenced
//! ([`crate::StorageStore::referenced_blobs`]), and their builds are listed by
//! [`crate::StorageStore::trashed_code`] under their original namespace (the build
//! key contains it), so the collector keeps them too. Retention of records,
//! telemetry and finished calls applies in the trash as anywhere.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::{FunctionRecord, Namespace, Result, SqlStore, StoreError, time};

/// What every hidden name starts with.
pub const TRASH_PREFIX: &str = "~trash~";

/// Lists the tables a namespace's rows live in (each with a `namespace` column; the
/// audit log, which records what happened to the namespace, is left alone), and the
/// statement that moves one namespace's rows to another name (`?1` the new name,
/// `?2` the old one).
macro_rules! namespaced {
    ($($table:literal),+ $(,)?) => {
        /// The tables a namespace's rows live in, all moved to and from the trash.
        pub const TABLES: &[&str] = &[$($table),+];
        const RENAMES: &[&str] = &[$(concat!("UPDATE ", $table, " SET namespace = $1 WHERE namespace = $2")),+];
    };
}

namespaced!(
    "functions",
    "triggers",
    "jobs",
    "secrets",
    "devices",
    "telemetry",
    "tokens",
    "invocations",
    "async_calls",
    "dead_letters",
    "namespace_quotas",
);

/// The hidden name of `namespace` trashed at `deleted_at_us` (µs since the epoch).
/// Zero-padded, so hidden names of one namespace sort by deletion time.
pub fn trash_name(namespace: &str, deleted_at_us: i64) -> String {
    format!("{TRASH_PREFIX}{deleted_at_us:016}~{namespace}")
}

/// Whether `name` is a hidden name of the trash (no namespace name starts with `~`).
pub fn is_trash_name(name: &str) -> bool {
    name.starts_with(TRASH_PREFIX)
}

/// The namespace a hidden name holds and when it was trashed.
pub fn parse_trash_name(hidden: &str) -> Option<(&str, DateTime<Utc>)> {
    let rest = hidden.strip_prefix(TRASH_PREFIX)?;
    let (micros, name) = rest.split_once('~')?;
    let at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
    (!name.is_empty()).then_some((name, at))
}

/// A namespace in the trash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrashedNamespace {
    /// Its name (before it was deleted, and again once restored).
    pub name: String,
    /// The hidden name its rows are kept under.
    pub hidden: String,
    pub deleted_at: DateTime<Utc>,
    /// When the namespace was first created.
    pub created_at: DateTime<Utc>,
}

#[async_trait]
pub trait TrashStore: Send + Sync + 'static {
    /// Moves a namespace and everything in it to the trash; returns its functions
    /// (so the caller can stop them). `NotFound` when there is no such namespace.
    async fn trash_namespace(&self, name: &str) -> Result<Vec<FunctionRecord>>;
    /// Brings back the newest trashed namespace of that name, whole. `NotFound` when
    /// none is in the trash; `Conflict` when a namespace of that name exists (it was
    /// created after the delete).
    async fn restore_namespace(&self, name: &str) -> Result<Namespace>;
    /// Every namespace in the trash, newest first.
    async fn trashed_namespaces(&self) -> Result<Vec<TrashedNamespace>>;
    /// Deletes for good every namespace trashed before `before`, with everything in
    /// it; returns how many went.
    async fn purge_trash(&self, before: DateTime<Utc>) -> Result<u64>;
}

/// The cutoff of a retention of `max_age`.
pub fn purge_cutoff(max_age: Duration) -> DateTime<Utc> {
    let age = chrono::Duration::from_std(max_age).unwrap_or(chrono::Duration::MAX);
    Utc::now()
        .checked_sub_signed(age)
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Moves every row of namespace `from` to `to`, whose `namespaces` row exists.
async fn move_rows(conn: &mut sqlx::AnyConnection, from: &str, to: &str) -> Result<()> {
    for sql in RENAMES {
        sqlx::query(*sql)
            .bind(to)
            .bind(from)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

#[async_trait]
impl TrashStore for SqlStore {
    async fn trash_namespace(&self, name: &str) -> Result<Vec<FunctionRecord>> {
        let not_found = || StoreError::NotFound {
            kind: "namespace",
            name: name.to_string(),
        };
        if is_trash_name(name) {
            return Err(not_found());
        }
        let mut tx = self.begin_write().await?;
        let created_at: String =
            sqlx::query_scalar("SELECT created_at FROM namespaces WHERE name = $1")
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or_else(not_found)?;
        let functions = crate::db::functions_of(&mut tx, name).await?;
        // Two deletes of one name within a microsecond still get names of their own.
        let mut at = Utc::now().timestamp_micros();
        let hidden = loop {
            let hidden = trash_name(name, at);
            let done = sqlx::query(
                "INSERT INTO namespaces (name, created_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            )
            .bind(&hidden)
            .bind(&created_at)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 1 {
                break hidden;
            }
            at += 1;
        };
        move_rows(&mut tx, name, &hidden).await?;
        sqlx::query("DELETE FROM namespaces WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(functions)
    }

    async fn restore_namespace(&self, name: &str) -> Result<Namespace> {
        let mut tx = self.begin_write().await?;
        let newest = trashed(&mut tx)
            .await?
            .into_iter()
            .find(|t| t.name == name)
            .ok_or_else(|| StoreError::NotFound {
                kind: "namespace",
                name: name.to_string(),
            })?;
        let taken = sqlx::query("SELECT 1 FROM namespaces WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        if taken.is_some() {
            return Err(StoreError::Conflict {
                kind: "namespace",
                name: name.to_string(),
            });
        }
        sqlx::query("INSERT INTO namespaces (name, created_at) VALUES ($1, $2)")
            .bind(name)
            .bind(crate::stamp(newest.created_at))
            .execute(&mut *tx)
            .await?;
        move_rows(&mut tx, &newest.hidden, name).await?;
        sqlx::query("DELETE FROM namespaces WHERE name = $1")
            .bind(&newest.hidden)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Namespace {
            name: name.to_string(),
            created_at: newest.created_at,
        })
    }

    async fn trashed_namespaces(&self) -> Result<Vec<TrashedNamespace>> {
        let mut conn = self.pool().acquire().await?;
        trashed(&mut conn).await
    }

    async fn purge_trash(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut purged = 0;
        for t in self.trashed_namespaces().await? {
            if t.deleted_at >= before {
                continue;
            }
            // One transaction per namespace: the write lock is never held for long.
            let mut tx = self.begin_write().await?;
            let exists = sqlx::query("SELECT 1 FROM namespaces WHERE name = $1")
                .bind(&t.hidden)
                .fetch_optional(&mut *tx)
                .await?;
            if exists.is_none() {
                // Restored (or purged) meanwhile.
                continue;
            }
            crate::db::delete_namespace_rows(&mut tx, &t.hidden).await?;
            // Its records are reachable by nothing any more.
            sqlx::query("DELETE FROM invocations WHERE namespace = $1")
                .bind(&t.hidden)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            purged += 1;
        }
        Ok(purged)
    }
}

/// Every namespace in the trash, newest first.
async fn trashed(conn: &mut sqlx::AnyConnection) -> Result<Vec<TrashedNamespace>> {
    let rows = sqlx::query("SELECT name, created_at FROM namespaces WHERE name LIKE '~trash~%'")
        .fetch_all(&mut *conn)
        .await?;
    let mut all = Vec::with_capacity(rows.len());
    for row in rows {
        let hidden: String = row.try_get("name")?;
        let Some((name, deleted_at)) = parse_trash_name(&hidden) else {
            continue;
        };
        all.push(TrashedNamespace {
            name: name.to_string(),
            deleted_at,
            created_at: time(row.try_get::<&str, _>("created_at")?),
            hidden,
        });
    }
    all.sort_by_key(|t| std::cmp::Reverse(t.deleted_at));
    Ok(all)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use serde_json::json;
    use sless_core::invocation::{InvocationRecord, InvocationSource};
    use sless_core::{CallPhase, DeadLetter, DeadLetterSource, DeviceSpec};
    use sless_records::RecordSink;

    use super::*;
    use crate::{
        CallRecord, CallStore, DeadLetterStore, DeviceStore, JobRecord, JobStore, NewTelemetry,
        QuotaStore, SecretStore, StorageStore, Store, TokenStore, TriggerRecord, TriggerStore,
    };

    const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    /// A namespace with a row in every table of [`TABLES`].
    async fn populate(store: &SqlStore, ns: &str, function: &str) {
        let now = Utc::now();
        store.ensure_namespace(ns).await.unwrap();
        let mut spec: sless_core::FunctionSpec =
            serde_json::from_value(json!({"runtime": "python3"})).unwrap();
        spec.validate().unwrap();
        store
            .create_function(&FunctionRecord {
                namespace: ns.into(),
                name: function.into(),
                spec,
                status: Default::default(),
                revision: 1,
                code_sha256: Some(SHA.into()),
                generation: 1,
                created_at: now,
                updated_at: now,
            })
            .await
            .unwrap();
        store
            .create_trigger(&TriggerRecord {
                namespace: ns.into(),
                name: "every-minute".into(),
                spec: serde_json::from_value(
                    json!({"function": function, "type": "cron", "schedule": "* * * * *"}),
                )
                .unwrap(),
                status: Default::default(),
                generation: 1,
                created_at: now,
                updated_at: now,
            })
            .await
            .unwrap();
        store
            .create_job(&JobRecord {
                namespace: ns.into(),
                name: "nightly".into(),
                spec: serde_json::from_value(json!({"function": function, "run_id": 1})).unwrap(),
                status: Default::default(),
                code_sha256: None,
                generation: 1,
                created_at: now,
                updated_at: now,
            })
            .await
            .unwrap();
        store
            .put_secret(ns, "db", BTreeMap::from([("K".to_string(), vec![1, 2, 3])]))
            .await
            .unwrap();
        store
            .create_device(
                ns,
                "sensor",
                &DeviceSpec::default(),
                "pbkdf2-sha512$1$c2FsdA==$aGFzaA==",
            )
            .await
            .unwrap();
        store
            .insert_telemetry(&[NewTelemetry {
                namespace: ns.into(),
                device: "sensor".into(),
                received_at: now,
                payload: json!({"t": 21}),
            }])
            .await
            .unwrap();
        store
            .create_token(&format!("hash-{ns}-{function}"), ns)
            .await
            .unwrap();
        store
            .insert_batch(&[InvocationRecord {
                id: format!("inv-{ns}-{function}"),
                namespace: ns.into(),
                function: function.into(),
                revision: 1,
                source: InvocationSource::Http,
                request_id: "req".into(),
                started_at: now,
                duration: Duration::from_millis(3),
                status: 200,
                cold_start: false,
                error: None,
                attempt: None,
                trigger: None,
                call_id: None,
            }])
            .await
            .unwrap();
        store
            .insert_call(&CallRecord {
                id: format!("call-{ns}-{function}"),
                namespace: ns.into(),
                function: function.into(),
                phase: CallPhase::Queued,
                attempts: 0,
                event: b"{}".to_vec(),
                request_id: "req".into(),
                callback_url: None,
                response: None,
                error: None,
                redrive_of: None,
                queued_at: now,
                started_at: None,
                finished_at: None,
            })
            .await
            .unwrap();
        store
            .put_dead_letter(&DeadLetter {
                id: format!("dl-{ns}-{function}"),
                namespace: ns.into(),
                source: DeadLetterSource::Async,
                trigger: None,
                function: function.into(),
                payload: b"{}".to_vec(),
                message: json!({"call_id": "c"}),
                attempts: 3,
                last_status: 500,
                error: Some("boom".into()),
                failed_at: now,
            })
            .await
            .unwrap();
        store
            .set_namespace_quota(ns, Some(r#"{"functions":3}"#))
            .await
            .unwrap();
    }

    /// How many rows each table holds for `ns`.
    async fn counts(store: &SqlStore, ns: &str) -> BTreeMap<&'static str, i64> {
        let mut counts = BTreeMap::new();
        for (table, sql) in TABLES.iter().zip(COUNTS) {
            let n: i64 = sqlx::query_scalar(*sql)
                .bind(ns)
                .fetch_one(store.pool())
                .await
                .unwrap();
            counts.insert(*table, n);
        }
        counts
    }

    macro_rules! count_statements {
        ($($table:literal),+ $(,)?) => {
            const COUNTS: &[&str] = &[$(concat!("SELECT COUNT(*) FROM ", $table, " WHERE namespace = $1")),+];
        };
    }
    count_statements!(
        "functions",
        "triggers",
        "jobs",
        "secrets",
        "devices",
        "telemetry",
        "tokens",
        "invocations",
        "async_calls",
        "dead_letters",
        "namespace_quotas",
    );

    fn hidden_of(name: &str, trash: &[TrashedNamespace]) -> String {
        trash
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.hidden.clone())
            .unwrap()
    }

    #[tokio::test]
    async fn every_table_with_a_namespace_column_goes_to_the_trash_but_the_audit_log() {
        let store = crate::testing::store().await;
        let sql = match store.backend() {
            crate::Backend::Sqlite => {
                "SELECT m.name FROM sqlite_schema m JOIN pragma_table_info(m.name) p \
                 WHERE m.type = 'table' AND p.name = 'namespace' ORDER BY m.name"
            }
            crate::Backend::Postgres => {
                "SELECT CAST(table_name AS TEXT) FROM information_schema.columns \
                 WHERE table_schema = 'public' AND column_name = 'namespace' ORDER BY table_name"
            }
        };
        let tables: Vec<String> = sqlx::query_scalar(sql)
            .fetch_all(store.pool())
            .await
            .unwrap();
        let mut expected: Vec<String> = TABLES
            .iter()
            .map(|t| t.to_string())
            .chain(["audit".to_string()])
            .collect();
        expected.sort();
        assert_eq!(
            tables, expected,
            "a new table with a namespace column: add it to TABLES"
        );
        let counted: Vec<&str> = COUNTS
            .iter()
            .map(|s| s.split_whitespace().nth(3).unwrap())
            .collect();
        assert_eq!(counted, TABLES);
    }

    #[tokio::test]
    async fn trash_then_restore_brings_every_row_back_and_hides_it_meanwhile() {
        let store = crate::testing::store().await;
        populate(&store, "team", "hello").await;
        populate(&store, "other", "hello").await;
        let before = counts(&store, "team").await;
        assert!(before.values().all(|&n| n == 1), "{before:?}");
        let created = store.get_namespace("team").await.unwrap().created_at;
        let secret = store.get_secret("team", "db").await.unwrap();
        let device = store.get_device("team", "sensor").await.unwrap();

        let functions = store.trash_namespace("team").await.unwrap();
        assert_eq!(functions.len(), 1);
        assert!(matches!(
            store.get_namespace("team").await,
            Err(StoreError::NotFound { .. })
        ));
        assert!(counts(&store, "team").await.values().all(|&n| n == 0));
        let trash = store.trashed_namespaces().await.unwrap();
        assert_eq!(trash.len(), 1);
        let hidden = hidden_of("team", &trash);
        assert!(is_trash_name(&hidden), "{hidden}");
        assert_eq!(parse_trash_name(&hidden).unwrap().0, "team");
        assert_eq!(counts(&store, &hidden).await, before);
        assert_eq!(trash[0].created_at, created);

        // No enumeration across namespaces sees it; the other namespace is untouched.
        let names: Vec<_> = store
            .list_namespaces()
            .await
            .unwrap()
            .into_iter()
            .map(|n| n.name)
            .collect();
        assert_eq!(names, ["other"]);
        let only_other = |ns: Vec<String>| assert!(ns.iter().all(|n| n == "other"), "{ns:?}");
        only_other(
            store
                .list_functions(None)
                .await
                .unwrap()
                .into_iter()
                .map(|f| f.namespace)
                .collect(),
        );
        only_other(
            store
                .list_triggers(None)
                .await
                .unwrap()
                .into_iter()
                .map(|t| t.namespace)
                .collect(),
        );
        only_other(
            store
                .list_jobs(None)
                .await
                .unwrap()
                .into_iter()
                .map(|j| j.namespace)
                .collect(),
        );
        only_other(
            store
                .all_devices()
                .await
                .unwrap()
                .into_iter()
                .map(|d| d.namespace)
                .collect(),
        );
        only_other(
            store
                .unfinished_counts()
                .await
                .unwrap()
                .into_iter()
                .map(|c| c.0)
                .collect(),
        );
        only_other(
            store
                .namespace_quotas()
                .await
                .unwrap()
                .into_iter()
                .map(|q| q.0)
                .collect(),
        );
        only_other(
            store
                .list_tokens(None)
                .await
                .unwrap()
                .into_iter()
                .map(|t| t.namespace)
                .collect(),
        );
        assert_eq!(
            store.token_namespace("hash-team-hello").await.unwrap(),
            None
        );
        assert!(matches!(
            store
                .delete_token(&crate::token_id("hash-team-hello"), None)
                .await,
            Err(StoreError::NotFound { .. })
        ));
        // Its code is still referenced, and its builds are known by the old namespace.
        assert!(store.referenced_blobs().await.unwrap().contains(SHA));
        let (functions, jobs) = store.trashed_code().await.unwrap();
        assert_eq!(
            functions
                .iter()
                .map(|f| (f.namespace.as_str(), f.name.as_str()))
                .collect::<Vec<_>>(),
            [("team", "hello")]
        );
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].namespace, "team");
        // Nothing of it counts for a namespace made under the name meanwhile.
        assert_eq!(store.namespace_storage("team", None).await.unwrap(), 0);

        let restored = store.restore_namespace("team").await.unwrap();
        assert_eq!(
            (restored.name.as_str(), restored.created_at),
            ("team", created)
        );
        assert_eq!(counts(&store, "team").await, before);
        assert!(counts(&store, &hidden).await.values().all(|&n| n == 0));
        assert!(store.trashed_namespaces().await.unwrap().is_empty());
        assert!(store.get_namespace(&hidden).await.is_err());
        // Sealed as it was, the same password hash, the same token.
        assert_eq!(store.get_secret("team", "db").await.unwrap(), secret);
        assert_eq!(
            store
                .get_device("team", "sensor")
                .await
                .unwrap()
                .password_hash,
            device.password_hash
        );
        assert_eq!(
            store
                .token_namespace("hash-team-hello")
                .await
                .unwrap()
                .as_deref(),
            Some("team")
        );
        let namespaces: HashSet<String> = store
            .list_functions(None)
            .await
            .unwrap()
            .into_iter()
            .map(|f| f.namespace)
            .collect();
        assert_eq!(namespaces, HashSet::from(["team".into(), "other".into()]));
        assert!(store.trashed_code().await.unwrap().0.is_empty());
    }

    #[tokio::test]
    async fn a_name_in_use_again_conflicts_and_the_newest_delete_comes_back() {
        let store = crate::testing::store().await;
        assert!(matches!(
            store.restore_namespace("team").await,
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            store.trash_namespace("team").await,
            Err(StoreError::NotFound { .. })
        ));
        populate(&store, "team", "first").await;
        store.trash_namespace("team").await.unwrap();
        // The name is free: a new namespace takes it, and the restore is refused.
        assert!(store.ensure_namespace("team").await.unwrap());
        assert!(matches!(
            store.restore_namespace("team").await,
            Err(StoreError::Conflict { .. })
        ));
        // The refused restore changed nothing.
        assert_eq!(store.trashed_namespaces().await.unwrap().len(), 1);
        assert!(store.list_functions(Some("team")).await.unwrap().is_empty());
        // The new one is deleted too (forced: it goes to the trash as well).
        populate(&store, "team", "second").await;
        store.trash_namespace("team").await.unwrap();
        let trash = store.trashed_namespaces().await.unwrap();
        assert_eq!(trash.len(), 2);
        assert!(trash[0].deleted_at > trash[1].deleted_at);
        // The newest comes back first, then (once that is gone for good) the older.
        store.restore_namespace("team").await.unwrap();
        let names = |fs: Vec<FunctionRecord>| fs.into_iter().map(|f| f.name).collect::<Vec<_>>();
        assert_eq!(
            names(store.list_functions(Some("team")).await.unwrap()),
            ["second"]
        );
        store.delete_namespace("team", true).await.unwrap();
        store.restore_namespace("team").await.unwrap();
        assert_eq!(
            names(store.list_functions(Some("team")).await.unwrap()),
            ["first"]
        );
        assert!(store.trashed_namespaces().await.unwrap().is_empty());
        // A hidden name is no namespace to trash.
        store.trash_namespace("team").await.unwrap();
        let hidden = hidden_of("team", &store.trashed_namespaces().await.unwrap());
        assert!(matches!(
            store.trash_namespace(&hidden).await,
            Err(StoreError::NotFound { .. })
        ));
    }

    #[tokio::test]
    async fn purge_deletes_what_was_trashed_before_the_cutoff_for_good() {
        let store = crate::testing::store().await;
        populate(&store, "team", "hello").await;
        populate(&store, "other", "hello").await;
        store.trash_namespace("team").await.unwrap();
        let hidden = hidden_of("team", &store.trashed_namespaces().await.unwrap());
        // Within the retention: kept.
        assert_eq!(
            store
                .purge_trash(purge_cutoff(Duration::from_secs(3600)))
                .await
                .unwrap(),
            0
        );
        assert_eq!(store.trashed_namespaces().await.unwrap().len(), 1);
        // Past it: gone, every row with it, and nothing left to restore.
        let later = Utc::now() + chrono::Duration::seconds(1);
        assert_eq!(store.purge_trash(later).await.unwrap(), 1);
        assert!(store.trashed_namespaces().await.unwrap().is_empty());
        assert!(counts(&store, &hidden).await.values().all(|&n| n == 0));
        assert!(store.get_namespace(&hidden).await.is_err());
        assert!(matches!(
            store.restore_namespace("team").await,
            Err(StoreError::NotFound { .. })
        ));
        assert!(store.trashed_code().await.unwrap().0.is_empty());
        // The other namespace is untouched.
        assert!(counts(&store, "other").await.values().all(|&n| n == 1));
        assert_eq!(store.purge_trash(later).await.unwrap(), 0);
    }

    #[test]
    fn hidden_names_hold_the_name_and_the_time() {
        let at = DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let hidden = trash_name("team-a", at.timestamp_micros());
        assert_eq!(hidden, "~trash~1700000000123456~team-a");
        assert_eq!(parse_trash_name(&hidden), Some(("team-a", at)));
        assert!(is_trash_name(&hidden));
        assert!(sless_core::validate_name("namespace", &hidden).is_err());
        assert!(!is_trash_name("team-a"));
        for bad in [
            "team",
            "~trash~",
            "~trash~x~team",
            "~trash~123~",
            "~trash~123",
        ] {
            assert_eq!(parse_trash_name(bad), None, "{bad}");
        }
        // Zero-padded: one namespace's hidden names sort by time.
        assert!(trash_name("a", 999) < trash_name("a", 1000));
    }
}
