//! What a reconcile pass ends with ([`Action`]), why it can fail
//! ([`ReconcileError`]) and what happens next when it does ([`error_policy`]):
//! trouble that passes (the store, the blob store's disk, the build sandbox, a
//! cancelled deploy) is retried with back-off; a fault in what the owner stored
//! (missing or corrupt code, an invalid spec, code that does not build or start)
//! is reported once as `Failed` and not retried until something changes.

use std::time::Duration;

use sless_blob::BlobError;
use sless_build::BuildError;
use sless_core::Backoff;
use sless_store::StoreError;

/// What to do after a reconcile pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The function's running state matches its record; nothing to do until it
    /// is enqueued again.
    Done,
    /// Look again after this long (zero: at once), even if nothing is enqueued.
    RequeueAfter(Duration),
}

/// Retries of transient failures: 500 ms doubling to 30 s, jittered.
pub const RECONCILE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

/// Why a reconcile pass did not finish. [`ReconcileError::is_permanent`] tells
/// the two kinds apart; the `Display` of a permanent one is what the owner reads
/// in the function's status.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The metadata store failed. Transient, except a record that cannot be
    /// decoded or a stored spec that is invalid.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The code store could not be read (disk trouble); transient.
    #[error("code archive {sha256}: {source}")]
    Blob {
        sha256: String,
        #[source]
        source: BlobError,
    },
    /// The function's code archive is not stored (or its key is not a sha256);
    /// permanent until the code is uploaded again.
    #[error("the stored code archive {0} is missing; upload the code again to repair it")]
    CodeMissing(String),
    /// The function's code archive no longer hashes to its name and was removed;
    /// permanent until the code is uploaded again.
    #[error(
        "the stored code archive {0} is corrupt (its bytes no longer match its sha256); upload the code again to repair it"
    )]
    CodeCorrupt(String),
    /// The owner's code does not build (or the build timed out, or the runtime
    /// cannot be built here); permanent. The message ends with the build output.
    #[error("{0}")]
    BuildFailed(String),
    /// The build failed for reasons of the server (sandbox, disk); transient.
    /// The details go to the server log, never to the owner.
    #[error("build: {0}")]
    BuildServer(#[source] BuildError),
    /// An instance of the new revision did not become ready (the owner's code
    /// fails to load); permanent. The old revision, if any, keeps serving.
    #[error("revision {revision} could not start: {message}")]
    StartFailed { revision: u64, message: String },
    /// The deploy was cancelled (the function was removed or the executor is
    /// stopping meanwhile); transient: the next pass sees which.
    #[error("revision {0}: the deployment was cancelled")]
    DeployCancelled(u64),
    /// A secret reference cannot be resolved (the secret or key is gone, or does not
    /// open with this server's key); permanent until the secret or the spec changes.
    /// The message names the variable or secret, never a value.
    #[error("{0}")]
    Secret(String),
}

impl ReconcileError {
    /// `true`: retrying cannot help until the owner changes something (a new
    /// revision, an upload of the code); the function is marked `Failed`.
    pub fn is_permanent(&self) -> bool {
        match self {
            ReconcileError::Store(e) => {
                matches!(e, StoreError::Corrupt(_) | StoreError::Invalid(_))
            }
            ReconcileError::CodeMissing(_)
            | ReconcileError::CodeCorrupt(_)
            | ReconcileError::BuildFailed(_)
            | ReconcileError::Secret(_)
            | ReconcileError::StartFailed { .. } => true,
            ReconcileError::Blob { .. }
            | ReconcileError::BuildServer(_)
            | ReconcileError::DeployCancelled(_) => false,
        }
    }
}

/// What follows a failed pass, the `retries`-th in a row (1 for the first):
/// a permanent error stops ([`Action::Done`]; the pass has already recorded it
/// as the function's status), a transient one is retried after
/// [`RECONCILE_BACKOFF`]'s jittered delay.
pub fn error_policy(error: &ReconcileError, retries: u32) -> Action {
    if error.is_permanent() {
        Action::Done
    } else {
        Action::RequeueAfter(RECONCILE_BACKOFF.jittered(retries.max(1), rand::random::<f64>()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> std::io::Error {
        std::io::Error::other("disk on fire")
    }

    #[test]
    fn faults_of_the_stored_function_stop_and_server_trouble_retries() {
        let permanent = [
            ReconcileError::CodeMissing("ab".into()),
            ReconcileError::CodeCorrupt("ab".into()),
            ReconcileError::BuildFailed("SyntaxError".into()),
            ReconcileError::StartFailed {
                revision: 3,
                message: "ImportError".into(),
            },
            ReconcileError::Store(StoreError::Corrupt(
                serde_json::from_str::<u8>("x").expect_err("not a number"),
            )),
        ];
        for e in &permanent {
            assert_eq!(error_policy(e, 1), Action::Done, "{e}");
            assert_eq!(error_policy(e, 7), Action::Done, "{e}");
        }
        let transient = [
            ReconcileError::Store(StoreError::Database(sqlx::Error::PoolTimedOut)),
            ReconcileError::Blob {
                sha256: "ab".into(),
                source: BlobError::Io {
                    context: "reading".into(),
                    source: io(),
                },
            },
            ReconcileError::BuildServer(BuildError::Io {
                context: "creating a build directory".into(),
                source: io(),
            }),
            ReconcileError::DeployCancelled(3),
        ];
        for e in &transient {
            assert!(matches!(error_policy(e, 1), Action::RequeueAfter(_)), "{e}");
        }
    }

    #[test]
    fn transient_retries_back_off_from_half_a_second_to_thirty() {
        let e = ReconcileError::DeployCancelled(1);
        let delay = |retries| match error_policy(&e, retries) {
            Action::RequeueAfter(d) => d,
            Action::Done => panic!("a transient error must be retried"),
        };
        for (retries, full) in [(1, 500), (2, 1000), (3, 2000), (7, 30_000), (40, 30_000)] {
            let full = Duration::from_millis(full);
            let d = delay(retries);
            assert!(d >= full / 2 && d <= full, "retry {retries}: {d:?}");
        }
    }

    #[test]
    fn permanent_messages_say_what_the_owner_must_do() {
        let sha = "0".repeat(64);
        assert_eq!(
            ReconcileError::CodeMissing(sha.clone()).to_string(),
            format!("the stored code archive {sha} is missing; upload the code again to repair it")
        );
        assert!(
            ReconcileError::CodeCorrupt(sha).to_string().contains(
                "is corrupt (its bytes no longer match its sha256); upload the code again"
            )
        );
        assert_eq!(
            ReconcileError::StartFailed {
                revision: 4,
                message: "ImportError: no module named x".into()
            }
            .to_string(),
            "revision 4 could not start: ImportError: no module named x"
        );
    }
}
