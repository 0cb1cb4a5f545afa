//! PostgreSQL on a database whose default collation is linguistic (as on a server initialised with
//! `en_US.UTF-8`): ids must still sort byte by byte, because listings page by them and the reconciliation
//! listing promises that a message created after a page was read sorts after it.

use std::collections::BTreeMap;

use herald_core::id::AppId;
use herald_core::model::Application;
use herald_store::{AppFilter, PageRequest, SecretCipher, StoreOptions};
use sqlx::Row;

use crate::store::at;

/// An application id ending in `tail` (zeros before it).
fn id(tail: &str) -> AppId {
    AppId::parse(&format!("app_{tail:0>22}")).unwrap()
}

fn app(tail: &str) -> Application {
    Application {
        id: id(tail),
        uid: None,
        name: "shop".into(),
        rate_limit: None,
        verify_endpoints: false,
        payload_retention_days: None,
        metadata: BTreeMap::new(),
        created_at: at(1),
        updated_at: at(1),
    }
}

#[tokio::test]
async fn ids_sort_byte_by_byte_under_a_linguistic_default_collation() {
    let Some(database) = herald_store::testdb::fresh_linguistic("the collation test").await else {
        return;
    };
    let store = herald_store::open_with(
        &database.url,
        SecretCipher::from_key(&[7; 32]),
        &StoreOptions::default(),
    )
    .await
    .unwrap();
    // Byte order puts "B" (0x42) before "a" (0x61); en-US puts "a" first.
    for tail in ["2a", "2B", "2C"] {
        store.create_app(&app(tail)).await.unwrap();
    }
    let page = |after: Option<&str>| PageRequest {
        limit: 1,
        after: after.map(str::to_owned),
        reverse: false,
    };
    let first = store.list_apps(&page(None), &AppFilter::default()).await.unwrap();
    let ids: Vec<&str> = first.items.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(
        ids,
        [id("2B").as_str()],
        "byte order, not the database's linguistic order"
    );
    let rest = store
        .list_apps(&page(Some(&id("2B"))), &AppFilter::default())
        .await
        .unwrap();
    assert_eq!(rest.items[0].id, id("2C"));
    let last = store
        .list_apps(&page(Some(&id("2C"))), &AppFilter::default())
        .await
        .unwrap();
    assert_eq!(last.items[0].id, id("2a"));

    // Every text column of the sender's tables says so (a later migration must not add one that does not:
    // comparing columns of two collations is an error in PostgreSQL).
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&database.url)
        .await
        .unwrap();
    let linguistic: Vec<String> = sqlx::query(
        "SELECT c.relname || '.' || a.attname AS col FROM pg_attribute a \
         JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname NOT LIKE '\\_%' \
         AND c.relname NOT LIKE 'inbox\\_%' AND a.attnum > 0 AND NOT a.attisdropped \
         AND a.atttypid = 'text'::regtype AND a.attcollation <> 'pg_catalog.\"C\"'::regcollation \
         ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .iter()
    .map(|row| row.get("col"))
    .collect();
    assert!(
        linguistic.is_empty(),
        "text columns without COLLATE \"C\": {linguistic:?}"
    );
}
