//! JWT sign-in: bearer tokens signed by an identity provider, verified with
//! `jsonwebtoken` against the configured keys, and mapped to a namespace.
//!
//! Keys: an HS256 shared secret (from a file), and RS256 / ES256 / EdDSA public
//! keys from a JWKS file and/or a JWKS URL, picked by the token's `kid`. Each key
//! verifies exactly one algorithm, the one of its key type: an HS256 token is only
//! ever checked with the shared secret (never with a public key, which would let
//! anyone who knows the public key sign tokens), and `alg: none` is refused before
//! anything else is looked at. The JWKS URL is fetched at start and refetched when a
//! token names a `kid` it does not know, at most once per `min_refetch` interval.
//!
//! Verified tokens are remembered by the hash of the token (bounded LRU, never past
//! the token's `exp`), so a busy client does not cost an RSA verification per request.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde::Deserialize;

use crate::error::ApiError;

/// Clock skew allowed on `exp` and `nbf`.
pub const LEEWAY_SECS: u64 = 60;
/// The shortest HS256 secret taken: as long as the hash (RFC 7518, section 3.2).
const MIN_HS256_SECRET: usize = 32;
/// Verified tokens remembered.
const CACHE_ENTRIES: usize = 10_000;
/// How long a verified token is remembered at most (less when it expires sooner).
const CACHE_TTL: Duration = Duration::from_secs(300);
/// How long one JWKS fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// What `sless serve` was told about JWTs.
#[derive(Debug, Clone, Default)]
pub struct JwtConfig {
    /// The HS256 shared secret.
    pub hs256_secret: Option<Vec<u8>>,
    /// A JWKS document read from a file.
    pub jwks: Option<JwkSet>,
    /// Where the JWKS is fetched from.
    pub jwks_url: Option<String>,
    /// The required `iss`, when set.
    pub issuer: Option<String>,
    /// The required `aud`, when set.
    pub audience: Option<String>,
    /// The claim naming the namespace (`sub` by default).
    pub namespace_claim: String,
    /// The least time between two fetches of the JWKS URL.
    pub min_refetch: Duration,
}

/// A public key and the one algorithm it verifies.
struct Key {
    alg: Algorithm,
    key: DecodingKey,
}

/// The JWKS URL's keys and when they were last fetched.
struct Remote {
    url: String,
    http: reqwest::Client,
    min_refetch: Duration,
    /// The keys last fetched: read without waiting for a fetch in progress.
    keys: std::sync::RwLock<HashMap<String, std::sync::Arc<Key>>>,
    /// When the URL was last fetched; held while a fetch runs, so one runs at a time.
    fetched_at: tokio::sync::Mutex<Instant>,
}

/// A verified token: who signed in, and the namespace it acts in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The `sub` claim (or, without one, the namespace claim's value).
    pub subject: String,
    pub namespace: String,
}

/// Verifies JWTs against the configured keys.
pub struct JwtVerifier {
    hs256: Option<DecodingKey>,
    file_keys: HashMap<String, std::sync::Arc<Key>>,
    remote: Option<Remote>,
    issuer: Option<String>,
    audience: Option<String>,
    namespace_claim: String,
    cache: Mutex<lru::LruCache<String, (Verified, SystemTime)>>,
}

impl JwtVerifier {
    /// Checks the configuration and fetches the JWKS URL once. The error names the
    /// flag whose value is wrong.
    pub async fn new(config: JwtConfig) -> anyhow::Result<JwtVerifier> {
        let hs256 = match &config.hs256_secret {
            Some(secret) if secret.len() < MIN_HS256_SECRET => anyhow::bail!(
                "--jwt-hs256-secret-file: the secret is {} bytes long; HS256 needs at least {MIN_HS256_SECRET}",
                secret.len()
            ),
            Some(secret) => Some(
                DecodingKey::from_secret(secret)
                    .map_err(|e| anyhow::anyhow!("--jwt-hs256-secret-file: {e}"))?,
            ),
            None => None,
        };
        let file_keys = match &config.jwks {
            Some(set) => {
                let keys = keys_of(set).map_err(|e| anyhow::anyhow!("--jwt-jwks-file: {e}"))?;
                if keys.is_empty() {
                    anyhow::bail!(
                        "--jwt-jwks-file: the JWKS has no RS256, ES256 or EdDSA signing key with a kid"
                    );
                }
                keys
            }
            None => HashMap::new(),
        };
        let remote = match &config.jwks_url {
            Some(url) => {
                let http = reqwest::Client::builder()
                    .timeout(FETCH_TIMEOUT)
                    .build()
                    .map_err(|e| anyhow::anyhow!("--jwt-jwks-url: {e}"))?;
                let keys = fetch(&http, url)
                    .await
                    .map_err(|e| anyhow::anyhow!("--jwt-jwks-url {url}: {e}"))?;
                Some(Remote {
                    url: url.clone(),
                    http,
                    min_refetch: config.min_refetch,
                    keys: std::sync::RwLock::new(keys),
                    fetched_at: tokio::sync::Mutex::new(Instant::now()),
                })
            }
            None => None,
        };
        if hs256.is_none() && config.jwks.is_none() && remote.is_none() {
            anyhow::bail!(
                "JWT sign-in needs a key: --jwt-hs256-secret-file, --jwt-jwks-file or --jwt-jwks-url"
            );
        }
        let claim = config.namespace_claim.trim();
        if claim.is_empty() {
            anyhow::bail!("--jwt-namespace-claim: must name a claim");
        }
        Ok(JwtVerifier {
            hs256,
            file_keys,
            remote,
            issuer: config.issuer.filter(|s| !s.is_empty()),
            audience: config.audience.filter(|s| !s.is_empty()),
            namespace_claim: claim.to_string(),
            cache: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(CACHE_ENTRIES).unwrap_or(NonZeroUsize::MIN),
            )),
        })
    }

    /// A token verified before and not yet expired.
    pub fn cached(&self, hash: &str) -> Option<Verified> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        match cache.get(hash) {
            Some((v, until)) if SystemTime::now() < *until => Some(v.clone()),
            Some(_) => {
                cache.pop(hash);
                None
            }
            None => None,
        }
    }

    /// Remembers a verified token until `exp` (or [`CACHE_TTL`], if sooner).
    pub fn remember(&self, hash: String, verified: Verified, exp: SystemTime) {
        let until = exp.min(SystemTime::now() + CACHE_TTL);
        if until > SystemTime::now() {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.put(hash, (verified, until));
        }
    }

    /// Verifies `token`: `Unauthorized` naming the failed check, or `Forbidden`
    /// when the namespace claim maps to no valid namespace. On success, also the
    /// token's `exp`.
    pub async fn verify(&self, token: &str) -> Result<(Verified, SystemTime), ApiError> {
        let header = Header::parse(token)?;
        let key = self.key_for(&header).await?;
        let mut validation = Validation::new(key.alg);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.validate_aud = self.audience.is_some();
        let mut required = vec!["exp"];
        if let Some(iss) = &self.issuer {
            validation.set_issuer(&[iss]);
            required.push("iss");
        }
        if let Some(aud) = &self.audience {
            validation.set_audience(&[aud]);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            &key.key,
            &validation,
        )
        .map_err(|e| refusal(e.kind()))?;
        let claims = data.claims;
        let exp = claims
            .get("exp")
            .and_then(|v| v.as_f64())
            .filter(|s| s.is_finite() && *s >= 0.0)
            // Far-future values saturate rather than overflow the clock type.
            .map(|s| {
                UNIX_EPOCH
                    .checked_add(Duration::from_secs(s as u64))
                    .unwrap_or_else(|| SystemTime::now() + CACHE_TTL)
            })
            .ok_or_else(|| unauthorized("the exp claim is not a number of seconds"))?;
        let value = claims
            .get(&self.namespace_claim)
            .and_then(|v| v.as_str())
            .ok_or_else(|| {
                ApiError::Forbidden(format!(
                    "JWT refused: the namespace claim {:?} is missing or not a string",
                    self.namespace_claim
                ))
            })?;
        let namespace = namespace_for(value).ok_or_else(|| {
            ApiError::Forbidden(format!(
                "JWT refused: the namespace claim {:?} ({value:?}) maps to no valid namespace name",
                self.namespace_claim
            ))
        })?;
        let subject = claims
            .get("sub")
            .and_then(|v| v.as_str())
            .unwrap_or(value)
            .to_string();
        Ok((Verified { subject, namespace }, exp))
    }

    /// The key the header asks for, if it may be used with the header's algorithm.
    async fn key_for(&self, header: &Header) -> Result<std::sync::Arc<Key>, ApiError> {
        let alg = match header.alg.as_str() {
            a if a.eq_ignore_ascii_case("none") => {
                return Err(unauthorized(
                    "algorithm not allowed: none (unsigned tokens are refused)",
                ));
            }
            "HS256" => {
                return match &self.hs256 {
                    Some(key) => Ok(std::sync::Arc::new(Key {
                        alg: Algorithm::HS256,
                        key: key.clone(),
                    })),
                    None => Err(unauthorized(
                        "algorithm not allowed: HS256 (no HS256 secret is configured; HS256 is never verified with a public key)",
                    )),
                };
            }
            "RS256" => Algorithm::RS256,
            "ES256" => Algorithm::ES256,
            "EdDSA" => Algorithm::EdDSA,
            other => {
                return Err(unauthorized(&format!(
                    "algorithm not allowed: {other} (allowed: HS256, RS256, ES256, EdDSA)"
                )));
            }
        };
        let Some(kid) = &header.kid else {
            return Err(unauthorized(
                "unknown kid: the token names no key (kid) to verify it with",
            ));
        };
        let key = match self.file_keys.get(kid) {
            Some(k) => Some(k.clone()),
            None => self.remote_key(kid).await,
        };
        let Some(key) = key else {
            return Err(unauthorized(&format!(
                "unknown kid {kid:?}: no configured key has this id"
            )));
        };
        if key.alg != alg {
            return Err(unauthorized(&format!(
                "algorithm not allowed: {} with key {kid:?}, which is a {:?} key",
                header.alg, key.alg
            )));
        }
        Ok(key)
    }

    /// A key of the JWKS URL; an unknown `kid` refetches the JWKS, at most once
    /// per `min_refetch`.
    async fn remote_key(&self, kid: &str) -> Option<std::sync::Arc<Key>> {
        let remote = self.remote.as_ref()?;
        let known = |remote: &Remote| {
            let keys = remote.keys.read().unwrap_or_else(|e| e.into_inner());
            keys.get(kid).cloned()
        };
        if let Some(k) = known(remote) {
            return Some(k);
        }
        let mut fetched_at = remote.fetched_at.lock().await;
        // A fetch that ran while this one waited may have brought the key.
        if let Some(k) = known(remote) {
            return Some(k);
        }
        if fetched_at.elapsed() < remote.min_refetch {
            return None;
        }
        // Counted as a fetch even when it fails, so a down provider is not hammered.
        *fetched_at = Instant::now();
        match fetch(&remote.http, &remote.url).await {
            Ok(keys) => *remote.keys.write().unwrap_or_else(|e| e.into_inner()) = keys,
            Err(e) => {
                tracing::warn!(url = %remote.url, error = %e, "cannot refetch the JWKS; keeping the keys known");
            }
        }
        known(remote)
    }
}

/// The header fields looked at before verification.
#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

impl Header {
    fn parse(token: &str) -> Result<Header, ApiError> {
        let first = token.split('.').next().unwrap_or_default();
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(first.trim_end_matches('='))
            .map_err(|_| unauthorized("malformed token: the header is not base64url"))?;
        serde_json::from_slice(&bytes)
            .map_err(|_| unauthorized("malformed token: the header is not JSON with an alg"))
    }
}

/// Whether a bearer value has the shape of a JWT: three dot-separated base64url
/// parts (the last may be empty, as in an unsigned token, refused later).
pub fn looks_like_jwt(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    let b64 = |p: &str| {
        p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'=')
    };
    parts.len() == 3 && !parts[0].is_empty() && !parts[1].is_empty() && parts.iter().all(|p| b64(p))
}

/// The namespace a claim value maps to: lowercased, every character outside
/// `[a-z0-9-]` becomes `-`, then trimmed to a DNS label (no leading or trailing
/// `-`, at most 63 characters). `None` when nothing valid is left.
pub fn namespace_for(claim: &str) -> Option<String> {
    let mapped: String = claim
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches('-');
    let label: String = trimmed.chars().take(63).collect();
    let label = label.trim_end_matches('-');
    (!label.is_empty()).then(|| label.to_string())
}

fn unauthorized(what: &str) -> ApiError {
    ApiError::Unauthorized(format!("JWT refused: {what}"))
}

/// The `401` for a failed check, naming it.
fn refusal(kind: &ErrorKind) -> ApiError {
    unauthorized(&match kind {
        ErrorKind::InvalidSignature => {
            "bad signature: the signature does not match the header and payload (forged or tampered token)".to_string()
        }
        ErrorKind::ExpiredSignature => {
            format!("expired: exp is in the past (beyond {LEEWAY_SECS} s leeway)")
        }
        ErrorKind::ImmatureSignature => {
            format!("not yet valid: nbf is in the future (beyond {LEEWAY_SECS} s leeway)")
        }
        ErrorKind::InvalidIssuer => "wrong issuer: iss is not the configured issuer".to_string(),
        ErrorKind::InvalidAudience => {
            "wrong audience: aud does not name the configured audience".to_string()
        }
        ErrorKind::MissingRequiredClaim(c) => format!("the required claim {c} is missing"),
        ErrorKind::InvalidClaimFormat(c) => format!("the claim {c} has an invalid format"),
        ErrorKind::InvalidAlgorithm => {
            "algorithm not allowed for the key that verifies it".to_string()
        }
        other => format!("malformed token ({other:?})"),
    })
}

/// The signing keys of a JWKS, by `kid`: RSA keys verify RS256, P-256 keys ES256,
/// Ed25519 keys EdDSA. Keys without a `kid`, encryption keys, symmetric keys and
/// other key types are left out; a key that names another algorithm is too.
fn keys_of(set: &JwkSet) -> Result<HashMap<String, std::sync::Arc<Key>>, String> {
    let mut keys = HashMap::new();
    for jwk in &set.keys {
        let Some(kid) = &jwk.common.key_id else {
            continue;
        };
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let alg = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                Algorithm::EdDSA
            }
            _ => continue,
        };
        if let Some(named) = jwk.common.key_algorithm
            && format!("{named:?}") != format!("{alg:?}")
        {
            continue;
        }
        if let AlgorithmParameters::OctetKeyPair(p) = &jwk.algorithm {
            // The verifier reads exactly 32 bytes: a shorter key must not get that far.
            let x = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p.x.trim_end_matches('='))
                .map_err(|_| format!("key {kid:?}: x is not base64url"))?;
            if x.len() != 32 {
                return Err(format!("key {kid:?}: an Ed25519 key is 32 bytes"));
            }
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key {kid:?}: {e}"))?;
        keys.insert(kid.clone(), std::sync::Arc::new(Key { alg, key }));
    }
    Ok(keys)
}

/// Parses a JWKS document.
pub fn parse_jwks(text: &[u8]) -> Result<JwkSet, String> {
    serde_json::from_slice(text).map_err(|e| format!("not a JWKS document: {e}"))
}

async fn fetch(
    http: &reqwest::Client,
    url: &str,
) -> Result<HashMap<String, std::sync::Arc<Key>>, String> {
    let resp = http.get(url).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("answered {}", resp.status()));
    }
    let body = resp.bytes().await.map_err(|e| e.to_string())?;
    let set = parse_jwks(&body)?;
    let keys = keys_of(&set)?;
    if keys.is_empty() {
        return Err("the JWKS has no RS256, ES256 or EdDSA signing key with a kid".into());
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_map_to_dns_labels() {
        assert_eq!(namespace_for("team-a").as_deref(), Some("team-a"));
        assert_eq!(namespace_for("Team_A").as_deref(), Some("team-a"));
        assert_eq!(
            namespace_for("alice@example.com").as_deref(),
            Some("alice-example-com")
        );
        assert_eq!(namespace_for("--Bob--").as_deref(), Some("bob"));
        assert_eq!(namespace_for("auth0|12345").as_deref(), Some("auth0-12345"));
        assert_eq!(namespace_for("Zoë").as_deref(), Some("zo"));
        assert_eq!(namespace_for(""), None);
        assert_eq!(namespace_for("@@@"), None);
        assert_eq!(namespace_for("---"), None);
        assert_eq!(namespace_for("ÄÖÜ"), None);
    }

    #[test]
    fn long_claims_are_cut_to_63_characters_without_a_trailing_dash() {
        let long = "a".repeat(100);
        assert_eq!(namespace_for(&long).unwrap().len(), 63);
        let dash_at_63 = format!("{}.b", "a".repeat(62));
        assert_eq!(namespace_for(&dash_at_63).unwrap(), "a".repeat(62));
        for claim in [long.as_str(), dash_at_63.as_str(), "x@y", "A B C"] {
            let ns = namespace_for(claim).unwrap();
            sless_core::name::validate_name("namespace", &ns).unwrap();
        }
    }

    #[test]
    fn only_three_base64url_parts_look_like_a_jwt() {
        assert!(looks_like_jwt("eyJh.eyJz.c2ln"));
        assert!(looks_like_jwt("eyJh.eyJz."), "unsigned: refused later");
        assert!(!looks_like_jwt("sless_0123abcd"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a.b.c.d"));
        assert!(!looks_like_jwt(".b.c"));
        assert!(!looks_like_jwt("a b.c.d"));
    }

    #[test]
    fn refusals_name_the_check() {
        let msg = |k: ErrorKind| refusal(&k).to_string();
        assert!(msg(ErrorKind::InvalidSignature).contains("bad signature"));
        assert!(msg(ErrorKind::ExpiredSignature).contains("expired"));
        assert!(msg(ErrorKind::ImmatureSignature).contains("not yet valid"));
        assert!(msg(ErrorKind::InvalidIssuer).contains("wrong issuer"));
        assert!(msg(ErrorKind::InvalidAudience).contains("wrong audience"));
    }
}
