//! A store on a loopback PostgreSQL connects without TLS unless its URL chooses a mode
//! (`herald_sql::loopback`): TLS on loopback guards nothing and costs both ends CPU on every row.

use herald_store::{SecretCipher, StoreOptions};
use sqlx::{Connection as _, PgConnection};

/// Whether the server offers TLS at all (Debian's packaged server does, with its snake-oil certificate).
async fn offers_tls(url: &str) -> bool {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&mut conn)
        .await
        .expect("SHOW ssl");
    ssl == "on"
}

/// Whether the session of `conn` is encrypted, as the server sees it.
async fn encrypted(conn: &mut PgConnection) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(conn)
        .await
        .expect("pg_stat_ssl")
}

#[tokio::test]
async fn a_store_on_loopback_connects_in_plain_unless_its_url_chooses_a_mode() {
    let Some(database) = herald_store::testdb::fresh("a_store_on_loopback_connects_in_plain…").await else {
        return;
    };
    let host = url::Url::parse(&database.url).expect("URL");
    let loopback = matches!(host.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
    assert!(loopback, "the test server is expected on loopback: {}", database.url);
    let _store = herald_store::open_with(
        &database.url,
        SecretCipher::from_key(&[7; 32]),
        &StoreOptions::default(),
    )
    .await
    .expect("open");
    let mut watcher = PgConnection::connect(&database.url).await.expect("connect");
    let (plain, tls): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE NOT s.ssl), count(*) FILTER (WHERE s.ssl)
         FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE a.application_name = 'herald' AND a.datname = current_database()",
    )
    .fetch_one(&mut watcher)
    .await
    .expect("the store's sessions");
    assert!(plain > 0, "the store holds connections");
    assert_eq!(tls, 0, "no TLS on loopback by default");

    // A mode in the URL is used as given.
    let separator = if database.url.contains('?') { '&' } else { '?' };
    let disabled = format!("{}{separator}sslmode=disable", database.url);
    let options = herald_sql::loopback::connect_options(&disabled).expect("options");
    assert!(!encrypted(&mut PgConnection::connect_with(&options).await.expect("connect")).await);
    if offers_tls(&database.url).await {
        let required = format!("{}{separator}sslmode=require", database.url);
        let options = herald_sql::loopback::connect_options(&required).expect("options");
        let mut conn = PgConnection::connect_with(&options).await.expect("connect with TLS");
        assert!(encrypted(&mut conn).await, "sslmode=require is kept on loopback");
    }
}
