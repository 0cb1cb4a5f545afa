//! The inbox on one SQLite file: WAL mode and `synchronous=FULL`, so that an acknowledged event survives
//! `kill -9` and a power cut; one writer connection (inserts and forwarding outcomes each go through a
//! group-commit writer) and a small pool of readers.

use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{AssertSqlSafe, Row, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use super::writer::{self, InsertJob, RecordJob};
use super::{InboxStore, Inserted, ListQuery, NewEvent, Outcome, StoreError, StoreResult, StoredEvent};

/// Inserts that may wait for the writer before callers queue on the channel itself.
const INSERT_QUEUE: usize = 1_024;

/// The SQLite implementation of [`InboxStore`].
#[derive(Debug)]
pub struct SqliteInbox {
    read: SqlitePool,
    write: SqlitePool,
    inserts: mpsc::Sender<InsertJob>,
    records: mpsc::Sender<RecordJob>,
}

impl SqliteInbox {
    /// Open (creating if needed) the database at `url` (`sqlite://PATH`), run the inbox's migrations and
    /// start the group-commit writer.
    ///
    /// # Errors
    ///
    /// Database and migration errors.
    pub async fn open(url: &str) -> StoreResult<Self> {
        let base = SqliteConnectOptions::from_str(url)?
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(base.clone().create_if_missing(true))
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&write).await?;
        let read = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(base.read_only(true))
            .await?;
        let (inserts, jobs) = mpsc::channel(INSERT_QUEUE);
        tokio::spawn(writer::run(write.clone(), jobs));
        let (records, outcomes) = mpsc::channel(INSERT_QUEUE);
        tokio::spawn(writer::run_records(write.clone(), outcomes));
        Ok(Self {
            read,
            write,
            inserts,
            records,
        })
    }
}

fn decode(row: &SqliteRow) -> StoreResult<StoredEvent> {
    let headers: String = row.try_get("headers")?;
    let headers = serde_json::from_str(&headers).map_err(|e| StoreError::Corrupt(format!("headers: {e}")))?;
    let status: String = row.try_get("status")?;
    let attempts: i64 = row.try_get("attempts")?;
    let body: Vec<u8> = row.try_get("body")?;
    Ok(StoredEvent {
        id: row.try_get("id")?,
        source: row.try_get("source")?,
        event_id: row.try_get("event_id")?,
        headers,
        body: Bytes::from(body),
        received_at: row.try_get("received_at")?,
        status: status.parse()?,
        attempts: u32::try_from(attempts).map_err(|_| StoreError::Corrupt(format!("attempts {attempts}")))?,
        next_attempt_at: row.try_get("next_attempt_at")?,
        last_error: row.try_get("last_error")?,
        resource_key: row.try_get("resource_key")?,
        version: row.try_get("version")?,
        replays: row.try_get("replays")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn clamp(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[async_trait::async_trait]
impl InboxStore for SqliteInbox {
    async fn insert(&self, event: NewEvent) -> StoreResult<Inserted> {
        let (reply, answer) = oneshot::channel();
        let job = InsertJob {
            event,
            received_at: herald_core::clock::now_ms(),
            reply,
        };
        self.inserts.send(job).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn due(&self, now: i64, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let rows = sqlx::query(
            "SELECT * FROM inbox_event WHERE status = 'pending' AND next_attempt_at <= ? \
             ORDER BY next_attempt_at, id LIMIT ?",
        )
        .bind(now)
        .bind(clamp(limit))
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(decode).collect()
    }

    async fn next_due_after(&self, now: i64) -> StoreResult<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT MIN(next_attempt_at) FROM inbox_event WHERE status = 'pending' AND next_attempt_at > ?",
        )
        .bind(now)
        .fetch_one(&self.read)
        .await?)
    }

    async fn newest_version(&self, source: &str, resource_key: &str) -> StoreResult<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT version FROM inbox_version WHERE source = ? AND resource_key = ?")
                .bind(source)
                .bind(resource_key)
                .fetch_optional(&self.read)
                .await?,
        )
    }

    async fn record(&self, id: &str, replays: i64, attempts: u32, outcome: &Outcome, now: i64) -> StoreResult<bool> {
        let (reply, answer) = oneshot::channel();
        let job = RecordJob {
            id: id.to_owned(),
            replays,
            attempts,
            outcome: outcome.clone(),
            now,
            reply,
        };
        self.records.send(job).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn get(&self, id: &str) -> StoreResult<Option<StoredEvent>> {
        let row = sqlx::query("SELECT * FROM inbox_event WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.read)
            .await?;
        row.as_ref().map(decode).transpose()
    }

    async fn list(&self, query: &ListQuery) -> StoreResult<Vec<StoredEvent>> {
        let mut conditions = vec!["1 = 1"];
        if query.source.is_some() {
            conditions.push("source = ?");
        }
        if query.status.is_some() {
            conditions.push("status = ?");
        }
        if query.before.is_some() {
            conditions.push("id < ?");
        }
        let sql = format!(
            "SELECT * FROM inbox_event WHERE {} ORDER BY id DESC LIMIT ?",
            conditions.join(" AND ")
        );
        // Only fixed fragments are concatenated; every value is bound.
        let mut select = sqlx::query(AssertSqlSafe(sql));
        if let Some(source) = &query.source {
            select = select.bind(source);
        }
        if let Some(status) = query.status {
            select = select.bind(status.as_str());
        }
        if let Some(before) = &query.before {
            select = select.bind(before);
        }
        let rows = select
            .bind(clamp(query.limit).saturating_add(1))
            .fetch_all(&self.read)
            .await?;
        rows.iter().map(decode).collect()
    }

    async fn replay(&self, id: &str, now: i64) -> StoreResult<bool> {
        let updated = sqlx::query(
            "UPDATE inbox_event SET status = 'pending', attempts = 0, next_attempt_at = ?, last_error = NULL, \
             replays = replays + 1, updated_at = ? WHERE id = ?",
        )
        .bind(now)
        .bind(now)
        .bind(id)
        .execute(&self.write)
        .await?;
        Ok(updated.rows_affected() == 1)
    }

    async fn replay_window(&self, source: &str, since: i64, until: i64, now: i64) -> StoreResult<u64> {
        let updated = sqlx::query(
            "UPDATE inbox_event SET status = 'pending', attempts = 0, next_attempt_at = ?, last_error = NULL, \
             replays = replays + 1, updated_at = ? WHERE source = ? AND received_at >= ? AND received_at < ?",
        )
        .bind(now)
        .bind(now)
        .bind(source)
        .bind(since)
        .bind(until)
        .execute(&self.write)
        .await?;
        Ok(updated.rows_affected())
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.read).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Status;

    fn event(event_id: &str) -> NewEvent {
        NewEvent {
            source: "s".into(),
            event_id: event_id.into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from_static(b"{\"a\":1}"),
            status: Status::Pending,
            last_error: None,
            resource_key: Some("r".into()),
            version: Some("2".into()),
        }
    }

    async fn open() -> (tempfile::TempDir, SqliteInbox) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
        let store = SqliteInbox::open(&url).await.unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn duplicates_are_stored_once_even_within_one_batch() {
        let (_dir, store) = open().await;
        let (a, b) = tokio::join!(store.insert(event("e1")), store.insert(event("e1")));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.id, b.id);
        assert!(a.duplicate != b.duplicate, "exactly one is the original");
        let again = store.insert(event("e1")).await.unwrap();
        assert!(again.duplicate);
        assert_eq!(again.id, a.id);
        let all = store
            .list(&ListQuery {
                limit: 10,
                ..ListQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].headers, event("e1").headers);
        assert_eq!(all[0].body, event("e1").body);
    }

    #[tokio::test]
    async fn results_are_fenced_by_replays_and_the_guard_never_goes_back() {
        let (_dir, store) = open().await;
        let id = store.insert(event("e1")).await.unwrap().id;
        let due = store.due(i64::MAX, 10).await.unwrap();
        assert_eq!(due.len(), 1);
        // A replay while the attempt is in flight: the attempt's result is dropped, the event stays pending.
        assert!(store.replay(&id, 1).await.unwrap());
        let forwarded = Outcome::Forwarded {
            guard: Some(("r".into(), "2".into())),
        };
        assert!(!store.record(&id, 0, 1, &forwarded, 2).await.unwrap());
        assert_eq!(store.get(&id).await.unwrap().unwrap().status, Status::Pending);
        assert!(store.record(&id, 1, 1, &forwarded, 2).await.unwrap());
        assert_eq!(store.newest_version("s", "r").await.unwrap().as_deref(), Some("2"));
        // An older version forwarded by replay does not lower the mark.
        let older = store.insert(event("e0")).await.unwrap().id;
        let back = Outcome::Forwarded {
            guard: Some(("r".into(), "1".into())),
        };
        assert!(store.record(&older, 0, 1, &back, 3).await.unwrap());
        assert_eq!(store.newest_version("s", "r").await.unwrap().as_deref(), Some("2"));
        assert_eq!(store.next_due_after(0).await.unwrap(), None);
        assert_eq!(store.replay_window("s", 0, i64::MAX, 5).await.unwrap(), 2);
        assert_eq!(store.due(5, 10).await.unwrap().len(), 2);
    }
}
