//! The SQL each producer database speaks: the only dialect-specific part of the relay.
//!
//! Every statement the relay runs against a producer's outbox is built here, from the table's name (checked
//! by [`TableName`]) and the dialect; nothing else in the crate writes SQL.

use std::fmt;

/// A producer database the relay reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL: `FOR UPDATE SKIP LOCKED`, so several relays share one table.
    Postgres,
    /// MariaDB 10.6+ or MySQL 8+: `FOR UPDATE SKIP LOCKED` too.
    MySql,
    /// SQLite: no row locks, one writer at a time for the whole file ([`Dialect::locks_database`]):
    /// a relay reads its rows without a lock, publishes them, and takes the write lock only to settle them.
    Sqlite,
}

/// Why a source URL or table name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialectError {
    /// The URL's scheme is none the relay reads.
    #[error("unsupported source database `{0}`: use postgres://, mysql://, mariadb:// or sqlite://")]
    Scheme(String),
    /// The table name is not a plain (optionally schema-qualified) SQL identifier.
    #[error("table name `{0}`: must be letters, digits and `_` (optionally `schema.table`)")]
    Table(String),
}

impl Dialect {
    /// The dialect of a database URL (`postgres://`, `postgresql://`, `mysql://`, `mariadb://`, `sqlite:`).
    pub fn of_url(url: &str) -> Result<Self, DialectError> {
        let scheme = url.split(':').next().unwrap_or_default().to_ascii_lowercase();
        match scheme.as_str() {
            "postgres" | "postgresql" => Ok(Self::Postgres),
            "mysql" | "mariadb" => Ok(Self::MySql),
            "sqlite" => Ok(Self::Sqlite),
            _ => Err(DialectError::Scheme(scheme)),
        }
    }

    /// The URL sqlx's `Any` driver understands (it knows MariaDB as `mysql://`).
    pub fn driver_url(self, url: &str) -> String {
        match (self, url.split_once(':')) {
            (Self::MySql, Some((_, rest))) => format!("mysql:{rest}"),
            _ => url.to_owned(),
        }
    }

    /// Whether a write lock here is the whole database's rather than a row's: SQLite has one writer per
    /// file. A relay must then never hold a transaction that writes across its HTTP publishes, or every
    /// write of the producer (its outbox inserts and its own business writes) would wait for Herald's
    /// answers, and fail with `database is locked` past its busy timeout. Where this is true the relay
    /// reads its rows ([`begin_read`](Self::begin_read)), publishes with no transaction open, and settles
    /// them in a short transaction of its own ([`begin`](Self::begin)); elsewhere one transaction claims
    /// rows with row locks (`FOR UPDATE SKIP LOCKED`), publishes them and settles them.
    pub fn locks_database(self) -> bool {
        match self {
            Self::Sqlite => true,
            Self::Postgres | Self::MySql => false,
        }
    }

    /// The statement that opens a transaction that writes: a relay batch's (claim, publish, settle) where
    /// rows are locked one by one; only the settling of published rows where the database is locked as a
    /// whole. SQLite's `IMMEDIATE` takes the write lock at once: a second relay waits here (up to its busy
    /// timeout) rather than failing its delete later with "database is locked".
    pub fn begin(self) -> &'static str {
        match self {
            Self::Sqlite => "BEGIN IMMEDIATE",
            Self::Postgres | Self::MySql => "BEGIN",
        }
    }

    /// The statement that opens the read of claimable rows where the database is locked as a whole
    /// ([`locks_database`](Self::locks_database)): SQLite's `DEFERRED` transaction takes no write lock,
    /// and gives the claim and its [`keyed_before`](Self::keyed_before) one snapshot.
    pub fn begin_read(self) -> &'static str {
        match self {
            Self::Sqlite => "BEGIN DEFERRED",
            Self::Postgres | Self::MySql => "BEGIN",
        }
    }

    /// What each new connection of a relay runs first. MariaDB/MySQL: `READ COMMITTED`, as PostgreSQL's
    /// default. Under InnoDB's default `REPEATABLE READ`, a claim (`FOR UPDATE`) also locks the gaps it
    /// scanned, the end of the table among them, so a producer's insert waits for the relay's batch — and
    /// with the relay's delete in between, one of them dies of a deadlock. Each statement of a batch seeing
    /// the latest commits is what [`crate::order`] expects anyway (another relay's rows just relayed are
    /// gone, not held).
    pub fn session_setup(self) -> Option<&'static str> {
        match self {
            Self::MySql => Some("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"),
            Self::Postgres | Self::Sqlite => None,
        }
    }

    /// The connection's own port and the server's, as the server sees them (NULL or 0 over a Unix
    /// socket), so the relay can set `TCP_NODELAY` on its socket (sqlx 0.9.0 leaves Nagle on, which holds
    /// the second half of some exchanges for the server's delayed ACK, ~40 ms). `None`: SQLite, a file.
    pub(crate) fn ports_query(self) -> Option<&'static str> {
        match self {
            Self::Postgres => Some("SELECT inet_client_port()::bigint, inet_server_port()::bigint"),
            Self::MySql => Some(
                "SELECT CAST(SUBSTRING_INDEX(HOST, ':', -1) AS SIGNED), CAST(@@port AS SIGNED) \
                 FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()",
            ),
            Self::Sqlite => None,
        }
    }

    /// Set `TCP_NODELAY` on `conn`'s socket when it is a TCP connection (`ports_query`
    /// finds it; nothing to do on SQLite or over a Unix socket). For a pool's `after_connect`.
    pub async fn set_tcp_nodelay(self, conn: &mut sqlx::AnyConnection) -> Result<(), sqlx::Error> {
        if let Some(query) = self.ports_query() {
            let (client, server): (Option<i64>, Option<i64>) = sqlx::query_as(query).fetch_one(conn).await?;
            herald_sql::tcp_nodelay::set_on_reported_ports(client, server).await;
        }
        Ok(())
    }

    /// How many batches a relay works on at once (see `relay`): two where rows are locked one by one, so
    /// one batch is claimed while another publishes; one on SQLite, where nothing marks a row as taken
    /// while it is published (a second batch would read and publish the same rows again).
    pub fn lanes(self) -> usize {
        match self {
            Self::Postgres | Self::MySql => 2,
            Self::Sqlite => 1,
        }
    }

    /// The `n`-th (from 1) bind placeholder.
    fn mark(self, n: usize) -> String {
        match self {
            Self::MySql => "?".to_owned(),
            Self::Postgres | Self::Sqlite => format!("${n}"),
        }
    }

    /// `count` placeholders from the `first`, comma-separated.
    fn marks(self, first: usize, count: usize) -> String {
        (first..first + count)
            .map(|n| self.mark(n))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `payload` and `channels` as text, `created_at` as Unix milliseconds.
    fn columns(self) -> &'static str {
        match self {
            Self::Postgres => {
                "seq, event_id, app, event_type, payload::text, channels::text, ordering_key, \
                 (extract(epoch FROM created_at) * 1000)::bigint"
            }
            Self::MySql => {
                "seq, event_id, app, event_type, CAST(payload AS CHAR), CAST(channels AS CHAR), ordering_key, \
                 CAST(UNIX_TIMESTAMP(created_at) * 1000 AS SIGNED)"
            }
            Self::Sqlite => "seq, event_id, app, event_type, payload, channels, ordering_key, created_at",
        }
    }

    /// A producer's insert of one row: `event_id`, `app`, `event_type`, `payload` (JSON text) and
    /// `ordering_key`, in that order (what an application runs in its transaction; the tests and the
    /// benchmark use it too).
    pub fn insert(self, table: &TableName) -> String {
        let payload = match self {
            Self::Postgres => format!("{}::jsonb", self.mark(4)),
            Self::MySql | Self::Sqlite => self.mark(4),
        };
        format!(
            "INSERT INTO {table} (event_id, app, event_type, payload, ordering_key) VALUES ({}, {payload}, {})",
            self.marks(1, 3),
            self.mark(5)
        )
    }

    /// The oldest unrelayed rows, locked, skipping rows another relay holds (`$1`: how many). On SQLite,
    /// just the oldest unrelayed rows (nothing is locked: see [`locks_database`](Self::locks_database)).
    pub fn claim(self, table: &TableName) -> String {
        let lock = match self {
            Self::Postgres | Self::MySql => " FOR UPDATE SKIP LOCKED",
            Self::Sqlite => "",
        };
        format!(
            "SELECT {} FROM {table} WHERE {UNRELAYED} ORDER BY seq LIMIT {}{lock}",
            self.columns(),
            self.mark(1)
        )
    }

    /// The unrelayed rows (`seq`, `ordering_key`) of `keys` ordering keys up to a sequence number (the
    /// last placeholder): what must be published before a claimed row of the same key may be.
    pub fn keyed_before(self, table: &TableName, keys: usize) -> String {
        format!(
            "SELECT seq, ordering_key FROM {table} WHERE {UNRELAYED} AND ordering_key IN ({}) AND seq <= {} \
             ORDER BY seq",
            self.marks(1, keys),
            self.mark(keys + 1)
        )
    }

    /// Remove `count` relayed rows by `seq`.
    pub fn delete(self, table: &TableName, count: usize) -> String {
        format!("DELETE FROM {table} WHERE seq IN ({})", self.marks(1, count))
    }

    /// Mark `count` rows relayed (kept, for an audit trail) by `seq`. A row already marked keeps its time:
    /// where rows are not locked while published, two relays may both settle one row, and the first
    /// settled it.
    pub fn mark_relayed(self, table: &TableName, count: usize) -> String {
        format!(
            "UPDATE {table} SET relayed_at = {} WHERE relayed_at IS NULL AND seq IN ({})",
            self.now(),
            self.marks(1, count)
        )
    }

    /// Set one row's `relay_error` (`$1`) by `seq` (`$2`): Herald refused it for good. A row another relay
    /// already marked relayed stays relayed (Herald took it from that one).
    pub fn reject(self, table: &TableName) -> String {
        format!(
            "UPDATE {table} SET relay_error = {} WHERE relayed_at IS NULL AND seq = {}",
            self.mark(1),
            self.mark(2)
        )
    }

    /// The oldest unrelayed row's creation (Unix milliseconds, NULL when none) and how many wait.
    pub fn backlog(self, table: &TableName) -> String {
        let oldest = match self {
            Self::Postgres => "(extract(epoch FROM MIN(created_at)) * 1000)::bigint",
            Self::MySql => "CAST(UNIX_TIMESTAMP(MIN(created_at)) * 1000 AS SIGNED)",
            Self::Sqlite => "MIN(created_at)",
        };
        format!("SELECT {oldest}, COUNT(*) FROM {table} WHERE {UNRELAYED}")
    }

    /// The outbox table's DDL (the shipped `sql/*.sql`) for a table named `table`.
    pub fn ddl(self, table: &TableName) -> String {
        let shipped = match self {
            Self::Postgres => include_str!("../sql/postgres.sql"),
            Self::MySql => include_str!("../sql/mysql.sql"),
            Self::Sqlite => include_str!("../sql/sqlite.sql"),
        };
        // Index names are per schema: derive them from the table's own name.
        let bare = table.as_str().rsplit('.').next().unwrap_or(table.as_str());
        shipped
            .replace("herald_outbox_", &format!("{bare}_"))
            .replace("herald_outbox", table.as_str())
    }

    /// [`ddl`](Self::ddl) as separate statements, comments removed (for drivers that run one at a time).
    pub fn ddl_statements(self, table: &TableName) -> Vec<String> {
        let ddl = self.ddl(table);
        let bare: Vec<&str> = ddl
            .lines()
            .map(|line| line.split("--").next().unwrap_or_default())
            .collect();
        bare.join("\n")
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The current time in the column type of `relayed_at`.
    fn now(self) -> &'static str {
        match self {
            Self::Postgres => "now()",
            Self::MySql => "CURRENT_TIMESTAMP(6)",
            Self::Sqlite => SQLITE_NOW_MS,
        }
    }
}

/// The rows still to relay: neither relayed nor refused.
const UNRELAYED: &str = "relayed_at IS NULL AND relay_error IS NULL";

/// Unix milliseconds in SQLite, on every version (`unixepoch('subsec')` needs 3.42).
pub const SQLITE_NOW_MS: &str = "(CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))";

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
            Self::Sqlite => "sqlite",
        })
    }
}

/// An outbox table's name, safe to write into SQL: an identifier, optionally schema-qualified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName(String);

impl TableName {
    /// Check a name (`herald_outbox`, `billing.outbox`).
    pub fn parse(name: &str) -> Result<Self, DialectError> {
        let identifier = |part: &str| {
            part.len() <= 63
                && part.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        let parts: Vec<&str> = name.split('.').collect();
        if parts.len() <= 2 && parts.iter().all(|p| identifier(p)) {
            Ok(Self(name.to_owned()))
        } else {
            Err(DialectError::Table(name.to_owned()))
        }
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dialect_follows_the_scheme() {
        assert_eq!(Dialect::of_url("postgres://u@h/db"), Ok(Dialect::Postgres));
        assert_eq!(Dialect::of_url("postgresql://u@h/db"), Ok(Dialect::Postgres));
        assert_eq!(Dialect::of_url("mariadb://root@localhost/db"), Ok(Dialect::MySql));
        assert_eq!(Dialect::of_url("sqlite:///tmp/x.db"), Ok(Dialect::Sqlite));
        assert!(Dialect::of_url("oracle://x").is_err());
        assert_eq!(Dialect::MySql.driver_url("mariadb://root@h/db"), "mysql://root@h/db");
    }

    #[test]
    fn table_names_are_identifiers() {
        assert!(TableName::parse("herald_outbox").is_ok());
        assert!(TableName::parse("billing.outbox_2").is_ok());
        for bad in ["", "1abc", "a;drop table x", "a.b.c", "a b", "o\"x", "a."] {
            assert!(TableName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ddl_names_the_table() {
        let t = TableName::parse("billing.events").expect("name");
        let ddl = Dialect::Postgres.ddl(&t);
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS billing.events ("));
        assert!(ddl.contains("INDEX IF NOT EXISTS events_ordering ON billing.events"));
        assert!(!ddl.contains("herald_outbox"));
        for dialect in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
            let statements = dialect.ddl_statements(&t);
            assert!(statements[0].starts_with("CREATE TABLE"), "{statements:?}");
            assert!(statements.iter().all(|s| !s.contains("--") && !s.contains(';')));
        }
    }

    #[test]
    fn only_sqlite_reads_outside_its_settling_transaction() {
        assert!(Dialect::Sqlite.locks_database());
        assert_eq!(
            (Dialect::Sqlite.begin_read(), Dialect::Sqlite.begin()),
            ("BEGIN DEFERRED", "BEGIN IMMEDIATE")
        );
        for dialect in [Dialect::Postgres, Dialect::MySql] {
            assert!(!dialect.locks_database());
            assert!(
                dialect
                    .claim(&TableName::parse("o").expect("name"))
                    .ends_with("SKIP LOCKED")
            );
        }
    }

    #[test]
    fn placeholders_follow_the_dialect() {
        let t = TableName::parse("o").expect("name");
        assert_eq!(Dialect::MySql.delete(&t, 3), "DELETE FROM o WHERE seq IN (?, ?, ?)");
        assert_eq!(Dialect::Postgres.delete(&t, 2), "DELETE FROM o WHERE seq IN ($1, $2)");
        assert!(
            Dialect::Postgres
                .keyed_before(&t, 2)
                .contains("IN ($1, $2) AND seq <= $3")
        );
        assert!(Dialect::Postgres.claim(&t).ends_with("LIMIT $1 FOR UPDATE SKIP LOCKED"));
        assert!(!Dialect::Sqlite.claim(&t).contains("FOR UPDATE"));
        assert_eq!(
            Dialect::Postgres.reject(&t),
            "UPDATE o SET relay_error = $1 WHERE relayed_at IS NULL AND seq = $2"
        );
        assert_eq!(
            Dialect::Postgres.insert(&t),
            "INSERT INTO o (event_id, app, event_type, payload, ordering_key) VALUES ($1, $2, $3, $4::jsonb, $5)"
        );
        assert!(Dialect::MySql.insert(&t).ends_with("VALUES (?, ?, ?, ?, ?)"));
    }
}
