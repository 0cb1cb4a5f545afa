//! Compatibility: the official `svix` Python SDK (pinned in tests/compat/requirements.txt) drives a real
//! Herald: creates an app, an event type and an endpoint, sends a message and lists its attempts.
//!
//! The SDK must be importable by the interpreter named in `HERALD_TEST_PYTHON` (default `python3`);
//! `scripts/test` installs it into a virtual environment and sets that variable.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use common::{Herald, Receiver, Reply, TOKEN};

fn python() -> String {
    std::env::var("HERALD_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/compat/svix_compat.py")
}

#[tokio::test]
async fn the_official_svix_python_sdk_works_against_herald() {
    let probe = std::process::Command::new(python())
        .args(["-c", "import svix"])
        .output()
        .expect("run python");
    assert!(
        probe.status.success(),
        "the svix Python package is not importable by {}: run scripts/test (it installs tests/compat/requirements.txt)",
        python()
    );
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let base = format!("http://{}", herald.addr);
    let receiver_url = receiver.url();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python())
            .arg(script())
            .env("HERALD_URL", base)
            .env("HERALD_TOKEN", TOKEN)
            .env("RECEIVER_URL", receiver_url)
            .output()
            .expect("run the compat script")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "svix SDK script failed:\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let values: HashMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once('=')).collect();
    let msg_id = values.get("MSG_ID").expect("MSG_ID printed");
    let secret = values.get("ENDPOINT_SECRET").expect("secret printed");
    let payload = values.get("PAYLOAD_JSON").expect("payload printed");

    // What the SDK sent is what the receiver got, signed with the secret the SDK read back.
    let got = receiver.wait_for(1, Duration::from_secs(10)).await;
    let request = got
        .iter()
        .find(|r| r.header("webhook-id") == *msg_id)
        .expect("the SDK's message was delivered");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&request.body).unwrap(),
        serde_json::from_str::<serde_json::Value>(payload).unwrap()
    );
    standardwebhooks::Webhook::new(secret)
        .unwrap()
        .verify(&request.body, &request.headers)
        .expect("signature verifies");
}
