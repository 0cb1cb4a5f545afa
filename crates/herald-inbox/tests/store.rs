//! The inbox store's contract, written against `SharedInboxStore` so that every backend runs the same
//! suite: a fresh SQLite file and a fresh PostgreSQL database per test. Without a reachable PostgreSQL the
//! PostgreSQL half is skipped with a visible message, unless `HERALD_REQUIRE_POSTGRES=1` (CI), when it
//! fails.

use std::collections::BTreeSet;

use bytes::Bytes;
use herald_core::clock::Millis;
use herald_core::id::InboxEventId;
use herald_inbox::store::{self, ListQuery, NewEvent, Outcome, SharedInboxStore, Status, StoredEvent};
use herald_store::testdb::{self, TestDatabase};

/// Fresh storage for one backend: its URL, and what must outlive the store (the SQLite file's directory,
/// or the PostgreSQL test database, dropped after the store).
struct Storage {
    name: &'static str,
    url: String,
    _dir: Option<tempfile::TempDir>,
    database: Option<TestDatabase>,
}

/// Fresh storage on every backend under test.
async fn storages(test: &str) -> Vec<Storage> {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec![Storage {
        name: "sqlite",
        url: format!("sqlite://{}", dir.path().join("inbox.db").display()),
        _dir: Some(dir),
        database: None,
    }];
    if let Some(database) = testdb::fresh(test).await {
        all.push(Storage {
            name: "postgres",
            url: database.url.clone(),
            _dir: None,
            database: Some(database),
        });
    }
    all
}

/// Every backend under test, each opened on fresh storage. The tuple drops the store before its storage.
async fn backends(test: &str) -> Vec<(Storage, SharedInboxStore)> {
    let mut opened = Vec::new();
    for storage in storages(test).await {
        let store = store::open(&storage.url).await.unwrap();
        opened.push((storage, store));
    }
    opened
}

fn event(source: &str, event_id: &str) -> NewEvent {
    NewEvent {
        source: source.into(),
        event_id: event_id.into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: Bytes::from(format!(r#"{{"id":"{event_id}"}}"#)),
        status: Status::Pending,
        last_error: None,
        resource_key: Some("r".into()),
        version: Some("2".into()),
    }
}

fn all(limit: usize) -> ListQuery {
    ListQuery {
        limit,
        ..ListQuery::default()
    }
}

fn ids(events: &[StoredEvent]) -> Vec<&str> {
    events.iter().map(|e| e.id.as_str()).collect()
}

/// A moment on the tests' clock, in Unix milliseconds.
fn at(ms: i64) -> Millis {
    Millis::from_unix_ms(ms)
}

fn retry_at(at: Millis) -> Outcome {
    Outcome::Retry {
        next_attempt_at: at,
        error: "503".into(),
    }
}

fn forwarded(key: &str, version: &str) -> Outcome {
    Outcome::Forwarded {
        guard: Some((key.into(), version.into())),
    }
}

#[tokio::test]
async fn a_duplicate_is_stored_once_and_answered_with_the_original_id() {
    for (storage, store) in backends("a_duplicate_is_stored_once").await {
        let name = storage.name;
        // Concurrent copies: one batch on SQLite, racing connections on PostgreSQL.
        let copies = futures_join(&store, 8, "e1").await;
        let first = &copies[0].id;
        assert!(copies.iter().all(|c| &c.id == first), "{name}: one id for every copy");
        assert_eq!(copies.iter().filter(|c| !c.duplicate).count(), 1, "{name}: {copies:?}");
        let again = store.insert(event("s", "e1")).await.unwrap();
        assert_eq!((again.id.as_str(), again.duplicate), (first.as_str(), true), "{name}");
        // The same event id in another source is another event.
        let other = store.insert(event("t", "e1")).await.unwrap();
        assert!(!other.duplicate && &other.id != first, "{name}");
        let stored = store.list(&all(10)).await.unwrap();
        assert_eq!(stored.len(), 2, "{name}");
        let original = store.get(first).await.unwrap().unwrap();
        assert_eq!(original.headers, event("s", "e1").headers, "{name}");
        assert_eq!(original.body, event("s", "e1").body, "{name}");
        assert_eq!(
            (original.status, original.attempts, original.replays),
            (Status::Pending, 0, 0)
        );
        assert_eq!(original.next_attempt_at, original.received_at, "{name}: due at once");
        assert!(store.get(&InboxEventId::new()).await.unwrap().is_none(), "{name}");
        store.ping().await.unwrap();
    }
}

/// `n` concurrent inserts of one event.
async fn futures_join(store: &SharedInboxStore, n: usize, event_id: &str) -> Vec<store::Inserted> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let store = store.clone();
        let event = event("s", event_id);
        tasks.spawn(async move { store.insert(event).await.unwrap() });
    }
    tasks.join_all().await
}

#[tokio::test]
async fn due_events_come_earliest_first_and_retries_wait() {
    for (storage, store) in backends("due_events_come_earliest_first").await {
        let name = storage.name;
        let a = store.insert(event("s", "a")).await.unwrap().id;
        let b = store.insert(event("s", "b")).await.unwrap().id;
        let c = store.insert(event("s", "c")).await.unwrap().id;
        let now = store.get(&c).await.unwrap().unwrap().received_at;
        assert_eq!(
            ids(&store.due(now, 10).await.unwrap()),
            [a.as_str(), b.as_str(), c.as_str()],
            "{name}: in order"
        );
        assert_eq!(
            ids(&store.due(now, 2).await.unwrap()),
            [a.as_str(), b.as_str()],
            "{name}: limited"
        );
        // a fails and is due again later than b's retry; c is forwarded.
        assert!(store.record(&a, 0, 1, &retry_at(now.add_ms(2_000)), now).await.unwrap());
        assert!(store.record(&b, 0, 1, &retry_at(now.add_ms(1_000)), now).await.unwrap());
        assert!(
            store
                .record(&c, 0, 1, &Outcome::Forwarded { guard: None }, now)
                .await
                .unwrap()
        );
        assert!(store.due(now, 10).await.unwrap().is_empty(), "{name}: nothing due yet");
        assert_eq!(
            store.next_due_after(now).await.unwrap(),
            Some(now.add_ms(1_000)),
            "{name}"
        );
        assert_eq!(
            ids(&store.due(now.add_ms(1_500), 10).await.unwrap()),
            [b.as_str()],
            "{name}"
        );
        assert_eq!(
            ids(&store.due(now.add_ms(5_000), 10).await.unwrap()),
            [b.as_str(), a.as_str()],
            "{name}: by due time"
        );
        let failed = store.get(&a).await.unwrap().unwrap();
        assert_eq!((failed.status, failed.attempts), (Status::Pending, 1), "{name}");
        assert_eq!(failed.last_error.as_deref(), Some("503"), "{name}");
        // Dead: no longer due, and nothing is scheduled after it.
        let dead = Outcome::Dead { error: "gone".into() };
        assert!(store.record(&a, 0, 9, &dead, now).await.unwrap());
        assert!(store.record(&b, 0, 9, &dead, now).await.unwrap());
        assert_eq!(store.next_due_after(now).await.unwrap(), None, "{name}");
        assert_eq!(store.get(&a).await.unwrap().unwrap().status, Status::Dead, "{name}");
    }
}

#[tokio::test]
async fn an_outcome_is_refused_after_a_replay_or_once_it_is_no_longer_pending() {
    for (storage, store) in backends("an_outcome_is_refused_after_a_replay").await {
        let name = storage.name;
        let id = store.insert(event("s", "e1")).await.unwrap().id;
        let ok = Outcome::Forwarded { guard: None };
        // A replay while a forward is in flight: the forward's result (replay count 0) is dropped.
        assert!(store.replay(&id, at(1)).await.unwrap());
        assert!(
            !store.record(&id, 0, 1, &ok, at(2)).await.unwrap(),
            "{name}: stale replay count"
        );
        let pending = store.get(&id).await.unwrap().unwrap();
        assert_eq!((pending.status, pending.replays), (Status::Pending, 1), "{name}");
        assert!(store.record(&id, 1, 1, &ok, at(2)).await.unwrap(), "{name}");
        // Forwarded: a second outcome for the same attempt is refused.
        assert!(
            !store.record(&id, 1, 2, &retry_at(at(9)), at(3)).await.unwrap(),
            "{name}"
        );
        let done = store.get(&id).await.unwrap().unwrap();
        assert_eq!(
            (done.status, done.attempts, done.updated_at),
            (Status::Forwarded, 1, at(2))
        );
        let stale = Outcome::Stale { reason: "older".into() };
        let other = store.insert(event("s", "e2")).await.unwrap().id;
        assert!(store.record(&other, 0, 0, &stale, at(4)).await.unwrap());
        let skipped = store.get(&other).await.unwrap().unwrap();
        assert_eq!(
            (skipped.status, skipped.last_error.as_deref()),
            (Status::Stale, Some("older"))
        );
        assert!(!store.replay(&InboxEventId::new(), at(5)).await.unwrap(), "{name}");
        assert!(
            !store.record(&InboxEventId::new(), 0, 1, &ok, at(5)).await.unwrap(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_window_replay_counts_only_its_source_and_window() {
    for (storage, store) in backends("a_window_replay_counts").await {
        let name = storage.name;
        let mut stamps = Vec::new();
        for n in 0..4 {
            let id = store.insert(event("s", &format!("e{n}"))).await.unwrap().id;
            stamps.push(store.get(&id).await.unwrap().unwrap().received_at);
            assert!(
                store
                    .record(&id, 0, 1, &Outcome::Forwarded { guard: None }, at(0))
                    .await
                    .unwrap()
            );
            // Distinct reception times, so the window's bounds fall between events.
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        }
        store.insert(event("elsewhere", "e9")).await.unwrap();
        let now = stamps[3].add_ms(10);
        assert_eq!(
            store.replay_window("s", at(0), at(1), now).await.unwrap(),
            0,
            "{name}: empty window"
        );
        assert_eq!(
            store.replay_window("nobody", at(0), Millis::MAX, now).await.unwrap(),
            0,
            "{name}"
        );
        // [second, fourth): the second and third events.
        assert_eq!(
            store.replay_window("s", stamps[1], stamps[3], now).await.unwrap(),
            2,
            "{name}"
        );
        let due = store.due(now, 10).await.unwrap();
        let replayed: Vec<(&str, i64, u32)> = due
            .iter()
            .filter(|e| e.source == "s")
            .map(|e| (e.event_id.as_str(), e.replays, e.attempts))
            .collect();
        assert_eq!(replayed, [("e1", 1, 0), ("e2", 1, 0)], "{name}");
        assert_eq!(
            store.replay_window("s", at(0), Millis::MAX, now).await.unwrap(),
            4,
            "{name}"
        );
    }
}

#[tokio::test]
async fn listings_are_newest_first_and_page_with_a_cursor() {
    for (storage, store) in backends("listings_are_newest_first").await {
        let name = storage.name;
        let mut inserted = Vec::new();
        for n in 0..5 {
            let source = if n % 2 == 0 { "even" } else { "odd" };
            inserted.push(store.insert(event(source, &format!("e{n}"))).await.unwrap().id);
        }
        let bad = NewEvent {
            status: Status::BadInput,
            last_error: Some("no version".into()),
            ..event("odd", "poison")
        };
        inserted.push(store.insert(bad).await.unwrap().id);
        let newest_first: Vec<&str> = inserted.iter().rev().map(InboxEventId::as_str).collect();
        // limit + 1 rows tell whether more follow.
        let first = store.list(&all(2)).await.unwrap();
        assert_eq!(ids(&first), newest_first[..3], "{name}");
        let second = store
            .list(&ListQuery {
                before: Some(inserted[4].clone()),
                ..all(2)
            })
            .await
            .unwrap();
        assert_eq!(ids(&second), newest_first[2..5], "{name}");
        let last = store
            .list(&ListQuery {
                before: Some(inserted[1].clone()),
                ..all(10)
            })
            .await
            .unwrap();
        assert_eq!(ids(&last), newest_first[5..], "{name}");
        let even = store
            .list(&ListQuery {
                source: Some("even".into()),
                ..all(10)
            })
            .await
            .unwrap();
        assert_eq!(ids(&even), [inserted[4].as_str(), &inserted[2], &inserted[0]], "{name}");
        let poison = store
            .list(&ListQuery {
                source: Some("odd".into()),
                status: Some(Status::BadInput),
                ..all(10)
            })
            .await
            .unwrap();
        assert_eq!(ids(&poison), [inserted[5].as_str()], "{name}");
        assert_eq!(poison[0].last_error.as_deref(), Some("no version"), "{name}");
        assert!(
            store
                .due(Millis::MAX, 10)
                .await
                .unwrap()
                .iter()
                .all(|e| e.status == Status::Pending)
        );
    }
}

#[tokio::test]
async fn the_version_mark_only_moves_forward_in_version_order() {
    for (storage, store) in backends("the_version_mark_only_moves_forward").await {
        let name = storage.name;
        assert_eq!(store.newest_version("s", "r").await.unwrap(), None, "{name}");
        // Forwarded in this order; the mark follows version order (integers by value, so 10 > 9),
        // never going back for an older or equal version (a replay forwards those).
        let steps = [
            ("9", "9"),
            ("10", "10"),
            ("9", "10"),
            ("10", "10"),
            ("011", "011"),
            ("2.5", "011"),
        ];
        for (n, (version, mark)) in steps.into_iter().enumerate() {
            let id = store.insert(event("s", &format!("v{n}"))).await.unwrap().id;
            assert!(store.record(&id, 0, 1, &forwarded("r", version), at(1)).await.unwrap());
            let newest = store.newest_version("s", "r").await.unwrap();
            assert_eq!(newest.as_deref(), Some(mark), "{name}: after forwarding {version}");
        }
        // Marks are per source and resource; a forward without the guard leaves them alone.
        assert_eq!(store.newest_version("t", "r").await.unwrap(), None, "{name}");
        assert_eq!(store.newest_version("s", "other").await.unwrap(), None, "{name}");
        let id = store.insert(event("s", "plain")).await.unwrap().id;
        assert!(
            store
                .record(&id, 0, 1, &Outcome::Forwarded { guard: None }, at(1))
                .await
                .unwrap()
        );
        assert_eq!(store.newest_version("s", "r").await.unwrap().as_deref(), Some("011"));
        // Strings compare byte by byte.
        for (n, version) in ["2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z"].into_iter().enumerate() {
            let id = store.insert(event("s", &format!("t{n}"))).await.unwrap().id;
            assert!(
                store
                    .record(&id, 0, 1, &forwarded("time", version), at(1))
                    .await
                    .unwrap()
            );
        }
        let newest = store.newest_version("s", "time").await.unwrap();
        assert_eq!(newest.as_deref(), Some("2026-01-02T00:00:00Z"), "{name}");
    }
}

#[tokio::test]
async fn any_text_from_the_network_round_trips_including_nul() {
    for (storage, store) in backends("any_text_from_the_network_round_trips").await {
        let name = storage.name;
        // NUL (which PostgreSQL's text cannot hold) and U+FFFF (the escape character) everywhere a
        // provider's bytes end up as text.
        let weird = "a\0b\u{FFFF}0c\u{FFFF}";
        let event = NewEvent {
            source: "s".into(),
            event_id: format!("id-{weird}"),
            headers: vec![("x-weird".into(), weird.into()), ("x-plain".into(), "plain".into())],
            body: Bytes::from_static(b"\0\x01\xff{not json"),
            status: Status::Pending,
            last_error: None,
            resource_key: Some(format!("key-{weird}")),
            version: Some(format!("v-{weird}")),
        };
        let id = store.insert(event.clone()).await.unwrap().id;
        // The same id deduplicates; one differing only where the escape would collide does not.
        assert!(store.insert(event.clone()).await.unwrap().duplicate, "{name}");
        let collide = NewEvent {
            event_id: "id-a\u{FFFF}0b\u{FFFF}\u{FFFF}0c\u{FFFF}\u{FFFF}".into(),
            ..event.clone()
        };
        assert!(
            !store.insert(collide).await.unwrap().duplicate,
            "{name}: escaping is injective"
        );
        let stored = store.get(&id).await.unwrap().unwrap();
        assert_eq!(stored.event_id, event.event_id, "{name}");
        assert_eq!(stored.headers, event.headers, "{name}");
        assert_eq!(stored.body, event.body, "{name}");
        assert_eq!(
            (stored.resource_key, stored.version),
            (event.resource_key.clone(), event.version.clone())
        );
        let key = event.resource_key.clone().unwrap();
        let version = event.version.clone().unwrap();
        assert!(
            store
                .record(&id, 0, 1, &forwarded(&key, &version), at(1))
                .await
                .unwrap()
        );
        let newest = store.newest_version("s", &key).await.unwrap();
        assert_eq!(newest.as_deref(), Some(version.as_str()), "{name}");
        // A filter with NUL from an admin's query finds nothing instead of failing. (An id cannot hold one:
        // it is parsed before it reaches the store.)
        let none = store
            .list(&ListQuery {
                source: Some("s\0".into()),
                ..all(10)
            })
            .await
            .unwrap();
        assert!(none.is_empty(), "{name}");
    }
}

/// The sender's store and the inbox on one database (`herald serve --inbox` with one URL): each keeps its
/// own migration history, whichever opens first, and both open again.
#[tokio::test]
async fn the_inbox_shares_a_database_with_the_sender() {
    for storage in storages("the_inbox_shares_a_database_with_the_sender").await {
        let name = storage.name;
        let options = herald_store::StoreOptions::default();
        let open_sender = || herald_store::open_with(&storage.url, testdb::test_cipher(), &options);
        for round in 0..2 {
            // First round: the inbox migrates first, then the sender; second: both already migrated.
            let inbox = store::open(&storage.url)
                .await
                .unwrap_or_else(|e| panic!("{name} {round}: {e}"));
            let sender = open_sender().await.unwrap_or_else(|e| panic!("{name} {round}: {e}"));
            inbox.insert(event("s", &format!("e{round}"))).await.unwrap();
            assert_eq!(inbox.list(&all(10)).await.unwrap().len(), round + 1, "{name}");
            sender.ping().await.unwrap();
            drop((inbox, sender));
        }
    }
    // The other order, on fresh storage.
    for storage in storages("the_inbox_shares_a_database_with_the_sender").await {
        let sender = herald_store::open_with(&storage.url, testdb::test_cipher(), &Default::default())
            .await
            .unwrap();
        let inbox = store::open(&storage.url).await.unwrap();
        inbox.insert(event("s", "e")).await.unwrap();
        sender.ping().await.unwrap();
        if let Some(database) = &storage.database {
            // The inbox's history is its own table; sqlx's default one is the sender's alone.
            let url = database.url.clone();
            let pool = sqlx::PgPool::connect(&url).await.unwrap();
            let inbox_versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM _herald_inbox_migrations")
                .fetch_all(&pool)
                .await
                .unwrap();
            // Every inbox migration the crate ships, in order, and nothing of the sender's.
            let shipped: Vec<i64> = (1..=inbox_migration_count("postgres")).collect();
            assert_eq!(inbox_versions, shipped);
            let sender_versions: BTreeSet<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
                .fetch_all(&pool)
                .await
                .unwrap()
                .into_iter()
                .collect();
            assert!(sender_versions.contains(&4), "{sender_versions:?}");
            pool.close().await;
        }
    }
}

/// How many migrations the inbox ships for `dialect` (the files under `migrations/{dialect}`).
fn inbox_migration_count(dialect: &str) -> i64 {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(dialect);
    let count = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter(|entry| {
            entry
                .as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sql"))
        })
        .count();
    i64::try_from(count).unwrap()
}

/// An inbox file made before the inbox's migrations had their own table (they were in sqlx's
/// `_sqlx_migrations`) opens, keeps its events, and takes new ones.
#[tokio::test]
async fn an_older_sqlite_inbox_file_still_opens() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("old.db").display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    // The schema and the history exactly as the first release's migrator left them.
    sqlx::raw_sql(include_str!("old_sqlite_inbox.sql"))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let store = store::open(&url).await.unwrap();
    let old = store
        .get(&"evt_0000000000000000000old".parse().unwrap())
        .await
        .unwrap()
        .expect("the old event is still there");
    assert_eq!(old.body, Bytes::from_static(b"{}"));
    store.insert(event("s", "new")).await.unwrap();
    assert_eq!(store.list(&all(10)).await.unwrap().len(), 2);
}
