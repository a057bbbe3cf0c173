//! Instances over time: warm minimums, deletes, redeploys under load, restarts.

use std::time::Duration;

use serde_json::json;

use crate::harness::{Server, processes_with};

const HELLO: &str =
    "import os\n\ndef handle(event):\n    return os.environ.get('ANSWER', 'none')\n";

async fn wait_until<F: FnMut() -> bool>(what: &str, mut cond: F) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn min_instances_are_kept_warm_and_delete_frees_the_url() {
    let server = Server::start().await;
    let f = server
        .deploy(
            "warm",
            json!({"runtime": "python3", "min_instances": 1, "env": {"ANSWER": "warm"}}),
            &[("handler.py", HELLO)],
        )
        .await;
    assert_eq!(f.status.phase, "Ready", "{}", f.status.message);
    assert_eq!(f.status.instances.ready, 1);
    assert_eq!(server.get("warm", "").await, (200, "warm".to_string()));
    server
        .client
        .delete_function("default", "warm")
        .await
        .unwrap();
    assert_eq!(server.get("warm", "").await.0, 404);
}

/// Waits (bounded) until a load loop has published at least `n` answers.
async fn answers_reach(rx: &mut tokio::sync::watch::Receiver<usize>, n: usize) {
    tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|seen| *seen >= n))
        .await
        .unwrap_or_else(|_| panic!("the load loop never reached {n} answers"))
        .expect("load loop running");
}

#[tokio::test]
async fn redeploys_under_load_drop_nothing_and_never_serve_stale_code() {
    let server = Server::start().await;
    let spec = json!({"runtime": "python3", "min_instances": 1});
    server
        .deploy(
            "flip",
            spec.clone(),
            &[("handler.py", "def handle(e):\n    return 'v1'\n")],
        )
        .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The load loop publishes how many answers it has had, so the test can wait
    // for load to be flowing instead of guessing how long that takes.
    let (answered, mut answered_rx) = tokio::sync::watch::channel(0usize);
    let load = {
        let url = format!("{}/fn/default/flip", server.url());
        let http = server.client.http().clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && std::time::Instant::now() < deadline
            {
                let r = http.get(&url).send().await.expect("request");
                answers.push((r.status().as_u16(), r.text().await.unwrap_or_default()));
                answered.send_replace(answers.len());
            }
            answers
        })
    };
    answers_reach(&mut answered_rx, 5).await;
    let f = server
        .deploy(
            "flip",
            json!({}),
            &[("handler.py", "def handle(e):\n    return 'v2'\n")],
        )
        .await;
    assert_eq!(f.status.phase, "Ready");
    // From the moment the new revision is Ready, the old code is never served again.
    let after = server.get("flip", "").await;
    assert_eq!(after, (200, "v2".to_string()));
    // Keep the load going past the switch for a few more answers.
    let seen = *answered_rx.borrow();
    answers_reach(&mut answered_rx, seen + 5).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers = load.await.unwrap();
    assert!(
        answers.len() > 10,
        "load loop made only {} requests",
        answers.len()
    );
    assert!(
        answers.iter().all(|(s, _)| *s == 200),
        "failed requests during redeploy: {:?}",
        answers
            .iter()
            .filter(|(s, _)| *s != 200)
            .collect::<Vec<_>>()
    );
    let last = answers.last().unwrap();
    assert_eq!(last.1, "v2");
    // Once v2 was seen, v1 never came back.
    let first_v2 = answers
        .iter()
        .position(|(_, b)| b == "v2")
        .expect("v2 served");
    assert!(answers[first_v2..].iter().all(|(_, b)| b == "v2"));
}

#[tokio::test]
async fn sigterm_restart_keeps_functions_serving() {
    let mut server = Server::start().await;
    server
        .deploy(
            "keep-py",
            json!({"runtime": "python3", "env": {"ANSWER": "kept"}}),
            &[("handler.py", HELLO)],
        )
        .await;
    server
        .deploy(
            "keep-node",
            json!({"runtime": "nodejs"}),
            &[("handler.js", "exports.handle = () => 'node kept';")],
        )
        .await;
    assert_eq!(server.get("keep-py", "").await, (200, "kept".to_string()));

    // A request in flight when SIGTERM arrives still gets its answer.
    server
        .deploy(
            "inflight",
            json!({"runtime": "python3"}),
            &[(
                "handler.py",
                "import time\n\ndef handle(e):\n    print('handling', flush=True)\n    time.sleep(1)\n    return 'finished'\n",
            )],
        )
        .await;
    let url = format!("{}/fn/default/inflight", server.url());
    let http = server.client.http().clone();
    let pending =
        tokio::spawn(async move { http.get(url).send().await.map(|r| r.status().as_u16()) });
    // The handler has the request once its line is in the function's log.
    server.wait_log("inflight", "handling").await;
    let status = server.stop().await;
    assert!(status.success(), "server exit: {status}");
    assert_eq!(
        pending.await.unwrap().expect("in-flight request answered"),
        200
    );

    server.restart().await;
    for (name, want) in [("keep-py", "kept"), ("keep-node", "node kept")] {
        let f = server.client.get_function("default", name).await.unwrap();
        let f = server
            .wait_settled("default", name, f.status.revision)
            .await;
        assert_eq!(f.status.phase, "Ready");
        assert_eq!(server.get(name, "").await, (200, want.to_string()));
    }
}

#[tokio::test]
async fn no_instance_outlives_the_server() {
    let mut server = Server::start().await;
    let data = server.data_dir.clone();
    server
        .deploy(
            "linger",
            json!({"runtime": "python3", "min_instances": 2}),
            &[("handler.py", HELLO)],
        )
        .await;
    assert!(processes_with(&data).len() >= 2, "warm instances run");

    // A clean stop ends them.
    server.stop().await;
    wait_until("instances to stop after SIGTERM", || {
        processes_with(&data).is_empty()
    })
    .await;

    // So does a server that is killed outright.
    server.restart().await;
    let f = server
        .client
        .get_function("default", "linger")
        .await
        .unwrap();
    server
        .wait_settled("default", "linger", f.status.revision)
        .await;
    wait_until("instances to be back", || processes_with(&data).len() >= 2).await;
    server.kill9().await;
    wait_until("instances to die with a killed server", || {
        processes_with(&data).is_empty()
    })
    .await;
}
