//! The lookups every resource shares: an application by id or uid, the id it resolves to, an endpoint or a
//! polling endpoint of an application, and the typed id a path segment names. They live apart from the
//! routes so that authentication and the resources that nest under an application use them without
//! importing one another.
//!
//! The handlers extract a path's `{app_id}`, `{endpoint_id}`, `{sink_id}` and `{msg_id}` as the
//! [`IdOrUid`](herald_core::id::IdOrUid) of their kind, so one segment cannot be looked up as another's:
//! the lookups take those types, not text.

use herald_core::id::{AppId, AppIdOrUid, EndpointIdOrUid, Id, Kind, SinkIdOrUid};
use herald_core::model::{Application, Endpoint};
use herald_store::PollingEndpoint;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The id of kind `K` a path segment names, or 404 for `what`: a text that is no such id names nothing
/// (the same answer as an id nobody has).
pub(crate) fn id<K: Kind>(text: &str, what: &str) -> ApiResult<Id<K>> {
    Id::parse(text).map_err(|_| ApiError::not_found(what))
}

/// Look up an app by id or uid, answering 404 when missing.
pub(crate) async fn app(state: &AppState, id_or_uid: &AppIdOrUid) -> ApiResult<Application> {
    state
        .store
        .get_app(id_or_uid)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))
}

/// The id of the app an id or uid names, from memory when possible (the message hot path). The store
/// re-checks that the app exists when it commits the message.
pub(crate) async fn app_id(state: &AppState, id_or_uid: &AppIdOrUid) -> ApiResult<AppId> {
    if let Some(id) = state.app_ids.get(id_or_uid) {
        return Ok(id);
    }
    let app = app(state, id_or_uid).await?;
    state.app_ids.insert(id_or_uid, &app.id);
    Ok(app.id)
}

/// Look up an endpoint of an app by id or uid.
pub(crate) async fn endpoint(state: &AppState, app_id: &AppId, endpoint_id: &EndpointIdOrUid) -> ApiResult<Endpoint> {
    state
        .store
        .get_endpoint(app_id, endpoint_id)
        .await
        .map_err(|e| ApiError::from_store(e, "endpoint"))
}

/// The polling endpoint `sink_id` (id or uid) of the application `app_id` (id or uid).
pub(crate) async fn polling_endpoint(
    state: &AppState,
    app_id: &AppIdOrUid,
    sink_id: &SinkIdOrUid,
) -> ApiResult<PollingEndpoint> {
    let app_id = self::app_id(state, app_id).await?;
    state
        .store
        .get_polling_endpoint(&app_id, sink_id)
        .await
        .map_err(|e| ApiError::from_store(e, "polling endpoint"))
}
