//! Another process holding the SQLite database's write lock (an operator's `sqlite3` shell left in a
//! transaction, a backup tool, a second program on the same file): under concurrent load, every
//! acknowledgement is recorded; the server must refuse what it cannot commit with 503 once SQLite's busy
//! wait gives up, take writes again by itself once the lock is released, and hold every acknowledged
//! write — through the API and after `kill -9` and a restart. `HERALD_FAULT_ROUNDS` sets the rounds
//! (default 1).

use crate::common;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use common::Herald;
use common::faults::{self, Ledger, Load, random_pause};
use serde_json::json;
use sqlx::ConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;

/// Producers posting at once.
const PRODUCERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_with_its_database_locked_by_another_process_refuses_then_resumes_and_loses_nothing() {
    let data = tempfile::tempdir().expect("data dir");
    let path = data.path().join("herald.db");
    let url = format!("sqlite://{}", path.display());
    let herald = Arc::new(Herald::start(&[("HERALD_DATABASE_URL", url.as_str())]).await);
    let app = herald.app("locked").await;
    let write = {
        let herald = herald.clone();
        let app = app.clone();
        move |n: usize| {
            let herald = herald.clone();
            let path = format!("/app/{app}/msg");
            async move {
                let body = json!({"eventType": "locked.db", "payload": {"n": n}});
                let (status, body) = herald.call("POST", &path, Some(body)).await;
                (202, status, body)
            }
        }
    };

    let rounds = faults::rounds(1);
    let mut ledger = Ledger::default();
    // The checks' own writes, numbered apart from the producers'.
    let mut probe = 900_000_000..;
    for _ in 0..rounds {
        let load = Load::start(PRODUCERS, write.clone());
        tokio::time::sleep(random_pause(300)).await;
        // The other process's connection: no busy wait of its own, and the write lock held until told.
        let mut other = SqliteConnectOptions::from_str(&url)
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
            &mut ledger,
            "store_unavailable",
            "while another process holds the write lock",
            || {},
        )
        .await;
        let health = faults::wait_health(&herald, 503, None).await;
        assert_eq!(health["status"], "unavailable", "{health}");
        tokio::time::sleep(random_pause(500)).await;
        sqlx::query("ROLLBACK")
            .execute(&mut other)
            .await
            .expect("release the lock");
        drop(other);
        faults::resumed(&herald, &write, &mut probe, &mut ledger, "once the lock was released").await;
        load.finish(&mut ledger).await;
    }
    ledger.assert_answers("store_unavailable", rounds);
    ledger.assert_all_stored(&faults::message_ids(&herald, &app).await, "through the API");
    drop(write);
    let mut herald = Arc::try_unwrap(herald).unwrap_or_else(|_| panic!("the producers are done"));
    herald.kill9();
    herald.restart().await;
    ledger.assert_all_stored(&faults::message_ids(&herald, &app).await, "after kill -9 and a restart");
    println!(
        "reliability: sender, SQLite, write lock held by another process: rounds={rounds} acknowledged={} refused={} lost=0",
        ledger.acknowledged.len(),
        ledger.refused_with("store_unavailable"),
    );
}
