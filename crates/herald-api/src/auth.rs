//! Bearer-token authentication and tenancy.
//!
//! Two kinds of token are accepted:
//! - the **admin token**, compared by its SHA-256 digest in constant time, so neither timing nor a memory
//!   dump of the state reveals it; it may do everything;
//! - **application-scoped tokens** (`POST /auth/app-portal-access/{app_id}`), stored only as their digest
//!   with an expiry. One sees and changes only its own application; a *polling endpoint token*
//!   (`POST /app/{app_id}/polling-endpoint/{sink_id}/token`, the same kind of record with its polling
//!   endpoint named) only reads that polling endpoint's stream.
//!
//! What an application token may call is decided per operation by the `x-herald-access` key of the
//! OpenAPI document compiled into the server, so the document and the enforcement cannot disagree:
//! - `app`: the operation acts on the application named by `{app_id}` (its id or uid), or on the
//!   background task `{task_id}`; allowed only when that is the token's own application;
//! - `sink`: an `app` operation on one polling endpoint's stream (`{sink_id}`): its polls and its
//!   consumers' offsets. Besides the tokens of the application, a **polling endpoint token**
//!   (`POST /app/{app_id}/polling-endpoint/{sink_id}/token`) may call these, for its own polling endpoint
//!   and nothing else — it is read-only in that it changes nothing of the application, and the only state it
//!   moves is the offsets of that stream's consumers (a seek, a commit);
//! - `shared`: global definitions every tenant needs to read (event types);
//! - `admin`, or no key at all, or an operation missing from the document: the admin token only. A route
//!   someone forgets to classify is therefore closed to tenants, never open.
//!
//! A valid application token is answered `403 forbidden` on anything else, whether or not the object it
//! names exists (the answer is the same for both, so it discloses nothing); an unknown or expired token
//! is `401`. A read-only token may only `GET`.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::RequestPartsExt;
use axum::extract::{MatchedPath, RawPathParams, Request};
use axum::http::header::AUTHORIZATION;
use axum::http::{Method, StatusCode};
use herald_core::clock;
use herald_core::id::{AppId, AppIdOrUid, SinkId, SinkIdOrUid, TaskId};
use herald_store::{AppToken, StoreError};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::AppState;

/// SHA-256 of a token, as stored and compared.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Who may call an operation, as the OpenAPI document's `x-herald-access` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The admin token only.
    Admin,
    /// The admin token, or an application token for the application (or task) the path names.
    App,
    /// As [`Access::App`], and also a polling endpoint token for the polling endpoint the path names.
    Sink,
    /// Any valid token.
    Shared,
}

/// The prefix every documented path carries.
const PREFIX: &str = "/api/v1";

/// (method, path template without the prefix) → access, read once from the compiled document.
static POLICY: LazyLock<HashMap<(Method, String), Access>> = LazyLock::new(|| policy_of(crate::openapi::DOCUMENT));

fn policy_of(document: &str) -> HashMap<(Method, String), Access> {
    let mut policy = HashMap::new();
    // The document is part of the build and checked by tests; were it unreadable, every operation would
    // be admin-only, which fails closed.
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(document) else {
        return policy;
    };
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        let template = path.strip_prefix(PREFIX).unwrap_or(path);
        for (method, operation) in item.as_object().into_iter().flatten() {
            let Ok(method) = Method::from_bytes(method.to_uppercase().as_bytes()) else {
                continue;
            };
            let access = match operation["x-herald-access"].as_str() {
                Some("app") => Access::App,
                Some("sink") => Access::Sink,
                Some("shared") => Access::Shared,
                _ => Access::Admin,
            };
            policy.insert((method, template.to_owned()), access);
        }
    }
    policy
}

/// The access rule of an operation (admin-only when undocumented).
pub fn access(method: &Method, template: &str) -> Access {
    // HEAD is served by GET routes.
    let method = if method == Method::HEAD {
        Method::GET
    } else {
        method.clone()
    };
    let template = template.strip_prefix(PREFIX).unwrap_or(template);
    POLICY
        .get(&(method, template.to_owned()))
        .copied()
        .unwrap_or(Access::Admin)
}

/// Which credentials a request was authenticated with. Handlers that act differently for tenants read it
/// from the request's extensions.
#[derive(Debug, Clone)]
pub enum Principal {
    /// The admin token.
    Admin,
    /// An application-scoped token.
    App(AppToken),
}

/// The bearer token a request presents.
fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")))
        .map(str::trim)
}

/// For routes outside the OpenAPI document that only the admin may call (`/metrics`): the admin token,
/// else `403` for a valid application token and `401` for anything else.
pub(crate) async fn require_admin(state: &AppState, headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let digest = token_digest(bearer(headers).ok_or_else(ApiError::unauthorized)?);
    if bool::from(digest.ct_eq(&state.admin_token_sha256)) {
        return Ok(());
    }
    match state.store.find_app_token(&hex::encode(digest), clock::now()).await {
        Ok(Some(_)) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "only the admin token may read the metrics",
        )),
        Ok(None) => Err(ApiError::unauthorized()),
        Err(error) => Err(ApiError::from_store(error, "token")),
    }
}

/// Authenticate the bearer token, then check that an application token may make this call: the request,
/// with its [`Principal`] attached, or why it is refused.
pub(crate) async fn admit(state: &AppState, request: Request) -> Result<Request, ApiError> {
    let presented = bearer(request.headers()).ok_or_else(ApiError::unauthorized)?;
    let digest = token_digest(presented);
    if bool::from(digest.ct_eq(&state.admin_token_sha256)) {
        let mut request = request;
        request.extensions_mut().insert(Principal::Admin);
        return Ok(request);
    }
    // Looked up by digest: the token itself is never stored, and a digest match is as hard to forge as
    // the token.
    let token = state
        .store
        .find_app_token(&hex::encode(digest), clock::now())
        .await
        .map_err(|e| ApiError::from_store(e, "token"))?
        .ok_or_else(ApiError::unauthorized)?;
    let (mut parts, body) = request.into_parts();
    let template = parts
        .extensions
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let params = parts.extract::<RawPathParams>().await.ok();
    let params: Vec<(String, String)> = params
        .iter()
        .flat_map(|p| p.iter().map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    authorize(state, &token, &parts.method, &template, &params).await?;
    parts.extensions.insert(Principal::App(token));
    Ok(Request::from_parts(parts, body))
}

/// May this application token make this call?
async fn authorize(
    state: &AppState,
    token: &AppToken,
    method: &Method,
    template: &str,
    params: &[(String, String)],
) -> Result<(), ApiError> {
    let access = access(method, template);
    if let Some(sink_id) = &token.sink_id {
        return authorize_sink(state, token, sink_id, access, params).await;
    }
    // `shared` operations are open to every token, read-only ones too: the only one that writes is a
    // logout, which takes rights away.
    if token.read_only && method != Method::GET && method != Method::HEAD && access != Access::Shared {
        return Err(forbidden("this token is read-only"));
    }
    match access {
        Access::Admin => Err(forbidden("this operation needs the admin token")),
        Access::Shared => Ok(()),
        Access::App | Access::Sink => {
            let param = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
            let owner = if param("app_id").is_some() {
                app_of(state, params).await?
            } else if let Some(task) = param("task_id") {
                match TaskId::parse(task) {
                    Ok(task) => match state.store.get_task(&task, Some(&token.app_id)).await {
                        Ok(task) => Some(task.app_id),
                        Err(StoreError::NotFound) => None,
                        Err(error) => return Err(ApiError::from_store(error, "background task")),
                    },
                    // No task has such an id.
                    Err(_) => None,
                }
            } else {
                // An `app` operation that names neither: nothing to check it against, so admin-only.
                return Err(forbidden("this operation needs the admin token"));
            };
            if owner.as_ref() == Some(&token.app_id) {
                Ok(())
            } else {
                Err(forbidden("this token may only use its own application"))
            }
        }
    }
}

/// The application the path's `{app_id}` names (id or uid), resolved as the handlers resolve it; `None`
/// when there is none (or no such application).
async fn app_of(state: &AppState, params: &[(String, String)]) -> Result<Option<AppId>, ApiError> {
    let Some((_, app)) = params.iter().find(|(k, _)| k == "app_id") else {
        return Ok(None);
    };
    // The same resolution the handlers use (id or uid, through the same cache).
    match crate::lookup::app_id(state, &AppIdOrUid::new(app.as_str())).await {
        Ok(id) => Ok(Some(id)),
        Err(error) if error.status == StatusCode::NOT_FOUND => Ok(None),
        Err(error) => Err(error),
    }
}

/// May this polling endpoint token make this call: a `sink` operation whose `{app_id}` and `{sink_id}`
/// (ids or uids) name its own application and polling endpoint? Anything else is the same `403`, whether
/// or not what it names exists.
async fn authorize_sink(
    state: &AppState,
    token: &AppToken,
    sink_id: &SinkId,
    access: Access,
    params: &[(String, String)],
) -> Result<(), ApiError> {
    let refused = || forbidden("this token may only read its own polling endpoint's stream");
    if access != Access::Sink || app_of(state, params).await?.as_ref() != Some(&token.app_id) {
        return Err(refused());
    }
    let Some((_, named)) = params.iter().find(|(k, _)| k == "sink_id") else {
        return Err(refused());
    };
    match state
        .store
        .get_polling_endpoint(&token.app_id, &SinkIdOrUid::new(named))
        .await
    {
        Ok(sink) if &sink.id == sink_id => Ok(()),
        Ok(_) | Err(StoreError::NotFound) => Err(refused()),
        Err(error) => Err(ApiError::from_store(error, "polling endpoint")),
    }
}

fn forbidden(detail: &str) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_read_from_the_document_and_fails_closed() {
        assert_eq!(access(&Method::GET, "/api/v1/app/{app_id}"), Access::App);
        assert_eq!(access(&Method::HEAD, "/api/v1/app/{app_id}/msg"), Access::App);
        assert_eq!(access(&Method::GET, "/api/v1/event-type"), Access::Shared);
        assert_eq!(
            access(&Method::GET, "/api/v1/app/{app_id}/poller/{sink_id}"),
            Access::Sink
        );
        assert_eq!(access(&Method::POST, "/api/v1/event-type"), Access::Admin);
        assert_eq!(access(&Method::GET, "/api/v1/app"), Access::Admin);
        assert_eq!(access(&Method::GET, "/api/v1/not-documented/{app_id}"), Access::Admin);
        assert!(policy_of("not json").is_empty());
    }
}
