//! Bearer tokens: the admin token, and namespace tokens stored only as SHA-256
//! hashes (they are 256-bit random secrets, so a plain hash is enough).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use sless_store::{Store, TokenStore};

use crate::AppState;
use crate::error::ApiError;
use crate::jwt::JwtVerifier;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The admin token: may do everything.
    Admin,
    /// A namespace token or a JWT: may act only in `namespace`.
    Namespace { namespace: String, actor: Actor },
}

/// Which credential a namespace caller presented, as the audit log names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// A namespace token, by its id (never its value).
    Token(String),
    /// A JWT, by its subject.
    Jwt(String),
}

impl Caller {
    /// Whether the caller may act in `namespace`.
    pub fn may_access(&self, namespace: &str) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Namespace { namespace: ns, .. } => ns == namespace,
        }
    }

    pub fn is_admin(&self) -> bool {
        matches!(self, Caller::Admin)
    }

    /// The caller's own namespace; `None` for the admin.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Caller::Admin => None,
            Caller::Namespace { namespace, .. } => Some(namespace),
        }
    }

    /// Who the caller is, as the audit log writes it: `admin`, `token:<id>` or `jwt:<sub>`.
    pub fn actor_label(&self) -> String {
        match self {
            Caller::Admin => "admin".into(),
            Caller::Namespace {
                actor: Actor::Token(id),
                ..
            } => format!("token:{id}"),
            Caller::Namespace {
                actor: Actor::Jwt(sub),
                ..
            } => format!("jwt:{sub}"),
        }
    }

    /// `404` for namespaces the caller may not see: their existence is not leaked.
    /// Nobody sees the hidden names namespaces in the trash are kept under.
    pub fn check(&self, namespace: &str) -> Result<(), ApiError> {
        if self.may_access(namespace) && !sless_store::is_trash_name(namespace) {
            Ok(())
        } else {
            Err(ApiError::not_found("namespace", namespace))
        }
    }
}

pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A namespace token's caller. The token's id is the start of its hash: it names
/// the token in lists and the audit log and tells nothing about its value.
fn token_caller(namespace: String, hash: &str) -> Caller {
    Caller::Namespace {
        namespace,
        actor: Actor::Token(sless_store::token_id(hash)),
    }
}

/// A new random token, shown to its owner once.
pub fn new_token() -> String {
    format!("sless_{}", hex::encode(rand::random::<[u8; 32]>()))
}

/// Resolves tokens, caching namespace tokens in memory.
pub struct Tokens {
    /// Swapped by [`Tokens::rotate_admin`].
    admin_hash: RwLock<String>,
    store: Arc<dyn Store>,
    /// Where a rotated admin token is kept; `None` when the admin token is set by
    /// `SLESS_ADMIN_TOKEN`, which rotation cannot change.
    admin_file: Option<PathBuf>,
    /// Held while the admin token is rotated, so two rotations do not interleave.
    rotating: Mutex<()>,
    /// Where tokens' last use is written; `None` leaves it unrecorded.
    token_store: Option<Arc<dyn TokenStore>>,
    /// When each token's last use was last written (by hash), so it is written at
    /// most once per [`TOUCH_EVERY`] per token, not on every request.
    touched: Mutex<lru::LruCache<String, Instant>>,
    cache: Mutex<TokenCache>,
    /// Failed authentications per client address (API and private functions alike).
    pub(crate) limiter: AuthLimiter,
    /// JWT sign-in, when configured.
    jwt: Option<Arc<JwtVerifier>>,
    /// The web console's signed-in sessions (cookie → token).
    pub(crate) sessions: crate::console::Sessions,
}

impl Tokens {
    pub fn new(admin_token: &str, store: Arc<dyn Store>) -> Self {
        Self::with_limiter(admin_token, store, AuthLimiter::default())
    }

    pub fn with_limiter(admin_token: &str, store: Arc<dyn Store>, limiter: AuthLimiter) -> Self {
        Self {
            admin_hash: RwLock::new(hash_token(admin_token)),
            store,
            admin_file: None,
            rotating: Mutex::new(()),
            token_store: None,
            touched: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(KNOWN_TOKENS).unwrap_or(NonZeroUsize::MIN),
            )),
            cache: Mutex::new(TokenCache::default()),
            limiter,
            jwt: None,
            sessions: crate::console::Sessions::default(),
        }
    }

    /// Lets [`Tokens::rotate_admin`] replace the admin token, keeping the new one in
    /// `path` (mode 0600). Without it (the token comes from `SLESS_ADMIN_TOKEN`)
    /// rotation is refused.
    pub fn with_admin_file(mut self, path: PathBuf) -> Self {
        self.admin_file = Some(path);
        self
    }

    /// Records namespace tokens' last use in `store`.
    pub fn with_token_store(mut self, store: Arc<dyn TokenStore>) -> Self {
        self.token_store = Some(store);
        self
    }

    /// Replaces the admin token with a new random one, effective at once: the old
    /// one is refused from the next request on. The new token is written to the
    /// admin-token file first (so a restart keeps it), then swapped in; if it
    /// cannot be written, nothing changes.
    pub fn rotate_admin(&self) -> Result<String, ApiError> {
        let Some(path) = &self.admin_file else {
            return Err(ApiError::Conflict(
                "the admin token is set by SLESS_ADMIN_TOKEN, which the server cannot change: \
                 set a new value and restart the server to rotate it"
                    .into(),
            ));
        };
        let _one_at_a_time = self.rotating.lock().unwrap_or_else(|e| e.into_inner());
        let token = new_token();
        write_private(path, &format!("{token}\n")).map_err(|e| {
            ApiError::Internal(anyhow::anyhow!(
                "cannot write the new admin token to {}: {e}",
                path.display()
            ))
        })?;
        *self.admin_hash.write().unwrap_or_else(|e| e.into_inner()) = hash_token(&token);
        tracing::info!(file = %path.display(), "the admin token was rotated");
        Ok(token)
    }

    fn is_admin_hash(&self, hash: &str) -> bool {
        *self.admin_hash.read().unwrap_or_else(|e| e.into_inner()) == hash
    }

    /// Writes the token's last use, unless it was written less than [`TOUCH_EVERY`] ago.
    /// A failure is logged: a request never fails for it.
    async fn touch(&self, hash: &str) {
        let Some(store) = &self.token_store else {
            return;
        };
        let now = Instant::now();
        {
            let mut touched = self.touched.lock().unwrap_or_else(|e| e.into_inner());
            if touched
                .get(hash)
                .is_some_and(|at| now.duration_since(*at) < TOUCH_EVERY)
            {
                return;
            }
            touched.put(hash.to_string(), now);
        }
        if let Err(e) = store.touch_token(hash, chrono::Utc::now()).await {
            tracing::warn!(error = %e, "cannot record a token's last use");
        }
    }

    pub async fn resolve(&self, token: &str) -> Result<Option<Caller>, ApiError> {
        let hash = hash_token(token);
        // Comparing hashes keeps the comparison independent of where the secrets differ.
        if self.is_admin_hash(&hash) {
            return Ok(Some(Caller::Admin));
        }
        if let Some(jwt) = &self.jwt
            && crate::jwt::looks_like_jwt(token)
        {
            return self.resolve_jwt(jwt, token, hash).await.map(Some);
        }
        let hit = self.cache().get(&hash, Instant::now());
        if let Some(hit) = hit {
            if hit.is_some() {
                self.touch(&hash).await;
            }
            return Ok(hit.map(|ns| token_caller(ns, &hash)));
        }
        // A token deleted while the store is asked must not come back from the
        // answer: `invalidate` moves the epoch, and an answer from before it is not kept.
        let epoch = self.cache().epoch;
        let ns = self.store.token_namespace(&hash).await?;
        {
            let mut cache = self.cache();
            if cache.epoch == epoch {
                cache.insert(hash.clone(), ns.clone(), Instant::now());
            }
        }
        if ns.is_some() {
            self.touch(&hash).await;
        }
        Ok(ns.map(|ns| token_caller(ns, &hash)))
    }

    /// Accepts JWTs verified by `jwt` as well as tokens.
    pub fn with_jwt(mut self, jwt: Arc<JwtVerifier>) -> Self {
        self.jwt = Some(jwt);
        self
    }

    /// A JWT's caller: verified (or verified recently), its namespace created on
    /// its first valid use. Refusals are `401` naming the failed check (`403` for
    /// a namespace claim that maps to no valid name).
    async fn resolve_jwt(
        &self,
        jwt: &JwtVerifier,
        token: &str,
        hash: String,
    ) -> Result<Caller, ApiError> {
        let verified = match jwt.cached(&hash) {
            Some(v) => v,
            None => {
                let (v, exp) = jwt.verify(token).await?;
                if self.store.ensure_namespace(&v.namespace).await? {
                    tracing::info!(namespace = %v.namespace, subject = %v.subject, "namespace created at first JWT sign-in");
                }
                jwt.remember(hash, v.clone(), exp);
                v
            }
        };
        Ok(Caller::Namespace {
            namespace: verified.namespace,
            actor: Actor::Jwt(verified.subject),
        })
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, TokenCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops cached lookups (after tokens were created or deleted).
    pub fn invalidate(&self) {
        self.cache().clear();
    }
}

/// A token's last use is written at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// Writes `text` to `path` readable by its owner only (0600), replacing the file
/// whole: a temporary file in the same directory, synced, then renamed over it.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".new");
    let tmp = path.with_file_name(name);
    // A leftover from an interrupted write may have other permissions: start afresh.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Token lookups remembered, by token hash. Known tokens and unknown ones live in
/// two separate LRU tables, so a stream of random tokens can only push out other
/// unknown ones, never a valid token; both tables forget entries after a while, so a
/// token created or deleted behind this cache's back is seen within that time.
struct TokenCache {
    known: lru::LruCache<String, (String, Instant)>,
    unknown: lru::LruCache<String, Instant>,
    /// Moves on every [`TokenCache::clear`].
    epoch: u64,
}

/// Valid tokens remembered (least recently used go first).
const KNOWN_TOKENS: usize = 10_000;
/// How long a valid token is trusted without asking the store again.
const KNOWN_TTL: Duration = Duration::from_secs(60);
/// Unknown tokens remembered, so a client retrying a bad token does not reach the store each time.
const UNKNOWN_TOKENS: usize = 1_024;
/// How long an unknown token is remembered as unknown.
const UNKNOWN_TTL: Duration = Duration::from_secs(5);

impl Default for TokenCache {
    fn default() -> Self {
        Self::new(KNOWN_TOKENS, UNKNOWN_TOKENS)
    }
}

impl TokenCache {
    fn new(known: usize, unknown: usize) -> Self {
        let size = |n: usize| NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN);
        Self {
            known: lru::LruCache::new(size(known)),
            unknown: lru::LruCache::new(size(unknown)),
            epoch: 0,
        }
    }

    /// `Some(Some(ns))`: a valid token of `ns`; `Some(None)`: known to be invalid;
    /// `None`: not remembered (or remembered too long ago).
    fn get(&mut self, hash: &str, now: Instant) -> Option<Option<String>> {
        if let Some((ns, at)) = self.known.get(hash) {
            if now.duration_since(*at) < KNOWN_TTL {
                return Some(Some(ns.clone()));
            }
            self.known.pop(hash);
        }
        if let Some(at) = self.unknown.get(hash) {
            if now.duration_since(*at) < UNKNOWN_TTL {
                return Some(None);
            }
            self.unknown.pop(hash);
        }
        None
    }

    fn insert(&mut self, hash: String, namespace: Option<String>, now: Instant) {
        match namespace {
            Some(ns) => {
                self.unknown.pop(&hash);
                self.known.put(hash, (ns, now));
            }
            None => {
                self.known.pop(&hash);
                self.unknown.put(hash, now);
            }
        }
    }

    fn clear(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        self.known.clear();
        self.unknown.clear();
    }
}

/// Counts failed authentications per client address: past `max_failures` within
/// `window` of the first one, the address's requests with credentials are answered
/// `429` (with `Retry-After`) without looking at the token, until the window ends.
/// Requests without credentials, and all requests from other addresses, are not
/// affected; successes are not counted. The table is bounded: once full (after
/// dropping expired entries), new addresses share one extra entry.
pub struct AuthLimiter {
    max_failures: u32,
    window: Duration,
    capacity: usize,
    table: Mutex<HashMap<IpAddr, Failures>>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    since: Instant,
    count: u32,
}

impl Default for AuthLimiter {
    /// 20 failures a minute, 10,000 addresses.
    fn default() -> Self {
        AuthLimiter::new(20, Duration::from_secs(60), 10_000)
    }
}

impl AuthLimiter {
    pub fn new(max_failures: u32, window: Duration, capacity: usize) -> Self {
        AuthLimiter {
            max_failures,
            window,
            capacity: capacity.max(1),
            table: Mutex::new(HashMap::new()),
        }
    }

    /// An address's key: IPv6 clients are counted per /64, the block one host
    /// usually has (so it cannot rotate through addresses).
    fn key(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let s = v6.segments();
                    IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
                }
            },
            v4 => v4,
        }
    }

    /// `Err(seconds to wait)` while `ip` is over the limit.
    pub fn check(&self, ip: IpAddr) -> Result<(), u64> {
        self.check_at(ip, Instant::now())
    }

    /// Counts a failure of `ip`.
    pub fn failed(&self, ip: IpAddr) {
        self.failed_at(ip, Instant::now());
    }

    fn check_at(&self, ip: IpAddr, now: Instant) -> Result<(), u64> {
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let key = Self::key(ip);
        let entry = table.get(&key).or_else(|| {
            table
                .get(&IpAddr::V6(Ipv6Addr::UNSPECIFIED))
                .filter(|_| table.len() >= self.capacity)
        });
        match entry {
            Some(f) if f.count >= self.max_failures && now < f.since + self.window => {
                let left = (f.since + self.window).saturating_duration_since(now);
                Err(left.as_secs() + u64::from(left.subsec_nanos() > 0))
            }
            _ => Ok(()),
        }
    }

    fn failed_at(&self, ip: IpAddr, now: Instant) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let mut key = Self::key(ip);
        if !table.contains_key(&key) && table.len() >= self.capacity {
            table.retain(|_, f| now < f.since + self.window);
            if table.len() >= self.capacity {
                key = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
            }
        }
        let f = table.entry(key).or_insert(Failures {
            since: now,
            count: 0,
        });
        if now >= f.since + self.window {
            *f = Failures {
                since: now,
                count: 0,
            };
        }
        f.count = f.count.saturating_add(1);
    }

    pub(crate) fn too_many(retry_after: u64) -> ApiError {
        ApiError::TooManyRequests {
            message: format!(
                "too many failed authentications from this address: retry in {retry_after} s"
            ),
            retry_after,
        }
    }
}

#[async_trait]
impl sless_gateway::Authorizer for Tokens {
    async fn may_invoke(
        &self,
        token: &str,
        namespace: &str,
        peer: Option<IpAddr>,
    ) -> sless_gateway::Access {
        if let Some(ip) = peer
            && let Err(retry_after) = self.limiter.check(ip)
        {
            return sless_gateway::Access::Limited(retry_after);
        }
        match self.resolve(token).await {
            Ok(Some(c)) if c.may_access(namespace) => sless_gateway::Access::Allowed,
            Ok(Some(_)) => sless_gateway::Access::Denied,
            Ok(None) => {
                if let Some(ip) = peer {
                    self.limiter.failed(ip);
                }
                sless_gateway::Access::Denied
            }
            Err(e) => {
                if let (Some(ip), ApiError::Unauthorized(_)) = (peer, &e) {
                    self.limiter.failed(ip);
                }
                sless_gateway::Access::Denied
            }
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = if parts
            .headers
            .contains_key(axum::http::header::AUTHORIZATION)
        {
            sless_gateway::bearer_token(&parts.headers)
                .ok_or_else(|| {
                    ApiError::Unauthorized(
                        "the Authorization header must be 'Bearer <token>'".into(),
                    )
                })?
                .to_string()
        } else if let Some(id) = crate::console::session_id(&parts.headers) {
            // The web console: the session's token, and its csrf token on any change.
            let (token, csrf) = state.tokens.sessions.get(&id).ok_or_else(|| {
                ApiError::Unauthorized("the console session has ended; sign in again".into())
            })?;
            if !parts.method.is_safe() {
                crate::console::check_csrf(&parts.headers, &csrf)?;
            }
            token
        } else {
            return Err(ApiError::Unauthorized(
                "missing Authorization: Bearer <token> header".into(),
            ));
        };
        let token = token.as_str();
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        let limiter = &state.tokens.limiter;
        if let Some(ip) = peer {
            limiter.check(ip).map_err(AuthLimiter::too_many)?;
        }
        let resolved = state.tokens.resolve(token).await;
        if let (Some(ip), Err(ApiError::Unauthorized(_))) = (peer, &resolved) {
            limiter.failed(ip); // a refused JWT
        }
        match resolved? {
            Some(caller) => {
                crate::audit::note_actor(&parts.extensions, &caller);
                Ok(caller)
            }
            None => {
                if let Some(ip) = peer {
                    limiter.failed(ip);
                }
                Err(ApiError::Unauthorized("unknown token".into()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_past_the_limit_block_the_address_until_the_window_ends() {
        let l = AuthLimiter::new(3, Duration::from_secs(60), 100);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(l.check_at(a, t0), Ok(()));
            l.failed_at(a, t0);
        }
        assert_eq!(l.check_at(a, t0 + Duration::from_millis(500)), Err(60));
        assert_eq!(
            l.check_at(b, t0),
            Ok(()),
            "other addresses are not affected"
        );
        assert_eq!(l.check_at(a, t0 + Duration::from_secs(59)), Err(1));
        assert_eq!(l.check_at(a, t0 + Duration::from_secs(60)), Ok(()));
        l.failed_at(a, t0 + Duration::from_secs(61));
        assert_eq!(
            l.check_at(a, t0 + Duration::from_secs(61)),
            Ok(()),
            "a new window"
        );
    }

    #[test]
    fn random_tokens_never_evict_a_valid_one() {
        let mut cache = TokenCache::new(4, 8);
        let t0 = Instant::now();
        cache.insert("valid".into(), Some("team".into()), t0);
        for i in 0..10_000 {
            cache.insert(format!("random-{i}"), None, t0);
        }
        assert_eq!(cache.get("valid", t0), Some(Some("team".into())));
        assert_eq!(cache.get("random-9999", t0), Some(None));
        assert_eq!(
            cache.get("random-0", t0),
            None,
            "the oldest unknown token was forgotten"
        );
    }

    #[test]
    fn cached_lookups_expire() {
        let mut cache = TokenCache::new(4, 4);
        let t0 = Instant::now();
        cache.insert("valid".into(), Some("team".into()), t0);
        cache.insert("bad".into(), None, t0);
        assert_eq!(
            cache.get("bad", t0 + UNKNOWN_TTL - Duration::from_millis(1)),
            Some(None)
        );
        assert_eq!(cache.get("bad", t0 + UNKNOWN_TTL), None);
        assert_eq!(
            cache.get("valid", t0 + KNOWN_TTL / 2),
            Some(Some("team".into()))
        );
        assert_eq!(cache.get("valid", t0 + KNOWN_TTL), None);
    }

    #[test]
    fn a_token_found_valid_is_no_longer_unknown_and_clear_forgets_all() {
        let mut cache = TokenCache::new(4, 4);
        let t0 = Instant::now();
        cache.insert("t".into(), None, t0);
        cache.insert("t".into(), Some("team".into()), t0);
        assert_eq!(cache.get("t", t0), Some(Some("team".into())));
        cache.clear();
        assert_eq!(cache.get("t", t0), None);
    }

    #[test]
    fn ipv6_hosts_are_counted_per_64_and_the_table_is_bounded() {
        let l = AuthLimiter::new(2, Duration::from_secs(60), 3);
        let t0 = Instant::now();
        l.failed_at("2001:db8::1".parse().unwrap(), t0);
        l.failed_at("2001:db8::2".parse().unwrap(), t0);
        assert!(l.check_at("2001:db8::3".parse().unwrap(), t0).is_err());
        for i in 0..50u8 {
            l.failed_at(IpAddr::from([192, 0, 2, i]), t0);
        }
        let table = l.table.lock().unwrap();
        assert!(table.len() <= 4, "{}", table.len());
        drop(table);
        assert!(
            l.check_at(IpAddr::from([192, 0, 2, 99]), t0).is_err(),
            "past the bound, new addresses share one entry"
        );
    }
}
