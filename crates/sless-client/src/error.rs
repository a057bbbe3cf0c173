//! The client's error type: API errors as the server stated them, transport and decode failures.

use std::time::Duration;

/// Everything a [`crate::Client`] call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with a non-success status. `code` and `message` come from the
    /// contract's `{"error": {"code", "message"}}` body; when the body has another shape
    /// (a proxy in between, say) `code` is `http_<status>` and `message` is the body text.
    #[error("{message} (HTTP {status} {code})")]
    Api {
        /// The HTTP status code.
        status: u16,
        /// The machine-readable error code, e.g. `not_found`.
        code: String,
        /// The human-readable message.
        message: String,
    },
    /// The request could not be sent or the response could not be read.
    #[error("request to {url} failed")]
    Http {
        /// The URL of the failed request (without credentials).
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with a success status but a body this client does not understand.
    #[error("cannot decode the response of {url}")]
    Decode {
        /// The URL whose response was undecodable.
        url: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The server address given to [`crate::Client::new`] is not a usable http(s) URL.
    #[error("invalid server URL {url:?}: {reason}")]
    InvalidUrl {
        /// The address as given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The CA certificate given to [`crate::Client::with_ca_cert`] cannot be used.
    #[error("the CA certificate cannot be used: {reason}")]
    InvalidCaCert {
        /// Why it was refused.
        reason: String,
    },
    /// [`crate::Client::wait_ready`] ran out of time before the revision settled.
    #[error(
        "function {namespace}/{name} did not reach Ready or Failed for revision {revision} within {}s (last phase: {last_phase})",
        waited.as_secs()
    )]
    WaitTimeout {
        /// Namespace of the function waited for.
        namespace: String,
        /// Name of the function waited for.
        name: String,
        /// The revision waited for.
        revision: u64,
        /// How long the client waited.
        waited: Duration,
        /// The phase seen at the last poll.
        last_phase: String,
    },
    /// [`crate::Client::wait_job`] ran out of time before the run reached a terminal phase.
    #[error(
        "job {namespace}/{name} run {run_id} did not finish within {}s (last phase: {last_phase})",
        waited.as_secs()
    )]
    JobWaitTimeout {
        /// Namespace of the job waited for.
        namespace: String,
        /// Name of the job waited for.
        name: String,
        /// The run waited for.
        run_id: u64,
        /// How long the client waited.
        waited: Duration,
        /// The phase seen at the last poll.
        last_phase: String,
    },
}

impl ClientError {
    /// True when the server's TLS certificate was refused: it does not chain to a
    /// trusted CA, names another host, or has expired.
    pub fn is_untrusted_certificate(&self) -> bool {
        let ClientError::Http { source, .. } = self else {
            return false;
        };
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(source);
        while let Some(err) = next {
            // An `io::Error`'s `source()` skips the error it wraps: look inside too.
            let inner = err
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .map(|e| e as &(dyn std::error::Error + 'static));
            for e in std::iter::once(err).chain(inner) {
                if let Some(rustls::Error::InvalidCertificate(_)) =
                    e.downcast_ref::<rustls::Error>()
                {
                    return true;
                }
                // The connector may pass rustls's error on as text only.
                if e.to_string().starts_with("invalid peer certificate") {
                    return true;
                }
            }
            next = err.source();
        }
        false
    }

    /// The HTTP status of an [`ClientError::Api`] error, `None` for every other kind.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// True when the server could not be reached at all (refused, unresolvable, timed out
    /// while connecting), as opposed to a failure after it answered.
    pub fn is_connect(&self) -> bool {
        matches!(self, ClientError::Http { source, .. } if source.is_connect())
    }

    /// The machine code of an [`ClientError::Api`] error.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Builds the API error for a non-success response from its status and raw body.
    pub fn from_response(status: u16, body: &[u8]) -> ClientError {
        let fallback_code = format!("http_{status}");
        match serde_json::from_slice::<sless_api_types::ErrorBody>(body) {
            Ok(sless_api_types::ErrorBody { error }) => ClientError::Api {
                status,
                code: if error.code.is_empty() {
                    fallback_code
                } else {
                    error.code
                },
                message: if error.message.is_empty() {
                    reason(status)
                } else {
                    error.message
                },
            },
            Err(_) => {
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                // A long HTML error page from a proxy helps nobody in a terminal; keep the start.
                let message = if text.is_empty() {
                    reason(status)
                } else if text.chars().count() > 300 {
                    format!("{}…", text.chars().take(300).collect::<String>())
                } else {
                    text.to_string()
                };
                ClientError::Api {
                    status,
                    code: fallback_code,
                    message,
                }
            }
        }
    }
}

/// The canonical reason phrase of `status`, used when the server sent no message.
fn reason(status: u16) -> String {
    reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("unexpected status")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_contract_shape() {
        let err = ClientError::from_response(
            404,
            br#"{"error":{"code":"not_found","message":"function default/x not found"}}"#,
        );
        assert_eq!(err.status(), Some(404));
        assert_eq!(err.code(), Some("not_found"));
        assert_eq!(
            err.to_string(),
            "function default/x not found (HTTP 404 not_found)"
        );
    }

    #[test]
    fn falls_back_to_body_text_and_reason() {
        let err = ClientError::from_response(502, b"Bad Gateway from proxy\n");
        assert_eq!(
            err.to_string(),
            "Bad Gateway from proxy (HTTP 502 http_502)"
        );
        let err = ClientError::from_response(503, b"");
        assert_eq!(err.to_string(), "Service Unavailable (HTTP 503 http_503)");
        let long = "x".repeat(1000);
        let err = ClientError::from_response(500, long.as_bytes());
        let ClientError::Api { message, .. } = err else {
            panic!("not an API error")
        };
        assert_eq!(message.chars().count(), 301);
    }
}
