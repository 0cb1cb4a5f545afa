//! `herald serve`: run a node until SIGINT or SIGTERM.

use herald_server::{Node, Settings};
use herald_telemetry::{LogFormat, Telemetry};

use crate::inbox::EmbeddedInbox;
use crate::process::shutdown_signal;

pub(crate) async fn run(settings: Settings, inbox: Option<EmbeddedInbox>, json: bool) -> anyhow::Result<()> {
    // First: the embedded inbox registers its series before the node starts.
    herald_telemetry::registry::install();
    // The OTLP exporter's client (reqwest, built without a TLS provider of its own) needs one even for an
    // http:// collector.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let format = if json { LogFormat::Json } else { settings.log_format };
    let telemetry = Telemetry::init(format, settings.trace_export.as_ref())?;
    if let Some(export) = &settings.trace_export {
        tracing::info!(endpoint = %export.endpoint, "sending traces over OTLP/HTTP");
    }
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
    if let Some(addr) = node.metrics_addr {
        println!("herald metrics on http://{addr}/metrics");
    }
    let served = node.run_until(shutdown_signal()).await;
    if let Some(inbox) = inbox {
        inbox.shutdown().await;
    }
    telemetry.shutdown().await;
    served
}
