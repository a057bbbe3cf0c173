//! `sless device create|ls|get|rotate|enable|disable|rm|send` (things that publish to the
//! server's MQTT broker with credentials of their own) and `sless telemetry` (what they sent).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};
use sless_client::{Device, Telemetry};

use super::invocations::{Since, parse_since};
use super::{Ctx, table};

/// The API's bound on one telemetry page, asked for by every poll of `--follow`.
const MAX_LIMIT: u32 = 1000;

/// How often `sless telemetry --follow` asks for new messages.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);

/// Manage devices: each gets a broker account that may publish to its own telemetry topic
/// and subscribe to its own command topic. The server must run with `--mqtt-listen`.
#[derive(clap::Subcommand, Debug)]
pub enum DeviceCommand {
    /// Create a device and print how it connects, with its password (shown only this once).
    #[command(after_help = "Examples:
  sless serve --mqtt-listen 0.0.0.0:1883 &
  sless device create t77 --label room=kitchen --label floor=1
  mosquitto_pub -h 127.0.0.1 -p 1883 -u default_t77 -P '<password>' \\
      -t default/telemetry/t77 -q 1 -m '{\"temp\": 21}'
  sless telemetry t77")]
    Create {
        /// Device name (a DNS label: lowercase letters, digits, '-').
        name: String,
        /// A label; repeat for several.
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Create it switched off (the broker refuses it); turn it on with `sless device enable`.
        #[arg(long)]
        disabled: bool,
        /// Print the API's JSON (password included) instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// List the namespace's devices: whether they are connected, when they last sent.
    #[command(after_help = "Examples:
  sless device ls
  sless device ls --json | jq -r '.[] | select(.status.online | not) | .name'")]
    Ls {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one device: its state, labels and connection details (not its password).
    #[command(
        visible_alias = "status",
        after_help = "Examples:
  sless device get t77
  sless device get t77 --json | jq .mqtt.publish_topic"
    )]
    Get {
        /// Device to show.
        name: String,
        /// Print the API's JSON instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Give a device a new password (shown only this once); the old one stops working at once.
    #[command(after_help = "Example:\n  sless device rotate t77")]
    Rotate {
        /// Device whose password to replace.
        name: String,
        /// Print the API's JSON (password included) instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Let devices connect again.
    #[command(after_help = "Example:\n  sless device enable t77")]
    Enable {
        /// Devices to enable.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Cut devices off without deleting them: the broker disconnects them and refuses
    /// them until they are enabled.
    #[command(after_help = "Example:\n  sless device disable t77 t78")]
    Disable {
        /// Devices to disable.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Delete devices and their telemetry.
    #[command(after_help = "Example:\n  sless device rm t77")]
    Rm {
        /// Devices to delete.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Publish a JSON command to a device's command topic ({ns}/commands/{name}).
    #[command(after_help = "Examples:
  sless device send t77 --data '{\"led\": \"on\"}'
  sless device send t77 --data @command.json
  mosquitto_sub -h 127.0.0.1 -p 1883 -u default_t77 -P '<password>' -t default/commands/t77 -q 1")]
    Send {
        /// Device to send to.
        name: String,
        /// The command: JSON text, @FILE, or @- for stdin.
        #[arg(short, long, value_name = "JSON|@FILE")]
        data: String,
    },
}

/// Print the telemetry devices sent, oldest first: `<received at> <payload as JSON>` per
/// message (with the device's name between the two when no DEVICE is given).
///
/// Without --since and --until, the newest --limit messages (100 by default, 1000 at
/// most). --since and --until take an RFC 3339 time or a duration back from now (30s, 10m,
/// 2h, 1d, or combined like 1h30m); --since is inclusive, --until exclusive. --follow
/// keeps printing new messages, polling every second, until interrupted.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  sless telemetry t77
  sless telemetry t77 --since 10m -f
  sless telemetry t77 --since 2025-01-01T00:00:00Z --until 2025-01-02T00:00:00Z --limit 1000
  sless telemetry --since 1h        # every device of the namespace
  sless telemetry t77 -f | cut -d' ' -f2- | jq .temp")]
pub struct TelemetryArgs {
    /// Device whose messages to print (default: every device of the namespace).
    pub device: Option<String>,

    /// Only messages received at or after this time (RFC 3339), or this long ago (10m).
    #[arg(long, value_name = "TIME|DURATION", value_parser = parse_since)]
    pub since: Option<Since>,

    /// Only messages received before this time (RFC 3339), or this long ago (10m).
    #[arg(long, value_name = "TIME|DURATION", value_parser = parse_since, conflicts_with = "follow")]
    pub until: Option<Since>,

    /// At most this many messages, the newest (1 to 1000, the server's bound).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: Option<u32>,

    /// Keep printing new messages until interrupted.
    #[arg(short, long)]
    pub follow: bool,
}

/// Runs `sless device ...`.
pub async fn run(ctx: &Ctx, command: DeviceCommand) -> anyhow::Result<ExitCode> {
    let ns = ctx.namespace.as_str();
    match command {
        DeviceCommand::Create {
            name,
            labels,
            disabled,
            json,
        } => {
            sless_core::validate_name("name", &name)
                .map_err(|e| anyhow!("device name {name:?} is invalid: {}", e.message))?;
            let labels = label_map(labels)?;
            let device = ctx
                .client
                .create_device(ns, &name, &labels, !disabled)
                .await
                .with_context(|| format!("cannot create device {ns}/{name}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&device)?);
            } else {
                print!("{}", describe_created(&device));
            }
        }
        DeviceCommand::Ls { json } => {
            let devices = ctx
                .client
                .list_devices(ns)
                .await
                .with_context(|| format!("cannot list devices in {ns}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&devices)?);
            } else {
                print!("{}", devices_table(&devices));
            }
        }
        DeviceCommand::Get { name, json } => {
            let device = ctx
                .client
                .get_device(ns, &name)
                .await
                .with_context(|| format!("cannot read device {ns}/{name}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&device)?);
            } else {
                print!("{}", summary(&device));
            }
        }
        DeviceCommand::Rotate { name, json } => {
            let device = ctx
                .client
                .rotate_device_credentials(ns, &name)
                .await
                .with_context(|| format!("cannot rotate the password of device {ns}/{name}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&device)?);
            } else {
                print!("{}", describe_rotated(&device));
            }
        }
        DeviceCommand::Enable { names } => set_enabled(ctx, &names, true).await?,
        DeviceCommand::Disable { names } => set_enabled(ctx, &names, false).await?,
        DeviceCommand::Rm { names } => {
            for name in &names {
                ctx.client
                    .delete_device(ns, name)
                    .await
                    .with_context(|| format!("cannot delete device {ns}/{name}"))?;
                println!("deleted device {ns}/{name}");
            }
        }
        DeviceCommand::Send { name, data } => {
            let command = read_command(&data)?;
            let sent = ctx
                .client
                .send_device_command(ns, &name, &command)
                .await
                .with_context(|| format!("cannot send a command to device {ns}/{name}"))?;
            println!("sent to {}", sent.topic);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn set_enabled(ctx: &Ctx, names: &[String], enabled: bool) -> anyhow::Result<()> {
    let ns = ctx.namespace.as_str();
    let verb = if enabled { "enable" } else { "disable" };
    for name in names {
        ctx.client
            .patch_device(ns, name, &json!({ "enabled": enabled }))
            .await
            .with_context(|| format!("cannot {verb} device {ns}/{name}"))?;
        println!("{verb}d device {ns}/{name}");
    }
    Ok(())
}

/// Parses one `--label KEY=VALUE`; the value may itself contain `=` or be empty.
fn parse_label(s: &str) -> Result<(String, String), String> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if key.is_empty() {
        return Err(format!("the label's key is empty in {s:?}"));
    }
    Ok((key.to_string(), value.to_string()))
}

/// The `--label` pairs as the API's map; a key given twice is a mistake, not an override.
fn label_map(pairs: Vec<(String, String)>) -> anyhow::Result<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    for (key, value) in pairs {
        if labels.contains_key(&key) {
            bail!("--label {key} is given twice");
        }
        labels.insert(key, value);
    }
    Ok(labels)
}

/// Reads `--data` (JSON text, `@FILE`, `@-` for stdin) and checks it is JSON before
/// anything is sent.
fn read_command(data: &str) -> anyhow::Result<Value> {
    let (text, origin) = match data.strip_prefix('@') {
        Some("-") => {
            let text = std::io::read_to_string(std::io::stdin())
                .context("cannot read the command from stdin")?;
            (text, "stdin".to_string())
        }
        Some(path) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the command file {path}"))?,
            path.to_string(),
        ),
        None => (data.to_string(), "--data".to_string()),
    };
    parse_command(&text, &origin)
}

fn parse_command(text: &str, origin: &str) -> anyhow::Result<Value> {
    if text.trim().is_empty() {
        bail!("the command from {origin} is empty; give JSON, e.g. --data '{{\"led\": \"on\"}}'");
    }
    serde_json::from_str(text).with_context(|| {
        format!("the command from {origin} is not valid JSON (e.g. --data '{{\"led\": \"on\"}}')")
    })
}

/// `yes` or `no`.
fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

/// Labels as `k=v, k2=v2`, in key order.
fn labels_text(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `text` as one shell word: as it is when it needs no quoting, else in single quotes.
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// The `sless device ...` command a hint should name, with `-n` when not in `default`.
fn device_command(d: &Device, verb: &str) -> String {
    let ns = if d.namespace == "default" || d.namespace.is_empty() {
        String::new()
    } else {
        format!(" -n {}", d.namespace)
    };
    format!("sless device {verb} {}{ns}", d.name)
}

/// The connection details, `password` included when the answer has one.
fn connection_rows(d: &Device) -> Vec<(&'static str, String)> {
    let m = &d.mqtt;
    let mut rows = vec![
        ("host", m.host.clone()),
        ("port", m.port.to_string()),
        ("websocket", m.ws_url.clone().unwrap_or_default()),
        ("client id", m.client_id.clone()),
        ("username", m.username.clone()),
    ];
    if let Some(password) = &m.password {
        rows.push(("password", password.clone()));
    }
    rows.push(("publish to", m.publish_topic.clone()));
    rows.push(("commands", m.subscribe_topic.clone()));
    rows
}

/// `key: value` lines, the values aligned; empty values are left out.
fn render_rows(rows: Vec<(&str, String)>) -> String {
    let mut out = String::new();
    for (key, value) in rows.into_iter().filter(|(_, v)| !v.is_empty()) {
        out.push_str(&format!("{:<14}{value}\n", format!("{key}:")));
    }
    out
}

/// The password notice and the `mosquitto_pub` / `mosquitto_sub` lines to try it with.
fn password_and_examples(d: &Device) -> String {
    let m = &d.mqtt;
    let password = m.password.as_deref().unwrap_or("<password>");
    let login = format!(
        "-h {} -p {} -u {} -P {}",
        shell_word(&m.host),
        m.port,
        shell_word(&m.username),
        shell_word(password)
    );
    format!(
        "\nThe password is shown only this once (sless keeps only a hash); \
         `{}` makes a new one.\n\
         \nPublish telemetry:\n  mosquitto_pub {login} -t {} -q 1 -m '{{\"temp\": 21}}'\n\
         Receive commands:\n  mosquitto_sub {login} -t {} -q 1\n",
        device_command(d, "rotate"),
        shell_word(&m.publish_topic),
        shell_word(&m.subscribe_topic),
    )
}

/// What `sless device create` prints: the device, how it connects, its password once.
fn describe_created(d: &Device) -> String {
    let state = if d.enabled {
        String::new()
    } else {
        format!(
            " (disabled: the broker refuses it until `{}`)",
            device_command(d, "enable")
        )
    };
    let mut rows = vec![("labels", labels_text(&d.labels))];
    rows.extend(connection_rows(d));
    format!(
        "created device {}/{}{state}\n{}{}",
        d.namespace,
        d.name,
        render_rows(rows),
        password_and_examples(d)
    )
}

/// What `sless device rotate` prints: the new password once, and that the old one is gone.
fn describe_rotated(d: &Device) -> String {
    format!(
        "new password for device {}/{}; the old one stopped working\n{}{}",
        d.namespace,
        d.name,
        render_rows(connection_rows(d)),
        password_and_examples(d)
    )
}

/// What `sless device get` prints (the API never returns the password here).
fn summary(d: &Device) -> String {
    let mut rows = vec![
        ("name", format!("{}/{}", d.namespace, d.name)),
        ("enabled", yes_no(d.enabled).to_string()),
        ("online", yes_no(d.status.online).to_string()),
        ("last seen", table::time(d.status.last_seen_at.as_deref())),
        ("messages", d.status.messages.to_string()),
        ("labels", labels_text(&d.labels)),
    ];
    rows.extend(connection_rows(d));
    rows.push(("created", d.created_at.clone()));
    rows.push(("updated", d.updated_at.clone()));
    render_rows(rows)
}

fn devices_table(devices: &[Device]) -> String {
    let rows: Vec<Vec<String>> = devices
        .iter()
        .map(|d| {
            vec![
                d.name.clone(),
                yes_no(d.status.online).to_string(),
                table::time(d.status.last_seen_at.as_deref()),
                d.status.messages.to_string(),
                yes_no(d.enabled).to_string(),
                table::one_line(
                    &d.labels
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(","),
                    60,
                ),
            ]
        })
        .collect();
    table::render(
        &[
            "NAME",
            "ONLINE",
            "LAST SEEN",
            "MESSAGES",
            "ENABLED",
            "LABELS",
        ],
        &rows,
    )
}

/// One output line of `sless telemetry`; the device's name only when several may appear.
fn telemetry_line(t: &Telemetry, with_device: bool) -> String {
    let at = table::time_ms(Some(&t.received_at));
    if with_device {
        format!("{at} {} {}", t.device, t.payload)
    } else {
        format!("{at} {}", t.payload)
    }
}

fn received_at(t: &Telemetry) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(t.received_at.trim())
        .ok()
        .map(|at| at.with_timezone(&Utc))
}

/// What `--follow` has printed: the newest time, and the messages at that time, which the
/// next poll (`since` is inclusive) returns again.
#[derive(Debug, Default)]
struct Printed {
    newest: Option<DateTime<Utc>>,
    /// Device and payload of each message printed at `newest`; a list, not a set, so two
    /// equal messages in the same microsecond are both printed once.
    at_newest: Vec<(String, Value)>,
}

impl Printed {
    /// The messages of `batch` (newest first, as the API lists them) not printed yet,
    /// oldest first; they count as printed from now on.
    fn fresh(&mut self, mut batch: Vec<Telemetry>) -> Vec<Telemetry> {
        batch.reverse();
        // Stable, so messages of the same time keep the server's order.
        batch.sort_by_key(received_at);
        let mut seen_again = std::mem::take(&mut self.at_newest);
        let mut fresh = Vec::new();
        for t in batch {
            let Some(at) = received_at(&t) else {
                // A time that does not parse cannot be ordered: print it, remember nothing.
                fresh.push(t);
                continue;
            };
            let key = (t.device.clone(), t.payload.clone());
            match self.newest {
                Some(newest) if at < newest => continue,
                Some(newest) if at == newest => {
                    if let Some(i) = seen_again.iter().position(|k| *k == key) {
                        seen_again.swap_remove(i);
                        self.at_newest.push(key);
                        continue;
                    }
                }
                _ => {
                    self.newest = Some(at);
                    seen_again.clear();
                    self.at_newest.clear();
                }
            }
            self.at_newest.push(key);
            fresh.push(t);
        }
        // Messages at `newest` this batch did not repeat still count as printed (a newer
        // `newest` emptied the list).
        self.at_newest.extend(seen_again);
        fresh
    }

    /// The `since` of the next poll, when anything was printed.
    fn since(&self) -> Option<String> {
        self.newest
            .map(|at| at.to_rfc3339_opts(SecondsFormat::AutoSi, true))
    }
}

/// Runs `sless telemetry`.
pub async fn telemetry(ctx: &Ctx, args: TelemetryArgs) -> anyhow::Result<ExitCode> {
    let ns = ctx.namespace.as_str();
    let now = Utc::now();
    let since = args.since.as_ref().map(|s| s.to_rfc3339(now));
    let until = args.until.as_ref().map(|s| s.to_rfc3339(now));
    let device = args.device.as_deref();
    let fetch = |since: Option<String>, limit: Option<u32>| {
        let until = until.clone();
        async move {
            let result = match device {
                Some(name) => {
                    ctx.client
                        .device_telemetry(ns, name, since.as_deref(), until.as_deref(), limit)
                        .await
                }
                None => {
                    ctx.client
                        .namespace_telemetry(ns, None, since.as_deref(), until.as_deref(), limit)
                        .await
                }
            };
            result.with_context(|| match device {
                Some(name) => format!("cannot read the telemetry of device {ns}/{name}"),
                None => format!("cannot read the telemetry in {ns}"),
            })
        }
    };
    let mut printed = Printed::default();
    let first = fetch(since.clone(), args.limit).await?;
    if !print_lines(&printed.fresh(first), device.is_none())? {
        return Ok(ExitCode::SUCCESS);
    }
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    loop {
        tokio::time::sleep(FOLLOW_INTERVAL).await;
        let batch = fetch(printed.since().or_else(|| since.clone()), Some(MAX_LIMIT)).await?;
        if batch.len() >= MAX_LIMIT as usize {
            eprintln!(
                "warning: {MAX_LIMIT} or more messages arrived within a poll; only the newest \
                 {MAX_LIMIT} are shown, older ones may be missing"
            );
        }
        if !print_lines(&printed.fresh(batch), device.is_none())? {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// Prints the lines and flushes, so `sless telemetry -f | grep` stays live; false when
/// the reader went away (`| head`), which ends the command quietly.
fn print_lines(items: &[Telemetry], with_device: bool) -> anyhow::Result<bool> {
    let mut out = std::io::stdout().lock();
    let written = items
        .iter()
        .try_for_each(|t| writeln!(out, "{}", telemetry_line(t, with_device)))
        .and_then(|()| out.flush());
    match written {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("cannot write to stdout"),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use sless_client::{DeviceMqtt, DeviceStatus};

    use super::*;

    #[derive(Parser, Debug)]
    struct DeviceHarness {
        #[command(subcommand)]
        device: DeviceCommand,
    }

    #[derive(Parser, Debug)]
    struct TelemetryHarness {
        #[command(flatten)]
        args: TelemetryArgs,
    }

    fn parse(argv: &[&str]) -> Result<DeviceCommand, clap::Error> {
        DeviceHarness::try_parse_from(std::iter::once("device").chain(argv.iter().copied()))
            .map(|h| h.device)
    }

    fn parse_telemetry(argv: &[&str]) -> Result<TelemetryArgs, clap::Error> {
        TelemetryHarness::try_parse_from(std::iter::once("telemetry").chain(argv.iter().copied()))
            .map(|h| h.args)
    }

    fn device(password: Option<&str>) -> Device {
        Device {
            name: "t77".into(),
            namespace: "default".into(),
            labels: BTreeMap::from([
                ("room".to_string(), "kitchen".to_string()),
                ("floor".to_string(), "1".to_string()),
            ]),
            enabled: true,
            mqtt: DeviceMqtt {
                host: "127.0.0.1".into(),
                port: 1883,
                ws_url: None,
                client_id: "default-t77".into(),
                username: "default_t77".into(),
                password: password.map(String::from),
                publish_topic: "default/telemetry/t77".into(),
                subscribe_topic: "default/commands/t77".into(),
            },
            status: DeviceStatus {
                online: true,
                last_seen_at: Some("2025-03-01T12:00:00.250Z".into()),
                messages: 42,
            },
            created_at: "2025-03-01T11:00:00Z".into(),
            updated_at: "2025-03-01T11:30:00Z".into(),
        }
    }

    fn message(device: &str, at: &str, payload: Value) -> Telemetry {
        Telemetry {
            device: device.into(),
            received_at: at.into(),
            payload,
        }
    }

    #[test]
    fn labels_are_key_value_pairs() {
        assert_eq!(
            parse_label("room=kitchen"),
            Ok(("room".into(), "kitchen".into()))
        );
        assert_eq!(parse_label("eq=a=b"), Ok(("eq".into(), "a=b".into())));
        assert_eq!(parse_label("empty="), Ok(("empty".into(), String::new())));
        assert!(
            parse_label("kitchen")
                .unwrap_err()
                .contains("expected KEY=VALUE")
        );
        assert!(parse_label("=x").unwrap_err().contains("key is empty"));
        let labels = label_map(vec![("a".into(), "1".into()), ("b".into(), "2".into())])
            .expect("distinct keys");
        assert_eq!(labels.len(), 2);
        let err =
            label_map(vec![("a".into(), "1".into()), ("a".into(), "2".into())]).expect_err("twice");
        assert_eq!(err.to_string(), "--label a is given twice");
    }

    #[test]
    fn commands_parse() {
        let cmd = parse(&[
            "create",
            "t77",
            "--label",
            "room=kitchen",
            "--label",
            "floor=1",
        ])
        .expect("parses");
        assert!(matches!(
            cmd,
            DeviceCommand::Create { ref name, ref labels, disabled: false, json: false }
                if name == "t77" && labels.len() == 2
        ));
        assert!(parse(&["create", "t77", "--label", "nope"]).is_err());
        assert!(matches!(
            parse(&["status", "t77"]).expect("alias"),
            DeviceCommand::Get { .. }
        ));
        assert!(parse(&["disable"]).is_err(), "disable needs a name");
        assert!(parse(&["send", "t77"]).is_err(), "send needs --data");
        assert!(matches!(
            parse(&["send", "t77", "-d", "{}"]).expect("parses"),
            DeviceCommand::Send { ref data, .. } if data == "{}"
        ));
    }

    #[test]
    fn command_data_is_checked_locally() {
        assert_eq!(
            parse_command(r#"{"led": "on"}"#, "--data").expect("json"),
            json!({"led": "on"})
        );
        assert_eq!(parse_command("42", "--data").expect("json"), json!(42));
        let err = parse_command("{led: on}", "--data").expect_err("not json");
        assert!(
            err.to_string()
                .starts_with("the command from --data is not valid JSON"),
            "{err}"
        );
        let err = parse_command(" \n", "--data").expect_err("empty");
        assert!(err.to_string().contains("is empty"), "{err}");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cmd.json");
        std::fs::write(&path, r#"{"reboot": true}"#).expect("write");
        assert_eq!(
            read_command(&format!("@{}", path.display())).expect("file"),
            json!({"reboot": true})
        );
        assert!(read_command("@/definitely/not/here.json").is_err());
    }

    #[test]
    fn telemetry_flags_parse() {
        let args =
            parse_telemetry(&["t77", "--since", "10m", "-f", "--limit", "5"]).expect("parses");
        assert_eq!(args.device.as_deref(), Some("t77"));
        assert_eq!(args.since, Some(Since::Ago(chrono::Duration::minutes(10))));
        assert!(args.follow);
        assert_eq!(args.limit, Some(5));
        let args = parse_telemetry(&["--since", "2025-03-01T13:00:00+02:00"]).expect("parses");
        assert_eq!(args.device, None);
        assert_eq!(
            args.since.expect("since").to_rfc3339(Utc::now()),
            "2025-03-01T11:00:00Z"
        );
        for argv in [
            &["t77", "--since", "soon"][..],
            &["t77", "--limit", "0"],
            &["t77", "--limit", "1001"],
            &["t77", "--until", "1h", "-f"],
        ] {
            assert!(parse_telemetry(argv).is_err(), "{argv:?} should not parse");
        }
    }

    #[test]
    fn created_devices_show_the_password_once_and_how_to_publish() {
        let out = describe_created(&device(Some("s3cr3t-Pw")));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "created device default/t77",
                "labels:       floor=1, room=kitchen",
                "host:         127.0.0.1",
                "port:         1883",
                "client id:    default-t77",
                "username:     default_t77",
                "password:     s3cr3t-Pw",
                "publish to:   default/telemetry/t77",
                "commands:     default/commands/t77",
                "",
                "The password is shown only this once (sless keeps only a hash); `sless device rotate t77` makes a new one.",
                "",
                "Publish telemetry:",
                "  mosquitto_pub -h 127.0.0.1 -p 1883 -u default_t77 -P s3cr3t-Pw -t default/telemetry/t77 -q 1 -m '{\"temp\": 21}'",
                "Receive commands:",
                "  mosquitto_sub -h 127.0.0.1 -p 1883 -u default_t77 -P s3cr3t-Pw -t default/commands/t77 -q 1",
            ]
        );
        let mut off = device(Some("a'b c"));
        off.enabled = false;
        off.namespace = "team-a".into();
        let out = describe_created(&off);
        assert!(
            out.starts_with(
                "created device team-a/t77 (disabled: the broker refuses it until \
                 `sless device enable t77 -n team-a`)\n"
            ),
            "{out}"
        );
        // A password the shell would split or expand is quoted.
        assert!(out.contains(r#"-P 'a'\''b c' -t"#), "{out}");
        assert!(out.contains("`sless device rotate t77 -n team-a`"), "{out}");
    }

    #[test]
    fn rotation_says_the_old_password_is_gone() {
        let out = describe_rotated(&device(Some("new-pw")));
        assert!(
            out.starts_with("new password for device default/t77; the old one stopped working\n"),
            "{out}"
        );
        assert!(out.contains("password:     new-pw\n"), "{out}");
        assert!(out.contains("shown only this once"), "{out}");
    }

    #[test]
    fn details_leave_out_the_password() {
        let mut d = device(None);
        d.mqtt.ws_url = Some("ws://127.0.0.1:8083/mqtt".into());
        let out = summary(&d);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "name:         default/t77",
                "enabled:      yes",
                "online:       yes",
                "last seen:    2025-03-01T12:00:00Z",
                "messages:     42",
                "labels:       floor=1, room=kitchen",
                "host:         127.0.0.1",
                "port:         1883",
                "websocket:    ws://127.0.0.1:8083/mqtt",
                "client id:    default-t77",
                "username:     default_t77",
                "publish to:   default/telemetry/t77",
                "commands:     default/commands/t77",
                "created:      2025-03-01T11:00:00Z",
                "updated:      2025-03-01T11:30:00Z",
            ]
        );
    }

    #[test]
    fn table_shows_one_row_per_device() {
        let mut quiet = device(None);
        quiet.name = "t78".into();
        quiet.enabled = false;
        quiet.labels.clear();
        quiet.status = DeviceStatus::default();
        let out = devices_table(&[device(None), quiet]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "NAME   ONLINE   LAST SEEN              MESSAGES   ENABLED   LABELS",
                "t77    yes      2025-03-01T12:00:00Z   42         yes       floor=1,room=kitchen",
                "t78    no       -                      0          no",
            ]
        );
    }

    #[test]
    fn telemetry_lines_are_time_and_compact_json() {
        let t = message(
            "t77",
            "2025-03-01T12:00:00.123456Z",
            json!({"temp": 21, "unit": "C"}),
        );
        assert_eq!(
            telemetry_line(&t, false),
            r#"2025-03-01T12:00:00.123Z {"temp":21,"unit":"C"}"#
        );
        assert_eq!(
            telemetry_line(&t, true),
            r#"2025-03-01T12:00:00.123Z t77 {"temp":21,"unit":"C"}"#
        );
        let text = message("t77", "2025-03-01T12:00:00Z", json!("plain text"));
        assert_eq!(
            telemetry_line(&text, false),
            r#"2025-03-01T12:00:00.000Z "plain text""#
        );
    }

    #[test]
    fn follow_prints_oldest_first_and_skips_what_it_printed() {
        let mut printed = Printed::default();
        assert_eq!(printed.since(), None);
        // The API lists newest first.
        let first = printed.fresh(vec![
            message("t77", "2025-03-01T12:00:02.5Z", json!({"n": 3})),
            message("t77", "2025-03-01T12:00:02.5Z", json!({"n": 2})),
            message("t77", "2025-03-01T12:00:01Z", json!({"n": 1})),
        ]);
        let payloads = |items: &[Telemetry]| {
            items
                .iter()
                .map(|t| t.payload["n"].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(payloads(&first), [json!(1), json!(2), json!(3)]);
        assert_eq!(printed.since().as_deref(), Some("2025-03-01T12:00:02.500Z"));

        // The next poll (since inclusive) repeats the newest time's messages: skipped,
        // while a new one at that very time is printed.
        let again = printed.fresh(vec![
            message("t77", "2025-03-01T12:00:03Z", json!({"n": 5})),
            message("t77", "2025-03-01T12:00:02.5Z", json!({"n": 4})),
            message("t77", "2025-03-01T12:00:02.5Z", json!({"n": 3})),
            message("t77", "2025-03-01T12:00:02.5Z", json!({"n": 2})),
        ]);
        assert_eq!(payloads(&again), [json!(4), json!(5)]);
        assert_eq!(printed.since().as_deref(), Some("2025-03-01T12:00:03Z"));
        assert!(
            printed
                .fresh(vec![message(
                    "t77",
                    "2025-03-01T12:00:03Z",
                    json!({"n": 5})
                )])
                .is_empty()
        );
        assert!(printed.fresh(Vec::new()).is_empty());
        assert_eq!(
            printed.since().as_deref(),
            Some("2025-03-01T12:00:03Z"),
            "an empty poll keeps the mark"
        );

        // Two equal messages in the same microsecond are two messages; the same payload
        // from another device is another message.
        let mut printed = Printed::default();
        let twins = vec![
            message("t77", "2025-03-01T12:00:00Z", json!(1)),
            message("t77", "2025-03-01T12:00:00Z", json!(1)),
        ];
        assert_eq!(printed.fresh(twins.clone()).len(), 2);
        assert!(printed.fresh(twins.clone()).is_empty());
        let mut three = twins;
        three.insert(0, message("t78", "2025-03-01T12:00:00Z", json!(1)));
        three.insert(0, message("t77", "2025-03-01T12:00:00Z", json!(1)));
        assert_eq!(
            printed
                .fresh(three)
                .iter()
                .map(|t| t.device.as_str())
                .collect::<Vec<_>>(),
            ["t78", "t77"]
        );
    }
}
