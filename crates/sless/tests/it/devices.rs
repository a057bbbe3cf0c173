//! Devices end to end: `sless serve --mqtt-listen` runs mosquitto with its
//! dynamic-security plugin; devices are created through the API, connect with real
//! MQTT clients (rumqttc, and Debian's `mosquitto_pub` where rumqttc cannot take the
//! broker's answer), and their telemetry is served by the API.

use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, Packet, QoS};
use serde_json::{Value, json};

use crate::harness::{Server, send};

const WAIT: Duration = Duration::from_secs(30);

async fn server() -> Server {
    Server::start_with(&["--prewarm", "0", "--mqtt-listen", "127.0.0.1:0"]).await
}

/// Creates device `name` in `ns`; the answer, with its password.
pub(crate) async fn create(server: &Server, ns: &str, name: &str) -> Value {
    let (status, d) = send(
        server,
        reqwest::Method::POST,
        &format!("/v1/namespaces/{ns}/devices"),
        Some(json!({"name": name, "labels": {"room": "lab"}})),
    )
    .await;
    assert_eq!(status, 201, "{d}");
    d
}

pub(crate) struct Creds {
    pub(crate) port: u16,
    pub(crate) username: String,
    pub(crate) password: String,
}

pub(crate) fn creds(device: &Value) -> Creds {
    let m = &device["mqtt"];
    Creds {
        port: m["port"].as_u64().expect("port") as u16,
        username: m["username"].as_str().expect("username").to_string(),
        password: m["password"].as_str().expect("password").to_string(),
    }
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
        format!("{username}-{}", N.fetch_add(1, Ordering::SeqCst)),
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

/// Polls until `f` picks something out of an incoming packet, or the connection ends.
async fn until<T>(
    el: &mut EventLoop,
    mut f: impl FnMut(&Packet) -> Option<T>,
) -> Result<T, ConnectionError> {
    tokio::time::timeout(WAIT, async {
        loop {
            if let Event::Incoming(p) = el.poll().await?
                && let Some(t) = f(&p)
            {
                return Ok(t);
            }
        }
    })
    .await
    .expect("in time")
}

async fn publish(c: &AsyncClient, el: &mut EventLoop, topic: &str, payload: Vec<u8>) {
    c.publish(topic, QoS::AtLeastOnce, false, payload)
        .await
        .unwrap();
    until(el, |p| matches!(p, Packet::PubAck(_)).then_some(()))
        .await
        .expect("a PUBACK");
}

/// `mosquitto_pub` (Debian's mosquitto-clients) publishing once at QoS 1.
async fn mosquitto_pub(
    port: u16,
    username: &str,
    password: &str,
    topic: &str,
    message: &str,
) -> std::process::Output {
    tokio::process::Command::new("mosquitto_pub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-u",
            username,
            "-P",
            password,
        ])
        .args(["-q", "1", "-t", topic, "-m", message])
        .output()
        .await
        .expect("mosquitto_pub runs")
}

/// The device's telemetry (newest first), waiting (bounded) until there are `n`.
async fn telemetry(server: &Server, ns: &str, name: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = send(
            server,
            reqwest::Method::GET,
            &format!("/v1/namespaces/{ns}/devices/{name}/telemetry?limit=1000"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let items = body["items"].as_array().cloned().unwrap_or_default();
        if items.len() >= n {
            return items;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} messages stored: {body}",
            items.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn device(server: &Server, ns: &str, name: &str) -> Value {
    let (status, d) = send(
        server,
        reqwest::Method::GET,
        &format!("/v1/namespaces/{ns}/devices/{name}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{d}");
    d
}

/// Waits (bounded) until the device's `status.online` is `online`.
async fn wait_online(server: &Server, ns: &str, name: &str, online: bool) {
    let deadline = Instant::now() + WAIT;
    while device(server, ns, name).await["status"]["online"] != online {
        assert!(
            Instant::now() < deadline,
            "{name} never became online = {online}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_devices_telemetry_is_stored_and_served() {
    let server = server().await;
    let d = create(&server, "default", "t77").await;
    assert_eq!(d["mqtt"]["username"], "default_t77");
    assert_eq!(d["mqtt"]["publish_topic"], "default/telemetry/t77");
    assert_eq!(d["mqtt"]["subscribe_topic"], "default/commands/t77");
    assert_eq!(d["labels"]["room"], "lab");
    assert_eq!(d["status"]["messages"], 0);
    let c = creds(&d);
    assert_eq!(c.password.len(), 32);
    // Shown once: nowhere else.
    let shown = device(&server, "default", "t77").await;
    assert!(shown["mqtt"].get("password").is_none(), "{shown}");
    assert!(!shown.to_string().contains(&c.password));
    let (_, list) = send(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces/default/devices",
        None,
    )
    .await;
    assert!(!list.to_string().contains(&c.password), "{list}");
    // Nothing yet is an empty list, never an error.
    let (status, empty) = send(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces/default/telemetry",
        None,
    )
    .await;
    assert_eq!((status, empty), (200, json!({"items": []})));

    let (client, mut el) = connect(c.port, &c.username, &c.password)
        .await
        .expect("admitted");
    wait_online(&server, "default", "t77", true).await;
    let topic = "default/telemetry/t77";
    publish(&client, &mut el, topic, br#"{"temp": 21.5}"#.to_vec()).await;
    publish(&client, &mut el, topic, b"not json".to_vec()).await;
    publish(&client, &mut el, topic, vec![0xff, 0x00, 0xfe]).await;
    publish(&client, &mut el, topic, Vec::new()).await;
    let items = telemetry(&server, "default", "t77", 4).await;
    let payloads: Vec<Value> = items.iter().rev().map(|i| i["payload"].clone()).collect();
    assert_eq!(
        payloads,
        [
            json!({"temp": 21.5}),
            json!("not json"),
            json!({"base64": "/wD+"}),
            json!("")
        ]
    );
    assert!(items.iter().all(|i| i["device"] == "t77"));
    let d = device(&server, "default", "t77").await;
    assert_eq!(d["status"]["messages"], 4, "{d}");
    assert!(d["status"]["last_seen_at"].is_string(), "{d}");
    let (_, all) = send(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces/default/telemetry?device=t77&limit=2",
        None,
    )
    .await;
    assert_eq!(all["items"].as_array().map(Vec::len), Some(2), "{all}");

    drop(client);
    drop(el);
    wait_online(&server, "default", "t77", false).await;
}

#[tokio::test]
async fn devices_reach_only_their_own_topics_and_credentials_are_enforced() {
    let server = server().await;
    let (status, _) = send(&server, reqwest::Method::PUT, "/v1/namespaces/other", None).await;
    assert_eq!(status, 201);
    let a = creds(&create(&server, "default", "a").await);
    let b = creds(&create(&server, "default", "b").await);
    let x = creds(&create(&server, "other", "x").await);

    // Publishing anywhere but its own topic stores nothing.
    for topic in [
        "default/telemetry/b",
        "other/telemetry/x",
        "default/commands/a",
        "elsewhere",
    ] {
        let out = mosquitto_pub(a.port, &a.username, &a.password, topic, "denied").await;
        assert!(out.status.success(), "{out:?}");
    }
    let out = mosquitto_pub(
        a.port,
        &a.username,
        &a.password,
        "default/telemetry/a",
        "mine",
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        telemetry(&server, "default", "a", 1).await[0]["payload"],
        "mine"
    );
    let out = mosquitto_pub(x.port, &x.username, &x.password, "other/telemetry/x", "x's").await;
    assert!(out.status.success(), "{out:?}");
    telemetry(&server, "other", "x", 1).await;
    for (ns, name) in [("default", "b"), ("other", "x")] {
        let (_, t) = send(
            &server,
            reqwest::Method::GET,
            &format!("/v1/namespaces/{ns}/devices/{name}/telemetry"),
            None,
        )
        .await;
        assert!(!t.to_string().contains("denied"), "{ns}/{name}: {t}");
    }

    // Subscribing to anything but its own commands is refused.
    let (client, mut el) = connect(a.port, &a.username, &a.password)
        .await
        .expect("admitted");
    for filter in [
        "#",
        "default/commands/b",
        "default/commands/+",
        "default/telemetry/b",
        "other/commands/x",
    ] {
        client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
        let codes = until(&mut el, |p| match p {
            Packet::SubAck(s) => Some(s.return_codes.clone()),
            _ => None,
        })
        .await
        .expect("a SUBACK");
        assert_eq!(codes, [rumqttc::SubscribeReasonCode::Failure], "{filter}");
    }

    // Wrong and unknown credentials are refused.
    assert!(connect(a.port, &a.username, &b.password).await.is_err());
    assert!(
        connect(a.port, "default_nobody", &a.password)
            .await
            .is_err()
    );
    assert!(connect(a.port, "sless-ingest", &a.password).await.is_err());

    // Rotation: the connected session is closed, the old password refused, the new admitted.
    let (status, rotated) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/devices/a/credentials",
        None,
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    let a2 = creds(&rotated);
    assert_ne!(a2.password, a.password);
    assert!(
        until(&mut el, |_| None::<()>).await.is_err(),
        "disconnected by the rotation"
    );
    assert!(connect(a.port, &a.username, &a.password).await.is_err());
    let (_, mut el) = connect(a.port, &a2.username, &a2.password)
        .await
        .expect("the new password");

    // Disabled: disconnected and refused until enabled again.
    let patch = |enabled: bool| {
        send(
            &server,
            reqwest::Method::PATCH,
            "/v1/namespaces/default/devices/a",
            Some(json!({"enabled": enabled})),
        )
    };
    let (status, d) = patch(false).await;
    assert_eq!((status, d["enabled"].clone()), (200, json!(false)), "{d}");
    assert!(
        until(&mut el, |_| None::<()>).await.is_err(),
        "disconnected when disabled"
    );
    assert!(connect(a.port, &a2.username, &a2.password).await.is_err());
    let (status, _) = patch(true).await;
    assert_eq!(status, 200);
    let (_, mut el) = connect(a.port, &a2.username, &a2.password)
        .await
        .expect("enabled again");

    // Deleted: disconnected, refused, gone from the API.
    let (status, _) = send(
        &server,
        reqwest::Method::DELETE,
        "/v1/namespaces/default/devices/a",
        None,
    )
    .await;
    assert_eq!(status, 204);
    assert!(
        until(&mut el, |_| None::<()>).await.is_err(),
        "disconnected when deleted"
    );
    assert!(connect(a.port, &a2.username, &a2.password).await.is_err());
    let (status, _) = send(
        &server,
        reqwest::Method::GET,
        "/v1/namespaces/default/devices/a",
        None,
    )
    .await;
    assert_eq!(status, 404);
    // b was never touched.
    connect(b.port, &b.username, &b.password)
        .await
        .expect("b still admitted");
}

#[tokio::test]
async fn commands_reach_the_device_on_its_subscribe_topic() {
    let server = server().await;
    let d = creds(&create(&server, "default", "lamp").await);
    let (client, mut el) = connect(d.port, &d.username, &d.password)
        .await
        .expect("admitted");
    client
        .subscribe("default/commands/lamp", QoS::AtLeastOnce)
        .await
        .unwrap();
    until(&mut el, |p| matches!(p, Packet::SubAck(_)).then_some(()))
        .await
        .expect("subscribed");
    let (status, sent) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/devices/lamp/commands",
        Some(json!({"on": true})),
    )
    .await;
    assert_eq!(status, 202, "{sent}");
    assert_eq!(sent["topic"], "default/commands/lamp");
    let got = until(&mut el, |p| match p {
        Packet::Publish(p) => Some(p.payload.clone()),
        _ => None,
    })
    .await
    .expect("the command");
    assert_eq!(
        serde_json::from_slice::<Value>(&got).unwrap(),
        json!({"on": true})
    );
    let (status, _) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/devices/nobody/commands",
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 404);
}

/// Logs each event with the device `context.message` names; `{"fail": ...}` raises.
const TRIGGERED: &str = r#"import json

def handle(event, context):
    message = getattr(context, "message", None) or {}
    if isinstance(event, dict) and "fail" in event:
        print("failing %s" % event["fail"])
        raise RuntimeError("bad reading %s" % event["fail"])
    print("reading from %s kind %s: %s" % (message.get("device"), message.get("kind"), json.dumps(event, sort_keys=True)))
    return {"ok": True}
"#;

#[tokio::test]
async fn a_device_trigger_invokes_its_function_per_message_and_dead_letters_failures() {
    let server = server().await;
    server
        .deploy(
            "on-reading",
            json!({"runtime": "python3", "network": "none"}),
            &[("handler.py", TRIGGERED)],
        )
        .await;
    let (status, t) = send(
        &server,
        reqwest::Method::POST,
        "/v1/namespaces/default/triggers",
        Some(json!({"name": "readings", "function": "on-reading", "type": "device",
                    "devices": "sensor-*",
                    "delivery": {"max_attempts": 2, "backoff_initial_ms": 50, "backoff_max_ms": 100}})),
    )
    .await;
    assert_eq!(status, 201, "{t}");
    assert_eq!(t["type"], "device");
    assert_eq!(t["devices"], "sensor-*");
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, t) = send(
            &server,
            reqwest::Method::GET,
            "/v1/namespaces/default/triggers/readings",
            None,
        )
        .await;
        if t["status"]["connection"] == "connected" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the trigger never connected: {t}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sensor = creds(&create(&server, "default", "sensor-1").await);
    let other = creds(&create(&server, "default", "other-1").await);
    for (c, topic, msg) in [
        (&other, "default/telemetry/other-1", r#"{"t": 0}"#),
        (&sensor, "default/telemetry/sensor-1", r#"{"t": 1}"#),
        (&sensor, "default/telemetry/sensor-1", r#"{"fail": 7}"#),
        (&sensor, "default/telemetry/sensor-1", r#"{"t": 2}"#),
    ] {
        let out = mosquitto_pub(c.port, &c.username, &c.password, topic, msg).await;
        assert!(out.status.success(), "{out:?}");
    }
    let log = server
        .wait_log(
            "on-reading",
            r#"reading from sensor-1 kind device: {"t": 2}"#,
        )
        .await;
    assert!(
        log.contains(r#"reading from sensor-1 kind device: {"t": 1}"#),
        "{log}"
    );
    assert!(
        !log.contains("other-1"),
        "a device the glob does not name: {log}"
    );
    // Telemetry is stored whatever the trigger does.
    telemetry(&server, "default", "other-1", 1).await;
    telemetry(&server, "default", "sensor-1", 3).await;

    // The raising reading: two attempts, then a dead letter of the device trigger.
    let deadline = Instant::now() + WAIT;
    let dead = loop {
        let (status, dl) = send(
            &server,
            reqwest::Method::GET,
            "/v1/namespaces/default/dead-letters?trigger=readings",
            None,
        )
        .await;
        assert_eq!(status, 200, "{dl}");
        if let Some(d) = dl["items"].as_array().and_then(|i| i.first()) {
            break d.clone();
        }
        assert!(Instant::now() < deadline, "no dead letter: {dl}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(dead["source"], "device", "{dead}");
    assert_eq!(dead["attempts"], 2, "{dead}");
    assert_eq!(dead["payload"], json!({"fail": 7}), "{dead}");
    assert_eq!(dead["message"]["device"], "sensor-1", "{dead}");
    assert!(
        dead["error"]
            .as_str()
            .unwrap_or_default()
            .contains("bad reading 7"),
        "{dead}"
    );
    assert_eq!(
        server
            .wait_log("on-reading", "failing 7")
            .await
            .matches("failing 7")
            .count(),
        2
    );

    // Every attempt is an invocation record with source "device".
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, inv) = send(
            &server,
            reqwest::Method::GET,
            "/v1/namespaces/default/invocations?function=on-reading&source=device",
            None,
        )
        .await;
        let n = inv["items"].as_array().map_or(0, Vec::len);
        if n >= 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{n} device invocation records: {inv}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sless(server: &Server, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
        .args(args)
        .env("SLESS_SERVER", server.url())
        .env("SLESS_TOKEN", crate::harness::TOKEN)
        .env_remove("SLESS_NAMESPACE")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run sless")
}

#[tokio::test]
async fn the_command_line_creates_a_device_reads_its_telemetry_and_cuts_it_off() {
    let server = server().await;
    let out = sless(
        &server,
        &["device", "create", "cli-dev", "--label", "room=lab"],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("mosquitto_pub"), "{text}");
    assert!(
        text.contains("only"),
        "says the password is shown once: {text}"
    );
    let out = sless(&server, &["device", "rotate", "cli-dev", "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    let d: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let c = creds(&d);
    let out = mosquitto_pub(
        c.port,
        &c.username,
        &c.password,
        "default/telemetry/cli-dev",
        r#"{"v": 42}"#,
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    telemetry(&server, "default", "cli-dev", 1).await;
    let out = sless(&server, &["telemetry", "cli-dev"]).await;
    assert!(out.status.success(), "{out:?}");
    let lines = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(lines.trim_end().ends_with(r#"{"v":42}"#), "{lines}");
    let out = sless(&server, &["device", "ls"]).await;
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        table.contains("cli-dev") && table.contains("room=lab"),
        "{table}"
    );
    let out = sless(&server, &["device", "disable", "cli-dev"]).await;
    assert!(out.status.success(), "{out:?}");
    let refused = mosquitto_pub(
        c.port,
        &c.username,
        &c.password,
        "default/telemetry/cli-dev",
        "x",
    )
    .await;
    assert!(
        !refused.status.success(),
        "a disabled device is refused: {refused:?}"
    );
    let out = sless(&server, &["device", "rm", "cli-dev"]).await;
    assert!(out.status.success(), "{out:?}");
    let out = sless(&server, &["device", "get", "cli-dev"]).await;
    assert!(!out.status.success());
}

#[tokio::test]
async fn mqtt_5_devices_are_served_and_refused_alike() {
    let server = server().await;
    let c = creds(&create(&server, "default", "v5").await);
    let port = c.port.to_string();
    let pub5 = |password: &str, topic: &str, message: &str| {
        tokio::process::Command::new("mosquitto_pub")
            .args([
                "-V",
                "5",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-u",
                &c.username,
                "-P",
                password,
            ])
            .args(["-q", "1", "-t", topic, "-m", message])
            .output()
    };
    let ok = pub5(&c.password, "default/telemetry/v5", r#"{"proto": 5}"#)
        .await
        .expect("runs");
    assert!(ok.status.success(), "{ok:?}");
    // MQTT 5 tells the device its publish was refused (PUBACK reason "not authorized").
    let denied = pub5(&c.password, "default/telemetry/other", "denied")
        .await
        .expect("runs");
    let said = String::from_utf8_lossy(&denied.stderr).to_lowercase();
    assert!(said.contains("not authorized"), "{denied:?}");
    let refused = pub5("wrong", "default/telemetry/v5", "x")
        .await
        .expect("runs");
    assert!(!refused.status.success(), "{refused:?}");
    let items = telemetry(&server, "default", "v5", 1).await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["payload"], json!({"proto": 5}));
}
