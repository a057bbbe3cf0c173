//! Queue triggers on Kafka (librdkafka's mock cluster, which speaks the real protocol with
//! consumer groups and commits): the scenarios of `queue_scenarios` that do not stop the
//! broker, which the mock cannot survive.

use crate::queue_harness::Source;
use crate::queue_scenarios as s;

const KIND: Source = Source::Kafka;

#[tokio::test]
async fn kafka_payloads_duplicates_and_responses() {
    s::payloads_duplicates_and_responses(KIND).await;
}

#[tokio::test]
async fn kafka_bursts_at_zero_instances_and_a_thousand() {
    s::bursts_at_zero_instances_and_a_thousand(KIND).await;
}

#[tokio::test]
async fn kafka_server_restarts() {
    s::server_restarts(KIND).await;
}

#[tokio::test]
async fn kafka_refused_messages_become_dead_letters() {
    s::refused_messages_become_dead_letters(KIND).await;
}

#[tokio::test]
async fn kafka_disable_and_enable() {
    s::disable_and_enable(KIND).await;
}

#[tokio::test]
async fn kafka_raising_handlers_retry_then_dead_letter() {
    s::raising_handlers_retry_then_dead_letter(KIND).await;
}

#[tokio::test]
async fn kafka_ordering_and_concurrency() {
    s::ordering_and_concurrency(KIND).await;
}
