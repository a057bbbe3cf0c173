//! The load loop's side of HTTP/1.1: one keep-alive connection that writes a request
//! prepared once as bytes and reads responses framed by `Content-Length`.
//!
//! The generator shares two cores with what it measures, so every microsecond it spends
//! per request is taken from the server under test. Like `wrk`, it therefore does no more
//! than a closed loop needs: no per-request request building, no connection task, no
//! header map. Everything the bench measures answers with a `Content-Length`; a response
//! without one (chunked, or delimited by closing) is reported as an error, never guessed.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use crate::load::Endpoint;

/// Most response headers read; more is an error.
const MAX_HEADERS: usize = 64;
/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// One response, as far as the load loop cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: BytesMut,
}

/// One keep-alive HTTP/1.1 connection.
pub struct WireConn {
    stream: Stream,
    buf: BytesMut,
    /// The server said `Connection: close`: no more requests on this one.
    closing: bool,
}

impl WireConn {
    pub async fn connect(endpoint: &Endpoint) -> std::io::Result<WireConn> {
        let stream = match endpoint {
            Endpoint::Tcp(addr) => {
                let stream = TcpStream::connect(addr).await?;
                // Small request/response pairs: Nagle would add delayed-ACK stalls.
                stream.set_nodelay(true)?;
                Stream::Tcp(stream)
            }
            Endpoint::Unix(path) => Stream::Unix(UnixStream::connect(path).await?),
        };
        Ok(WireConn {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
            closing: false,
        })
    }

    /// False once the server asked to close the connection.
    pub fn reusable(&self) -> bool {
        !self.closing
    }

    /// Sends `request` (a whole request, head and body) and reads its response.
    pub async fn exchange(&mut self, request: &[u8]) -> Result<Answer, String> {
        match &mut self.stream {
            Stream::Tcp(s) => s.write_all(request).await,
            Stream::Unix(s) => s.write_all(request).await,
        }
        .map_err(|e| format!("cannot send the request: {e}"))?;
        loop {
            if let Some(answer) = take_response(&mut self.buf, &mut self.closing)? {
                return Ok(answer);
            }
            if self.buf.len() > MAX_HEAD + (1 << 26) {
                return Err("response too large".into());
            }
            let read = match &mut self.stream {
                Stream::Tcp(s) => s.read_buf(&mut self.buf).await,
                Stream::Unix(s) => s.read_buf(&mut self.buf).await,
            }
            .map_err(|e| format!("cannot read the response: {e}"))?;
            if read == 0 {
                self.closing = true;
                return Err("the server closed the connection before answering".into());
            }
        }
    }
}

/// Takes the next complete response out of `buf`, if it has all arrived; notes a
/// `Connection: close` in `closing`.
fn take_response(buf: &mut BytesMut, closing: &mut bool) -> Result<Option<Answer>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err("response head too large".into());
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("malformed response: {e}")),
    };
    let status = response.code.unwrap_or(0);
    let mut length = None;
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let text = std::str::from_utf8(h.value).unwrap_or("");
            length = Some(
                text.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("invalid Content-Length {text:?}"))?,
            );
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err("chunked responses are not supported by the load generator".into());
        } else if h.name.eq_ignore_ascii_case("connection")
            && h.value.eq_ignore_ascii_case(b"close")
        {
            *closing = true;
        }
    }
    let length = match (length, status) {
        (Some(n), _) => n,
        (None, 204 | 304) | (None, 100..=199) => 0,
        (None, _) => return Err(format!("status {status} came without a Content-Length")),
    };
    if buf.len() < head_len + length {
        return Ok(None);
    }
    buf.advance(head_len);
    let body = buf.split_to(length);
    if (100..200).contains(&status) {
        // An interim answer: the real one follows.
        return take_response(buf, closing);
    }
    Ok(Some(Answer { status, body }))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixListener;

    use super::*;

    const OK_HELLO: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";

    #[test]
    fn a_response_is_taken_only_once_all_of_it_has_arrived() {
        for cut in 0..OK_HELLO.len() {
            let mut buf = BytesMut::from(&OK_HELLO[..cut]);
            let mut closing = false;
            assert_eq!(
                take_response(&mut buf, &mut closing),
                Ok(None),
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
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"[..]);
        let err = take_response(&mut buf, &mut closing).unwrap_err();
        assert!(err.contains("chunked"), "{err}");
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\n"[..]);
        let err = take_response(&mut buf, &mut closing).unwrap_err();
        assert!(err.contains("without a Content-Length"), "{err}");
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 503 Busy\r\ncontent-length: 0\r\nConnection: close\r\n\r\n"[..],
        );
        let answer = take_response(&mut buf, &mut closing).unwrap().unwrap();
        assert_eq!(answer.status, 503);
        assert!(closing, "Connection: close is noted");
    }

    #[tokio::test]
    async fn a_close_before_the_whole_answer_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = s.read(&mut request).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")
                .await
                .unwrap();
        });
        let mut conn = WireConn::connect(&Endpoint::Unix(path)).await.unwrap();
        let err = conn.exchange(b"GET / HTTP/1.1\r\n\r\n").await.unwrap_err();
        assert!(err.contains("closed"), "{err}");
        assert!(!conn.reusable());
    }
}
