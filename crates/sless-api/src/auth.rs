//! Bearer tokens: the admin token, and namespace tokens stored only as SHA-256
//! hashes (they are 256-bit random secrets, so a plain hash is enough).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use sless_store::Store;

use crate::AppState;
use crate::error::ApiError;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Admin,
    Namespace(String),
}

impl Caller {
    /// Whether the caller may act in `namespace`.
    pub fn may_access(&self, namespace: &str) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Namespace(ns) => ns == namespace,
        }
    }

    /// `404` for namespaces the caller may not see: their existence is not leaked.
    pub fn check(&self, namespace: &str) -> Result<(), ApiError> {
        if self.may_access(namespace) {
            Ok(())
        } else {
            Err(ApiError::not_found("namespace", namespace))
        }
    }
}

pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A new random token, shown to its owner once.
pub fn new_token() -> String {
    format!("sless_{}", hex::encode(rand::random::<[u8; 32]>()))
}

/// Resolves tokens, caching namespace tokens in memory.
pub struct Tokens {
    admin_hash: String,
    store: Arc<dyn Store>,
    cache: RwLock<HashMap<String, Option<String>>>,
}

impl Tokens {
    pub fn new(admin_token: &str, store: Arc<dyn Store>) -> Self {
        Self {
            admin_hash: hash_token(admin_token),
            store,
            cache: RwLock::new(HashMap::new()),
        }
    }

    pub async fn resolve(&self, token: &str) -> Result<Option<Caller>, ApiError> {
        let hash = hash_token(token);
        // Comparing hashes keeps the comparison independent of where the secrets differ.
        if hash == self.admin_hash {
            return Ok(Some(Caller::Admin));
        }
        if let Some(hit) = self
            .cache
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&hash)
        {
            return Ok(hit.clone().map(Caller::Namespace));
        }
        let ns = self.store.token_namespace(&hash).await?;
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(hash, ns.clone());
        Ok(ns.map(Caller::Namespace))
    }

    /// Drops cached lookups (after tokens were created or deleted).
    pub fn invalidate(&self) {
        self.cache
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

#[async_trait]
impl sless_gateway::Authorizer for Tokens {
    async fn may_invoke(&self, token: &str, namespace: &str) -> bool {
        matches!(self.resolve(token).await, Ok(Some(c)) if c.may_access(namespace))
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| {
                ApiError::Unauthorized("missing Authorization: Bearer <token> header".into())
            })?;
        let token = header
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ApiError::Unauthorized("the Authorization header must be 'Bearer <token>'".into())
            })?;
        state
            .tokens
            .resolve(token)
            .await?
            .ok_or_else(|| ApiError::Unauthorized("unknown token".into()))
    }
}
