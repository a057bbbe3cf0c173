//! `GET .../jobs/{name}?wait=`: a reader waiting for a run to end is woken by the
//! change that ends it (here a PATCH to `run_id: 0` or a delete), not by a poll.

use std::time::Duration;

use axum::http::Method;
use serde_json::json;

use crate::harness::{App, Req};

const JOB: &str = "/v1/namespaces/default/jobs/nightly";

/// Far below the `?wait=` the readers ask for: a reader that missed the change
/// would answer only after its whole wait.
const PROMPTLY: Duration = Duration::from_secs(20);

/// A self-contained job with no code waits for it: its run stays `Pending`.
async fn app_with_a_waiting_job() -> App {
    let app = App::start().await;
    app.job("nightly", json!({"runtime": "python3", "run_id": 1}))
        .await;
    let job = app.expect(Req::get(JOB), 200).await;
    assert_eq!(job["status"]["phase"], "Pending", "{job}");
    app
}

#[tokio::test]
async fn a_waiting_read_answers_when_a_patch_ends_the_run() {
    let app = app_with_a_waiting_job().await;
    let waited = tokio::time::timeout(PROMPTLY, async {
        tokio::join!(
            app.expect(Req::get(&format!("{JOB}?wait=120")), 200),
            async {
                // Reads queued behind the waiting one, so it is likely parked by now
                // (if not, it reads the patched record at once: the answer is the same).
                app.expect(Req::get(JOB), 200).await;
                app.expect(Req::json(Method::PATCH, JOB, &json!({"run_id": 0})), 200)
                    .await
            }
        )
    })
    .await
    .expect("the waiting read answered when the run ended, not after its wait");
    let (read, patched) = waited;
    assert_eq!(read["status"]["phase"], "Skipped", "{read}");
    assert_eq!(read["spec"]["run_id"], 0, "{read}");
    assert_eq!(read["status"], patched["status"]);
}

#[tokio::test]
async fn a_waiting_read_of_a_deleted_job_answers_404() {
    let app = app_with_a_waiting_job().await;
    let (read, _) = tokio::time::timeout(PROMPTLY, async {
        tokio::join!(app.send(Req::get(&format!("{JOB}?wait=120"))), async {
            app.expect(Req::get(JOB), 200).await;
            app.expect(Req::delete(JOB), 204).await
        })
    })
    .await
    .expect("the waiting read answered when the job was deleted, not after its wait");
    let (status, body) = read;
    assert_eq!(status.as_u16(), 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found", "{body}");
}
