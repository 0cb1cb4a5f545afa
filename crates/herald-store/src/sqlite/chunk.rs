//! How SQLite statements over many rows are cut: rows per multi-row statement and their placeholders.

/// Rows per multi-row `INSERT` (SQLite allows 32,766 bound values per statement).
pub(crate) const ROWS_PER_INSERT: usize = 256;

/// `?, ?, …` with `n` marks.
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}
