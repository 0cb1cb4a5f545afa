//! Applications: `/app`, `/app/{app_id}` (an id or a uid).

use axum::extract::{OriginalUri, Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use herald_core::clock;
use herald_core::id::{AppId, AppIdOrUid, IdKind};
use herald_core::model::Application;
use herald_store::{AppFilter, StoreError};

use crate::body::JsonBody;
use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::lookup;
use crate::model::{ApplicationIn, ApplicationOut, ApplicationPatch, ListResponse};
use crate::query::Query;
use crate::state::AppState;
use crate::validate;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/app", get(list).post(create))
        .route("/app/{app_id}", get(read).put(replace).patch(patch).delete(remove))
}

fn check(name: &str, uid: Option<&str>, metadata: &crate::model::Metadata) -> ApiResult<()> {
    validate::text("name", name, true, validate::MAX_NAME_LEN)?;
    validate::metadata(metadata)?;
    if let Some(uid) = uid {
        validate::uid(uid, IdKind::Application)?;
    }
    Ok(())
}

/// Validate a whole [`ApplicationIn`], also where it is then ignored (an inline `application` of a message
/// or a portal-access request naming an existing app, `get_if_exists` finding one): a body the document
/// refuses is refused wherever it is sent.
fn check_in(input: &ApplicationIn) -> ApiResult<()> {
    check(&input.name, input.uid.as_deref(), &input.metadata)?;
    retention(input.payload_retention_period).map(drop)
}

/// The app's default payload retention (`payloadRetentionPeriod`, days), validated as a message's.
fn retention(days: Option<i64>) -> ApiResult<Option<u32>> {
    days.map(|d| validate::retention_days("payloadRetentionPeriod", d))
        .transpose()
}

/// The id of the app the path's `id_or_uid` names; when there is none and the body has an inline
/// `application` (a message's, a portal-access request's), it is created first, as Svix does.
pub(crate) async fn id_or_create(
    state: &AppState,
    id_or_uid: &AppIdOrUid,
    application: Option<ApplicationIn>,
) -> ApiResult<AppId> {
    match application {
        Some(application) => resolve_or_create(state, id_or_uid, application)
            .await
            .map_err(|error| error.nested(&["application".to_owned()])),
        None => lookup::app_id(state, id_or_uid).await,
    }
}

/// The id of the app `id_or_uid` names, creating it from `input` when there is none (an inline
/// `application` is ignored when the app exists, but validated all the same). The new app takes
/// `id_or_uid` as its uid; a different `uid` in `input` is refused, as is a missing app named by an
/// `app_…` id (ids are Herald's to give).
async fn resolve_or_create(state: &AppState, id_or_uid: &AppIdOrUid, mut input: ApplicationIn) -> ApiResult<AppId> {
    check_in(&input)?;
    match lookup::app_id(state, id_or_uid).await {
        Err(error) if error.status == StatusCode::NOT_FOUND => {}
        found => return found,
    }
    input.uid = Some(validate::uid_for_put(
        ("app_id", id_or_uid),
        input.uid.as_deref(),
        "application",
    )?);
    match create_new(state, input).await {
        Ok(app) => Ok(app.id),
        // Another request created it meanwhile: use that one.
        Err(error) if error.status == StatusCode::CONFLICT => lookup::app_id(state, id_or_uid).await,
        Err(error) => Err(error),
    }
}

async fn list(
    State(state): State<AppState>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<ApplicationOut>>> {
    let query = Query::of(&uri);
    let page = query.page()?;
    // Oldest first unless `order=descending`.
    let filter = AppFilter {
        newest_first: query.descending(false),
        exclude_without_endpoints: query.flag("exclude_apps_with_no_endpoints", false)?,
        exclude_only_disabled: query.flag("exclude_apps_with_disabled_endpoints", false)?,
        exclude_only_svix_play: query.flag("exclude_apps_with_svix_play_endpoints", false)?,
    };
    let apps = state
        .store
        .list_apps(&page, &filter)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))?;
    Ok(Json(convert::list(apps, convert::application)))
}

async fn create(
    State(state): State<AppState>,
    OriginalUri(uri): OriginalUri,
    JsonBody(input): JsonBody<ApplicationIn>,
) -> ApiResult<(StatusCode, Json<ApplicationOut>)> {
    check_in(&input)?;
    if Query::of(&uri).flag("get_if_exists", false)?
        && let Some(uid) = &input.uid
    {
        match state.store.get_app(&AppIdOrUid::new(uid)).await {
            Ok(existing) => return Ok((StatusCode::OK, Json(convert::application(existing)))),
            Err(StoreError::NotFound) => {}
            Err(other) => return Err(ApiError::from_store(other, "application")),
        }
    }
    insert(&state, input).await
}

/// Create a new app from `input`; 201 with it.
async fn insert(state: &AppState, input: ApplicationIn) -> ApiResult<(StatusCode, Json<ApplicationOut>)> {
    let app = create_new(state, input).await?;
    Ok((StatusCode::CREATED, Json(convert::application(app))))
}

/// Validate and store a new app.
pub(crate) async fn create_new(state: &AppState, input: ApplicationIn) -> ApiResult<Application> {
    check(&input.name, input.uid.as_deref(), &input.metadata)?;
    let app = new_app(input)?;
    state
        .store
        .create_app(&app)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))?;
    Ok(app)
}

fn new_app(input: ApplicationIn) -> ApiResult<Application> {
    let now = clock::now();
    Ok(Application {
        id: AppId::new(),
        uid: input.uid,
        name: input.name,
        rate_limit: input.throttle_rate.map(u32::from),
        verify_endpoints: input.verify_endpoints,
        payload_retention_days: retention(input.payload_retention_period)?,
        metadata: input.metadata,
        created_at: now,
        updated_at: now,
    })
}

async fn read(State(state): State<AppState>, Path(app_id): Path<AppIdOrUid>) -> ApiResult<Json<ApplicationOut>> {
    Ok(Json(convert::application(lookup::app(&state, &app_id).await?)))
}

/// PUT replaces the app, creating it (with the path segment as its uid) when it does not exist, as
/// Svix's SDKs expect.
async fn replace(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    JsonBody(input): JsonBody<ApplicationIn>,
) -> ApiResult<(StatusCode, Json<ApplicationOut>)> {
    check(&input.name, input.uid.as_deref(), &input.metadata)?;
    let payload_retention_days = retention(input.payload_retention_period)?;
    match state.store.get_app(&app_id).await {
        Ok(mut app) => {
            app.uid = input.uid;
            app.name = input.name;
            app.rate_limit = input.throttle_rate.map(u32::from);
            app.verify_endpoints = input.verify_endpoints;
            app.payload_retention_days = payload_retention_days;
            app.metadata = input.metadata;
            save(&state, &mut app).await?;
            Ok((StatusCode::OK, Json(convert::application(app))))
        }
        Err(StoreError::NotFound) => {
            let mut input = input;
            input.uid = Some(validate::uid_for_put(
                ("app_id", &app_id),
                input.uid.as_deref(),
                "application",
            )?);
            insert(&state, input).await
        }
        Err(other) => Err(ApiError::from_store(other, "application")),
    }
}

async fn patch(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    JsonBody(input): JsonBody<ApplicationPatch>,
) -> ApiResult<Json<ApplicationOut>> {
    let mut app = lookup::app(&state, &app_id).await?;
    if let Some(name) = input.name {
        app.name = name;
    }
    input.uid.apply_to(&mut app.uid);
    let mut rate = app.rate_limit.and_then(|r| u16::try_from(r).ok());
    input.throttle_rate.apply_to(&mut rate);
    app.rate_limit = rate.map(u32::from);
    if let Some(verify) = input.verify_endpoints {
        app.verify_endpoints = verify;
    }
    let mut days = app.payload_retention_days.map(i64::from);
    input.payload_retention_period.apply_to(&mut days);
    app.payload_retention_days = retention(days)?;
    if let Some(metadata) = input.metadata {
        app.metadata = metadata;
    }
    check(&app.name, app.uid.as_deref(), &app.metadata)?;
    save(&state, &mut app).await?;
    Ok(Json(convert::application(app)))
}

/// Store a changed app. Its uid may have moved, so the id cache starts over.
async fn save(state: &AppState, app: &mut Application) -> ApiResult<()> {
    app.updated_at = clock::now();
    state
        .store
        .update_app(app)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))?;
    state.app_ids.clear();
    Ok(())
}

async fn remove(State(state): State<AppState>, Path(app_id): Path<AppIdOrUid>) -> ApiResult<StatusCode> {
    let app = lookup::app(&state, &app_id).await?;
    state
        .store
        .delete_app(&app.id)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))?;
    state.app_ids.clear();
    Ok(StatusCode::NO_CONTENT)
}
