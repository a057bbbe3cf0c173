//! Mapping a handler's return value (or the platform's failure) to an HTTP response.
//! The mapping of a handler's answer is `sless_invoke::response`'s, shared with the
//! deliveries (queue triggers, async calls); this module makes it an axum response.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use sless_executor::InvokeError;
use sless_invoke::is_start_failure;
use sless_invoke::response::JSON;

/// The platform's own error shape, `{"error": {"code", "message"}}`
/// ([`sless_api_types::ErrorBody`]), as a response.
pub fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    plain(status, JSON, Bytes::from(error_body(code, message)))
}

/// The bytes of [`sless_api_types::ErrorBody`]: `{"error":{"code":…,"message":…}}`.
pub fn error_body(code: &str, message: &str) -> Vec<u8> {
    // A struct of two strings always serialises (no map keys, no floats, no IO).
    serde_json::to_vec(&sless_api_types::ErrorBody::new(code, message))
        .expect("an error body always serialises")
}

/// The status and error a failed invocation answers with.
/// Its message is the executor's whole text: only the function's owner (the
/// authenticated `/invoke`) gets this; `/fn/` and `/t/` answer with
/// [`public_invoke_error_response`].
pub fn invoke_error_response(e: &InvokeError) -> Response {
    let (status, code) = status_and_code(e);
    with_retry_after(e, error_response(status, code, &e.to_string()))
}

/// Adds `Retry-After` to the answer of a refusal that waiting resolves (a rate limit).
fn with_retry_after(e: &InvokeError, mut response: Response) -> Response {
    if let InvokeError::QuotaExceeded(refusal) = e
        && let Some(seconds) = refusal.retry_after
    {
        response
            .headers_mut()
            .insert(axum::http::header::RETRY_AFTER, seconds.into());
    }
    response
}

/// The pipeline's status and code of `e` (`sless_invoke::status_of`, the one table).
fn status_and_code(e: &InvokeError) -> (StatusCode, &'static str) {
    let (status, code) = sless_invoke::status_of(e);
    // Every status in the table is a valid one.
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        code,
    )
}

/// The answer a failed invocation gives a caller of `/fn/` or `/t/`, who may be
/// anyone: the status and code of [`invoke_error_response`], with a message that
/// carries none of the function's internals. The executor's text for a failed start
/// holds the instance's last output lines (a traceback: paths, source lines, values);
/// that stays in the function's log and status, where its owner reads it.
pub fn public_invoke_error_response(e: &InvokeError, ns: &str, name: &str) -> Response {
    let text = e.to_string();
    let message = if matches!(e, InvokeError::Unavailable(_)) && is_start_failure(&text) {
        start_failure_message(ns, name, &text)
    } else {
        first_line(&text)
    };
    let (status, code) = status_and_code(e);
    with_retry_after(e, error_response(status, code, &message))
}

/// Longest public summary of a failure, in characters.
const MAX_PUBLIC_REASON: usize = 200;

/// What a public caller learns of a start failure: that it happened, the exception's
/// type when the runtime named one (`ValueError`, never its message), and where the
/// owner finds the rest.
fn start_failure_message(ns: &str, name: &str, text: &str) -> String {
    let hint = if let Some(kind) = exception_type(text) {
        format!(" ({kind} while loading its code)")
    } else if text.contains("did not become ready within") {
        " (it did not become ready in time)".to_string()
    } else {
        String::new()
    };
    format!(
        "function {ns}/{name} could not start{hint}: its owner finds the reason in the \
         function's logs and status"
    )
}

/// The exception type in a runtime's load error (`… failed to import: ValueError: …`):
/// an identifier, possibly dotted, at most 80 characters.
fn exception_type(text: &str) -> Option<&str> {
    const MARK: &str = "failed to import: ";
    let at = text.rfind(MARK)? + MARK.len();
    let rest = &text[at..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(rest.len());
    let kind = &rest[..end];
    let terminated = matches!(rest[end..].chars().next(), None | Some(':' | '\n' | '\r'));
    (terminated
        && (1..=80).contains(&kind.len())
        && kind.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
    .then_some(kind)
}

/// The first line of a message, without a trailing colon, at most
/// [`MAX_PUBLIC_REASON`] characters.
fn first_line(text: &str) -> String {
    text.lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches(':')
        .chars()
        .take(MAX_PUBLIC_REASON)
        .collect()
}

fn plain(status: StatusCode, content_type: &'static str, body: Bytes) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// Maps the shim's answer to a response ([`sless_invoke::response::map_answer`]):
/// `ok == false` is the handler's exception (`500 {"error": ...}`); otherwise the
/// return value, per the handler conventions.
pub fn result_response(ok: bool, body: &Bytes) -> Response {
    sless_invoke::response::map_answer(ok, body).map(Body::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use serde_json::Value;
    use sless_invoke::response::{HTML, TEXT};

    /// The shared DTO writes exactly the bytes the error shape always had, escapes included.
    #[test]
    fn error_bodies_keep_their_bytes() {
        for message in [
            "plain",
            "quotes \" and \\ backslash",
            "line\nbreak\ttab \u{1} control",
            "non-ascii: ü € 🦀 and </script>",
            "",
        ] {
            let before =
                serde_json::json!({"error": {"code": "invalid", "message": message}}).to_string();
            assert_eq!(
                String::from_utf8(error_body("invalid", message)).expect("utf-8"),
                before
            );
        }
    }

    async fn map(ok: bool, body: &str) -> (u16, Option<String>, String, Response) {
        let r = result_response(ok, &Bytes::from(body.to_string()));
        let status = r.status().as_u16();
        let ct = r
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string());
        let (parts, b) = r.into_parts();
        let bytes = b.collect().await.unwrap().to_bytes();
        (
            status,
            ct,
            String::from_utf8(bytes.to_vec()).unwrap(),
            Response::from_parts(parts, Body::empty()),
        )
    }

    #[tokio::test]
    async fn values_map_to_json() {
        for v in [r#"{"a":1}"#, "[1,2]", "42", "true", "null"] {
            let (s, ct, b, _) = map(true, v).await;
            assert_eq!((s, ct.as_deref(), b.as_str()), (200, Some(JSON), v));
        }
    }

    #[tokio::test]
    async fn strings_are_text_or_html() {
        assert_eq!(map(true, r#""hello""#).await.1.as_deref(), Some(TEXT));
        let (s, ct, b, _) = map(true, r#""<h1>hi</h1>""#).await;
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (200, Some(HTML), "<h1>hi</h1>")
        );
    }

    #[tokio::test]
    async fn status_code_objects_are_exact_responses() {
        let (s, ct, b, r) =
            map(true, r#"{"statusCode": 201, "headers": {"X-A": "b", "Content-Type": "text/csv"}, "body": "a,b"}"#).await;
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (201, Some("text/csv"), "a,b")
        );
        assert_eq!(r.headers()["x-a"], "b");
        let (s, ct, b, _) = map(true, r#"{"statusCode": 404, "body": {"missing": true}}"#).await;
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (404, Some(JSON), r#"{"missing":true}"#)
        );
        let (s, _, b, _) = map(true, r#"{"statusCode": 204}"#).await;
        assert_eq!((s, b.as_str()), (204, ""));
        let (s, _, b, _) = map(
            true,
            r#"{"statusCode": 200, "body": "aGk=", "isBase64Encoded": true}"#,
        )
        .await;
        assert_eq!((s, b.as_str()), (200, "hi"));
        let (s, _, _, _) = map(true, r#"{"statusCode": 99}"#).await;
        assert_eq!(s, 502);
    }

    async fn public(e: InvokeError) -> (u16, Value) {
        let r = public_invoke_error_response(&e, "team", "f");
        let status = r.status().as_u16();
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn public_callers_get_no_traceback_path_or_value_of_a_failed_start() {
        let cold = "function f could not start: instance exited with status 3 while starting: \
                    Traceback (most recent call last):\n  File \"/code/main.py\", line 2, in <module>\n    \
                    raise ValueError(\"password=hunter2\")\nValueError: password=hunter2\n\
                    sless: entrypoint module \"main\" failed to import: ValueError: password=hunter2";
        let warm = "function f could not start: entrypoint module \"main\" failed to import: \
                    pkg.BadThing: /srv/owner/secret.txt missing";
        let slow = "function f could not start: instance did not become ready within 30 s: /code/x";
        for (text, hint) in [
            (cold, " (ValueError while loading its code)"),
            (warm, " (pkg.BadThing while loading its code)"),
            (slow, " (it did not become ready in time)"),
            ("function f could not start: ", ""),
        ] {
            let (status, body) = public(InvokeError::Unavailable(text.into())).await;
            assert_eq!(status, 503);
            assert_eq!(body["error"]["code"], "unavailable");
            assert_eq!(
                body["error"]["message"],
                format!(
                    "function team/f could not start{hint}: its owner finds the reason in the \
                     function's logs and status"
                )
            );
        }
        // The owner's authenticated invoke keeps the whole text.
        let r = invoke_error_response(&InvokeError::Unavailable(cold.into()));
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&bytes).contains("hunter2"));
    }

    #[tokio::test]
    async fn other_failures_keep_one_capped_line() {
        let (status, body) = public(InvokeError::Unavailable(
            "function f is at capacity and its queue is full (3 waiting)".into(),
        ))
        .await;
        assert_eq!(status, 503);
        assert_eq!(
            body["error"]["message"],
            "function f is at capacity and its queue is full (3 waiting)"
        );
        let (status, body) = public(InvokeError::InstanceFailed(format!(
            "malformed response: {}\nsecond line",
            "x".repeat(500)
        )))
        .await;
        assert_eq!(status, 502);
        assert_eq!(body["error"]["code"], "instance_failed");
        let message = body["error"]["message"].as_str().unwrap();
        assert_eq!(message.chars().count(), MAX_PUBLIC_REASON);
        assert!(!message.contains("second line"));
        let (status, body) = public(InvokeError::Timeout {
            name: "f".into(),
            seconds: 3,
        })
        .await;
        assert_eq!(status, 504);
        assert_eq!(body["error"]["message"], "function f timed out after 3 s");
    }

    #[tokio::test]
    async fn exceptions_are_500_with_the_message() {
        let (s, ct, b, _) = map(false, r#"{"error": "boom"}"#).await;
        assert_eq!(
            (s, ct.as_deref(), b.as_str()),
            (500, Some(JSON), r#"{"error": "boom"}"#)
        );
    }
}
