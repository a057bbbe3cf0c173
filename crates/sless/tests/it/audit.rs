//! Namespace tokens listed and revoked, the admin token rotated, and the audit log
//! of control-plane changes, through the real server.

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;

use reqwest::Method;
use serde_json::{Value, json};
use sha2::Digest;

use crate::harness::{Server, TOKEN, spawn_serving};

const HELLO_PY: &str = r#"
def handle(event):
    return {"hello": "world"}
"#;

/// A request with `token` (none: no `Authorization`); status and JSON body (`null` if none).
async fn req(
    url: &str,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = reqwest::Client::new().request(method.clone(), format!("{url}{path}"));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(b) = body {
        let content_type = if method == Method::PATCH {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        r = r.header("content-type", content_type).body(b.to_string());
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn items(v: &Value) -> Vec<Value> {
    v["items"].as_array().cloned().unwrap_or_default()
}

fn token_id(token: &str) -> String {
    hex::encode(sha2::Sha256::digest(token.as_bytes()))[..12].to_string()
}

async fn sless_cli(server: &Server, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
        .args(args)
        .env("SLESS_SERVER", server.url())
        .env("SLESS_TOKEN", TOKEN)
        .env_remove("SLESS_NAMESPACE")
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn tokens_are_listed_without_values_and_revoked_on_the_next_request() {
    let server = Server::start().await;
    let url = server.url();
    server
        .deploy(
            "private",
            json!({"runtime": "python3", "private": true}),
            &[("handler.py", HELLO_PY)],
        )
        .await;
    server.client.ensure_namespace("other").await.unwrap();
    let mine = server.client.create_token("default").await.unwrap();
    let theirs = server.client.create_token("other").await.unwrap();
    let (mine_id, theirs_id) = (token_id(&mine), token_id(&theirs));

    // Used once through the API and once through the gateway.
    let (status, _) = req(
        &url,
        Method::GET,
        "/v1/namespaces/default/functions",
        Some(&mine),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let fn_url = format!("{url}/fn/default/private/");
    let call = |token: String| {
        let fn_url = fn_url.clone();
        async move {
            reqwest::Client::new()
                .get(fn_url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(call(mine.clone()).await, 200);

    let (status, all) = req(&url, Method::GET, "/v1/tokens", Some(TOKEN), None).await;
    assert_eq!(status, 200, "{all}");
    let text = all.to_string();
    for secret in [&mine, &theirs] {
        assert!(
            !text.contains(secret.as_str()),
            "a token value is listed: {text}"
        );
        let hash = hex::encode(sha2::Sha256::digest(secret.as_bytes()));
        assert!(!text.contains(&hash), "a token hash is listed: {text}");
    }
    let listed = items(&all);
    assert_eq!(listed.len(), 2, "{all}");
    let entry = |id: &str| {
        listed
            .iter()
            .find(|t| t["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} not in {all}"))
    };
    let m = entry(&mine_id);
    assert_eq!(m["namespace"], "default");
    assert!(
        m["created_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{m}"
    );
    assert!(
        m["last_used_at"].as_str().is_some(),
        "a used token shows its last use: {m}"
    );
    let t = entry(&theirs_id);
    assert_eq!(t["namespace"], "other");
    assert_eq!(
        t["last_used_at"],
        Value::Null,
        "an unused token was never used: {t}"
    );

    let (_, filtered) = req(
        &url,
        Method::GET,
        "/v1/tokens?namespace=other",
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(items(&filtered).len(), 1, "{filtered}");
    // A namespace token sees its own namespace's tokens only.
    let (status, own) = req(&url, Method::GET, "/v1/tokens", Some(&mine), None).await;
    assert_eq!(status, 200);
    let own = items(&own);
    assert_eq!(own.len(), 1);
    assert_eq!(own[0]["id"], mine_id.as_str());
    let (status, _) = req(
        &url,
        Method::GET,
        "/v1/tokens?namespace=other",
        Some(&mine),
        None,
    )
    .await;
    assert_eq!(status, 404);

    // The CLI lists ids, never values.
    let out = sless_cli(&server, &["token", "ls"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&mine_id) && stdout.contains(&theirs_id),
        "{stdout}"
    );
    assert!(!stdout.contains(&mine), "{stdout}");

    // Another namespace's token, and an unknown id, are not found.
    let (status, body) = req(
        &url,
        Method::DELETE,
        &format!("/v1/tokens/{theirs_id}"),
        Some(&mine),
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    let (status, _) = req(
        &url,
        Method::DELETE,
        "/v1/tokens/000000000000",
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        call(theirs.clone()).await,
        404,
        "still valid, but not for this namespace"
    );

    // Revoked: refused on the very next request, by the API and the gateway.
    let (status, _) = req(
        &url,
        Method::DELETE,
        &format!("/v1/tokens/{mine_id}"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) = req(
        &url,
        Method::GET,
        "/v1/namespaces/default/functions",
        Some(&mine),
        None,
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(call(mine.clone()).await, 404);
    // Through the CLI too.
    let out = sless_cli(&server, &["token", "rm", &theirs_id]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, _) = req(&url, Method::GET, "/v1/whoami", Some(&theirs), None).await;
    assert_eq!(status, 401);
    let (_, left) = req(&url, Method::GET, "/v1/tokens", Some(TOKEN), None).await;
    assert_eq!(items(&left).len(), 0, "{left}");

    // An admin token from SLESS_ADMIN_TOKEN cannot be rotated by the server.
    let (status, body) = req(
        &url,
        Method::POST,
        "/v1/tokens/admin/rotate",
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("SLESS_ADMIN_TOKEN"),
        "{body}"
    );
}

/// `sless serve` with a generated admin token (no `SLESS_ADMIN_TOKEN`) in `data`.
async fn serve_generated(data: &std::path::Path) -> (tokio::process::Child, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"));
    cmd.arg("serve")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(data)
        .env_remove("SLESS_ADMIN_TOKEN")
        .env("SLESS_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let (child, port) = spawn_serving(cmd).await;
    (child, format!("http://127.0.0.1:{port}"))
}

#[tokio::test]
async fn the_admin_token_is_rotated_without_a_restart_and_a_restart_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut child, url) = serve_generated(&data).await;
    let file = data.join("admin-token");
    let old = std::fs::read_to_string(&file).unwrap().trim().to_string();
    let (status, _) = req(&url, Method::GET, "/v1/whoami", Some(&old), None).await;
    assert_eq!(status, 200);
    server_side_namespace_token_refused_rotation(&url, &old).await;

    let (status, body) = req(
        &url,
        Method::POST,
        "/v1/tokens/admin/rotate",
        Some(&old),
        None,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let new = body["token"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    let (status, body) = req(&url, Method::GET, "/v1/whoami", Some(&new), None).await;
    assert_eq!(status, 200);
    assert_eq!(body["admin"], true);
    let (status, _) = req(&url, Method::GET, "/v1/whoami", Some(&old), None).await;
    assert_eq!(status, 401, "the old admin token is refused at once");
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), new);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // Once more from the command line: it prints the new token once.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
        .args(["token", "rotate-admin"])
        .env("SLESS_SERVER", &url)
        .env("SLESS_TOKEN", &new)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let newest = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (status, _) = req(&url, Method::GET, "/v1/whoami", Some(&newest), None).await;
    assert_eq!(status, 200);
    let (status, _) = req(&url, Method::GET, "/v1/whoami", Some(&new), None).await;
    assert_eq!(status, 401);
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), newest);

    child.kill().await.unwrap();
    let (_child, url) = serve_generated(&data).await;
    let (status, _) = req(&url, Method::GET, "/v1/whoami", Some(&newest), None).await;
    assert_eq!(status, 200, "the rotated token survives a restart");
    for stale in [&old, &new] {
        let (status, _) = req(&url, Method::GET, "/v1/whoami", Some(stale), None).await;
        assert_eq!(status, 401);
    }
}

/// A namespace token cannot rotate the admin token: the endpoint does not exist for it.
async fn server_side_namespace_token_refused_rotation(url: &str, admin: &str) {
    let (status, _) = req(url, Method::PUT, "/v1/namespaces/team", Some(admin), None).await;
    assert_eq!(status, 201);
    let (_, body) = req(
        url,
        Method::POST,
        "/v1/tokens",
        Some(admin),
        Some(json!({"namespace": "team"})),
    )
    .await;
    let team = body["token"].as_str().unwrap().to_string();
    let (status, _) = req(
        url,
        Method::POST,
        "/v1/tokens/admin/rotate",
        Some(&team),
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = req(url, Method::GET, "/v1/whoami", Some(admin), None).await;
    assert_eq!(status, 200, "the admin token still works");
}

fn find<'a>(log: &'a [Value], actor: &str, action: &str, status: u16) -> &'a Value {
    log.iter()
        .find(|e| e["actor"] == actor && e["action"] == action && e["status"] == status)
        .unwrap_or_else(|| {
            panic!(
                "no {action} by {actor} with {status} in {}",
                serde_json::to_string_pretty(log).unwrap()
            )
        })
}

#[tokio::test]
async fn the_audit_log_records_who_changed_what_and_only_admins_read_it() {
    let server = Server::start().await;
    let url = server.url();
    const SECRET: &str = "hunter2-never-logged";
    let admin = Some(TOKEN);
    let (status, _) = req(&url, Method::PUT, "/v1/namespaces/team", admin, None).await;
    assert_eq!(status, 201);
    let (status, _) = req(&url, Method::PUT, "/v1/namespaces/other", admin, None).await;
    assert_eq!(status, 201);
    let (_, body) = req(
        &url,
        Method::POST,
        "/v1/tokens",
        admin,
        Some(json!({"namespace": "team"})),
    )
    .await;
    let token = body["token"].as_str().unwrap().to_string();
    let id = token_id(&token);
    let actor = format!("token:{id}");

    // Changes by the admin and by the namespace token.
    let create = json!({"name": "hello", "runtime": "python3", "env": {"PASSWORD": SECRET}});
    let (status, body) = req(
        &url,
        Method::POST,
        "/v1/namespaces/team/functions",
        admin,
        Some(create),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = req(
        &url,
        Method::PATCH,
        "/v1/namespaces/team/functions/hello",
        Some(&token),
        Some(json!({"env": {"PASSWORD": SECRET, "X": "1"}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = req(
        &url,
        Method::POST,
        "/v1/namespaces/team/functions",
        Some(&token),
        Some(json!({"name": "second", "runtime": "python3"})),
    )
    .await;
    assert_eq!(status, 201);
    let (status, _) = req(
        &url,
        Method::DELETE,
        "/v1/namespaces/team/functions/second",
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, _) = req(
        &url,
        Method::DELETE,
        "/v1/namespaces/team/functions/hello",
        admin,
        None,
    )
    .await;
    assert_eq!(status, 204);
    // Failed attempts: another namespace, and a bad token.
    let (status, _) = req(
        &url,
        Method::POST,
        "/v1/namespaces/other/functions",
        Some(&token),
        Some(json!({"name": "sneaky", "runtime": "python3"})),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = req(
        &url,
        Method::DELETE,
        "/v1/namespaces/team",
        Some("not-a-real-token"),
        None,
    )
    .await;
    assert_eq!(status, 401);
    // Reads are not changes.
    let (status, _) = req(
        &url,
        Method::GET,
        "/v1/namespaces/team/functions",
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, 200);

    // A namespace token cannot read the log: to it the endpoint does not exist.
    let (status, body) = req(&url, Method::GET, "/v1/audit", Some(&token), None).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");

    let (status, body) = req(&url, Method::GET, "/v1/audit?limit=1000", admin, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !body.to_string().contains(SECRET),
        "a secret value is in the audit log: {body}"
    );
    let log = items(&body);
    assert_eq!(
        log.len(),
        10,
        "every write, none of the reads: {}",
        serde_json::to_string_pretty(&log).unwrap()
    );
    let times: Vec<&str> = log.iter().map(|e| e["time"].as_str().unwrap()).collect();
    assert!(
        times.windows(2).all(|w| w[0] >= w[1]),
        "newest first: {times:?}"
    );

    let e = find(&log, "admin", "function.create", 201);
    assert_eq!(e["namespace"], "team");
    assert_eq!(e["object"], json!({"kind": "function", "name": "hello"}));
    assert_eq!(e["address"], "127.0.0.1");
    assert!(e["id"].as_str().is_some_and(|i| !i.is_empty()));
    let e = find(&log, &actor, "function.patch", 200);
    assert_eq!(e["object"], json!({"kind": "function", "name": "hello"}));
    assert_eq!(e["namespace"], "team");
    let e = find(&log, &actor, "function.create", 201);
    assert_eq!(e["object"]["name"], "second");
    find(&log, &actor, "function.delete", 204);
    find(&log, "admin", "function.delete", 204);
    let e = find(&log, "admin", "token.create", 201);
    assert_eq!(e["namespace"], "team");
    assert_eq!(e["object"], json!({"kind": "token", "name": id}));
    let e = find(&log, &actor, "function.create", 404);
    assert_eq!(e["namespace"], "other");
    let e = find(&log, "anonymous", "namespace.delete", 401);
    assert_eq!(e["object"], json!({"kind": "namespace", "name": "team"}));
    assert_eq!(e["address"], "127.0.0.1");
    find(&log, "admin", "namespace.put", 201);

    // Filters.
    let (_, body) = req(&url, Method::GET, "/v1/audit?namespace=other", admin, None).await;
    let other = items(&body);
    assert!(other.iter().all(|e| e["namespace"] == "other"), "{body}");
    assert_eq!(other.len(), 2, "{body}");
    let (_, body) = req(&url, Method::GET, "/v1/audit?limit=1", admin, None).await;
    assert_eq!(items(&body), log[..1].to_vec());
    let newest = log[0]["time"].as_str().unwrap();
    let (_, body) = req(
        &url,
        Method::GET,
        &format!("/v1/audit?since={newest}"),
        admin,
        None,
    )
    .await;
    assert!(
        items(&body)
            .iter()
            .all(|e| e["time"].as_str().unwrap() >= newest),
        "{body}"
    );
    assert!(!items(&body).is_empty());
    for (query, field) in [
        ("since=yesterday", "since"),
        ("limit=0", "limit"),
        ("limit=abc", "limit"),
    ] {
        let (status, body) = req(
            &url,
            Method::GET,
            &format!("/v1/audit?{query}"),
            admin,
            None,
        )
        .await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(field), "{query}: {message}");
    }
}
