//! The data directory's health as readiness and writes see it: the metadata
//! store's file must still be the one opened at start, and the disk must have room.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::{ApiError, AppState};

/// Checks the data directory.
#[derive(Debug)]
pub struct Storage {
    data_dir: PathBuf,
    db_path: Option<PathBuf>,
    /// The database file as the server opened it. Holding it open keeps its inode
    /// from being reused, so a file created later under the same name is told apart.
    db_file: Option<std::fs::File>,
    min_free: u64,
}

/// What is wrong with the data directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageProblem {
    /// The database file was deleted or replaced while serving.
    #[error(
        "the metadata store's file was removed or replaced while the server runs: nothing can be stored until it is restarted"
    )]
    StoreGone,
    /// Free space is below the configured minimum.
    #[error(
        "the server's disk is full ({free} bytes free, at least {min} needed): nothing can be stored"
    )]
    Full { free: u64, min: u64 },
}

impl Storage {
    /// Opens `db_path` (a SQLite store's file; `None` for a database elsewhere) to
    /// remember which file it is now; `min_free` bytes must stay free in `data_dir`.
    pub fn new(data_dir: PathBuf, db_path: Option<PathBuf>, min_free: u64) -> Storage {
        let db_file = db_path.as_ref().and_then(|p| std::fs::File::open(p).ok());
        Storage {
            data_dir,
            db_path,
            db_file,
            min_free,
        }
    }

    /// The first problem found, if any (two `stat`s and a `statvfs`: cheap enough per write).
    pub fn problem(&self) -> Option<StorageProblem> {
        if let (Some(file), Some(path)) = (&self.db_file, &self.db_path) {
            let same = match (file.metadata(), std::fs::metadata(path)) {
                (Ok(a), Ok(b)) => a.nlink() > 0 && (a.dev(), a.ino()) == (b.dev(), b.ino()),
                _ => false,
            };
            if !same {
                return Some(StorageProblem::StoreGone);
            }
        }
        if self.min_free > 0
            && let Ok(st) = nix::sys::statvfs::statvfs(&self.data_dir)
        {
            // The field types differ between platforms (u32 on some 32-bit ones).
            #[allow(clippy::unnecessary_cast)]
            let free = (st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64);
            if free < self.min_free {
                return Some(StorageProblem::Full {
                    free,
                    min: self.min_free,
                });
            }
        }
        None
    }
}

impl From<StorageProblem> for ApiError {
    fn from(p: StorageProblem) -> Self {
        match p {
            StorageProblem::StoreGone => ApiError::Unavailable(p.to_string()),
            StorageProblem::Full { .. } => ApiError::InsufficientStorage(p.to_string()),
        }
    }
}

/// `/v1/namespaces/{ns}/functions/{name}/invoke` (and not, say, a function named `invoke`).
fn is_invoke(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').collect();
    matches!(
        segments.as_slice(),
        ["", "v1", "namespaces", _, "functions", _, "invoke"]
    )
}

/// Refuses API writes (other than deletes, which free space, and invokes, which
/// store nothing the caller waits for) while the data directory is unhealthy:
/// a write that cannot last must not answer `201`.
pub async fn guard_writes(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let writes = matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH)
        && !is_invoke(req.uri().path());
    if writes && let Some(problem) = s.storage.problem() {
        tracing::warn!(%problem, "refusing a write");
        return ApiError::from(problem).into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_invoke_endpoint_is_exempt() {
        assert!(is_invoke("/v1/namespaces/a/functions/f/invoke"));
        assert!(!is_invoke("/v1/namespaces/a/functions/invoke"));
        assert!(!is_invoke("/v1/namespaces/a/jobs/invoke"));
        assert!(!is_invoke("/v1/namespaces/a/functions/f/code"));
    }

    #[test]
    fn a_replaced_database_file_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("sless.db");
        std::fs::write(&db, "a").unwrap();
        let storage = Storage::new(dir.path().to_path_buf(), Some(db.clone()), 0);
        assert_eq!(storage.problem(), None);
        std::fs::remove_file(&db).unwrap();
        assert_eq!(storage.problem(), Some(StorageProblem::StoreGone));
        std::fs::write(&db, "b").unwrap();
        assert_eq!(
            storage.problem(),
            Some(StorageProblem::StoreGone),
            "a new file is not the store"
        );
        let huge = Storage::new(dir.path().to_path_buf(), Some(db), u64::MAX);
        assert!(matches!(huge.problem(), Some(StorageProblem::Full { .. })));
    }
}
