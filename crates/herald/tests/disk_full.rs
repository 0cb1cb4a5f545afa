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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::faults::{self, Ledger, SizedTmpfs};
use common::{Herald, Receiver, Reply};
use serde_json::{Value, json};

/// Producers posting at once.
const PRODUCERS: usize = 6;
/// Filesystem size: small, so that it fills in a moment under load.
const TMPFS_MIB: u32 = 24;
/// How long a bound on "soon" is (a refusal after filling, a 202 after freeing, `/health`).
const SOON: Duration = Duration::from_secs(20);

/// A payload of about `bytes` bytes that does not compress into nothing.
fn payload(n: usize, bytes: usize) -> Value {
    let filler: String = (0..bytes)
        .map(|i| char::from(b'a' + ((i.wrapping_mul(7).wrapping_add(n.wrapping_mul(13))) % 26) as u8))
        .collect();
    json!({ "n": n, "filler": filler })
}

/// A pause of 0..`max_ms` milliseconds, different each time: the fault hits at a random point.
fn random_pause(max_ms: u64) -> Duration {
    Duration::from_millis(rand::random::<u64>() % max_ms.max(1))
}

/// Poll `/health` until it answers `status` (and `database`, if given).
async fn wait_health(server: &Herald, status: u16, database: Option<&str>) -> Value {
    let deadline = Instant::now() + SOON;
    loop {
        let (got, body) = server.call("GET", "/health", None).await;
        if got == status && database.is_none_or(|d| body["database"] == d) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/health never became {status} {database:?}: {got} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every message id of an app, through the API (all pages).
async fn stored_messages(herald: &Herald, app: &str) -> BTreeSet<String> {
    herald
        .messages(app)
        .await
        .iter()
        .map(|message| message["id"].as_str().expect("id").to_owned())
        .collect()
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

/// Run a load until `stop`; each call of `one` makes one request and records its answer.
fn producers<F, Fut>(count: usize, stop: &Arc<AtomicBool>, one: F) -> Vec<tokio::task::JoinHandle<Ledger>>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (u16, u16, Value)> + Send,
{
    (0..count)
        .map(|p| {
            let stop = stop.clone();
            let one = one.clone();
            tokio::spawn(async move {
                let mut ledger = Ledger::default();
                let mut n = p * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    let (ok, status, body) = one(n).await;
                    ledger.answer(ok, status, &body);
                    n += 1;
                }
                ledger
            })
        })
        .collect()
}

async fn gather(tasks: Vec<tokio::task::JoinHandle<Ledger>>, into: &mut Ledger) {
    for task in tasks {
        into.absorb(task.await.expect("producer"));
    }
}

/// One round: load, fill at a random moment, hold full, free, wait for writes to succeed again.
/// `write` makes one write and answers (acknowledging status, status, body).
async fn fault_round<F, Fut>(server: &Herald, tmpfs: &SizedTmpfs, ledger: &mut Ledger, write: F)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (u16, u16, Value)> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let load = producers(PRODUCERS, &stop, write.clone());
    tokio::time::sleep(random_pause(500)).await;
    let ballast = tmpfs.ballast();
    ballast.fill();
    // Full: the server says so, on writes and on /health, and keeps saying so while it lasts.
    // The checks' own writes, numbered apart from the producers'.
    let mut probe = 900_000_000..;
    let deadline = Instant::now() + SOON;
    loop {
        let (ok, status, body) = write(probe.next().unwrap_or_default()).await;
        if status == 503 && body["code"] == "storage_full" {
            break;
        }
        ledger.answer(ok, status, &body);
        assert!(
            Instant::now() < deadline,
            "the disk is full, yet no write was refused: {status} {body}"
        );
        // Any space left (a WAL frame reused, a page freed) goes to the ballast.
        ballast.fill();
    }
    let health = wait_health(server, 503, Some("full")).await;
    assert_eq!(health["status"], "unavailable", "{health}");
    tokio::time::sleep(Duration::from_millis(300) + random_pause(700)).await;
    ballast.free();
    // Freed: writes succeed again by themselves, no restart.
    let deadline = Instant::now() + SOON;
    loop {
        let (ok, status, body) = write(probe.next().unwrap_or_default()).await;
        ledger.answer(ok, status, &body);
        if status == ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "writes did not resume after space was freed: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_health(server, 200, Some("ok")).await;
    tokio::time::sleep(random_pause(300)).await;
    stop.store(true, Ordering::Relaxed);
    gather(load, ledger).await;
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
        let stop = Arc::new(AtomicBool::new(false));
        let creator = {
            let herald = herald.clone();
            producers(1, &stop, move |n| {
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
        let write = {
            let herald = herald.clone();
            let app = app.clone();
            move |n: usize| {
                let herald = herald.clone();
                let path = format!("/app/{app}/msg");
                async move {
                    let body = json!({"eventType": "disk.full", "payload": payload(n, 8_000)});
                    let (status, body) = herald.call("POST", &path, Some(body)).await;
                    (202, status, body)
                }
            }
        };
        fault_round(&herald, &tmpfs, &mut messages, write).await;
        stop.store(true, Ordering::Relaxed);
        gather(creator, &mut apps).await;
    }
    assert!(
        messages.violations.is_empty(),
        "answers that are neither 202 nor 503: {:?}",
        messages.violations
    );
    assert!(
        apps.violations.is_empty(),
        "answers that are neither 201 nor 503: {:?}",
        apps.violations
    );
    assert!(
        messages.refused_with("storage_full") >= rounds,
        "{:?}",
        messages.refused
    );

    // Through the API: every acknowledged message and app is there.
    messages.assert_all_stored(&stored_messages(&herald, &app).await, "through the API");
    apps.assert_all_stored(&stored_apps(&herald, &apps.acknowledged).await, "apps through the API");

    // At the receiver: every acknowledged message arrives, and nothing arrives that is not stored.
    let stored = stored_messages(&herald, &app).await;
    let arrivals = messages
        .wait_arrivals(&receiver, "webhook-id", Duration::from_secs(90))
        .await;
    let phantom: Vec<&String> = arrivals.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(phantom.is_empty(), "delivered but not stored: {phantom:?}");

    // After kill -9 and a restart: still all there.
    let mut herald = Arc::try_unwrap(herald).unwrap_or_else(|_| panic!("the producers are done"));
    herald.kill9();
    herald.restart().await;
    messages.assert_all_stored(&stored_messages(&herald, &app).await, "after kill -9 and restart");
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
    assert!(
        events.violations.is_empty(),
        "answers that are neither 200 nor 503: {:?}",
        events.violations
    );
    assert!(events.refused_with("storage_full") >= rounds, "{:?}", events.refused);

    let mut inbox = Arc::try_unwrap(inbox).unwrap_or_else(|_| panic!("the producers are done"));
    let arrivals = events.assert_inbox_kept(&mut inbox, &handler, |_, _| {}).await;
    report(
        "inbox, SQLite, disk full",
        rounds,
        &events,
        faults::duplicates(&arrivals),
    );
}
