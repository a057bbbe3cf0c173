//! `/readyz` follows the blob store: an S3 server that is down or hung makes the
//! server unavailable (within the probe's own timeout), and its return makes it
//! ready again. The S3 server is a moto of this test's own, as it is stopped.

use std::time::{Duration, Instant};

use serde_json::Value;
use sless_brokers::Moto;

use crate::harness::{App, Req};

async fn readyz(app: &App) -> (u16, Value) {
    let (status, body) = app.send(Req::get("/readyz").token(None)).await;
    (status.as_u16(), body)
}

/// Asks `/readyz` until it answers `status` (a backend that came back may take a
/// retry of the client's pooled connection to be seen).
async fn wait_ready(app: &App, status: u16) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (got, body) = readyz(app).await;
        if got == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never answered {status}: {got} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_blob_store_unavailable(status: u16, body: &Value, says: &str) {
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "unavailable", "{body}");
    let problems = body["problems"].as_array().expect("problems");
    assert_eq!(problems.len(), 1, "only the blob store: {body}");
    let problem = problems[0].as_str().expect("a string");
    assert!(problem.starts_with("blob store"), "{problem}");
    assert!(problem.contains(says), "{problem}");
}

#[tokio::test]
async fn readyz_follows_the_s3_blob_store() {
    let moto = Moto::start().expect("moto_server starts (see .ci/run)");
    moto.create_bucket("ready").expect("bucket");
    let endpoint = moto.endpoint();
    let app = App::start_with(&[
        "--blob-url",
        "s3://ready/code",
        "--s3-endpoint",
        &endpoint,
        "--s3-region",
        sless_brokers::moto::REGION,
        "--s3-access-key-id",
        sless_brokers::moto::ACCESS_KEY_ID,
        "--s3-secret-access-key",
        sless_brokers::moto::SECRET_ACCESS_KEY,
    ])
    .await;
    let (status, body) = readyz(&app).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ready");

    // Hung: the probe gives up on its own and says so.
    moto.pause().expect("pause");
    let (status, body) = readyz(&app).await;
    assert_blob_store_unavailable(status, &body, "no answer within 2 s");
    moto.resume().expect("resume");
    wait_ready(&app, 200).await;

    // Down.
    moto.stop();
    let (status, body) = readyz(&app).await;
    assert_blob_store_unavailable(status, &body, "s3://ready/code");
    // Back (moto starts empty: the bucket is made again).
    moto.start_again().expect("moto starts again");
    moto.create_bucket("ready").expect("bucket");
    let body = wait_ready(&app, 200).await;
    assert_eq!(body["status"], "ready");
}

#[tokio::test]
async fn a_bad_blob_url_or_an_unreachable_bucket_stops_the_start() {
    for (url, says) in [
        ("s3://", "no bucket name"),
        ("ftp://bucket/x", "expected s3://bucket/prefix"),
    ] {
        let err = crate::harness::start_error(&["--blob-url", url]).await;
        let message = format!("{err:#}");
        assert!(message.contains("--blob-url"), "{message}");
        assert!(message.contains(says), "{message}");
    }
    let moto = Moto::start().expect("moto_server starts (see .ci/run)");
    let endpoint = moto.endpoint();
    let err = crate::harness::start_error(&[
        "--blob-url",
        "s3://not-created/x",
        "--s3-endpoint",
        &endpoint,
        "--s3-access-key-id",
        "a",
        "--s3-secret-access-key",
        "b",
    ])
    .await;
    let message = format!("{err:#}");
    assert!(
        message.contains("cannot reach the code store --blob-url s3://not-created/x"),
        "{message}"
    );
}
