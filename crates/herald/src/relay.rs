//! `herald relay`: publish a producer's transactional outbox (a table in its own PostgreSQL, MariaDB/MySQL
//! or SQLite database) through Herald's API, until SIGINT or SIGTERM. See docs/outbox.md.

use anyhow::Context as _;
use clap::Args;
use herald_relay::dialect::{Dialect, TableName};
use herald_relay::{Relay, RelaySection};
use herald_telemetry::LogFormat;

/// Options of `herald relay`.
#[derive(Args)]
pub(crate) struct RelayArgs {
    /// The producer's database: postgres://…, mysql://… (or mariadb://…) or sqlite://PATH.
    #[arg(long, env = "HERALD_RELAY_SOURCE")]
    source: String,
    /// The outbox table (its DDL: 'herald relay --print-ddl --source URL').
    #[arg(long, env = "HERALD_RELAY_TABLE", default_value = "herald_outbox")]
    table: String,
    /// Herald's base URL (or any Svix-compatible server's), e.g. http://127.0.0.1:8040.
    #[arg(long, env = "HERALD_RELAY_HERALD", required_unless_present = "print_ddl")]
    herald: Option<String>,
    /// The bearer token to publish with (the admin token or an application's).
    #[arg(
        long,
        env = "HERALD_RELAY_TOKEN",
        hide_env_values = true,
        required_unless_present = "print_ddl"
    )]
    token: Option<String>,
    /// A name for logs and metrics [default: the table's name].
    #[arg(long)]
    name: Option<String>,
    /// Rows claimed per batch (one transaction on the source).
    #[arg(long, default_value_t = 500)]
    batch_size: usize,
    /// Publishes in flight at once (rows of one ordering key always go one after the other).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// How long an idle relay waits before looking at the outbox again.
    #[arg(long, default_value = "20ms")]
    poll_interval: String,
    /// Keep relayed rows (set relayed_at) instead of deleting them.
    #[arg(long)]
    keep: bool,
    /// How long one publish may take before it is abandoned and retried.
    #[arg(long, default_value = "10s")]
    publish_timeout: String,
    /// How often to log progress (relayed, rate, lag, backlog); 0s: never.
    #[arg(long, default_value = "10s")]
    report_interval: String,
    /// Publish one message per request even when the server offers POST …/msg-batch (many per request).
    #[arg(long)]
    one_per_request: bool,
    /// Serve the relay's Prometheus metrics at GET /metrics on this address (e.g. 127.0.0.1:9041).
    #[arg(long, env = "HERALD_RELAY_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// Print the outbox table's DDL for the source's database (and --table) and exit.
    #[arg(long)]
    print_ddl: bool,
}

/// Run `herald relay`.
pub(crate) async fn run(args: RelayArgs, json: bool) -> anyhow::Result<()> {
    if args.print_ddl {
        let dialect = Dialect::of_url(&args.source)?;
        print!("{}", dialect.ddl(&TableName::parse(&args.table)?));
        return Ok(());
    }
    let section = RelaySection {
        name: args.name,
        source: args.source,
        table: args.table,
        herald: args.herald.unwrap_or_default(),
        token: args.token.unwrap_or_default(),
        batch_size: args.batch_size,
        concurrency: args.concurrency,
        poll_interval: args.poll_interval,
        keep: args.keep,
        publish_timeout: args.publish_timeout,
        report_interval: args.report_interval,
        one_per_request: args.one_per_request,
    };
    let config = section.check()?;
    let telemetry = crate::process::init_logs(if json { LogFormat::Json } else { LogFormat::Text })?;
    if let Some(listen) = &args.metrics_listen {
        herald_telemetry::registry::install();
        herald_relay::metrics::register();
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("--metrics-listen: listening on {listen}"))?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .route("/metrics", axum::routing::get(metrics))
            .fallback(herald_edge::problem::no_route)
            .method_not_allowed_fallback(herald_edge::problem::wrong_method);
        // Through the edge, as Herald's own listeners: timeouts, a small connection cap, JSON errors.
        let edge = herald_edge::Edge::new(herald_edge::Limits::default().for_metrics());
        tokio::spawn(async move {
            if let Err(error) = edge.serve(listener, app, std::future::pending()).await {
                tracing::error!(%error, "the metrics listener failed");
            }
        });
        println!("herald relay metrics on http://{addr}/metrics");
    }
    let relay = Relay::new(config)?;
    relay.run(crate::process::shutdown_signal()).await;
    telemetry.shutdown().await;
    Ok(())
}

async fn metrics() -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        herald_telemetry::registry::render(),
    )
}
