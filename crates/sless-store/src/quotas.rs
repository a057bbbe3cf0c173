//! Per-namespace quota overrides (migration 0008), stored as the JSON object of
//! the quotas an admin set; the defaults are the server's flags and not stored.

use async_trait::async_trait;
use sqlx::Row;

use crate::{Result, SqlStore, StoreError};

#[async_trait]
pub trait QuotaStore: Send + Sync + 'static {
    /// The overrides of `namespace` as stored, if any were set.
    async fn namespace_quota(&self, namespace: &str) -> Result<Option<String>>;
    /// Replaces the overrides of `namespace` (`None` removes them); a missing
    /// namespace is `NotFound`.
    async fn set_namespace_quota(&self, namespace: &str, quota: Option<&str>) -> Result<()>;
    /// Every namespace's overrides, ordered by namespace.
    async fn namespace_quotas(&self) -> Result<Vec<(String, String)>>;
}

#[async_trait]
impl QuotaStore for SqlStore {
    async fn namespace_quota(&self, namespace: &str) -> Result<Option<String>> {
        let row = sqlx::query("SELECT quota FROM namespace_quotas WHERE namespace = $1")
            .bind(namespace)
            .fetch_optional(self.pool())
            .await?;
        Ok(row.map(|r| r.get::<String, _>("quota")))
    }

    async fn set_namespace_quota(&self, namespace: &str, quota: Option<&str>) -> Result<()> {
        let result = match quota {
            Some(q) => {
                sqlx::query(
                    "INSERT INTO namespace_quotas (namespace, quota) \
                     SELECT name, $1 FROM namespaces WHERE name = $2 \
                     ON CONFLICT (namespace) DO UPDATE SET quota = excluded.quota",
                )
                .bind(q)
                .bind(namespace)
                .execute(self.pool())
                .await?
            }
            None => {
                sqlx::query("DELETE FROM namespace_quotas WHERE namespace = $1")
                    .bind(namespace)
                    .execute(self.pool())
                    .await?;
                return Ok(());
            }
        };
        if result.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                kind: "namespace",
                name: namespace.to_string(),
            });
        }
        Ok(())
    }

    async fn namespace_quotas(&self) -> Result<Vec<(String, String)>> {
        let rows = sqlx::query(concat!(
            "SELECT namespace, quota FROM namespace_quotas WHERE ",
            live!("namespace"),
            " ORDER BY namespace"
        ))
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get("namespace"), r.get("quota")))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    #[tokio::test]
    async fn overrides_round_trip_and_go_with_their_namespace() {
        let store = crate::testing::store().await;
        store.ensure_namespace("a").await.unwrap();
        assert_eq!(store.namespace_quota("a").await.unwrap(), None);
        store
            .set_namespace_quota("a", Some(r#"{"functions":3}"#))
            .await
            .unwrap();
        store
            .set_namespace_quota("a", Some(r#"{"functions":4}"#))
            .await
            .unwrap();
        assert_eq!(
            store.namespace_quota("a").await.unwrap().as_deref(),
            Some(r#"{"functions":4}"#)
        );
        assert!(matches!(
            store.set_namespace_quota("nope", Some("{}")).await,
            Err(StoreError::NotFound { .. })
        ));
        assert_eq!(store.namespace_quotas().await.unwrap().len(), 1);
        store.delete_namespace("a", true).await.unwrap();
        assert!(store.namespace_quotas().await.unwrap().is_empty());
    }
}
