//! Application-scoped tokens (admin only):
//! - `POST /auth/app-portal-access/{app_id}` issues a token that sees and changes only that application
//!   (see [`crate::auth`] for what it may call); Herald stores only its SHA-256 and its expiry;
//! - `POST /auth/app/{app_id}/expire-all` revokes every token of the application, at once or after a grace
//!   period;
//! - `GET /auth/token` (any valid token, a Herald extension) tells what the presented token is, so the
//!   dashboard shows an application token only its application and a read-only one no button it may not
//!   press.

use std::time::Duration;

use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use base64::Engine as _;
use herald_core::clock;
use herald_core::id::{AppId, AppIdOrUid, SinkId};
use herald_store::AppToken;

use super::apps;
use crate::auth::Principal;
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::lookup;
use crate::model::{AppPortalAccessIn, AppPortalAccessOut, ApplicationTokenExpireIn, TokenInfoOut};
use crate::state::AppState;

/// The longest a token may live, and its default (as Svix).
const MAX_EXPIRY_SECONDS: u64 = 7 * 24 * 3600;
/// Random bytes in a token.
const TOKEN_BYTES: usize = 32;
/// Every application token starts with this, so one found in a log is recognisable.
const TOKEN_PREFIX: &str = "herald_app_";

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/auth/app-portal-access/{app_id}", post(portal_access))
        .route("/auth/dashboard-access/{app_id}", post(dashboard_access))
        .route("/auth/app/{app_id}/expire-all", post(expire_all))
        .route("/auth/token", get(token_info))
        .route("/auth/logout", post(logout))
}

/// Where the dashboard is for someone outside, always an absolute URL (the SDKs' schema says so): the
/// configured public URL, else this request's `Host` (or HTTP/2 authority), else `localhost`.
fn dashboard_url(state: &AppState, headers: &HeaderMap, uri: &Uri) -> String {
    let base = match &state.portal.public_url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| uri.authority().map(|a| a.as_str()))
            // Only a plain authority (host and port) becomes part of the link.
            .filter(|host| url::Url::parse(&format!("http://{host}/")).is_ok_and(|u| u.path() == "/"))
            .map_or_else(|| "http://localhost".to_owned(), |host| format!("http://{host}")),
    };
    format!("{base}{}", crate::dashboard::ROOT)
}

async fn portal_access(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    JsonBody(input): JsonBody<AppPortalAccessIn>,
) -> ApiResult<Json<AppPortalAccessOut>> {
    issue(&state, &app_id, &uri, &headers, input).await.map(Json)
}

/// `POST /auth/dashboard-access/{app_id}`, the deprecated form the 1.x SDKs still offer: the same token
/// as `app-portal-access` with no options (seven days, read and write), without a body.
async fn dashboard_access(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> ApiResult<Json<AppPortalAccessOut>> {
    issue(&state, &app_id, &uri, &headers, AppPortalAccessIn::default())
        .await
        .map(Json)
}

/// Seconds a token lives: `expiry` (1 s to seven days), seven days when absent.
pub(crate) fn expiry_of(expiry: Option<u64>) -> ApiResult<u64> {
    let expiry = expiry.unwrap_or(MAX_EXPIRY_SECONDS);
    if !(1..=MAX_EXPIRY_SECONDS).contains(&expiry) {
        return Err(ApiError::body(
            "expiry",
            format!("must be between 1 and {MAX_EXPIRY_SECONDS} seconds, got {expiry}"),
        ));
    }
    Ok(expiry)
}

/// Make a new token (`prefix` and random bytes) for the application `app_id` — for one of its polling
/// endpoints only when `sink_id` is given —, store its digest with its expiry, and return it (it is
/// shown once, never stored).
pub(crate) async fn mint(
    state: &AppState,
    prefix: &str,
    app_id: &AppId,
    sink_id: Option<&SinkId>,
    session_id: Option<&str>,
    read_only: bool,
    expiry_seconds: u64,
) -> ApiResult<String> {
    let random: [u8; TOKEN_BYTES] = rand::random();
    let token = format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random)
    );
    let now = clock::now();
    let stored = AppToken {
        token_sha256: hex::encode(crate::auth::token_digest(&token)),
        app_id: app_id.clone(),
        read_only,
        sink_id: sink_id.cloned(),
        session_id: session_id.map(str::to_owned),
        created_at: now,
        expires_at: now + Duration::from_secs(expiry_seconds),
    };
    state.store.create_app_token(&stored).await.map_err(|e| {
        ApiError::from_store(
            e,
            if sink_id.is_some() {
                "polling endpoint"
            } else {
                "application"
            },
        )
    })?;
    Ok(token)
}

/// The most sessions one `expire-all` names.
const MAX_SESSION_IDS: usize = 1_000;
/// The longest session id, in characters.
const MAX_SESSION_ID_LEN: usize = 256;

/// A session id: any text of 1 to 256 characters (Svix prescribes no form; it is only compared).
fn session_name(field: &str, value: &str) -> ApiResult<()> {
    let length = value.chars().count();
    if length == 0 || length > MAX_SESSION_ID_LEN {
        return Err(ApiError::body(
            field,
            format!("a session id is 1 to {MAX_SESSION_ID_LEN} characters"),
        ));
    }
    Ok(())
}

/// Issue an application token for the application `app_id` names (creating it when `input` says so).
async fn issue(
    state: &AppState,
    app_id: &AppIdOrUid,
    uri: &Uri,
    headers: &HeaderMap,
    input: AppPortalAccessIn,
) -> ApiResult<AppPortalAccessOut> {
    if input.capabilities.is_some() {
        return Err(ApiError::body(
            "capabilities",
            "not supported by this server; use readOnly",
        ));
    }
    let expiry = expiry_of(input.expiry)?;
    if let Some(session) = &input.session_id {
        session_name("sessionId", session)?;
    }
    let app_id = apps::id_or_create(state, app_id, input.application).await?;
    let token = mint(
        state,
        TOKEN_PREFIX,
        &app_id,
        None,
        input.session_id.as_deref(),
        input.read_only.unwrap_or(false),
        expiry,
    )
    .await?;
    // The token goes in the fragment, which browsers never send to a server (nor in a Referer).
    Ok(AppPortalAccessOut {
        url: format!("{}#key={token}", dashboard_url(state, headers, uri)),
        token,
    })
}

async fn expire_all(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    JsonBody(input): JsonBody<ApplicationTokenExpireIn>,
) -> ApiResult<StatusCode> {
    // As Svix: a non-empty list ends only the tokens issued with one of these `sessionId`s.
    let sessions = input.session_ids.filter(|ids| !ids.is_empty());
    if let Some(ids) = &sessions {
        if ids.len() > MAX_SESSION_IDS {
            return Err(ApiError::body("sessionIds", format!("at most {MAX_SESSION_IDS} items")));
        }
        for id in ids {
            session_name("sessionIds", id)?;
        }
    }
    let grace = input.expiry.unwrap_or(0).min(MAX_EXPIRY_SECONDS);
    let app = lookup::app(&state, &app_id).await?;
    let at = clock::now() + Duration::from_secs(grace);
    state
        .store
        .expire_app_tokens(&app.id, sessions.as_deref(), at)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /auth/logout`: the application token making the call stops working at once (as Svix: "trying to
/// log out other tokens will fail"). The admin token cannot log out: it is configured, not issued, and a
/// logout would lock the operator out until a restart with a new `HERALD_ADMIN_TOKEN`.
async fn logout(State(state): State<AppState>, Extension(principal): Extension<Principal>) -> ApiResult<StatusCode> {
    match principal {
        Principal::Admin => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "the admin token cannot log out (it is set by HERALD_ADMIN_TOKEN); only application tokens can",
        )),
        Principal::App(token) => {
            state
                .store
                .expire_app_token(&token.token_sha256, clock::now())
                .await
                .map_err(|e| ApiError::from_store(e, "token"))?;
            Ok(StatusCode::NO_CONTENT)
        }
    }
}

async fn token_info(Extension(principal): Extension<Principal>) -> Json<TokenInfoOut> {
    Json(match principal {
        Principal::Admin => TokenInfoOut {
            kind: "admin",
            app_id: None,
            read_only: false,
            expires_at: None,
        },
        Principal::App(token) => TokenInfoOut {
            kind: "app",
            app_id: Some(token.app_id),
            read_only: token.read_only,
            expires_at: Some(token.expires_at.to_datetime()),
        },
    })
}
