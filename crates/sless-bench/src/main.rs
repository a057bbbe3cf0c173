//! `sless-bench`: starts a `sless serve`, measures deploys, cold starts, warm throughput and
//! scaling against baselines taken in the same run, and prints a table and `key=value` lines.

mod backends;
mod code;
mod cpu;
mod error;
mod events;
mod golang;
mod load;
mod measure;
mod procs;
mod stats;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use sless_core::QueueKind;
use tokio::signal::unix::{SignalKind, signal};

use crate::error::{BenchError, Result};
use crate::measure::{ColdRuntime, Plan};
use crate::procs::{Server, ServerConfig};
use crate::stats::Figures;

/// Measures a sless server against baselines in one run; prints a markdown table and one
/// `key=value` line per figure on stdout, progress on stderr.
#[derive(Debug, Parser)]
#[command(name = "sless-bench", version)]
struct Options {
    /// Fewer runs and shorter load: a smoke test of the bench, not figures to quote.
    #[arg(long)]
    quick: bool,
    /// Measure only these figures (comma-separated keys, e.g. `cold_ms_p50_python,scale_ratio`).
    /// Figures measured together (and those a target refers to) come along.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Alternating rounds of every load comparison; each ratio and CPU figure is printed with
    /// its min / median / max over them. Default: 5, or 3 with --quick.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: Option<u32>,
    /// The `sless` binary to start; default: `sless` next to this program. Any build of
    /// sless will do, e.g. an older one kept to compare against (see scripts/bench).
    #[arg(long, env = "SLESS_BENCH_SLESS")]
    sless: Option<PathBuf>,
    /// The Python interpreter functions run with (and the baselines).
    #[arg(long, env = "SLESS_BENCH_PYTHON", default_value = "/usr/bin/python3")]
    python: PathBuf,
    /// The Node.js interpreter functions run with (and the plain Node baseline).
    #[arg(long, env = "SLESS_BENCH_NODE", default_value = "/usr/bin/node")]
    node: PathBuf,
    /// bubblewrap, which the server's sandbox needs.
    #[arg(long, env = "SLESS_BENCH_BWRAP", default_value = "/usr/bin/bwrap")]
    bwrap: PathBuf,
    /// The repository checkout, for `runtimes/python/sless_runtime.py`; default: the one this
    /// program was built from.
    #[arg(long, env = "SLESS_BENCH_REPO")]
    repo: Option<PathBuf>,
    /// Concurrent keep-alive connections of every load run.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    connections: u16,
}

/// A set of figures measured together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    // Declaration order is run order: the baselines that need no server first, so that
    // nothing of the platform runs beside them, then the idle RSS of a fresh server.
    Bare,
    PythonShim,
    Rss,
    Deploy,
    ColdPython,
    ColdNode,
    WarmNode,
    Metrics,
    Go,
    Scale,
    QueueAmqp,
    QueueKafka,
    QueueMqtt,
    QueueNats,
    Async,
    Telemetry,
    Backends,
}

impl Group {
    const ALL: [Group; 17] = [
        Group::Bare,
        Group::PythonShim,
        Group::Rss,
        Group::Deploy,
        Group::ColdPython,
        Group::ColdNode,
        Group::WarmNode,
        Group::Metrics,
        Group::Go,
        Group::Scale,
        Group::QueueAmqp,
        Group::QueueKafka,
        Group::QueueMqtt,
        Group::QueueNats,
        Group::Async,
        Group::Telemetry,
        Group::Backends,
    ];

    /// The group that measures `key`.
    fn of(key: &str) -> Option<Group> {
        Some(match key {
            "server_rss_mb_idle" => Group::Rss,
            "bare_python_ms_p50" => Group::Bare,
            "deploy_ms_p50" => Group::Deploy,
            "cold_ms_p50_python" | "cold_ms_p99_python" | "cold_ms_p50_python_hostnet" => {
                Group::ColdPython
            }
            "cold_ms_p50_node" => Group::ColdNode,
            "warm_rps_direct"
            | "warm_rps_gateway"
            | "gateway_ratio"
            | "warm_p50_ms_gateway"
            | "warm_p99_ms_gateway"
            | "server_cpu_us_per_req"
            | "instance_cpu_us_per_req"
            | "instance_cpu_us_per_req_direct"
            | "gateway_cpu_ratio"
            | "gateway_vs_plain_node" => Group::WarmNode,
            "cold_ms_p50_go"
            | "deploy_ms_p50_go"
            | "warm_rps_gateway_go"
            | "go_vs_node_gateway" => Group::Go,
            "python_shim_ratio" => Group::PythonShim,
            "gateway_cpu_us_metrics_on" | "gateway_cpu_us_metrics_off" | "metrics_cpu_ratio" => {
                Group::Metrics
            }
            "scale_ratio" => Group::Scale,
            "queue_msgs_per_s_amqp" | "queue_vs_broker_amqp" => Group::QueueAmqp,
            "queue_msgs_per_s_kafka" | "queue_vs_broker_kafka" => Group::QueueKafka,
            "queue_msgs_per_s_mqtt" | "queue_vs_broker_mqtt" => Group::QueueMqtt,
            "queue_msgs_per_s_nats" | "queue_vs_broker_nats" => Group::QueueNats,
            "async_calls_per_s" | "async_vs_sync" => Group::Async,
            "telemetry_msgs_per_s" | "mqtt_broker_msgs_per_s" | "telemetry_vs_broker" => {
                Group::Telemetry
            }
            "gateway_ratio_pg"
            | "gateway_ratio_pg_no_records"
            | "server_cpu_us_per_req_sqlite"
            | "server_cpu_us_per_req_pg"
            | "postgres_cpu_us_per_req"
            | "warm_p50_ms_gateway_sqlite"
            | "warm_p50_ms_gateway_pg"
            | "deploy_ratio_pg_s3"
            | "record_write_ms_per_1000_sqlite"
            | "record_write_ms_per_1000_pg" => Group::Backends,
            _ => return None,
        })
    }

    /// Whether the group needs a running `sless serve`.
    fn needs_server(self) -> bool {
        // The telemetry figures start a server of their own, with its MQTT broker.
        !matches!(self, Group::Bare | Group::PythonShim | Group::Telemetry)
    }
}

/// A figure's key without a spread suffix (`gateway_ratio_median` → `gateway_ratio`), so
/// `--only` takes the keys of the `key=value` lines too.
fn base_key(key: &str) -> &str {
    stats::SPREAD_SUFFIXES
        .iter()
        .filter_map(|suffix| key.strip_suffix(suffix))
        .find(|base| Group::of(base).is_some())
        .unwrap_or(key)
}

/// What `--only` selects: the groups of the keys, plus the bare Python figure that the
/// deploy and cold-start targets are relative to. Empty selects everything.
fn select(only: &[String]) -> Result<(BTreeSet<Group>, bool)> {
    let keys: Vec<&str> = only
        .iter()
        .map(|k| base_key(k.trim()))
        .filter(|k| !k.is_empty())
        .collect();
    if keys.is_empty() {
        return Ok((Group::ALL.into_iter().collect(), true));
    }
    let mut groups = BTreeSet::new();
    for key in &keys {
        let group = Group::of(key).ok_or_else(|| {
            let known: Vec<&str> = stats::FIGURES.iter().map(|(k, _, _)| *k).collect();
            BenchError::Usage(format!(
                "unknown figure {key:?} in --only; known: {}",
                known.join(", ")
            ))
        })?;
        groups.insert(group);
    }
    if groups.contains(&Group::Deploy) || groups.contains(&Group::ColdPython) {
        groups.insert(Group::Bare);
    }
    let plain_node = keys.contains(&"gateway_vs_plain_node");
    Ok((groups, plain_node))
}

/// Fails with a clear message when a program the selected groups need is missing.
fn preflight(opts: &Options, sless: &Path, shim: &Path, groups: &BTreeSet<Group>) -> Result<()> {
    let needs_server = groups.iter().any(|g| g.needs_server());
    let mut checks: Vec<(&'static str, &Path, &'static str)> = vec![(
        "Python interpreter",
        &opts.python,
        "install python3 (apt-get install python3) or pass --python",
    )];
    if needs_server {
        checks.push((
            "sless binary",
            sless,
            "build it with `cargo build --release -p sless` or pass --sless",
        ));
        checks.push((
            "bubblewrap",
            &opts.bwrap,
            "the sandbox needs it: apt-get install bubblewrap, or pass --bwrap",
        ));
    }
    if needs_server || groups.contains(&Group::WarmNode) {
        checks.push((
            "Node.js interpreter",
            &opts.node,
            "install nodejs (apt-get install nodejs) or pass --node",
        ));
    }
    if groups.contains(&Group::PythonShim) {
        checks.push((
            "Python runtime shim",
            shim,
            "pass --repo with the sless checkout that holds runtimes/python/sless_runtime.py",
        ));
    }
    for (what, path, hint) in checks {
        if !path.is_file() {
            return Err(BenchError::MissingTool {
                what,
                path: path.to_path_buf(),
                hint,
            });
        }
    }
    Ok(())
}

/// The `sless` binary next to this one (both are built into `target/release`).
fn default_sless() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("sless")))
        .unwrap_or_else(|| PathBuf::from("target/release/sless"))
}

/// What a run measures and with which programs, resolved from the options.
struct Setup<'a> {
    opts: &'a Options,
    groups: BTreeSet<Group>,
    /// Whether to run the plain Node baseline (only `gateway_vs_plain_node` needs it).
    plain_node: bool,
    sless: PathBuf,
    shim: PathBuf,
    /// The run's own temporary directory (server data, baselines' code and sockets).
    scratch: &'a Path,
}

/// Runs the selected measurements, starting the server when the first one needs it.
/// The server is left in `slot` so the caller stops it whatever happens here.
async fn measure_all(
    setup: &Setup<'_>,
    slot: &mut Option<Server>,
    figures: &mut Figures,
) -> Result<()> {
    let Setup {
        opts,
        groups,
        plain_node,
        sless,
        shim,
        scratch,
    } = setup;
    let (plain_node, scratch) = (*plain_node, *scratch);
    let plan = Plan::new(opts.quick, usize::from(opts.connections), opts.rounds);
    for group in groups {
        if group.needs_server() && slot.is_none() {
            let server = Server::start(&ServerConfig {
                binary: sless,
                python: &opts.python,
                node: &opts.node,
                scratch,
                mqtt_listen: None,
                extra_args: &[],
                extra_env: &[],
            })
            .await?;
            eprintln!("sless-bench: sless serve listening on {}", server.addr);
            *slot = Some(server);
        }
        if let Some(server) = slot.as_mut() {
            // A server that died under a previous measurement would make every later one
            // fail with a confusing connection error; say what happened instead.
            server.check_running()?;
        }
        let server = slot.as_ref();
        match group {
            Group::Rss => measure::server_rss(need(server)?, figures).await?,
            Group::Bare => measure::bare_python(&opts.python, plan.bare_runs, figures).await?,
            Group::Deploy => measure::deploy(need(server)?, plan.deploy_runs, figures).await?,
            Group::ColdPython => {
                measure::cold(need(server)?, ColdRuntime::Python, plan.cold_runs, figures).await?
            }
            Group::ColdNode => {
                measure::cold(need(server)?, ColdRuntime::Node, plan.cold_runs, figures).await?
            }
            Group::WarmNode => {
                measure::warm_node(
                    need(server)?,
                    &opts.node,
                    scratch,
                    &plan,
                    plain_node,
                    figures,
                )
                .await?
            }
            Group::Go => {
                let server = need(server)?;
                measure::cold(server, ColdRuntime::Go, plan.cold_runs, figures).await?;
                golang::go(server, &plan, figures).await?
            }
            Group::PythonShim => {
                measure::python_shim(&opts.python, shim, scratch, &plan, figures).await?
            }
            Group::Metrics => {
                // The same server with metrics off, beside the one measured everywhere else.
                let dir = scratch.join("metrics-off");
                std::fs::create_dir_all(&dir).map_err(error::io("create a scratch directory"))?;
                let mut off = Server::start(&ServerConfig {
                    binary: sless,
                    python: &opts.python,
                    node: &opts.node,
                    scratch: &dir,
                    mqtt_listen: None,
                    extra_args: &["--metrics=false".to_string()],
                    extra_env: &[],
                })
                .await?;
                let measured = measure::metrics_cost(need(server)?, &off, &plan, figures).await;
                measured.and(off.stop().await)?
            }
            Group::Scale => measure::scale(need(server)?, &plan, figures).await?,
            Group::QueueAmqp => {
                events::queue(need(server)?, QueueKind::Amqp, &plan, figures).await?
            }
            Group::QueueKafka => {
                events::queue(need(server)?, QueueKind::Kafka, &plan, figures).await?
            }
            Group::QueueMqtt => {
                events::queue(need(server)?, QueueKind::Mqtt, &plan, figures).await?
            }
            Group::QueueNats => {
                events::queue(need(server)?, QueueKind::Nats, &plan, figures).await?
            }
            Group::Async => events::async_calls(need(server)?, &plan, figures).await?,
            Group::Telemetry => {
                let dir = scratch.join("telemetry");
                std::fs::create_dir_all(&dir).map_err(error::io("create a scratch directory"))?;
                let mqtt = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map_err(error::io("find a free loopback port"))?;
                let server = Server::start(&ServerConfig {
                    binary: sless,
                    python: &opts.python,
                    node: &opts.node,
                    scratch: &dir,
                    mqtt_listen: Some(mqtt),
                    extra_args: &[],
                    extra_env: &[],
                })
                .await?;
                events::telemetry(&server, mqtt.port(), &plan, figures).await?
            }
            Group::Backends => {
                let programs = backends::Programs {
                    sless,
                    python: &opts.python,
                    node: &opts.node,
                };
                backends::measure(need(server)?, &programs, scratch, &plan, figures).await?
            }
        }
    }
    Ok(())
}

/// The server, for a group that needs one (started before it by `measure_all`).
fn need(server: Option<&Server>) -> Result<&Server> {
    server.ok_or_else(|| BenchError::Setup("no server was started".into()))
}

/// SIGINT, SIGTERM and SIGHUP, watched from the start of the run so none of them kills the
/// bench before it has stopped what it started.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        let watch =
            |kind: SignalKind, name: &str| signal(kind).map_err(error::io(format!("watch {name}")));
        Ok(Signals {
            int: watch(SignalKind::interrupt(), "SIGINT")?,
            term: watch(SignalKind::terminate(), "SIGTERM")?,
            hup: watch(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    /// Resolves with the name of the first signal that arrives.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}

/// The `sless` binary a run starts.
fn sless_binary(opts: &Options) -> PathBuf {
    opts.sless.clone().unwrap_or_else(default_sless)
}

/// The whole run: checks, measurements, and stopping the server whatever happened.
/// Returns the figures measured, and the error that ended the run early, if any.
async fn run(opts: &Options) -> (Figures, Result<()>) {
    let mut figures = Figures::default();
    let outcome = async {
        let mut signals = Signals::install()?;
        let (groups, plain_node) = select(&opts.only)?;
        let sless = sless_binary(opts);
        let repo = opts
            .repo
            .clone()
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
        let shim = repo.join("runtimes/python/sless_runtime.py");
        preflight(opts, &sless, &shim, &groups)?;
        let scratch = tempfile::Builder::new()
            .prefix("sless-bench-")
            .tempdir()
            .map_err(error::io("create a scratch directory"))?;
        let setup = Setup {
            opts,
            groups,
            plain_node,
            sless,
            shim,
            scratch: scratch.path(),
        };
        let mut slot = None;
        let measured = tokio::select! {
            result = measure_all(&setup, &mut slot, &mut figures) => result,
            name = signals.recv() => Err(BenchError::Interrupted(name)),
        };
        let stopped = match slot.as_mut() {
            Some(server) => {
                eprintln!("sless-bench: stopping sless serve");
                server.stop().await
            }
            None => Ok(()),
        };
        measured.and(stopped)
    }
    .await;
    (figures, outcome)
}

/// The 1-minute load average from `/proc/loadavg`, `?` when unreadable.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn main() -> ExitCode {
    let opts = Options::parse();
    // Two workers: the machine this runs on has two cores, shared with the server under
    // test and its instances, so a bigger pool would only add contention.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sless-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let load_before = load_average();
    let (figures, outcome) = runtime.block_on(run(&opts));
    if !figures.is_empty() {
        println!("{}", figures.table());
        // Other work on the machine moves every figure; say how busy it was, and which
        // build was measured, so runs of two builds are told apart.
        let sless = sless_binary(&opts);
        let sless = std::fs::canonicalize(&sless).unwrap_or(sless);
        println!(
            "_{} CPUs; load average {} at start, {} at end; sless: {}_\n",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_before,
            load_average(),
            sless.display()
        );
        print!("{}", figures.key_values());
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sless-bench: error: {}", load::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_figure_belongs_to_a_group() {
        for (key, _, _) in stats::FIGURES {
            assert!(Group::of(key).is_some(), "{key} has no group");
        }
    }

    #[test]
    fn no_selection_means_everything() {
        let (groups, plain) = select(&[]).expect("select");
        assert_eq!(groups.len(), Group::ALL.len());
        assert!(plain);
    }

    #[test]
    fn relative_targets_bring_their_reference() {
        let (groups, plain) = select(&["deploy_ms_p50".into()]).expect("select");
        assert_eq!(
            groups.into_iter().collect::<Vec<_>>(),
            vec![Group::Bare, Group::Deploy]
        );
        assert!(!plain);
        let (groups, plain) =
            select(&["scale_ratio".into(), " gateway_vs_plain_node ".into()]).expect("select");
        assert_eq!(
            groups.into_iter().collect::<Vec<_>>(),
            vec![Group::WarmNode, Group::Scale]
        );
        assert!(plain);
    }

    #[test]
    fn spread_keys_select_their_figure() {
        let (groups, plain) = select(&[
            "gateway_ratio_median".into(),
            "server_cpu_us_per_req_max".into(),
        ])
        .expect("select");
        assert_eq!(
            groups.into_iter().collect::<Vec<_>>(),
            vec![Group::WarmNode]
        );
        assert!(!plain);
        let (_, plain) = select(&["gateway_vs_plain_node_min".into()]).expect("select");
        assert!(plain);
        assert_eq!(base_key("scale_ratio_max"), "scale_ratio");
        assert_eq!(base_key("warp_speed_max"), "warp_speed_max");
        assert!(select(&["gateway_ratio_p50".into()]).is_err());
    }

    #[test]
    fn unknown_keys_are_refused_with_the_known_ones() {
        let err = select(&["warp_speed".into()]).expect_err("unknown");
        let text = err.to_string();
        assert!(
            text.contains("warp_speed") && text.contains("scale_ratio"),
            "{text}"
        );
    }

    #[test]
    fn missing_programs_are_named_with_a_hint() {
        let opts = Options::parse_from([
            "sless-bench",
            "--python",
            "/nonexistent/python3",
            "--only",
            "bare_python_ms_p50",
        ]);
        let (groups, _) = select(&opts.only).expect("select");
        let err = preflight(&opts, Path::new("/x"), Path::new("/y"), &groups).expect_err("missing");
        let text = err.to_string();
        assert!(
            text.contains("/nonexistent/python3") && text.contains("--python"),
            "{text}"
        );
    }

    #[test]
    fn options_parse() {
        let opts = Options::parse_from([
            "sless-bench",
            "--quick",
            "--only",
            "a,b",
            "--connections",
            "4",
            "--rounds",
            "7",
            "--sless",
            "/work/old/sless",
        ]);
        assert!(opts.quick);
        assert_eq!(opts.only, vec!["a", "b"]);
        assert_eq!(opts.connections, 4);
        assert_eq!(opts.rounds, Some(7));
        assert_eq!(sless_binary(&opts), PathBuf::from("/work/old/sless"));
        assert!(Options::try_parse_from(["sless-bench", "--connections", "0"]).is_err());
        assert!(Options::try_parse_from(["sless-bench", "--rounds", "0"]).is_err());
        assert_eq!(
            Options::parse_from(["sless-bench"]).rounds,
            None,
            "the plan picks the default"
        );
    }
}
