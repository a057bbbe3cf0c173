//! The nats connector (not yet written: every call fails with NotConnected).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{ConnectionStatus, Connector, QueueError, Received, SourceConfig};

pub struct NatsConnector {
    config: SourceConfig,
}

impl NatsConnector {
    pub fn new(config: SourceConfig) -> Result<Self, QueueError> {
        Ok(Self { config })
    }
}

#[async_trait]
impl Connector for NatsConnector {
    async fn run(
        self: Arc<Self>,
        _deliver: mpsc::Sender<Received>,
        status: Arc<ConnectionStatus>,
        shutdown: CancellationToken,
    ) {
        status.failed(format!(
            "{} sources are not supported yet",
            self.config.kind.as_str()
        ));
        shutdown.cancelled().await;
    }

    async fn publish(
        &self,
        _topic: &str,
        _payload: Bytes,
        _headers: &[(String, String)],
    ) -> Result<(), QueueError> {
        Err(QueueError::NotConnected)
    }
}
