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
//!
//! Under a running server and concurrent producers: the same root page damaged between two bursts of
//! load; every answer is a 2xx or a 503 with a storage code, writes that touch the page are refused
//! `store_corrupt`, writes that do not still commit and are readable, `/health` says `corrupt`; after
//! `kill -9` the restart refuses the file (`quick`), and once the page is repaired with the bytes it had,
//! every acknowledged write is there — also after another `kill -9` and restart.

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::faults::{self, Ledger, Load, random_pause};
use common::{Herald, Receiver, Reply};
use serde_json::{Value, json};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Row};

/// Writes made before the damage: enough that the events' table spans many pages.
const WRITES: usize = 150;

/// The server under test: the sender, with its application, or the inbox.
#[derive(Clone)]
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
/// the test writes into the main file is what SQLite reads. Retried while a reader of the running
/// server blocks it.
async fn checkpoint(path: &Path) {
    let mut conn = connect(path).await;
    let deadline = std::time::Instant::now() + faults::SOON;
    loop {
        let row = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(&mut conn)
            .await
            .expect("checkpoint");
        if row.get::<i64, _>(0) == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the checkpoint stayed blocked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    conn.close().await.expect("close");
}

/// The bytes of the file at `offset`.
fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let file = std::fs::File::open(path).expect("open the database file");
    let mut bytes = vec![0; len];
    file.read_exact_at(&mut bytes, offset).expect("read the page");
    bytes
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

/// Destroy `table`'s root page under a running server, until SQLite reads the garbage: a write of the
/// server (the inbox's forwarder recording an outcome, say) may put a newer copy of the page in the
/// write-ahead log between the checkpoint and the damage, and that copy, not the main file's, is what
/// SQLite reads. Answers the page's offset and the bytes it held (its true content: once SQLite reads
/// the garbage, no write that touches the page can commit).
async fn destroy_root_page(path: &Path, table: &str) -> (u64, Vec<u8>) {
    for _ in 0..20 {
        checkpoint(path).await;
        let (offset, page_size) = root_page(path, table).await;
        let original = read_at(path, offset, page_size);
        overwrite(path, offset, &garbage(page_size));
        let mut conn = connect(path).await;
        // SQLite reads a page from the file only when its cached copy is stale, and a connection keeps
        // its cache while no other connection commits (its own commits do not count). A commit of the
        // test's own — `user_version` rewritten with its own value — makes every connection of the
        // server drop its cache at its next transaction, as a commit of any other process would.
        let version: i64 = sqlx::query_scalar("PRAGMA user_version")
            .fetch_one(&mut conn)
            .await
            .expect("user_version");
        sqlx::query(sqlx::AssertSqlSafe(format!("PRAGMA user_version = {version}")))
            .execute(&mut conn)
            .await
            .expect("commit from outside");
        let read = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT * FROM {table} LIMIT 1")))
            .fetch_optional(&mut conn)
            .await;
        conn.close().await.expect("close");
        match read {
            Err(sqlx::Error::Database(error)) if error.message().contains("malformed") => return (offset, original),
            // Shadowed by a newer copy in the log: the next checkpoint writes that copy over the garbage.
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("the root page of {table} could not be destroyed: a newer copy always shadowed it");
}

/// Damage under a running server: load, pause it, checkpoint and overwrite the events' table's root
/// page, load again; check every answer, the refusals and `/health`; then `kill -9`, a refused restart,
/// the page repaired with the bytes it had, and every acknowledged write found. `also` runs while the
/// page is damaged (a write elsewhere that must still commit).
async fn damaged_while_serving<W, Fut, A, AFut>(mut server: Herald, side: Side, write: W, also: A)
where
    W: Fn(Arc<Herald>, usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = (u16, u16, Value)> + Send,
    A: Fn(Arc<Herald>) -> AFut,
    AFut: std::future::Future<Output = ()>,
{
    let path = server.db_path();
    let mut ledger = Ledger::default();
    let rounds = faults::rounds(1);
    for round in 0..rounds {
        let shared = Arc::new(server);
        let producer = {
            let (shared, write) = (shared.clone(), write.clone());
            move |n: usize| write(shared.clone(), n)
        };
        let load = Load::start(PRODUCERS, producer.clone());
        tokio::time::sleep(Duration::from_millis(200) + random_pause(500)).await;
        load.finish(&mut ledger).await;
        // The server runs on; between two of its commits the page is destroyed.
        let (offset, original) = destroy_root_page(&path, side.table()).await;
        let load = Load::start(PRODUCERS, producer.clone());
        let mut probe = 900_000_000 + round * 1_000..;
        faults::refused(
            &producer,
            &mut probe,
            &mut ledger,
            "store_corrupt",
            "with a destroyed page",
            || {},
        )
        .await;
        let health = faults::wait_health(&shared, 503, Some("corrupt")).await;
        assert_eq!(health["status"], "unavailable", "{health}");
        also(shared.clone()).await;
        tokio::time::sleep(random_pause(300)).await;
        load.finish(&mut ledger).await;
        drop(producer);
        server = Arc::try_unwrap(shared).unwrap_or_else(|_| panic!("the producers are done"));
        assert!(server.is_running(), "the server stopped on a corrupt page");

        server.kill9();
        let refusal = server.start_refused(&[("HERALD_SQLITE_CHECK", "quick")]);
        assert_refusal(&refusal, &path, "quick_check");
        // The repair: the page as it was (a real repair restores a backup or `.recover`s; nothing that
        // touches this page committed since, so its old bytes are its true content).
        overwrite(&path, offset, &original);
        server.restart().await;
        ledger.assert_all_stored(&side.stored(&server, &ledger.acknowledged).await, "after the repair");
        faults::wait_health(&server, 200, Some("ok")).await;
    }
    ledger.assert_answers("store_corrupt", rounds);
    server.kill9();
    server.restart().await;
    ledger.assert_all_stored(
        &side.stored(&server, &ledger.acknowledged).await,
        "after kill -9 and a restart",
    );
    println!(
        "reliability: {}, SQLite, page destroyed under load: rounds={rounds} acknowledged={} refused_corrupt={} refused_unavailable={} lost=0",
        side.table(),
        ledger.acknowledged.len(),
        ledger.refused_with("store_corrupt"),
        ledger.refused_with("store_unavailable"),
    );
}

/// Producers posting at once in the running-server tests.
const PRODUCERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_with_a_page_destroyed_under_load_refuses_what_touches_it_and_loses_nothing_acknowledged() {
    let herald = Herald::start_sqlite(&[]).await;
    let side = Side::Sender {
        app: herald.app("corrupt-live").await,
    };
    let writer = side.clone();
    let write = move |server: Arc<Herald>, n: usize| {
        let side = writer.clone();
        async move { side.write(&server, n).await }
    };
    // Applications live on other pages: creating one still commits, and it is readable.
    let also = |server: Arc<Herald>| async move {
        let (status, body) = server
            .call("POST", "/app", Some(json!({"name": "beside the damage"})))
            .await;
        assert_eq!(status, 201, "{body}");
        let id = body["id"].as_str().unwrap_or_default();
        let (status, body) = server.call("GET", &format!("/app/{id}"), None).await;
        assert_eq!(status, 200, "{body}");
    };
    damaged_while_serving(herald, side, write, also).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_with_a_page_destroyed_under_load_refuses_what_touches_it_and_loses_nothing_acknowledged() {
    let handler = Receiver::start(Reply::status(200)).await;
    let inbox = Herald::start_inbox_sqlite(&faults::inbox_config(&handler)).await;
    // Every post a new provider id (the producers' numbers start over with each burst).
    let posted = Arc::new(AtomicUsize::new(0));
    let write = move |server: Arc<Herald>, _n: usize| {
        let n = posted.fetch_add(1, Ordering::Relaxed);
        async move { Side::Inbox.write(&server, n).await }
    };
    damaged_while_serving(inbox, Side::Inbox, write, |_| async {}).await;
}
