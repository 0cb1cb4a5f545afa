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
        let ports = dialect.ports_query();
        let pool = AnyPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if let Some(statement) = setup {
                        sqlx::query(statement).execute(&mut *conn).await?;
                    }
                    // Every exchange of a batch waits on this socket: no Nagle delay on it.
                    if let Some(query) = ports {
                        let (client, server): (Option<i64>, Option<i64>) =
                            sqlx::query_as(query).fetch_one(&mut *conn).await?;
                        herald_sql::tcp_nodelay::set_on_reported_ports(client, server).await;
                    }
                    Ok(())
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

    /// Open a batch's transaction.
    pub async fn begin(&self) -> Result<Transaction<'static, Any>, SourceError> {
        Ok(self.pool.begin_with(self.dialect.begin()).await?)
    }

    /// The oldest `limit` unrelayed rows, locked for this transaction (skipping rows other relays hold).
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

    /// Delete or mark the relayed rows.
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
