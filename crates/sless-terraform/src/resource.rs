//! The seam between Terraform's resource calls and sless's: [`SlessResource`] is what
//! each resource implements (its table, its API calls), and [`Adapter`] turns it into a
//! `tf_provider::Resource`, applying the shared plan, normalisation and apply rules of
//! [`crate::schema`] and reporting errors as Terraform diagnostics.

use std::sync::{Arc, RwLock};

use anyhow::{Context, bail};
use async_trait::async_trait;
use tf_provider::schema::Schema;
use tf_provider::value::{ValueAny, ValueEmpty};
use tf_provider::{AttributePath, DataSource, Diagnostic, Diagnostics, Resource};

use crate::schema::{self, Def};
use crate::value::{Obj, get, str_of, string};

/// What a configured provider knows: the API client and the default namespace.
pub struct Ctx {
    pub client: sless_client::Client,
    pub namespace: String,
}

/// The provider's configuration, filled by `ConfigureProvider`, shared by every resource.
#[derive(Clone, Default)]
pub struct Shared(Arc<RwLock<Option<Arc<Ctx>>>>);

impl Shared {
    pub fn set(&self, ctx: Ctx) {
        if let Ok(mut slot) = self.0.write() {
            *slot = Some(Arc::new(ctx));
        }
    }

    pub fn get(&self) -> Option<Arc<Ctx>> {
        self.0.read().ok().and_then(|slot| slot.clone())
    }

    fn require(&self) -> anyhow::Result<Arc<Ctx>> {
        self.get()
            .context("the sless provider is not configured (its endpoint is unknown)")
    }
}

/// One sless object type as a Terraform resource.
#[async_trait]
pub trait SlessResource: Send + Sync + 'static {
    fn def(&self) -> &Def;

    /// Configuration errors as `(attribute, message)`; values may still be unknown.
    fn validate(&self, config: &Obj) -> Vec<(&'static str, String)> {
        let _ = config;
        Vec::new()
    }

    /// The resource's own plan adjustments after the shared rules (computed values it can
    /// know in advance, such as the hash of the code).
    fn plan(&self, prior: Option<&Obj>, config: &Obj, planned: &mut Obj) -> anyhow::Result<()> {
        let _ = (prior, config, planned);
        Ok(())
    }

    /// The object as the API has it now, `None` when it no longer exists.
    async fn read(&self, ctx: &Ctx, state: &Obj) -> anyhow::Result<Option<Obj>>;

    /// Creates the object; on failure nothing may be left behind.
    async fn create(&self, ctx: &Ctx, planned: &Obj) -> anyhow::Result<Obj>;

    async fn update(&self, ctx: &Ctx, prior: &Obj, planned: &Obj) -> anyhow::Result<Obj>;

    async fn delete(&self, ctx: &Ctx, state: &Obj) -> anyhow::Result<()>;

    /// The minimal state `terraform import ID` starts from (then read): `ns/name`, or a
    /// bare `name` in the provider's namespace.
    fn import_state(&self, ctx: &Ctx, id: &str) -> anyhow::Result<Obj> {
        let (ns, name) = match id.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => (ctx.namespace.clone(), id.to_string()),
        };
        if ns.is_empty() || name.is_empty() || name.contains('/') {
            bail!("import ID {id:?} is not of the form namespace/name");
        }
        let mut obj = Obj::new();
        obj.insert("namespace".into(), string(ns));
        obj.insert("name".into(), string(name));
        Ok(obj)
    }
}

/// The `namespace/name` id of a namespaced object.
pub fn object_id(obj: &Obj) -> String {
    format!(
        "{}/{}",
        str_of(obj, "namespace").unwrap_or_default(),
        str_of(obj, "name").unwrap_or_default()
    )
}

/// `namespace` and `name` of a state or plan.
pub fn ns_name(obj: &Obj) -> anyhow::Result<(&str, &str)> {
    match (str_of(obj, "namespace"), str_of(obj, "name")) {
        (Some(ns), Some(name)) => Ok((ns, name)),
        _ => bail!("namespace and name must be known"),
    }
}

/// True for the client's `404`.
pub fn is_not_found(err: &sless_client::ClientError) -> bool {
    err.status() == Some(404)
}

/// A read's answer: the object, `None` when the server says 404, else the error with
/// `what` (e.g. "cannot read function ns/f") as its context.
pub fn found<T>(
    result: Result<T, sless_client::ClientError>,
    what: String,
) -> anyhow::Result<Option<T>> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(err) if is_not_found(&err) => Ok(None),
        Err(err) => Err(anyhow::Error::new(err).context(what)),
    }
}

/// A delete's answer: already gone (404) is done too.
pub fn deleted(result: Result<(), sless_client::ClientError>, what: String) -> anyhow::Result<()> {
    found(result, what).map(|_| ())
}

/// Reports `err` (with its causes as the detail) as an error diagnostic.
pub fn report(diags: &mut Diagnostics, err: &anyhow::Error) {
    let mut chain = err.chain();
    let summary = chain.next().map(|e| e.to_string()).unwrap_or_default();
    let detail: Vec<String> = chain.map(|e| e.to_string()).collect();
    error_at(diags, summary, detail.join("\n"), AttributePath::root());
}

/// Adds an error diagnostic. Built directly rather than with `Diagnostics::error`, which
/// appends a Rust backtrace to the detail whenever `RUST_BACKTRACE` is set: users would see
/// the provider's stack under every error.
pub fn error_at(
    diags: &mut Diagnostics,
    summary: String,
    detail: String,
    attribute: AttributePath,
) {
    diags.add_error(Diagnostic {
        summary: summary.into(),
        detail: detail.into(),
        attribute,
    });
}

fn as_obj(v: ValueAny) -> Obj {
    match v {
        ValueAny::Map(m) => m,
        _ => Obj::new(),
    }
}

/// A [`SlessResource`] served as a Terraform resource.
pub struct Adapter<R> {
    pub inner: R,
    pub shared: Shared,
}

impl<R: SlessResource> Adapter<R> {
    /// The state after a create or update: the plan with its unknowns taken from what the
    /// API answered.
    fn applied(&self, planned: &Obj, fresh: &mut Obj) -> ValueAny {
        schema::normalize(self.inner.def(), Some(planned), fresh);
        ValueAny::Map(schema::finalize(planned, fresh))
    }

    fn plan(&self, prior: Option<&Obj>, config: &Obj) -> anyhow::Result<(Obj, Vec<AttributePath>)> {
        let def = self.inner.def();
        let (mut planned, mut replace) = schema::plan(def, prior, config);
        // A namespaced object left without `namespace` lives in the provider's.
        if def.attr("namespace").is_some() && matches!(get(config, "namespace"), ValueAny::Null) {
            let ns = match self.shared.get() {
                Some(ctx) => string(ctx.namespace.clone()),
                None => ValueAny::Unknown,
            };
            if let Some(prior) = prior
                && get(prior, "namespace") != &ns
                && !replace
                    .iter()
                    .any(|p| p == &AttributePath::new("namespace"))
            {
                replace.push(AttributePath::new("namespace"));
            }
            planned.insert("namespace".into(), ns);
        }
        self.inner.plan(prior, config, &mut planned)?;
        schema::mark_volatile(def, prior, &mut planned);
        Ok((planned, replace))
    }
}

#[async_trait]
impl<R: SlessResource> Resource for Adapter<R> {
    type State<'a> = ValueAny;
    type PrivateState<'a> = ValueEmpty;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        Some(schema::tf_schema(self.inner.def()))
    }

    async fn validate<'a>(&self, diags: &mut Diagnostics, config: ValueAny) -> Option<()> {
        let config = as_obj(config);
        for (path, msg) in schema::invalid_json(self.inner.def(), &config) {
            error_at(diags, msg, String::new(), path);
        }
        for (attr, msg) in self.inner.validate(&config) {
            error_at(diags, msg, String::new(), AttributePath::new(attr));
        }
        Some(())
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        state: ValueAny,
        _private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(ValueAny, ValueEmpty)> {
        let state = as_obj(state);
        let result = async {
            let ctx = self.shared.require()?;
            self.inner.read(&ctx, &state).await
        }
        .await;
        match result {
            Ok(Some(mut fresh)) => {
                schema::normalize(self.inner.def(), Some(&state), &mut fresh);
                Some((ValueAny::Map(fresh), ValueEmpty::Null))
            }
            Ok(None) => None,
            Err(err) => {
                report(diags, &err);
                Some((ValueAny::Map(state), ValueEmpty::Null))
            }
        }
    }

    async fn plan_create<'a>(
        &self,
        diags: &mut Diagnostics,
        _proposed: ValueAny,
        config: ValueAny,
        _meta: ValueEmpty,
    ) -> Option<(ValueAny, ValueEmpty)> {
        match self.plan(None, &as_obj(config)) {
            Ok((planned, _)) => Some((ValueAny::Map(planned), ValueEmpty::Null)),
            Err(err) => {
                report(diags, &err);
                None
            }
        }
    }

    async fn plan_update<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: ValueAny,
        _proposed: ValueAny,
        config: ValueAny,
        _private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(ValueAny, ValueEmpty, Vec<AttributePath>)> {
        let prior = as_obj(prior);
        match self.plan(Some(&prior), &as_obj(config)) {
            Ok((planned, replace)) => Some((ValueAny::Map(planned), ValueEmpty::Null, replace)),
            Err(err) => {
                report(diags, &err);
                None
            }
        }
    }

    async fn plan_destroy<'a>(
        &self,
        _diags: &mut Diagnostics,
        _prior: ValueAny,
        _private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<ValueEmpty> {
        Some(ValueEmpty::Null)
    }

    async fn create<'a>(
        &self,
        diags: &mut Diagnostics,
        planned: ValueAny,
        _config: ValueAny,
        _private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(ValueAny, ValueEmpty)> {
        let planned = as_obj(planned);
        let result = async {
            let ctx = self.shared.require()?;
            self.inner.create(&ctx, &planned).await
        }
        .await;
        match result {
            Ok(mut fresh) => Some((self.applied(&planned, &mut fresh), ValueEmpty::Null)),
            Err(err) => {
                report(diags, &err);
                None
            }
        }
    }

    async fn update<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: ValueAny,
        planned: ValueAny,
        _config: ValueAny,
        _private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(ValueAny, ValueEmpty)> {
        let prior = as_obj(prior);
        let planned = as_obj(planned);
        let result = async {
            let ctx = self.shared.require()?;
            self.inner.update(&ctx, &prior, &planned).await
        }
        .await;
        match result {
            Ok(mut fresh) => Some((self.applied(&planned, &mut fresh), ValueEmpty::Null)),
            Err(err) => {
                // The prior state stays: the next apply plans the same change again.
                report(diags, &err);
                Some((ValueAny::Map(prior), ValueEmpty::Null))
            }
        }
    }

    async fn destroy<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: ValueAny,
        _private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<()> {
        let prior = as_obj(prior);
        let result = async {
            let ctx = self.shared.require()?;
            self.inner.delete(&ctx, &prior).await
        }
        .await;
        match result {
            Ok(()) => Some(()),
            Err(err) => {
                report(diags, &err);
                None
            }
        }
    }

    async fn import<'a>(
        &self,
        diags: &mut Diagnostics,
        id: String,
    ) -> Option<(ValueAny, ValueEmpty)> {
        let result = async {
            let ctx = self.shared.require()?;
            let start = self.inner.import_state(&ctx, &id)?;
            match self.inner.read(&ctx, &start).await? {
                Some(mut fresh) => {
                    schema::normalize(self.inner.def(), None, &mut fresh);
                    Ok(fresh)
                }
                None => bail!("cannot import {id:?}: no such object on the server"),
            }
        }
        .await;
        match result {
            Ok(state) => Some((ValueAny::Map(state), ValueEmpty::Null)),
            Err(err) => {
                report(diags, &err);
                None
            }
        }
    }
}

/// A data source: looks an object up by the attributes the configuration sets.
#[async_trait]
pub trait SlessDataSource: Send + Sync + 'static {
    fn def(&self) -> &Def;
    async fn read(&self, ctx: &Ctx, config: &Obj) -> anyhow::Result<Obj>;
}

/// A [`SlessDataSource`] served as a Terraform data source.
pub struct DataAdapter<D> {
    pub inner: D,
    pub shared: Shared,
}

#[async_trait]
impl<D: SlessDataSource> DataSource for DataAdapter<D> {
    type State<'a> = ValueAny;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        Some(schema::tf_schema(self.inner.def()))
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        config: ValueAny,
        _meta: ValueEmpty,
    ) -> Option<ValueAny> {
        let config = as_obj(config);
        let result = async {
            let ctx = self.shared.require()?;
            let mut config = config.clone();
            if matches!(get(&config, "namespace"), ValueAny::Null)
                && self.inner.def().attr("namespace").is_some()
            {
                config.insert("namespace".into(), string(ctx.namespace.clone()));
            }
            let mut fresh = self.inner.read(&ctx, &config).await?;
            schema::normalize(self.inner.def(), None, &mut fresh);
            Ok::<_, anyhow::Error>(fresh)
        }
        .await;
        match result {
            Ok(state) => Some(ValueAny::Map(state)),
            Err(err) => {
                report(diags, &err);
                None
            }
        }
    }
}
