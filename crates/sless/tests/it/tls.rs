//! TLS on the listener: `sless serve --tls-cert --tls-key` with a CA and certificates
//! made by the test; the API, a function and the CLI over HTTPS; a certificate the
//! client does not trust; plain HTTP sent to the TLS port; reload on SIGHUP.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use serde_json::json;
use sless_client::Client;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::harness::{TOKEN, zip};

/// A certificate authority made for one test.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        Ca {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// A server certificate for 127.0.0.1 and localhost: (certificate PEM, its DER, key PEM).
    fn server_cert(&self, name: &str) -> (String, Vec<u8>, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), cert.der().to_vec(), key.serialize_pem())
    }
}

/// The files a TLS server is started with.
struct Files {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn files(ca: &Ca, cert_pem: &str, key_pem: &str) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("ca.pem"), &ca.pem).unwrap();
    std::fs::write(path("cert.pem"), cert_pem).unwrap();
    std::fs::write(path("key.pem"), key_pem).unwrap();
    Files {
        ca: path("ca.pem"),
        cert: path("cert.pem"),
        key: path("key.pem"),
        _dir: dir,
    }
}

/// A `sless serve` over TLS whose stderr lines the test can wait for.
struct TlsServer {
    child: tokio::process::Child,
    port: u16,
    _data: tempfile::TempDir,
    lines: mpsc::UnboundedReceiver<String>,
    client: Client,
}

impl TlsServer {
    async fn start(files: &Files, extra: &[&str]) -> TlsServer {
        let data = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data.path().join("data"))
            .arg("--tls-cert")
            .arg(&files.cert)
            .arg("--tls-key")
            .arg(&files.key)
            .args(extra)
            .env("SLESS_ADMIN_TOKEN", TOKEN)
            .env("SLESS_LOG", "warn,sless::tls=info")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start sless serve");
        let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let (tx, mut lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stderr.next_line().await {
                eprintln!("{line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let start = tokio::time::timeout(Duration::from_secs(120), async {
            while let Some(line) = lines.recv().await {
                if let Some(rest) = line.strip_prefix("sless serving on https://") {
                    let addr = rest.split_whitespace().next().unwrap();
                    return addr.parse::<std::net::SocketAddr>().unwrap().port();
                }
            }
            panic!("sless serve exited during start");
        })
        .await
        .expect("sless serve printed no start line within 120 s");
        let ca = std::fs::read(&files.ca).unwrap();
        let client = Client::with_ca_cert(
            &format!("https://127.0.0.1:{start}"),
            Some(TOKEN.into()),
            Some(&ca),
        )
        .unwrap();
        TlsServer {
            child,
            port: start,
            _data: data,
            lines,
            client,
        }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn hangup(&self) {
        let pid = self.child.id().expect("server running");
        let status = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits (bounded) for a stderr line containing `needle`.
    async fn wait_line(&mut self, needle: &str) -> String {
        tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = self.lines.recv().await {
                if line.contains(needle) {
                    return line;
                }
            }
            panic!("sless serve exited before logging {needle:?}");
        })
        .await
        .unwrap_or_else(|_| panic!("no log line with {needle:?} within 60 s"))
    }

    /// The certificate the server presents to a new connection.
    async fn peer_certificate(&self, ca_pem: &[u8]) -> Vec<u8> {
        let http = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(ca_pem).unwrap()])
            .tls_info(true)
            .build()
            .unwrap();
        let resp = http
            .get(format!("{}/healthz", self.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.extensions()
            .get::<reqwest::tls::TlsInfo>()
            .and_then(|info| info.peer_certificate())
            .expect("TLS info with the peer certificate")
            .to_vec()
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn cli(server: &TlsServer, args: &[&str]) -> std::process::Output {
    cli_with_env(server, args, &[]).await
}

/// The CLI with the system trust store overridden as OpenSSL's variables do
/// (`SSL_CERT_FILE`), and only as `env` says.
async fn cli_with_env(
    server: &TlsServer,
    args: &[&str],
    env: &[(&str, &Path)],
) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
        .args(args)
        .env("SLESS_SERVER", server.url())
        .env("SLESS_TOKEN", TOKEN)
        .env_remove("SLESS_NAMESPACE")
        .env_remove("SLESS_CA_CERT")
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run sless")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test]
async fn api_functions_and_cli_over_https_with_a_private_ca() {
    let ca = Ca::new("sless test CA");
    let (cert, _, key) = ca.server_cert("sless test server");
    let files = files(&ca, &cert, &key);
    let server = TlsServer::start(&files, &[]).await;

    // The API, with the CA trusted.
    let who = server.client.whoami().await.expect("whoami over https");
    assert_eq!(who["admin"], true, "{who}");

    // A function deployed and called over https; its URL says https.
    let f = server
        .client
        .create_function("default", &json!({"name": "hi", "runtime": "python3"}))
        .await
        .expect("create");
    assert!(f.status.url.starts_with("https://"), "{}", f.status.url);
    let handler = "def handle(event):\n    return {'hello': event['path']}\n";
    let up = server
        .client
        .upload_code("default", "hi", zip(&[("handler.py", handler)]))
        .await
        .expect("upload");
    server
        .client
        .wait_ready(
            "default",
            "hi",
            up.revision,
            Duration::from_secs(120),
            |_| {},
        )
        .await
        .expect("ready");
    let resp = server
        .client
        .http()
        .get(format!("{}/fn/default/hi/there", server.url()))
        .send()
        .await
        .expect("call over https");
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body, json!({"hello": "/there"}));

    // The CLI with --ca-cert.
    let out = cli(&server, &["ls", "--ca-cert", path_str(&files.ca)]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().next() == Some("hi")),
        "{listed}"
    );

    // A CA that did not sign the server's certificate: refused, with a hint.
    let other = Ca::new("another CA");
    let other_ca = files.ca.with_file_name("other-ca.pem");
    std::fs::write(&other_ca, &other.pem).unwrap();
    let out = cli(&server, &["ls", "--ca-cert", path_str(&other_ca)]).await;
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains("certificate"), "{err}");
    assert!(err.contains("hint:") && err.contains("--ca-cert"), "{err}");

    // Without --ca-cert only the system's trust store counts, which knows nothing of
    // the test's CA.
    let out = cli(&server, &["ls"]).await;
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).to_lowercase().contains("certificate"),
        "{}",
        text(&out.stderr)
    );

    // The system trust store, here the test's CA as `SSL_CERT_FILE`, is trusted
    // without --ca-cert.
    let out = cli_with_env(&server, &["ls"], &[("SSL_CERT_FILE", &files.ca)]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));

    // A --ca-cert that is not a certificate names the flag.
    let out = cli(&server, &["ls", "--ca-cert", path_str(&files.key)]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--ca-cert"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn plain_http_to_the_tls_port_is_answered_and_closed() {
    let ca = Ca::new("sless test CA");
    let (cert, _, key) = ca.server_cert("sless test server");
    let files = files(&ca, &cert, &key);
    let server = TlsServer::start(&files, &["--header-timeout-sec", "2"]).await;
    let addr = format!("127.0.0.1:{}", server.port);

    // Plain HTTP: a plain 400 naming https, then the connection closes.
    let mut plain = tokio::net::TcpStream::connect(&addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), plain.read_to_end(&mut answer))
        .await
        .expect("the server closes a plain-HTTP connection")
        .unwrap();
    let answer = text(&answer);
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains("https://"), "{answer}");

    // A client that connects and never starts the handshake is closed after the
    // header timeout instead of holding a connection forever.
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), silent.read_to_end(&mut buf))
        .await
        .expect("a silent connection is closed")
        .unwrap();

    // A failed handshake (garbage after a handshake record byte) closes too.
    let mut garbage = tokio::net::TcpStream::connect(&addr).await.unwrap();
    garbage.write_all(&[0x16; 64]).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(60), garbage.read_to_end(&mut buf))
        .await
        .expect("a failed handshake is closed");

    // Meanwhile, and after, the server serves https.
    let who = server.client.whoami().await.expect("whoami over https");
    assert_eq!(who["admin"], true);
    drop((plain, silent, garbage));
}

#[tokio::test]
async fn sighup_reloads_the_certificate_and_a_broken_pair_keeps_the_old_one() {
    let ca = Ca::new("sless test CA");
    let (cert, first_der, key) = ca.server_cert("first");
    let files = files(&ca, &cert, &key);
    let mut server = TlsServer::start(&files, &[]).await;
    let ca_pem = ca.pem.as_bytes();
    assert_eq!(server.peer_certificate(ca_pem).await, first_der);

    // A renewed pair: new connections get it.
    let (cert, renewed_der, key) = ca.server_cert("renewed");
    assert_ne!(renewed_der, first_der);
    std::fs::write(&files.key, &key).unwrap();
    std::fs::write(&files.cert, &cert).unwrap();
    server.hangup();
    server.wait_line("reloaded the TLS certificate").await;
    assert_eq!(server.peer_certificate(ca_pem).await, renewed_der);

    // A certificate whose key is not the one beside it: the renewed pair stays.
    let (cert, _, _) = ca.server_cert("mismatched");
    std::fs::write(&files.cert, &cert).unwrap();
    server.hangup();
    let line = server.wait_line("cannot reload the TLS certificate").await;
    assert!(line.contains("does not match"), "{line}");
    assert_eq!(server.peer_certificate(ca_pem).await, renewed_der);
    let who = server.client.whoami().await.expect("whoami over https");
    assert_eq!(who["admin"], true);
}

#[tokio::test]
async fn unusable_tls_flags_stop_the_start_with_the_flag_named() {
    let ca = Ca::new("sless test CA");
    let (cert, _, key) = ca.server_cert("server");
    let (_, _, other_key) = ca.server_cert("other");
    let good = files(&ca, &cert, &key);
    let mismatched = files(&ca, &cert, &other_key);
    let data = tempfile::tempdir().unwrap();
    let start = |args: Vec<String>| {
        let data = data.path().join("data");
        async move {
            let out = tokio::time::timeout(
                Duration::from_secs(120),
                tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
                    .arg("serve")
                    .args(["--listen", "127.0.0.1:0", "--data-dir"])
                    .arg(data)
                    .args(args)
                    .env("SLESS_ADMIN_TOKEN", TOKEN)
                    .env_remove("SLESS_TLS_CERT")
                    .env_remove("SLESS_TLS_KEY")
                    .stdin(Stdio::null())
                    .output(),
            )
            .await
            .expect("sless serve stops at once")
            .unwrap();
            assert!(!out.status.success());
            text(&out.stderr)
        }
    };
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let err = start(vec!["--tls-cert".into(), s(&good.cert)]).await;
    assert!(err.contains("--tls-key"), "{err}");
    let err = start(vec![
        "--tls-cert".into(),
        s(&mismatched.cert),
        "--tls-key".into(),
        s(&mismatched.key),
    ])
    .await;
    assert!(err.contains("does not match"), "{err}");
    let err = start(vec![
        "--tls-cert".into(),
        s(&good.key),
        "--tls-key".into(),
        s(&good.key),
    ])
    .await;
    assert!(
        err.contains("--tls-cert") && err.contains("no certificate"),
        "{err}"
    );
    let err = start(vec![
        "--tls-cert".into(),
        s(&good.cert),
        "--tls-key".into(),
        s(&good.key.with_file_name("missing.pem")),
    ])
    .await;
    assert!(err.contains("--tls-key: cannot read"), "{err}");
}
