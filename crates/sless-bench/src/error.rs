//! The bench's error type: what went wrong, with the measurement or process it concerns.

use std::path::PathBuf;
use std::time::Duration;

/// Everything a benchmark run can fail with.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A program the bench needs (python, node, bwrap, the sless binary) is not there.
    #[error("{what} not found at {}: {hint}", path.display())]
    MissingTool {
        /// What the program is for, e.g. `Python interpreter`.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// How to get it or point the bench elsewhere.
        hint: &'static str,
    },
    /// The command line asked for something the bench does not know.
    #[error("{0}")]
    Usage(String),
    /// A child process (server, baseline, interpreter) could not be started.
    #[error("cannot start {what}")]
    Spawn {
        /// The process, e.g. `sless serve`.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A child process exited or never became usable.
    #[error("{what}: {reason}{}", tail_suffix(log_tail))]
    ProcessFailed {
        /// The process, e.g. `sless serve`.
        what: String,
        /// What was observed (exit status, timeout).
        reason: String,
        /// The last lines of its output, when it has any.
        log_tail: String,
    },
    /// A file-system or socket operation of the bench itself failed.
    #[error("{what}")]
    Io {
        /// The operation, e.g. `write the handler to /tmp/...`.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A call to the sless API failed.
    #[error("API call failed: {during}")]
    Api {
        /// The step, e.g. `create function cold-py`.
        during: String,
        /// The client's error, which carries the server's own message (boxed: it is large,
        /// and every other result of the bench would pay for its size).
        #[source]
        source: Box<sless_client::ClientError>,
    },
    /// A function did not become `Ready` (it failed to build or start).
    #[error("function {name} did not become Ready for revision {revision}: {message}")]
    NotReady {
        /// The function's name.
        name: String,
        /// The revision waited for.
        revision: u64,
        /// The status message the server gave.
        message: String,
    },
    /// Something the bench waits for did not happen in time.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long the bench waited.
        waited: Duration,
    },
    /// The load generator could not connect to its target.
    #[error("cannot connect to {endpoint}")]
    Connect {
        /// The target, `unix:/path` or `tcp:host:port`.
        endpoint: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An HTTP exchange failed below the status line (connection reset, protocol error).
    #[error("HTTP exchange with {endpoint} failed")]
    Http {
        /// The target, `unix:/path` or `tcp:host:port`.
        endpoint: String,
        /// What went wrong on the wire.
        #[source]
        source: sless_wire::WireError,
    },
    /// A response was not the one a measurement relies on (status, body).
    #[error("{what}: unexpected response {status}: {body}")]
    BadResponse {
        /// The request, e.g. `first request to cold-py`.
        what: String,
        /// Its status code.
        status: u16,
        /// The start of its body.
        body: String,
    },
    /// Too many requests failed under load for the figure to mean anything.
    #[error(
        "{what}: {errors} of {attempts} requests failed under load (first failure: {first_failure})"
    )]
    LoadErrors {
        /// The load run, e.g. `gateway`.
        what: String,
        /// How many requests failed.
        errors: u64,
        /// How many requests were attempted.
        attempts: u64,
        /// The first failure seen.
        first_failure: String,
    },
    /// The platform did not end up in the state a measurement needs (e.g. no instance socket).
    #[error("{0}")]
    Setup(String),
    /// The run was stopped by a signal; everything started was stopped.
    #[error("interrupted by {0}")]
    Interrupted(&'static str),
}

fn tail_suffix(tail: &str) -> String {
    if tail.trim().is_empty() {
        String::new()
    } else {
        format!("\n--- last output ---\n{}", tail.trim_end())
    }
}

/// Result of every bench step.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Builds a [`BenchError::Io`] from a description of the operation.
pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Io { what, source }
}

/// Builds a [`BenchError::Api`] from a description of the step.
pub fn api(during: impl Into<String>) -> impl FnOnce(sless_client::ClientError) -> BenchError {
    let during = during.into();
    move |source| BenchError::Api {
        during,
        source: Box::new(source),
    }
}
