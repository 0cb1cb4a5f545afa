//! Reading a polling endpoint's stream, as the official SDKs call it:
//! - `GET /app/{app_id}/poller/{sink_id}` (`message.poller.poll`): a page after `iterator` (or after the
//!   time `after`, or from the start), optionally narrowed to one `event_type` and one `channel`;
//! - `GET …/poller/{sink_id}/consumer/{consumer_id}` (`consumer_poll`): the same from the consumer's
//!   server-side offset; passing the previous answer's `iterator` commits it first, so a batch is served
//!   again until the consumer comes back for the next one (at least once);
//! - `POST …/poller/{sink_id}/consumer/{consumer_id}/seek` (`consumer_seek`): move the offset to a time;
//! - v2, `GET /app/{app_id}/polling-endpoint/{sink_id}/consumer/{consumer_id}`: a batch leased to the
//!   consumer for `lease_duration_ms` (served again once the lease ends uncommitted), and
//!   `POST …/commit` with the last processed `offset`.
//!
//! Every read may wait for new messages: `wait_ms` (up to [`MAX_WAIT`]) holds an empty answer until a
//! message of the stream commits: the store's [`herald_store::StreamSignal`] wakes it (at once for this
//! node's ingest; on PostgreSQL within a few tens of milliseconds for another node's), and it reads again
//! every [`RECHECK`] regardless.

use std::time::Duration;

use axum::extract::{OriginalUri, Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_core::clock::{self, Millis};
use herald_core::id::{AppIdOrUid, SinkIdOrUid};
use herald_core::model::Message;
use herald_store::{ConsumerOffset, PollingEndpoint, StoreError, StreamPage};
use tokio::time::Instant;

use crate::body::JsonBody;
use crate::convert;
use crate::error::{ApiError, ApiResult, Source};
use crate::lookup;
use crate::model::{
    MessageOut, PollerV2CommitIn, PollerV2MessageOut, PollerV2PollOut, PollingEndpointConsumerSeekIn,
    PollingEndpointConsumerSeekOut, PollingEndpointOut,
};
use crate::query::Query;
use crate::state::AppState;
use crate::validate;

/// The longest a poll may wait for a new message.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(30);
/// While waiting, how often the stream is read again regardless of the store's signal: a safety net only,
/// since the signal moves for every node's commits (see [`herald_store::StreamSignal`]).
pub(crate) const RECHECK: Duration = Duration::from_secs(5);
/// The default lease of a v2 poll.
const DEFAULT_LEASE_MS: i64 = 30_000;
/// The longest lease of a v2 poll.
const MAX_LEASE_MS: i64 = 5 * 60_000;
/// Page sizes.
const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 250;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/app/{app_id}/poller/{sink_id}", get(poll))
        .route(
            "/app/{app_id}/poller/{sink_id}/consumer/{consumer_id}",
            get(consumer_poll),
        )
        .route(
            "/app/{app_id}/poller/{sink_id}/consumer/{consumer_id}/seek",
            post(consumer_seek),
        )
        .route(
            "/app/{app_id}/polling-endpoint/{sink_id}/consumer/{consumer_id}",
            get(v2_poll),
        )
        .route(
            "/app/{app_id}/polling-endpoint/{sink_id}/consumer/{consumer_id}/commit",
            post(v2_commit),
        )
}

fn store_error(error: StoreError) -> ApiError {
    ApiError::from_store(error, "polling endpoint")
}

/// What narrows a read besides the sink's own filters (the v1 poll's `event_type` and `channel`).
#[derive(Debug, Default)]
struct Narrowing {
    event_type: Option<String>,
    channel: Option<String>,
}

impl Narrowing {
    fn keeps(&self, message: &Message) -> bool {
        self.event_type.as_ref().is_none_or(|t| *t == message.event_type)
            && self.channel.as_ref().is_none_or(|c| {
                message
                    .channels
                    .as_ref()
                    .is_some_and(|have| have.iter().any(|h| h == c))
            })
    }
}

/// The query parameters every read takes.
struct ReadParams {
    limit: usize,
    wait: Duration,
}

impl ReadParams {
    fn of(query: &Query<'_>) -> ApiResult<Self> {
        let limit = match query.get(&["limit"]) {
            Some(text) => text
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| ApiError::query("limit", format!("expected an integer from 1 to {MAX_LIMIT}")))?,
            None => DEFAULT_LIMIT,
        };
        let max_ms = MAX_WAIT.as_millis();
        let wait = match query.get(&["wait_ms"]) {
            Some(text) => text
                .parse::<u64>()
                .ok()
                .filter(|ms| u128::from(*ms) <= max_ms)
                .map(Duration::from_millis)
                .ok_or_else(|| ApiError::query("wait_ms", format!("expected an integer from 0 to {max_ms}")))?,
            None => Duration::ZERO,
        };
        Ok(Self { limit, wait })
    }
}

/// An iterator this server issued: a stream position.
fn parse_iterator(text: &str) -> ApiResult<i64> {
    text.parse::<i64>()
        .ok()
        .filter(|seq| *seq >= 0)
        .ok_or_else(|| ApiError::from_store(StoreError::BadIterator, "iterator"))
}

fn consumer_id(id: &str) -> ApiResult<()> {
    validate::name("consumer_id", id, false).map_err(|error| error.relocated(Source::Path, "consumer_id"))
}

/// Read the sink's stream after `from`, waiting up to `wait` for a first message when there is none.
async fn read(
    state: &AppState,
    sink: &PollingEndpoint,
    from: i64,
    narrowing: &Narrowing,
    params: &ReadParams,
) -> ApiResult<StreamPage> {
    let deadline = Instant::now() + params.wait;
    // Held only by a poll that may wait: a held signal is a long poll waiting on this node, which on
    // PostgreSQL has the node watch the stream for other nodes' commits.
    let mut signal = (!params.wait.is_zero()).then(|| state.store.stream_signal());
    let mut from = from;
    loop {
        // Marked seen before the read: a commit after it wakes the wait below, none is missed.
        if let Some(signal) = signal.as_mut() {
            signal.mark_seen();
        }
        let page = herald_store::scan_stream(&*state.store, &sink.app_id, from, params.limit, |m| {
            sink.wants(m) && narrowing.keeps(m)
        })
        .await
        .map_err(store_error)?;
        let now = Instant::now();
        let waits = page.entries.is_empty() && page.done && now < deadline;
        let (true, Some(signal)) = (waits, signal.as_mut()) else {
            return Ok(page);
        };
        from = page.position;
        let nap = (deadline - now).min(RECHECK);
        // Until a commit moves the signal or the nap ends (then `Elapsed`, ignored); `changed` never fails
        // here, as `state.store` outlives this read.
        let _ = tokio::time::timeout(nap, signal.changed()).await;
    }
}

fn message_out(message: &Message) -> MessageOut {
    convert::message(message, true)
}

fn page_out(page: &StreamPage) -> PollingEndpointOut {
    PollingEndpointOut {
        data: page.entries.iter().map(|e| message_out(&e.message)).collect(),
        iterator: page.position.to_string(),
        done: page.done,
    }
}

/// Where a consumer never seen before starts: the beginning of the stream, or its end (`latest`).
async fn new_consumer_start(state: &AppState, sink: &PollingEndpoint, latest: bool) -> ApiResult<i64> {
    if latest {
        state.store.stream_head(&sink.app_id).await.map_err(store_error)
    } else {
        Ok(0)
    }
}

async fn poll(
    State(state): State<AppState>,
    Path((app_id, sink_id)): Path<(AppIdOrUid, SinkIdOrUid)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<PollingEndpointOut>> {
    let query = Query::of(&uri);
    let params = ReadParams::of(&query)?;
    let narrowing = Narrowing {
        event_type: query.get(&["event_type"]).map(str::to_owned),
        channel: query.get(&["channel"]).map(str::to_owned),
    };
    let after = query.time(&["after"])?;
    let sink = lookup::polling_endpoint(&state, &app_id, &sink_id).await?;
    let from = match (query.get(&["iterator"]).filter(|s| !s.is_empty()), after) {
        (Some(iterator), _) => parse_iterator(iterator)?,
        (None, Some(time)) => position_at(&state, &sink, time).await?,
        (None, None) => 0,
    };
    let page = read(&state, &sink, from, &narrowing, &params).await?;
    Ok(Json(page_out(&page)))
}

/// The position before the sink's app's first message created at or after `time` (the stream's end
/// when there is none yet).
async fn position_at(state: &AppState, sink: &PollingEndpoint, time: Millis) -> ApiResult<i64> {
    match state
        .store
        .stream_position_at(&sink.app_id, time)
        .await
        .map_err(store_error)?
    {
        Some(position) => Ok(position),
        None => state.store.stream_head(&sink.app_id).await.map_err(store_error),
    }
}

async fn consumer_poll(
    State(state): State<AppState>,
    Path((app_id, sink_id, consumer)): Path<(AppIdOrUid, SinkIdOrUid, String)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<PollingEndpointOut>> {
    consumer_id(&consumer)?;
    let query = Query::of(&uri);
    let params = ReadParams::of(&query)?;
    let sink = lookup::polling_endpoint(&state, &app_id, &sink_id).await?;
    let from = match query.get(&["iterator"]).filter(|s| !s.is_empty()) {
        // Coming back with the last answer's iterator acknowledges everything before it.
        Some(iterator) => {
            let position = parse_iterator(iterator)?;
            state
                .store
                .put_consumer_offset(&sink.id, &consumer, &ConsumerOffset::at(position), clock::now())
                .await
                .map_err(store_error)?;
            position
        }
        None => match state
            .store
            .consumer_offset(&sink.id, &consumer)
            .await
            .map_err(store_error)?
        {
            Some(offset) => offset.committed,
            None => new_consumer_start(&state, &sink, false).await?,
        },
    };
    let page = read(&state, &sink, from, &Narrowing::default(), &params).await?;
    Ok(Json(page_out(&page)))
}

async fn consumer_seek(
    State(state): State<AppState>,
    Path((app_id, sink_id, consumer)): Path<(AppIdOrUid, SinkIdOrUid, String)>,
    JsonBody(input): JsonBody<PollingEndpointConsumerSeekIn>,
) -> ApiResult<Json<PollingEndpointConsumerSeekOut>> {
    consumer_id(&consumer)?;
    let sink = lookup::polling_endpoint(&state, &app_id, &sink_id).await?;
    let position = position_at(&state, &sink, Millis::from_datetime(input.after)).await?;
    state
        .store
        .put_consumer_offset(&sink.id, &consumer, &ConsumerOffset::at(position), clock::now())
        .await
        .map_err(store_error)?;
    Ok(Json(PollingEndpointConsumerSeekOut {
        iterator: position.to_string(),
    }))
}

async fn v2_poll(
    State(state): State<AppState>,
    Path((app_id, sink_id, consumer)): Path<(AppIdOrUid, SinkIdOrUid, String)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<PollerV2PollOut>> {
    consumer_id(&consumer)?;
    let query = Query::of(&uri);
    let params = ReadParams::of(&query)?;
    let lease_ms = match query.get(&["lease_duration_ms"]) {
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|ms| (1..=MAX_LEASE_MS).contains(ms))
            .ok_or_else(|| {
                ApiError::query(
                    "lease_duration_ms",
                    format!("expected an integer from 1 to {MAX_LEASE_MS}"),
                )
            })?,
        None => DEFAULT_LEASE_MS,
    };
    let latest = match query.get(&["starting_position"]) {
        None | Some("earliest") => false,
        Some("latest") => true,
        Some(_) => {
            return Err(ApiError::query(
                "starting_position",
                "expected \"earliest\" or \"latest\"",
            ));
        }
    };
    let sink = lookup::polling_endpoint(&state, &app_id, &sink_id).await?;
    let known = state
        .store
        .consumer_offset(&sink.id, &consumer)
        .await
        .map_err(store_error)?;
    let offset = match known {
        Some(offset) => offset,
        None => ConsumerOffset::at(new_consumer_start(&state, &sink, latest).await?),
    };
    let from = offset.next_from(clock::now());
    let page = read(&state, &sink, from, &Narrowing::default(), &params).await?;
    let now = clock::now();
    let next = if page.entries.is_empty() && from == offset.committed {
        // Nothing handed out and nothing outstanding: what was read matched nothing, so it is done with.
        ConsumerOffset::at(page.position)
    } else if page.entries.is_empty() {
        // Nothing new, but an earlier batch is still leased: keep its lease, skip what matched nothing.
        ConsumerOffset {
            leased: page.position,
            ..offset
        }
    } else {
        ConsumerOffset {
            committed: offset.committed,
            leased: page.position,
            lease_expires_at: now.add_ms(lease_ms),
        }
    };
    // A new consumer's start is kept even when nothing came back: `latest` means the end of the stream
    // at its first poll, not at each poll until a message arrives (which would skip what commits between).
    if next != offset || known.is_none() {
        state
            .store
            .put_consumer_offset(&sink.id, &consumer, &next, now)
            .await
            .map_err(store_error)?;
    }
    Ok(Json(PollerV2PollOut {
        data: page
            .entries
            .iter()
            .map(|e| PollerV2MessageOut {
                offset: e.seq,
                message: message_out(&e.message),
            })
            .collect(),
        done: page.done,
    }))
}

async fn v2_commit(
    State(state): State<AppState>,
    Path((app_id, sink_id, consumer)): Path<(AppIdOrUid, SinkIdOrUid, String)>,
    JsonBody(input): JsonBody<PollerV2CommitIn>,
) -> ApiResult<StatusCode> {
    consumer_id(&consumer)?;
    let sink = lookup::polling_endpoint(&state, &app_id, &sink_id).await?;
    let head = state.store.stream_head(&sink.app_id).await.map_err(store_error)?;
    // The document bounds `offset` (0 and up); one past the stream's head conflicts with the stream as
    // it is now (409, as the state of the resource decides it), rather than being malformed.
    if input.offset > head {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "offset {} is past what this stream handed out (0 to {head})",
                input.offset
            ),
        ));
    }
    if input.offset < 0 {
        return Err(ApiError::body(
            "offset",
            format!("must be 0 or more, got {}", input.offset),
        ));
    }
    state
        .store
        .commit_consumer(&sink.id, &consumer, input.offset, clock::now())
        .await
        .map_err(store_error)?;
    Ok(StatusCode::NO_CONTENT)
}
