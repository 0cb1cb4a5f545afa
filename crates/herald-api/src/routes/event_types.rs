//! Event types: `/event-type`, `/event-type/{name}`.

use axum::extract::{OriginalUri, Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use herald_core::clock::{self, Millis};
use herald_core::model::EventType;
use herald_store::StoreError;

use crate::body::JsonBody;
use crate::convert;
use crate::error::{ApiError, ApiResult, Source};
use crate::model::{EventTypeIn, EventTypeOut, EventTypePatch, EventTypeUpdate, JsonObject, ListResponse};
use crate::query::Query;
use crate::state::AppState;
use crate::validate;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/event-type", get(list).post(create))
        .route("/event-type/{name}", get(read).put(replace).patch(patch).delete(remove))
}

pub(super) fn store_error(error: StoreError) -> ApiError {
    ApiError::from_store(error, "event type")
}

fn schemas_text(schemas: Option<JsonObject>) -> Option<String> {
    schemas.map(|s| serde_json::Value::Object(s).to_string())
}

async fn list(
    State(state): State<AppState>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<EventTypeOut>>> {
    let query = Query::of(&uri);
    let page = query.page()?;
    let include_archived = query.flag("include_archived", false)?;
    let found = state
        .store
        .list_event_types(&page, include_archived, query.descending(false))
        .await
        .map_err(store_error)?;
    Ok(Json(convert::list(found, convert::event_type)))
}

async fn create(
    State(state): State<AppState>,
    JsonBody(input): JsonBody<EventTypeIn>,
) -> ApiResult<(StatusCode, Json<EventTypeOut>)> {
    validate::name("name", &input.name, false)?;
    let fields = Replacement {
        description: input.description,
        archived: input.archived,
        deprecated: input.deprecated,
        feature_flag: input.feature_flag,
        feature_flags: input.feature_flags,
        group_name: input.group_name,
        schemas: input.schemas,
    };
    fields.validate()?;
    let now = clock::now();
    let et = fields.into_event_type(input.name, now, now);
    state.store.create_event_type(&et).await.map_err(store_error)?;
    Ok((StatusCode::CREATED, Json(convert::event_type(et))))
}

async fn read(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Json<EventTypeOut>> {
    Ok(Json(convert::event_type(
        state.store.get_event_type(&name).await.map_err(store_error)?,
    )))
}

/// PUT replaces the event type, creating it when missing (Svix's SDKs treat PUT as an upsert).
async fn replace(
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(input): JsonBody<EventTypeUpdate>,
) -> ApiResult<(StatusCode, Json<EventTypeOut>)> {
    let fields = Replacement {
        description: input.description,
        archived: input.archived,
        deprecated: input.deprecated,
        feature_flag: input.feature_flag,
        feature_flags: input.feature_flags,
        group_name: input.group_name,
        schemas: input.schemas,
    };
    let (et, created) = upsert(&state, name, fields).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(convert::event_type(et))))
}

/// The most feature flags an event type may carry.
pub(super) const MAX_FEATURE_FLAGS: usize = 100;

/// What a replacement (or a creation) sets on an event type.
pub(super) struct Replacement {
    pub(super) description: String,
    pub(super) archived: bool,
    pub(super) deprecated: bool,
    pub(super) feature_flag: Option<String>,
    pub(super) feature_flags: Option<Vec<String>>,
    pub(super) group_name: Option<String>,
    pub(super) schemas: Option<JsonObject>,
}

impl Replacement {
    /// Check the fields every write of an event type takes (its name is the caller's to check).
    pub(super) fn validate(&self) -> ApiResult<()> {
        validate::text("description", &self.description, false, validate::MAX_DESCRIPTION_LEN)?;
        check_extras(self.feature_flags.as_deref(), self.group_name.as_deref())
    }

    /// The event type `name` with these fields.
    fn into_event_type(self, name: String, created_at: Millis, updated_at: Millis) -> EventType {
        EventType {
            name,
            description: self.description,
            archived: self.archived,
            deprecated: self.deprecated,
            feature_flag: self.feature_flag,
            feature_flags: self.feature_flags.map(distinct),
            group_name: self.group_name,
            schemas: schemas_text(self.schemas),
            created_at,
            updated_at,
        }
    }
}

/// `featureFlags` (each a name, at most [`MAX_FEATURE_FLAGS`]) and `groupName` (text of at most 256
/// characters), as a create, replace or patch gives them.
pub(super) fn check_extras(feature_flags: Option<&[String]>, group_name: Option<&str>) -> ApiResult<()> {
    if let Some(flags) = feature_flags {
        validate::names("featureFlags", flags, MAX_FEATURE_FLAGS, false)?;
    }
    if let Some(group) = group_name {
        validate::text("groupName", group, false, validate::MAX_NAME_LEN)?;
    }
    Ok(())
}

/// The flags in their first order, each once.
fn distinct(flags: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    flags.into_iter().filter(|flag| seen.insert(flag.clone())).collect()
}

/// Replace the event type `name` with `fields`, creating it when missing; the stored event type, and
/// whether it was created.
pub(super) async fn upsert(state: &AppState, name: String, fields: Replacement) -> ApiResult<(EventType, bool)> {
    fields.validate()?;
    let now = clock::now();
    let existing = match state.store.get_event_type(&name).await {
        Ok(et) => Some(et),
        Err(StoreError::NotFound) => {
            validate::name("name", &name, false).map_err(|error| error.relocated(Source::Path, "name"))?;
            None
        }
        Err(other) => return Err(store_error(other)),
    };
    let created_at = existing.as_ref().map_or(now, |e| e.created_at);
    let et = fields.into_event_type(name, created_at, now);
    if existing.is_some() {
        state.store.update_event_type(&et).await.map_err(store_error)?;
    } else {
        state.store.create_event_type(&et).await.map_err(store_error)?;
    }
    Ok((et, existing.is_none()))
}

async fn patch(
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(input): JsonBody<EventTypePatch>,
) -> ApiResult<Json<EventTypeOut>> {
    let mut et = state.store.get_event_type(&name).await.map_err(store_error)?;
    if let Some(description) = input.description {
        validate::text("description", &description, false, validate::MAX_DESCRIPTION_LEN)?;
        et.description = description;
    }
    if let Some(archived) = input.archived {
        et.archived = archived;
    }
    if let Some(deprecated) = input.deprecated {
        et.deprecated = deprecated;
    }
    input.feature_flag.apply_to(&mut et.feature_flag);
    input.feature_flags.apply_to(&mut et.feature_flags);
    input.group_name.apply_to(&mut et.group_name);
    check_extras(et.feature_flags.as_deref(), et.group_name.as_deref())?;
    et.feature_flags = et.feature_flags.map(distinct);
    if let Some(update) = input.schemas.into_update() {
        et.schemas = schemas_text(update);
    }
    et.updated_at = clock::now();
    state.store.update_event_type(&et).await.map_err(store_error)?;
    Ok(Json(convert::event_type(et)))
}

/// DELETE archives the event type, as Svix does (endpoints filtering on it keep working and it can be
/// unarchived); `?expunge=true` deletes it for good.
async fn remove(
    State(state): State<AppState>,
    Path(name): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<StatusCode> {
    if Query::of(&uri).flag("expunge", false)? {
        state.store.delete_event_type(&name).await.map_err(store_error)?;
    } else {
        let mut et = state.store.get_event_type(&name).await.map_err(store_error)?;
        et.archived = true;
        et.updated_at = clock::now();
        state.store.update_event_type(&et).await.map_err(store_error)?;
    }
    Ok(StatusCode::NO_CONTENT)
}
