//! `herald serve`: run a node until SIGINT or SIGTERM.

use herald_server::{Node, Settings};

use crate::inbox::EmbeddedInbox;

pub async fn run(settings: Settings, inbox: Option<EmbeddedInbox>) -> anyhow::Result<()> {
    init_tracing();
    if settings.dev {
        // Printed as well as logged: a log filter (RUST_LOG=error) must not be able to hide that the SSRF
        // protection is relaxed.
        eprintln!(
            "WARNING: DEVELOPMENT MODE (--dev): plain http and loopback destinations (127.0.0.0/8, ::1) are \
             allowed. Never run this in production."
        );
        tracing::warn!("DEVELOPMENT MODE: http and loopback destinations are allowed. Never run this in production.");
    }
    let inbox = match inbox {
        Some(embedded) => Some(embedded.start().await?),
        None => None,
    };
    // The inbox shares the listener and the admin token (its routes: /in/… and /api/v1/inbox/…).
    let node = Node::start_with(&settings, |admin| inbox.as_ref().map(|i| i.routes(Some(*admin)))).await?;
    if let Some(token) = &node.generated_admin_token {
        println!("Generated an admin token. It is shown only this once; keep it safe:");
        println!("HERALD_ADMIN_TOKEN={token}");
    }
    tracing::info!(address = %node.addr, database = %herald_server::redact(&settings.database_url), "herald is serving");
    println!("herald listening on http://{}", node.addr);
    let served = node.run_until(shutdown_signal()).await;
    if let Some(inbox) = inbox {
        inbox.shutdown().await;
    }
    served
}

pub(crate) fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub(crate) async fn shutdown_signal() {
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
