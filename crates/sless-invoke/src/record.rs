//! What an invocation record says about a failure: the handler's exception message
//! or the platform's reason, cut to [`MAX_ERROR_LEN`].

use serde_json::Value;
use sless_executor::{InvokeError, InvokeResponse};

/// Longest error message kept in a record, in bytes; the rest is cut off so a
/// handler raising huge exceptions cannot bloat the database.
pub const MAX_ERROR_LEN: usize = 1024;

/// The error of an outcome: the handler's exception message when it raised, the
/// platform's reason when no handler answered, `None` when it answered.
pub(crate) fn error_of(result: &Result<InvokeResponse, InvokeError>) -> Option<String> {
    match result {
        Ok(r) if r.ok => None,
        Ok(r) => Some(handler_error(&r.body)),
        Err(e) => Some(e.to_string()),
    }
}

/// The message of a handler's exception: the shims answer `{"error": "<message>"}`;
/// anything else is kept as it came.
pub fn handler_error(body: &[u8]) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(mut map)) => match map.remove("error") {
            Some(Value::String(s)) => s,
            Some(other) => other.to_string(),
            None => Value::Object(map).to_string(),
        },
        _ => String::from_utf8_lossy(body).into_owned(),
    }
}

/// `s` cut to [`MAX_ERROR_LEN`] bytes on a char boundary, marked with `…` when cut.
pub(crate) fn truncate(mut s: String) -> String {
    if s.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}
