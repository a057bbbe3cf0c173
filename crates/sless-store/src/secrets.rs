//! Secrets: sealed values only. The store never sees a plaintext value; sealing and
//! opening are the caller's (`sless-secrets`), since the key never reaches the database.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{Result, SqlStore, StoreError, stamp, time};

/// One secret as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRecord {
    pub namespace: String,
    pub name: String,
    /// Key → `nonce || ciphertext+tag`.
    pub sealed: BTreeMap<String, Vec<u8>>,
    /// Changes with every write of the secret (its sealed bytes' hash: fresh nonces
    /// make every write differ), and only then.
    pub digest: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl SecretRecord {
    pub fn keys(&self) -> Vec<String> {
        self.sealed.keys().cloned().collect()
    }
}

/// What still refers to a secret, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretReferences {
    pub functions: Vec<String>,
    pub triggers: Vec<String>,
    pub jobs: Vec<String>,
}

impl SecretReferences {
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty() && self.triggers.is_empty() && self.jobs.is_empty()
    }
}

impl std::fmt::Display for SecretReferences {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        for (kind, names) in [
            ("functions", &self.functions),
            ("triggers", &self.triggers),
            ("jobs", &self.jobs),
        ] {
            if !names.is_empty() {
                parts.push(format!("{kind} {}", names.join(", ")));
            }
        }
        f.write_str(&parts.join("; "))
    }
}

#[async_trait]
pub trait SecretStore: Send + Sync + 'static {
    /// Creates or replaces a secret; `true` when it was created.
    async fn put_secret(
        &self,
        namespace: &str,
        name: &str,
        sealed: BTreeMap<String, Vec<u8>>,
    ) -> Result<(SecretRecord, bool)>;
    async fn get_secret(&self, namespace: &str, name: &str) -> Result<SecretRecord>;
    async fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretRecord>>;
    /// What in `namespace` refers to the secret `name`.
    async fn secret_references(&self, namespace: &str, name: &str) -> Result<SecretReferences>;
    /// Deletes a secret nothing refers to; `Ok(Err(refs))` (nothing deleted) names what
    /// still does. The check and the delete are one transaction.
    async fn delete_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<std::result::Result<(), SecretReferences>>;
}

fn digest(sealed: &BTreeMap<String, Vec<u8>>) -> String {
    let mut h = Sha256::new();
    for (key, value) in sealed {
        h.update((key.len() as u64).to_be_bytes());
        h.update(key.as_bytes());
        h.update((value.len() as u64).to_be_bytes());
        h.update(value);
    }
    hex::encode(&h.finalize()[..16])
}

fn from_row(row: &AnyRow) -> Result<SecretRecord> {
    let text: String = row.try_get("sealed")?;
    let encoded: BTreeMap<String, String> = serde_json::from_str(&text)?;
    let mut sealed = BTreeMap::new();
    for (key, hex_value) in encoded {
        let bytes = hex::decode(&hex_value).map_err(|e| {
            StoreError::Corrupt(serde_json::Error::io(std::io::Error::other(format!(
                "sealed value of key {key:?}: {e}"
            ))))
        })?;
        sealed.insert(key, bytes);
    }
    Ok(SecretRecord {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        sealed,
        digest: row.try_get("digest")?,
        created_at: time(&row.try_get::<String, _>("created_at")?),
        updated_at: time(&row.try_get::<String, _>("updated_at")?),
    })
}

/// Whether a stored spec holds `{"secret": name, "key": ...}` anywhere.
pub(crate) fn names_secret(v: &Value, name: &str) -> bool {
    match v {
        Value::Object(map) => {
            (map.len() == 2
                && map.get("secret").and_then(Value::as_str) == Some(name)
                && map.get("key").is_some_and(Value::is_string))
                || map.values().any(|v| names_secret(v, name))
        }
        Value::Array(items) => items.iter().any(|v| names_secret(v, name)),
        _ => false,
    }
}

async fn references(
    conn: &mut sqlx::AnyConnection,
    namespace: &str,
    name: &str,
) -> Result<SecretReferences> {
    let mut refs = SecretReferences::default();
    // The JSON walk decides (the same on every backend).
    for (query, out) in [
        (
            "SELECT name, spec FROM functions WHERE namespace = $1 ORDER BY name",
            &mut refs.functions,
        ),
        (
            "SELECT name, spec FROM triggers WHERE namespace = $1 ORDER BY name",
            &mut refs.triggers,
        ),
        (
            "SELECT name, spec FROM jobs WHERE namespace = $1 ORDER BY name",
            &mut refs.jobs,
        ),
    ] {
        let rows = sqlx::query(query)
            .bind(namespace)
            .fetch_all(&mut *conn)
            .await?;
        for row in rows {
            let spec: Value = serde_json::from_str(&row.try_get::<String, _>("spec")?)?;
            if names_secret(&spec, name) {
                out.push(row.try_get("name")?);
            }
        }
    }
    Ok(refs)
}

#[async_trait]
impl SecretStore for SqlStore {
    async fn put_secret(
        &self,
        namespace: &str,
        name: &str,
        sealed: BTreeMap<String, Vec<u8>>,
    ) -> Result<(SecretRecord, bool)> {
        // As stored: to the millisecond.
        let now = time(&stamp(Utc::now()));
        let digest = digest(&sealed);
        let encoded: BTreeMap<&String, String> =
            sealed.iter().map(|(k, v)| (k, hex::encode(v))).collect();
        let text = serde_json::to_string(&encoded)?;
        let mut tx = self.begin_write().await?;
        let existing: Option<String> =
            sqlx::query("SELECT created_at FROM secrets WHERE namespace = $1 AND name = $2")
                .bind(namespace)
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?
                .map(|row| row.try_get("created_at"))
                .transpose()?;
        let created_at = existing.as_deref().map(time).unwrap_or(now);
        let result = sqlx::query(
            "INSERT INTO secrets (namespace, name, sealed, digest, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (namespace, name) DO UPDATE SET \
             sealed = excluded.sealed, digest = excluded.digest, updated_at = excluded.updated_at",
        )
        .bind(namespace)
        .bind(name)
        .bind(&text)
        .bind(&digest)
        .bind(stamp(created_at))
        .bind(stamp(now))
        .execute(&mut *tx)
        .await;
        crate::inserted(result, "secret", namespace, name)?;
        tx.commit().await?;
        Ok((
            SecretRecord {
                namespace: namespace.to_string(),
                name: name.to_string(),
                sealed,
                digest,
                created_at,
                updated_at: now,
            },
            existing.is_none(),
        ))
    }

    async fn get_secret(&self, namespace: &str, name: &str) -> Result<SecretRecord> {
        let row = sqlx::query("SELECT * FROM secrets WHERE namespace = $1 AND name = $2")
            .bind(namespace)
            .bind(name)
            .fetch_optional(self.pool())
            .await?
            .ok_or_else(|| StoreError::NotFound {
                kind: "secret",
                name: name.to_string(),
            })?;
        from_row(&row)
    }

    async fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretRecord>> {
        sqlx::query("SELECT * FROM secrets WHERE namespace = $1 ORDER BY name")
            .bind(namespace)
            .fetch_all(self.pool())
            .await?
            .iter()
            .map(from_row)
            .collect()
    }

    async fn secret_references(&self, namespace: &str, name: &str) -> Result<SecretReferences> {
        let mut conn = self.pool().acquire().await?;
        references(&mut conn, namespace, name).await
    }

    async fn delete_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<std::result::Result<(), SecretReferences>> {
        let mut tx = self.begin_write().await?;
        let refs = references(&mut tx, namespace, name).await?;
        if !refs.is_empty() {
            return Ok(Err(refs));
        }
        let deleted = sqlx::query("DELETE FROM secrets WHERE namespace = $1 AND name = $2")
            .bind(namespace)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        if deleted.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                kind: "secret",
                name: name.to_string(),
            });
        }
        tx.commit().await?;
        Ok(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    #[tokio::test]
    async fn secrets_are_replaced_listed_and_deleted_unless_referenced() {
        let store = crate::testing::store().await;
        store.ensure_namespace("ns").await.unwrap();
        let sealed = BTreeMap::from([("k".to_string(), vec![1, 2, 3])]);
        let (a, created) = store.put_secret("ns", "db", sealed.clone()).await.unwrap();
        assert!(created);
        let (b, created) = store
            .put_secret("ns", "db", BTreeMap::from([("k".to_string(), vec![4])]))
            .await
            .unwrap();
        assert!(!created);
        assert_ne!(a.digest, b.digest);
        assert_eq!(b.created_at, a.created_at);
        assert_eq!(store.get_secret("ns", "db").await.unwrap(), b);
        assert_eq!(store.list_secrets("ns").await.unwrap(), vec![b]);
        assert!(matches!(
            store.put_secret("nope", "db", sealed).await,
            Err(StoreError::NotFound {
                kind: "namespace",
                ..
            })
        ));

        let spec: sless_core::FunctionSpec = serde_json::from_value(serde_json::json!({
            "runtime": "python3", "env": {"A": {"secret": "db", "key": "k"}, "B": "db"}
        }))
        .unwrap();
        let now = Utc::now();
        store
            .create_function(&crate::FunctionRecord {
                namespace: "ns".into(),
                name: "f".into(),
                spec,
                status: Default::default(),
                revision: 1,
                code_sha256: None,
                generation: 1,
                created_at: now,
                updated_at: now,
            })
            .await
            .unwrap();
        let refs = store.delete_secret("ns", "db").await.unwrap().unwrap_err();
        assert_eq!(refs.functions, vec!["f".to_string()]);
        assert_eq!(refs.to_string(), "functions f");
        store.delete_function("ns", "f").await.unwrap();
        store.delete_secret("ns", "db").await.unwrap().unwrap();
        assert!(matches!(
            store.delete_secret("ns", "db").await,
            Err(StoreError::NotFound { kind: "secret", .. })
        ));
    }
}
