//! Runtime names: a family (`python3`, `nodejs`, `go`, `custom`) plus an optional
//! version alias that runs on whatever interpreter the host has.

use serde::{Deserialize, Serialize};

use crate::ValidationError;

/// Where a Go build puts the compiled function, relative to its code directory
/// (`/code` in the sandbox): the builder writes it, instances run it.
pub const GO_BINARY: &str = ".sless-handler";

/// The language family a runtime name belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuntimeFamily {
    Python3,
    Nodejs,
    Go,
    Custom,
}

impl RuntimeFamily {
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeFamily::Python3 => "python3",
            RuntimeFamily::Nodejs => "nodejs",
            RuntimeFamily::Go => "go",
            RuntimeFamily::Custom => "custom",
        }
    }

    /// The file that holds the entrypoint module `module` for this family.
    pub fn module_file(self, module: &str) -> String {
        match self {
            RuntimeFamily::Python3 => format!("{}.py", module.replace('.', "/")),
            RuntimeFamily::Nodejs => format!("{module}.js"),
            RuntimeFamily::Go => "go.mod".to_string(),
            RuntimeFamily::Custom => module.to_string(),
        }
    }

    /// The default entrypoint when a spec names none.
    pub fn default_entrypoint(self) -> &'static str {
        match self {
            RuntimeFamily::Go => "Handle",
            RuntimeFamily::Custom => "bootstrap",
            _ => "handler.handle",
        }
    }
}

/// A parsed runtime name such as `python3.11` or `nodejs20`.
///
/// On the wire it is the name as the user wrote it (a JSON string); decoding checks it
/// with [`Runtime::parse`], so a spec holding a `Runtime` always names a known family.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Runtime {
    pub family: RuntimeFamily,
    /// The name as the user wrote it, kept so it round-trips through the API.
    pub name: String,
}

impl Runtime {
    /// Parses a runtime name: a family followed by an optional version alias made
    /// of digits and dots (`python3`, `python3.11`, `nodejs`, `nodejs20`, `go1.23`).
    pub fn parse(name: &str) -> Result<Runtime, ValidationError> {
        let families = [
            ("python3", RuntimeFamily::Python3),
            ("python", RuntimeFamily::Python3),
            ("nodejs", RuntimeFamily::Nodejs),
            ("node", RuntimeFamily::Nodejs),
            ("go", RuntimeFamily::Go),
            ("custom", RuntimeFamily::Custom),
        ];
        for (prefix, family) in families {
            if let Some(rest) = name.strip_prefix(prefix) {
                let rest = rest.strip_prefix('.').unwrap_or(rest);
                let version_ok = rest.bytes().all(|b| b.is_ascii_digit() || b == b'.')
                    && !rest.ends_with('.')
                    && !rest.contains("..");
                // `python` alone is not a family name: Python 2 is not supported.
                let bare_python = prefix == "python" && rest.is_empty();
                let python2 = prefix == "python" && rest.starts_with('2');
                if version_ok && !bare_python && !python2 && (prefix != "custom" || rest.is_empty())
                {
                    return Ok(Runtime {
                        family,
                        name: name.to_string(),
                    });
                }
            }
        }
        Err(ValidationError::new(
            "runtime",
            format!(
                "unknown runtime {name:?}: use python3, nodejs, go or custom (a version alias such as python3.11 or nodejs20 is accepted)"
            ),
        ))
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl std::str::FromStr for Runtime {
    type Err = ValidationError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Runtime::parse(name)
    }
}

impl Serialize for Runtime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name)
    }
}

impl<'de> Deserialize<'de> for Runtime {
    /// The error is the message of [`Runtime::parse`]; serde's path (`runtime`) names the field.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Runtime::parse(&name).map_err(|e| serde::de::Error::custom(e.message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_aliases_map_to_families() {
        let cases = [
            ("python3", RuntimeFamily::Python3),
            ("python3.11", RuntimeFamily::Python3),
            ("python3.12", RuntimeFamily::Python3),
            ("nodejs", RuntimeFamily::Nodejs),
            ("nodejs20", RuntimeFamily::Nodejs),
            ("nodejs18", RuntimeFamily::Nodejs),
            ("go", RuntimeFamily::Go),
            ("go1.23", RuntimeFamily::Go),
            ("custom", RuntimeFamily::Custom),
        ];
        for (name, family) in cases {
            assert_eq!(Runtime::parse(name).unwrap().family, family, "{name}");
        }
    }

    #[test]
    fn unknown_runtimes_are_named_in_the_error() {
        for bad in [
            "ruby",
            "python",
            "python2.7",
            "nodejs20x",
            "go1..2",
            "custom1",
            "",
        ] {
            let err = Runtime::parse(bad).unwrap_err();
            assert_eq!(err.field, "runtime");
            assert!(err.message.contains(&format!("{bad:?}")), "{}", err.message);
        }
    }

    #[test]
    fn runtimes_travel_as_the_name_the_user_wrote() {
        let r: Runtime = serde_json::from_str("\"nodejs20\"").unwrap();
        assert_eq!(
            (r.family, r.to_string()),
            (RuntimeFamily::Nodejs, "nodejs20".into())
        );
        assert_eq!(serde_json::to_string(&r).unwrap(), "\"nodejs20\"");
        let err = serde_json::from_str::<Runtime>("\"cobol\"").unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&Runtime::parse("cobol").unwrap_err().message),
            "{err}"
        );
    }
}
