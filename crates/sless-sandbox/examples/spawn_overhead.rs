//! Measures the cold-start cost of the sandbox: `/usr/bin/python3` running a one-line
//! script that writes to fd 3, started bare versus through `Sandbox::spawn` (cgroup creation
//! and limits, bwrap, setpriv). "to fd 3" is the time until the script's first statement
//! ran (what a cold start costs a request); "total" includes exit and sandbox teardown.
//!
//! `cargo run --release -p sless-sandbox --example spawn_overhead [runs]`

use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use sless_sandbox::{Network, ProcessSpec, Sandbox, SandboxConfig};

const PYTHON: &str = "/usr/bin/python3";
const SCRIPT: &str = "import os; os.write(3, b'r')";

fn summary(label: &str, mut times: Vec<Duration>) -> Duration {
    times.sort();
    let mean = times.iter().sum::<Duration>() / times.len() as u32;
    let median = times[times.len() / 2];
    println!(
        "{label:<18} mean {:>6.2} ms  median {:>6.2} ms  min {:>6.2} ms  max {:>6.2} ms",
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
    let mut bare_ready = Vec::with_capacity(runs);
    let mut sandboxed_ready = Vec::with_capacity(runs);
    let mut sandboxed = Vec::with_capacity(runs);
    let mut spawn_calls = Vec::with_capacity(runs);
    let mut drops = Vec::with_capacity(runs);
    // Interleaved, so drift (page cache, CPU frequency) hits both sides alike; the first
    // round of each warms the page cache and is not counted.
    for i in 0..=runs {
        let start = Instant::now();
        let (reader, writer) = std::io::pipe()?;
        let mut cmd = tokio::process::Command::new(PYTHON);
        cmd.args(["-c", "import os; os.write(1, b'r')"])
            .env_clear()
            .stdout(writer);
        let mut child = cmd.spawn()?;
        drop(cmd);
        let mut reader = tokio::net::unix::pipe::Receiver::from_owned_fd(reader.into())?;
        let mut byte = [0u8; 1];
        reader.read_exact(&mut byte).await?;
        let ready = start.elapsed();
        let status = child.wait().await?;
        let elapsed = start.elapsed();
        assert!(status.success());
        if i > 0 {
            bare_ready.push(ready);
            bare.push(elapsed);
        }

        let spec = ProcessSpec {
            id: format!("run-{i}"),
            program: PYTHON.into(),
            args: vec!["-c".into(), SCRIPT.into()],
            env: Vec::new(),
            mounts: Vec::new(),
            cwd: "/".into(),
            memory_mb: 128,
            max_pids: 64,
            network: Network::Host,
            ready_pipe: true,
            listen: None,
        };
        let start = Instant::now();
        let mut child = sandbox.spawn(&spec)?;
        let spawned = start.elapsed();
        let mut byte = [0u8; 1];
        child
            .ready
            .as_mut()
            .expect("ready pipe")
            .read_exact(&mut byte)
            .await?;
        let ready = start.elapsed();
        let exit = child.wait().await;
        let waited = start.elapsed();
        drop(child);
        let elapsed = start.elapsed();
        assert!(exit.success(), "{exit}");
        if i > 0 {
            sandboxed.push(elapsed);
            sandboxed_ready.push(ready);
            spawn_calls.push(spawned);
            drops.push(elapsed - waited);
        }
    }
    let br = summary("bare to fd 3", bare_ready);
    let sr = summary("sandboxed to fd 3", sandboxed_ready);
    let b = summary("bare total", bare);
    let s = summary("sandboxed total", sandboxed);
    summary("  spawn()", spawn_calls);
    summary("  drop", drops);
    println!(
        "overhead (median): {:.2} ms to fd 3, {:.2} ms total",
        (sr.as_secs_f64() - br.as_secs_f64()) * 1e3,
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
