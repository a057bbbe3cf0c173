//! The namespace trash end to end: a namespace with a deployed function reading a
//! secret, an HTTP trigger, a device that published telemetry and an invocation
//! record is force-deleted with `sless ns rm --force` (everything stops: its URLs
//! answer 404, its device is disconnected and refused, its code outlives storage
//! collection) and `sless namespace restore` brings it back whole: the function
//! serves again from the same build with the same secret, the trigger routes, the
//! telemetry and records are listed, and the device connects with its old password.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};
use serde_json::{Value, json};

use crate::harness::{Server, TOKEN, send};

const WAIT: Duration = Duration::from_secs(60);

const HANDLER: &str = r#"import os

def handle(event):
    return {'password': os.environ.get('DB_PASSWORD'), 'path': event.get('path')}
"#;

const SCRATCH: &str = r#"def handle(event):
    return 'scratch'
"#;

/// `sless ARGS` against `server` with the admin token.
async fn sless(server: &Server, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
        .args(args)
        .env("SLESS_SERVER", server.url())
        .env("SLESS_TOKEN", TOKEN)
        .env_remove("SLESS_NAMESPACE")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run sless")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "sless failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `GET {url}{path}` without credentials: status and body.
async fn get(server: &Server, path: &str) -> (u16, String) {
    let resp = server
        .client
        .http()
        .get(format!("{}{path}", server.url()))
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

/// The build directories there are now.
fn builds(data_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data_dir.join("builds"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn inode(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .ino()
}

/// An MQTT 3.1.1 session with `username`/`password`; `Err` when refused.
async fn connect(
    port: u16,
    username: &str,
    password: &str,
) -> Result<(AsyncClient, EventLoop), String> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let mut o = MqttOptions::new(
        format!("trash-{username}-{}", N.fetch_add(1, Ordering::SeqCst)),
        "127.0.0.1",
        port,
    );
    o.set_credentials(username, password);
    let (client, mut el) = AsyncClient::new(o, 64);
    match tokio::time::timeout(WAIT, el.poll())
        .await
        .expect("an answer")
    {
        Ok(Event::Incoming(Packet::ConnAck(_))) => Ok((client, el)),
        Ok(other) => Err(format!("{other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

async fn publish(c: &AsyncClient, el: &mut EventLoop, topic: &str, payload: Value) {
    c.publish(topic, QoS::AtLeastOnce, false, payload.to_string())
        .await
        .unwrap();
    tokio::time::timeout(WAIT, async {
        loop {
            if let Event::Incoming(Packet::PubAck(_)) = el.poll().await.expect("connected") {
                return;
            }
        }
    })
    .await
    .expect("a PUBACK in time");
}

/// Polls `GET path` (admin) until `done` holds for its body; the body.
async fn wait_for(server: &Server, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = send(server, reqwest::Method::GET, path, None).await;
        if status == 200 && done(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "{path}: {status} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn items(body: &Value) -> Vec<Value> {
    body["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_force_deleted_namespace_comes_back_whole() {
    // Collection every second with a short grace: it runs while the namespace is in
    // the trash, and must leave its code and build alone.
    let server = Server::start_with(&[
        "--prewarm",
        "0",
        "--mqtt-listen",
        "127.0.0.1:0",
        "--gc-interval-sec",
        "1",
        "--gc-grace-sec",
        "2",
    ])
    .await;
    let ns = "/v1/namespaces/team";
    let (status, body) = send(&server, reqwest::Method::PUT, ns, None).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = send(
        &server,
        reqwest::Method::PUT,
        &format!("{ns}/secrets/db"),
        Some(json!({"data": {"PASSWORD": "hunter2"}})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let before = builds(&server.data_dir);
    server
        .deploy_in(
            "team",
            "hello",
            json!({"runtime": "python3",
                   "env": {"DB_PASSWORD": {"secret": "db", "key": "PASSWORD"}}}),
            &[("handler.py", HANDLER)],
        )
        .await;
    let hello_build: Vec<String> = builds(&server.data_dir)
        .into_iter()
        .filter(|b| !before.contains(b))
        .collect();
    assert_eq!(hello_build.len(), 1, "one new build: {hello_build:?}");
    let hello_build = server.data_dir.join("builds").join(&hello_build[0]);
    let hello_inode = inode(&hello_build);
    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        &format!("{ns}/triggers"),
        Some(json!({"name": "web", "function": "hello", "type": "http", "path": "/web"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    let (status, answer) = get(&server, "/fn/team/hello").await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("hunter2"), "{answer}");
    let (status, answer) = get(&server, "/t/team/web").await;
    assert_eq!(status, 200, "{answer}");
    let records = wait_for(&server, &format!("{ns}/invocations"), |b| {
        items(b).len() >= 2
    })
    .await;
    let record_ids: Vec<Value> = items(&records).iter().map(|r| r["id"].clone()).collect();

    // A device that published telemetry, and stays connected.
    let (status, device) = send(
        &server,
        reqwest::Method::POST,
        &format!("{ns}/devices"),
        Some(json!({"name": "sensor"})),
    )
    .await;
    assert_eq!(status, 201, "{device}");
    let port = device["mqtt"]["port"].as_u64().expect("port") as u16;
    let username = device["mqtt"]["username"].as_str().unwrap().to_string();
    let password = device["mqtt"]["password"].as_str().unwrap().to_string();
    let (client, mut el) = connect(port, &username, &password).await.expect("admitted");
    publish(&client, &mut el, "team/telemetry/sensor", json!({"t": 21})).await;
    let telemetry_path = format!("{ns}/devices/sensor/telemetry");
    wait_for(&server, &telemetry_path, |b| items(b).len() == 1).await;

    // Garbage of another namespace, to see collection run while the namespace is away.
    server
        .deploy(
            "scratch",
            json!({"runtime": "python3"}),
            &[("handler.py", SCRATCH)],
        )
        .await;
    let scratch_build: Vec<String> = builds(&server.data_dir)
        .into_iter()
        .filter(|b| server.data_dir.join("builds").join(b) != hello_build && !before.contains(b))
        .collect();
    assert_eq!(scratch_build.len(), 1, "{scratch_build:?}");
    let scratch_build = server.data_dir.join("builds").join(&scratch_build[0]);
    server
        .client
        .delete_function("default", "scratch")
        .await
        .unwrap();

    // To the trash.
    let out = stdout(&sless(&server, &["ns", "rm", "team", "--force"]).await);
    assert!(out.contains("trash"), "{out}");
    assert!(out.contains("sless ns restore team"), "{out}");

    let (status, body) = send(&server, reqwest::Method::GET, ns, None).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = send(&server, reqwest::Method::GET, &telemetry_path, None).await;
    assert_eq!(status, 404, "{body}");
    let (status, answer) = get(&server, "/fn/team/hello").await;
    assert_eq!(status, 404, "{answer}");
    let (status, answer) = get(&server, "/t/team/web").await;
    assert_eq!(status, 404, "{answer}");
    // The connected device was disconnected, and its credentials are refused.
    tokio::time::timeout(WAIT, async {
        loop {
            if el.poll().await.is_err() {
                return;
            }
        }
    })
    .await
    .expect("the device is disconnected");
    drop(client);
    let refused = connect(port, &username, &password).await;
    assert!(refused.is_err(), "a trashed device was admitted");
    // Collection ran past its grace (the scratch build went) and kept the trashed code.
    let deadline = Instant::now() + WAIT;
    while scratch_build.exists() {
        assert!(Instant::now() < deadline, "collection never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        inode(&hello_build),
        hello_inode,
        "the trashed build was removed"
    );

    // Back.
    let out = stdout(&sless(&server, &["namespace", "restore", "team"]).await);
    assert!(out.contains("restored namespace team"), "{out}");
    let (status, answer) = get(&server, "/fn/team/hello").await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer.contains("hunter2"),
        "the secret did not come back: {answer}"
    );
    // From the same build, not a new one.
    assert_eq!(
        inode(&hello_build),
        hello_inode,
        "the function was built again"
    );
    let (status, answer) = get(&server, "/t/team/web").await;
    assert_eq!(status, 200, "{answer}");
    let (status, secret) = send(
        &server,
        reqwest::Method::GET,
        &format!("{ns}/secrets/db"),
        None,
    )
    .await;
    assert_eq!((status, secret["keys"].clone()), (200, json!(["PASSWORD"])));
    let (status, trigger) = send(
        &server,
        reqwest::Method::GET,
        &format!("{ns}/triggers/web"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{trigger}");
    let telemetry = wait_for(&server, &telemetry_path, |b| items(b).len() == 1).await;
    assert_eq!(items(&telemetry)[0]["payload"], json!({"t": 21}));
    let records = wait_for(&server, &format!("{ns}/invocations"), |b| {
        items(b).len() >= record_ids.len()
    })
    .await;
    for id in &record_ids {
        assert!(
            items(&records).iter().any(|r| &r["id"] == id),
            "record {id} is missing: {records}"
        );
    }
    // The device connects with its old password again, and its telemetry is stored.
    let deadline = Instant::now() + WAIT;
    let (client, mut el) = loop {
        match connect(port, &username, &password).await {
            Ok(session) => break session,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "the restored device is refused: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    publish(&client, &mut el, "team/telemetry/sensor", json!({"t": 22})).await;
    wait_for(&server, &telemetry_path, |b| items(b).len() == 2).await;
}
