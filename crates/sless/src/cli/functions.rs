//! Subcommands on deployed functions: `invoke`, `ls`, `status`, `logs`, `rm`.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use anyhow::Context;
use futures::StreamExt;
use serde_json::Value;
use sless_client::{ClientError, Function};

use super::{Ctx, table};

/// Call a function with a JSON event and print its answer.
///
/// The event is --data (JSON text, or @FILE to read it from a file, or @- / - for stdin);
/// without --data it is read from stdin when stdin is not a terminal, else it is {}.
/// The answer's body goes to stdout; a non-2xx answer goes to stderr and the exit code is 1.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  sless invoke hello
  sless invoke hello --data '{\"name\": \"Ada\"}'
  sless invoke hello --data @event.json
  echo '{\"n\": 3}' | sless invoke fib")]
pub struct InvokeArgs {
    /// Function to call.
    pub name: String,

    /// Event as JSON text, @FILE, or @- for stdin.
    #[arg(short, long, value_name = "JSON|@FILE")]
    pub data: Option<String>,

    /// Queue the call and print its id at once (see `sless calls get ID --wait`); it
    /// runs under the function's delivery policy, retried and dead-lettered.
    #[arg(long = "async")]
    pub r#async: bool,

    /// With --async: POST the function's response here when the call ends.
    #[arg(long, value_name = "URL", requires = "async")]
    pub callback: Option<String>,
}

/// Where the event comes from once the flags are read.
#[derive(Debug, PartialEq, Eq)]
enum EventSource {
    Literal(String),
    File(String),
    Stdin,
    Empty,
}

fn event_source(data: Option<&str>, stdin_is_terminal: bool) -> EventSource {
    match data {
        Some("-" | "@-") => EventSource::Stdin,
        Some(data) => match data.strip_prefix('@') {
            Some(path) => EventSource::File(path.to_string()),
            None => EventSource::Literal(data.to_string()),
        },
        None if stdin_is_terminal => EventSource::Empty,
        None => EventSource::Stdin,
    }
}

/// Reads and parses the event from `--data`/`--event` (JSON, `@FILE`, `@-`/`-` for stdin),
/// or from stdin when not given and stdin is not a terminal; empty input means `{}`.
pub(super) fn read_event(data: Option<&str>, flag: &str) -> anyhow::Result<Value> {
    let (text, origin) = match event_source(data, std::io::stdin().is_terminal()) {
        EventSource::Literal(text) => (text, flag.to_string()),
        EventSource::File(path) => (
            std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read the event file {path}"))?,
            path,
        ),
        EventSource::Stdin => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read the event from stdin")?;
            (text, "stdin".to_string())
        }
        EventSource::Empty => (String::new(), String::new()),
    };
    parse_event(&text, &origin)
}

fn parse_event(text: &str, origin: &str) -> anyhow::Result<Value> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_str(text).with_context(|| format!("the event from {origin} is not valid JSON"))
}

/// Runs `sless invoke`.
pub async fn invoke(ctx: &Ctx, args: InvokeArgs) -> anyhow::Result<ExitCode> {
    let event = read_event(args.data.as_deref(), "--data")?;
    let ns = &ctx.namespace;
    if args.r#async {
        let queued = ctx
            .client
            .invoke_async(ns, &args.name, &event, args.callback.as_deref())
            .await
            .with_context(|| format!("cannot queue a call of {ns}/{}", args.name))?;
        println!("{}", queued.call_id);
        return Ok(ExitCode::SUCCESS);
    }
    let resp = ctx
        .client
        .invoke(ns, &args.name, &event)
        .await
        .with_context(|| format!("cannot invoke {ns}/{}", args.name))?;
    if resp.is_success() {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(&resp.body)?;
        if std::io::stdout().is_terminal() && !resp.body.ends_with(b"\n") {
            stdout.write_all(b"\n")?;
        }
        stdout.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    // The platform's own errors (unknown function, bad token) read better as one line; a
    // handler's error body is shown as it came.
    if is_platform_error(&resp.body) {
        return Err(ClientError::from_response(resp.status, &resp.body))
            .with_context(|| format!("cannot invoke {ns}/{}", args.name));
    }
    let mut stderr = std::io::stderr().lock();
    stderr.write_all(&resp.body)?;
    if !resp.body.ends_with(b"\n") {
        stderr.write_all(b"\n")?;
    }
    writeln!(
        stderr,
        "error: {ns}/{} answered HTTP {}",
        args.name, resp.status
    )?;
    Ok(ExitCode::FAILURE)
}

/// True for the contract's `{"error": {"code", "message"}}` shape (a handler's exception is
/// `{"error": "<text>"}`, a string).
fn is_platform_error(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|v| v["error"]["code"].is_string())
}

/// List the functions of the namespace.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  sless ls
  sless ls -n team-a --json")]
pub struct LsArgs {
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `sless ls`.
pub async fn ls(ctx: &Ctx, args: LsArgs) -> anyhow::Result<ExitCode> {
    let ns = &ctx.namespace;
    let functions = ctx
        .client
        .list_functions(ns)
        .await
        .with_context(|| format!("cannot list functions in {ns}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&functions)?);
    } else {
        print!("{}", functions_table(&functions, |f| ctx.public_url(f)));
    }
    Ok(ExitCode::SUCCESS)
}

fn functions_table(functions: &[Function], url: impl Fn(&Function) -> String) -> String {
    let rows: Vec<Vec<String>> = functions
        .iter()
        .map(|f| {
            let i = f.status.instances;
            let instances = if i.starting > 0 {
                format!("{} (+{} starting)", i.ready, i.starting)
            } else {
                i.ready.to_string()
            };
            vec![
                f.name.clone(),
                f.runtime().to_string(),
                f.status.phase.to_string(),
                f.status.revision.to_string(),
                instances,
                url(f),
            ]
        })
        .collect();
    table::render(
        &["NAME", "RUNTIME", "PHASE", "REVISION", "INSTANCES", "URL"],
        &rows,
    )
}

/// Show a function's spec and status.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  sless status hello
  sless status hello --json | jq .status.phase")]
pub struct StatusArgs {
    /// Function to show.
    pub name: String,

    /// Print the API's JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
}

/// Runs `sless status`.
pub async fn status(ctx: &Ctx, args: StatusArgs) -> anyhow::Result<ExitCode> {
    let ns = &ctx.namespace;
    let f = ctx
        .client
        .get_function(ns, &args.name)
        .await
        .with_context(|| format!("cannot read {ns}/{}", args.name))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&f)?);
    } else {
        print!("{}", summary(&f, &ctx.public_url(&f)));
    }
    Ok(ExitCode::SUCCESS)
}

fn summary(f: &Function, url: &str) -> String {
    let s = &f.status;
    let mut rows = vec![
        ("name", format!("{}/{}", f.namespace, f.name)),
        ("phase", s.phase.to_string()),
        ("revision", s.revision.to_string()),
        ("url", url.to_string()),
        (
            "instances",
            format!(
                "{} ready, {} starting",
                s.instances.ready, s.instances.starting
            ),
        ),
        (
            "code",
            s.code_sha256
                .clone()
                .map(|c| format!("sha256 {c}"))
                .unwrap_or_else(|| "(none uploaded)".into()),
        ),
        (
            "built",
            s.last_built_at.clone().unwrap_or_else(|| "never".into()),
        ),
        ("created", f.created_at.clone()),
        ("updated", f.updated_at.clone()),
    ];
    if let Value::Object(spec) = &f.spec {
        for (key, value) in spec {
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            rows.push((key.as_str(), text));
        }
    }
    let mut out = String::new();
    // Fields an older server does not report are left out rather than shown blank.
    for (key, value) in rows.into_iter().filter(|(_, v)| !v.is_empty()) {
        out.push_str(&format!("{:<18}{value}\n", format!("{key}:")));
    }
    if !s.message.is_empty() {
        out.push_str("message:\n");
        for line in s.message.lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

/// Print a function's build and instance logs, newest last.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  sless logs hello --tail 50
  sless logs hello -f")]
pub struct LogsArgs {
    /// Function whose logs to show.
    pub name: String,

    /// Keep streaming new lines until interrupted.
    #[arg(short, long)]
    pub follow: bool,

    /// Show only the last N lines (at most 100000, the server's bound).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub tail: Option<u32>,
}

/// Runs `sless logs`.
pub async fn logs(ctx: &Ctx, args: LogsArgs) -> anyhow::Result<ExitCode> {
    let ns = &ctx.namespace;
    let context = || format!("cannot read the logs of {ns}/{}", args.name);
    let mut stdout = std::io::stdout();
    if !args.follow {
        let text = ctx
            .client
            .logs(ns, &args.name, args.tail)
            .await
            .with_context(context)?;
        stdout.write_all(text.as_bytes())?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut stream = Box::pin(
        ctx.client
            .follow_logs(ns, &args.name, args.tail)
            .await
            .with_context(context)?,
    );
    while let Some(chunk) = stream.next().await {
        // Flushing per chunk keeps `sless logs -f | grep` live.
        stdout.write_all(&chunk.with_context(context)?)?;
        stdout.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Delete functions (and their triggers).
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  sless rm hello
  sless rm -n team-a api worker")]
pub struct RmArgs {
    /// Functions to delete.
    #[arg(required = true)]
    pub names: Vec<String>,
}

/// Runs `sless rm`.
pub async fn rm(ctx: &Ctx, args: RmArgs) -> anyhow::Result<ExitCode> {
    let ns = &ctx.namespace;
    for name in &args.names {
        ctx.client
            .delete_function(ns, name)
            .await
            .with_context(|| format!("cannot delete {ns}/{name}"))?;
        println!("deleted {ns}/{name}");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use sless_client::{FunctionStatus, InstanceCounts};

    use super::*;

    #[test]
    fn event_sources() {
        assert_eq!(
            event_source(Some("{}"), true),
            EventSource::Literal("{}".into())
        );
        assert_eq!(
            event_source(Some("@ev.json"), true),
            EventSource::File("ev.json".into())
        );
        assert_eq!(event_source(Some("@-"), true), EventSource::Stdin);
        assert_eq!(event_source(Some("-"), true), EventSource::Stdin);
        assert_eq!(event_source(None, false), EventSource::Stdin);
        assert_eq!(event_source(None, true), EventSource::Empty);
    }

    #[test]
    fn events_parse_or_explain() {
        assert_eq!(parse_event("", "stdin").expect("empty is {}"), json!({}));
        assert_eq!(
            parse_event(" [1, 2] ", "stdin").expect("json"),
            json!([1, 2])
        );
        let err = parse_event("{oops", "--data").expect_err("invalid");
        assert_eq!(err.to_string(), "the event from --data is not valid JSON");
    }

    #[test]
    fn event_files_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ev.json");
        std::fs::write(&path, r#"{"n": 3}"#).expect("write");
        let data = format!("@{}", path.display());
        assert_eq!(
            read_event(Some(&data), "--data").expect("read"),
            json!({"n": 3})
        );
        assert!(read_event(Some("@/definitely/not/here.json"), "--data").is_err());
        let err = read_event(Some("{"), "--event").expect_err("invalid");
        assert_eq!(err.to_string(), "the event from --event is not valid JSON");
    }

    #[test]
    fn platform_errors_are_told_from_handler_errors() {
        assert!(is_platform_error(
            br#"{"error":{"code":"not_found","message":"nope"}}"#
        ));
        assert!(!is_platform_error(br#"{"error":"boom"}"#));
        assert!(!is_platform_error(b"plain text"));
    }

    #[test]
    fn table_shows_one_row_per_function() {
        let f = Function {
            name: "hello".into(),
            namespace: "default".into(),
            spec: json!({"runtime": "python3"}),
            status: FunctionStatus {
                phase: "Ready".into(),
                revision: 4,
                url: "http://h/fn/default/hello".into(),
                instances: InstanceCounts {
                    ready: 1,
                    starting: 2,
                },
                ..FunctionStatus::default()
            },
            ..Function::default()
        };
        let out = functions_table(&[f], |f| f.status.url.clone());
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].starts_with("NAME    RUNTIME   PHASE   REVISION   INSTANCES"),
            "{out}"
        );
        assert!(
            lines[1].contains(
                "python3   Ready   4          1 (+2 starting)   http://h/fn/default/hello"
            ),
            "{out}"
        );
    }

    #[test]
    fn summary_includes_spec_and_message() {
        let f = Function {
            name: "hello".into(),
            namespace: "default".into(),
            spec: json!({"memory_mb": 128, "runtime": "nodejs"}),
            status: FunctionStatus {
                phase: "Failed".into(),
                message: "line 1\nline 2".into(),
                ..FunctionStatus::default()
            },
            ..Function::default()
        };
        let out = summary(&f, "http://h/fn/default/hello");
        assert!(
            out.starts_with("name:             default/hello\n"),
            "{out}"
        );
        assert!(out.contains("runtime:          nodejs\n"), "{out}");
        assert!(out.contains("memory_mb:        128\n"), "{out}");
        assert!(out.ends_with("message:\n  line 1\n  line 2\n"), "{out}");
        assert!(
            out.contains("url:              http://h/fn/default/hello\n"),
            "{out}"
        );
        assert!(
            !out.contains("created:"),
            "unknown timestamps are left out: {out}"
        );
    }
}
