//! SQL helpers shared by the dialects: keyset pagination, limits and the meaning of constraint violations.

use crate::statement::{Arg, Sql};
use crate::{PageRequest, StoreError};

/// Keyset pagination over one column: listings are either oldest-first (`newest_first = false`) or
/// newest-first, and a reverse page walks the other way from its anchor.
pub(crate) struct Keyset {
    column: &'static str,
    descending: bool,
}

impl Keyset {
    /// The keyset of `page` over `column`.
    pub(crate) fn new(column: &'static str, page: &PageRequest, newest_first: bool) -> Self {
        Self {
            column,
            descending: newest_first != page.reverse,
        }
    }

    /// Append ` AND column > anchor` (or `<`), binding the anchor, when the page has one.
    pub(crate) fn condition<'a>(&self, sql: &mut Sql<'a>, anchor: Option<Arg<'a>>) {
        if let Some(anchor) = anchor {
            let mark = sql.mark(anchor);
            let op = if self.descending { "<" } else { ">" };
            sql.push(&format!(" AND {} {op} {mark}", self.column));
        }
    }

    /// Append the page's order and its row limit (one more than the page, to tell whether more exist).
    pub(crate) fn order_and_limit(&self, sql: &mut Sql<'_>, page: &PageRequest) {
        let direction = if self.descending { "DESC" } else { "ASC" };
        sql.push(&format!(" ORDER BY {} {direction} LIMIT ", self.column));
        sql.push_bind(limit_plus_one(page));
    }
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
