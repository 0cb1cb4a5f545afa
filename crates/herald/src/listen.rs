//! `herald listen`: webhooks on a developer's machine with nothing opened inbound.
//!
//! It creates a polling endpoint of the application (or reuses one named with `--sink`), long-polls its
//! stream through the v2 consumer calls, and posts each new message to the local `--forward` URL signed
//! with the polling endpoint's key: the body is the stored payload byte for byte and the headers are those
//! a pushed delivery carries (`content-type`, `user-agent`, `webhook-id`, `webhook-timestamp`,
//! `webhook-signature`, built by the delivery engine's own [`herald_delivery::signed_headers`]), so the
//! handler's verification code runs unchanged. One line per event (time, type, id, the handler's status
//! and latency); `--print` shows the payloads instead of forwarding; `--json` prints JSON lines. Ctrl-C
//! (or SIGTERM) stops it and deletes a polling endpoint it created.
//!
//! Each batch is committed once it has been forwarded, whatever the handler answered (a local handler
//! that fails is the developer's to look at, not to be hammered with retries): a message is forwarded
//! once per listener, and a listener restarted with `--sink` continues where it stopped.
//!
//! Answers are read as typed structs whose ids are `herald_core::id`s: a malformed one (an id of another
//! kind, a missing key) stops the listener with an error naming the call.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use herald_core::id::{MessageId, SinkId};
use herald_signature::{HeaderNames, SigningKey};
use reqwest::Method;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::ops::{Api, Connection, out, q};

/// The consumer `herald listen` reads the stream as.
const CONSUMER: &str = "herald-listen";
/// How long one poll waits for a new message (the server allows up to 30 s).
const WAIT_MS: u64 = 20_000;
/// How long the handler may take to answer one message.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);

/// Options of `herald listen`.
#[derive(Args)]
pub(crate) struct ListenArgs {
    #[command(flatten)]
    connection: Connection,
    /// Application id or uid.
    #[arg(long)]
    app: String,
    /// Only these event types (comma-separated or repeated) [default: all].
    #[arg(long = "event-types", value_delimiter = ',')]
    event_types: Vec<String>,
    /// Only messages on one of these channels (comma-separated or repeated) [default: all].
    #[arg(long, value_delimiter = ',')]
    channels: Vec<String>,
    /// Reuse this polling endpoint (id or uid) instead of creating one; it is kept at exit, and its
    /// consumer "herald-listen" continues where it stopped.
    #[arg(long)]
    sink: Option<String>,
    /// Where to post each message, e.g. http://localhost:3000/webhooks.
    #[arg(long, required_unless_present = "print")]
    forward: Option<String>,
    /// Only print each message's payload (one line each); forward nothing.
    #[arg(long)]
    print: bool,
}

/// One message of a v2 poll, its payload kept as the server's bytes.
#[derive(Deserialize)]
struct Polled {
    offset: i64,
    id: MessageId,
    #[serde(rename = "eventType")]
    event_type: String,
    payload: Box<RawValue>,
    timestamp: String,
}

/// A v2 poll's answer.
#[derive(Deserialize)]
struct Batch {
    data: Vec<Polled>,
}

/// A polling endpoint, as the listener reads it.
#[derive(Deserialize)]
struct PollingEndpoint {
    id: SinkId,
}

/// A polling endpoint's signing key.
#[derive(Deserialize)]
struct Secret {
    key: String,
}

/// The polling endpoint being read, and whether this listener made it (and so deletes it at exit).
struct Sink {
    id: SinkId,
    created: bool,
}

/// Run `herald listen` until Ctrl-C or SIGTERM.
pub(crate) async fn run(args: ListenArgs, json: bool) -> anyhow::Result<()> {
    // TLS (an https server or handler) through the same provider as the other commands.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = Api::new(&args.connection)?;
    let app = q(&args.app);
    let sink = open_sink(&api, &app, &args).await?;
    let stopped = tokio::select! {
        result = listen(&api, &app, &sink, &args, json) => result,
        () = crate::process::shutdown_signal() => Ok(()),
    };
    if sink.created {
        // Cleaned up even when listening failed: the polling endpoint existed only for this listener.
        let removed = api
            .raw(
                Method::DELETE,
                &format!("/app/{app}/polling-endpoint/{}", q(&sink.id)),
                None,
            )
            .await;
        match (removed, json) {
            (Ok(_), false) => eprintln!("deleted polling endpoint {}", sink.id),
            (Ok(_), true) => {}
            (Err(error), _) => eprintln!("could not delete polling endpoint {}: {error:#}", sink.id),
        }
    }
    stopped
}

/// The polling endpoint `--sink` names, or a new one with the filters given.
async fn open_sink(api: &Api, app: &str, args: &ListenArgs) -> anyhow::Result<Sink> {
    if let Some(sink) = &args.sink {
        let found: PollingEndpoint = api
            .answer(Method::GET, &format!("/app/{app}/polling-endpoint/{}", q(sink)), None)
            .await?;
        return Ok(Sink {
            id: found.id,
            created: false,
        });
    }
    let mut body = json!({ "description": "herald listen" });
    if !args.event_types.is_empty() {
        body["eventTypes"] = json!(args.event_types);
    }
    if !args.channels.is_empty() {
        body["channels"] = json!(args.channels);
    }
    let created: PollingEndpoint = api
        .answer(Method::POST, &format!("/app/{app}/polling-endpoint"), Some(body))
        .await?;
    eprintln!("listening on polling endpoint {} (deleted at exit)", created.id);
    Ok(Sink {
        id: created.id,
        created: true,
    })
}

/// Poll, forward (or print) and commit, batch after batch.
async fn listen(api: &Api, app: &str, sink: &Sink, args: &ListenArgs, json: bool) -> anyhow::Result<()> {
    let sink_path = format!("/app/{app}/polling-endpoint/{}", q(&sink.id));
    let secret: Secret = api.answer(Method::GET, &format!("{sink_path}/secret"), None).await?;
    let key = SigningKey::parse(&secret.key).context("the polling endpoint's key")?;
    let forward = reqwest::Client::builder()
        .timeout(FORWARD_TIMEOUT)
        .build()
        .context("building the HTTP client")?;
    let user_agent = herald_delivery::ClientConfig::default().user_agent;
    let consumer = format!("{sink_path}/consumer/{CONSUMER}");
    // The first poll answers at once: it places a consumer never seen at the stream's end (only messages
    // published from now on), and only then is the listener ready.
    let mut wait_ms = 0;
    loop {
        let poll = format!("{consumer}?starting_position=latest&wait_ms={wait_ms}&limit=50");
        let batch: Batch = api.answer(Method::GET, &poll, None).await?;
        if wait_ms == 0 {
            wait_ms = WAIT_MS;
            match &args.forward {
                Some(url) if !args.print => eprintln!("ready: forwarding to {url}; Ctrl-C stops"),
                _ => eprintln!("ready: printing payloads; Ctrl-C stops"),
            }
        }
        let Some(last) = batch.data.last().map(|m| m.offset) else {
            continue;
        };
        for message in &batch.data {
            let body = message.payload.get().as_bytes();
            if args.print {
                out(message.payload.get())?;
                continue;
            }
            let Some(url) = &args.forward else { continue };
            let timestamp = herald_core::clock::now().as_unix_secs();
            let mut headers = herald_delivery::signed_headers(
                &[&key],
                &Default::default(),
                &message.id,
                body,
                timestamp,
                HeaderNames::Webhook,
            );
            if let Ok(agent) = reqwest::header::HeaderValue::from_str(&user_agent) {
                headers.insert(reqwest::header::USER_AGENT, agent);
            }
            let started = Instant::now();
            let sent = forward.post(url).headers(headers).body(body.to_vec()).send().await;
            let latency_ms = started.elapsed().as_millis();
            let (status, error) = match sent {
                Ok(response) => (Some(response.status().as_u16()), None),
                Err(error) => (None, Some(error.without_url().to_string())),
            };
            report(message, status, error.as_deref(), latency_ms, json)?;
        }
        api.raw(
            Method::POST,
            &format!("{consumer}/commit"),
            Some(json!({ "offset": last })),
        )
        .await?;
    }
}

/// One line about one forwarded message.
fn report(
    message: &Polled,
    status: Option<u16>,
    error: Option<&str>,
    latency_ms: u128,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        let line: Value = json!({
            "timestamp": message.timestamp,
            "eventType": message.event_type,
            "id": message.id,
            "status": status,
            "error": error,
            "latencyMs": latency_ms,
        });
        return out(&line.to_string());
    }
    let outcome = match (status, error) {
        (Some(status), _) => status.to_string(),
        (None, Some(error)) => format!("error: {error}"),
        (None, None) => "error".to_owned(),
    };
    out(&format!(
        "{}  {}  {}  -> {outcome}  {latency_ms} ms",
        message.timestamp, message.event_type, message.id
    ))
}
