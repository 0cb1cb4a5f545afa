//! How SQLite statements over many rows are cut: rows per multi-row statement, their placeholders, and
//! several such statements in one text.

/// Rows per multi-row `INSERT` (SQLite allows 32,766 bound values per statement).
pub(crate) const ROWS_PER_INSERT: usize = 256;

/// `?, ?, …` with `n` marks.
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Append to `sql` the statements inserting `rows` rows, each `insert` (`INSERT INTO t (…)`) with up to
/// [`ROWS_PER_INSERT`] `row`s (`(?, …)`) as its `VALUES`, `;`-separated; nothing for no rows.
pub(crate) fn inserts(sql: &mut String, insert: &str, row: &str, rows: usize) {
    let mut left = rows;
    while left > 0 {
        let n = left.min(ROWS_PER_INSERT);
        sql.push_str(insert);
        sql.push_str(" VALUES ");
        sql.push_str(&vec![row; n].join(", "));
        sql.push_str(";\n");
        left -= n;
    }
}
