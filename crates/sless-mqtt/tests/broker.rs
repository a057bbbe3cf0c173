//! The managed broker against Debian's real mosquitto: accounts from sless's store
//! at start, the ACL on publish and subscribe, changes while it runs, presence, and
//! restarts by the supervisor.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, Packet, QoS, SubscribeReasonCode,
};
use sless_mqtt::{Accounts, Broker, BrokerConfig, DeviceAccount, PasswordHash, dynsec};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

/// The store's accounts, as a test sets them.
#[derive(Default)]
struct Store(Mutex<Vec<DeviceAccount>>);

#[async_trait]
impl Accounts for Store {
    async fn accounts(&self) -> Result<Vec<DeviceAccount>, String> {
        Ok(self.0.lock().unwrap().clone())
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn account(ns: &str, name: &str, password: &str) -> DeviceAccount {
    DeviceAccount {
        namespace: ns.into(),
        name: name.into(),
        password: PasswordHash::new(password),
        enabled: true,
    }
}

async fn start(store: Arc<Store>) -> (Arc<Broker>, tempfile::TempDir, CancellationToken) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("sless_mqtt=trace")
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();
    let broker = Broker::start(
        BrokerConfig {
            listen: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
            ws_listen: None,
            dir: dir.path().join("mqtt"),
            mosquitto: sless_mqtt::default_mosquitto(),
            max_packet_bytes: 1 << 20,
        },
        store,
        shutdown.clone(),
    )
    .await
    .expect("the broker starts");
    (broker, dir, shutdown)
}

/// A device's MQTT 3.1.1 session (what most devices speak); `Err` with the refusal
/// when the broker refuses it.
async fn connect(
    broker: &Broker,
    username: &str,
    password: &str,
) -> Result<(AsyncClient, EventLoop), String> {
    let port = broker.config().listen.port();
    let mut o = MqttOptions::new(format!("c-{username}-{}", rand_id()), "127.0.0.1", port);
    o.set_credentials(username, password);
    let (client, mut el) = AsyncClient::new(o, 16);
    match tokio::time::timeout(WAIT, el.poll())
        .await
        .expect("an answer")
    {
        Ok(Event::Incoming(Packet::ConnAck(_))) => Ok((client, el)),
        Ok(other) => Err(format!("{other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

/// sless's ingest account, reading every device's telemetry.
async fn observer(broker: &Broker) -> (AsyncClient, EventLoop) {
    let url = broker.ingest_url();
    let password = url
        .split_once("sless-ingest:")
        .and_then(|(_, rest)| rest.split_once('@'))
        .map(|(p, _)| p.to_string())
        .expect("credentials in the ingest URL");
    let (c, mut el) = connect(broker, "sless-ingest", &password)
        .await
        .expect("ingest admitted");
    assert!(subscribe(&c, &mut el, "+/telemetry/+").await);
    (c, el)
}

async fn wait_online(broker: &Broker, username: &str, online: bool) {
    tokio::time::timeout(WAIT, async {
        while broker.is_online(username) != online {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{username} online = {online} in time"));
}

fn rand_id() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

/// Polls until `f` picks something out of an event, or the connection ends (`Err`).
async fn until<T>(
    el: &mut EventLoop,
    mut f: impl FnMut(&Packet) -> Option<T>,
) -> Result<T, ConnectionError> {
    tokio::time::timeout(WAIT, async {
        loop {
            if let Event::Incoming(p) = el.poll().await?
                && let Some(t) = f(&p)
            {
                return Ok(t);
            }
        }
    })
    .await
    .expect("in time")
}

/// Publishes at QoS 1 and waits for the PUBACK (3.1.1 acknowledges a denied publish
/// too: the broker drops it).
async fn publish(client: &AsyncClient, el: &mut EventLoop, topic: &str, payload: &str) {
    client
        .publish(topic, QoS::AtLeastOnce, false, payload.to_string())
        .await
        .unwrap();
    until(el, |p| matches!(p, Packet::PubAck(_)).then_some(()))
        .await
        .expect("a PUBACK");
}

/// Whether the broker granted the subscription.
async fn subscribe(client: &AsyncClient, el: &mut EventLoop, filter: &str) -> bool {
    client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    until(el, |p| match p {
        Packet::SubAck(a) => Some(!matches!(a.return_codes[0], SubscribeReasonCode::Failure)),
        _ => None,
    })
    .await
    .expect("a SUBACK")
}

#[tokio::test(flavor = "multi_thread")]
async fn devices_reach_only_their_own_topics() {
    let store = Arc::new(Store::default());
    store
        .0
        .lock()
        .unwrap()
        .push(account("team-a", "t1", "pw-t1"));
    store
        .0
        .lock()
        .unwrap()
        .push(account("team-b", "t1", "pw-b"));
    let (broker, _dir, shutdown) = start(store).await;

    assert!(
        connect(&broker, "team-a_t1", "wrong").await.is_err(),
        "a wrong password is refused"
    );
    assert!(
        connect(&broker, "nobody", "x").await.is_err(),
        "an unknown user is refused"
    );
    let (obs, mut obs_el) = observer(&broker).await;
    let (c, mut el) = connect(&broker, "team-a_t1", "pw-t1")
        .await
        .expect("its own password");
    // Presence comes from the broker's log, a moment after the CONNACK.
    wait_online(&broker, "team-a_t1", true).await;
    assert!(!broker.is_online("team-b_t1"));

    // Denied publishes, from mosquitto's own client: the broker answers a denied
    // QoS 1 publish with a PUBACK carrying a reason code even on MQTT 3.1.1, which
    // rumqttc takes for a broken connection.
    let port = broker.config().listen.port().to_string();
    for topic in [
        "team-a/telemetry/t2",
        "team-b/telemetry/t1",
        "team-a/commands/t1",
        "x",
    ] {
        let out = tokio::process::Command::new("mosquitto_pub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-u",
                "team-a_t1",
                "-P",
                "pw-t1",
            ])
            .args(["-q", "1", "-t", topic, "-m", "denied"])
            .output()
            .await
            .expect("mosquitto_pub (Debian's mosquitto-clients) runs");
        assert!(out.status.success(), "{out:?}");
    }
    publish(&c, &mut el, "team-a/telemetry/t1", "allowed").await;
    // The only message that reached a reader of every telemetry topic is the allowed one.
    let got = until(&mut obs_el, |p| match p {
        Packet::Publish(p) => Some((p.topic.clone(), p.payload.clone())),
        _ => None,
    })
    .await
    .expect("a message");
    assert_eq!(got.0, "team-a/telemetry/t1");
    assert_eq!(&got.1[..], b"allowed");
    assert!(subscribe(&c, &mut el, "team-a/commands/t1").await);
    for filter in [
        "#",
        "team-a/commands/+",
        "team-b/commands/t1",
        "team-a/telemetry/t1",
        "+/telemetry/+",
    ] {
        assert!(!subscribe(&c, &mut el, filter).await, "{filter}");
    }
    drop(c);
    drop(el);
    wait_online(&broker, "team-a_t1", false).await;
    obs.disconnect().await.ok();
    shutdown.cancel();
    broker.stopped().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn changes_while_running_take_effect_at_once() {
    let store = Arc::new(Store::default());
    let (broker, _dir, shutdown) = start(store.clone()).await;

    // A device created while the broker runs.
    store.0.lock().unwrap().push(account("ns", "d", "first"));
    broker
        .apply(dynsec::upsert_device("ns", "d", "first", true))
        .await;
    let (_c, mut el) = connect(&broker, "ns_d", "first").await.expect("created");
    // Applying the same again changes nothing.
    broker
        .apply(dynsec::upsert_device("ns", "d", "first", true))
        .await;

    // A new password: the connected session is closed, the old password refused.
    broker
        .apply(vec![dynsec::set_password("ns_d", "second")])
        .await;
    assert!(
        until(&mut el, |_| None::<()>).await.is_err(),
        "disconnected by the broker"
    );
    assert!(connect(&broker, "ns_d", "first").await.is_err());
    let (_c, mut el) = connect(&broker, "ns_d", "second")
        .await
        .expect("the new password");

    // Disabled: disconnected and refused; enabled again: admitted.
    broker.apply(vec![dynsec::set_enabled("ns_d", false)]).await;
    assert!(
        until(&mut el, |_| None::<()>).await.is_err(),
        "disconnected by the broker"
    );
    assert!(connect(&broker, "ns_d", "second").await.is_err());
    broker.apply(vec![dynsec::set_enabled("ns_d", true)]).await;
    let (_c, mut el) = connect(&broker, "ns_d", "second")
        .await
        .expect("enabled again");

    // Deleted: disconnected and refused.
    broker.apply(dynsec::delete_device("ns_d")).await;
    assert!(
        until(&mut el, |_| None::<()>).await.is_err(),
        "disconnected by the broker"
    );
    assert!(connect(&broker, "ns_d", "second").await.is_err());
    shutdown.cancel();
    broker.stopped().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_that_dies_is_started_again_with_the_stores_accounts() {
    let store = Arc::new(Store::default());
    let (broker, _dir, shutdown) = start(store.clone()).await;
    let mut starts = broker.starts();
    let first = *starts.borrow_and_update();
    // Changed in the store while nothing applies it: the next start writes it.
    store.0.lock().unwrap().push(account("ns", "late", "pw"));
    broker.restart();
    tokio::time::timeout(WAIT, starts.wait_for(|n| *n > first))
        .await
        .expect("started again in time")
        .expect("supervisor running");
    connect(&broker, "ns_late", "pw")
        .await
        .expect("the store's account after a restart");
    shutdown.cancel();
    broker.stopped().await;
}
