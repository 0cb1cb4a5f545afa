//! A minimal client of the public, Svix-compatible API: create applications and endpoints, post messages.
//!
//! Only documented routes and fields are used, so the harness works against any server with that API.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use herald_core::id::Kind;

use crate::poster::Poster;
use crate::server_id::{AppId, EndpointId, MessageId, ServerId, SinkId};
use indicatif::ProgressBar;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde::{Deserialize, Serialize};

/// How long one request may take, from connecting to the end of its answer.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Endpoints created at once when setting up many.
const SETUP_CONCURRENCY: usize = 16;

/// The API of one server: a pooled keep-alive HTTP client for everything, and for messages to a
/// plain-HTTP server a lighter [`Poster`].
#[derive(Clone)]
pub struct Api {
    client: reqwest::Client,
    /// Messages' own lighter way to a plain-HTTP server (see [`Poster`]); `None` for any other.
    poster: Option<Arc<Poster>>,
    /// `http://host:port`, as given.
    server: Arc<str>,
    /// `http://host:port/api/v1`.
    base: Arc<str>,
    auth: HeaderValue,
}

/// An endpoint to create.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSpec {
    /// Where deliveries go.
    pub url: String,
    /// Event types it receives; `None` means all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter_types: Option<Vec<String>>,
    /// Created disabled (nothing is sent to it).
    pub disabled: bool,
}

impl EndpointSpec {
    /// An enabled endpoint receiving every event type.
    pub fn to(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            filter_types: None,
            disabled: false,
        }
    }

    /// Receive only `event_type`.
    pub fn only(mut self, event_type: &str) -> Self {
        self.filter_types = Some(vec![event_type.to_owned()]);
        self
    }

    /// Create it disabled (or not).
    pub fn disabled(mut self, disabled: bool) -> Self {
        self.disabled = disabled;
        self
    }
}

/// A page of a polling endpoint's stream (`PollingEndpointOut`).
#[derive(Debug, Deserialize)]
pub struct PolledPage {
    /// The messages, oldest first.
    pub data: Vec<PolledMessage>,
    /// Where the next read continues; coming back with it commits this page.
    pub iterator: String,
    /// Whether the stream had nothing more.
    pub done: bool,
}

/// One message read from a polling endpoint (the fields the harness needs of `MessageOut`).
#[derive(Debug, Deserialize)]
pub struct PolledMessage {
    /// The message id.
    pub id: MessageId,
    /// Its payload, as posted.
    pub payload: serde_json::Value,
}

/// The answer to a create, of which only the id is read. The id is read as text and checked apart, so that
/// an id of another form is reported as such rather than as JSON that does not parse.
#[derive(Deserialize)]
struct Created {
    id: String,
}

impl Api {
    /// A client for the server at `server_url` (e.g. `http://127.0.0.1:8040`) using the bearer `token`,
    /// keeping up to `connections` idle keep-alive connections.
    pub fn new(server_url: &str, token: &str, connections: usize) -> anyhow::Result<Self> {
        // reqwest is built without a default TLS provider; install ring's (a no-op if one already is).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .no_proxy()
            .http1_only()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(connections)
            .pool_idle_timeout(Duration::from_secs(90))
            .timeout(REQUEST_TIMEOUT)
            .build()
            .context("building the HTTP client")?;
        let auth =
            HeaderValue::from_str(&format!("Bearer {token}")).context("the token is not a valid header value")?;
        let base = format!("{}/api/v1", server_url.trim_end_matches('/'));
        Ok(Self {
            client,
            poster: Poster::for_base(&base, auth.clone(), connections)?.map(Arc::new),
            server: Arc::from(server_url),
            base: Arc::from(base),
            auth,
        })
    }

    /// The server's base URL, as given.
    pub fn server(&self) -> Arc<str> {
        self.server.clone()
    }

    /// Check that the server answers and accepts the token.
    pub async fn check(&self) -> anyhow::Result<()> {
        let url = format!("{}/app?limit=1", self.base);
        let response = self
            .client
            .get(&url)
            .header(AUTHORIZATION, &self.auth)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        let status = response.status();
        if !status.is_success() {
            bail!("GET {url} answered {status}; is the token right?");
        }
        Ok(())
    }

    /// Create an application named `name`; returns its id.
    pub async fn create_app(&self, name: &str) -> anyhow::Result<AppId> {
        let body = serde_json::json!({ "name": name });
        self.create(format!("{}/app", self.base), &body)
            .await
            .with_context(|| format!("creating application {name}"))
    }

    /// Create an endpoint of `app_id`; returns its id.
    pub async fn create_endpoint(&self, app_id: &AppId, spec: &EndpointSpec) -> anyhow::Result<EndpointId> {
        self.create(format!("{}/app/{app_id}/endpoint", self.base), spec)
            .await
            .with_context(|| format!("creating an endpoint for {}", spec.url))
    }

    /// Create many endpoints of `app_id`, a few at a time; returns their ids in the order given.
    pub async fn create_endpoints(
        &self,
        app_id: &AppId,
        specs: &[EndpointSpec],
        bar: &ProgressBar,
    ) -> anyhow::Result<Vec<EndpointId>> {
        futures::stream::iter(specs)
            .map(|spec| async move {
                let id = self.create_endpoint(app_id, spec).await;
                bar.inc(1);
                id
            })
            .buffered(SETUP_CONCURRENCY)
            .try_collect()
            .await
    }

    /// The path, under any node's API, that messages of `app_id` are posted to (asking for a short answer
    /// without the payload). A path rather than a URL: with several nodes the same message may go to any.
    pub fn message_path(app_id: &str) -> String {
        format!("/app/{app_id}/msg?with_content=false")
    }

    /// Post one message body to `path` (from [`Api::message_path`]) on this node; `Ok` when the server
    /// accepted it.
    pub async fn post_message(&self, path: &str, body: String) -> anyhow::Result<()> {
        if let Some(poster) = &self.poster {
            return poster.post(path, body).await;
        }
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .header(AUTHORIZATION, &self.auth)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(body)
            .send()
            .await
            .context("posting a message")?;
        let status = response.status();
        // Read the answer to the end so the connection goes back to the pool.
        let answer = response.bytes().await.context("reading the answer to a message")?;
        if !status.is_success() {
            bail!("message refused: {status} {}", snippet(&answer));
        }
        Ok(())
    }

    /// Create a polling endpoint of `app_id` that keeps messages of `event_type`; returns its id.
    pub async fn create_polling_endpoint(&self, app_id: &AppId, event_type: &str) -> anyhow::Result<SinkId> {
        let body = serde_json::json!({ "eventTypes": [event_type] });
        self.create(format!("{}/app/{app_id}/polling-endpoint", self.base), &body)
            .await
            .with_context(|| format!("creating a polling endpoint for {app_id}"))
    }

    /// One read of `consumer` on polling endpoint `sink_id` (the SDKs' `consumer_poll`): from its committed
    /// offset, after committing `iterator` (the previous answer's) when given, waiting up to `wait` for a
    /// message when there is none (Herald's `wait_ms`).
    pub async fn consumer_poll(
        &self,
        app_id: &AppId,
        sink_id: &SinkId,
        consumer: &str,
        iterator: Option<&str>,
        limit: u32,
        wait: Duration,
    ) -> anyhow::Result<PolledPage> {
        let mut url = reqwest::Url::parse(&format!(
            "{}/app/{app_id}/poller/{sink_id}/consumer/{consumer}",
            self.base
        ))
        .context("the poller's URL")?;
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("limit", &limit.to_string());
            query.append_pair("wait_ms", &wait.as_millis().to_string());
            if let Some(iterator) = iterator {
                query.append_pair("iterator", iterator);
            }
        }
        let response = self
            .client
            .get(url)
            .header(AUTHORIZATION, &self.auth)
            .send()
            .await
            .context("polling")?;
        let status = response.status();
        let answer = response.bytes().await.context("reading a poll's answer")?;
        if !status.is_success() {
            bail!("poll refused: {status} {}", snippet(&answer));
        }
        serde_json::from_slice(&answer).context("a poll's answer is not a PollingEndpointOut")
    }

    /// POST `body` to `url` and read the id of what it created, which must be of kind `K`: the harness
    /// talks to any server with this API, so what it answers is checked, not assumed.
    async fn create<K: Kind>(&self, url: String, body: &impl Serialize) -> anyhow::Result<ServerId<K>> {
        let response = self
            .client
            .post(&url)
            .header(AUTHORIZATION, &self.auth)
            .json(body)
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = response.status();
        let answer = response
            .bytes()
            .await
            .with_context(|| format!("reading the answer of {url}"))?;
        if !status.is_success() {
            bail!("POST {url} answered {status} {}", snippet(&answer));
        }
        let created: Created =
            serde_json::from_slice(&answer).with_context(|| format!("the answer of {url} has no id"))?;
        ServerId::parse(created.id).with_context(|| format!("the answer of {url} names no {} id", K::KIND.prefix()))
    }
}

/// The start of a response body, for error messages.
pub(crate) fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.chars().take(300).collect()
}
