//! `sless serve --config FILE`, `--print-config` and `--log-format json`, on the
//! real binary: the file's settings apply beneath the environment and flags, a bad
//! key stops the start naming it, and the server's log lines are JSON.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncBufReadExt;

use crate::harness::TOKEN;

fn sless() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"));
    cmd.env("SLESS_ADMIN_TOKEN", TOKEN)
        .env_remove("SLESS_MAX_BODY_MB")
        .env_remove("SLESS_PUBLIC_URL")
        .env_remove("SLESS_LOG_FORMAT")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

#[tokio::test]
async fn print_config_shows_the_file_beneath_the_environment_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sless.toml");
    std::fs::write(
        &file,
        "public-url = \"http://file.example:1\"\nmax-body-mb = 3\nbuilds = 3\n\
         blob-url = \"s3://code/prefix\"\ns3-secret-access-key = \"hunter2\"\n",
    )
    .unwrap();
    let out = sless()
        .args(["serve", "--print-config", "--builds", "5", "--config"])
        .arg(&file)
        .env("SLESS_MAX_BODY_MB", "4")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for line in [
        "public-url = \"http://file.example:1\"",
        "max-body-mb = 4",
        "builds = 5",
        "blob-url = \"s3://code/prefix\"",
        "s3-secret-access-key = \"***\"",
        "max-archive-mb = 64",
        "log-format = \"text\"",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line}: {stdout}");
    }
    assert!(!stdout.contains("hunter2"), "{stdout}");
}

#[tokio::test]
async fn a_bad_config_file_stops_the_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    for (text, says) in [
        ("max-body-mbb = 3\n", "unknown key `max-body-mbb`"),
        ("max-body-mb = \"3\"\n", "`max-body-mb` must be an integer"),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = sless()
            .args(["serve", "--data-dir"])
            .arg(dir.path().join("data"))
            .env("SLESS_CONFIG", &file)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}: {out:?}");
        assert!(stderr.contains(says), "{text}: {stderr}");
        assert!(stderr.contains("bad.toml"), "{text}: {stderr}");
    }
}

#[tokio::test]
async fn a_server_started_from_a_file_takes_its_settings_and_logs_json() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sless.toml");
    std::fs::write(
        &file,
        format!(
            "listen = \"127.0.0.1:0\"\ndata-dir = \"{}\"\npublic-url = \"http://file.example:1\"\n\
             log-format = \"json\"\nprewarm = 0\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    // The flag overrides the file's public URL; the rest comes from the file.
    let mut child = sless()
        .args(["serve", "--public-url", "http://flag.example:2", "--config"])
        .arg(&file)
        .env("SLESS_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let start = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            eprintln!("{line}");
            if line.starts_with("sless serving on ") {
                return line;
            }
            assert_json(&line);
        }
        panic!("sless serve exited during start");
    })
    .await
    .expect("a start line");
    assert!(
        start.starts_with("sless serving on http://flag.example:2 (listening on 127.0.0.1:"),
        "{start}"
    );
    assert!(
        start.contains(&dir.path().join("data").display().to_string()),
        "{start}"
    );

    // Stopping logs (at info) what it does: JSON lines too.
    let pid = child.id().unwrap();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let mut messages = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        eprintln!("{line}");
        let event = assert_json(&line);
        messages.push(event["message"].as_str().unwrap_or_default().to_string());
    }
    assert!(child.wait().await.unwrap().success());
    assert!(
        messages.iter().any(|m| m.starts_with("shutting down")),
        "{messages:?}"
    );
}

/// A log line as JSON with a time, a level and a message.
fn assert_json(line: &str) -> Value {
    let event: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
    assert!(event["timestamp"].is_string(), "{line}");
    assert!(event["level"].is_string(), "{line}");
    assert!(event["message"].is_string(), "{line}");
    event
}
