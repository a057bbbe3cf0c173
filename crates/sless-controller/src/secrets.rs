//! Resolving a function's (or job's) secret references when it is deployed: the
//! values of its `{"secret", "key"}` env entries, every key of every secret it
//! references (its `/run/secrets` files), and a digest that changes whenever one
//! of those secrets is replaced. Values are opened here and handed to the executor
//! only; they never reach a status, log line or error message.

use std::collections::BTreeMap;
use std::sync::Arc;

use sless_core::EnvValue;
use sless_core::secret::{Sensitive, referenced_secrets};
use sless_secrets::{Cipher, Slot};
use sless_store::{SecretStore, StoreError};

/// The secret store and the server's key.
pub struct SecretResolver {
    store: Arc<dyn SecretStore>,
    cipher: Arc<Cipher>,
}

/// An env with its references resolved.
#[derive(Debug, Default)]
pub struct Resolved {
    /// The plain variables.
    pub env: BTreeMap<String, String>,
    /// The variables whose values come from secrets.
    pub secret_env: BTreeMap<String, Sensitive>,
    /// secret → key → value, for `/run/secrets`.
    pub files: BTreeMap<String, BTreeMap<String, Sensitive>>,
    /// Changes whenever a referenced secret is replaced (empty without references).
    pub digest: String,
}

/// Why references could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The store failed; transient.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A reference names a secret or key that does not exist, or a value does not
    /// open with this server's key; the message names the variable or secret, never a value.
    #[error("{0}")]
    Invalid(String),
}

impl SecretResolver {
    pub fn new(store: Arc<dyn SecretStore>, cipher: Arc<Cipher>) -> Self {
        SecretResolver { store, cipher }
    }

    /// A digest of the current versions of the secrets `env` references, without
    /// opening anything (a missing secret counts as a version of its own).
    pub async fn digest(
        &self,
        namespace: &str,
        env: &BTreeMap<String, EnvValue>,
    ) -> Result<String, StoreError> {
        let mut parts = Vec::new();
        for secret in referenced_secrets(env) {
            match self.store.get_secret(namespace, &secret).await {
                Ok(record) => parts.push(format!("{secret}={}", record.digest)),
                Err(StoreError::NotFound { .. }) => parts.push(format!("{secret}=-")),
                Err(e) => return Err(e),
            }
        }
        Ok(parts.join(";"))
    }

    pub async fn resolve(
        &self,
        namespace: &str,
        env: &BTreeMap<String, EnvValue>,
    ) -> Result<Resolved, ResolveError> {
        let mut out = Resolved::default();
        let mut parts = Vec::new();
        for secret in referenced_secrets(env) {
            let record = match self.store.get_secret(namespace, &secret).await {
                Ok(record) => record,
                Err(StoreError::NotFound { .. }) => {
                    let var = env
                        .iter()
                        .find(|(_, v)| v.as_secret().is_some_and(|r| r.secret == secret))
                        .map(|(k, _)| k.as_str())
                        .unwrap_or_default();
                    return Err(ResolveError::Invalid(format!(
                        "env.{var}: secret {secret:?} does not exist in namespace {namespace:?}"
                    )));
                }
                Err(e) => return Err(e.into()),
            };
            parts.push(format!("{secret}={}", record.digest));
            let mut keys = BTreeMap::new();
            for (key, sealed) in &record.sealed {
                let slot = Slot {
                    namespace,
                    secret: &secret,
                    key,
                };
                let value = self.cipher.open(slot, sealed).map_err(|_| {
                    ResolveError::Invalid(format!(
                        "secret {secret:?} does not open with this server's secret key \
                         (was it written under another SLESS_SECRET_KEY?); set the secret again"
                    ))
                })?;
                let text = String::from_utf8(value.to_vec()).map_err(|_| {
                    ResolveError::Invalid(format!("secret {secret:?}: key {key:?} is not UTF-8"))
                })?;
                keys.insert(key.clone(), Sensitive::new(text));
            }
            out.files.insert(secret, keys);
        }
        for (var, value) in env {
            match value {
                EnvValue::Plain(v) => {
                    out.env.insert(var.clone(), v.clone());
                }
                EnvValue::Secret(r) => {
                    let value = out
                        .files
                        .get(&r.secret)
                        .and_then(|keys| keys.get(&r.key))
                        .ok_or_else(|| {
                            ResolveError::Invalid(format!(
                                "env.{var}: secret {:?} has no key {:?}",
                                r.secret, r.key
                            ))
                        })?;
                    out.secret_env.insert(var.clone(), value.clone());
                }
            }
        }
        out.digest = parts.join(";");
        Ok(out)
    }
}

/// Resolves `env` with `resolver`; without one (a server keeping no secrets) plain
/// values pass and any reference is refused.
pub async fn resolve_env(
    resolver: Option<&SecretResolver>,
    namespace: &str,
    env: &BTreeMap<String, EnvValue>,
) -> Result<Resolved, ResolveError> {
    match resolver {
        Some(resolver) => resolver.resolve(namespace, env).await,
        None if sless_core::secret::env_refs(env).next().is_none() => Ok(Resolved {
            env: env
                .iter()
                .filter_map(|(k, v)| v.as_plain().map(|v| (k.clone(), v.to_string())))
                .collect(),
            ..Default::default()
        }),
        None => Err(ResolveError::Invalid(
            "env: this server keeps no secrets".into(),
        )),
    }
}
