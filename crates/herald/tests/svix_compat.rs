//! Compatibility: the official `svix` SDKs drive a real `herald serve` through every operation they expose.
//!
//! Each SDK generation (Python and JavaScript, the newest 1.x and 2.x, pinned under tests/compat/) runs the
//! suite script of its language against its own Herald. The script finds the operations by introspecting
//! the SDK itself, so a pinned SDK with an operation the suite does not know fails here. `scripts/test`
//! installs the SDKs under `target/` (`HERALD_TEST_SDK_DIR` points elsewhere).
//!
//! Each run also sets `HERALD_SIGNATURE_HEADERS` and the script checks every delivery carries exactly those
//! header sets, each verifying on its own with the SDK's `Webhook`: across a language's two generations
//! the verifier sees `svix-*` alone and, in `both`, `webhook-*` alone and `svix-*` alone (the default
//! `webhook` mode is the Standard Webhooks set the rest of the test suite verifies). Every run also gives
//! one message to four endpoints that choose their own names (`signatureHeaders`: `webhook`, `svix`, `both`,
//! and none, the server's), each delivery verified the same way.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::{Herald, TOKEN};

/// The workspace root (the suite scripts live in its tests/compat/).
fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where `scripts/test` installed the SDKs.
fn sdk_dir() -> PathBuf {
    std::env::var_os("HERALD_TEST_SDK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// Which store the suite's server runs on.
#[derive(Clone, Copy)]
enum Backend {
    /// SQLite, or PostgreSQL for every test when `HERALD_TEST_BACKEND=postgres` (see `Herald::start`).
    Default,
    /// PostgreSQL always (a fresh database named after the test); skipped as the other PostgreSQL tests
    /// are when none is reachable and `HERALD_REQUIRE_POSTGRES` is not set.
    Postgres(&'static str),
}

/// Start the suite's server on `backend`; `None` when PostgreSQL is wanted and not reachable.
async fn start(backend: Backend, signature_headers: &str) -> Option<Herald> {
    let settings = [("HERALD_SIGNATURE_HEADERS", signature_headers)];
    match backend {
        Backend::Default => Some(Herald::start(&settings).await),
        Backend::Postgres(test) => Herald::start_pg(test, &settings).await,
    }
}

/// Run one suite script (`program script`) against a fresh Herald on `backend` that sends the signature
/// headers under `signature_headers` (`webhook`, `svix` or `both`); the script's last line must report
/// success, and every operation it found must have been exercised. `None` when the backend is not there.
async fn run_suite(
    program: PathBuf,
    script: &str,
    sdk_env: (&str, PathBuf),
    signature_headers: &str,
    backend: Backend,
) -> Option<String> {
    assert!(
        program.is_relative() || program.exists(),
        "{} is missing: run scripts/test (it installs the pinned SDKs under target/)",
        program.display()
    );
    let herald = start(backend, signature_headers).await?;
    let base = format!("http://{}", herald.addr);
    let script = workspace().join("tests/compat").join(script);
    let (sdk_key, sdk_value, headers) = (sdk_env.0.to_owned(), sdk_env.1, signature_headers.to_owned());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(&program)
            .arg(script)
            .env("HERALD_URL", base)
            .env("HERALD_TOKEN", TOKEN)
            .env(sdk_key, sdk_value)
            .env("COMPAT_SIGNATURE_HEADERS", headers)
            .output()
            .expect("run the compatibility suite")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the SDK suite failed:\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default().to_owned();
    assert!(last.starts_with("COMPAT OK"), "no success line: {stdout}");
    Some(last)
}

/// The number of operations a `COMPAT OK … : N operations (…)` line reports.
fn operations(line: &str) -> usize {
    line.split(": ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no operation count in {line:?}"))
}

async fn python_generation(generation: u8, version: &str, signature_headers: &str, backend: Backend) {
    let python = sdk_dir().join(format!("svix-python-v{generation}/bin/python"));
    let sdk_env = ("PYTHONDONTWRITEBYTECODE", PathBuf::from("1"));
    let Some(line) = run_suite(python, "svix_sdk_suite.py", sdk_env, signature_headers, backend).await else {
        return;
    };
    assert!(line.contains(&format!("svix-python {version}:")), "{line}");
    // Both generations expose well over a hundred operations; far fewer means the walk found too little.
    assert!(operations(&line) > 100, "{line}");
}

#[tokio::test]
async fn every_operation_of_the_python_sdk_1x_works_or_answers_501() {
    python_generation(1, "1.99.1", "svix", Backend::Default).await;
}

#[tokio::test]
async fn every_operation_of_the_python_sdk_2x_works_or_answers_501() {
    python_generation(2, "2.9.1", "both", Backend::Default).await;
}

// Every generation of each SDK also against PostgreSQL, on every run: every operation (the pollers and
// consumer offsets among them) must behave the same on both stores. These runs send the default `webhook`
// names, so each generation's verifier sees every header mode across its two runs.
#[tokio::test]
async fn every_operation_of_the_python_sdk_2x_works_or_answers_501_on_postgres() {
    let test = "every_operation_of_the_python_sdk_2x_works_or_answers_501_on_postgres";
    python_generation(2, "2.9.1", "webhook", Backend::Postgres(test)).await;
}

#[tokio::test]
async fn every_operation_of_the_python_sdk_1x_works_or_answers_501_on_postgres() {
    let test = "every_operation_of_the_python_sdk_1x_works_or_answers_501_on_postgres";
    python_generation(1, "1.99.1", "webhook", Backend::Postgres(test)).await;
}

async fn javascript_generation(generation: u8, version: &str, signature_headers: &str, backend: Backend) {
    let prefix = sdk_dir().join(format!("svix-javascript-v{generation}"));
    assert!(
        prefix.join("node_modules/svix").is_dir(),
        "{} is missing: run scripts/test (it installs the pinned SDKs under target/)",
        prefix.display()
    );
    let Some(line) = run_suite(
        PathBuf::from("node"),
        "svix_sdk_suite.mjs",
        ("SVIX_SDK_DIR", prefix),
        signature_headers,
        backend,
    )
    .await
    else {
        return;
    };
    assert!(line.contains(&format!("svix-javascript {version}:")), "{line}");
    assert!(operations(&line) > 100, "{line}");
}

#[tokio::test]
async fn every_operation_of_the_javascript_sdk_1x_works_or_answers_501() {
    javascript_generation(1, "1.99.1", "both", Backend::Default).await;
}

#[tokio::test]
async fn every_operation_of_the_javascript_sdk_2x_works_or_answers_501() {
    javascript_generation(2, "2.5.0", "svix", Backend::Default).await;
}

#[tokio::test]
async fn every_operation_of_the_javascript_sdk_2x_works_or_answers_501_on_postgres() {
    let test = "every_operation_of_the_javascript_sdk_2x_works_or_answers_501_on_postgres";
    javascript_generation(2, "2.5.0", "webhook", Backend::Postgres(test)).await;
}

#[tokio::test]
async fn every_operation_of_the_javascript_sdk_1x_works_or_answers_501_on_postgres() {
    let test = "every_operation_of_the_javascript_sdk_1x_works_or_answers_501_on_postgres";
    javascript_generation(1, "1.99.1", "webhook", Backend::Postgres(test)).await;
}

/// docs/svix-compatibility.md lists every operation of the pinned SDKs: its table is exactly what
/// `scripts/svix-operations` reads out of the installed SDKs, so a pinned SDK with another operation (or
/// a status changed in the suites' NOT_OFFERED lists) must be documented before the suite passes.
#[test]
fn the_documented_operation_table_is_the_installed_sdks() {
    let output = Command::new("python3")
        .arg(workspace().join("scripts/svix-operations"))
        .env("HERALD_TEST_SDK_DIR", sdk_dir())
        .output()
        .expect("run scripts/svix-operations");
    assert!(
        output.status.success(),
        "scripts/svix-operations failed (run scripts/test first: it installs the SDKs):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let generated = String::from_utf8_lossy(&output.stdout).into_owned();
    let documented = std::fs::read_to_string(workspace().join("docs/svix-compatibility.md")).expect("read the doc");
    let section = documented
        .split_once("## Every SDK operation")
        .map(|(_, rest)| rest)
        .expect("docs/svix-compatibility.md has its operation table");
    // The table rows and the closing note, each as the script prints them.
    let wanted: Vec<&str> = generated.lines().filter(|line| !line.trim().is_empty()).collect();
    let found: Vec<&str> = section
        .lines()
        .filter(|line| line.starts_with('|') || line.starts_with("Operations without a request"))
        .collect();
    assert!(wanted.len() > 100, "the script listed too little:\n{generated}");
    let missing: Vec<_> = wanted.iter().filter(|line| !found.contains(line)).collect();
    let stale: Vec<_> = found.iter().filter(|line| !wanted.contains(line)).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/svix-compatibility.md's table differs from scripts/svix-operations' output; missing: {missing:#?}\nstale: {stale:#?}"
    );
}
