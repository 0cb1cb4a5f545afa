//! The application rows an ingest writer found last, so that a batch whose apps it knows can skip
//! reading them: SQLite's batch is then one call to SQLite's thread instead of two, PostgreSQL's one round
//! trip instead of three (see `sqlite::bulk` and `postgres::remembered`).
//!
//! A remembered row is never trusted, only checked, in the statement that writes the batch's messages:
//! each message row binds its app's id only through a lookup of the app's row as remembered (its
//! `endpoints_version` and payload retention). A row that moved since — an endpoint written (which bumps
//! the version), the retention changed, the app deleted — makes the lookup find nothing, the message's
//! `app_id` `NULL`, and the statement fail on its `NOT NULL` constraint; the batch is then rolled back
//! (PostgreSQL: its one statement fails whole), the memory forgotten, and the batch written again with
//! its apps read. (A PostgreSQL statement refused first for something else — the ingest lock taken, a
//! repeated `eventId` — keeps the memory; a moved row then refuses a later one.) So a stale row costs one failed
//! statement, never a message fanned out to the wrong list. (PostgreSQL's lookup also share-locks the
//! rows, `SKIP LOCKED`, as the read it replaces does: an app whose row another transaction holds is not
//! found either, and the batch read that skips it defers its jobs.)
//!
//! SQLite: an app whose messages in the batch all repeat stored ones (an `eventId` or `idempotency-key`
//! seen before) has no message row, so its row is not checked: it needs none, since a duplicate is
//! answered the stored message, read in the batch's transaction. That the app still exists rests on its
//! delete taking its messages with it (`ON DELETE CASCADE`, foreign keys on): for a deleted app no
//! earlier message is found, and the message becomes a new, checked row. An app delete that left its
//! messages behind would have to forget the app here. (PostgreSQL's short batches read no stored
//! message: one that a message repeats fails the statement on its unique index, and the batch is
//! written again the usual way, which reads them.)

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::group_commit::IngestJob;
use crate::plan::{self, Apps};
use crate::subscribers::{self, AppRow};

/// The most rows remembered; past it, the memory starts again empty (a node ingesting for more apps than
/// this reads their rows more often, as without it). About a hundred bytes each.
const MAX_KNOWN: usize = 100_000;

/// An application's row as the writer last read it: what a batch needs of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KnownApp {
    /// Its default payload retention in days, if it has one.
    pub(crate) retention_days: Option<i64>,
    /// Its `endpoints_version` (see [`crate::subscribers`]).
    pub(crate) endpoints_version: i64,
}

/// Each application's row as the writer last read it, by id.
#[derive(Debug, Default)]
pub(crate) struct KnownApps {
    rows: Mutex<HashMap<String, KnownApp>>,
}

impl KnownApps {
    /// Remember `found`, rows just read in a batch's transaction.
    pub(crate) fn remember(&self, found: &[AppRow]) {
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = || {
            found.iter().map(|(id, retention_days, endpoints_version)| {
                let row = KnownApp {
                    retention_days: *retention_days,
                    endpoints_version: *endpoints_version,
                };
                (id.clone(), row)
            })
        };
        rows.extend(entries());
        if rows.len() > MAX_KNOWN {
            rows.clear();
            rows.extend(entries());
        }
    }

    /// The rows of `app_ids` if every one is remembered, else `None` (the batch reads them).
    pub(crate) fn all_of(&self, app_ids: &[&str]) -> Option<HashMap<String, KnownApp>> {
        let rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        app_ids
            .iter()
            .map(|id| rows.get(*id).map(|row| ((*id).to_owned(), *row)))
            .collect()
    }

    /// Forget every row: a batch that trusted them failed, so the next one reads its apps afresh.
    pub(crate) fn forget(&self) {
        self.rows.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// What the writer remembers of the batch's apps, if it is all the batch needs of them: every app's
    /// row, and its subscribers at the remembered `endpoints_version` in `cache`.
    pub(crate) fn recall(&self, batch: &[IngestJob], cache: &subscribers::Cache) -> Option<Recalled> {
        let app_ids = plan::app_ids(batch);
        let rows = self.all_of(&app_ids)?;
        let versions: Vec<(&str, i64)> = rows
            .iter()
            .map(|(id, row)| (id.as_str(), row.endpoints_version))
            .collect();
        let (subscribers, stale) = cache.lookup(&versions);
        if !stale.is_empty() {
            return None;
        }
        let apps = rows
            .iter()
            .map(|(id, row)| (id.clone(), plan::retention_ms(row.retention_days)))
            .collect();
        Some(Recalled {
            apps,
            subscribers,
            rows,
        })
    }
}

/// What a batch that skips reading its apps takes from the writer's memory instead (see
/// [`KnownApps::recall`]).
pub(crate) struct Recalled {
    /// The apps, with their default payload retention (in milliseconds).
    pub(crate) apps: Apps,
    /// Their subscribers, at the remembered versions.
    pub(crate) subscribers: subscribers::ByApp,
    /// The rows the batch's message statement checks.
    pub(crate) rows: HashMap<String, KnownApp>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_skips_reading_its_apps_only_when_every_one_is_remembered() {
        let known = KnownApps::default();
        assert_eq!(known.all_of(&["app_a"]), None);
        known.remember(&[("app_a".into(), Some(7), 3), ("app_b".into(), None, 1)]);
        let both = known.all_of(&["app_a", "app_b"]).expect("both remembered");
        assert_eq!(
            both.get("app_a"),
            Some(&KnownApp {
                retention_days: Some(7),
                endpoints_version: 3
            })
        );
        assert_eq!(known.all_of(&["app_a", "app_c"]), None, "one unknown app");
        known.remember(&[("app_a".into(), Some(7), 4)]);
        assert_eq!(
            known.all_of(&["app_a"]).and_then(|rows| rows.get("app_a").copied()),
            Some(KnownApp {
                retention_days: Some(7),
                endpoints_version: 4
            }),
            "the latest read wins"
        );
        known.forget();
        assert_eq!(known.all_of(&["app_b"]), None);
    }

    #[test]
    fn the_memory_starts_again_empty_past_its_bound() {
        let known = KnownApps::default();
        let many: Vec<AppRow> = (0..MAX_KNOWN).map(|i| (format!("app_{i}"), None, 1)).collect();
        known.remember(&many);
        assert!(known.all_of(&["app_0"]).is_some());
        known.remember(&many[..10]);
        assert!(
            known.all_of(&["app_0"]).is_some(),
            "rows already held do not count twice"
        );
        known.remember(&[("app_new".into(), None, 1)]);
        assert_eq!(known.all_of(&["app_0"]), None, "the old rows are gone");
        assert!(known.all_of(&["app_new"]).is_some());
    }
}
