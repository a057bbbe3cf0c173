//! `sless invocations`: the record of recent calls, newest first, with filters.

use std::process::ExitCode;

use anyhow::Context;
use chrono::{DateTime, Duration, SecondsFormat, SubsecRound, Utc};
use sless_client::{Invocation, InvocationQuery};

use super::{Ctx, table};

/// Sources an invocation record can name, as the API spells them.
const SOURCES: [&str; 5] = ["http", "invoke", "cron", "queue", "job"];

/// List recent invocations of the namespace's functions, newest first.
///
/// Every filter narrows the list. --since takes an RFC 3339 time or a duration back from
/// now (30s, 10m, 2h, 1d, or combined like 1h30m). The server returns at most --limit records
/// (100 by default, 1000 at most).
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  sless invocations
  sless invocations --function hello --since 10m
  sless invocations --status 500 --limit 20
  sless invocations --source cron --since 2025-01-01T00:00:00Z --json | jq '.[].duration_ms'")]
pub struct InvocationsArgs {
    /// Only calls of this function.
    #[arg(short, long)]
    pub function: Option<String>,

    /// Only calls answered with this HTTP status code.
    #[arg(long, value_name = "CODE", value_parser = clap::value_parser!(u16).range(100..=599))]
    pub status: Option<u16>,

    /// Only calls from this source.
    #[arg(long, value_parser = SOURCES)]
    pub source: Option<String>,

    /// Only calls that started at or after this time (RFC 3339), or this long ago (10m).
    #[arg(long, value_name = "TIME|DURATION", value_parser = parse_since)]
    pub since: Option<Since>,

    /// At most this many records (1 to 1000, the server's bound).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: Option<u32>,

    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The start of the window `--since` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Since {
    /// A fixed time.
    At(DateTime<Utc>),
    /// This long before the command runs.
    Ago(Duration),
}

impl Since {
    /// The time as the API takes it, RFC 3339 in UTC.
    pub(super) fn to_rfc3339(&self, now: DateTime<Utc>) -> String {
        let at = match self {
            Since::At(at) => *at,
            // Whole seconds read better in a URL; rounding down only widens the window.
            Since::Ago(ago) => (now - *ago).trunc_subsecs(0),
        };
        at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
    }
}

/// Parses `--since`: an RFC 3339 time, or a duration made of `<number><unit>` parts with
/// units s, m, h, d (`90s`, `10m`, `1h30m`). `sless telemetry` reads its bounds with it too.
pub(super) fn parse_since(text: &str) -> Result<Since, String> {
    let text = text.trim();
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(Since::At(at.with_timezone(&Utc)));
    }
    parse_duration(text).map(Since::Ago).map_err(|why| {
        format!("{why}; give an RFC 3339 time (2025-01-01T12:00:00Z) or a duration (30s, 10m, 2h, 1d, 1h30m)")
    })
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    if text.is_empty() {
        return Err("empty value".to_string());
    }
    let mut total = Duration::zero();
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let n: i64 = digits
            .parse()
            .map_err(|_| format!("{text:?}: a number must come before {c:?}"))?;
        let part = match c {
            's' => Duration::try_seconds(n),
            'm' => Duration::try_minutes(n),
            'h' => Duration::try_hours(n),
            'd' => Duration::try_days(n),
            _ => return Err(format!("{text:?}: unknown unit {c:?}")),
        }
        .ok_or_else(|| format!("{text:?} is too long"))?;
        total = total
            .checked_add(&part)
            .ok_or_else(|| format!("{text:?} is too long"))?;
        digits.clear();
    }
    if !digits.is_empty() {
        return Err(format!("{text:?}: {digits} needs a unit (s, m, h or d)"));
    }
    Ok(total)
}

/// The API query for the flags, with a relative `--since` taken back from `now`.
fn query(args: &InvocationsArgs, now: DateTime<Utc>) -> InvocationQuery {
    InvocationQuery {
        function: args.function.clone(),
        status: args.status,
        source: args.source.clone(),
        since: args.since.as_ref().map(|s| s.to_rfc3339(now)),
        limit: args.limit,
    }
}

/// Runs `sless invocations`.
pub async fn run(ctx: &Ctx, args: InvocationsArgs) -> anyhow::Result<ExitCode> {
    let ns = &ctx.namespace;
    let records = ctx
        .client
        .list_invocations(ns, &query(&args, Utc::now()))
        .await
        .with_context(|| format!("cannot list invocations in {ns}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&records)?);
    } else {
        print!("{}", invocations_table(&records));
    }
    Ok(ExitCode::SUCCESS)
}

/// A call's duration: tenths of a millisecond for the quick ones, seconds for the slow.
fn duration_text(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.1}ms")
    } else if ms < 1000.0 {
        format!("{ms:.0}ms")
    } else {
        format!("{:.2}s", ms / 1000.0)
    }
}

fn invocations_table(records: &[Invocation]) -> String {
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                table::time_ms(Some(&r.started_at)),
                r.function.clone(),
                r.source.to_string(),
                r.status.to_string(),
                duration_text(r.duration_ms),
                if r.cold_start { "yes" } else { "no" }.to_string(),
                r.request_id.clone(),
                table::one_line(r.error.as_deref().unwrap_or(""), 60),
            ]
        })
        .collect();
    table::render(
        &[
            "STARTED",
            "FUNCTION",
            "SOURCE",
            "STATUS",
            "DURATION",
            "COLD",
            "REQUEST-ID",
            "ERROR",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Harness {
        #[command(flatten)]
        args: InvocationsArgs,
    }

    fn parse(argv: &[&str]) -> Result<InvocationsArgs, clap::Error> {
        Harness::try_parse_from(std::iter::once("invocations").chain(argv.iter().copied()))
            .map(|h| h.args)
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("valid time")
            .with_timezone(&Utc)
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90s"), Ok(Duration::seconds(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::minutes(10)));
        assert_eq!(
            parse_duration("1h30m"),
            Ok(Duration::minutes(90)),
            "parts add up"
        );
        assert_eq!(parse_duration("2d"), Ok(Duration::days(2)));
        assert!(
            parse_duration("10")
                .expect_err("no unit")
                .contains("needs a unit")
        );
        assert!(
            parse_duration("5y")
                .expect_err("bad unit")
                .contains("unknown unit 'y'")
        );
        assert!(
            parse_duration("m")
                .expect_err("no number")
                .contains("a number must come")
        );
        assert!(parse_duration("99999999999999999d").is_err());
    }

    #[test]
    fn since_takes_times_and_durations() {
        let now = at("2025-03-01T12:00:00.987654Z");
        let since = parse_since("10m").expect("duration");
        assert_eq!(since.to_rfc3339(now), "2025-03-01T11:50:00Z");
        // Offsets are turned into UTC, so the query string needs no '+'.
        let since = parse_since("2025-03-01T13:00:00+02:00").expect("time");
        assert_eq!(since, Since::At(at("2025-03-01T11:00:00Z")));
        assert_eq!(since.to_rfc3339(now), "2025-03-01T11:00:00Z");
        let err = parse_since("yesterday").expect_err("neither");
        assert!(err.contains("give an RFC 3339 time"), "{err}");
    }

    #[test]
    fn flags_become_the_query() {
        let args = parse(&[
            "--function",
            "hello",
            "--status",
            "500",
            "--source",
            "cron",
            "--since",
            "1h",
            "--limit",
            "20",
        ])
        .expect("parses");
        let q = query(&args, at("2025-03-01T12:00:00Z"));
        assert_eq!(
            q,
            InvocationQuery {
                function: Some("hello".into()),
                status: Some(500),
                source: Some("cron".into()),
                since: Some("2025-03-01T11:00:00Z".into()),
                limit: Some(20),
            }
        );
        assert_eq!(
            query(&parse(&[]).expect("parses"), Utc::now()),
            InvocationQuery::default()
        );
    }

    #[test]
    fn bad_flags_are_refused() {
        for argv in [
            &["--status", "42"][..],
            &["--status", "ok"],
            &["--source", "email"],
            &["--since", "soon"],
            &["--limit", "0"],
        ] {
            assert!(parse(argv).is_err(), "{argv:?} should not parse");
        }
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(duration_text(0.42), "0.4ms");
        assert_eq!(duration_text(12.6), "13ms");
        assert_eq!(duration_text(1520.0), "1.52s");
    }

    #[test]
    fn table_shows_one_row_per_call() {
        let records = [
            Invocation {
                id: "2".into(),
                function: "hello".into(),
                source: "http".into(),
                request_id: "req-b".into(),
                started_at: "2025-03-01T12:00:01.250Z".into(),
                duration_ms: 1520.0,
                status: 500,
                cold_start: true,
                error: Some("ValueError:\n  bad input".into()),
                ..Invocation::default()
            },
            Invocation {
                id: "1".into(),
                function: "hello".into(),
                source: "cron".into(),
                request_id: "req-a".into(),
                started_at: "2025-03-01T12:00:00Z".into(),
                duration_ms: 12.4,
                status: 200,
                ..Invocation::default()
            },
        ];
        let out = invocations_table(&records);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "STARTED                    FUNCTION   SOURCE   STATUS   DURATION   COLD   REQUEST-ID   ERROR",
                "2025-03-01T12:00:01.250Z   hello      http     500      1.52s      yes    req-b        ValueError: bad input",
                "2025-03-01T12:00:00.000Z   hello      cron     200      12ms       no     req-a",
            ]
        );
    }
}
