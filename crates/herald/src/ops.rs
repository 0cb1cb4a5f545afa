//! Operators' commands against a running Herald: find what went missing and repair it from a shell.
//!
//! - `herald events`: the reconciliation listing (every message of a window, oldest first), one JSON object
//!   per line, byte for byte as the server sent it (so each payload is the producer's bytes);
//!   `--follow` keeps polling from where it stopped.
//! - `herald dead`: dead letters of an application or endpoint, with their last outcome.
//! - `herald resend`: send one message to one endpoint again.
//! - `herald recover` / `herald replay-missing`: start the bulk repair, show its progress, print a summary.
//! - `herald task`: a background task's state.
//!
//! Each is a thin client of the REST API (`--server`, `--token`), so it works against any node. Times are
//! RFC 3339, a date or a time ago (see [`crate::when`]); `--json` prints the server's JSON instead of text.
//! What a command reads of an answer it reads through a typed answer ([`Endpoint`], [`Message`],
//! [`DeadLetter`], [`Task`]) whose ids are `herald_core::id`s, checked as they are read: an answer with an id
//! of another kind, or none, stops the command with an error naming the call, instead of being printed or
//! used.

use std::collections::HashMap;
use std::io::Write as _;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use herald_core::id::{EndpointId, MessageId, TaskId};
use herald_core::model::TaskState;
use reqwest::Method;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::when;

/// Where the API is and how to authenticate.
#[derive(Args)]
pub(crate) struct Connection {
    /// The Herald server.
    #[arg(long, env = "HERALD_SERVER", default_value = "http://127.0.0.1:8040")]
    pub(crate) server: String,
    /// A bearer token (the admin token, or an application's token).
    #[arg(long, env = "HERALD_TOKEN", hide_env_values = true)]
    pub(crate) token: String,
}

/// A window of message creation times.
#[derive(Args)]
pub(crate) struct Window {
    /// Messages created at or after this time: RFC 3339 (2026-11-29T14:00:00Z), a date (2026-11-29) or a
    /// time ago (30m, 1h, 2d).
    #[arg(long, value_parser = when::parse)]
    since: String,
    /// Messages created before this time, in the same forms [default: now].
    #[arg(long, value_parser = when::parse)]
    until: Option<String>,
}

/// The operators' commands.
#[derive(Subcommand)]
pub(crate) enum OpsCommand {
    /// Every message of an application created in a window, oldest first, one JSON object per line.
    Events {
        #[command(flatten)]
        connection: Connection,
        /// Application id or uid.
        #[arg(long)]
        app: String,
        /// Messages created at or after this time: RFC 3339, a date (2026-11-29) or a time ago (1h).
        #[arg(long, value_parser = when::parse)]
        since: Option<String>,
        /// Messages created before this time, in the same forms.
        #[arg(long, value_parser = when::parse)]
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
        /// Only this endpoint (id or uid).
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
        /// The task id (qtask_…).
        id: String,
    },
}

/// A minimal API client.
pub(crate) struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

/// One page of a listing, each item kept as the server's bytes.
#[derive(Deserialize)]
struct RawPage {
    data: Vec<Box<RawValue>>,
    iterator: Option<String>,
    #[serde(default)]
    done: bool,
}

/// An endpoint, as the commands read it.
#[derive(Deserialize)]
struct Endpoint {
    id: EndpointId,
    #[serde(default)]
    uid: Option<String>,
}

/// A message, as the commands read it (without its content).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Message {
    id: MessageId,
    #[serde(default)]
    event_id: Option<String>,
}

/// A dead delivery: its message as attempted to one endpoint.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeadLetter {
    #[serde(flatten)]
    message: Message,
    event_type: String,
    endpoint_id: EndpointId,
    attempts: u32,
    #[serde(default)]
    last_attempt: Option<LastAttempt>,
}

/// A delivery's latest attempt.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LastAttempt {
    response_status_code: u16,
    outcome: String,
    timestamp: String,
}

/// A background task, as started or read back.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Task {
    id: TaskId,
    task: String,
    #[serde(deserialize_with = "task_state")]
    status: TaskState,
    processed: u64,
    total: u64,
    // The server answers `null` for data it cannot read back; the task ran all the same, and failing
    // the command then would invite the operator to start it again (a bulk replay sending twice).
    #[serde(default, deserialize_with = "herald_api::model::null_as_default")]
    data: TaskData,
    created_at: String,
    updated_at: String,
}

/// What a task's `data` says that the commands show (times as Unix ms).
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TaskData {
    #[serde(default)]
    endpoint_id: Option<EndpointId>,
    #[serde(default)]
    since: Option<i64>,
    #[serde(default)]
    until: Option<i64>,
    #[serde(default)]
    queued: Option<u64>,
    #[serde(default)]
    error: Option<String>,
}

/// A task's `status`, one of [`TaskState`]'s names.
fn task_state<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<TaskState, D::Error> {
    let name = String::deserialize(deserializer)?;
    TaskState::parse(&name).ok_or_else(|| serde::de::Error::custom(format!("{name:?} is no task status")))
}

/// An answer (or an item of one) of `method path` as `T`; an error naming the call when it is not one.
fn parse<T: DeserializeOwned>(method: &Method, path: &str, bytes: &[u8]) -> anyhow::Result<T> {
    serde_json::from_slice(bytes).with_context(|| format!("{method} {path}: unexpected answer"))
}

impl Api {
    pub(crate) fn new(connection: &Connection) -> anyhow::Result<Self> {
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

    /// Call the API and return the answer's bytes; a non-2xx answer becomes an error carrying the server's
    /// `detail` (a string, or the validation list of `{loc, msg}`).
    pub(crate) async fn raw(&self, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Vec<u8>> {
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
        let bytes = response.bytes().await.context("reading the answer")?.to_vec();
        if !status.is_success() {
            let json: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let detail = match &json["detail"] {
                Value::String(text) => text.clone(),
                Value::Array(items) => items
                    .iter()
                    .map(|item| {
                        let loc: Vec<&str> = item["loc"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .collect();
                        format!("{}: {}", loc.join("."), item["msg"].as_str().unwrap_or("invalid"))
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
                _ => String::from_utf8_lossy(&bytes).into_owned(),
            };
            bail!("{method} {path}: {status}: {detail}");
        }
        Ok(bytes)
    }

    /// Call the API and read its answer as `T` (see [`parse`]).
    pub(crate) async fn answer<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<T> {
        let bytes = self.raw(method.clone(), path, body).await?;
        parse(&method, path, &bytes)
    }

    /// One page of a listing.
    async fn page(&self, path: &str) -> anyhow::Result<RawPage> {
        self.answer(Method::GET, path, None).await
    }

    /// The uid (else the id) of each endpoint of an application.
    async fn endpoint_names(&self, app: &str) -> anyhow::Result<HashMap<String, String>> {
        let mut names = HashMap::new();
        let mut iterator: Option<String> = None;
        loop {
            let mut path = format!("/app/{}/endpoint?limit=250", q(app));
            if let Some(it) = &iterator {
                path.push_str(&format!("&iterator={}", q(it)));
            }
            let page = self.page(&path).await?;
            for raw in &page.data {
                let endpoint: Endpoint = parse(&Method::GET, &path, raw.get().as_bytes())?;
                let name = endpoint.uid.unwrap_or_else(|| endpoint.id.to_string());
                names.insert(endpoint.id.into_string(), name);
            }
            if page.done || page.iterator.is_none() {
                return Ok(names);
            }
            iterator = page.iterator;
        }
    }
}

/// Percent-encode a query value.
pub(crate) fn q(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// Write a line to standard output; a closed pipe (`| head`) ends the command quietly.
#[allow(
    clippy::exit,
    reason = "a reader that went away (`| head`) has all it wanted: end as `cat` would"
)]
pub(crate) fn out(line: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{line}") {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => other.context("writing to standard output"),
    }
}

/// Rows as aligned columns under a header line.
fn columns(header: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    std::iter::once(line(header.iter().map(|h| (*h).to_owned()).collect()))
        .chain(rows.iter().map(|row| line(row.clone())))
        .collect()
}

/// Text for a column (`-` when absent).
fn text(value: Option<&str>) -> String {
    value.unwrap_or("-").to_owned()
}

/// Run an operator's command; `json` prints the server's JSON instead of text.
pub(crate) async fn run(command: OpsCommand, json: bool) -> anyhow::Result<()> {
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
        } => dead(&Api::new(&connection)?, &app, endpoint.as_deref(), json).await,
        OpsCommand::Resend {
            connection,
            app,
            msg,
            endpoint,
        } => {
            let api = Api::new(&connection)?;
            let path = format!("/app/{}/msg/{}/endpoint/{}/resend", q(&app), q(&msg), q(&endpoint));
            api.raw(Method::POST, &path, None).await?;
            let message: Message = api
                .answer(
                    Method::GET,
                    &format!("/app/{}/msg/{}?with_content=false", q(&app), q(&msg)),
                    None,
                )
                .await?;
            let target: Endpoint = api
                .answer(
                    Method::GET,
                    &format!("/app/{}/endpoint/{}", q(&app), q(&endpoint)),
                    None,
                )
                .await?;
            if json {
                return out(
                    &json!({"queued": true, "msgId": message.id, "eventId": message.event_id,
                    "endpointId": target.id, "endpointUid": target.uid})
                    .to_string(),
                );
            }
            let event_id = message.event_id.map(|e| format!(" (eventId {e})")).unwrap_or_default();
            let name = target.uid.as_deref().unwrap_or(&target.id);
            out(&format!(
                "queued: {}{event_id} will be sent to endpoint {name} ({}) again",
                message.id, target.id
            ))
        }
        OpsCommand::Recover {
            connection,
            app,
            endpoint,
            window,
        } => repair(&Api::new(&connection)?, &app, &endpoint, "recover", &window, json).await,
        OpsCommand::ReplayMissing {
            connection,
            app,
            endpoint,
            window,
        } => {
            repair(
                &Api::new(&connection)?,
                &app,
                &endpoint,
                "replay-missing",
                &window,
                json,
            )
            .await
        }
        OpsCommand::Task { connection, id } => {
            let api = Api::new(&connection)?;
            let path = format!("/background-task/{}", q(&id));
            if json {
                return out(String::from_utf8_lossy(&api.raw(Method::GET, &path, None).await?).trim_end());
            }
            let task: Task = api.answer(Method::GET, &path, None).await?;
            for line in describe_task(&task) {
                out(&line)?;
            }
            Ok(())
        }
    }
}

/// A task in `key  value` lines, every time as RFC 3339 (the task's data keeps times as Unix ms).
fn describe_task(task: &Task) -> Vec<String> {
    let data = &task.data;
    let mut rows = vec![
        vec!["task".to_owned(), task.id.to_string()],
        vec!["kind".to_owned(), task.task.clone()],
        vec!["status".to_owned(), task.status.as_str().to_owned()],
        vec![
            "progress".to_owned(),
            format!("{} of {} processed", task.processed, task.total),
        ],
    ];
    if let Some(endpoint) = &data.endpoint_id {
        rows.push(vec!["endpoint".to_owned(), endpoint.to_string()]);
    }
    for (key, at) in [("since", data.since), ("until", data.until)] {
        if let Some(at) = at {
            rows.push(vec![key.to_owned(), when::from_millis(at)]);
        }
    }
    if let Some(queued) = data.queued {
        rows.push(vec!["queued".to_owned(), queued.to_string()]);
    }
    if let Some(error) = &data.error {
        rows.push(vec!["error".to_owned(), error.clone()]);
    }
    rows.push(vec!["started".to_owned(), task.created_at.clone()]);
    rows.push(vec!["updated".to_owned(), task.updated_at.clone()]);
    let width = rows.iter().map(|r| r[0].len()).max().unwrap_or(0);
    rows.iter().map(|r| format!("{:<width$}  {}", r[0], r[1])).collect()
}

/// Dead letters as a table (uids, eventIds, last outcome), or JSON lines; says so when there are none.
async fn dead(api: &Api, app: &str, endpoint: Option<&str>, json: bool) -> anyhow::Result<()> {
    let names = if json {
        HashMap::new()
    } else {
        api.endpoint_names(app).await?
    };
    let mut rows = Vec::new();
    let mut iterator: Option<String> = None;
    loop {
        let mut path = format!(
            "/app/{}/delivery?deliveryStatus=dead&with_content=false&limit=250",
            q(app)
        );
        if let Some(endpoint) = endpoint {
            path.push_str(&format!("&endpointId={}", q(endpoint)));
        }
        if let Some(it) = &iterator {
            path.push_str(&format!("&iterator={}", q(it)));
        }
        let page = api.page(&path).await?;
        for raw in &page.data {
            if json {
                out(raw.get())?;
                continue;
            }
            let dead: DeadLetter = parse(&Method::GET, &path, raw.get().as_bytes())?;
            let last = dead.last_attempt.as_ref();
            let outcome = match last {
                Some(last) if last.response_status_code > 0 => {
                    format!("{} {}", last.response_status_code, last.outcome)
                }
                Some(last) => last.outcome.clone(),
                None => "no attempt (expired while waiting)".to_owned(),
            };
            let endpoint = names
                .get(dead.endpoint_id.as_str())
                .cloned()
                .unwrap_or_else(|| dead.endpoint_id.to_string());
            rows.push(vec![
                dead.message.id.to_string(),
                text(dead.message.event_id.as_deref()),
                endpoint,
                dead.event_type,
                dead.attempts.to_string(),
                outcome,
                text(last.map(|last| last.timestamp.as_str())),
            ]);
        }
        if page.done || page.iterator.is_none() {
            break;
        }
        iterator = page.iterator;
    }
    if json {
        return Ok(());
    }
    if rows.is_empty() {
        let scope = endpoint.map(|e| format!(" to endpoint {e}")).unwrap_or_default();
        return out(&format!("no dead deliveries in application {app}{scope}"));
    }
    let header = [
        "MESSAGE",
        "EVENT ID",
        "ENDPOINT",
        "EVENT TYPE",
        "ATTEMPTS",
        "LAST OUTCOME",
        "LAST ATTEMPT",
    ];
    for line in columns(&header, &rows) {
        out(&line)?;
    }
    Ok(())
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
        let page = api.page(&path).await?;
        // Each message as the server wrote it: re-serialising would reorder the payload's keys.
        for message in &page.data {
            out(message.get())?;
        }
        if let Some(it) = page.iterator {
            eprintln!("iterator: {it}");
            iterator = Some(it);
        }
        if page.done {
            if !follow {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Start a bulk repair and follow its background task to the end, with a progress bar while there is
/// work (and standard error is a terminal), then a summary (or the task's JSON).
async fn repair(api: &Api, app: &str, endpoint: &str, action: &str, window: &Window, json: bool) -> anyhow::Result<()> {
    let mut body = json!({ "since": window.since });
    if let Some(until) = &window.until {
        body["until"] = json!(until);
    }
    let path = format!("/app/{}/endpoint/{}/{action}", q(app), q(endpoint));
    let started: Task = api.answer(Method::POST, &path, Some(body)).await?;
    let id = started.id;
    let bar = (!json && started.total > 0).then(|| {
        let total = started.total;
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(format!("{action} {id}"));
        bar
    });
    let task_path = format!("/background-task/{}", q(&id));
    let (task, bytes) = loop {
        let bytes = api.raw(Method::GET, &task_path, None).await?;
        let task: Task = parse(&Method::GET, &task_path, &bytes)?;
        if let Some(bar) = &bar {
            bar.set_length(task.total);
            bar.set_position(task.processed);
        }
        if task.status != TaskState::Running {
            break (task, bytes);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let finished = task.status == TaskState::Finished;
    if json {
        out(String::from_utf8_lossy(&bytes).trim_end())?;
    } else if finished {
        let summary = if task.processed == 0 {
            format!("{action} {id} finished: nothing to do in this window (0 processed)")
        } else {
            format!(
                "{action} {id} finished: {} processed, {} queued for delivery",
                task.processed,
                task.data.queued.unwrap_or(0)
            )
        };
        out(&summary)?;
    }
    if !finished {
        let error = task.data.error.as_deref().unwrap_or("no detail");
        bail!("{action} {id} failed: {error}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_under_their_header() {
        let lines = columns(&["A", "LONG HEADER"], &[vec!["wide cell".into(), "x".into()]]);
        assert_eq!(lines, ["A          LONG HEADER", "wide cell  x"]);
    }

    #[test]
    fn a_task_reads_with_rfc3339_times() {
        let task = json!({"id": TaskId::new(), "task": "endpoint.recover", "status": "finished", "processed": 2,
            "total": 2, "data": {"endpointId": EndpointId::new(), "since": 1_764_590_400_000_i64, "queued": 2},
            "createdAt": "2025-12-01T12:00:01Z", "updatedAt": "2025-12-01T12:00:02Z"});
        let lines = describe_task(&serde_json::from_value(task).expect("a task"));
        assert!(
            lines.contains(&"since     2025-12-01T12:00:00Z".to_owned()),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("progress") && l.ends_with("2 of 2 processed")),
            "{lines:?}"
        );
    }
}
