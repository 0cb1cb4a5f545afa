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

/// The message ids of an app.
async fn stored(herald: &Herald, app: &str) -> BTreeSet<String> {
    herald
        .messages(app)
        .await
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect()
}

/// One request, timed.
async fn timed(herald: &Herald, method: &str, path: &str, body: Option<Value>) -> (u16, Value, Duration) {
    let started = Instant::now();
    let (status, body) = herald.call(method, path, body).await;
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

    messages.assert_all_stored(&stored(&herald, &app).await, "through the API");
    let arrivals = messages
        .wait_arrivals(&receiver, "webhook-id", Duration::from_secs(90))
        .await;
    herald.kill9();
    herald.restart().await;
    messages.assert_all_stored(&stored(&herald, &app).await, "after kill -9 and restart");
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
        // The cut takes the next COMMIT of any of the node's connections: usually an ingest batch's,
        // now and then a lease round's or the result writer's. Publish until an ingest batch is cut.
        let mut tries = 0;
        let refused = loop {
            tries += 1;
            assert!(tries <= 50, "{cut:?}: no ingest commit was cut in 50 tries");
            proxy.cut_at_next_commit(cut);
            let events: Vec<String> = (self.published..self.published + at_once)
                .map(|i| format!("evt-{i}"))
                .collect();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_at_commit_is_answered_503_within_the_writers_bound_and_the_writer_goes_on() {
    let test = "a_connection_silent_at_commit_is_answered_503_within_the_writers_bound_and_the_writer_goes_on";
    let timeout = format!("{}ms", TIMEOUT.as_millis());
    let statement = format!("{}ms", STATEMENT_TIMEOUT.as_millis());
    let env = [
        ("HERALD_DATABASE_TIMEOUT", timeout.as_str()),
        ("HERALD_DATABASE_STATEMENT_TIMEOUT", statement.as_str()),
    ];
    // No endpoint: nothing but ingest and the lease rounds commit (a silenced lease round is bounded by
    // its own timeout), so the writer's bound is what this test sees.
    let Some((mut herald, proxy)) = Herald::start_behind_proxy(test, &env).await else {
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
