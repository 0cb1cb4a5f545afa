//! Fan-out on PostgreSQL across nodes: each node's writer caches every application's endpoint list
//! (checked against the application's `endpoints_version`), and no foreign key ties a delivery to its
//! endpoint or message (migration 0028), so what another node changes must reach the next batch at once,
//! and deleting an endpoint or an application while nodes fan out to it must leave no delivery behind.
//! Skipped with a visible message when PostgreSQL is unreachable (fatal with `HERALD_REQUIRE_POSTGRES=1`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};

use herald_core::id::{AppId, EndpointId};
use herald_store::postgres::PgStore;
use herald_store::{DeliveryStore, Ingested, Store, StoreError, StoreOptions, testdb};
use sqlx::{Connection, PgConnection};

use crate::leases::{app, endpoint, message};

/// The endpoints one message to `app_id`, ingested on `node`, was fanned out to.
async fn fanned_out_to(node: &PgStore, app_id: &AppId) -> BTreeSet<EndpointId> {
    match node.ingest(message(app_id)).await.unwrap() {
        Ingested::Created { deliveries, .. } => deliveries.into_iter().map(|d| d.endpoint_id).collect(),
        Ingested::Duplicate(m) => panic!("unexpected duplicate {}", m.id),
    }
}

/// A node on `database` with the default options (also for the other PostgreSQL modules of this binary).
pub(crate) async fn node(database: &testdb::TestDatabase) -> PgStore {
    PgStore::open(&database.url, testdb::test_cipher(), &StoreOptions::default())
        .await
        .unwrap()
}

/// Deliveries whose endpoint or message is gone.
async fn orphans(url: &str) -> i64 {
    let mut conn = PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM delivery d WHERE NOT EXISTS (SELECT 1 FROM endpoint e WHERE e.id = d.endpoint_id) \
         OR NOT EXISTS (SELECT 1 FROM message m WHERE m.id = d.message_id)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap()
}

/// Run one statement on a connection of its own, as one of the transactions a test plays (the ids it
/// names are the store's own, so they are written into the text; also for the other PostgreSQL modules of
/// this binary).
pub(crate) async fn run(conn: &mut PgConnection, sql: &str) -> sqlx::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(conn)
        .await
        .map(drop)
}

/// The ingest lock as the tests here play it (any advisory key stands for it between their transactions).
const INGEST_LOCK: &str = "SELECT pg_advisory_xact_lock(42)";

/// A re-queue as `hold_endpoint` starts one: its endpoint held `FOR KEY SHARE`, its transaction open.
async fn requeue_holding(url: &str, endpoint_id: &EndpointId) -> PgConnection {
    let mut requeue = PgConnection::connect(url).await.unwrap();
    run(&mut requeue, "BEGIN").await.unwrap();
    let hold = format!("SELECT id FROM endpoint WHERE id = '{endpoint_id}' FOR KEY SHARE");
    run(&mut requeue, &hold).await.unwrap();
    requeue
}

/// An ingest batch as the writer starts one: the ingest lock taken, its transaction open; a lock wait of
/// its gives up after `wait` (a failure, where the writer's would be a cycle the database breaks later).
async fn batch_holding_the_ingest_lock(url: &str, wait: &str) -> PgConnection {
    let mut batch = PgConnection::connect(url).await.unwrap();
    for sql in ["BEGIN", &format!("SET LOCAL lock_timeout = '{wait}'"), INGEST_LOCK] {
        run(&mut batch, sql).await.unwrap();
    }
    batch
}

/// The batch reads its application's row as the writer does (`FOR SHARE SKIP LOCKED`: it never waits for
/// it) and must get it (`why`) — skipped, the application's messages would be deferred for as long as the
/// row is held — and commits; then the re-queue, free to take the ingest lock, commits too.
async fn batch_then_requeue_commit(batch: &mut PgConnection, requeue: &mut PgConnection, app_id: &AppId, why: &str) {
    let share = format!("SELECT id FROM application WHERE id = '{app_id}' FOR SHARE SKIP LOCKED");
    let got: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(share))
        .fetch_all(&mut *batch)
        .await
        .unwrap();
    assert_eq!(got, vec![app_id.to_string()], "{why}");
    run(batch, "COMMIT").await.unwrap();
    run(requeue, INGEST_LOCK).await.unwrap();
    run(requeue, "COMMIT").await.unwrap();
}

/// A node's cached list is never used after another node changed the application's endpoints: the
/// next message it takes fans out as the table now says.
#[tokio::test]
async fn endpoint_changes_on_another_node_reach_the_next_message_at_once() {
    let Some(database) = testdb::fresh("endpoint_changes_on_another_node_reach…").await else {
        return;
    };
    let (a, b) = (node(&database).await, node(&database).await);
    let shop = app();
    a.create_app(&shop).await.unwrap();
    let first = endpoint(&shop.id);
    a.create_endpoint(&first).await.unwrap();
    assert_eq!(fanned_out_to(&a, &shop.id).await, BTreeSet::from([first.id.clone()]));

    let mut second = endpoint(&shop.id);
    b.create_endpoint(&second).await.unwrap();
    assert_eq!(
        fanned_out_to(&a, &shop.id).await,
        BTreeSet::from([first.id.clone(), second.id.clone()]),
        "an endpoint created on the other node"
    );

    second.filter_types = Some(vec!["x.y".into()]);
    b.update_endpoint(&second).await.unwrap();
    assert_eq!(
        fanned_out_to(&a, &shop.id).await,
        BTreeSet::from([first.id.clone()]),
        "a filter narrowed on the other node"
    );

    b.delete_endpoint(&first.id).await.unwrap();
    assert!(
        fanned_out_to(&a, &shop.id).await.is_empty(),
        "an endpoint deleted on the other node"
    );
    assert_eq!(orphans(&database.url).await, 0, "its deliveries went with it");
}

/// Two nodes fan out to an application's endpoints without pause while a third client deletes them one
/// by one, and then deletes a second application being written to as well: every delivery left has its
/// endpoint and its message (the deletes wait for the batches that hold the application, and those after
/// them see the endpoint gone).
#[tokio::test]
async fn deleting_endpoints_and_apps_while_nodes_fan_out_leaves_no_delivery_behind() {
    let Some(database) = testdb::fresh("deleting_endpoints_and_apps_while_nodes…").await else {
        return;
    };
    let (a, b) = (node(&database).await, node(&database).await);
    let (shop, other) = (app(), app());
    let mut endpoints = Vec::new();
    for owner in [&shop, &other] {
        a.create_app(owner).await.unwrap();
        for _ in 0..12 {
            let e = endpoint(&owner.id);
            a.create_endpoint(&e).await.unwrap();
            endpoints.push(e);
        }
    }
    let (a, b) = (Arc::new(a), Arc::new(b));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for node in [a.clone(), b.clone()] {
        for target in [shop.id.clone(), other.id.clone()] {
            let (node, stop) = (node.clone(), stop.clone());
            writers.push(tokio::spawn(async move {
                let mut created = 0_u32;
                while !stop.load(AtomicOrdering::Relaxed) {
                    let batch = (0..8).map(|_| message(&target)).collect();
                    for outcome in node.ingest_many(batch).await.unwrap() {
                        match outcome {
                            Ok(Ingested::Created { .. }) => created += 1,
                            // The application was deleted under it.
                            Err(StoreError::NotFound) => {}
                            other => panic!("unexpected outcome {other:?}"),
                        }
                    }
                }
                created
            }));
        }
    }
    let deleter = node(&database).await;
    for e in endpoints.iter().filter(|e| e.app_id == shop.id).take(10) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        deleter.delete_endpoint(&e.id).await.unwrap();
    }
    deleter.delete_app(&other.id).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    stop.store(true, AtomicOrdering::Relaxed);
    let mut created = 0;
    for writer in writers {
        created += writer.await.unwrap();
    }
    assert!(
        created > 100,
        "the nodes fanned out while the deletes ran ({created} messages)"
    );

    assert_eq!(
        orphans(&database.url).await,
        0,
        "a delivery outlived its endpoint or message"
    );
    let mut conn = PgConnection::connect(&database.url).await.unwrap();
    let left: Vec<String> = sqlx::query_scalar("SELECT DISTINCT endpoint_id FROM delivery ORDER BY 1")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    let mut kept: Vec<String> = endpoints
        .iter()
        .filter(|e| e.app_id == shop.id)
        .skip(10)
        .map(|e| e.id.to_string())
        .collect();
    kept.sort_unstable();
    assert_eq!(left, kept, "only the endpoints never deleted have deliveries");
}

/// Deleting an application locks its endpoints before its row, as every endpoint write does: taken the
/// other way round, it would hold the row while it waits for an endpoint a re-queue holds (the re-queue
/// waiting for the ingest lock), and every batch meanwhile would skip the application and defer its
/// messages (before batches skipped a locked row, it closed a wait cycle with them). Played here with the
/// statements each of those runs first: while the delete waits for the re-queue's endpoint, a batch gets
/// the application's row — and a message to it is written at once.
#[tokio::test]
async fn deleting_an_app_waits_for_a_held_endpoint_before_it_locks_the_app() {
    let Some(database) = testdb::fresh("deleting_an_app_waits_for_a_held_endpoint…").await else {
        return;
    };
    let store = node(&database).await;
    let shop = app();
    store.create_app(&shop).await.unwrap();
    let held = endpoint(&shop.id);
    store.create_endpoint(&held).await.unwrap();

    // The re-queue: its endpoint held, as `hold_endpoint` holds it.
    let mut requeue = requeue_holding(&database.url, &held.id).await;

    let store = Arc::new(store);
    let deleting = tokio::spawn({
        let (store, id) = (store.clone(), shop.id.clone());
        async move { store.delete_app(&id).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!deleting.is_finished(), "the delete waits for the held endpoint");
    let written = tokio::time::timeout(std::time::Duration::from_secs(2), store.ingest(message(&shop.id))).await;
    assert!(
        matches!(written, Ok(Ok(Ingested::Created { .. }))),
        "a message to the application is written while the delete waits: {written:?}"
    );

    // The batch: the ingest lock, then its application's row — which it must get while the delete waits;
    // then the re-queue goes on (the ingest lock is free) and commits, and the delete ends.
    let mut batch = batch_holding_the_ingest_lock(&database.url, "2s").await;
    batch_then_requeue_commit(
        &mut batch,
        &mut requeue,
        &shop.id,
        "the batch takes the application's row while the delete waits for an endpoint",
    )
    .await;
    deleting.await.unwrap().unwrap();
    assert!(matches!(
        store.get_endpoint_by_id(&held.id).await,
        Err(StoreError::NotFound)
    ));
}

/// An endpoint created while `delete_app` waits for the application's row (after it locked the endpoints
/// it found) is not locked by it first: should a re-queue hold the new endpoint, `delete_app` would wait
/// for it holding the application's row, and every batch meanwhile would defer the application's messages
/// (it closed a wait cycle with the batch and the re-queue before batches skipped a locked row). It starts
/// again instead, without the application's row, so the batch gets it.
#[tokio::test]
async fn deleting_an_app_starts_again_when_an_endpoint_appeared_meanwhile() {
    let Some(database) = testdb::fresh("deleting_an_app_starts_again…").await else {
        return;
    };
    let store = Arc::new(node(&database).await);
    let shop = app();
    store.create_app(&shop).await.unwrap();
    let first = endpoint(&shop.id);
    store.create_endpoint(&first).await.unwrap();
    let connect = || PgConnection::connect(&database.url);

    // Something holds the application's row as a foreign-key check does, so the delete waits for it
    // after locking `first`.
    let mut holder = connect().await.unwrap();
    run(&mut holder, "BEGIN").await.unwrap();
    run(
        &mut holder,
        &format!("SELECT id FROM application WHERE id = '{}' FOR KEY SHARE", shop.id),
    )
    .await
    .unwrap();
    let deleting = tokio::spawn({
        let (store, id) = (store.clone(), shop.id.clone());
        async move { store.delete_app(&id).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    // Meanwhile another endpoint of the application is created (a copy of the first), and a re-queue
    // takes it.
    let late = EndpointId::new();
    let mut creator = connect().await.unwrap();
    for sql in [
        "BEGIN".to_owned(),
        "SET LOCAL lock_timeout = '2s'".to_owned(),
        format!(
            "CREATE TEMP TABLE copied AS SELECT * FROM endpoint WHERE id = '{}'",
            first.id
        ),
        format!("UPDATE copied SET id = '{late}', uid = NULL"),
        "INSERT INTO endpoint SELECT * FROM copied".to_owned(),
        "COMMIT".to_owned(),
    ] {
        run(&mut creator, &sql).await.unwrap();
    }
    let mut requeue = requeue_holding(&database.url, &late).await;
    let mut batch = batch_holding_the_ingest_lock(&database.url, "3s").await;

    // The delete gets the application's row, finds the new endpoint and lets the row go again.
    run(&mut holder, "COMMIT").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    batch_then_requeue_commit(
        &mut batch,
        &mut requeue,
        &shop.id,
        "the batch takes the application's row while the delete waits for the new endpoint",
    )
    .await;

    deleting.await.unwrap().unwrap();
    for gone in [&first.id, &late] {
        assert!(matches!(
            store.get_endpoint_by_id(gone).await,
            Err(StoreError::NotFound)
        ));
    }
}

/// A delete of an application that fails — here its lock wait gives up — changes nothing: the application,
/// its endpoints and its attempt log are all still there (the attempt log is deleted in the delete's one
/// transaction, not before it).
#[tokio::test]
async fn a_failed_app_delete_leaves_the_app_and_its_attempt_log_whole() {
    let Some(database) = testdb::fresh("a_failed_app_delete_leaves_the_app…").await else {
        return;
    };
    let options = StoreOptions {
        database: herald_sql::custody::DatabaseTimeouts {
            statement: std::time::Duration::from_millis(500),
            ..Default::default()
        },
        ..StoreOptions::default()
    };
    let store = PgStore::open(&database.url, testdb::test_cipher(), &options)
        .await
        .unwrap();
    let shop = app();
    store.create_app(&shop).await.unwrap();
    let kept = endpoint(&shop.id);
    store.create_endpoint(&kept).await.unwrap();
    let mut conn = PgConnection::connect(&database.url).await.unwrap();
    run(
        &mut conn,
        &format!(
            "INSERT INTO attempt (id, delivery_seq, app_id, message_id, endpoint_id, url, attempt_number, success, \
             outcome, response_status, response, duration_ms, trigger_type, created_at) VALUES ('{}', 1, '{}', \
             'msg_x', '{}', 'https://example.com/hook', 1, true, 'success', 200, '', 1, 0, 1)",
            herald_core::id::AttemptId::new(),
            shop.id,
            kept.id
        ),
    )
    .await
    .unwrap();

    // A re-queue holds the endpoint past the store's lock wait.
    let mut requeue = requeue_holding(&database.url, &kept.id).await;
    assert!(store.delete_app(&shop.id).await.is_err(), "the delete gives up waiting");
    run(&mut requeue, "ROLLBACK").await.unwrap();

    store
        .get_endpoint_by_id(&kept.id)
        .await
        .expect("the endpoint is still there");
    let attempts: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM attempt WHERE app_id = $1")
        .bind(shop.id.as_str())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(attempts, 1, "the attempt log is still there");
    store.delete_app(&shop.id).await.expect("a later delete succeeds");
}
