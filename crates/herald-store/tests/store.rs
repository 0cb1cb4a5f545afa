//! The store's contract, written against `SharedStore` so that every backend runs the same suite:
//! SQLite files and PostgreSQL databases (a fresh one per test), each contract test as one test per
//! backend (`NAME::sqlite`, `NAME::postgres`; see [`on_each_backend`]). Without a reachable PostgreSQL the
//! PostgreSQL half is skipped with a visible message, unless `HERALD_REQUIRE_POSTGRES=1` (CI).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use herald_core::id::{IdKind, new_id};
use herald_core::model::{
    Application, Attempt, AttemptTrigger, BackgroundTask, DeliveryStatus, Endpoint, Message, Ordering,
};
use herald_store::{
    AppToken, AttemptFilter, AttemptRecord, Backlog, Ingested, MessageFilter, NewMessage, PageRequest, Remembered,
    Requeue, RetentionStep, SecretCipher, SharedStore, StoreError, StoreOptions,
};

/// The key secrets are encrypted with in these tests.
fn cipher() -> SecretCipher {
    SecretCipher::from_key(&[7; 32])
}

/// Open the store at `url` with the test key and default options.
async fn open(url: &str) -> herald_store::StoreResult<SharedStore> {
    herald_store::open_with(url, cipher(), &StoreOptions::default()).await
}

/// Fresh storage for one backend: its URL, and what must outlive the store (the SQLite file's
/// directory, or the PostgreSQL test database, dropped after the store).
struct Storage {
    url: String,
    _dir: Option<tempfile::TempDir>,
    _database: Option<herald_store::testdb::TestDatabase>,
}

/// Fresh storage on every backend under test.
async fn storages(test: &str) -> Vec<Storage> {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec![Storage {
        url: format!("sqlite://{}", dir.path().join("store.db").display()),
        _dir: Some(dir),
        _database: None,
    }];
    if let Some(database) = herald_store::testdb::fresh(test).await {
        all.push(Storage {
            url: database.url.clone(),
            _dir: None,
            _database: Some(database),
        });
    }
    all
}

/// The backends a contract test runs on, each as a test of its own.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

/// Fresh storage on `backend`, and the store opened on it; `None` for PostgreSQL when it is unreachable
/// (the test database module has said so visibly, and fails instead when PostgreSQL is required). The
/// storage must outlive the store.
async fn opened(backend: Backend, test: &str) -> Option<(Storage, SharedStore)> {
    let storage = match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            Storage {
                url: format!("sqlite://{}", dir.path().join("store.db").display()),
                _dir: Some(dir),
                _database: None,
            }
        }
        Backend::Postgres => {
            let database = herald_store::testdb::fresh(test).await?;
            Storage {
                url: database.url.clone(),
                _dir: None,
                _database: Some(database),
            }
        }
    };
    let store = open(&storage.url).await.unwrap();
    Some((storage, store))
}

/// `NAME::sqlite` and `NAME::postgres` for each contract test `async fn NAME(store: SharedStore)`, so a
/// failure names its backend.
macro_rules! on_each_backend {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[tokio::test]
            async fn sqlite() {
                super::run(super::Backend::Sqlite, stringify!($test), super::$test).await;
            }

            #[tokio::test]
            async fn postgres() {
                super::run(super::Backend::Postgres, stringify!($test), super::$test).await;
            }
        }
    )*};
}

/// For the contract tests of other modules (`crate::store::on_each_backend!`).
pub(crate) use on_each_backend;

/// Run one contract test on fresh storage of `backend` (the store is dropped before its storage).
pub(crate) async fn run<F: std::future::Future<Output = ()>>(
    backend: Backend,
    test: &str,
    body: impl FnOnce(SharedStore) -> F,
) {
    if let Some((_storage, store)) = opened(backend, test).await {
        body(store).await;
    }
}

on_each_backend!(
    applications_round_trip_and_uids_are_unique,
    pages_walk_forward_and_back_without_gaps,
    ingest_commits_message_and_deliveries_and_deduplicates,
    concurrent_ingests_each_commit_once_and_a_failing_one_fails_alone,
    attempts_update_deliveries_and_can_disable_the_endpoint,
    waiting_deliveries_expire_and_the_backlog_is_counted,
    a_backlog_longer_than_one_expiry_pass_expires_whole_and_the_rest_stays,
    deliveries_that_die_waiting_are_reported_exhausted_and_a_requeued_one_waits_its_own_window,
    ordering_settings_and_keys_round_trip,
    repairs_requeue_only_what_is_not_pending_and_sort_after_the_cursor,
    replay_missing_adds_only_subscribed_messages_without_a_delivery,
    tasks_and_oldest_first_listings_round_trip,
    secrets_and_headers_round_trip_and_only_rotation_changes_the_secret,
    rotation_keeps_replaced_keys_until_they_expire_and_no_grace_revokes_them_all,
    app_tokens_are_found_by_digest_until_they_expire_or_are_revoked,
    attempt_results_record_failing_exhausted_and_recovered_once_each,
    retention_steps_delete_old_attempts_and_expunge_expired_idle_payloads,
    retention_steps_prune_old_operational_events_sent_or_not,
    an_apps_payload_retention_applies_to_messages_that_set_none,
    any_text_round_trips_exactly,
    remembered_responses_keep_their_request_digest_first_one_wins_and_expire,
);

pub(crate) fn app(uid: Option<&str>) -> Application {
    Application {
        id: new_id(IdKind::Application),
        uid: uid.map(str::to_owned),
        name: "shop".into(),
        rate_limit: None,
        verify_endpoints: false,
        payload_retention_days: None,
        metadata: BTreeMap::from([("team".to_owned(), "billing".to_owned())]),
        created_at: 1,
        updated_at: 1,
    }
}

fn endpoint(app_id: &str) -> Endpoint {
    Endpoint {
        id: new_id(IdKind::Endpoint),
        app_id: app_id.to_owned(),
        uid: None,
        url: "https://example.com/hook".into(),
        description: String::new(),
        filter_types: Some(vec!["a.b".into()]),
        channels: None,
        disabled: false,
        disabled_reason: None,
        rate_limit: None,
        max_concurrency: None,
        ordering: Ordering::Unordered,
        request_timeout_ms: None,
        version: 1,
        metadata: BTreeMap::new(),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        headers: BTreeMap::new(),
        created_at: 1,
        updated_at: 1,
    }
}

pub(crate) fn new_message(app_id: &str, event_id: Option<&str>, key: Option<&str>) -> NewMessage {
    NewMessage {
        app_id: app_id.to_owned(),
        event_id: event_id.map(str::to_owned),
        event_type: "a.b".into(),
        channels: Some(vec!["eu".into()]),
        payload: Arc::from(&b"{\"k\": [1, 2]}"[..]),
        idempotency_key: key.map(str::to_owned),
        ordering_key: None,
        payload_retention_ms: None,
    }
}

async fn ingest(store: &SharedStore, app_id: &str, event_id: Option<&str>, key: Option<&str>) -> Ingested {
    store.ingest(new_message(app_id, event_id, key)).await.unwrap()
}

fn created(ingested: Ingested) -> (Message, Vec<herald_store::CreatedDelivery>) {
    match ingested {
        Ingested::Created { message, deliveries } => (message, deliveries),
        Ingested::Duplicate(m) => panic!("unexpected duplicate of {}", m.id),
    }
}

async fn applications_round_trip_and_uids_are_unique(store: SharedStore) {
    let a = app(Some("acme"));
    store.create_app(&a).await.unwrap();
    assert_eq!(store.get_app(&a.id).await.unwrap(), a);
    assert_eq!(store.get_app("acme").await.unwrap(), a);
    assert!(matches!(
        store.create_app(&app(Some("acme"))).await,
        Err(StoreError::Conflict("uid"))
    ));
    let mut changed = a.clone();
    changed.name = "renamed".into();
    store.update_app(&changed).await.unwrap();
    assert_eq!(store.get_app(&a.id).await.unwrap().name, "renamed");
    store.delete_app(&a.id).await.unwrap();
    assert!(matches!(store.get_app(&a.id).await, Err(StoreError::NotFound)));
    assert!(matches!(store.delete_app(&a.id).await, Err(StoreError::NotFound)));
}

async fn pages_walk_forward_and_back_without_gaps(store: SharedStore) {
    let mut ids = Vec::new();
    for _ in 0..7 {
        let a = app(None);
        store.create_app(&a).await.unwrap();
        ids.push(a.id);
    }
    let mut seen = Vec::new();
    let mut page = store.list_apps(&PageRequest::first(3)).await.unwrap();
    loop {
        seen.extend(page.items.iter().map(|a| a.id.clone()));
        if page.done {
            break;
        }
        page = store
            .list_apps(&PageRequest::new(Some(3), page.iterator.clone()))
            .await
            .unwrap();
    }
    assert_eq!(seen, ids, "oldest first, every app exactly once");
    let back = store
        .list_apps(&PageRequest::new(Some(3), page.prev_iterator.clone()))
        .await
        .unwrap();
    assert_eq!(back.items.iter().map(|a| a.id.clone()).collect::<Vec<_>>(), ids[3..6]);
}

async fn ingest_commits_message_and_deliveries_and_deduplicates(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let e1 = endpoint(&a.id);
    let e2 = endpoint(&a.id);
    store.create_endpoint(&e1).await.unwrap();
    store.create_endpoint(&e2).await.unwrap();
    let mut feed = store.take_commit_feed().expect("feed");
    assert!(store.take_commit_feed().is_none(), "the feed is taken once");

    let mut disabled = endpoint(&a.id);
    disabled.disabled = true;
    store.create_endpoint(&disabled).await.unwrap();
    let mut other_type = endpoint(&a.id);
    other_type.filter_types = Some(vec!["x.y".into()]);
    store.create_endpoint(&other_type).await.unwrap();

    let (original, deliveries) = created(ingest(&store, &a.id, Some("evt-1"), None).await);
    let mut targets: Vec<&str> = deliveries.iter().map(|d| d.endpoint_id.as_str()).collect();
    targets.sort_unstable();
    let mut expected = [e1.id.as_str(), e2.id.as_str(), disabled.id.as_str()];
    expected.sort_unstable();
    assert_eq!(
        targets, expected,
        "fan-out: subscribed endpoints, disabled ones included (their deliveries wait)"
    );
    assert!(IdKind::Message.matches(&original.id), "the store assigns the id");
    let fed = feed.recv().await.unwrap();
    assert_eq!(
        fed.iter().map(|d| d.seq).collect::<Vec<_>>(),
        deliveries.iter().map(|d| d.seq).collect::<Vec<_>>()
    );
    let stored = store.get_message(&a.id, &original.id).await.unwrap();
    assert_eq!(&*stored.payload, b"{\"k\": [1, 2]}", "bytes kept");
    assert_eq!(
        store.get_message(&a.id, "evt-1").await.unwrap().id,
        original.id,
        "found by event id"
    );

    let Ingested::Duplicate(dup) = ingest(&store, &a.id, Some("evt-1"), None).await else {
        panic!("expected the duplicate to be recognised")
    };
    assert_eq!(dup.id, original.id);
    let (keyed, _) = created(ingest(&store, &a.id, None, Some("key-1")).await);
    let Ingested::Duplicate(again) = ingest(&store, &a.id, None, Some("key-1")).await else {
        panic!("expected the idempotency key to be recognised")
    };
    assert_eq!(again.id, keyed.id);
    assert!(matches!(
        store.ingest(new_message("app_missing", None, None)).await,
        Err(StoreError::NotFound)
    ));
    let pending = store.load_pending(&e1.id, 0, 100).await.unwrap();
    assert_eq!(pending.len(), 2, "duplicates added no delivery");
}

async fn concurrent_ingests_each_commit_once_and_a_failing_one_fails_alone(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let e = endpoint(&a.id);
    store.create_endpoint(&e).await.unwrap();
    let mut tasks = Vec::new();
    for n in 0..200 {
        let store = store.clone();
        let app_id = if n == 57 {
            "app_missing".to_owned()
        } else {
            a.id.clone()
        };
        tasks.push(tokio::spawn(async move {
            store.ingest(new_message(&app_id, None, None)).await
        }));
    }
    let mut ok = 0;
    for (n, task) in tasks.into_iter().enumerate() {
        match task.await.unwrap() {
            Ok(Ingested::Created { .. }) => ok += 1,
            Ok(Ingested::Duplicate(_)) => panic!("no duplicates here"),
            Err(error) => assert_eq!(n, 57, "only the message of a missing app fails: {error}"),
        }
    }
    assert_eq!(ok, 199);
    let pending = store.load_pending(&e.id, 0, 1_000).await.unwrap();
    assert_eq!(pending.len(), 199);
    let seqs: HashSet<i64> = pending.iter().map(|p| p.seq).collect();
    assert_eq!(seqs.len(), 199);
    let listed = store
        .list_messages(&a.id, &MessageFilter::default(), &PageRequest::first(250))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 199);
    // Ids follow commit order, so the newest-first listing is exactly the reverse of seq order.
    let by_seq: Vec<String> = pending.iter().map(|p| p.message.id.clone()).collect();
    let mut listed_ids: Vec<String> = listed.items.iter().map(|m| m.id.clone()).collect();
    listed_ids.reverse();
    assert_eq!(listed_ids, by_seq);
}

async fn attempts_update_deliveries_and_can_disable_the_endpoint(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let e = endpoint(&a.id);
    store.create_endpoint(&e).await.unwrap();
    let (m, deliveries) = created(ingest(&store, &a.id, None, None).await);
    let attempt = |n: u32, success: bool| Attempt {
        id: new_id(IdKind::Attempt),
        message_id: m.id.clone(),
        endpoint_id: e.id.clone(),
        url: e.url.clone(),
        attempt_number: n,
        success,
        outcome: if success { "success".into() } else { "gone".into() },
        response_status: Some(if success { 200 } else { 410 }),
        response: "body".into(),
        duration_ms: 3,
        trigger: AttemptTrigger::Scheduled,
        created_at: 100 + i64::from(n),
    };
    let record = |n: u32, status: DeliveryStatus| AttemptRecord {
        delivery_seq: deliveries[0].seq,
        app_id: a.id.clone(),
        attempt: attempt(n, status == DeliveryStatus::Delivered),
        status,
        next_attempt_at: 1_000,
    };
    store
        .record_attempts(&[record(1, DeliveryStatus::Pending)])
        .await
        .unwrap();
    let pending = store.load_pending(&e.id, 0, 10).await.unwrap();
    assert_eq!((pending[0].attempts, pending[0].next_attempt_at), (1, 1_000));
    store
        .record_attempts(&[record(2, DeliveryStatus::Failed)])
        .await
        .unwrap();
    assert!(store.disable_endpoint(&e.id, "gone", 500).await.unwrap());
    assert!(
        !store.disable_endpoint(&e.id, "again", 600).await.unwrap(),
        "already disabled: nothing recorded"
    );
    let all = store.list_operational_events(0, 10).await.unwrap();
    let kinds: Vec<&str> = all.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        kinds,
        ["endpoint.created", "message.attempt.exhausted", "endpoint.disabled"]
    );
    let events: Vec<_> = all
        .into_iter()
        .filter(|e| e.event_type == "endpoint.disabled")
        .collect();
    assert_eq!(events[0].app_id, a.id);
    let data: serde_json::Value = serde_json::from_str(&events[0].data).unwrap();
    assert_eq!(data["endpointId"], e.id.as_str());
    assert_eq!(data["reason"], "gone");
    assert!(
        store
            .list_operational_events(events[0].seq, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Newest first, paged by `seq`, as the dashboard reads them.
    let newest = store.list_operational_events_newest(None, 2).await.unwrap();
    let kinds: Vec<&str> = newest.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(kinds, ["endpoint.disabled", "message.attempt.exhausted"]);
    let older = store
        .list_operational_events_newest(Some(newest[1].seq), 10)
        .await
        .unwrap();
    let kinds: Vec<&str> = older.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(kinds, ["endpoint.created"]);
    // The attempts per time bucket: both failed, 3 ms each, at 101 and 102.
    let buckets = store.attempt_buckets(&e.id, 100, 200, 1).await.unwrap();
    let seen: Vec<(i64, u64, u64, i64, i64)> = buckets
        .iter()
        .map(|b| (b.index, b.succeeded, b.failed, b.total_duration_ms, b.max_duration_ms))
        .collect();
    assert_eq!(seen, [(1, 0, 1, 3, 3), (2, 0, 1, 3, 3)]);
    let one = store.attempt_buckets(&e.id, 100, 200, 50).await.unwrap();
    assert_eq!(
        (one.len(), one[0].index, one[0].failed, one[0].total_duration_ms),
        (1, 0, 2, 6)
    );
    assert!(
        store.attempt_buckets(&e.id, 102, 200, 10).await.unwrap()[0].failed == 1,
        "the window's start counts"
    );
    assert!(
        store.attempt_buckets(&e.id, 0, 101, 10).await.unwrap().is_empty(),
        "the end does not"
    );
    assert_eq!(
        store.delivery_state(&m.id, &e.id).await.unwrap(),
        (DeliveryStatus::Failed, 2)
    );
    assert!(
        store.load_pending(&e.id, 0, 10).await.unwrap().is_empty(),
        "finished deliveries are not pending"
    );
    let ep = store.get_endpoint_by_id(&e.id).await.unwrap();
    assert!(ep.disabled);
    assert_eq!(ep.disabled_reason.as_deref(), Some("gone"));
    let log = store
        .list_attempts_by_message(&a.id, &m.id, &AttemptFilter::default(), &PageRequest::default())
        .await
        .unwrap();
    assert_eq!(
        log.items.iter().map(|x| x.attempt_number).collect::<Vec<_>>(),
        [2, 1],
        "newest first"
    );
    assert_eq!(log.items[1].response_status, Some(410));
    assert!(store.endpoints_with_pending().await.unwrap().is_empty());
}

async fn waiting_deliveries_expire_and_the_backlog_is_counted(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let e = endpoint(&a.id);
    store.create_endpoint(&e).await.unwrap();
    assert_eq!(store.endpoint_backlog(&e.id).await.unwrap(), Backlog::default());
    let (first, d1) = created(ingest(&store, &a.id, None, None).await);
    let (second, d2) = created(ingest(&store, &a.id, None, None).await);
    let (third, _) = created(ingest(&store, &a.id, None, None).await);
    let backlog = store.endpoint_backlog(&e.id).await.unwrap();
    assert_eq!(backlog.pending, 3);
    assert!(!backlog.capped);
    assert_eq!(backlog.oldest_created_at, Some(first.created_at));

    store.expire_deliveries(&[d1[0].seq], 10).await.unwrap();
    assert_eq!(
        store.delivery_state(&first.id, &e.id).await.unwrap().0,
        DeliveryStatus::Dead
    );
    // Everything created up to the second message expires; the third stays.
    let expired = store.expire_waiting(&e.id, second.created_at + 1, 20).await.unwrap();
    let third_kept = third.created_at > second.created_at;
    assert_eq!(expired, if third_kept { 1 } else { 2 }, "the first was already dead");
    assert_eq!(
        store.delivery_state(&second.id, &e.id).await.unwrap().0,
        DeliveryStatus::Dead
    );
    let pending = store.load_pending(&e.id, 0, 10).await.unwrap();
    assert!(pending.iter().all(|p| p.seq != d2[0].seq));
    assert_eq!(
        store.endpoint_backlog(&e.id).await.unwrap().pending,
        u64::from(third_kept)
    );
}

#[test]
fn a_backlog_count_stops_at_the_cap_and_says_so() {
    let cap = Backlog::COUNT_CAP;
    let at = |counted: u64| Backlog::from_count(i64::try_from(counted).unwrap(), Some(5));
    assert_eq!((at(0).pending, at(0).capped), (0, false));
    assert_eq!((at(cap).pending, at(cap).capped), (cap, false));
    assert_eq!((at(cap + 1).pending, at(cap + 1).capped), (cap, true));
    assert_eq!(at(cap + 1).oldest_created_at, Some(5));
    assert_eq!(Backlog::from_count(-1, None), Backlog::default());
}

async fn a_backlog_longer_than_one_expiry_pass_expires_whole_and_the_rest_stays(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let e = endpoint(&a.id);
    store.create_endpoint(&e).await.unwrap();
    // Two and a half expiry passes' worth of old deliveries, then one that has not expired.
    let old = 1_250;
    let mut ingests = tokio::task::JoinSet::new();
    for _ in 0..old {
        let (store, app_id) = (store.clone(), a.id.clone());
        ingests.spawn(async move { ingest(&store, &app_id, None, None).await });
    }
    let mut newest_old = 0;
    while let Some(done) = ingests.join_next().await {
        newest_old = newest_old.max(created(done.unwrap()).0.created_at);
    }
    let fresh = loop {
        let (m, _) = created(ingest(&store, &a.id, None, None).await);
        if m.created_at > newest_old {
            break m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    };
    let expired = store.expire_waiting(&e.id, newest_old + 1, 20).await.unwrap();
    assert_eq!(expired, old, "every old delivery, across several passes");
    let backlog = store.endpoint_backlog(&e.id).await.unwrap();
    assert_eq!(backlog.pending, 1);
    assert_eq!(backlog.oldest_created_at, Some(fresh.created_at));
    assert_eq!(store.expire_waiting(&e.id, newest_old + 1, 30).await.unwrap(), 0);
}

async fn deliveries_that_die_waiting_are_reported_exhausted_and_a_requeued_one_waits_its_own_window(
    store: SharedStore,
) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let e = endpoint(&a.id);
    store.create_endpoint(&e).await.unwrap();
    let (tried, tried_d) = created(ingest(&store, &a.id, None, None).await);
    let (untried, _) = created(ingest(&store, &a.id, None, None).await);
    let (old, old_d) = created(ingest(&store, &a.id, None, None).await);
    // One failed attempt, then the delivery waits for its retry (still pending).
    settle(&store, &a.id, &tried, &e, tried_d[0].seq, DeliveryStatus::Pending).await;
    let last_attempt = store
        .list_attempts_by_message(&a.id, &tried.id, &AttemptFilter::default(), &PageRequest::default())
        .await
        .unwrap()
        .items
        .remove(0);
    // An old delivery that died and was re-queued (recover) much later: its window starts then.
    settle(&store, &a.id, &old, &e, old_d[0].seq, DeliveryStatus::Dead).await;
    let requeued_at = old.created_at + 1_000_000;
    assert!(matches!(
        store
            .requeue_delivery(&old.id, &e.id, AttemptTrigger::Recover, requeued_at)
            .await
            .unwrap(),
        Requeue::Queued(_)
    ));

    store.expire_deliveries(&[tried_d[0].seq], 10).await.unwrap();
    // Again: already dead, nothing more is reported.
    store.expire_deliveries(&[tried_d[0].seq], 11).await.unwrap();
    let cutoff = old.created_at.max(untried.created_at) + 1;
    assert_eq!(
        store.expire_waiting(&e.id, cutoff, 20).await.unwrap(),
        1,
        "only the untried one"
    );
    assert_eq!(
        store.delivery_state(&old.id, &e.id).await.unwrap().0,
        DeliveryStatus::Pending,
        "a re-queued delivery waits its own window"
    );
    assert_eq!(store.expire_waiting(&e.id, requeued_at + 1, 30).await.unwrap(), 1);
    for m in [&tried, &untried, &old] {
        assert_eq!(
            store.delivery_state(&m.id, &e.id).await.unwrap().0,
            DeliveryStatus::Dead
        );
    }

    let expired: Vec<(serde_json::Value, i64)> = store
        .list_operational_events(0, 50)
        .await
        .unwrap()
        .into_iter()
        .filter(|ev| ev.event_type == "message.attempt.exhausted")
        .map(|ev| (serde_json::from_str(&ev.data).unwrap(), ev.created_at))
        .filter(|(data, _): &(serde_json::Value, i64)| data["reason"] == "expired")
        .collect();
    let by_msg = |id: &str| {
        expired
            .iter()
            .find(|(data, _)| data["msgId"] == id)
            .unwrap_or_else(|| panic!("no expired event for {id}: {expired:?}"))
    };
    assert_eq!(expired.len(), 3, "{expired:?}");
    let (data, at) = by_msg(&tried.id);
    assert_eq!(*at, 10);
    assert_eq!(
        (
            &data["appId"],
            &data["endpointId"],
            &data["deliveryStatus"],
            &data["attempts"]
        ),
        (
            &serde_json::json!(a.id),
            &serde_json::json!(e.id),
            &serde_json::json!("dead"),
            &serde_json::json!(1)
        )
    );
    assert_eq!(data["lastAttempt"]["id"], last_attempt.id.as_str());
    assert_eq!(data["lastAttempt"]["responseStatusCode"], 500);
    let (data, at) = by_msg(&untried.id);
    assert_eq!((*at, &data["attempts"]), (20, &serde_json::json!(0)));
    assert!(data.get("lastAttempt").is_none(), "{data}");
    // The re-queued one names the attempt of its earlier run.
    let (data, at) = by_msg(&old.id);
    assert_eq!(*at, 30);
    assert!(data["lastAttempt"]["id"].is_string(), "{data}");
}

async fn ordering_settings_and_keys_round_trip(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let mut e = endpoint(&a.id);
    e.ordering = Ordering::Key;
    e.max_concurrency = Some(3);
    e.request_timeout_ms = Some(2_500);
    store.create_endpoint(&e).await.unwrap();
    let back = store.get_endpoint_by_id(&e.id).await.unwrap();
    assert_eq!(
        (back.ordering, back.max_concurrency, back.request_timeout_ms),
        (Ordering::Key, Some(3), Some(2_500))
    );
    let mut keyed = new_message(&a.id, None, None);
    keyed.ordering_key = Some("customer-7".into());
    let (m, _) = created(store.ingest(keyed).await.unwrap());
    assert_eq!(m.ordering_key.as_deref(), Some("customer-7"));
    let pending = store.load_pending(&e.id, 0, 10).await.unwrap();
    assert_eq!(pending[0].message.ordering_key.as_deref(), Some("customer-7"));
    assert_eq!(
        store.get_message(&a.id, &m.id).await.unwrap().ordering_key.as_deref(),
        Some("customer-7")
    );
}

#[tokio::test]
async fn a_reopened_store_keeps_everything_committed() {
    for storage in storages("a_reopened_store_keeps_everything_committed").await {
        let url = &storage.url;
        let a = app(None);
        let e = endpoint(&a.id);
        {
            let store = open(url).await.unwrap();
            store.create_app(&a).await.unwrap();
            store.create_endpoint(&e).await.unwrap();
            ingest(&store, &a.id, None, None).await;
        }
        let store = open(url).await.unwrap();
        assert_eq!(
            store.endpoints_with_pending().await.unwrap(),
            std::slice::from_ref(&e.id)
        );
        assert_eq!(store.load_pending(&e.id, 0, 10).await.unwrap().len(), 1);
    }
}

/// Finish a delivery with one attempt in `status`.
async fn settle(store: &SharedStore, app_id: &str, m: &Message, e: &Endpoint, seq: i64, status: DeliveryStatus) {
    let record = AttemptRecord {
        delivery_seq: seq,
        app_id: app_id.to_owned(),
        attempt: Attempt {
            id: new_id(IdKind::Attempt),
            message_id: m.id.clone(),
            endpoint_id: e.id.clone(),
            url: e.url.clone(),
            attempt_number: 1,
            success: status == DeliveryStatus::Delivered,
            outcome: "server_error".into(),
            response_status: Some(500),
            response: String::new(),
            duration_ms: 1,
            trigger: AttemptTrigger::Scheduled,
            created_at: m.created_at + 1,
        },
        status,
        next_attempt_at: 0,
    };
    store.record_attempts(&[record]).await.unwrap();
}

async fn repairs_requeue_only_what_is_not_pending_and_sort_after_the_cursor(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let e = endpoint(&a.id);
    store.create_endpoint(&e).await.unwrap();
    let mut made = Vec::new();
    for _ in 0..4 {
        made.push(created(ingest(&store, &a.id, None, None).await));
    }
    let top_seq = made.iter().map(|(_, d)| d[0].seq).max().unwrap();
    settle(&store, &a.id, &made[0].0, &e, made[0].1[0].seq, DeliveryStatus::Dead).await;
    settle(&store, &a.id, &made[1].0, &e, made[1].1[0].seq, DeliveryStatus::Failed).await;
    settle(
        &store,
        &a.id,
        &made[2].0,
        &e,
        made[2].1[0].seq,
        DeliveryStatus::Delivered,
    )
    .await;
    // made[3] stays pending.
    let window = (0, i64::MAX);
    assert_eq!(store.count_failed(&e.id, window.0, window.1).await.unwrap(), 2);
    let dead = store
        .list_deliveries(&a.id, Some(&e.id), Some(DeliveryStatus::Dead), &PageRequest::default())
        .await
        .unwrap();
    assert_eq!(dead.items.len(), 1);
    assert_eq!(dead.items[0].message.id, made[0].0.id);
    assert_eq!(dead.items[0].last_attempt.as_ref().unwrap().outcome, "server_error");
    let stats = store.endpoint_stats(&e.id, window.0, window.1).await.unwrap();
    assert_eq!((stats.delivered, stats.failed, stats.pending), (1, 2, 1));

    assert_eq!(store.requeue_failed(&e.id, window.0, window.1, 1, 50).await.unwrap(), 1);
    assert_eq!(
        store.requeue_failed(&e.id, window.0, window.1, 10, 50).await.unwrap(),
        1
    );
    assert_eq!(
        store.requeue_failed(&e.id, window.0, window.1, 10, 50).await.unwrap(),
        0,
        "nothing twice"
    );
    let pending = store.load_pending(&e.id, top_seq, 10).await.unwrap();
    assert_eq!(pending.len(), 2, "re-queued deliveries sort after the cursor");
    assert!(
        pending
            .iter()
            .all(|p| p.attempts == 0 && p.window_start == 50 && p.trigger == AttemptTrigger::Recover)
    );

    assert_eq!(
        store
            .requeue_delivery(&made[3].0.id, &e.id, AttemptTrigger::Manual, 60)
            .await
            .unwrap(),
        Requeue::AlreadyPending
    );
    let Requeue::Queued(seq) = store
        .requeue_delivery(&made[2].0.id, &e.id, AttemptTrigger::Manual, 60)
        .await
        .unwrap()
    else {
        panic!("a delivered message can be resent");
    };
    assert!(seq > top_seq);
    assert!(matches!(
        store
            .requeue_delivery("msg_nope", &e.id, AttemptTrigger::Manual, 60)
            .await,
        Err(StoreError::NotFound)
    ));

    let cancelled = store.cancel_pending(&a.id, None, Some(&e.id), 70).await.unwrap();
    assert_eq!(cancelled.len(), 4, "every pending delivery of the endpoint");
    assert!(store.load_pending(&e.id, 0, 10).await.unwrap().is_empty());
    store.expunge_payload(&a.id, &made[1].0.id).await.unwrap();
    assert_eq!(&*store.get_message(&a.id, &made[1].0.id).await.unwrap().payload, b"{}");
    assert_eq!(
        store
            .requeue_delivery(&made[1].0.id, &e.id, AttemptTrigger::Manual, 80)
            .await
            .unwrap(),
        Requeue::Expunged
    );
}

async fn replay_missing_adds_only_subscribed_messages_without_a_delivery(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let early = endpoint(&a.id);
    store.create_endpoint(&early).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(created(ingest(&store, &a.id, None, None).await).0.id);
    }
    let mut other = new_message(&a.id, None, None);
    other.event_type = "x.y".into();
    store.ingest(other).await.unwrap();
    let late = endpoint(&a.id);
    store.create_endpoint(&late).await.unwrap();
    assert_eq!(store.count_messages(&a.id, 0, i64::MAX).await.unwrap(), 6);
    let (cursor, added) = store
        .add_missing_deliveries(&late, 0, i64::MAX, None, 3, 90)
        .await
        .unwrap();
    assert_eq!(added, 3);
    let (cursor, added) = store
        .add_missing_deliveries(&late, 0, i64::MAX, cursor.as_deref(), 3, 90)
        .await
        .unwrap();
    assert_eq!(added, 2, "the x.y message is not subscribed");
    let (_, again) = store
        .add_missing_deliveries(&late, 0, i64::MAX, None, 10, 91)
        .await
        .unwrap();
    assert_eq!(again, 0, "nothing twice");
    assert!(cursor.is_some());
    let pending = store.load_pending(&late.id, 0, 10).await.unwrap();
    let got: Vec<String> = pending.iter().map(|p| p.message.id.clone()).collect();
    assert_eq!(got, ids);
}

async fn tasks_and_oldest_first_listings_round_trip(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let mut task = BackgroundTask {
        id: new_id(IdKind::Task),
        kind: "endpoint.recover".into(),
        app_id: a.id.clone(),
        state: "running".into(),
        processed: 0,
        total: 9,
        data: "{}".into(),
        created_at: 1,
        updated_at: 1,
    };
    store.create_task(&task).await.unwrap();
    task.processed = 4;
    store.update_task(&task).await.unwrap();
    assert_eq!(store.get_task(&task.id, Some(&a.id)).await.unwrap().processed, 4);
    assert!(matches!(
        store.get_task(&task.id, Some("app_other")).await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(store.fail_interrupted_tasks(1_000_000).await.unwrap(), 1);
    assert_eq!(store.get_task(&task.id, None).await.unwrap().state, "failed");

    let first = created(ingest(&store, &a.id, None, None).await).0;
    let second = created(ingest(&store, &a.id, None, None).await).0;
    let filter = MessageFilter {
        oldest_first: true,
        ..MessageFilter::default()
    };
    let page = store
        .list_messages(&a.id, &filter, &PageRequest::default())
        .await
        .unwrap();
    let order: Vec<&str> = page.items.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(order, [first.id.as_str(), second.id.as_str()]);
}

const OLD_KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NEW_KEY: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const ED_KEY: &str = "whsk_AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyB5tVYuj+ZU+UB4sRLoqYunkB+FOuaVvtfg45ELrQSWZA==";

async fn secrets_and_headers_round_trip_and_only_rotation_changes_the_secret(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let mut e = endpoint(&a.id);
    e.headers = BTreeMap::from([("x-tenant".to_owned(), "acme".to_owned())]);
    store.create_endpoint(&e).await.unwrap();
    let read = store.get_endpoint(&a.id, &e.id).await.unwrap();
    assert_eq!(read.secret, OLD_KEY);
    assert_eq!(read.headers, e.headers);
    assert_eq!(store.get_endpoint_by_id(&e.id).await.unwrap().secret, OLD_KEY);
    let listed = store
        .list_endpoints(&a.id, &PageRequest::default(), false)
        .await
        .unwrap();
    assert_eq!(listed.items[0].secret, OLD_KEY);
    assert_eq!(listed.items[0].headers, e.headers);
    assert_eq!(store.app_endpoints(&a.id).await.unwrap()[0].secret, OLD_KEY);

    // An update carries every field but the secret: a stale read cannot undo a rotation.
    let mut changed = read.clone();
    changed.secret = NEW_KEY.to_owned();
    changed.headers = BTreeMap::from([("x-region".to_owned(), "eu".to_owned())]);
    store.update_endpoint(&changed).await.unwrap();
    let read = store.get_endpoint(&a.id, &e.id).await.unwrap();
    assert_eq!(read.secret, OLD_KEY);
    assert_eq!(read.headers, changed.headers);
}

async fn rotation_keeps_replaced_keys_until_they_expire_and_no_grace_revokes_them_all(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let e = endpoint(&a.id);
    store.create_endpoint(&e).await.unwrap();
    assert!(store.previous_secrets(&e.id, 1_000).await.unwrap().is_empty());

    store
        .rotate_endpoint_secret(&e.id, NEW_KEY, 11_000, 1_000)
        .await
        .unwrap();
    assert_eq!(store.get_endpoint_by_id(&e.id).await.unwrap().secret, NEW_KEY);
    let previous = store.previous_secrets(&e.id, 1_000).await.unwrap();
    assert_eq!(previous.len(), 1);
    assert_eq!(previous[0].secret, OLD_KEY);
    assert_eq!((previous[0].rotated_at, previous[0].expires_at), (1_000, 11_000));
    assert!(store.previous_secrets(&e.id, 10_999).await.unwrap().len() == 1);
    assert!(
        store.previous_secrets(&e.id, 11_000).await.unwrap().is_empty(),
        "expired at its time"
    );

    // A second rotation with a shorter grace: the older key is cut to it too; newest first.
    store.rotate_endpoint_secret(&e.id, ED_KEY, 6_000, 2_000).await.unwrap();
    let previous = store.previous_secrets(&e.id, 2_000).await.unwrap();
    let keys: Vec<(&str, i64)> = previous.iter().map(|p| (p.secret.as_str(), p.expires_at)).collect();
    assert_eq!(keys, [(NEW_KEY, 6_000), (OLD_KEY, 6_000)]);
    assert_eq!(store.get_endpoint_by_id(&e.id).await.unwrap().secret, ED_KEY);

    // No grace (a compromised key): every replaced key stops at once.
    store
        .rotate_endpoint_secret(&e.id, OLD_KEY, 3_000, 3_000)
        .await
        .unwrap();
    assert!(store.previous_secrets(&e.id, 3_000).await.unwrap().is_empty());
    assert_eq!(store.get_endpoint_by_id(&e.id).await.unwrap().secret, OLD_KEY);

    // Every rotation is an `endpoint.updated` event, recorded with it, at its time.
    let updates: Vec<(bool, i64)> = store
        .list_operational_events(0, 50)
        .await
        .unwrap()
        .into_iter()
        .filter(|ev| ev.event_type == "endpoint.updated")
        .map(|ev| (ev.data.contains(&format!("\"endpointId\":\"{}\"", e.id)), ev.created_at))
        .collect();
    assert_eq!(updates, [(true, 1_000), (true, 2_000), (true, 3_000)]);

    assert!(matches!(
        store.rotate_endpoint_secret("ep_missing", NEW_KEY, 5_000, 4_000).await,
        Err(StoreError::NotFound)
    ));
    store
        .rotate_endpoint_secret(&e.id, NEW_KEY, 9_000, 4_000)
        .await
        .unwrap();
    store.delete_endpoint(&e.id).await.unwrap();
    assert!(store.previous_secrets(&e.id, 4_000).await.unwrap().is_empty());
}

/// The SQLite file at `path` and its WAL, as bytes.
fn sqlite_bytes(path: &std::path::Path) -> Vec<u8> {
    let mut bytes = std::fs::read(path).unwrap();
    let wal = path.with_extension("db-wal");
    if let Ok(more) = std::fs::read(wal) {
        bytes.extend(more);
    }
    bytes
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn sqlite_stores_secrets_encrypted_and_refuses_the_wrong_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let url = format!("sqlite://{}", path.display());
    let a = app(None);
    let mut e = endpoint(&a.id);
    e.headers = BTreeMap::from([("authorization".to_owned(), "Bearer hunter2-token".to_owned())]);
    {
        let store = open(&url).await.unwrap();
        store.create_app(&a).await.unwrap();
        store.create_endpoint(&e).await.unwrap();
        store.rotate_endpoint_secret(&e.id, NEW_KEY, i64::MAX, 1).await.unwrap();
        let bytes = sqlite_bytes(&path);
        for secret in [OLD_KEY, NEW_KEY] {
            let b64 = &secret["whsec_".len()..];
            assert!(!contains(&bytes, b64.as_bytes()), "{b64} is in the database file");
            let raw = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64).unwrap();
            assert!(!contains(&bytes, &raw), "the raw key bytes are in the database file");
        }
        assert!(!contains(&bytes, b"hunter2-token"));
    }
    let wrong = herald_store::open_with(&url, SecretCipher::from_key(&[8; 32]), &StoreOptions::default()).await;
    assert!(
        matches!(wrong, Err(StoreError::SecretKey(_))),
        "a wrong key is refused at open"
    );
    let store = open(&url).await.unwrap();
    assert_eq!(store.get_endpoint_by_id(&e.id).await.unwrap().secret, NEW_KEY);
}

#[tokio::test]
async fn sqlite_encrypts_secrets_stored_in_plain_text_before_encryption() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    let a = app(None);
    let e = endpoint(&a.id);
    {
        let store = open(&url).await.unwrap();
        store.create_app(&a).await.unwrap();
        store.create_endpoint(&e).await.unwrap();
    }
    // What a database written before encryption holds: the secret and headers in plain text.
    let raw = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query("UPDATE endpoint SET secret = ?, headers = '{\"x-a\":\"b\"}' WHERE id = ?")
        .bind(OLD_KEY)
        .bind(&e.id)
        .execute(&raw)
        .await
        .unwrap();
    raw.close().await;

    let store = open(&url).await.unwrap();
    let read = store.get_endpoint_by_id(&e.id).await.unwrap();
    assert_eq!(read.secret, OLD_KEY);
    assert_eq!(read.headers.get("x-a").map(String::as_str), Some("b"));
    let raw = sqlx::SqlitePool::connect(&url).await.unwrap();
    let (secret, headers): (String, String) = sqlx::query_as("SELECT secret, headers FROM endpoint WHERE id = ?")
        .bind(&e.id)
        .fetch_one(&raw)
        .await
        .unwrap();
    assert!(
        secret.starts_with("enc1:") && headers.starts_with("enc1:"),
        "sealed at open"
    );
    assert!(!secret.contains(&OLD_KEY["whsec_".len()..]));
}

#[tokio::test]
async fn postgres_stores_secrets_encrypted_refuses_the_wrong_key_and_encrypts_plain_text() {
    let Some(database) = herald_store::testdb::fresh("postgres_stores_secrets_encrypted").await else {
        return;
    };
    let url = database.url.clone();
    let a = app(None);
    let mut e = endpoint(&a.id);
    e.headers = BTreeMap::from([("authorization".to_owned(), "Bearer hunter2-token".to_owned())]);
    {
        let store = open(&url).await.unwrap();
        store.create_app(&a).await.unwrap();
        store.create_endpoint(&e).await.unwrap();
        store.rotate_endpoint_secret(&e.id, NEW_KEY, i64::MAX, 1).await.unwrap();
    }
    let raw = sqlx::PgPool::connect(&url).await.unwrap();
    let stored: Vec<String> = sqlx::query_scalar(
        "SELECT secret FROM endpoint UNION ALL SELECT headers FROM endpoint UNION ALL SELECT secret FROM endpoint_secret",
    )
    .fetch_all(&raw)
    .await
    .unwrap();
    assert_eq!(stored.len(), 3);
    for value in &stored {
        assert!(value.starts_with("enc1:"), "sealed: {value}");
        assert!(!value.contains(&OLD_KEY["whsec_".len()..]) && !value.contains(&NEW_KEY["whsec_".len()..]));
        assert!(!value.contains("hunter2"));
    }
    let wrong = herald_store::open_with(&url, SecretCipher::from_key(&[8; 32]), &StoreOptions::default()).await;
    assert!(
        matches!(wrong, Err(StoreError::SecretKey(_))),
        "a wrong key is refused at open"
    );

    // What a database written before encryption holds: the secret and headers in plain text.
    sqlx::query("UPDATE endpoint SET secret = $1, headers = '{\"x-a\":\"b\"}' WHERE id = $2")
        .bind(OLD_KEY)
        .bind(&e.id)
        .execute(&raw)
        .await
        .unwrap();
    {
        let store = open(&url).await.unwrap();
        let read = store.get_endpoint_by_id(&e.id).await.unwrap();
        assert_eq!(read.secret, OLD_KEY);
        assert_eq!(read.headers.get("x-a").map(String::as_str), Some("b"));
        let previous = store.previous_secrets(&e.id, 2).await.unwrap();
        assert_eq!(previous.len(), 1);
        assert_eq!(previous[0].secret, OLD_KEY);
    }
    let (secret, headers): (String, String) = sqlx::query_as("SELECT secret, headers FROM endpoint WHERE id = $1")
        .bind(&e.id)
        .fetch_one(&raw)
        .await
        .unwrap();
    assert!(
        secret.starts_with("enc1:") && headers.starts_with("enc1:"),
        "sealed at open"
    );
    raw.close().await;
}

async fn app_tokens_are_found_by_digest_until_they_expire_or_are_revoked(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let token = |digest: &str, expires_at: i64| AppToken {
        token_sha256: digest.to_owned(),
        app_id: a.id.clone(),
        read_only: digest == "ro",
        sink_id: None,
        created_at: 1,
        expires_at,
    };
    for t in [token("live", 1_000), token("ro", 1_000), token("old", 10)] {
        store.create_app_token(&t).await.unwrap();
    }
    let orphan = AppToken {
        app_id: "app_nobody".into(),
        ..token("orphan", 1_000)
    };
    assert!(matches!(
        store.create_app_token(&orphan).await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(
        store.find_app_token("live", 50).await.unwrap(),
        Some(token("live", 1_000))
    );
    assert!(store.find_app_token("ro", 50).await.unwrap().unwrap().read_only);
    assert_eq!(store.find_app_token("old", 50).await.unwrap(), None, "expired");
    assert_eq!(store.find_app_token("nope", 50).await.unwrap(), None);
    // Revocation with a grace period shortens only longer-lived tokens.
    assert_eq!(store.expire_app_tokens(&a.id, 100).await.unwrap(), 2);
    assert!(store.find_app_token("live", 99).await.unwrap().is_some());
    assert_eq!(store.find_app_token("live", 100).await.unwrap(), None);
    store.delete_app(&a.id).await.unwrap();
    assert_eq!(
        store.find_app_token("live", 0).await.unwrap(),
        None,
        "gone with the app"
    );
}

async fn attempt_results_record_failing_exhausted_and_recovered_once_each(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let e = endpoint(&a.id);
    store.create_endpoint(&e).await.unwrap();
    let mut updated = e.clone();
    updated.description = "changed".into();
    store.update_endpoint(&updated).await.unwrap();
    let (m1, d1) = created(ingest(&store, &a.id, Some("one"), None).await);
    let (m2, d2) = created(ingest(&store, &a.id, Some("two"), None).await);
    let record = |m: &Message, seq: i64, n: u32, status: DeliveryStatus| AttemptRecord {
        delivery_seq: seq,
        app_id: a.id.clone(),
        attempt: Attempt {
            id: new_id(IdKind::Attempt),
            message_id: m.id.clone(),
            endpoint_id: e.id.clone(),
            url: e.url.clone(),
            attempt_number: n,
            success: status == DeliveryStatus::Delivered,
            outcome: "x".into(),
            response_status: Some(500),
            response: String::new(),
            duration_ms: 1,
            trigger: AttemptTrigger::Scheduled,
            created_at: 10 * i64::from(n),
        },
        status,
        next_attempt_at: 0,
    };
    // m1: fails four times, then succeeds: failing, then recovered. m2: succeeds on its 2nd attempt
    // (never reported failing, so no recovery either).
    let mut batch: Vec<AttemptRecord> = (1..=4)
        .map(|n| record(&m1, d1[0].seq, n, DeliveryStatus::Pending))
        .collect();
    batch.push(record(&m2, d2[0].seq, 1, DeliveryStatus::Pending));
    store.record_attempts(&batch).await.unwrap();
    store
        .record_attempts(&[
            record(&m1, d1[0].seq, 5, DeliveryStatus::Delivered),
            record(&m2, d2[0].seq, 2, DeliveryStatus::Delivered),
        ])
        .await
        .unwrap();
    // A resend of m1 that dies later reports exhaustion again.
    store
        .record_attempts(&[record(&m1, d1[0].seq, 1, DeliveryStatus::Dead)])
        .await
        .unwrap();
    store.delete_endpoint(&e.id).await.unwrap();
    let events = store.list_operational_events(0, 50).await.unwrap();
    let kinds: Vec<(&str, Option<String>)> = events
        .iter()
        .map(|ev| {
            let data: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
            (ev.event_type.as_str(), data["msgId"].as_str().map(str::to_owned))
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("endpoint.created", None),
            ("endpoint.updated", None),
            ("message.attempt.failing", Some(m1.id.clone())),
            ("message.attempt.recovered", Some(m1.id.clone())),
            ("message.attempt.exhausted", Some(m1.id.clone())),
            ("endpoint.deleted", None),
        ]
    );
    // The outbox: every event unsent until marked.
    let unsent = store.unsent_operational_events(0, 50).await.unwrap();
    assert_eq!(unsent.len(), events.len());
    store.mark_operational_event_sent(unsent[0].seq, 5).await.unwrap();
    let unsent = store.unsent_operational_events(0, 50).await.unwrap();
    assert_eq!(unsent.len(), events.len() - 1);
    assert_eq!(
        store.unsent_operational_events(unsent[2].seq, 2).await.unwrap().len(),
        2
    );
}

async fn retention_steps_delete_old_attempts_and_expunge_expired_idle_payloads(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    let e = endpoint(&a.id);
    store.create_endpoint(&e).await.unwrap();
    let with_retention = |event_id: &str, keep: Option<i64>| NewMessage {
        payload_retention_ms: keep,
        ..new_message(&a.id, Some(event_id), None)
    };
    let (done, done_d) = created(store.ingest(with_retention("done", Some(1))).await.unwrap());
    let (waiting, _) = created(store.ingest(with_retention("waiting", Some(1))).await.unwrap());
    let (forever, _) = created(store.ingest(with_retention("forever", None)).await.unwrap());
    settle(&store, &a.id, &done, &e, done_d[0].seq, DeliveryStatus::Delivered).await;
    let far_future = i64::MAX / 4;
    // Every attempt here is younger than a cutoff of 100 (ms since the epoch): none goes, but the
    // endpoint's `endpoint.created` event (recorded at its creation time, 1) does. With the cutoff far
    // in the future, batches of one row remove every attempt.
    let first = store.retention_step(100, far_future, 1).await.unwrap();
    assert_eq!(
        first,
        RetentionStep {
            attempts_deleted: 0,
            payloads_expunged: 1,
            events_deleted: 1,
        }
    );
    let mut deleted = 0;
    loop {
        let step = store.retention_step(far_future, 0, 1).await.unwrap();
        deleted += step.attempts_deleted;
        if step.attempts_deleted == 0 {
            break;
        }
    }
    assert!(deleted > 0);
    let message = |id: &str| {
        let store = store.clone();
        let (app_id, id) = (a.id.clone(), id.to_owned());
        async move { store.get_message(&app_id, &id).await.unwrap() }
    };
    assert_eq!(&*message(&done.id).await.payload, b"{}");
    assert_eq!(message(&done.id).await.event_id.as_deref(), Some("done"));
    assert_eq!(
        message(&waiting.id).await.payload,
        waiting.payload,
        "still pending: kept"
    );
    assert_eq!(message(&forever.id).await.payload, forever.payload);
}

async fn retention_steps_prune_old_operational_events_sent_or_not(store: SharedStore) {
    let a = app(None);
    store.create_app(&a).await.unwrap();
    // endpoint.created events at 1, 2 and 10,000; endpoint.disabled at 50.
    let mut created = Vec::new();
    for at in [1, 2, 10_000] {
        let e = Endpoint {
            created_at: at,
            updated_at: at,
            ..endpoint(&a.id)
        };
        store.create_endpoint(&e).await.unwrap();
        created.push(e);
    }
    assert!(store.disable_endpoint(&created[0].id, "gone", 50).await.unwrap());
    let events = store.list_operational_events(0, 50).await.unwrap();
    let at: Vec<i64> = events.iter().map(|e| e.created_at).collect();
    assert_eq!(at, [1, 2, 10_000, 50]);
    // Sent: all but the disable. Unsent events are pruned too, or a node without an operational
    // webhook would keep every event forever.
    for event in events.iter().filter(|e| e.event_type != "endpoint.disabled") {
        store.mark_operational_event_sent(event.seq, 60).await.unwrap();
    }

    // Events older than 5,000 go, a batch of one at a time, oldest first; the recent one stays.
    let mut deleted = Vec::new();
    loop {
        let step = store.retention_step(5_000, 0, 1).await.unwrap();
        assert!(step.events_deleted <= 1);
        if step.events_deleted == 0 {
            break;
        }
        deleted.push(step.events_deleted);
    }
    assert_eq!(deleted, [1, 1, 1]);
    let left: Vec<(String, i64)> = store
        .list_operational_events(0, 50)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.event_type, e.created_at))
        .collect();
    assert_eq!(left, [("endpoint.created".to_owned(), 10_000)]);
}

async fn an_apps_payload_retention_applies_to_messages_that_set_none(store: SharedStore) {
    const DAY_MS: i64 = 24 * 3600 * 1000;
    // No endpoints: no delivery is pending, so only the expiry decides.
    let mut a = app(None);
    a.payload_retention_days = Some(1);
    store.create_app(&a).await.unwrap();
    assert_eq!(store.get_app(&a.id).await.unwrap().payload_retention_days, Some(1));
    let (by_app, _) = created(ingest(&store, &a.id, Some("by-app"), None).await);
    let (own, _) = created(
        store
            .ingest(NewMessage {
                payload_retention_ms: Some(2 * DAY_MS),
                ..new_message(&a.id, Some("own"), None)
            })
            .await
            .unwrap(),
    );
    // The default changes for later messages only.
    a.payload_retention_days = None;
    store.update_app(&a).await.unwrap();
    assert_eq!(store.get_app(&a.id).await.unwrap().payload_retention_days, None);
    let (later, _) = created(ingest(&store, &a.id, Some("later"), None).await);

    let payload = |id: String| {
        let (store, app_id) = (store.clone(), a.id.clone());
        async move { store.get_message(&app_id, &id).await.unwrap().payload }
    };
    // Just before a day has passed nothing expires; a day after its creation the app's default
    // expunges the message that set no retention, but not the one that asked for two days.
    let step = store
        .retention_step(0, by_app.created_at + DAY_MS - 1, 10)
        .await
        .unwrap();
    assert_eq!(step.payloads_expunged, 0);
    let step = store.retention_step(0, own.created_at + DAY_MS, 10).await.unwrap();
    assert_eq!(step.payloads_expunged, 1);
    assert_eq!(&*payload(by_app.id.clone()).await, b"{}");
    assert_eq!(payload(own.id.clone()).await, own.payload);
    // Far later, the message's own two days have passed too; the message ingested without a default
    // keeps its payload for good.
    let step = store
        .retention_step(0, later.created_at + 3650 * DAY_MS, 10)
        .await
        .unwrap();
    assert_eq!(step.payloads_expunged, 1);
    assert_eq!(&*payload(own.id.clone()).await, b"{}");
    assert_eq!(payload(later.id.clone()).await, later.payload);
}

async fn any_text_round_trips_exactly(store: SharedStore) {
    // NUL cannot be stored in PostgreSQL text as it is, and U+FFFF is the escape PostgreSQL's store uses.
    let odd = "nul\0byte \u{FFFF}0 \u{FFFF}\u{FFFF} 🦀 \"quote\" \\ \u{202e}";
    let mut a = app(None);
    a.name = odd.into();
    store.create_app(&a).await.unwrap();
    assert_eq!(store.get_app(&a.id).await.unwrap().name, odd);
    let mut e = endpoint(&a.id);
    e.description = odd.into();
    e.disabled_reason = Some(odd.into());
    store.create_endpoint(&e).await.unwrap();
    let back = store.get_endpoint_by_id(&e.id).await.unwrap();
    assert_eq!(
        (back.description.as_str(), back.disabled_reason.as_deref()),
        (odd, Some(odd))
    );

    let mut new = new_message(&a.id, Some(odd), None);
    new.ordering_key = Some(odd.into());
    let (m, deliveries) = created(store.ingest(new.clone()).await.unwrap());
    assert_eq!(m.event_id.as_deref(), Some(odd));
    let found = store.get_message(&a.id, odd).await.unwrap();
    assert_eq!(
        (found.id.as_str(), found.ordering_key.as_deref()),
        (m.id.as_str(), Some(odd))
    );
    let Ingested::Duplicate(dup) = store.ingest(new).await.unwrap() else {
        panic!("the same odd event id is a duplicate")
    };
    assert_eq!(dup.id, m.id);

    let record = AttemptRecord {
        delivery_seq: deliveries[0].seq,
        app_id: a.id.clone(),
        attempt: Attempt {
            id: new_id(IdKind::Attempt),
            message_id: m.id.clone(),
            endpoint_id: e.id.clone(),
            url: e.url.clone(),
            attempt_number: 1,
            success: false,
            outcome: "server_error".into(),
            response_status: Some(500),
            response: odd.into(),
            duration_ms: 1,
            trigger: AttemptTrigger::Scheduled,
            created_at: herald_core::clock::now_ms(),
        },
        status: DeliveryStatus::Pending,
        next_attempt_at: 0,
    };
    store.record_attempts(&[record]).await.unwrap();
    let log = store
        .list_attempts_by_message(&a.id, &m.id, &AttemptFilter::default(), &PageRequest::default())
        .await
        .unwrap();
    assert_eq!(log.items.len(), 1, "the attempt was stored");
    assert_eq!(
        log.items[0].response, odd,
        "a receiver's response body is kept as it was"
    );
}

async fn remembered_responses_keep_their_request_digest_first_one_wins_and_expire(store: SharedStore) {
    let answer = |status: u16, digest: Option<&str>| Remembered {
        status,
        body: format!("{{\"status\":{status}}}").into_bytes(),
        request_digest: digest.map(str::to_owned),
    };
    let first = answer(201, Some("sha256:first"));
    store.remember_response("admin", "k1", &first, 100, 0).await.unwrap();
    // The first answer stored for a key wins: a racing second request does not replace it.
    store
        .remember_response("admin", "k1", &answer(409, Some("sha256:second")), 110, 0)
        .await
        .unwrap();
    assert_eq!(
        store.idempotent_response("admin", "k1", 0).await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(
        store.idempotent_response("app_other", "k1", 0).await.unwrap(),
        None,
        "scoped"
    );
    // An answer remembered without a digest (before digests were kept) reads back as such.
    let undigested = answer(202, None);
    store
        .remember_response("admin", "k2", &undigested, 200, 0)
        .await
        .unwrap();
    assert_eq!(
        store.idempotent_response("admin", "k2", 0).await.unwrap(),
        Some(undigested)
    );
    // Stored before `since`: not returned; and remembering forgets what is older than `expire_before`.
    assert_eq!(store.idempotent_response("admin", "k1", 101).await.unwrap(), None);
    store
        .remember_response("admin", "k3", &answer(201, Some("d")), 300, 150)
        .await
        .unwrap();
    assert_eq!(
        store.idempotent_response("admin", "k1", 0).await.unwrap(),
        None,
        "expired"
    );
    assert!(store.idempotent_response("admin", "k2", 0).await.unwrap().is_some());
}
