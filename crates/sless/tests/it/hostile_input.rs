//! Hostile input against every endpoint: malformed and deeply nested JSON, bodies
//! over the limits, unicode and control characters in names, paths, queries and
//! headers, and headers that lie about the body. Every answer must be a 4xx in the
//! contract's shape (or the endpoint's documented success), never a 5xx, a hang or
//! a crash.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use crate::harness::{Server, TOKEN, send};
use crate::hostile_edge::parse_response;

/// Answers whatever event it gets: a 5xx can only come from the platform.
const ECHO: &str = "def handle(event):\n    return {'path': event.get('path') if isinstance(event, dict) else None}\n";

/// Every route of the API and the gateways, with the methods it takes and
/// whether those take a body (`{x}` is filled in with existing objects).
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/v1/whoami"),
    ("POST", "/v1/tokens"),
    ("GET", "/v1/namespaces"),
    ("PUT", "/v1/namespaces/{ns}"),
    ("GET", "/v1/namespaces/{ns}"),
    ("GET", "/v1/namespaces/{ns}/functions"),
    ("POST", "/v1/namespaces/{ns}/functions"),
    ("GET", "/v1/namespaces/{ns}/functions/{fn}"),
    ("PATCH", "/v1/namespaces/{ns}/functions/{fn}"),
    ("PUT", "/v1/namespaces/{ns}/functions/{fn}/code"),
    ("GET", "/v1/namespaces/{ns}/functions/{fn}/source"),
    ("GET", "/v1/namespaces/{ns}/functions/{fn}/logs"),
    ("POST", "/v1/namespaces/{ns}/functions/{fn}/invoke"),
    ("GET", "/v1/namespaces/{ns}/invocations"),
    ("GET", "/v1/namespaces/{ns}/triggers"),
    ("POST", "/v1/namespaces/{ns}/triggers"),
    ("GET", "/v1/namespaces/{ns}/triggers/{tr}"),
    ("PATCH", "/v1/namespaces/{ns}/triggers/{tr}"),
    ("GET", "/v1/namespaces/{ns}/jobs"),
    ("POST", "/v1/namespaces/{ns}/jobs"),
    ("GET", "/v1/namespaces/{ns}/jobs/{job}"),
    ("PATCH", "/v1/namespaces/{ns}/jobs/{job}"),
    ("PUT", "/v1/namespaces/{ns}/jobs/{job}/code"),
    ("POST", "/fn/{ns}/{fn}/a/b"),
    ("GET", "/fn/{ns}/{fn}"),
    ("POST", "/t/{ns}/echo"),
    ("GET", "/t/{ns}/echo/x"),
];

fn fill(path: &str, seg: &str) -> String {
    path.replace("{ns}", "default")
        .replace("{fn}", "echo")
        .replace("{tr}", "echo-route")
        .replace("{job}", "echo-job")
        .replace("SEG", seg)
}

/// One hostile request.
struct Case {
    what: String,
    method: String,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

fn case(what: &str, method: &str, path: String, content_type: &str, body: Vec<u8>) -> Case {
    Case {
        what: what.to_string(),
        method: method.to_string(),
        path,
        headers: vec![("Content-Type".into(), content_type.as_bytes().to_vec())],
        body,
    }
}

fn cases() -> Vec<Case> {
    let nested = "[".repeat(10_000).into_bytes();
    let deep_object = "{\"a\":".repeat(10_000).into_bytes();
    let huge = vec![b'x'; 2 * 1024 * 1024 + 1];
    let mut huge_json = b"{\"name\":\"".to_vec();
    huge_json.extend(vec![b'a'; 2 * 1024 * 1024]);
    huge_json.extend(b"\"}");
    let mut out = Vec::new();
    for (method, path) in ROUTES {
        let p = fill(path, "");
        let json_bodies: Vec<(&str, Vec<u8>)> = vec![
            ("malformed JSON", b"{\"name\": ".to_vec()),
            ("nested arrays", nested.clone()),
            ("nested objects", deep_object.clone()),
            ("huge JSON", huge_json.clone()),
            ("not UTF-8", vec![0xff, 0xfe, b'{', 0x00]),
            (
                "control characters in names",
                serde_json::to_vec(&json!({"name": "a\u{0}b\u{7}\n", "function": "e\u{202e}cho", "namespace": "de\u{0}fault", "runtime": "python3"})).unwrap(),
            ),
            (
                "unicode names",
                serde_json::to_vec(&json!({"name": "fünf-😀", "function": "écho", "namespace": "ñ", "type": "http", "path": "/ü\u{0}"})).unwrap(),
            ),
            ("a number", b"1e999999".to_vec()),
            ("null", b"null".to_vec()),
            ("wrong types", serde_json::to_vec(&json!({"name": ["x"], "runtime": {"a": 1}, "memory_mb": "lots", "env": [1], "run_id": -1, "enabled": "yes", "schedule": 5})).unwrap()),
        ];
        for (what, body) in json_bodies {
            out.push(case(what, method, p.clone(), "application/json", body));
        }
        out.push(case(
            "huge body",
            method,
            p.clone(),
            "application/zip",
            huge.clone(),
        ));
        out.push(case(
            "wrong content type",
            method,
            p.clone(),
            "text/plain",
            b"{}".to_vec(),
        ));
        out.push(case(
            "zip that is not one",
            method,
            p.clone(),
            "application/zip",
            b"PK\x03\x04garbage".to_vec(),
        ));
        out.push(case(
            "broken multipart",
            method,
            p.clone(),
            "multipart/form-data; boundary=x",
            b"--x\r\nContent-Disposition: form-data; name=\"code\"\r\n\r\nabc".to_vec(),
        ));
        out.push(case(
            "multipart without boundary",
            method,
            p.clone(),
            "multipart/form-data",
            b"abc".to_vec(),
        ));
        // Hostile path segments and query strings.
        for (what, seg) in [
            ("NUL in a name", "%00"),
            ("invalid UTF-8 in a name", "%ff%fe"),
            ("unicode in a name", "caf%C3%A9"),
            ("a long name", &"a".repeat(4000)),
            ("dot segments", "..%2F..%2Fetc"),
            ("RTL override", "%E2%80%AEx"),
        ] {
            let hostile = path
                .replace("{fn}", seg)
                .replace("{tr}", seg)
                .replace("{job}", seg)
                .replace(
                    "{ns}",
                    if path.contains("{fn}") || path.contains("{tr}") || path.contains("{job}") {
                        "default"
                    } else {
                        seg
                    },
                );
            out.push(case(
                what,
                method,
                hostile,
                "application/json",
                b"{}".to_vec(),
            ));
        }
        for (what, q) in [
            (
                "negative query numbers",
                "?tail=-1&wait=-1&limit=-1&since=-1",
            ),
            (
                "huge query numbers",
                "?tail=99999999999999999999999&wait=18446744073709551615&limit=1001",
            ),
            (
                "bad query encoding",
                "?tail=%ff&function=%00&status=%zz&follow=maybe",
            ),
            (
                "repeated query",
                "?limit=1&limit=2&tail=1&tail=2&wait=1&wait=2",
            ),
            (
                "unicode query",
                "?function=%E2%80%AE&source=%F0%9F%98%80&since=2025-13-45T99:99:99Z",
            ),
        ] {
            out.push(case(
                what,
                method,
                format!("{p}{q}"),
                "application/json",
                b"{}".to_vec(),
            ));
        }
        // Hostile headers.
        let mut c = case(
            "non-ASCII header values",
            method,
            p.clone(),
            "application/json",
            b"{}".to_vec(),
        );
        c.headers
            .push(("X-Request-Id".into(), vec![0xff, 0xfe, b'a']));
        c.headers
            .push(("X-Other".into(), "é😀".as_bytes().to_vec()));
        out.push(c);
        let mut c = case(
            "a huge request id",
            method,
            p.clone(),
            "application/json",
            b"{}".to_vec(),
        );
        c.headers.push(("X-Request-Id".into(), vec![b'r'; 8000]));
        out.push(c);
        let mut c = case(
            "odd authorization",
            method,
            p.clone(),
            "application/json",
            b"{}".to_vec(),
        );
        c.headers.retain(|(n, _)| n != "Authorization");
        c.headers.push(("Authorization".into(), b"Bearer".to_vec()));
        out.push(c);
    }
    // Deletes only with hostile names: the objects the other cases use stay.
    for path in [
        "/v1/namespaces/{ns}",
        "/v1/namespaces/default/functions/{ns}",
        "/v1/namespaces/default/triggers/{ns}",
        "/v1/namespaces/default/jobs/{ns}",
        "/v1/namespaces/{ns}/functions/echo",
    ] {
        for seg in ["%00", "%ff%fe", "caf%C3%A9", "..%2F..", "%E2%80%AEx"] {
            let p = path.replace("{ns}", seg);
            out.push(case(
                "hostile name",
                "DELETE",
                format!("{p}?force=%ff"),
                "application/json",
                Vec::new(),
            ));
            out.push(case(
                "hostile name",
                "DELETE",
                p,
                "application/json",
                Vec::new(),
            ));
        }
    }
    out
}

/// Sends `c` on its own connection: `Authorization` (unless the case sets one),
/// `Content-Length` and `Connection: close`. Returns the status and body, or what
/// went wrong.
async fn send_raw(
    port: u16,
    c: &Case,
    content_length: Option<usize>,
    extra: &[u8],
) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut req = format!(
        "{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n",
        c.method, c.path
    )
    .into_bytes();
    if !c.headers.iter().any(|(n, _)| n == "Authorization") {
        req.extend(format!("Authorization: Bearer {TOKEN}\r\n").as_bytes());
    }
    for (name, value) in &c.headers {
        req.extend(name.as_bytes());
        req.extend(b": ");
        req.extend(value);
        req.extend(b"\r\n");
    }
    req.extend(
        format!(
            "Content-Length: {}\r\n\r\n",
            content_length.unwrap_or(c.body.len())
        )
        .as_bytes(),
    );
    let work = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        s.write_all(&req).await.map_err(|e| format!("write: {e}"))?;
        // The server may answer (413) before the whole body is sent and close.
        let _ = s.write_all(&c.body).await;
        let _ = s.write_all(extra).await;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        Ok::<_, String>(out)
    };
    let out = tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .map_err(|_| "no answer within 10 s".to_string())??;
    Ok(parse_response(&out))
}

/// A 4xx in the contract's shape, or a success; never a 5xx, a hang or silence.
fn judge(result: &Result<(u16, String), String>) -> Option<String> {
    match result {
        Err(e) => Some(e.clone()),
        Ok((0, _)) => Some("closed without an answer".into()),
        Ok((s, body)) if *s >= 500 => Some(format!("{s}: {body}")),
        Ok((s, body)) if *s >= 400 => {
            let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
            (!(v["error"]["code"].is_string() && v["error"]["message"].is_string()))
                .then(|| format!("{s} not in the contract's shape: {body:?}"))
        }
        Ok(_) => None,
    }
}

async fn set_up() -> Server {
    let server = Server::start_with(&[
        "--prewarm",
        "0",
        "--max-archive-mb",
        "1",
        "--max-body-mb",
        "1",
        "--body-timeout-sec",
        "1",
        "--header-timeout-sec",
        "2",
    ])
    .await;
    server
        .deploy(
            "echo",
            json!({"runtime": "python3"}),
            &[("handler.py", ECHO)],
        )
        .await;
    let ns = "/v1/namespaces/default";
    let (s, b) = send(&server, reqwest::Method::POST, &format!("{ns}/triggers"), Some(json!({"name": "echo-route", "function": "echo", "type": "http", "path": "/echo", "methods": ["GET", "POST"]}))).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = send(
        &server,
        reqwest::Method::POST,
        &format!("{ns}/jobs"),
        Some(json!({"name": "echo-job", "function": "echo", "event": {}})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    server
}

#[tokio::test]
async fn every_endpoint_answers_hostile_input_with_a_4xx_in_the_contract_shape() {
    let started = Instant::now();
    let server = set_up().await;
    let port = server.port;
    let all = cases();
    let n = all.len();
    let failures: Vec<String> = futures::stream::iter(all)
        .map(|c| async move {
            let r = send_raw(port, &c, None, b"").await;
            judge(&r).map(|why| {
                format!(
                    "{} {} ({}): {why}",
                    c.method,
                    c.path.chars().take(80).collect::<String>(),
                    c.what
                )
            })
        })
        .buffer_unordered(8)
        .filter_map(|f| async move { f })
        .collect()
        .await;
    assert!(
        failures.is_empty(),
        "{} of {n} hostile requests answered wrongly:\n{}",
        failures.len(),
        failures.join("\n")
    );
    still_healthy(&server).await;
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn headers_that_lie_about_the_body_get_a_4xx_or_the_documented_success() {
    let server = set_up().await;
    let port = server.port;
    let mut failures = Vec::new();
    let body_routes: Vec<_> = ROUTES.iter().filter(|(m, _)| *m != "GET").collect();
    let mut work = Vec::new();
    for (method, path) in body_routes {
        let p = fill(path, "");
        // Content-Length larger than the body: the body never completes (408).
        work.push((
            format!("{method} {p}: Content-Length larger than the body"),
            case(
                "long",
                method,
                p.clone(),
                "application/json",
                b"{}".to_vec(),
            ),
            Some(100usize),
            Vec::new(),
        ));
        // Content-Length smaller than the body: the rest is a second (garbage) request
        // on a connection the client asked to close; the first answer counts.
        work.push((
            format!("{method} {p}: Content-Length smaller than the body"),
            case(
                "short",
                method,
                p.clone(),
                "application/json",
                b"{\"name\": \"x\"} trailing garbage".to_vec(),
            ),
            Some(2),
            Vec::new(),
        ));
        // Chunked bodies with a broken chunk, and Transfer-Encoding against Content-Length.
        let mut c = case(
            "bad chunk",
            method,
            p.clone(),
            "application/json",
            Vec::new(),
        );
        c.headers
            .push(("Transfer-Encoding".into(), b"chunked".to_vec()));
        work.push((
            format!("{method} {p}: a broken chunk"),
            c,
            None,
            b"zz\r\n{}\r\n0\r\n\r\n".to_vec(),
        ));
    }
    let results = futures::stream::iter(work)
        .map(|(what, c, len, extra)| async move {
            let mut c = c;
            // A chunked body carries no Content-Length of its own.
            let r = if extra.is_empty() {
                send_raw(port, &c, len, b"").await
            } else {
                c.body = extra;
                send_chunked(port, &c).await
            };
            (what, r)
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    for (what, r) in results {
        if let Some(why) = judge(&r) {
            failures.push(format!("{what}: {why}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    still_healthy(&server).await;
}

/// A request with `Transfer-Encoding: chunked` (and, to confuse, a Content-Length
/// too on every other route) whose body is `c.body` as written.
async fn send_chunked(port: u16, c: &Case) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut req = format!("{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\n", c.method, c.path).into_bytes();
    for (name, value) in &c.headers {
        req.extend(name.as_bytes());
        req.extend(b": ");
        req.extend(value);
        req.extend(b"\r\n");
    }
    req.extend(b"\r\n");
    req.extend(&c.body);
    let work = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(&req).await.map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        Ok::<_, String>(out)
    };
    let out = tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .map_err(|_| "no answer within 10 s".to_string())??;
    Ok(parse_response(&out))
}

async fn still_healthy(server: &Server) {
    let r = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
        .get(format!("{}/healthz", server.url()))
        .send()
        .await
        .expect("the server still answers");
    assert_eq!(r.status(), 200);
    let (s, _) = send(
        server,
        reqwest::Method::GET,
        "/v1/namespaces/default/functions/echo",
        None,
    )
    .await;
    assert_eq!(s, 200);
    let r = reqwest::Client::new()
        .post(format!("{}/fn/default/echo", server.url()))
        .body("still serving")
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn requests_hyper_refuses_get_a_4xx_and_the_server_goes_on() {
    // These never reach the router: hyper refuses them itself. The answer must
    // still be a 4xx in the contract's shape, and the server must keep serving.
    let server = Server::start_with(&["--prewarm", "0"]).await;
    let port = server.port;
    let many_headers: String = (0..150).map(|i| format!("X-{i}: 1\r\n")).collect();
    let cases: Vec<(&str, Vec<u8>, &[u16])> = vec![
        (
            "a 70 KB URI",
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            &[414],
        ),
        (
            "a 70 KB URI on /fn/",
            format!("GET /fn/default/x/{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            &[414],
        ),
        (
            "150 headers",
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n").into_bytes(),
            &[431],
        ),
        (
            "a 500 KB header",
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(500_000)).into_bytes(),
            &[431],
        ),
        ("a garbage request line", b"GARBAGE\r\n\r\n".to_vec(), &[400]),
        ("a bad version", b"GET / HTTP/7.3\r\nHost: x\r\n\r\n".to_vec(), &[400]),
        ("a header without a colon", b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n".to_vec(), &[400]),
        (
            "two Content-Lengths",
            b"POST /v1/namespaces/default/functions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef".to_vec(),
            &[400],
        ),
        (
            "Content-Length and chunked",
            format!("POST /v1/namespaces/default/functions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n").into_bytes(),
            &[400],
        ),
        (
            "a chunk size overflow",
            b"POST /fn/default/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n".to_vec(),
            &[400, 404],
        ),
    ];
    for (what, bytes, want) in cases {
        let (status, body) = crate::hostile_edge::raw(port, &bytes, Duration::from_secs(5)).await;
        assert!(want.contains(&status), "{what}: {status} {body:?}");
        let code = contract_code(&body).unwrap_or_else(|| panic!("{what}: {status} {body:?}"));
        let expected: &[&str] = match status {
            414 => &["uri_too_long"],
            431 => &["headers_too_large"],
            404 => &["not_found"],
            // hyper's refusal, or a body the API or gateway could not read.
            _ => &["invalid", "bad_request"],
        };
        assert!(expected.contains(&code.as_str()), "{what}: {body}");
    }
    // A malformed request after a served one on the same connection is answered
    // in the contract's shape too, and the served answer is left as it was.
    let (first, second) = two_on_one_connection(
        port,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GARBAGE\r\n\r\n",
    )
    .await;
    assert!(first.starts_with("HTTP/1.1 200 "), "{first}");
    assert!(first.ends_with(r#"{"status":"ok"}"#), "{first}");
    let (status, body) = crate::hostile_edge::parse_response(second.as_bytes());
    assert_eq!(status, 400, "{second}");
    assert_eq!(contract_code(&body).as_deref(), Some("invalid"), "{second}");
    still_healthy_without_functions(&server).await;
}

/// The `error.code` of a body in the contract's shape with a message.
fn contract_code(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v["error"]["message"].as_str().filter(|m| !m.is_empty())?;
    v["error"]["code"].as_str().map(str::to_string)
}

/// Sends `a`, reads its whole answer (framed by `Content-Length`), then sends `b` on
/// the same connection and reads until the server closes it.
async fn two_on_one_connection(port: u16, a: &[u8], b: &[u8]) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let work = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        s.write_all(a).await.unwrap();
        let mut first = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&first));
            first.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&first).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap();
                if body.len() >= length {
                    break;
                }
            }
        }
        s.write_all(b).await.unwrap();
        let mut second = Vec::new();
        let _ = s.read_to_end(&mut second).await;
        (
            String::from_utf8_lossy(&first).to_string(),
            String::from_utf8_lossy(&second).to_string(),
        )
    };
    tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .expect("answers within 10 s")
}

async fn still_healthy_without_functions(server: &Server) {
    let r = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
        .get(format!("{}/healthz", server.url()))
        .send()
        .await
        .expect("the server still answers");
    assert_eq!(r.status(), 200);
}
