//! `sless_function`, `sless_service` (a function with `min_instances >= 1`) and the
//! `sless_function` data source; also the code handling `sless_job` shares (`source_dir`
//! / `source_zip`, the archive's hash in the plan).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use async_trait::async_trait;
use serde_json::{Map, Value as Json, json};
use sha2::{Digest, Sha256};
use sless_client::{Function, FunctionPhase};
use tf_provider::value::ValueAny;

use crate::resource::{Ctx, SlessDataSource, SlessResource, deleted, found, ns_name, object_id};
use crate::schema::{self, Attr, BlockDef, Def, Mode, Preset, Ty};
use crate::value::{
    Obj, block, block_of, from_json, get, map_of, num_of, str_of, string, string_map,
};

/// The delivery policy block of functions (their async calls) and triggers.
pub fn delivery_block(desc: &'static str) -> BlockDef {
    BlockDef {
        name: "delivery",
        desc,
        force_new: false,
        omit_when_default: true,
        attrs: vec![
            Attr::with_default(
                "max_attempts",
                Ty::Num,
                Preset::Num(3),
                "Attempts before a message becomes a dead letter.",
            ),
            Attr::with_default(
                "backoff_initial_ms",
                Ty::Num,
                Preset::Num(500),
                "The first retry's delay.",
            ),
            Attr::with_default(
                "backoff_max_ms",
                Ty::Num,
                Preset::Num(60000),
                "The longest retry delay.",
            ),
            Attr::with_default(
                "concurrency",
                Ty::Num,
                Preset::Num(1),
                "Messages in flight at once.",
            ),
            Attr::with_default(
                "ordering",
                Ty::Str,
                Preset::Str("none"),
                "`none`, or `key`: one in flight per key, in order.",
            ),
        ],
    }
}

/// The delivery block of a state as the API's `delivery` object.
pub fn delivery_json(obj: &Obj) -> Option<Json> {
    let d = block_of(obj, "delivery")?;
    let mut out = Map::new();
    for k in [
        "max_attempts",
        "backoff_initial_ms",
        "backoff_max_ms",
        "concurrency",
    ] {
        if let Some(n) = num_of(d, k) {
            out.insert(k.into(), json!(n));
        }
    }
    if let Some(o) = str_of(d, "ordering") {
        out.insert("ordering".into(), json!(o));
    }
    Some(Json::Object(out))
}

/// The API's `delivery` object as a block list.
pub fn delivery_state(d: Option<&Json>) -> ValueAny {
    match d {
        Some(Json::Object(m)) => {
            let keys = [
                "max_attempts",
                "backoff_initial_ms",
                "backoff_max_ms",
                "concurrency",
                "ordering",
            ];
            block(
                keys.iter()
                    .filter_map(|k| m.get(*k).map(|v| (k.to_string(), from_json(v))))
                    .collect(),
            )
        }
        _ => ValueAny::List(vec![]),
    }
}

/// The code attributes: a folder or a zip file, and the archive's hash.
pub fn code_attrs() -> Vec<Attr> {
    vec![
        Attr::optional(
            "source_dir",
            Ty::Str,
            "A folder holding the code. The provider zips it deterministically (the same files give the same bytes, as `sless deploy` makes them), so any change under it shows in a plan as an in-place update of `code_sha256`.",
        )
        .local(),
        Attr::optional("source_zip", Ty::Str, "A zip archive of the code, instead of `source_dir`.").local(),
        Attr::computed("code_sha256", Ty::Str, "SHA-256 of the uploaded archive."),
    ]
}

/// The archive `planned` names, `None` when it names none.
pub fn code_bytes(planned: &Obj) -> anyhow::Result<Option<Vec<u8>>> {
    if let Some(dir) = str_of(planned, "source_dir") {
        let archive = sless_client::archive::zip_dir(Path::new(dir))
            .with_context(|| format!("source_dir {dir:?}"))?;
        return Ok(Some(archive.bytes));
    }
    if let Some(file) = str_of(planned, "source_zip") {
        let bytes =
            std::fs::read(file).with_context(|| format!("source_zip {file:?}: cannot read it"))?;
        return Ok(Some(bytes));
    }
    Ok(None)
}

/// The archive to upload: the one `planned` names, when its hash differs from the prior
/// state's (always on create).
pub fn changed_code(prior: Option<&Obj>, planned: &Obj) -> anyhow::Result<Option<Vec<u8>>> {
    if prior.is_some_and(|p| get(p, "code_sha256") == get(planned, "code_sha256")) {
        return Ok(None);
    }
    code_bytes(planned)
}

/// Plans `code_sha256`: the hash of the archive the configuration names (unknown while its
/// path is), else the prior one. Without prior state a source is required (`what` names
/// the object).
pub fn plan_code(
    prior: Option<&Obj>,
    config: &Obj,
    planned: &mut Obj,
    what: &str,
) -> anyhow::Result<()> {
    let dir = get(config, "source_dir");
    let zip = get(config, "source_zip");
    if !matches!(dir, ValueAny::Null) && !matches!(zip, ValueAny::Null) {
        bail!("{what}: set source_dir or source_zip, not both");
    }
    let hash = if matches!(dir, ValueAny::Unknown) || matches!(zip, ValueAny::Unknown) {
        ValueAny::Unknown
    } else {
        match code_bytes(config)? {
            Some(bytes) => string(hex::encode(Sha256::digest(&bytes))),
            None => match prior {
                Some(p) => get(p, "code_sha256").clone(),
                None => bail!("{what}: source_dir or source_zip is required"),
            },
        }
    };
    planned.insert("code_sha256".into(), hash);
    Ok(())
}

/// Plain `env` and `secret_env` (`NAME = "secret/key"`) as the API's `env` object.
pub fn env_json(obj: &Obj) -> anyhow::Result<Map<String, Json>> {
    let mut env: Map<String, Json> = map_of(obj, "env")
        .into_iter()
        .map(|(k, v)| (k, json!(v)))
        .collect();
    for (k, v) in map_of(obj, "secret_env") {
        let Some((secret, key)) = v.split_once('/') else {
            bail!("secret_env.{k}: {v:?} is not of the form secret/key");
        };
        if env.contains_key(&k) {
            bail!("{k} is in both env and secret_env");
        }
        env.insert(k, json!({"secret": secret, "key": key}));
    }
    Ok(env)
}

/// The API's `env` split into plain values and secret references.
pub fn env_state(env: Option<&Json>, out: &mut Obj) {
    let mut plain = std::collections::BTreeMap::new();
    let mut secret = std::collections::BTreeMap::new();
    if let Some(Json::Object(m)) = env {
        for (k, v) in m {
            match v {
                Json::String(s) => {
                    plain.insert(k.clone(), s.clone());
                }
                Json::Object(r) => {
                    let s = r.get("secret").and_then(Json::as_str).unwrap_or_default();
                    let key = r.get("key").and_then(Json::as_str).unwrap_or_default();
                    secret.insert(k.clone(), format!("{s}/{key}"));
                }
                _ => {}
            }
        }
    }
    out.insert("env".into(), string_map(&plain));
    out.insert("secret_env".into(), string_map(&secret));
}

/// The numeric spec fields with their API defaults (`min_instances` is the caller's).
const NUMBERS: &[(&str, i64, &str)] = &[
    ("memory_mb", 128, "Memory limit in MiB (32..4096)."),
    ("cpu", 1000, "CPU limit in millicores."),
    (
        "timeout_sec",
        30,
        "Seconds a call may run (0..900, 0 = no limit).",
    ),
    (
        "max_instances",
        10,
        "Most instances at once (at least max(1, min_instances)).",
    ),
    ("concurrency", 16, "Requests one instance serves at once."),
    (
        "idle_timeout_sec",
        60,
        "Seconds an instance above min_instances may idle before it stops.",
    ),
];

fn function_def(service: bool) -> Def {
    let mut attrs = vec![
        Attr::computed("id", Ty::Str, "`namespace/name`."),
        Attr::optional_computed(
            "namespace",
            Ty::Str,
            "The namespace; default the provider's.",
        )
        .force_new(),
        Attr::required("name", Ty::Str, "The function's name (a DNS label).").force_new(),
        Attr::required(
            "runtime",
            Ty::Str,
            "`python3`, `nodejs`, `go` or `custom`, or a version alias (`python3.11`, `nodejs20`).",
        ),
        Attr::optional_computed(
            "entrypoint",
            Ty::Str,
            "`module.function`; default `handler.handle` (`Handle` for go).",
        ),
        Attr::optional("env", Ty::MapStr, "Environment variables."),
        Attr::optional(
            "secret_env",
            Ty::MapStr,
            "Environment variables from secrets: `NAME = \"secret/key\"`.",
        ),
    ];
    attrs.push(if service {
        Attr::with_default(
            "min_instances",
            Ty::Num,
            Preset::Num(1),
            "Instances kept running (at least 1 for a service).",
        )
    } else {
        Attr::with_default(
            "min_instances",
            Ty::Num,
            Preset::Num(0),
            "Instances kept running; 0 scales to zero.",
        )
    });
    for (name, d, desc) in NUMBERS {
        attrs.push(Attr::with_default(name, Ty::Num, Preset::Num(*d), desc));
    }
    attrs.extend([
        Attr::with_default(
            "paused",
            Ty::Bool,
            Preset::Bool(false),
            "Frozen: no instances, `/fn/` answers 503, triggers do not fire.",
        ),
        Attr::with_default(
            "private",
            Ty::Bool,
            Preset::Bool(false),
            "`/fn/` requires a token of the namespace.",
        ),
        Attr::with_default(
            "network",
            Ty::Str,
            Preset::Str("outbound"),
            "`outbound`, `none` or `host`.",
        ),
        Attr::with_default(
            "ready_timeout_sec",
            Ty::Num,
            Preset::Num(300),
            "How long an apply waits for the function to be Ready.",
        )
        .local(),
    ]);
    attrs.extend(code_attrs());
    attrs.extend([
        Attr::computed("revision", Ty::Num, "The latest revision.").volatile(),
        Attr::computed("phase", Ty::Str, "`Ready` after a successful apply.").volatile(),
        Attr::computed(
            "url",
            Ty::Str,
            "The function's public URL (`/fn/{namespace}/{name}`).",
        ),
    ]);
    Def {
        desc: if service {
            "An always-on HTTP service: a function with `min_instances` of at least 1."
        } else {
            "A function: code, runtime and configuration, served at `/fn/{namespace}/{name}`."
        },
        attrs,
        blocks: vec![delivery_block(
            "The default delivery policy of the function's async calls.",
        )],
    }
}

/// The spec fields of `obj` as the API's JSON.
fn spec_json(def: &Def, obj: &Obj) -> anyhow::Result<Map<String, Json>> {
    let mut spec = Map::new();
    spec.insert(
        "runtime".into(),
        json!(str_of(obj, "runtime").context("runtime must be known")?),
    );
    if let Some(e) = str_of(obj, "entrypoint") {
        spec.insert("entrypoint".into(), json!(e));
    }
    spec.insert("env".into(), Json::Object(env_json(obj)?));
    for a in def
        .attrs
        .iter()
        .filter(|a| a.mode != Mode::Computed && !a.local)
    {
        match (a.ty, get(obj, a.name)) {
            (Ty::Num, ValueAny::Number(n)) => {
                spec.insert(a.name.into(), json!(n));
            }
            (Ty::Bool, ValueAny::Bool(b)) => {
                spec.insert(a.name.into(), json!(b));
            }
            (Ty::Str, ValueAny::String(s)) if a.name == "network" => {
                spec.insert(a.name.into(), json!(s));
            }
            _ => {}
        }
    }
    spec.insert("delivery".into(), delivery_json(obj).unwrap_or(Json::Null));
    Ok(spec)
}

/// The state of a function as the API reports it.
pub fn function_state(def: &Def, f: &Function) -> Obj {
    let mut out = Obj::new();
    out.insert("id".into(), string(format!("{}/{}", f.namespace, f.name)));
    out.insert("namespace".into(), string(&f.namespace));
    out.insert("name".into(), string(&f.name));
    for a in &def.attrs {
        if (matches!(a.ty, Ty::Num | Ty::Bool)
            || ["runtime", "entrypoint", "network"].contains(&a.name))
            && let Some(v) = f.spec.get(a.name)
        {
            out.insert(a.name.into(), from_json(v));
        }
    }
    env_state(f.spec.get("env"), &mut out);
    out.insert("delivery".into(), delivery_state(f.spec.get("delivery")));
    out.insert(
        "code_sha256".into(),
        crate::value::opt_string(f.status.code_sha256.clone()),
    );
    out.insert(
        "revision".into(),
        ValueAny::Number(f.status.revision as i64),
    );
    out.insert("phase".into(), string(f.status.phase.to_string()));
    out.insert("url".into(), string(&f.status.url));
    out
}

/// Waits for revision `revision` of the function to settle; an error carrying the
/// build log's tail when it failed.
pub async fn wait_ready(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    revision: u64,
    timeout: Duration,
) -> anyhow::Result<Function> {
    let f = ctx
        .client
        .wait_ready(ns, name, revision, timeout, |_| {})
        .await
        .with_context(|| format!("function {ns}/{name} did not become Ready"))?;
    if f.status.phase == FunctionPhase::Failed {
        return Err(anyhow::anyhow!("{}", f.status.message.trim_end())).with_context(|| {
            format!(
                "function {ns}/{name} failed (revision {})",
                f.status.revision
            )
        });
    }
    Ok(f)
}

fn timeout_of(obj: &Obj) -> Duration {
    Duration::from_secs(num_of(obj, "ready_timeout_sec").unwrap_or(300).max(1) as u64)
}

pub struct FunctionResource {
    def: Def,
    service: bool,
}

impl FunctionResource {
    pub fn new(service: bool) -> Self {
        FunctionResource {
            def: function_def(service),
            service,
        }
    }

    fn kind(&self) -> &'static str {
        if self.service { "service" } else { "function" }
    }

    async fn converge(
        &self,
        ctx: &Ctx,
        ns: &str,
        name: &str,
        prior: Option<&Obj>,
        planned: &Obj,
        mut revision: u64,
    ) -> anyhow::Result<Function> {
        if let Some(bytes) = changed_code(prior, planned)? {
            let up = ctx
                .client
                .upload_code(ns, name, bytes)
                .await
                .with_context(|| format!("cannot upload the code of {ns}/{name}"))?;
            if let Some(want) = str_of(planned, "code_sha256")
                && want != up.code_sha256
            {
                bail!(
                    "the code under source_dir changed between plan and apply (planned {want}, uploaded {}); run the plan again",
                    up.code_sha256
                );
            }
            revision = revision.max(up.revision);
        }
        wait_ready(ctx, ns, name, revision, timeout_of(planned)).await
    }
}

#[async_trait]
impl SlessResource for FunctionResource {
    fn def(&self) -> &Def {
        &self.def
    }

    fn validate(&self, config: &Obj) -> Vec<(&'static str, String)> {
        let mut errors = Vec::new();
        if self.service
            && let Some(n) = num_of(config, "min_instances")
            && n < 1
        {
            errors.push((
                "min_instances",
                format!("a service runs at least one instance; min_instances = {n}"),
            ));
        }
        for (k, v) in map_of(config, "secret_env") {
            if !v.contains('/') {
                errors.push((
                    "secret_env",
                    format!("secret_env.{k}: {v:?} is not of the form secret/key"),
                ));
            }
        }
        errors
    }

    fn plan(&self, prior: Option<&Obj>, config: &Obj, planned: &mut Obj) -> anyhow::Result<()> {
        plan_code(prior, config, planned, &format!("sless_{}", self.kind()))?;
        // An unset entrypoint is the runtime's default, so removing it resets it.
        if matches!(get(config, "entrypoint"), ValueAny::Null) {
            let v = match get(planned, "runtime") {
                ValueAny::String(r) if r.starts_with("go") => string("Handle"),
                ValueAny::String(r) if r.starts_with("custom") => string("bootstrap"),
                ValueAny::String(_) => string("handler.handle"),
                _ => ValueAny::Unknown,
            };
            planned.insert(
                "entrypoint".into(),
                if matches!(v, ValueAny::Null) {
                    ValueAny::Unknown
                } else {
                    v
                },
            );
        }
        // The URL follows the name; only an unknown namespace leaves it unknown.
        if let Some(p) = prior
            && get(p, "namespace") != get(planned, "namespace")
        {
            planned.insert("url".into(), ValueAny::Unknown);
        }
        Ok(())
    }

    async fn read(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<Option<Obj>> {
        let (ns, name) = ns_name(st)?;
        Ok(found(
            ctx.client.get_function(ns, name).await,
            format!("cannot read function {ns}/{name}"),
        )?
        .map(|f| function_state(&self.def, &f)))
    }

    async fn create(&self, ctx: &Ctx, planned: &Obj) -> anyhow::Result<Obj> {
        let (ns, name) = ns_name(planned)?;
        let mut body = spec_json(&self.def, planned)?;
        body.insert("name".into(), json!(name));
        if body.get("delivery") == Some(&Json::Null) {
            body.remove("delivery");
        }
        let created = ctx
            .client
            .create_function(ns, &Json::Object(body))
            .await
            .with_context(|| format!("cannot create function {ns}/{name}"))?;
        match self
            .converge(ctx, ns, name, None, planned, created.status.revision)
            .await
        {
            Ok(f) => Ok(function_state(&self.def, &f)),
            Err(err) => {
                // Nothing is left behind: the next apply creates it afresh.
                let _ = ctx.client.delete_function(ns, name).await;
                Err(err)
            }
        }
    }

    async fn update(&self, ctx: &Ctx, prior: &Obj, planned: &Obj) -> anyhow::Result<Obj> {
        let (ns, name) = ns_name(planned)?;
        let mut revision = num_of(prior, "revision").unwrap_or(0).max(0) as u64;
        let before = spec_json(&self.def, prior)?;
        let mut patch = spec_json(&self.def, planned)?;
        // A merge patch removes an env key by naming it with null.
        if let (Some(Json::Object(old)), Some(Json::Object(new))) =
            (before.get("env"), patch.get_mut("env"))
        {
            for k in old.keys() {
                new.entry(k.clone()).or_insert(Json::Null);
            }
        }
        if schema::spec_changed(&self.def, prior, planned) && before != patch {
            let f = ctx
                .client
                .patch_function(ns, name, &Json::Object(patch))
                .await
                .with_context(|| format!("cannot update function {ns}/{name}"))?;
            revision = f.status.revision;
        }
        let f = self
            .converge(ctx, ns, name, Some(prior), planned, revision)
            .await?;
        Ok(function_state(&self.def, &f))
    }

    async fn delete(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<()> {
        let (ns, name) = ns_name(st)?;
        deleted(
            ctx.client.delete_function(ns, name).await,
            format!("cannot delete function {}", object_id(st)),
        )
    }
}

pub struct FunctionData {
    def: Def,
}

impl Default for FunctionData {
    fn default() -> Self {
        let mut def = function_def(false);
        def.desc = "Looks up a function by namespace and name.";
        for a in &mut def.attrs {
            if a.name != "namespace" && a.name != "name" {
                a.mode = Mode::Computed;
                a.default = None;
                a.local = false;
            }
        }
        def.attrs
            .retain(|a| !["source_dir", "source_zip", "ready_timeout_sec"].contains(&a.name));
        def.blocks.clear();
        FunctionData { def }
    }
}

#[async_trait]
impl SlessDataSource for FunctionData {
    fn def(&self) -> &Def {
        &self.def
    }

    async fn read(&self, ctx: &Ctx, config: &Obj) -> anyhow::Result<Obj> {
        let (ns, name) = ns_name(config)?;
        let f = ctx
            .client
            .get_function(ns, name)
            .await
            .with_context(|| format!("cannot read function {ns}/{name}"))?;
        let mut st = function_state(&self.def, &f);
        st.remove("delivery");
        Ok(st)
    }
}
