//! The Go runtime's figures: `deploy_ms_p50_go` (a code-only change with the server's Go
//! build cache warm, upload to `Ready`), and warm throughput of a Go hello through the
//! gateway next to the Node one in the same alternating rounds (`warm_rps_gateway_go`,
//! `go_vs_node_gateway`). `cold_ms_p50_go` comes from [`measure::cold`].

use std::time::Instant;

use serde_json::json;

use crate::code;
use crate::error::{Result, api};
use crate::load::{Endpoint, RequestTemplate, Target};
use crate::measure::{self, NS, Plan, progress};
use crate::procs::Server;
use crate::stats::{Figures, percentile_ms};

/// `deploy_ms_p50_go`, then the gateway comparison of Go and Node.
pub async fn go(server: &Server, plan: &Plan, figures: &mut Figures) -> Result<()> {
    let runs = plan.deploy_runs;
    progress!("deploy go (code-only change, warm build cache), {runs} runs");
    let name = "bench-deploy-go";
    let spec = json!({"runtime": "go", "min_instances": 0});
    // The first build fills the cache (the standard library); it is not measured.
    measure::create(server, name, &spec, &[("handler.go", &code::hello_go(0))]).await?;
    let mut samples = Vec::with_capacity(runs);
    for run in 1..=runs as u64 {
        let archive = code::zip(&[("handler.go", &code::hello_go(run))])?;
        let start = Instant::now();
        let uploaded = server
            .client
            .upload_code(NS, name, archive)
            .await
            .map_err(api(format!("upload code to {name}")))?;
        measure::wait_ready(server, name, uploaded.revision, measure::DEPLOY_POLL).await?;
        samples.push(start.elapsed());
    }
    measure::remove(server, name).await?;
    figures.set("deploy_ms_p50_go", percentile_ms(&samples, 50.0));

    let load = plan.load;
    progress!(
        "warm go vs node through the gateway, {} connections, {} alternating rounds of {:?}",
        load.connections,
        plan.rounds,
        load.duration
    );
    let concurrency = load.connections.max(1) * 2;
    let subjects = [
        (
            "bench-warm-gw-node",
            "nodejs",
            "handler.js",
            code::HELLO_NODE.to_string(),
        ),
        ("bench-warm-gw-go", "go", "handler.go", code::hello_go(0)),
    ];
    let mut targets = Vec::new();
    for (name, runtime, file, source) in &subjects {
        let spec = json!({
            "runtime": runtime, "min_instances": 1, "max_instances": 1,
            "concurrency": concurrency,
        });
        measure::create(server, name, &spec, &[(file, source)]).await?;
        targets.push(Target {
            name: format!("gateway {runtime}"),
            endpoint: Endpoint::Tcp(server.addr),
            request: RequestTemplate::get(&format!("/fn/{NS}/{name}")),
            cpu: Vec::new(),
        });
    }
    let outcome = measure::compare_checked(&targets, plan).await;
    for (name, ..) in &subjects {
        measure::remove(server, name).await?;
    }
    let comparison = outcome?;
    let (node, go) = (&comparison.totals[0], &comparison.totals[1]);
    figures.set("warm_rps_gateway_go", go.rps());
    figures.set_with_rounds(
        "go_vs_node_gateway",
        measure::ratio(go.rps(), node.rps()),
        &comparison.per_round(|r| measure::ratio(r[1].rps(), r[0].rps())),
    );
    Ok(())
}
