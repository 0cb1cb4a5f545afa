//! Application-scoped tokens (admin only):
//! - `POST /auth/app-portal-access/{app_id}` issues a token that sees and changes only that application
//!   (see [`crate::auth`] for what it may call); Herald stores only its SHA-256 and its expiry;
//! - `POST /auth/app/{app_id}/expire-all` revokes every token of the application, at once or after a grace
//!   period.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use herald_core::clock::now_ms;
use herald_core::id::IdKind;
use herald_store::AppToken;

use super::apps;
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::model::{AppPortalAccessIn, AppPortalAccessOut, ApplicationTokenExpireIn};
use crate::state::AppState;
use crate::validate;

/// The longest a token may live, and its default (as Svix).
const MAX_EXPIRY_SECONDS: u64 = 7 * 24 * 3600;
/// Random bytes in a token.
const TOKEN_BYTES: usize = 32;
/// Every application token starts with this, so one found in a log is recognisable.
const TOKEN_PREFIX: &str = "herald_app_";

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/auth/app-portal-access/{app_id}", post(portal_access))
        .route("/auth/app/{app_id}/expire-all", post(expire_all))
}

async fn portal_access(
    State(state): State<AppState>,
    Path(app_id): Path<String>,
    JsonBody(input): JsonBody<AppPortalAccessIn>,
) -> ApiResult<Json<AppPortalAccessOut>> {
    if input.capabilities.is_some() {
        return Err(ApiError::validation(
            "capabilities: not supported by this server; use readOnly",
        ));
    }
    let expiry = input.expiry.unwrap_or(MAX_EXPIRY_SECONDS);
    if !(1..=MAX_EXPIRY_SECONDS).contains(&expiry) {
        return Err(ApiError::validation(format!(
            "expiry: must be between 1 and {MAX_EXPIRY_SECONDS} seconds, got {expiry}"
        )));
    }
    let app = match (apps::find(&state, &app_id).await, input.application) {
        (Ok(app), _) => app,
        // As Svix: `application` creates the application when the path names none.
        (Err(error), Some(mut application)) if error.status == StatusCode::NOT_FOUND => {
            application.uid = Some(validate::uid_for_put(
                &app_id,
                application.uid.as_deref(),
                IdKind::Application,
                "application",
            )?);
            apps::create_new(&state, application).await?
        }
        (Err(error), _) => return Err(error),
    };
    let random: [u8; TOKEN_BYTES] = rand::random();
    let token = format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random)
    );
    let now = now_ms();
    let expires_ms = i64::try_from(expiry * 1000).unwrap_or(i64::MAX);
    let stored = AppToken {
        token_sha256: hex::encode(crate::auth::token_digest(&token)),
        app_id: app.id.clone(),
        read_only: input.read_only.unwrap_or(false),
        created_at: now,
        expires_at: now.saturating_add(expires_ms),
    };
    state
        .store
        .create_app_token(&stored)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))?;
    Ok(Json(AppPortalAccessOut {
        url: format!("/api/v1/app/{}#key={token}", app.id),
        token,
    }))
}

async fn expire_all(
    State(state): State<AppState>,
    Path(app_id): Path<String>,
    JsonBody(input): JsonBody<ApplicationTokenExpireIn>,
) -> ApiResult<StatusCode> {
    if input.session_ids.as_ref().is_some_and(|ids| !ids.is_empty()) {
        return Err(ApiError::validation(
            "sessionIds: expiring single sessions is not supported; omit it to expire every token",
        ));
    }
    let grace = input.expiry.unwrap_or(0).min(MAX_EXPIRY_SECONDS);
    let app = apps::find(&state, &app_id).await?;
    let at = now_ms().saturating_add(i64::try_from(grace * 1000).unwrap_or(i64::MAX));
    state
        .store
        .expire_app_tokens(&app.id, at)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))?;
    Ok(StatusCode::NO_CONTENT)
}
