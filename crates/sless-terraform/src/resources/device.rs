//! `sless_device`: an IoT device's registration and MQTT credentials.

use anyhow::Context;
use async_trait::async_trait;
use serde_json::json;
use sless_client::Device;
use tf_provider::value::ValueAny;

use crate::resource::{Ctx, SlessResource, deleted, found, ns_name, object_id};
use crate::schema::{Attr, Def, Preset, Ty};
use crate::value::{Obj, bool_of, get, map_of, opt_string, string, string_map};

pub struct DeviceResource {
    def: Def,
}

impl Default for DeviceResource {
    fn default() -> Self {
        DeviceResource {
            def: Def {
                desc: "A device: MQTT credentials for sless's broker (`sless serve --mqtt-listen`), allowed to publish to its telemetry topic and subscribe to its commands topic only.",
                attrs: vec![
                    Attr::computed("id", Ty::Str, "`namespace/name`."),
                    Attr::optional_computed("namespace", Ty::Str, "The namespace; default the provider's.").force_new(),
                    Attr::required("name", Ty::Str, "The device's name (a DNS label).").force_new(),
                    Attr::optional("labels", Ty::MapStr, "Labels."),
                    Attr::with_default("enabled", Ty::Bool, Preset::Bool(true), "A disabled device is disconnected and refused."),
                    Attr::optional("rotation", Ty::Str, "Any value; changing it rotates the password (the old one stops working at once).").local(),
                    Attr::computed("password", Ty::Str, "The MQTT password, known only to the apply that created or rotated it (not after an import).").sensitive(),
                    Attr::computed("username", Ty::Str, "The MQTT username, `{namespace}_{name}`."),
                    Attr::computed("client_id", Ty::Str, "A suggested MQTT client id."),
                    Attr::computed("mqtt_host", Ty::Str, "The broker's host."),
                    Attr::computed("mqtt_port", Ty::Num, "The broker's port."),
                    Attr::computed("ws_url", Ty::Str, "MQTT over WebSocket, when the server listens for it."),
                    Attr::computed("publish_topic", Ty::Str, "`{namespace}/telemetry/{name}`: the one topic it may publish to."),
                    Attr::computed("subscribe_topic", Ty::Str, "`{namespace}/commands/{name}`: the one topic it may subscribe to."),
                ],
                blocks: vec![],
            },
        }
    }
}

fn device_state(d: &Device, password: ValueAny) -> Obj {
    let m = &d.mqtt;
    Obj::from([
        (
            "id".to_string(),
            string(format!("{}/{}", d.namespace, d.name)),
        ),
        ("namespace".to_string(), string(&d.namespace)),
        ("name".to_string(), string(&d.name)),
        ("labels".to_string(), string_map(&d.labels)),
        ("enabled".to_string(), ValueAny::Bool(d.enabled)),
        (
            "password".to_string(),
            m.password.clone().map_or(password, string),
        ),
        ("username".to_string(), string(&m.username)),
        ("client_id".to_string(), string(&m.client_id)),
        ("mqtt_host".to_string(), string(&m.host)),
        ("mqtt_port".to_string(), ValueAny::Number(i64::from(m.port))),
        ("ws_url".to_string(), opt_string(m.ws_url.clone())),
        ("publish_topic".to_string(), string(&m.publish_topic)),
        ("subscribe_topic".to_string(), string(&m.subscribe_topic)),
    ])
}

#[async_trait]
impl SlessResource for DeviceResource {
    fn def(&self) -> &Def {
        &self.def
    }

    fn plan(&self, prior: Option<&Obj>, _config: &Obj, planned: &mut Obj) -> anyhow::Result<()> {
        if let Some(p) = prior
            && get(p, "rotation") != get(planned, "rotation")
        {
            planned.insert("password".into(), ValueAny::Unknown);
        }
        Ok(())
    }

    async fn read(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<Option<Obj>> {
        let (ns, name) = ns_name(st)?;
        // The password is never read back: the state keeps the one it has.
        Ok(found(
            ctx.client.get_device(ns, name).await,
            format!("cannot read device {ns}/{name}"),
        )?
        .map(|d| device_state(&d, get(st, "password").clone())))
    }

    async fn create(&self, ctx: &Ctx, planned: &Obj) -> anyhow::Result<Obj> {
        let (ns, name) = ns_name(planned)?;
        let d = ctx
            .client
            .create_device(
                ns,
                name,
                &map_of(planned, "labels"),
                bool_of(planned, "enabled").unwrap_or(true),
            )
            .await
            .with_context(|| format!("cannot create device {ns}/{name}"))?;
        Ok(device_state(&d, ValueAny::Null))
    }

    async fn update(&self, ctx: &Ctx, prior: &Obj, planned: &Obj) -> anyhow::Result<Obj> {
        let (ns, name) = ns_name(planned)?;
        let mut labels: serde_json::Map<String, serde_json::Value> = map_of(planned, "labels")
            .into_iter()
            .map(|(k, v)| (k, json!(v)))
            .collect();
        for k in map_of(prior, "labels").into_keys() {
            labels.entry(k).or_insert(serde_json::Value::Null);
        }
        let patch =
            json!({"labels": labels, "enabled": bool_of(planned, "enabled").unwrap_or(true)});
        let mut d = ctx
            .client
            .patch_device(ns, name, &patch)
            .await
            .with_context(|| format!("cannot update device {ns}/{name}"))?;
        let mut password = get(prior, "password").clone();
        if get(prior, "rotation") != get(planned, "rotation") {
            d = ctx
                .client
                .rotate_device_credentials(ns, name)
                .await
                .with_context(|| format!("cannot rotate the credentials of device {ns}/{name}"))?;
            password = ValueAny::Null;
        }
        Ok(device_state(&d, password))
    }

    async fn delete(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<()> {
        let (ns, name) = ns_name(st)?;
        deleted(
            ctx.client.delete_device(ns, name).await,
            format!("cannot delete device {}", object_id(st)),
        )
    }
}
