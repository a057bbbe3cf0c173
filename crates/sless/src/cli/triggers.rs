//! `sless trigger create|ls|status|enable|disable|rm`: extra HTTP routes, cron schedules
//! and queue consumers that call a function.

use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use serde_json::{Map, Value};
use sless_client::{Trigger, TriggerKind};

use super::functions::read_event;
use super::{Ctx, table};

/// Manage triggers: what calls a function besides its own URL.
#[derive(clap::Subcommand, Debug)]
pub enum TriggerCommand {
    /// Create an HTTP route, a cron schedule or a queue consumer that calls a function.
    Create(Box<CreateArgs>),
    /// List the namespace's triggers with their route, schedule or queue, when they fire,
    /// and for queue triggers the connection's state and what happened to the messages.
    #[command(after_help = "Examples:
  sless trigger ls
  sless trigger ls --json | jq '.[] | select(.enabled == false) | .name'")]
    Ls {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one trigger's settings and when it fired last and fires next (queue triggers:
    /// the connection's state, its last error and the delivery counters).
    #[command(
        visible_alias = "get",
        after_help = "Examples:
  sless trigger status nightly
  sless trigger get orders-in
  sless trigger status nightly --json | jq .status.next_fire_at"
    )]
    Status {
        /// Trigger to show.
        name: String,
        /// Print the API's JSON instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Turn triggers back on (a cron schedule fires again, a route answers again).
    #[command(after_help = "Example:\n  sless trigger enable nightly")]
    Enable {
        /// Triggers to enable.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Stop triggers without deleting them: a schedule stops firing, a route answers 404.
    #[command(after_help = "Example:\n  sless trigger disable nightly orders-route")]
    Disable {
        /// Triggers to disable.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Delete triggers (the function stays).
    #[command(after_help = "Example:\n  sless trigger rm nightly orders-route")]
    Rm {
        /// Triggers to delete.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// Create a trigger for a function.
///
/// --http PATH adds the public route /t/{namespace}/PATH (and everything below it) to the
/// function; the handler sees the request as it would over /fn/. --cron EXPR calls the
/// function on a schedule: 5 fields (minute hour day-of-month month day-of-week), or 6 with
/// seconds first; the event is --event with "fired_at" added. --queue URL (or
/// --queue-secret SECRET/KEY) --topic T delivers every message of a broker's queue, topic
/// or subject to the function, acknowledging it only after the function succeeded or the
/// message became a dead letter; the kind comes from the URL's scheme (amqp://, kafka://,
/// mqtt://, nats://) unless --kind says it.
// Each kind's flags conflict with the other kinds rather than `requires` their own: clap
// drops a requirement on an argument that conflicts with one present, as the kinds do.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("trigger_type").required(true).args(["http", "cron", "queue", "queue_secret", "devices"])))]
#[command(after_help = "Examples:
  sless trigger create orders --function shop --http /orders --method GET --method POST
  curl http://127.0.0.1:8080/t/default/orders/42
  sless trigger create nightly --function report --cron '0 3 * * *' --timezone Europe/Berlin
  sless trigger create tick --function ping --cron '*/10 * * * * *' --event '{\"source\": \"tick\"}'
  sless trigger create warm --function api --cron '0 9 * * 1-5' --prewarm 30 --disabled
  sless trigger create orders-in --function process --queue amqp://guest:guest@127.0.0.1:5672/%2f \\
      --topic orders --concurrency 4 --max-attempts 5 --dead-letter-topic orders.dlq
  sless secret set rabbit url=amqp://user:pass@rabbit:5672/%2f
  sless trigger create events --function ingest --queue-secret rabbit/url --topic events
  sless trigger create clicks --function count --queue kafka://127.0.0.1:9092 --topic clicks \\
      --ordering key --concurrency 8 --start-from earliest
  sless trigger create readings --function store --devices 'sensor-*' --ordering key --concurrency 4")]
pub struct CreateArgs {
    /// Trigger name (a DNS label: lowercase letters, digits, '-').
    pub name: String,

    /// Function the trigger calls.
    #[arg(short, long)]
    pub function: String,

    /// Route /t/{namespace}PATH to the function (an HTTP trigger).
    #[arg(long, value_name = "PATH")]
    pub http: Option<String>,

    /// Method the route accepts; repeat or separate with commas (default: all).
    #[arg(
        long = "method",
        value_name = "METHOD",
        conflicts_with = "cron",
        value_delimiter = ','
    )]
    pub methods: Vec<String>,

    /// Call the function on this schedule (a cron trigger).
    #[arg(long, value_name = "EXPR")]
    pub cron: Option<String>,

    /// IANA time zone the schedule is read in (default UTC).
    #[arg(long, value_name = "TZ", conflicts_with = "http")]
    pub timezone: Option<String>,

    /// Event for each call, as JSON text or @FILE (default {}).
    #[arg(long, value_name = "JSON|@FILE", conflicts_with = "http")]
    pub event: Option<String>,

    /// Start an instance this many seconds before each fire, so the call is not a cold start.
    #[arg(long, value_name = "SEC", conflicts_with = "http")]
    pub prewarm: Option<u32>,

    /// Consume this broker (a queue trigger): amqp://, kafka://host:port[,host:port],
    /// mqtt:// (MQTT 3.1.1; add ?version=5 for MQTT 5), nats://; credentials in the URL
    /// are stored as given (see --queue-secret).
    #[arg(long, value_name = "URL", conflicts_with_all = ["http", "cron", "queue_secret"])]
    pub queue: Option<String>,

    /// Call the function with every telemetry message of these devices (a device
    /// trigger): `*`, a device name, or a glob such as `sensor-*`. Needs a server
    /// running its MQTT broker (`sless serve --mqtt-listen`).
    #[arg(long, value_name = "GLOB", conflicts_with_all = ["http", "cron", "queue", "queue_secret", "topic", "kind", "group", "start_from", "dead_letter_topic", "response_topic"])]
    pub devices: Option<String>,

    /// Like --queue, with the URL read from a secret's key (SECRET/KEY) when connecting.
    #[arg(long, value_name = "SECRET/KEY", conflicts_with_all = ["http", "cron"])]
    pub queue_secret: Option<String>,

    /// The broker: amqp, kafka, mqtt or nats (default: from the URL's scheme).
    #[arg(long, value_name = "KIND", conflicts_with_all = ["http", "cron"])]
    pub kind: Option<String>,

    /// Queue (amqp), topic (kafka), topic filter (mqtt) or subject (nats) to consume.
    #[arg(long, value_name = "TOPIC", conflicts_with_all = ["http", "cron"])]
    pub topic: Option<String>,

    /// Consumer group (kafka), session (mqtt), durable consumer (nats) (default
    /// sless-{namespace}-{trigger}).
    #[arg(long, value_name = "GROUP", conflicts_with_all = ["http", "cron"])]
    pub group: Option<String>,

    /// A group that never consumed starts at the latest message (default) or the earliest.
    #[arg(long, value_name = "latest|earliest", conflicts_with_all = ["http", "cron"])]
    pub start_from: Option<String>,

    /// Messages in flight at once (default 1).
    #[arg(long, value_name = "N", conflicts_with_all = ["http", "cron"])]
    pub concurrency: Option<u32>,

    /// `key`: messages with the same key strictly in order, one in flight per key.
    #[arg(long, value_name = "none|key", conflicts_with_all = ["http", "cron"])]
    pub ordering: Option<String>,

    /// Attempts per message before it becomes a dead letter (default 3).
    #[arg(long, value_name = "N", conflicts_with_all = ["http", "cron"])]
    pub max_attempts: Option<u32>,

    /// Also publish dead letters to this topic, with x-sless-* headers.
    #[arg(long, value_name = "TOPIC", conflicts_with_all = ["http", "cron"])]
    pub dead_letter_topic: Option<String>,

    /// Publish the function's return value to this topic after each success.
    #[arg(long, value_name = "TOPIC", conflicts_with_all = ["http", "cron"])]
    pub response_topic: Option<String>,

    /// The event is {"payload": ..., "message": {...}} instead of the payload alone.
    #[arg(long, conflicts_with_all = ["http", "cron"])]
    pub envelope: bool,

    /// Create it switched off; turn it on with `sless trigger enable`.
    #[arg(long)]
    pub disabled: bool,
}

/// The queue kind a URL's scheme names.
fn kind_of_url(url: &str) -> Option<sless_core::QueueKind> {
    let scheme = url.split_once("://")?.0.to_ascii_lowercase();
    sless_core::QueueKind::ALL
        .into_iter()
        .find(|k| k.schemes().contains(&scheme.as_str()))
}

/// Runs `sless trigger ...`.
pub async fn run(ctx: &Ctx, command: TriggerCommand) -> anyhow::Result<ExitCode> {
    let ns = ctx.namespace.as_str();
    match command {
        TriggerCommand::Create(args) => {
            let event = match &args.event {
                Some(data) => Some(read_event(Some(data), "--event")?),
                None => None,
            };
            let body = create_body(&args, event)?;
            let trigger = ctx
                .client
                .create_trigger(ns, &body)
                .await
                .with_context(|| format!("cannot create trigger {ns}/{}", args.name))?;
            println!("{}", describe_created(&trigger, ctx.client.base_url()));
        }
        TriggerCommand::Ls { json } => {
            let triggers = ctx
                .client
                .list_triggers(ns)
                .await
                .with_context(|| format!("cannot list triggers in {ns}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&triggers)?);
            } else {
                print!("{}", triggers_table(&triggers));
            }
        }
        TriggerCommand::Status { name, json } => {
            let trigger = ctx
                .client
                .get_trigger(ns, &name)
                .await
                .with_context(|| format!("cannot read trigger {ns}/{name}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&trigger)?);
            } else {
                print!("{}", summary(&trigger, ctx.client.base_url()));
            }
        }
        TriggerCommand::Enable { names } => set_enabled(ctx, &names, true).await?,
        TriggerCommand::Disable { names } => set_enabled(ctx, &names, false).await?,
        TriggerCommand::Rm { names } => {
            for name in &names {
                ctx.client
                    .delete_trigger(ns, name)
                    .await
                    .with_context(|| format!("cannot delete trigger {ns}/{name}"))?;
                println!("deleted trigger {ns}/{name}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn set_enabled(ctx: &Ctx, names: &[String], enabled: bool) -> anyhow::Result<()> {
    let ns = ctx.namespace.as_str();
    let verb = if enabled { "enable" } else { "disable" };
    for name in names {
        ctx.client
            .patch_trigger(ns, name, &serde_json::json!({ "enabled": enabled }))
            .await
            .with_context(|| format!("cannot {verb} trigger {ns}/{name}"))?;
        println!("{verb}d trigger {ns}/{name}");
    }
    Ok(())
}

/// The `POST .../triggers` body for `args`, checked as far as the client can without the
/// server: names, the number of cron fields, the path's leading `/`.
fn create_body(args: &CreateArgs, event: Option<Value>) -> anyhow::Result<Value> {
    for (what, name) in [("trigger", &args.name), ("function", &args.function)] {
        sless_core::validate_name("name", name)
            .map_err(|e| anyhow!("{what} name {name:?} is invalid: {}", e.message))?;
    }
    let mut body = Map::new();
    body.insert("name".into(), Value::from(args.name.as_str()));
    body.insert("function".into(), Value::from(args.function.as_str()));
    if args.disabled {
        body.insert("enabled".into(), Value::Bool(false));
    }
    if args.queue.is_some() || args.queue_secret.is_some() {
        queue_body(args, event, &mut body)?;
        return Ok(Value::Object(body));
    }
    if let Some(devices) = &args.devices {
        if event.is_some() {
            bail!(
                "--event is for cron triggers; a device trigger's event is the telemetry message (see --envelope)"
            );
        }
        body.insert("type".into(), Value::from("device"));
        body.insert("devices".into(), Value::from(devices.as_str()));
        if args.envelope {
            body.insert("event".into(), Value::from("envelope"));
        }
        delivery_fields(args, &mut body);
        return Ok(Value::Object(body));
    }
    match (&args.http, &args.cron) {
        (Some(path), None) => {
            if !path.starts_with('/') {
                bail!("--http {path:?}: the path must start with '/', e.g. /{path}");
            }
            body.insert("type".into(), Value::from("http"));
            body.insert("path".into(), Value::from(path.as_str()));
            let methods: Vec<Value> = args
                .methods
                .iter()
                .map(|m| m.trim().to_ascii_uppercase())
                .filter(|m| !m.is_empty())
                .map(Value::from)
                .collect();
            if !methods.is_empty() {
                body.insert("methods".into(), Value::Array(methods));
            }
        }
        (None, Some(schedule)) => {
            let fields = schedule.split_whitespace().count();
            if !(fields == 5 || fields == 6) {
                bail!(
                    "--cron {schedule:?} has {fields} field{}; give 5 (minute hour day month weekday) \
                     or 6 (seconds first)",
                    if fields == 1 { "" } else { "s" }
                );
            }
            body.insert("type".into(), Value::from("cron"));
            body.insert("schedule".into(), Value::from(schedule.trim()));
            if let Some(tz) = &args.timezone {
                body.insert("timezone".into(), Value::from(tz.as_str()));
            }
            if let Some(event) = event {
                body.insert("event".into(), event);
            }
            if let Some(prewarm) = args.prewarm {
                body.insert("prewarm_sec".into(), Value::from(prewarm));
            }
        }
        // clap's "trigger_type" group makes exactly one of them present.
        _ => bail!("give exactly one of --http PATH, --cron EXPR or --queue URL"),
    }
    Ok(Value::Object(body))
}

/// The queue trigger's fields of a `POST .../triggers` body.
fn queue_body(
    args: &CreateArgs,
    event: Option<Value>,
    body: &mut Map<String, Value>,
) -> anyhow::Result<()> {
    if event.is_some() {
        bail!(
            "--event is for cron triggers; a queue trigger's event is the message (see --envelope)"
        );
    }
    let Some(topic) = &args.topic else {
        bail!("--topic is required with --queue: the queue, topic or subject to consume");
    };
    let kind = match (&args.kind, &args.queue) {
        (Some(k), _) => k.to_ascii_lowercase(),
        (None, Some(url)) => match kind_of_url(url) {
            Some(k) => k.as_str().to_string(),
            None => bail!(
                "--queue {url:?}: cannot tell the broker from the scheme; use amqp://, kafka://, \
                 mqtt:// or nats://, or give --kind"
            ),
        },
        (None, None) => bail!("--queue-secret needs --kind: amqp, kafka, mqtt or nats"),
    };
    let mut source = Map::new();
    source.insert("kind".into(), Value::from(kind));
    match (&args.queue, &args.queue_secret) {
        (Some(url), _) => {
            source.insert("url".into(), Value::from(url.as_str()));
        }
        (None, Some(r)) => {
            let Some((secret, key)) = r
                .split_once('/')
                .filter(|(s, k)| !s.is_empty() && !k.is_empty())
            else {
                bail!("--queue-secret {r:?}: give SECRET/KEY, e.g. rabbit/url");
            };
            source.insert(
                "url_secret".into(),
                serde_json::json!({"secret": secret, "key": key}),
            );
        }
        // clap's "trigger_type" group makes one of them present.
        (None, None) => bail!("give --queue URL or --queue-secret SECRET/KEY"),
    }
    source.insert("topic".into(), Value::from(topic.as_str()));
    if let Some(group) = &args.group {
        source.insert("group".into(), Value::from(group.as_str()));
    }
    if let Some(start) = &args.start_from {
        source.insert("start_from".into(), Value::from(start.to_ascii_lowercase()));
    }
    body.insert("type".into(), Value::from("queue"));
    body.insert("source".into(), Value::Object(source));
    if args.envelope {
        body.insert("event".into(), Value::from("envelope"));
    }
    for (field, topic) in [
        ("response_topic", &args.response_topic),
        ("dead_letter_topic", &args.dead_letter_topic),
    ] {
        if let Some(t) = topic {
            body.insert(field.into(), Value::from(t.as_str()));
        }
    }
    delivery_fields(args, body);
    Ok(())
}

/// `delivery` from --concurrency, --max-attempts and --ordering (queue and device triggers).
fn delivery_fields(args: &CreateArgs, body: &mut Map<String, Value>) {
    let mut delivery = Map::new();
    if let Some(n) = args.concurrency {
        delivery.insert("concurrency".into(), Value::from(n));
    }
    if let Some(n) = args.max_attempts {
        delivery.insert("max_attempts".into(), Value::from(n));
    }
    if let Some(o) = &args.ordering {
        delivery.insert("ordering".into(), Value::from(o.to_ascii_lowercase()));
    }
    if !delivery.is_empty() {
        body.insert("delivery".into(), Value::Object(delivery));
    }
}

/// The public URL of an HTTP trigger's route.
fn route_url(base: &str, trigger: &Trigger) -> String {
    let path = trigger.path().unwrap_or("/");
    format!(
        "{base}/t/{}{}",
        trigger.namespace,
        path.trim_end_matches('/')
    )
}

/// One line saying what was created, for `sless trigger create`.
fn describe_created(t: &Trigger, base: &str) -> String {
    let state = if t.spec.enabled { "" } else { " (disabled)" };
    let head = format!("created trigger {}/{}{state}", t.namespace, t.name);
    match t.kind() {
        "http" => format!("{head}: {} -> {}", route_url(base, t), t.spec.function),
        "cron" => format!(
            "{head}: {} -> {}, next {}",
            schedule_text(t),
            t.spec.function,
            table::time(t.status.next_fire_at.as_deref())
        ),
        "queue" | "device" => format!("{head}: {} -> {}", target_text(t), t.spec.function),
        other => format!("{head}: {other} -> {}", t.spec.function),
    }
}

/// `url` with the password of its user info masked, for display.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// The STATE cell: a queue trigger's connection (`disabled` when nothing consumes).
fn state_text(t: &Trigger) -> String {
    if t.kind() != "queue" && t.kind() != "device" {
        return "-".to_string();
    }
    match t.status.connection {
        Some(c) => c.as_str().to_string(),
        None if !t.spec.enabled => "disabled".to_string(),
        None => "-".to_string(),
    }
}

/// The COUNTERS cell: what happened to a queue trigger's messages since the server started.
fn counters_text(t: &Trigger) -> String {
    match &t.status.counters {
        Some(c) => format!(
            "ok {} / retry {} / dlq {}",
            c.succeeded, c.retried, c.dead_lettered
        ),
        None => "-".to_string(),
    }
}

/// The cron schedule, with its time zone when it is not UTC.
fn schedule_text(t: &Trigger) -> String {
    let schedule = t.schedule().unwrap_or_default().to_string();
    match t.timezone() {
        Some(tz) if !tz.is_empty() && tz != "UTC" => format!("{schedule} ({tz})"),
        _ => schedule,
    }
}

/// Every method an HTTP trigger can name; a trigger allowing all of them shows no list.
const ALL_METHODS: usize = 7;

/// The SCHEDULE/PATH cell: the route (with its methods when limited) or the schedule.
fn target_text(t: &Trigger) -> String {
    match t.kind() {
        "http" => {
            let path = t.path().unwrap_or_default().to_string();
            if t.methods().is_empty() || t.methods().len() >= ALL_METHODS {
                path
            } else {
                format!("{path} ({})", t.methods().join(","))
            }
        }
        "cron" => schedule_text(t),
        "queue" => {
            let Some(source) = t.source() else {
                return String::new();
            };
            format!("{}:{}", source.kind.as_str(), source.topic)
        }
        "device" => format!("devices:{}", t.devices().unwrap_or("*")),
        _ => String::new(),
    }
}

/// The LAST cell: when it last fired and how that went.
fn last_text(t: &Trigger) -> String {
    let when = table::time(t.status.last_fired_at.as_deref());
    let result = t.status.last_result.as_ref().map(ToString::to_string);
    match result.filter(|r| !r.is_empty()) {
        Some(result) => format!("{when} ({})", table::one_line(&result, 40)),
        None => when,
    }
}

/// The triggers as a table; the STATE and COUNTERS columns are there when a queue
/// trigger is.
fn triggers_table(triggers: &[Trigger]) -> String {
    let queues = triggers
        .iter()
        .any(|t| t.kind() == "queue" || t.kind() == "device");
    let rows: Vec<Vec<String>> = triggers
        .iter()
        .map(|t| {
            let mut row = vec![
                t.name.clone(),
                t.kind().to_string(),
                t.spec.function.clone(),
                if t.spec.enabled { "yes" } else { "no" }.to_string(),
            ];
            if queues {
                row.push(state_text(t));
            }
            row.extend([
                target_text(t),
                table::time(t.status.next_fire_at.as_deref()),
                last_text(t),
            ]);
            if queues {
                row.push(counters_text(t));
            }
            row
        })
        .collect();
    let headers: &[&str] = if queues {
        &[
            "NAME",
            "TYPE",
            "FUNCTION",
            "ENABLED",
            "STATE",
            "SCHEDULE/PATH/QUEUE",
            "NEXT",
            "LAST",
            "COUNTERS",
        ]
    } else {
        &[
            "NAME",
            "TYPE",
            "FUNCTION",
            "ENABLED",
            "SCHEDULE/PATH",
            "NEXT",
            "LAST",
        ]
    };
    table::render(headers, &rows)
}

/// `key: value` lines for `sless trigger status`.
fn summary(t: &Trigger, base: &str) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("name", format!("{}/{}", t.namespace, t.name)),
        ("type", t.kind().to_string()),
        ("function", t.spec.function.clone()),
        (
            "enabled",
            if t.spec.enabled { "yes" } else { "no" }.to_string(),
        ),
    ];
    match t.kind() {
        "http" => {
            rows.push(("url", route_url(base, t)));
            let methods = if t.methods().is_empty() {
                "all".to_string()
            } else {
                t.methods().join(", ")
            };
            rows.push(("methods", methods));
        }
        "cron" => {
            rows.push(("schedule", t.schedule().unwrap_or_default().to_string()));
            rows.push(("timezone", t.timezone().unwrap_or_default().to_string()));
            if let Some(event) = t.event() {
                rows.push(("event", event.to_string()));
            }
            if let Some(prewarm) = t.prewarm_sec().filter(|s| *s > 0) {
                rows.push(("prewarm", format!("{prewarm}s")));
            }
            rows.push(("next fire", table::time(t.status.next_fire_at.as_deref())));
        }
        _ => {
            if let Some(devices) = t.devices() {
                rows.push(("devices", devices.to_string()));
            }
            if let Some(source) = t.source() {
                rows.push((
                    "source",
                    format!("{}:{}", source.kind.as_str(), source.topic),
                ));
                match (&source.url, &source.url_secret) {
                    (Some(url), _) => rows.push(("url", without_password(url))),
                    (None, Some(r)) => {
                        rows.push(("url", format!("from secret {}/{}", r.secret, r.key)))
                    }
                    (None, None) => {}
                }
                rows.push(("group", source.group.clone().unwrap_or_default()));
            }
            if let TriggerKind::Queue {
                event,
                response_topic,
                dead_letter_topic,
                ..
            } = &t.spec.kind
            {
                if *event == sless_core::EventShape::Envelope {
                    rows.push(("event", "envelope".to_string()));
                }
                rows.push(("response to", response_topic.clone().unwrap_or_default()));
                rows.push((
                    "dead letters",
                    dead_letter_topic.clone().unwrap_or_default(),
                ));
            }
            if let Some(d) = t.delivery() {
                rows.push((
                    "delivery",
                    format!(
                        "concurrency {}, ordering {}, {} attempt{}, back-off {}-{} ms",
                        d.concurrency,
                        d.ordering.as_str(),
                        d.max_attempts,
                        if d.max_attempts == 1 { "" } else { "s" },
                        d.backoff_initial_ms,
                        d.backoff_max_ms
                    ),
                ));
            }
            rows.push(("state", state_text(t)));
            rows.push((
                "last error",
                t.status.last_error.clone().unwrap_or_default(),
            ));
            if let Some(c) = &t.status.counters {
                rows.push((
                    "counters",
                    format!(
                        "received {}, succeeded {}, retried {}, failed {}, dead-lettered {}",
                        c.received, c.succeeded, c.retried, c.failed, c.dead_lettered
                    ),
                ));
            }
            if let Some(lag) = t.status.lag {
                rows.push(("lag", lag.to_string()));
            }
        }
    }
    rows.push(("last fired", table::time(t.status.last_fired_at.as_deref())));
    rows.push((
        "last result",
        t.status
            .last_result
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
    ));
    rows.push(("created", t.created_at.clone()));
    rows.push(("updated", t.updated_at.clone()));
    let mut out = String::new();
    // Fields the server did not report are left out rather than shown blank.
    for (key, value) in rows.into_iter().filter(|(_, v)| !v.is_empty()) {
        out.push_str(&format!("{:<14}{value}\n", format!("{key}:")));
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use serde_json::json;
    use sless_client::{TriggerResult, TriggerSpec, TriggerStatus};

    use super::*;

    #[derive(Parser, Debug)]
    struct Harness {
        #[command(subcommand)]
        trigger: TriggerCommand,
    }

    fn parse(argv: &[&str]) -> Result<TriggerCommand, clap::Error> {
        Harness::try_parse_from(std::iter::once("trigger").chain(argv.iter().copied()))
            .map(|h| h.trigger)
    }

    fn create(argv: &[&str]) -> CreateArgs {
        match parse(&[&["create"], argv].concat()).expect("parses") {
            TriggerCommand::Create(args) => *args,
            other => panic!("not create: {other:?}"),
        }
    }

    #[test]
    fn http_triggers_build_their_body() {
        let args = create(&[
            "orders", "-f", "shop", "--http", "/orders", "--method", "get", "--method", "POST,put",
        ]);
        assert_eq!(
            create_body(&args, None).expect("body"),
            json!({"name": "orders", "function": "shop", "type": "http", "path": "/orders",
                   "methods": ["GET", "POST", "PUT"]})
        );
        let args = create(&["all", "--function", "shop", "--http", "/", "--disabled"]);
        assert_eq!(
            create_body(&args, None).expect("body"),
            json!({"name": "all", "function": "shop", "type": "http", "path": "/", "enabled": false})
        );
    }

    #[test]
    fn cron_triggers_build_their_body() {
        let args = create(&[
            "nightly",
            "--function",
            "report",
            "--cron",
            "0 3 * * *",
            "--timezone",
            "Europe/Berlin",
            "--prewarm",
            "30",
            "--event",
            "{\"k\": 1}",
        ]);
        let event = Some(json!({"k": 1}));
        assert_eq!(
            create_body(&args, event).expect("body"),
            json!({"name": "nightly", "function": "report", "type": "cron", "schedule": "0 3 * * *",
                   "timezone": "Europe/Berlin", "prewarm_sec": 30, "event": {"k": 1}})
        );
        let args = create(&["tick", "-f", "ping", "--cron", "*/2 * * * * *"]);
        assert_eq!(
            create_body(&args, None).expect("6 fields are fine")["schedule"],
            "*/2 * * * * *"
        );
    }

    #[test]
    fn device_triggers_build_their_body() {
        let args = create(&[
            "readings",
            "-f",
            "store",
            "--devices",
            "sensor-*",
            "--ordering",
            "key",
            "--concurrency",
            "4",
            "--envelope",
        ]);
        assert_eq!(
            create_body(&args, None).expect("body"),
            json!({"name": "readings", "function": "store", "type": "device",
                   "devices": "sensor-*", "event": "envelope",
                   "delivery": {"ordering": "key", "concurrency": 4}})
        );
        for argv in [
            &["t", "-f", "x", "--devices", "*", "--topic", "t"][..],
            &["t", "-f", "x", "--devices", "*", "--queue", "mqtt://h"],
            &["t", "-f", "x", "--devices", "*", "--cron", "* * * * *"],
        ] {
            let argv = [&["create"], argv].concat();
            assert!(parse(&argv).is_err(), "{argv:?} should not parse");
        }
    }

    #[test]
    fn create_needs_exactly_one_kind_and_its_own_flags() {
        for argv in [
            &["t", "-f", "x"][..],
            &["t", "-f", "x", "--http", "/a", "--cron", "* * * * *"],
            &["t", "-f", "x", "--http", "/a", "--timezone", "UTC"],
            &["t", "-f", "x", "--cron", "* * * * *", "--method", "GET"],
            &["t", "--http", "/a"],
        ] {
            let argv = [&["create"], argv].concat();
            assert!(parse(&argv).is_err(), "{argv:?} should not parse");
        }
    }

    #[test]
    fn create_checks_what_it_can_before_sending() {
        let err =
            create_body(&create(&["t", "-f", "x", "--cron", "* * *"]), None).expect_err("3 fields");
        assert!(err.to_string().contains("has 3 fields"), "{err}");
        let err = create_body(&create(&["t", "-f", "x", "--http", "orders"]), None)
            .expect_err("relative path");
        assert!(err.to_string().contains("must start with '/'"), "{err}");
        let err = create_body(&create(&["Bad_Name", "-f", "x", "--http", "/a"]), None)
            .expect_err("bad name");
        assert!(
            err.to_string()
                .starts_with("trigger name \"Bad_Name\" is invalid"),
            "{err}"
        );
        let err = create_body(&create(&["t", "-f", "My.Fn", "--http", "/a"]), None)
            .expect_err("bad function");
        assert!(err.to_string().starts_with("function name"), "{err}");
    }

    #[test]
    fn other_subcommands_parse() {
        assert!(matches!(
            parse(&["disable", "a", "b"]).expect("parses"),
            TriggerCommand::Disable { names } if names == ["a", "b"]
        ));
        assert!(parse(&["enable"]).is_err(), "enable needs a name");
        assert!(parse(&["rm"]).is_err(), "rm needs a name");
        assert!(matches!(
            parse(&["ls", "--json"]).expect("parses"),
            TriggerCommand::Ls { json: true }
        ));
    }

    fn cron_trigger() -> Trigger {
        Trigger {
            name: "nightly".into(),
            namespace: "default".into(),
            spec: TriggerSpec {
                function: "report".into(),
                enabled: true,
                kind: TriggerKind::Cron {
                    schedule: "0 3 * * *".into(),
                    timezone: "Europe/Berlin".into(),
                    event: json!({}),
                    prewarm_sec: 0,
                },
            },
            status: TriggerStatus {
                next_fire_at: Some("2025-01-02T02:00:00.000Z".into()),
                last_fired_at: Some("2025-01-01T02:00:00Z".into()),
                last_result: Some(TriggerResult::parse("200")),
                ..Default::default()
            },
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    fn http_trigger() -> Trigger {
        Trigger {
            name: "orders".into(),
            namespace: "default".into(),
            spec: TriggerSpec {
                function: "shop".into(),
                enabled: false,
                kind: TriggerKind::Http {
                    path: "/orders".into(),
                    methods: vec!["GET".into(), "POST".into()],
                },
            },
            status: TriggerStatus::default(),
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    #[test]
    fn table_shows_route_or_schedule_and_firing_times() {
        let out = triggers_table(&[cron_trigger(), http_trigger()]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "NAME      TYPE   FUNCTION   ENABLED   SCHEDULE/PATH               NEXT                   LAST",
                "nightly   cron   report     yes       0 3 * * * (Europe/Berlin)   2025-01-02T02:00:00Z   2025-01-01T02:00:00Z (200)",
                "orders    http   shop       no        /orders (GET,POST)          -                      -",
            ]
        );
    }

    fn queue_trigger() -> Trigger {
        let fields = serde_json::from_value(json!({
            "function": "process", "type": "queue",
            "source": {"kind": "amqp", "url": "amqp://guest:secret@rabbit:5672/%2f",
                       "topic": "orders", "group": "sless-default-orders-in"},
            "dead_letter_topic": "orders.dlq",
            "delivery": {"concurrency": 4, "max_attempts": 5}
        }))
        .expect("fields");
        Trigger {
            name: "orders-in".into(),
            namespace: "default".into(),
            spec: TriggerSpec::from_fields(fields).expect("valid"),
            status: TriggerStatus {
                last_fired_at: Some("2025-01-01T02:00:00Z".into()),
                last_result: Some(TriggerResult::parse("ok: status 200")),
                connection: Some(sless_core::ConnectionState::Connected),
                last_error: Some("connection refused".into()),
                counters: Some(sless_core::DeliveryCounters {
                    received: 13,
                    succeeded: 10,
                    retried: 2,
                    failed: 3,
                    dead_lettered: 1,
                }),
                lag: Some(4),
                ..Default::default()
            },
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    #[test]
    fn queue_triggers_build_their_body() {
        let args = create(&[
            "orders-in",
            "-f",
            "process",
            "--queue",
            "amqp://guest:guest@127.0.0.1:5672/%2f",
            "--topic",
            "orders",
            "--concurrency",
            "4",
            "--ordering",
            "key",
            "--max-attempts",
            "5",
            "--dead-letter-topic",
            "orders.dlq",
            "--response-topic",
            "orders.done",
            "--start-from",
            "earliest",
            "--group",
            "g1",
            "--envelope",
        ]);
        assert_eq!(
            create_body(&args, None).expect("body"),
            json!({"name": "orders-in", "function": "process", "type": "queue",
                   "source": {"kind": "amqp", "url": "amqp://guest:guest@127.0.0.1:5672/%2f",
                              "topic": "orders", "group": "g1", "start_from": "earliest"},
                   "event": "envelope", "response_topic": "orders.done",
                   "dead_letter_topic": "orders.dlq",
                   "delivery": {"concurrency": 4, "max_attempts": 5, "ordering": "key"}})
        );
        for (url, kind) in [
            ("kafka://127.0.0.1:9092", "kafka"),
            ("mqtt://127.0.0.1:1883", "mqtt"),
            ("nats://127.0.0.1:4222", "nats"),
        ] {
            let args = create(&["t", "-f", "x", "--queue", url, "--topic", "t"]);
            assert_eq!(
                create_body(&args, None).expect("body")["source"]["kind"],
                kind
            );
        }
        let args = create(&[
            "t",
            "-f",
            "x",
            "--queue-secret",
            "rabbit/url",
            "--kind",
            "amqp",
            "--topic",
            "t",
        ]);
        let body = create_body(&args, None).expect("body");
        assert_eq!(
            body["source"],
            json!({"kind": "amqp", "url_secret": {"secret": "rabbit", "key": "url"}, "topic": "t"})
        );
        assert!(body.get("delivery").is_none(), "server defaults apply");
    }

    #[test]
    fn queue_flags_are_checked_before_sending() {
        for (argv, want) in [
            (
                &["t", "-f", "x", "--queue", "amqp://h"][..],
                "--topic is required",
            ),
            (
                &["t", "-f", "x", "--queue", "redis://h", "--topic", "t"],
                "cannot tell the broker",
            ),
            (
                &[
                    "t",
                    "-f",
                    "x",
                    "--queue-secret",
                    "rabbit",
                    "--kind",
                    "amqp",
                    "--topic",
                    "t",
                ],
                "give SECRET/KEY",
            ),
            (
                &[
                    "t",
                    "-f",
                    "x",
                    "--queue-secret",
                    "rabbit/url",
                    "--topic",
                    "t",
                ],
                "needs --kind",
            ),
        ] {
            let err = create_body(&create(argv), None).expect_err("refused");
            assert!(err.to_string().contains(want), "{argv:?}: {err}");
        }
        for argv in [
            &["t", "-f", "x", "--topic", "t"][..],
            &["t", "-f", "x", "--http", "/a", "--topic", "t"],
            &["t", "-f", "x", "--queue", "amqp://h", "--http", "/a"],
            &[
                "t",
                "-f",
                "x",
                "--queue",
                "amqp://h",
                "--queue-secret",
                "a/b",
            ],
            &["t", "-f", "x", "--cron", "* * * * *", "--concurrency", "2"],
        ] {
            let argv = [&["create"], argv].concat();
            assert!(parse(&argv).is_err(), "{argv:?} should not parse");
        }
    }

    #[test]
    fn queue_triggers_show_their_state_and_counters() {
        let out = triggers_table(&[http_trigger(), queue_trigger()]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "NAME        TYPE    FUNCTION   ENABLED   STATE       SCHEDULE/PATH/QUEUE   NEXT   LAST                                    COUNTERS",
                "orders      http    shop       no        -           /orders (GET,POST)    -      -                                       -",
                "orders-in   queue   process    yes       connected   amqp:orders           -      2025-01-01T02:00:00Z (ok: status 200)   ok 10 / retry 2 / dlq 1",
            ]
        );
        assert_eq!(
            describe_created(&queue_trigger(), "http://h:1"),
            "created trigger default/orders-in: amqp:orders -> process"
        );
        let out = summary(&queue_trigger(), "http://h:1");
        for line in [
            "source:       amqp:orders\n",
            "url:          amqp://guest:***@rabbit:5672/%2f\n",
            "group:        sless-default-orders-in\n",
            "dead letters: orders.dlq\n",
            "delivery:     concurrency 4, ordering none, 5 attempts, back-off 500-60000 ms\n",
            "state:        connected\n",
            "last error:   connection refused\n",
            "counters:     received 13, succeeded 10, retried 2, failed 3, dead-lettered 1\n",
            "lag:          4\n",
        ] {
            assert!(out.contains(line), "{line:?} in\n{out}");
        }
        assert!(!out.contains("secret"), "{out}");
        assert!(
            !out.contains("response to"),
            "unset fields are left out: {out}"
        );
        assert!(matches!(
            parse(&["get", "orders-in"]).expect("get is status"),
            TriggerCommand::Status { name, json: false } if name == "orders-in"
        ));
    }

    #[test]
    fn descriptions_name_the_route_or_the_next_fire() {
        assert_eq!(
            describe_created(&http_trigger(), "http://h:1"),
            "created trigger default/orders (disabled): http://h:1/t/default/orders -> shop"
        );
        assert_eq!(
            describe_created(&cron_trigger(), "http://h:1"),
            "created trigger default/nightly: 0 3 * * * (Europe/Berlin) -> report, next 2025-01-02T02:00:00Z"
        );
        let out = summary(&cron_trigger(), "http://h:1");
        assert!(out.starts_with("name:         default/nightly\n"), "{out}");
        assert!(out.contains("timezone:     Europe/Berlin\n"), "{out}");
        assert!(out.contains("last result:  200\n"), "{out}");
        assert!(!out.contains("url:"), "{out}");
        let out = summary(&http_trigger(), "http://h:1");
        assert!(
            out.contains("url:          http://h:1/t/default/orders\n"),
            "{out}"
        );
        assert!(out.contains("methods:      GET, POST\n"), "{out}");
        assert!(out.contains("enabled:      no\n"), "{out}");
    }
}
