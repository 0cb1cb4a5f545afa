//! `POST /event-type/import/openapi` (Svix's `v1.event-type.import-openapi`): create or replace the event
//! types an OpenAPI 3.1 document declares under `webhooks` (see [`crate::openapi_import`]). `dryRun`
//! answers what would change without changing it; `replaceAll` also archives every event type the
//! document does not name.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use herald_store::PageRequest;

use super::event_types::{self, Replacement};
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::model::{EventTypeFromOpenApiOut, EventTypeImportIn, EventTypeImportOut, EventTypeImportResult};
use crate::openapi_import::{self, Imported};
use crate::state::AppState;
use crate::validate;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/event-type/import/openapi", post(import))
}

/// The document given as `spec` (an object) or `specRaw` (its JSON or YAML text), exactly one of them.
fn document(input: EventTypeImportIn) -> ApiResult<serde_json::Value> {
    match (input.spec, input.spec_raw) {
        (Some(spec), None) => Ok(spec),
        (None, Some(raw)) => parse_raw(&raw),
        (Some(_), Some(_)) => Err(ApiError::body("specRaw", "give either spec or specRaw, not both")),
        (None, None) => Err(ApiError::body("spec", "give the OpenAPI document as spec or specRaw")),
    }
}

/// `specRaw`: JSON, or else YAML (as OpenAPI documents are most often written), and a mapping either way
/// (the error names `specRaw`, the field the client sent). The YAML parser refuses alias bombs and deep
/// nesting, so a hostile text costs no more than its (bounded) size.
fn parse_raw(raw: &str) -> ApiResult<serde_json::Value> {
    let document = match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(document) => document,
        Err(json) => match serde_yaml_ng::from_str::<serde_json::Value>(raw) {
            Ok(document) => document,
            // Text that looks like JSON is best explained by the JSON parser's error.
            Err(_) if raw.trim_start().starts_with('{') => {
                return Err(ApiError::body("specRaw", format!("not a JSON document: {json}")));
            }
            Err(yaml) => {
                return Err(ApiError::body(
                    "specRaw",
                    format!("neither a JSON nor a YAML document: {yaml}"),
                ));
            }
        },
    };
    if !document.is_object() {
        return Err(ApiError::body(
            "specRaw",
            "the document is not a mapping (an OpenAPI object)",
        ));
    }
    Ok(document)
}

async fn import(
    State(state): State<AppState>,
    JsonBody(input): JsonBody<EventTypeImportIn>,
) -> ApiResult<Json<EventTypeImportOut>> {
    let (dry_run, replace_all) = (input.dry_run.unwrap_or(false), input.replace_all.unwrap_or(false));
    let found = openapi_import::event_types(&document(input)?).map_err(|e| {
        // The importer names the place in the document first (`webhooks.x: …`).
        let text = e.to_string();
        let (at, msg) = text.split_once(": ").unwrap_or(("", text.as_str()));
        ApiError::body(&format!("spec.{at}"), msg)
    })?;
    for imported in &found {
        validate::name("spec.webhooks", &imported.name, false)?;
        validate::text(
            "spec.webhooks.description",
            &imported.description,
            true,
            validate::MAX_DESCRIPTION_LEN,
        )?;
        event_types::check_extras(imported.feature_flags.as_deref(), imported.group_name.as_deref())
            .map_err(|error| error.nested(&["spec".to_owned(), "webhooks".to_owned()]))?;
    }
    if dry_run {
        return Ok(Json(EventTypeImportOut {
            data: EventTypeImportResult {
                modified: Vec::new(),
                to_modify: Some(found.into_iter().map(preview).collect()),
            },
        }));
    }
    let named: BTreeSet<String> = found.iter().map(|i| i.name.clone()).collect();
    let mut modified = Vec::with_capacity(found.len());
    for imported in found {
        let fields = Replacement {
            description: imported.description,
            archived: false,
            deprecated: imported.deprecated,
            feature_flag: None,
            feature_flags: imported.feature_flags,
            group_name: imported.group_name,
            schemas: imported.schemas,
        };
        let (stored, _) = event_types::upsert(&state, imported.name, fields).await?;
        modified.push(stored.name);
    }
    if replace_all {
        archive_all_but(&state, &named, &mut modified).await?;
    }
    Ok(Json(EventTypeImportOut {
        data: EventTypeImportResult {
            modified,
            to_modify: None,
        },
    }))
}

/// Archive every event type not in `keep`, noting each in `modified`.
async fn archive_all_but(state: &AppState, keep: &BTreeSet<String>, modified: &mut Vec<String>) -> ApiResult<()> {
    let mut page = PageRequest::first(PageRequest::MAX_LIMIT);
    loop {
        let found = state
            .store
            .list_event_types(&page, false, false)
            .await
            .map_err(event_types::store_error)?;
        for mut et in found.items.into_iter().filter(|et| !keep.contains(&et.name)) {
            et.archived = true;
            et.updated_at = herald_core::clock::now();
            state
                .store
                .update_event_type(&et)
                .await
                .map_err(event_types::store_error)?;
            modified.push(et.name);
        }
        match found.iterator {
            Some(next) if !found.done => page = PageRequest::new(Some(PageRequest::MAX_LIMIT), Some(next)),
            _ => return Ok(()),
        }
    }
}

fn preview(imported: Imported) -> EventTypeFromOpenApiOut {
    EventTypeFromOpenApiOut {
        name: imported.name,
        description: imported.description,
        schemas: imported.schemas,
        deprecated: imported.deprecated,
        group_name: imported.group_name,
        feature_flags: imported.feature_flags,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_raw;

    /// The detail of a refusal (the field it names is `specRaw` in every case here).
    fn refusal(raw: &str) -> String {
        let error = parse_raw(raw).expect_err(raw);
        let text = format!("{error:?}");
        assert!(text.contains("specRaw"), "{text}");
        text
    }

    #[test]
    fn json_and_yaml_mappings_are_read_alike() {
        let json = parse_raw(r#"{"openapi": "3.1.0", "webhooks": {"a.b": {}}}"#).expect("JSON");
        let yaml = parse_raw("openapi: 3.1.0\nwebhooks:\n  a.b: {}\n").expect("YAML");
        assert_eq!(json, yaml);
    }

    #[test]
    fn text_that_is_not_a_mapping_is_refused_naming_what_failed() {
        assert!(refusal(r#"{"openapi": "3.1.0","#).contains("not a JSON document"));
        assert!(refusal("webhooks: [unclosed").contains("neither a JSON nor a YAML document"));
        assert!(refusal("[1, 2]").contains("not a mapping"));
        assert!(refusal("just words").contains("not a mapping"));
    }
}
