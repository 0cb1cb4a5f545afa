//! Polling endpoints, the application stream and consumer offsets, on every backend.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use herald_core::id::{AppId, MessageId, SinkId, SinkIdOrUid};
use herald_store::{AppToken, ConsumerOffset, PollingEndpoint, SharedStore, StoreError};

use crate::store::{Backend, app, at, new_message, on_each_backend, run};

on_each_backend!(
    polling_endpoints_round_trip_with_their_secret_sealed,
    the_stream_numbers_an_apps_messages_in_commit_order,
    consumer_offsets_are_set_committed_forward_only_and_go_with_their_sink,
    a_token_scoped_to_a_sink_round_trips_and_goes_with_its_sink,
);

fn sink(app_id: &AppId, uid: Option<&str>) -> PollingEndpoint {
    PollingEndpoint {
        id: SinkId::new(),
        app_id: app_id.clone(),
        uid: uid.map(str::to_owned),
        description: "laptop\0listener".into(),
        filter_types: Some(vec!["a.b".into()]),
        channels: None,
        metadata: BTreeMap::from([("who".to_owned(), "dev".to_owned())]),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        created_at: at(5),
        updated_at: at(5),
    }
}

async fn ingest_typed(store: &SharedStore, app_id: &AppId, event_type: &str) -> MessageId {
    let mut new = new_message(app_id, None, None);
    new.event_type = event_type.to_owned();
    match store.ingest(new).await.unwrap() {
        herald_store::Ingested::Created { message, .. } => message.id.clone(),
        herald_store::Ingested::Duplicate(_) => panic!("not a duplicate"),
    }
}

async fn polling_endpoints_round_trip_with_their_secret_sealed(store: SharedStore) {
    let owner = app(None);
    store.create_app(&owner).await.unwrap();
    let first = sink(&owner.id, Some("laptop"));
    store.create_polling_endpoint(&first).await.unwrap();
    assert_eq!(
        store
            .get_polling_endpoint(&owner.id, &SinkIdOrUid::new("laptop"))
            .await
            .unwrap(),
        first
    );
    assert_eq!(
        store
            .get_polling_endpoint(&owner.id, &(&first.id).into())
            .await
            .unwrap(),
        first
    );
    let taken = sink(&owner.id, Some("laptop"));
    assert!(matches!(
        store.create_polling_endpoint(&taken).await,
        Err(StoreError::Conflict("uid"))
    ));
    let orphan = sink(&AppId::new(), None);
    assert!(matches!(
        store.create_polling_endpoint(&orphan).await,
        Err(StoreError::NotFound)
    ));

    let second = sink(&owner.id, None);
    store.create_polling_endpoint(&second).await.unwrap();
    let all = store.list_polling_endpoints(&owner.id, None, 10).await.unwrap();
    assert_eq!(all, vec![first.clone(), second.clone()]);
    let rest = store
        .list_polling_endpoints(&owner.id, Some(&first.id), 10)
        .await
        .unwrap();
    assert_eq!(rest, vec![second.clone()]);

    let mut changed = first.clone();
    changed.uid = None;
    changed.channels = Some(vec!["eu".into()]);
    changed.secret = "whsec_ignored".into();
    changed.updated_at = at(9);
    store.update_polling_endpoint(&changed).await.unwrap();
    let read = store
        .get_polling_endpoint(&owner.id, &(&first.id).into())
        .await
        .unwrap();
    assert_eq!(read.channels, Some(vec!["eu".to_owned()]));
    assert_eq!(read.secret, first.secret, "an update never changes the secret");

    store.delete_polling_endpoint(&owner.id, &first.id).await.unwrap();
    assert!(matches!(
        store.get_polling_endpoint(&owner.id, &(&first.id).into()).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.delete_polling_endpoint(&owner.id, &first.id).await,
        Err(StoreError::NotFound)
    ));
}

async fn the_stream_numbers_an_apps_messages_in_commit_order(store: SharedStore) {
    let owner = app(None);
    let other = app(None);
    store.create_app(&owner).await.unwrap();
    store.create_app(&other).await.unwrap();
    assert_eq!(store.stream_head(&owner.id).await.unwrap(), 0);
    let signal = store.stream_signal();

    // Concurrent producers on two apps: group commit interleaves them in batches.
    let mut tasks = Vec::new();
    for n in 0..40 {
        let store = store.clone();
        let app_id = if n % 4 == 0 { other.id.clone() } else { owner.id.clone() };
        tasks.push(tokio::spawn(async move {
            let id = ingest_typed(&store, &app_id, if n % 2 == 0 { "a.b" } else { "c.d" }).await;
            (app_id, id)
        }));
    }
    let mut mine = HashSet::new();
    for task in tasks {
        let (app_id, id) = task.await.unwrap();
        if app_id == owner.id {
            mine.insert(id);
        }
    }
    assert!(signal.has_moved(), "committing messages moves the stream signal");

    let entries = store.read_stream(&owner.id, 0, 100).await.unwrap();
    assert_eq!(entries.len(), 30);
    let seqs: Vec<i64> = entries.iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let ids: HashSet<MessageId> = entries.iter().map(|e| e.message.id.clone()).collect();
    assert_eq!(ids, mine, "exactly the app's own messages");
    assert!(entries.iter().all(|e| e.message.app_id == owner.id));
    assert_eq!(&*entries[0].message.payload, b"{\"k\": [1, 2]}");
    assert_eq!(store.stream_head(&owner.id).await.unwrap(), *seqs.last().unwrap());

    // A range read from the middle returns the rest, in order, bounded by the limit.
    let tail = store.read_stream(&owner.id, seqs[9], 5).await.unwrap();
    assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), seqs[10..15].to_vec());

    // By time: from the beginning of time it is the whole stream; after the last message, none.
    assert_eq!(
        store.stream_position_at(&owner.id, at(0)).await.unwrap(),
        Some(seqs[0] - 1)
    );
    let last_created = entries.last().unwrap().message.created_at;
    assert_eq!(
        store
            .stream_position_at(&owner.id, last_created.add_ms(1))
            .await
            .unwrap(),
        None
    );
}

async fn consumer_offsets_are_set_committed_forward_only_and_go_with_their_sink(store: SharedStore) {
    let owner = app(None);
    store.create_app(&owner).await.unwrap();
    let polling = sink(&owner.id, None);
    store.create_polling_endpoint(&polling).await.unwrap();
    assert_eq!(store.consumer_offset(&polling.id, "c1").await.unwrap(), None);

    let leased = ConsumerOffset {
        committed: 3,
        leased: 8,
        lease_expires_at: at(1_000),
    };
    store
        .put_consumer_offset(&polling.id, "c1", &leased, at(10))
        .await
        .unwrap();
    assert_eq!(store.consumer_offset(&polling.id, "c1").await.unwrap(), Some(leased));

    // A commit inside the lease keeps it; one covering it ends it; an older one changes nothing.
    store.commit_consumer(&polling.id, "c1", 5, at(11)).await.unwrap();
    let offset = store.consumer_offset(&polling.id, "c1").await.unwrap().unwrap();
    assert_eq!((offset.committed, offset.lease_expires_at), (5, at(1_000)));
    store.commit_consumer(&polling.id, "c1", 8, at(12)).await.unwrap();
    let offset = store.consumer_offset(&polling.id, "c1").await.unwrap().unwrap();
    assert_eq!((offset.committed, offset.lease_expires_at), (8, at(0)));
    store.commit_consumer(&polling.id, "c1", 2, at(13)).await.unwrap();
    assert_eq!(
        store
            .consumer_offset(&polling.id, "c1")
            .await
            .unwrap()
            .unwrap()
            .committed,
        8
    );

    // A first commit creates the consumer; a seek may move it back.
    store.commit_consumer(&polling.id, "c2", 4, at(14)).await.unwrap();
    assert_eq!(
        store.consumer_offset(&polling.id, "c2").await.unwrap(),
        Some(ConsumerOffset::at(4))
    );
    store
        .put_consumer_offset(&polling.id, "c1", &ConsumerOffset::at(1), at(15))
        .await
        .unwrap();
    assert_eq!(
        store.consumer_offset(&polling.id, "c1").await.unwrap(),
        Some(ConsumerOffset::at(1))
    );

    // Offsets of a sink that is gone are refused, and deleting a sink deletes its consumers.
    assert!(matches!(
        store.commit_consumer(&SinkId::new(), "c1", 1, at(16)).await,
        Err(StoreError::NotFound)
    ));
    store.delete_polling_endpoint(&owner.id, &polling.id).await.unwrap();
    assert_eq!(store.consumer_offset(&polling.id, "c1").await.unwrap(), None);
}

async fn a_token_scoped_to_a_sink_round_trips_and_goes_with_its_sink(store: SharedStore) {
    let owner = app(None);
    store.create_app(&owner).await.unwrap();
    let polling = sink(&owner.id, None);
    store.create_polling_endpoint(&polling).await.unwrap();
    let scoped = AppToken {
        token_sha256: "scoped".into(),
        app_id: owner.id.clone(),
        read_only: true,
        sink_id: Some(polling.id.clone()),
        session_id: None,
        created_at: at(1),
        expires_at: at(1_000),
    };
    store.create_app_token(&scoped).await.unwrap();
    assert_eq!(
        store.find_app_token("scoped", at(50)).await.unwrap(),
        Some(scoped.clone())
    );
    let dangling = AppToken {
        token_sha256: "dangling".into(),
        sink_id: Some(SinkId::new()),
        ..scoped.clone()
    };
    assert!(matches!(
        store.create_app_token(&dangling).await,
        Err(StoreError::NotFound)
    ));
    store.delete_polling_endpoint(&owner.id, &polling.id).await.unwrap();
    assert_eq!(
        store.find_app_token("scoped", at(50)).await.unwrap(),
        None,
        "gone with its polling endpoint"
    );
}

/// Two nodes on one PostgreSQL database: a long poll waits on its own node's stream signal, which that
/// node's ingest moves; a message committed through the other node must move it too, promptly (not at the
/// poll's timeout), and nothing must move it while nothing commits.
#[tokio::test]
async fn another_nodes_commit_wakes_a_long_poll_promptly() {
    let Some(database) = herald_store::testdb::fresh("another_nodes_commit_wakes_a_long_poll").await else {
        return;
    };
    let open = async || {
        herald_store::open_with(
            &database.url,
            herald_store::testdb::test_cipher(),
            &herald_store::StoreOptions::default(),
        )
        .await
        .expect("open a node")
    };
    let (a, b) = (open().await, open().await);
    let owner = app(None);
    a.create_app(&owner).await.unwrap();

    // A long poll on node B.
    let mut signal = b.stream_signal();
    let settle = Duration::from_millis(300);
    tokio::time::sleep(settle).await;
    signal.mark_seen();
    assert!(
        tokio::time::timeout(settle, signal.changed()).await.is_err(),
        "nothing committed: the signal stays"
    );

    let id = ingest_typed(&a, &owner.id, "a.b").await;
    let committed = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), signal.changed())
        .await
        .expect("node A's commit wakes node B's long poll promptly")
        .expect("the store runs");
    let woke = committed.elapsed();
    let entries = b.read_stream(&owner.id, 0, 10).await.unwrap();
    assert_eq!(
        entries.iter().map(|e| e.message.id.clone()).collect::<Vec<_>>(),
        [id],
        "woken after {woke:?}"
    );
}
