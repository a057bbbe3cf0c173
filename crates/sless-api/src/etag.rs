//! Optimistic concurrency on the wire: every function, trigger and job answers with
//! `ETag: "<generation>"` (a strong tag), and writes of their spec or code take
//! `If-Match` (RFC 9110 §13.1.1), answered with `412` when the object changed since.

use std::future::Future;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::ApiError;

/// The `ETag` of an object at `generation`: `"7"`.
pub(crate) fn etag(generation: u64) -> HeaderValue {
    // Digits between quotes are always a valid header value; the fallback is unreachable.
    HeaderValue::try_from(format!("\"{generation}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("\"\""))
}

/// A single object's answer: `status`, its `ETag` and its body.
pub(crate) fn tagged(status: StatusCode, generation: u64, body: impl IntoResponse) -> Response {
    let mut response = (status, body).into_response();
    response
        .headers_mut()
        .insert(header::ETAG, etag(generation));
    response
}

/// A request's `If-Match`: absent or `*` is unconditional; otherwise the entity tags
/// it lists, of which one must be the object's current (strong) tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// No `If-Match`, or `If-Match: *`: the write applies to whatever is current.
    Any,
    /// The tags listed, as `(weak, opaque-tag without its quotes)`.
    Tags(Vec<(bool, String)>),
}

impl IfMatch {
    /// Parses every `If-Match` field of a request (RFC 9110: `"*" / #entity-tag`).
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a HeaderValue>) -> Result<Self, ApiError> {
        let mut present = false;
        let mut star = false;
        let mut tags = Vec::new();
        for value in values {
            present = true;
            parse_list(value.as_bytes(), &mut star, &mut tags).map_err(|why| {
                ApiError::bad(format!(
                    "If-Match: {why} (expected \"*\" or a list of entity tags such as \"7\")"
                ))
            })?;
        }
        match (present, star, tags.is_empty()) {
            (false, _, _) => Ok(IfMatch::Any),
            (true, true, true) => Ok(IfMatch::Any),
            (true, true, false) => Err(ApiError::bad(
                "If-Match: \"*\" cannot be combined with entity tags",
            )),
            (true, false, true) => Err(ApiError::bad(
                "If-Match: empty (expected \"*\" or a list of entity tags such as \"7\")",
            )),
            (true, false, false) => Ok(IfMatch::Tags(tags)),
        }
    }

    /// Whether `generation`'s tag is listed, compared strongly: a weak tag never
    /// matches, and `"07"` is not `"7"`.
    fn matches(tags: &[(bool, String)], generation: u64) -> bool {
        let current = generation.to_string();
        tags.iter()
            .any(|(weak, opaque)| !weak && *opaque == current)
    }

    /// The generation a write of the `kind` object `name` must find: `None` when
    /// unconditional (`current` is not even read), else the current one if `If-Match`
    /// lists its tag, else `412` with the current tag. The store then writes only if
    /// the object is still at that generation.
    pub(crate) async fn expect<F>(
        &self,
        kind: &str,
        name: &str,
        current: F,
    ) -> Result<Option<u64>, ApiError>
    where
        F: Future<Output = Result<u64, ApiError>>,
    {
        let IfMatch::Tags(tags) = self else {
            return Ok(None);
        };
        let current = current.await?;
        if Self::matches(tags, current) {
            Ok(Some(current))
        } else {
            Err(precondition_failed(kind, name, current))
        }
    }
}

/// The `412` of a write whose `If-Match` names another version than the current one.
pub(crate) fn precondition_failed(kind: &str, name: &str, current: u64) -> ApiError {
    ApiError::PreconditionFailed {
        message: format!(
            "{kind} {name:?} changed since the version If-Match names: current ETag \"{current}\""
        ),
        generation: current,
    }
}

/// Reads one field value's comma-separated list into `tags` (or `star`).
fn parse_list(
    mut s: &[u8],
    star: &mut bool,
    tags: &mut Vec<(bool, String)>,
) -> Result<(), &'static str> {
    loop {
        // Empty list elements and whitespace are allowed and ignored.
        while let [b' ' | b'\t' | b',', rest @ ..] = s {
            s = rest;
        }
        if s.is_empty() {
            return Ok(());
        }
        if let [b'*', rest @ ..] = s {
            *star = true;
            s = rest;
        } else {
            let weak = s.starts_with(b"W/");
            if weak {
                s = &s[2..];
            }
            let [b'"', rest @ ..] = s else {
                return Err("an entity tag must be quoted");
            };
            let end = rest
                .iter()
                .position(|&b| b == b'"')
                .ok_or("an entity tag is not closed")?;
            let opaque = &rest[..end];
            // etagc = %x21 / %x23-7E / obs-text
            if opaque.iter().any(|&b| b < 0x21 || b == 0x7f) {
                return Err("an entity tag holds a character it may not");
            }
            tags.push((weak, String::from_utf8_lossy(opaque).into_owned()));
            s = &rest[end + 1..];
        }
        while let [b' ' | b'\t', rest @ ..] = s {
            s = rest;
        }
        match s {
            [] => return Ok(()),
            [b',', ..] => {}
            _ => return Err("entity tags must be separated by commas"),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        IfMatch::parse(parts.headers.get_all(header::IF_MATCH))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(values: &[&str]) -> Result<IfMatch, String> {
        let values: Vec<HeaderValue> = values
            .iter()
            .map(|v| HeaderValue::from_bytes(v.as_bytes()).unwrap())
            .collect();
        IfMatch::parse(&values).map_err(|e| e.to_string())
    }

    fn tags(list: &[(bool, &str)]) -> IfMatch {
        IfMatch::Tags(list.iter().map(|(w, t)| (*w, t.to_string())).collect())
    }

    #[test]
    fn parses_star_lists_and_weak_tags() {
        assert_eq!(parse(&[]).unwrap(), IfMatch::Any);
        assert_eq!(parse(&["*"]).unwrap(), IfMatch::Any);
        assert_eq!(parse(&[" * "]).unwrap(), IfMatch::Any);
        assert_eq!(parse(&["\"7\""]).unwrap(), tags(&[(false, "7")]));
        assert_eq!(
            parse(&["\"7\", W/\"8\",,\"x\""]).unwrap(),
            tags(&[(false, "7"), (true, "8"), (false, "x")])
        );
        assert_eq!(
            parse(&["\"1\"", " \"2\" ,"]).unwrap(),
            tags(&[(false, "1"), (false, "2")])
        );
        assert_eq!(parse(&["\"\""]).unwrap(), tags(&[(false, "")]));
    }

    #[test]
    fn malformed_headers_name_if_match() {
        for bad in [
            "7",
            "\"7",
            "\"7\" \"8\"",
            "w/\"7\"",
            "\"7\"x",
            "*, \"7\"",
            "",
            " , ",
            "\"a b\"",
        ] {
            let e = parse(&[bad]).unwrap_err();
            assert!(e.starts_with("If-Match: "), "{bad:?}: {e}");
        }
    }

    #[tokio::test]
    async fn only_a_strong_tag_of_the_current_generation_matches() {
        let at = |g: u64| async move { Ok::<_, ApiError>(g) };
        assert_eq!(IfMatch::Any.expect("job", "j", at(3)).await.unwrap(), None);
        let list = tags(&[(false, "2"), (false, "3")]);
        assert_eq!(list.expect("job", "j", at(3)).await.unwrap(), Some(3));
        for stale in [
            tags(&[(false, "2")]),
            tags(&[(true, "3")]),
            tags(&[(false, "03")]),
        ] {
            let e = stale.expect("job", "j", at(3)).await.unwrap_err();
            assert!(
                matches!(e, ApiError::PreconditionFailed { generation: 3, .. }),
                "{e}"
            );
            assert_eq!(
                e.to_string(),
                "job \"j\" changed since the version If-Match names: current ETag \"3\""
            );
        }
    }
}
