//! Secrets end to end: a function reads a secret from its environment and from
//! /run/secrets, nothing on disk or in any answer holds the value, references are
//! checked, and replacing a secret rolls the function over without dropped requests.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Server, send};

const READER: &str = r#"import os

def handle(event):
    path = '/run/secrets/db/dsn'
    with open(path) as f:
        from_file = f.read()
    try:
        open(path, 'w').close()
        writable = True
    except OSError:
        writable = False
    return {'env': os.environ.get('DB_DSN'), 'file': from_file,
            'keys': sorted(os.listdir('/run/secrets/db')),
            'mode': oct(os.stat(path).st_mode & 0o777), 'writable': writable}
"#;

/// A value no other test writes, so finding it anywhere means it leaked.
fn unique_value(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("pw-{tag}-{}-{nanos}", std::process::id())
}

/// Every file under `dir` (database, WAL, logs, builds, blobs...) holding `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
    {
        if entry.file_type().is_file()
            && let Ok(bytes) = std::fs::read(entry.path())
            && bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
        {
            found.push(entry.path().display().to_string());
        }
    }
    found
}

async fn put_secret(server: &Server, name: &str, data: Value) -> (u16, Value) {
    send(
        server,
        reqwest::Method::PUT,
        &format!("/v1/namespaces/default/secrets/{name}"),
        Some(json!({ "data": data })),
    )
    .await
}

#[tokio::test]
async fn a_function_reads_its_secret_from_env_and_file_and_nothing_else_holds_it() {
    let server = Server::start().await;
    let value = unique_value("one");
    let (status, created) = put_secret(&server, "db", json!({"dsn": value, "user": "app"})).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["name"], "db");
    assert_eq!(created["keys"], json!(["dsn", "user"]));

    // References to what does not exist are refused, naming the variable.
    for (env, message) in [
        (json!({"secret": "nope", "key": "dsn"}), "does not exist"),
        (json!({"secret": "db", "key": "nope"}), "has no key"),
    ] {
        let (status, body) = send(
            &server,
            reqwest::Method::POST,
            "/v1/namespaces/default/functions",
            Some(json!({"name": "bad", "runtime": "python3", "env": {"DB_DSN": env}})),
        )
        .await;
        assert_eq!(status, 400, "{body}");
        let text = body["error"]["message"].as_str().unwrap();
        assert!(
            text.starts_with("env.DB_DSN: ") && text.contains(message),
            "{text}"
        );
    }

    let f = server
        .deploy(
            "app",
            json!({"runtime": "python3", "env": {
                "DB_DSN": {"secret": "db", "key": "dsn"}, "PLAIN": "visible"}}),
            &[("handler.py", READER)],
        )
        .await;
    assert_eq!(f.status.phase, "Ready", "{:?}", f.status);
    let (status, answer) = server.get("app", "").await;
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["env"], value.as_str());
    assert_eq!(answer["file"], value.as_str());
    assert_eq!(answer["keys"], json!(["dsn", "user"]));
    assert_eq!(answer["mode"], "0o400");
    assert_eq!(answer["writable"], false);

    // No answer of the API holds the value: the secret, the function (its spec
    // shows the reference), its source, logs and invocation records.
    for path in [
        "/v1/namespaces/default/secrets",
        "/v1/namespaces/default/secrets/db",
        "/v1/namespaces/default/functions/app",
        "/v1/namespaces/default/functions",
        "/v1/namespaces/default/functions/app/source",
        "/v1/namespaces/default/invocations",
    ] {
        let (status, body) = send(&server, reqwest::Method::GET, path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(!body.to_string().contains(&value), "{path} shows the value");
    }
    let (_, function) = send(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces/default/functions/app",
        None,
    )
    .await;
    assert_eq!(
        function["spec"]["env"]["DB_DSN"],
        json!({"secret": "db", "key": "dsn"})
    );
    let logs = server.client.logs("default", "app", None).await.unwrap();
    assert!(!logs.contains(&value));
    // Nor does any file of the data directory, in any form the server wrote.
    assert_eq!(
        files_containing(&server.data_dir, &value),
        Vec::<String>::new()
    );

    // A referenced secret cannot be deleted; the answer names who uses it.
    let (status, body) = send(
        &server,
        reqwest::Method::DELETE,
        "/v1/namespaces/default/secrets/db",
        None,
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("functions app"),
        "{body}"
    );

    // Bad input is 400 naming the field, without echoing the value.
    let (status, body) = put_secret(&server, "db", json!({"a/b": value})).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("data.a/b: ")
    );
    assert!(!body.to_string().contains(&value));
    let (status, body) = put_secret(&server, "Bad_Name", json!({"k": "v"})).await;
    assert_eq!(status, 400, "{body}");

    // Once nothing refers to it, it goes.
    server
        .client
        .delete_function("default", "app")
        .await
        .unwrap();
    let (status, body) = send(
        &server,
        reqwest::Method::DELETE,
        "/v1/namespaces/default/secrets/db",
        None,
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let (status, _) = send(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces/default/secrets/db",
        None,
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn replacing_a_secret_rolls_the_function_over_without_dropped_requests() {
    let server = Server::start().await;
    let old = unique_value("old");
    let new = unique_value("new");
    let (status, _) = put_secret(&server, "db", json!({"dsn": old})).await;
    assert_eq!(status, 201);
    let f = server
        .deploy(
            "roll",
            json!({"runtime": "python3", "min_instances": 1,
                   "env": {"DB_DSN": {"secret": "db", "key": "dsn"}}}),
            &[("handler.py", READER)],
        )
        .await;
    assert_eq!(f.status.phase, "Ready", "{:?}", f.status);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (answered, mut answered_rx) = tokio::sync::watch::channel(0usize);
    let load = {
        let url = format!("{}/fn/default/roll", server.url());
        let http = server.client.http().clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                let r = http.get(&url).send().await.expect("request");
                answers.push((r.status().as_u16(), r.text().await.unwrap_or_default()));
                answered.send_replace(answers.len());
            }
            answers
        })
    };
    let reach = |rx: &mut tokio::sync::watch::Receiver<usize>, n: usize| {
        let mut rx = rx.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|&k| k >= n))
                .await
                .expect("load flows")
                .expect("load task alive");
        }
    };
    reach(&mut answered_rx, 5).await;

    let (status, body) = put_secret(&server, "db", json!({"dsn": new})).await;
    assert_eq!(status, 200, "{body}");
    // The function serves the new value once its instances are replaced.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, answer) = server.get("roll", "").await;
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        if answer["env"] == new.as_str() {
            assert_eq!(answer["file"], new.as_str());
            break;
        }
        assert_eq!(answer["env"], old.as_str());
        assert!(Instant::now() < deadline, "the new value never arrived");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = *answered_rx.borrow();
    reach(&mut answered_rx, seen + 5).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers = load.await.unwrap();
    let failed: Vec<_> = answers.iter().filter(|(s, _)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "dropped during the replacement: {failed:?}"
    );
    assert!(answers.iter().any(|(_, b)| b.contains(&new)));
    assert_eq!(
        files_containing(&server.data_dir, &new),
        Vec::<String>::new()
    );
    assert_eq!(
        files_containing(&server.data_dir, &old),
        Vec::<String>::new()
    );
}

/// Runs the `sless` command line against `server`, with `stdin` on its standard input.
async fn sless(server: &Server, args: &[&str], stdin: &str) -> std::process::Output {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
        .args(args)
        .env("SLESS_SERVER", server.url())
        .env("SLESS_TOKEN", crate::harness::TOKEN)
        .env_remove("SLESS_NAMESPACE")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run sless");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    child.wait_with_output().await.expect("sless output")
}

#[tokio::test]
async fn secrets_from_the_command_line() {
    let server = Server::start().await;
    let value = unique_value("cli");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("password");
    std::fs::write(&file, &value).unwrap();
    let from_file = format!("dsn={}", file.display());
    let out = sless(
        &server,
        &[
            "secret",
            "set",
            "db",
            "--from-literal",
            "user=app",
            "--from-file",
            &from_file,
        ],
        "",
    )
    .await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout.trim(), "secret db set (keys: dsn, user)");
    // From stdin, never echoed.
    let out = sless(
        &server,
        &["secret", "set", "other", "-n", "default"],
        &format!("token={value}\n"),
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}");
    assert!(!stdout.contains(&value));

    let out = sless(&server, &["secret", "ls"], "").await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("db") && stdout.contains("dsn,user") && stdout.contains("other"));
    assert!(!stdout.contains(&value));

    // deploy --env-secret writes the reference.
    let code = tempfile::tempdir().unwrap();
    std::fs::write(code.path().join("handler.py"), READER).unwrap();
    let out = sless(
        &server,
        &[
            "deploy",
            code.path().to_str().unwrap(),
            "--name",
            "app",
            "--runtime",
            "python3",
            "--env-secret",
            "DB_DSN=db/dsn",
        ],
        "",
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, answer) = server.get("app", "").await;
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["env"], value.as_str());

    let out = sless(&server, &["secret", "rm", "db"], "").await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("functions app"));
    let out = sless(&server, &["secret", "rm", "other"], "").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sless(&server, &["secret", "ls", "--json"], "").await;
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
}
