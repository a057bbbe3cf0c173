//! Prometheus metrics (`GET /metrics`): the series' names, the handles the invoke
//! path caches per function, and the process's exporter.
//!
//! Recording goes through the `metrics` facade, which is process-global: [`install`]
//! puts the Prometheus recorder in place once (a second server in the same process
//! shares it), and until then every handle is a no-op and every helper here returns
//! at once. A counter is an atomic add on its handle and a histogram sample a
//! lock-free push, but *finding* a handle hashes its labels under the registry's lock
//! (and allocates the label strings), so the invoke path keeps its handles:
//! [`FunctionMetrics`] per function (in the executor's pool), [`RouteCounters`] for
//! a fixed route. Other events are rare enough to look their handle up each time.
//!
//! Series with a user's name in a label (namespace, function, trigger) are bounded by
//! the objects that exist; the exporter cannot forget a series, so those of a deleted
//! function or trigger stay (frozen) until the server restarts.
//!
//! Invariant: nothing here locks across an `.await`, touches the store or does IO;
//! the one thread this starts drains histogram samples every few seconds.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Histogram, Label, Level, Metadata};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// The series' names, as `GET /metrics` shows them.
pub mod names {
    /// Invocations that ended, by `namespace`, `function`, `source` and `status`
    /// (the HTTP status answered).
    pub const INVOCATIONS: &str = "sless_invocations_total";
    /// How long invocations took, by `namespace` and `function` (histogram).
    pub const INVOCATION_DURATION: &str = "sless_invocation_duration_seconds";
    /// Invocations that waited for a new instance, by `namespace` and `function`.
    pub const COLD_STARTS: &str = "sless_cold_starts_total";
    /// Instances by `state`: `ready`, `starting`, `warm` (generic, no function yet).
    pub const INSTANCES: &str = "sless_instances";
    /// Builds by `result`: `ok`, `failed` (the code's fault), `error` (the server's),
    /// `reused` (identical code built before; nothing ran).
    pub const BUILDS: &str = "sless_builds_total";
    /// How long builds that ran took (histogram).
    pub const BUILD_DURATION: &str = "sless_build_duration_seconds";
    /// Messages of queue and device triggers, by `namespace`, `trigger` and `outcome`.
    pub const QUEUE_MESSAGES: &str = "sless_queue_messages_total";
    /// Async calls delivered, by `namespace`, `function` and `outcome`.
    pub const ASYNC_CALLS: &str = "sless_async_calls_total";
    /// Dead letters stored now.
    pub const DEAD_LETTERS: &str = "sless_dead_letters";
    /// Async calls queued or running now.
    pub const ASYNC_CALLS_QUEUED: &str = "sless_async_calls_queued";
    /// Telemetry messages stored.
    pub const TELEMETRY_MESSAGES: &str = "sless_telemetry_messages_total";
    /// HTTP requests answered, by `route` (the route's template, `unmatched` for none)
    /// and `status`.
    pub const HTTP_REQUESTS: &str = "sless_http_requests_total";
}

/// The delivery outcomes of [`names::QUEUE_MESSAGES`] and [`names::ASYNC_CALLS`]:
/// `received`, then per attempt `failed` (and `retried` when another follows), and
/// once per message `succeeded` or `dead_lettered`.
pub const DELIVERY_OUTCOMES: [&str; 5] = [
    "received",
    "succeeded",
    "retried",
    "failed",
    "dead_lettered",
];

/// Invocation duration buckets, in seconds: a millisecond to the longest timeout.
const INVOCATION_BUCKETS: [f64; 17] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0,
];
/// Build duration buckets, in seconds: a reused install to the build timeout.
const BUILD_BUCKETS: [f64; 11] = [
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// How often histogram samples are drained into their buckets when nobody scrapes
/// (each sample waits in a lock-free list until then).
const UPKEEP_PERIOD: Duration = Duration::from_secs(5);

static EXPORTER: OnceLock<PrometheusHandle> = OnceLock::new();

/// Why the exporter could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The exporter's configuration was refused (a bug: the buckets are constants).
    #[error("cannot configure the Prometheus exporter: {0}")]
    Build(String),
    /// Another recorder is already the process's.
    #[error("another metrics recorder is installed in this process")]
    Taken,
}

/// The process's exporter: renders every series in Prometheus' text format.
#[derive(Clone, Debug)]
pub struct Exporter {
    handle: PrometheusHandle,
}

impl Exporter {
    /// Every series, in the Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

/// Installs the Prometheus recorder for the process (once; later calls get the same
/// exporter) and starts recording.
pub fn install() -> Result<Exporter, MetricsError> {
    // Servers built at once in one process (the in-process tests) install one after
    // the other: between setting the recorder and keeping its handle, no other may look.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(handle) = EXPORTER.get() {
        return Ok(Exporter {
            handle: handle.clone(),
        });
    }
    let build = |e: metrics_exporter_prometheus::BuildError| MetricsError::Build(e.to_string());
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(names::INVOCATION_DURATION.into()),
            &INVOCATION_BUCKETS,
        )
        .map_err(build)?
        .set_buckets_for_metric(Matcher::Full(names::BUILD_DURATION.into()), &BUILD_BUCKETS)
        .map_err(build)?
        .build_recorder();
    let handle = recorder.handle();
    // Two servers built at once in one process: one recorder wins, both use it.
    if metrics::set_global_recorder(recorder).is_err() {
        return EXPORTER
            .get()
            .map(|handle| Exporter {
                handle: handle.clone(),
            })
            .ok_or(MetricsError::Taken);
    }
    let handle = EXPORTER.get_or_init(|| handle).clone();
    describe();
    let upkeep = handle.clone();
    let _ = std::thread::Builder::new()
        .name("sless-metrics".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_PERIOD);
                upkeep.run_upkeep();
            }
        });
    Ok(Exporter { handle })
}

/// Whether metrics are recorded in this process.
#[inline]
pub fn enabled() -> bool {
    EXPORTER.get().is_some()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        names::INVOCATIONS,
        "Invocations that ended, by the HTTP status answered"
    );
    describe_histogram!(
        names::INVOCATION_DURATION,
        metrics::Unit::Seconds,
        "How long invocations took"
    );
    describe_counter!(
        names::COLD_STARTS,
        "Invocations that waited for a new instance"
    );
    describe_gauge!(names::INSTANCES, "Instances by state");
    describe_counter!(
        names::BUILDS,
        "Builds by result (ok, failed, error, reused)"
    );
    describe_histogram!(
        names::BUILD_DURATION,
        metrics::Unit::Seconds,
        "How long builds that ran took"
    );
    describe_counter!(
        names::QUEUE_MESSAGES,
        "Messages of queue and device triggers by outcome"
    );
    describe_counter!(names::ASYNC_CALLS, "Async calls delivered by outcome");
    describe_gauge!(names::DEAD_LETTERS, "Dead letters stored");
    describe_gauge!(names::ASYNC_CALLS_QUEUED, "Async calls queued or running");
    describe_counter!(names::TELEMETRY_MESSAGES, "Telemetry messages stored");
    describe_counter!(
        names::HTTP_REQUESTS,
        "HTTP requests by route template and status"
    );
}

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);

fn counter(name: &'static str, labels: Vec<Label>) -> Counter {
    metrics::with_recorder(|r| {
        r.register_counter(&metrics::Key::from_parts(name, labels), &METADATA)
    })
}

fn histogram(name: &'static str, labels: Vec<Label>) -> Histogram {
    metrics::with_recorder(|r| {
        r.register_histogram(&metrics::Key::from_parts(name, labels), &METADATA)
    })
}

fn gauge(name: &'static str, labels: Vec<Label>) -> metrics::Gauge {
    metrics::with_recorder(|r| r.register_gauge(&metrics::Key::from_parts(name, labels), &METADATA))
}

/// The invocation sources, as `sless_core::invocation::InvocationSource` names them.
const SOURCES: [&str; 7] = ["http", "invoke", "cron", "queue", "job", "device", "async"];

/// The statuses whose counters are cached (sorted); others are looked up each time.
const STATUSES: [u16; 28] = [
    200, 201, 202, 204, 206, 301, 302, 303, 304, 307, 308, 400, 401, 403, 404, 405, 408, 409, 410,
    413, 415, 422, 429, 500, 501, 502, 503, 504,
];

/// A status's counter slot, if it has one.
#[inline]
fn status_slot(status: u16) -> Option<usize> {
    STATUSES.binary_search(&status).ok()
}

type StatusCounters = [OnceLock<Counter>; STATUSES.len()];

fn status_counters() -> Box<StatusCounters> {
    Box::new([const { OnceLock::new() }; STATUSES.len()])
}

/// One function's invocation series, kept with the function (the executor's pool),
/// so an invocation records with atomic operations only: a counter per source and
/// status made on first use, the duration histogram and the cold-start counter.
pub struct FunctionMetrics {
    namespace: String,
    function: String,
    /// Per source, per cached status.
    by_source: [OnceLock<Box<StatusCounters>>; SOURCES.len()],
    duration: Histogram,
    cold_starts: Counter,
}

impl std::fmt::Debug for FunctionMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FunctionMetrics")
            .field("namespace", &self.namespace)
            .field("function", &self.function)
            .finish_non_exhaustive()
    }
}

fn function_labels(namespace: &str, function: &str) -> Vec<Label> {
    vec![
        Label::new("namespace", namespace.to_string()),
        Label::new("function", function.to_string()),
    ]
}

impl FunctionMetrics {
    pub fn new(namespace: &str, function: &str) -> Self {
        let (duration, cold_starts) = if enabled() {
            (
                histogram(
                    names::INVOCATION_DURATION,
                    function_labels(namespace, function),
                ),
                counter(names::COLD_STARTS, function_labels(namespace, function)),
            )
        } else {
            (Histogram::noop(), Counter::noop())
        };
        Self {
            namespace: namespace.to_string(),
            function: function.to_string(),
            by_source: [const { OnceLock::new() }; SOURCES.len()],
            duration,
            cold_starts,
        }
    }

    /// Records an invocation from `source` answered with `status`.
    pub fn invocation(&self, source: &'static str, status: u16, took: Duration, cold_start: bool) {
        if !enabled() {
            return;
        }
        self.duration.record(took.as_secs_f64());
        if cold_start {
            self.cold_starts.increment(1);
        }
        let cached = SOURCES
            .iter()
            .position(|s| *s == source)
            .zip(status_slot(status));
        match cached {
            Some((src, st)) => self.by_source[src].get_or_init(status_counters)[st]
                .get_or_init(|| invocation_counter(&self.namespace, &self.function, source, status))
                .increment(1),
            None => {
                invocation_counter(&self.namespace, &self.function, source, status).increment(1)
            }
        }
    }
}

fn invocation_counter(
    namespace: &str,
    function: &str,
    source: &'static str,
    status: u16,
) -> Counter {
    let mut labels = function_labels(namespace, function);
    labels.push(Label::from_static_parts("source", source));
    labels.push(Label::new("status", status.to_string()));
    counter(names::INVOCATIONS, labels)
}

/// Records an invocation of a function whose handles are not at hand (one that
/// failed and has no pool, a job's run recorded under its function).
pub fn invocation(
    namespace: &str,
    function: &str,
    source: &'static str,
    status: u16,
    took: Duration,
    cold_start: bool,
) {
    if !enabled() {
        return;
    }
    invocation_counter(namespace, function, source, status).increment(1);
    histogram(
        names::INVOCATION_DURATION,
        function_labels(namespace, function),
    )
    .record(took.as_secs_f64());
    if cold_start {
        counter(names::COLD_STARTS, function_labels(namespace, function)).increment(1);
    }
}

/// The request counters of one route template, cached per status: for the hottest
/// routes, which the gateway answers before routing.
pub struct RouteCounters {
    route: &'static str,
    by_status: [OnceLock<Counter>; STATUSES.len()],
}

impl RouteCounters {
    pub const fn new(route: &'static str) -> Self {
        Self {
            route,
            by_status: [const { OnceLock::new() }; STATUSES.len()],
        }
    }

    /// Counts a request to this route answered with `status`.
    #[inline]
    pub fn request(&self, status: u16) {
        if !enabled() {
            return;
        }
        match status_slot(status) {
            Some(slot) => self.by_status[slot]
                .get_or_init(|| http_counter(self.route, status))
                .increment(1),
            None => http_counter(self.route, status).increment(1),
        }
    }
}

fn http_counter(route: &str, status: u16) -> Counter {
    counter(
        names::HTTP_REQUESTS,
        vec![
            Label::new("route", route.to_string()),
            Label::new("status", status.to_string()),
        ],
    )
}

/// Counts an HTTP request to the route template `route` (`None`: no route matched)
/// answered with `status`.
pub fn http_request(route: Option<&str>, status: u16) {
    if !enabled() {
        return;
    }
    http_counter(route.unwrap_or("unmatched"), status).increment(1);
}

/// One delivery engine's counters (a queue or device trigger, or a function's async
/// calls), one per outcome of [`DELIVERY_OUTCOMES`].
#[derive(Clone)]
pub struct DeliveryMetrics {
    pub received: Counter,
    pub succeeded: Counter,
    pub retried: Counter,
    pub failed: Counter,
    pub dead_lettered: Counter,
}

impl std::fmt::Debug for DeliveryMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryMetrics").finish_non_exhaustive()
    }
}

impl DeliveryMetrics {
    /// The counters of a queue or device trigger.
    pub fn queue(namespace: &str, trigger: &str) -> Self {
        Self::of(names::QUEUE_MESSAGES, ("trigger", trigger), namespace)
    }

    /// The counters of a function's async calls.
    pub fn async_calls(namespace: &str, function: &str) -> Self {
        Self::of(names::ASYNC_CALLS, ("function", function), namespace)
    }

    fn of(name: &'static str, (key, value): (&'static str, &str), namespace: &str) -> Self {
        let make = |outcome: &'static str| {
            if !enabled() {
                return Counter::noop();
            }
            counter(
                name,
                vec![
                    Label::new("namespace", namespace.to_string()),
                    Label::new(key, value.to_string()),
                    Label::from_static_parts("outcome", outcome),
                ],
            )
        };
        let [received, succeeded, retried, failed, dead_lettered] = DELIVERY_OUTCOMES.map(make);
        Self {
            received,
            succeeded,
            retried,
            failed,
            dead_lettered,
        }
    }
}

/// A build's result for [`names::BUILDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildResult {
    Ok,
    /// The code's fault (does not build, times out, unsupported).
    Failed,
    /// The server's fault (sandbox, disk).
    Error,
    /// Identical code was built before; nothing ran.
    Reused,
}

impl BuildResult {
    pub fn as_str(self) -> &'static str {
        match self {
            BuildResult::Ok => "ok",
            BuildResult::Failed => "failed",
            BuildResult::Error => "error",
            BuildResult::Reused => "reused",
        }
    }
}

/// Records a build; `took` for builds that ran.
pub fn build(result: BuildResult, took: Option<Duration>) {
    if !enabled() {
        return;
    }
    counter(
        names::BUILDS,
        vec![Label::from_static_parts("result", result.as_str())],
    )
    .increment(1);
    if let Some(took) = took {
        histogram(names::BUILD_DURATION, Vec::new()).record(took.as_secs_f64());
    }
}

/// Counts `n` telemetry messages stored.
pub fn telemetry_messages(n: u64) {
    if !enabled() {
        return;
    }
    counter(names::TELEMETRY_MESSAGES, Vec::new()).increment(n);
}

/// The instance counts by state, as of now (set before each scrape).
pub fn set_instances(ready: u64, starting: u64, warm: u64) {
    if !enabled() {
        return;
    }
    for (state, n) in [("ready", ready), ("starting", starting), ("warm", warm)] {
        gauge(
            names::INSTANCES,
            vec![Label::from_static_parts("state", state)],
        )
        .set(n as f64);
    }
}

/// The dead letters stored now (set before each scrape).
pub fn set_dead_letters(n: u64) {
    if enabled() {
        gauge(names::DEAD_LETTERS, Vec::new()).set(n as f64);
    }
}

/// The async calls queued or running now (set before each scrape).
pub fn set_async_calls_queued(n: u64) {
    if enabled() {
        gauge(names::ASYNC_CALLS_QUEUED, Vec::new()).set(n as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_statuses_are_sorted_so_the_search_finds_them() {
        assert!(STATUSES.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(status_slot(200), Some(0));
        assert_eq!(status_slot(504), Some(STATUSES.len() - 1));
        assert_eq!(status_slot(599), None);
    }

    #[test]
    fn recorded_series_render_with_their_labels() {
        let exporter = install().expect("install");
        let f = FunctionMetrics::new("ns-a", "fn-a");
        f.invocation("http", 200, Duration::from_millis(3), true);
        f.invocation("http", 200, Duration::from_millis(4), false);
        f.invocation("http", 599, Duration::from_millis(4), false);
        f.invocation("queue", 500, Duration::from_millis(4), false);
        RouteCounters::new("/fn/{ns}/{name}").request(404);
        http_request(None, 404);
        build(BuildResult::Ok, Some(Duration::from_secs(2)));
        let queue = DeliveryMetrics::queue("ns-a", "orders");
        queue.received.increment(2);
        set_instances(1, 2, 3);
        let text = exporter.render();
        for line in [
            r#"sless_invocations_total{namespace="ns-a",function="fn-a",source="http",status="200"} 2"#,
            r#"sless_invocations_total{namespace="ns-a",function="fn-a",source="http",status="599"} 1"#,
            r#"sless_invocations_total{namespace="ns-a",function="fn-a",source="queue",status="500"} 1"#,
            r#"sless_invocation_duration_seconds_count{namespace="ns-a",function="fn-a"} 4"#,
            r#"sless_invocation_duration_seconds_bucket{namespace="ns-a",function="fn-a",le="0.005"} 4"#,
            r#"sless_cold_starts_total{namespace="ns-a",function="fn-a"} 1"#,
            r#"sless_http_requests_total{route="/fn/{ns}/{name}",status="404"} 1"#,
            r#"sless_http_requests_total{route="unmatched",status="404"} 1"#,
            r#"sless_builds_total{result="ok"} 1"#,
            r#"sless_build_duration_seconds_count 1"#,
            r#"sless_queue_messages_total{namespace="ns-a",trigger="orders",outcome="received"} 2"#,
            r#"sless_instances{state="starting"} 2"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(text.contains("# TYPE sless_invocation_duration_seconds histogram"));
    }
}
