//! The blob store: uploaded code archives kept under the sha256 of their bytes.

use std::io::Write;
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

/// Where code archives live, addressed by the lowercase hex sha256 of their bytes.
#[async_trait::async_trait]
pub trait BlobStore: Send + Sync + 'static {
    /// Stores `bytes` and returns their sha256. Idempotent: storing the same bytes
    /// twice is cheap and returns the same key. Atomic: a reader never sees a
    /// partly written blob.
    async fn put(&self, bytes: Bytes) -> Result<String, BlobError>;
    /// The bytes stored under `sha256`, or [`BlobError::NotFound`].
    async fn get(&self, sha256: &str) -> Result<Bytes, BlobError>;
    /// Whether a blob is stored under `sha256`.
    async fn exists(&self, sha256: &str) -> Result<bool, BlobError>;
    /// Checks that the backend is usable (for `/readyz`).
    async fn ping(&self) -> Result<(), BlobError>;
}

/// The lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn check_key(sha256: &str) -> Result<(), BlobError> {
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
        Ok(LocalBlobStore { dir })
    }

    /// The directory this store keeps its blobs in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_of(&self, sha256: &str) -> PathBuf {
        self.dir.join(&sha256[..2]).join(format!("{sha256}.zip"))
    }
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
    async fn put(&self, bytes: Bytes) -> Result<String, BlobError> {
        let store = self.clone();
        blocking(move || {
            let sha = sha256_hex(&bytes);
            let path = store.path_of(&sha);
            if path.is_file() {
                return Ok(sha);
            }
            let fan_out = path.parent().unwrap_or(&store.dir).to_path_buf();
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&fan_out)
                .map_err(|e| BlobError::io(format!("creating {}", fan_out.display()), e))?;
            // A uniquely named temporary file in the same directory: concurrent
            // puts of the same bytes each write their own and the renames race
            // harmlessly, since both contents are identical.
            let mut tmp = tempfile::Builder::new()
                .prefix(".tmp")
                .tempfile_in(&fan_out)
                .map_err(|e| BlobError::io("creating a temporary file", e))?;
            tmp.write_all(&bytes)
                .and_then(|()| tmp.as_file().sync_all())
                .map_err(|e| BlobError::io(format!("writing blob {sha}"), e))?;
            tmp.persist(&path)
                .map_err(|e| BlobError::io(format!("renaming blob {sha} into place"), e.error))?;
            tracing::debug!(sha256 = %sha, size = bytes.len(), "stored blob");
            Ok(sha)
        })
        .await
    }

    async fn get(&self, sha256: &str) -> Result<Bytes, BlobError> {
        check_key(sha256)?;
        let path = self.path_of(sha256);
        match tokio::fs::read(&path).await {
            Ok(data) => Ok(Bytes::from(data)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(BlobError::NotFound(sha256.to_string()))
            }
            Err(e) => Err(BlobError::io(format!("reading blob {sha256}"), e)),
        }
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
        let sha = store.put(data.clone()).await.unwrap();
        assert_eq!(sha, sha256_hex(&data));
        assert!(root.join(&sha[..2]).join(format!("{sha}.zip")).is_file());
        assert_eq!(store.get(&sha).await.unwrap(), data);
        assert!(store.exists(&sha).await.unwrap());

        // Idempotent: the same bytes give the same key and one file.
        assert_eq!(store.put(data.clone()).await.unwrap(), sha);
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
                tokio::spawn(async move { store.put(data).await })
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
            sha
        );
        assert_eq!(
            store.get(&sha).await.unwrap(),
            Bytes::from_static(b"full contents")
        );
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
