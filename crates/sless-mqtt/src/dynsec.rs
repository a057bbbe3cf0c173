//! The dynamic-security plugin's side: the account file sless writes before each
//! start of mosquitto, and the `$CONTROL/dynamic-security/v1` commands that change
//! accounts while it runs. Both say the same thing about a device:
//!
//! - default access: publish denied, receive denied, subscribe denied (unsubscribe
//!   allowed), so whatever no role grants is refused;
//! - a device `{ns}_{name}` has the role `device:{ns}_{name}`, which allows publishing
//!   to `{ns}/telemetry/{name}` and subscribing to (and receiving from)
//!   `{ns}/commands/{name}`, nothing else;
//! - sless's ingest client reads `+/telemetry/+` and sends to `+/commands/+`; its
//!   control client reaches `$CONTROL/dynamic-security/#` only. Neither is a device.

use serde_json::{Value, json};
use sless_core::device;

use crate::password::PasswordHash;

/// The topic commands are published to, and the one answers come back on.
pub const CONTROL_TOPIC: &str = "$CONTROL/dynamic-security/v1";
pub const RESPONSE_TOPIC: &str = "$CONTROL/dynamic-security/v1/response";

/// The username of sless's ingest client (not a device: no `_` in it).
pub const INGEST_USER: &str = "sless-ingest";
/// The username of sless's control client.
pub const CONTROL_USER: &str = "sless-control";

/// One device's broker account, as sless keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAccount {
    pub namespace: String,
    pub name: String,
    pub password: PasswordHash,
    pub enabled: bool,
}

impl DeviceAccount {
    pub fn username(&self) -> String {
        device::username(&self.namespace, &self.name)
    }
}

fn role_name(username: &str) -> String {
    format!("device:{username}")
}

fn acl(acltype: &str, topic: &str) -> Value {
    json!({"acltype": acltype, "topic": topic, "priority": 0, "allow": true})
}

/// What a device may do: publish its telemetry, subscribe to and receive its commands.
fn device_acls(namespace: &str, name: &str) -> Value {
    let telemetry = device::telemetry_topic(namespace, name);
    let commands = device::commands_topic(namespace, name);
    json!([
        acl("publishClientSend", &telemetry),
        acl("subscribePattern", &commands),
        acl("publishClientReceive", &commands),
    ])
}

fn client(username: &str, password: &PasswordHash, roles: &[String], disabled: bool) -> Value {
    json!({
        "username": username,
        "password": password.hash_b64(),
        "salt": password.salt_b64(),
        "iterations": password.iterations,
        "roles": roles.iter().map(|r| json!({"rolename": r})).collect::<Vec<_>>(),
        "disabled": disabled,
    })
}

/// The whole account file: sless's two clients and every device.
pub fn account_file(
    ingest: &PasswordHash,
    control: &PasswordHash,
    devices: &[DeviceAccount],
) -> Value {
    let mut clients = vec![
        client(INGEST_USER, ingest, &["sless-ingest".to_string()], false),
        client(CONTROL_USER, control, &["sless-control".to_string()], false),
    ];
    let mut roles = vec![
        json!({"rolename": "sless-ingest", "acls": [
            acl("subscribePattern", device::TELEMETRY_FILTER),
            acl("publishClientReceive", device::TELEMETRY_FILTER),
            acl("publishClientSend", "+/commands/+"),
        ]}),
        json!({"rolename": "sless-control", "acls": [
            acl("publishClientSend", "$CONTROL/dynamic-security/#"),
            acl("publishClientReceive", "$CONTROL/dynamic-security/#"),
            acl("subscribePattern", "$CONTROL/dynamic-security/#"),
        ]}),
    ];
    for d in devices {
        let username = d.username();
        let role = role_name(&username);
        clients.push(client(
            &username,
            &d.password,
            std::slice::from_ref(&role),
            !d.enabled,
        ));
        roles.push(json!({"rolename": role, "acls": device_acls(&d.namespace, &d.name)}));
    }
    json!({
        "defaultACLAccess": {
            "publishClientSend": false,
            "publishClientReceive": false,
            "subscribe": false,
            "unsubscribe": true,
        },
        "clients": clients,
        "groups": [],
        "roles": roles,
    })
}

/// The commands that create (or, if it exists, reset) a device's account and role.
/// `createClient` (with its role) of an existing client fails on its own; the
/// password and enabled state are then set by the commands after it, so the list is
/// idempotent. (`addClientRole` is not: the plugin answers "Internal error" when the
/// client has the role already.)
pub fn upsert_device(namespace: &str, name: &str, password: &str, enabled: bool) -> Vec<Value> {
    let username = device::username(namespace, name);
    let role = role_name(&username);
    let mut commands = vec![
        json!({"command": "createRole", "rolename": role, "acls": device_acls(namespace, name)}),
        json!({"command": "createClient", "username": username, "password": password,
               "roles": [{"rolename": role}]}),
        json!({"command": "setClientPassword", "username": username, "password": password}),
    ];
    commands.push(set_enabled(&username, enabled));
    commands
}

/// A new password; the broker disconnects a client connected with the old one.
pub fn set_password(username: &str, password: &str) -> Value {
    json!({"command": "setClientPassword", "username": username, "password": password})
}

/// Refuses (and disconnects) or admits a client again.
pub fn set_enabled(username: &str, enabled: bool) -> Value {
    let command = if enabled {
        "enableClient"
    } else {
        "disableClient"
    };
    json!({"command": command, "username": username})
}

/// Removes a device's client (disconnecting it) and its role.
pub fn delete_device(username: &str) -> Vec<Value> {
    vec![
        json!({"command": "deleteClient", "username": username}),
        json!({"command": "deleteRole", "rolename": role_name(username)}),
    ]
}

/// Whether an error in a response is what an idempotent command list expects
/// (creating what exists, deleting what is gone).
pub fn is_benign(error: &str) -> bool {
    let e = error.to_ascii_lowercase();
    e.contains("already exists") || e.contains("not found")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_file_grants_devices_their_two_topics_only() {
        let pw = PasswordHash::new("x");
        let file = account_file(
            &pw,
            &pw,
            &[DeviceAccount {
                namespace: "team-a".into(),
                name: "t77".into(),
                password: pw.clone(),
                enabled: false,
            }],
        );
        assert_eq!(file["defaultACLAccess"]["publishClientSend"], false);
        assert_eq!(file["defaultACLAccess"]["subscribe"], false);
        let dev = &file["clients"][2];
        assert_eq!(dev["username"], "team-a_t77");
        assert_eq!(dev["disabled"], true);
        assert_eq!(dev["iterations"], 101);
        let role = &file["roles"][2];
        assert_eq!(role["rolename"], "device:team-a_t77");
        let topics: Vec<(String, String)> = role["acls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["acltype"].as_str().unwrap().to_string(),
                    a["topic"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(
            topics,
            [
                ("publishClientSend".into(), "team-a/telemetry/t77".into()),
                ("subscribePattern".into(), "team-a/commands/t77".into()),
                ("publishClientReceive".into(), "team-a/commands/t77".into()),
            ]
        );
    }
}
