//! A [`BlobStore`] in an S3 bucket (AWS S3 or anything that speaks its API), through
//! the `object_store` crate.
//!
//! Objects are laid out as the local store's files are, under the URL's prefix:
//! `<prefix>/ab/<sha256>.zip`, so a data directory's `blobs/` can be copied into a
//! bucket as it is. The semantics are the local store's: every read is hashed and
//! a corrupt object is reported and deleted; a put of bytes already stored writes
//! them again, because S3 has no way to touch an object and the collector reads
//! an object's last-modified time as its "last used" time.
//!
//! Check-then-act sequences (put, the removal of a corrupt object, collection) are
//! serialised per key within this process by striped locks, as the local store's
//! mutex does: S3 has no conditional delete. One server owns a bucket prefix.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::{ClientConfigKey, ObjectStore, ObjectStoreExt, RetryConfig, WriteMultipart};
use sha2::{Digest, Sha256};

use crate::store::{BlobError, BlobInfo, BlobStore, Stored, check_key, sha256_hex};

/// Bodies larger than this are uploaded in parts of this size (S3 wants at least
/// 5 MiB per part but the last).
const PART_SIZE: usize = 8 << 20;

/// Parallel part uploads of one multipart upload.
const PART_CONCURRENCY: usize = 4;

/// Stripes of the per-key locks.
const STRIPES: usize = 64;

/// How to reach the bucket. Anything left `None` comes from the standard AWS
/// environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
/// `AWS_REGION` / `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL`, ...), as object_store
/// reads it.
#[derive(Clone, Default)]
pub struct S3Config {
    pub bucket: String,
    /// `""` or segments without leading or trailing slashes.
    pub prefix: String,
    /// An S3-compatible endpoint (`http://127.0.0.1:9000`); plain `http://` is
    /// allowed when the endpoint says so.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

/// A [`BlobStore`] in an S3 bucket.
#[derive(Debug, Clone)]
pub struct S3BlobStore {
    s3: Arc<AmazonS3>,
    prefix: String,
    /// `s3://bucket/prefix`, for messages.
    url: String,
    locks: Arc<[tokio::sync::Mutex<()>]>,
}

fn backend(context: impl Into<String>, e: object_store::Error) -> BlobError {
    BlobError::Io {
        context: context.into(),
        source: std::io::Error::other(e),
    }
}

impl S3BlobStore {
    /// A store for `config`. Makes no request: [`BlobStore::ping`] checks that the
    /// bucket answers.
    pub fn new(config: S3Config) -> Result<Self, BlobError> {
        let url = if config.prefix.is_empty() {
            format!("s3://{}", config.bucket)
        } else {
            format!("s3://{}/{}", config.bucket, config.prefix)
        };
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(&config.bucket);
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        // An http:// endpoint (from the flag or AWS_ENDPOINT_URL) is the operator's
        // explicit choice, e.g. a MinIO on the same host.
        let endpoint = config
            .endpoint
            .clone()
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
            .or_else(|| std::env::var("AWS_ENDPOINT").ok());
        if endpoint.is_some_and(|e| e.starts_with("http://")) {
            builder = builder.with_allow_http(true);
        }
        if let Some(region) = &config.region {
            builder = builder.with_region(region);
        }
        if let Some(key) = &config.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &config.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        // A backend that is down fails a request within half a minute instead of
        // the crate's three; the controller retries with its own back-off.
        let retry = RetryConfig {
            max_retries: 4,
            retry_timeout: Duration::from_secs(30),
            ..RetryConfig::default()
        };
        let s3 = builder
            .with_retry(retry)
            // Set key by key: `with_client_options` would drop what the environment
            // set (AWS_ALLOW_HTTP, a proxy).
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                "5s",
            )
            .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "120s")
            .build()
            .map_err(|e| backend(format!("configuring {url}"), e))?;
        let locks: Vec<_> = (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect();
        Ok(S3BlobStore {
            s3: Arc::new(s3),
            prefix: config.prefix,
            url,
            locks: locks.into(),
        })
    }

    /// `s3://bucket/prefix`.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn path_of(&self, sha256: &str) -> Path {
        let key = format!("{}/{sha256}.zip", &sha256[..2]);
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    fn prefix_path(&self) -> Option<Path> {
        (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()))
    }

    /// The stripe of `sha256`'s lock (its first byte).
    async fn lock(&self, sha256: &str) -> tokio::sync::MutexGuard<'_, ()> {
        let stripe = usize::from_str_radix(&sha256[..2], 16).unwrap_or(0) % STRIPES;
        self.locks[stripe].lock().await
    }

    /// The object at `path` read whole and hashed: its bytes, their sha256 and
    /// its e-tag; `None` if there is none.
    async fn read_hashed(
        &self,
        path: &Path,
        sha256: &str,
    ) -> Result<Option<(Bytes, String, Option<String>)>, BlobError> {
        let got = match self.s3.get(path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(backend(format!("reading blob {sha256}"), e)),
        };
        let e_tag = got.meta.e_tag.clone();
        let mut data = Vec::with_capacity(usize::try_from(got.meta.size).unwrap_or(0));
        let mut hasher = Sha256::new();
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| backend(format!("reading blob {sha256}"), e))?;
            hasher.update(&chunk);
            data.extend_from_slice(&chunk);
        }
        Ok(Some((
            Bytes::from(data),
            hex::encode(hasher.finalize()),
            e_tag,
        )))
    }

    /// Writes `bytes` to `path`: one request for small bodies, a multipart upload
    /// (parts in parallel) for large ones. Either way S3 makes the object appear
    /// whole or not at all.
    async fn write(&self, path: &Path, bytes: Bytes, sha256: &str) -> Result<(), BlobError> {
        let context = || format!("writing blob {sha256} to {}", self.url);
        if bytes.len() <= PART_SIZE {
            self.s3
                .put(path, bytes.into())
                .await
                .map_err(|e| backend(context(), e))?;
            return Ok(());
        }
        let upload = self
            .s3
            .put_multipart(path)
            .await
            .map_err(|e| backend(context(), e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        let mut rest = bytes;
        while !rest.is_empty() {
            writer
                .wait_for_capacity(PART_CONCURRENCY)
                .await
                .map_err(|e| backend(context(), e))?;
            let piece = rest.split_to(rest.len().min(PART_SIZE));
            writer.put(piece);
        }
        // On failure `finish` aborts the upload, so no parts are left billed.
        writer.finish().await.map_err(|e| backend(context(), e))?;
        Ok(())
    }
}

fn system_time(t: chrono::DateTime<chrono::Utc>) -> SystemTime {
    SystemTime::from(t)
}

#[async_trait::async_trait]
impl BlobStore for S3BlobStore {
    async fn put(&self, bytes: Bytes) -> Result<(String, Stored), BlobError> {
        let sha = sha256_hex(&bytes);
        let path = self.path_of(&sha);
        let _guard = self.lock(&sha).await;
        let outcome = match self.s3.head(&path).await {
            Err(object_store::Error::NotFound { .. }) => Stored::New,
            Err(e) => return Err(backend(format!("looking up blob {sha}"), e)),
            Ok(meta) if meta.size != bytes.len() as u64 => Stored::Repaired,
            Ok(_) => match self.read_hashed(&path, &sha).await? {
                None => Stored::New,
                Some((_, actual, _)) if actual == sha => Stored::Existing,
                Some(_) => Stored::Repaired,
            },
        };
        // Written in every case: for an intact copy this renews its last-modified
        // time, so a collection that started before the caller's record names it
        // keeps it.
        self.write(&path, bytes.clone(), &sha).await?;
        if outcome == Stored::Repaired {
            tracing::warn!(sha256 = %sha, "replaced a corrupt stored blob with an intact upload");
        }
        tracing::debug!(sha256 = %sha, size = bytes.len(), ?outcome, "stored blob in S3");
        Ok((sha, outcome))
    }

    async fn get(&self, sha256: &str) -> Result<Bytes, BlobError> {
        check_key(sha256)?;
        let path = self.path_of(sha256);
        let Some((data, actual, e_tag)) = self.read_hashed(&path, sha256).await? else {
            return Err(BlobError::NotFound(sha256.to_string()));
        };
        if actual == sha256 {
            return Ok(data);
        }
        // Never hand changed bytes on; delete them, unless a put replaced the
        // object meanwhile (a different e-tag), so that the next upload of the
        // original writes it anew.
        let _guard = self.lock(sha256).await;
        match self.s3.head(&path).await {
            Ok(meta) if meta.e_tag == e_tag => match self.s3.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(backend(format!("removing corrupt blob {sha256}"), e)),
            },
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(backend(format!("looking up blob {sha256}"), e)),
        }
        tracing::error!(sha256 = %sha256, %actual, url = %self.url, "stored blob is corrupt; removed it");
        Err(BlobError::Corrupt {
            sha256: sha256.to_string(),
            actual,
        })
    }

    async fn list(&self) -> Result<Vec<BlobInfo>, BlobError> {
        let prefix = self.prefix_path();
        let mut stream = self.s3.list(prefix.as_ref());
        let mut out = Vec::new();
        while let Some(meta) = stream.next().await {
            let meta = meta.map_err(|e| backend(format!("listing {}", self.url), e))?;
            // Only `<prefix>/ab/<sha>.zip`: anything else in the bucket is not ours.
            let Some(name) = meta.location.filename() else {
                continue;
            };
            let Some(sha) = name.strip_suffix(".zip") else {
                continue;
            };
            if check_key(sha).is_err() || meta.location != self.path_of(sha) {
                continue;
            }
            out.push(BlobInfo {
                sha256: sha.to_string(),
                size: meta.size,
                modified: system_time(meta.last_modified),
            });
        }
        Ok(out)
    }

    async fn remove_if_unused_since(
        &self,
        sha256: &str,
        cutoff: SystemTime,
    ) -> Result<Option<u64>, BlobError> {
        check_key(sha256)?;
        let path = self.path_of(sha256);
        let _guard = self.lock(sha256).await;
        let meta = match self.s3.head(&path).await {
            Ok(meta) => meta,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(backend(format!("looking up blob {sha256}"), e)),
        };
        if system_time(meta.last_modified) >= cutoff {
            return Ok(None);
        }
        match self.s3.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(Some(meta.size)),
            Err(e) => Err(backend(format!("removing blob {sha256}"), e)),
        }
    }

    async fn exists(&self, sha256: &str) -> Result<bool, BlobError> {
        check_key(sha256)?;
        match self.s3.head(&self.path_of(sha256)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(backend(format!("looking up blob {sha256}"), e)),
        }
    }

    async fn ping(&self) -> Result<(), BlobError> {
        // A listing (one request: at most 256 fan-out prefixes) fails for a bucket
        // that does not exist or refuses us; a HEAD of a key could not tell a
        // missing bucket from a missing key.
        self.s3
            .list_with_delimiter(self.prefix_path().as_ref())
            .await
            .map_err(|e| backend(format!("listing {}", self.url), e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use sless_brokers::Moto;

    use super::*;

    /// One moto for this test binary; each test has a bucket of its own.
    fn moto() -> &'static Moto {
        static MOTO: OnceLock<Moto> = OnceLock::new();
        MOTO.get_or_init(|| Moto::start().expect("moto_server starts (see .ci/run)"))
    }

    fn config(moto: &Moto, bucket: &str, prefix: &str) -> S3Config {
        S3Config {
            bucket: bucket.into(),
            prefix: prefix.into(),
            endpoint: Some(moto.endpoint()),
            region: Some(sless_brokers::moto::REGION.into()),
            access_key_id: Some(sless_brokers::moto::ACCESS_KEY_ID.into()),
            secret_access_key: Some(sless_brokers::moto::SECRET_ACCESS_KEY.into()),
        }
    }

    /// A store in a new bucket of the shared moto.
    fn store(prefix: &str) -> S3BlobStore {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let bucket = format!("blob-test-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let moto = moto();
        moto.create_bucket(&bucket).unwrap();
        S3BlobStore::new(config(moto, &bucket, prefix)).unwrap()
    }

    #[tokio::test]
    async fn the_s3_store_behaves_as_every_store_does() {
        for prefix in ["", "sless/blobs"] {
            let store = store(prefix);
            let s3 = store.clone();
            let tamper = move |sha: String, bytes: Vec<u8>| {
                let s3 = s3.clone();
                Box::pin(async move {
                    s3.s3
                        .put(&s3.path_of(&sha), Bytes::from(bytes).into())
                        .await
                        .unwrap();
                })
                    as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
            };
            crate::conformance::check(&store, &tamper).await;
        }
    }

    #[tokio::test]
    async fn keys_are_laid_out_as_the_local_store_and_other_objects_are_ignored() {
        let store = store("team/code");
        let (sha, _) = store.put(Bytes::from_static(b"zip")).await.unwrap();
        let stored = store
            .s3
            .head(&Path::from(format!("team/code/{}/{sha}.zip", &sha[..2])))
            .await
            .unwrap();
        assert_eq!(stored.size, 3);
        // Objects that are not `<prefix>/ab/<sha>.zip` are not blobs.
        for key in [
            format!("team/code/{sha}.zip"),
            format!("team/code/{}/{sha}.zip.tmp", &sha[..2]),
            format!("team/code/{}/x/{sha}.zip", &sha[..2]),
            "team/code/readme.txt".to_string(),
            format!("elsewhere/{}/{sha}.zip", &sha[..2]),
        ] {
            store
                .s3
                .put(&Path::from(key), Bytes::from_static(b"x").into())
                .await
                .unwrap();
        }
        let listed = store.list().await.unwrap();
        assert_eq!(
            listed.iter().map(|b| b.sha256.as_str()).collect::<Vec<_>>(),
            vec![sha.as_str()]
        );
    }

    #[tokio::test]
    async fn large_bodies_go_up_in_parts_and_come_back_whole() {
        let store = store("big");
        // Three parts, the last one short; bytes that differ per position, so a
        // part out of order would not hash right.
        let data: Vec<u8> = (0..2 * PART_SIZE + 12_345)
            .map(|i| (i % 251) as u8)
            .collect();
        let data = Bytes::from(data);
        let (sha, stored) = store.put(data.clone()).await.unwrap();
        assert_eq!(stored, Stored::New);
        assert_eq!(store.get(&sha).await.unwrap(), data);
        assert_eq!(
            store.put(data.clone()).await.unwrap(),
            (sha.clone(), Stored::Existing)
        );
        let listed = store.list().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].size, data.len() as u64);
    }

    #[tokio::test]
    async fn a_missing_bucket_or_an_unreachable_endpoint_is_an_error_not_a_panic() {
        let moto = moto();
        let missing = S3BlobStore::new(config(moto, "no-such-bucket", "")).unwrap();
        let err = missing.ping().await.unwrap_err();
        assert!(err.to_string().contains("s3://no-such-bucket"), "{err}");
        assert!(missing.put(Bytes::from_static(b"x")).await.is_err());
        assert!(missing.list().await.is_err());

        // A port nothing listens on.
        let port = sless_brokers::free_port().unwrap();
        let mut unreachable = config(moto, "some-bucket", "p");
        unreachable.endpoint = Some(format!("http://127.0.0.1:{port}"));
        let store = S3BlobStore::new(unreachable).unwrap();
        let err = store.ping().await.unwrap_err();
        assert!(err.to_string().contains("s3://some-bucket/p"), "{err}");
        assert!(matches!(
            store.get(&sha256_hex(b"x")).await,
            Err(BlobError::Io { .. })
        ));
    }
}
