//! The accept loop: HTTP/1.1 connections with a header/idle timeout, a bound on
//! open connections that makes room for a new one by closing the oldest idle
//! connection (so idle clients cannot lock out health checks or the API), and
//! accept errors (out of file descriptors) survived by backing off instead of
//! spinning or exiting; and the requests hyper refuses before any service sees
//! them answered in the contract's error shape (see [`EdgeIo`]).
//!
//! With TLS ([`crate::tls`]) each connection's handshake runs in its own task,
//! bounded by the header timeout, so a slow or failed handshake never holds up the
//! loop; a client speaking plain HTTP to the TLS port gets a plain `400` saying so.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use sless_gateway::FastPath;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How connections are bounded.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Connections open at once.
    pub max: usize,
    /// A connection idle between requests, or still sending a request's headers,
    /// this long is closed.
    pub header_timeout: Duration,
}

impl ConnLimits {
    /// Limits for a process allowed `nofile` open files: half of them for
    /// connections (the rest is for the store, logs and instances' sockets and
    /// pipes), at most 65,536.
    pub fn from_nofile(nofile: u64, max: Option<usize>, header_timeout: Duration) -> ConnLimits {
        let derived = (nofile / 2).clamp(16, 65_536) as usize;
        ConnLimits {
            max: max.unwrap_or(derived).max(1),
            header_timeout,
        }
    }
}

/// Raises the soft limit on open files to the hard limit, so the server is bounded
/// by what the administrator allows rather than the (often 1024) default.
/// Returns the soft limit in force afterwards.
pub fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                return hard;
            }
            soft
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-file limit; assuming 1024");
            1024
        }
    }
}

/// One open connection, as the limit sees it.
#[derive(Default)]
struct ConnState {
    /// Requests being handled now.
    busy: AtomicUsize,
    /// Requests handed to the service so far (see [`EdgeIo`]).
    calls: AtomicU64,
    /// Closes the connection to make room for a new one.
    evict: CancellationToken,
}

/// The open connections, oldest first (entries of closed ones are dropped lazily).
struct Open {
    max: usize,
    count: Arc<AtomicUsize>,
    queue: Mutex<VecDeque<Weak<ConnState>>>,
}

/// How many of the oldest connections are looked at for an idle one to close.
const EVICT_SCAN: usize = 64;

impl Open {
    /// Admits a new connection: under the limit at once; at the limit by closing
    /// the oldest connection that is not handling a request (idle between
    /// requests, or still sending headers). `None` when all of the oldest are busy.
    fn admit(&self) -> Option<(Arc<ConnState>, Slot)> {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if self.count.load(Ordering::Acquire) >= self.max {
            let mut evicted = false;
            for _ in 0..EVICT_SCAN.min(queue.len()) {
                let Some(weak) = queue.pop_front() else { break };
                let Some(conn) = weak.upgrade() else { continue };
                if conn.busy.load(Ordering::Acquire) == 0 && !conn.evict.is_cancelled() {
                    conn.evict.cancel();
                    evicted = true;
                    break;
                }
                queue.push_back(weak);
            }
            if !evicted {
                return None;
            }
        }
        // Entries of closed connections are dropped once they outnumber the open ones.
        if queue.len() > 2 * self.max.max(EVICT_SCAN) {
            queue.retain(|w| w.strong_count() > 0);
        }
        let conn = Arc::new(ConnState::default());
        queue.push_back(Arc::downgrade(&conn));
        self.count.fetch_add(1, Ordering::AcqRel);
        Some((conn, Slot(self.count.clone())))
    }
}

/// Counts one open connection until dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One connection's service: the app, plus the peer's address on requests that
/// carry credentials (failed authentication is limited per address). Other
/// requests, the invoke path's in particular, pay nothing for it but two
/// atomic counts that tell the limit the connection is busy.
#[derive(Clone)]
struct ConnService {
    app: FastPath,
    peer: SocketAddr,
    state: Arc<ConnState>,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = Busy<<FastPath as tower::Service<Request<Body>>>::Future>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let mut req = req.map(Body::new);
        if req.headers().contains_key(header::AUTHORIZATION) {
            req.extensions_mut().insert(ConnectInfo(self.peer));
        }
        self.state.busy.fetch_add(1, Ordering::AcqRel);
        self.state.calls.fetch_add(1, Ordering::Relaxed);
        Busy {
            inner: self.app.dispatch(req),
            state: self.state.clone(),
        }
    }
}

/// A request's future that marks its connection busy until it is done.
struct Busy<F> {
    inner: F,
    state: Arc<ConnState>,
}

impl<F: Future + Unpin> Future for Busy<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        Pin::new(&mut self.inner).poll(cx)
    }
}

impl<F> Drop for Busy<F> {
    fn drop(&mut self) {
        self.state.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `listener` (over TLS when `tls` is given) until `stop` turns true, then
/// waits for open connections to finish their requests (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: FastPath,
    limits: ConnLimits,
    tls: Option<Arc<crate::tls::Tls>>,
    mut stop: watch::Receiver<bool>,
) {
    let open = Open {
        max: limits.max,
        count: Arc::default(),
        queue: Mutex::default(),
    };
    let graceful = GracefulShutdown::new();
    let mut warned = Warned::default();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors (or kernel memory): the pending connection
                // stays in the backlog; retrying at once would spin. Anything else
                // concerns that one connection only.
                use nix::errno::Errno;
                let pressure = matches!(
                    e.raw_os_error().map(Errno::from_raw),
                    Some(Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM)
                );
                if pressure {
                    warned.warn(
                        || tracing::warn!(error = %e, "cannot accept connections: backing off"),
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let Some((state, slot)) = open.admit() else {
            // Every connection looked at is handling a request: closing the new one
            // at once frees its descriptor and the backlog.
            warned.warn(|| {
                tracing::warn!(
                    max = limits.max,
                    "connection limit reached with every connection busy: closing new connections"
                )
            });
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = ConnService {
            app: app.clone(),
            peer,
            state: state.clone(),
        };
        if let Some(tls) = &tls {
            let acceptor = tls.acceptor().clone();
            let watcher = graceful.watcher();
            let builder = builder.clone();
            let timeout = limits.header_timeout;
            tokio::spawn(async move {
                let serve = async {
                    let Some(stream) = handshake(&acceptor, stream, timeout).await else {
                        return;
                    };
                    let io = EdgeIo::new(stream, state.clone());
                    // Errors here are the client's, as below.
                    let _ = watcher
                        .watch(builder.serve_connection(TokioIo::new(io), service))
                        .await;
                };
                tokio::select! {
                    () = serve => {}
                    _ = state.evict.cancelled() => {}
                }
                drop(slot);
            });
            continue;
        }
        let io = EdgeIo::new(stream, state.clone());
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            // Errors here are the client's (a reset, a timeout, a malformed request).
            tokio::select! {
                _ = conn => {}
                _ = state.evict.cancelled() => {}
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The TLS handshake of one connection, bounded by the header timeout. A client
/// speaking plain HTTP is answered `400` in plain HTTP (it could read nothing else)
/// and closed; a failed or timed-out handshake just closes the connection.
async fn handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    mut stream: TcpStream,
    timeout: Duration,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let shake = async {
        let mut first = [0u8; 1];
        if stream.peek(&mut first).await.ok()? == 0 {
            return None;
        }
        if first[0] != TLS_HANDSHAKE_RECORD {
            let body = sless_gateway::error_body(
                "invalid",
                "this server speaks HTTPS on this port: use an https:// URL",
            );
            let mut answer = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            answer.extend_from_slice(&body);
            let _ = stream.write_all(&answer).await;
            let _ = stream.shutdown().await;
            // What the client sent is read and dropped until it closes (within the
            // timeout), so the close is not a reset that could discard the answer.
            let mut sink = [0u8; 4096];
            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
            return None;
        }
        match acceptor.accept(stream).await {
            Ok(tls) => Some(tls),
            Err(e) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                None
            }
        }
    };
    tokio::time::timeout(timeout, shake).await.ok().flatten()
}

/// A connection's socket as hyper sees it. hyper answers a request it cannot parse
/// itself, before any service sees it, with an empty body: a malformed request line
/// or header `400`, a URI over 65,534 bytes `414`, over 100 header fields or a head
/// over its read buffer (~400 KiB) `431`, each with `content-length: 0`, and then
/// closes the connection. This recognises such an answer on its way out, a write
/// of nothing but that head while no request has reached the service since the last
/// answer began, and writes the contract's `{"error": {"code", "message"}}` in its
/// place. Everything else passes through untouched: per write, the cost is one
/// comparison of a counter.
struct EdgeIo<S> {
    inner: S,
    state: Arc<ConnState>,
    /// `state.calls` when the latest answer began to be written.
    answered: u64,
    /// A replacement answer and how much of it is written.
    pending: Option<(Vec<u8>, usize)>,
}

impl<S> EdgeIo<S> {
    fn new(inner: S, state: Arc<ConnState>) -> EdgeIo<S> {
        EdgeIo {
            inner,
            state,
            answered: 0,
            pending: None,
        }
    }

    /// Whether this write begins the answer to a request the service was handed
    /// since the last answer began (then it is the service's, never replaced).
    fn begins_service_answer(&mut self) -> bool {
        let calls = self.state.calls.load(Ordering::Relaxed);
        if calls == self.answered {
            return false;
        }
        self.answered = calls;
        true
    }

    /// Whether `buf` (all that is being written) is hyper's own answer to a request
    /// it refused; the answer to write instead, if so.
    fn replacement(&mut self, buf: &[u8]) -> Option<Vec<u8>> {
        // `100 Continue` comes before the service's answer, not as its beginning.
        if buf.starts_with(b"HTTP/1.1 100 ") {
            return None;
        }
        if self.begins_service_answer() {
            return None;
        }
        refused_status(buf).map(contract_answer)
    }

    /// Writes what is left of a replacement answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>>
    where
        S: tokio::io::AsyncWrite + Unpin,
    {
        while let Some((bytes, written)) = &mut self.pending {
            if *written >= bytes.len() {
                self.pending = None;
                break;
            }
            let n =
                std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }
}

/// The status of hyper's answer to a request it could not parse: exactly a
/// `HTTP/1.x 400|414|431` head with no other header than `content-length: 0`,
/// `date` and `connection`, and no body.
fn refused_status(buf: &[u8]) -> Option<u16> {
    if buf.len() > 512 || !buf.ends_with(b"\r\n\r\n") {
        return None;
    }
    let text = std::str::from_utf8(buf).ok()?;
    let mut lines = text[..text.len() - 4].split("\r\n");
    let first = lines.next()?;
    let status = first
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| first.strip_prefix("HTTP/1.0 "))?
        .get(..3)?;
    let status = match status {
        "400" => 400,
        "414" => 414,
        "431" => 431,
        _ => return None,
    };
    let mut length = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" if value.trim() == "0" => length = true,
            "date" | "connection" => {}
            _ => return None,
        }
    }
    length.then_some(status)
}

/// The whole answer, in the contract's shape, for a request hyper refused.
fn contract_answer(status: u16) -> Vec<u8> {
    let (reason, code, message) = match status {
        414 => (
            "URI Too Long",
            "uri_too_long",
            "the request's URI is longer than 65,534 bytes",
        ),
        431 => (
            "Request Header Fields Too Large",
            "headers_too_large",
            "the request has more than 100 header fields, or its head is larger than 400 KiB",
        ),
        _ => (
            "Bad Request",
            "invalid",
            "the request is not valid HTTP/1.1 (its request line or a header cannot be parsed)",
        ),
    };
    let body = sless_gateway::error_body(code, message);
    let mut answer = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    answer
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for EdgeIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for EdgeIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::task::ready!(self.poll_pending(cx))?;
        if let Some(answer) = self.replacement(buf) {
            self.pending = Some((answer, 0));
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        std::task::ready!(self.poll_pending(cx))?;
        let mut filled = bufs.iter().filter(|b| !b.is_empty());
        match (filled.next(), filled.next()) {
            (Some(only), None) => {
                if let Some(answer) = self.replacement(only) {
                    self.pending = Some((answer, 0));
                    return Poll::Ready(Ok(only.len()));
                }
            }
            _ => {
                self.begins_service_answer();
            }
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        std::task::ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        std::task::ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Logs a recurring warning at most every 10 s.
#[derive(Default)]
struct Warned(Option<Instant>);

impl Warned {
    fn warn(&mut self, log: impl FnOnce()) {
        if self
            .0
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            self.0 = Some(Instant::now());
            log();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_follow_the_open_file_limit() {
        let t = Duration::from_secs(30);
        assert_eq!(ConnLimits::from_nofile(1024, None, t).max, 512);
        assert_eq!(ConnLimits::from_nofile(1 << 20, None, t).max, 65_536);
        assert_eq!(ConnLimits::from_nofile(10, None, t).max, 16);
        assert_eq!(ConnLimits::from_nofile(1024, Some(20), t).max, 20);
    }

    #[test]
    fn hypers_own_refusals_are_recognised_and_nothing_else() {
        let date = "date: Mon, 30 Nov 2026 05:00:00 GMT\r\n";
        for (status, reason) in [
            (400, "Bad Request"),
            (414, "URI Too Long"),
            (431, "Request Header Fields Too Large"),
        ] {
            let head = format!("HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\n{date}\r\n");
            assert_eq!(refused_status(head.as_bytes()), Some(status), "{head}");
            let closing = format!(
                "HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n{date}\r\n"
            );
            assert_eq!(refused_status(closing.as_bytes()), Some(status));
        }
        for other in [
            // A service's answers: a body, a content type, another status.
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}".to_string(),
            "HTTP/1.1 431 X\r\ncontent-type: text/plain\r\ncontent-length: 0\r\n\r\n".to_string(),
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_string(),
            "HTTP/1.1 400 Bad Request\r\nx-request-id: a\r\ncontent-length: 0\r\n\r\n".to_string(),
            "HTTP/1.1 400 Bad Request\r\n\r\n".to_string(),
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n".to_string(),
            "body bytes".to_string(),
        ] {
            assert_eq!(refused_status(other.as_bytes()), None, "{other}");
        }
        let answer = String::from_utf8(contract_answer(431)).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "headers_too_large");
    }

    #[test]
    fn at_the_limit_the_oldest_idle_connection_makes_room() {
        let open = Open {
            max: 3,
            count: Arc::default(),
            queue: Mutex::default(),
        };
        let mut conns: Vec<_> = (0..3).map(|_| open.admit().unwrap()).collect();
        conns[0].0.busy.fetch_add(1, Ordering::AcqRel);
        // The oldest is busy: the second-oldest goes.
        let fourth = open.admit().unwrap();
        assert!(!conns[0].0.evict.is_cancelled());
        assert!(conns[1].0.evict.is_cancelled());
        assert!(!conns[2].0.evict.is_cancelled());
        // The evicted connection's task ends and gives its slot back.
        drop(conns.remove(1));
        assert_eq!(open.count.load(Ordering::Acquire), 3);
        conns.push(fourth);
        // All busy: the new connection is refused.
        for (c, _) in &conns {
            c.busy.fetch_add(1, Ordering::AcqRel);
        }
        assert!(open.admit().is_none());
    }
}
