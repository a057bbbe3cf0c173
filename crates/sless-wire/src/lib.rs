//! The client side of HTTP/1.1 as sless speaks it on its hot paths: a keep-alive
//! connection that writes a request prepared as bytes and reads the response framed by
//! its `Content-Length`.
//!
//! Two users share it: the executor, whose every invocation is one request to an
//! instance over its Unix socket (docs/instance-protocol.md), and the benchmark's load
//! generator, which shares the machine's cores with what it measures. Both talk only to
//! peers that answer with a `Content-Length` (the shims, the gateway, the baselines), so
//! a general client's machinery — a task per connection, a channel per request, header
//! maps, body streams — is cost without use there. A response without a
//! `Content-Length` (chunked, or delimited by closing) is an error, never a guess.
//!
//! Headers are parsed with `httparse`, the parser hyper itself uses.

use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

/// Most response headers read.
const MAX_HEADERS: usize = 64;
/// Largest response head accepted, in bytes.
const MAX_HEAD: usize = 64 * 1024;
/// Largest response body accepted. Instances are sandboxed user code: a declared length is
/// not trusted with the server's memory.
pub const MAX_RESPONSE_BODY: usize = 256 * 1024 * 1024;
/// Most buffer space reserved ahead of a body's bytes arriving.
const RESERVE_STEP: usize = 4 * 1024 * 1024;
/// Bodies up to this size are copied behind the head so the request is one write.
const COALESCE_BODY: usize = 16 * 1024;

/// Why an exchange failed. After any error the connection must not be reused.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("cannot send the request ({0})")]
    Send(std::io::Error),
    #[error("cannot read the response ({0})")]
    Read(std::io::Error),
    #[error("the connection closed before the whole response arrived")]
    Closed,
    #[error("malformed response: {0}")]
    Malformed(String),
    #[error("invalid header {0}: it holds a control character")]
    InvalidHeader(String),
}

/// One response: its status and whole body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Bytes,
}

/// A request head being written: `METHOD path HTTP/1.1`, then headers, then (by
/// [`RequestHead::finish`]) `Content-Length` and the blank line.
pub struct RequestHead {
    bytes: Vec<u8>,
}

impl RequestHead {
    /// Starts a head. `method` and `path` are the caller's constants.
    pub fn new(method: &str, path: &str) -> RequestHead {
        let mut bytes = Vec::with_capacity(256);
        bytes.extend_from_slice(method.as_bytes());
        bytes.push(b' ');
        bytes.extend_from_slice(path.as_bytes());
        bytes.extend_from_slice(b" HTTP/1.1\r\n");
        RequestHead { bytes }
    }

    /// Adds a header. A value with a control character (CR, LF, ...) would let it write
    /// other headers or another request, so it is refused, naming the header.
    pub fn header(mut self, name: &str, value: &str) -> Result<RequestHead, WireError> {
        if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(WireError::InvalidHeader(name.to_string()));
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.extend_from_slice(b": ");
        self.bytes.extend_from_slice(value.as_bytes());
        self.bytes.extend_from_slice(b"\r\n");
        Ok(self)
    }

    /// The whole head for a body of `body_len` bytes.
    pub fn finish(mut self, body_len: usize) -> Vec<u8> {
        self.bytes.extend_from_slice(b"content-length: ");
        self.bytes
            .extend_from_slice(body_len.to_string().as_bytes());
        self.bytes.extend_from_slice(b"\r\n\r\n");
        self.bytes
    }
}

/// One keep-alive connection. Requests go one at a time, each answered before the next.
pub struct Conn<S> {
    stream: S,
    buf: BytesMut,
    /// The request being written, head and (small) body together; reused.
    out: Vec<u8>,
    /// The peer said `Connection: close`, or the connection failed.
    closing: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    pub fn new(stream: S) -> Conn<S> {
        Conn {
            stream,
            buf: BytesMut::with_capacity(8 * 1024),
            out: Vec::new(),
            closing: false,
        }
    }

    /// False once the peer asked to close or an exchange failed.
    pub fn reusable(&self) -> bool {
        !self.closing
    }

    /// Sends a request (`head` from [`RequestHead::finish`], then `body`) and reads its
    /// response. On error the connection is marked not reusable.
    pub async fn exchange(&mut self, head: &[u8], body: &[u8]) -> Result<Response, WireError> {
        let result = self.exchange_inner(head, body).await;
        if result.is_err() {
            self.closing = true;
        }
        result
    }

    async fn exchange_inner(&mut self, head: &[u8], body: &[u8]) -> Result<Response, WireError> {
        if !self.buf.is_empty() {
            return Err(WireError::Malformed(
                "the peer sent bytes nobody asked for".into(),
            ));
        }
        if body.len() <= COALESCE_BODY {
            self.out.clear();
            self.out.extend_from_slice(head);
            self.out.extend_from_slice(body);
            self.stream
                .write_all(&self.out)
                .await
                .map_err(WireError::Send)?;
        } else {
            self.stream.write_all(head).await.map_err(WireError::Send)?;
            self.stream.write_all(body).await.map_err(WireError::Send)?;
        }
        loop {
            if let Some(response) = take_response(&mut self.buf, &mut self.closing)? {
                return Ok(response);
            }
            let read = self
                .stream
                .read_buf(&mut self.buf)
                .await
                .map_err(WireError::Read)?;
            if read == 0 {
                return Err(WireError::Closed);
            }
        }
    }
}

impl Conn<UnixStream> {
    /// True when an idle connection was closed (or written to) by its peer meanwhile.
    /// Starts from the readiness the runtime already knows, so it costs at most one
    /// non-blocking read.
    pub fn peer_gone(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        match self.stream.poll_read_ready(&mut cx) {
            Poll::Pending => false,
            Poll::Ready(Err(_)) => true,
            // Readable while idle: the end of the stream, or bytes nobody asked for.
            Poll::Ready(Ok(())) => {
                let mut byte = [0u8; 1];
                !matches!(self.stream.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            }
        }
    }
}

/// Takes the next complete response out of `buf` once all of it has arrived; notes a
/// `Connection: close` in `closing`. Interim (1xx) responses are skipped.
pub fn take_response(
    buf: &mut BytesMut,
    closing: &mut bool,
) -> Result<Option<Response>, WireError> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        let head_len = match response.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(WireError::Malformed("response head too large".into()));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(WireError::Malformed(e.to_string())),
        };
        let status = response.code.unwrap_or(0);
        let mut length = None;
        for h in response.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let text = std::str::from_utf8(h.value).unwrap_or("");
                let n = text.trim().parse::<usize>().map_err(|_| {
                    WireError::Malformed(format!("invalid Content-Length {text:?}"))
                })?;
                if length.is_some_and(|m| m != n) {
                    return Err(WireError::Malformed(
                        "conflicting Content-Length headers".into(),
                    ));
                }
                length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(WireError::Malformed(
                    "a chunked response (the peer must send Content-Length)".into(),
                ));
            } else if h.name.eq_ignore_ascii_case("connection")
                && h.value.eq_ignore_ascii_case(b"close")
            {
                *closing = true;
            }
        }
        let length = match (length, status) {
            (Some(n), _) => n,
            (None, 100..=199 | 204 | 304) => 0,
            (None, _) => {
                return Err(WireError::Malformed(format!(
                    "status {status} came without a Content-Length"
                )));
            }
        };
        if length > MAX_RESPONSE_BODY {
            return Err(WireError::Malformed(format!(
                "a response body of {length} bytes is over the limit of {MAX_RESPONSE_BODY}"
            )));
        }
        if buf.len() < head_len + length {
            // Room for more of it, so a large body is not read in many small pieces.
            buf.reserve((head_len + length - buf.len()).min(RESERVE_STEP));
            return Ok(None);
        }
        buf.advance(head_len);
        let body = buf.split_to(length).freeze();
        if (100..200).contains(&status) {
            continue;
        }
        return Ok(Some(Response { status, body }));
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::UnixListener;

    use super::*;

    const OK_HELLO: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";

    #[test]
    fn a_response_is_taken_only_once_all_of_it_has_arrived() {
        for cut in 0..OK_HELLO.len() {
            let mut buf = BytesMut::from(&OK_HELLO[..cut]);
            let mut closing = false;
            assert!(
                take_response(&mut buf, &mut closing).unwrap().is_none(),
                "cut at {cut}"
            );
            buf.extend_from_slice(&OK_HELLO[cut..]);
            buf.extend_from_slice(b"HTTP/1.1");
            let answer = take_response(&mut buf, &mut closing).unwrap().unwrap();
            assert_eq!((answer.status, &answer.body[..]), (200, &b"hello"[..]));
            assert_eq!(
                &buf[..],
                b"HTTP/1.1",
                "the next response stays in the buffer"
            );
            assert!(!closing);
        }
    }

    #[test]
    fn interim_answers_are_skipped_and_unframed_bodies_refused() {
        let mut closing = false;
        let mut buf =
            BytesMut::from(&b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"[..]);
        let answer = take_response(&mut buf, &mut closing).unwrap().unwrap();
        assert_eq!((answer.status, answer.body.len()), (204, 0));
        for bad in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 3\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"garbage\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999\r\n\r\n",
        ] {
            let mut buf = BytesMut::from(bad);
            let err = take_response(&mut buf, &mut closing).unwrap_err();
            assert!(matches!(err, WireError::Malformed(_)), "{err}");
        }
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 503 Busy\r\ncontent-length: 0\r\nConnection: close\r\n\r\n"[..],
        );
        let answer = take_response(&mut buf, &mut closing).unwrap().unwrap();
        assert_eq!(answer.status, 503);
        assert!(closing, "Connection: close is noted");
    }

    #[test]
    fn heads_are_written_whole_and_refuse_injected_lines() {
        let head = RequestHead::new("POST", "/_sless/invoke")
            .header("x-sless-request-id", "abc")
            .unwrap()
            .finish(7);
        assert_eq!(
            head,
            b"POST /_sless/invoke HTTP/1.1\r\nx-sless-request-id: abc\r\ncontent-length: 7\r\n\r\n"
        );
        let err = RequestHead::new("POST", "/")
            .header("x-sless-request-id", "a\r\nx-evil: 1")
            .err()
            .unwrap();
        assert!(err.to_string().contains("x-sless-request-id"), "{err}");
    }

    /// A peer that answers each request it reads with the next answer, then closes.
    async fn peer(
        answers: Vec<&'static [u8]>,
    ) -> (Conn<UnixStream>, tokio::task::JoinHandle<Vec<u8>>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let _dir = dir;
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            for answer in answers {
                let mut request = [0u8; 64 * 1024];
                let n = s.read(&mut request).await.unwrap();
                seen.extend_from_slice(&request[..n]);
                s.write_all(answer).await.unwrap();
            }
            seen
        });
        let conn = Conn::new(UnixStream::connect(&path).await.unwrap());
        (conn, server)
    }

    #[tokio::test]
    async fn requests_and_responses_round_trip_and_a_close_is_noticed() {
        let (mut conn, server) = peer(vec![
            OK_HELLO,
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\ncut",
        ])
        .await;
        let head = RequestHead::new("POST", "/x").finish(2);
        let answer = conn.exchange(&head, b"{}").await.unwrap();
        assert_eq!((answer.status, &answer.body[..]), (200, &b"hello"[..]));
        assert!(conn.reusable());
        let err = conn
            .exchange(&RequestHead::new("GET", "/y").finish(0), b"")
            .await
            .unwrap_err();
        assert!(matches!(err, WireError::Closed), "{err}");
        assert!(!conn.reusable());
        let seen = server.await.unwrap();
        assert!(seen.starts_with(b"POST /x HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}GET /y"));
    }

    #[tokio::test]
    async fn an_idle_connection_knows_when_its_peer_went_away() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (close_tx, close_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = s.read(&mut request).await.unwrap();
            s.write_all(OK_HELLO).await.unwrap();
            let _ = close_rx.await;
        });
        let mut conn = Conn::new(UnixStream::connect(&path).await.unwrap());
        conn.exchange(&RequestHead::new("GET", "/").finish(0), b"")
            .await
            .unwrap();
        assert!(!conn.peer_gone(), "an open idle connection is usable");
        drop(close_tx);
        // The runtime learns of the close from epoll on one of its next turns.
        let mut gone = false;
        for _ in 0..10_000 {
            tokio::task::yield_now().await;
            if conn.peer_gone() {
                gone = true;
                break;
            }
        }
        assert!(gone, "a closed idle connection is noticed");
    }
}
