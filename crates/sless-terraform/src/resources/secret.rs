//! `sless_secret`: named key/value data, encrypted at rest; values are never read back.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use async_trait::async_trait;
use sless_client::Secret;

use crate::resource::{Ctx, SlessResource, deleted, found, ns_name, object_id};
use crate::schema::{Attr, Def, Ty};
use crate::value::{Obj, map_of, string, string_map};

pub struct SecretResource {
    def: Def,
}

impl Default for SecretResource {
    fn default() -> Self {
        SecretResource {
            def: Def {
                desc: "A secret: key/value data, encrypted at rest, used by functions (`secret_env`) and queue triggers (`url_secret`). The server never returns the values, so the state keeps those Terraform set; a key added or removed outside Terraform shows as a change.",
                attrs: vec![
                    Attr::computed("id", Ty::Str, "`namespace/name`."),
                    Attr::optional_computed(
                        "namespace",
                        Ty::Str,
                        "The namespace; default the provider's.",
                    )
                    .force_new(),
                    Attr::required("name", Ty::Str, "The secret's name (a DNS label).").force_new(),
                    Attr::required("data", Ty::MapStr, "The keys and their values.").sensitive(),
                ],
                blocks: vec![],
            },
        }
    }
}

async fn find(ctx: &Ctx, ns: &str, name: &str) -> anyhow::Result<Option<Secret>> {
    let all = found(
        ctx.client.list_secrets(ns).await,
        format!("cannot list the secrets of {ns}"),
    )?;
    Ok(all.and_then(|all| all.into_iter().find(|s| s.name == name)))
}

fn state(ns: &str, name: &str, data: &BTreeMap<String, String>) -> Obj {
    Obj::from([
        ("id".to_string(), string(format!("{ns}/{name}"))),
        ("namespace".to_string(), string(ns)),
        ("name".to_string(), string(name)),
        ("data".to_string(), string_map(data)),
    ])
}

async fn put(ctx: &Ctx, planned: &Obj) -> anyhow::Result<Obj> {
    let (ns, name) = ns_name(planned)?;
    let data = map_of(planned, "data");
    ctx.client
        .put_secret(ns, name, &data)
        .await
        .with_context(|| format!("cannot write secret {ns}/{name}"))?;
    Ok(state(ns, name, &data))
}

#[async_trait]
impl SlessResource for SecretResource {
    fn def(&self) -> &Def {
        &self.def
    }

    async fn read(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<Option<Obj>> {
        let (ns, name) = ns_name(st)?;
        let Some(secret) = find(ctx, ns, name).await? else {
            return Ok(None);
        };
        // Values Terraform set stay; a key only the server has reads as "" (a diff).
        let known = map_of(st, "data");
        let data = secret
            .keys
            .iter()
            .map(|k| (k.clone(), known.get(k).cloned().unwrap_or_default()))
            .collect();
        Ok(Some(state(ns, name, &data)))
    }

    async fn create(&self, ctx: &Ctx, planned: &Obj) -> anyhow::Result<Obj> {
        let (ns, name) = ns_name(planned)?;
        if find(ctx, ns, name).await?.is_some() {
            bail!(
                "secret {ns}/{name} already exists; import it with terraform import ... {ns}/{name}"
            );
        }
        put(ctx, planned).await
    }

    async fn update(&self, ctx: &Ctx, _prior: &Obj, planned: &Obj) -> anyhow::Result<Obj> {
        put(ctx, planned).await
    }

    async fn delete(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<()> {
        let (ns, name) = ns_name(st)?;
        deleted(
            ctx.client.delete_secret(ns, name).await,
            format!("cannot delete secret {}", object_id(st)),
        )
    }
}
