//! Per-namespace quotas: what a namespace may use, the overrides an admin sets
//! (`PUT /v1/namespaces/{ns}` with `{"quota": {...}}`) and the error a request
//! over one of them gets.
//!
//! Every limit is a whole number. `storage_mb: 0` means no storage limit (as the
//! server-wide `--namespace-storage-mb 0` always did); any other quota at `0`
//! allows nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ValidationError;

/// One of the quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaKind {
    Functions,
    Instances,
    MemoryMb,
    InvocationsPerSec,
    QueuedCalls,
    Devices,
    StorageMb,
}

impl QuotaKind {
    pub const ALL: [QuotaKind; 7] = [
        QuotaKind::Functions,
        QuotaKind::Instances,
        QuotaKind::MemoryMb,
        QuotaKind::InvocationsPerSec,
        QuotaKind::QueuedCalls,
        QuotaKind::Devices,
        QuotaKind::StorageMb,
    ];

    /// The field's name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaKind::Functions => "functions",
            QuotaKind::Instances => "instances",
            QuotaKind::MemoryMb => "memory_mb",
            QuotaKind::InvocationsPerSec => "invocations_per_sec",
            QuotaKind::QueuedCalls => "queued_calls",
            QuotaKind::Devices => "devices",
            QuotaKind::StorageMb => "storage_mb",
        }
    }

    pub fn parse(name: &str) -> Option<QuotaKind> {
        QuotaKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for QuotaKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The limits in force for a namespace (or the server's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    pub functions: u64,
    pub instances: u64,
    pub memory_mb: u64,
    pub invocations_per_sec: u64,
    pub queued_calls: u64,
    pub devices: u64,
    /// `0`: no limit.
    pub storage_mb: u64,
}

impl Default for Quota {
    /// Generous defaults: a namespace rarely meets them unless an admin lowers them.
    fn default() -> Self {
        Quota {
            functions: 1000,
            instances: 200,
            memory_mb: 65536,
            // Above what one server's gateway answers (~20k/s), so the
            // limiter never caps a namespace unless an admin lowers it.
            invocations_per_sec: 1_000_000,
            queued_calls: 100_000,
            devices: 10000,
            storage_mb: 2048,
        }
    }
}

impl Quota {
    pub fn get(&self, kind: QuotaKind) -> u64 {
        match kind {
            QuotaKind::Functions => self.functions,
            QuotaKind::Instances => self.instances,
            QuotaKind::MemoryMb => self.memory_mb,
            QuotaKind::InvocationsPerSec => self.invocations_per_sec,
            QuotaKind::QueuedCalls => self.queued_calls,
            QuotaKind::Devices => self.devices,
            QuotaKind::StorageMb => self.storage_mb,
        }
    }

    fn slot(&mut self, kind: QuotaKind) -> &mut u64 {
        match kind {
            QuotaKind::Functions => &mut self.functions,
            QuotaKind::Instances => &mut self.instances,
            QuotaKind::MemoryMb => &mut self.memory_mb,
            QuotaKind::InvocationsPerSec => &mut self.invocations_per_sec,
            QuotaKind::QueuedCalls => &mut self.queued_calls,
            QuotaKind::Devices => &mut self.devices,
            QuotaKind::StorageMb => &mut self.storage_mb,
        }
    }

    /// These defaults with `overrides` applied.
    pub fn with(mut self, overrides: &QuotaOverrides) -> Quota {
        for (kind, value) in &overrides.0 {
            *self.slot(*kind) = *value;
        }
        self
    }

    /// `Ok` when one more unit fits next to `used` (`used < limit`), otherwise the
    /// error naming the quota. `storage_mb: 0` never refuses.
    pub fn check(&self, kind: QuotaKind, used: u64) -> Result<(), QuotaExceeded> {
        self.check_adding(kind, used, 1)
    }

    /// `Ok` when `adding` more units fit next to `used`.
    pub fn check_adding(
        &self,
        kind: QuotaKind,
        used: u64,
        adding: u64,
    ) -> Result<(), QuotaExceeded> {
        let limit = self.get(kind);
        if kind == QuotaKind::StorageMb && limit == 0 {
            return Ok(());
        }
        if used.saturating_add(adding) > limit {
            return Err(QuotaExceeded { kind, limit, used });
        }
        Ok(())
    }
}

/// A request over a quota: `429 quota_exceeded`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("quota exceeded: {kind} {used} of {limit} in use")]
pub struct QuotaExceeded {
    pub kind: QuotaKind,
    pub limit: u64,
    /// What the namespace uses now.
    pub used: u64,
}

/// A JSON number that is a non-negative whole number: `3`, and also `3.0` (JSON
/// Schema's `integer` includes it, and some encoders write whole numbers so).
fn whole_number(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < u64::MAX as f64)
            .map(|f| f as u64)
    })
}

/// The quotas an admin set for one namespace; the others are the server's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaOverrides(pub BTreeMap<QuotaKind, u64>);

impl QuotaOverrides {
    /// Applies the `quota` object of a `PUT`: fields given replace, `null` resets
    /// one to the server's default; unknown fields and anything but a
    /// non-negative whole number are `400` naming the field.
    pub fn merge(&mut self, patch: &Value) -> Result<(), ValidationError> {
        let Some(fields) = patch.as_object() else {
            return Err(ValidationError::new(
                "quota",
                "must be an object of quota names to whole numbers",
            ));
        };
        let unknown: Vec<&str> = fields
            .keys()
            .filter(|k| QuotaKind::parse(k).is_none())
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(ValidationError::new(
                format!("quota.{}", unknown.join(", quota.")),
                format!(
                    "unknown field (known: {})",
                    QuotaKind::ALL.map(QuotaKind::as_str).join(", ")
                ),
            ));
        }
        let mut next = self.0.clone();
        for (name, value) in fields {
            let Some(kind) = QuotaKind::parse(name) else {
                continue;
            };
            match value {
                Value::Null => {
                    next.remove(&kind);
                }
                v => match whole_number(v) {
                    Some(n) => {
                        next.insert(kind, n);
                    }
                    None => {
                        return Err(ValidationError::new(
                            format!("quota.{name}"),
                            format!("must be a non-negative whole number or null, not {v}"),
                        ));
                    }
                },
            }
        }
        self.0 = next;
        Ok(())
    }

    /// The overrides as stored: a JSON object of the quotas set.
    pub fn to_json(&self) -> String {
        let map: serde_json::Map<String, Value> = self
            .0
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), Value::from(*v)))
            .collect();
        Value::Object(map).to_string()
    }

    /// Reads what [`QuotaOverrides::to_json`] wrote (unknown names are skipped).
    pub fn from_json(text: &str) -> Result<QuotaOverrides, serde_json::Error> {
        let map: BTreeMap<String, u64> = serde_json::from_str(text)?;
        Ok(QuotaOverrides(
            map.into_iter()
                .filter_map(|(k, v)| QuotaKind::parse(&k).map(|k| (k, v)))
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_replaces_given_fields_and_null_resets() {
        let mut o = QuotaOverrides::default();
        o.merge(&json!({"functions": 3, "instances": 2})).unwrap();
        o.merge(&json!({"functions": null, "memory_mb": 512}))
            .unwrap();
        let q = Quota::default().with(&o);
        assert_eq!(q.functions, Quota::default().functions);
        assert_eq!(q.instances, 2);
        assert_eq!(q.memory_mb, 512);
        // A whole number written as a float is that number.
        o.merge(&json!({"devices": 40.0})).unwrap();
        assert_eq!(o.0.get(&QuotaKind::Devices), Some(&40));
        let back = QuotaOverrides::from_json(&o.to_json()).unwrap();
        assert_eq!(back, o);
    }

    #[test]
    fn bad_values_and_unknown_fields_name_the_field_and_change_nothing() {
        let mut o = QuotaOverrides::default();
        o.merge(&json!({"devices": 5})).unwrap();
        for (patch, field) in [
            (json!({"functions": -1}), "quota.functions"),
            (json!({"functions": 1.5}), "quota.functions"),
            (json!({"functions": -2.0}), "quota.functions"),
            (json!({"functions": 1e300}), "quota.functions"),
            (json!({"instances": "3"}), "quota.instances"),
            (json!({"cpus": 3, "devices": 1}), "quota.cpus"),
            (json!([1]), "quota"),
        ] {
            let e = o.merge(&patch).unwrap_err();
            assert_eq!(e.field, field, "{patch}");
        }
        assert_eq!(o.0.get(&QuotaKind::Devices), Some(&5));
        assert_eq!(o.0.len(), 1);
    }

    #[test]
    fn check_names_the_quota_limit_and_usage() {
        let q = Quota {
            functions: 3,
            ..Quota::default()
        };
        assert!(q.check(QuotaKind::Functions, 2).is_ok());
        let e = q.check(QuotaKind::Functions, 3).unwrap_err();
        assert_eq!(e.to_string(), "quota exceeded: functions 3 of 3 in use");
        let none = Quota {
            storage_mb: 0,
            ..Quota::default()
        };
        assert!(none.check_adding(QuotaKind::StorageMb, 1 << 40, 1).is_ok());
        let zero = Quota {
            devices: 0,
            ..Quota::default()
        };
        assert!(zero.check(QuotaKind::Devices, 0).is_err());
    }
}
