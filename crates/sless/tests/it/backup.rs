//! Backup and restore end to end: a server with a function reading a secret, a
//! cron trigger, a job, a device and a namespace token is backed up with
//! `sless backup` while it serves; `sless restore` rebuilds it into a new data
//! directory (on SQLite) and into a new PostgreSQL database, and each restored
//! server serves the same function with the same secret, and lists the same
//! triggers, jobs, secrets, devices and tokens.

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

use crate::harness::{Server, TOKEN, backends, blob_store, send};

const HANDLER: &str = r#"import os

def handle(event):
    return {'dsn': os.environ.get('DB_DSN'), 'v': 1}
"#;

async fn sless(server_url: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
        .args(args)
        .env("SLESS_SERVER", server_url)
        .env("SLESS_TOKEN", TOKEN)
        .env_remove("SLESS_NAMESPACE")
        .env_remove("SLESS_DATABASE_URL")
        .env_remove("SLESS_DATA_DIR")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run sless")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Names under `path` (a list endpoint answering `{"items": [...]}`), sorted.
async fn names(server: &Server, path: &str) -> Vec<String> {
    let (status, body) = send(server, reqwest::Method::GET, path, None).await;
    assert_eq!(status, 200, "{path}: {body}");
    let mut names: Vec<String> = body["items"]
        .as_array()
        .unwrap_or_else(|| panic!("{path}: {body}"))
        .iter()
        .map(|i| i["name"].as_str().unwrap_or_default().to_string())
        .collect();
    names.sort();
    names
}

/// What a server holds, as the API shows it.
async fn holdings(server: &Server) -> Value {
    json!({
        "namespaces": names(server, "/v1/namespaces").await,
        "functions": names(server, "/v1/namespaces/team/functions").await,
        "triggers": names(server, "/v1/namespaces/team/triggers").await,
        "jobs": names(server, "/v1/namespaces/team/jobs").await,
        "secrets": names(server, "/v1/namespaces/team/secrets").await,
        "devices": names(server, "/v1/namespaces/team/devices").await,
    })
}

async fn invoke(server: &Server) -> Value {
    let url = format!("{}/fn/team/app", server.url());
    let resp = server.client.http().get(url).send().await.expect("invoke");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

/// Restores `backup` into a new data directory (and database) and starts a server on it.
async fn restored(
    backup: &Path,
    source: &Server,
    database_url: Option<String>,
    root: &Path,
) -> Server {
    let data_dir = root.join(if database_url.is_some() {
        "pg"
    } else {
        "sqlite"
    });
    let dir = data_dir.to_str().unwrap();
    let mut args = vec!["restore", backup.to_str().unwrap(), "--data-dir", dir];
    if let Some(url) = &database_url {
        args.extend(["--database-url", url.as_str()]);
    }
    // Into the bucket the restored server will use, when the tests run on S3.
    let s3 = blob_store::for_server(&data_dir).map(|s3| s3.flags());
    args.extend(s3.iter().flatten().map(String::as_str));
    let out = sless("http://127.0.0.1:1", &args).await;
    assert!(out.status.success(), "restore failed: {}", text(&out));
    assert!(text(&out).contains("1 functions"), "{}", text(&out));
    // The same secret key: the backup holds sealed values only.
    std::fs::copy(
        source.data_dir.join(sless_secrets::KEY_FILE),
        data_dir.join(sless_secrets::KEY_FILE),
    )
    .expect("copy the key");
    // A restore goes only into an empty store.
    let again = sless("http://127.0.0.1:1", &args).await;
    assert!(!again.status.success());
    assert!(text(&again).contains("not empty"), "{}", text(&again));
    Server::start_on(
        data_dir,
        database_url,
        &["--prewarm", "0", "--mqtt-listen", "127.0.0.1:0"],
    )
    .await
}

#[tokio::test]
async fn a_backup_taken_while_serving_restores_onto_sqlite_and_postgres() {
    let server = Server::start_with(&["--prewarm", "0", "--mqtt-listen", "127.0.0.1:0"]).await;
    server.client.ensure_namespace("team").await.unwrap();
    let (status, body) = send(
        &server,
        reqwest::Method::PUT,
        "/v1/namespaces/team/secrets/db",
        Some(json!({"data": {"dsn": "postgres://app@db/app"}})),
    )
    .await;
    assert!(status == 200 || status == 201, "{body}");
    let f = server
        .deploy_in(
            "team",
            "app",
            json!({"runtime": "python3", "env": {"DB_DSN": {"secret": "db", "key": "dsn"}}}),
            &[("handler.py", HANDLER)],
        )
        .await;
    assert_eq!(f.status.phase, "Ready", "{:?}", f.status);
    for (path, body) in [
        (
            "/v1/namespaces/team/triggers",
            json!({"name": "nightly", "function": "app", "type": "cron", "schedule": "0 3 * * *"}),
        ),
        (
            "/v1/namespaces/team/jobs",
            json!({"name": "once", "function": "app", "event": {"x": 1}}),
        ),
        ("/v1/namespaces/team/devices", json!({"name": "sensor-1"})),
    ] {
        let (status, answer) = send(&server, reqwest::Method::POST, path, Some(body)).await;
        assert_eq!(status, 201, "{path}: {answer}");
    }
    let before = invoke(&server).await;
    assert_eq!(before["dsn"], "postgres://app@db/app");
    let held = holdings(&server).await;
    assert_eq!(held["functions"], json!(["app"]), "{held}");

    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("backup.zip");
    // Taken while the function is being called.
    let calls = {
        let url = format!("{}/fn/team/app", server.url());
        let http = server.client.http().clone();
        tokio::spawn(async move {
            for _ in 0..20 {
                let r = http.get(&url).send().await.expect("invoke");
                assert_eq!(r.status(), 200);
            }
        })
    };
    let out = sless(&server.url(), &["backup", "--out", file.to_str().unwrap()]).await;
    assert!(out.status.success(), "backup failed: {}", text(&out));
    assert!(text(&out).contains("1 code archives"), "{}", text(&out));
    calls.await.unwrap();

    // Only the admin may take one.
    let token = server.client.create_token("team").await.unwrap();
    let denied = tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
        .args([
            "backup",
            "--out",
            work.path().join("no.zip").to_str().unwrap(),
        ])
        .env("SLESS_SERVER", server.url())
        .env("SLESS_TOKEN", &token)
        .output()
        .await
        .unwrap();
    assert!(!denied.status.success());
    assert!(!work.path().join("no.zip").exists());

    // A file that is not a backup is refused, naming the problem.
    let junk = work.path().join("junk.zip");
    std::fs::write(&junk, b"not a zip").unwrap();
    let out = sless(
        "http://127.0.0.1:1",
        &[
            "restore",
            junk.to_str().unwrap(),
            "--data-dir",
            work.path().join("junk").to_str().unwrap(),
        ],
    )
    .await;
    assert!(!out.status.success());
    assert!(text(&out).contains("not a sless backup"), "{}", text(&out));

    // Onto SQLite and onto PostgreSQL, whichever backend the server under test uses.
    let postgres = backends::postgres_database_url()
        .await
        .expect("PostgreSQL to restore onto");
    for database_url in [None, Some(postgres)] {
        let onto = if database_url.is_some() {
            "postgres"
        } else {
            "sqlite"
        };
        let copy = restored(&file, &server, database_url, work.path()).await;
        let copy_held = holdings(&copy).await;
        assert_eq!(copy_held, held, "restored onto {onto}");
        let restored_fn = copy.wait_phase("team", "app", "Ready").await;
        assert_eq!(
            restored_fn["status"]["revision"],
            json!(f.status.revision),
            "onto {onto}"
        );
        assert_eq!(invoke(&copy).await, before, "restored onto {onto}");
    }
}
