//! Disk full under load, on real SQLite files on a size-capped tmpfs: the sender and the inbox never
//! acknowledge a write (a message, an application, an endpoint, an inbox event) they did not commit, refuse with 503 `storage_full` while the disk is full,
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

/// The objects among `ids` that the API finds under `under` (`/app`, `/app/{app}/endpoint`).
async fn stored_under(herald: &Herald, under: &str, ids: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for id in ids {
        let (status, body) = herald.call("GET", &format!("{under}/{id}"), None).await;
        match status {
            200 => {
                found.insert(id.clone());
            }
            404 => {}
            other => panic!("GET {under}/{id}: {other} {body}"),
        }
    }
    found
}

/// Every object acknowledged by each ledger is found under its path (see [`stored_under`]).
async fn assert_created_kept(herald: &Herald, created: &[(String, &Ledger)], when: &str) {
    for (under, ledger) in created {
        let found = stored_under(herald, under, &ledger.acknowledged).await;
        ledger.assert_all_stored(&found, &format!("{under} {when}"));
    }
}

/// The messages whose delivery to `endpoint` is recorded as successful (every page of its attempts).
async fn recorded_successes(herald: &Herald, app: &str, endpoint: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut iterator = String::new();
    loop {
        let path = format!("/app/{app}/attempt/endpoint/{endpoint}?status=0&limit=250{iterator}");
        let page = herald.get(&path).await;
        for attempt in page["data"].as_array().into_iter().flatten() {
            if let Some(id) = attempt["msgId"].as_str() {
                found.insert(id.to_owned());
            }
        }
        match page["iterator"].as_str() {
            Some(next) if page["done"] != true => iterator = format!("&iterator={next}"),
            _ => return found,
        }
    }
}

/// One producer creating an object under `under` every 20 ms, its body from `body` (answered 201).
fn creator(herald: &Arc<Herald>, under: String, body: fn(usize) -> Value) -> Load {
    let herald = herald.clone();
    Load::start(1, move |n| {
        let (herald, under) = (herald.clone(), under.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let (status, answer) = herald.call("POST", &under, Some(body(n))).await;
            (201, status, answer)
        }
    })
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
    let (endpoint, _) = herald.endpoint(&app, json!({ "url": receiver.url() })).await;
    // Endpoints are created on an application of their own, which gets no messages.
    let endpoint_app = herald.app("endpoints").await;
    let endpoints_under = format!("/app/{endpoint_app}/endpoint");
    let herald = Arc::new(herald);

    let rounds = faults::rounds(3);
    let mut messages = Ledger::default();
    let mut apps = Ledger::default();
    let mut endpoints = Ledger::default();
    for _ in 0..rounds {
        // Messages from the producers; apps and endpoints created alongside (the other write paths).
        let app_creator = creator(&herald, "/app".to_owned(), |n| json!({"name": format!("a{n}")}));
        let endpoint_creator = creator(
            &herald,
            endpoints_under.clone(),
            |n| json!({"url": format!("http://127.0.0.1:9/hook/{n}"), "description": format!("e{n}")}),
        );
        let write = faults::message_writer(herald.clone(), app.clone(), "disk.full", |n| payload(n, 8_000));
        fault_round(&herald, &tmpfs, &mut messages, write).await;
        app_creator.finish(&mut apps).await;
        endpoint_creator.finish(&mut endpoints).await;
    }
    messages.assert_answers("storage_full", rounds);
    apps.assert_answers("storage_full", 0);
    endpoints.assert_answers("storage_full", 0);

    // Through the API: every acknowledged message, app and endpoint is there.
    messages.assert_all_stored(&faults::message_ids(&herald, &app).await, "through the API");
    let created = [("/app".to_owned(), &apps), (endpoints_under, &endpoints)];
    assert_created_kept(&herald, &created, "through the API").await;

    // At the receiver: every acknowledged message arrives, and nothing arrives that is not stored.
    let stored = faults::message_ids(&herald, &app).await;
    let arrivals = messages
        .wait_arrivals(&receiver, "webhook-id", Duration::from_secs(90))
        .await;
    let phantom: Vec<&String> = arrivals.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(phantom.is_empty(), "delivered but not stored: {phantom:?}");
    // The result writer, refused while the disk was full, recorded every one of those deliveries since.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let recorded = recorded_successes(&herald, &app, &endpoint).await;
        let missing: Vec<&String> = messages.acknowledged.difference(&recorded).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} acknowledged messages delivered but never recorded as such: {:?}",
            missing.len(),
            missing.iter().take(5).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // After kill -9 and a restart: still all there.
    let mut herald = Arc::try_unwrap(herald).unwrap_or_else(|_| panic!("the producers are done"));
    herald.kill9();
    herald.restart().await;
    messages.assert_all_stored(&faults::message_ids(&herald, &app).await, "after kill -9 and restart");
    assert_created_kept(&herald, &created, "after kill -9 and restart").await;
    report(
        "sender, SQLite, disk full",
        rounds,
        &messages,
        faults::duplicates(&arrivals),
    );
    println!(
        "reliability: sender, SQLite, disk full: applications acknowledged={} endpoints acknowledged={} (refused {} and {})",
        apps.acknowledged.len(),
        endpoints.acknowledged.len(),
        apps.refused_with("storage_full") + apps.refused_with("store_unavailable"),
        endpoints.refused_with("storage_full") + endpoints.refused_with("store_unavailable"),
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
