//! Checkpoints of SQLite's write-ahead log, off the writer's commits.
//!
//! SQLite copies the pages its log holds back into the database file (a checkpoint) inside the commit
//! that takes the log past `wal_autocheckpoint` pages, 1,000 by default: under load that was one commit
//! in ~25 holding every request of its batch for the copy and the database file's fsync, twenty times a
//! second. Here a connection of its own checkpoints every [`EVERY`] instead, beside the writer (a
//! passive checkpoint waits for nobody and nobody waits for it), and a page the writer changes many
//! times in that while is copied once. The writer's own checkpoint stays as a backstop at
//! [`WRITER_BACKSTOP_PAGES`]: it is what restarts the log from its beginning under steady writes (a
//! checkpoint beside a writer that keeps appending never finds the whole log copied), and by then it
//! has only the pages since the last checkpoint here to copy. Figures: docs/performance.md,
//! "checkpoints-off-the-writer".
//!
//! A checkpoint moves only what is committed already: durability rests on the log's fsync at each
//! commit, not on this.

use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection};
use tokio::sync::oneshot;

use crate::StoreResult;

/// How often the checkpointer copies the log's pages into the database file.
pub(super) const EVERY: Duration = Duration::from_millis(500);

/// How many pages the log holds before the writer's commit checkpoints it itself (SQLite's
/// `wal_autocheckpoint`): the backstop (see the module's documentation). At 4 KiB a page, the log file
/// grows to about 80 MiB at most and keeps that size.
pub(super) const WRITER_BACKSTOP_PAGES: u32 = 20_000;

/// The running checkpointer: it stops when this is dropped (with its store).
#[derive(Debug)]
pub(super) struct Checkpointer {
    _stop: oneshot::Sender<()>,
}

/// Open a connection of the checkpointer's own to the database `options` name and start checkpointing
/// every `every`.
pub(super) async fn start(options: &SqliteConnectOptions, every: Duration) -> StoreResult<Checkpointer> {
    let conn = SqliteConnection::connect_with(options).await?;
    let (stop, stopped) = oneshot::channel();
    tokio::spawn(run(conn, every, stopped));
    Ok(Checkpointer { _stop: stop })
}

async fn run(mut conn: SqliteConnection, every: Duration, mut stopped: oneshot::Receiver<()>) {
    // A failure repeats every round while its cause lasts (a full disk): said once, and again when it
    // changes. The log keeps every page meanwhile, and the writer's backstop still checkpoints.
    let mut failing: Option<String> = None;
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            () = tokio::time::sleep(every) => {}
        }
        match sqlx::raw_sql("PRAGMA wal_checkpoint(PASSIVE)").execute(&mut conn).await {
            Ok(_) => {
                if failing.take().is_some() {
                    tracing::info!("checkpointing SQLite's write-ahead log works again");
                }
            }
            Err(error) => {
                let text = error.to_string();
                if failing.as_deref() != Some(text.as_str()) {
                    tracing::warn!(%error, "checkpointing SQLite's write-ahead log failed; trying again");
                    failing = Some(text);
                }
            }
        }
    }
    let _ = conn.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    /// The database file's size in bytes.
    fn file_size(path: &std::path::Path) -> u64 {
        std::fs::metadata(path).expect("the database file").len()
    }

    #[tokio::test]
    async fn the_checkpointer_copies_what_a_writer_that_never_checkpoints_committed() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("log.db");
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .expect("a SQLite URL")
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .create_if_missing(true);
        let mut writer = SqliteConnection::connect_with(&options.clone().pragma("wal_autocheckpoint", "0"))
            .await
            .expect("the writer");
        sqlx::raw_sql(
            "CREATE TABLE filler (b BLOB); \
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) \
             INSERT INTO filler SELECT randomblob(4000) FROM n;",
        )
        .execute(&mut writer)
        .await
        .expect("committed");
        let before = file_size(&path);
        assert!(
            before < 100_000,
            "the pages are in the log, not the file yet ({before} bytes)"
        );
        let checkpointer = start(&options, Duration::from_millis(20)).await.expect("started");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while file_size(&path) < 2_000_000 {
            assert!(std::time::Instant::now() < deadline, "nothing checkpointed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(checkpointer);
    }
}
