//! Cron schedules: parsing a cron expression in an IANA time zone and computing its next fire time.
//!
//! The grammar is the one of the API contract: standard 5-field cron (`min hour dom month dow`) or
//! 6-field with seconds first (`*/2 * * * * *`), with names (`MON`, `JAN`), ranges, steps, lists and
//! the nicknames `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly` (`@annually`). Parsing and
//! next-occurrence search are delegated to the `croner` crate; this module pins its options, keeps
//! the accepted grammar to what the contract promises (no 7th "year" field) and turns its errors
//! into messages that name the offending field.
//!
//! # Day of month and day of week
//!
//! As in Vixie cron, when both fields are restricted a day matches if *either* matches
//! (`0 0 13 * FRI` fires on every 13th and on every Friday).
//!
//! # Daylight saving time
//!
//! Schedules are evaluated on the wall clock of their time zone; the policy at the two DST edges
//! is croner's, and the golden tests below pin it:
//!
//! - **Spring forward** (a wall-clock hour does not exist): a job whose time falls in the gap fires
//!   once, at the first real instant after the gap (a daily `30 2 * * *` job in Europe/Berlin fires at
//!   03:00 local on the last Sunday of March). It is not skipped.
//! - **Fall back** (a wall-clock hour happens twice): a job with a fixed time (no wildcard or step in
//!   the second, minute and hour fields) fires once, in the first occurrence of that hour. Interval
//!   jobs (`*/5 * * * *`) keep their rhythm in absolute time and fire in both occurrences, since the
//!   wall-clock minutes really do pass twice.

use std::fmt;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::errors::CronError;
use croner::parser::{CronParser, Seconds, Year};

/// The time zone a schedule uses when the trigger names none.
pub const DEFAULT_TIMEZONE: &str = "UTC";

/// Field names in 6-field order (seconds first), used to say which field is wrong.
const FIELDS: [(&str, u16, u16); 6] = [
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
];

/// Why a cron expression or time zone was refused. The `Display` text starts with the API field
/// name (`schedule` or `timezone`) so that the API can return it as-is in a `400` body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The cron expression does not parse, or names a value out of range.
    #[error("schedule: {expr:?}: {reason}")]
    Expression {
        /// The expression as given.
        expr: String,
        /// What is wrong with it, naming the field where known.
        reason: String,
    },
    /// The expression parses but matches no instant in the foreseeable future (`0 0 30 2 *`).
    #[error("schedule: {expr:?}: never fires (no matching time)")]
    NeverFires {
        /// The expression as given.
        expr: String,
    },
    /// The time zone is not an IANA time zone name known to this build.
    #[error(
        "timezone: {name:?}: unknown IANA time zone (for example \"UTC\" or \"Europe/Berlin\")"
    )]
    UnknownTimezone {
        /// The time zone name as given.
        name: String,
    },
}

/// A parsed cron schedule bound to a time zone. Cheap to clone.
#[derive(Clone)]
pub struct Schedule {
    expr: String,
    tz: Tz,
    cron: Cron,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("expr", &self.expr)
            .field("timezone", &self.tz.name())
            .finish()
    }
}

/// Two schedules are equal when they were written the same way in the same zone; the scheduler
/// uses this to decide whether an update changed the timing of a trigger.
impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.expr == other.expr && self.tz == other.tz
    }
}

impl Eq for Schedule {}

impl Schedule {
    /// Parses `expr` (5 or 6 fields, or an `@nickname`) in the IANA time zone `timezone`.
    /// An empty `timezone` means [`DEFAULT_TIMEZONE`].
    pub fn parse(expr: &str, timezone: &str) -> Result<Schedule, ScheduleError> {
        let timezone = timezone.trim();
        let timezone = if timezone.is_empty() {
            DEFAULT_TIMEZONE
        } else {
            timezone
        };
        let tz: Tz = timezone
            .parse()
            .map_err(|_| ScheduleError::UnknownTimezone {
                name: timezone.to_string(),
            })?;

        let trimmed = expr.trim();
        let invalid = |reason: String| ScheduleError::Expression {
            expr: expr.to_string(),
            reason,
        };
        if trimmed.is_empty() {
            return Err(invalid("empty expression".to_string()));
        }
        let fields: Vec<&str> = trimmed.split_whitespace().collect();
        if trimmed.starts_with('@') {
            if fields.len() != 1 {
                return Err(invalid("a @nickname stands alone".to_string()));
            }
        } else if !(5..=6).contains(&fields.len()) {
            // croner would read a 7th field as a year; the API contract does not offer it.
            return Err(invalid(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week) \
                 or 6 with seconds first, got {}",
                fields.len()
            )));
        }

        let cron = parser()
            .parse(trimmed)
            .map_err(|err| invalid(diagnose(&fields, &err)))?;
        let schedule = Schedule {
            expr: trimmed.to_string(),
            tz,
            cron,
        };
        // A pattern such as February 30th parses but never matches; refusing it here turns a
        // silently dead trigger into a 400 at creation time.
        if schedule.next_after(Utc::now()).is_none() {
            return Err(ScheduleError::NeverFires {
                expr: expr.to_string(),
            });
        }
        Ok(schedule)
    }

    /// The first fire time strictly after `t` (sub-second parts of `t` count: after 12:00:00.5 an
    /// every-second schedule fires at 12:00:01). `None` if croner finds no match within its search
    /// horizon, which [`Schedule::parse`] already refuses for the present.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.tz);
        match self.cron.find_next_occurrence(&local, false) {
            Ok(next) => Some(next.with_timezone(&Utc)),
            Err(err) => {
                tracing::debug!(expr = %self.expr, tz = %self.tz.name(), %err, "no next cron occurrence");
                None
            }
        }
    }

    /// The expression as written (trimmed).
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The IANA name of the schedule's time zone.
    pub fn timezone(&self) -> &'static str {
        self.tz.name()
    }
}

/// The croner parser with the options this module's grammar needs: seconds optional (a 6th
/// leading field), no year field, Vixie-style OR of day-of-month and day-of-week.
fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .dom_and_dow(false)
        .build()
}

/// Finds which field makes croner refuse the expression by parsing each field alone (the others
/// wildcards), so the message can name it. Falls back to croner's own message.
fn diagnose(fields: &[&str], err: &CronError) -> String {
    // Bring the fields to 6-field order (seconds first); nicknames never reach here with an error.
    let offset = if fields.len() == 5 { 1 } else { 0 };
    for (i, part) in fields.iter().enumerate() {
        let idx = i + offset;
        let Some(&(name, min, max)) = FIELDS.get(idx) else {
            continue;
        };
        let mut probe = ["*"; 6];
        probe[idx] = part;
        if let Err(field_err) = parser().parse(&probe.join(" ")) {
            if let Ok(n) = part.parse::<u32>()
                && (n < u32::from(min) || n > u32::from(max))
            {
                return format!("{name} {n} is out of range {min}-{max}");
            }
            return format!("{name} field {part:?}: {}", croner_message(&field_err));
        }
    }
    croner_message(err)
}

/// croner's message without its variant prefix and trailing period, to read as a clause.
fn croner_message(err: &CronError) -> String {
    let text = match err {
        CronError::ComponentError(m)
        | CronError::InvalidPattern(m)
        | CronError::IllegalCharacters(m) => m.clone(),
        other => other.to_string(),
    };
    text.trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("test timestamp is RFC 3339")
            .with_timezone(&Utc)
    }

    /// The next `n` fire times after `start`, as RFC 3339 UTC strings.
    fn fires(expr: &str, tz: &str, start: &str, n: usize) -> Vec<String> {
        let s = Schedule::parse(expr, tz).expect("schedule parses");
        let mut t = utc(start);
        let mut out = Vec::new();
        for _ in 0..n {
            t = s.next_after(t).expect("schedule has a next fire");
            out.push(t.to_rfc3339());
        }
        out
    }

    #[test]
    fn every_five_minutes() {
        assert_eq!(
            fires("*/5 * * * *", "UTC", "2025-01-01T10:02:13Z", 3),
            [
                "2025-01-01T10:05:00+00:00",
                "2025-01-01T10:10:00+00:00",
                "2025-01-01T10:15:00+00:00"
            ]
        );
        // Exactly on a slot: the next one is strictly after.
        assert_eq!(
            fires("*/5 * * * *", "UTC", "2025-01-01T10:05:00Z", 1),
            ["2025-01-01T10:10:00+00:00"]
        );
    }

    #[test]
    fn seconds_schedule() {
        assert_eq!(
            fires("*/2 * * * * *", "UTC", "2025-01-01T10:00:00Z", 3),
            [
                "2025-01-01T10:00:02+00:00",
                "2025-01-01T10:00:04+00:00",
                "2025-01-01T10:00:06+00:00"
            ]
        );
        assert_eq!(
            fires("15,45 * * * * *", "UTC", "2025-01-01T10:00:20Z", 2),
            ["2025-01-01T10:00:45+00:00", "2025-01-01T10:01:15+00:00"]
        );
    }

    #[test]
    fn sub_second_start_rounds_to_next_whole_second() {
        let s = Schedule::parse("* * * * * *", "UTC").expect("parses");
        let t = utc("2025-01-01T12:00:00.500Z");
        assert_eq!(s.next_after(t), Some(utc("2025-01-01T12:00:01Z")));
    }

    #[test]
    fn day_of_month_and_day_of_week() {
        // Only dom restricted.
        assert_eq!(
            fires("0 9 15 * *", "UTC", "2025-01-20T00:00:00Z", 2),
            ["2025-02-15T09:00:00+00:00", "2025-03-15T09:00:00+00:00"]
        );
        // Only dow restricted, by name and range: Mon-Fri at 08:30.
        assert_eq!(
            fires("30 8 * * MON-FRI", "UTC", "2025-01-03T09:00:00Z", 2),
            // 2025-01-03 is a Friday: next are Monday 6th and Tuesday 7th.
            ["2025-01-06T08:30:00+00:00", "2025-01-07T08:30:00+00:00"]
        );
        // Both restricted: either matches (Vixie cron). June 2025: Fri 6th, 13th (both), ...
        assert_eq!(
            fires("0 0 13 * FRI", "UTC", "2025-06-01T00:00:00Z", 3),
            [
                "2025-06-06T00:00:00+00:00",
                "2025-06-13T00:00:00+00:00",
                "2025-06-20T00:00:00+00:00"
            ]
        );
        // Sunday as 7.
        assert_eq!(
            fires("0 12 * * 7", "UTC", "2025-01-01T00:00:00Z", 1),
            ["2025-01-05T12:00:00+00:00"]
        );
    }

    #[test]
    fn month_names_lists_and_nicknames() {
        assert_eq!(
            fires("0 0 1 JAN,jul *", "UTC", "2025-02-01T00:00:00Z", 2),
            ["2025-07-01T00:00:00+00:00", "2026-01-01T00:00:00+00:00"]
        );
        assert_eq!(
            fires("@hourly", "UTC", "2025-01-01T10:30:00Z", 1),
            ["2025-01-01T11:00:00+00:00"]
        );
        assert_eq!(
            fires("@daily", "UTC", "2025-01-01T10:30:00Z", 1),
            ["2025-01-02T00:00:00+00:00"]
        );
        assert_eq!(
            fires("@weekly", "UTC", "2025-01-01T10:30:00Z", 1),
            ["2025-01-05T00:00:00+00:00"]
        );
        assert_eq!(
            fires("@monthly", "UTC", "2025-01-15T00:00:00Z", 1),
            ["2025-02-01T00:00:00+00:00"]
        );
        assert_eq!(
            fires("@yearly", "UTC", "2025-01-15T00:00:00Z", 1),
            ["2026-01-01T00:00:00+00:00"]
        );
        // Leap day: the next 29 February is years away and still found.
        assert_eq!(
            fires("0 0 29 2 *", "UTC", "2025-03-01T00:00:00Z", 1),
            ["2028-02-29T00:00:00+00:00"]
        );
    }

    #[test]
    fn time_zone_shifts_the_wall_clock() {
        // 09:00 in Berlin is 08:00 UTC in winter and 07:00 UTC in summer.
        assert_eq!(
            fires("0 9 * * *", "Europe/Berlin", "2025-01-10T12:00:00Z", 1),
            ["2025-01-11T08:00:00+00:00"]
        );
        assert_eq!(
            fires("0 9 * * *", "Europe/Berlin", "2025-07-10T12:00:00Z", 1),
            ["2025-07-11T07:00:00+00:00"]
        );
    }

    #[test]
    fn dst_spring_forward_fires_at_end_of_gap() {
        // Berlin, 2025-03-30: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
        // Policy: fire once at the first real instant after the gap (03:00 CEST = 01:00 UTC).
        assert_eq!(
            fires("30 2 * * *", "Europe/Berlin", "2025-03-29T12:00:00Z", 2),
            ["2025-03-30T01:00:00+00:00", "2025-03-31T00:30:00+00:00"]
        );
        // New York, 2025-03-09: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
        assert_eq!(
            fires("30 2 * * *", "America/New_York", "2025-03-08T12:00:00Z", 2),
            ["2025-03-09T07:00:00+00:00", "2025-03-10T06:30:00+00:00"]
        );
    }

    #[test]
    fn dst_fall_back_fixed_time_fires_once() {
        // Berlin, 2025-10-26: 03:00 CEST goes back to 02:00 CET; 02:30 happens at 00:30 and 01:30 UTC.
        // Policy: a fixed-time job fires once, in the first occurrence.
        assert_eq!(
            fires("30 2 * * *", "Europe/Berlin", "2025-10-25T12:00:00Z", 2),
            ["2025-10-26T00:30:00+00:00", "2025-10-27T01:30:00+00:00"]
        );
        // New York, 2025-11-02: 01:30 happens at 05:30 EDT and 06:30 EST (UTC).
        assert_eq!(
            fires("30 1 * * *", "America/New_York", "2025-11-01T12:00:00Z", 2),
            ["2025-11-02T05:30:00+00:00", "2025-11-03T06:30:00+00:00"]
        );
        // Starting inside the repeated hour, after the first 02:30, does not fire it again.
        assert_eq!(
            fires("30 2 * * *", "Europe/Berlin", "2025-10-26T00:45:00Z", 1),
            ["2025-10-27T01:30:00+00:00"]
        );
    }

    #[test]
    fn dst_fall_back_interval_job_keeps_absolute_rhythm() {
        // Every 30 minutes through the repeated hour in Berlin: 00:00..01:30 UTC are
        // 02:00 CEST, 02:30 CEST, 02:00 CET, 02:30 CET. No gap, no double slot.
        assert_eq!(
            fires("*/30 * * * *", "Europe/Berlin", "2025-10-25T23:45:00Z", 5),
            [
                "2025-10-26T00:00:00+00:00",
                "2025-10-26T00:30:00+00:00",
                "2025-10-26T01:00:00+00:00",
                "2025-10-26T01:30:00+00:00",
                "2025-10-26T02:00:00+00:00"
            ]
        );
    }

    #[test]
    fn default_timezone_is_utc() {
        let s = Schedule::parse("0 0 * * *", "").expect("parses");
        assert_eq!(s.timezone(), "UTC");
        let t = Utc
            .with_ymd_and_hms(2025, 1, 1, 5, 0, 0)
            .single()
            .expect("valid");
        assert_eq!(
            s.next_after(t),
            Some(
                Utc.with_ymd_and_hms(2025, 1, 2, 0, 0, 0)
                    .single()
                    .expect("valid")
            )
        );
    }

    fn err(expr: &str, tz: &str) -> String {
        Schedule::parse(expr, tz)
            .expect_err("expression is refused")
            .to_string()
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            err("61 * * * *", "UTC"),
            r#"schedule: "61 * * * *": minute 61 is out of range 0-59"#
        );
        assert_eq!(
            err("0 25 * * *", "UTC"),
            r#"schedule: "0 25 * * *": hour 25 is out of range 0-23"#
        );
        assert_eq!(
            err("0 0 0 * *", "UTC"),
            r#"schedule: "0 0 0 * *": day-of-month 0 is out of range 1-31"#
        );
        assert_eq!(
            err("60 * * * * *", "UTC"),
            r#"schedule: "60 * * * * *": second 60 is out of range 0-59"#
        );
        let msg = err("* * * FOO *", "UTC");
        assert!(
            msg.starts_with(r#"schedule: "* * * FOO *": month field "FOO": "#),
            "{msg}"
        );
        let msg = err("1-70 * * * *", "UTC");
        assert!(
            msg.starts_with(r#"schedule: "1-70 * * * *": minute field "1-70": "#),
            "{msg}"
        );
        assert_eq!(
            err("* * * *", "UTC"),
            r#"schedule: "* * * *": expected 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first, got 4"#
        );
        assert_eq!(
            err("0 0 0 1 1 * 2030", "UTC"),
            r#"schedule: "0 0 0 1 1 * 2030": expected 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first, got 7"#
        );
        assert_eq!(err("", "UTC"), r#"schedule: "": empty expression"#);
        assert!(err("@fortnightly", "UTC").starts_with(r#"schedule: "@fortnightly": "#));
        assert_eq!(
            err("0 0 30 2 *", "UTC"),
            r#"schedule: "0 0 30 2 *": never fires (no matching time)"#
        );
    }

    #[test]
    fn unknown_timezone_is_refused() {
        assert_eq!(
            err("* * * * *", "Mars/Olympus"),
            r#"timezone: "Mars/Olympus": unknown IANA time zone (for example "UTC" or "Europe/Berlin")"#
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// The parser sits on the API's trust boundary: any input either parses into a schedule
        /// whose next fire is strictly later, or is refused with a `schedule:` message.
        #[test]
        fn parse_never_panics_and_next_is_later(
            expr in "[0-9*/,A-Z@a-z -]{0,24}",
            secs in 0i64..4_000_000_000,
        ) {
            let t = Utc.timestamp_opt(secs, 0).single().expect("in range");
            match Schedule::parse(&expr, "Europe/Berlin") {
                Ok(s) => {
                    if let Some(next) = s.next_after(t) {
                        proptest::prop_assert!(next > t);
                    }
                }
                Err(e) => proptest::prop_assert!(e.to_string().starts_with("schedule: ")),
            }
        }

        /// Well-formed numeric schedules always parse and fire on a matching minute.
        #[test]
        fn generated_schedules_match_their_fields(
            minute in 0u32..60, hour in 0u32..24, secs in 0i64..4_000_000_000,
        ) {
            let s = Schedule::parse(&format!("{minute} {hour} * * *"), "UTC").expect("valid");
            let t = Utc.timestamp_opt(secs, 0).single().expect("in range");
            let next = s.next_after(t).expect("daily schedule has a next fire");
            proptest::prop_assert!(next > t && next - t <= chrono::TimeDelta::days(1));
            proptest::prop_assert_eq!(
                (chrono::Timelike::minute(&next), chrono::Timelike::hour(&next)),
                (minute, hour)
            );
        }
    }

    #[test]
    fn equality_is_by_expression_and_zone() {
        let a = Schedule::parse("*/5 * * * *", "UTC").expect("parses");
        let b = Schedule::parse(" */5 * * * * ", "UTC").expect("parses");
        let c = Schedule::parse("*/5 * * * *", "Europe/Berlin").expect("parses");
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
