//! A resource's attributes described once, as a table, and the rules every resource
//! shares: the Terraform schema made from the table, the plan (config, defaults, prior
//! values, what forces a replacement, what becomes unknown), the normalisation of what the
//! API answers (so null and `""`, `{}` and an absent map, reordered JSON are no diff),
//! and the state after an apply (the plan, with only its unknowns filled in).

use std::collections::HashMap;

use tf_provider::AttributePath;
use tf_provider::schema::{
    Attribute, AttributeConstraint, AttributeType, Block, Description, NestedBlock, Schema,
};
use tf_provider::value::ValueAny;

use crate::value::{Obj, get, is_empty, is_known, json_text_eq};

/// The type of an attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Str,
    Num,
    Bool,
    MapStr,
    ListStr,
    /// A string holding a JSON document (`jsonencode(...)`), compared by value.
    Json,
}

/// Who sets an attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Required,
    /// Set by the configuration or not at all.
    Optional,
    /// Set by the configuration, or else the default (or what the server chose).
    OptionalComputed,
    /// Set by the provider only.
    Computed,
}

/// A default the plan uses for an unset optional attribute: the API's own default, so an
/// unset attribute is never a diff and removing one from the configuration resets it.
#[derive(Debug, Clone, Copy)]
pub enum Preset {
    Str(&'static str),
    Num(i64),
    Bool(bool),
    Strs(&'static [&'static str]),
}

impl Preset {
    fn value(self) -> ValueAny {
        match self {
            Preset::Str(s) => ValueAny::String(s.to_string()),
            Preset::Num(n) => ValueAny::Number(n),
            Preset::Bool(b) => ValueAny::Bool(b),
            Preset::Strs(items) => ValueAny::List(
                items
                    .iter()
                    .map(|s| ValueAny::String(s.to_string()))
                    .collect(),
            ),
        }
    }
}

/// One attribute of a resource or block.
#[derive(Debug, Clone)]
pub struct Attr {
    pub name: &'static str,
    pub ty: Ty,
    pub mode: Mode,
    pub default: Option<Preset>,
    /// A change replaces the object.
    pub force_new: bool,
    pub sensitive: bool,
    /// The provider's own setting (a timeout, a folder): never sent to or read from the
    /// API; kept from the prior state on read.
    pub local: bool,
    /// Computed and changed by every update (a revision, a run's result): unknown in a plan
    /// that changes anything else.
    pub volatile: bool,
    pub desc: &'static str,
}

impl Attr {
    fn new(name: &'static str, ty: Ty, mode: Mode, desc: &'static str) -> Attr {
        Attr {
            name,
            ty,
            mode,
            default: None,
            force_new: false,
            sensitive: false,
            local: false,
            volatile: false,
            desc,
        }
    }
    pub fn required(name: &'static str, ty: Ty, desc: &'static str) -> Attr {
        Attr::new(name, ty, Mode::Required, desc)
    }
    pub fn optional(name: &'static str, ty: Ty, desc: &'static str) -> Attr {
        Attr::new(name, ty, Mode::Optional, desc)
    }
    pub fn optional_computed(name: &'static str, ty: Ty, desc: &'static str) -> Attr {
        Attr::new(name, ty, Mode::OptionalComputed, desc)
    }
    pub fn computed(name: &'static str, ty: Ty, desc: &'static str) -> Attr {
        Attr::new(name, ty, Mode::Computed, desc)
    }
    /// Optional with the API's default `d`.
    pub fn with_default(name: &'static str, ty: Ty, d: Preset, desc: &'static str) -> Attr {
        Attr {
            default: Some(d),
            ..Attr::new(name, ty, Mode::OptionalComputed, desc)
        }
    }
    pub fn force_new(mut self) -> Attr {
        self.force_new = true;
        self
    }
    pub fn sensitive(mut self) -> Attr {
        self.sensitive = true;
        self
    }
    pub fn local(mut self) -> Attr {
        self.local = true;
        self
    }
    pub fn volatile(mut self) -> Attr {
        self.volatile = true;
        self
    }
}

/// A nested block that appears at most once (`cron { ... }`).
#[derive(Debug, Clone)]
pub struct BlockDef {
    pub name: &'static str,
    pub attrs: Vec<Attr>,
    /// Adding or removing the block replaces the object.
    pub force_new: bool,
    /// The API always answers this block; when every attribute has its default and the
    /// configuration had no block, the state has none either.
    pub omit_when_default: bool,
    pub desc: &'static str,
}

/// A resource's or data source's attributes and blocks.
#[derive(Debug, Clone)]
pub struct Def {
    pub desc: &'static str,
    pub attrs: Vec<Attr>,
    pub blocks: Vec<BlockDef>,
}

impl Def {
    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.attrs.iter().find(|a| a.name == name)
    }
}

fn attr_type(ty: Ty) -> AttributeType {
    match ty {
        Ty::Str | Ty::Json => AttributeType::String,
        Ty::Num => AttributeType::Number,
        Ty::Bool => AttributeType::Bool,
        Ty::MapStr => AttributeType::Map(Box::new(AttributeType::String)),
        Ty::ListStr => AttributeType::List(Box::new(AttributeType::String)),
    }
}

fn attributes(attrs: &[Attr]) -> HashMap<String, Attribute> {
    attrs
        .iter()
        .map(|a| {
            let mut desc = a.desc.to_string();
            if let Some(d) = a.default {
                let shown = match d {
                    Preset::Str(s) => format!("\"{s}\""),
                    Preset::Num(n) => n.to_string(),
                    Preset::Bool(b) => b.to_string(),
                    Preset::Strs(items) => format!("{items:?}"),
                };
                desc.push_str(&format!(" Default {shown}."));
            }
            if a.force_new {
                desc.push_str(" Changing it replaces the object.");
            }
            let attribute = Attribute {
                attr_type: attr_type(a.ty),
                description: Description::markdown(desc),
                constraint: match a.mode {
                    Mode::Required => AttributeConstraint::Required,
                    Mode::Optional => AttributeConstraint::Optional,
                    Mode::OptionalComputed => AttributeConstraint::OptionalComputed,
                    Mode::Computed => AttributeConstraint::Computed,
                },
                sensitive: a.sensitive,
                deprecated: false,
            };
            (a.name.to_string(), attribute)
        })
        .collect()
}

/// The Terraform schema of `def`; a data source's (`data_source`) makes every attribute
/// but `lookup` computed.
pub fn tf_schema(def: &Def) -> Schema {
    let blocks = def
        .blocks
        .iter()
        .map(|b| {
            let block = Block {
                version: 1,
                attributes: attributes(&b.attrs),
                blocks: HashMap::new(),
                description: Description::markdown(b.desc),
                deprecated: false,
            };
            (b.name.to_string(), NestedBlock::Optional(block))
        })
        .collect();
    Schema {
        version: 1,
        block: Block {
            version: 1,
            attributes: attributes(&def.attrs),
            blocks,
            description: Description::markdown(def.desc),
            deprecated: false,
        },
    }
}

/// The planned value of one attribute.
fn plan_value(a: &Attr, prior: Option<&Obj>, config: &Obj) -> ValueAny {
    let c = get(config, a.name);
    let p = prior.map(|p| get(p, a.name));
    let mut v = match a.mode {
        Mode::Required | Mode::Optional => c.clone(),
        Mode::OptionalComputed => {
            if !matches!(c, ValueAny::Null) {
                c.clone()
            } else if let Some(d) = a.default {
                d.value()
            } else {
                match p {
                    Some(p) if !matches!(p, ValueAny::Null) => p.clone(),
                    _ => ValueAny::Unknown,
                }
            }
        }
        Mode::Computed => p.cloned().unwrap_or(ValueAny::Unknown),
    };
    // The same JSON spelled differently is no change: keep the prior spelling.
    if a.ty == Ty::Json
        && a.mode != Mode::Required
        && a.mode != Mode::Optional
        && let (Some(ValueAny::String(ps)), ValueAny::String(vs)) = (p, &v)
        && json_text_eq(ps, vs)
    {
        v = ValueAny::String(ps.clone());
    }
    v
}

fn plan_attrs(
    attrs: &[Attr],
    prior: Option<&Obj>,
    config: &Obj,
    path: &AttributePath,
    out: &mut Obj,
    replace: &mut Vec<AttributePath>,
) {
    for a in attrs {
        let v = plan_value(a, prior, config);
        if a.force_new
            && let Some(prior) = prior
            && &v != get(prior, a.name)
        {
            replace.push(path.clone().attribute(a.name));
        }
        out.insert(a.name.to_string(), v);
    }
}

fn elements(v: &ValueAny) -> Vec<Option<&Obj>> {
    match v {
        ValueAny::List(items) => items
            .iter()
            .map(|i| match i {
                ValueAny::Map(m) => Some(m),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The plan for `config` over `prior` (`None` when creating), with the attribute paths
/// whose change replaces the object. Volatile attributes become unknown when anything
/// else changes.
pub fn plan(def: &Def, prior: Option<&Obj>, config: &Obj) -> (Obj, Vec<AttributePath>) {
    let mut out = Obj::new();
    let mut replace = Vec::new();
    plan_attrs(
        &def.attrs,
        prior,
        config,
        &AttributePath::root(),
        &mut out,
        &mut replace,
    );
    for b in &def.blocks {
        let config_elems = elements(get(config, b.name));
        let prior_elems = prior.map(|p| elements(get(p, b.name))).unwrap_or_default();
        let path = AttributePath::new(b.name);
        let mut planned = Vec::new();
        for (i, elem) in config_elems.iter().enumerate() {
            let Some(elem) = elem else {
                planned.push(ValueAny::Unknown);
                continue;
            };
            let prior_elem = prior_elems.get(i).copied().flatten();
            let mut o = Obj::new();
            plan_attrs(
                &b.attrs,
                prior_elem,
                elem,
                &path.clone().index(i as i64),
                &mut o,
                &mut replace,
            );
            planned.push(ValueAny::Map(o));
        }
        if b.force_new && prior.is_some() && planned.len() != prior_elems.len() {
            replace.push(path);
        }
        out.insert(b.name.to_string(), ValueAny::List(planned));
    }
    (out, replace)
}

/// Makes the volatile attributes of `planned` unknown when it differs from `prior` in
/// anything else. Call after the resource's own plan adjustments.
pub fn mark_volatile(def: &Def, prior: Option<&Obj>, planned: &mut Obj) {
    let changed = match prior {
        None => true,
        Some(prior) => {
            def.attrs
                .iter()
                .filter(|a| !a.volatile && !a.local)
                .any(|a| get(planned, a.name) != get(prior, a.name))
                || def
                    .blocks
                    .iter()
                    .any(|b| get(planned, b.name) != get(prior, b.name))
        }
    };
    if changed {
        for a in def.attrs.iter().filter(|a| a.volatile) {
            planned.insert(a.name.to_string(), ValueAny::Unknown);
        }
    }
}

/// True when `planned` and `prior` differ in an attribute the API holds (neither computed
/// nor local): the update has something to send.
pub fn spec_changed(def: &Def, prior: &Obj, planned: &Obj) -> bool {
    def.attrs
        .iter()
        .filter(|a| a.mode != Mode::Computed && !a.local)
        .any(|a| get(planned, a.name) != get(prior, a.name))
        || def
            .blocks
            .iter()
            .any(|b| get(planned, b.name) != get(prior, b.name))
}

fn normalize_attrs(attrs: &[Attr], prior: Option<&Obj>, fresh: &mut Obj) {
    for a in attrs {
        let p = prior.map(|p| get(p, a.name)).unwrap_or(&ValueAny::Null);
        let f = fresh.remove(a.name).unwrap_or(ValueAny::Null);
        let v = if a.local {
            match (p, a.default) {
                (ValueAny::Null, Some(d)) => d.value(),
                _ => p.clone(),
            }
        } else if a.ty == Ty::Json
            && let (ValueAny::String(ps), ValueAny::String(fs)) = (p, &f)
            && json_text_eq(ps, fs)
        {
            p.clone()
        } else if a.mode == Mode::Optional && is_empty(&f) && is_empty(p) {
            // The API does not tell null from "" or {}: keep the configuration's spelling.
            p.clone()
        } else {
            f
        };
        fresh.insert(a.name.to_string(), v);
    }
}

fn is_default_block(b: &BlockDef, elem: &Obj) -> bool {
    b.attrs.iter().all(|a| match a.default {
        Some(d) => get(elem, a.name) == &d.value(),
        None => is_empty(get(elem, a.name)),
    })
}

/// Brings what the API answered (`fresh`) into the state's shape: every attribute present,
/// local attributes from `prior`, and the spellings of `prior` kept where the API cannot
/// tell them apart (null vs empty, JSON key order, an absent block vs its defaults).
pub fn normalize(def: &Def, prior: Option<&Obj>, fresh: &mut Obj) {
    normalize_attrs(&def.attrs, prior, fresh);
    for b in &def.blocks {
        let prior_elems = prior.map(|p| elements(get(p, b.name))).unwrap_or_default();
        let fresh_elems: Vec<Obj> = elements(get(fresh, b.name))
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        let mut out = Vec::new();
        for (i, mut elem) in fresh_elems.into_iter().enumerate() {
            let prior_elem = prior_elems.get(i).copied().flatten();
            normalize_attrs(&b.attrs, prior_elem, &mut elem);
            if b.omit_when_default && prior_elem.is_none() && is_default_block(b, &elem) {
                continue;
            }
            out.push(ValueAny::Map(elem));
        }
        fresh.insert(b.name.to_string(), ValueAny::List(out));
    }
}

fn finalize_value(planned: &ValueAny, fresh: &ValueAny) -> ValueAny {
    match (planned, fresh) {
        (ValueAny::List(p), ValueAny::List(f)) if p.len() == f.len() => {
            ValueAny::List(p.iter().zip(f).map(|(p, f)| finalize_value(p, f)).collect())
        }
        (ValueAny::Map(p), ValueAny::Map(f)) => ValueAny::Map(
            p.iter()
                .map(|(k, pv)| {
                    let fv = f.get(k).unwrap_or(&ValueAny::Null);
                    (k.clone(), finalize_value(pv, fv))
                })
                .collect(),
        ),
        (p, _) if is_known(p) => p.clone(),
        (_, f) => f.clone(),
    }
}

/// The state after an apply: the plan, with its unknown values taken from what the API
/// answered, so every value the plan promised is what the state holds.
pub fn finalize(planned: &Obj, fresh: &Obj) -> Obj {
    let p = ValueAny::Map(planned.clone());
    let f = ValueAny::Map(fresh.clone());
    match finalize_value(&p, &f) {
        ValueAny::Map(m) => m,
        _ => planned.clone(),
    }
}

#[cfg(test)]
mod tests;

/// The JSON attributes of `config` (top level and in blocks) whose known value does not
/// parse, with the error to show at each.
pub fn invalid_json(def: &Def, config: &Obj) -> Vec<(AttributePath, String)> {
    fn check(
        attrs: &[Attr],
        obj: &Obj,
        path: AttributePath,
        out: &mut Vec<(AttributePath, String)>,
    ) {
        for a in attrs.iter().filter(|a| a.ty == Ty::Json) {
            if let ValueAny::String(s) = get(obj, a.name)
                && let Err(err) = serde_json::from_str::<serde_json::Value>(s)
            {
                out.push((
                    path.clone().attribute(a.name),
                    format!(
                        "{} is not JSON ({err}); write it with jsonencode(...)",
                        a.name
                    ),
                ));
            }
        }
    }
    let mut out = Vec::new();
    check(&def.attrs, config, AttributePath::root(), &mut out);
    for b in &def.blocks {
        for (i, elem) in elements(get(config, b.name)).into_iter().enumerate() {
            if let Some(elem) = elem {
                check(
                    &b.attrs,
                    elem,
                    AttributePath::new(b.name).index(i as i64),
                    &mut out,
                );
            }
        }
    }
    out
}

fn type_name(ty: Ty) -> &'static str {
    match ty {
        Ty::Str => "string",
        Ty::Json => "string (JSON)",
        Ty::Num => "number",
        Ty::Bool => "bool",
        Ty::MapStr => "map(string)",
        Ty::ListStr => "list(string)",
    }
}

fn attr_rows(attrs: &[Attr], out: &mut String) {
    out.push_str("| attribute | type | | description |\n|---|---|---|---|\n");
    for a in attrs {
        let mut kind = match a.mode {
            Mode::Required => "required",
            Mode::Optional | Mode::OptionalComputed => "optional",
            Mode::Computed => "computed",
        }
        .to_string();
        if a.sensitive {
            kind.push_str(", sensitive");
        }
        let mut desc = a.desc.to_string();
        if let Some(d) = a.default {
            let shown = match d {
                Preset::Str(s) => format!("`\"{s}\"`"),
                Preset::Num(n) => format!("`{n}`"),
                Preset::Bool(b) => format!("`{b}`"),
                Preset::Strs(items) => format!("`{items:?}`"),
            };
            desc.push_str(&format!(" Default {shown}."));
        }
        if a.force_new {
            desc.push_str(" Changing it replaces the object.");
        }
        if a.local {
            desc.push_str(" (Provider setting: not stored on the server.)");
        }
        out.push_str(&format!(
            "| `{}` | {} | {kind} | {} |\n",
            a.name,
            type_name(a.ty),
            desc.replace('|', "\\|")
        ));
    }
}

/// The reference section of `docs/terraform.md` for one resource, data source or the
/// provider itself, generated from its table so the guide cannot drift from the code.
pub fn reference(title: &str, def: &Def) -> String {
    let mut out = format!("### {title}\n\n{}\n\n", def.desc);
    attr_rows(&def.attrs, &mut out);
    for b in &def.blocks {
        out.push_str(&format!(
            "\nBlock `{}` (at most one): {}\n\n",
            b.name, b.desc
        ));
        attr_rows(&b.attrs, &mut out);
    }
    out
}
