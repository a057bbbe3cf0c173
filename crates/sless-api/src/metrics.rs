//! `GET /metrics`: every Prometheus series of the process (`sless_metrics`), with
//! the gauges that are counts of something read just before rendering.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::{ApiError, AppState};

/// How `/metrics` is served.
#[derive(Clone, Debug, Default)]
pub struct MetricsEndpoint {
    /// `None`: metrics are off and `/metrics` answers `404`.
    pub exporter: Option<sless_metrics::Exporter>,
    /// When set, a scrape needs `Authorization: Bearer <token>`.
    pub token: Option<String>,
}

/// The media type of the Prometheus text exposition format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "meta",
    security(()),
    responses(
        (status = 200, description = "Every series in the Prometheus text format (see the README's \"Metrics\")", content_type = "text/plain", body = String),
        (status = 401, description = "`--metrics-token` is set and the request does not carry it as a bearer token", body = sless_api_types::ErrorBody),
        (status = 404, description = "Metrics are off (`--metrics=false`)", body = sless_api_types::ErrorBody)
    )
)]
pub(crate) async fn scrape(State(s): State<AppState>, headers: HeaderMap) -> Response {
    let Some(exporter) = &s.metrics.exporter else {
        return ApiError::NotFound("no such endpoint".into()).into_response();
    };
    if let Some(token) = &s.metrics.token {
        let given = sless_gateway::bearer_token(&headers).unwrap_or_default();
        // Compared as digests, so the time taken says nothing about the token.
        if Sha256::digest(given.as_bytes()) != Sha256::digest(token.as_bytes()) {
            return ApiError::Unauthorized(
                "/metrics needs the metrics token: Authorization: Bearer <token>".into(),
            )
            .into_response();
        }
    }
    let (ready, starting, warm) = s.executor.instance_totals();
    sless_metrics::set_instances(ready, starting, warm);
    sless_metrics::set_async_calls_queued(s.calls.queued_total());
    match s.dead_letters.count_dead_letters().await {
        Ok(n) => sless_metrics::set_dead_letters(n),
        // The last value stays; the scrape still answers.
        Err(e) => tracing::warn!(error = %e, "cannot count dead letters for /metrics"),
    }
    let mut response = (StatusCode::OK, exporter.render()).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT_FORMAT));
    response
}
