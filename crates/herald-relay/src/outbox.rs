//! The producer's outbox table: claiming rows, removing or marking the relayed ones, refusing the rest.
//!
//! One connection pool per relay, through sqlx's `Any` driver; the statements come from [`Dialect`].

use std::time::Duration;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyConnection, AnyPool, AssertSqlSafe, Row, Transaction};

use crate::dialect::{Dialect, DialectError, TableName};
use crate::row::OutboxRow;

/// Errors of the source database.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The URL or table name is unusable.
    #[error(transparent)]
    Config(#[from] DialectError),
    /// The database failed or could not be reached.
    #[error("source database: {0}")]
    Database(#[from] sqlx::Error),
}

/// What becomes of relayed rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relayed {
    /// They are deleted (the default: the outbox stays small).
    Delete,
    /// `relayed_at` is set and they stay, for an audit trail (prune them yourself).
    Mark,
}

/// One producer's outbox table.
pub struct Outbox {
    pool: AnyPool,
    dialect: Dialect,
    table: TableName,
    relayed: Relayed,
}

/// Connections per relay: one per lane (the most [`Dialect::lanes`] gives), plus the backlog probe.
const POOL_SIZE: u32 = 3;

impl Outbox {
    /// Prepare a pool on `url` (connecting lazily: a source that is down at start is waited for, with
    /// back-off, like one that goes down later).
    pub fn open(url: &str, table: &str, relayed: Relayed) -> Result<Self, SourceError> {
        sqlx::any::install_default_drivers();
        let dialect = Dialect::of_url(url)?;
        let table = TableName::parse(table)?;
        let setup = dialect.session_setup();
        let pool = AnyPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if let Some(statement) = setup {
                        sqlx::query(statement).execute(&mut *conn).await?;
                    }
                    // Every exchange of a batch waits on this socket: no Nagle delay on it.
                    dialect.set_tcp_nodelay(conn).await
                })
            })
            .connect_lazy(&dialect.driver_url(url))?;
        Ok(Self {
            pool,
            dialect,
            table,
            relayed,
        })
    }

    /// The database's dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Open a transaction that writes: a whole batch's where rows are locked one by one, only the settling
    /// of a batch where the database is locked as a whole (see [`Dialect::locks_database`]).
    pub async fn begin(&self) -> Result<Transaction<'static, Any>, SourceError> {
        Ok(self.pool.begin_with(self.dialect.begin()).await?)
    }

    /// Open the read of a batch's rows where the database is locked as a whole: one snapshot for
    /// [`claim`](Self::claim) and [`keyed_before`](Self::keyed_before), and no write lock.
    pub async fn begin_read(&self) -> Result<Transaction<'static, Any>, SourceError> {
        Ok(self.pool.begin_with(self.dialect.begin_read()).await?)
    }

    /// The oldest `limit` unrelayed rows, locked for this transaction (skipping rows other relays hold);
    /// where the database has no row locks, just read.
    pub async fn claim(&self, tx: &mut AnyConnection, limit: usize) -> Result<Vec<OutboxRow>, SourceError> {
        let rows = sqlx::query(AssertSqlSafe(self.dialect.claim(&self.table)))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await?;
        rows.iter()
            .map(decode)
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    /// Every unrelayed row (`seq`, key) of `keys` up to `max_seq`.
    pub async fn keyed_before(
        &self,
        tx: &mut AnyConnection,
        keys: &[String],
        max_seq: i64,
    ) -> Result<Vec<(i64, String)>, SourceError> {
        let sql = self.dialect.keyed_before(&self.table, keys.len());
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for key in keys {
            query = query.bind(key.clone());
        }
        let rows = query.bind(max_seq).fetch_all(&mut *tx).await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    /// Delete or mark the relayed rows. Rows that are gone already (another relay settled them) are no
    /// error: the statement is by `seq`, and matches nothing for them.
    pub async fn finish(&self, tx: &mut AnyConnection, seqs: &[i64]) -> Result<(), SourceError> {
        if seqs.is_empty() {
            return Ok(());
        }
        let sql = match self.relayed {
            Relayed::Delete => self.dialect.delete(&self.table, seqs.len()),
            Relayed::Mark => self.dialect.mark_relayed(&self.table, seqs.len()),
        };
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for seq in seqs {
            query = query.bind(*seq);
        }
        query.execute(&mut *tx).await?;
        Ok(())
    }

    /// Record why Herald refused a row (it is not claimed again until `relay_error` is cleared).
    pub async fn reject(&self, tx: &mut AnyConnection, seq: i64, reason: &str) -> Result<(), SourceError> {
        sqlx::query(AssertSqlSafe(self.dialect.reject(&self.table)))
            .bind(reason.chars().take(1_000).collect::<String>())
            .bind(seq)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    /// The oldest unrelayed row's creation (Unix ms) and how many rows wait.
    pub async fn backlog(&self) -> Result<(Option<i64>, u64), SourceError> {
        let row = sqlx::query(AssertSqlSafe(self.dialect.backlog(&self.table)))
            .fetch_one(&self.pool)
            .await?;
        let oldest: Option<i64> = row.try_get(0)?;
        let waiting: i64 = row.try_get(1)?;
        Ok((oldest, u64::try_from(waiting).unwrap_or(0)))
    }

    /// Close the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

fn decode(row: &AnyRow) -> Result<OutboxRow, sqlx::Error> {
    Ok(OutboxRow {
        seq: row.try_get(0)?,
        event_id: row.try_get(1)?,
        app: row.try_get(2)?,
        event_type: row.try_get(3)?,
        payload: row.try_get(4)?,
        channels: row.try_get(5)?,
        ordering_key: row.try_get(6)?,
        created_at_ms: row.try_get(7)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ports of one of `outbox`'s connections, and whether its socket has `TCP_NODELAY`.
    async fn nodelay_of(outbox: &Outbox) -> bool {
        let query = outbox.dialect.ports_query().expect("a networked database");
        let mut conn = outbox.pool.acquire().await.expect("connection");
        let (client, server): (Option<i64>, Option<i64>) =
            sqlx::query_as(query).fetch_one(&mut *conn).await.expect("ports");
        let port = |p: Option<i64>| u16::try_from(p.expect("a TCP connection")).expect("a port");
        herald_sql::tcp_nodelay::is_set_on_ports(port(client), port(server)).expect("the socket")
    }

    /// An outbox table in a fresh SQLite file in `dir`, holding rows `e1`, `e2`, `e3`; the relay's view of
    /// it (`relayed`), and a plain pool on it to look.
    async fn sqlite_outbox(dir: &tempfile::TempDir, relayed: Relayed) -> (Outbox, AnyPool) {
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
        let outbox = Outbox::open(&url, "herald_outbox", relayed).expect("outbox");
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("pool");
        let table = TableName::parse("herald_outbox").expect("name");
        for statement in Dialect::Sqlite.ddl_statements(&table) {
            sqlx::query(AssertSqlSafe(statement)).execute(&pool).await.expect("DDL");
        }
        for n in 1..=3 {
            sqlx::query(AssertSqlSafe(Dialect::Sqlite.insert(&table)))
                .bind(format!("e{n}"))
                .bind("shop")
                .bind("invoice.paid")
                .bind("{}")
                .bind(None::<String>)
                .execute(&pool)
                .await
                .expect("insert");
        }
        (outbox, pool)
    }

    /// Read the claimable rows as a relay on SQLite does (no write lock), and their `seq`s.
    async fn read_seqs(outbox: &Outbox) -> Vec<i64> {
        let mut read = outbox.begin_read().await.expect("begin read");
        let rows = outbox.claim(&mut read, 10).await.expect("claim");
        read.rollback().await.expect("rollback");
        rows.iter().map(|r| r.seq).collect()
    }

    /// Settle as a relay on SQLite does: reject `e3`, remove (or mark) `e1` and `e2`, in one transaction.
    async fn settle(outbox: &Outbox, seqs: &[i64]) -> Result<(), SourceError> {
        let mut tx = outbox.begin().await?;
        outbox.reject(&mut tx, seqs[2], "404: no such app").await?;
        outbox.finish(&mut tx, &seqs[..2]).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Two relays on one SQLite file read the same rows (nothing is locked while they publish) and both
    /// settle them: the second settling changes nothing and is no error.
    #[tokio::test]
    async fn settling_rows_another_relay_settled_is_no_error() {
        for relayed in [Relayed::Delete, Relayed::Mark] {
            let dir = tempfile::tempdir().expect("dir");
            let (first, pool) = sqlite_outbox(&dir, relayed).await;
            let second = Outbox::open(
                &format!("sqlite://{}", dir.path().join("shop.db").display()),
                "herald_outbox",
                relayed,
            )
            .expect("second outbox");
            let seqs = read_seqs(&first).await;
            assert_eq!(read_seqs(&second).await, seqs, "{relayed:?}: both read the same rows");
            settle(&first, &seqs).await.expect("first settles");
            let look = async || -> Vec<(String, Option<i64>, Option<String>)> {
                sqlx::query("SELECT event_id, relayed_at, relay_error FROM herald_outbox ORDER BY seq")
                    .fetch_all(&pool)
                    .await
                    .expect("rows")
                    .iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2)))
                    .collect()
            };
            let settled = look().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
            settle(&second, &seqs).await.expect("settling again is no error");
            assert_eq!(
                look().await,
                settled,
                "{relayed:?}: the second settling changed nothing"
            );
            assert!(read_seqs(&first).await.is_empty(), "{relayed:?}: nothing left to relay");
            let kept = match relayed {
                Relayed::Delete => 1,
                Relayed::Mark => 3,
            };
            assert_eq!(settled.len(), kept, "{relayed:?}: {settled:?}");
            for outbox in [first, second] {
                outbox.close().await;
            }
            pool.close().await;
        }
    }

    #[tokio::test]
    async fn source_connections_over_tcp_have_tcp_nodelay() {
        if let Some(db) = herald_sql::testdb::fresh("relay_tcp_nodelay").await {
            let outbox = Outbox::open(&db.url, "herald_outbox", Relayed::Delete).expect("outbox");
            assert!(nodelay_of(&outbox).await, "PostgreSQL source over TCP: {}", db.url);
            outbox.close().await;
        }
        let mariadb =
            std::env::var("HERALD_TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned());
        let outbox = Outbox::open(&mariadb, "herald_outbox", Relayed::Delete).expect("outbox");
        match outbox.pool.acquire().await {
            Ok(conn) => {
                drop(conn);
                assert!(nodelay_of(&outbox).await, "MariaDB source over TCP");
            }
            Err(error) => {
                assert!(
                    !std::env::var("HERALD_REQUIRE_MARIADB").is_ok_and(|v| v == "1"),
                    "MariaDB required: {error}"
                );
                eprintln!("SKIPPED MariaDB half of source_connections_over_tcp_have_tcp_nodelay: {error}");
            }
        }
        outbox.close().await;
    }
}
