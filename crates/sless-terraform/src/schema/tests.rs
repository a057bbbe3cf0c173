use tf_provider::AttributePath;
use tf_provider::value::ValueAny;

use super::*;
use crate::value::{Obj, block, string};

fn def() -> Def {
    Def {
        desc: "test",
        attrs: vec![
            Attr::computed("id", Ty::Str, "id"),
            Attr::required("name", Ty::Str, "name").force_new(),
            Attr::with_default("memory_mb", Ty::Num, Preset::Num(128), "memory"),
            Attr::optional("env", Ty::MapStr, "env"),
            Attr::optional("note", Ty::Str, "note"),
            Attr::with_default("event", Ty::Json, Preset::Str("{}"), "event"),
            Attr::with_default("ready_timeout_sec", Ty::Num, Preset::Num(300), "t").local(),
            Attr::computed("revision", Ty::Num, "rev").volatile(),
        ],
        blocks: vec![BlockDef {
            name: "delivery",
            desc: "d",
            force_new: false,
            omit_when_default: true,
            attrs: vec![Attr::with_default(
                "max_attempts",
                Ty::Num,
                Preset::Num(3),
                "m",
            )],
        }],
    }
}

fn obj(pairs: &[(&str, ValueAny)]) -> Obj {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn prior() -> Obj {
    obj(&[
        ("id", string("default/f")),
        ("name", string("f")),
        ("memory_mb", ValueAny::Number(128)),
        ("env", ValueAny::Null),
        ("note", ValueAny::Null),
        ("event", string(r#"{"a":1,"b":2}"#)),
        ("ready_timeout_sec", ValueAny::Number(300)),
        ("revision", ValueAny::Number(3)),
        ("delivery", ValueAny::List(vec![])),
    ])
}

#[test]
fn a_create_plans_defaults_and_leaves_computed_values_unknown() {
    let config = obj(&[("name", string("f"))]);
    let (planned, replace) = plan(&def(), None, &config);
    assert!(replace.is_empty());
    assert_eq!(planned["memory_mb"], ValueAny::Number(128));
    assert_eq!(planned["event"], string("{}"));
    assert_eq!(planned["id"], ValueAny::Unknown);
    assert_eq!(planned["env"], ValueAny::Null);
    assert_eq!(planned["delivery"], ValueAny::List(vec![]));
}

#[test]
fn a_matching_config_plans_exactly_the_prior_state() {
    // The event spelled another way, unset attributes: no difference at all.
    let config = obj(&[
        ("name", string("f")),
        ("event", string("{ \"b\": 2, \"a\": 1 }")),
    ]);
    let p = prior();
    let (mut planned, replace) = plan(&def(), Some(&p), &config);
    mark_volatile(&def(), Some(&p), &mut planned);
    assert!(replace.is_empty());
    assert_eq!(planned, p);
    assert!(!spec_changed(&def(), &p, &planned));
}

#[test]
fn a_removed_attribute_returns_to_its_default_and_unknowns_the_volatile_ones() {
    let mut p = prior();
    p.insert("memory_mb".into(), ValueAny::Number(512));
    let config = obj(&[("name", string("f"))]);
    let (mut planned, _) = plan(&def(), Some(&p), &config);
    mark_volatile(&def(), Some(&p), &mut planned);
    assert_eq!(planned["memory_mb"], ValueAny::Number(128));
    assert_eq!(planned["revision"], ValueAny::Unknown);
    assert_eq!(planned["id"], string("default/f"));
}

#[test]
fn a_renamed_object_is_replaced() {
    let config = obj(&[("name", string("g"))]);
    let (_, replace) = plan(&def(), Some(&prior()), &config);
    assert_eq!(replace, vec![AttributePath::new("name")]);
}

#[test]
fn only_a_local_setting_changed_is_no_spec_change() {
    let config = obj(&[
        ("name", string("f")),
        ("event", string(r#"{"a":1,"b":2}"#)),
        ("ready_timeout_sec", ValueAny::Number(10)),
    ]);
    let p = prior();
    let (mut planned, _) = plan(&def(), Some(&p), &config);
    mark_volatile(&def(), Some(&p), &mut planned);
    assert!(!spec_changed(&def(), &p, &planned));
    assert_eq!(planned["revision"], ValueAny::Number(3));
}

#[test]
fn what_the_api_answers_keeps_the_configurations_spelling() {
    let mut p = prior();
    p.insert("env".into(), ValueAny::Map(Obj::new()));
    // The API answers no env as {}, no note as "", the event reordered, the delivery
    // block with its defaults; the provider's own setting is not in the answer at all.
    let mut fresh = obj(&[
        ("id", string("default/f")),
        ("name", string("f")),
        ("memory_mb", ValueAny::Number(128)),
        ("env", ValueAny::Null),
        ("note", string("")),
        ("event", string(r#"{"b":2,"a":1}"#)),
        ("revision", ValueAny::Number(3)),
        (
            "delivery",
            block(obj(&[("max_attempts", ValueAny::Number(3))])),
        ),
    ]);
    normalize(&def(), Some(&p), &mut fresh);
    let mut want = prior();
    want.insert("env".into(), ValueAny::Map(Obj::new()));
    assert_eq!(fresh, want);
}

#[test]
fn a_delivery_block_that_differs_from_the_defaults_is_kept() {
    let mut fresh = prior();
    fresh.insert(
        "delivery".into(),
        block(obj(&[("max_attempts", ValueAny::Number(5))])),
    );
    normalize(&def(), None, &mut fresh);
    assert_eq!(
        fresh["delivery"],
        block(obj(&[("max_attempts", ValueAny::Number(5))]))
    );
}

#[test]
fn an_apply_keeps_every_planned_value_and_fills_only_the_unknown_ones() {
    let mut planned = prior();
    planned.insert("revision".into(), ValueAny::Unknown);
    let mut fresh = prior();
    fresh.insert("revision".into(), ValueAny::Number(4));
    fresh.insert("memory_mb".into(), ValueAny::Number(999));
    let state = finalize(&planned, &fresh);
    assert_eq!(state["revision"], ValueAny::Number(4));
    assert_eq!(state["memory_mb"], ValueAny::Number(128));
}

#[test]
fn the_schema_marks_constraints_and_sensitivity() {
    let mut d = def();
    d.attrs
        .push(Attr::required("token", Ty::Str, "t").sensitive());
    let schema = tf_schema(&d);
    let attrs = &schema.block.attributes;
    assert_eq!(attrs["id"].constraint, AttributeConstraint::Computed);
    assert_eq!(
        attrs["memory_mb"].constraint,
        AttributeConstraint::OptionalComputed
    );
    assert_eq!(attrs["env"].constraint, AttributeConstraint::Optional);
    assert!(attrs["token"].sensitive);
    assert!(schema.block.blocks.contains_key("delivery"));
}

#[test]
fn an_event_that_is_not_json_is_an_error_at_the_attribute() {
    let config = obj(&[("name", string("f")), ("event", string("{nope"))]);
    let errors = invalid_json(&def(), &config);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].0, AttributePath::new("event"));
    assert!(errors[0].1.contains("jsonencode"), "{}", errors[0].1);
    assert!(invalid_json(&def(), &prior()).is_empty());
}
