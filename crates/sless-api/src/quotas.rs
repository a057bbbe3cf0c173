//! Per-namespace quotas on the control plane: the server's defaults, the
//! overrides an admin stores, what a namespace uses, and the checks made when
//! functions are created or changed. The executor enforces instances, memory and
//! the invocation rate itself, with the limits pushed here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sless_api_types::QuotaCounts;
use sless_core::{FunctionSpec, Quota, QuotaExceeded, QuotaKind, QuotaOverrides};
use sless_executor::Executor;
use sless_store::{CodeOwner, QuotaStore, StorageStore, Store};
use tokio::sync::OwnedMutexGuard;

use crate::ApiError;

const MIB: u64 = 1 << 20;

impl From<QuotaExceeded> for ApiError {
    fn from(e: QuotaExceeded) -> Self {
        ApiError::QuotaExceeded(e.to_string())
    }
}

/// The quotas of every namespace.
pub struct Quotas {
    defaults: Quota,
    store: Arc<dyn QuotaStore>,
    storage: Arc<dyn StorageStore>,
    executor: Arc<Executor>,
    /// Held while a namespace's function count is checked and a function
    /// created, so two creates at the limit cannot both pass.
    creating: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Held while overrides are read, merged and written.
    setting: tokio::sync::Mutex<()>,
    /// The async calls' queue, whose unfinished calls are the `queued_calls` usage
    /// (set once the queue is started, after the quotas).
    queued_calls: std::sync::OnceLock<Arc<sless_controller::calls::Calls>>,
}

impl Quotas {
    /// Loads every namespace's overrides and hands the limits to the executor.
    pub async fn load(
        defaults: Quota,
        store: Arc<dyn QuotaStore>,
        storage: Arc<dyn StorageStore>,
        executor: Arc<Executor>,
    ) -> Result<Arc<Quotas>, sless_store::StoreError> {
        executor.quotas().set_default(defaults);
        for (ns, text) in store.namespace_quotas().await? {
            let overrides = QuotaOverrides::from_json(&text).unwrap_or_else(|e| {
                tracing::warn!(namespace = %ns, error = %e, "unreadable quota overrides; using the defaults");
                QuotaOverrides::default()
            });
            executor.quotas().set(&ns, defaults.with(&overrides));
        }
        Ok(Arc::new(Quotas {
            defaults,
            store,
            storage,
            executor,
            creating: Mutex::new(HashMap::new()),
            setting: tokio::sync::Mutex::new(()),
            queued_calls: std::sync::OnceLock::new(),
        }))
    }

    /// Counts the async calls' queue in the `queued_calls` usage.
    pub fn count_queued_calls(&self, calls: Arc<sless_controller::calls::Calls>) {
        let _ = self.queued_calls.set(calls);
    }

    /// The server's defaults.
    pub fn defaults(&self) -> Quota {
        self.defaults
    }

    async fn overrides(&self, ns: &str) -> Result<QuotaOverrides, ApiError> {
        Ok(match self.store.namespace_quota(ns).await? {
            Some(text) => {
                QuotaOverrides::from_json(&text).map_err(|e| ApiError::Internal(e.into()))?
            }
            None => QuotaOverrides::default(),
        })
    }

    /// The quotas in force for `ns`.
    pub async fn effective(&self, ns: &str) -> Result<Quota, ApiError> {
        Ok(self.defaults.with(&self.overrides(ns).await?))
    }

    /// Applies the `quota` object of a `PUT` (fields given replace, `null` resets
    /// to the default) and makes it effective at once.
    pub async fn set(&self, ns: &str, patch: &Value) -> Result<Quota, ApiError> {
        let _one_at_a_time = self.setting.lock().await;
        let mut overrides = self.overrides(ns).await?;
        overrides.merge(patch)?;
        let stored = (!overrides.0.is_empty()).then(|| overrides.to_json());
        self.store
            .set_namespace_quota(ns, stored.as_deref())
            .await?;
        let quota = self.defaults.with(&overrides);
        self.executor.quotas().set(ns, quota);
        Ok(quota)
    }

    /// Makes the stored overrides of `ns` effective again (it was restored from the
    /// trash, its overrides with it).
    pub async fn reload(&self, ns: &str) -> Result<Quota, ApiError> {
        let quota = self.effective(ns).await?;
        self.executor.quotas().set(ns, quota);
        Ok(quota)
    }

    /// A deleted namespace's quotas are the defaults again (its stored overrides
    /// were deleted with it).
    pub fn forget(&self, ns: &str) {
        self.executor.quotas().set(ns, self.defaults);
    }

    /// Serialises function creation in `ns` (held across the count and the insert).
    pub async fn creating(&self, ns: &str) -> OwnedMutexGuard<()> {
        let lock = self
            .creating
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(ns.to_string())
            .or_default()
            .clone();
        lock.lock_owned().await
    }

    /// `429` when `ns` already has as many functions as its quota allows.
    pub async fn check_functions(&self, store: &dyn Store, ns: &str) -> Result<(), ApiError> {
        let quota = self.effective(ns).await?;
        let used = store.list_functions(Some(ns)).await?.len() as u64;
        quota.check(QuotaKind::Functions, used)?;
        Ok(())
    }

    /// `429` when a function's minimum instances alone would not fit the
    /// namespace's instance or memory quota.
    pub async fn check_minimum(&self, ns: &str, spec: &FunctionSpec) -> Result<(), ApiError> {
        let quota = self.effective(ns).await?;
        let min = u64::from(spec.min_instances);
        let memory = min * u64::from(spec.memory_mb);
        if min > quota.instances {
            return Err(ApiError::QuotaExceeded(format!(
                "quota exceeded: instances {} allowed, min_instances {min} needs {min}",
                quota.instances
            )));
        }
        if memory > quota.memory_mb {
            return Err(ApiError::QuotaExceeded(format!(
                "quota exceeded: memory_mb {} allowed, min_instances {min} × memory_mb {} needs {memory}",
                quota.memory_mb, spec.memory_mb
            )));
        }
        Ok(())
    }

    /// The storage quota of `ns` in bytes (`0`: none).
    pub async fn storage_bytes(&self, ns: &str) -> Result<u64, ApiError> {
        Ok(self.effective(ns).await?.storage_mb.saturating_mul(MIB))
    }

    /// What `ns` uses now.
    pub async fn usage(&self, store: &dyn Store, ns: &str) -> Result<QuotaCounts, ApiError> {
        let functions = store.list_functions(Some(ns)).await?.len() as u64;
        let storage = self
            .storage
            .namespace_storage(ns, None::<CodeOwner<'_>>)
            .await?;
        let live = self.executor.quotas().usage(ns);
        Ok(QuotaCounts {
            functions,
            instances: live.instances,
            memory_mb: live.memory_mb,
            invocations_per_sec: live.invocations_per_sec,
            // Devices are not registered by any feature yet.
            queued_calls: self.queued_calls.get().map_or(0, |c| c.queued(ns)),
            devices: 0,
            storage_mb: storage.div_ceil(MIB),
        })
    }
}

/// The limits as the API shows them.
pub fn counts(q: &Quota) -> QuotaCounts {
    QuotaCounts {
        functions: q.functions,
        instances: q.instances,
        memory_mb: q.memory_mb,
        invocations_per_sec: q.invocations_per_sec,
        queued_calls: q.queued_calls,
        devices: q.devices,
        storage_mb: q.storage_mb,
    }
}
