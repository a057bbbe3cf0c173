//! The `sless` command line against a real server, as the README's tour uses it.

use std::process::Output;

use futures::StreamExt;
use serde_json::json;

use crate::harness::{Server, TOKEN, repo_path};

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

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn deploy_invoke_logs_ls_and_rm_from_the_command_line() {
    let server = Server::start().await;
    let dir = repo_path("examples/hello-python");
    let out = sless(&server, &["deploy", dir.to_str().unwrap()]).await;
    assert!(
        out.status.success(),
        "deploy failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains(&format!("{}/fn/default/hello-python", server.url())),
        "deploy prints the URL: {}",
        text(&out.stdout)
    );

    let out = sless(
        &server,
        &["invoke", "hello-python", "--data", r#"{"name":"Ada"}"#],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("Hello, Ada!"),
        "{}",
        text(&out.stdout)
    );

    let out = sless(&server, &["logs", "hello-python"]).await;
    assert!(out.status.success());
    assert!(
        text(&out.stdout).contains("greeting Ada"),
        "{}",
        text(&out.stdout)
    );

    let out = sless(&server, &["ls"]).await;
    let listing = text(&out.stdout);
    assert!(
        listing.contains("hello-python") && listing.contains("Ready"),
        "{listing}"
    );

    // A failing build exits non-zero and shows why.
    let broken = tempfile::tempdir().unwrap();
    std::fs::write(
        broken.path().join("handler.py"),
        "def other(event):\n    return 1\n",
    )
    .unwrap();
    let out = sless(
        &server,
        &[
            "deploy",
            broken.path().to_str().unwrap(),
            "--name",
            "broken",
        ],
    )
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("handle"),
        "{}",
        text(&out.stderr)
    );

    let out = sless(&server, &["rm", "hello-python"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.get("hello-python", "").await.0, 404);
}

#[tokio::test]
async fn following_logs_receives_lines_printed_after_it_started() {
    let server = Server::start().await;
    server
        .deploy(
            "chatty",
            json!({"runtime": "python3"}),
            &[(
                "handler.py",
                "def handle(e):\n    print('said', e['path'])\n    return 1\n",
            )],
        )
        .await;
    let mut stream = server
        .client
        .follow_logs("default", "chatty", Some(0))
        .await
        .unwrap();
    assert_eq!(server.get("chatty", "/late-line").await.0, 200);
    let mut seen = String::new();
    let found = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Some(chunk) = stream.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if seen.contains("said /late-line") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "followed output: {seen}");
}

#[tokio::test]
async fn browsers_can_upload_code_as_multipart_and_paused_functions_answer_503() {
    let server = Server::start().await;
    server
        .client
        .create_function("default", &json!({"name": "mp", "runtime": "python3"}))
        .await
        .unwrap();
    let archive = crate::harness::zip(&[(
        "handler.py",
        "def handle(e):\n    return 'from multipart'\n",
    )]);
    let form = reqwest::multipart::Form::new().part(
        "code",
        reqwest::multipart::Part::bytes(archive)
            .file_name("code.zip")
            .mime_str("application/zip")
            .unwrap(),
    );
    let resp = server
        .client
        .http()
        .put(format!(
            "{}/v1/namespaces/default/functions/mp/code",
            server.url()
        ))
        .bearer_auth(TOKEN)
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let revision = resp.json::<serde_json::Value>().await.unwrap()["revision"]
        .as_u64()
        .unwrap();
    server.wait_settled("default", "mp", revision).await;
    assert_eq!(
        server.get("mp", "").await,
        (200, "from multipart".to_string())
    );

    let f = server
        .client
        .patch_function("default", "mp", &json!({"paused": true}))
        .await
        .unwrap();
    server
        .wait_settled("default", "mp", f.status.revision)
        .await;
    assert_eq!(server.get("mp", "").await.0, 503);
    let f = server
        .client
        .patch_function("default", "mp", &json!({"paused": false}))
        .await
        .unwrap();
    server
        .wait_settled("default", "mp", f.status.revision)
        .await;
    assert_eq!(
        server.get("mp", "").await,
        (200, "from multipart".to_string())
    );
}
