//! A function's network: by default (`outbound`) it reaches the outside world but not
//! the host at any of its addresses (the sless API, services on 127.0.0.1 or on the
//! host's own IPs) nor other instances, and what it listens on is not reachable from the
//! host; `none` has no network; `host` is the host's, for the admin or with
//! `--allow-host-network`.

use std::net::{Ipv4Addr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Server, send};

/// Connects to each target, reads what it says, and reports the instance's view of the
/// network (TCP ports with sockets, interfaces).
const PROBER: &str = r#"
import socket

def handle(event, context):
    out = {}
    for name, host, port in event["targets"]:
        s = socket.socket()
        s.settimeout(3)
        try:
            s.connect((host, port))
            s.settimeout(0.5)
            try:
                said = s.recv(64).decode()
            except OSError:
                said = ""
            out[name] = "connected" + (":" + said if said else "")
        except OSError as e:
            out[name] = type(e).__name__
        finally:
            s.close()
    ports = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        ports.add(int(line.split()[1].split(":")[1], 16))
    out["proc_ports"] = sorted(ports)
    out["interfaces"] = sorted(
        line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]
    )
    return out
"#;

/// Listens on 0.0.0.0:LISTEN_PORT from import on, answering `instance` to each connection.
const LISTENER: &str = r#"
import os, socket, threading

def _serve():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(os.environ["LISTEN_PORT"])))
    s.listen(16)
    while True:
        c, _ = s.accept()
        c.sendall(b"instance")
        c.close()

threading.Thread(target=_serve, daemon=True).start()

def handle(event, context):
    return "listening"
"#;

fn free_port() -> u16 {
    TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A TCP listener of the test's on `addr` that greets every connection with `host`.
fn host_listener(addr: &str) -> u16 {
    let listener = TcpListener::bind(addr).expect("listen");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { break };
            let _ = std::io::Write::write_all(&mut conn, b"host");
        }
    });
    port
}

/// The host's first IPv4 address that is not loopback, if it has one.
fn host_ip() -> Option<Ipv4Addr> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// Runs the prober function `name` against `targets` (`[label, host, port]`).
async fn probe(server: &Server, ns: &str, name: &str, targets: &[(&str, String, u16)]) -> Value {
    let targets: Vec<Value> = targets
        .iter()
        .map(|(label, host, port)| json!([label, host, port]))
        .collect();
    let resp = server
        .client
        .invoke(ns, name, &json!({ "targets": targets }))
        .await
        .expect("invoke");
    let body: Value = serde_json::from_slice(&resp.body).expect("json answer");
    assert_eq!(resp.status, 200, "{body}");
    body
}

/// Polls until connecting from the host to `port` on `addr` either works or is refused.
fn host_connects(addr: &str, port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &format!("{addr}:{port}").parse().expect("address"),
        Duration::from_secs(2),
    )
    .is_ok()
}

#[tokio::test]
async fn default_network_keeps_the_host_and_other_instances_out() {
    // The listeners live in instances between requests; a frozen instance would accept
    // connections but never answer them, so nothing is frozen here.
    let server = Server::start_with(&["--freeze-idle-ms", "0"]).await;
    let loopback_port = host_listener("127.0.0.1:0");
    let ip = host_ip();
    let ip_port = ip.map(|ip| host_listener(&format!("{ip}:0")));

    // Another function's instance listening on all its addresses, with the default network.
    let listen_port = free_port();
    server
        .deploy(
            "listener",
            json!({"runtime": "python3", "min_instances": 1,
                   "env": {"LISTEN_PORT": listen_port.to_string()}}),
            &[("handler.py", LISTENER)],
        )
        .await;
    assert_eq!(server.get("listener", "/").await.0, 200);
    // The same, on the host's network (the admin may): the host reaches that one.
    let host_listen_port = free_port();
    server
        .deploy(
            "host-listener",
            json!({"runtime": "python3", "min_instances": 1, "network": "host",
                   "env": {"LISTEN_PORT": host_listen_port.to_string()}}),
            &[("handler.py", LISTENER)],
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host_connects("127.0.0.1", host_listen_port) {
        assert!(
            Instant::now() < deadline,
            "the host-network listener never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A default-network instance's listener is not reachable from the host.
    assert!(!host_connects("127.0.0.1", listen_port));
    if let Some(ip) = ip {
        assert!(!host_connects(&ip.to_string(), listen_port));
    }

    let mut targets = vec![
        ("api", "127.0.0.1".to_owned(), server.port),
        ("api_via_slirp", "10.0.2.2".to_owned(), server.port),
        ("loopback_service", "127.0.0.1".to_owned(), loopback_port),
        ("loopback_via_slirp", "10.0.2.2".to_owned(), loopback_port),
        ("other_instance", "127.0.0.1".to_owned(), listen_port),
        ("host_instance", "127.0.0.1".to_owned(), host_listen_port),
    ];
    if let (Some(ip), Some(port)) = (ip, ip_port) {
        targets.push(("host_ip_service", ip.to_string(), port));
        targets.push(("host_ip_api", ip.to_string(), server.port));
        targets.push(("host_ip_other_instance", ip.to_string(), listen_port));
        targets.push(("host_ip_host_instance", ip.to_string(), host_listen_port));
    }

    server
        .deploy(
            "prober",
            json!({"runtime": "python3"}),
            &[("handler.py", PROBER)],
        )
        .await;
    let seen = probe(&server, "default", "prober", &targets).await;
    for (label, _, _) in &targets {
        let got = seen[label].as_str().unwrap_or_default();
        assert!(
            got == "ConnectionRefusedError" || got == "PermissionError",
            "{label} reached from the default network: {seen}"
        );
    }
    // The host's own addresses are unroutable, not merely closed.
    for label in ["api_via_slirp", "host_ip_service", "host_ip_api"] {
        if seen.get(label).is_some() {
            assert_eq!(seen[label], "PermissionError", "{label}: {seen}");
        }
    }
    // Its view of TCP sockets holds none of the host's.
    let ports: Vec<u64> = seen["proc_ports"]
        .as_array()
        .expect("ports")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    for port in [
        Some(server.port),
        Some(loopback_port),
        ip_port,
        Some(host_listen_port),
    ]
    .into_iter()
    .flatten()
    {
        assert!(!ports.contains(&u64::from(port)), "{port} in {ports:?}");
    }
    assert_eq!(seen["interfaces"], json!(["lo", "tap0"]), "{seen}");

    // The same prober on the host's network reaches all of it: the probe can fail.
    server
        .deploy(
            "host-prober",
            json!({"runtime": "python3", "network": "host"}),
            &[("handler.py", PROBER)],
        )
        .await;
    let seen = probe(&server, "default", "host-prober", &targets).await;
    assert_eq!(seen["loopback_service"], "connected:host", "{seen}");
    assert_eq!(seen["api"], "connected", "{seen}");
    assert_eq!(seen["host_instance"], "connected:instance", "{seen}");
    if ip.is_some() {
        assert_eq!(seen["host_ip_service"], "connected:host", "{seen}");
    }
    let ports = seen["proc_ports"].as_array().expect("ports");
    assert!(ports.contains(&json!(loopback_port)), "{seen}");
}

/// A network namespace of the test's, reached from the host through a veth pair: an
/// address outside the host, as the outside world is to a function. Its listener greets
/// each connection with the address it came from. The namespace, and the veth pair with
/// it, goes when the listener is killed.
struct OutsideHost {
    addr: String,
    listener: std::process::Child,
}

const OUTSIDE: &str = r#"
import socket, sys
print("ready", flush=True)
addr, port = sys.stdin.readline().split()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, int(port)))
s.listen(16)
print("up", flush=True)
while True:
    c, peer = s.accept()
    c.sendall(("outside " + peer[0]).encode())
    c.close()
"#;

impl OutsideHost {
    fn start(port: u16) -> OutsideHost {
        use std::io::{BufRead, Write};
        let pid = std::process::id();
        let (host_if, peer_if) = (format!("slo{pid}"), format!("sli{pid}"));
        // 10.X.Y.0/30 from the pid, so parallel runs do not collide.
        let (x, y) = (200 + (pid / 256) % 50, pid % 256);
        let (host_addr, addr) = (format!("10.{x}.{y}.1"), format!("10.{x}.{y}.2"));
        let mut listener = Command::new("unshare")
            .args(["--net", "python3", "-c", OUTSIDE])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("outside listener");
        let mut out = std::io::BufReader::new(listener.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("listener started");
        assert_eq!(line.trim(), "ready");
        let ns_pid = listener.id().to_string();
        let run = |args: &[&str]| {
            let status = Command::new(args[0])
                .args(&args[1..])
                .status()
                .expect("run");
            assert!(status.success(), "{args:?}");
        };
        run(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if, "netns",
            &ns_pid,
        ]);
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{host_addr}/30"),
            "dev",
            &host_if,
        ]);
        run(&["ip", "link", "set", &host_if, "up"]);
        let inside = |args: &[&str]| {
            let mut full = vec!["nsenter", "-t", &ns_pid, "-n", "ip"];
            full.extend_from_slice(args);
            run(&full);
        };
        inside(&["addr", "add", &format!("{addr}/30"), "dev", &peer_if]);
        inside(&["link", "set", &peer_if, "up"]);
        inside(&["link", "set", "lo", "up"]);
        let mut stdin = listener.stdin.take().expect("stdin");
        writeln!(stdin, "{addr} {port}").expect("configure listener");
        line.clear();
        out.read_line(&mut line).expect("listener up");
        assert_eq!(line.trim(), "up");
        OutsideHost { addr, listener }
    }
}

impl Drop for OutsideHost {
    fn drop(&mut self) {
        let _ = self.listener.kill();
        let _ = self.listener.wait();
    }
}

#[tokio::test]
async fn outbound_reaches_the_outside_and_none_reaches_nothing() {
    let server = Server::start().await;
    let port = free_port();
    let outside = OutsideHost::start(port);
    let targets = [("outside", outside.addr.clone(), port)];

    server
        .deploy(
            "out",
            json!({"runtime": "python3"}),
            &[("handler.py", PROBER)],
        )
        .await;
    let seen = probe(&server, "default", "out", &targets).await;
    // The outside sees the connection come from the host (slirp4netns's own socket).
    let said = seen["outside"].as_str().unwrap_or_default();
    assert!(said.starts_with("connected:outside 10."), "{seen}");

    server
        .deploy(
            "nothing",
            json!({"runtime": "python3", "network": "none"}),
            &[("handler.py", PROBER)],
        )
        .await;
    let seen = probe(
        &server,
        "default",
        "nothing",
        &[
            ("outside", outside.addr.clone(), port),
            ("slirp", "10.0.2.2".to_owned(), server.port),
            ("api", "127.0.0.1".to_owned(), server.port),
        ],
    )
    .await;
    assert_eq!(seen["outside"], "OSError", "{seen}");
    assert_eq!(seen["slirp"], "OSError", "{seen}");
    assert_eq!(seen["api"], "ConnectionRefusedError", "{seen}");
    assert_eq!(seen["interfaces"], json!(["lo"]), "{seen}");
}

#[tokio::test]
async fn host_network_is_for_the_admin_unless_the_server_allows_it() {
    let server = Server::start().await;
    server.client.ensure_namespace("team").await.expect("ns");
    let token = server.client.create_token("team").await.expect("token");
    let as_team = |method: reqwest::Method, path: &str, body: Value| {
        let req = server
            .client
            .http()
            .request(method, format!("{}{path}", server.url()))
            .bearer_auth(&token)
            .json(&body);
        async move {
            let resp = req.send().await.expect("request");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, body) = as_team(
        reqwest::Method::POST,
        "/v1/namespaces/team/functions",
        json!({"name": "f", "runtime": "python3", "network": "host"}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("--allow-host-network"), "{message}");

    let (status, body) = as_team(
        reqwest::Method::POST,
        "/v1/namespaces/team/functions",
        json!({"name": "f", "runtime": "python3"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["spec"]["network"], "outbound");
    let (status, body) = as_team(
        reqwest::Method::PATCH,
        "/v1/namespaces/team/functions/f",
        json!({"network": "host"}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = as_team(
        reqwest::Method::PATCH,
        "/v1/namespaces/team/functions/f",
        json!({"network": "none"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["spec"]["network"], "none");
    let (status, body) = as_team(
        reqwest::Method::PATCH,
        "/v1/namespaces/team/functions/f",
        json!({"network": "bridge"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid");

    // The admin may.
    let (status, body) = send(
        &server,
        reqwest::Method::PATCH,
        "/v1/namespaces/team/functions/f",
        Some(json!({"network": "host"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["spec"]["network"], "host");

    // A server that allows it lets namespace tokens choose it too.
    let open = Server::start_with(&["--allow-host-network"]).await;
    open.client.ensure_namespace("team").await.expect("ns");
    let token = open.client.create_token("team").await.expect("token");
    let resp = open
        .client
        .http()
        .post(format!("{}/v1/namespaces/team/functions", open.url()))
        .bearer_auth(&token)
        .json(&json!({"name": "f", "runtime": "python3", "network": "host"}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status().as_u16(), 201);
}
