//! PostgreSQL refused, black-holed and slowed, through a TCP proxy of the test's own in front of the
//! shared server: requests that start during the fault are answered 503 within the configured bound
//! (`HERALD_DATABASE_TIMEOUT`, 1 s here and by default, plus slack for a loaded machine), nothing
//! acknowledged is lost, and everything resumes by itself — checked through the API, at the receiver
//! and after `kill -9` and a restart. `HERALD_FAULT_ROUNDS` sets the rounds (default 1 of each fault).
//!
//! And a connection cut at the commit point: right before the `COMMIT` reaches the server, or right
//! after the server committed but before its reply reaches Herald. Either way Herald cannot know that
//! the batch committed, so it must not acknowledge it; a producer retrying with the same `eventId` gets
//! the one stored message, never a second.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::faults::{self, Ledger};
use common::{CommitCut, Herald, ProxiedNode, ProxyMode, Receiver, TcpProxy};
use serde_json::{Value, json};

/// The node's `HERALD_DATABASE_TIMEOUT`.
const TIMEOUT: Duration = Duration::from_secs(1);
/// What a loaded CI machine may add to it before the answer is out.
const SLACK: Duration = Duration::from_millis(1_500);

/// How long a test waits for any answer before it fails saying so (far beyond every bound: a request
/// that takes this long hangs).
const HANG: Duration = Duration::from_secs(60);

/// One request, timed.
async fn timed(herald: &Herald, method: &str, path: &str, body: Option<Value>) -> (u16, Value, Duration) {
    let started = Instant::now();
    let (status, body) = tokio::time::timeout(HANG, herald.call(method, path, body))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within {HANG:?}"));
    (status, body, started.elapsed())
}

/// A fault the proxy injects.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Refused,
    BlackHoled,
    Slowed,
}

impl Fault {
    async fn start(self, proxy: &TcpProxy) {
        match self {
            Fault::Refused => proxy.cut(),
            Fault::BlackHoled => proxy.set_mode(ProxyMode::Hold),
            // Every chunk waits three times the bound: each round trip outlasts it.
            Fault::Slowed => proxy.set_mode(ProxyMode::Delay(TIMEOUT * 3)),
        }
    }

    async fn end(self, proxy: &TcpProxy) {
        match self {
            Fault::Refused => proxy.restore().await,
            Fault::BlackHoled | Fault::Slowed => proxy.set_mode(ProxyMode::Forward),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refused_black_holed_or_slowed_answers_503_in_bounded_time_and_loses_nothing() {
    let test = "postgres_refused_black_holed_or_slowed_answers_503_in_bounded_time_and_loses_nothing";
    let timeout = format!("{}ms", TIMEOUT.as_millis());
    let env = [("HERALD_DATABASE_TIMEOUT", timeout.as_str())];
    let Some(ProxiedNode {
        mut herald,
        proxy,
        receiver,
        app,
    }) = ProxiedNode::start(test, "database-faults", &env).await
    else {
        return;
    };
    let publish = |n: usize| {
        (
            format!("/app/{app}/msg"),
            json!({"eventType": "db.fault", "payload": {"n": n}}),
        )
    };

    let mut messages = Ledger::default();
    let mut slowest_503 = Duration::ZERO;
    let mut n = 0;
    for _ in 0..5 {
        let (path, body) = publish(n);
        n += 1;
        let (status, body, _) = timed(&herald, "POST", &path, Some(body)).await;
        messages.answer(202, status, &body);
    }
    assert_eq!(messages.acknowledged.len(), 5, "{:?}", messages.violations);

    // A mildly slow database is only slower: writes still succeed.
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(20)));
    let (path, body) = publish(n);
    n += 1;
    let (status, body, _) = timed(&herald, "POST", &path, Some(body)).await;
    assert_eq!(status, 202, "{body}");
    messages.answer(202, status, &body);
    proxy.set_mode(ProxyMode::Forward);

    let rounds = faults::rounds(1);
    for _ in 0..rounds {
        for fault in [Fault::Refused, Fault::BlackHoled, Fault::Slowed] {
            fault.start(&proxy).await;
            let mut refused = 0;
            for _ in 0..3 {
                let (path, body) = publish(n);
                n += 1;
                let mut answers = vec![timed(&herald, "POST", &path, Some(body)).await];
                answers.push(timed(&herald, "POST", "/app", Some(json!({"name": format!("f{n}")}))).await);
                answers.push(timed(&herald, "GET", &format!("/app/{app}/msg"), None).await);
                for (i, (status, body, elapsed)) in answers.into_iter().enumerate() {
                    if i == 0 {
                        messages.answer(202, status, &body);
                    }
                    if status == 503 {
                        refused += 1;
                        assert_eq!(body["code"], "store_unavailable", "{fault:?}: {body}");
                        slowest_503 = slowest_503.max(elapsed);
                        assert!(
                            elapsed <= TIMEOUT + SLACK,
                            "{fault:?}: a 503 took {elapsed:?}, beyond the {TIMEOUT:?} bound"
                        );
                    } else {
                        assert!(status < 300, "{fault:?}: {status} {body}");
                    }
                }
                let (status, body, elapsed) = timed(&herald, "GET", "/health", None).await;
                assert_eq!(
                    (status, body["status"].as_str()),
                    (503, Some("unavailable")),
                    "{fault:?}: {body}"
                );
                assert!(elapsed <= TIMEOUT + SLACK, "{fault:?}: /health took {elapsed:?}");
                slowest_503 = slowest_503.max(elapsed);
            }
            assert!(
                refused >= 3,
                "{fault:?}: the database is gone, yet only {refused} requests were refused"
            );
            assert!(herald.is_running(), "{fault:?}: the node must survive");

            fault.end(&proxy).await;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let (path, body) = publish(n);
                n += 1;
                let (status, body, _) = timed(&herald, "POST", &path, Some(body)).await;
                messages.answer(202, status, &body);
                if status == 202 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{fault:?}: no recovery after the fault ended: {body}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert!(messages.violations.is_empty(), "{:?}", messages.violations);

    messages.assert_all_stored(&faults::message_ids(&herald, &app).await, "through the API");
    let arrivals = messages
        .wait_arrivals(&receiver, "webhook-id", Duration::from_secs(90))
        .await;
    herald.kill9();
    herald.restart().await;
    messages.assert_all_stored(&faults::message_ids(&herald, &app).await, "after kill -9 and restart");
    println!(
        "reliability: sender, PostgreSQL refused/black-holed/slowed: rounds={rounds} acknowledged={} refused={} lost=0 duplicates={} slowest_503={slowest_503:?}",
        messages.acknowledged.len(),
        messages.refused_with("store_unavailable"),
        faults::duplicates(&arrivals),
    );
}

/// Each stored message's `eventId` and id.
async fn stored_events(herald: &Herald, app: &str) -> BTreeMap<String, Vec<String>> {
    let mut events: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for message in herald.messages(app).await {
        if let (Some(event), Some(id)) = (message["eventId"].as_str(), message["id"].as_str()) {
            events.entry(event.to_owned()).or_default().push(id.to_owned());
        }
    }
    events
}

/// Messages published together in each try of the commit-cut test, so that a cut batch may hold several.
const AT_ONCE: usize = 4;

/// What the commit-cut tests saw: every answer, and what each cut did.
#[derive(Default)]
struct Cuts {
    messages: Ledger,
    /// eventId -> the message id its 202 named.
    acknowledged_as: BTreeMap<String, String>,
    /// Messages answered 503 that the server had committed.
    committed_unacknowledged: usize,
    /// Messages answered 503 that the server had rolled back.
    rolled_back: usize,
    /// Cuts that took another commit than an ingest batch's (a lease round's, the result writer's).
    other_commits_cut: usize,
    slowest_503: Duration,
    published: usize,
}

impl Cuts {
    /// Cut, as `cut`, the commit of one ingest batch of up to `at_once` messages published together,
    /// then check every message it refused: stored exactly when the server got the `COMMIT`, and
    /// acknowledged — as that stored message — when the producer retries it with its `eventId`.
    ///
    /// Only for cuts that close the connection may `at_once` be more than one: behind a batch whose
    /// connection went silent, the messages queued for the next batch run out of time too, and are
    /// committed right after (the writer gives the silent batch up a moment after they gave up).
    async fn cut_one_batch(&mut self, herald: &Herald, proxy: &TcpProxy, app: &str, cut: CommitCut, at_once: usize) {
        let path = format!("/app/{app}/msg");
        let message = |event: &str| json!({"eventType": "db.commit", "eventId": event, "payload": {"event": event}});
        // The cut takes the commit point of the batch that writes the first message's payload: its
        // `COMMIT`, or, for a batch that is one statement outside a transaction block (PostgreSQL's
        // batches of apps the writer remembers), that statement.
        let mut tries = 0;
        let refused = loop {
            tries += 1;
            assert!(tries <= 50, "{cut:?}: no ingest commit was cut in 50 tries");
            let events: Vec<String> = (self.published..self.published + at_once)
                .map(|i| format!("evt-{i}"))
                .collect();
            proxy.cut_commit_after(format!("\"{}\"", events[0]).as_bytes(), cut);
            self.published += at_once;
            let answers = futures::future::join_all(
                events
                    .iter()
                    .map(|event| timed(herald, "POST", &path, Some(message(event)))),
            )
            .await;
            let mut refused = Vec::new();
            for (event, (status, body, elapsed)) in events.into_iter().zip(answers) {
                self.messages.answer(202, status, &body);
                if status == 202 {
                    self.acknowledged_as
                        .insert(event, body["id"].as_str().unwrap_or_default().to_owned());
                } else {
                    self.slowest_503 = self.slowest_503.max(elapsed);
                    refused.push(event);
                }
            }
            if !refused.is_empty() {
                break refused;
            }
            assert!(
                !proxy.commit_cut_armed(),
                "{cut:?}: the ingest's COMMIT went through the proxy unseen"
            );
            self.other_commits_cut += 1;
        };
        for event in refused {
            // The batch's outcome is certain to the test, unknown to Herald: it answered 503 either way.
            let (status, found) = herald.call("GET", &format!("{path}/{event}"), None).await;
            let committed = if cut.commits() {
                self.committed_unacknowledged += 1;
                assert_eq!(status, 200, "{cut:?}: the server committed {event}: {found}");
                Some(found["id"].as_str().unwrap_or_default().to_owned())
            } else {
                self.rolled_back += 1;
                assert_eq!(status, 404, "{cut:?}: {event} was rolled back: {found}");
                None
            };
            // The producer retries with the same eventId until it is acknowledged.
            let deadline = Instant::now() + Duration::from_secs(30);
            let id = loop {
                let (status, body) = herald.call("POST", &path, Some(message(&event))).await;
                self.messages.answer(202, status, &body);
                if status == 202 {
                    break body["id"].as_str().unwrap_or_default().to_owned();
                }
                assert!(Instant::now() < deadline, "{cut:?}: {event} never acknowledged: {body}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            if let Some(committed) = committed {
                assert_eq!(
                    id, committed,
                    "{cut:?}: the retry must acknowledge the committed message"
                );
            }
            self.acknowledged_as.insert(event, id);
        }
    }

    /// Every answer was a 202 or a 503 `store_unavailable`; every stored `eventId` is one message, the
    /// one its acknowledgement named; and the stored messages are exactly the acknowledged ones.
    async fn assert_each_event_stored_once(&self, herald: &Herald, app: &str, when: &str) {
        assert!(self.messages.violations.is_empty(), "{:?}", self.messages.violations);
        let stored = stored_events(herald, app).await;
        for (event, ids) in &stored {
            assert_eq!(ids.len(), 1, "{when}: {event} is stored {} times: {ids:?}", ids.len());
        }
        for (event, id) in &self.acknowledged_as {
            assert_eq!(
                stored.get(event).map(Vec::as_slice),
                Some(std::slice::from_ref(id)),
                "{when}: {event} was acknowledged as {id}"
            );
        }
        let stored_ids: BTreeSet<String> = stored.into_values().flatten().collect();
        assert_eq!(
            stored_ids, self.messages.acknowledged,
            "{when}: every stored message was acknowledged once retried, and only those"
        );
    }

    /// [`Cuts::assert_each_event_stored_once`] through the API, then (with a `receiver`) wait until every
    /// acknowledged message arrived there, then the same check after `kill -9` and a restart; every
    /// arrival's `webhook-id`.
    async fn assert_kept(&self, herald: &mut Herald, app: &str, receiver: Option<&Receiver>) -> Vec<String> {
        self.assert_each_event_stored_once(herald, app, "through the API").await;
        let arrivals = match receiver {
            Some(receiver) => {
                self.messages
                    .wait_arrivals(receiver, "webhook-id", Duration::from_secs(90))
                    .await
            }
            None => Vec::new(),
        };
        herald.kill9();
        herald.restart().await;
        self.assert_each_event_stored_once(herald, app, "after kill -9 and restart")
            .await;
        arrivals
    }

    /// The figures line's common part.
    fn figures(&self) -> String {
        format!(
            "acknowledged={} committed_unacknowledged={} rolled_back={} other_commits_cut={} lost=0 stored_twice=0",
            self.messages.acknowledged.len(),
            self.committed_unacknowledged,
            self.rolled_back,
            self.other_commits_cut
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_at_commit_is_never_acknowledged_and_a_retry_stores_each_message_once() {
    let test = "a_connection_cut_at_commit_is_never_acknowledged_and_a_retry_stores_each_message_once";
    let Some(ProxiedNode {
        mut herald,
        proxy,
        receiver,
        app,
    }) = ProxiedNode::start(test, "commit-cuts", &[]).await
    else {
        return;
    };
    let mut cuts = Cuts::default();
    let rounds = faults::rounds(3);
    for _ in 0..rounds {
        for cut in [CommitCut::After, CommitCut::Before] {
            cuts.cut_one_batch(&herald, &proxy, &app, cut, AT_ONCE).await;
        }
    }
    let arrivals = cuts.assert_kept(&mut herald, &app, Some(&receiver)).await;
    println!(
        "reliability: sender, PostgreSQL connection cut at COMMIT: rounds={rounds} {} duplicates={}",
        cuts.figures(),
        faults::duplicates(&arrivals),
    );
}

/// The commit-silence test's `HERALD_DATABASE_STATEMENT_TIMEOUT`: with [`TIMEOUT`], the bound of the
/// group-commit writer's transaction and of a message's wait for it.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// A sender behind a proxy with [`TIMEOUT`] and [`STATEMENT_TIMEOUT`]: a bound of 3 s on every call.
async fn start_with_short_bounds(test: &str) -> Option<(Herald, TcpProxy)> {
    let timeout = format!("{}ms", TIMEOUT.as_millis());
    let statement = format!("{}ms", STATEMENT_TIMEOUT.as_millis());
    let env = [
        ("HERALD_DATABASE_TIMEOUT", timeout.as_str()),
        ("HERALD_DATABASE_STATEMENT_TIMEOUT", statement.as_str()),
    ];
    Herald::start_behind_proxy(test, &env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_at_commit_is_answered_503_within_the_writers_bound_and_the_writer_goes_on() {
    let test = "a_connection_silent_at_commit_is_answered_503_within_the_writers_bound_and_the_writer_goes_on";
    // No endpoint: nothing but ingest and the lease rounds commit (a silenced lease round is bounded by
    // its own timeout), so the writer's bound is what this test sees.
    let Some((mut herald, proxy)) = start_with_short_bounds(test).await else {
        return;
    };
    let app = herald.app("commit-silence").await;
    let bound = TIMEOUT + STATEMENT_TIMEOUT;
    let mut cuts = Cuts::default();
    let rounds = faults::rounds(1);
    for _ in 0..rounds {
        for cut in [CommitCut::SilentBefore, CommitCut::SilentAfter] {
            cuts.cut_one_batch(&herald, &proxy, &app, cut, 1).await;
        }
    }
    assert!(
        cuts.slowest_503 <= bound + SLACK,
        "a 503 took {:?}, beyond the writer's {bound:?} bound",
        cuts.slowest_503
    );
    cuts.assert_kept(&mut herald, &app, None).await;
    println!(
        "reliability: sender, PostgreSQL connection silent at COMMIT: rounds={rounds} {} slowest_503={:?} (bound {bound:?})",
        cuts.figures(),
        cuts.slowest_503,
    );
}

/// Wait (generously) until the proxy's armed cut has fired.
async fn wait_fired(proxy: &TcpProxy, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while proxy.commit_cut_armed() {
        assert!(Instant::now() < deadline, "{what}: the armed silence never fired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Make the connection that sends `marker` go silent, then send `request` (which binds it): it must be
/// answered `503 store_unavailable`; how long that took.
async fn silenced(herald: &Herald, proxy: &TcpProxy, marker: &str, request: (&str, &str, Option<Value>)) -> Duration {
    let (method, path, body) = request;
    proxy.cut_at_next(marker.as_bytes(), CommitCut::SilentBefore);
    let (status, body, elapsed) = timed(herald, method, path, body).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("store_unavailable")),
        "{method} {path}: {body}"
    );
    assert!(
        !proxy.commit_cut_armed(),
        "{method} {path}: its statement went through the proxy unseen"
    );
    elapsed
}

/// What the receiver of the silent-call test answers: the result writer's statement that records the
/// answer is the only one that carries it, so it is the one a cut on these bytes silences.
const RESULT_MARKER: &str = "silent-result-marker";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_mid_call_fails_reads_api_writes_and_results_within_the_bound_and_all_resumes() {
    let test = "a_connection_silent_mid_call_fails_reads_api_writes_and_results_within_the_bound_and_all_resumes";
    let Some((mut herald, proxy)) = start_with_short_bounds(test).await else {
        return;
    };
    let bound = TIMEOUT + STATEMENT_TIMEOUT;
    let app = herald.app("silent-calls").await;
    let receiver = Receiver::start(common::Reply::status(200).body(RESULT_MARKER)).await;
    herald.endpoint(&app, json!({ "url": receiver.url() })).await;
    let mut slowest_503 = Duration::ZERO;

    // A read whose statement goes unanswered (the app's uid is bound by that statement only).
    let read_uid = "silent-read-marker";
    let (status, body) = herald
        .call("POST", "/app", Some(json!({"name": "read", "uid": read_uid})))
        .await;
    assert_eq!(status, 201, "{body}");
    let elapsed = silenced(&herald, &proxy, read_uid, ("GET", &format!("/app/{read_uid}"), None)).await;
    slowest_503 = slowest_503.max(elapsed);
    let (status, body) = herald.call("GET", &format!("/app/{read_uid}"), None).await;
    assert_eq!(status, 200, "reads resume: {body}");

    // An API write whose statement goes unanswered: refused, not stored; the retry is.
    let write_uid = "silent-write-marker";
    let create = json!({"name": "write", "uid": write_uid});
    let elapsed = silenced(&herald, &proxy, write_uid, ("POST", "/app", Some(create.clone()))).await;
    slowest_503 = slowest_503.max(elapsed);
    let (status, body) = herald.call("GET", &format!("/app/{write_uid}"), None).await;
    assert_eq!(status, 404, "a refused write is not stored: {body}");
    let (status, body) = herald.call("POST", "/app", Some(create)).await;
    assert_eq!(status, 201, "writes resume: {body}");
    let write_app = body["id"].as_str().unwrap_or_default().to_owned();

    // The result writer's statement goes unanswered: it gives the batch up and records it again.
    proxy.cut_at_next(RESULT_MARKER.as_bytes(), CommitCut::SilentBefore);
    let mut messages = Ledger::default();
    let (status, body) = herald
        .call(
            "POST",
            &format!("/app/{app}/msg"),
            Some(json!({"eventType": "db.silent", "payload": {}})),
        )
        .await;
    messages.answer(202, status, &body);
    let msg = body["id"].as_str().unwrap_or_default().to_owned();
    assert_eq!(status, 202, "{body}");
    wait_fired(&proxy, "the result writer").await;
    let attempts = herald
        .wait_attempts(&app, &msg, Duration::from_secs(90), |attempts| {
            attempts.iter().any(|a| a["status"] == 0)
        })
        .await;
    assert!(
        slowest_503 <= bound + SLACK,
        "a 503 took {slowest_503:?}, beyond the {bound:?} bound"
    );

    messages.assert_all_stored(&faults::message_ids(&herald, &app).await, "through the API");
    herald.kill9();
    herald.restart().await;
    messages.assert_all_stored(&faults::message_ids(&herald, &app).await, "after kill -9 and restart");
    let (status, body) = herald.call("GET", &format!("/app/{write_app}"), None).await;
    assert_eq!(status, 200, "the acknowledged app after kill -9 and restart: {body}");
    println!(
        "reliability: sender, PostgreSQL connection silent mid-call (read, API write, result writer): acknowledged={} lost=0 slowest_503={slowest_503:?} (bound {bound:?}) attempts_recorded={} deliveries={}",
        messages.acknowledged.len(),
        attempts.len(),
        receiver.received().len(),
    );
}

/// The inbox's bound: it runs with the default timeouts (`DatabaseTimeouts::default()`: 1 s to acquire,
/// 5 s per statement).
const INBOX_BOUND: Duration = Duration::from_secs(6);

/// One signed post to the inbox, timed.
async fn post_timed(inbox: &Herald, msg_id: &str) -> (u16, Value, Duration) {
    let started = Instant::now();
    let body = json!({"type": "invoice.paid", "id": msg_id}).to_string();
    let (status, body) = tokio::time::timeout(HANG, faults::post_signed(inbox, msg_id, &body))
        .await
        .unwrap_or_else(|_| panic!("posting {msg_id}: no answer within {HANG:?}"));
    (status, body, started.elapsed())
}

/// Post `msg_id` as a provider does, until it is acknowledged; its inbox id.
async fn post_until_acknowledged(inbox: &Herald, msg_id: &str, ledger: &mut Ledger) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body, _) = post_timed(inbox, msg_id).await;
        ledger.answer(200, status, &body);
        if status == 200 {
            return body["id"].as_str().unwrap_or_default().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{msg_id} was never acknowledged: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_on_postgres_refused_black_holed_slowed_or_cut_at_commit_never_acknowledges_what_it_did_not_store() {
    let test = "inbox_on_postgres_refused_black_holed_slowed_or_cut_at_commit_never_acknowledges_what_it_did_not_store";
    let handler = Receiver::start(common::Reply::status(200)).await;
    let schedule = vec!["500ms"; 50].join(",");
    let env = [("HERALD_INBOX_RETRY_SCHEDULE", schedule.as_str())];
    let Some((mut inbox, proxy)) = Herald::start_inbox_behind_proxy(test, &faults::inbox_config(&handler), &env).await
    else {
        return;
    };
    let mut events = Ledger::default();
    // provider id -> the inbox id its acknowledgement named.
    let mut acknowledged_as = BTreeMap::new();
    let mut slowest_503 = Duration::ZERO;
    let mut n = 0;
    let mut next_id = |prefix: &str| {
        n += 1;
        format!("{prefix}-{n}")
    };
    for _ in 0..3 {
        let msg_id = next_id("ok");
        let id = post_until_acknowledged(&inbox, &msg_id, &mut events).await;
        acknowledged_as.insert(msg_id, id);
    }

    let rounds = faults::rounds(1);
    let (mut committed_unacknowledged, mut rolled_back) = (0, 0);
    for _ in 0..rounds {
        for fault in [Fault::Refused, Fault::BlackHoled, Fault::Slowed] {
            fault.start(&proxy).await;
            for _ in 0..3 {
                let (status, body, elapsed) = post_timed(&inbox, &next_id("fault")).await;
                events.answer(200, status, &body);
                assert_eq!(
                    (status, body["code"].as_str()),
                    (503, Some("store_unavailable")),
                    "{fault:?}: the database is gone: {body}"
                );
                slowest_503 = slowest_503.max(elapsed);
                let (status, body, elapsed) = timed(&inbox, "GET", "/health", None).await;
                assert_eq!(
                    (status, body["status"].as_str()),
                    (503, Some("unavailable")),
                    "{fault:?}: {body}"
                );
                slowest_503 = slowest_503.max(elapsed);
            }
            fault.end(&proxy).await;
            let msg_id = next_id("after");
            let id = post_until_acknowledged(&inbox, &msg_id, &mut events).await;
            acknowledged_as.insert(msg_id, id);
        }
        // The insert is one autocommitted statement: it commits at the end of the chunk that carries it
        // (the only one holding the event's `webhook-id`), so a cut there is the inbox's commit point.
        for cut in [CommitCut::After, CommitCut::Before] {
            let msg_id = next_id("cut");
            proxy.cut_at_next(msg_id.as_bytes(), cut);
            let (status, body, elapsed) = post_timed(&inbox, &msg_id).await;
            events.answer(200, status, &body);
            assert!(
                !proxy.commit_cut_armed(),
                "{cut:?}: the insert went through the proxy unseen"
            );
            assert_eq!(
                (status, body["code"].as_str()),
                (503, Some("store_unavailable")),
                "{cut:?}: the inbox cannot know whether the insert committed: {body}"
            );
            slowest_503 = slowest_503.max(elapsed);
            let stored = faults::inbox_events(&inbox).await.remove(&msg_id);
            if cut.commits() {
                committed_unacknowledged += 1;
                assert!(stored.is_some(), "{cut:?}: the server committed {msg_id}");
            } else {
                rolled_back += 1;
                assert!(stored.is_none(), "{cut:?}: {msg_id} was rolled back: {stored:?}");
            }
            // The provider retries with the same webhook-id: the one stored event is acknowledged.
            let id = post_until_acknowledged(&inbox, &msg_id, &mut events).await;
            if let Some(stored) = stored {
                assert_eq!(
                    stored,
                    vec![id.clone()],
                    "{cut:?}: the retry must acknowledge the stored event"
                );
            }
            acknowledged_as.insert(msg_id, id);
        }
    }

    // The forwarder cannot record a forward's outcome (the COMMIT of its transaction is cut): the event
    // stays pending and is forwarded again — at least once, never lost.
    let msg_id = next_id("outcome");
    proxy.cut_at_next_commit(CommitCut::Before);
    let id = post_until_acknowledged(&inbox, &msg_id, &mut events).await;
    acknowledged_as.insert(msg_id, id);
    wait_fired(&proxy, "the forwarder's outcome").await;

    assert!(
        slowest_503 <= INBOX_BOUND + SLACK,
        "a 503 took {slowest_503:?}, beyond {INBOX_BOUND:?}"
    );
    assert!(events.violations.is_empty(), "{:?}", events.violations);
    let check = |stored: &BTreeMap<String, Vec<String>>, when: &str| {
        for (provider, ids) in stored {
            assert_eq!(
                ids.len(),
                1,
                "{when}: {provider} is stored {} times: {ids:?}",
                ids.len()
            );
        }
        for (provider, id) in &acknowledged_as {
            assert_eq!(
                stored.get(provider).map(Vec::as_slice),
                Some(std::slice::from_ref(id)),
                "{when}: {provider} was acknowledged as {id}"
            );
        }
    };
    let arrivals = events.assert_inbox_kept(&mut inbox, &handler, check).await;
    println!(
        "reliability: inbox, PostgreSQL refused/black-holed/slowed/cut at commit: rounds={rounds} acknowledged={} refused={} committed_unacknowledged={committed_unacknowledged} rolled_back={rolled_back} lost=0 stored_twice=0 duplicates={} slowest_503={slowest_503:?}",
        events.acknowledged.len(),
        events.refused_with("store_unavailable"),
        faults::duplicates(&arrivals),
    );
}

/// `herald inbox`'s PostgreSQL timeouts are settings, as the sender's: with `HERALD_DATABASE_TIMEOUT`
/// and `HERALD_DATABASE_STATEMENT_TIMEOUT` below their defaults, an insert whose connection goes silent
/// is answered `503 store_unavailable` within their sum (0.5 s + 1 s), not the default's 6 s; the inbox
/// takes events again at once, and the silent insert was not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_database_timeouts_are_settings_that_bound_a_silent_insert() {
    let test = "inbox_database_timeouts_are_settings_that_bound_a_silent_insert";
    let handler = Receiver::start(common::Reply::status(200)).await;
    let env = [
        ("HERALD_DATABASE_TIMEOUT", "500ms"),
        ("HERALD_DATABASE_STATEMENT_TIMEOUT", "1s"),
    ];
    let Some((inbox, proxy)) = Herald::start_inbox_behind_proxy(test, &faults::inbox_config(&handler), &env).await
    else {
        return;
    };
    let bound = Duration::from_millis(1_500);
    let mut events = Ledger::default();
    post_until_acknowledged(&inbox, "before", &mut events).await;
    proxy.cut_at_next(b"silent", CommitCut::SilentBefore);
    let (status, body, elapsed) = post_timed(&inbox, "silent").await;
    events.answer(200, status, &body);
    assert!(!proxy.commit_cut_armed(), "the insert went through the proxy unseen");
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("store_unavailable")),
        "a silent insert: {body}"
    );
    assert!(
        elapsed <= bound + SLACK,
        "the silent insert was answered after {elapsed:?}, beyond the configured bound of {bound:?}"
    );
    post_until_acknowledged(&inbox, "after", &mut events).await;
    events.assert_answers("store_unavailable", 1);
    let stored = faults::inbox_events(&inbox).await;
    assert!(
        !stored.contains_key("silent"),
        "the silent insert was stored: {stored:?}"
    );
    assert!(
        stored.contains_key("before") && stored.contains_key("after"),
        "{stored:?}"
    );
    println!("reliability: inbox, PostgreSQL, silent insert answered 503 after {elapsed:?} (bound {bound:?})");
}

/// The outbox reader's marking of a row that cannot become a message (its app is unknown) is a store
/// call like every other, held to the bound: its connection gone silent, the reader gives that session
/// up within it and reads on, so rows published after it still become messages — before, the reader
/// waited on the silent connection until TCP gave up (about 15 minutes), and no outbox row was read
/// meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_readers_marking_of_a_refused_row_is_bounded_and_the_reader_reads_on() {
    let test = "the_outbox_readers_marking_of_a_refused_row_is_bounded_and_the_reader_reads_on";
    let Some((herald, proxy)) = start_with_short_bounds(test).await else {
        return;
    };
    let app = herald.app("shop").await;
    let url = herald.database.as_ref().expect("database").url.clone();
    // The producer reaches the database directly, not through the proxy.
    let producer = sqlx::PgPool::connect(&url).await.expect("producer connects");
    // The row-by-row marking is the only statement with this text (a batch marks rows with UNNEST).
    proxy.cut_at_next(b"SET error = $2 WHERE seq = $1", CommitCut::SilentBefore);
    // A row `herald_publish` would have refused (its app is unknown), as one whose app was deleted after
    // it was published: a well-formed application id (a malformed one is refused as the rows are read,
    // by one statement for all of them), so that the writer's plan refuses it.
    sqlx::query("INSERT INTO herald_outbox (app_id, event_type, payload, event_id) VALUES ('app_0000000000000000000000', 'invoice.paid', '{}', 'orphan')")
        .execute(&producer)
        .await
        .expect("insert the orphan row");
    let deadline = Instant::now() + Duration::from_secs(20);
    while proxy.commit_cut_armed() {
        assert!(Instant::now() < deadline, "the reader never marked the orphan row");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let silenced = Instant::now();
    sqlx::query("SELECT herald_publish($1, 'invoice.paid', '{\"n\": 1}', 'after-the-silence')")
        .bind(&app)
        .execute(&producer)
        .await
        .expect("herald_publish");
    // The bound (3 s), the reader's first back-off (0.2 s) and a loaded machine's slack.
    let within = TIMEOUT + STATEMENT_TIMEOUT + Duration::from_millis(200) + SLACK + Duration::from_secs(2);
    loop {
        let (status, body) = herald
            .call("GET", &format!("/app/{app}/msg/after-the-silence"), None)
            .await;
        if status == 200 {
            break;
        }
        assert!(
            silenced.elapsed() < within,
            "the row published after the silent marking is still not a message after {:?}: {status} {body}",
            silenced.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let error: Option<String> = sqlx::query_scalar("SELECT error FROM herald_outbox WHERE event_id = 'orphan'")
        .fetch_one(&producer)
        .await
        .expect("the orphan row is kept");
    assert!(
        error.is_some_and(|e| !e.is_empty()),
        "the orphan row is kept with its reason"
    );
    println!(
        "reliability: outbox reader, silent marking given up; the next row a message after {:?}",
        silenced.elapsed()
    );
}

/// Wait (generously) until a session of the node waits on a lock the test's session `holder` holds.
async fn wait_blocked_by(db: &sqlx::PgPool, holder: i32, what: &str) {
    wait_blocked_by_many(db, holder, 1, what).await;
}

/// Wait (generously) until at least `sessions` sessions wait on a lock the test's session `holder` holds.
async fn wait_blocked_by_many(db: &sqlx::PgPool, holder: i32, sessions: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let blocked: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))")
                .bind(holder)
                .fetch_one(db)
                .await
                .expect("read pg_stat_activity");
        if blocked >= sessions {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the node never waited on the test's lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the application holds a message with this `eventId`.
async fn has_message(herald: &Herald, app: &str, event: &str) -> bool {
    let (status, body) = herald.call("GET", &format!("/app/{app}/msg/{event}"), None).await;
    assert!(matches!(status, 200 | 404), "{status} {body}");
    status == 200
}

/// A session of the test's own holding the ingest lock, which every batch of the group-commit writer
/// takes first (a batch no longer waits for an application's row: it defers the application's messages):
/// the batch that has taken a message stays open, waiting, until the test commits.
struct IngestLock {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    pid: i32,
}

impl IngestLock {
    /// Take the ingest lock on a session of its own (waiting, in the lock's queue, for whoever holds it
    /// or asked first).
    async fn take(db: &sqlx::PgPool) -> Self {
        let mut tx = db.begin().await.expect("begin");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .expect("pid");
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(herald_store::postgres::INGEST_LOCK)
            .execute(&mut *tx)
            .await
            .expect("take the ingest lock");
        Self { tx, pid }
    }

    async fn release(self) {
        self.tx.commit().await.expect("release the lock");
    }
}

/// A message queued behind a long (but healthy) batch is taken by the next batch only after part of its
/// wait is spent; should that batch then run past the rest of it, the message must not be answered `503`
/// while its batch goes on to commit it (a producer that retried without an `eventId` would store it
/// twice). Before, the message's wait was cut at the bound counted from its arrival, and the next batch
/// committed it regardless. Deterministic: the test holds the ingest lock the writer's batches wait on,
/// once for each batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_answered_503_is_never_committed_by_a_later_batch() {
    let test = "a_message_answered_503_is_never_committed_by_a_later_batch";
    // Bound 4.5 s (a message's wait, and a batch's transaction); a lock wait is given up after 4 s.
    let env = [
        ("HERALD_DATABASE_TIMEOUT", "500ms"),
        ("HERALD_DATABASE_STATEMENT_TIMEOUT", "4s"),
    ];
    let Some(mut herald) = Herald::start_pg(test, &env).await else {
        return;
    };
    let (first_app, second_app) = (herald.app("first").await, herald.app("second").await);
    let url = herald.database.as_ref().expect("database").url.clone();
    let db = sqlx::PgPool::connect(&url).await.expect("the test's own connection");

    let first_lock = IngestLock::take(&db).await;
    let node = &herald;
    let post = |app: &str, event: &str| {
        let path = format!("/app/{app}/msg");
        let body = json!({"eventType": "invoice.paid", "eventId": event, "payload": {"n": 1}});
        async move { timed(node, "POST", &path, Some(body)).await }
    };
    let first = post(&first_app, "first");
    let second = post(&second_app, "second");
    let scenario = async {
        // The first message's batch waits for the ingest lock ...
        wait_blocked_by(&db, first_lock.pid, "the first message's batch").await;
        let blocked_at = Instant::now();
        // ... while the second message arrives and queues behind it (sent below, once this runs), and
        // the test's second session asks for the lock too, after the first batch: it gets the lock when
        // that batch commits, before the writer's next batch asks for it.
        let (second_lock, ()) = tokio::join!(IngestLock::take(&db), async {
            wait_blocked_by_many(&db, first_lock.pid, 2, "the test's second session").await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            // The first batch commits 3 s into its 4 s lock wait; the writer takes the second message
            // into the next batch, which waits for the lock the second session then holds.
            tokio::time::sleep_until((blocked_at + Duration::from_secs(3)).into()).await;
            first_lock.release().await;
        });
        wait_blocked_by(&db, second_lock.pid, "the second message's batch").await;
        // Released past the second message's bound counted from its arrival (4.5 s after about 0.3 s),
        // within its batch's 4 s lock wait (from about 3 s).
        tokio::time::sleep_until((blocked_at + Duration::from_millis(5_900)).into()).await;
        second_lock.release().await;
    };
    let second_later = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        second.await
    };
    let ((first_status, first_body, _), (second_status, second_body, second_took), ()) =
        tokio::join!(first, second_later, scenario);
    assert_eq!(first_status, 202, "{first_body}");

    let second_stored = has_message(&herald, &second_app, "second").await;
    match second_status {
        202 => assert!(second_stored, "acknowledged but not stored: {second_body}"),
        _ => assert!(
            !second_stored,
            "answered {second_status} {second_body} after {second_took:?}, but its batch committed it"
        ),
    }
    // Its batch was healthy: the message is acknowledged, after the time its batch took.
    assert_eq!(second_status, 202, "{second_body}");
    herald.kill9();
    herald.restart().await;
    assert!(
        has_message(&herald, &second_app, "second").await,
        "the acknowledged message is there after kill -9"
    );
    println!("reliability: a message taken into a slow batch: answered {second_status} after {second_took:?}");
}

/// What the receiver of the result-commit test answers: only the result writer's statement that records
/// the attempt carries it, so the proxy can cut that transaction's `COMMIT`.
const RESULT_COMMIT_MARKER: &str = "result-commit-marker";

/// The attempts and the `message.attempt.exhausted` events recorded for `msg`.
async fn recorded_for(herald: &Herald, app: &str, msg: &str) -> (usize, usize) {
    let attempts = herald.attempts(app, msg).await.len();
    let events = herald.get("/operational-event?limit=250").await["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|e| e["eventType"] == "message.attempt.exhausted" && e["data"]["msgId"] == msg)
        .count();
    (attempts, events)
}

/// The result writer's `COMMIT` goes through but its answer is lost: the writer cannot know it committed
/// and writes the batch again. That retry must record nothing twice — neither the attempt (its id is
/// the same) nor the operational events the attempt causes (a second `message.attempt.exhausted` would
/// also be pushed to the operational webhook again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_commit_whose_answer_is_lost_records_its_attempt_and_events_once() {
    let test = "a_result_commit_whose_answer_is_lost_records_its_attempt_and_events_once";
    let Some((herald, proxy)) = Herald::start_behind_proxy(test, &[]).await else {
        return;
    };
    let app = herald.app("result-commit").await;
    // A 400 ends the delivery at its first attempt (a content rejection), with an exhausted event.
    let receiver = Receiver::start(common::Reply::status(400).body(RESULT_COMMIT_MARKER)).await;
    herald.endpoint(&app, json!({ "url": receiver.url() })).await;
    proxy.cut_commit_after(RESULT_COMMIT_MARKER.as_bytes(), CommitCut::After);
    let post = |n: u32| {
        let herald = &herald;
        let path = format!("/app/{app}/msg");
        async move {
            let body = herald
                .post(&path, json!({"eventType": "result.commit", "payload": {"n": n}}))
                .await;
            body["id"].as_str().expect("id").to_owned()
        }
    };
    let cut = post(1).await;
    wait_fired(&proxy, "the result writer's COMMIT").await;
    // The writer retries its batch before it takes another: once a later message's attempt is
    // recorded, the retry is done.
    let later = post(2).await;
    herald
        .wait_attempts(&app, &later, Duration::from_secs(60), |attempts| !attempts.is_empty())
        .await;
    let (attempts, events) = recorded_for(&herald, &app, &cut).await;
    assert_eq!(
        (attempts, events),
        (1, 1),
        "the cut message's attempt and exhausted event, each recorded once"
    );
    assert_eq!(recorded_for(&herald, &app, &later).await, (1, 1));
    println!(
        "reliability: result writer, PostgreSQL COMMIT answered into the void: attempts={attempts} exhausted_events={events}"
    );
}
