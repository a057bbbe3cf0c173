//! `terraform-provider-sless`: the Terraform provider for sless (plugin protocol 6).
//!
//! It speaks to a sless server only through its REST API (`sless-client`). The protocol,
//! the go-plugin handshake and its TLS certificate are `tf-provider`'s; this crate holds
//! the resources: each is a table of attributes ([`schema::Def`]) plus its API calls
//! ([`resource::SlessResource`]), and the rules every resource shares (defaults, what
//! forces a replacement, null versus `""`, waiting for `Ready`) live once in
//! [`schema`] and [`resource`].

pub mod resource;
pub mod resources;
pub mod schema;
pub mod value;

use std::collections::HashMap;

use async_trait::async_trait;
use tf_provider::schema::Schema;
use tf_provider::value::{ValueAny, ValueEmpty};
use tf_provider::{Diagnostics, DynamicDataSource, DynamicResource, Provider};

use resource::{Adapter, Ctx, DataAdapter, Shared};
use schema::{Attr, Def, Ty};
use value::str_of;

/// The server when neither `endpoint` nor `SLESS_SERVER` says: `sless serve`'s default.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:8080";

fn provider_def() -> Def {
    Def {
        desc: "The sless serverless platform: functions, services, triggers, jobs, secrets and devices.",
        attrs: vec![
            Attr::optional(
                "endpoint",
                Ty::Str,
                "The sless server's URL. Env `SLESS_SERVER`; default `http://127.0.0.1:8080`.",
            ),
            Attr::optional(
                "token",
                Ty::Str,
                "An API token (admin, namespace or JWT). Env `SLESS_TOKEN`.",
            )
            .sensitive(),
            Attr::optional(
                "namespace",
                Ty::Str,
                "The namespace of objects that do not name one. Env `SLESS_NAMESPACE`; default `default`.",
            ),
        ],
        blocks: vec![],
    }
}

/// The provider: its configuration, and the resources and data sources it serves.
pub struct SlessProvider {
    shared: Shared,
    def: Def,
}

impl Default for SlessProvider {
    fn default() -> Self {
        SlessProvider {
            shared: Shared::default(),
            def: provider_def(),
        }
    }
}

fn setting(config: &ValueAny, name: &str, env: &str) -> Option<String> {
    let from_config = match config {
        ValueAny::Map(m) => str_of(m, name).map(str::to_string),
        _ => None,
    };
    from_config
        .or_else(|| std::env::var(env).ok())
        .filter(|s| !s.is_empty())
}

#[async_trait]
impl Provider for SlessProvider {
    type Config<'a> = ValueAny;
    type MetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        Some(schema::tf_schema(&self.def))
    }

    async fn configure<'a>(
        &self,
        diags: &mut Diagnostics,
        _terraform_version: String,
        config: ValueAny,
    ) -> Option<()> {
        let endpoint = setting(&config, "endpoint", "SLESS_SERVER")
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = setting(&config, "token", "SLESS_TOKEN");
        let namespace =
            setting(&config, "namespace", "SLESS_NAMESPACE").unwrap_or_else(|| "default".into());
        match sless_client::Client::new(&endpoint, token) {
            Ok(client) => {
                self.shared.set(Ctx { client, namespace });
                Some(())
            }
            Err(err) => {
                resource::error_at(
                    diags,
                    format!("endpoint {endpoint:?}: {err}"),
                    String::new(),
                    tf_provider::AttributePath::new("endpoint"),
                );
                None
            }
        }
    }

    fn get_resources(
        &self,
        _diags: &mut Diagnostics,
    ) -> Option<HashMap<String, Box<dyn DynamicResource>>> {
        use resources::*;
        fn boxed<R: resource::SlessResource>(
            inner: R,
            shared: &Shared,
        ) -> Box<dyn DynamicResource> {
            Box::new(Adapter {
                inner,
                shared: shared.clone(),
            })
        }
        let s = &self.shared;
        Some(HashMap::from([
            (
                "namespace".to_string(),
                boxed(namespace::NamespaceResource::default(), s),
            ),
            (
                "function".to_string(),
                boxed(function::FunctionResource::new(false), s),
            ),
            (
                "service".to_string(),
                boxed(function::FunctionResource::new(true), s),
            ),
            (
                "trigger".to_string(),
                boxed(trigger::TriggerResource::default(), s),
            ),
            ("job".to_string(), boxed(job::JobResource::default(), s)),
            (
                "secret".to_string(),
                boxed(secret::SecretResource::default(), s),
            ),
            (
                "device".to_string(),
                boxed(device::DeviceResource::default(), s),
            ),
        ]))
    }

    fn get_data_sources(
        &self,
        _diags: &mut Diagnostics,
    ) -> Option<HashMap<String, Box<dyn DynamicDataSource>>> {
        use resources::*;
        let s = &self.shared;
        Some(HashMap::from([
            (
                "function".to_string(),
                Box::new(DataAdapter {
                    inner: function::FunctionData::default(),
                    shared: s.clone(),
                }) as Box<dyn DynamicDataSource>,
            ),
            (
                "namespace".to_string(),
                Box::new(DataAdapter {
                    inner: namespace::NamespaceData::default(),
                    shared: s.clone(),
                }) as Box<dyn DynamicDataSource>,
            ),
        ]))
    }
}

/// The attribute reference of the provider, every resource and every data source, as
/// Markdown (the generated part of `docs/terraform.md`).
pub fn reference_markdown() -> String {
    let provider = SlessProvider::default();
    let mut diags = Diagnostics::default();
    let mut out = schema::reference("Provider `sless`", &provider.def);
    let resources = provider.get_resources(&mut diags).unwrap_or_default();
    let mut names: Vec<&String> = resources.keys().collect();
    names.sort();
    for name in names {
        if let Some(def) = resources::def_of(name, false) {
            out.push('\n');
            out.push_str(&schema::reference(
                &format!("Resource `sless_{name}`"),
                &def,
            ));
        }
    }
    for name in ["function", "namespace"] {
        if let Some(def) = resources::def_of(name, true) {
            out.push('\n');
            out.push_str(&schema::reference(
                &format!("Data source `sless_{name}`"),
                &def,
            ));
        }
    }
    out
}

/// Serves the provider to the Terraform process that started it; returns when Terraform
/// is done with it.
pub async fn serve() -> anyhow::Result<()> {
    // Two rustls crypto providers are linked (tonic's ring, the client's aws-lc-rs), and
    // without a process default rustls refuses to pick one. ring it is: Terraform's
    // client certificate is ECDSA P-521, which ring cannot verify, so Terraform does not
    // present it and go-plugin's mutual TLS falls back to the server certificate alone;
    // with aws-lc-rs the certificate is presented and refused as a CA used as a leaf.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tf_provider::serve("sless", SlessProvider::default()).await
}

#[cfg(test)]
mod tests {
    /// `docs/terraform.md` carries the generated reference between these markers;
    /// `SLESS_UPDATE_DOCS=1 cargo test -p sless-terraform` rewrites it.
    #[test]
    fn the_guide_carries_the_current_attribute_reference() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/terraform.md");
        let doc = std::fs::read_to_string(path).expect("docs/terraform.md");
        let (start, end) = ("<!-- reference:start -->\n", "<!-- reference:end -->");
        let a = doc.find(start).expect("start marker") + start.len();
        let b = doc.find(end).expect("end marker");
        let want = super::reference_markdown();
        if std::env::var_os("SLESS_UPDATE_DOCS").is_some() {
            std::fs::write(path, format!("{}{want}{}", &doc[..a], &doc[b..])).expect("write");
            return;
        }
        assert!(
            doc[a..b] == want,
            "docs/terraform.md's reference is stale: run SLESS_UPDATE_DOCS=1 cargo test -p sless-terraform"
        );
    }
}
