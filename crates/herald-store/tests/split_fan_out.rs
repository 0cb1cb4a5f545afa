//! Wide fan-outs on PostgreSQL in two steps: a message with more than 128 deliveries is acknowledged with
//! its endpoint list stored, and its delivery rows follow in the writer's next transaction. Every
//! delivery must still come, exactly once, in the commit feed and in the table; a list left behind by a
//! node that stopped in between must be taken up by another node, without an endpoint deleted meanwhile;
//! a list whose application's row is held waits without holding the writer, and one the database refuses
//! stays for a later sweep without holding back any other; and a message with an ordering key is never
//! split. Skipped with a visible message when PostgreSQL is unreachable (fatal with
//! `HERALD_REQUIRE_POSTGRES=1`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use herald_core::id::{AppId, EndpointId, MessageId};
use herald_store::postgres::PgStore;
use herald_store::{Change, ChangeStream, DeliveryStore, Ingested, Store, testdb};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use crate::fan_out::node;
use crate::leases::{app, endpoint, message, wait_until};

/// More endpoints than a batch writes deliveries for in the message's own transaction (128), and than
/// one pending row holds (250).
const WIDE: usize = 300;

/// An application with `n` endpoints subscribed to everything, created on `store`.
async fn app_with_endpoints(store: &PgStore, n: usize) -> (AppId, Vec<EndpointId>) {
    let shop = app();
    store.create_app(&shop).await.unwrap();
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let ep = endpoint(&shop.id);
        store.create_endpoint(&ep).await.unwrap();
        ids.push(ep.id);
    }
    (shop.id, ids)
}

/// The endpoints the commit feed hands the engine for `message` until `want` of them came (each once),
/// within 10 s, with their seqs in the order they came.
async fn fed(changes: &mut ChangeStream, message: &MessageId, want: usize) -> (BTreeSet<EndpointId>, Vec<i64>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut endpoints, mut seqs) = (BTreeSet::new(), Vec::new());
    while endpoints.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        let change = tokio::time::timeout(left, changes.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {want} deliveries reached the feed", endpoints.len()))
            .expect("the feed is open");
        if let Change::Committed(deliveries) = change {
            for d in deliveries.into_iter().filter(|d| d.message.id == *message) {
                assert!(endpoints.insert(d.endpoint_id.clone()), "{} fed twice", d.endpoint_id);
                seqs.push(d.seq);
            }
        }
    }
    (endpoints, seqs)
}

/// The delivery rows of `message`, by endpoint, and the pending fan-out rows left in the database.
async fn stored(url: &str, message: &str) -> (BTreeSet<String>, i64) {
    let mut conn = PgConnection::connect(url).await.unwrap();
    let rows: Vec<String> = sqlx::query_scalar("SELECT endpoint_id FROM delivery WHERE message_id = $1")
        .bind(message)
        .fetch_all(&mut conn)
        .await
        .unwrap();
    let count = rows.len();
    let endpoints: BTreeSet<String> = rows.into_iter().collect();
    assert_eq!(endpoints.len(), count, "one delivery per endpoint");
    let pending: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM fan_out_pending")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    (endpoints, pending)
}

fn texts(ids: &[EndpointId]) -> BTreeSet<String> {
    ids.iter().map(ToString::to_string).collect()
}

/// What a node that stopped between the two steps leaves: a message to `ids` of `app_id`, a minute old,
/// and its endpoint list in two pending rows (as a batch writes a long list); the message's id.
async fn left_pending(conn: &mut PgConnection, app_id: &AppId, ids: &[EndpointId]) -> MessageId {
    let id = MessageId::new();
    let created = herald_core::clock::now().add_ms(-60_000).as_unix_ms();
    sqlx::query("INSERT INTO message (id, app_id, event_type, payload, created_at) VALUES ($1, $2, 'a.b', $3, $4)")
        .bind(id.as_str())
        .bind(app_id.as_str())
        .bind(&b"{}"[..])
        .bind(created)
        .execute(&mut *conn)
        .await
        .unwrap();
    let (first, rest) = ids.split_at(ids.len() / 2);
    for (chunk, part) in [first, rest].into_iter().enumerate() {
        let list: Vec<String> = part.iter().map(ToString::to_string).collect();
        sqlx::query("INSERT INTO fan_out_pending (message_id, chunk, endpoint_ids) VALUES ($1, $2, $3)")
            .bind(id.as_str())
            .bind(i32::try_from(chunk).unwrap())
            .bind(serde_json::to_string(&list).unwrap())
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    id
}

#[tokio::test]
async fn a_wide_fan_out_is_acknowledged_before_its_deliveries_and_every_one_follows() {
    let Some(database) = testdb::fresh("a_wide_fan_out_is_acknowledged_before…").await else {
        return;
    };
    let store = node(&database).await;
    let mut changes = store.take_changes().expect("the commit feed");
    let (shop, endpoints) = app_with_endpoints(&store, WIDE).await;

    let Ingested::Created {
        message: wide,
        deliveries,
    } = store.ingest(message(&shop)).await.unwrap()
    else {
        panic!("a new message");
    };
    assert!(deliveries.is_empty(), "the delivery rows come after the answer");
    let (fed_to, seqs) = fed(&mut changes, &wide.id, WIDE).await;
    assert_eq!(fed_to, endpoints.iter().cloned().collect(), "every endpoint, once");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "fed in seq order");
    let (rows, pending) = stored(&database.url, wide.id.as_str()).await;
    assert_eq!(rows, texts(&endpoints));
    assert_eq!(pending, 0, "the endpoint list went with the expansion");

    // A narrow message after it is written whole, after it: its one delivery's seq is higher.
    let (narrow, only) = app_with_endpoints(&store, 1).await;
    let Ingested::Created { deliveries, .. } = store.ingest(message(&narrow)).await.unwrap() else {
        panic!("a new message");
    };
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].endpoint_id, only[0]);
    assert!(deliveries[0].seq > *seqs.last().expect("seqs"));
}

#[tokio::test]
async fn a_wide_message_with_an_ordering_key_is_written_whole() {
    let Some(database) = testdb::fresh("a_wide_message_with_an_ordering_key…").await else {
        return;
    };
    let store = node(&database).await;
    let (shop, endpoints) = app_with_endpoints(&store, WIDE).await;
    let mut keyed = message(&shop);
    keyed.ordering_key = Some("customer-7".into());
    let Ingested::Created {
        message: written,
        deliveries,
    } = store.ingest(keyed).await.unwrap()
    else {
        panic!("a new message");
    };
    // Split, a later message of the key could draw its seqs first and overtake it.
    assert_eq!(
        deliveries.len(),
        WIDE,
        "every delivery in the message's own transaction"
    );
    let (rows, pending) = stored(&database.url, written.id.as_str()).await;
    assert_eq!(rows, texts(&endpoints));
    assert_eq!(pending, 0);
}

/// A node that stopped between the two steps leaves the message and its endpoint list; the next writer
/// to start takes it up: every endpoint gets its delivery but the one deleted meanwhile. The list of a
/// message whose application is deleted goes with it.
#[tokio::test]
async fn a_fan_out_left_pending_by_a_stopped_node_is_taken_up_by_the_next() {
    let Some(database) = testdb::fresh("a_fan_out_left_pending_by_a_stopped…").await else {
        return;
    };
    let (shop, endpoints, gone_app, its_endpoints) = {
        let first = node(&database).await;
        let (shop, endpoints) = app_with_endpoints(&first, WIDE).await;
        let (gone_app, its_endpoints) = app_with_endpoints(&first, 2).await;
        first.delete_endpoint(&endpoints[0]).await.unwrap();
        (shop, endpoints, gone_app, its_endpoints)
    };
    // What the stopped node's batch had committed: two messages and their endpoint lists.
    let mut conn = PgConnection::connect(&database.url).await.unwrap();
    let left = left_pending(&mut conn, &shop, &endpoints).await;
    let of_gone_app = left_pending(&mut conn, &gone_app, &its_endpoints).await;
    let next = node(&database).await;
    next.delete_app(&gone_app).await.unwrap();

    wait_until("the pending fan-out is expanded", Duration::from_secs(10), async || {
        stored(&database.url, left.as_str()).await.1 == 0
    })
    .await;
    let (rows, _) = stored(&database.url, left.as_str()).await;
    assert_eq!(rows, texts(&endpoints[1..]), "all but the endpoint deleted meanwhile");
    let (rows, _) = stored(&database.url, of_gone_app.as_str()).await;
    assert!(rows.is_empty(), "nothing for a deleted application's message");
}

/// A chunk whose application's row another transaction holds (an endpoint write, an application's delete)
/// waits — its deliveries are not written behind the writer's ingest lock while the row is held — and
/// follows once the row is free, every endpoint once.
#[tokio::test]
async fn a_pending_fan_out_waits_while_its_application_is_held_and_follows_once_it_is_free() {
    let Some(database) = testdb::fresh("a_pending_fan_out_waits_while_its_app…").await else {
        return;
    };
    let (shop, endpoints, other) = {
        let first = node(&database).await;
        let (shop, endpoints) = app_with_endpoints(&first, WIDE).await;
        (shop, endpoints, app_with_endpoints(&first, 1).await.0)
    };
    let mut conn = PgConnection::connect(&database.url).await.unwrap();
    let left = left_pending(&mut conn, &shop, &endpoints).await;
    let mut holder = PgConnection::connect(&database.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT id FROM application WHERE id = $1 FOR UPDATE")
        .bind(shop.as_str())
        .fetch_one(&mut holder)
        .await
        .unwrap();

    let next = node(&database).await;
    let mut changes = next.take_changes().expect("the commit feed");
    // The next node sweeps the rows at its start and tries them every 10 ms while the row is held.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rows, pending) = stored(&database.url, left.as_str()).await;
    assert!(rows.is_empty(), "no delivery while the application's row is held");
    assert_eq!(pending, 2, "both chunks still pending");
    // The writer is not stuck behind the held row: another application's message goes through.
    let answer = tokio::time::timeout(Duration::from_secs(2), next.ingest(message(&other)))
        .await
        .expect("another application's message is answered while the row is held");
    let Ok(Ingested::Created { deliveries, .. }) = answer else {
        panic!("another application's message is stored: {answer:?}");
    };
    assert_eq!(deliveries.len(), 1);

    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    let (fed_to, _) = fed(&mut changes, &left, WIDE).await;
    assert_eq!(fed_to, endpoints.iter().cloned().collect(), "every endpoint, once");
    let (rows, pending) = stored(&database.url, left.as_str()).await;
    assert_eq!(rows, texts(&endpoints));
    assert_eq!(pending, 0);
}

/// A chunk the database refuses (here a trigger raising for one message's deliveries) is given up without
/// holding back anyone else's: the other message's deliveries are written, the refused list stays pending,
/// and the next sweep — here a node starting once the cause is gone — writes it, each endpoint once.
#[tokio::test]
async fn a_refused_chunk_is_left_pending_for_a_later_sweep_and_holds_back_no_other() {
    let Some(database) = testdb::fresh("a_refused_chunk_is_left_pending…").await else {
        return;
    };
    let (shop, endpoints) = {
        let first = node(&database).await;
        app_with_endpoints(&first, WIDE).await
    };
    let mut conn = PgConnection::connect(&database.url).await.unwrap();
    let refused = left_pending(&mut conn, &shop, &endpoints).await;
    let written = left_pending(&mut conn, &shop, &endpoints).await;
    let refuse = format!(
        "CREATE FUNCTION refuse_for_the_test() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         IF NEW.message_id = '{refused}' THEN RAISE EXCEPTION 'refused for the test'; END IF; RETURN NEW; END $$"
    );
    sqlx::query(AssertSqlSafe(refuse)).execute(&mut conn).await.unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse_for_the_test BEFORE INSERT ON delivery FOR EACH ROW \
         EXECUTE FUNCTION refuse_for_the_test()",
    )
    .execute(&mut conn)
    .await
    .unwrap();

    let next = node(&database).await;
    wait_until("the other message is expanded", Duration::from_secs(10), async || {
        stored(&database.url, written.as_str()).await.0 == texts(&endpoints)
    })
    .await;
    // Its chunks were tried (the sweep at the start takes both messages' rows) and given up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rows, pending) = stored(&database.url, refused.as_str()).await;
    assert!(rows.is_empty(), "none of the refused message's deliveries");
    assert_eq!(pending, 2, "its list stays, for the next sweep");

    sqlx::query("DROP TRIGGER refuse_for_the_test ON delivery")
        .execute(&mut conn)
        .await
        .unwrap();
    let another = node(&database).await;
    wait_until("the refused list is swept up", Duration::from_secs(10), async || {
        stored(&database.url, refused.as_str()).await.1 == 0
    })
    .await;
    let (rows, _) = stored(&database.url, refused.as_str()).await;
    assert_eq!(rows, texts(&endpoints), "every endpoint, once");
    drop((next, another));
}
