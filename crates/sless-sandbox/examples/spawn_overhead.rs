//! Measures the cold-start cost of the sandbox: `/usr/bin/python3 -c pass` started bare
//! versus through `Sandbox::spawn` (cgroup creation and limits, bwrap, setpriv, teardown).
//!
//! `cargo run --release -p sless-sandbox --example spawn_overhead [runs]`

use std::time::{Duration, Instant};

use sless_sandbox::{ProcessSpec, Sandbox, SandboxConfig};

const PYTHON: &str = "/usr/bin/python3";

fn summary(label: &str, mut times: Vec<Duration>) -> Duration {
    times.sort();
    let mean = times.iter().sum::<Duration>() / times.len() as u32;
    let median = times[times.len() / 2];
    println!(
        "{label:<10} mean {:>6.2} ms  median {:>6.2} ms  min {:>6.2} ms  max {:>6.2} ms",
        mean.as_secs_f64() * 1e3,
        median.as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
    );
    median
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(30);
    let sandbox = Sandbox::new(SandboxConfig {
        cgroup_name: format!("sless-overhead-{}", std::process::id()),
        ..SandboxConfig::default()
    })?;
    println!("capabilities: {:?}", sandbox.capabilities());

    let mut bare = Vec::with_capacity(runs);
    let mut sandboxed = Vec::with_capacity(runs);
    let mut spawn_calls = Vec::with_capacity(runs);
    let mut drops = Vec::with_capacity(runs);
    // Interleaved, so drift (page cache, CPU frequency) hits both sides alike; the first
    // round of each warms the page cache and is not counted.
    for i in 0..=runs {
        let start = Instant::now();
        let status = tokio::process::Command::new(PYTHON)
            .args(["-c", "pass"])
            .env_clear()
            .status()
            .await?;
        let elapsed = start.elapsed();
        assert!(status.success());
        if i > 0 {
            bare.push(elapsed);
        }

        let spec = ProcessSpec {
            id: format!("run-{i}"),
            program: PYTHON.into(),
            args: vec!["-c".into(), "pass".into()],
            env: Vec::new(),
            mounts: Vec::new(),
            cwd: "/".into(),
            memory_mb: 128,
            max_pids: 64,
            network: true,
            ready_pipe: true,
        };
        let start = Instant::now();
        let mut child = sandbox.spawn(&spec)?;
        let spawned = start.elapsed();
        let exit = child.wait().await;
        let waited = start.elapsed();
        drop(child);
        let elapsed = start.elapsed();
        assert!(exit.success(), "{exit}");
        if i > 0 {
            sandboxed.push(elapsed);
            spawn_calls.push(spawned);
            drops.push(elapsed - waited);
        }
    }
    let b = summary("bare", bare);
    let s = summary("sandboxed", sandboxed);
    summary("  spawn()", spawn_calls);
    summary("  drop", drops);
    println!(
        "overhead (median): {:.2} ms",
        (s.as_secs_f64() - b.as_secs_f64()) * 1e3
    );
    for dir in ["memory", "pids"] {
        let _ = std::fs::remove_dir(format!(
            "/sys/fs/cgroup/{dir}/sless-overhead-{}",
            std::process::id()
        ));
    }
    Ok(())
}
