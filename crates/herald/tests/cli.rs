//! The command line: the generated admin token, the TOML configuration file, `--help`, `verify` and
//! `migrate`.

mod common;

use std::process::Command;

use common::Herald;

fn herald() -> Command {
    Command::new(env!("CARGO_BIN_EXE_herald"))
}

#[tokio::test]
async fn an_admin_token_is_generated_once_printed_once_and_kept() {
    let mut node = Herald::start(&[("HERALD_ADMIN_TOKEN", "")]).await;
    let line = node
        .stdout_lines
        .iter()
        .find_map(|l| l.strip_prefix("HERALD_ADMIN_TOKEN="))
        .expect("token printed")
        .to_owned();
    let auth = format!("Bearer {line}");
    let (status, _) = node.call_with("GET", "/app", None, &[("authorization", &auth)]).await;
    assert_eq!(status, 200, "the printed token works");
    let (status, _) = node.call("GET", "/app", None).await;
    assert_eq!(status, 401, "the harness token is not configured on this node");

    node.kill9();
    node.restart().await;
    assert!(
        !node.stdout_lines.iter().any(|l| l.contains("HERALD_ADMIN_TOKEN=")),
        "printed only at first start"
    );
    let (status, _) = node.call_with("GET", "/app", None, &[("authorization", &auth)]).await;
    assert_eq!(status, 200, "the stored token still works after a restart");
    let stored: Vec<u8> = match &node.database {
        // On PostgreSQL (HERALD_TEST_BACKEND=postgres): everything the node keeps about the token.
        Some(database) => {
            use sqlx::Connection as _;
            let mut conn = sqlx::PgConnection::connect(&database.url).await.expect("connect");
            let values: Vec<String> = sqlx::query_scalar("SELECT key || value FROM meta")
                .fetch_all(&mut conn)
                .await
                .expect("meta");
            values.concat().into_bytes()
        }
        None => std::fs::read(node.db_path()).expect("read db"),
    };
    assert!(
        !stored.windows(line.len()).any(|w| w == line.as_bytes()),
        "the token is not stored in clear"
    );
}

#[test]
fn help_documents_every_setting() {
    let output = herald().args(["serve", "--help"]).output().expect("run");
    let help = String::from_utf8_lossy(&output.stdout);
    for variable in [
        "HERALD_LISTEN",
        "HERALD_DATABASE_URL",
        "HERALD_ADMIN_TOKEN",
        "HERALD_RETRY_SCHEDULE",
        "HERALD_ALLOW_PRIVATE_CIDRS",
        "HERALD_ALLOW_HTTP",
        "HERALD_ALLOW_PORTS",
        "HERALD_PROXY_URL",
        "HERALD_BREAKER_THRESHOLD",
        "HERALD_BREAKER_COOLDOWN",
        "HERALD_BREAKER_MAX_COOLDOWN",
        "HERALD_DISABLE_AFTER",
        "HERALD_MAX_REQUEST_TIMEOUT",
        "HERALD_LEASE_TTL",
        "HERALD_RETENTION",
        "HERALD_CONFIG",
    ] {
        assert!(help.contains(variable), "{variable} missing from --help:\n{help}");
    }
}

#[test]
fn bad_configuration_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald.toml");
    std::fs::write(&file, "retry_schedule = \"soon\"\n").unwrap();
    let output = herald()
        .args(["serve", "--config"])
        .arg(&file)
        .env_remove("HERALD_RETRY_SCHEDULE")
        .current_dir(dir.path())
        .output()
        .expect("run");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("retry_schedule"), "{stderr}");
    assert!(
        !dir.path().join("herald.db").exists(),
        "nothing is created on a bad configuration"
    );
}

#[tokio::test]
async fn the_configuration_file_is_read_and_the_environment_wins() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald.toml");
    std::fs::write(&file, "admin_token = \"from-file\"\nmax_payload_bytes = 100\n").unwrap();
    let file = file.display().to_string();
    // The harness sets HERALD_ADMIN_TOKEN, which wins over the file's admin_token.
    let node = Herald::start(&[("HERALD_CONFIG", file.as_str())]).await;
    let (status, _) = node
        .call_with("GET", "/app", None, &[("authorization", "Bearer from-file")])
        .await;
    assert_eq!(status, 401);
    let app = node.app("config").await;
    let big = serde_json::json!({"eventType": "a.b", "payload": {"pad": "x".repeat(200)}});
    let (status, body) = node.call("POST", &format!("/app/{app}/msg"), Some(big)).await;
    assert_eq!(status, 413, "max_payload_bytes from the file applies: {body}");
}

#[test]
fn verify_checks_a_signature_from_the_command_line() {
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("body.json");
    std::fs::write(&body, br#"{"test": 2432232314}"#).unwrap();
    let run = |signature: &str| {
        herald()
            .args([
                "verify",
                "--secret",
                secret,
                "--id",
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                "--timestamp",
                "1614265330",
            ])
            .args(["--signature", signature, "--ignore-timestamp", "--body"])
            .arg(&body)
            .output()
            .expect("run")
    };
    assert!(run("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=").status.success());
    let rejected = run("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=");
    assert!(!rejected.status.success());
    assert!(String::from_utf8_lossy(&rejected.stderr).contains("signature rejected"));
}

#[tokio::test]
async fn migrate_creates_the_schema_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("migrated.db");
    let output = herald()
        .args(["migrate", "--database-url", &format!("sqlite://{}", path.display())])
        .env_clear()
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(path.exists(), "the SQLite file was created");

    let Some(database) = herald_store::testdb::fresh("migrate_creates_the_schema_and_nothing_else").await else {
        return;
    };
    let output = herald()
        .args(["migrate"])
        .env_clear()
        .env("HERALD_DATABASE_URL", &database.url)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(&database.url).await.unwrap();
    let (partitions, nodes): (i64, i64) =
        sqlx::query_as("SELECT (SELECT COUNT(*) FROM partition_lease), (SELECT COUNT(*) FROM node)")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!((partitions, nodes), (256, 0), "the schema is there and no node joined");
    let pending_index: String =
        sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE indexname = 'delivery_pending'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(pending_index.ends_with("WHERE (status = 0)"), "{pending_index}");
    let _ = conn.close().await;

    let output = herald()
        .args(["migrate", "--database-url", "mysql://nowhere/db"])
        .env_clear()
        .output()
        .unwrap();
    assert!(!output.status.success(), "an unsupported URL is refused");
}
