//! How SQLite statements over many rows are cut: rows per multi-row statement, their placeholders, and
//! several such statements in one text.

/// Rows per multi-row `INSERT` (SQLite allows 32,766 bound values per statement).
pub(crate) const ROWS_PER_INSERT: usize = 256;

/// `?, ?, …` with `n` marks.
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Append to `sql` the statements over `rows` rows, up to [`ROWS_PER_INSERT`] rows each, `;`-separated:
/// each is `head`, its rows' `row` (`(?, …)`) comma-separated, then `tail`; nothing for no rows.
pub(crate) fn statements(sql: &mut String, head: &str, row: &str, tail: &str, rows: usize) {
    let mut left = rows;
    while left > 0 {
        let n = left.min(ROWS_PER_INSERT);
        sql.push_str(head);
        sql.push_str(&vec![row; n].join(", "));
        sql.push_str(tail);
        sql.push_str(";\n");
        left -= n;
    }
}
