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
    db_path: PathBuf,
    /// Device and inode of the database file when the server opened it.
    db_id: Option<(u64, u64)>,
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
    /// Remembers which file `db_path` is now; `min_free` bytes must stay free in `data_dir`.
    pub fn new(data_dir: PathBuf, db_path: PathBuf, min_free: u64) -> Storage {
        let db_id = std::fs::metadata(&db_path).ok().map(|m| (m.dev(), m.ino()));
        Storage {
            data_dir,
            db_path,
            db_id,
            min_free,
        }
    }

    /// The first problem found, if any (a `stat` and a `statvfs`: cheap enough per write).
    pub fn problem(&self) -> Option<StorageProblem> {
        if let Some(id) = self.db_id {
            let now = std::fs::metadata(&self.db_path)
                .ok()
                .map(|m| (m.dev(), m.ino()));
            if now != Some(id) {
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

/// Refuses API writes (other than deletes, which free space, and invokes, which
/// store nothing the caller waits for) while the data directory is unhealthy:
/// a write that cannot last must not answer `201`.
pub async fn guard_writes(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let writes = matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH)
        && !req.uri().path().ends_with("/invoke");
    if writes && let Some(problem) = s.storage.problem() {
        tracing::warn!(%problem, "refusing a write");
        return ApiError::from(problem).into_response();
    }
    next.run(req).await
}
