//! The accept loop: HTTP/1.1 connections with a header/idle timeout, a bound on
//! open connections with a few slots held back so health checks and the API
//! still get in, and accept errors (out of file descriptors) survived by backing
//! off instead of spinning or exiting.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use sless_gateway::FastPath;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// How connections are bounded.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Connections served normally at once.
    pub max: usize,
    /// Extra connections taken once `max` are open: each serves one request and
    /// must send its headers within `reserve_header_timeout`.
    pub reserve: usize,
    /// A connection idle between requests, or still sending a request's headers,
    /// this long is closed.
    pub header_timeout: Duration,
    pub reserve_header_timeout: Duration,
}

impl ConnLimits {
    /// Limits for a process allowed `nofile` open files: half of them for
    /// connections (the rest is for the store, logs and instances' sockets and
    /// pipes), of which 1/64 (at least 4) are held back.
    pub fn from_nofile(nofile: u64, max: Option<usize>, header_timeout: Duration) -> ConnLimits {
        let derived = (nofile / 2).clamp(16, 65_536) as usize;
        let max = max.unwrap_or(derived).max(1);
        ConnLimits {
            max,
            reserve: (max / 64).max(4),
            header_timeout,
            reserve_header_timeout: header_timeout.min(Duration::from_secs(2)),
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

/// One connection's service: the app, plus the peer's address on requests that
/// carry credentials (failed authentication is limited per address). Other
/// requests, the invoke path's in particular, pay nothing for it.
#[derive(Clone)]
struct ConnService {
    app: FastPath,
    peer: SocketAddr,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = <FastPath as tower::Service<Request<Body>>>::Future;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let mut req = req.map(Body::new);
        if req.headers().contains_key(header::AUTHORIZATION) {
            req.extensions_mut().insert(ConnectInfo(self.peer));
        }
        let mut app = self.app.clone();
        tower::Service::call(&mut app, req)
    }
}

/// Serves `listener` until `stop` turns true, then waits for open connections to
/// finish their requests (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: FastPath,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) {
    let normal = Arc::new(Semaphore::new(limits.max));
    let reserve = Arc::new(Semaphore::new(limits.reserve));
    let graceful = GracefulShutdown::new();
    let mut warned = Warned::default();
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
        let (permit, spare) = match normal.clone().try_acquire_owned() {
            Ok(p) => (p, false),
            Err(_) => match reserve.clone().try_acquire_owned() {
                Ok(p) => (p, true),
                Err(_) => {
                    // Closing at once frees the descriptor and the backlog slot.
                    warned.warn(|| {
                        tracing::warn!(
                            max = limits.max,
                            "connection limit reached: closing new connections"
                        )
                    });
                    drop(stream);
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new());
        if spare {
            builder
                .keep_alive(false)
                .header_read_timeout(limits.reserve_header_timeout);
        } else {
            builder.header_read_timeout(limits.header_timeout);
        }
        let service = ConnService {
            app: app.clone(),
            peer,
        };
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // Errors here are the client's (a reset, a timeout, a malformed request).
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
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
        let l = ConnLimits::from_nofile(1024, None, t);
        assert_eq!((l.max, l.reserve), (512, 8));
        let l = ConnLimits::from_nofile(1 << 20, None, t);
        assert_eq!((l.max, l.reserve), (65_536, 1024));
        let l = ConnLimits::from_nofile(10, None, t);
        assert_eq!((l.max, l.reserve), (16, 4));
        let l = ConnLimits::from_nofile(1024, Some(20), t);
        assert_eq!((l.max, l.reserve), (20, 4));
        assert_eq!(l.reserve_header_timeout, Duration::from_secs(2));
    }
}
