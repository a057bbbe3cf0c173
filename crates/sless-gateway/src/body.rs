//! Reading request bodies under a size limit.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use http_body_util::BodyExt;
use std::time::Duration;

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
    /// The client sent nothing of the body for longer than the body timeout.
    #[error("the request body stopped arriving (nothing for {0} s)")]
    TimedOut(u64),
    /// The connection failed or the body was malformed.
    #[error("could not read the request body")]
    Unreadable,
}

/// Reads a whole body of at most `limit` bytes, giving up when no part of it
/// arrives for `idle` (a client holding a request open costs a connection).
pub async fn read_body(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
    idle: Duration,
) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared.filter(|n| *n > limit as u64) {
        if declared <= limit as u64 + DRAIN_LIMIT {
            drain(body, idle).await;
        }
        return Err(BodyError::TooLarge(limit));
    }
    // Most bodies come in one frame: that one is returned as it is, without a copy.
    let mut single: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut len = 0usize;
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(BodyError::TimedOut(idle.as_secs())),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(BodyError::Unreadable),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        len += data.len();
        if len > limit {
            return Err(BodyError::TooLarge(limit));
        }
        if single.is_none() && joined.is_empty() {
            single = Some(data);
        } else {
            if let Some(first) = single.take() {
                joined.extend_from_slice(&first);
            }
            joined.extend_from_slice(&data);
        }
    }
    Ok(single.unwrap_or_else(|| Bytes::from(joined)))
}

async fn drain(mut body: Body, idle: Duration) {
    let mut seen = 0u64;
    while let Ok(Some(Ok(frame))) = tokio::time::timeout(idle, body.frame()).await {
        seen += frame.data_ref().map_or(0, |d| d.len() as u64);
        if seen > DRAIN_LIMIT * 2 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    /// A body that sends `first` and then nothing, without ending.
    fn stalled(first: &'static [u8]) -> Body {
        let stream =
            futures::stream::once(
                async move { Ok::<_, std::io::Error>(Bytes::from_static(first)) },
            )
            .chain(futures::stream::pending());
        Body::from_stream(stream)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_times_out() {
        let idle = Duration::from_secs(30);
        let started = tokio::time::Instant::now();
        let r = read_body(&HeaderMap::new(), stalled(b"{\"a\":"), 1024, idle).await;
        assert!(matches!(r, Err(BodyError::TimedOut(30))), "{r:?}");
        assert_eq!(started.elapsed(), idle);
    }

    #[tokio::test(start_paused = true)]
    async fn an_oversized_declared_body_is_not_drained_forever() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, "2048".parse().unwrap());
        let r = read_body(&headers, stalled(b"x"), 1024, Duration::from_secs(5)).await;
        assert!(matches!(r, Err(BodyError::TooLarge(1024))), "{r:?}");
    }

    #[tokio::test]
    async fn bodies_in_many_frames_are_joined_and_limited() {
        let frames = futures::stream::iter(
            ["ab", "cd", "ef"].map(|s| Ok::<_, std::io::Error>(Bytes::from_static(s.as_bytes()))),
        );
        let idle = Duration::from_secs(5);
        let body = read_body(&HeaderMap::new(), Body::from_stream(frames), 6, idle)
            .await
            .unwrap();
        assert_eq!(&body[..], b"abcdef");
        let frames = futures::stream::iter(
            ["ab", "cd", "ef"].map(|s| Ok::<_, std::io::Error>(Bytes::from_static(s.as_bytes()))),
        );
        let r = read_body(&HeaderMap::new(), Body::from_stream(frames), 5, idle).await;
        assert!(matches!(r, Err(BodyError::TooLarge(5))));
    }
}
