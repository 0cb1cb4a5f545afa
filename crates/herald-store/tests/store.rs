//! The store's contract, written against `SharedStore` so that every backend runs the same suite:
//! SQLite files and PostgreSQL databases (a fresh one per test). Without a reachable PostgreSQL the
//! PostgreSQL half is skipped with a visible message, unless `HERALD_REQUIRE_POSTGRES=1` (CI).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use herald_core::id::{IdKind, new_id};
use herald_core::model::{Application, Attempt, AttemptTrigger, DeliveryStatus, Endpoint, Message, Ordering};
use herald_store::{AttemptRecord, Backlog, Ingested, MessageFilter, NewMessage, PageRequest, SharedStore, StoreError};

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

/// Every backend under test, each opened on fresh storage. The storage must outlive the store (the
/// tuple drops the store first).
async fn backends() -> Vec<(Storage, SharedStore)> {
    let mut opened = Vec::new();
    for storage in storages("the store suite").await {
        let store = herald_store::open(&storage.url).await.unwrap();
        opened.push((storage, store));
    }
    opened
}

fn app(uid: Option<&str>) -> Application {
    Application {
        id: new_id(IdKind::Application),
        uid: uid.map(str::to_owned),
        name: "shop".into(),
        rate_limit: None,
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
        version: 1,
        metadata: BTreeMap::new(),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        created_at: 1,
        updated_at: 1,
    }
}

fn new_message(app_id: &str, event_id: Option<&str>, key: Option<&str>) -> NewMessage {
    NewMessage {
        app_id: app_id.to_owned(),
        event_id: event_id.map(str::to_owned),
        event_type: "a.b".into(),
        channels: Some(vec!["eu".into()]),
        payload: Arc::from(&b"{\"k\": [1, 2]}"[..]),
        idempotency_key: key.map(str::to_owned),
        ordering_key: None,
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

#[tokio::test]
async fn applications_round_trip_and_uids_are_unique() {
    for (_dir, store) in backends().await {
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
}

#[tokio::test]
async fn pages_walk_forward_and_back_without_gaps() {
    for (_dir, store) in backends().await {
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
}

#[tokio::test]
async fn ingest_commits_message_and_deliveries_and_deduplicates() {
    for (_dir, store) in backends().await {
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
}

#[tokio::test]
async fn concurrent_ingests_each_commit_once_and_a_failing_one_fails_alone() {
    for (_dir, store) in backends().await {
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
}

#[tokio::test]
async fn attempts_update_deliveries_and_can_disable_the_endpoint() {
    for (_dir, store) in backends().await {
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
        let events = store.list_operational_events(0, 10).await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event_type, "endpoint.disabled");
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
            .list_attempts_by_message(&a.id, &m.id, &PageRequest::default())
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
}

#[tokio::test]
async fn waiting_deliveries_expire_and_the_backlog_is_counted() {
    for (_dir, store) in backends().await {
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
}

#[tokio::test]
async fn ordering_settings_and_keys_round_trip() {
    for (_dir, store) in backends().await {
        let a = app(None);
        store.create_app(&a).await.unwrap();
        let mut e = endpoint(&a.id);
        e.ordering = Ordering::Key;
        e.max_concurrency = Some(3);
        store.create_endpoint(&e).await.unwrap();
        let back = store.get_endpoint_by_id(&e.id).await.unwrap();
        assert_eq!((back.ordering, back.max_concurrency), (Ordering::Key, Some(3)));
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
}

#[tokio::test]
async fn a_reopened_store_keeps_everything_committed() {
    for storage in storages("a_reopened_store_keeps_everything_committed").await {
        let url = &storage.url;
        let a = app(None);
        let e = endpoint(&a.id);
        {
            let store = herald_store::open(url).await.unwrap();
            store.create_app(&a).await.unwrap();
            store.create_endpoint(&e).await.unwrap();
            ingest(&store, &a.id, None, None).await;
        }
        let store = herald_store::open(url).await.unwrap();
        assert_eq!(
            store.endpoints_with_pending().await.unwrap(),
            std::slice::from_ref(&e.id)
        );
        assert_eq!(store.load_pending(&e.id, 0, 10).await.unwrap().len(), 1);
    }
}

#[tokio::test]
async fn any_text_round_trips_exactly() {
    // NUL cannot be stored in PostgreSQL text as it is, and U+FFFF is the escape PostgreSQL's store uses.
    let odd = "nul\0byte \u{FFFF}0 \u{FFFF}\u{FFFF} 🦀 \"quote\" \\ \u{202e}";
    for (_dir, store) in backends().await {
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
            .list_attempts_by_message(&a.id, &m.id, &PageRequest::default())
            .await
            .unwrap();
        assert_eq!(log.items.len(), 1, "the attempt was stored");
        assert_eq!(
            log.items[0].response, odd,
            "a receiver's response body is kept as it was"
        );
    }
}
