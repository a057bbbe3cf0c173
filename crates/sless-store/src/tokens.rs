//! Namespace tokens as operators see them: listed by id (never by value or hash),
//! revoked by id, and stamped with their last use. [`TokenStore`] is the seam;
//! [`SqlStore`] implements it in the same table that [`crate::Store`] creates
//! tokens in.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::{Result, SqlStore, StoreError, stamp, time};

/// Hex digits of a token's hash that make its id: 48 bits, so ids of one server's
/// tokens do not collide, while the id tells nothing about the token's value.
pub const TOKEN_ID_LEN: usize = 12;

/// A token's id: the start of the SHA-256 hash of its value (hex).
pub fn token_id(hash: &str) -> String {
    hash.chars().take(TOKEN_ID_LEN).collect()
}

/// Whether `id` has the form of a token id (so it is safe to look up).
pub fn is_token_id(id: &str) -> bool {
    id.len() == TOKEN_ID_LEN && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A namespace token, without its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: String,
    pub namespace: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
}

#[async_trait]
pub trait TokenStore: Send + Sync + 'static {
    /// Tokens of one namespace, or of all when `None`, oldest first.
    async fn list_tokens(&self, namespace: Option<&str>) -> Result<Vec<TokenInfo>>;
    /// Deletes the token with this id; with `namespace`, only if it belongs there
    /// (else `NotFound`, as for an unknown id). Returns the deleted token.
    async fn delete_token(&self, id: &str, namespace: Option<&str>) -> Result<TokenInfo>;
    /// Records that the token with this hash was used at `at`.
    async fn touch_token(&self, hash: &str, at: DateTime<Utc>) -> Result<()>;
}

fn token_from_row(row: &sqlx::any::AnyRow) -> Result<TokenInfo> {
    let hash: String = row.try_get("hash")?;
    let created_at: String = row.try_get("created_at")?;
    let last_used_at: Option<String> = row.try_get("last_used_at")?;
    Ok(TokenInfo {
        id: token_id(&hash),
        namespace: row.try_get("namespace")?,
        created_at: time(&created_at),
        last_used_at: last_used_at.as_deref().map(time),
    })
}

#[async_trait]
impl TokenStore for SqlStore {
    async fn list_tokens(&self, namespace: Option<&str>) -> Result<Vec<TokenInfo>> {
        let rows = sqlx::query(
            "SELECT hash, namespace, created_at, last_used_at FROM tokens \
             WHERE ($1 IS NULL OR namespace = $1) AND namespace NOT LIKE '~trash~%' \
             ORDER BY created_at, hash",
        )
        .bind(namespace)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(token_from_row).collect()
    }

    async fn delete_token(&self, id: &str, namespace: Option<&str>) -> Result<TokenInfo> {
        let not_found = || StoreError::NotFound {
            kind: "token",
            name: id.to_string(),
        };
        if !is_token_id(id) {
            return Err(not_found());
        }
        let row = sqlx::query(
            "DELETE FROM tokens WHERE substr(hash, 1, CAST($1 AS INTEGER)) = $2 AND ($3 IS NULL OR namespace = $3) \
             AND namespace NOT LIKE '~trash~%' \
             RETURNING hash, namespace, created_at, last_used_at",
        )
        .bind(TOKEN_ID_LEN as i64)
        .bind(id)
        .bind(namespace)
        .fetch_optional(self.pool())
        .await?;
        row.as_ref()
            .map(token_from_row)
            .transpose()?
            .ok_or_else(not_found)
    }

    async fn touch_token(&self, hash: &str, at: DateTime<Utc>) -> Result<()> {
        sqlx::query("UPDATE tokens SET last_used_at = $1 WHERE hash = $2")
            .bind(stamp(at))
            .bind(hash)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    #[tokio::test]
    async fn tokens_are_listed_by_id_touched_and_deleted_within_their_namespace() {
        let store = crate::testing::store().await;
        store.ensure_namespace("a").await.unwrap();
        store.ensure_namespace("b").await.unwrap();
        let (ha, hb) = ("a".repeat(64), "b".repeat(64));
        store.create_token(&ha, "a").await.unwrap();
        store.create_token(&hb, "b").await.unwrap();
        let all = store.list_tokens(None).await.unwrap();
        assert_eq!(all.len(), 2);
        let only_a = store.list_tokens(Some("a")).await.unwrap();
        assert_eq!(only_a.len(), 1);
        assert_eq!(only_a[0].id, "aaaaaaaaaaaa");
        assert_eq!(only_a[0].last_used_at, None);

        let used = Utc::now();
        store.touch_token(&ha, used).await.unwrap();
        let a = &store.list_tokens(Some("a")).await.unwrap()[0];
        assert_eq!(
            a.last_used_at.map(|t| t.timestamp_millis()),
            Some(used.timestamp_millis())
        );

        let other_ns = store.delete_token("aaaaaaaaaaaa", Some("b")).await;
        assert!(matches!(other_ns, Err(StoreError::NotFound { .. })));
        assert!(matches!(
            store.delete_token("aaaa%", None).await,
            Err(StoreError::NotFound { .. })
        ));
        let gone = store.delete_token("aaaaaaaaaaaa", Some("a")).await.unwrap();
        assert_eq!(gone.namespace, "a");
        assert_eq!(store.token_namespace(&ha).await.unwrap(), None);
        assert_eq!(store.token_namespace(&hb).await.unwrap(), Some("b".into()));
    }
}
