//! Reading request bodies under a size limit.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use http_body_util::BodyExt;

/// How much of an oversized body is read and discarded before answering `413`.
/// Reading it lets the client finish sending and see the answer, instead of a
/// connection reset mid-upload; past this the connection is simply closed.
const DRAIN_LIMIT: u64 = 16 * 1024 * 1024;

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The body is larger than the limit.
    #[error("request body is larger than the limit of {0} bytes")]
    TooLarge(usize),
    /// The connection failed or the body was malformed.
    #[error("could not read the request body")]
    Unreadable,
}

/// Reads a whole body of at most `limit` bytes.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared.filter(|n| *n > limit as u64) {
        if declared <= limit as u64 + DRAIN_LIMIT {
            drain(body).await;
        }
        return Err(BodyError::TooLarge(limit));
    }
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(BodyError::TooLarge(limit))
        }
        Err(_) => Err(BodyError::Unreadable),
    }
}

async fn drain(mut body: Body) {
    let mut seen = 0u64;
    while let Some(Ok(frame)) = body.frame().await {
        seen += frame.data_ref().map_or(0, |d| d.len() as u64);
        if seen > DRAIN_LIMIT * 2 {
            break;
        }
    }
}
