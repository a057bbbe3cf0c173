//! Autoscaling: scale-up to `max_instances` and not beyond, the bounded queue,
//! idle scale-down to `min_instances` and to zero, and no errors while scaling.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::Server;

/// Sleeps `?s=` seconds (0.5 by default), first logging `sleeping <s>` so a test
/// can see the request has reached the handler.
const SLEEPER: &str = "import time\n\ndef handle(event):\n    s = event['query'].get('s', '0.5')\n    print('sleeping', s, flush=True)\n    time.sleep(float(s))\n    return 'done'\n";

/// Polls the function's instance counts until `cond` holds (bounded).
async fn wait_counts(server: &Server, name: &str, what: &str, cond: impl Fn(u32, u32) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let f = server.client.get_function("default", name).await.unwrap();
        let c = f.status.instances;
        if cond(c.ready, c.starting) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: never reached {what}; last {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn scales_up_to_max_instances_and_not_beyond_then_back_down() {
    let server = Server::start().await;
    let spec = json!({"runtime": "python3", "concurrency": 1, "max_instances": 3, "min_instances": 1, "idle_timeout_sec": 1});
    server
        .deploy("scaler", spec, &[("handler.py", SLEEPER)])
        .await;

    let peak = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (client, peak, done) = (server.client.clone(), peak.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                let f = client.get_function("default", "scaler").await.unwrap();
                peak.fetch_max(
                    f.status.instances.ready + f.status.instances.starting,
                    Ordering::Relaxed,
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let calls = (0..12).map(|_| server.get("scaler", "?s=0.4"));
    let results = futures::future::join_all(calls).await;
    done.store(true, Ordering::Relaxed);
    watcher.await.unwrap();
    assert!(
        results.iter().all(|(s, b)| *s == 200 && b == "done"),
        "{results:?}"
    );
    let peak = peak.load(Ordering::Relaxed);
    assert_eq!(
        peak, 3,
        "12 concurrent requests at concurrency 1 use all 3 instances, never more"
    );

    // Idle instances above the minimum are stopped; the minimum stays.
    wait_counts(
        &server,
        "scaler",
        "ready == min_instances (1)",
        |ready, starting| ready == 1 && starting == 0,
    )
    .await;
    assert_eq!(server.get("scaler", "?s=0").await.0, 200);
}

#[tokio::test]
async fn idle_functions_scale_to_zero_and_come_back() {
    let server = Server::start().await;
    server
        .deploy(
            "napper",
            json!({"runtime": "nodejs", "idle_timeout_sec": 1}),
            &[("handler.js", "exports.handle = () => 'awake';")],
        )
        .await;
    assert_eq!(server.get("napper", "").await, (200, "awake".to_string()));
    wait_counts(&server, "napper", "zero instances", |ready, starting| {
        ready == 0 && starting == 0
    })
    .await;
    // The first request at zero instances waits for one and succeeds.
    assert_eq!(server.get("napper", "").await, (200, "awake".to_string()));
    let f = server
        .client
        .get_function("default", "napper")
        .await
        .unwrap();
    assert_eq!(f.status.instances.ready, 1);
}

#[tokio::test]
async fn a_full_queue_and_a_long_wait_answer_503() {
    let server = Server::start_with(&["--max-queue", "2", "--queue-timeout-sec", "2"]).await;
    server
        .deploy(
            "narrow",
            json!({"runtime": "python3", "concurrency": 1, "max_instances": 1}),
            &[("handler.py", SLEEPER)],
        )
        .await;
    // One request runs, two wait, the rest find the queue full.
    let calls = (0..6).map(|_| server.get("narrow", "?s=1.5"));
    let results = futures::future::join_all(calls).await;
    let ok = results.iter().filter(|(s, _)| *s == 200).count();
    let full: Vec<_> = results.iter().filter(|(s, _)| *s == 503).collect();
    assert!(ok >= 1, "{results:?}");
    assert!(!full.is_empty(), "{results:?}");
    assert!(
        full.iter().any(|(_, b)| b.contains("queue is full")),
        "{full:?}"
    );
    assert_eq!(
        ok + full.len(),
        6,
        "every request got an answer: {results:?}"
    );

    // A request that cannot get an instance within the queue timeout gets 503, not a hang.
    let busy = tokio::spawn({
        let url = format!("{}/fn/default/narrow?s=4", server.url());
        let http = server.client.http().clone();
        async move { http.get(url).send().await.unwrap().status().as_u16() }
    });
    // The only instance is busy once the handler has logged that request.
    server.wait_log("narrow", "sleeping 4").await;
    let started = Instant::now();
    let (status, body) = server.get("narrow", "?s=0").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("had room within"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(busy.await.unwrap(), 200);
}

#[tokio::test]
async fn no_request_fails_while_instances_scale_up_and_down() {
    let server = Server::start().await;
    let spec =
        json!({"runtime": "python3", "concurrency": 2, "max_instances": 4, "idle_timeout_sec": 1});
    server
        .deploy("elastic", spec, &[("handler.py", SLEEPER)])
        .await;
    let failures = Arc::new(AtomicU32::new(0));
    let total = Arc::new(AtomicU32::new(0));
    // Waves of load with pauses between them, so instances are added and removed
    // while requests keep arriving; bounded in count and time, loopback only.
    for wave in 0..3 {
        let clients = (0..6).map(|_| {
            let (url, http) = (
                format!("{}/fn/default/elastic?s=0.05", server.url()),
                server.client.http().clone(),
            );
            let (failures, total) = (failures.clone(), total.clone());
            async move {
                for _ in 0..10 {
                    let status = http
                        .get(&url)
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                        .unwrap_or(0);
                    total.fetch_add(1, Ordering::Relaxed);
                    if status != 200 {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        futures::future::join_all(clients).await;
        if wave < 2 {
            wait_counts(
                &server,
                "elastic",
                "scale-down to zero between waves",
                |ready, starting| ready + starting == 0,
            )
            .await;
        }
    }
    assert_eq!(total.load(Ordering::Relaxed), 180);
    assert_eq!(failures.load(Ordering::Relaxed), 0);
}
