//! Scale-out on PostgreSQL, at the store level: nodes share the delivery partitions through leases,
//! take over a dead node's partitions, wake each other for new work, and a stale owner's writes are
//! fenced out. Skipped with a visible message when PostgreSQL is unreachable (fatal with
//! `HERALD_REQUIRE_POSTGRES=1`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_core::id::{AppId, AttemptId, EndpointId, MessageId};
use herald_core::model::{Application, Attempt, AttemptTrigger, DeliveryStatus, Endpoint, Ordering};
use herald_core::outcome::OutcomeClass;
use herald_store::postgres::PgStore;
use herald_store::{
    AttemptRecord, DeliveryStore, Ingested, NewMessage, OwnershipEvent, PageRequest, Store, StoreOptions, partition_of,
    testdb,
};
use sqlx::{Connection, PgConnection};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::store::at;

fn options() -> StoreOptions {
    StoreOptions {
        lease_ttl: Duration::from_secs(2),
        release_drain: Duration::from_millis(300),
        ..StoreOptions::default()
    }
}

/// A fresh application (also for the other PostgreSQL modules of this binary).
pub(crate) fn app() -> Application {
    Application {
        id: AppId::new(),
        uid: None,
        name: "shop".into(),
        rate_limit: None,
        verify_endpoints: false,
        payload_retention_days: None,
        metadata: BTreeMap::new(),
        created_at: at(1),
        updated_at: at(1),
    }
}

/// An endpoint of `app_id` subscribed to everything (also for the other PostgreSQL modules of this binary).
pub(crate) fn endpoint(app_id: &AppId) -> Endpoint {
    Endpoint {
        id: EndpointId::new(),
        app_id: app_id.clone(),
        uid: None,
        url: "https://example.com/hook".into(),
        description: String::new(),
        filter_types: None,
        channels: None,
        disabled: false,
        disabled_reason: None,
        rate_limit: None,
        max_concurrency: None,
        ordering: Ordering::Unordered,
        request_timeout_ms: None,
        signature_headers: None,
        version: 1,
        metadata: BTreeMap::new(),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        headers: BTreeMap::new(),
        created_at: at(1),
        updated_at: at(1),
    }
}

/// A message of type `a.b` to `app_id` (also for the other PostgreSQL modules of this binary).
pub(crate) fn message(app_id: &AppId) -> NewMessage {
    NewMessage {
        app_id: app_id.clone(),
        event_id: None,
        event_type: "a.b".into(),
        channels: None,
        payload: Arc::from(&b"{}"[..]),
        idempotency_key: None,
        ordering_key: None,
        tags: None,
        deliver_at: None,
        to_endpoint: None,
        payload_retention_ms: None,
    }
}

async fn ingest(store: &PgStore, app_id: &AppId) -> (MessageId, i64) {
    match store.ingest(message(app_id)).await.unwrap() {
        Ingested::Created { message, deliveries } => (message.id.clone(), deliveries[0].seq),
        Ingested::Duplicate(m) => panic!("unexpected duplicate {}", m.id),
    }
}

async fn owners(url: &str) -> BTreeMap<String, i64> {
    let mut conn = PgConnection::connect(url).await.unwrap();
    let rows: Vec<(Option<String>, i64)> =
        sqlx::query_as("SELECT owner, COUNT(*) FROM partition_lease WHERE expires_at > now() GROUP BY owner")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    rows.into_iter().filter_map(|(o, n)| o.map(|o| (o, n))).collect()
}

/// Wait until `check` holds, failing after `timeout` with `what`.
pub(crate) async fn wait_until<F: AsyncFn() -> bool>(what: &str, timeout: Duration, check: F) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until nodes `a` and `b` own half the partitions each, failing after `timeout`.
async fn split_evenly(url: &str, a: &PgStore, b: &PgStore, timeout: Duration) {
    let even = BTreeMap::from([(a.node_id().to_owned(), 128), (b.node_id().to_owned(), 128)]);
    wait_until("the partitions are split evenly", timeout, async || {
        owners(url).await == even
    })
    .await;
}

/// The next `Work` event naming `endpoint` (other events are skipped).
async fn work_for(events: &mut UnboundedReceiver<OwnershipEvent>, endpoint: &str, timeout: Duration) {
    tokio::time::timeout(timeout, async {
        loop {
            match events.recv().await {
                Some(OwnershipEvent::Work(ids)) if ids.iter().any(|id| id == endpoint) => return,
                Some(_) => {}
                None => panic!("ownership events ended"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no work event for {endpoint}"));
}

/// An endpoint of `app` whose partition `owner` owns.
async fn endpoint_owned_by(store: &PgStore, owner: &PgStore, app_id: &AppId) -> Endpoint {
    let ownership = owner.ownership().unwrap();
    loop {
        let e = endpoint(app_id);
        if ownership.owns(&e.id) {
            store.create_endpoint(&e).await.unwrap();
            return e;
        }
    }
}

#[tokio::test]
async fn nodes_share_the_partitions_wake_each_other_and_take_over_from_a_dead_node() {
    let Some(database) = testdb::fresh("nodes_share_the_partitions…").await else {
        return;
    };
    let a = PgStore::open(&database.url, testdb::test_cipher(), &options())
        .await
        .unwrap();
    assert_eq!(
        owners(&database.url).await,
        BTreeMap::from([(a.node_id().to_owned(), 256)]),
        "a lone node owns every partition as soon as it is open"
    );
    let mut a_events = a.ownership().unwrap().take_events().unwrap();
    let b = PgStore::open(&database.url, testdb::test_cipher(), &options())
        .await
        .unwrap();
    let mut b_events = b.ownership().unwrap().take_events().unwrap();
    split_evenly(&database.url, &a, &b, Duration::from_secs(15)).await;
    let (oa, ob) = (a.ownership().unwrap(), b.ownership().unwrap());
    for _ in 0..200 {
        let id = EndpointId::new();
        assert!(oa.owns(&id) != ob.owns(&id), "exactly one node owns {id}");
    }

    // Ingest on A for an endpoint B owns: B is told (NOTIFY), A's commit feed carries it too but A's
    // engine would skip it (A does not own it).
    let shop = app();
    a.create_app(&shop).await.unwrap();
    let on_b = endpoint_owned_by(&a, &b, &shop.id).await;
    assert!(!oa.owns(&on_b.id));
    let (_, seq) = ingest(&a, &shop.id).await;
    work_for(&mut b_events, &on_b.id, Duration::from_secs(5)).await;

    // B dies without a word (its tasks stop, its leases stay until they expire): A takes everything
    // over within the lease time plus a couple of heartbeats, and is told about B's pending work.
    drop(b);
    let started = Instant::now();
    // The database shows a lease taken over as soon as it commits, the node's own view just after: wait
    // for both.
    wait_until("A owns every partition again", Duration::from_secs(10), async || {
        owners(&database.url).await == BTreeMap::from([(a.node_id().to_owned(), 256)]) && oa.owns(&on_b.id)
    })
    .await;
    work_for(&mut a_events, &on_b.id, Duration::from_secs(5)).await;
    let pending = a.load_pending(&on_b.id, 0, 10).await.unwrap();
    assert_eq!(pending.iter().map(|p| p.seq).collect::<Vec<_>>(), [seq]);
    eprintln!("take-over after {:?}", started.elapsed());
}

#[tokio::test]
async fn ingest_notifies_the_other_nodes_only_for_endpoints_they_own() {
    let Some(database) = testdb::fresh("ingest_notifies_the_other_nodes_only…").await else {
        return;
    };
    let mut listener = sqlx::postgres::PgListener::connect(&database.url).await.unwrap();
    listener.listen("herald_work").await.unwrap();
    let a = PgStore::open(&database.url, testdb::test_cipher(), &options())
        .await
        .unwrap();
    let shop = app();
    a.create_app(&shop).await.unwrap();
    let on_a = endpoint(&shop.id);
    a.create_endpoint(&on_a).await.unwrap();

    // A lone node owns every endpoint: its engine has the deliveries from its commit feed, and a
    // notification would only make every notifying commit of the cluster wait for this one's flush.
    ingest(&a, &shop.id).await;
    let heard = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await;
    assert!(heard.is_err(), "a lone node's ingest notified: {heard:?}");

    // With a second node, an ingest for an endpoint that node owns tells it at commit.
    let b = PgStore::open(&database.url, testdb::test_cipher(), &options())
        .await
        .unwrap();
    split_evenly(&database.url, &a, &b, Duration::from_secs(15)).await;
    a.delete_endpoint(&on_a.id).await.unwrap();
    endpoint_owned_by(&a, &b, &shop.id).await;
    ingest(&a, &shop.id).await;
    let heard = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification for the other node")
        .unwrap();
    assert_eq!(heard.payload(), a.node_id(), "the notifying node names itself");
}

/// A first attempt of delivery `seq` (`message_id` to `e`) that succeeded.
fn delivered(seq: i64, message_id: &MessageId, e: &Endpoint) -> AttemptRecord {
    AttemptRecord {
        delivery_seq: seq,
        app_id: e.app_id.clone(),
        attempt: Attempt {
            id: AttemptId::new(),
            message_id: message_id.clone(),
            endpoint_id: e.id.clone(),
            url: e.url.clone(),
            attempt_number: 1,
            success: true,
            outcome: OutcomeClass::Success,
            response_status: Some(200),
            response: String::new(),
            duration_ms: 3,
            trigger: AttemptTrigger::Scheduled,
            created_at: herald_core::clock::now(),
        },
        status: DeliveryStatus::Delivered,
        next_attempt_at: at(0),
    }
}

#[tokio::test]
async fn a_stale_owner_cannot_write_results_for_a_partition_taken_over() {
    let Some(database) = testdb::fresh("a_stale_owner_cannot_write_results…").await else {
        return;
    };
    let store = PgStore::open(&database.url, testdb::test_cipher(), &options())
        .await
        .unwrap();
    let mut events = store.ownership().unwrap().take_events().unwrap();
    let shop = app();
    store.create_app(&shop).await.unwrap();
    let e = endpoint(&shop.id);
    store.create_endpoint(&e).await.unwrap();
    let (message_id, seq) = ingest(&store, &shop.id).await;
    assert!(store.ownership().unwrap().owns(&e.id));

    // Another node takes the endpoint's partition over (as after this node was paused past its lease).
    let mut conn = PgConnection::connect(&database.url).await.unwrap();
    sqlx::query(
        "UPDATE partition_lease SET owner = 'node_elsewhere', epoch = epoch + 1, \
         expires_at = now() + interval '1 hour' WHERE partition = $1",
    )
    .bind(partition_of(&e.id))
    .execute(&mut conn)
    .await
    .unwrap();

    let record = delivered(seq, &message_id, &e);
    store.record_attempts(&[record]).await.unwrap();
    store.expire_deliveries(&[seq], at(5)).await.unwrap();
    assert_eq!(
        store.delivery_state(&message_id, &e.id).await.unwrap(),
        (DeliveryStatus::Pending, 0),
        "the stale owner's result and expiry were rejected"
    );
    assert!(
        store
            .list_attempts_by_message(&shop.id, &message_id, &Default::default(), &PageRequest::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // At its next renewal the node learns it lost the partition, and tells its engine.
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.recv().await {
                Some(OwnershipEvent::Released(partitions)) => {
                    assert!(partitions.contains(&partition_of(&e.id)), "{partitions:?}");
                    break;
                }
                Some(_) => {}
                None => panic!("the events ended"),
            }
        }
    })
    .await
    .expect("a Released event");
    assert!(!store.ownership().unwrap().owns(&e.id));
}

#[tokio::test]
async fn a_node_that_shuts_down_hands_its_partitions_over_at_once() {
    let Some(database) = testdb::fresh("a_node_that_shuts_down_hands_its_partitions_over_at_once").await else {
        return;
    };
    // A long lease: waiting for it to expire would take longer than this test allows.
    let options = StoreOptions {
        lease_ttl: Duration::from_secs(20),
        ..options()
    };
    let a = PgStore::open(&database.url, testdb::test_cipher(), &options)
        .await
        .unwrap();
    let b = PgStore::open(&database.url, testdb::test_cipher(), &options)
        .await
        .unwrap();
    split_evenly(&database.url, &a, &b, Duration::from_secs(30)).await;
    b.shutdown().await;
    let b_owns_nothing = (0..100).all(|_| !b.ownership().unwrap().owns(&EndpointId::new()));
    assert!(b_owns_nothing, "a node that shut down owns nothing");
    wait_until("A owns every partition", Duration::from_secs(10), async || {
        owners(&database.url).await == BTreeMap::from([(a.node_id().to_owned(), 256)])
    })
    .await;
}

/// A node that gives partitions up to a newcomer gives up only its share above, and keeps delivering for
/// the rest while the given-up ones drain. The drain here outlasts several heartbeats, as in production
/// (the longest attempt against a quarter of the lease time): a node that counted its draining partitions
/// as still held gave up the rest at its next heartbeat, and the whole cluster stopped delivering until
/// the drain ended.
#[tokio::test]
async fn a_node_keeps_its_share_while_the_partitions_it_gave_up_drain() {
    let Some(database) = testdb::fresh("a_node_keeps_its_share_while_the_partitions_it_gave_up_drain").await else {
        return;
    };
    let drain = Duration::from_secs(3);
    let options = StoreOptions {
        release_drain: drain,
        ..options()
    };
    let a = PgStore::open(&database.url, testdb::test_cipher(), &options)
        .await
        .unwrap();
    // One endpoint id in each partition, to count the partitions a node schedules for.
    let mut by_partition = BTreeMap::new();
    while by_partition.len() < 256 {
        let id = EndpointId::new();
        by_partition.entry(partition_of(&id)).or_insert(id);
    }
    let oa = a.ownership().unwrap();
    let active = || by_partition.values().filter(|id| oa.owns(id)).count();
    assert_eq!(active(), 256, "a lone node schedules for every partition");

    let b = PgStore::open(&database.url, testdb::test_cipher(), &options)
        .await
        .unwrap();
    let started = Instant::now();
    let mut seen = Vec::new();
    // Sample through most of the drain: five heartbeats and more.
    while started.elapsed() < drain - Duration::from_millis(500) {
        seen.push(active());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen.contains(&128), "A gave half its partitions up: {seen:?}");
    assert!(
        seen.iter().all(|&n| n >= 128),
        "A kept scheduling for its share while the rest drained: {seen:?}"
    );
    split_evenly(&database.url, &a, &b, Duration::from_secs(15)).await;
    assert_eq!(active(), 128, "A schedules for its half once the hand-over ended");
}

/// A partition given up is cleared for the next owner as soon as the engine says nothing of it is in
/// flight (`Ownership::drained`), not after the longest attempt; word about partitions that are not
/// draining changes nothing.
#[tokio::test]
async fn a_partition_given_up_goes_to_the_next_owner_once_reported_drained() {
    let Some(database) = testdb::fresh("a_partition_given_up_goes_to_the_next_owner_once_reported_drained").await
    else {
        return;
    };
    // A drain far longer than the test waits: only the report can end it in time.
    let options = StoreOptions {
        release_drain: Duration::from_secs(120),
        ..options()
    };
    let a = PgStore::open(&database.url, testdb::test_cipher(), &options)
        .await
        .unwrap();
    let oa = a.ownership().unwrap();
    let b = PgStore::open(&database.url, testdb::test_cipher(), &options)
        .await
        .unwrap();
    wait_until("A gave half its partitions up", Duration::from_secs(10), async || {
        (0..herald_store::PARTITIONS).filter(|&p| oa.owns_partition(p)).count() == 128
    })
    .await;
    let given_up: Vec<i32> = (0..herald_store::PARTITIONS)
        .filter(|&p| !oa.owns_partition(p))
        .collect();
    // A report for partitions A still owns is ignored: they stay A's.
    let kept: Vec<i32> = (0..herald_store::PARTITIONS)
        .filter(|&p| oa.owns_partition(p))
        .collect();
    oa.drained(&kept);
    // Half the given-up partitions first: B gets exactly those, the rest wait.
    let (first, rest) = given_up.split_at(64);
    oa.drained(first);
    wait_until(
        "B owns the first partitions reported drained",
        Duration::from_secs(10),
        async || owners(&database.url).await.get(b.node_id()) == Some(&64),
    )
    .await;
    oa.drained(rest);
    split_evenly(&database.url, &a, &b, Duration::from_secs(10)).await;
    let ob = b.ownership().unwrap();
    assert!(given_up.iter().all(|&p| ob.owns_partition(p)), "B owns what A gave up");
    assert!(kept.iter().all(|&p| oa.owns_partition(p)), "A kept its share");
}

/// Results the database cannot take right now (here: the attempt table locked past `lock_timeout`; a full
/// disk alike) are an error for the result writer to retry, never records dropped as if refused for good:
/// a dropped record leaves its delivery pending, to be sent again after a restart, and its attempt lost.
#[tokio::test]
async fn results_the_database_cannot_take_now_fail_and_are_not_dropped() {
    let Some(database) = testdb::fresh("results_the_database_cannot_take_now_fail").await else {
        return;
    };
    // The default lease time: the writes below wait for their lock with the partitions' lease rows
    // share-locked, which holds the renewals back, so a lease of 2 s would run out meanwhile.
    let store = PgStore::open(&database.url, testdb::test_cipher(), &StoreOptions::default())
        .await
        .unwrap();
    let shop = app();
    store.create_app(&shop).await.unwrap();
    let e = endpoint(&shop.id);
    store.create_endpoint(&e).await.unwrap();
    let (first, first_seq) = ingest(&store, &shop.id).await;
    let (second, second_seq) = ingest(&store, &shop.id).await;
    assert!(store.ownership().unwrap().owns(&e.id));
    let records = [delivered(first_seq, &first, &e), delivered(second_seq, &second, &e)];

    let mut locker = PgConnection::connect(&database.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE attempt IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    let refused = store.record_attempts(&records).await;
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    match refused {
        Err(error) => assert!(error.fault().is_some(), "a storage fault, retried: {error}"),
        Ok(()) => panic!("results written while their table was locked away: reported stored, yet dropped"),
    }

    store.record_attempts(&records).await.unwrap();
    for (message_id, label) in [(&first, "first"), (&second, "second")] {
        assert_eq!(
            store.delivery_state(message_id, &e.id).await.unwrap(),
            (DeliveryStatus::Delivered, 1),
            "the {label} delivery's result is stored once the table answers"
        );
    }
}

/// The group-commit writer keeps its connection only while batches follow each other: idle, it gives it
/// back to the pool, so a connection the server dropped meanwhile (a restart, a failover, an
/// `idle_session_timeout`) is found out by the pool's ping and replaced, and costs no ingest an error.
#[tokio::test]
async fn an_ingest_after_the_servers_sessions_ended_while_idle_is_stored() {
    let Some(database) = testdb::fresh("an_ingest_after_the_servers_sessions_ended…").await else {
        return;
    };
    let a = PgStore::open(&database.url, testdb::test_cipher(), &options())
        .await
        .unwrap();
    let shop = app();
    a.create_app(&shop).await.unwrap();
    a.create_endpoint(&endpoint(&shop.id)).await.unwrap();
    ingest(&a, &shop.id).await;

    // End every session of the node, the writer's among them, as a server restart would.
    let mut admin = PgConnection::connect(&database.url).await.unwrap();
    let sessions: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'herald'",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(!sessions.is_empty(), "no session of the node was found to end");
    sqlx::query("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS s (pid)")
        .bind(&sessions)
        .execute(&mut admin)
        .await
        .unwrap();
    let url = database.url.clone();
    wait_until("the ended sessions are gone", Duration::from_secs(5), async || {
        let mut conn = PgConnection::connect(&url).await.unwrap();
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = ANY($1)")
            .bind(&sessions)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        left == 0
    })
    .await;

    // The next message is stored, not refused for a connection that died while nobody used it.
    ingest(&a, &shop.id).await;
}
