//! Plain aligned text tables for list output: easy to read, and easy to `awk`.

/// Renders `rows` under `headers`, columns separated by at least three spaces. The last
/// column is not padded, so lines carry no trailing spaces.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let columns = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().take(columns).enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_row).chain(rows) {
        let mut line = String::new();
        for (i, width) in widths.iter().enumerate() {
            let cell = row.get(i).map(String::as_str).unwrap_or("");
            if i + 1 == columns {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(width - cell.chars().count() + 3));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// An RFC 3339 time from the API in one column-friendly form, UTC to the second
/// (`2025-01-02T03:04:05Z`); `-` when there is none. Text that does not parse is shown as it
/// came rather than hidden.
pub fn time(value: Option<&str>) -> String {
    time_with(value, "%Y-%m-%dT%H:%M:%SZ")
}

/// [`time`] to the millisecond, for records where order within a second matters.
pub fn time_ms(value: Option<&str>) -> String {
    time_with(value, "%Y-%m-%dT%H:%M:%S%.3fZ")
}

fn time_with(value: Option<&str>, format: &str) -> String {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => "-".to_string(),
        Some(text) => chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| t.with_timezone(&chrono::Utc).format(format).to_string())
            .unwrap_or_else(|_| text.to_string()),
    }
}

/// `text` on one line and at most `max` characters, ending in `…` when cut, so one long
/// error message cannot wreck a table.
pub fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        return flat;
    }
    let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_shown_in_utc_to_the_second() {
        assert_eq!(
            time(Some("2025-01-02T04:04:05.678+01:00")),
            "2025-01-02T03:04:05Z"
        );
        assert_eq!(
            time_ms(Some("2025-01-02T03:04:05.678912Z")),
            "2025-01-02T03:04:05.678Z"
        );
        assert_eq!(time(None), "-");
        assert_eq!(time(Some("")), "-");
        assert_eq!(time(Some("yesterday")), "yesterday");
    }

    #[test]
    fn long_text_is_cut_to_one_line() {
        assert_eq!(one_line("short", 10), "short");
        assert_eq!(one_line("a\n  b\tc", 10), "a b c");
        assert_eq!(one_line("abcdefghijkl", 5), "abcd…");
    }

    #[test]
    fn aligns_columns_without_trailing_spaces() {
        let rows = vec![
            vec!["hello".to_string(), "python3".to_string(), "".to_string()],
            vec!["a".to_string(), "nodejs".to_string(), "x".to_string()],
        ];
        let out = render(&["NAME", "RUNTIME", "URL"], &rows);
        assert_eq!(
            out,
            "NAME    RUNTIME   URL\nhello   python3\na       nodejs    x\n"
        );
    }

    #[test]
    fn header_only_when_empty() {
        assert_eq!(render(&["A", "B"], &[]), "A   B\n");
    }
}
