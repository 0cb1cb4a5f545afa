//! Scheduled delivery (`deliverAt`): a message is in custody at once (202, its fan-out committed) and
//! none of its deliveries is attempted before the time it names — with a real receiver on loopback and
//! the real clock, across `kill -9` and a restart, on SQLite and PostgreSQL, and with several nodes
//! sharing PostgreSQL. Past that time its deliveries flow as any other: retries included.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::{Herald, Receiver, Reply};
use herald_store::testdb;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Fast retries, so a refused first attempt is retried within the test.
fn schedule() -> String {
    vec!["300ms"; 40].join(",")
}

/// A `deliverAt` `ahead` from now, and the wall-clock time it names. Arrivals are compared with it by
/// the wall clock too: Herald keeps the promise in wall time, and the monotonic clock may run apart from
/// it while the system clock is slewed or stepped.
fn deliver_at(ahead: Duration) -> (String, SystemTime) {
    let at = OffsetDateTime::from(SystemTime::now() + ahead);
    // Milliseconds, rounded up: the server keeps milliseconds, so it must not round the time down.
    let at = at.replace_millisecond(at.millisecond()).expect("millisecond") + time::Duration::milliseconds(1);
    (at.format(&Rfc3339).expect("format"), SystemTime::from(at))
}

/// Publish one message; its id and the answer.
async fn publish(herald: &Herald, app: &str, body: Value) -> (String, Value) {
    let (status, answer) = herald.call("POST", &format!("/app/{app}/msg"), Some(body)).await;
    assert_eq!(status, 202, "{answer}");
    (answer["id"].as_str().expect("id").to_owned(), answer)
}

/// An application with one endpoint on a new receiver, and one message scheduled `ahead`: the receiver,
/// the application, the message, its `deliverAt` and the wall-clock time it names.
async fn one_scheduled(herald: &Herald, ahead: Duration) -> (Receiver, String, String, String, SystemTime) {
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("scheduled").await;
    herald.endpoint(&app, json!({ "url": receiver.url() })).await;
    let (at, due) = deliver_at(ahead);
    let (scheduled, _) = publish(
        herald,
        &app,
        json!({"eventType": "a.b", "payload": {}, "deliverAt": at}),
    )
    .await;
    (receiver, app, scheduled, at, due)
}

/// When the receiver first got the message (by the wall clock), if it did.
fn first_arrival(receiver: &Receiver, msg: &str) -> Option<SystemTime> {
    receiver
        .received()
        .iter()
        .filter(|r| r.header("webhook-id") == msg)
        .map(|r| r.wall)
        .min()
}

/// Wait until every message in `ids` reached the receiver (with a 2xx).
async fn wait_delivered(receiver: &Receiver, ids: &[&str], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let counts = receiver.per_message();
        if ids.iter().all(|id| counts.get(*id).is_some_and(|(_, ok)| *ok > 0)) {
            return;
        }
        assert!(Instant::now() < deadline, "not all of {ids:?} delivered: {counts:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_scheduled_message_is_not_delivered_before_its_time_and_others_are_not_held_back() {
    let schedule = schedule();
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", schedule.as_str())]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("scheduled").await;
    herald.endpoint(&app, json!({ "url": receiver.url() })).await;

    let (at, due) = deliver_at(Duration::from_secs(3));
    let (scheduled, answer) = publish(
        &herald,
        &app,
        json!({"eventType": "invoice.due", "payload": {"n": 1}, "deliverAt": at}),
    )
    .await;
    assert_eq!(answer["deliverAt"], json!(at), "deliverAt is echoed: {answer}");
    // Nothing scheduled holds back a message for now, nor one whose time has already passed.
    let (now, _) = publish(&herald, &app, json!({"eventType": "invoice.paid", "payload": {"n": 2}})).await;
    let (past, _) = publish(
        &herald,
        &app,
        json!({"eventType": "invoice.paid", "payload": {"n": 3}, "deliverAt": "2020-01-01T00:00:00Z"}),
    )
    .await;
    wait_delivered(&receiver, &[&now, &past], Duration::from_secs(10)).await;
    assert_eq!(
        first_arrival(&receiver, &scheduled),
        None,
        "delivered before its deliverAt"
    );
    // Meanwhile it is in custody, listed, and its delivery pending until then.
    let read = herald.get(&format!("/app/{app}/msg/{scheduled}")).await;
    assert_eq!(read["deliverAt"], json!(at));
    let deliveries = herald.get(&format!("/app/{app}/msg/{scheduled}/endpoint")).await;
    assert_eq!(deliveries["data"][0]["deliveryStatus"], "pending", "{deliveries}");
    assert_eq!(deliveries["data"][0]["nextAttempt"], json!(at), "{deliveries}");

    wait_delivered(&receiver, &[&scheduled], Duration::from_secs(15)).await;
    let arrived = first_arrival(&receiver, &scheduled).expect("delivered");
    assert!(
        arrived >= due,
        "delivered {:?} before its deliverAt",
        due.duration_since(arrived)
    );
}

#[tokio::test]
async fn a_scheduled_delivery_that_fails_is_retried_as_any_other() {
    let schedule = schedule();
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", schedule.as_str())]).await;
    let (receiver, app, scheduled, _, due) = one_scheduled(&herald, Duration::from_secs(2)).await;
    // The first request of each message is refused (a 503): the scheduled one is retried after it.
    receiver.first_of_each(Reply::status(503));
    let attempts = herald
        .wait_attempts(&app, &scheduled, Duration::from_secs(15), |a| {
            a.iter().any(|x| x["status"] == 0)
        })
        .await;
    assert!(attempts.len() >= 2, "refused, then retried: {attempts:#?}");
    assert_eq!(attempts[0]["responseStatusCode"], 503);
    assert!(first_arrival(&receiver, &scheduled).expect("attempted") >= due);
}

#[tokio::test]
async fn a_scheduled_message_survives_kill_9_and_is_delivered_at_its_time_after_restart() {
    let schedule = schedule();
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", schedule.as_str())]).await;
    survives_kill_9(herald).await;
}

#[tokio::test]
async fn a_scheduled_message_survives_kill_9_on_postgres() {
    let schedule = schedule();
    let test = "a_scheduled_message_survives_kill_9_on_postgres";
    let Some(herald) = Herald::start_pg(test, &[("HERALD_RETRY_SCHEDULE", schedule.as_str())]).await else {
        return;
    };
    survives_kill_9(herald).await;
}

async fn survives_kill_9(mut herald: Herald) {
    let (receiver, app, scheduled, at, due) = one_scheduled(&herald, Duration::from_secs(4)).await;
    // Killed with the delivery waiting on its timer: only the store knows of it now.
    herald.kill9();
    herald.restart().await;
    // On PostgreSQL the restarted node waits out the killed node's leases (10 s) first.
    wait_delivered(&receiver, &[&scheduled], Duration::from_secs(40)).await;
    let arrived = first_arrival(&receiver, &scheduled).expect("delivered");
    assert!(
        arrived >= due,
        "delivered {:?} before its deliverAt",
        due.duration_since(arrived)
    );
    let read = herald.get(&format!("/app/{app}/msg/{scheduled}")).await;
    assert_eq!(read["deliverAt"], json!(at), "kept across the restart");
}

/// Two nodes on one PostgreSQL: messages published through either node, to endpoints whose partitions
/// are spread over both, are delivered by each endpoint's owner at their time; then one node is killed
/// with scheduled deliveries still waiting, and the other takes them over and delivers them at theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_deliveries_are_kept_by_the_owner_of_each_endpoint_across_nodes() {
    const ENDPOINTS: usize = 10;
    let test = "scheduled_deliveries_are_kept_by_the_owner_of_each_endpoint_across_nodes";
    let Some(database) = testdb::fresh(test).await else {
        return;
    };
    let database = Arc::new(database);
    let schedule = schedule();
    let env = [("HERALD_RETRY_SCHEDULE", schedule.as_str()), ("HERALD_LEASE_TTL", "3s")];
    let first = Herald::start_on(database.clone(), &env).await;
    let mut second = Herald::start_on(database.clone(), &env).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = first.app("scheduled-cluster").await;
    for _ in 0..ENDPOINTS {
        first.endpoint(&app, json!({ "url": receiver.url() })).await;
    }
    // Wait until both nodes own partitions (the second joined after the first took them all).
    let deadline = Instant::now() + Duration::from_secs(30);
    while owners(&database.url).await < 2 {
        assert!(Instant::now() < deadline, "the second node never took partitions over");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (soon_at, soon_due) = deliver_at(Duration::from_secs(3));
    let (soon, _) = publish(
        &second,
        &app,
        json!({"eventType": "a.b", "payload": {}, "deliverAt": soon_at}),
    )
    .await;
    let (late_at, late_due) = deliver_at(Duration::from_secs(8));
    let (late, _) = publish(
        &first,
        &app,
        json!({"eventType": "a.b", "payload": {}, "deliverAt": late_at}),
    )
    .await;

    let deadline = Instant::now() + Duration::from_secs(20);
    while receiver.per_message().get(&soon).is_none_or(|(_, ok)| *ok < ENDPOINTS) {
        assert!(Instant::now() < deadline, "{:?}", receiver.per_message());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The second node dies with the later message still waiting for its time.
    second.kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.per_message().get(&late).is_none_or(|(_, ok)| *ok < ENDPOINTS) {
        assert!(Instant::now() < deadline, "{:?}", receiver.per_message());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (msg, due) in [(&soon, soon_due), (&late, late_due)] {
        let arrivals: Vec<SystemTime> = receiver
            .received()
            .iter()
            .filter(|r| r.header("webhook-id") == msg.as_str())
            .map(|r| r.wall)
            .collect();
        assert!(arrivals.len() >= ENDPOINTS, "{msg}: {} arrivals", arrivals.len());
        let first = arrivals.iter().min().expect("arrivals");
        assert!(
            *first >= due,
            "{msg} delivered {:?} before its deliverAt",
            due.duration_since(*first)
        );
    }
}

/// How many nodes hold unexpired partition leases.
async fn owners(url: &str) -> i64 {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar(
        "SELECT COUNT(DISTINCT owner) FROM partition_lease WHERE owner IS NOT NULL AND expires_at > now()",
    )
    .fetch_one(&mut conn)
    .await
    .expect("leases")
}
