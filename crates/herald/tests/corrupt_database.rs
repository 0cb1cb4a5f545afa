//! A corrupt SQLite database file, for the sender and the inbox: real files, damaged by the test with
//! real writes at real offsets — a torn header, a truncated file, a table's root page (found through
//! `sqlite_schema`) overwritten with garbage.
//!
//! At start-up the server refuses a damaged file with a message naming the file, what is wrong and how
//! to recover (`sqlite3 FILE .recover`); a damaged page the default (`basic`) check does not read is
//! refused by `HERALD_SQLITE_CHECK=quick`, and under the default is answered `503 store_corrupt` on
//! every request that touches it, with `/health` saying `corrupt`, never a 2xx and never a crash. After
//! the file is restored (from the copy taken before the damage, as from a backup), every acknowledged
//! write is there.

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::str::FromStr;

use common::faults::{self, Ledger};
use common::{Herald, Receiver, Reply};
use serde_json::{Value, json};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Row};

/// Writes made before the damage: enough that the events' table spans many pages.
const WRITES: usize = 150;

/// The server under test: the sender, with its application, or the inbox.
enum Side {
    Sender { app: String },
    Inbox,
}

impl Side {
    /// The table the side's writes go to.
    fn table(&self) -> &'static str {
        match self {
            Side::Sender { .. } => "message",
            Side::Inbox => "inbox_event",
        }
    }

    /// Write number `n` (about 1 KB): (acknowledging status, status, body).
    async fn write(&self, server: &Herald, n: usize) -> (u16, u16, Value) {
        let filler = "x".repeat(1_000);
        match self {
            Side::Sender { app } => {
                let body = json!({"eventType": "corrupt.db", "payload": {"n": n, "filler": filler}});
                let (status, body) = server.call("POST", &format!("/app/{app}/msg"), Some(body)).await;
                (202, status, body)
            }
            Side::Inbox => {
                let body = json!({"type": "invoice.paid", "n": n, "filler": filler}).to_string();
                let (status, body) = faults::post_signed(server, &format!("corrupt_{n}"), &body).await;
                (200, status, body)
            }
        }
    }

    /// A read of the whole table through the API: (status, body).
    async fn read_all(&self, server: &Herald) -> (u16, Value) {
        match self {
            Side::Sender { app } => server.call("GET", &format!("/app/{app}/msg?limit=250"), None).await,
            Side::Inbox => server.call("GET", "/inbox/event?limit=250", None).await,
        }
    }

    /// The acknowledged ids the API finds.
    async fn stored(&self, server: &Herald, acknowledged: &BTreeSet<String>) -> BTreeSet<String> {
        match self {
            Side::Sender { app } => faults::message_ids(server, app).await,
            Side::Inbox => faults::inbox_stored(server, acknowledged).await,
        }
    }
}

/// Open the file from outside, as an operator's tool would.
async fn connect(path: &Path) -> sqlx::SqliteConnection {
    SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .expect("url")
        .connect()
        .await
        .expect("open the database from outside")
}

/// Move everything the write-ahead log holds into the main file and empty the log, so that the damage
/// the test writes into the main file is what SQLite reads.
async fn checkpoint(path: &Path) {
    let mut conn = connect(path).await;
    let row = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .fetch_one(&mut conn)
        .await
        .expect("checkpoint");
    assert_eq!(row.get::<i64, _>(0), 0, "the checkpoint was blocked");
    conn.close().await.expect("close");
}

/// The byte offset and size of `table`'s root page, from `sqlite_schema`.
async fn root_page(path: &Path, table: &str) -> (u64, usize) {
    let mut conn = connect(path).await;
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(&mut conn)
        .await
        .expect("page size");
    let root: i64 = sqlx::query_scalar("SELECT rootpage FROM sqlite_schema WHERE type = 'table' AND name = $1")
        .bind(table)
        .fetch_one(&mut conn)
        .await
        .expect("root page");
    conn.close().await.expect("close");
    assert!(root > 1, "{table} has no root page of its own: {root}");
    let page_size = u64::try_from(page_size).expect("page size");
    let offset = u64::try_from(root - 1).expect("root page") * page_size;
    (offset, usize::try_from(page_size).expect("page size"))
}

/// Write `bytes` at `offset` of the file and flush them to disk.
fn overwrite(path: &Path, offset: u64, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open the database file");
    file.write_all_at(bytes, offset).expect("damage the file");
    file.sync_all().expect("sync");
}

/// Garbage that no SQLite page starts with (the first byte of a b-tree page is its type: 2, 5, 10 or 13).
fn garbage(len: usize) -> Vec<u8> {
    b"garbage!".iter().copied().cycle().take(len).collect()
}

/// Put the file back as it was before the damage (from `pristine`, as an operator restores a backup).
fn restore(path: &Path, pristine: &[u8]) {
    std::fs::write(path, pristine).expect("restore the file");
    for suffix in ["-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        let _ = std::fs::remove_file(side);
    }
}

/// Fail unless the refusal names the file, what is wrong (`found`) and how to recover.
fn assert_refusal(stderr: &str, path: &Path, found: &str) {
    for expected in [path.display().to_string().as_str(), "is damaged", found, ".recover"] {
        assert!(
            stderr.contains(expected),
            "the refusal does not say {expected:?}: {stderr}"
        );
    }
}

/// The whole course on one side: acknowledged writes, then each damage in turn on the stopped server's
/// file, each refused at start-up (or, for a page the basic check does not read, answered
/// `503 store_corrupt`), each followed by a restore and a start that finds every acknowledged write.
async fn damage_course(server: &mut Herald, side: &Side) {
    let mut ledger = Ledger::default();
    for n in 0..WRITES {
        let (ok, status, body) = side.write(server, n).await;
        ledger.answer(ok, status, &body);
    }
    ledger.assert_answers("store_unavailable", 0);
    assert_eq!(ledger.acknowledged.len(), WRITES, "{:?}", ledger.refused);
    let path = server.db_path();
    server.kill9();
    checkpoint(&path).await;
    let pristine = std::fs::read(&path).expect("read the file");

    // A torn header: the first sector of page 1 overwritten.
    overwrite(&path, 0, &garbage(512));
    assert_refusal(&server.start_refused(&[]), &path, "magic string");
    restore(&path, &pristine);

    // A truncated file: a copy or a restore that stopped half-way.
    let file = std::fs::OpenOptions::new().write(true).open(&path).expect("open");
    file.set_len(pristine.len() as u64 / 2).expect("truncate");
    drop(file);
    assert_refusal(&server.start_refused(&[]), &path, "truncated");
    restore(&path, &pristine);

    // The events' table's root page overwritten with garbage: the basic check does not read it...
    let (offset, page_size) = root_page(&path, side.table()).await;
    overwrite(&path, offset, &garbage(page_size));
    assert_refusal(
        &server.start_refused(&[("HERALD_SQLITE_CHECK", "quick")]),
        &path,
        "quick_check",
    );
    // ...so the default start serves, and every request that touches the page is refused.
    server.restart().await;
    for n in WRITES..WRITES + 3 {
        let (_, status, body) = side.write(server, n).await;
        assert_eq!((status, body["code"].as_str()), (503, Some("store_corrupt")), "{body}");
    }
    let (status, body) = side.read_all(server).await;
    assert_eq!((status, body["code"].as_str()), (503, Some("store_corrupt")), "{body}");
    let health = faults::wait_health(server, 503, Some("corrupt")).await;
    assert_eq!(health["status"], "unavailable", "{health}");
    assert!(server.is_running(), "the server stopped on a corrupt page");
    server.kill9();
    restore(&path, &pristine);

    // Restored: every acknowledged write is there, and writes are taken again.
    server.restart().await;
    ledger.assert_all_stored(&side.stored(server, &ledger.acknowledged).await, "after the restore");
    let (ok, status, body) = side.write(server, WRITES + 10).await;
    assert_eq!(status, ok, "{body}");
    faults::wait_health(server, 200, Some("ok")).await;
    println!(
        "reliability: {}, SQLite, corrupt file: acknowledged={} refused_at_start=3 lost=0",
        side.table(),
        ledger.acknowledged.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_refuses_a_damaged_database_file_and_never_acknowledges_on_a_corrupt_page() {
    // SQLite whatever the backend: a damaged file is SQLite's (PostgreSQL's own corruption is answered
    // `store_corrupt` through its error codes, XX001 and XX002, which a test cannot provoke from outside).
    let mut herald = Herald::start_sqlite(&[]).await;
    let app = herald.app("corrupt").await;
    damage_course(&mut herald, &Side::Sender { app }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_refuses_a_damaged_database_file_and_never_acknowledges_on_a_corrupt_page() {
    let handler = Receiver::start(Reply::status(200)).await;
    let mut inbox = Herald::start_inbox_sqlite(&faults::inbox_config(&handler)).await;
    damage_course(&mut inbox, &Side::Inbox).await;
}
