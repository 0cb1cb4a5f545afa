//! The REST resources behave as Svix clients expect: CRUD by id or uid, PUT as upsert, PATCH semantics,
//! event-type archiving, secret handling.

use crate::common;

use common::Herald;
use serde_json::json;

#[tokio::test]
async fn applications_by_id_or_uid_with_put_upsert_and_patch() {
    let herald = Herald::start(&[]).await;
    let created = herald
        .post(
            "/app",
            json!({"name": "Acme", "uid": "acme", "metadata": {"tier": "gold"}}),
        )
        .await;
    let id = created["id"].as_str().unwrap();
    assert!(id.starts_with("app_"));
    assert_eq!(herald.get("/app/acme").await["id"], id);
    assert_eq!(
        herald.get(&format!("/app/{id}/")).await["uid"],
        "acme",
        "trailing slash accepted"
    );

    let (status, patched) = herald
        .call("PATCH", "/app/acme", Some(json!({"name": "Acme Inc"})))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        (patched["name"].as_str(), patched["metadata"]["tier"].as_str()),
        (Some("Acme Inc"), Some("gold"))
    );

    // PUT on an unknown uid creates it with that uid; on an unknown id-shaped segment it is 404.
    let (status, upserted) = herald.call("PUT", "/app/beta", Some(json!({"name": "Beta"}))).await;
    assert_eq!(status, 201, "{upserted}");
    assert_eq!(upserted["uid"], "beta");
    let (status, again) = herald.call("PUT", "/app/beta", Some(json!({"name": "Beta 2"}))).await;
    assert_eq!((status, again["id"].as_str()), (200, upserted["id"].as_str()));
    let (status, _) = herald
        .call("PUT", "/app/app_0000000000000000000000", Some(json!({"name": "x"})))
        .await;
    assert_eq!(status, 404);

    let list = herald.get("/app?limit=1").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert_eq!(list["done"], false);
    let (status, _) = herald.call("DELETE", "/app/acme", None).await;
    assert_eq!(status, 204);
    assert_eq!(herald.call("GET", "/app/acme", None).await.0, 404);
}

#[tokio::test]
async fn event_types_are_archived_on_delete_unless_expunged() {
    let herald = Herald::start(&[]).await;
    herald
        .post(
            "/event-type",
            json!({"name": "invoice.paid", "description": "An invoice was paid"}),
        )
        .await;
    assert_eq!(herald.call("DELETE", "/event-type/invoice.paid", None).await.0, 204);
    let archived = herald.get("/event-type/invoice.paid").await;
    assert_eq!(archived["archived"], true);
    assert!(
        herald.get("/event-type").await["data"].as_array().unwrap().is_empty(),
        "archived types are hidden"
    );
    assert_eq!(
        herald.get("/event-type?include_archived=true").await["data"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        herald
            .call("DELETE", "/event-type/invoice.paid?expunge=true", None)
            .await
            .0,
        204
    );
    assert_eq!(herald.call("GET", "/event-type/invoice.paid", None).await.0, 404);
}

#[tokio::test]
async fn endpoint_secrets_are_generated_given_or_rotated() {
    let herald = Herald::start(&[]).await;
    let app = herald.app("shop").await;
    let (generated, secret) = herald.endpoint(&app, json!({"url": "https://example.com/a"})).await;
    assert!(secret.starts_with("whsec_"));
    assert!(herald_signature::HmacSecret::parse(&secret).unwrap().len() >= 24);
    let given = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (_, kept) = herald
        .endpoint(&app, json!({"url": "https://example.com/b", "secret": given}))
        .await;
    assert_eq!(kept, given);
    let (status, error) = herald
        .call(
            "POST",
            &format!("/app/{app}/endpoint"),
            Some(json!({"url": "https://example.com/c", "secret": "whsec_c2hvcnQ="})),
        )
        .await;
    assert_eq!(status, 422, "a 5-byte key is too short: {error}");

    let path = format!("/app/{app}/endpoint/{generated}");
    assert_eq!(herald.call("PATCH", &path, Some(json!({"secret": null}))).await.0, 200);
    let rotated = herald.get(&format!("{path}/secret")).await["key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(rotated, secret, "secret: null rotates to a fresh secret");
    assert_eq!(
        herald.call("PATCH", &path, Some(json!({"description": "x"}))).await.0,
        200
    );
    assert_eq!(
        herald.get(&format!("{path}/secret")).await["key"],
        rotated.as_str(),
        "absent keeps it"
    );
    let endpoint = herald.get(&path).await;
    assert!(
        endpoint.get("secret").is_none(),
        "the endpoint object never carries the secret"
    );
}

#[tokio::test]
async fn messages_follow_a_uid_that_moves_to_another_application() {
    let herald = Herald::start(&[]).await;
    let first = herald.post("/app", json!({"name": "First", "uid": "shop"})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let sent = herald
        .post("/app/shop/msg", json!({"eventType": "a.b", "payload": {"n": 1}}))
        .await;
    assert_eq!(
        herald
            .get(&format!("/app/{first}/msg/{}", sent["id"].as_str().unwrap()))
            .await["payload"]["n"],
        1
    );

    assert_eq!(
        herald
            .call("PATCH", "/app/shop", Some(json!({"uid": "old-shop"})))
            .await
            .0,
        200
    );
    let second = herald.post("/app", json!({"name": "Second", "uid": "shop"})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let moved = herald
        .post("/app/shop/msg", json!({"eventType": "a.b", "payload": {"n": 2}}))
        .await;
    let moved_id = moved["id"].as_str().unwrap();
    assert_eq!(
        herald
            .call("GET", &format!("/app/{second}/msg/{moved_id}"), None)
            .await
            .0,
        200
    );
    assert_eq!(
        herald
            .call("GET", &format!("/app/{first}/msg/{moved_id}"), None)
            .await
            .0,
        404,
        "not the old app"
    );

    assert_eq!(herald.call("DELETE", "/app/shop", None).await.0, 204);
    let (status, body) = herald
        .call(
            "POST",
            "/app/shop/msg",
            Some(json!({"eventType": "a.b", "payload": {}})),
        )
        .await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test]
async fn a_repeated_idempotency_key_replays_the_first_create() {
    let herald = Herald::start(&[]).await;
    let post = |path: &'static str, body: serde_json::Value, key: &'static str| herald.post_keyed(path, body, key);
    let (s1, first) = post("/app", json!({"name": "Retried"}), "auto_1").await;
    let (s2, again) = post("/app", json!({"name": "Retried"}), "auto_1").await;
    assert_eq!((s1, s2), (201, 201));
    assert_eq!(first, again, "the retry is answered with the first object");
    let (_, other) = post("/app", json!({"name": "Retried"}), "auto_2").await;
    assert_ne!(other["id"], first["id"], "another key is another request");
    assert_eq!(herald.get("/app").await["data"].as_array().unwrap().len(), 2);

    // A failed request is not remembered: fixing it and retrying with the same key works.
    let (status, _) = post("/event-type", json!({"name": "bad name"}), "auto_3").await;
    assert_eq!(status, 422);
    let (status, created) = post("/event-type", json!({"name": "good.name", "description": ""}), "auto_3").await;
    assert_eq!(status, 201, "{created}");
}

#[tokio::test]
async fn an_idempotency_key_reused_for_another_request_is_refused_even_after_a_delete() {
    let herald = Herald::start(&[]).await;
    let post = |path: String, body: serde_json::Value, key: String| {
        let herald = &herald;
        async move { herald.post_keyed(&path, body, &key).await }
    };
    let refused = |answer: &(u16, serde_json::Value), what: &str| {
        assert_eq!(answer.0, 422, "{what}: {}", answer.1);
        assert!(
            common::names_field(&answer.1, "idempotency-key"),
            "{what}: {}",
            answer.1
        );
    };
    let key = || "reuse-1".to_owned();
    let (status, first) = post("/app".into(), json!({"name": "First"}), key()).await;
    assert_eq!(status, 201, "{first}");
    refused(
        &post("/app".into(), json!({"name": "Second"}), key()).await,
        "another body",
    );
    refused(
        &post("/app?get_if_exists=true".into(), json!({"name": "First"}), key()).await,
        "another query",
    );
    refused(
        &post("/event-type".into(), json!({"name": "a.b", "description": ""}), key()).await,
        "another path",
    );
    // Deleted since: the same request still gets its answer, another one is still refused.
    let id = first["id"].as_str().unwrap();
    assert_eq!(herald.call("DELETE", &format!("/app/{id}"), None).await.0, 204);
    let (status, again) = post("/app".into(), json!({"name": "First"}), key()).await;
    assert_eq!(
        (status, &again),
        (201, &first),
        "a retry after the delete gets the first answer"
    );
    refused(
        &post("/app".into(), json!({"name": "Second"}), key()).await,
        "another body after the delete",
    );
    assert_eq!(
        herald.get("/app").await["data"].as_array().unwrap().len(),
        0,
        "nothing was created"
    );

    // Messages keep their key with the message: the same message is answered, another one refused.
    let app = herald.app("keyed").await;
    let msg = |n: u32| json!({"eventType": "a.b", "payload": {"n": n}});
    let (status, sent) = post(format!("/app/{app}/msg"), msg(1), "msg-key".into()).await;
    assert_eq!(status, 202, "{sent}");
    let (status, retried) = post(format!("/app/{app}/msg"), msg(1), "msg-key".into()).await;
    assert_eq!((status, &retried["id"]), (202, &sent["id"]), "{retried}");
    refused(
        &post(format!("/app/{app}/msg"), msg(2), "msg-key".into()).await,
        "another message",
    );
    let messages = herald.get(&format!("/app/{app}/msg")).await;
    assert_eq!(messages["data"].as_array().unwrap().len(), 1, "{messages}");
    // The key's length is 1 to 256, on every POST.
    for path in ["/app".to_owned(), format!("/app/{app}/msg")] {
        refused(
            &post(path.clone(), msg(3), "k".repeat(257)).await,
            "a 257-character key",
        );
        refused(&post(path.clone(), msg(3), String::new()).await, "an empty key");
        let (status, body) = post(
            path.clone(),
            json!({"name": "x", "eventType": "a.b", "payload": {}}),
            "k".repeat(256),
        )
        .await;
        assert!(
            status == 201 || status == 202,
            "{path} with a 256-character key: {status} {body}"
        );
    }
}
