//! Ingest on PostgreSQL never waits for an application's row that another transaction holds — an endpoint
//! write, or `delete_app` deleting the application and everything of it: a batch holds the cluster-wide
//! ingest lock, so a batch waiting for one tenant's row would hold every node's ingest, every tenant's,
//! for as long (and fail them all at the lock timeout). The held application's messages are deferred —
//! written once the row is free, or answered not found if it went — and the others go through. Skipped
//! with a visible message when PostgreSQL is unreachable (fatal with `HERALD_REQUIRE_POSTGRES=1`).

use std::sync::Arc;
use std::time::Duration;

use herald_core::id::{AppId, MessageId};
use herald_core::model::Message;
use herald_store::postgres::{INGEST_LOCK, PgStore};
use herald_store::{Ingested, Store, StoreError, StoreResult, testdb};
use sqlx::{Connection, PgConnection};
use tokio::task::JoinHandle;

use crate::fan_out::{node, run};
use crate::leases::{app, endpoint, message, wait_until};
use crate::outbox::lock_waiters;

/// Well under the store's lock timeout (5 s): a message acknowledged within it did not wait for a lock.
const PROMPT: Duration = Duration::from_secs(2);

/// How long a deferred message is watched for not being acknowledged while its application is held.
const WHILE_HELD: Duration = Duration::from_millis(500);

/// A transaction begun on a connection of its own, left open.
async fn begun(url: &str) -> PgConnection {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    run(&mut conn, "BEGIN").await.expect("begin");
    conn
}

/// One message to `app_id`, ingested in the background.
fn ingesting(store: &Arc<PgStore>, app_id: &AppId) -> JoinHandle<StoreResult<Ingested>> {
    let (store, app_id) = (store.clone(), app_id.clone());
    tokio::spawn(async move { store.ingest(message(&app_id)).await })
}

/// The answer of `ingest`, which must come within [`PROMPT`] (`what`: whose).
async fn promptly(ingest: JoinHandle<StoreResult<Ingested>>, what: &str) -> StoreResult<Ingested> {
    tokio::time::timeout(PROMPT, ingest)
        .await
        .unwrap_or_else(|_| panic!("{what} was not answered within {PROMPT:?}"))
        .expect("joined")
}

/// The message `answer` created (`what`: whose).
fn created(answer: StoreResult<Ingested>, what: &str) -> Message {
    match answer {
        Ok(Ingested::Created { message, .. }) => Message::clone(&message),
        other => panic!("{what} was not created: {other:?}"),
    }
}

/// `ingest` (`what`: whose message) must still be unanswered after [`WHILE_HELD`].
async fn still_waiting(ingest: &JoinHandle<StoreResult<Ingested>>, what: &str) {
    tokio::time::sleep(WHILE_HELD).await;
    assert!(
        !ingest.is_finished(),
        "{what} is not answered while its application's row is held"
    );
}

/// What each test starts from: a store with two applications, one of whose rows a transaction holds as
/// `delete_app` holds it (`FOR UPDATE`).
struct Held {
    database: testdb::TestDatabase,
    store: Arc<PgStore>,
    /// The application whose row is held.
    held: AppId,
    /// Another application, free.
    other: AppId,
    /// The transaction holding `held`'s row, left open.
    holder: PgConnection,
}

impl Held {
    /// A message to the held application, ingested in the background; once it is at the writer (which,
    /// were it to wait for the row, would hold every message behind it).
    async fn message_to_the_held_app(&self) -> JoinHandle<StoreResult<Ingested>> {
        let waiting = ingesting(&self.store, &self.held);
        tokio::time::sleep(Duration::from_millis(300)).await;
        waiting
    }

    /// A message to the held application, then one to the other: the other's is acknowledged at once,
    /// the held one's still waits; the waiting one.
    async fn the_other_app_goes_first(&self) -> JoinHandle<StoreResult<Ingested>> {
        let waiting = self.message_to_the_held_app().await;
        created(
            promptly(ingesting(&self.store, &self.other), "the other application's message").await,
            "the other application's message",
        );
        still_waiting(&waiting, "the held application's message").await;
        waiting
    }

    /// The holder runs `statement` (on the held application: `{app}` in it stands for its id), then
    /// commits, letting the row go.
    async fn commit_after(&mut self, statement: &str) {
        let statement = statement.replace("{app}", self.held.as_str());
        run(&mut self.holder, &statement).await.expect("the holder's statement");
        run(&mut self.holder, "COMMIT").await.expect("commit");
    }
}

/// [`Held`] on a fresh database named for the test (`None`: PostgreSQL is unreachable, the test skips).
async fn held_app(name: &str) -> Option<Held> {
    held_app_after(name, false).await
}

/// [`held_app`]; `remembered`: each application has a message stored before its row is held, so the
/// writer remembers both rows, and its next batches check them in their one statement instead of reading
/// them (`postgres::remembered`).
async fn held_app_after(name: &str, remembered: bool) -> Option<Held> {
    let database = testdb::fresh(name).await?;
    let store = Arc::new(node(&database).await);
    let (held, other) = (app(), app());
    for each in [&held, &other] {
        store.create_app(each).await.expect("create the app");
        if remembered {
            created(store.ingest(message(&each.id)).await, "a first message");
        }
    }
    let mut holder = begun(&database.url).await;
    let lock = format!("SELECT id FROM application WHERE id = '{}' FOR UPDATE", held.id);
    run(&mut holder, &lock).await.expect("lock the application's row");
    Some(Held {
        database,
        store,
        held: held.id,
        other: other.id,
        holder,
    })
}

/// While one application's row is held, another's message is acknowledged at once; the held one's waits,
/// and is stored once the holder commits a harmless change.
#[tokio::test]
async fn a_held_application_row_holds_only_its_own_messages() {
    if let Some(t) = held_app("a_held_application_row_holds_only_its…").await {
        holds_only_its_own_messages(t).await;
    }
}

/// As above, with both rows remembered by the writer: the batch that checks the held row instead of
/// reading it finds it held and fails, writing nothing, rather than wait for it with the ingest lock
/// taken (which would hold the other application's message too); the batch written again reads the rows,
/// skipping the held one, and defers its message as before.
#[tokio::test]
async fn a_held_row_the_writer_remembers_holds_only_its_own_messages() {
    if let Some(t) = held_app_after("a_held_row_the_writer_remembers…", true).await {
        holds_only_its_own_messages(t).await;
    }
}

/// The other application's message goes first; the held one's is stored once the holder lets go.
async fn holds_only_its_own_messages(mut t: Held) {
    let waiting = t.the_other_app_goes_first().await;
    t.commit_after("UPDATE application SET name = name WHERE id = '{app}'")
        .await;
    let message = created(promptly(waiting, "the held application's message").await, "it");
    t.store
        .get_message(&t.held, &(&message.id).into())
        .await
        .expect("the deferred message is stored");
}

/// A message to an application that is deleted while its row is held (as `delete_app` holds it) waits,
/// and is answered not found once the delete commits — what a batch answers for an application that is
/// not there; meanwhile another application's message goes through.
#[tokio::test]
async fn a_message_to_an_application_deleted_while_held_is_not_found() {
    let Some(mut t) = held_app("a_message_to_an_application_deleted…").await else {
        return;
    };

    let waiting = t.the_other_app_goes_first().await;
    t.commit_after("DELETE FROM application WHERE id = '{app}'").await;
    let answer = promptly(waiting, "the deleted application's message").await;
    assert!(matches!(answer, Err(StoreError::NotFound)), "{answer:?}");
}

/// One batch with messages to both applications (the writer held at its `BEGIN` by the ingest lock until
/// both are queued): the other application's message is written and acknowledged, the held one's waits
/// for the row, then is stored.
#[tokio::test]
async fn a_batch_writes_the_free_applications_messages_and_defers_the_held_ones() {
    let Some(mut t) = held_app("a_batch_writes_the_free_applications…").await else {
        return;
    };

    // The writer takes a first message and waits at its BEGIN for the ingest lock; the next two queue
    // behind it and make the next batch together.
    let mut blocker = begun(&t.database.url).await;
    run(&mut blocker, &format!("SELECT pg_advisory_xact_lock({INGEST_LOCK})"))
        .await
        .expect("the ingest lock");
    let first = ingesting(&t.store, &t.other);
    wait_until("the writer waits for the ingest lock", PROMPT, async || {
        lock_waiters(&t.database.url).await > 0
    })
    .await;
    let deferred = ingesting(&t.store, &t.held);
    let free = ingesting(&t.store, &t.other);
    tokio::time::sleep(Duration::from_millis(200)).await;
    run(&mut blocker, "COMMIT").await.expect("commit");

    created(promptly(first, "the first message").await, "the first message");
    created(
        promptly(free, "the other application's message of the mixed batch").await,
        "the other application's message",
    );
    still_waiting(&deferred, "the held application's message of the mixed batch").await;
    t.commit_after("SELECT 1").await;
    created(promptly(deferred, "the held application's message").await, "it");
}

/// Outbox rows of a held application and of another, published together (one round, one fence): the
/// rows keep their order — the other application's row, behind the held one, is not written before it —
/// and none is lost or refused: both become messages, in order, once the row is free. Meanwhile an API
/// message to the other application is acknowledged at once.
#[tokio::test]
async fn outbox_rows_behind_a_held_application_keep_their_order_and_nothing_is_lost() {
    let Some(mut t) = held_app("outbox_rows_behind_a_held_application…").await else {
        return;
    };

    let mut producer = begun(&t.database.url).await;
    for (app_id, event_id) in [(&t.held, "evt_held"), (&t.other, "evt_other")] {
        let publish = format!("SELECT herald_publish('{app_id}', 'a.b', '{{}}', '{event_id}')");
        run(&mut producer, &publish).await.expect("herald_publish");
    }
    run(&mut producer, "COMMIT").await.expect("commit");
    // The reader has the rows at the writer by now: it reads at the commit's notification, or at its
    // poll (every second) should that be lost.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    created(
        promptly(ingesting(&t.store, &t.other), "the API message").await,
        "the API message",
    );
    tokio::time::sleep(WHILE_HELD).await;
    assert_eq!(
        outbox_messages(&t.database.url).await,
        Vec::<String>::new(),
        "neither row is a message while the first one's application is held"
    );
    t.commit_after("SELECT 1").await;
    wait_until("both rows are messages", Duration::from_secs(30), async || {
        outbox_messages(&t.database.url).await.len() == 2
    })
    .await;
    assert_eq!(
        outbox_messages(&t.database.url).await,
        vec!["evt_held".to_owned(), "evt_other".to_owned()],
        "in outbox order"
    );
    let mut conn = PgConnection::connect(&t.database.url).await.expect("connect");
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM herald_outbox")
        .fetch_one(&mut conn)
        .await
        .expect("count the outbox");
    assert_eq!(left, 0, "no row is left behind (none refused)");
}

/// The event ids of the messages that came from the outbox (those with an event id), in creation order.
async fn outbox_messages(url: &str) -> Vec<String> {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar("SELECT event_id FROM message WHERE event_id IS NOT NULL ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .expect("the messages")
}

/// A batch that would check remembered rows in its one statement, instead of reading them after its
/// `BEGIN`, never commits after another holder of the ingest lock with lower delivery `seq`s or message
/// ids: the holder here (standing for another node's batch) draws a `seq` and a message id while the
/// batch waits, and commits first — the batch's must be higher, as a reader's cursor (`seq > n`) and a
/// listing paged by id rely on. Drawn before the lock was held, the batch's would be the lower ones.
#[tokio::test]
async fn a_batch_of_remembered_rows_draws_its_seqs_and_ids_after_the_ingest_lock() {
    let Some(database) = testdb::fresh("a_batch_of_remembered_rows_draws…").await else {
        return;
    };
    let store = Arc::new(node(&database).await);
    let shop = app();
    store.create_app(&shop).await.expect("create the app");
    store.create_endpoint(&endpoint(&shop.id)).await.expect("an endpoint");
    created(store.ingest(message(&shop.id)).await, "a first message");

    let mut blocker = begun(&database.url).await;
    run(&mut blocker, &format!("SELECT pg_advisory_xact_lock({INGEST_LOCK})"))
        .await
        .expect("the ingest lock");
    let waiting = ingesting(&store, &shop.id);
    wait_until("the writer waits for the ingest lock", PROMPT, async || {
        lock_waiters(&database.url).await > 0
    })
    .await;
    let drawn: i64 = sqlx::query_scalar("SELECT nextval(pg_get_serial_sequence('delivery', 'seq'))")
        .fetch_one(&mut blocker)
        .await
        .expect("draw a seq");
    let earlier = MessageId::new();
    sqlx::query("INSERT INTO message (id, app_id, event_type, payload, created_at) VALUES ($1, $2, 'a.b', '{}', 0)")
        .bind(earlier.as_str())
        .bind(shop.id.as_str())
        .execute(&mut blocker)
        .await
        .expect("another node's message");
    run(&mut blocker, "COMMIT").await.expect("commit");

    let Ok(Ingested::Created { message, deliveries }) = promptly(waiting, "the message").await else {
        panic!("the message was not created");
    };
    assert_eq!(deliveries.len(), 1, "one endpoint, one delivery");
    assert!(
        deliveries[0].seq > drawn,
        "the batch drew seq {} before the lock's holder drew {drawn}",
        deliveries[0].seq
    );
    assert!(
        message.id.as_str() > earlier.as_str(),
        "the batch drew id {} before the lock's holder drew {earlier}",
        message.id
    );
}
