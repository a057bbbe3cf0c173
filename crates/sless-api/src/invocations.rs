//! Invocation records: `GET /v1/namespaces/{ns}/invocations`, newest first,
//! filtered by function, status, source and start time.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sless_api_types::{Items, timestamp};
use sless_store::{InvocationFilter, InvocationRecord, InvocationSource, MAX_INVOCATION_LIMIT};

use crate::{ApiError, AppState, Caller, body};

#[utoipa::path(
    get,
    path = "/v1/namespaces/{ns}/invocations",
    tag = "invocations",
    params(crate::openapi::NsPath, crate::openapi::InvocationParams),
    responses((status = 200, description = "Recorded invocations, newest first", body = sless_api_types::Items<sless_api_types::Invocation>), crate::openapi::ReadErrors)
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    Path(ns): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.check(&ns)?;
    let Query(params) = query.map_err(|e| ApiError::bad(format!("query: {e}")))?;
    let filter = parse_filter(&params)?;
    s.store.get_namespace(&ns).await?;
    let items = s
        .invocations
        .list(&ns, &filter)
        .await?
        .iter()
        .map(invocation_body)
        .collect();
    body(&Items::new(items))
}

/// The filter a query asks for. An empty value (`?function=`) filters nothing;
/// when a parameter repeats, the last one counts. A `limit` outside 1..=1000 is
/// refused, never lowered.
fn parse_filter(params: &[(String, String)]) -> Result<InvocationFilter, ApiError> {
    let mut filter = InvocationFilter::default();
    for (key, value) in params {
        if value.is_empty() {
            match key.as_str() {
                "function" => filter.function = None,
                "trigger" => filter.trigger = None,
                "call_id" => filter.call_id = None,
                "status" => filter.status = None,
                "source" => filter.source = None,
                "since" => filter.since = None,
                "limit" => filter.limit = None,
                other => return Err(unknown(other)),
            }
            continue;
        }
        match key.as_str() {
            "function" => {
                sless_core::validate_name("function", value)?;
                filter.function = Some(value.clone());
            }
            "trigger" => {
                sless_core::validate_name("trigger", value)?;
                filter.trigger = Some(value.clone());
            }
            "call_id" => {
                if value.chars().count() > 200 || value.chars().any(char::is_control) {
                    return Err(ApiError::bad(format!(
                        "call_id: must be a call id (at most 200 characters), got {value:?}"
                    )));
                }
                filter.call_id = Some(value.clone());
            }
            "status" => {
                let status = value
                    .parse::<u16>()
                    .ok()
                    .filter(|s| (100..=599).contains(s))
                    .ok_or_else(|| {
                        ApiError::bad(format!(
                            "status: must be an HTTP status code from 100 to 599, got {value:?}"
                        ))
                    })?;
                filter.status = Some(status);
            }
            "source" => {
                let source = InvocationSource::parse(value).ok_or_else(|| {
                    let all: Vec<&str> = InvocationSource::ALL.iter().map(|s| s.as_str()).collect();
                    ApiError::bad(format!(
                        "source: must be one of {}, got {value:?}",
                        all.join(", ")
                    ))
                })?;
                filter.source = Some(source);
            }
            "since" => {
                let since = DateTime::parse_from_rfc3339(value).map_err(|e| {
                    ApiError::bad(format!(
                        "since: must be an RFC 3339 time such as 2025-01-31T12:00:00Z, got {value:?} ({e})"
                    ))
                })?;
                filter.since = Some(since.with_timezone(&Utc));
            }
            "limit" => {
                let limit = crate::ranged_param(
                    "limit",
                    Some(value.as_str()),
                    1,
                    u64::from(MAX_INVOCATION_LIMIT),
                )?;
                filter.limit = limit.map(|n| n as u32);
            }
            other => return Err(unknown(other)),
        }
    }
    Ok(filter)
}

fn unknown(parameter: &str) -> ApiError {
    ApiError::bad(format!(
        "{parameter}: unknown query parameter (function, trigger, call_id, status, source, since and limit are known)"
    ))
}

/// The wire shape of one record. `duration_ms` keeps microseconds as decimals:
/// most handlers answer in well under a millisecond.
fn invocation_body(r: &InvocationRecord) -> sless_api_types::Invocation {
    sless_api_types::Invocation {
        id: r.id.clone(),
        function: r.function.clone(),
        revision: r.revision,
        source: r.source.into(),
        request_id: r.request_id.clone(),
        started_at: timestamp(r.started_at),
        duration_ms: r.duration.as_micros() as f64 / 1000.0,
        status: r.status,
        cold_start: r.cold_start,
        error: r.error.clone(),
        attempt: r.attempt,
        trigger: r.trigger.clone(),
        call_id: r.call_id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn parse(query: &[(&str, &str)]) -> Result<InvocationFilter, String> {
        let params: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse_filter(&params).map_err(|e| e.to_string())
    }

    #[test]
    fn filters_parse_and_empty_values_filter_nothing() {
        let f = parse(&[
            ("function", "hello"),
            ("status", "500"),
            ("source", "invoke"),
            ("since", "2025-01-31T13:00:00+01:00"),
            ("limit", "5"),
        ])
        .unwrap();
        assert_eq!(
            f,
            InvocationFilter {
                function: Some("hello".into()),
                status: Some(500),
                source: Some(InvocationSource::Invoke),
                since: Some("2025-01-31T12:00:00Z".parse().unwrap()),
                limit: Some(5),
                ..InvocationFilter::default()
            }
        );
        let empty = [
            ("function", ""),
            ("status", ""),
            ("source", ""),
            ("since", ""),
            ("limit", ""),
        ];
        assert_eq!(parse(&empty).unwrap(), InvocationFilter::default());
        assert_eq!(parse(&[("limit", "1000")]).unwrap().limit, Some(1000));
        assert!(
            parse(&[("limit", "1001")]).is_err(),
            "over the maximum is refused, not clamped"
        );
        assert_eq!(
            parse(&[("status", "200"), ("status", "404")])
                .unwrap()
                .status,
            Some(404)
        );
        assert_eq!(
            parse(&[("function", "a"), ("function", "")])
                .unwrap()
                .function,
            None,
            "the last value counts, even an empty one"
        );
    }

    #[test]
    fn bad_values_are_400_naming_the_parameter() {
        for (query, field) in [
            (("function", "Not_A_Name"), "function:"),
            (("status", "abc"), "status:"),
            (("status", "700"), "status:"),
            (("source", "email"), "source:"),
            (("since", "yesterday"), "since:"),
            (("limit", "0"), "limit:"),
            (("limit", "-3"), "limit:"),
            (("fucntion", "x"), "fucntion:"),
        ] {
            let err = parse(&[query]).unwrap_err();
            assert!(err.starts_with(field), "{query:?}: {err}");
        }
        let err = parse_filter(&[("status".into(), "x".into())]).unwrap_err();
        assert!(matches!(err, ApiError::BadRequest(_)));
    }

    #[test]
    fn records_have_the_contract_shape() {
        let r = InvocationRecord {
            id: "0001".into(),
            namespace: "team".into(),
            function: "hello".into(),
            revision: 2,
            source: InvocationSource::Http,
            request_id: "req".into(),
            started_at: "2025-01-31T12:00:00.123456Z".parse().unwrap(),
            duration: Duration::from_micros(1500),
            status: 500,
            cold_start: true,
            error: Some("boom".into()),
            attempt: None,
            trigger: None,
            call_id: None,
        };
        assert_eq!(
            sless_api_types::to_body(&invocation_body(&r)).unwrap(),
            json!({
                "id": "0001", "function": "hello", "revision": 2, "source": "http",
                "request_id": "req", "started_at": "2025-01-31T12:00:00.123Z",
                "duration_ms": 1.5, "status": 500, "cold_start": true, "error": "boom",
            })
        );
    }
}
