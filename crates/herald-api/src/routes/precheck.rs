//! `POST /app/{app_id}/msg/precheck/active` (Svix's `v1.message.precheck`): whether a message of this event
//! type on these channels would reach any enabled endpoint now — so a producer can skip building a payload
//! nobody would get. The answer is a snapshot: an endpoint created or enabled right after changes it.

use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use herald_core::id::AppIdOrUid;

use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::lookup;
use crate::model::{MessagePrecheckIn, MessagePrecheckOut};
use crate::state::AppState;
use crate::validate;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/app/{app_id}/msg/precheck/active", post(precheck))
}

async fn precheck(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    JsonBody(input): JsonBody<MessagePrecheckIn>,
) -> ApiResult<Json<MessagePrecheckOut>> {
    validate::name("eventType", &input.event_type, false)?;
    let app = lookup::app(&state, &app_id).await?;
    let endpoints = state
        .store
        .app_endpoints(&app.id)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))?;
    let channels: Option<Vec<String>> = input.channels.map(|set| set.into_iter().collect());
    let active = endpoints
        .iter()
        .any(|endpoint| !endpoint.disabled && endpoint.subscribes_to(&input.event_type, channels.as_deref()));
    Ok(Json(MessagePrecheckOut { active }))
}
