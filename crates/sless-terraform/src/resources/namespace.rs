//! `sless_namespace` and the `sless_namespace` data source.

use anyhow::{Context, bail};
use async_trait::async_trait;
use tf_provider::value::ValueAny;

use crate::resource::{Ctx, SlessDataSource, SlessResource, is_not_found};
use crate::schema::{Attr, Def, Preset, Ty};
use crate::value::{Obj, bool_of, str_of, string};

pub struct NamespaceResource {
    def: Def,
}

impl Default for NamespaceResource {
    fn default() -> Self {
        NamespaceResource {
            def: Def {
                desc: "A namespace: a tenant's own space for functions, triggers, jobs, secrets and devices.",
                attrs: vec![
                    Attr::computed("id", Ty::Str, "The namespace's name."),
                    Attr::required("name", Ty::Str, "The namespace's name (a DNS label).").force_new(),
                    Attr::with_default(
                        "force_destroy",
                        Ty::Bool,
                        Preset::Bool(false),
                        "Destroy the namespace even when it still holds objects (they go to the server's trash with it, restorable with `sless ns restore`). Without it, destroying a namespace that is not empty fails.",
                    )
                    .local(),
                ],
                blocks: vec![],
            },
        }
    }
}

async fn exists(ctx: &Ctx, name: &str) -> anyhow::Result<bool> {
    let all = ctx
        .client
        .list_namespaces()
        .await
        .context("cannot list namespaces")?;
    Ok(all.iter().any(|n| n.name == name))
}

fn state(name: &str) -> Obj {
    Obj::from([
        ("id".to_string(), string(name)),
        ("name".to_string(), string(name)),
    ])
}

#[async_trait]
impl SlessResource for NamespaceResource {
    fn def(&self) -> &Def {
        &self.def
    }

    async fn read(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<Option<Obj>> {
        let name = str_of(st, "name").context("name must be known")?;
        Ok(exists(ctx, name).await?.then(|| state(name)))
    }

    async fn create(&self, ctx: &Ctx, planned: &Obj) -> anyhow::Result<Obj> {
        let name = str_of(planned, "name").context("name must be known")?;
        ctx.client
            .ensure_namespace(name)
            .await
            .with_context(|| format!("cannot create namespace {name}"))?;
        Ok(state(name))
    }

    async fn update(&self, _ctx: &Ctx, _prior: &Obj, planned: &Obj) -> anyhow::Result<Obj> {
        // Only `force_destroy`, the provider's own setting, can change in place.
        Ok(planned.clone())
    }

    async fn delete(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<()> {
        let name = str_of(st, "name").context("name must be known")?;
        let force = bool_of(st, "force_destroy").unwrap_or(false);
        match ctx.client.delete_namespace(name, force).await {
            Ok(()) => Ok(()),
            Err(err) if is_not_found(&err) => Ok(()),
            Err(err) if err.status() == Some(409) => Err(anyhow::Error::new(err).context(format!(
                "namespace {name} is not empty; set force_destroy = true to delete it with everything in it"
            ))),
            Err(err) => Err(anyhow::Error::new(err).context(format!("cannot delete namespace {name}"))),
        }
    }

    fn import_state(&self, _ctx: &Ctx, id: &str) -> anyhow::Result<Obj> {
        if id.is_empty() || id.contains('/') {
            bail!("import ID {id:?} is not a namespace name");
        }
        Ok(state(id))
    }
}

pub struct NamespaceData {
    def: Def,
}

impl Default for NamespaceData {
    fn default() -> Self {
        NamespaceData {
            def: Def {
                desc: "Looks up a namespace and the functions in it.",
                attrs: vec![
                    Attr::computed("id", Ty::Str, "The namespace's name."),
                    Attr::required("name", Ty::Str, "The namespace's name."),
                    Attr::computed(
                        "functions",
                        Ty::ListStr,
                        "The names of its functions, sorted.",
                    ),
                ],
                blocks: vec![],
            },
        }
    }
}

#[async_trait]
impl SlessDataSource for NamespaceData {
    fn def(&self) -> &Def {
        &self.def
    }

    async fn read(&self, ctx: &Ctx, config: &Obj) -> anyhow::Result<Obj> {
        let name = str_of(config, "name").context("name must be known")?;
        if !exists(ctx, name).await? {
            bail!("namespace {name} does not exist (or this token may not see it)");
        }
        let mut names: Vec<String> = ctx
            .client
            .list_functions(name)
            .await
            .with_context(|| format!("cannot list the functions of {name}"))?
            .into_iter()
            .map(|f| f.name)
            .collect();
        names.sort();
        let mut st = state(name);
        st.insert(
            "functions".into(),
            ValueAny::List(names.into_iter().map(string).collect()),
        );
        Ok(st)
    }
}
