//! SQL helpers shared by the backends: keyset pagination and the meaning of constraint violations.

use crate::{PageRequest, StoreError};

/// The keyset condition and order for a page over `column`; `mark` is the placeholder of the anchor's
/// bind parameter in the backend's dialect (`?` or `$n`).
///
/// Listings are either oldest-first (`newest_first = false`) or newest-first; a reverse page walks the
/// other way from its anchor.
pub(crate) fn keyset(column: &str, page: &PageRequest, newest_first: bool, mark: &str) -> (String, String) {
    let descending = newest_first != page.reverse;
    let order = format!("ORDER BY {column} {}", if descending { "DESC" } else { "ASC" });
    let condition = match page.after {
        Some(_) => format!("{column} {} {mark}", if descending { "<" } else { ">" }),
        None => "1 = 1".to_owned(),
    };
    (condition, order)
}

/// An endpoint's backlog: a count bounded at [`crate::Backlog::COUNT_CAP`] + 1 and the oldest pending
/// delivery's creation time, the head of the `(endpoint_id, seq)` pending index (seq follows creation
/// order). `first` and `second` are the endpoint id's placeholders in the two subqueries (`?` and `?` on
/// SQLite, `$1` twice on PostgreSQL).
pub(crate) fn backlog_query(first: &str, second: &str) -> String {
    format!(
        "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM delivery WHERE endpoint_id = {first} AND status = 0 LIMIT {cap}) \
         AS counted) AS pending, (SELECT m.created_at FROM delivery d JOIN message m ON m.id = d.message_id \
         WHERE d.endpoint_id = {second} AND d.status = 0 ORDER BY d.seq LIMIT 1) AS oldest",
        cap = crate::Backlog::COUNT_CAP + 1
    )
}

/// The row limit that fetches one row more than the page, to tell whether more exist.
pub(crate) fn limit_plus_one(page: &PageRequest) -> i64 {
    i64::try_from(page.limit).unwrap_or(i64::MAX).saturating_add(1)
}

/// A `usize` limit as a bind parameter.
pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Turn a constraint violation into what it means: `Conflict` naming the field for a unique key,
/// `NotFound` for a foreign key (the parent — an application or endpoint — does not exist).
///
/// SQLite names the columns in its message (`UNIQUE constraint failed: application.uid`); PostgreSQL
/// names the constraint, and the PostgreSQL schema names its unique constraints after their columns.
pub(crate) fn map_constraint(error: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &error {
        if db.is_foreign_key_violation() {
            return StoreError::NotFound;
        }
        if db.is_unique_violation() {
            let what = db.constraint().map_or_else(|| db.message().to_owned(), str::to_owned);
            let field = if what.contains("uid") {
                "uid"
            } else if what.contains("event_id") {
                "eventId"
            } else if what.contains("name") {
                "name"
            } else {
                "id"
            };
            return StoreError::Conflict(field);
        }
    }
    StoreError::Database(error)
}
