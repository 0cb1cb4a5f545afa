//! `herald serve`: open the store, start the delivery engine, serve the API until a signal arrives.

use std::sync::Arc;

use anyhow::Context;
use base64::Engine as _;
use herald_api::auth::token_digest;
use herald_api::{AppState, Limits};
use herald_core::address::AddressPolicy;
use herald_delivery::{
    ClientConfig, DeliveryClient, Engine, EngineConfig, HostResolver, SystemResolver,
};
use herald_store::SharedStore;

use crate::config::Settings;

/// The store key holding the generated admin token's digest.
const ADMIN_TOKEN_KEY: &str = "admin_token_sha256";

pub async fn run(settings: Settings) -> anyhow::Result<()> {
    init_tracing();
    let store = herald_store::open(&settings.database_url)
        .await
        .with_context(|| format!("opening {}", settings.database_url))?;
    let admin_token_sha256 = admin_token(&store, settings.admin_token.as_deref()).await?;
    if settings.dev {
        tracing::warn!(
            "DEVELOPMENT MODE: http and loopback destinations are allowed. Never run this in production."
        );
    }
    let policy = Arc::new(AddressPolicy::new(
        settings.allow_private_cidrs.clone(),
        settings.allow_http,
    ));
    let resolver: Arc<dyn HostResolver> = Arc::new(
        SystemResolver::new()
            .map_err(anyhow::Error::msg)
            .context("DNS resolver")?,
    );
    let client_config = ClientConfig {
        connect_timeout: settings.connect_timeout,
        total_timeout: settings.request_timeout,
        ..ClientConfig::default()
    };
    let client =
        DeliveryClient::new(client_config, policy.clone(), resolver).context("delivery client")?;
    let engine_config = EngineConfig {
        schedule: settings.retry_schedule.clone(),
        max_in_flight: settings.max_in_flight,
        endpoint_concurrency: settings.endpoint_concurrency,
        ..EngineConfig::default()
    };
    let engine = Engine::start(store.clone(), client, engine_config)
        .await
        .context("starting the delivery engine")?;
    let state = AppState::new(
        store,
        Some(engine),
        policy,
        admin_token_sha256,
        Limits::for_payload(settings.max_payload_bytes),
    );
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("listening on {}", settings.listen))?;
    let local = listener.local_addr()?;
    tracing::info!(address = %local, database = %settings.database_url, "herald is serving");
    println!("herald listening on http://{local}");
    axum::serve(listener, herald_api::make_service(state))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("serving")?;
    Ok(())
}

/// The admin token's digest: from the configuration, or the stored one, or a new one printed once.
async fn admin_token(store: &SharedStore, configured: Option<&str>) -> anyhow::Result<[u8; 32]> {
    if let Some(token) = configured {
        return Ok(token_digest(token));
    }
    if let Some(hex_digest) = store.meta_get(ADMIN_TOKEN_KEY).await? {
        let mut digest = [0u8; 32];
        hex::decode_to_slice(hex_digest.trim(), &mut digest)
            .context("the stored admin token digest is corrupt")?;
        return Ok(digest);
    }
    let random: [u8; 32] = rand::random();
    let token = format!(
        "herald_admin_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random)
    );
    let digest = token_digest(&token);
    store
        .meta_set(ADMIN_TOKEN_KEY, &hex::encode(digest))
        .await?;
    println!("Generated an admin token. It is shown only this once; keep it safe:");
    println!("HERALD_ADMIN_TOKEN={token}");
    Ok(digest)
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
