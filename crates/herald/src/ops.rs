//! Operators' commands against a running Herald: find what went missing and repair it from a shell.
//!
//! - `herald events`: the reconciliation listing (every message of a window, oldest first), as JSON lines;
//!   `--follow` keeps polling from where it stopped.
//! - `herald dead`: dead letters of an application or endpoint, with their last outcome.
//! - `herald resend`: send one message to one endpoint again.
//! - `herald recover` / `herald replay-missing`: start the bulk repair, show its progress, print a summary.
//! - `herald task`: a background task's state.
//!
//! Each is a thin client of the REST API (`--server`, `--token`), so it works against any node.

use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};

/// Where the API is and how to authenticate.
#[derive(Debug, Args)]
pub struct Connection {
    /// The Herald server.
    #[arg(long, env = "HERALD_SERVER", default_value = "http://127.0.0.1:8040")]
    server: String,
    /// A bearer token (the admin token, or an application's token).
    #[arg(long, env = "HERALD_TOKEN", hide_env_values = true)]
    token: String,
}

/// A window of message creation times (RFC 3339).
#[derive(Debug, Args)]
pub struct Window {
    /// Messages created at or after this time, e.g. 2026-11-29T14:00:00Z.
    #[arg(long)]
    since: String,
    /// Messages created before this time [default: now].
    #[arg(long)]
    until: Option<String>,
}

/// The operators' commands.
#[derive(Debug, Subcommand)]
pub enum OpsCommand {
    /// Every message of an application created in a window, oldest first, one JSON object per line.
    Events {
        #[command(flatten)]
        connection: Connection,
        /// Application id or uid.
        #[arg(long)]
        app: String,
        /// Messages created at or after this time (RFC 3339).
        #[arg(long)]
        since: Option<String>,
        /// Messages created before this time (RFC 3339).
        #[arg(long)]
        until: Option<String>,
        /// Only these event types (repeatable).
        #[arg(long = "event-type")]
        event_types: Vec<String>,
        /// Continue from this iterator (printed on standard error as the listing goes).
        #[arg(long)]
        iterator: Option<String>,
        /// Keep polling for new messages after the last page.
        #[arg(long)]
        follow: bool,
    },
    /// Dead deliveries (dead letters) with their last outcome, newest first.
    Dead {
        #[command(flatten)]
        connection: Connection,
        /// Application id or uid.
        #[arg(long)]
        app: String,
        /// Only this endpoint.
        #[arg(long)]
        endpoint: Option<String>,
    },
    /// Send one message to one endpoint again (a manual attempt).
    Resend {
        #[command(flatten)]
        connection: Connection,
        /// Application id or uid.
        #[arg(long)]
        app: String,
        /// Message id (or eventId).
        #[arg(long)]
        msg: String,
        /// Endpoint id or uid.
        #[arg(long)]
        endpoint: String,
    },
    /// Re-send every delivery to an endpoint that failed or died in a window; waits and shows progress.
    Recover {
        #[command(flatten)]
        connection: Connection,
        /// Application id or uid.
        #[arg(long)]
        app: String,
        /// Endpoint id or uid.
        #[arg(long)]
        endpoint: String,
        #[command(flatten)]
        window: Window,
    },
    /// Send an endpoint the messages of a window it never got; waits and shows progress.
    ReplayMissing {
        #[command(flatten)]
        connection: Connection,
        /// Application id or uid.
        #[arg(long)]
        app: String,
        /// Endpoint id or uid.
        #[arg(long)]
        endpoint: String,
        #[command(flatten)]
        window: Window,
    },
    /// A background task's state and progress.
    Task {
        #[command(flatten)]
        connection: Connection,
        /// The task id (`qtask_…`).
        id: String,
    },
}

/// A minimal API client.
struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    fn new(connection: &Connection) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            http,
            base: format!("{}/api/v1", connection.server.trim_end_matches('/')),
            token: connection.token.clone(),
        })
    }

    /// Call the API; a non-2xx answer becomes an error carrying the server's `detail`.
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {path}: the server did not answer"))?;
        let status = response.status();
        let bytes = response.bytes().await.context("reading the answer")?;
        let json: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({ "detail": String::from_utf8_lossy(&bytes) }))
        };
        if !status.is_success() {
            let detail = json["detail"].as_str().unwrap_or("no detail");
            bail!("{method} {path}: {status}: {detail}");
        }
        Ok(json)
    }
}

/// Percent-encode a query value.
fn q(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// Run an operator's command.
pub async fn run(command: OpsCommand) -> anyhow::Result<()> {
    // reqwest is built without a default TLS provider: https servers need one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match command {
        OpsCommand::Events {
            connection,
            app,
            since,
            until,
            event_types,
            iterator,
            follow,
        } => {
            let api = Api::new(&connection)?;
            events(&api, &app, since, until, event_types, iterator, follow).await
        }
        OpsCommand::Dead {
            connection,
            app,
            endpoint,
        } => {
            let api = Api::new(&connection)?;
            let mut iterator: Option<String> = None;
            loop {
                let mut path = format!(
                    "/app/{}/delivery?deliveryStatus=dead&with_content=false&limit=250",
                    q(&app)
                );
                if let Some(endpoint) = &endpoint {
                    path.push_str(&format!("&endpointId={}", q(endpoint)));
                }
                if let Some(it) = &iterator {
                    path.push_str(&format!("&iterator={}", q(it)));
                }
                let page = api.call(Method::GET, &path, None).await?;
                for d in page["data"].as_array().into_iter().flatten() {
                    let last = &d["lastAttempt"];
                    println!(
                        "{}\t{}\t{}\t{} attempts\tlast: {} {} at {}",
                        d["id"].as_str().unwrap_or("?"),
                        d["endpointId"].as_str().unwrap_or("?"),
                        d["eventType"].as_str().unwrap_or("?"),
                        d["attempts"],
                        last["outcome"].as_str().unwrap_or("-"),
                        last["responseStatusCode"],
                        last["timestamp"].as_str().unwrap_or("-"),
                    );
                }
                if page["done"] == true {
                    return Ok(());
                }
                iterator = page["iterator"].as_str().map(str::to_owned);
            }
        }
        OpsCommand::Resend {
            connection,
            app,
            msg,
            endpoint,
        } => {
            let api = Api::new(&connection)?;
            let path = format!("/app/{}/msg/{}/endpoint/{}/resend", q(&app), q(&msg), q(&endpoint));
            api.call(Method::POST, &path, None).await?;
            println!("queued: {msg} will be sent to {endpoint} again");
            Ok(())
        }
        OpsCommand::Recover {
            connection,
            app,
            endpoint,
            window,
        } => repair(&Api::new(&connection)?, &app, &endpoint, "recover", &window).await,
        OpsCommand::ReplayMissing {
            connection,
            app,
            endpoint,
            window,
        } => repair(&Api::new(&connection)?, &app, &endpoint, "replay-missing", &window).await,
        OpsCommand::Task { connection, id } => {
            let api = Api::new(&connection)?;
            let task = api
                .call(Method::GET, &format!("/background-task/{}", q(&id)), None)
                .await?;
            println!("{}", serde_json::to_string_pretty(&task)?);
            Ok(())
        }
    }
}

async fn events(
    api: &Api,
    app: &str,
    since: Option<String>,
    until: Option<String>,
    event_types: Vec<String>,
    mut iterator: Option<String>,
    follow: bool,
) -> anyhow::Result<()> {
    let mut base = format!("/app/{}/events?limit=250", q(app));
    for (key, value) in [("since", &since), ("until", &until)] {
        if let Some(value) = value {
            base.push_str(&format!("&{key}={}", q(value)));
        }
    }
    for event_type in &event_types {
        base.push_str(&format!("&event_types={}", q(event_type)));
    }
    loop {
        let mut path = base.clone();
        if let Some(it) = &iterator {
            path.push_str(&format!("&iterator={}", q(it)));
        }
        let page = api.call(Method::GET, &path, None).await?;
        for message in page["data"].as_array().into_iter().flatten() {
            println!("{message}");
        }
        if let Some(it) = page["iterator"].as_str() {
            iterator = Some(it.to_owned());
            eprintln!("iterator: {it}");
        }
        if page["done"] == true {
            if !follow {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Start a bulk repair and follow its background task to the end, with a progress bar.
async fn repair(api: &Api, app: &str, endpoint: &str, action: &str, window: &Window) -> anyhow::Result<()> {
    let mut body = json!({ "since": window.since });
    if let Some(until) = &window.until {
        body["until"] = json!(until);
    }
    let path = format!("/app/{}/endpoint/{}/{action}", q(app), q(endpoint));
    let started = api.call(Method::POST, &path, Some(body)).await?;
    let id = started["id"]
        .as_str()
        .context("the server returned no task id")?
        .to_owned();
    let bar = indicatif::ProgressBar::new(started["total"].as_u64().unwrap_or(0));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(format!("{action} {id}"));
    let task = loop {
        let task = api
            .call(Method::GET, &format!("/background-task/{}", q(&id)), None)
            .await?;
        bar.set_length(task["total"].as_u64().unwrap_or(0));
        bar.set_position(task["processed"].as_u64().unwrap_or(0));
        if task["status"] != "running" {
            break task;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    bar.finish_and_clear();
    match task["status"].as_str() {
        Some("finished") => {
            println!(
                "{action} {id} finished: {} processed, {} queued for delivery",
                task["processed"], task["data"]["queued"]
            );
            Ok(())
        }
        _ => {
            let error = task["data"]["error"].as_str().unwrap_or("no detail");
            bail!("{action} {id} failed: {error}");
        }
    }
}
