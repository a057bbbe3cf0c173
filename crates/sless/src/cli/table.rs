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

#[cfg(test)]
mod tests {
    use super::*;

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
