//! Disk full under load, on real SQLite files on a size-capped tmpfs: the sender and the inbox never
//! acknowledge a write they did not commit, refuse with 503 `storage_full` while the disk is full,
//! report it on `/health`, and take writes again by themselves once space is freed — checked through
//! the API, at the receivers, and after `kill -9` and a restart.
//!
//! Each round starts concurrent producers, fills the disk to the last byte at a random moment, holds it
//! full under load, frees it and waits for writes to succeed again. `HERALD_FAULT_ROUNDS` sets the
//! number of rounds (default 3; the figures in docs/reliability.md come from longer runs).

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::faults::{self, Ledger, Load, SizedTmpfs, random_pause, wait_health};
use common::{Herald, Receiver, Reply};
use serde_json::{Value, json};

/// Producers posting at once.
const PRODUCERS: usize = 6;
/// Filesystem size: small, so that it fills in a moment under load.
const TMPFS_MIB: u32 = 24;

/// A payload of about `bytes` bytes that does not compress into nothing.
fn payload(n: usize, bytes: usize) -> Value {
    let filler: String = (0..bytes)
        .map(|i| char::from(b'a' + ((i.wrapping_mul(7).wrapping_add(n.wrapping_mul(13))) % 26) as u8))
        .collect();
    json!({ "n": n, "filler": filler })
}

/// The apps among `ids` that the API finds.
async fn stored_apps(herald: &Herald, ids: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for id in ids {
        let (status, body) = herald.call("GET", &format!("/app/{id}"), None).await;
        match status {
            200 => {
                found.insert(id.clone());
            }
            404 => {}
            other => panic!("GET /app/{id}: {other} {body}"),
        }
    }
    found
}

/// One round: load, fill at a random moment, hold full, free, wait for writes to succeed again.
/// `write` makes one write and answers (acknowledging status, status, body).
async fn fault_round<F, Fut>(server: &Herald, tmpfs: &SizedTmpfs, ledger: &mut Ledger, write: F)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (u16, u16, Value)> + Send,
{
    let load = Load::start(PRODUCERS, write.clone());
    tokio::time::sleep(random_pause(500)).await;
    let ballast = tmpfs.ballast();
    ballast.fill();
    // Full: the server says so, on writes and on /health, and keeps saying so while it lasts.
    // The checks' own writes, numbered apart from the producers'.
    let mut probe = 900_000_000..;
    // Any space left (a WAL frame reused, a page freed) goes to the ballast.
    faults::refused(&write, &mut probe, ledger, "storage_full", "with the disk full", || {
        ballast.fill()
    })
    .await;
    let health = wait_health(server, 503, Some("full")).await;
    assert_eq!(health["status"], "unavailable", "{health}");
    tokio::time::sleep(Duration::from_millis(300) + random_pause(700)).await;
    ballast.free();
    // Freed: writes succeed again by themselves, no restart.
    faults::resumed(server, &write, &mut probe, ledger, "after space was freed").await;
    tokio::time::sleep(random_pause(300)).await;
    load.finish(ledger).await;
}

fn report(what: &str, rounds: usize, ledger: &Ledger, duplicates: usize) {
    // The figures docs/reliability.md quotes (visible with `--nocapture`).
    println!(
        "reliability: {what}: rounds={rounds} acknowledged={} refused_storage_full={} refused_unavailable={} lost=0 duplicates={duplicates}",
        ledger.acknowledged.len(),
        ledger.refused_with("storage_full"),
        ledger.refused_with("store_unavailable"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_on_a_full_disk_never_acknowledges_what_it_did_not_store() {
    let tmpfs = SizedTmpfs::mount(TMPFS_MIB);
    let url = tmpfs.sqlite_url("herald.db");
    let schedule = vec!["500ms"; 50].join(",");
    let herald = Herald::start(&[
        ("HERALD_DATABASE_URL", url.as_str()),
        ("HERALD_RETRY_SCHEDULE", schedule.as_str()),
    ])
    .await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("disk-full").await;
    herald.endpoint(&app, json!({ "url": receiver.url() })).await;
    let herald = Arc::new(herald);

    let rounds = faults::rounds(3);
    let mut messages = Ledger::default();
    let mut apps = Ledger::default();
    for _ in 0..rounds {
        // Messages from the producers; apps created alongside (the other write path).
        let creator = {
            let herald = herald.clone();
            Load::start(1, move |n| {
                let herald = herald.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let (status, body) = herald
                        .call("POST", "/app", Some(json!({"name": format!("a{n}")})))
                        .await;
                    (201, status, body)
                }
            })
        };
        let write = faults::message_writer(herald.clone(), app.clone(), "disk.full", |n| payload(n, 8_000));
        fault_round(&herald, &tmpfs, &mut messages, write).await;
        creator.finish(&mut apps).await;
    }
    messages.assert_answers("storage_full", rounds);
    apps.assert_answers("storage_full", 0);

    // Through the API: every acknowledged message and app is there.
    messages.assert_all_stored(&faults::message_ids(&herald, &app).await, "through the API");
    apps.assert_all_stored(&stored_apps(&herald, &apps.acknowledged).await, "apps through the API");

    // At the receiver: every acknowledged message arrives, and nothing arrives that is not stored.
    let stored = faults::message_ids(&herald, &app).await;
    let arrivals = messages
        .wait_arrivals(&receiver, "webhook-id", Duration::from_secs(90))
        .await;
    let phantom: Vec<&String> = arrivals.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(phantom.is_empty(), "delivered but not stored: {phantom:?}");

    // After kill -9 and a restart: still all there.
    let mut herald = Arc::try_unwrap(herald).unwrap_or_else(|_| panic!("the producers are done"));
    herald.kill9();
    herald.restart().await;
    messages.assert_all_stored(&faults::message_ids(&herald, &app).await, "after kill -9 and restart");
    apps.assert_all_stored(&stored_apps(&herald, &apps.acknowledged).await, "apps after kill -9");
    report(
        "sender, SQLite, disk full",
        rounds,
        &messages,
        faults::duplicates(&arrivals),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_on_a_full_disk_never_acknowledges_what_it_did_not_store() {
    let tmpfs = SizedTmpfs::mount(TMPFS_MIB);
    let url = tmpfs.sqlite_url("inbox.db");
    let handler = Receiver::start(Reply::status(200)).await;
    let config = faults::inbox_config(&handler);
    let schedule = vec!["500ms"; 50].join(",");
    let inbox = Herald::start_inbox(
        &config,
        &[
            ("HERALD_DATABASE_URL", url.as_str()),
            ("HERALD_INBOX_RETRY_SCHEDULE", schedule.as_str()),
        ],
        None,
    )
    .await;
    let inbox = Arc::new(inbox);

    let rounds = faults::rounds(3);
    let mut events = Ledger::default();
    for round in 0..rounds {
        let write = {
            let inbox = inbox.clone();
            move |n: usize| {
                let inbox = inbox.clone();
                async move {
                    let body = payload(n, 8_000).to_string();
                    let (status, body) = faults::post_signed(&inbox, &format!("msg_{round}_{n}"), &body).await;
                    (200, status, body)
                }
            }
        };
        fault_round(&inbox, &tmpfs, &mut events, write).await;
    }
    events.assert_answers("storage_full", rounds);

    let mut inbox = Arc::try_unwrap(inbox).unwrap_or_else(|_| panic!("the producers are done"));
    let arrivals = events.assert_inbox_kept(&mut inbox, &handler, |_, _| {}).await;
    report(
        "inbox, SQLite, disk full",
        rounds,
        &events,
        faults::duplicates(&arrivals),
    );
}
