//! `ApiError`: every failure of the REST API, mapped to the contract's status
//! codes and `{"error": {"code", "message"}}` body. A 5xx tells the client
//! nothing internal; the full error goes to the log.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sless_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Invalid input; the message names the field.
    #[error("{0}")]
    BadRequest(String),
    /// No or bad credentials.
    #[error("{0}")]
    Unauthorized(String),
    /// Authenticated, but not allowed to do this.
    #[error("{0}")]
    Forbidden(String),
    /// Not found, or not visible to the caller.
    #[error("{0}")]
    NotFound(String),
    /// Already exists, or the object is in a conflicting state.
    #[error("{0}")]
    Conflict(String),
    /// The body is over a configured limit.
    #[error("{0}")]
    TooLarge(String),
    /// The body's content type is not one this endpoint takes.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Over a namespace quota; the message names which.
    #[error("{0}")]
    QuotaExceeded(String),
    /// A dependency (store, object store) is unavailable.
    #[error("{0}")]
    Unavailable(String),
    /// The request's body stopped arriving.
    #[error("{0}")]
    Timeout(String),
    /// The disk is full: nothing can be stored.
    #[error("{0}")]
    InsufficientStorage(String),
    /// Too many failed attempts from this address; retry after that many seconds.
    #[error("{message}")]
    TooManyRequests { message: String, retry_after: u64 },
    /// `If-Match` names another version than the object's current one, which is at
    /// `generation` (sent back as the `ETag`); nothing was changed.
    #[error("{message}")]
    PreconditionFailed { message: String, generation: u64 },
    /// Other writers kept changing the object while this write was applied; nothing
    /// was changed and the client may retry at once (`503 busy`, `Retry-After: 1`).
    #[error("{0}")]
    Busy(String),
    /// Anything else: logged in full, answered as a bare 500.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    pub fn bad(message: impl Into<String>) -> Self {
        ApiError::BadRequest(message.into())
    }
    pub fn not_found(kind: &str, name: &str) -> Self {
        ApiError::NotFound(format!("{kind} {name:?} not found"))
    }

    /// The failure to read the function a trigger or job names (its `function`
    /// field): a missing one is the request's fault (`400` naming the field), any
    /// other error is the server's and maps as every store error does.
    pub fn named_function(e: StoreError, namespace: &str, function: &str) -> Self {
        match e {
            StoreError::NotFound { .. } => ApiError::bad(format!(
                "function: {function:?} does not exist in namespace {namespace}"
            )),
            other => other.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { kind, name } => ApiError::not_found(kind, &name),
            StoreError::Conflict { kind, name } => {
                ApiError::Conflict(format!("{kind} {name:?} already exists"))
            }
            e @ StoreError::PathTaken { .. } => ApiError::Conflict(e.to_string()),
            StoreError::NotEmpty(ns) => ApiError::Conflict(format!(
                "namespace {ns:?} still has functions: delete them first or use ?force=true"
            )),
            StoreError::Invalid(v) => ApiError::BadRequest(v.to_string()),
            StoreError::PreconditionFailed {
                kind,
                name,
                current,
            } => crate::etag::precondition_failed(kind, &name, current),
            StoreError::Contended { kind, name } => ApiError::Busy(format!(
                "{kind} {name:?} is being changed by others at the same time: nothing was changed; try again"
            )),
            StoreError::Rejected(e) => ApiError::from_rejection(e),
            e if e.is_storage_full() => {
                tracing::error!(error = %e, "the metadata store's disk is full");
                ApiError::InsufficientStorage(
                    "the disk holding the metadata store is full: nothing was stored".into(),
                )
            }
            e if e.is_store_gone() => {
                tracing::error!(error = %e, "the metadata store's file is gone");
                ApiError::Unavailable(
                    "the metadata store was removed while the server runs: nothing was stored"
                        .into(),
                )
            }
            other => ApiError::Internal(other.into()),
        }
    }
}

impl ApiError {
    /// The error an edit inside a store update refused the change with, back as the
    /// `ApiError` it was (or, for the other error types edits use, mapped as usual).
    fn from_rejection(e: Box<dyn std::error::Error + Send + Sync>) -> Self {
        let e = match e.downcast::<ApiError>() {
            Ok(api) => return *api,
            Err(e) => e,
        };
        let e = match e.downcast::<sless_core::ValidationError>() {
            Ok(invalid) => return (*invalid).into(),
            Err(e) => e,
        };
        match e.downcast::<StoreError>() {
            Ok(store) => (*store).into(),
            Err(e) => ApiError::Internal(anyhow::anyhow!(e)),
        }
    }

    /// Wraps `self` for an edit closure of a store update, which hands it back
    /// untouched ([`StoreError::Rejected`]); `From<StoreError>` unwraps it.
    pub(crate) fn reject(self) -> StoreError {
        StoreError::Rejected(Box::new(self))
    }
}

impl From<sless_blob::BlobError> for ApiError {
    fn from(e: sless_blob::BlobError) -> Self {
        match &e {
            sless_blob::BlobError::Io { source, .. }
                if source.kind() == std::io::ErrorKind::StorageFull =>
            {
                tracing::error!(error = %e, "the code store's disk is full");
                ApiError::InsufficientStorage(
                    "the disk holding the code store is full: the archive was not stored".into(),
                )
            }
            _ => ApiError::Internal(e.into()),
        }
    }
}

impl From<sless_core::patch::PatchError> for ApiError {
    /// A patch the client got wrong is `400` naming the field; one the server could
    /// not apply is its own fault.
    fn from(e: sless_core::patch::PatchError) -> Self {
        match e.into_validation() {
            Ok(invalid) => invalid.into(),
            Err(e) => ApiError::Internal(e.into()),
        }
    }
}

impl From<sless_core::ValidationError> for ApiError {
    fn from(e: sless_core::ValidationError) -> Self {
        ApiError::BadRequest(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "invalid"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::QuotaExceeded(_) => (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Timeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            ApiError::InsufficientStorage(_) => {
                (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage")
            }
            ApiError::TooManyRequests { retry_after, .. } => {
                let mut r = sless_gateway::error_response(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_requests",
                    &self.to_string(),
                );
                r.headers_mut()
                    .insert(axum::http::header::RETRY_AFTER, (*retry_after).into());
                return r;
            }
            ApiError::PreconditionFailed { generation, .. } => {
                let mut r = sless_gateway::error_response(
                    StatusCode::PRECONDITION_FAILED,
                    "precondition_failed",
                    &self.to_string(),
                );
                r.headers_mut()
                    .insert(axum::http::header::ETAG, crate::etag::etag(*generation));
                return r;
            }
            ApiError::Busy(_) => {
                let mut r = sless_gateway::error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "busy",
                    &self.to_string(),
                );
                r.headers_mut()
                    .insert(axum::http::header::RETRY_AFTER, 1.into());
                return r;
            }
            ApiError::Internal(e) => {
                tracing::error!(error = ?e, "internal error");
                return sless_gateway::error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                );
            }
        };
        sless_gateway::error_response(status, code, &self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stores_concurrency_errors_map_to_412_503_and_the_edits_own_error() {
        let stale: ApiError = StoreError::PreconditionFailed {
            kind: "trigger",
            name: "t".into(),
            current: 7,
        }
        .into();
        let r = stale.into_response();
        assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED);
        assert_eq!(r.headers()[axum::http::header::ETAG], "\"7\"");

        let busy: ApiError = StoreError::Contended {
            kind: "job",
            name: "j".into(),
        }
        .into();
        assert!(busy.to_string().contains("\"j\""), "{busy}");
        let r = busy.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], "1");

        let conflict: ApiError = ApiError::Conflict("path \"/x\" is taken".into())
            .reject()
            .into();
        assert!(
            matches!(&conflict, ApiError::Conflict(m) if m == "path \"/x\" is taken"),
            "{conflict:?}"
        );
        let invalid: ApiError =
            StoreError::Rejected(Box::new(sless_core::ValidationError::new("env", "bad"))).into();
        assert!(matches!(invalid, ApiError::BadRequest(_)), "{invalid:?}");
        let other: ApiError = StoreError::Rejected("something else".into()).into();
        assert!(matches!(other, ApiError::Internal(_)), "{other:?}");
    }

    async fn answer(e: ApiError) -> (StatusCode, String) {
        let r = e.into_response();
        let status = r.status();
        let body = axum::body::to_bytes(r.into_body(), 1 << 16)
            .await
            .expect("a small body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Only a missing function is the request's fault; a store failure is a 500
    /// that tells the client nothing of it.
    #[tokio::test]
    async fn a_named_function_is_missing_only_when_the_store_says_so() {
        let missing = StoreError::NotFound {
            kind: "function",
            name: "hello".into(),
        };
        assert_eq!(
            answer(ApiError::named_function(missing, "team", "hello")).await,
            (
                StatusCode::BAD_REQUEST,
                r#"{"error":{"code":"invalid","message":"function: \"hello\" does not exist in namespace team"}}"#
                    .to_string()
            )
        );
        let broken = StoreError::Corrupt(serde_json::from_str::<u8>("{").unwrap_err());
        assert_eq!(
            answer(ApiError::named_function(broken, "team", "hello")).await,
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                r#"{"error":{"code":"internal","message":"internal error"}}"#.to_string()
            )
        );
    }
}
