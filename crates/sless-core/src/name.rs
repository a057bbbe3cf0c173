//! Object names: DNS-1123 labels, as the API contract requires for namespaces,
//! functions, triggers and jobs.

use crate::ValidationError;

/// Checks `value` against `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, 1..63 characters.
pub fn validate_name(field: &str, value: &str) -> Result<(), ValidationError> {
    let bad = |why: &str| {
        Err(ValidationError::new(
            field,
            format!("{value:?} is not a valid name: {why}"),
        ))
    };
    if value.is_empty() {
        return bad("it is empty");
    }
    if value.len() > 63 {
        return bad("it is longer than 63 characters");
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return bad("only lowercase letters, digits and '-' are allowed");
    }
    if value.starts_with('-') || value.ends_with('-') {
        return bad("it must start and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_dns_labels() {
        for ok in ["a", "hello", "hello-world", "a1", "0", &"x".repeat(63)] {
            assert!(validate_name("name", ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            "-a",
            "a-",
            "Hello",
            "a_b",
            "a.b",
            "ä",
            &"x".repeat(64),
            "a b",
        ] {
            let err = validate_name("name", bad).unwrap_err();
            assert_eq!(err.field, "name");
        }
    }
}
