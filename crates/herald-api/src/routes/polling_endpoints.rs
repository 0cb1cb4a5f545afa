//! Polling endpoints (a Herald resource; the SDKs read them through the `sink_id` of the poller paths):
//! `/app/{app_id}/polling-endpoint`, `/app/{app_id}/polling-endpoint/{sink_id}` and its `/secret` (the
//! key `herald listen` signs forwarded messages with) and `/token` (a token that reads only this polling
//! endpoint's stream, see [`crate::auth`]). Their streams are read through [`super::poller`].

use std::collections::BTreeSet;

use axum::extract::{OriginalUri, Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_core::clock;
use herald_core::id::{AppIdOrUid, IdKind, SinkId, SinkIdOrUid};
use herald_store::{PollingEndpoint, StoreError};

use super::tenancy;
use crate::body::JsonBody;

use crate::error::{ApiError, ApiResult};
use crate::keys::{initial_key, secret_out};
use crate::lookup;
use crate::model::{
    EndpointSecretOut, ListResponse, Metadata, PollingEndpointIn, PollingEndpointPatch, PollingEndpointSinkOut,
    PollingEndpointTokenIn, PollingEndpointTokenOut,
};
use crate::query::Query;
use crate::state::AppState;
use crate::validate;

/// Most event types a polling endpoint may list (as an endpoint).
const MAX_EVENT_TYPES: usize = 256;
/// Most channels a polling endpoint may list (as an endpoint).
const MAX_CHANNELS: usize = 10;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/app/{app_id}/polling-endpoint", get(list).post(create))
        .route(
            "/app/{app_id}/polling-endpoint/{sink_id}",
            get(read).patch(patch).delete(remove),
        )
        .route("/app/{app_id}/polling-endpoint/{sink_id}/secret", get(secret))
        .route("/app/{app_id}/polling-endpoint/{sink_id}/token", post(issue_token))
}

fn store_error(error: StoreError) -> ApiError {
    ApiError::from_store(error, "polling endpoint")
}

/// The fields a client sets, validated.
struct SinkFields {
    uid: Option<String>,
    description: String,
    event_types: Option<BTreeSet<String>>,
    channels: Option<BTreeSet<String>>,
    metadata: Metadata,
}

impl SinkFields {
    fn validate(self) -> ApiResult<Self> {
        if let Some(uid) = &self.uid {
            validate::uid(uid, IdKind::PollingEndpoint)?;
        }
        validate::text("description", &self.description, false, 4096)?;
        if let Some(types) = &self.event_types {
            validate::names("eventTypes", types, MAX_EVENT_TYPES, false)?;
        }
        if let Some(channels) = &self.channels {
            validate::names("channels", channels, MAX_CHANNELS, true)?;
        }
        Ok(self)
    }

    fn apply(self, sink: &mut PollingEndpoint) {
        let list = |set: Option<BTreeSet<String>>| set.map(|s| s.into_iter().collect::<Vec<_>>());
        sink.uid = self.uid;
        sink.description = self.description;
        sink.filter_types = list(self.event_types);
        sink.channels = list(self.channels);
        sink.metadata = self.metadata;
    }

    fn of_patch(sink: &PollingEndpoint, patch: PollingEndpointPatch) -> Self {
        let set = |list: &Option<Vec<String>>| list.as_ref().map(|l| l.iter().cloned().collect::<BTreeSet<_>>());
        let mut uid = sink.uid.clone();
        patch.uid.apply_to(&mut uid);
        let mut event_types = set(&sink.filter_types);
        patch.event_types.apply_to(&mut event_types);
        let mut channels = set(&sink.channels);
        patch.channels.apply_to(&mut channels);
        Self {
            uid,
            description: patch.description.unwrap_or_else(|| sink.description.clone()),
            event_types,
            channels,
            metadata: patch.metadata.unwrap_or_else(|| sink.metadata.clone()),
        }
    }
}

/// The answer shape of a polling endpoint.
fn out(sink: PollingEndpoint) -> PollingEndpointSinkOut {
    let set = |list: Option<Vec<String>>| list.map(|l| l.into_iter().collect::<BTreeSet<_>>());
    PollingEndpointSinkOut {
        id: sink.id,
        uid: sink.uid,
        description: sink.description,
        event_types: set(sink.filter_types),
        channels: set(sink.channels),
        metadata: sink.metadata,
        created_at: sink.created_at.to_datetime(),
        updated_at: sink.updated_at.to_datetime(),
    }
}

async fn list(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<PollingEndpointSinkOut>>> {
    let page = Query::of(&uri).page()?;
    if page.reverse {
        return Err(ApiError::query("iterator", "polling endpoints are listed forward only"));
    }
    let app_id = lookup::app_id(&state, &app_id).await?;
    let mut found = state
        .store
        .list_polling_endpoints(&app_id, page.after.as_deref(), page.limit + 1)
        .await
        .map_err(store_error)?;
    let done = found.len() <= page.limit;
    found.truncate(page.limit);
    let iterator = if done {
        None
    } else {
        found.last().map(|s| s.id.to_string())
    };
    Ok(Json(ListResponse {
        data: found.into_iter().map(out).collect(),
        iterator,
        prev_iterator: None,
        done,
    }))
}

async fn create(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    JsonBody(input): JsonBody<PollingEndpointIn>,
) -> ApiResult<(StatusCode, Json<PollingEndpointSinkOut>)> {
    let app_id = lookup::app_id(&state, &app_id).await?;
    let secret = initial_key(input.secret.as_deref(), None)?;
    let fields = SinkFields {
        uid: input.uid,
        description: input.description,
        event_types: input.event_types,
        channels: input.channels,
        metadata: input.metadata,
    }
    .validate()?;
    let now = clock::now();
    let mut sink = PollingEndpoint {
        id: SinkId::new(),
        app_id,
        uid: None,
        description: String::new(),
        filter_types: None,
        channels: None,
        metadata: Metadata::new(),
        secret,
        created_at: now,
        updated_at: now,
    };
    fields.apply(&mut sink);
    state.store.create_polling_endpoint(&sink).await.map_err(store_error)?;
    Ok((StatusCode::CREATED, Json(out(sink))))
}

async fn read(
    State(state): State<AppState>,
    Path((app_id, sink_id)): Path<(AppIdOrUid, SinkIdOrUid)>,
) -> ApiResult<Json<PollingEndpointSinkOut>> {
    Ok(Json(out(lookup::polling_endpoint(&state, &app_id, &sink_id).await?)))
}

async fn patch(
    State(state): State<AppState>,
    Path((app_id, sink_id)): Path<(AppIdOrUid, SinkIdOrUid)>,
    JsonBody(input): JsonBody<PollingEndpointPatch>,
) -> ApiResult<Json<PollingEndpointSinkOut>> {
    let mut sink = lookup::polling_endpoint(&state, &app_id, &sink_id).await?;
    SinkFields::of_patch(&sink, input).validate()?.apply(&mut sink);
    sink.updated_at = clock::now();
    state.store.update_polling_endpoint(&sink).await.map_err(store_error)?;
    Ok(Json(out(sink)))
}

async fn remove(
    State(state): State<AppState>,
    Path((app_id, sink_id)): Path<(AppIdOrUid, SinkIdOrUid)>,
) -> ApiResult<StatusCode> {
    let sink = lookup::polling_endpoint(&state, &app_id, &sink_id).await?;
    state
        .store
        .delete_polling_endpoint(&sink.app_id, &sink.id)
        .await
        .map_err(store_error)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn secret(
    State(state): State<AppState>,
    Path((app_id, sink_id)): Path<(AppIdOrUid, SinkIdOrUid)>,
) -> ApiResult<Json<EndpointSecretOut>> {
    let sink = lookup::polling_endpoint(&state, &app_id, &sink_id).await?;
    Ok(Json(secret_out(sink.secret)))
}

/// Every polling endpoint token starts with this, so one found in a log is recognisable.
const TOKEN_PREFIX: &str = "herald_sink_";

async fn issue_token(
    State(state): State<AppState>,
    Path((app_id, sink_id)): Path<(AppIdOrUid, SinkIdOrUid)>,
    JsonBody(input): JsonBody<PollingEndpointTokenIn>,
) -> ApiResult<Json<PollingEndpointTokenOut>> {
    let expiry = tenancy::expiry_of(input.expiry)?;
    let sink = lookup::polling_endpoint(&state, &app_id, &sink_id).await?;
    // Read-only: whatever else it could be allowed, it never writes (see `crate::auth`).
    let token = tenancy::mint(&state, TOKEN_PREFIX, &sink.app_id, Some(&sink.id), None, true, expiry).await?;
    Ok(Json(PollingEndpointTokenOut { token }))
}
