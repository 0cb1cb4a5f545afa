//! Another process holding the SQLite database's write lock (an operator's `sqlite3` shell left in a
//! transaction, a backup tool, a second program on the same file), for the sender and the inbox: under
//! concurrent load, every acknowledgement is recorded; the server must refuse what it cannot commit with
//! 503, report the store failing on `/health` while the lock is held, take writes again by itself once it
//! is released, and hold every acknowledged write — through the API and after `kill -9` and a restart.
//! `HERALD_FAULT_ROUNDS` sets the rounds (default 1).

use crate::common;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::faults::{self, Ledger, Load, random_pause};
use common::{Herald, Receiver, Reply};
use serde_json::{Value, json};
use sqlx::ConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;

/// Producers posting at once.
const PRODUCERS: usize = 4;

/// `rounds` times, under load: another process takes the write lock of the database at `url` at a random
/// moment, holds it until writes are refused (and `/health` says so), then releases it; writes must
/// resume by themselves. `write` makes one write and answers (acknowledging status, status, body).
async fn lock_rounds<F, Fut>(server: &Herald, url: &str, rounds: usize, ledger: &mut Ledger, write: F)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (u16, u16, Value)> + Send,
{
    // The checks' own writes, numbered apart from the producers'.
    let mut probe = 900_000_000..;
    for _ in 0..rounds {
        let load = Load::start(PRODUCERS, write.clone());
        tokio::time::sleep(random_pause(300)).await;
        // The other process's connection, holding the write lock until told.
        let mut other = SqliteConnectOptions::from_str(url)
            .expect("url")
            .busy_timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("open the database from outside");
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut other)
            .await
            .expect("take the write lock");
        faults::refused(
            &write,
            &mut probe,
            ledger,
            "store_unavailable",
            "while another process holds the write lock",
            || {},
        )
        .await;
        let health = faults::wait_health(server, 503, None).await;
        assert_eq!(health["status"], "unavailable", "{health}");
        tokio::time::sleep(random_pause(500)).await;
        sqlx::query("ROLLBACK")
            .execute(&mut other)
            .await
            .expect("release the lock");
        drop(other);
        faults::resumed(server, &write, &mut probe, ledger, "once the lock was released").await;
        load.finish(ledger).await;
    }
    ledger.assert_answers("store_unavailable", rounds);
}

fn report(what: &str, rounds: usize, ledger: &Ledger) {
    // The figures docs/reliability.md quotes (visible with `--nocapture`).
    println!(
        "reliability: {what}, write lock held by another process: rounds={rounds} acknowledged={} refused={} lost=0",
        ledger.acknowledged.len(),
        ledger.refused_with("store_unavailable"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_with_its_database_locked_by_another_process_refuses_then_resumes_and_loses_nothing() {
    let data = tempfile::tempdir().expect("data dir");
    let url = format!("sqlite://{}", data.path().join("herald.db").display());
    let herald = Arc::new(Herald::start(&[("HERALD_DATABASE_URL", url.as_str())]).await);
    let app = herald.app("locked").await;
    let write = faults::message_writer(herald.clone(), app.clone(), "locked.db", |n| json!({"n": n}));
    let rounds = faults::rounds(1);
    let mut ledger = Ledger::default();
    lock_rounds(&herald, &url, rounds, &mut ledger, write).await;

    ledger.assert_all_stored(&faults::message_ids(&herald, &app).await, "through the API");
    let mut herald = Arc::try_unwrap(herald).unwrap_or_else(|_| panic!("the producers are done"));
    herald.kill9();
    herald.restart().await;
    ledger.assert_all_stored(&faults::message_ids(&herald, &app).await, "after kill -9 and a restart");
    report("sender, SQLite", rounds, &ledger);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_with_its_database_locked_by_another_process_refuses_then_resumes_and_loses_nothing() {
    let data = tempfile::tempdir().expect("data dir");
    let url = format!("sqlite://{}", data.path().join("inbox.db").display());
    let handler = Receiver::start(Reply::status(200)).await;
    let inbox = Arc::new(
        Herald::start_inbox(
            &faults::inbox_config(&handler),
            &[("HERALD_DATABASE_URL", url.as_str())],
            None,
        )
        .await,
    );
    // Every post a new provider id (the producers' numbers start over each round).
    let posted = Arc::new(AtomicUsize::new(0));
    let write = {
        let inbox = inbox.clone();
        move |n: usize| {
            let inbox = inbox.clone();
            let msg_id = format!("locked_{}", posted.fetch_add(1, Ordering::Relaxed));
            async move {
                let body = json!({"type": "invoice.paid", "n": n}).to_string();
                let (status, body) = faults::post_signed(&inbox, &msg_id, &body).await;
                (200, status, body)
            }
        }
    };
    let rounds = faults::rounds(1);
    let mut events = Ledger::default();
    lock_rounds(&inbox, &url, rounds, &mut events, write).await;

    let mut inbox = Arc::try_unwrap(inbox).unwrap_or_else(|_| panic!("the producers are done"));
    events.assert_all_stored(
        &faults::inbox_stored(&inbox, &events.acknowledged).await,
        "through the API",
    );
    inbox.kill9();
    inbox.restart().await;
    events.assert_all_stored(
        &faults::inbox_stored(&inbox, &events.acknowledged).await,
        "after kill -9 and a restart",
    );
    report("inbox, SQLite", rounds, &events);
}
