//! Terraform values as the provider handles them: an object is a map from attribute name
//! to [`ValueAny`], and these helpers read, build and convert them.

use std::collections::BTreeMap;

use serde_json::Value as Json;
use tf_provider::value::ValueAny;

/// An object value: a resource's state, plan or config, or one block of it.
pub type Obj = BTreeMap<String, ValueAny>;

static NULL: ValueAny = ValueAny::Null;

/// `obj[name]`, or null when absent.
pub fn get<'a>(obj: &'a Obj, name: &str) -> &'a ValueAny {
    obj.get(name).unwrap_or(&NULL)
}

/// The string at `name`, when it is a known string.
pub fn str_of<'a>(obj: &'a Obj, name: &str) -> Option<&'a str> {
    match get(obj, name) {
        ValueAny::String(s) => Some(s),
        _ => None,
    }
}

/// The number at `name`, when it is a known number.
pub fn num_of(obj: &Obj, name: &str) -> Option<i64> {
    match get(obj, name) {
        ValueAny::Number(n) => Some(*n),
        _ => None,
    }
}

/// The bool at `name`, when it is a known bool.
pub fn bool_of(obj: &Obj, name: &str) -> Option<bool> {
    match get(obj, name) {
        ValueAny::Bool(b) => Some(*b),
        _ => None,
    }
}

/// The map of strings at `name` (empty when null).
pub fn map_of(obj: &Obj, name: &str) -> BTreeMap<String, String> {
    match get(obj, name) {
        ValueAny::Map(m) => m
            .iter()
            .filter_map(|(k, v)| match v {
                ValueAny::String(s) => Some((k.clone(), s.clone())),
                _ => None,
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// The list of strings at `name` (empty when null).
pub fn list_of(obj: &Obj, name: &str) -> Vec<String> {
    match get(obj, name) {
        ValueAny::List(items) => items
            .iter()
            .filter_map(|v| match v {
                ValueAny::String(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The first element of the block list at `name`, when the block is present.
pub fn block_of<'a>(obj: &'a Obj, name: &str) -> Option<&'a Obj> {
    match get(obj, name) {
        ValueAny::List(items) => items.first().and_then(|v| match v {
            ValueAny::Map(m) => Some(m),
            _ => None,
        }),
        _ => None,
    }
}

/// A one-element block list holding `obj`.
pub fn block(obj: Obj) -> ValueAny {
    ValueAny::List(vec![ValueAny::Map(obj)])
}

/// A string value.
pub fn string(s: impl Into<String>) -> ValueAny {
    ValueAny::String(s.into())
}

/// A string value, or null for `None`.
pub fn opt_string(s: Option<impl Into<String>>) -> ValueAny {
    s.map_or(ValueAny::Null, |s| ValueAny::String(s.into()))
}

/// A map of strings.
pub fn string_map(m: &BTreeMap<String, String>) -> ValueAny {
    ValueAny::Map(m.iter().map(|(k, v)| (k.clone(), string(v))).collect())
}

/// True when `v` holds no unknown value anywhere inside it.
pub fn is_known(v: &ValueAny) -> bool {
    match v {
        ValueAny::Unknown => false,
        ValueAny::List(items) => items.iter().all(is_known),
        ValueAny::Map(m) => m.values().all(is_known),
        _ => true,
    }
}

/// True when `v` is null, an empty string, an empty list or an empty map: what the API
/// stores as "not set".
pub fn is_empty(v: &ValueAny) -> bool {
    match v {
        ValueAny::Null => true,
        ValueAny::String(s) => s.is_empty(),
        ValueAny::List(items) => items.is_empty(),
        ValueAny::Map(m) => m.is_empty(),
        _ => false,
    }
}

/// A JSON value of the API as a Terraform value (fractional numbers are truncated: no
/// attribute of the provider takes one).
pub fn from_json(v: &Json) -> ValueAny {
    match v {
        Json::Null => ValueAny::Null,
        Json::Bool(b) => ValueAny::Bool(*b),
        Json::Number(n) => ValueAny::Number(
            n.as_i64()
                .or_else(|| n.as_f64().map(|f| f as i64))
                .unwrap_or_default(),
        ),
        Json::String(s) => ValueAny::String(s.clone()),
        Json::Array(items) => ValueAny::List(items.iter().map(from_json).collect()),
        Json::Object(m) => {
            ValueAny::Map(m.iter().map(|(k, v)| (k.clone(), from_json(v))).collect())
        }
    }
}

/// Two JSON documents that parse to the same value (key order and spacing aside).
pub fn json_text_eq(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<Json>(a),
        serde_json::from_str::<Json>(b),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_anywhere_makes_a_value_unknown() {
        let mut m = Obj::new();
        m.insert("a".into(), ValueAny::List(vec![ValueAny::Unknown]));
        assert!(!is_known(&ValueAny::Map(m)));
        assert!(is_known(&string("x")));
    }

    #[test]
    fn json_documents_compare_by_value() {
        assert!(json_text_eq(
            r#"{"a":1,"b":[2]}"#,
            "{ \"b\": [2], \"a\": 1 }"
        ));
        assert!(!json_text_eq(r#"{"a":1}"#, r#"{"a":2}"#));
    }
}
