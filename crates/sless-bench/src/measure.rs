//! The measurements: each deploys what it needs, measures, records its figures and removes
//! its functions again so the next one starts from an idle server.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sless_client::Function;

use crate::code;
use crate::cpu::{self, CpuSource, Meter};
use crate::error::{BenchError, Result, api, io};
use crate::load::{self, Comparison, Endpoint, LoadReport, LoadSpec, RequestTemplate, Target};
use crate::procs::{PlainNode, ProtocolConfig, ProtocolServer, Server};
use crate::stats::{Figures, percentile_ms};

/// Every function lives in the default namespace, which a fresh server has.
pub(crate) const NS: &str = "default";
/// How often the deploy measurement polls the status: fine enough for millisecond figures.
pub(crate) const DEPLOY_POLL: Duration = Duration::from_millis(2);
/// How often other waits poll the status.
const POLL: Duration = Duration::from_millis(5);
/// How long a deploy (build and, with `min_instances`, start) may take.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long old instances may take to drain after a new revision.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// The share of failed requests a load run may have and still count.
const MAX_ERROR_RATIO: f64 = 0.01;

/// How many runs and how much load; `--quick` makes everything smaller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub bare_runs: usize,
    pub deploy_runs: usize,
    pub cold_runs: usize,
    /// The load of each round of a comparison, per target.
    pub load: LoadSpec,
    /// Alternating rounds of each comparison (see [`load::compare`]); every ratio and CPU
    /// figure is reported with its spread over them.
    pub rounds: u32,
    /// Messages (and async calls) per round of the event figures.
    pub messages: usize,
}

/// Rounds of a full run: enough for a median that one disturbed round cannot move.
pub const FULL_ROUNDS: u32 = 5;
/// Rounds of a `--quick` run: the fewest that still have a middle one.
pub const QUICK_ROUNDS: u32 = 3;

impl Plan {
    /// The plan for a full run or a `--quick` smoke test, with `connections` connections and
    /// `rounds` rounds per comparison (default [`FULL_ROUNDS`] or [`QUICK_ROUNDS`]).
    pub fn new(quick: bool, connections: usize, rounds: Option<u32>) -> Plan {
        if quick {
            Plan {
                bare_runs: 5,
                deploy_runs: 3,
                cold_runs: 5,
                load: LoadSpec {
                    connections,
                    warmup: Duration::from_millis(300),
                    duration: Duration::from_millis(500),
                },
                rounds: rounds.unwrap_or(QUICK_ROUNDS).max(1),
                messages: 500,
            }
        } else {
            Plan {
                bare_runs: 20,
                deploy_runs: 10,
                cold_runs: 25,
                // Two-second rounds: long enough that a CPU counter read in clock ticks is
                // off by about one percent, short enough that alternating rounds see the
                // same machine.
                load: LoadSpec {
                    connections,
                    warmup: Duration::from_secs(1),
                    duration: Duration::from_secs(2),
                },
                rounds: rounds.unwrap_or(FULL_ROUNDS).max(1),
                messages: 5000,
            }
        }
    }
}

/// Prints a progress line to stderr (stdout carries only the results).
macro_rules! progress {
    ($($arg:tt)*) => { eprintln!("sless-bench: {}", format!($($arg)*)) };
}
pub(crate) use progress;

/// `bare_python_ms_p50`: wall time of `python -c pass`.
pub async fn bare_python(python: &Path, runs: usize, figures: &mut Figures) -> Result<()> {
    progress!("bare python start-up, {runs} runs");
    let mut samples = Vec::with_capacity(runs);
    // Two unmeasured runs bring the interpreter and its modules into the page cache, as
    // they are for the platform, which starts that same interpreter all the time.
    for i in 0..runs + 2 {
        let start = Instant::now();
        let status = tokio::process::Command::new(python)
            .args(["-c", "pass"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await
            .map_err(|source| BenchError::Spawn {
                what: format!("{} -c pass", python.display()),
                source,
            })?;
        let took = start.elapsed();
        if !status.success() {
            return Err(BenchError::Setup(format!(
                "{} -c pass failed: {status}",
                python.display()
            )));
        }
        if i >= 2 {
            samples.push(took);
        }
    }
    figures.set("bare_python_ms_p50", percentile_ms(&samples, 50.0));
    Ok(())
}

/// `server_rss_mb_idle`: the server's RSS with no functions, once it is healthy and settled.
pub async fn server_rss(server: &Server, figures: &mut Figures) -> Result<()> {
    // Let start-up work (reconcile of nothing, shim files written) finish first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = server.rss_mib()?;
    progress!("idle server RSS {rss:.1} MiB");
    figures.set("server_rss_mb_idle", rss);
    Ok(())
}

/// `deploy_ms_p50`: upload of new code → `Ready` for its revision, client-observed.
pub async fn deploy(server: &Server, runs: usize, figures: &mut Figures) -> Result<()> {
    progress!("deploy, {runs} runs");
    let name = "bench-deploy";
    let spec = json!({"runtime": "python3", "min_instances": 0});
    create(server, name, &spec, &[("handler.py", code::HELLO_PY)]).await?;
    let mut samples = Vec::with_capacity(runs);
    for run in 1..=runs as u64 {
        samples.push(deploy_once(server, name, run).await?);
    }
    remove(server, name).await?;
    figures.set("deploy_ms_p50", percentile_ms(&samples, 50.0));
    Ok(())
}

/// Uploads the Python hello's `run`-th variant to `name` and waits until it is `Ready`:
/// the time that took, client-observed.
pub(crate) async fn deploy_once(server: &Server, name: &str, run: u64) -> Result<Duration> {
    let source = code::deploy_py(run);
    let archive = code::zip(&[("handler.py", &source)])?;
    let start = Instant::now();
    let uploaded = server
        .client
        .upload_code(NS, name, archive)
        .await
        .map_err(api(format!("upload code to {name}")))?;
    wait_ready(server, name, uploaded.revision, DEPLOY_POLL).await?;
    Ok(start.elapsed())
}

/// The two cold-start figures' runtimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColdRuntime {
    Python,
    Node,
    Go,
}

/// `cold_ms_p50_python`/`cold_ms_p99_python` or `cold_ms_p50_node`: the first request to a
/// function at zero instances, through `/fn/`, client-observed. Python is measured twice in
/// the same run, interleaved so both see the same machine: with the default network
/// (`outbound`: a namespace of its own behind slirp4netns) and with `"network": "host"`
/// (`cold_ms_p50_python_hostnet`), which shows what the isolation costs.
pub async fn cold(
    server: &Server,
    runtime: ColdRuntime,
    runs: usize,
    figures: &mut Figures,
) -> Result<()> {
    let hello_go = code::hello_go(0);
    let (runtime_name, file, source) = match runtime {
        ColdRuntime::Python => ("python3", "handler.py", code::HELLO_PY),
        ColdRuntime::Node => ("nodejs", "handler.js", code::HELLO_NODE),
        ColdRuntime::Go => ("go", "handler.go", hello_go.as_str()),
    };
    let subjects: &[(&str, Option<&str>)] = match runtime {
        ColdRuntime::Python => &[
            ("bench-cold-py", None),
            ("bench-cold-py-hostnet", Some("host")),
        ],
        ColdRuntime::Node => &[("bench-cold-node", None)],
        ColdRuntime::Go => &[("bench-cold-go", None)],
    };
    progress!("cold start {runtime_name}, {runs} runs");
    for (name, network) in subjects {
        // Every deploy starts one instance of the new revision, even at min_instances 0 (it
        // proves the revision loads), so a new revision alone does not bring the function
        // back to zero. The shortest idle timeout lets the reaper stop that instance, and
        // the one each measured request started, within a couple of seconds.
        let mut spec = json!({"runtime": runtime_name, "min_instances": 0, "idle_timeout_sec": 1});
        if let Some(network) = network {
            spec["network"] = json!(network);
        }
        create(server, name, &spec, &[(file, source)]).await?;
    }
    let mut samples = vec![Vec::with_capacity(runs); subjects.len()];
    for run in 0..runs {
        for ((name, _), samples) in subjects.iter().zip(&mut samples) {
            samples.push(cold_once(server, name, run).await?);
        }
    }
    for (name, _) in subjects {
        remove(server, name).await?;
    }
    match runtime {
        ColdRuntime::Python => {
            figures.set("cold_ms_p50_python", percentile_ms(&samples[0], 50.0));
            figures.set("cold_ms_p99_python", percentile_ms(&samples[0], 99.0));
            figures.set(
                "cold_ms_p50_python_hostnet",
                percentile_ms(&samples[1], 50.0),
            );
        }
        ColdRuntime::Node => figures.set("cold_ms_p50_node", percentile_ms(&samples[0], 50.0)),
        ColdRuntime::Go => figures.set("cold_ms_p50_go", percentile_ms(&samples[0], 50.0)),
    }
    Ok(())
}

/// One cold request to `name`: after the first run, a new revision (the request is the first
/// of code no instance has served before, as after a deploy), then zero instances.
async fn cold_once(server: &Server, name: &str, run: usize) -> Result<Duration> {
    if run > 0 {
        let patched = server
            .client
            .patch_function(NS, name, &json!({"env": {"RUN": run.to_string()}}))
            .await
            .map_err(api(format!("patch {name}")))?;
        wait_ready(server, name, patched.status.revision, POLL).await?;
    }
    wait_no_instances(server, name).await?;
    let url = format!("http://{}/fn/{NS}/{name}", server.addr);
    let start = Instant::now();
    let resp = server
        .client
        .http()
        .get(&url)
        .send()
        .await
        .map_err(|e| BenchError::Setup(format!("first request to {name} failed: {e}")))?;
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap_or_default();
    let took = start.elapsed();
    if status != 200 || !body.contains("world") {
        return Err(BenchError::BadResponse {
            what: format!("first request to {name}"),
            status,
            body: body.chars().take(300).collect(),
        });
    }
    Ok(took)
}

/// The minimal event the direct and plain-Node runs hand the handler.
fn minimal_event() -> Value {
    json!({"method": "GET", "path": "/", "query": {}, "headers": {}, "body": null})
}

/// The warm Node figures: one instance hit directly on its socket, through `/fn/`, and a
/// plain Node server with the same handler — same generator, same connections, same run.
///
/// Around every round the server's and the instance's CPU counters are read, for
/// `server_cpu_us_per_req` and `instance_cpu_us_per_req` (through `/fn/`),
/// `instance_cpu_us_per_req_direct` (the instance alone) and `gateway_cpu_ratio`: what a
/// request through `/fn/` costs the server and the instance together, relative to what the
/// instance alone costs when hit directly.
pub async fn warm_node(
    server: &Server,
    node: &Path,
    scratch: &Path,
    plan: &Plan,
    with_plain: bool,
    figures: &mut Figures,
) -> Result<()> {
    let spec = plan.load;
    progress!(
        "warm node: direct vs gateway{}, {} connections, {} alternating rounds of {:?}",
        if with_plain { " vs plain node" } else { "" },
        spec.connections,
        plan.rounds,
        spec.duration
    );
    let name = "bench-warm-node";
    let fn_spec = json!({
        "runtime": "nodejs", "min_instances": 1, "max_instances": 1,
        "concurrency": spec.connections.max(1) * 2,
    });
    create(server, name, &fn_spec, &[("handler.js", code::HELLO_NODE)]).await?;
    let mut gateway = Target {
        name: "gateway".into(),
        endpoint: Endpoint::Tcp(server.addr),
        request: RequestTemplate::get(&format!("/fn/{NS}/{name}")),
        cpu: vec![Meter {
            name: "server",
            source: CpuSource::process(server.pid())?,
        }],
    };
    expect_ok(&gateway).await?;
    let direct_req = RequestTemplate::post_json("/_sless/invoke", &minimal_event())
        .with_header("x-sless-request-id", "bench")
        .with_header("x-sless-source", "http");
    let socket = function_socket(&server.data_dir.join("run"), &direct_req).await?;
    // Without cgroup CPU accounting (a sandbox without cgroups) the server's figure is
    // still worth having, so the instance's are left out rather than failing the run.
    let instance_cpu = match cpu::instance_cgroup(server.pid(), &socket) {
        Ok(source) => Some(Meter {
            name: "instance",
            source,
        }),
        Err(e) => {
            progress!("  no instance CPU figures: {}", load::error_chain(&e));
            None
        }
    };
    gateway.cpu.extend(instance_cpu.clone());
    let direct = Target {
        name: "direct".into(),
        endpoint: Endpoint::Unix(socket),
        request: direct_req,
        cpu: instance_cpu.into_iter().collect(),
    };
    expect_ok(&direct).await?;

    let mut targets = vec![direct, gateway];
    let plain = if with_plain {
        let code_dir = scratch.join("plain-node");
        std::fs::create_dir_all(&code_dir).map_err(io(format!("create {}", code_dir.display())))?;
        write(&code_dir.join("handler.js"), code::HELLO_NODE)?;
        let script = code_dir.join("plain_node_server.js");
        write(&script, code::PLAIN_NODE_JS)?;
        let plain = PlainNode::start(node, &script, &code_dir, &code_dir).await?;
        targets.push(Target {
            name: "plain node".into(),
            endpoint: Endpoint::Tcp(plain.addr),
            request: RequestTemplate::get("/"),
            cpu: Vec::new(),
        });
        Some(plain)
    } else {
        None
    };
    let outcome = compare_checked(&targets, plan).await;
    if let Some(plain) = plain {
        plain.stop().await?;
    }
    remove(server, name).await?;
    let comparison = outcome?;
    warm_figures(&comparison, figures);
    Ok(())
}

/// `gateway_cpu_us_metrics_on` / `_off`: the server's CPU time per warm `/fn/` request
/// (utime + stime of the server process, before and after each round) with metrics
/// recorded, on the run's server, and with `--metrics=false`, on a second server started
/// for it; alternating rounds, so both see the same machine. `metrics_cpu_ratio` is on / off.
pub async fn metrics_cost(
    on: &Server,
    off: &Server,
    plan: &Plan,
    figures: &mut Figures,
) -> Result<()> {
    let spec = plan.load;
    progress!(
        "metrics: gateway CPU with metrics on vs off, {} connections, {} alternating rounds of {:?}",
        spec.connections,
        plan.rounds,
        spec.duration
    );
    let name = "bench-metrics";
    let fn_spec = json!({
        "runtime": "nodejs", "min_instances": 1, "max_instances": 1,
        "concurrency": spec.connections.max(1) * 2,
    });
    let mut targets = Vec::new();
    for (label, server) in [("metrics on", on), ("metrics off", off)] {
        create(server, name, &fn_spec, &[("handler.js", code::HELLO_NODE)]).await?;
        let target = Target {
            name: label.into(),
            endpoint: Endpoint::Tcp(server.addr),
            request: RequestTemplate::get(&format!("/fn/{NS}/{name}")),
            cpu: vec![Meter {
                name: "server",
                source: CpuSource::process(server.pid())?,
            }],
        };
        expect_ok(&target).await?;
        targets.push(target);
    }
    let outcome = compare_checked(&targets, plan).await;
    remove(on, name).await?;
    remove(off, name).await?;
    let comparison = outcome?;
    let cpu_figures: [(&'static str, FromRound); 3] = [
        ("gateway_cpu_us_metrics_on", |r| r[0].cpu_us_per_req(0)),
        ("gateway_cpu_us_metrics_off", |r| r[1].cpu_us_per_req(0)),
        ("metrics_cpu_ratio", |r| {
            Some(ratio(r[0].cpu_us_per_req(0)?, r[1].cpu_us_per_req(0)?))
        }),
    ];
    for (key, of) in cpu_figures {
        if let Some(whole) = of(&comparison.totals) {
            let rounds = comparison.per_round(|r| of(r).unwrap_or(f64::NAN));
            figures.set_with_rounds(key, whole, &rounds);
        }
    }
    Ok(())
}

/// A figure computed from the reports of one round (or of the totals), when it can be.
type FromRound = fn(&[LoadReport]) -> Option<f64>;

/// The warm figures of a comparison of direct (target 0, CPU counter 0: the instance),
/// gateway (target 1, counters 0: the server, 1: the instance) and optionally plain Node
/// (target 2). A figure whose counter is missing is left out.
fn warm_figures(comparison: &Comparison, figures: &mut Figures) {
    let reports = &comparison.totals;
    let (direct, gateway) = (&reports[0], &reports[1]);
    figures.set("warm_rps_direct", direct.rps());
    figures.set("warm_rps_gateway", gateway.rps());
    figures.set_with_rounds(
        "gateway_ratio",
        ratio(gateway.rps(), direct.rps()),
        &comparison.per_round(|r| ratio(r[1].rps(), r[0].rps())),
    );
    figures.set("warm_p50_ms_gateway", gateway.latency_ms(50.0));
    figures.set("warm_p99_ms_gateway", gateway.latency_ms(99.0));
    if let Some(plain) = reports.get(2) {
        figures.set_with_rounds(
            "gateway_vs_plain_node",
            ratio(gateway.rps(), plain.rps()),
            &comparison.per_round(|r| ratio(r[1].rps(), r[2].rps())),
        );
    }
    let cpu_figures: [(&'static str, FromRound); 4] = [
        ("server_cpu_us_per_req", |r| r[1].cpu_us_per_req(0)),
        ("instance_cpu_us_per_req", |r| r[1].cpu_us_per_req(1)),
        ("instance_cpu_us_per_req_direct", |r| r[0].cpu_us_per_req(0)),
        ("gateway_cpu_ratio", |r| {
            let through_gateway = r[1].cpu_us_per_req(0)? + r[1].cpu_us_per_req(1)?;
            Some(ratio(through_gateway, r[0].cpu_us_per_req(0)?))
        }),
    ];
    for (key, of) in cpu_figures {
        if let Some(whole) = of(reports) {
            // A round without the figure counts as not measured (NaN), which the spread skips.
            let rounds = comparison.per_round(|r| of(r).unwrap_or(f64::NAN));
            figures.set_with_rounds(key, whole, &rounds);
        }
    }
}

/// `python_shim_ratio`: the shim vs a `ThreadingHTTPServer` serving the same handler, both
/// outside the sandbox on a Unix socket.
pub async fn python_shim(
    python: &Path,
    shim: &Path,
    scratch: &Path,
    plan: &Plan,
    figures: &mut Figures,
) -> Result<()> {
    let spec = plan.load;
    progress!(
        "python shim vs ThreadingHTTPServer, {} connections, {} alternating rounds of {:?}",
        spec.connections,
        plan.rounds,
        spec.duration
    );
    let root = scratch.join("python-shim");
    let code_dir = root.join("code");
    std::fs::create_dir_all(&code_dir).map_err(io(format!("create {}", code_dir.display())))?;
    write(&code_dir.join("handler.py"), code::ECHO_PY)?;
    let baseline = root.join("threading_server.py");
    write(&baseline, code::THREADING_BASELINE_PY)?;
    let request = RequestTemplate::post_json("/_sless/invoke", &json!({"name": "bench", "n": 1}))
        .with_header("x-sless-request-id", "bench")
        .with_header("x-sless-source", "invoke");

    let mut processes = Vec::new();
    let mut targets = Vec::new();
    for (what, script) in [
        ("python shim", shim),
        ("ThreadingHTTPServer", baseline.as_path()),
    ] {
        let run_dir = root.join(what.replace(' ', "-"));
        std::fs::create_dir_all(&run_dir).map_err(io(format!("create {}", run_dir.display())))?;
        let process = ProtocolServer::start(&ProtocolConfig {
            what,
            python,
            script,
            code_dir: &code_dir,
            run_dir: &run_dir,
            entrypoint: "handler.handle",
            concurrency: spec.connections.max(1),
        })
        .await?;
        targets.push(Target {
            name: what.into(),
            endpoint: Endpoint::Unix(process.socket.clone()),
            request: request.clone(),
            cpu: Vec::new(),
        });
        processes.push(process);
    }
    let mut outcome = Ok(Comparison::default());
    for target in &targets {
        if let Err(e) = expect_ok(target).await {
            outcome = Err(e);
        }
    }
    if outcome.is_ok() {
        outcome = compare_checked(&targets, plan).await;
    }
    for process in processes {
        process.stop().await?;
    }
    let comparison = outcome?;
    let reports = &comparison.totals;
    figures.set_with_rounds(
        "python_shim_ratio",
        ratio(reports[0].rps(), reports[1].rps()),
        &comparison.per_round(|r| ratio(r[0].rps(), r[1].rps())),
    );
    Ok(())
}

/// `scale_ratio`: a CPU-bound Python handler at `concurrency: 1` with two instances vs one,
/// through `/fn/`, under the same concurrent load.
pub async fn scale(server: &Server, plan: &Plan, figures: &mut Figures) -> Result<()> {
    let spec = plan.load;
    progress!(
        "scale: CPU-bound python, 2 instances vs 1, {} connections, {} alternating rounds of {:?}",
        spec.connections,
        plan.rounds,
        spec.duration
    );
    let mut targets = Vec::new();
    for instances in [1u32, 2] {
        let name = format!("bench-scale-{instances}");
        // Both instances start with the deployment, so the run measures serving with two
        // instances, not how fast the second one is started.
        let fn_spec = json!({
            "runtime": "python3", "min_instances": instances, "max_instances": instances,
            "concurrency": 1, "timeout_sec": 60,
        });
        create(server, &name, &fn_spec, &[("handler.py", code::CPU_PY)]).await?;
        targets.push(Target {
            request: RequestTemplate::get(&format!("/fn/{NS}/{name}")),
            endpoint: Endpoint::Tcp(server.addr),
            name,
            cpu: Vec::new(),
        });
    }
    let mut outcome = Ok(Comparison::default());
    for target in &targets {
        if let Err(e) = expect_ok(target).await {
            outcome = Err(e);
        }
    }
    if outcome.is_ok() {
        outcome = compare_checked(&targets, plan).await;
    }
    for target in &targets {
        remove(server, &target.name).await?;
    }
    let comparison = outcome?;
    let reports = &comparison.totals;
    figures.set_with_rounds(
        "scale_ratio",
        ratio(reports[1].rps(), reports[0].rps()),
        &comparison.per_round(|r| ratio(r[1].rps(), r[0].rps())),
    );
    Ok(())
}

/// Alternating load runs of `targets`, each checked for errors, with a progress line each.
pub(crate) async fn compare_checked(targets: &[Target], plan: &Plan) -> Result<Comparison> {
    let comparison = load::compare(targets, plan.load, plan.rounds).await?;
    let reports = &comparison.totals;
    for (target, report) in targets.iter().zip(reports) {
        let what = &target.name;
        let cpu: String = target
            .cpu
            .iter()
            .enumerate()
            .filter_map(|(i, meter)| Some((meter.name, report.cpu_us_per_req(i)?)))
            .map(|(name, us)| format!(", {name} CPU {us:.1} µs/req"))
            .collect();
        progress!(
            "  {what}: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, {} errors{cpu}",
            report.rps(),
            report.latency_ms(50.0),
            report.latency_ms(99.0),
            report.errors
        );
        if let Some(first) = report.first_failure.as_deref() {
            progress!("  {what}: first failure: {first}");
        }
    }
    for (target, report) in targets.iter().zip(reports) {
        report.check(&target.name, MAX_ERROR_RATIO)?;
    }
    Ok(comparison)
}

/// Sends the target's request once and fails unless it is answered with 200.
async fn expect_ok(target: &Target) -> Result<()> {
    let (status, body) = load::request_once(&target.endpoint, &target.request).await?;
    if status == 200 {
        Ok(())
    } else {
        Err(BenchError::BadResponse {
            what: format!("probe of {}", target.name),
            status,
            body: String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned(),
        })
    }
}

/// `a / b`, or 0 when `b` is 0 (nothing measured on the reference side).
pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Creates a function (replacing a leftover of the same name), uploads its code and waits
/// until it is `Ready`.
pub(crate) async fn create(
    server: &Server,
    name: &str,
    spec: &Value,
    files: &[(&str, &str)],
) -> Result<()> {
    if server.client.get_function(NS, name).await.is_ok() {
        remove(server, name).await?;
    }
    let mut body = spec.clone();
    body["name"] = json!(name);
    server
        .client
        .create_function(NS, &body)
        .await
        .map_err(api(format!("create function {name}")))?;
    let uploaded = server
        .client
        .upload_code(NS, name, code::zip(files)?)
        .await
        .map_err(api(format!("upload code to {name}")))?;
    wait_ready(server, name, uploaded.revision, POLL).await?;
    Ok(())
}

/// Deletes a function, which stops its instances.
pub(crate) async fn remove(server: &Server, name: &str) -> Result<()> {
    server
        .client
        .delete_function(NS, name)
        .await
        .map_err(api(format!("delete function {name}")))
}

/// Polls every `every` until the function's status is `Ready` for `revision` (or later).
pub(crate) async fn wait_ready(
    server: &Server,
    name: &str,
    revision: u64,
    every: Duration,
) -> Result<Function> {
    let start = Instant::now();
    loop {
        let function = server
            .client
            .get_function(NS, name)
            .await
            .map_err(api(format!("get function {name}")))?;
        let status = &function.status;
        if status.revision >= revision {
            match status.phase.as_str() {
                "Ready" => return Ok(function),
                "Failed" => {
                    return Err(BenchError::NotReady {
                        name: name.to_string(),
                        revision,
                        message: status.message.clone(),
                    });
                }
                _ => {}
            }
        }
        if start.elapsed() > READY_TIMEOUT {
            return Err(BenchError::Timeout {
                what: format!(
                    "{name} revision {revision} to be Ready (last: revision {} {})",
                    status.revision, status.phase
                ),
                waited: READY_TIMEOUT,
            });
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls until the function reports no ready or starting instance, so the next request is cold.
async fn wait_no_instances(server: &Server, name: &str) -> Result<()> {
    let start = Instant::now();
    loop {
        let function = server
            .client
            .get_function(NS, name)
            .await
            .map_err(api(format!("get function {name}")))?;
        let counts = function.status.instances;
        if counts.ready == 0 && counts.starting == 0 {
            return Ok(());
        }
        if start.elapsed() > DRAIN_TIMEOUT {
            return Err(BenchError::Timeout {
                what: format!(
                    "{name} to have no instances (still {} ready, {} starting)",
                    counts.ready, counts.starting
                ),
                waited: DRAIN_TIMEOUT,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The instance sockets under `<data>/run`: `<instance>/fn.sock` or `<instance>/sock/fn.sock`
/// (the executor has used both layouts).
fn socket_candidates(run_root: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(run_root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(format!("list {}", run_root.display()))(e)),
    };
    let mut sockets = Vec::new();
    for entry in entries {
        let dir = entry
            .map_err(io(format!("list {}", run_root.display())))?
            .path();
        for socket in [dir.join("fn.sock"), dir.join("sock").join("fn.sock")] {
            if socket.exists() {
                sockets.push(socket);
            }
        }
    }
    sockets.sort();
    Ok(sockets)
}

/// The socket of the one function instance that exists: the one that answers the hello
/// handler's result. The run directory also holds the warm pool's generic instances, which
/// have no function loaded, so a new directory alone does not identify it.
async fn function_socket(run_root: &Path, probe: &RequestTemplate) -> Result<PathBuf> {
    let candidates = socket_candidates(run_root)?;
    let mut found = Vec::new();
    for socket in &candidates {
        let endpoint = Endpoint::Unix(socket.clone());
        let answer =
            tokio::time::timeout(Duration::from_secs(5), load::request_once(&endpoint, probe))
                .await;
        if let Ok(Ok((200, body))) = answer
            && String::from_utf8_lossy(&body).contains("world")
        {
            found.push(socket.clone());
        }
    }
    match <[PathBuf; 1]>::try_from(found) {
        Ok([socket]) => Ok(socket),
        Err(found) => Err(BenchError::Setup(format!(
            "expected exactly one instance socket under {} answering the function, found {found:?} \
             among {candidates:?}",
            run_root.display()
        ))),
    }
}

fn write(path: &Path, content: &str) -> Result<()> {
    std::fs::write(path, content).map_err(io(format!("write {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_plans_are_smaller_but_complete() {
        let full = Plan::new(false, 8, None);
        let quick = Plan::new(true, 8, None);
        assert!(
            full.cold_runs >= 20,
            "the issue asks for at least 20 cold runs"
        );
        assert_eq!(full.bare_runs, 20);
        assert_eq!(full.deploy_runs, 10);
        assert!(quick.cold_runs < full.cold_runs && quick.cold_runs > 0);
        assert!(quick.load.duration < full.load.duration);
        assert_eq!(quick.load.connections, 8);
        assert_eq!((full.rounds, quick.rounds), (FULL_ROUNDS, QUICK_ROUNDS));
        assert!(quick.rounds < full.rounds && quick.rounds >= 3);
        assert_eq!(Plan::new(false, 8, Some(9)).rounds, 9);
        assert_eq!(Plan::new(true, 8, Some(0)).rounds, 1);
    }

    /// A round's report: `ok` requests in one second, with CPU counters used `cpu_ms` each
    /// over that second.
    fn round(ok: u64, cpu_ms: &[u64]) -> LoadReport {
        LoadReport {
            ok,
            window: Duration::from_secs(1),
            cpu: cpu_ms
                .iter()
                .map(|ms| load::CpuUse {
                    used_ns: ms * 1_000_000,
                    over: Duration::from_secs(1),
                })
                .collect(),
            ..LoadReport::default()
        }
    }

    #[test]
    fn warm_figures_have_whole_run_values_and_round_spreads() {
        // Direct: 10000 req/s at 20 µs instance CPU each; gateway: 3000 req/s at 40 µs
        // server + 30 µs instance CPU each, then a disturbed round at 2000 req/s.
        let rounds = vec![
            vec![round(10_000, &[200]), round(3000, &[120, 90])],
            vec![round(10_000, &[200]), round(2000, &[80, 60])],
            vec![round(10_000, &[200]), round(3000, &[120, 90])],
        ];
        let mut totals = vec![LoadReport::default(), LoadReport::default()];
        for r in &rounds {
            for (total, report) in totals.iter_mut().zip(r) {
                total.merge(report.clone());
            }
        }
        let mut figures = Figures::default();
        warm_figures(&Comparison { rounds, totals }, &mut figures);
        let close = |key: &str, want: f64| {
            let got = figures.get(key).unwrap_or(f64::NAN);
            assert!((got - want).abs() < 1e-9, "{key}: {got} != {want}");
        };
        close("warm_rps_gateway", 8000.0 / 3.0);
        close("gateway_ratio", 0.8 / 3.0);
        close("server_cpu_us_per_req", 40.0);
        close("instance_cpu_us_per_req", 30.0);
        close("instance_cpu_us_per_req_direct", 20.0);
        close("gateway_cpu_ratio", 3.5);
        let spread = figures.spread("gateway_ratio").expect("spread");
        assert_eq!((spread.min, spread.median, spread.max), (0.2, 0.3, 0.3));
        assert_eq!(spread.rounds, 3);
        assert!(figures.spread("warm_rps_gateway").is_none());
        assert!(figures.get("gateway_vs_plain_node").is_none());
    }

    #[test]
    fn warm_figures_leave_out_cpu_figures_without_counters() {
        let rounds = vec![vec![round(10_000, &[]), round(3000, &[120])]];
        let totals = rounds[0].clone();
        let mut figures = Figures::default();
        warm_figures(&Comparison { rounds, totals }, &mut figures);
        assert!(figures.get("server_cpu_us_per_req").is_some());
        for key in [
            "instance_cpu_us_per_req",
            "instance_cpu_us_per_req_direct",
            "gateway_cpu_ratio",
        ] {
            assert!(figures.get(key).is_none(), "{key}");
        }
    }

    #[test]
    fn ratios_guard_against_nothing_measured() {
        assert_eq!(ratio(10.0, 4.0), 2.5);
        assert_eq!(ratio(10.0, 0.0), 0.0);
    }

    #[test]
    fn socket_candidates_finds_both_layouts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = dir.path().join("run");
        assert!(
            socket_candidates(&run)
                .expect("missing is empty")
                .is_empty()
        );
        for sub in ["a", "b", "c/sock"] {
            std::fs::create_dir_all(run.join(sub)).expect("mkdir");
        }
        std::fs::write(run.join("b/fn.sock"), "").expect("write");
        std::fs::write(run.join("c/sock/fn.sock"), "").expect("write");
        assert_eq!(
            socket_candidates(&run).expect("list"),
            vec![run.join("b/fn.sock"), run.join("c/sock/fn.sock")]
        );
    }

    #[tokio::test]
    async fn function_socket_refuses_when_no_instance_answers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = dir.path().join("run");
        std::fs::create_dir_all(run.join("g1")).expect("mkdir");
        // A socket file nobody listens on: a stale or generic instance.
        std::fs::write(run.join("g1/fn.sock"), "").expect("write");
        let err = function_socket(&run, &RequestTemplate::get("/"))
            .await
            .expect_err("nothing answers");
        assert!(err.to_string().contains("exactly one"), "{err}");
    }

    #[test]
    fn the_minimal_event_has_the_gateway_fields() {
        let event = minimal_event();
        for field in ["method", "path", "query", "headers", "body"] {
            assert!(event.get(field).is_some(), "{field}");
        }
    }
}
