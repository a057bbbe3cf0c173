//! The Kafka connector: a consumer group member reading one topic, committing per
//! partition only the offsets below which every message was acknowledged, so
//! acknowledgements may come in any order and a restart never skips an unfinished
//! message. Built with the cargo feature `kafka` (it compiles librdkafka); without
//! it a Kafka source is refused with a clear error.

#[cfg(feature = "kafka")]
mod client;
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
mod offsets;

#[cfg(feature = "kafka")]
pub use client::KafkaConnector;

#[cfg(not(feature = "kafka"))]
pub use disabled::KafkaConnector;

#[cfg(not(feature = "kafka"))]
mod disabled {
    //! The stand-in when the build has no Kafka support.

    use std::sync::Arc;

    use async_trait::async_trait;
    use bytes::Bytes;
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    use crate::{ConnectionStatus, Connector, QueueError, Received, SourceConfig};

    /// Never constructed: [`KafkaConnector::new`] refuses every source.
    pub struct KafkaConnector {
        _private: (),
    }

    impl KafkaConnector {
        pub fn new(_config: SourceConfig) -> Result<Self, QueueError> {
            Err(QueueError::Config(
                "this build of sless has no Kafka support (feature `kafka`)".into(),
            ))
        }
    }

    #[async_trait]
    impl Connector for KafkaConnector {
        async fn run(
            self: Arc<Self>,
            _deliver: mpsc::Sender<Received>,
            _status: Arc<ConnectionStatus>,
            shutdown: CancellationToken,
        ) {
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

    #[cfg(test)]
    mod tests {
        use sless_core::{QueueKind, StartFrom};

        use crate::{QueueError, SourceConfig, connector};

        #[test]
        fn a_build_without_kafka_refuses_kafka_sources_and_says_why() {
            let config = SourceConfig {
                kind: QueueKind::Kafka,
                url: "kafka://127.0.0.1:9092".into(),
                topic: "t".into(),
                group: "g".into(),
                start_from: StartFrom::Latest,
                prefetch: 1,
                label: "ns/t".into(),
            };
            match connector(config) {
                Err(QueueError::Config(m)) => assert_eq!(
                    m,
                    "this build of sless has no Kafka support (feature `kafka`)"
                ),
                Err(e) => panic!("unexpected error {e}"),
                Ok(_) => panic!("a Kafka connector without Kafka support"),
            }
        }
    }
}
