//! Injected I/O and fsync errors at chosen points of a SQLite commit, for the sender and the inbox: an
//! `LD_PRELOAD` shim (`tests/faults/io_fault.c`, compiled here with `cc`) fails `write`/`pwrite`/`fsync`/
//! `fdatasync` on the database or its WAL with `EIO` when the test says so — the first or a later frame
//! write of the next commit, its fsync, or every write and sync while a flag file exists — or with
//! `EROFS`, as every write reports once the kernel has remounted the filesystem read-only after an error
//! (`errors=remount-ro`; a test cannot remount a filesystem read-only while SQLite holds files open for
//! writing: the kernel refuses with EBUSY). Under
//! concurrent load, every acknowledgement is recorded; the server must refuse what it could not commit
//! with 503, report the store failing on `/health` while it fails, take writes again once the fault is
//! lifted (no restart), and hold every acknowledged write — through the API and after `kill -9` and a
//! restart without the shim. `HERALD_FAULT_ROUNDS` sets the rounds of all the scenarios (default 1).

use crate::common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::faults::{self, Ledger, Load, SOON, random_pause, wait_health};
use common::{Herald, Receiver, Reply};
use serde_json::{Value, json};

/// Producers posting at once.
const PRODUCERS: usize = 4;

/// The shim, compiled into a temporary directory, and its control file.
struct Shim {
    dir: tempfile::TempDir,
}

impl Shim {
    /// Compile `tests/faults/io_fault.c` with `cc`; fails the test (rather than passing without its fault)
    /// when there is no C compiler (`.ci/run` installs one).
    fn build() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/faults/io_fault.c");
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(dir.path().join("libio_fault.so"))
            .arg(&source)
            .arg("-ldl")
            .status()
            .expect("run cc (the I/O fault tests need a C compiler)");
        assert!(status.success(), "compiling {} failed: {status}", source.display());
        Self { dir }
    }

    fn control(&self) -> PathBuf {
        self.dir.path().join("control")
    }

    /// The environment that runs a process under the shim.
    fn env(&self) -> [(&'static str, String); 2] {
        [
            (
                "LD_PRELOAD",
                self.dir.path().join("libio_fault.so").display().to_string(),
            ),
            ("HERALD_IO_FAULT", self.control().display().to_string()),
        ]
    }

    /// Fail matching calls from now on (see the shim's header): written whole, then renamed into place,
    /// so the shim never reads half a line and counts from this moment.
    fn arm(&self, fault: &Scenario) {
        let staged = self.dir.path().join("control.new");
        let line = format!(
            "{} {} {} {} {}\n",
            fault.op, fault.target, fault.skip, fault.count, fault.errno
        );
        std::fs::write(&staged, line).expect("write control");
        std::fs::rename(&staged, self.control()).expect("arm the shim");
    }

    fn lift(&self) {
        let _ = std::fs::remove_file(self.control());
    }

    /// How many calls the shim has failed so far.
    fn fired(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("control.fired"))
            .map(|log| log.lines().count())
            .unwrap_or(0)
    }
}

/// One injected fault: which calls fail (the shim's `OP TARGET SKIP COUNT`).
struct Scenario {
    what: &'static str,
    op: &'static str,
    target: &'static str,
    skip: u32,
    /// 0: every matching call while armed (held for a while); otherwise that many, once.
    count: u32,
    /// The error the failed calls report (`EIO` or `EROFS`).
    errno: &'static str,
}

const SCENARIOS: [Scenario; 6] = [
    Scenario {
        what: "the first WAL frame write of the next commit",
        op: "write",
        target: "wal",
        skip: 0,
        count: 1,
        errno: "EIO",
    },
    Scenario {
        what: "a later WAL frame write",
        op: "write",
        target: "wal",
        skip: 3,
        count: 1,
        errno: "EIO",
    },
    Scenario {
        what: "the next commit's WAL fsync",
        op: "sync",
        target: "wal",
        skip: 0,
        count: 1,
        errno: "EIO",
    },
    Scenario {
        what: "every WAL fsync, held",
        op: "sync",
        target: "wal",
        skip: 0,
        count: 0,
        errno: "EIO",
    },
    Scenario {
        what: "every write and sync of the database and its WAL, held",
        op: "any",
        target: "any",
        skip: 0,
        count: 0,
        errno: "EIO",
    },
    Scenario {
        what: "the filesystem remounted read-only: every write fails with EROFS, held",
        op: "write",
        target: "any",
        skip: 0,
        count: 0,
        errno: "EROFS",
    },
];

/// One scenario under load: arm the fault at a random moment, see it hit (and, held, see writes refused
/// and `/health` failing), lift it, see writes succeed again. `write` makes one write and answers
/// (acknowledging status, status, body).
async fn fault_round<F, Fut>(server: &Herald, shim: &Shim, scenario: &Scenario, ledger: &mut Ledger, write: F)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (u16, u16, Value)> + Send,
{
    let load = Load::start(PRODUCERS, write.clone());
    tokio::time::sleep(random_pause(300)).await;
    let fired_before = shim.fired();
    shim.arm(scenario);
    // The checks' own writes, numbered apart from the producers'.
    let mut probe = 900_000_000..;
    let deadline = Instant::now() + SOON;
    if scenario.count == 0 {
        let when = format!("with the fault ({}) armed", scenario.what);
        faults::refused(&write, &mut probe, ledger, "store_unavailable", &when, || {}).await;
        let health = wait_health(server, 503, None).await;
        assert_eq!(health["status"], "unavailable", "{}: {health}", scenario.what);
        tokio::time::sleep(Duration::from_millis(200) + random_pause(500)).await;
    } else {
        while shim.fired() < fired_before + scenario.count as usize {
            assert!(Instant::now() < deadline, "{}: the fault never hit", scenario.what);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(shim.fired() > fired_before, "{}: the fault never hit", scenario.what);
    shim.lift();
    // Lifted: writes succeed again by themselves, no restart.
    let when = format!("once the fault ({}) was lifted", scenario.what);
    faults::resumed(server, &write, &mut probe, ledger, &when).await;
    load.finish(ledger).await;
}

/// Run every scenario `rounds` times; how many calls the shim failed in all.
async fn every_scenario<F, Fut>(server: &Herald, shim: &Shim, rounds: usize, ledger: &mut Ledger, write: F) -> usize
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (u16, u16, Value)> + Send,
{
    for _ in 0..rounds {
        for scenario in &SCENARIOS {
            fault_round(server, shim, scenario, ledger, write.clone()).await;
        }
    }
    ledger.assert_answers("store_unavailable", rounds);
    shim.fired()
}

/// Restart `server` after `kill -9`, without the shim.
async fn kill_and_restart_without_shim(server: &mut Herald) {
    server.kill9();
    server
        .env
        .retain(|(key, _)| key != "LD_PRELOAD" && key != "HERALD_IO_FAULT");
    server.restart().await;
}

fn report(what: &str, rounds: usize, ledger: &Ledger, fired: usize) {
    // The figures docs/reliability.md quotes (visible with `--nocapture`).
    println!(
        "reliability: {what}: rounds={rounds} scenarios={} calls_failed={fired} acknowledged={} refused={} lost=0",
        SCENARIOS.len(),
        ledger.acknowledged.len(),
        ledger.refused_with("store_unavailable"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_with_injected_io_and_fsync_errors_never_acknowledges_what_it_did_not_store() {
    let shim = Shim::build();
    let data = tempfile::tempdir().expect("data dir");
    let url = format!("sqlite://{}", data.path().join("herald.db").display());
    let mut env: Vec<(&str, &str)> = vec![("HERALD_DATABASE_URL", url.as_str())];
    let shim_env = shim.env();
    env.extend(shim_env.iter().map(|(k, v)| (*k, v.as_str())));
    let herald = Arc::new(Herald::start(&env).await);
    let app = herald.app("io-errors").await;

    let write = faults::message_writer(herald.clone(), app.clone(), "io.error", |n| json!({"n": n}));
    let rounds = faults::rounds(1);
    let mut messages = Ledger::default();
    let fired = every_scenario(&herald, &shim, rounds, &mut messages, write).await;

    messages.assert_all_stored(&faults::message_ids(&herald, &app).await, "through the API");
    let mut herald = Arc::try_unwrap(herald).unwrap_or_else(|_| panic!("the producers are done"));
    kill_and_restart_without_shim(&mut herald).await;
    messages.assert_all_stored(
        &faults::message_ids(&herald, &app).await,
        "after kill -9 and a restart without the shim",
    );
    report(
        "sender, SQLite, injected I/O and fsync errors",
        rounds,
        &messages,
        fired,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_with_injected_io_and_fsync_errors_never_acknowledges_what_it_did_not_store() {
    let shim = Shim::build();
    let data = tempfile::tempdir().expect("data dir");
    let url = format!("sqlite://{}", data.path().join("inbox.db").display());
    let handler = Receiver::start(Reply::status(200)).await;
    let mut env: Vec<(&str, &str)> = vec![("HERALD_DATABASE_URL", url.as_str())];
    let shim_env = shim.env();
    env.extend(shim_env.iter().map(|(k, v)| (*k, v.as_str())));
    let inbox = Arc::new(Herald::start_inbox(&faults::inbox_config(&handler), &env, None).await);

    // Every post a new provider id (the producers' numbers start over each round).
    let posted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let write = {
        let inbox = inbox.clone();
        move |n: usize| {
            let inbox = inbox.clone();
            let msg_id = format!("io_{}", posted.fetch_add(1, Ordering::Relaxed));
            async move {
                let body = json!({"type": "invoice.paid", "n": n}).to_string();
                let (status, body) = faults::post_signed(&inbox, &msg_id, &body).await;
                (200, status, body)
            }
        }
    };
    let rounds = faults::rounds(1);
    let mut events = Ledger::default();
    let fired = every_scenario(&inbox, &shim, rounds, &mut events, write).await;

    let mut inbox = Arc::try_unwrap(inbox).unwrap_or_else(|_| panic!("the producers are done"));
    events.assert_all_stored(
        &faults::inbox_stored(&inbox, &events.acknowledged).await,
        "through the API",
    );
    kill_and_restart_without_shim(&mut inbox).await;
    events.assert_all_stored(
        &faults::inbox_stored(&inbox, &events.acknowledged).await,
        "after kill -9 and a restart without the shim",
    );
    report("inbox, SQLite, injected I/O and fsync errors", rounds, &events, fired);
}

/// The retention job's runs that ended `result` (`ok`, `error`) so far, from `/metrics`.
async fn retention_runs(herald: &Herald, result: &str) -> f64 {
    let (status, text) = crate::metrics::scrape(herald.addr, Some(common::TOKEN)).await;
    assert_eq!(status, 200, "{text}");
    crate::metrics::sample(&text, "herald_retention_runs_total", &[("result", result)]).unwrap_or(0.0)
}

/// The retention job while every write of the database fails: its runs fail (counted, the process goes
/// on, nothing is half-deleted), and once the fault is lifted its next run deletes what it could not —
/// no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_fails_its_runs_while_writes_fail_and_catches_up_once_they_do_not() {
    let shim = Shim::build();
    let data = tempfile::tempdir().expect("data dir");
    let url = format!("sqlite://{}", data.path().join("herald.db").display());
    let mut env: Vec<(&str, &str)> = vec![
        ("HERALD_DATABASE_URL", url.as_str()),
        ("HERALD_RETENTION", "2s"),
        ("HERALD_RETENTION_INTERVAL", "200ms"),
    ];
    let shim_env = shim.env();
    env.extend(shim_env.iter().map(|(k, v)| (*k, v.as_str())));
    let mut herald = Herald::start(&env).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("retention").await;
    herald.endpoint(&app, json!({ "url": receiver.url() })).await;
    let msg = herald
        .post(&format!("/app/{app}/msg"), json!({"eventType": "t", "payload": {}}))
        .await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    herald
        .wait_attempts(&app, &msg, SOON, |attempts| attempts.len() == 1)
        .await;
    // Every write fails from now on, before the attempt is old enough (2 s) for retention to delete it.
    shim.arm(&SCENARIOS[4]);
    let failed_before = retention_runs(&herald, "error").await;
    let deadline = Instant::now() + SOON;
    while retention_runs(&herald, "error").await <= failed_before {
        assert!(
            Instant::now() < deadline,
            "no retention run failed while every write did"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(shim.fired() > 0, "the retention runs' writes never hit the fault");
    assert_eq!(
        herald.attempts(&app, &msg).await.len(),
        1,
        "the attempt is kept while writes fail"
    );
    assert!(herald.is_running(), "a failing retention run stopped the server");
    shim.lift();
    // Lifted: the next runs delete the old attempt, by themselves.
    let ok_before = retention_runs(&herald, "ok").await;
    herald
        .wait_attempts(&app, &msg, SOON, |attempts| attempts.is_empty())
        .await;
    // The run that deleted it counts itself once its pass is over, a moment after the deletion shows.
    let deadline = Instant::now() + SOON;
    while retention_runs(&herald, "ok").await <= ok_before {
        assert!(Instant::now() < deadline, "no retention run succeeded since");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(herald.get(&format!("/app/{app}/msg/{msg}")).await["id"], msg.as_str());
}
