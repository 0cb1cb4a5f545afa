//! Storage faults for the custody tests: a size-capped tmpfs that a ballast file fills to the last byte
//! and frees again, and the ledger that compares what was acknowledged with what is stored.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How many fault rounds a test runs: `HERALD_FAULT_ROUNDS`, or `default` (kept small so the suite
/// stays fast; raise it to soak).
pub(crate) fn rounds(default: usize) -> usize {
    std::env::var("HERALD_FAULT_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// A tmpfs of a fixed size mounted on a fresh temporary directory; unmounted when dropped. Needs root
/// (CI runs as root); a test that cannot mount fails rather than passing without its fault.
pub(crate) struct SizedTmpfs {
    dir: tempfile::TempDir,
}

impl SizedTmpfs {
    pub(crate) fn mount(mebibytes: u32) -> Self {
        let dir = tempfile::tempdir().expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mebibytes}m,mode=0700"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a {mebibytes} MiB tmpfs failed (the disk-full tests need root): {status}"
        );
        Self { dir }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A SQLite URL for a file on this filesystem.
    pub(crate) fn sqlite_url(&self, name: &str) -> String {
        format!("sqlite://{}", self.path().join(name).display())
    }

    /// The ballast file that fills this filesystem.
    pub(crate) fn ballast(&self) -> Ballast {
        Ballast {
            path: self.path().join("ballast"),
        }
    }
}

impl Drop for SizedTmpfs {
    fn drop(&mut self) {
        // Lazy: a server killed a moment ago may still hold a file open.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// A file that takes every free byte of its filesystem, and gives them back.
pub(crate) struct Ballast {
    path: PathBuf,
}

impl Ballast {
    /// Write until the filesystem is full (large blocks, then small ones, down to the last page).
    pub(crate) fn fill(&self) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .expect("open ballast");
        for block in [1 << 20, 64 << 10, 4 << 10, 512] {
            let chunk = vec![0xa5u8; block];
            while file.write_all(&chunk).is_ok() {}
        }
        // Whatever a partial write left buffered is dropped with the file; the filesystem is full.
    }

    /// Free the space again.
    pub(crate) fn free(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What a fault test saw: every acknowledgement, every refusal, and the checks against the store.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// Ids the server acknowledged (2xx).
    pub acknowledged: BTreeSet<String>,
    /// Refusals by error code (each must be a 503 with a storage code: `storage_full`,
    /// `store_unavailable` or `store_corrupt`).
    pub refused: BTreeMap<String, usize>,
    /// Answers that are neither an acknowledgement nor an allowed refusal.
    pub violations: Vec<String>,
}

impl Ledger {
    /// Record one answer: `ok` is the acknowledging status; an acknowledgement must carry `id`.
    pub(crate) fn answer(&mut self, ok: u16, status: u16, body: &serde_json::Value) {
        if status == ok {
            match body["id"].as_str() {
                Some(id) => {
                    self.acknowledged.insert(id.to_owned());
                }
                None => self.violations.push(format!("{status} without an id: {body}")),
            }
            return;
        }
        let code = body["code"].as_str().unwrap_or("");
        if status == 503 && matches!(code, "storage_full" | "store_unavailable" | "store_corrupt") {
            *self.refused.entry(code.to_owned()).or_insert(0) += 1;
        } else {
            self.violations.push(format!("{status} {body}"));
        }
    }

    /// Merge another task's ledger into this one.
    pub(crate) fn absorb(&mut self, other: Ledger) {
        self.acknowledged.extend(other.acknowledged);
        for (code, n) in other.refused {
            *self.refused.entry(code).or_insert(0) += n;
        }
        self.violations.extend(other.violations);
    }

    pub(crate) fn refused_with(&self, code: &str) -> usize {
        self.refused.get(code).copied().unwrap_or(0)
    }

    /// Wait until every acknowledged id arrived at `receiver` (the id in `header`); every arrival's id,
    /// duplicates included.
    pub(crate) async fn wait_arrivals(
        &self,
        receiver: &super::Receiver,
        header: &str,
        within: Duration,
    ) -> Vec<String> {
        let deadline = Instant::now() + within;
        loop {
            let arrivals: Vec<String> = receiver
                .received()
                .iter()
                .map(|r| r.header(header).to_owned())
                .collect();
            let arrived: BTreeSet<&String> = arrivals.iter().collect();
            let missing = self.acknowledged.iter().filter(|id| !arrived.contains(id)).count();
            if missing == 0 {
                return arrivals;
            }
            assert!(
                Instant::now() < deadline,
                "{missing} of {} acknowledged ids never arrived",
                self.acknowledged.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Fail unless every acknowledged inbox event is stored (through the admin API) and `also` holds on
    /// the stored events ([`inbox_events`]), then wait until every one reached `handler`, then the same
    /// checks after `kill -9` and a restart; every arrival's `herald-inbox-id`.
    pub(crate) async fn assert_inbox_kept(
        &self,
        inbox: &mut super::Herald,
        handler: &super::Receiver,
        also: impl Fn(&BTreeMap<String, Vec<String>>, &str),
    ) -> Vec<String> {
        self.assert_all_stored(&inbox_stored(inbox, &self.acknowledged).await, "through the API");
        also(&inbox_events(inbox).await, "through the API");
        let arrivals = self
            .wait_arrivals(handler, "herald-inbox-id", Duration::from_secs(90))
            .await;
        inbox.kill9();
        inbox.restart().await;
        self.assert_all_stored(
            &inbox_stored(inbox, &self.acknowledged).await,
            "after kill -9 and restart",
        );
        also(&inbox_events(inbox).await, "after kill -9 and restart");
        arrivals
    }

    /// Fail unless every answer was an acknowledgement or an allowed 503, and at least `at_least` were
    /// refused with `code`.
    pub(crate) fn assert_answers(&self, code: &str, at_least: usize) {
        assert!(
            self.violations.is_empty(),
            "answers that are neither an acknowledgement nor a 503: {:?}",
            self.violations
        );
        assert!(self.refused_with(code) >= at_least, "refused: {:?}", self.refused);
    }

    /// Fail unless every acknowledged id is in `stored`.
    pub(crate) fn assert_all_stored(&self, stored: &BTreeSet<String>, when: &str) {
        let lost: Vec<&String> = self.acknowledged.difference(stored).collect();
        assert!(
            lost.is_empty(),
            "{when}: {} of {} acknowledged ids are not stored: {lost:?}",
            lost.len(),
            self.acknowledged.len()
        );
    }
}

/// The signing secret of the fault tests' inbox source `billing`.
const INBOX_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// An inbox configuration with one Standard Webhooks source, `billing`, forwarding to `handler`.
pub(crate) fn inbox_config(handler: &super::Receiver) -> String {
    format!(
        "[[source]]\nname = \"billing\"\nscheme = \"standard-webhooks\"\nsecrets = [\"{INBOX_SECRET}\"]\nforward_to = \"{}\"\n",
        handler.url()
    )
}

/// Post `body` to the inbox's `billing` source as the provider would, signed, with `msg_id` as its
/// `webhook-id` (the inbox's deduplication key).
pub(crate) async fn post_signed(inbox: &super::Herald, msg_id: &str, body: &str) -> (u16, serde_json::Value) {
    let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
    let signature =
        herald_signature::HmacSecret::parse(INBOX_SECRET)
            .expect("secret")
            .sign(msg_id, timestamp, body.as_bytes());
    let timestamp = timestamp.to_string();
    let headers = [
        ("content-type", "application/json"),
        ("webhook-id", msg_id),
        ("webhook-timestamp", timestamp.as_str()),
        ("webhook-signature", signature.as_str()),
    ];
    inbox.post_raw("/in/billing", body.as_bytes(), &headers).await
}

/// One write of the fault tests' producers: its acknowledging status, the status it got and the body.
pub(crate) type Answered = std::pin::Pin<Box<dyn std::future::Future<Output = (u16, u16, serde_json::Value)> + Send>>;

/// The producers' write for the sender: post message `n` of `event_type` to `app`, its payload made by
/// `payload(n)`; a `202` acknowledges it.
pub(crate) fn message_writer(
    herald: std::sync::Arc<super::Herald>,
    app: String,
    event_type: &'static str,
    payload: impl Fn(usize) -> serde_json::Value + Clone + Send + Sync + 'static,
) -> impl Fn(usize) -> Answered + Clone + Send + 'static {
    let path: std::sync::Arc<str> = format!("/app/{app}/msg").into();
    move |n: usize| {
        let (herald, path) = (herald.clone(), path.clone());
        let body = serde_json::json!({"eventType": event_type, "payload": payload(n)});
        Box::pin(async move {
            let (status, body) = herald.call("POST", &path, Some(body)).await;
            (202, status, body)
        })
    }
}

/// Every message id of an app, through the API (all pages).
pub(crate) async fn message_ids(herald: &super::Herald, app: &str) -> BTreeSet<String> {
    herald
        .messages(app)
        .await
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect()
}

/// The inbox events among `ids` that the admin API finds.
pub(crate) async fn inbox_stored(inbox: &super::Herald, ids: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for id in ids {
        let (status, body) = inbox.call("GET", &format!("/inbox/event/{id}/"), None).await;
        match status {
            200 => {
                found.insert(id.clone());
            }
            404 => {}
            other => panic!("GET /inbox/event/{id}/: {other} {body}"),
        }
    }
    found
}

/// Each stored inbox event's provider id (`eventId`, the `webhook-id` it was posted with) and inbox ids.
pub(crate) async fn inbox_events(inbox: &super::Herald) -> BTreeMap<String, Vec<String>> {
    let mut events: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut iterator: Option<String> = None;
    loop {
        let path = match &iterator {
            Some(after) => format!("/inbox/event?limit=250&iterator={after}"),
            None => "/inbox/event?limit=250".to_owned(),
        };
        let page = inbox.get(&path).await;
        for event in page["data"].as_array().map(Vec::as_slice).unwrap_or_default() {
            if let (Some(provider), Some(id)) = (event["eventId"].as_str(), event["id"].as_str()) {
                events.entry(provider.to_owned()).or_default().push(id.to_owned());
            }
        }
        if page["done"].as_bool().unwrap_or(true) {
            return events;
        }
        iterator = page["iterator"].as_str().map(str::to_owned);
    }
}

/// How long a bound on "soon" is (a refusal after a fault starts, a success after it ends, `/health`).
pub(crate) const SOON: Duration = Duration::from_secs(20);

/// A pause of 0..`max_ms` milliseconds, different each time: the fault hits at a random point.
pub(crate) fn random_pause(max_ms: u64) -> Duration {
    Duration::from_millis(rand::random::<u64>() % max_ms.max(1))
}

/// Poll `/health` until it answers `status` (and `database`, if given).
pub(crate) async fn wait_health(server: &super::Herald, status: u16, database: Option<&str>) -> serde_json::Value {
    let deadline = Instant::now() + SOON;
    loop {
        let (got, body) = server.call("GET", "/health", None).await;
        if got == status && database.is_none_or(|d| body["database"] == d) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/health never became {status} {database:?}: {got} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// While a fault lasts: write (numbered from `probe`, recording each answer that is not the refusal)
/// until a write is refused with `503 code`, within [`SOON`]; `between` runs after each write that was
/// not.
pub(crate) async fn refused<F, Fut>(
    write: &F,
    probe: &mut std::ops::RangeFrom<usize>,
    ledger: &mut Ledger,
    code: &str,
    when: &str,
    mut between: impl FnMut(),
) where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = (u16, u16, serde_json::Value)>,
{
    let deadline = Instant::now() + SOON;
    loop {
        let (ok, status, body) = write(probe.next().unwrap_or_default()).await;
        if status == 503 && body["code"] == code {
            return;
        }
        ledger.answer(ok, status, &body);
        assert!(
            Instant::now() < deadline,
            "{when}, yet no write was refused with {code}: {status} {body}"
        );
        between();
    }
}

/// After a fault ended: write (numbered from `probe`, recording each answer) until a write is
/// acknowledged, then wait until `/health` says `ok` — all by itself, within [`SOON`].
pub(crate) async fn resumed<F, Fut>(
    server: &super::Herald,
    write: &F,
    probe: &mut std::ops::RangeFrom<usize>,
    ledger: &mut Ledger,
    when: &str,
) where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = (u16, u16, serde_json::Value)>,
{
    let deadline = Instant::now() + SOON;
    loop {
        let (ok, status, body) = write(probe.next().unwrap_or_default()).await;
        ledger.answer(ok, status, &body);
        if status == ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "writes did not resume {when}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_health(server, 200, Some("ok")).await;
}

/// Producers making requests until told to stop, each recording its answers in its own ledger.
pub(crate) struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Ledger>>,
}

impl Load {
    /// Start `count` producers; each call of `one` makes one request and answers (acknowledging status,
    /// status, body).
    pub(crate) fn start<F, Fut>(count: usize, one: F) -> Self
    where
        F: Fn(usize) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = (u16, u16, serde_json::Value)> + Send,
    {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks = (0..count)
            .map(|p| {
                let stop = stop.clone();
                let one = one.clone();
                tokio::spawn(async move {
                    let mut ledger = Ledger::default();
                    let mut n = p * 1_000_000;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let (ok, status, body) = one(n).await;
                        ledger.answer(ok, status, &body);
                        n += 1;
                    }
                    ledger
                })
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stop the producers and merge their ledgers into `into`.
    pub(crate) async fn finish(self, into: &mut Ledger) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in self.tasks {
            into.absorb(task.await.expect("producer"));
        }
    }
}

/// How often each id arrived at a receiver; the ids that arrived more than once.
pub(crate) fn duplicates(arrivals: &[String]) -> usize {
    let mut seen = BTreeMap::new();
    for id in arrivals {
        *seen.entry(id.as_str()).or_insert(0usize) += 1;
    }
    seen.values().filter(|n| **n > 1).count()
}
