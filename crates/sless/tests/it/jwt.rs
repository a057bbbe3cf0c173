//! JWT sign-in through the real server, with keys the tests generate: HS256 from a
//! secret file, RS256 from a JWKS file and from a JWKS URL served here (with a key
//! rotation), every refusal with the check it names, and one namespace per subject.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use rsa::pkcs1::{EncodeRsaPrivateKey, EncodeRsaPublicKey};
use rsa::traits::PublicKeyParts;
use serde_json::{Value, json};

use crate::harness::{Server, TOKEN};

const SECRET: &str = "an-hs256-secret-of-at-least-32-bytes!";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Claims valid for an hour, for `sub`.
fn claims(sub: &str) -> Value {
    json!({"sub": sub, "exp": now() + 3600, "iat": now()})
}

fn hs256(claims: &Value) -> String {
    hs256_with(SECRET.as_bytes(), claims)
}

fn hs256_with(secret: &[u8], claims: &Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap()
}

/// An RSA key pair with its `kid`.
struct RsaKey {
    kid: String,
    private: rsa::PrivateKey,
}

impl RsaKey {
    fn new(kid: &str) -> RsaKey {
        let private = rsa::PrivateKey::new(&mut getrandom::SysRng, 2048).unwrap();
        RsaKey {
            kid: kid.into(),
            private,
        }
    }

    fn jwk(&self) -> Value {
        let public = self.private.to_public_key();
        json!({
            "kty": "RSA",
            "use": "sig",
            "alg": "RS256",
            "kid": self.kid,
            "n": b64(&public.n().to_be_bytes_trimmed_vartime()),
            "e": b64(&public.e().to_be_bytes_trimmed_vartime()),
        })
    }

    fn public_der(&self) -> Vec<u8> {
        self.private
            .to_public_key()
            .to_pkcs1_der()
            .unwrap()
            .as_bytes()
            .to_vec()
    }

    fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, claims)
    }

    fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.into());
        let der = self.private.to_pkcs1_der().unwrap();
        encode(&header, claims, &EncodingKey::from_rsa_der(der.as_bytes())).unwrap()
    }
}

fn jwks(keys: &[&RsaKey]) -> Value {
    json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()})
}

/// `GET path` with `token`: the status and the JSON body.
async fn get(server: &Server, token: &str, path: &str) -> (u16, Value) {
    let resp = server
        .client
        .http()
        .get(format!("{}{path}", server.url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Asserts a `401` whose message contains `needle`.
async fn refused(server: &Server, token: &str, needle: &str) {
    let (status, body) = get(server, token, "/v1/whoami").await;
    assert_eq!(status, 401, "{needle}: {body}");
    assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(needle),
        "expected {needle:?} in {message:?}"
    );
}

fn write(dir: &Path, name: &str, content: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.to_str().unwrap().to_string()
}

/// A JWKS served on 127.0.0.1 that the test can change, counting fetches.
struct JwksServer {
    url: String,
    doc: Arc<Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
}

impl JwksServer {
    async fn start(doc: Value) -> JwksServer {
        let doc = Arc::new(Mutex::new(doc));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (d, f) = (doc.clone(), fetches.clone());
        let app = axum::Router::new().route(
            "/jwks.json",
            axum::routing::get(move || {
                let (d, f) = (d.clone(), f.clone());
                async move {
                    f.fetch_add(1, Ordering::SeqCst);
                    axum::Json(d.lock().unwrap().clone())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        JwksServer { url, doc, fetches }
    }

    fn serve(&self, doc: Value) {
        *self.doc.lock().unwrap() = doc;
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn hs256_subjects_get_their_own_namespaces_created_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let secret = write(dir.path(), "secret", format!("{SECRET}\n").as_bytes());
    let server = Server::start_with(&[
        "--jwt-hs256-secret-file",
        &secret,
        "--jwt-issuer",
        "https://idp.example",
        "--jwt-audience",
        "sless",
    ])
    .await;
    let signed = |sub: &str| {
        let mut c = claims(sub);
        c["iss"] = json!("https://idp.example");
        c["aud"] = json!("sless");
        hs256(&c)
    };
    let alice = signed("Alice@Example.com");
    let bob = signed("bob");

    let (status, _) = get(&server, TOKEN, "/v1/namespaces/alice-example-com").await;
    assert_eq!(status, 404, "no namespace before the first sign-in");
    let (status, who) = get(&server, &alice, "/v1/whoami").await;
    assert_eq!(status, 200, "{who}");
    assert_eq!(who["admin"], false);
    assert_eq!(who["namespaces"], json!(["alice-example-com"]));
    let (status, ns) = get(&server, TOKEN, "/v1/namespaces/alice-example-com").await;
    assert_eq!(status, 200, "created at the first valid request: {ns}");

    // Two subjects, two namespaces that cannot see each other.
    let (status, who) = get(&server, &bob, "/v1/whoami").await;
    assert_eq!((status, &who["namespaces"]), (200, &json!(["bob"])));
    let (status, _) = get(
        &server,
        &alice,
        "/v1/namespaces/alice-example-com/functions",
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = get(&server, &bob, "/v1/namespaces/alice-example-com/functions").await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = get(&server, &alice, "/v1/namespaces/bob/functions").await;
    assert_eq!(status, 404, "{body}");
    let (status, list) = get(&server, &bob, "/v1/namespaces").await;
    assert_eq!(status, 200);
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["bob"], "{list}");

    // The CLI takes a JWT like any token.
    let sless = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sless"))
            .args(args)
            .env("SLESS_SERVER", server.url())
            .env("SLESS_TOKEN", &alice)
            .env_remove("SLESS_NAMESPACE")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let out = sless(&["whoami"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}", out);
    assert!(text.contains("alice-example-com"), "{text}");
    let out = sless(&["-n", "alice-example-com", "ls"]);
    assert!(out.status.success(), "{:?}", out);
    let out = sless(&["-n", "bob", "ls"]);
    assert!(
        !out.status.success(),
        "another subject's namespace: {:?}",
        out
    );

    // Each refusal names its check.
    let mut c = claims("alice");
    c["iss"] = json!("https://idp.example");
    c["aud"] = json!("sless");
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = c.clone();
        f(&mut c);
        hs256(&c)
    };
    refused(
        &server,
        &hs256_with(b"another-secret-of-at-least-32-bytes!!", &c),
        "bad signature",
    )
    .await;
    let genuine = hs256(&c);
    let parts: Vec<&str> = genuine.split('.').collect();
    let mut payload = c.clone();
    payload["sub"] = json!("bob");
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        b64(payload.to_string().as_bytes()),
        parts[2]
    );
    refused(&server, &tampered, "bad signature").await;
    refused(
        &server,
        &with(&|c| c["exp"] = json!(now() - 600)),
        "expired",
    )
    .await;
    refused(
        &server,
        &with(&|c| c["nbf"] = json!(now() + 600)),
        "not yet valid",
    )
    .await;
    refused(
        &server,
        &with(&|c| c["iss"] = json!("https://evil.example")),
        "wrong issuer",
    )
    .await;
    refused(
        &server,
        &with(&|c| c["aud"] = json!("someone-else")),
        "wrong audience",
    )
    .await;
    refused(
        &server,
        &with(&|c| {
            c.as_object_mut().unwrap().remove("exp");
        }),
        "exp",
    )
    .await;
    let none = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT"}"#),
        b64(c.to_string().as_bytes())
    );
    refused(&server, &none, "algorithm not allowed: none").await;
    refused(&server, "abc.def.ghi", "malformed").await;

    // A far-future exp is taken (and breaks nothing).
    let (status, _) = get(&server, &with(&|c| c["exp"] = json!(1e300)), "/v1/whoami").await;
    assert!(status == 200 || status == 401, "{status}");
    let (status, _) = get(&server, &genuine, "/v1/whoami").await;
    assert_eq!(status, 200, "the server still answers");

    // Within the leeway, an expired token is still taken.
    let (status, _) = get(
        &server,
        &with(&|c| c["exp"] = json!(now() - 5)),
        "/v1/whoami",
    )
    .await;
    assert_eq!(status, 200);

    // A claim that maps to no valid namespace name is 403.
    let (status, body) = get(&server, &with(&|c| c["sub"] = json!("@@@")), "/v1/whoami").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden", "{body}");

    // Failed sign-ins count toward the per-address limit.
    let mut limited = false;
    for _ in 0..30 {
        let (status, _) = get(&server, &tampered, "/v1/whoami").await;
        if status == 429 {
            limited = true;
            break;
        }
        assert_eq!(status, 401);
    }
    assert!(limited, "refused JWTs are rate-limited per address");
}

#[tokio::test]
async fn rs256_from_a_jwks_file_refuses_unknown_kids_and_algorithm_confusion() {
    let dir = tempfile::tempdir().unwrap();
    let key = RsaKey::new("k1");
    let other = RsaKey::new("k2");
    let file = write(
        dir.path(),
        "jwks.json",
        jwks(&[&key]).to_string().as_bytes(),
    );
    let server = Server::start_with(&["--jwt-jwks-file", &file]).await;

    let token = key.sign(&claims("carol"));
    let (status, who) = get(&server, &token, "/v1/whoami").await;
    assert_eq!(
        (status, &who["namespaces"]),
        (200, &json!(["carol"])),
        "{who}"
    );
    // Again, from the cache of verified tokens.
    let (status, _) = get(&server, &token, "/v1/whoami").await;
    assert_eq!(status, 200);

    refused(&server, &other.sign(&claims("carol")), "unknown kid").await;
    refused(
        &server,
        &other.sign_as("k1", &claims("carol")),
        "bad signature",
    )
    .await;
    // HS256 "signed" with the public key, as an attacker who knows it would.
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("k1".into());
    let confused = encode(
        &header,
        &claims("carol"),
        &EncodingKey::from_secret(&key.public_der()).unwrap(),
    )
    .unwrap();
    refused(&server, &confused, "algorithm not allowed: HS256").await;
    let genuine = key.sign(&claims("carol"));
    let parts: Vec<&str> = genuine.split('.').collect();
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        b64(claims("dave").to_string().as_bytes()),
        parts[2]
    );
    refused(&server, &tampered, "bad signature").await;
    // An opaque token that is not a JWT is an unknown token, as before.
    refused(&server, "sless_0123456789abcdef", "unknown token").await;
}

#[tokio::test]
async fn rs256_from_a_jwks_url_follows_a_key_rotation() {
    let old = RsaKey::new("2026-old");
    let new = RsaKey::new("2026-new");
    let jwks_server = JwksServer::start(jwks(&[&old])).await;
    let server = Server::start_with(&[
        "--jwt-jwks-url",
        &jwks_server.url,
        "--jwt-jwks-min-refetch-sec",
        "0",
    ])
    .await;
    assert_eq!(jwks_server.fetches(), 1, "fetched at start");
    let (status, who) = get(&server, &old.sign(&claims("erin")), "/v1/whoami").await;
    assert_eq!(
        (status, &who["namespaces"]),
        (200, &json!(["erin"])),
        "{who}"
    );
    assert_eq!(jwks_server.fetches(), 1, "a known kid needs no fetch");

    // The provider rotates to a new key: a token with the new kid refetches.
    jwks_server.serve(jwks(&[&new]));
    let (status, who) = get(&server, &new.sign(&claims("erin")), "/v1/whoami").await;
    assert_eq!(
        (status, &who["namespaces"]),
        (200, &json!(["erin"])),
        "{who}"
    );
    assert_eq!(jwks_server.fetches(), 2);
    refused(
        &server,
        &old.sign_as("gone", &claims("erin")),
        "unknown kid",
    )
    .await;

    // With the default interval, an unknown kid does not refetch again and again.
    let slow = Server::start_with(&[
        "--jwt-jwks-url",
        &jwks_server.url,
        "--jwt-jwks-min-refetch-sec",
        "3600",
    ])
    .await;
    let before = jwks_server.fetches();
    for _ in 0..3 {
        refused(&slow, &old.sign(&claims("erin")), "unknown kid").await;
    }
    assert_eq!(
        jwks_server.fetches(),
        before,
        "no refetch within the interval"
    );
    let (status, _) = get(&slow, &new.sign(&claims("erin")), "/v1/whoami").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn bad_jwt_configuration_stops_the_server_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let not_jwks = write(dir.path(), "bad.json", b"{\"keys\": 42}");
    let short = write(dir.path(), "short", b"too-short");
    let missing = dir.path().join("missing").to_str().unwrap().to_string();
    for (flag, value, needle) in [
        ("--jwt-jwks-file", missing.as_str(), "cannot read"),
        ("--jwt-jwks-file", not_jwks.as_str(), "not a JWKS"),
        ("--jwt-hs256-secret-file", missing.as_str(), "cannot read"),
        ("--jwt-hs256-secret-file", short.as_str(), "at least 32"),
        ("--jwt-jwks-url", "http://127.0.0.1:9/jwks.json", ""),
    ] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .args([flag, value])
            .env("SLESS_ADMIN_TOKEN", TOKEN)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(needle),
            "{flag} {value}: {stderr}"
        );
    }
}

#[tokio::test]
async fn a_jwt_calls_the_private_functions_of_its_namespace_only() {
    let dir = tempfile::tempdir().unwrap();
    let secret = write(dir.path(), "secret", SECRET.as_bytes());
    let server = Server::start_with(&["--jwt-hs256-secret-file", &secret]).await;
    let frank = hs256(&claims("frank"));
    let grace = hs256(&claims("grace"));
    // Frank's first sign-in creates his namespace; he deploys a private function there.
    let as_frank = sless_client::Client::new(&server.url(), Some(frank.clone())).unwrap();
    as_frank
        .create_function(
            "frank",
            &json!({"name": "hello", "runtime": "python3", "private": true}),
        )
        .await
        .unwrap();
    let handler = "def handle(event):\n    return {\"hello\": \"frank\"}\n";
    let up = as_frank
        .upload_code(
            "frank",
            "hello",
            crate::harness::zip(&[("handler.py", handler)]),
        )
        .await
        .unwrap();
    server.wait_settled("frank", "hello", up.revision).await;

    let url = format!("{}/fn/frank/hello", server.url());
    let call = |token: Option<String>| {
        let mut req = server.client.http().get(&url);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    let (status, body) = call(Some(frank.clone())).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("frank"), "{body}");
    assert_eq!(call(None).await.0, 401);
    assert_eq!(call(Some(grace)).await.0, 404, "another subject");
    let mut expired = claims("frank");
    expired["exp"] = json!(now() - 600);
    // As for any token the gateway refuses: the function is not shown to exist.
    assert_eq!(call(Some(hs256(&expired))).await.0, 404);
    assert_eq!(call(Some("sless_unknown".into())).await.0, 404);

    // Frank's changes are in the audit log under his subject, with what, where and the outcome.
    as_frank
        .patch_function("frank", "hello", &json!({"env": {"GREETING": "hi"}}))
        .await
        .unwrap();
    as_frank.delete_function("frank", "hello").await.unwrap();
    let entries = server
        .client
        .list_audit(Some("frank"), None, Some(100))
        .await
        .unwrap();
    for action in ["function.create", "function.patch", "function.delete"] {
        let entry = entries
            .iter()
            .find(|e| e.action == action)
            .unwrap_or_else(|| panic!("no {action} in {entries:?}"));
        assert_eq!(entry.actor, "jwt:frank", "{entry:?}");
        assert_eq!(entry.object.kind, "function", "{entry:?}");
        assert_eq!(entry.object.name.as_deref(), Some("hello"), "{entry:?}");
        assert_eq!(entry.address.as_deref(), Some("127.0.0.1"), "{entry:?}");
        assert!((200..300).contains(&entry.status), "{entry:?}");
    }
    // The JWT cannot read the audit log itself.
    assert_eq!(get(&server, &frank, "/v1/audit").await.0, 404);
}

/// A JWKS file with a P-256 key (ES256) and an Ed25519 key (EdDSA); the private
/// keys are handed to `jsonwebtoken` as PKCS#8 DER built here.
#[tokio::test]
async fn es256_and_eddsa_keys_from_a_jwks_file() {
    let d: [u8; 32] = rand_bytes();
    let ec = p256::ecdsa::SigningKey::from_slice(&d).unwrap();
    let point = ec.verifying_key().to_sec1_point(false);
    let xy = &point.as_bytes()[1..];
    // PKCS#8 { ecPublicKey, prime256v1, ECPrivateKey { 1, d } }
    let mut ec_der =
        hex_bytes("3041020100301306072a8648ce3d020106082a8648ce3d030107042730250201010420");
    ec_der.extend_from_slice(&d);
    let seed: [u8; 32] = rand_bytes();
    let ed_public = ed25519_dalek::SigningKey::from_bytes(&seed)
        .verifying_key()
        .to_bytes();
    // PKCS#8 { Ed25519, seed }
    let mut ed_der = hex_bytes("302e020100300506032b657004220420");
    ed_der.extend_from_slice(&seed);

    let dir = tempfile::tempdir().unwrap();
    let doc = json!({"keys": [
        {"kty": "EC", "crv": "P-256", "kid": "ec1", "x": b64(&xy[..32]), "y": b64(&xy[32..])},
        {"kty": "OKP", "crv": "Ed25519", "kid": "ed1", "x": b64(&ed_public)},
    ]});
    let file = write(dir.path(), "jwks.json", doc.to_string().as_bytes());
    let server = Server::start_with(&["--jwt-jwks-file", &file]).await;
    let sign = |alg: Algorithm, kid: &str, der: &[u8], sub: &str| {
        let mut header = Header::new(alg);
        header.kid = Some(kid.into());
        let key = match alg {
            Algorithm::ES256 => EncodingKey::from_ec_der(der),
            _ => EncodingKey::from_ed_der(der),
        };
        encode(&header, &claims(sub), &key).unwrap()
    };
    let (status, who) = get(
        &server,
        &sign(Algorithm::ES256, "ec1", &ec_der, "hana"),
        "/v1/whoami",
    )
    .await;
    assert_eq!(
        (status, &who["namespaces"]),
        (200, &json!(["hana"])),
        "{who}"
    );
    let (status, who) = get(
        &server,
        &sign(Algorithm::EdDSA, "ed1", &ed_der, "ivan"),
        "/v1/whoami",
    )
    .await;
    assert_eq!(
        (status, &who["namespaces"]),
        (200, &json!(["ivan"])),
        "{who}"
    );
    // A key verifies only the algorithm of its type.
    refused(
        &server,
        &sign(Algorithm::ES256, "ed1", &ec_der, "hana"),
        "algorithm not allowed: ES256",
    )
    .await;
    let other: [u8; 32] = rand_bytes();
    let mut other_der = hex_bytes("302e020100300506032b657004220420");
    other_der.extend_from_slice(&other);
    refused(
        &server,
        &sign(Algorithm::EdDSA, "ed1", &other_der, "ivan"),
        "bad signature",
    )
    .await;
}

fn rand_bytes() -> [u8; 32] {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).unwrap();
    b
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}
