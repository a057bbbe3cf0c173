//! Devices: things that connect to sless's MQTT broker with their own credentials and
//! publish telemetry. Their spec (labels, enabled), and the names the broker knows them
//! by — username `{ns}_{name}`, `{ns}/telemetry/{name}` to publish, `{ns}/commands/{name}`
//! to subscribe — derived here once. Plain data, no IO.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ValidationError;

/// The most labels a device may carry.
pub const MAX_LABELS: usize = 64;
/// The longest label key or value.
pub const MAX_LABEL_LEN: usize = 253;

/// What a device's owner sets: labels, and whether it may connect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A disabled device is refused by the broker (and disconnected) until enabled.
    #[serde(default = "enabled_default")]
    pub enabled: bool,
}

fn enabled_default() -> bool {
    true
}

impl Default for DeviceSpec {
    fn default() -> Self {
        Self {
            labels: BTreeMap::new(),
            enabled: true,
        }
    }
}

impl DeviceSpec {
    /// Checks the labels (errors name `labels.<key>`).
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.labels.len() > MAX_LABELS {
            return Err(ValidationError::new(
                "labels",
                format!("at most {MAX_LABELS} labels"),
            ));
        }
        for (k, v) in &self.labels {
            if k.is_empty() || k.chars().count() > MAX_LABEL_LEN || k.chars().any(char::is_control)
            {
                return Err(ValidationError::new(
                    format!("labels.{k}"),
                    format!(
                        "a label key is 1 to {MAX_LABEL_LEN} characters, without control characters"
                    ),
                ));
            }
            if v.chars().count() > MAX_LABEL_LEN || v.chars().any(char::is_control) {
                return Err(ValidationError::new(
                    format!("labels.{k}"),
                    format!(
                        "a label value is at most {MAX_LABEL_LEN} characters, without control characters"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The broker username of device `name` in `namespace`. Names are DNS labels (no
/// `_`), so the username names exactly one device.
pub fn username(namespace: &str, name: &str) -> String {
    format!("{namespace}_{name}")
}

/// The device a broker username names, if it names one.
pub fn parse_username(username: &str) -> Option<(&str, &str)> {
    let (ns, name) = username.split_once('_')?;
    (crate::validate_name("", ns).is_ok() && crate::validate_name("", name).is_ok())
        .then_some((ns, name))
}

/// The only topic the device may publish to.
pub fn telemetry_topic(namespace: &str, name: &str) -> String {
    format!("{namespace}/telemetry/{name}")
}

/// The only topic the device may subscribe to; commands to it are published there.
pub fn commands_topic(namespace: &str, name: &str) -> String {
    format!("{namespace}/commands/{name}")
}

/// The topic filter sless's ingest subscribes to: every device's telemetry.
pub const TELEMETRY_FILTER: &str = "+/telemetry/+";

/// The device a telemetry topic belongs to: `{ns}/telemetry/{name}`.
pub fn parse_telemetry_topic(topic: &str) -> Option<(&str, &str)> {
    let mut parts = topic.split('/');
    let (ns, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
    (parts.next().is_none()
        && kind == "telemetry"
        && crate::validate_name("", ns).is_ok()
        && crate::validate_name("", name).is_ok())
    .then_some((ns, name))
}

/// Whether `name` matches a device trigger's `devices`: `*`, a name, or a glob where
/// `*` stands for any run of characters and `?` for one.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests_support::decode;
    use serde_json::json;

    #[test]
    fn names_and_topics() {
        assert_eq!(username("team-a", "t77"), "team-a_t77");
        assert_eq!(parse_username("team-a_t77"), Some(("team-a", "t77")));
        assert_eq!(parse_username("sless-ingest"), None);
        assert_eq!(parse_username("a_b_c"), None);
        assert_eq!(telemetry_topic("ns", "d"), "ns/telemetry/d");
        assert_eq!(commands_topic("ns", "d"), "ns/commands/d");
        assert_eq!(parse_telemetry_topic("ns/telemetry/d"), Some(("ns", "d")));
        for t in [
            "ns/commands/d",
            "ns/telemetry/d/x",
            "ns/telemetry",
            "NS/telemetry/d",
        ] {
            assert_eq!(parse_telemetry_topic(t), None, "{t}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob_matches("*", "t77"));
        assert!(glob_matches("t*", "t77"));
        assert!(glob_matches("t?7", "t77"));
        assert!(glob_matches("sensor-*-a", "sensor-12-a"));
        assert!(!glob_matches("t?", "t77"));
        assert!(!glob_matches("x*", "t77"));
        assert!(glob_matches("t77", "t77"));
    }

    #[test]
    fn specs_default_and_refuse_bad_labels() {
        let s: DeviceSpec = decode(json!({})).unwrap();
        assert_eq!(s, DeviceSpec::default());
        assert!(s.enabled);
        let e = decode::<DeviceSpec>(json!({"colour": 1})).unwrap_err();
        assert!(e.contains("unknown field `colour`"), "{e}");
        let s: DeviceSpec = decode(json!({"labels": {"": "x"}})).unwrap();
        assert_eq!(s.validate().unwrap_err().field, "labels.");
        let s: DeviceSpec = decode(json!({"labels": {"room": "a\nb"}})).unwrap();
        assert_eq!(s.validate().unwrap_err().field, "labels.room");
    }
}
