//! What code storage is referenced and by whom: the queries behind garbage
//! collection (which archives are still named) and the per-namespace storage
//! quota (how many bytes a namespace's code takes).

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::Row;

use crate::trash::parse_trash_name;
use crate::{FunctionRecord, JobRecord, Result, SqlStore};

/// The function or job whose code is being replaced: its current archive is
/// left out of the count, since the upload replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeOwner<'a> {
    Function(&'a str),
    Job(&'a str),
}

#[async_trait]
pub trait StorageStore: Send + Sync + 'static {
    /// Records the sizes of a stored archive (idempotent).
    async fn record_blob(&self, sha256: &str, compressed: u64, unpacked: u64) -> Result<()>;
    /// Bytes the code of `namespace` takes: every distinct archive its functions
    /// and jobs name, counted once (compressed plus unpacked), without the one
    /// `except` names now.
    async fn namespace_storage(
        &self,
        namespace: &str,
        except: Option<CodeOwner<'_>>,
    ) -> Result<u64>;
    /// Whether a function or job of `namespace` other than `except` names `sha256`.
    async fn namespace_references(
        &self,
        namespace: &str,
        sha256: &str,
        except: Option<CodeOwner<'_>>,
    ) -> Result<bool>;
    /// Every archive a function or job of any namespace names, those in the trash
    /// included (they are kept for a restore).
    async fn referenced_blobs(&self) -> Result<HashSet<String>>;
    /// The functions and jobs of namespaces in the trash, each under the name of
    /// the namespace it was trashed from (their builds' keys contain it), so their
    /// builds are kept for a restore.
    async fn trashed_code(&self) -> Result<(Vec<FunctionRecord>, Vec<JobRecord>)>;
    /// Forgets the sizes of archives that were removed.
    async fn forget_blobs(&self, sha256s: &[String]) -> Result<()>;
}

/// The names to leave out: (function, job); an empty name matches nothing.
fn excluded<'a>(except: Option<CodeOwner<'a>>) -> (&'a str, &'a str) {
    match except {
        Some(CodeOwner::Function(f)) => (f, ""),
        Some(CodeOwner::Job(j)) => ("", j),
        None => ("", ""),
    }
}

/// The archives a namespace's functions and jobs name, but for one of each;
/// binds: namespace, function name, namespace, job name.
macro_rules! named {
    () => {
        "SELECT code_sha256 FROM functions \
         WHERE namespace = $1 AND code_sha256 IS NOT NULL AND name != $2 \
         UNION SELECT code_sha256 FROM jobs \
         WHERE namespace = $3 AND code_sha256 IS NOT NULL AND name != $4"
    };
}

#[async_trait]
impl StorageStore for SqlStore {
    async fn record_blob(&self, sha256: &str, compressed: u64, unpacked: u64) -> Result<()> {
        sqlx::query(
            "INSERT INTO blob_sizes (sha256, compressed, unpacked) VALUES ($1, $2, $3) \
             ON CONFLICT (sha256) DO UPDATE SET compressed = excluded.compressed, unpacked = excluded.unpacked",
        )
        .bind(sha256)
        .bind(compressed as i64)
        .bind(unpacked as i64)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn namespace_storage(
        &self,
        namespace: &str,
        except: Option<CodeOwner<'_>>,
    ) -> Result<u64> {
        let (function, job) = excluded(except);
        let row = sqlx::query(concat!(
            "SELECT CAST(COALESCE(SUM(compressed + unpacked), 0) AS BIGINT) AS used \
             FROM blob_sizes WHERE sha256 IN (",
            named!(),
            ")"
        ))
        .bind(namespace)
        .bind(function)
        .bind(namespace)
        .bind(job)
        .fetch_one(self.pool())
        .await?;
        let used: i64 = row.try_get("used")?;
        Ok(used.max(0) as u64)
    }

    async fn namespace_references(
        &self,
        namespace: &str,
        sha256: &str,
        except: Option<CodeOwner<'_>>,
    ) -> Result<bool> {
        let (function, job) = excluded(except);
        let row = sqlx::query(concat!(
            "SELECT CASE WHEN EXISTS (SELECT 1 FROM (",
            named!(),
            ") AS n WHERE code_sha256 = $5) THEN 1 ELSE 0 END AS named"
        ))
        .bind(namespace)
        .bind(function)
        .bind(namespace)
        .bind(job)
        .bind(sha256)
        .fetch_one(self.pool())
        .await?;
        Ok(row.try_get::<i64, _>("named")? != 0)
    }

    async fn referenced_blobs(&self) -> Result<HashSet<String>> {
        let rows = sqlx::query(
            "SELECT code_sha256 FROM functions WHERE code_sha256 IS NOT NULL \
             UNION SELECT code_sha256 FROM jobs WHERE code_sha256 IS NOT NULL",
        )
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>("code_sha256").map_err(Into::into))
            .collect()
    }

    async fn trashed_code(&self) -> Result<(Vec<FunctionRecord>, Vec<JobRecord>)> {
        let rows = sqlx::query("SELECT * FROM functions WHERE namespace LIKE '~trash~%'")
            .fetch_all(self.pool())
            .await?;
        let mut functions = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut f = crate::db::function_from_row(row)?;
            if let Some((ns, _)) = parse_trash_name(&f.namespace) {
                f.namespace = ns.to_string();
                functions.push(f);
            }
        }
        let rows = sqlx::query("SELECT * FROM jobs WHERE namespace LIKE '~trash~%'")
            .fetch_all(self.pool())
            .await?;
        let mut jobs = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut j = crate::jobs::from_row(row)?;
            if let Some((ns, _)) = parse_trash_name(&j.namespace) {
                j.namespace = ns.to_string();
                jobs.push(j);
            }
        }
        Ok((functions, jobs))
    }

    async fn forget_blobs(&self, sha256s: &[String]) -> Result<()> {
        for sha in sha256s {
            sqlx::query("DELETE FROM blob_sizes WHERE sha256 = $1")
                .bind(sha)
                .execute(self.pool())
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FunctionChange, JobStore, Store};

    #[tokio::test]
    async fn usage_counts_each_named_archive_once_and_leaves_out_the_replaced_one() {
        let store = crate::testing::store().await;
        for ns in ["a", "b"] {
            store.ensure_namespace(ns).await.unwrap();
        }
        let sha = |c: char| c.to_string().repeat(64);
        let now = chrono::Utc::now();
        for (ns, name, code) in [
            ("a", "f1", '1'),
            ("a", "f2", '1'),
            ("a", "f3", '2'),
            ("b", "g", '3'),
        ] {
            let mut spec: sless_core::FunctionSpec =
                serde_json::from_value(serde_json::json!({"runtime": "python3"})).unwrap();
            spec.validate().unwrap();
            let r = crate::FunctionRecord {
                namespace: ns.into(),
                name: name.into(),
                spec,
                status: Default::default(),
                revision: 1,
                code_sha256: None,
                generation: 1,
                created_at: now,
                updated_at: now,
            };
            store.create_function(&r).await.unwrap();
            store
                .update_function(ns, name, None, FunctionChange::Code(sha(code)))
                .await
                .unwrap();
        }
        store
            .create_job(&JobRecord {
                namespace: "a".into(),
                name: "j".into(),
                spec: serde_json::from_value(serde_json::json!({"runtime": "python3"})).unwrap(),
                status: Default::default(),
                code_sha256: Some(sha('4')),
                generation: 1,
                created_at: now,
                updated_at: now,
            })
            .await
            .unwrap();
        for (c, size) in [('1', 10), ('2', 200), ('3', 3000), ('4', 40000), ('5', 1)] {
            store.record_blob(&sha(c), size, size).await.unwrap();
        }
        // '1' is named twice but counted once; '5' is named by nobody.
        assert_eq!(
            store.namespace_storage("a", None).await.unwrap(),
            2 * (10 + 200 + 40000)
        );
        assert_eq!(store.namespace_storage("b", None).await.unwrap(), 6000);
        assert_eq!(
            store
                .namespace_storage("a", Some(CodeOwner::Function("f3")))
                .await
                .unwrap(),
            2 * (10 + 40000)
        );
        assert_eq!(
            store
                .namespace_storage("a", Some(CodeOwner::Job("j")))
                .await
                .unwrap(),
            2 * (10 + 200)
        );
        assert!(
            store
                .namespace_references("a", &sha('1'), Some(CodeOwner::Function("f1")))
                .await
                .unwrap()
        );
        assert!(
            !store
                .namespace_references("a", &sha('2'), Some(CodeOwner::Function("f3")))
                .await
                .unwrap()
        );
        assert!(
            !store
                .namespace_references("a", &sha('3'), None)
                .await
                .unwrap()
        );
        assert_eq!(
            store.referenced_blobs().await.unwrap(),
            ['1', '2', '3', '4'].into_iter().map(sha).collect()
        );
        store.forget_blobs(&[sha('2')]).await.unwrap();
        assert_eq!(
            store.namespace_storage("a", None).await.unwrap(),
            2 * (10 + 40000)
        );
    }
}
