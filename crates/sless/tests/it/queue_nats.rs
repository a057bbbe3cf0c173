//! Queue triggers on NATS JetStream: the scenarios of `queue_scenarios`.

use crate::queue_harness::Source;
use crate::queue_scenarios as s;

const KIND: Source = Source::Nats;

#[tokio::test]
async fn nats_payloads_duplicates_and_responses() {
    s::payloads_duplicates_and_responses(KIND).await;
}

#[tokio::test]
async fn nats_bursts_at_zero_instances_and_a_thousand() {
    s::bursts_at_zero_instances_and_a_thousand(KIND).await;
}

#[tokio::test]
async fn nats_server_restarts() {
    s::server_restarts(KIND).await;
}

#[tokio::test]
async fn nats_broker_down_then_up_then_restarted() {
    s::broker_down_then_up_then_restarted(KIND).await;
}

#[tokio::test]
async fn nats_refused_messages_become_dead_letters() {
    s::refused_messages_become_dead_letters(KIND).await;
}

#[tokio::test]
async fn nats_disable_and_enable() {
    s::disable_and_enable(KIND).await;
}

#[tokio::test]
async fn nats_raising_handlers_retry_then_dead_letter() {
    s::raising_handlers_retry_then_dead_letter(KIND).await;
}

#[tokio::test]
async fn nats_ordering_and_concurrency() {
    s::ordering_and_concurrency(KIND).await;
}
