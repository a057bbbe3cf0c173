//! Percentiles, spreads over rounds, the figures a run produces, their targets, and the two
//! output formats (a markdown table for people, `key=value` lines for scripts).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// The `p`th percentile (0..=100) of sorted values by nearest rank, `None` when empty.
pub fn percentile_sorted<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The `p`th percentile of durations, in milliseconds; 0 when there are none.
pub fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    percentile_sorted(&sorted, p).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// The spread of a figure over a run's rounds: on a shared machine one round proves
/// little, so every ratio and CPU figure shows how far its rounds were apart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub min: f64,
    /// The middle value; the mean of the two middle ones for an even count.
    pub median: f64,
    pub max: f64,
    /// How many rounds.
    pub rounds: usize,
}

impl Spread {
    /// The spread of `values`, ignoring any that are not finite (a round that measured
    /// nothing); `None` when none is left.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let (first, last) = (*sorted.first()?, *sorted.last()?);
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Spread {
            min: first,
            median,
            max: last,
            rounds: n,
        })
    }
}

/// The suffixes of the `key=value` lines of a figure's spread.
pub const SPREAD_SUFFIXES: [&str; 3] = ["_min", "_median", "_max"];

/// Which side of the reference a figure should be on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// The figure should be at most the reference.
    AtMost,
    /// The figure should be at least the reference.
    AtLeast,
}

/// What a figure is compared with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reference {
    /// A fixed number.
    Value(f64),
    /// `factor ×` another figure of the same run.
    Figure { factor: f64, key: &'static str },
}

/// A figure's goal, from the issue that asked for the bench.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    pub bound: Bound,
    pub reference: Reference,
}

/// Every figure the bench can produce, in the order it prints them, with its unit and target.
pub const FIGURES: &[(&str, &str, Option<Target>)] = &[
    ("bare_python_ms_p50", "ms", None),
    (
        "deploy_ms_p50",
        "ms",
        Some(Target {
            bound: Bound::AtMost,
            reference: Reference::Figure {
                factor: 3.0,
                key: "bare_python_ms_p50",
            },
        }),
    ),
    (
        "cold_ms_p50_python",
        "ms",
        Some(Target {
            bound: Bound::AtMost,
            reference: Reference::Figure {
                factor: 1.0,
                key: "bare_python_ms_p50",
            },
        }),
    ),
    ("cold_ms_p99_python", "ms", None),
    ("cold_ms_p50_python_hostnet", "ms", None),
    ("cold_ms_p50_node", "ms", None),
    ("warm_rps_direct", "req/s", None),
    ("warm_rps_gateway", "req/s", None),
    (
        "gateway_ratio",
        "",
        Some(Target {
            bound: Bound::AtLeast,
            reference: Reference::Value(0.8),
        }),
    ),
    ("warm_p50_ms_gateway", "ms", None),
    ("warm_p99_ms_gateway", "ms", None),
    ("server_cpu_us_per_req", "µs", None),
    ("instance_cpu_us_per_req", "µs", None),
    ("instance_cpu_us_per_req_direct", "µs", None),
    ("gateway_cpu_ratio", "", None),
    ("gateway_cpu_us_metrics_on", "µs", None),
    ("gateway_cpu_us_metrics_off", "µs", None),
    ("metrics_cpu_ratio", "", None),
    (
        "gateway_vs_plain_node",
        "",
        Some(Target {
            bound: Bound::AtLeast,
            reference: Reference::Value(0.7),
        }),
    ),
    ("cold_ms_p50_go", "ms", None),
    ("deploy_ms_p50_go", "ms", None),
    ("warm_rps_gateway_go", "req/s", None),
    ("go_vs_node_gateway", "", None),
    (
        "python_shim_ratio",
        "",
        Some(Target {
            bound: Bound::AtLeast,
            reference: Reference::Value(5.0),
        }),
    ),
    (
        "scale_ratio",
        "",
        Some(Target {
            bound: Bound::AtLeast,
            reference: Reference::Value(1.6),
        }),
    ),
    (
        "queue_msgs_per_s_amqp",
        "msg/s",
        Some(Target {
            bound: Bound::AtLeast,
            reference: Reference::Value(2000.0),
        }),
    ),
    ("queue_vs_broker_amqp", "", None),
    (
        "queue_msgs_per_s_kafka",
        "msg/s",
        Some(Target {
            bound: Bound::AtLeast,
            reference: Reference::Value(2000.0),
        }),
    ),
    ("queue_vs_broker_kafka", "", None),
    (
        "queue_msgs_per_s_mqtt",
        "msg/s",
        Some(Target {
            bound: Bound::AtLeast,
            reference: Reference::Value(2000.0),
        }),
    ),
    ("queue_vs_broker_mqtt", "", None),
    (
        "queue_msgs_per_s_nats",
        "msg/s",
        Some(Target {
            bound: Bound::AtLeast,
            reference: Reference::Value(2000.0),
        }),
    ),
    ("queue_vs_broker_nats", "", None),
    (
        "async_calls_per_s",
        "calls/s",
        Some(Target {
            bound: Bound::AtLeast,
            reference: Reference::Value(2000.0),
        }),
    ),
    ("async_vs_sync", "", None),
    (
        "telemetry_msgs_per_s",
        "msg/s",
        Some(Target {
            bound: Bound::AtLeast,
            reference: Reference::Value(5000.0),
        }),
    ),
    ("mqtt_broker_msgs_per_s", "msg/s", None),
    ("telemetry_vs_broker", "", None),
    (
        "server_rss_mb_idle",
        "MiB",
        Some(Target {
            bound: Bound::AtMost,
            reference: Reference::Value(40.0),
        }),
    ),
    ("gateway_ratio_pg", "", None),
    (
        "gateway_ratio_pg_no_records",
        "",
        Some(Target {
            bound: Bound::AtLeast,
            reference: Reference::Value(0.9),
        }),
    ),
    ("server_cpu_us_per_req_sqlite", "µs", None),
    ("server_cpu_us_per_req_pg", "µs", None),
    ("postgres_cpu_us_per_req", "µs", None),
    ("warm_p50_ms_gateway_sqlite", "ms", None),
    ("warm_p50_ms_gateway_pg", "ms", None),
    ("deploy_ratio_pg_s3", "", None),
    ("record_write_ms_per_1000_sqlite", "ms", None),
    ("record_write_ms_per_1000_pg", "ms", None),
];

/// True when `key` names a figure the bench knows.
pub fn is_known(key: &str) -> bool {
    FIGURES.iter().any(|(k, _, _)| *k == key)
}

/// The figures of one run, by key, with the spread over rounds of those measured in rounds.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Figures {
    values: BTreeMap<&'static str, f64>,
    spreads: BTreeMap<&'static str, Spread>,
}

/// How a figure fared against its target.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The figure has no target.
    NoTarget,
    /// The target needs a figure this run did not measure.
    Unknown { target: String },
    /// Compared: the target as text (with the reference's value) and whether it was met.
    Checked { target: String, met: bool },
}

impl Figures {
    /// Records a figure; `key` must be one of [`FIGURES`].
    pub fn set(&mut self, key: &'static str, value: f64) {
        debug_assert!(is_known(key), "unknown figure {key}");
        self.values.insert(key, value);
    }

    /// Records a figure measured over the whole run (`value`, which the target is checked
    /// against) and its value in each round, whose spread is printed beside it.
    pub fn set_with_rounds(&mut self, key: &'static str, value: f64, rounds: &[f64]) {
        self.set(key, value);
        if let Some(spread) = Spread::of(rounds) {
            self.spreads.insert(key, spread);
        }
    }

    /// The spread over rounds of a recorded figure, when it was measured in rounds.
    pub fn spread(&self, key: &str) -> Option<Spread> {
        self.spreads.get(key).copied()
    }

    /// A recorded figure.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.values.get(key).copied()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Compares figure `key` (which must be recorded) with its target.
    pub fn verdict(&self, key: &str) -> Verdict {
        let Some((_, unit, Some(target))) = FIGURES.iter().find(|(k, _, _)| *k == key) else {
            return Verdict::NoTarget;
        };
        let Some(value) = self.get(key) else {
            return Verdict::NoTarget;
        };
        let sign = match target.bound {
            Bound::AtMost => "≤",
            Bound::AtLeast => "≥",
        };
        let (limit, text) = match target.reference {
            Reference::Value(v) => (
                Some(v),
                format!("{sign} {}", with_unit(plain_number(v), unit)),
            ),
            Reference::Figure { factor, key: other } => {
                let scaled = if factor == 1.0 {
                    other.to_string()
                } else {
                    format!("{} × {other}", plain_number(factor))
                };
                match self.get(other) {
                    Some(v) => {
                        let limit = factor * v;
                        (
                            Some(limit),
                            format!("{sign} {scaled} ({})", format_value(limit, unit)),
                        )
                    }
                    None => (None, format!("{sign} {scaled}")),
                }
            }
        };
        match limit {
            None => Verdict::Unknown { target: text },
            Some(limit) => Verdict::Checked {
                target: text,
                met: match target.bound {
                    Bound::AtMost => value <= limit,
                    Bound::AtLeast => value >= limit,
                },
            },
        }
    }

    /// The markdown table: figure, value over the whole run, min / median / max over the
    /// rounds, target, ✓/✗.
    pub fn table(&self) -> String {
        let mut out = String::from(
            "| figure | value | rounds: min / median / max | target | ok |\n\
             |---|---:|---:|---|:-:|\n",
        );
        for (key, unit, _) in FIGURES {
            let Some(value) = self.get(key) else { continue };
            let (target, mark) = match self.verdict(key) {
                Verdict::NoTarget => (String::new(), ""),
                Verdict::Unknown { target } => (target, "?"),
                Verdict::Checked { target, met } => (target, if met { "✓" } else { "✗" }),
            };
            let shown = format_value(value, unit);
            let spread = self.spread(key).map_or(String::new(), |s| {
                let n = |v: f64| format_value(v, "");
                format!(
                    "{} / {} / {}{} ({}×)",
                    n(s.min),
                    n(s.median),
                    n(s.max),
                    if unit.is_empty() {
                        String::new()
                    } else {
                        format!(" {unit}")
                    },
                    s.rounds
                )
            });
            // Writing to a String cannot fail.
            let _ = writeln!(out, "| `{key}` | {shown} | {spread} | {target} | {mark} |");
        }
        out
    }

    /// One `key=value` line per figure, in table order, values as plain numbers; a figure
    /// measured in rounds is followed by `key_min`, `key_median` and `key_max`.
    pub fn key_values(&self) -> String {
        let mut out = String::new();
        for (key, _, _) in FIGURES {
            if let Some(value) = self.get(key) {
                let _ = writeln!(out, "{key}={}", plain_number(value));
            }
            if let Some(s) = self.spread(key) {
                for (suffix, v) in SPREAD_SUFFIXES.iter().zip([s.min, s.median, s.max]) {
                    let _ = writeln!(out, "{key}{suffix}={}", plain_number(v));
                }
            }
        }
        out
    }
}

/// A value with its unit, rounded for reading.
fn format_value(value: f64, unit: &str) -> String {
    let number = if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    };
    with_unit(number, unit)
}

fn with_unit(number: String, unit: &str) -> String {
    if unit.is_empty() {
        number
    } else {
        format!("{number} {unit}")
    }
}

/// A value for machines: two decimals at most, no trailing zeros.
fn plain_number(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<u32> = (1..=20).collect();
        assert_eq!(percentile_sorted(&values, 50.0), Some(10));
        assert_eq!(percentile_sorted(&values, 99.0), Some(20));
        assert_eq!(percentile_sorted(&values, 0.0), Some(1));
        assert_eq!(percentile_sorted(&[7u32], 50.0), Some(7));
        assert_eq!(percentile_sorted::<u32>(&[], 50.0), None);
        let durations = [30, 10, 20].map(Duration::from_millis);
        assert_eq!(percentile_ms(&durations, 50.0), 20.0);
        assert_eq!(percentile_ms(&[], 50.0), 0.0);
    }

    #[test]
    fn every_figure_reference_is_a_figure() {
        for (key, _, target) in FIGURES {
            if let Some(Target {
                reference: Reference::Figure { key: other, .. },
                ..
            }) = target
            {
                assert!(is_known(other), "{key} refers to unknown {other}");
            }
        }
    }

    #[test]
    fn verdicts_compare_with_constants_and_other_figures() {
        let mut f = Figures::default();
        f.set("bare_python_ms_p50", 20.0);
        f.set("deploy_ms_p50", 61.0);
        f.set("cold_ms_p50_python", 19.5);
        f.set("gateway_ratio", 0.8);
        f.set("server_rss_mb_idle", 41.0);
        assert_eq!(f.verdict("bare_python_ms_p50"), Verdict::NoTarget);
        assert_eq!(
            f.verdict("deploy_ms_p50"),
            Verdict::Checked {
                target: "≤ 3 × bare_python_ms_p50 (60.0 ms)".into(),
                met: false
            }
        );
        assert_eq!(
            f.verdict("cold_ms_p50_python"),
            Verdict::Checked {
                target: "≤ bare_python_ms_p50 (20.0 ms)".into(),
                met: true
            }
        );
        assert!(matches!(
            f.verdict("gateway_ratio"),
            Verdict::Checked { met: true, .. }
        ));
        assert!(matches!(
            f.verdict("server_rss_mb_idle"),
            Verdict::Checked { met: false, .. }
        ));
    }

    #[test]
    fn a_missing_reference_is_unknown_not_failed() {
        let mut f = Figures::default();
        f.set("deploy_ms_p50", 61.0);
        assert!(matches!(
            f.verdict("deploy_ms_p50"),
            Verdict::Unknown { .. }
        ));
        assert!(f.table().contains("| ? |"), "{}", f.table());
    }

    #[test]
    fn table_and_key_values_list_recorded_figures_in_order() {
        let mut f = Figures::default();
        f.set("scale_ratio", 1.25);
        f.set("bare_python_ms_p50", 19.0);
        f.set("warm_rps_gateway", 4321.5);
        let table = f.table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 5, "{table}");
        assert_eq!(lines[2], "| `bare_python_ms_p50` | 19.0 ms |  |  |  |");
        assert_eq!(lines[3], "| `warm_rps_gateway` | 4322 req/s |  |  |  |");
        assert_eq!(lines[4], "| `scale_ratio` | 1.25 |  | ≥ 1.6 | ✗ |");
        assert_eq!(
            f.key_values(),
            "bare_python_ms_p50=19\nwarm_rps_gateway=4321.5\nscale_ratio=1.25\n"
        );
    }

    #[test]
    fn spreads_have_the_middle_value_as_median() {
        let odd = Spread::of(&[0.5, 0.2, 0.9, 0.3, 0.4]).expect("spread");
        assert_eq!(
            odd,
            Spread {
                min: 0.2,
                median: 0.4,
                max: 0.9,
                rounds: 5
            }
        );
        let even = Spread::of(&[4.0, 1.0, 3.0, 2.0]).expect("spread");
        assert_eq!((even.min, even.median, even.max), (1.0, 2.5, 4.0));
        let one = Spread::of(&[7.0]).expect("spread");
        assert_eq!(
            (one.min, one.median, one.max, one.rounds),
            (7.0, 7.0, 7.0, 1)
        );
        assert_eq!(Spread::of(&[]), None);
        // A round that measured nothing (0/0) does not count.
        let partial = Spread::of(&[f64::NAN, 2.0, f64::INFINITY, 1.0]).expect("spread");
        assert_eq!((partial.median, partial.rounds), (1.5, 2));
        assert_eq!(Spread::of(&[f64::NAN]), None);
    }

    #[test]
    fn spreads_print_beside_their_figure_in_both_formats() {
        let mut f = Figures::default();
        f.set_with_rounds("gateway_ratio", 0.31, &[0.33, 0.29, 0.3]);
        f.set_with_rounds("server_cpu_us_per_req", 41.26, &[40.0, 45.5, 41.0]);
        f.set("warm_rps_gateway", 19043.0);
        let table = f.table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "| figure | value | rounds: min / median / max | target | ok |"
        );
        assert_eq!(
            lines[3],
            "| `gateway_ratio` | 0.31 | 0.29 / 0.30 / 0.33 (3×) | ≥ 0.8 | ✗ |"
        );
        assert_eq!(
            lines[4],
            "| `server_cpu_us_per_req` | 41.3 µs | 40.0 / 41.0 / 45.5 µs (3×) |  |  |"
        );
        assert_eq!(
            f.key_values(),
            "warm_rps_gateway=19043\n\
             gateway_ratio=0.31\ngateway_ratio_min=0.29\ngateway_ratio_median=0.3\n\
             gateway_ratio_max=0.33\n\
             server_cpu_us_per_req=41.26\nserver_cpu_us_per_req_min=40\n\
             server_cpu_us_per_req_median=41\nserver_cpu_us_per_req_max=45.5\n"
        );
        assert_eq!(f.spread("warm_rps_gateway"), None);
    }
}
