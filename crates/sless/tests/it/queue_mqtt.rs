//! Queue triggers on MQTT (mosquitto): the scenarios of `queue_scenarios`.

use crate::queue_harness::Source;
use crate::queue_scenarios as s;

const KIND: Source = Source::Mqtt;

#[tokio::test]
async fn mqtt_payloads_duplicates_and_responses() {
    s::payloads_duplicates_and_responses(KIND).await;
}

#[tokio::test]
async fn mqtt_bursts_at_zero_instances_and_a_thousand() {
    s::bursts_at_zero_instances_and_a_thousand(KIND).await;
}

#[tokio::test]
async fn mqtt_server_restarts() {
    s::server_restarts(KIND).await;
}

#[tokio::test]
async fn mqtt_broker_down_then_up_then_restarted() {
    s::broker_down_then_up_then_restarted(KIND).await;
}

#[tokio::test]
async fn mqtt_refused_messages_become_dead_letters() {
    s::refused_messages_become_dead_letters(KIND).await;
}

#[tokio::test]
async fn mqtt_disable_and_enable() {
    s::disable_and_enable(KIND).await;
}

#[tokio::test]
async fn mqtt_raising_handlers_retry_then_dead_letter() {
    s::raising_handlers_retry_then_dead_letter(KIND).await;
}

#[tokio::test]
async fn mqtt_ordering_and_concurrency() {
    s::ordering_and_concurrency(KIND).await;
}

/// The same scenarios spoken in MQTT 5: headers (the dead letters' `x-sless-*`) travel
/// as user properties.
mod v5 {
    use crate::queue_harness::Source;
    use crate::queue_scenarios as s;

    const KIND: Source = Source::Mqtt5;

    #[tokio::test]
    async fn mqtt5_payloads_duplicates_and_responses() {
        s::payloads_duplicates_and_responses(KIND).await;
    }

    #[tokio::test]
    async fn mqtt5_bursts_at_zero_instances_and_a_thousand() {
        s::bursts_at_zero_instances_and_a_thousand(KIND).await;
    }

    #[tokio::test]
    async fn mqtt5_server_restarts() {
        s::server_restarts(KIND).await;
    }

    #[tokio::test]
    async fn mqtt5_broker_down_then_up_then_restarted() {
        s::broker_down_then_up_then_restarted(KIND).await;
    }

    #[tokio::test]
    async fn mqtt5_refused_messages_become_dead_letters() {
        s::refused_messages_become_dead_letters(KIND).await;
    }

    #[tokio::test]
    async fn mqtt5_disable_and_enable() {
        s::disable_and_enable(KIND).await;
    }

    #[tokio::test]
    async fn mqtt5_raising_handlers_retry_then_dead_letter() {
        s::raising_handlers_retry_then_dead_letter(KIND).await;
    }

    #[tokio::test]
    async fn mqtt5_ordering_and_concurrency() {
        s::ordering_and_concurrency(KIND).await;
    }
}
