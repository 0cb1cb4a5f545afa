//! The command line: the generated admin token, the TOML configuration file, `--help`, `verify` and
//! `migrate`.

use crate::common;

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
        "HERALD_DATABASE_TIMEOUT",
        "HERALD_DATABASE_STATEMENT_TIMEOUT",
        "HERALD_SQLITE_CHECK",
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
        sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE indexname = 'delivery_pending_partition'")
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

#[test]
fn help_lists_every_command() {
    let output = herald().arg("--help").output().expect("run");
    let help = String::from_utf8_lossy(&output.stdout);
    for command in [
        "serve",
        "inbox",
        "verify",
        "bench",
        "events",
        "dead",
        "resend",
        "recover",
        "replay-missing",
        "task",
        "migrate",
    ] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(&format!("{command} "))),
            "{command} missing from herald --help:\n{help}"
        );
    }
    assert!(help.contains("--json"), "{help}");
}

#[test]
fn verify_says_when_the_secret_is_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("body.json");
    std::fs::write(&body, b"{}").unwrap();
    for (secret, why) in [
        ("whsec_not base64!", "malformed"),
        ("whsec_c2hvcnQ=", "5 bytes"),
        ("sk_live_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "prefix"),
    ] {
        let output = herald()
            .args([
                "verify",
                "--secret",
                secret,
                "--id",
                "msg_1",
                "--timestamp",
                "1614265330",
            ])
            .args(["--signature", "v1,AAAA", "--ignore-timestamp", "--body"])
            .arg(&body)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{secret} accepted");
        assert!(
            stderr.contains("--secret is malformed") && stderr.contains(why) && stderr.contains("whsec_"),
            "{secret}: {stderr}"
        );
        assert!(
            !stderr.contains("signature rejected"),
            "the secret is checked first: {stderr}"
        );
    }
}

/// Logs written to a pipe or a file carry no terminal colour codes; with `--json` they are JSON lines.
#[test]
fn logs_have_no_colours_off_a_terminal_and_are_json_with_json() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald.toml");
    std::fs::write(&file, "retry_schedule = \"soon\"\n").unwrap();
    for json in [false, true] {
        let mut command = herald();
        if json {
            command.arg("--json");
        }
        let output = command
            .args(["migrate", "--database-url", "mysql://nowhere/db"])
            .env_clear()
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success());
        assert!(!stderr.contains('\u{1b}'), "escape codes on a pipe: {stderr:?}");
        if json {
            let error: serde_json::Value = serde_json::from_str(stderr.trim()).expect("a JSON error");
            assert!(error["error"].as_str().is_some_and(|e| e.contains("mysql")), "{stderr}");
        }
    }
}

#[tokio::test]
async fn a_served_nodes_logs_are_plain_text_on_a_pipe() {
    // The harness pipes the node's standard error to the test; the warning about the generated key is
    // logged at start.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("herald.db");
    let mut child = herald()
        .args(["serve", "--listen", "127.0.0.1:0", "--database-url"])
        .arg(format!("sqlite://{}", db.display()))
        .env_clear()
        .env("HERALD_ADMIN_TOKEN", "t")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("listening on"))),
        "the node started"
    );
    let _ = child.kill();
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("generated the key"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "escape codes on a pipe: {stderr:?}");
}

/// What `herald COMMAND… FLAG` prints (`--help` or `-h`), checked to succeed.
fn help_text(command: &[String], flag: &str) -> String {
    let output = herald().args(command).arg(flag).output().expect("run");
    assert!(output.status.success(), "herald {command:?} {flag} failed");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The subcommands a help text lists, without `help`.
fn commands_in(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|command| *command != "help")
        .map(str::to_owned)
        .collect()
}

/// The subcommands `herald --help` lists.
fn listed_commands() -> Vec<String> {
    commands_in(&help_text(&[], "--help"))
}

/// Every command of the binary, as the words that name it (`[]` for `herald` itself), found by walking
/// the command lists of the help texts down to the commands without subcommands (`bench ingest`, …).
fn every_command() -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut to_visit = vec![Vec::new()];
    while let Some(command) = to_visit.pop() {
        for sub in commands_in(&help_text(&command, "--help")) {
            to_visit.push([command.clone(), vec![sub]].concat());
        }
        found.push(command);
    }
    found
}

#[test]
fn no_help_text_shows_markup() {
    let commands = every_command();
    for expected in [&["serve"][..], &["task"], &["bench", "ingest"], &["bench", "polling"]] {
        assert!(
            commands.iter().any(|command| command == expected),
            "{expected:?} not reached: {commands:?}"
        );
    }
    // Doc comments are written for rustdoc; clap prints them as they are, so Markdown's backticks would
    // show literally in the terminal.
    let mut marked = Vec::new();
    for command in &commands {
        for flag in ["--help", "-h"] {
            let help = help_text(command, flag);
            marked.extend(
                help.lines()
                    .filter(|line| line.contains('`'))
                    .map(|line| format!("herald {} {flag}: {}", command.join(" "), line.trim())),
            );
        }
    }
    assert!(marked.is_empty(), "backticks in help texts:\n{}", marked.join("\n"));
}

#[test]
fn no_help_text_shows_a_password_from_the_environment() {
    let password = "Hunter2-in-env";
    let commands = listed_commands();
    assert!(commands.len() >= 10, "{commands:?}");
    // Every variable any command's help names (so a setting added later is covered without being
    // listed here), each set to a URL with credentials, the password also in its path: whichever of them
    // holds a secret, a URL or a token, its value must not be shown.
    let mut names = std::collections::BTreeSet::new();
    for command in std::iter::once(None).chain(commands.iter().map(Some)) {
        let mut run = herald();
        if let Some(command) = command {
            run.arg(command);
        }
        let help = String::from_utf8_lossy(&run.arg("--help").output().expect("run").stdout).into_owned();
        for piece in help.split("[env: ").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    for expected in [
        "HERALD_DATABASE_URL",
        "HERALD_INBOX_DATABASE_URL",
        "HERALD_RELAY_SOURCE",
        "HERALD_TOKEN",
    ] {
        assert!(
            names.contains(expected),
            "{expected} is not in any help text: {names:?}"
        );
    }
    let value = format!("postgres://herald:{password}@db.example/{password}");
    let env: Vec<(String, String)> = names.iter().map(|name| (name.clone(), value.clone())).collect();
    for command in std::iter::once(None).chain(commands.iter().map(Some)) {
        let mut run = herald();
        run.envs(env.iter().map(|(k, v)| (k, v)));
        if let Some(command) = command {
            run.arg(command);
        }
        let output = run.arg("--help").output().expect("run");
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "herald {command:?} --help failed");
        assert!(
            help.contains("HERALD_") || command.is_none(),
            "herald {command:?} --help: no settings?\n{help}"
        );
        assert!(
            !help.contains(password),
            "herald {command:?} --help shows a secret:\n{help}"
        );
    }
}
