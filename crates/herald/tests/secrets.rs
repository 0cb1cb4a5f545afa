//! Endpoint secrets end to end, through the real binary and real receivers: rotation with a grace period,
//! immediate revocation, Ed25519 (`v1a`) endpoints, custom headers, and secrets encrypted at rest.

use crate::common;

use std::time::{Duration, Instant};

use common::{Herald, Received, Receiver, Reply};
use herald_signature::{Ed25519PublicKey, HmacSecret, Verifier, VerifyKey};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(15);

/// The Ed25519 vector of `tests/vectors/signatures.json`.
fn ed25519_vector() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/signatures.json");
    let text = std::fs::read_to_string(path).expect("signature vectors");
    let all: Value = serde_json::from_str(&text).expect("vectors are JSON");
    all["standard_webhooks_v1a"][0].clone()
}

/// Publish one message to the app and wait for the receiver's `n`-th request; returns that request.
async fn deliver(herald: &Herald, app: &str, receiver: &Receiver, n: usize) -> Received {
    herald
        .post(
            &format!("/app/{app}/msg"),
            json!({ "eventType": "invoice.paid", "payload": { "n": n } }),
        )
        .await;
    receiver.wait_for(n, WAIT).await[n - 1].clone()
}

/// Whether `request` verifies against exactly these keys (Herald's own verifier, clock tolerance on).
fn verifies(request: &Received, keys: Vec<VerifyKey>) -> bool {
    Verifier::new(keys)
        .verify_now(
            request.header("webhook-id"),
            request.header("webhook-timestamp"),
            request.header("webhook-signature"),
            &request.body,
        )
        .is_ok()
}

fn hmac(secret: &str) -> Vec<VerifyKey> {
    vec![HmacSecret::parse(secret).expect("whsec_ secret").into()]
}

/// Independent check of a `v1a` entry with ring over `{id}.{timestamp}.{body}`.
fn ring_verifies(request: &Received, whpk: &str) -> bool {
    let public = Ed25519PublicKey::parse(whpk).expect("whpk_ key").to_bytes();
    let mut content = format!(
        "{}.{}.",
        request.header("webhook-id"),
        request.header("webhook-timestamp")
    )
    .into_bytes();
    content.extend_from_slice(&request.body);
    let verifier = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public);
    request.header("webhook-signature").split(' ').any(|entry| {
        entry
            .strip_prefix("v1a,")
            .and_then(|b64| base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64).ok())
            .is_some_and(|signature| verifier.verify(&content, &signature).is_ok())
    })
}

async fn secret_of(herald: &Herald, app: &str, endpoint: &str) -> Value {
    herald.get(&format!("/app/{app}/endpoint/{endpoint}/secret")).await
}

#[tokio::test]
async fn rotation_signs_with_both_keys_during_the_grace_period_then_only_the_new_one() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(204)).await;
    let app = herald.app("rotation").await;
    let (endpoint, old) = herald.endpoint(&app, json!({ "url": receiver.url() })).await;

    let first = deliver(&herald, &app, &receiver, 1).await;
    assert!(verifies(&first, hmac(&old)), "the receiver verifies with the old key");

    let (status, body) = herald
        .call(
            "POST",
            &format!("/app/{app}/endpoint/{endpoint}/secret/rotate"),
            Some(json!({ "gracePeriodSeconds": 2 })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Herald read its clock before answering: the grace period is over by this instant + 2 s.
    let rotated_by = Instant::now();
    let new = secret_of(&herald, &app, &endpoint).await["key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(body["key"], new, "the rotation answers the new key");
    assert_ne!(new, old);
    assert!(new.starts_with("whsec_"));

    // During the grace period both keys sign: a receiver on either key accepts.
    let during = deliver(&herald, &app, &receiver, 2).await;
    assert_eq!(during.header("webhook-signature").split(' ').count(), 2);
    assert!(
        verifies(&during, hmac(&old)),
        "the old key still verifies during the grace period"
    );
    assert!(verifies(&during, hmac(&new)), "the new key verifies");
    standardwebhooks::Webhook::new(&new)
        .unwrap()
        .verify(&during.body, &during.headers)
        .expect("an independent verifier accepts the new key");

    // After it, only the new key signs.
    let grace_end = rotated_by + Duration::from_millis(2_200);
    tokio::time::sleep(grace_end.saturating_duration_since(Instant::now())).await;
    let after = deliver(&herald, &app, &receiver, 3).await;
    assert!(verifies(&after, hmac(&new)));
    assert!(
        !verifies(&after, hmac(&old)),
        "the old key fails after the grace period"
    );
    assert_eq!(after.header("webhook-signature").split(' ').count(), 1);

    // The grace period is bounded and must be a non-negative integer.
    for bad in [
        json!({ "gracePeriodSeconds": -1 }),
        json!({ "gracePeriodSeconds": 99_999_999 }),
    ] {
        let (status, body) = herald
            .call(
                "POST",
                &format!("/app/{app}/endpoint/{endpoint}/secret/rotate"),
                Some(bad),
            )
            .await;
        assert_eq!(status, 422, "{body}");
        assert!(common::names_field(&body, "gracePeriodSeconds"), "{body}");
    }
}

#[tokio::test]
async fn a_rotation_without_grace_revokes_the_old_key_at_once() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("revoke").await;
    let (endpoint, old) = herald.endpoint(&app, json!({ "url": receiver.url() })).await;
    let chosen = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    let (status, body) = herald
        .call(
            "POST",
            &format!("/app/{app}/endpoint/{endpoint}/secret/rotate"),
            Some(json!({ "key": chosen, "gracePeriodSeconds": 0 })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(secret_of(&herald, &app, &endpoint).await["key"], chosen);

    let request = deliver(&herald, &app, &receiver, 1).await;
    assert!(verifies(&request, hmac(chosen)));
    assert!(!verifies(&request, hmac(&old)), "a revoked key never signs again");
    assert_eq!(request.header("webhook-signature").split(' ').count(), 1);

    // A key that is not a signing key is refused, naming the field.
    let (status, body) = herald
        .call(
            "POST",
            &format!("/app/{app}/endpoint/{endpoint}/secret/rotate"),
            Some(json!({ "key": "whpk_ebVWLo/mVPlAeLES6KmLp5AfhTrmlb7X4OORC60ElmQ=" })),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(common::names_field(&body, "key"), "{body}");
}

#[tokio::test]
async fn ed25519_endpoints_sign_v1a_and_expose_their_public_key() {
    let vector = ed25519_vector();
    let (whsk, whpk) = (
        vector["secret_key"].as_str().unwrap(),
        vector["public_key"].as_str().unwrap(),
    );
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("ed25519").await;

    // With the vector's key: deliveries verify with the vector's public key, independently of Herald.
    let (endpoint, key) = herald
        .endpoint(&app, json!({ "url": receiver.url(), "secret": whsk }))
        .await;
    assert_eq!(key, whsk);
    assert_eq!(secret_of(&herald, &app, &endpoint).await["publicKey"], whpk);
    let shown = herald.get(&format!("/app/{app}/endpoint/{endpoint}")).await;
    assert_eq!(
        (&shown["signatureType"], &shown["publicKey"]),
        (&json!("ed25519"), &json!(whpk))
    );
    let request = deliver(&herald, &app, &receiver, 1).await;
    assert!(request.header("webhook-signature").starts_with("v1a,"));
    assert!(ring_verifies(&request, whpk), "ring verifies the v1a signature");
    assert!(verifies(&request, vec![Ed25519PublicKey::parse(whpk).unwrap().into()]));
    let mut tampered = request.clone();
    tampered.body = axum::body::Bytes::from_static(b"{\"n\":2}");
    assert!(!ring_verifies(&tampered, whpk), "the check is not vacuous");
    herald
        .call("DELETE", &format!("/app/{app}/endpoint/{endpoint}"), None)
        .await;

    // Generated: `signatureType: ed25519` makes a fresh key pair.
    let ep = herald
        .post(
            &format!("/app/{app}/endpoint"),
            json!({ "url": receiver.url(), "signatureType": "ed25519" }),
        )
        .await;
    let generated = secret_of(&herald, &app, ep["id"].as_str().unwrap()).await;
    assert!(generated["key"].as_str().unwrap().starts_with("whsk_"));
    let public = generated["publicKey"].as_str().unwrap();
    assert_eq!(ep["publicKey"], public);
    let request = deliver(&herald, &app, &receiver, 2).await;
    assert!(ring_verifies(&request, public));
    assert!(!ring_verifies(&request, whpk), "a fresh key, not the vector's");

    // A kind that contradicts the secret is refused.
    let (status, body) = herald
        .call(
            "POST",
            &format!("/app/{app}/endpoint"),
            Some(json!({ "url": receiver.url(), "secret": whsk, "signatureType": "hmac" })),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(common::names_field(&body, "signatureType"), "{body}");
}

#[tokio::test]
async fn custom_headers_arrive_on_every_attempt_and_never_override_the_signature() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("headers").await;
    let (endpoint, secret) = herald
        .endpoint(
            &app,
            json!({ "url": receiver.url(), "headers": { "X-Tenant": "acme", "Authorization": "Bearer abc" } }),
        )
        .await;
    let first = deliver(&herald, &app, &receiver, 1).await;
    assert_eq!(first.header("x-tenant"), "acme");
    assert_eq!(first.header("authorization"), "Bearer abc");
    assert!(verifies(&first, hmac(&secret)));

    let path = format!("/app/{app}/endpoint/{endpoint}/headers");
    for (method, name) in [
        ("PUT", "webhook-signature"),
        ("PUT", "Webhook-Id"),
        ("PATCH", "webhook-timestamp"),
        ("PUT", "svix-signature"),
        ("PATCH", "Svix-Id"),
        ("PUT", "content-type"),
        ("PATCH", "host"),
        ("PUT", "user-agent"),
        ("PUT", "transfer-encoding"),
    ] {
        let (status, body) = herald
            .call(method, &path, Some(json!({ "headers": { name: "forged" } })))
            .await;
        assert_eq!(status, 422, "{method} {name}: {body}");
        let field = format!("headers.{}", name.to_ascii_lowercase());
        assert!(common::names_field(&body, &field), "{body}");
    }
    let (status, body) = herald
        .call(
            "POST",
            &format!("/app/{app}/endpoint"),
            Some(json!({ "url": receiver.url(), "headers": { "webhook-signature": "v1,forged" } })),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let (status, _) = herald
        .call("PUT", &path, Some(json!({ "headers": { "x-bad": "line\r\nbreak" } })))
        .await;
    assert_eq!(status, 422);

    // PATCH merges: a value sets, null removes (names match in any case); credentials are listed as
    // sensitive, not shown; names come back as they were spelled.
    let (status, body) = herald
        .call(
            "PATCH",
            &path,
            Some(json!({ "headers": { "x-tenant": null, "x-region": "eu" } })),
        )
        .await;
    assert_eq!(status, 204, "{body}");
    let shown = herald.get(&path).await;
    assert_eq!(
        shown,
        json!({ "headers": { "x-region": "eu" }, "sensitive": ["Authorization"] })
    );
    let second = deliver(&herald, &app, &receiver, 2).await;
    assert_eq!(second.header("x-region"), "eu");
    assert!(second.headers.get("x-tenant").is_none());
    assert_eq!(second.headers.get_all("webhook-signature").iter().count(), 1);
    assert!(verifies(&second, hmac(&secret)));

    // PUT replaces the whole set.
    let (status, _) = herald
        .call("PUT", &path, Some(json!({ "headers": { "x-only": "1" } })))
        .await;
    assert_eq!(status, 204);
    assert_eq!(
        herald.get(&path).await,
        json!({ "headers": { "x-only": "1" }, "sensitive": [] })
    );
    let third = deliver(&herald, &app, &receiver, 3).await;
    assert_eq!(third.header("x-only"), "1");
    assert!(third.headers.get("authorization").is_none() && third.headers.get("x-region").is_none());
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Everything stored about endpoints: the SQLite file and its write-ahead log, or on PostgreSQL
/// (HERALD_TEST_BACKEND=postgres) every endpoint row and rotated-away key, of which there must be `rows`.
async fn stored_bytes(herald: &Herald, rows: usize) -> Vec<u8> {
    match &herald.database {
        Some(database) => {
            use sqlx::Connection as _;
            let mut conn = sqlx::PgConnection::connect(&database.url).await.expect("connect");
            let values: Vec<String> = sqlx::query_scalar(
                "SELECT e::text FROM endpoint e UNION ALL SELECT s::text FROM endpoint_secret s \
                 UNION ALL SELECT a::text FROM attempt a",
            )
            .fetch_all(&mut conn)
            .await
            .expect("rows");
            assert!(
                values.len() >= rows,
                "at least {rows} endpoint rows and keys, got {values:?}"
            );
            values.concat().into_bytes()
        }
        None => {
            let mut bytes = std::fs::read(herald.db_path()).expect("database file");
            bytes.extend(std::fs::read(herald.db_path().with_extension("db-wal")).unwrap_or_default());
            assert!(bytes.len() > 4096, "read the database");
            bytes
        }
    }
}

#[tokio::test]
async fn basic_auth_in_an_endpoint_url_is_sealed_and_never_shown() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("basic-auth").await;
    let password = "pa55-w0rd-Kq7Zr";
    let with_credentials =
        |user: &str, password: &str| receiver.url().replace("http://", &format!("http://{user}:{password}@"));
    let expected = |user: &str, password: &str| {
        let pair = format!("{user}:{password}");
        format!(
            "Basic {}",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pair)
        )
    };
    let created = herald
        .post(
            &format!("/app/{app}/endpoint"),
            json!({ "url": with_credentials("al%40ice", password) }),
        )
        .await;
    assert_eq!(
        created["url"],
        receiver.url(),
        "the URL is answered without its credentials: {created}"
    );
    let ep = created["id"].as_str().unwrap().to_owned();
    let headers = herald.get(&format!("/app/{app}/endpoint/{ep}/headers")).await;
    assert_eq!(headers["sensitive"], json!(["Authorization"]), "{headers}");
    // The receiver gets the credentials as the client that sent the userinfo would have sent them.
    let request = deliver(&herald, &app, &receiver, 1).await;
    assert_eq!(request.header("authorization"), expected("al@ice", password));
    // Nowhere in clear: endpoint, listing, attempts, headers, the database, the log.
    let answers = [
        herald.get(&format!("/app/{app}/endpoint/{ep}")).await,
        herald.get(&format!("/app/{app}/endpoint")).await,
        herald.get(&format!("/app/{app}/attempt/endpoint/{ep}")).await,
        headers,
    ];
    let b64 = expected("al@ice", password).replace("Basic ", "");
    for answer in &answers {
        let text = answer.to_string();
        assert!(!text.contains(password) && !text.contains(&b64), "{text}");
    }
    let bytes = stored_bytes(&herald, 1).await;
    assert!(
        !contains(&bytes, password.as_bytes()),
        "the password is in the database in clear"
    );
    assert!(
        !contains(&bytes, b64.as_bytes()),
        "the encoded credentials are in the database in clear"
    );
    assert!(!herald.stdout_lines.iter().any(|line| line.contains(password)));
    // New credentials in a new URL replace the old ones; the header and the URL cannot both give them.
    let patched = herald
        .call(
            "PATCH",
            &format!("/app/{app}/endpoint/{ep}"),
            Some(json!({ "url": with_credentials("bob", "n3w-Secret") })),
        )
        .await;
    assert_eq!(patched.0, 200, "{}", patched.1);
    assert_eq!(patched.1["url"], receiver.url());
    let request = deliver(&herald, &app, &receiver, 2).await;
    assert_eq!(request.header("authorization"), expected("bob", "n3w-Secret"));
    let (status, body) = herald
        .call(
            "POST",
            &format!("/app/{app}/endpoint"),
            Some(json!({ "url": with_credentials("u", "p"), "headers": { "Authorization": "Bearer x" } })),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(common::names_field(&body, "url"), "{body}");
}

#[tokio::test]
async fn secrets_are_not_findable_in_plain_text_in_the_database_file() {
    let mut herald = Herald::start(&[]).await;
    let app = herald.app("at-rest").await;
    let hmac_key = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let rotated_key = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    let ed_key = ed25519_vector()["secret_key"].as_str().unwrap().to_owned();
    let header_secret = "Bearer s3cr3t-header-value";
    let (ep, _) = herald
        .endpoint(
            &app,
            json!({ "url": "http://127.0.0.1:9/a", "secret": hmac_key, "headers": { "authorization": header_secret } }),
        )
        .await;
    herald
        .endpoint(&app, json!({ "url": "http://127.0.0.1:9/b", "secret": ed_key }))
        .await;
    // The replaced key stays stored (it signs during the grace period): encrypted too.
    let (status, _) = herald
        .call(
            "POST",
            &format!("/app/{app}/endpoint/{ep}/secret/rotate"),
            Some(json!({ "key": rotated_key })),
        )
        .await;
    assert_eq!(status, 200);

    let bytes = stored_bytes(&herald, 3).await;
    for secret in [hmac_key, rotated_key, ed_key.as_str()] {
        let b64 = secret.split_once('_').unwrap().1;
        let raw = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64).unwrap();
        assert!(
            !contains(&bytes, b64.as_bytes()),
            "{b64} is in the database file in plain text"
        );
        assert!(
            !contains(&bytes, &raw[..24]),
            "the key bytes of {secret} are in the database file"
        );
    }
    assert!(!contains(&bytes, header_secret.as_bytes()));

    // The generated key lives beside the database, not in it, and is read again at restart (PostgreSQL:
    // the key is configured).
    let database_url = match &herald.database {
        Some(database) => database.url.clone(),
        None => {
            let key_file = herald.dir.path().join("herald.db.key");
            let key = std::fs::read_to_string(&key_file).expect("key file");
            assert!(!contains(&bytes, key.trim().as_bytes()));
            format!("sqlite://{}", herald.db_path().display())
        }
    };
    herald.kill9();

    // The wrong key is refused at start, loudly, instead of signing with garbage.
    let wrong = std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .arg("serve")
        .current_dir(herald.dir.path())
        .env_clear()
        .env("HERALD_LISTEN", "127.0.0.1:0")
        .env("HERALD_ADMIN_TOKEN", common::TOKEN)
        .env("HERALD_DATABASE_URL", &database_url)
        .env("HERALD_SECRET_KEY", "CQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=")
        .output()
        .expect("run herald");
    assert!(!wrong.status.success());
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(stderr.contains("secret key"), "{stderr}");

    herald.restart().await;
    assert_eq!(secret_of(&herald, &app, &ep).await["key"], rotated_key);
}

/// The engine reads the records of endpoints it meets together (one loader, many endpoints per read): an
/// endpoint whose sealed secret does not open — here the row holds another endpoint's sealed secret, as a
/// bad copy between rows might leave it — must hold up no other endpoint, while it alone is retried.
#[tokio::test]
async fn an_endpoint_whose_secret_does_not_open_holds_up_no_other() {
    use sqlx::Connection as _;
    let herald = Herald::start_sqlite(&[]).await;
    let healthy = Receiver::start(Reply::status(204)).await;
    let damaged = Receiver::start(Reply::status(204)).await;
    let app = herald.app("damaged-secret").await;
    let (healthy_id, _) = herald.endpoint(&app, json!({ "url": healthy.url() })).await;
    let (damaged_id, _) = herald.endpoint(&app, json!({ "url": damaged.url() })).await;
    {
        let url = format!("sqlite://{}", herald.db_path().display());
        let mut conn = sqlx::SqliteConnection::connect(&url).await.expect("open the database");
        let changed =
            sqlx::query("UPDATE endpoint SET secret = (SELECT secret FROM endpoint WHERE id = ?) WHERE id = ?")
                .bind(&healthy_id)
                .bind(&damaged_id)
                .execute(&mut conn)
                .await
                .expect("copy the sealed secret")
                .rows_affected();
        assert_eq!(changed, 1);
    }

    // Both endpoints are met by the same message, so their records are asked for together.
    for n in 1..=3 {
        herald
            .post(
                &format!("/app/{app}/msg"),
                json!({ "eventType": "invoice.paid", "payload": { "n": n } }),
            )
            .await;
    }
    let arrived = healthy.wait_for(3, WAIT).await;
    assert_eq!(arrived.len(), 3, "the healthy endpoint gets every message");
    assert!(
        damaged.received().is_empty(),
        "nothing is sent to an endpoint whose key cannot be read"
    );
}
