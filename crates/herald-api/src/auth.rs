//! Bearer-token authentication.
//!
//! The admin token is compared by its SHA-256 digest in constant time, so neither timing nor a memory
//! dump of the state reveals it.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::AppState;

/// SHA-256 of a token, as stored and compared.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Reject requests without the admin bearer token.
pub async fn require_admin(State(state): State<AppState>, request: Request, next: Next) -> Result<Response, ApiError> {
    let presented = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")))
        .map(str::trim)
        .ok_or_else(ApiError::unauthorized)?;
    if bool::from(token_digest(presented).ct_eq(&state.admin_token_sha256)) {
        Ok(next.run(request).await)
    } else {
        Err(ApiError::unauthorized())
    }
}
