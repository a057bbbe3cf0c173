//! Functions that exist but cannot serve because their latest revision failed,
//! kept in memory for the invoke path so that every invoker says so (`503` with the
//! reason) instead of claiming they do not exist.

use std::collections::HashMap;
use std::sync::RwLock;

/// Why a function without a serving revision failed, and whether it is private
/// (a private one tells its reason only to callers allowed to invoke it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    pub private: bool,
}

/// `(namespace, name)` → the failure of a function with nothing to serve. The
/// controller writes it; the [`Invoker`](crate::Invoker) reads it only after the
/// executor said the function has no pool, so the hot path never looks here.
#[derive(Debug, Default)]
pub struct FailedFunctions {
    by_key: RwLock<HashMap<(String, String), Failure>>,
}

impl FailedFunctions {
    /// Records that `namespace/name` failed.
    pub fn set(&self, namespace: &str, name: &str, failure: Failure) {
        self.by_key
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert((namespace.to_string(), name.to_string()), failure);
    }

    /// Forgets a failure (the function serves again, or was deleted).
    pub fn clear(&self, namespace: &str, name: &str) {
        self.by_key
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// Forgets every failure of a namespace (it was deleted).
    pub fn clear_namespace(&self, namespace: &str) {
        self.by_key
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(ns, _), _| ns != namespace);
    }

    /// The failure of `namespace/name`, if it failed and has nothing to serve.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Failure> {
        self.by_key
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_clear() {
        let failed = FailedFunctions::default();
        let f = Failure {
            message: "boom".into(),
            private: false,
        };
        failed.set("a", "x", f.clone());
        failed.set("b", "x", f.clone());
        assert_eq!(failed.get("a", "x"), Some(f.clone()));
        assert_eq!(failed.get("a", "y"), None);
        failed.clear("a", "x");
        assert_eq!(failed.get("a", "x"), None);
        failed.clear_namespace("b");
        assert_eq!(failed.get("b", "x"), None);
    }
}
