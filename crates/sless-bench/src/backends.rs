//! The production backends against the embedded ones, in the same run:
//!
//! - `gateway_ratio_pg`: warm gateway throughput of a server on PostgreSQL and S3 over
//!   one on SQLite and the local directory (the same Node hello, alternating rounds), with each server's CPU per
//!   request (`server_cpu_us_per_req_sqlite`, `_pg`). The invoke path never waits on
//!   the store, so the ratio should be about 1.
//! - `gateway_ratio_pg_no_records`: the same with invocation records off on both
//!   servers, so no backend does any work per request.
//! - `deploy_ratio_pg_s3`: deploy p50 (upload → `Ready`) on PostgreSQL and S3 (moto on
//!   loopback) over SQLite and the local directory, deploys interleaved.
//! - `record_write_ms_per_1000_sqlite`, `_pg`: the store's cost of writing 1,000
//!   invocation records, in the recorder's batches, in process (median of rounds).

use std::path::Path;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::json;
use sless_core::invocation::{InvocationRecord, InvocationSource};
use sless_records::RecordSink;
use sless_store::SqlStore;

use crate::code;
use crate::cpu::{self, Meter};
use crate::error::{BenchError, Result, io};
use crate::load::{Endpoint, RequestTemplate, Target};
use crate::measure::{NS, Plan, compare_checked, create, progress, ratio, remove};
use crate::procs::{Server, ServerConfig};
use crate::stats::{Figures, percentile_ms};

/// What the comparison servers run with.
pub struct Programs<'a> {
    pub sless: &'a Path,
    pub python: &'a Path,
    pub node: &'a Path,
}

/// Records per measured write, and per batch (the recorder's default batch size).
const RECORDS: usize = 1000;
const BATCH: usize = 500;

pub async fn measure(
    sqlite: &Server,
    programs: &Programs<'_>,
    scratch: &Path,
    plan: &Plan,
    figures: &mut Figures,
) -> Result<()> {
    let pg = tokio::task::spawn_blocking(sless_brokers::Postgres::start)
        .await
        .map_err(|e| BenchError::Setup(format!("starting PostgreSQL: {e}")))?
        .map_err(|e| BenchError::Setup(format!("starting PostgreSQL: {e:#}")))?;
    let database = |pg: &sless_brokers::Postgres| {
        pg.create_database()
            .map_err(|e| BenchError::Setup(format!("creating a database: {e:#}")))
    };

    record_writes(&database(&pg)?, scratch, plan, figures).await?;

    let moto = tokio::task::spawn_blocking(|| {
        let moto = sless_brokers::Moto::start()?;
        moto.create_bucket("sless-bench")?;
        Ok::<_, anyhow::Error>(moto)
    })
    .await
    .map_err(|e| BenchError::Setup(format!("starting moto: {e}")))?
    .map_err(|e| BenchError::Setup(format!("starting moto (S3): {e:#}")))?;
    let dir = scratch.join("backend-pg");
    std::fs::create_dir_all(&dir).map_err(io("create a scratch directory"))?;
    let url = database(&pg)?;
    let args: Vec<String> = [
        "--database-url",
        &url,
        "--blob-url",
        "s3://sless-bench/code",
        "--s3-endpoint",
        &moto.endpoint(),
        "--s3-region",
        sless_brokers::moto::REGION,
        "--s3-access-key-id",
        sless_brokers::moto::ACCESS_KEY_ID,
        "--s3-secret-access-key",
        sless_brokers::moto::SECRET_ACCESS_KEY,
    ]
    .map(str::to_owned)
    .into();
    let start = |dir: std::path::PathBuf, args: Vec<String>| async move {
        std::fs::create_dir_all(&dir).map_err(io("create a scratch directory"))?;
        Server::start(&ServerConfig {
            binary: programs.sless,
            python: programs.python,
            node: programs.node,
            scratch: &dir,
            mqtt_listen: None,
            extra_args: &args,
            extra_env: &[],
        })
        .await
    };
    let mut other = start(dir, args.clone()).await?;
    let postmaster = pg
        .pid()
        .ok_or_else(|| BenchError::Setup("PostgreSQL wrote no postmaster.pid".into()))?;
    let outcome = async {
        gateway(sqlite, &other, Some(postmaster), plan, figures).await?;
        deploy(sqlite, &other, plan, figures).await
    }
    .await;
    let stopped = other.stop().await;
    outcome.and(stopped)?;

    // The same comparison with invocation records off on both: what is left is the
    // invoke path itself, which never touches the store.
    let no_records = "--no-invocation-records".to_string();
    let mut plain = start(
        scratch.join("backend-sqlite-norec"),
        vec![no_records.clone()],
    )
    .await?;
    let mut pg_args = args;
    pg_args[1] = database(&pg)?;
    pg_args[3] = "s3://sless-bench/norec".into();
    pg_args.push(no_records);
    let mut other = match start(scratch.join("backend-pg-norec"), pg_args).await {
        Ok(server) => server,
        Err(e) => {
            let _ = plain.stop().await;
            return Err(e);
        }
    };
    let outcome = gateway(&plain, &other, None, plan, figures).await;
    let stopped = plain.stop().await.and(other.stop().await);
    outcome.and(stopped)
}

/// `gateway_ratio_pg`, both servers' CPU per request, and PostgreSQL's own (writing
/// the invocation records) on the same cores.
///
/// Without `postmaster`, the servers record no invocations: only
/// `gateway_ratio_pg_no_records` is set.
async fn gateway(
    sqlite: &Server,
    pg: &Server,
    postmaster: Option<u32>,
    plan: &Plan,
    figures: &mut Figures,
) -> Result<()> {
    progress!(
        "gateway on SQLite vs PostgreSQL{}, {} connections, {} alternating rounds of {:?}",
        if postmaster.is_none() {
            " (no invocation records)"
        } else {
            ""
        },
        plan.load.connections,
        plan.rounds,
        plan.load.duration
    );
    let name = "bench-backend-node";
    let spec = json!({
        "runtime": "nodejs", "min_instances": 1, "max_instances": 1,
        "concurrency": plan.load.connections.max(1) * 2,
    });
    let mut targets = Vec::new();
    for (label, server) in [("sqlite", sqlite), ("postgres", pg)] {
        create(server, name, &spec, &[("handler.js", code::HELLO_NODE)]).await?;
        targets.push(Target {
            name: format!("gateway on {label}"),
            endpoint: Endpoint::Tcp(server.addr),
            request: RequestTemplate::get(&format!("/fn/{NS}/{name}")),
            cpu: vec![Meter {
                name: "server",
                source: cpu::CpuSource::process(server.pid())?,
            }],
        });
    }
    if let Some(postmaster) = postmaster {
        targets[1].cpu.push(Meter {
            name: "postgres",
            source: cpu::CpuSource::with_children(postmaster)?,
        });
    }
    let comparison = compare_checked(&targets, plan).await;
    for server in [sqlite, pg] {
        remove(server, name).await?;
    }
    let comparison = comparison?;
    let totals = &comparison.totals;
    if postmaster.is_none() {
        figures.set_with_rounds(
            "gateway_ratio_pg_no_records",
            ratio(totals[1].rps(), totals[0].rps()),
            &comparison.per_round(|r| ratio(r[1].rps(), r[0].rps())),
        );
        return Ok(());
    }
    figures.set_with_rounds(
        "gateway_ratio_pg",
        ratio(totals[1].rps(), totals[0].rps()),
        &comparison.per_round(|r| ratio(r[1].rps(), r[0].rps())),
    );
    for (key, index, meter) in [
        ("server_cpu_us_per_req_sqlite", 0, 0),
        ("server_cpu_us_per_req_pg", 1, 0),
        ("postgres_cpu_us_per_req", 1, 1),
    ] {
        if let Some(whole) = totals[index].cpu_us_per_req(meter) {
            let rounds =
                comparison.per_round(|r| r[index].cpu_us_per_req(meter).unwrap_or(f64::NAN));
            figures.set_with_rounds(key, whole, &rounds);
        }
    }
    figures.set("warm_p50_ms_gateway_sqlite", totals[0].latency_ms(50.0));
    figures.set("warm_p50_ms_gateway_pg", totals[1].latency_ms(50.0));
    Ok(())
}

/// `deploy_ratio_pg_s3`: deploys to both servers, interleaved.
async fn deploy(sqlite: &Server, other: &Server, plan: &Plan, figures: &mut Figures) -> Result<()> {
    let runs = plan.deploy_runs;
    progress!("deploy on SQLite+local vs the other backends, {runs} runs each, interleaved");
    let name = "bench-backend-deploy";
    let spec = json!({"runtime": "python3", "min_instances": 0});
    let mut samples = [Vec::with_capacity(runs), Vec::with_capacity(runs)];
    for server in [sqlite, other] {
        create(server, name, &spec, &[("handler.py", code::HELLO_PY)]).await?;
    }
    for run in 1..=runs as u64 {
        for (i, server) in [sqlite, other].into_iter().enumerate() {
            samples[i].push(crate::measure::deploy_once(server, name, run).await?);
        }
    }
    for server in [sqlite, other] {
        remove(server, name).await?;
    }
    let (a, b) = (
        percentile_ms(&samples[0], 50.0),
        percentile_ms(&samples[1], 50.0),
    );
    progress!("  deploy p50: {a:.1} ms on SQLite+local, {b:.1} ms on the other backends");
    figures.set("deploy_ratio_pg_s3", ratio(b, a));
    Ok(())
}

/// `record_write_ms_per_1000_*`: rounds of 1,000 records written in batches.
async fn record_writes(
    postgres_url: &str,
    scratch: &Path,
    plan: &Plan,
    figures: &mut Figures,
) -> Result<()> {
    let rounds = plan.rounds.max(3) as usize;
    progress!("invocation records: {rounds} rounds of {RECORDS} on SQLite and PostgreSQL");
    let setup = |e: sless_store::StoreError| BenchError::Setup(format!("opening a store: {e}"));
    let sqlite = SqlStore::open(&scratch.join("records.db"))
        .await
        .map_err(setup)?;
    let pg = SqlStore::from_url(postgres_url).await.map_err(setup)?;
    let mut per_store = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (i, store) in [&sqlite, &pg].into_iter().enumerate() {
            let records = records(round);
            let start = Instant::now();
            for batch in records.chunks(BATCH) {
                store
                    .insert_batch(batch)
                    .await
                    .map_err(|e| BenchError::Setup(format!("writing records: {e}")))?;
            }
            per_store[i].push(start.elapsed().as_secs_f64() * 1000.0);
        }
    }
    for (key, samples) in [
        ("record_write_ms_per_1000_sqlite", &per_store[0]),
        ("record_write_ms_per_1000_pg", &per_store[1]),
    ] {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        figures.set_with_rounds(key, sorted[sorted.len() / 2], samples);
    }
    Ok(())
}

/// 1,000 records of one round (ids distinct across rounds).
fn records(round: usize) -> Vec<InvocationRecord> {
    let now = Utc::now();
    (0..RECORDS)
        .map(|i| InvocationRecord {
            id: format!("r{round:03}-{i:05}"),
            namespace: "bench".into(),
            function: "f".into(),
            revision: 1,
            source: InvocationSource::Http,
            request_id: format!("req-{round}-{i}"),
            started_at: now,
            duration: Duration::from_micros(1500),
            status: 200,
            cold_start: i == 0,
            error: None,
            attempt: None,
            trigger: None,
            call_id: None,
        })
        .collect()
}
