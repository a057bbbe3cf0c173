//! The control client: sless's own MQTT 5 connection to the broker, on which it sends
//! dynamic-security commands and reads their answers. One command list at a time
//! (the plugin answers each message with one response message, in order).

use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use serde_json::{Value, json};
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use crate::dynsec::{CONTROL_TOPIC, CONTROL_USER, RESPONSE_TOPIC, is_benign};

/// How long one command list may wait for its answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the control connection.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Not connected, or the connection ended before the answer came.
    #[error("the MQTT broker is not reachable: {0}")]
    Unavailable(String),
    /// The plugin refused a command.
    #[error("the MQTT broker refused {command}: {error}")]
    Refused { command: String, error: String },
}

/// A connected control client.
pub struct Control {
    client: AsyncClient,
    answers: Mutex<mpsc::UnboundedReceiver<Value>>,
    stop: CancellationToken,
}

impl Drop for Control {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Control {
    /// Connects as the control user and subscribes to the answers; fails if the
    /// broker does not let it within `timeout`.
    pub async fn connect(
        host: &str,
        port: u16,
        password: &str,
        timeout: Duration,
    ) -> Result<Control, ControlError> {
        let mut options =
            MqttOptions::new(format!("sless-control-{}", std::process::id()), host, port);
        options
            .set_clean_start(true)
            .set_credentials(CONTROL_USER, password)
            .set_keep_alive(Duration::from_secs(15));
        let (client, mut eventloop) = AsyncClient::new(options, 64);
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, mut ready_rx) = mpsc::channel::<Result<(), String>>(1);
        let stop = CancellationToken::new();
        let sub = client.clone();
        let stopping = stop.clone();
        tokio::spawn(async move {
            let mut subscribed = false;
            loop {
                let event = tokio::select! {
                    _ = stopping.cancelled() => break,
                    e = eventloop.poll() => e,
                };
                match event {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        if sub.try_subscribe(RESPONSE_TOPIC, QoS::AtLeastOnce).is_err() {
                            let _ = ready_tx.try_send(Err("subscribe not queued".into()));
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) if !subscribed => {
                        subscribed = true;
                        let _ = ready_tx.try_send(Ok(()));
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if let Ok(v) = serde_json::from_slice::<Value>(&p.payload) {
                            let _ = tx.send(v);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if !subscribed {
                            let _ = ready_tx.try_send(Err(e.to_string()));
                        }
                        // The supervisor makes a new control client after a restart;
                        // this one keeps retrying gently until it is dropped.
                        tokio::select! {
                            _ = stopping.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        }
                    }
                }
            }
        });
        match tokio::time::timeout(timeout, ready_rx.recv()).await {
            Ok(Some(Ok(()))) => Ok(Control {
                client,
                answers: Mutex::new(rx),
                stop,
            }),
            Ok(Some(Err(e))) => {
                stop.cancel();
                Err(ControlError::Unavailable(e))
            }
            _ => {
                stop.cancel();
                Err(ControlError::Unavailable(
                    "no answer from the broker in time".into(),
                ))
            }
        }
    }

    /// Sends `commands` as one message and waits for the answer. An error the list
    /// expects (creating what exists, deleting what is gone) is not one.
    pub async fn run(&self, commands: Vec<Value>) -> Result<(), ControlError> {
        let mut answers = self.answers.lock().await;
        // Answers to lists that timed out earlier are stale.
        while answers.try_recv().is_ok() {}
        let body = json!({"commands": commands}).to_string();
        self.client
            .publish(CONTROL_TOPIC, QoS::AtLeastOnce, false, body)
            .await
            .map_err(|e| ControlError::Unavailable(e.to_string()))?;
        let answer = tokio::time::timeout(ANSWER_TIMEOUT, answers.recv())
            .await
            .map_err(|_| ControlError::Unavailable("no answer from the broker in time".into()))?
            .ok_or_else(|| ControlError::Unavailable("the control connection ended".into()))?;
        for r in answer["responses"].as_array().into_iter().flatten() {
            if let Some(error) = r["error"].as_str()
                && !is_benign(error)
            {
                return Err(ControlError::Refused {
                    command: r["command"].as_str().unwrap_or("a command").to_string(),
                    error: error.to_string(),
                });
            }
        }
        Ok(())
    }
}
