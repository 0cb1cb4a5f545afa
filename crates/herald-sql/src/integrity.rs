//! The start-up check of a SQLite database file (the sender's and the inbox's): a damaged file is
//! refused with a message that names the file, says what is wrong with it and how to recover it, instead
//! of serving on it and failing request after request.
//!
//! How much is checked is [`SqliteCheck`] (`HERALD_SQLITE_CHECK`):
//!
//! - [`SqliteCheck::Basic`] (the default) costs microseconds whatever the size: the 100-byte header
//!   (SQLite's magic string, a valid page size and payload fractions), the file's length against the
//!   page count the header records (a truncated file: a cut copy, a restore that did not finish), and a
//!   read of the schema (page 1 and the `sqlite_schema` table, which every statement needs).
//! - [`SqliteCheck::Quick`] adds `PRAGMA quick_check`: every page of every table and index is read and
//!   its structure checked. It reads the whole file, so it costs what reading the file costs — 0.6 s for
//!   a 1.3 GB file already in the page cache, 51 s for the same file from a busy virtual disk (see
//!   docs/reliability.md) — which is why it is not the default.
//! - [`SqliteCheck::Full`] runs `PRAGMA integrity_check` instead (also checks that every index matches its
//!   table, about twice the time).
//!
//! A page damaged where the basic check does not look is found when a request reads or writes it:
//! SQLite answers `SQLITE_CORRUPT`, the request `503 store_corrupt` ([`crate::custody::Fault::Corrupt`]).
//!
//! The check only judges damage: a file it cannot open or read for another reason (permissions, a lock)
//! passes, and the open that follows reports that error itself.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::custody::{self, Fault};

/// How much of a SQLite file is checked at start-up (see the [module](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SqliteCheck {
    /// The header, the file's length and the schema: microseconds.
    #[default]
    Basic,
    /// Also `PRAGMA quick_check`: reads the whole file.
    Quick,
    /// Also `PRAGMA integrity_check`: reads the whole file and checks every index against its table.
    Full,
}

impl FromStr for SqliteCheck {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "basic" => Ok(Self::Basic),
            "quick" => Ok(Self::Quick),
            "full" => Ok(Self::Full),
            other => Err(format!(
                "{other:?} is not a SQLite check: expected basic, quick or full"
            )),
        }
    }
}

/// A SQLite database file that is damaged, with what was found; its message says how to recover.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the SQLite database file {path} is damaged: {found}. Nothing was started. Stop every process using it, \
     then restore it from a backup, or recover what SQLite can still read into a new file — \
     `sqlite3 {path} .recover | sqlite3 {path}.recovered` (where this sqlite3 cannot `.recover`: \
     `sqlite3 {path} .dump`, its closing `ROLLBACK` made `COMMIT`) — and move that in place of the damaged \
     file, with its -wal and -shm files removed; see docs/reliability.md, \"A corrupt database file\""
)]
pub struct Damaged {
    /// The file.
    pub path: PathBuf,
    /// What is wrong: a header field, the length, or what SQLite said.
    pub found: String,
}

/// Check the SQLite database of `url` (`sqlite://PATH`) at the given depth; a missing or empty file
/// passes (it is created).
///
/// # Errors
///
/// [`Damaged`] when the file is damaged.
pub async fn check(url: &str, depth: SqliteCheck) -> Result<(), Damaged> {
    let Ok(options) = SqliteConnectOptions::from_str(url) else {
        return Ok(());
    };
    let path = options.get_filename().to_path_buf();
    let damaged = |found: String| Damaged {
        path: path.clone(),
        found,
    };
    match header_check(&path) {
        Ok(()) => {}
        Err(HeaderError::Unreadable) => return Ok(()),
        Err(HeaderError::Damaged(found)) => return Err(damaged(found)),
    }
    if std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) == 0 {
        return Ok(());
    }
    // Opened like the stores open it (WAL, so a log left by `kill -9` is replayed first), never created.
    // Each step is named, so that the refusal says which one SQLite failed.
    let judged = |step: &str, error: sqlx::Error| {
        if custody::fault_of(&error) == Some(Fault::Corrupt) {
            Err(damaged(format!("{step}: SQLite said: {error}")))
        } else {
            tracing::warn!(%error, path = %path.display(), step, "the start-up check of the SQLite file could not run");
            Ok(())
        }
    };
    let mut conn = match options.create_if_missing(false).connect().await {
        Ok(conn) => conn,
        Err(error) => return judged("opening it", error),
    };
    let pragma = match depth {
        SqliteCheck::Basic => None,
        SqliteCheck::Quick => Some("PRAGMA quick_check(20)"),
        SqliteCheck::Full => Some("PRAGMA integrity_check(20)"),
    };
    // Page 1 and the schema, which every statement reads first.
    let mut outcome = match sqlx::query("SELECT count(*) FROM sqlite_schema")
        .execute(&mut conn)
        .await
    {
        Ok(_) => Ok(()),
        Err(error) => judged("reading its schema", error),
    };
    if let (Ok(()), Some(pragma)) = (&outcome, pragma) {
        // One row `ok`, or up to 20 rows naming what is wrong.
        outcome = match sqlx::query_scalar::<_, String>(pragma).fetch_all(&mut conn).await {
            Ok(rows) if rows.first().is_some_and(|row| row == "ok") => Ok(()),
            Ok(rows) => Err(damaged(format!("{pragma} found: {}", rows.join("; ")))),
            Err(error) => judged(pragma, error),
        };
    }
    let _ = conn.close().await;
    outcome
}

enum HeaderError {
    /// The file cannot be read (missing, permissions): not the check's business.
    Unreadable,
    Damaged(String),
}

/// The header's fields and the file's length (<https://sqlite.org/fileformat.html#the_database_header>).
fn header_check(path: &Path) -> Result<(), HeaderError> {
    let mut file = std::fs::File::open(path).map_err(|_| HeaderError::Unreadable)?;
    let length = file.metadata().map_err(|_| HeaderError::Unreadable)?.len();
    if length == 0 {
        return Ok(());
    }
    let mut header = [0u8; 100];
    if length < header.len() as u64 {
        return Err(HeaderError::Damaged(format!(
            "it is {length} bytes long, shorter than SQLite's 100-byte header"
        )));
    }
    file.read_exact(&mut header).map_err(|_| HeaderError::Unreadable)?;
    let found = |what: String| Err(HeaderError::Damaged(what));
    if &header[..16] != b"SQLite format 3\0" {
        return found("its header does not start with SQLite's magic string \"SQLite format 3\"".into());
    }
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536u64,
        size if size >= 512 && size.is_power_of_two() => u64::from(size),
        size => return found(format!("its header records an impossible page size, {size}")),
    };
    if header[21..24] != [64, 32, 32] {
        return found("its header's payload fractions are not SQLite's fixed 64, 32, 32".into());
    }
    // The page count in the header is valid only when its "version valid for" matches the change counter.
    let counter = u32::from_be_bytes([header[24], header[25], header[26], header[27]]);
    let pages = u64::from(u32::from_be_bytes([header[28], header[29], header[30], header[31]]));
    let valid_for = u32::from_be_bytes([header[92], header[93], header[94], header[95]]);
    // A write-ahead log with frames in it may hold pages past the main file's end, legitimately (a
    // checkpoint cut short by a crash): the log is replayed on open, so the length says nothing then.
    let wal_frames = std::fs::metadata(wal_of(path)).is_ok_and(|m| m.len() > 0);
    if pages > 0 && counter == valid_for && !wal_frames && length < pages * page_size {
        return found(format!(
            "it is truncated: {length} bytes, but its header records {pages} pages of {page_size} bytes ({} bytes)",
            pages * page_size
        ));
    }
    Ok(())
}

/// The write-ahead log beside a database file.
fn wal_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_depth_parses_its_three_names_only() {
        assert_eq!("basic".parse(), Ok(SqliteCheck::Basic));
        assert_eq!("quick".parse(), Ok(SqliteCheck::Quick));
        assert_eq!("full".parse(), Ok(SqliteCheck::Full));
        assert!("fast".parse::<SqliteCheck>().is_err());
    }
}
