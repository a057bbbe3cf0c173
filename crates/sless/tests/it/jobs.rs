//! Jobs: one-shot runs of functions and of self-contained code.

use serde_json::{Value, json};

use crate::harness::{Server, TOKEN, processes_with, send, zip};

const WORKER: &str = "import time\n\ndef handle(event):\n    if event.get('fail'):\n        print('about to fail')\n        raise RuntimeError('job failed on purpose')\n    if event.get('sleep'):\n        time.sleep(event['sleep'])\n    return {'doubled': event.get('n', 0) * 2}\n";

async fn wait(server: &Server, name: &str) -> Value {
    let (status, job) = send(
        server,
        reqwest::Method::GET,
        &format!("/v1/namespaces/default/jobs/{name}?wait=60"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    job
}

#[tokio::test]
async fn function_jobs_succeed_fail_skip_and_rerun() {
    let server = Server::start().await;
    server
        .deploy(
            "worker",
            json!({"runtime": "python3"}),
            &[("handler.py", WORKER)],
        )
        .await;
    let jobs = "/v1/namespaces/default/jobs";

    let (status, _) = send(
        &server,
        reqwest::Method::POST,
        jobs,
        Some(json!({"name": "double", "function": "worker", "event": {"n": 21}})),
    )
    .await;
    assert_eq!(status, 201);
    let job = wait(&server, "double").await;
    assert_eq!(job["status"]["phase"], "Succeeded", "{job}");
    assert_eq!(job["status"]["result"], json!({"doubled": 42}));
    assert_eq!(job["status"]["attempts"], 1);
    assert!(job["status"]["finished_at"].is_string());

    // Raising run_id runs it again, with a new event.
    let (status, job) = send(
        &server,
        reqwest::Method::PATCH,
        &format!("{jobs}/double"),
        Some(json!({"run_id": 2, "event": {"n": 5}})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        (
            job["status"]["phase"].as_str(),
            job["status"]["run_id"].as_u64()
        ),
        (Some("Pending"), Some(2))
    );
    let job = wait(&server, "double").await;
    assert_eq!(
        (
            job["status"]["phase"].as_str(),
            job["status"]["result"].clone()
        ),
        (Some("Succeeded"), json!({"doubled": 10}))
    );

    // A handler exception fails the job with the message and the output; attempts are retried.
    send(&server, reqwest::Method::POST, jobs, Some(json!({"name": "broken", "function": "worker", "event": {"fail": true}, "max_attempts": 2}))).await;
    let job = wait(&server, "broken").await;
    assert_eq!(job["status"]["phase"], "Failed", "{job}");
    assert_eq!(job["status"]["attempts"], 2);
    let message = job["status"]["message"].as_str().unwrap();
    assert!(message.contains("job failed on purpose"), "{message}");
    assert!(
        message.contains("about to fail"),
        "the output tail is in the message: {message}"
    );

    // Past its timeout an attempt fails.
    send(
        &server,
        reqwest::Method::POST,
        jobs,
        Some(
            json!({"name": "slow", "function": "worker", "event": {"sleep": 5}, "timeout_sec": 1}),
        ),
    )
    .await;
    let job = wait(&server, "slow").await;
    assert_eq!(job["status"]["phase"], "Failed", "{job}");
    assert!(
        job["status"]["message"]
            .as_str()
            .unwrap()
            .contains("timed out"),
        "{job}"
    );

    // run_id 0 creates the job without running it.
    let (status, job) = send(
        &server,
        reqwest::Method::POST,
        jobs,
        Some(json!({"name": "later", "function": "worker", "run_id": 0})),
    )
    .await;
    assert_eq!(
        (status, job["status"]["phase"].as_str()),
        (201, Some("Skipped"))
    );

    // Job runs are invocations with source job.
    let list = server
        .client
        .request_json(
            reqwest::Method::GET,
            "/v1/namespaces/default/invocations?source=job",
            None,
        )
        .await
        .unwrap();
    assert!(!list["items"].as_array().unwrap().is_empty(), "{list}");

    // Bad input.
    let (status, _) = send(
        &server,
        reqwest::Method::POST,
        jobs,
        Some(json!({"name": "x", "function": "missing"})),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = send(
        &server,
        reqwest::Method::POST,
        jobs,
        Some(json!({"name": "double", "function": "worker"})),
    )
    .await;
    assert_eq!(status, 409);
}

#[tokio::test]
async fn self_contained_jobs_run_their_own_code_and_deleting_a_running_job_stops_it() {
    let server = Server::start().await;
    let jobs = "/v1/namespaces/default/jobs";
    let (status, job) = send(
        &server,
        reqwest::Method::POST,
        jobs,
        Some(
            json!({"name": "own", "runtime": "nodejs", "env": {"FACTOR": "3"}, "event": {"n": 7}}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{job}");
    assert_eq!(job["status"]["phase"], "Pending");
    let code = zip(&[(
        "handler.js",
        "exports.handle = async (e) => ({ tripled: e.n * Number(process.env.FACTOR) });",
    )]);
    let resp = server
        .client
        .http()
        .put(format!("{}{jobs}/own/code", server.url()))
        .bearer_auth(TOKEN)
        .header("content-type", "application/zip")
        .body(code)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let job = wait(&server, "own").await;
    assert_eq!(job["status"]["phase"], "Succeeded", "{job}");
    assert_eq!(job["status"]["result"], json!({"tripled": 21}));

    // A long job deleted while it runs is stopped: its instance goes away. The
    // handler names its process (`comm`), so the test follows that very instance
    // rather than a count that the warm pool's refills also move.
    let sleeper = zip(&[(
        "handler.py",
        &format!(
            "import time\n\ndef handle(e):\n    with open('/proc/self/comm', 'w') as f:\n        f.write('{LONG_JOB_MARK}')\n    time.sleep(60)\n    return 1\n"
        ),
    )]);
    send(
        &server,
        reqwest::Method::POST,
        jobs,
        Some(json!({"name": "long", "runtime": "python3"})),
    )
    .await;
    let resp = server
        .client
        .http()
        .put(format!("{}{jobs}/long/code", server.url()))
        .bearer_auth(TOKEN)
        .header("content-type", "application/zip")
        .body(sleeper)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    marked(&server, LONG_JOB_MARK, true).await;
    let (_, job) = send(&server, reqwest::Method::GET, &format!("{jobs}/long"), None).await;
    assert_eq!(job["status"]["phase"], "Running", "{job}");
    assert_eq!(job["status"]["attempts"], 1, "{job}");
    let (status, _) = send(
        &server,
        reqwest::Method::DELETE,
        &format!("{jobs}/long"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, _) = send(&server, reqwest::Method::GET, &format!("{jobs}/long"), None).await;
    assert_eq!(status, 404);
    // Fails naming what is left if the instance outlives its job.
    marked(&server, LONG_JOB_MARK, false).await;
}

/// The name the long job's handler gives its process (at most 15 bytes, as `comm` keeps).
const LONG_JOB_MARK: &str = "sless-long-job";

/// Waits until some of the server's sandboxed processes are named `mark` (`present`)
/// or none is (`!present`); fails after 30 s.
async fn marked(server: &Server, mark: &str, present: bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let found: Vec<u32> = processes_with(&server.data_dir)
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim_end() == mark)
            })
            .collect();
        if found.is_empty() != present {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after 30 s, processes named {mark}: {found:?} (want {})",
            if present { "some" } else { "none" }
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
