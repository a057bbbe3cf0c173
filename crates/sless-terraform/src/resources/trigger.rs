//! `sless_trigger`: an http, cron, queue or device block says which kind.

use anyhow::{Context, bail};
use async_trait::async_trait;
use serde_json::{Map, Value as Json, json};
use sless_client::Trigger;
use tf_provider::value::ValueAny;

use super::function::{delivery_block, delivery_json, delivery_state};
use crate::resource::{Ctx, SlessResource, deleted, found, ns_name, object_id};
use crate::schema::{Attr, BlockDef, Def, Preset, Ty};
use crate::value::{
    Obj, block, block_of, bool_of, from_json, get, list_of, num_of, opt_string, str_of, string,
};

const KINDS: &[&str] = &["http", "cron", "queue", "device"];
const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

fn kind_block(name: &'static str, desc: &'static str, attrs: Vec<Attr>) -> BlockDef {
    BlockDef {
        name,
        desc,
        attrs,
        force_new: true,
        omit_when_default: false,
    }
}

fn trigger_def() -> Def {
    Def {
        desc: "A trigger: fires a function from an HTTP route, a cron schedule, a broker's messages or devices' telemetry. Exactly one of the `http`, `cron`, `queue` and `device` blocks says which; changing the kind replaces the trigger, anything else is changed in place.",
        attrs: vec![
            Attr::computed("id", Ty::Str, "`namespace/name`."),
            Attr::optional_computed("namespace", Ty::Str, "The namespace; default the provider's.").force_new(),
            Attr::required("name", Ty::Str, "The trigger's name (a DNS label).").force_new(),
            Attr::required("function", Ty::Str, "The function it fires (in the same namespace)."),
            Attr::with_default("enabled", Ty::Bool, Preset::Bool(true), "A disabled trigger does not fire (queue messages stay in the broker)."),
            Attr::computed("type", Ty::Str, "`http`, `cron`, `queue` or `device`."),
        ],
        blocks: vec![
            kind_block("http", "An extra public route `/t/{namespace}{path}` to the function.", vec![
                Attr::required("path", Ty::Str, "The route, e.g. `/orders`; requests below it match too."),
                Attr::with_default("methods", Ty::ListStr, Preset::Strs(METHODS), "The methods it accepts."),
            ]),
            kind_block("cron", "Fires on a schedule.", vec![
                Attr::required("schedule", Ty::Str, "5-field cron, or 6 fields with seconds first."),
                Attr::with_default("timezone", Ty::Str, Preset::Str("UTC"), "The IANA time zone the schedule is read in."),
                Attr::with_default("event", Ty::Json, Preset::Str("{}"), "The event as JSON (`jsonencode({...})`); the handler gets it with `fired_at` added."),
                Attr::with_default("prewarm_sec", Ty::Num, Preset::Num(0), "Seconds before each fire at which an instance is started."),
            ]),
            kind_block("queue", "Messages from a broker: at-least-once, retried, dead-lettered.", vec![
                Attr::required("kind", Ty::Str, "`amqp`, `kafka`, `mqtt` or `nats`."),
                Attr::optional("url", Ty::Str, "The broker's URL (`amqp://...`, `kafka://host:port`, `mqtt://...?version=5`, `nats://...`).").sensitive(),
                Attr::optional("url_secret", Ty::Str, "The URL from a secret instead: `secret/key`."),
                Attr::required("topic", Ty::Str, "Queue, topic, topic filter or subject."),
                Attr::optional_computed("group", Ty::Str, "Consumer group, durable or session name; default `sless-{namespace}-{trigger}`."),
                Attr::with_default("start_from", Ty::Str, Preset::Str("latest"), "`latest` or `earliest`, for a group that never consumed."),
                Attr::with_default("event", Ty::Str, Preset::Str("payload"), "`payload`, or `envelope` (`{payload, message}`)."),
                Attr::optional("response_topic", Ty::Str, "Where a successful return value is published."),
                Attr::optional("dead_letter_topic", Ty::Str, "Where dead letters are also published."),
            ]),
            kind_block("device", "Telemetry of the namespace's devices.", vec![
                Attr::with_default("devices", Ty::Str, Preset::Str("*"), "A glob of device names."),
                Attr::with_default("event", Ty::Str, Preset::Str("payload"), "`payload` or `envelope`."),
            ]),
            delivery_block("Delivery policy of a queue or device trigger."),
        ],
    }
}

/// The one kind block `obj` has.
fn kind_of(obj: &Obj) -> Option<(&'static str, &Obj)> {
    KINDS.iter().find_map(|k| block_of(obj, k).map(|b| (*k, b)))
}

fn spec_json(obj: &Obj) -> anyhow::Result<Map<String, Json>> {
    let (kind, b) = kind_of(obj).context("one of http, cron, queue or device is required")?;
    let mut spec = Map::new();
    spec.insert(
        "function".into(),
        json!(str_of(obj, "function").context("function must be known")?),
    );
    spec.insert("type".into(), json!(kind));
    if let Some(e) = bool_of(obj, "enabled") {
        spec.insert("enabled".into(), json!(e));
    }
    let text = |k: &str| str_of(b, k).map(|s| json!(s)).unwrap_or(Json::Null);
    match kind {
        "http" => {
            spec.insert("path".into(), text("path"));
            spec.insert("methods".into(), json!(list_of(b, "methods")));
        }
        "cron" => {
            spec.insert("schedule".into(), text("schedule"));
            spec.insert("timezone".into(), text("timezone"));
            let event = str_of(b, "event").unwrap_or("{}");
            let event: Json = serde_json::from_str(event).context("cron.event is not JSON")?;
            spec.insert("event".into(), event);
            spec.insert(
                "prewarm_sec".into(),
                json!(num_of(b, "prewarm_sec").unwrap_or(0)),
            );
        }
        "queue" => {
            let url_secret = match str_of(b, "url_secret") {
                Some(s) => match s.split_once('/') {
                    Some((secret, key)) => json!({"secret": secret, "key": key}),
                    None => bail!("queue.url_secret: {s:?} is not of the form secret/key"),
                },
                None => Json::Null,
            };
            let mut source = Map::new();
            source.insert("kind".into(), text("kind"));
            source.insert("url".into(), text("url"));
            source.insert("url_secret".into(), url_secret);
            source.insert("topic".into(), text("topic"));
            source.insert("group".into(), text("group"));
            source.insert("start_from".into(), text("start_from"));
            spec.insert("source".into(), Json::Object(source));
            spec.insert("event".into(), text("event"));
            spec.insert("response_topic".into(), text("response_topic"));
            spec.insert("dead_letter_topic".into(), text("dead_letter_topic"));
        }
        _ => {
            spec.insert("devices".into(), text("devices"));
            spec.insert("event".into(), text("event"));
        }
    }
    if matches!(kind, "queue" | "device") {
        spec.insert("delivery".into(), delivery_json(obj).unwrap_or(Json::Null));
    }
    Ok(spec)
}

/// Drops the nulls a create does not need (a merge patch needs them to remove values).
fn without_nulls(v: Json) -> Json {
    match v {
        Json::Object(m) => Json::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

fn trigger_state(t: &Trigger, prior: Option<&Obj>) -> Obj {
    let raw = serde_json::to_value(&t.spec).unwrap_or(Json::Null);
    let field = |k: &str| raw.get(k).map(from_json).unwrap_or(ValueAny::Null);
    let mut out = Obj::new();
    out.insert("id".into(), string(format!("{}/{}", t.namespace, t.name)));
    out.insert("namespace".into(), string(&t.namespace));
    out.insert("name".into(), string(&t.name));
    out.insert("function".into(), string(&t.spec.function));
    out.insert("enabled".into(), ValueAny::Bool(t.spec.enabled));
    let kind = t.kind();
    out.insert("type".into(), string(kind));
    for k in KINDS {
        out.insert(k.to_string(), ValueAny::List(vec![]));
    }
    let mut b = Obj::new();
    match kind {
        "http" => {
            b.insert("path".into(), field("path"));
            let methods = field("methods");
            // The server spells methods its own way; the same set is no change.
            let prior_methods = prior
                .and_then(|p| block_of(p, "http"))
                .map(|h| get(h, "methods").clone());
            let same = |a: &ValueAny, b: &ValueAny| {
                let norm = |v: &ValueAny| {
                    let mut m: Vec<String> = match v {
                        ValueAny::List(items) => items
                            .iter()
                            .filter_map(|i| match i {
                                ValueAny::String(s) => Some(s.to_uppercase()),
                                _ => None,
                            })
                            .collect(),
                        _ => vec![],
                    };
                    m.sort();
                    m
                };
                norm(a) == norm(b)
            };
            b.insert(
                "methods".into(),
                match prior_methods {
                    Some(p) if same(&p, &methods) => p,
                    _ => methods,
                },
            );
        }
        "cron" => {
            b.insert("schedule".into(), field("schedule"));
            b.insert("timezone".into(), field("timezone"));
            b.insert(
                "event".into(),
                string(
                    raw.get("event")
                        .map(Json::to_string)
                        .unwrap_or_else(|| "{}".into()),
                ),
            );
            b.insert("prewarm_sec".into(), field("prewarm_sec"));
        }
        "queue" => {
            let src = raw.get("source").cloned().unwrap_or(Json::Null);
            let s = |k: &str| src.get(k).and_then(Json::as_str).map(str::to_string);
            b.insert("kind".into(), opt_string(s("kind")));
            b.insert("url".into(), opt_string(s("url")));
            let url_secret = src.get("url_secret").and_then(|r| {
                Some(format!(
                    "{}/{}",
                    r.get("secret")?.as_str()?,
                    r.get("key")?.as_str()?
                ))
            });
            b.insert("url_secret".into(), opt_string(url_secret));
            b.insert("topic".into(), opt_string(s("topic")));
            b.insert("group".into(), opt_string(s("group")));
            b.insert("start_from".into(), opt_string(s("start_from")));
            b.insert("event".into(), field("event"));
            b.insert("response_topic".into(), field("response_topic"));
            b.insert("dead_letter_topic".into(), field("dead_letter_topic"));
        }
        "device" => {
            b.insert("devices".into(), field("devices"));
            b.insert("event".into(), field("event"));
        }
        _ => {}
    }
    if KINDS.contains(&kind) {
        out.insert(kind.to_string(), block(b));
    }
    out.insert("delivery".into(), delivery_state(raw.get("delivery")));
    out
}

pub struct TriggerResource {
    def: Def,
}

impl Default for TriggerResource {
    fn default() -> Self {
        TriggerResource { def: trigger_def() }
    }
}

#[async_trait]
impl SlessResource for TriggerResource {
    fn def(&self) -> &Def {
        &self.def
    }

    fn validate(&self, config: &Obj) -> Vec<(&'static str, String)> {
        let present: Vec<&str> = KINDS
            .iter()
            .copied()
            .filter(|k| {
                matches!(get(config, k), ValueAny::List(items) if !items.is_empty())
                    || matches!(get(config, k), ValueAny::Unknown)
            })
            .collect();
        let mut errors = Vec::new();
        if present.len() != 1 {
            errors.push((
                "http",
                format!(
                    "exactly one of the http, cron, queue and device blocks is required (found {})",
                    if present.is_empty() {
                        "none".to_string()
                    } else {
                        present.join(", ")
                    }
                ),
            ));
        }
        if let Some(q) = block_of(config, "queue")
            && matches!(get(q, "url"), ValueAny::Null)
            && matches!(get(q, "url_secret"), ValueAny::Null)
        {
            errors.push(("queue", "queue: url or url_secret is required".to_string()));
        }
        if matches!(get(config, "delivery"), ValueAny::List(items) if !items.is_empty())
            && !present.iter().any(|k| matches!(*k, "queue" | "device"))
        {
            errors.push((
                "delivery",
                "delivery applies to queue and device triggers only".to_string(),
            ));
        }
        errors
    }

    fn plan(&self, _prior: Option<&Obj>, _config: &Obj, planned: &mut Obj) -> anyhow::Result<()> {
        let kind = kind_of(planned).map(|(k, _)| k);
        planned.insert("type".into(), kind.map_or(ValueAny::Unknown, string));
        Ok(())
    }

    async fn read(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<Option<Obj>> {
        let (ns, name) = ns_name(st)?;
        Ok(found(
            ctx.client.get_trigger(ns, name).await,
            format!("cannot read trigger {ns}/{name}"),
        )?
        .map(|t| trigger_state(&t, Some(st))))
    }

    async fn create(&self, ctx: &Ctx, planned: &Obj) -> anyhow::Result<Obj> {
        let (ns, name) = ns_name(planned)?;
        let mut body = spec_json(planned)?;
        body.insert("name".into(), json!(name));
        let t = ctx
            .client
            .create_trigger(ns, &without_nulls(Json::Object(body)))
            .await
            .with_context(|| format!("cannot create trigger {ns}/{name}"))?;
        Ok(trigger_state(&t, Some(planned)))
    }

    async fn update(&self, ctx: &Ctx, _prior: &Obj, planned: &Obj) -> anyhow::Result<Obj> {
        let (ns, name) = ns_name(planned)?;
        let patch = spec_json(planned)?;
        let t = ctx
            .client
            .patch_trigger(ns, name, &Json::Object(patch))
            .await
            .with_context(|| format!("cannot update trigger {ns}/{name}"))?;
        Ok(trigger_state(&t, Some(planned)))
    }

    async fn delete(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<()> {
        let (ns, name) = ns_name(st)?;
        deleted(
            ctx.client.delete_trigger(ns, name).await,
            format!("cannot delete trigger {}", object_id(st)),
        )
    }
}
