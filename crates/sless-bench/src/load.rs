//! A lean closed-loop HTTP/1.1 load generator: N keep-alive connections, each sending one
//! request after another for a fixed time, over TCP or a Unix socket. The loop speaks HTTP
//! through `sless-wire` (a request prepared once as bytes, responses framed by
//! `Content-Length`), so it costs the machine little more than `wrk` would; probes use
//! hyper.
//!
//! Every comparison in the bench (gateway vs direct, gateway vs plain Node, shim vs
//! `ThreadingHTTPServer`) uses this one generator with the same settings, so the generator's
//! own cost is the same on both sides of each ratio. A run can also read CPU counters of the
//! processes under load at the start and end of its measured window (see [`crate::cpu`]).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, header};
use sless_wire::{Conn, RequestHead};
use tokio::net::{TcpStream, UnixStream};

use crate::cpu::Meter;
use crate::error::{BenchError, Result};
use crate::stats;

/// How long one request may take before it counts as failed; bounds every run in time.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Connection attempts in a row that may fail before a connection's loop gives up.
const MAX_CONNECT_FAILURES: u32 = 20;

/// Where the load goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A loopback TCP address.
    Tcp(SocketAddr),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(addr) => write!(f, "tcp:{addr}"),
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// The one request every connection sends, over and over.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    /// The method, e.g. `GET`.
    pub method: Method,
    /// Path and query, e.g. `/fn/default/hello`.
    pub path: String,
    /// Extra headers (`Host`, `Content-Length` are set by the generator).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body, sent with a `Content-Length`; empty for none.
    pub body: Bytes,
}

impl RequestTemplate {
    /// A `GET path` with no body.
    pub fn get(path: &str) -> RequestTemplate {
        RequestTemplate {
            method: Method::GET,
            path: path.to_string(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// A `POST path` with a JSON body.
    pub fn post_json(path: &str, body: &serde_json::Value) -> RequestTemplate {
        RequestTemplate {
            method: Method::POST,
            path: path.to_string(),
            headers: vec![(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body: Bytes::from(body.to_string()),
        }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &'static str, value: &'static str) -> RequestTemplate {
        self.headers.push((
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        ));
        self
    }

    /// The request head as it goes on the wire (`Host`, the extra headers, and a
    /// `Content-Length`, which the instance protocol requires of a POST); the body follows it.
    fn head(&self) -> Result<Vec<u8>> {
        let invalid =
            |why: String| BenchError::Setup(format!("invalid request {}: {why}", self.path));
        if !self.path.starts_with('/') || self.path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(invalid(
                "the path must start with / and hold no spaces".into(),
            ));
        }
        let mut head = RequestHead::new(self.method.as_str(), &self.path)
            .header("host", "localhost")
            .map_err(|e| invalid(e.to_string()))?;
        for (name, value) in &self.headers {
            let value = value.to_str().map_err(|e| invalid(e.to_string()))?;
            head = head
                .header(name.as_str(), value)
                .map_err(|e| invalid(e.to_string()))?;
        }
        Ok(head.finish(self.body.len()))
    }
}

/// How much load, for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSpec {
    /// Concurrent keep-alive connections, each with one request in flight.
    pub connections: usize,
    /// Time before measuring starts (connections are set up, pools and JITs warm).
    pub warmup: Duration,
    /// The measured window (of each round, in [`compare`]).
    pub duration: Duration,
}

/// CPU time one counter advanced by while a run measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuUse {
    /// CPU time used, in nanoseconds.
    pub used_ns: u64,
    /// The time between the two readings.
    pub over: Duration,
}

/// What one load run observed within its measured window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadReport {
    /// Successful (2xx) requests that started and finished within the window.
    pub ok: u64,
    /// Requests that failed (non-2xx, transport error, timeout) at any time in the run.
    pub errors: u64,
    /// All attempted requests in the run, warm-up included.
    pub attempts: u64,
    /// The first failure seen, for the error message.
    pub first_failure: Option<String>,
    /// The measured window.
    pub window: Duration,
    /// Latencies of the successful requests in the window, in microseconds, sorted.
    pub latencies_us: Vec<u32>,
    /// What each of the target's CPU counters advanced by in the window, in its order.
    pub cpu: Vec<CpuUse>,
}

impl LoadReport {
    /// Successful requests per second in the window.
    pub fn rps(&self) -> f64 {
        let secs = self.window.as_secs_f64();
        if secs <= 0.0 {
            0.0
        } else {
            self.ok as f64 / secs
        }
    }

    /// CPU microseconds per successful request of the target's `counter`th CPU counter,
    /// `None` when it has no such counter or nothing succeeded.
    ///
    /// The counters are read when the window opens and closes, as near to it as the
    /// scheduler allows; dividing CPU time by the time between the readings and by the
    /// request rate of the window keeps a late reading from counting CPU of requests the
    /// window does not count. The requests in flight at either edge are not counted though
    /// their CPU partly is: with 8 connections and thousands of requests a round, that is
    /// well under one percent.
    pub fn cpu_us_per_req(&self, counter: usize) -> Option<f64> {
        let cpu = self.cpu.get(counter)?;
        let (over, rps) = (cpu.over.as_secs_f64(), self.rps());
        if over <= 0.0 || rps <= 0.0 {
            return None;
        }
        Some(cpu.used_ns as f64 / 1000.0 / over / rps)
    }

    /// The `p`th percentile latency in milliseconds (nearest rank).
    pub fn latency_ms(&self, p: f64) -> f64 {
        stats::percentile_sorted(&self.latencies_us, p).map_or(0.0, |us| f64::from(us) / 1000.0)
    }

    /// Fails when more than `max_error_ratio` of the attempts failed or nothing succeeded:
    /// a throughput measured mostly on errors would not mean what it says.
    pub fn check(&self, what: &str, max_error_ratio: f64) -> Result<()> {
        let too_many = self.errors as f64 > max_error_ratio * self.attempts.max(1) as f64;
        if self.ok == 0 || too_many {
            return Err(BenchError::LoadErrors {
                what: what.to_string(),
                errors: self.errors,
                attempts: self.attempts,
                first_failure: self
                    .first_failure
                    .clone()
                    .unwrap_or_else(|| "no request completed in the measured window".into()),
            });
        }
        Ok(())
    }
}

/// Per-connection tallies, merged into a [`LoadReport`].
#[derive(Debug, Default)]
struct Tally {
    ok: u64,
    errors: u64,
    attempts: u64,
    first_failure: Option<String>,
    latencies_us: Vec<u32>,
}

impl Tally {
    fn fail(&mut self, why: String) {
        self.errors += 1;
        self.first_failure.get_or_insert(why);
    }
}

/// Sends one request on a fresh connection and returns its status and body; for probes.
pub async fn request_once(endpoint: &Endpoint, template: &RequestTemplate) -> Result<(u16, Bytes)> {
    let head = template.head()?;
    let exchange = async {
        let mut conn = LoadConn::connect(endpoint)
            .await
            .map_err(|source| BenchError::Connect {
                endpoint: endpoint.to_string(),
                source,
            })?;
        let answer = conn
            .exchange(&head, &template.body)
            .await
            .map_err(|source| BenchError::Http {
                endpoint: endpoint.to_string(),
                source,
            })?;
        Ok((answer.status, answer.body))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| BenchError::Timeout {
            what: format!("a response from {endpoint}"),
            waited: REQUEST_TIMEOUT,
        })?
}

/// Runs `spec.connections` closed loops against `endpoint` for `warmup + duration`.
///
/// Only requests that both start after the warm-up and finish before the end are counted,
/// so the figure is the steady state, not the ramp-up or the tail. The `cpu` counters are
/// read at the start and the end of that window.
pub async fn run(
    endpoint: &Endpoint,
    template: &RequestTemplate,
    spec: LoadSpec,
    cpu: &[Meter],
) -> Result<LoadReport> {
    // Prepared once up front, so a malformed template fails before any load.
    let head = template.head()?;
    let start = Instant::now();
    let measure_from = start + spec.warmup;
    let until = measure_from + spec.duration;
    let mut tasks = Vec::with_capacity(spec.connections);
    for _ in 0..spec.connections.max(1) {
        let endpoint = endpoint.clone();
        let head = head.clone();
        let body = template.body.clone();
        tasks.push(tokio::spawn(async move {
            connection_loop(&endpoint, &head, &body, measure_from, until).await
        }));
    }
    // The connections run on their own tasks; this one only reads the counters. A failed
    // reading ends the run after the connections finish, so none is left running.
    tokio::time::sleep_until(measure_from.into()).await;
    let before = read_all(cpu);
    let before_at = Instant::now();
    tokio::time::sleep_until(until.into()).await;
    let after = read_all(cpu);
    let over = before_at.elapsed();
    let mut report = LoadReport {
        window: spec.duration,
        ..LoadReport::default()
    };
    for task in tasks {
        let tally = task
            .await
            .map_err(|e| BenchError::Setup(format!("a load connection task failed: {e}")))?;
        report.ok += tally.ok;
        report.errors += tally.errors;
        report.attempts += tally.attempts;
        if report.first_failure.is_none() {
            report.first_failure = tally.first_failure;
        }
        report.latencies_us.extend(tally.latencies_us);
    }
    report.latencies_us.sort_unstable();
    report.cpu = before?
        .into_iter()
        .zip(after?)
        .map(|(b, a)| CpuUse {
            used_ns: a.saturating_sub(b),
            over,
        })
        .collect();
    Ok(report)
}

/// Every counter's current value, in nanoseconds.
fn read_all(cpu: &[Meter]) -> Result<Vec<u64>> {
    cpu.iter().map(|meter| meter.source.read_ns()).collect()
}

/// One target of [`compare`]: a name for messages, where, what to send, and which CPU
/// counters to read around each of its rounds.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub endpoint: Endpoint,
    pub request: RequestTemplate,
    pub cpu: Vec<Meter>,
}

/// What [`compare`] measured: each round's report per target, and each target's rounds summed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Comparison {
    /// `rounds[round][target]`.
    pub rounds: Vec<Vec<LoadReport>>,
    /// `totals[target]`: all rounds of the target merged.
    pub totals: Vec<LoadReport>,
}

impl Comparison {
    /// `f` of every round, e.g. the ratio of two targets' throughput in each round.
    pub fn per_round(&self, f: impl Fn(&[LoadReport]) -> f64) -> Vec<f64> {
        self.rounds.iter().map(|round| f(round)).collect()
    }
}

/// Runs the targets in alternating rounds (A, B, A, B, ...), each measuring `spec.duration`,
/// and keeps each round's reports as well as their sums.
///
/// On a small machine shared with other work, throughput drifts over seconds; alternating
/// short rounds exposes every target to the same drift, so their ratio is fairer than that of
/// two long back-to-back runs, and the ratio of each round shows how much the drift moved it.
/// The first round of each target warms up for `spec.warmup`, later ones only long enough to
/// reconnect.
pub async fn compare(targets: &[Target], spec: LoadSpec, rounds: u32) -> Result<Comparison> {
    let rounds = rounds.max(1);
    let mut comparison = Comparison {
        rounds: Vec::with_capacity(rounds as usize),
        totals: vec![LoadReport::default(); targets.len()],
    };
    for round in 0..rounds {
        let mut this_round = Vec::with_capacity(targets.len());
        for (target, total) in targets.iter().zip(comparison.totals.iter_mut()) {
            let round_spec = LoadSpec {
                connections: spec.connections,
                warmup: if round == 0 {
                    spec.warmup
                } else {
                    spec.warmup.min(REWARM)
                },
                duration: spec.duration,
            };
            let report = run(&target.endpoint, &target.request, round_spec, &target.cpu).await?;
            total.merge(report.clone());
            this_round.push(report);
        }
        comparison.rounds.push(this_round);
    }
    for report in &mut comparison.totals {
        report.latencies_us.sort_unstable();
    }
    Ok(comparison)
}

/// The warm-up of every round of [`compare`] after the first: connections are new, the
/// servers are not.
const REWARM: Duration = Duration::from_millis(100);

impl LoadReport {
    /// Adds another run's counts, window, latencies (left unsorted; sort after merging) and
    /// CPU use.
    pub fn merge(&mut self, other: LoadReport) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.attempts += other.attempts;
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
        self.window += other.window;
        self.latencies_us.extend(other.latencies_us);
        if self.cpu.is_empty() {
            self.cpu = vec![CpuUse::default(); other.cpu.len()];
        }
        for (mine, theirs) in self.cpu.iter_mut().zip(other.cpu) {
            mine.used_ns += theirs.used_ns;
            mine.over += theirs.over;
        }
    }
}

/// One connection's loop: send, wait, record, repeat until `until`; reconnect when the
/// server closes the connection.
/// A load connection: TCP or Unix.
enum LoadConn {
    Tcp(Conn<TcpStream>),
    Unix(Conn<UnixStream>),
}

impl LoadConn {
    async fn connect(endpoint: &Endpoint) -> std::io::Result<LoadConn> {
        Ok(match endpoint {
            Endpoint::Tcp(addr) => {
                let stream = TcpStream::connect(addr).await?;
                // Small request/response pairs: Nagle would add delayed-ACK stalls.
                stream.set_nodelay(true)?;
                LoadConn::Tcp(Conn::new(stream))
            }
            Endpoint::Unix(path) => LoadConn::Unix(Conn::new(UnixStream::connect(path).await?)),
        })
    }

    fn reusable(&self) -> bool {
        match self {
            LoadConn::Tcp(c) => c.reusable(),
            LoadConn::Unix(c) => c.reusable(),
        }
    }

    async fn exchange(
        &mut self,
        head: &[u8],
        body: &[u8],
    ) -> std::result::Result<sless_wire::Response, sless_wire::WireError> {
        match self {
            LoadConn::Tcp(c) => c.exchange(head, body).await,
            LoadConn::Unix(c) => c.exchange(head, body).await,
        }
    }
}

async fn connection_loop(
    endpoint: &Endpoint,
    head: &[u8],
    body: &[u8],
    measure_from: Instant,
    until: Instant,
) -> Tally {
    let mut tally = Tally::default();
    let mut conn: Option<LoadConn> = None;
    let mut connect_failures = 0u32;
    while Instant::now() < until {
        let mut current = match conn.take() {
            Some(c) if c.reusable() => c,
            _ => match LoadConn::connect(endpoint).await {
                Ok(c) => {
                    connect_failures = 0;
                    c
                }
                Err(e) => {
                    tally.attempts += 1;
                    tally.fail(format!("cannot connect to {endpoint}: {e}"));
                    connect_failures += 1;
                    if connect_failures >= MAX_CONNECT_FAILURES {
                        break;
                    }
                    // Back off briefly so a refusing endpoint is not hammered in a hot loop.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            },
        };
        tally.attempts += 1;
        let sent = Instant::now();
        let exchange = current.exchange(head, body);
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(Ok(answer)) => {
                let done = Instant::now();
                if !(200..300).contains(&answer.status) {
                    tally.fail(format!(
                        "status {}: {}",
                        answer.status,
                        String::from_utf8_lossy(&answer.body[..answer.body.len().min(200)])
                    ));
                } else if sent >= measure_from && done <= until {
                    tally.ok += 1;
                    let us = done.duration_since(sent).as_micros();
                    tally
                        .latencies_us
                        .push(u32::try_from(us).unwrap_or(u32::MAX));
                }
                conn = Some(current);
            }
            Ok(Err(e)) => tally.fail(e.to_string()),
            Err(_) => tally.fail(format!("no response within {REQUEST_TIMEOUT:?}")),
        }
    }
    tally
}

/// An error with its sources, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use http::Request;
    use http_body_util::{BodyExt, Full};
    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper::{Response, StatusCode};
    use hyper_util::rt::TokioIo;
    use tokio::net::{TcpListener, UnixListener};

    use super::*;

    /// Serves every connection with `status` and an echo of the request, counting requests.
    fn serve<S>(stream: S, status: StatusCode, seen: Arc<AtomicU64>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let seen = seen.clone();
                async move {
                    seen.fetch_add(1, Ordering::SeqCst);
                    let method = req.method().to_string();
                    let body = req.into_body().collect().await?.to_bytes();
                    let text = format!("{method} {}", String::from_utf8_lossy(&body));
                    Ok::<_, hyper::Error>(
                        Response::builder()
                            .status(status)
                            .body(Full::new(Bytes::from(text)))
                            .expect("valid response"),
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }

    async fn tcp_server(status: StatusCode) -> (Endpoint, Arc<AtomicU64>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(AtomicU64::new(0));
        let counter = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                serve(stream, status, counter.clone());
            }
        });
        (Endpoint::Tcp(addr), seen)
    }

    const SHORT: LoadSpec = LoadSpec {
        connections: 3,
        warmup: Duration::from_millis(50),
        duration: Duration::from_millis(200),
    };

    #[test]
    fn templates_become_whole_heads_and_bad_ones_are_refused() {
        let post = RequestTemplate::post_json("/_sless/invoke", &serde_json::json!({"a": 1}))
            .with_header("x-sless-source", "invoke");
        let head = String::from_utf8(post.head().unwrap()).unwrap();
        assert_eq!(
            head,
            "POST /_sless/invoke HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
             x-sless-source: invoke\r\ncontent-length: 7\r\n\r\n"
        );
        for path in ["/a b", "nope", "/a\r\nx: y"] {
            let err = RequestTemplate::get(path).head().unwrap_err();
            assert!(err.to_string().contains("invalid request"), "{path}: {err}");
        }
    }

    #[tokio::test]
    async fn counts_successes_in_the_window_only() {
        let (endpoint, seen) = tcp_server(StatusCode::OK).await;
        let report = run(&endpoint, &RequestTemplate::get("/x"), SHORT, &[])
            .await
            .expect("run");
        assert!(report.ok > 0, "{report:?}");
        assert_eq!(report.errors, 0);
        assert!(report.first_failure.is_none());
        // Warm-up requests were sent but not counted.
        assert!(seen.load(Ordering::SeqCst) > report.ok);
        assert_eq!(report.latencies_us.len() as u64, report.ok);
        assert!(report.latencies_us.windows(2).all(|w| w[0] <= w[1]));
        assert!((report.rps() - report.ok as f64 / 0.2).abs() < 1e-6);
        report.check("tcp", 0.0).expect("no errors");
    }

    #[tokio::test]
    async fn non_success_statuses_are_errors() {
        let (endpoint, _) = tcp_server(StatusCode::SERVICE_UNAVAILABLE).await;
        let report = run(&endpoint, &RequestTemplate::get("/"), SHORT, &[])
            .await
            .expect("run");
        assert_eq!(report.ok, 0);
        assert!(report.errors > 0);
        assert!(
            report
                .first_failure
                .as_deref()
                .is_some_and(|f| f.contains("503")),
            "{report:?}"
        );
        let err = report.check("busy", 0.5).expect_err("all failed");
        assert!(err.to_string().contains("busy"), "{err}");
    }

    #[tokio::test]
    async fn posts_json_over_a_unix_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let seen = Arc::new(AtomicU64::new(0));
        let counter = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                serve(stream, StatusCode::OK, counter.clone());
            }
        });
        let endpoint = Endpoint::Unix(path);
        let template = RequestTemplate::post_json("/_sless/invoke", &serde_json::json!({"a": 1}));
        let (status, body) = request_once(&endpoint, &template).await.expect("probe");
        assert_eq!(status, 200);
        assert_eq!(&body[..], br#"POST {"a":1}"#);
        let report = run(&endpoint, &template, SHORT, &[]).await.expect("run");
        assert!(report.ok > 0 && report.errors == 0, "{report:?}");
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_fails_without_hanging() {
        let dir = tempfile::tempdir().expect("tempdir");
        let endpoint = Endpoint::Unix(dir.path().join("nobody.sock"));
        let report = run(&endpoint, &RequestTemplate::get("/"), SHORT, &[])
            .await
            .expect("run");
        assert_eq!(report.ok, 0);
        assert!(report.errors > 0);
        assert!(report.check("nobody", 1.0).is_err());
        assert!(
            request_once(&endpoint, &RequestTemplate::get("/"))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn compare_alternates_and_sums_rounds() {
        let (fast, fast_seen) = tcp_server(StatusCode::OK).await;
        let (busy, _) = tcp_server(StatusCode::SERVICE_UNAVAILABLE).await;
        let me = Meter {
            name: "bench",
            source: crate::cpu::CpuSource::process(std::process::id()).expect("clock tick"),
        };
        let targets = [
            Target {
                name: "fast".into(),
                endpoint: fast,
                request: RequestTemplate::get("/"),
                cpu: vec![me],
            },
            Target {
                name: "busy".into(),
                endpoint: busy,
                request: RequestTemplate::get("/"),
                cpu: Vec::new(),
            },
        ];
        let comparison = compare(&targets, SHORT, 2).await.expect("compare");
        assert_eq!(comparison.rounds.len(), 2);
        assert!(comparison.rounds.iter().all(|r| r.len() == 2));
        let reports = &comparison.totals;
        assert_eq!(reports.len(), 2);
        // Two rounds of the duration each add up to twice the window, and the rounds add up
        // to the totals.
        assert_eq!(reports[0].window, SHORT.duration * 2);
        assert_eq!(
            comparison.per_round(|r| r[0].ok as f64).iter().sum::<f64>(),
            reports[0].ok as f64
        );
        // Each round read the fast target's counter once per window; the busy one has none.
        assert_eq!(reports[0].cpu.len(), 1);
        // The readings are as near the window's edges as the scheduler allows.
        let over = reports[0].cpu[0].over;
        assert!(
            over > SHORT.duration && over < SHORT.duration * 4,
            "{:?}",
            reports[0].cpu
        );
        assert!(reports[1].cpu.is_empty());
        assert!(reports[0].ok > 0 && reports[0].errors == 0);
        assert!(reports[0].latencies_us.windows(2).all(|w| w[0] <= w[1]));
        assert!(fast_seen.load(Ordering::SeqCst) >= reports[0].ok);
        assert_eq!(reports[1].ok, 0);
        assert!(reports[1].errors > 0);
    }

    #[test]
    fn cpu_per_request_divides_the_cpu_rate_by_the_request_rate() {
        let report = LoadReport {
            ok: 2000,
            window: Duration::from_secs(2),
            // 50 ms of CPU over 1.0 s of readings at 1000 req/s: 50 µs per request, even
            // though the readings were 1.0 s apart, not the window's 2 s.
            cpu: vec![
                CpuUse {
                    used_ns: 50_000_000,
                    over: Duration::from_secs(1),
                },
                CpuUse::default(),
            ],
            ..LoadReport::default()
        };
        assert_eq!(report.cpu_us_per_req(0), Some(50.0));
        assert_eq!(report.cpu_us_per_req(1), None);
        assert_eq!(report.cpu_us_per_req(2), None);
        let idle = LoadReport {
            cpu: vec![CpuUse::default()],
            ..LoadReport::default()
        };
        assert_eq!(idle.cpu_us_per_req(0), None);
        let mut total = LoadReport::default();
        total.merge(report.clone());
        total.merge(report);
        assert_eq!(total.cpu[0].used_ns, 100_000_000);
        assert_eq!(total.cpu[0].over, Duration::from_secs(2));
        assert_eq!(total.cpu_us_per_req(0), Some(50.0));
    }

    #[test]
    fn percentiles_of_a_report() {
        let report = LoadReport {
            ok: 4,
            window: Duration::from_secs(2),
            latencies_us: vec![1000, 2000, 3000, 40_000],
            ..LoadReport::default()
        };
        assert_eq!(report.rps(), 2.0);
        assert_eq!(report.latency_ms(50.0), 2.0);
        assert_eq!(report.latency_ms(99.0), 40.0);
    }
}
