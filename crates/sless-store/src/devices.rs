//! Devices and their telemetry. A device row holds its spec, its broker password as
//! a hash only, and the counters the ingest keeps (`messages`, `last_seen_at`); the
//! telemetry table one row per message. [`DeviceStore`] is the seam.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sless_core::DeviceSpec;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::query::Builder;

use crate::{Result, SqlStore, StoreError, stamp, time};

/// One device as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceRecord {
    pub namespace: String,
    pub name: String,
    pub spec: DeviceSpec,
    /// `pbkdf2-sha512$<iterations>$<salt>$<hash>`, the broker plugin's format.
    pub password_hash: String,
    pub messages: u64,
    pub last_seen_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One message a device published, as the ingest hands it over.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTelemetry {
    pub namespace: String,
    pub device: String,
    pub received_at: DateTime<Utc>,
    /// The payload mapped to JSON (value, text, or `{"base64"}`).
    pub payload: serde_json::Value,
}

/// One stored telemetry message.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryRecord {
    pub id: i64,
    pub device: String,
    pub received_at: DateTime<Utc>,
    pub payload: serde_json::Value,
}

/// Which telemetry [`DeviceStore::list_telemetry`] returns (newest first).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TelemetryFilter {
    pub device: Option<String>,
    /// Received at or after.
    pub since: Option<DateTime<Utc>>,
    /// Received before.
    pub until: Option<DateTime<Utc>>,
    /// At most this many: [`DEFAULT_TELEMETRY_LIMIT`] when `None`, capped at
    /// [`MAX_TELEMETRY_LIMIT`].
    pub limit: Option<u32>,
}

pub const DEFAULT_TELEMETRY_LIMIT: u32 = 100;
pub const MAX_TELEMETRY_LIMIT: u32 = 1000;

#[async_trait]
pub trait DeviceStore: Send + Sync + 'static {
    /// Creates a device; `Conflict` when the name is taken.
    async fn create_device(
        &self,
        namespace: &str,
        name: &str,
        spec: &DeviceSpec,
        password_hash: &str,
    ) -> Result<DeviceRecord>;
    async fn get_device(&self, namespace: &str, name: &str) -> Result<DeviceRecord>;
    async fn list_devices(&self, namespace: &str) -> Result<Vec<DeviceRecord>>;
    async fn count_devices(&self, namespace: &str) -> Result<u64>;
    /// Every device of every namespace (the broker's accounts at its start).
    async fn all_devices(&self) -> Result<Vec<DeviceRecord>>;
    /// Replaces a device's spec.
    async fn set_device_spec(
        &self,
        namespace: &str,
        name: &str,
        spec: &DeviceSpec,
    ) -> Result<DeviceRecord>;
    /// Replaces a device's password hash.
    async fn set_device_password(
        &self,
        namespace: &str,
        name: &str,
        password_hash: &str,
    ) -> Result<DeviceRecord>;
    /// Deletes a device and its telemetry.
    async fn delete_device(&self, namespace: &str, name: &str) -> Result<()>;
    /// Stores a batch of telemetry and counts it on its devices, in one transaction.
    /// Messages of devices that no longer exist are dropped; returns how many were stored.
    async fn insert_telemetry(&self, batch: &[NewTelemetry]) -> Result<u64>;
    async fn list_telemetry(
        &self,
        namespace: &str,
        filter: &TelemetryFilter,
    ) -> Result<Vec<TelemetryRecord>>;
    /// Deletes telemetry older than `max_age` (zero: no bound) and, per device,
    /// beyond the newest `max_count` (zero: no bound); returns how many went.
    async fn prune_telemetry(&self, max_age: Duration, max_count: u64) -> Result<u64>;
}

fn not_found(name: &str) -> StoreError {
    StoreError::NotFound {
        kind: "device",
        name: name.to_string(),
    }
}

fn device_from_row(row: &AnyRow) -> Result<DeviceRecord> {
    let spec: String = row.try_get("spec")?;
    let messages: i64 = row.try_get("messages")?;
    let last_seen: Option<i64> = row.try_get("last_seen_at")?;
    Ok(DeviceRecord {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        spec: serde_json::from_str(&spec)?,
        password_hash: row.try_get("password_hash")?,
        messages: u64::try_from(messages).unwrap_or(0),
        last_seen_at: last_seen.and_then(DateTime::from_timestamp_micros),
        created_at: time(&row.try_get::<String, _>("created_at")?),
        updated_at: time(&row.try_get::<String, _>("updated_at")?),
    })
}

macro_rules! device_columns {
    () => {
        "namespace, name, spec, password_hash, messages, last_seen_at, created_at, updated_at"
    };
}

impl SqlStore {
    /// Runs one `UPDATE devices SET <column> = ?, updated_at = ? ... RETURNING` statement.
    async fn update_device(
        &self,
        sql: &'static str,
        namespace: &str,
        name: &str,
        value: String,
    ) -> Result<DeviceRecord> {
        let row = sqlx::query(sql)
            .bind(value)
            .bind(stamp(Utc::now()))
            .bind(namespace)
            .bind(name)
            .fetch_optional(self.pool())
            .await?
            .ok_or_else(|| not_found(name))?;
        device_from_row(&row)
    }
}

#[async_trait]
impl DeviceStore for SqlStore {
    async fn create_device(
        &self,
        namespace: &str,
        name: &str,
        spec: &DeviceSpec,
        password_hash: &str,
    ) -> Result<DeviceRecord> {
        let now = stamp(Utc::now());
        let row = sqlx::query(concat!(
            "INSERT INTO devices (namespace, name, spec, password_hash, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING ",
            device_columns!()
        ))
        .bind(namespace)
        .bind(name)
        .bind(serde_json::to_string(spec)?)
        .bind(password_hash)
        .bind(&now)
        .bind(&now)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| StoreError::Conflict {
            kind: "device",
            name: name.to_string(),
        })?;
        device_from_row(&row)
    }

    async fn get_device(&self, namespace: &str, name: &str) -> Result<DeviceRecord> {
        let row = sqlx::query(concat!(
            "SELECT ",
            device_columns!(),
            " FROM devices WHERE namespace = $1 AND name = $2"
        ))
        .bind(namespace)
        .bind(name)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| not_found(name))?;
        device_from_row(&row)
    }

    async fn list_devices(&self, namespace: &str) -> Result<Vec<DeviceRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            device_columns!(),
            " FROM devices WHERE namespace = $1 ORDER BY name"
        ))
        .bind(namespace)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(device_from_row).collect()
    }

    async fn count_devices(&self, namespace: &str) -> Result<u64> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM devices WHERE namespace = $1")
            .bind(namespace)
            .fetch_one(self.pool())
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn all_devices(&self) -> Result<Vec<DeviceRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            device_columns!(),
            " FROM devices WHERE ",
            live!("namespace"),
            " ORDER BY namespace, name"
        ))
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(device_from_row).collect()
    }

    async fn set_device_spec(
        &self,
        namespace: &str,
        name: &str,
        spec: &DeviceSpec,
    ) -> Result<DeviceRecord> {
        self.update_device(
            concat!(
                "UPDATE devices SET spec = $1, updated_at = $2 WHERE namespace = $3 AND name = $4 RETURNING ",
                device_columns!()
            ),
            namespace,
            name,
            serde_json::to_string(spec)?,
        )
        .await
    }

    async fn set_device_password(
        &self,
        namespace: &str,
        name: &str,
        password_hash: &str,
    ) -> Result<DeviceRecord> {
        self.update_device(
            concat!(
                "UPDATE devices SET password_hash = $1, updated_at = $2 WHERE namespace = $3 AND name = $4 RETURNING ",
                device_columns!()
            ),
            namespace,
            name,
            password_hash.to_string(),
        )
        .await
    }

    async fn delete_device(&self, namespace: &str, name: &str) -> Result<()> {
        let mut tx = self.pool().begin().await?;
        let done = sqlx::query("DELETE FROM devices WHERE namespace = $1 AND name = $2")
            .bind(namespace)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(not_found(name));
        }
        sqlx::query("DELETE FROM telemetry WHERE namespace = $1 AND device = $2")
            .bind(namespace)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn insert_telemetry(&self, batch: &[NewTelemetry]) -> Result<u64> {
        if batch.is_empty() {
            return Ok(0);
        }
        let mut tx = self.pool().begin().await?;
        let mut stored = 0;
        // 4 binds a row: well under SQLite's 32766 bound variables per statement.
        for chunk in batch.chunks(500) {
            // Rows keep the batch's order (their ids grow in it): the fifth
            // column is the position, which the SELECT orders by.
            let mut q = Builder::new(
                self.backend(),
                "INSERT INTO telemetry (namespace, device, received_at, payload) \
                 SELECT v.column1, v.column2, v.column3, v.column4 FROM (VALUES ",
            );
            for (i, t) in chunk.iter().enumerate() {
                q.push(if i == 0 { "(" } else { ", (" })
                    .push_bind(t.namespace.as_str())
                    .push(", ")
                    .push_bind(t.device.as_str())
                    .push(", ")
                    .push_bind(t.received_at.timestamp_micros())
                    .push(", ")
                    .push_bind(t.payload.to_string())
                    .push(", ")
                    .push_bind(i as i64)
                    .push(")");
            }
            q.push(
                ") AS v WHERE EXISTS (SELECT 1 FROM devices d \
                 WHERE d.namespace = v.column1 AND d.name = v.column2) ORDER BY v.column5",
            );
            stored += q.build()?.execute(&mut *tx).await?.rows_affected();
        }
        // Per device: how many, and when it was last heard from.
        let mut seen: std::collections::BTreeMap<(&str, &str), (i64, i64)> = Default::default();
        for t in batch {
            let e = seen
                .entry((t.namespace.as_str(), t.device.as_str()))
                .or_insert((0, i64::MIN));
            e.0 += 1;
            e.1 = e.1.max(t.received_at.timestamp_micros());
        }
        for ((ns, device), (n, last)) in seen {
            sqlx::query(
                "UPDATE devices SET messages = messages + $1, \
                 last_seen_at = CASE WHEN COALESCE(last_seen_at, 0) > $2 THEN last_seen_at ELSE $2 END \
                 WHERE namespace = $3 AND name = $4",
            )
            .bind(n)
            .bind(last)
            .bind(ns)
            .bind(device)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(stored)
    }

    async fn list_telemetry(
        &self,
        namespace: &str,
        filter: &TelemetryFilter,
    ) -> Result<Vec<TelemetryRecord>> {
        let mut q = Builder::new(
            self.backend(),
            "SELECT id, device, received_at, payload FROM telemetry WHERE namespace = ",
        );
        q.push_bind(namespace);
        if let Some(d) = &filter.device {
            q.push(" AND device = ").push_bind(d);
        }
        if let Some(t) = filter.since {
            q.push(" AND received_at >= ")
                .push_bind(t.timestamp_micros());
        }
        if let Some(t) = filter.until {
            q.push(" AND received_at < ")
                .push_bind(t.timestamp_micros());
        }
        let limit = filter
            .limit
            .unwrap_or(DEFAULT_TELEMETRY_LIMIT)
            .clamp(1, MAX_TELEMETRY_LIMIT);
        q.push(" ORDER BY received_at DESC, id DESC LIMIT ")
            .push_bind(i64::from(limit));
        let rows = q.build()?.fetch_all(self.pool()).await?;
        rows.iter()
            .map(|row| {
                let payload: String = row.try_get("payload")?;
                Ok(TelemetryRecord {
                    id: row.try_get("id")?,
                    device: row.try_get("device")?,
                    received_at: DateTime::from_timestamp_micros(row.try_get("received_at")?)
                        .unwrap_or_default(),
                    payload: serde_json::from_str(&payload)?,
                })
            })
            .collect()
    }

    async fn prune_telemetry(&self, max_age: Duration, max_count: u64) -> Result<u64> {
        let mut deleted = 0;
        if !max_age.is_zero() {
            let age = chrono::Duration::from_std(max_age).unwrap_or(chrono::Duration::MAX);
            let cutoff = Utc::now()
                .checked_sub_signed(age)
                .unwrap_or_default()
                .timestamp_micros();
            deleted += sqlx::query("DELETE FROM telemetry WHERE received_at < $1")
                .bind(cutoff)
                .execute(self.pool())
                .await?
                .rows_affected();
        }
        if max_count > 0 {
            let count = i64::try_from(max_count).unwrap_or(i64::MAX);
            let devices: Vec<(String, String)> =
                sqlx::query_as("SELECT DISTINCT namespace, device FROM telemetry")
                    .fetch_all(self.pool())
                    .await?;
            for (ns, device) in devices {
                // The newest row past the bound, in list order: it and all older go.
                let over: Option<(i64, i64)> = sqlx::query_as(
                    "SELECT received_at, id FROM telemetry WHERE namespace = $1 AND device = $2 \
                     ORDER BY received_at DESC, id DESC LIMIT 1 OFFSET $3",
                )
                .bind(&ns)
                .bind(&device)
                .bind(count)
                .fetch_optional(self.pool())
                .await?;
                if let Some((at, id)) = over {
                    deleted += sqlx::query(
                        "DELETE FROM telemetry WHERE namespace = $1 AND device = $2 \
                         AND (received_at < $3 OR (received_at = $4 AND id <= $5))",
                    )
                    .bind(&ns)
                    .bind(&device)
                    .bind(at)
                    .bind(at)
                    .bind(id)
                    .execute(self.pool())
                    .await?
                    .rows_affected();
                }
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;
    use serde_json::json;

    async fn store() -> (SqlStore, tempfile::TempDir) {
        let (dir, s) = crate::testing::pooled_store().await;
        s.ensure_namespace("ns").await.unwrap();
        (s, dir)
    }

    fn t(device: &str, at_us: i64, payload: serde_json::Value) -> NewTelemetry {
        NewTelemetry {
            namespace: "ns".into(),
            device: device.into(),
            received_at: DateTime::from_timestamp_micros(at_us).unwrap(),
            payload,
        }
    }

    #[tokio::test]
    async fn devices_are_created_once_changed_and_deleted_with_their_telemetry() {
        let (s, _d) = store().await;
        let spec = DeviceSpec::default();
        s.create_device("ns", "d1", &spec, "h1").await.unwrap();
        assert!(matches!(
            s.create_device("ns", "d1", &spec, "h2").await,
            Err(StoreError::Conflict { .. })
        ));
        let mut off = spec.clone();
        off.enabled = false;
        assert!(
            !s.set_device_spec("ns", "d1", &off)
                .await
                .unwrap()
                .spec
                .enabled
        );
        assert_eq!(
            s.set_device_password("ns", "d1", "h3")
                .await
                .unwrap()
                .password_hash,
            "h3"
        );
        assert_eq!(s.count_devices("ns").await.unwrap(), 1);

        let stored = s
            .insert_telemetry(&[
                t("d1", 1_000, json!({"t": 1})),
                t("d1", 2_000, json!("text")),
                t("gone", 3_000, json!(1)),
            ])
            .await
            .unwrap();
        assert_eq!(
            stored, 2,
            "a message of a device that does not exist is dropped"
        );
        let d = s.get_device("ns", "d1").await.unwrap();
        assert_eq!(d.messages, 2);
        assert_eq!(d.last_seen_at.unwrap().timestamp_micros(), 2_000);
        let items = s
            .list_telemetry("ns", &TelemetryFilter::default())
            .await
            .unwrap();
        assert_eq!(
            items.iter().map(|i| i.payload.clone()).collect::<Vec<_>>(),
            [json!("text"), json!({"t": 1})],
            "newest first"
        );
        let since = s
            .list_telemetry(
                "ns",
                &TelemetryFilter {
                    device: Some("d1".into()),
                    since: DateTime::from_timestamp_micros(1_500),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(since.len(), 1);

        s.delete_device("ns", "d1").await.unwrap();
        assert!(matches!(
            s.delete_device("ns", "d1").await,
            Err(StoreError::NotFound { .. })
        ));
        assert!(
            s.list_telemetry("ns", &TelemetryFilter::default())
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn pruning_keeps_the_newest_per_device() {
        let (s, _d) = store().await;
        s.create_device("ns", "a", &DeviceSpec::default(), "h")
            .await
            .unwrap();
        s.create_device("ns", "b", &DeviceSpec::default(), "h")
            .await
            .unwrap();
        let now = Utc::now().timestamp_micros();
        let batch: Vec<_> = (0..5)
            .map(|i| t("a", now - 1000 + i, json!(i)))
            .chain([t("b", now, json!("b"))])
            .collect();
        s.insert_telemetry(&batch).await.unwrap();
        assert_eq!(s.prune_telemetry(Duration::ZERO, 2).await.unwrap(), 3);
        let left = s
            .list_telemetry("ns", &TelemetryFilter::default())
            .await
            .unwrap();
        assert_eq!(
            left.iter().map(|i| i.payload.clone()).collect::<Vec<_>>(),
            [json!("b"), json!(4), json!(3)]
        );
    }
}
