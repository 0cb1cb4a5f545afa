//! Herald reading its own PostgreSQL outbox (`herald_publish`), at the store level: a reading session
//! given up (here: a batch failing as a whole) hands the reader lock back, so the next session reads on.
//! Skipped with a visible message when PostgreSQL is unreachable (fatal with `HERALD_REQUIRE_POSTGRES=1`).

use std::time::Duration;

use herald_store::postgres::PgStore;
use herald_store::{Store, StoreOptions, testdb};
use sqlx::{Connection, PgConnection};

use crate::leases::{app, wait_until};

/// Outbox rows not yet turned into messages (nor refused).
async fn waiting(url: &str) -> i64 {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar("SELECT COUNT(*) FROM herald_outbox WHERE error IS NULL")
        .fetch_one(&mut conn)
        .await
        .expect("count the outbox")
}

/// Herald's own backends waiting for a lock right now (also for the other PostgreSQL modules of this
/// binary).
pub(crate) async fn lock_waiters(url: &str) -> i64 {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = 'herald' AND wait_event_type = 'Lock'",
    )
    .fetch_one(&mut conn)
    .await
    .expect("pg_stat_activity")
}

/// Once every outbox row is read (made a message or refused): the rows kept, each with its event id and
/// error, and the event ids of the messages, both in order.
async fn once_read(url: &str) -> (Vec<(String, String)>, Vec<String>) {
    wait_until("every row is read", Duration::from_secs(60), async || {
        waiting(url).await == 0
    })
    .await;
    let mut conn = PgConnection::connect(url).await.expect("connect");
    let kept = sqlx::query_as("SELECT event_id, error FROM herald_outbox ORDER BY seq")
        .fetch_all(&mut conn)
        .await
        .expect("the rows kept");
    let messages = sqlx::query_scalar("SELECT event_id FROM message ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .expect("the messages");
    (kept, messages)
}

#[tokio::test]
async fn a_failed_outbox_batch_hands_the_reader_lock_back_and_the_rows_are_read_again() {
    let Some(database) = testdb::fresh("a_failed_outbox_batch_hands_the_reader_lock_back").await else {
        return;
    };
    let store = PgStore::open(&database.url, testdb::test_cipher(), &StoreOptions::default())
        .await
        .expect("open");
    let app = app();
    store.create_app(&app).await.expect("app");

    // The message table locked away: the batch of the row published below waits for it until the
    // server's lock_timeout, and fails as a whole; the reader gives its session up.
    let mut locker = PgConnection::connect(&database.url).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut locker).await.expect("begin");
    sqlx::query("LOCK TABLE message IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .expect("lock");
    let mut producer = PgConnection::connect(&database.url).await.expect("connect");
    sqlx::query("SELECT herald_publish($1, 'invoice.paid', '{\"n\": 1}', 'evt_1')")
        .bind(app.id.as_str())
        .execute(&mut producer)
        .await
        .expect("herald_publish");
    let generous = Duration::from_secs(60);
    wait_until("the outbox batch waits for the message table", generous, async || {
        lock_waiters(&database.url).await > 0
    })
    .await;
    wait_until(
        "the outbox batch gives up on the lock (lock_timeout)",
        generous,
        async || lock_waiters(&database.url).await == 0,
    )
    .await;
    assert_eq!(
        waiting(&database.url).await,
        1,
        "the failed batch left its row in the outbox"
    );
    sqlx::query("COMMIT").execute(&mut locker).await.expect("unlock");

    // The reader's next session must get the lock back and read the row again (the failed session's
    // lock must not stay with a pooled connection, where nobody reads under it).
    wait_until("the row is read again and becomes a message", generous, async || {
        waiting(&database.url).await == 0
    })
    .await;
    let messages: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM message WHERE event_id = 'evt_1'")
        .fetch_one(&mut producer)
        .await
        .expect("count messages");
    assert_eq!(messages, 1, "the row became exactly one message");
}

#[tokio::test]
async fn an_outbox_row_naming_no_application_id_is_refused_and_the_rows_around_it_are_read() {
    let Some(database) = testdb::fresh("an_outbox_row_naming_no_application_id_is_refused").await else {
        return;
    };
    let store = PgStore::open(&database.url, testdb::test_cipher(), &StoreOptions::default())
        .await
        .expect("open");
    let app = app();
    store.create_app(&app).await.expect("app");
    // Written past `herald_publish` (which resolves uids to ids): the middle row names a uid-like text.
    let mut producer = PgConnection::connect(&database.url).await.expect("connect");
    for (app_id, event_id) in [
        (app.id.as_str(), "evt_1"),
        ("shop", "evt_2"),
        (app.id.as_str(), "evt_3"),
    ] {
        sqlx::query("INSERT INTO herald_outbox (app_id, event_type, payload, event_id) VALUES ($1, 'a.b', '{}', $2)")
            .bind(app_id)
            .bind(event_id)
            .execute(&mut producer)
            .await
            .expect("insert an outbox row");
    }
    let (refused, messages) = once_read(&database.url).await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, "evt_2");
    assert!(
        refused[0].1.contains("\"shop\"") && refused[0].1.contains("app_"),
        "{refused:?}"
    );
    assert_eq!(messages, ["evt_1", "evt_3"]);
}

/// While the reader polls on its own (marked awake in `herald_outbox_reader`), a producer's commit does
/// not notify it: notifying commits go one WAL flush at a time under PostgreSQL's notification lock.
/// Otherwise every commit does, so a quiet reader wakes at once.
#[tokio::test]
async fn a_producers_commit_notifies_the_reader_only_while_it_is_not_awake() {
    let Some(database) = testdb::fresh("a_producers_commit_notifies_only_while_not_awake").await else {
        return;
    };
    // The schema only: no reader runs, so only this test marks it awake.
    herald_store::migrate(&database.url).await.expect("migrate");
    let mut listener = sqlx::postgres::PgListener::connect(&database.url)
        .await
        .expect("listener");
    listener.listen("herald_outbox").await.expect("listen");
    let mut producer = PgConnection::connect(&database.url).await.expect("connect");
    // A producer whose search_path does not name Herald's schema: the trigger still finds its table.
    sqlx::query("SET search_path = pg_catalog")
        .execute(&mut producer)
        .await
        .expect("search_path");
    let mut commit = async |n: i32| {
        sqlx::query(
            "INSERT INTO public.herald_outbox (app_id, event_type, payload, event_id) \
             VALUES ('app_x', 'invoice.paid', '{}', 'evt_' || $1)",
        )
        .bind(n)
        .execute(&mut producer)
        .await
        .expect("insert");
    };
    let mut notified = async |within: Duration| tokio::time::timeout(within, listener.recv()).await.is_ok();
    // Marked awake for `seconds` from now (negative: its mark has passed).
    let awake = |seconds: f64| {
        let url = database.url.clone();
        async move {
            let mut conn = PgConnection::connect(&url).await.expect("connect");
            sqlx::query("UPDATE herald_outbox_reader SET awake_until = clock_timestamp() + make_interval(secs => $1)")
                .bind(seconds)
                .execute(&mut conn)
                .await
                .expect("mark");
        }
    };

    commit(1).await;
    assert!(notified(Duration::from_secs(10)).await, "a quiet reader is notified");
    awake(3600.0).await;
    commit(2).await;
    assert!(!notified(Duration::from_millis(500)).await, "an awake reader is not");
    awake(-1.0).await;
    commit(3).await;
    assert!(
        notified(Duration::from_secs(10)).await,
        "notified again once its mark has passed"
    );
}

/// A payload of `bytes` bytes as `herald_outbox` keeps it (`payload::text`): `{"t": "xx…"}`.
fn payload_of(bytes: usize) -> String {
    let padding = bytes.checked_sub(9).expect("at least 9 bytes");
    format!("{{\"t\": \"{}\"}}", "x".repeat(padding))
}

/// A node with a `max_payload_bytes` of 64 on a fresh database, an app, and a producer's connection.
struct Limited {
    database: testdb::TestDatabase,
    store: PgStore,
    app: herald_core::model::Application,
    producer: PgConnection,
}

/// [`Limited`] for the test `name`; `None` when no PostgreSQL is at hand.
async fn limited(name: &str) -> Option<Limited> {
    let database = testdb::fresh(name).await?;
    let options = StoreOptions {
        max_payload_bytes: Some(64),
        ..StoreOptions::default()
    };
    let store = PgStore::open(&database.url, testdb::test_cipher(), &options)
        .await
        .expect("open");
    let app = app();
    store.create_app(&app).await.expect("app");
    let producer = PgConnection::connect(&database.url).await.expect("connect");
    Some(Limited {
        database,
        store,
        app,
        producer,
    })
}

/// Herald's `max_payload_bytes` holds for its outbox as for the API: `herald_publish` refuses a larger
/// payload in the producer's own transaction (SQLSTATE `54000`), and a row that got in under a larger limit
/// (another node's, or one written before this node started) is refused by this node's reader with the
/// reason in `error`: never published, never read again, and the rows after it flow on.
#[tokio::test]
async fn an_outbox_payload_over_max_payload_bytes_is_refused_in_the_producers_transaction_and_by_the_reader() {
    let Some(Limited {
        database,
        store: _store,
        app,
        mut producer,
    }) = limited("an_outbox_payload_over_max_payload_bytes_is_refused").await
    else {
        return;
    };
    let publish = async |producer: &mut PgConnection, payload: &str, event_id: &str| {
        sqlx::query("SELECT herald_publish($1, 'a.b', $2::jsonb, $3)")
            .bind(app.id.as_str())
            .bind(payload)
            .bind(event_id)
            .execute(producer)
            .await
    };

    let refused = publish(&mut producer, &payload_of(65), "evt_over")
        .await
        .expect_err("a payload over the limit is refused in the producer's transaction");
    let refused = refused.as_database_error().expect("a database error");
    assert_eq!(refused.code().as_deref(), Some("54000"), "{refused}");
    assert!(
        refused.message().contains("65 bytes") && refused.message().contains("max_payload_bytes (64)"),
        "{refused}"
    );
    publish(&mut producer, &payload_of(64), "evt_at")
        .await
        .expect("a payload at the limit is taken");

    // Another node, with a larger limit, started last: the function takes the row, this node's reader does not.
    sqlx::query("UPDATE herald_outbox_limit SET max_payload_bytes = 1000")
        .execute(&mut producer)
        .await
        .expect("another node's limit");
    publish(&mut producer, &payload_of(200), "evt_big")
        .await
        .expect("under the other node's limit");
    publish(&mut producer, &payload_of(10), "evt_after")
        .await
        .expect("a small row after it");
    let (refused, messages) = once_read(&database.url).await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, "evt_big");
    assert!(
        refused[0].1.contains("200 bytes") && refused[0].1.contains("max_payload_bytes (64)"),
        "{refused:?}"
    );
    assert_eq!(messages, ["evt_at", "evt_after"]);
}

/// A producer's role that may create functions where Herald's live cannot make the payload check call its
/// own code: every call passes exactly `(bigint, bigint)`, so an overload with other argument types (here
/// `integer` for the size, which `octet_length` returns) is never chosen, in the trigger or the reader.
#[tokio::test]
async fn a_producers_overload_of_the_payload_rule_is_never_called() {
    // The database and the node stay up until the test ends.
    let Some(Limited {
        database: _database,
        store: _store,
        app,
        mut producer,
    }) = limited("a_producers_overload_of_the_payload_rule").await
    else {
        return;
    };
    sqlx::query(
        "CREATE FUNCTION herald_outbox_payload_refusal(bytes INTEGER, max_payload_bytes BIGINT) RETURNS TEXT \
         LANGUAGE sql AS $$ SELECT NULL::text $$",
    )
    .execute(&mut producer)
    .await
    .expect("the producer's overload");
    let refused = sqlx::query("SELECT herald_publish($1, 'a.b', $2::jsonb, 'evt_over')")
        .bind(app.id.as_str())
        .bind(payload_of(65))
        .execute(&mut producer)
        .await
        .expect_err("the payload over the limit is still refused");
    let refused = refused.as_database_error().expect("a database error");
    assert_eq!(refused.code().as_deref(), Some("54000"), "{refused}");
}
