//! The blob store: uploaded code archives kept under the sha256 of their bytes.
//!
//! A blob is checked against its name every time it is read: a file changed on
//! disk (bit rot, a bad restore, a hand edit) is reported as
//! [`BlobError::Corrupt`] and removed, never handed to a build. Storing the same
//! bytes again writes them anew whenever the stored copy is missing or does not
//! match, so uploading the original archive repairs a damaged one.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use sha2::{Digest, Sha256};

/// Errors of a [`BlobStore`].
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// No blob is stored under this sha256.
    #[error("blob {0} not found")]
    NotFound(String),
    /// The file stored under `sha256` does not hash to it (changed on disk); it
    /// has been removed, and storing the original bytes again repairs it.
    #[error("blob {sha256} is corrupt: its bytes hash to {actual}")]
    Corrupt { sha256: String, actual: String },
    /// The key is not a lowercase hex sha256 (64 characters of `0-9a-f`).
    #[error("invalid blob key {0:?}: expected 64 lowercase hex characters")]
    InvalidKey(String),
    /// The storage backend failed; `context` says what was being done.
    #[error("blob store: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl BlobError {
    fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        BlobError::Io {
            context: context.into(),
            source,
        }
    }
}

/// What [`BlobStore::put`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Nothing was stored under the key: the bytes were written.
    New,
    /// An intact copy was stored already; it was left alone (and marked as used
    /// now, so a collection running meanwhile keeps it).
    Existing,
    /// The stored copy did not match its key (changed on disk); it was replaced.
    Repaired,
}

/// One stored blob, as listed for garbage collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobInfo {
    pub sha256: String,
    /// Bytes on disk.
    pub size: u64,
    /// When it was last stored (or stored again).
    pub modified: std::time::SystemTime,
}

/// Where code archives live, addressed by the lowercase hex sha256 of their bytes.
#[async_trait::async_trait]
pub trait BlobStore: Send + Sync + 'static {
    /// Stores `bytes` and returns their sha256. Idempotent: storing the same bytes
    /// twice returns the same key, and rewrites the stored copy only when it is
    /// missing or does not match. Atomic: a reader never sees a partly written blob.
    async fn put(&self, bytes: Bytes) -> Result<(String, Stored), BlobError>;
    /// The bytes stored under `sha256`, verified against it: [`BlobError::NotFound`]
    /// when there are none, [`BlobError::Corrupt`] (and the file is removed) when
    /// they do not hash to `sha256`.
    async fn get(&self, sha256: &str) -> Result<Bytes, BlobError>;
    /// Every stored blob.
    async fn list(&self) -> Result<Vec<BlobInfo>, BlobError>;
    /// Removes the blob `sha256` if it was last stored before `cutoff`; returns
    /// the bytes freed, or `None` when it was kept (or not there). Atomic with
    /// respect to [`BlobStore::put`]: a put that renews the blob either happens
    /// first (and the blob is kept) or after (and writes it anew).
    async fn remove_if_unused_since(
        &self,
        sha256: &str,
        cutoff: std::time::SystemTime,
    ) -> Result<Option<u64>, BlobError>;
    /// Whether a blob is stored under `sha256`.
    async fn exists(&self, sha256: &str) -> Result<bool, BlobError>;
    /// Checks that the backend is usable (for `/readyz`).
    async fn ping(&self) -> Result<(), BlobError>;
}

/// The lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

pub(crate) fn check_key(sha256: &str) -> Result<(), BlobError> {
    let valid = sha256.len() == 64
        && sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if valid {
        Ok(())
    } else {
        Err(BlobError::InvalidKey(sha256.to_string()))
    }
}

/// A [`BlobStore`] in a local directory: `dir/ab/abcdef….zip`.
///
/// The two-character fan-out keeps directories small. Blobs are written to a
/// temporary file in the same fan-out directory and renamed into place, so a
/// crash leaves at worst a stray `.tmp*` file, never a truncated blob.
#[derive(Debug, Clone)]
pub struct LocalBlobStore {
    dir: PathBuf,
    /// Serialises the check-then-write of a put with the check-then-remove of a
    /// collection, so neither acts on what the other just changed.
    guard: std::sync::Arc<std::sync::Mutex<()>>,
}

impl LocalBlobStore {
    /// Opens (creating it with mode 0700 if needed) the store in `dir`.
    pub fn new(dir: PathBuf) -> Result<Self, BlobError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| BlobError::io(format!("creating {}", dir.display()), e))?;
        // `recursive` leaves an existing directory's mode alone; the archives are
        // users' code, so tighten it even when the directory was made elsewhere.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| BlobError::io(format!("setting the mode of {}", dir.display()), e))?;
        Ok(LocalBlobStore {
            dir,
            guard: Default::default(),
        })
    }

    /// The directory this store keeps its blobs in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_of(&self, sha256: &str) -> PathBuf {
        self.dir.join(&sha256[..2]).join(format!("{sha256}.zip"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.guard.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Size of the reads that hash a stored blob.
const CHUNK: usize = 256 << 10;

/// Reads the file at `path` and hashes it on the way; `None` if it does not exist.
fn read_hashed(path: &Path, sha256: &str) -> Result<Option<(Vec<u8>, String)>, BlobError> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(BlobError::io(format!("reading blob {sha256}"), e)),
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut data = Vec::with_capacity(len as usize);
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = file
            .read(&mut chunk)
            .map_err(|e| BlobError::io(format!("reading blob {sha256}"), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&chunk[..n]);
        data.extend_from_slice(&chunk[..n]);
    }
    Ok(Some((data, hex::encode(hasher.finalize()))))
}

/// Whether the file at `path` holds bytes hashing to `sha256` (and, when
/// `expected` is given, that many): the size first (free), then the hash in
/// chunks, without keeping the bytes.
fn stored_intact(path: &Path, sha256: &str, expected: Option<u64>) -> Result<bool, BlobError> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(BlobError::io(format!("checking blob {sha256}"), e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| BlobError::io(format!("checking blob {sha256}"), e))?;
    if !meta.is_file() || expected.is_some_and(|n| n != meta.len()) {
        return Ok(false);
    }
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = file
            .read(&mut chunk)
            .map_err(|e| BlobError::io(format!("checking blob {sha256}"), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&chunk[..n]);
    }
    Ok(hex::encode(hasher.finalize()) == sha256)
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BlobError> + Send + 'static,
) -> Result<T, BlobError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BlobError::io("blocking task", std::io::Error::other(e)))?
}

#[async_trait::async_trait]
impl BlobStore for LocalBlobStore {
    async fn put(&self, bytes: Bytes) -> Result<(String, Stored), BlobError> {
        let store = self.clone();
        blocking(move || {
            let sha = sha256_hex(&bytes);
            let path = store.path_of(&sha);
            let _guard = store.lock();
            let present = path.exists();
            if present && stored_intact(&path, &sha, Some(bytes.len() as u64))? {
                // Renew it, so a collection that started before the caller's
                // record points at it does not take it as unused.
                let now = std::time::SystemTime::now();
                std::fs::File::options()
                    .append(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(now))
                    .map_err(|e| BlobError::io(format!("renewing blob {sha}"), e))?;
                return Ok((sha, Stored::Existing));
            }
            let fan_out = path.parent().unwrap_or(&store.dir).to_path_buf();
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&fan_out)
                .map_err(|e| BlobError::io(format!("creating {}", fan_out.display()), e))?;
            // A uniquely named temporary file in the same directory, renamed over
            // the final name: a reader sees the old file or the new, never a mix.
            let mut tmp = tempfile::Builder::new()
                .prefix(".tmp")
                .tempfile_in(&fan_out)
                .map_err(|e| BlobError::io("creating a temporary file", e))?;
            tmp.write_all(&bytes)
                .and_then(|()| tmp.as_file().sync_all())
                .map_err(|e| BlobError::io(format!("writing blob {sha}"), e))?;
            tmp.persist(&path)
                .map_err(|e| BlobError::io(format!("renaming blob {sha} into place"), e.error))?;
            let outcome = if present {
                tracing::warn!(sha256 = %sha, "replaced a corrupt stored blob with an intact upload");
                Stored::Repaired
            } else {
                Stored::New
            };
            tracing::debug!(sha256 = %sha, size = bytes.len(), "stored blob");
            Ok((sha, outcome))
        })
        .await
    }

    async fn get(&self, sha256: &str) -> Result<Bytes, BlobError> {
        check_key(sha256)?;
        let store = self.clone();
        let sha = sha256.to_string();
        blocking(move || {
            let path = store.path_of(&sha);
            let Some((data, actual)) = read_hashed(&path, &sha)? else {
                return Err(BlobError::NotFound(sha));
            };
            if actual == sha {
                return Ok(Bytes::from(data));
            }
            // Never hand changed bytes on; remove them (unless a put replaced the
            // file meanwhile) so that the next upload of the original writes it anew.
            let _guard = store.lock();
            if !stored_intact(&path, &sha, None).unwrap_or(false) {
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(BlobError::io(format!("removing corrupt blob {sha}"), e)),
                }
            }
            tracing::error!(sha256 = %sha, %actual, "stored blob is corrupt; removed it");
            Err(BlobError::Corrupt {
                sha256: sha,
                actual,
            })
        })
        .await
    }

    async fn list(&self) -> Result<Vec<BlobInfo>, BlobError> {
        let store = self.clone();
        blocking(move || {
            let mut out = Vec::new();
            let read = |dir: &Path| {
                std::fs::read_dir(dir)
                    .map_err(|e| BlobError::io(format!("listing {}", dir.display()), e))
            };
            for fan_out in read(&store.dir)? {
                let fan_out = fan_out.map_err(|e| BlobError::io("listing blobs", e))?;
                if !fan_out.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                for entry in read(&fan_out.path())? {
                    let entry = entry.map_err(|e| BlobError::io("listing blobs", e))?;
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let Some(sha) = name.strip_suffix(".zip") else {
                        continue;
                    };
                    if check_key(sha).is_err() {
                        continue;
                    }
                    let Ok(meta) = entry.metadata() else { continue };
                    out.push(BlobInfo {
                        sha256: sha.to_string(),
                        size: meta.len(),
                        modified: meta.modified().unwrap_or(std::time::UNIX_EPOCH),
                    });
                }
            }
            Ok(out)
        })
        .await
    }

    async fn remove_if_unused_since(
        &self,
        sha256: &str,
        cutoff: std::time::SystemTime,
    ) -> Result<Option<u64>, BlobError> {
        check_key(sha256)?;
        let store = self.clone();
        let sha = sha256.to_string();
        blocking(move || {
            let path = store.path_of(&sha);
            let _guard = store.lock();
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(BlobError::io(format!("checking blob {sha}"), e)),
            };
            if meta.modified().unwrap_or(std::time::UNIX_EPOCH) >= cutoff {
                return Ok(None);
            }
            std::fs::remove_file(&path)
                .map_err(|e| BlobError::io(format!("removing blob {sha}"), e))?;
            Ok(Some(meta.len()))
        })
        .await
    }

    async fn exists(&self, sha256: &str) -> Result<bool, BlobError> {
        check_key(sha256)?;
        let path = self.path_of(sha256);
        tokio::fs::try_exists(&path)
            .await
            .map_err(|e| BlobError::io(format!("looking up blob {sha256}"), e))
    }

    async fn ping(&self) -> Result<(), BlobError> {
        let meta = tokio::fs::metadata(&self.dir)
            .await
            .map_err(|e| BlobError::io(format!("checking {}", self.dir.display()), e))?;
        if !meta.is_dir() {
            return Err(BlobError::io(
                format!("checking {}", self.dir.display()),
                std::io::Error::other("not a directory"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY_SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn sha256_hex_is_lowercase_hex() {
        assert_eq!(sha256_hex(b""), EMPTY_SHA);
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[tokio::test]
    async fn put_get_round_trip_and_layout() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let store = LocalBlobStore::new(root.clone()).unwrap();
        assert_eq!(
            std::fs::metadata(&root).unwrap().permissions().mode() & 0o777,
            0o700
        );

        let data = Bytes::from_static(b"PK\x05\x06 some archive");
        let (sha, stored) = store.put(data.clone()).await.unwrap();
        assert_eq!(stored, Stored::New);
        assert_eq!(sha, sha256_hex(&data));
        assert!(root.join(&sha[..2]).join(format!("{sha}.zip")).is_file());
        assert_eq!(store.get(&sha).await.unwrap(), data);
        assert!(store.exists(&sha).await.unwrap());

        // Idempotent: the same bytes give the same key and one file.
        assert_eq!(
            store.put(data.clone()).await.unwrap(),
            (sha.clone(), Stored::Existing)
        );
        let names: Vec<_> = std::fs::read_dir(root.join(&sha[..2]))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            names,
            vec![format!("{sha}.zip")],
            "no temporary files left behind"
        );
        store.ping().await.unwrap();
    }

    #[tokio::test]
    async fn missing_and_invalid_keys() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path().to_path_buf()).unwrap();
        assert!(
            matches!(store.get(EMPTY_SHA).await, Err(BlobError::NotFound(k)) if k == EMPTY_SHA)
        );
        assert!(!store.exists(EMPTY_SHA).await.unwrap());
        for bad in [
            "",
            "../../etc/passwd",
            &EMPTY_SHA.to_uppercase(),
            &EMPTY_SHA[1..],
        ] {
            assert!(
                matches!(store.get(bad).await, Err(BlobError::InvalidKey(_))),
                "{bad}"
            );
            assert!(
                matches!(store.exists(bad).await, Err(BlobError::InvalidKey(_))),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn concurrent_puts_of_the_same_bytes_agree() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(LocalBlobStore::new(dir.path().to_path_buf()).unwrap());
        let data = Bytes::from(vec![7u8; 1 << 20]);
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (store, data) = (store.clone(), data.clone());
                tokio::spawn(async move { store.put(data).await.map(|(sha, _)| sha) })
            })
            .collect();
        let mut keys = Vec::new();
        for t in tasks {
            keys.push(t.await.unwrap().unwrap());
        }
        keys.dedup();
        assert_eq!(keys.len(), 1);
        assert_eq!(store.get(&keys[0]).await.unwrap(), data);
        let entries = std::fs::read_dir(dir.path().join(&keys[0][..2]))
            .unwrap()
            .count();
        assert_eq!(entries, 1, "only the blob itself, no temporary files");
    }

    #[tokio::test]
    async fn a_stray_temporary_file_is_not_a_blob() {
        // What a crash mid-write leaves behind must not be visible as the blob.
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path().to_path_buf()).unwrap();
        let sha = sha256_hex(b"full contents");
        std::fs::create_dir_all(dir.path().join(&sha[..2])).unwrap();
        std::fs::write(dir.path().join(&sha[..2]).join(".tmpXYZ"), b"full con").unwrap();
        assert!(!store.exists(&sha).await.unwrap());
        assert_eq!(
            store
                .put(Bytes::from_static(b"full contents"))
                .await
                .unwrap(),
            (sha.clone(), Stored::New)
        );
        assert_eq!(
            store.get(&sha).await.unwrap(),
            Bytes::from_static(b"full contents")
        );
    }

    #[tokio::test]
    async fn a_changed_blob_is_reported_removed_and_repaired_by_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path().to_path_buf()).unwrap();
        let data = Bytes::from(vec![42u8; 3 * CHUNK + 17]);
        let (sha, _) = store.put(data.clone()).await.unwrap();
        let path = store.path_of(&sha);

        // Same size, one byte changed: only the hash can tell.
        let mut bad = data.to_vec();
        bad[CHUNK + 5] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        match store.get(&sha).await {
            Err(BlobError::Corrupt { sha256, actual }) => {
                assert_eq!(sha256, sha);
                assert_eq!(actual, sha256_hex(&bad));
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert!(!path.exists(), "the corrupt copy is removed");
        assert!(matches!(store.get(&sha).await, Err(BlobError::NotFound(_))));
        assert_eq!(
            store.put(data.clone()).await.unwrap(),
            (sha.clone(), Stored::New)
        );
        assert_eq!(store.get(&sha).await.unwrap(), data);

        // A changed copy that nobody read yet is replaced by the next put.
        std::fs::write(&path, b"random junk").unwrap();
        assert_eq!(
            store.put(data.clone()).await.unwrap(),
            (sha.clone(), Stored::Repaired)
        );
        assert_eq!(store.get(&sha).await.unwrap(), data);
        std::fs::write(&path, &bad).unwrap();
        assert_eq!(
            store.put(data.clone()).await.unwrap(),
            (sha.clone(), Stored::Repaired),
            "same size, different bytes"
        );
        assert_eq!(store.get(&sha).await.unwrap(), data);
    }

    #[tokio::test]
    async fn listing_and_removing_honour_the_cutoff_and_renewals() {
        use std::time::{Duration, SystemTime};
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path().to_path_buf()).unwrap();
        let (a, _) = store.put(Bytes::from_static(b"aaaa")).await.unwrap();
        let (b, _) = store.put(Bytes::from_static(b"bbbbbb")).await.unwrap();
        std::fs::write(dir.path().join(&a[..2]).join(".tmpjunk"), b"x").unwrap();
        let mut listed = store.list().await.unwrap();
        listed.sort_by_key(|i| i.size);
        assert_eq!(
            listed
                .iter()
                .map(|i| (i.sha256.as_str(), i.size))
                .collect::<Vec<_>>(),
            vec![(a.as_str(), 4), (b.as_str(), 6)]
        );
        let hour_ago = SystemTime::now() - Duration::from_secs(3600);
        for sha in [&a, &b] {
            std::fs::File::options()
                .append(true)
                .open(store.path_of(sha))
                .unwrap()
                .set_modified(hour_ago)
                .unwrap();
        }
        let cutoff = SystemTime::now() - Duration::from_secs(60);
        // Storing `a` again renews it: a collection running meanwhile keeps it.
        assert_eq!(
            store.put(Bytes::from_static(b"aaaa")).await.unwrap().1,
            Stored::Existing
        );
        assert_eq!(
            store.remove_if_unused_since(&a, cutoff).await.unwrap(),
            None
        );
        assert_eq!(
            store.remove_if_unused_since(&b, cutoff).await.unwrap(),
            Some(6)
        );
        assert_eq!(
            store.remove_if_unused_since(&b, cutoff).await.unwrap(),
            None
        );
        assert!(store.get(&a).await.is_ok());
        assert!(matches!(store.get(&b).await, Err(BlobError::NotFound(_))));
    }

    #[tokio::test]
    async fn the_local_store_behaves_as_every_store_does() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path().join("blobs")).unwrap();
        let root = store.dir().to_path_buf();
        let tamper = move |sha: String, bytes: Vec<u8>| {
            let path = root.join(&sha[..2]).join(format!("{sha}.zip"));
            Box::pin(async move { std::fs::write(path, bytes).unwrap() })
                as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        };
        crate::conformance::check(&store, &tamper).await;
    }

    #[tokio::test]
    async fn ping_fails_when_the_directory_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path().join("b")).unwrap();
        store.ping().await.unwrap();
        std::fs::remove_dir(dir.path().join("b")).unwrap();
        assert!(store.ping().await.is_err());
    }
}
