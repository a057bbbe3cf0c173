//! The `run(listener, shutdown)` seam: a server built in-process serves a socket
//! the caller bound, and stops when the caller's shutdown future completes.

use crate::harness::{ADMIN, App};

#[tokio::test]
async fn a_built_server_serves_the_callers_listener_until_shutdown() {
    let app = App::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(app.server.run(listener, async {
        let _ = stopped.await;
    }));

    let http = reqwest::Client::new();
    let health = http
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let whoami = http
        .get(format!("http://{addr}/v1/whoami"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(whoami.status(), 200);

    stop.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(30), running)
        .await
        .expect("run returns once shutdown completes")
        .unwrap()
        .expect("a clean stop");
    // The listener is closed with it.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
