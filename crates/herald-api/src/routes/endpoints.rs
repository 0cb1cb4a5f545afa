//! Endpoints: `/app/{app_id}/endpoint`, `/app/{app_id}/endpoint/{endpoint_id}` and its `/verify` (its keys and
//! headers are in [`super::endpoint_secrets`]).

use std::collections::BTreeSet;

use axum::extract::{OriginalUri, Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_core::breaker::BreakerState;
use herald_core::clock::{self, Millis};
use herald_core::id::{AppIdOrUid, EndpointId, EndpointIdOrUid, IdKind};
use herald_core::model::{Application, DisabledReason, Endpoint, HeaderNames, Headers, Ordering};
use herald_store::StoreError;

use crate::body::JsonBody;
use crate::convert;
use crate::custom_headers;
use crate::error::{ApiError, ApiResult};
use crate::keys::{KeyKind, generate_key, initial_key, parse_key};
use crate::lookup;
use crate::model::{
    EndpointHealthOut, EndpointIn, EndpointOut, EndpointPatch, EndpointUpdate, ListResponse, Metadata, Patch,
};
use crate::query::Query;
use crate::state::AppState;
use crate::validate;

/// The header URL credentials become (custom header names are kept in lower case).
const AUTHORIZATION: &str = "authorization";

/// Most filter types an endpoint may list.
const MAX_FILTER_TYPES: usize = 256;
/// Most channels an endpoint may list.
const MAX_CHANNELS: usize = 10;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/app/{app_id}/endpoint", get(list).post(create))
        .route(
            "/app/{app_id}/endpoint/{endpoint_id}",
            get(read).put(replace).patch(patch).delete(remove),
        )
        .route("/app/{app_id}/endpoint/{endpoint_id}/verify", post(verify))
}

fn store_error(error: StoreError) -> ApiError {
    ApiError::from_store(error, "endpoint")
}

/// The fields every write of an endpoint sets, validated.
struct EndpointFields {
    url: String,
    description: String,
    uid: Option<String>,
    disabled: bool,
    filter_types: Option<BTreeSet<String>>,
    channels: Option<BTreeSet<String>>,
    throttle_rate: Option<u16>,
    max_concurrency: Option<u32>,
    /// As given; checked by `validate`.
    ordering: Option<String>,
    request_timeout_ms: Option<u32>,
    /// As given; checked by `validate`.
    signature_headers: Option<String>,
    metadata: Metadata,
    /// Basic-auth credentials taken out of the URL by `validate`, as an `Authorization` value: they are
    /// kept with the custom headers, which are sealed at rest, never in the URL column.
    url_credentials: Option<String>,
}

/// The shortest attempt timeout a client may set.
const MIN_REQUEST_TIMEOUT_MS: u32 = 100;

/// The largest per-endpoint concurrency cap a client may set.
const MAX_ENDPOINT_CONCURRENCY: u32 = 1_000;

impl EndpointFields {
    /// Validate, and canonicalise the URL the way the delivery client will read it.
    fn validate(mut self, state: &AppState) -> ApiResult<Self> {
        validate::url_length("url", &self.url)?;
        let target = state
            .policy
            .check_url(&self.url)
            .map_err(|e| ApiError::body("url", format!("{e}")))?;
        let mut url = target.url;
        self.url_credentials = crate::credentials::take_basic_auth(&mut url);
        self.url = url.to_string();
        validate::text("description", &self.description, false, validate::MAX_DESCRIPTION_LEN)?;
        validate::metadata(&self.metadata)?;
        if let Some(uid) = &self.uid {
            validate::uid(uid, IdKind::Endpoint)?;
        }
        if let Some(types) = &self.filter_types {
            validate::names("filterTypes", types, MAX_FILTER_TYPES, false)?;
        }
        if let Some(channels) = &self.channels {
            validate::names("channels", channels, MAX_CHANNELS, true)?;
        }
        if self.throttle_rate == Some(0) {
            return Err(ApiError::body("throttleRate", "must be at least 1"));
        }
        if let Some(cap) = self.max_concurrency
            && !(1..=MAX_ENDPOINT_CONCURRENCY).contains(&cap)
        {
            return Err(ApiError::body(
                "maxConcurrency",
                format!("must be between 1 and {MAX_ENDPOINT_CONCURRENCY}, got {cap}"),
            ));
        }
        let max_timeout = state.limits.max_request_timeout_ms;
        if let Some(ms) = self.request_timeout_ms
            && !(MIN_REQUEST_TIMEOUT_MS..=max_timeout).contains(&ms)
        {
            return Err(ApiError::body(
                "requestTimeoutMs",
                format!(
                    "must be between {MIN_REQUEST_TIMEOUT_MS} and {max_timeout} (the operator's bound), \
                 got {ms}"
                ),
            ));
        }
        if let Some(names) = &self.signature_headers
            && names.parse::<HeaderNames>().is_err()
        {
            return Err(ApiError::body(
                "signatureHeaders",
                format!("must be \"webhook\", \"svix\" or \"both\", got {names:?}"),
            ));
        }
        if let Some(mode) = &self.ordering
            && Ordering::parse(mode).is_none()
        {
            return Err(ApiError::body(
                "ordering",
                format!("must be \"none\" or \"key\", got {mode:?}"),
            ));
        }
        Ok(self)
    }

    fn apply(self, endpoint: &mut Endpoint) {
        let list = |set: Option<BTreeSet<String>>| set.map(|s| s.into_iter().collect::<Vec<_>>());
        endpoint.url = self.url;
        endpoint.description = self.description;
        endpoint.uid = self.uid;
        if endpoint.disabled != self.disabled {
            endpoint.disabled_reason = None;
        }
        endpoint.disabled = self.disabled;
        endpoint.filter_types = list(self.filter_types);
        endpoint.channels = list(self.channels);
        endpoint.rate_limit = self.throttle_rate.map(u32::from);
        endpoint.max_concurrency = self.max_concurrency;
        endpoint.request_timeout_ms = self.request_timeout_ms;
        endpoint.signature_headers = self.signature_headers.as_deref().and_then(|names| names.parse().ok());
        endpoint.ordering = self.ordering.as_deref().and_then(Ordering::parse).unwrap_or_default();
        endpoint.metadata = self.metadata;
        if let Some(authorization) = self.url_credentials {
            // Header names are kept as spelled: replace any spelling of the old one.
            endpoint
                .headers
                .retain(|name, _| !name.eq_ignore_ascii_case(AUTHORIZATION));
            endpoint.headers.insert("Authorization".to_owned(), authorization);
        }
    }

    fn of_patch(endpoint: &Endpoint, patch: EndpointPatch) -> Self {
        let set = |list: &Option<Vec<String>>| list.as_ref().map(|l| l.iter().cloned().collect::<BTreeSet<_>>());
        let mut uid = endpoint.uid.clone();
        patch.uid.apply_to(&mut uid);
        let mut filter_types = set(&endpoint.filter_types);
        patch.filter_types.apply_to(&mut filter_types);
        let mut channels = set(&endpoint.channels);
        patch.channels.apply_to(&mut channels);
        let mut throttle_rate = endpoint.rate_limit.and_then(|r| u16::try_from(r).ok());
        patch.throttle_rate.apply_to(&mut throttle_rate);
        let mut max_concurrency = endpoint.max_concurrency;
        patch.max_concurrency.apply_to(&mut max_concurrency);
        let mut request_timeout_ms = endpoint.request_timeout_ms;
        patch.request_timeout_ms.apply_to(&mut request_timeout_ms);
        let mut signature_headers = endpoint.signature_headers.map(|names| names.as_str().to_owned());
        patch.signature_headers.apply_to(&mut signature_headers);
        Self {
            url: patch.url.unwrap_or_else(|| endpoint.url.clone()),
            description: patch.description.unwrap_or_else(|| endpoint.description.clone()),
            uid,
            disabled: patch.disabled.unwrap_or(endpoint.disabled),
            filter_types,
            channels,
            throttle_rate,
            max_concurrency,
            request_timeout_ms,
            signature_headers,
            ordering: Some(patch.ordering.unwrap_or_else(|| endpoint.ordering.as_str().to_owned())),
            metadata: patch.metadata.unwrap_or_else(|| endpoint.metadata.clone()),
            url_credentials: None,
        }
    }
}

impl From<EndpointUpdate> for EndpointFields {
    fn from(u: EndpointUpdate) -> Self {
        Self {
            url: u.url,
            description: u.description,
            uid: u.uid,
            disabled: u.disabled,
            filter_types: u.filter_types,
            channels: u.channels,
            throttle_rate: u.throttle_rate,
            max_concurrency: u.max_concurrency,
            ordering: u.ordering,
            request_timeout_ms: u.request_timeout_ms,
            signature_headers: u.signature_headers,
            metadata: u.metadata,
            url_credentials: None,
        }
    }
}

async fn list(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<EndpointOut>>> {
    let query = Query::of(&uri);
    let page = query.page()?;
    // Newest first unless `order=ascending`, as Svix lists endpoints (the contract checked the value).
    let newest_first = query.descending(true);
    let app = lookup::app(&state, &app_id).await?;
    let found = state
        .store
        .list_endpoints(&app.id, &page, newest_first)
        .await
        .map_err(store_error)?;
    Ok(Json(convert::list(found, convert::endpoint)))
}

async fn create(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    JsonBody(input): JsonBody<EndpointIn>,
) -> ApiResult<(StatusCode, Json<EndpointOut>)> {
    let app = lookup::app(&state, &app_id).await?;
    let headers = match &input.headers {
        Some(given) => custom_headers::validate("headers", given)?,
        None => Headers::new(),
    };
    let has_authorization = headers.keys().any(|name| name.eq_ignore_ascii_case(AUTHORIZATION));
    if has_authorization && crate::credentials::has_userinfo(&input.url) {
        return Err(ApiError::body(
            "url",
            "holds credentials and headers sets Authorization too; give the credentials one way",
        ));
    }
    let secret = initial_key(input.secret.as_deref(), input.signature_type.as_deref())?;
    let endpoint = insert(&state, &app, EndpointId::new(), secret, headers, input.into_fields()).await?;
    Ok((StatusCode::CREATED, Json(convert::endpoint(endpoint))))
}

async fn insert(
    state: &AppState,
    app: &Application,
    id: EndpointId,
    secret: String,
    headers: Headers,
    fields: EndpointFields,
) -> ApiResult<Endpoint> {
    let fields = fields.validate(state)?;
    let now = clock::now();
    let mut endpoint = Endpoint {
        id,
        app_id: app.id.clone(),
        uid: None,
        url: String::new(),
        description: String::new(),
        filter_types: None,
        channels: None,
        disabled: false,
        disabled_reason: None,
        rate_limit: None,
        max_concurrency: None,
        ordering: Ordering::Unordered,
        request_timeout_ms: None,
        signature_headers: None,
        version: 1,
        metadata: Metadata::new(),
        secret,
        headers,
        created_at: now,
        updated_at: now,
    };
    fields.apply(&mut endpoint);
    if app.verify_endpoints {
        await_verification(&mut endpoint);
    }
    // Written held, the endpoint's check runs on the engine's hearing of it (the store's change stream).
    state.store.create_endpoint(&endpoint).await.map_err(store_error)?;
    Ok(endpoint)
}

/// Hold an endpoint until its ownership check passes (the engine enables it then).
fn await_verification(endpoint: &mut Endpoint) {
    endpoint.disabled = true;
    endpoint.disabled_reason = Some(DisabledReason::AwaitingVerification);
}

impl EndpointIn {
    fn into_fields(self) -> EndpointFields {
        EndpointFields {
            url: self.url,
            description: self.description,
            uid: self.uid,
            disabled: self.disabled,
            filter_types: self.filter_types,
            channels: self.channels,
            throttle_rate: self.throttle_rate,
            max_concurrency: self.max_concurrency,
            ordering: self.ordering,
            request_timeout_ms: self.request_timeout_ms,
            signature_headers: self.signature_headers,
            metadata: self.metadata,
            url_credentials: None,
        }
    }
}

async fn read(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
) -> ApiResult<Json<EndpointOut>> {
    let app = lookup::app(&state, &app_id).await?;
    let endpoint = lookup::endpoint(&state, &app.id, &endpoint_id).await?;
    let health = health(&state, &endpoint).await?;
    let mut out = convert::endpoint(endpoint);
    out.health = Some(health);
    Ok(Json(out))
}

/// The endpoint's flow-control state: the engine's breaker and in-flight count, the store's queue.
async fn health(state: &AppState, endpoint: &Endpoint) -> ApiResult<EndpointHealthOut> {
    let backlog = state
        .store
        .endpoint_backlogs(std::slice::from_ref(&endpoint.id))
        .await
        .map_err(store_error)?
        .pop()
        .unwrap_or_default();
    let snapshot = match &state.engine {
        Some(engine) => engine.endpoint_health(&endpoint.id).await,
        None => None,
    };
    let default_cap = state.engine.as_ref().map_or(1, |e| e.default_concurrency());
    let cap = endpoint.max_concurrency.unwrap_or(default_cap);
    let time = |at: Option<Millis>| at.map(Millis::to_datetime);
    Ok(match snapshot {
        Some(health) => {
            let s = health.snapshot;
            EndpointHealthOut {
                state: s.breaker.state().as_str(),
                consecutive_failures: s.breaker.consecutive_failures(),
                failing_since: time(s.breaker.failing_since()),
                opened_at: time(s.breaker.opened_at()),
                next_probe_at: time(s.breaker.next_probe_at()),
                held_until: time(s.held_until),
                in_flight: s.in_flight,
                concurrency_limit: s.concurrency_limit,
                queue_depth: backlog.pending,
                queue_depth_capped: backlog.capped,
                oldest_pending_at: time(backlog.oldest_created_at),
                recent_outcomes: health.recent_outcomes,
            }
        }
        // The engine holds nothing for it: nothing was attempted since start.
        None => EndpointHealthOut {
            state: BreakerState::Closed.as_str(),
            consecutive_failures: 0,
            failing_since: None,
            opened_at: None,
            next_probe_at: None,
            held_until: None,
            in_flight: 0,
            concurrency_limit: if endpoint.disabled { 0 } else { cap },
            queue_depth: backlog.pending,
            queue_depth_capped: backlog.capped,
            oldest_pending_at: time(backlog.oldest_created_at),
            recent_outcomes: Vec::new(),
        },
    })
}

async fn save(
    state: &AppState,
    app: &Application,
    mut endpoint: Endpoint,
    fields: EndpointFields,
) -> ApiResult<Endpoint> {
    let fields = fields.validate(state)?;
    let held = endpoint
        .disabled_reason
        .as_ref()
        .is_some_and(DisabledReason::held_by_verification);
    let url_changed = fields.url != endpoint.url;
    let credentials_changed = fields.url_credentials.is_some();
    fields.apply(&mut endpoint);
    // Only a passed ownership check enables an endpoint of an application that requires it (a write
    // that asks for `disabled: false` leaves it held); a new URL is a new destination and must prove
    // itself again.
    let reverify = app.verify_endpoints && (url_changed || held);
    if reverify {
        await_verification(&mut endpoint);
    }
    endpoint.updated_at = clock::now();
    state.store.update_endpoint(&endpoint).await.map_err(store_error)?;
    if credentials_changed {
        // New credentials are a header change: like `PUT …/headers`, answer once no later attempt can
        // carry the old ones.
        state.endpoint_applied(&endpoint.id).await;
    }
    Ok(endpoint)
}

/// Run the ownership check again (e.g. after fixing the receiver); the endpoint is held until it passes.
async fn verify(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
) -> ApiResult<StatusCode> {
    let app = lookup::app(&state, &app_id).await?;
    let mut endpoint = lookup::endpoint(&state, &app.id, &endpoint_id).await?;
    await_verification(&mut endpoint);
    endpoint.updated_at = clock::now();
    state.store.update_endpoint(&endpoint).await.map_err(store_error)?;
    Ok(StatusCode::ACCEPTED)
}

/// PUT replaces the endpoint, creating it (with the path segment as its uid) when missing.
async fn replace(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    JsonBody(input): JsonBody<EndpointUpdate>,
) -> ApiResult<(StatusCode, Json<EndpointOut>)> {
    let app = lookup::app(&state, &app_id).await?;
    match state.store.get_endpoint(&app.id, &endpoint_id).await {
        Ok(existing) => Ok((
            StatusCode::OK,
            Json(convert::endpoint(save(&state, &app, existing, input.into()).await?)),
        )),
        Err(StoreError::NotFound) => {
            let mut fields = EndpointFields::from(input);
            fields.uid = Some(validate::uid_for_put(
                ("endpoint_id", &endpoint_id),
                fields.uid.as_deref(),
                "endpoint",
            )?);
            let secret = generate_key(KeyKind::Hmac);
            let endpoint = insert(&state, &app, EndpointId::new(), secret, Headers::new(), fields).await?;
            Ok((StatusCode::CREATED, Json(convert::endpoint(endpoint))))
        }
        Err(other) => Err(store_error(other)),
    }
}

async fn patch(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    JsonBody(input): JsonBody<EndpointPatch>,
) -> ApiResult<Json<EndpointOut>> {
    let app = lookup::app(&state, &app_id).await?;
    let mut endpoint = lookup::endpoint(&state, &app.id, &endpoint_id).await?;
    // `"secret": null` asks for a fresh random key of the current kind; a value sets that key. Either
    // replaces the key at once, as a rotation without grace period.
    let new_secret = match &input.secret {
        Patch::Absent => None,
        Patch::Null => {
            let current = herald_signature::SigningKey::parse(&endpoint.secret).ok();
            let ed25519 = current.and_then(|k| k.public_key()).is_some();
            Some(generate_key(if ed25519 { KeyKind::Ed25519 } else { KeyKind::Hmac }))
        }
        Patch::Value(given) => Some(parse_key("secret", given)?),
    };
    if let Some(secret) = &new_secret {
        endpoint.secret.clone_from(secret);
    }
    let fields = EndpointFields::of_patch(&endpoint, input);
    let endpoint = save(&state, &app, endpoint, fields).await?;
    if let Some(secret) = &new_secret {
        let now = clock::now();
        state
            .store
            .rotate_endpoint_secret(&endpoint.id, secret, now, now)
            .await
            .map_err(store_error)?;
        state.endpoint_applied(&endpoint.id).await;
    }
    Ok(Json(convert::endpoint(endpoint)))
}

async fn remove(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
) -> ApiResult<StatusCode> {
    let app = lookup::app(&state, &app_id).await?;
    let endpoint = lookup::endpoint(&state, &app.id, &endpoint_id).await?;
    state.store.delete_endpoint(&endpoint.id).await.map_err(store_error)?;
    Ok(StatusCode::NO_CONTENT)
}
