//! The web console in a real browser: tests/console/console.test.mjs drives Debian's
//! Chromium (playwright-core, installed by `.ci/run` with `npm ci --prefix tests/console`)
//! against this real server. Screenshots land in `$CARGO_TARGET_TMPDIR/console`.

use std::process::Stdio;
use std::time::Duration;

use crate::harness::{Server, TOKEN, repo_path, zip};

const HELLO: &str = "def handle(event):
    print('console-log-line', flush=True)
    body = event.get('body', event) if isinstance(event, dict) else None
    name = body.get('name', 'world') if isinstance(body, dict) else 'world'
    return {'message': f'hello, {name}'}
";

const PICKY: &str = "import os

def handle(event):
    if os.environ.get('FAIL') == '1':
        return {'statusCode': 400, 'body': 'refused'}
    return 'accepted'
";

#[tokio::test]
async fn the_console_works_in_a_real_browser() {
    let dir = repo_path("tests/console");
    assert!(
        dir.join("node_modules/playwright-core").exists(),
        "playwright-core is not installed: run npm ci --prefix tests/console"
    );
    let server = Server::start_with(&[
        "--mqtt-listen",
        "127.0.0.1:0",
        "--mqtt-ws-listen",
        "127.0.0.1:0",
    ])
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let zip_path = tmp.path().join("hello.zip");
    std::fs::write(&zip_path, zip(&[("handler.py", HELLO)])).expect("zip");
    let picky_path = tmp.path().join("picky.zip");
    std::fs::write(&picky_path, zip(&[("handler.py", PICKY)])).expect("zip");
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&shots).expect("shots dir");
    let run = tokio::process::Command::new("node")
        .arg(dir.join("console.test.mjs"))
        .env("SLESS_URL", server.url())
        .env("SLESS_TOKEN", TOKEN)
        .env("HELLO_ZIP", &zip_path)
        .env("PICKY_ZIP", &picky_path)
        .env("SHOT_DIR", &shots)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the browser test finishes within 300 s")
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "the browser test failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("ok: function list of 200"), "{stdout}");
}
