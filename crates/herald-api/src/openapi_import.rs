//! Event types from an OpenAPI 3.1 document's `webhooks` (Svix's `event-type/import/openapi`).
//!
//! Each entry of `webhooks` is one event type: its key is the name, the `post` operation's `description`
//! (else `summary`) the description, the JSON schema of its `application/json` request body the version-1
//! schema (with every local `$ref` inlined, so the stored schema stands alone), `deprecated` its flag, and
//! Svix's extensions `x-svix-group-name` and `x-svix-feature-flags` its group and feature flags.
//!
//! Pure logic: a parsed document in, event types or a reason out.

use serde_json::{Map, Value};

/// How deep `$ref`s may nest (a cycle would otherwise never end).
const MAX_REF_DEPTH: usize = 32;
/// The most event types one document may declare.
pub(crate) const MAX_EVENT_TYPES: usize = 1_000;

/// One event type found in the document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Imported {
    /// The event type's name (the `webhooks` key).
    pub name: String,
    /// Its description (`description`, else `summary`, else empty).
    pub description: String,
    /// Its payload schemas keyed by version (`{"1": schema}`), when the operation declares a JSON body.
    pub schemas: Option<Map<String, Value>>,
    /// Whether the operation is marked deprecated.
    pub deprecated: bool,
    /// `x-svix-group-name`.
    pub group_name: Option<String>,
    /// `x-svix-feature-flags`.
    pub feature_flags: Option<Vec<String>>,
}

/// Why a document could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ImportError {
    /// The document is not a JSON object.
    #[error("not an OpenAPI document (a JSON object)")]
    NotAnObject,
    /// `webhooks` is there but is not an object.
    #[error("webhooks: must be an object of event type name to path item")]
    BadWebhooks,
    /// An entry has no `post` operation.
    #[error("webhooks.{0}: has no post operation")]
    NoOperation(String),
    /// A `$ref` that does not point inside the document, or nests too deep.
    #[error("webhooks.{0}: the $ref {1:?} does not resolve inside the document")]
    BadRef(String, String),
    /// More event types than allowed.
    #[error("webhooks: at most {MAX_EVENT_TYPES} event types")]
    TooMany,
}

/// The event types `document` declares, in the order of its `webhooks` keys.
pub(crate) fn event_types(document: &Value) -> Result<Vec<Imported>, ImportError> {
    let doc = document.as_object().ok_or(ImportError::NotAnObject)?;
    let Some(webhooks) = doc.get("webhooks") else {
        return Ok(Vec::new());
    };
    let webhooks = webhooks.as_object().ok_or(ImportError::BadWebhooks)?;
    if webhooks.len() > MAX_EVENT_TYPES {
        return Err(ImportError::TooMany);
    }
    webhooks
        .iter()
        .map(|(name, item)| {
            let operation = item
                .get("post")
                .and_then(Value::as_object)
                .ok_or_else(|| ImportError::NoOperation(name.clone()))?;
            let text = |key: &str| operation.get(key).and_then(Value::as_str).map(str::to_owned);
            let body = operation
                .get("requestBody")
                .map(|body| inline(document, body, 0))
                .transpose()
                .map_err(|reference| ImportError::BadRef(name.clone(), reference))?;
            let schema = body.and_then(|body| body.pointer("/content/application~1json/schema").cloned());
            Ok(Imported {
                name: name.clone(),
                description: text("description").or_else(|| text("summary")).unwrap_or_default(),
                schemas: schema.map(|s| Map::from_iter([("1".to_owned(), s)])),
                deprecated: operation.get("deprecated").and_then(Value::as_bool).unwrap_or(false),
                group_name: text("x-svix-group-name"),
                feature_flags: operation.get("x-svix-feature-flags").and_then(|flags| {
                    flags
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                }),
            })
        })
        .collect()
}

/// `value` with every local `$ref` (`#/…`) replaced by what it points at; the failing reference otherwise.
fn inline(document: &Value, value: &Value, depth: usize) -> Result<Value, String> {
    match value {
        Value::Object(map) => {
            if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
                let target = reference
                    .strip_prefix('#')
                    .filter(|_| depth < MAX_REF_DEPTH)
                    .and_then(|pointer| document.pointer(pointer))
                    .ok_or_else(|| reference.to_owned())?;
                return inline(document, target, depth + 1);
            }
            map.iter()
                .map(|(k, v)| Ok((k.clone(), inline(document, v, depth)?)))
                .collect::<Result<Map<_, _>, _>>()
                .map(Value::Object)
        }
        Value::Array(items) => items
            .iter()
            .map(|v| inline(document, v, depth))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        other => Ok(other.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_each_webhook_with_its_schema_inlined() {
        let doc = json!({
            "openapi": "3.1.0",
            "webhooks": {
                "invoice.paid": {"post": {
                    "summary": "Paid", "description": "An invoice was paid", "deprecated": true,
                    "x-svix-group-name": "billing", "x-svix-feature-flags": ["beta"],
                    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Invoice"}}}}
                }},
                "user.created": {"post": {"summary": "A user"}}
            },
            "components": {"schemas": {
                "Invoice": {"type": "object", "properties": {"amount": {"$ref": "#/components/schemas/Amount"}}},
                "Amount": {"type": "integer"}
            }}
        });
        let found = event_types(&doc).unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].name, "invoice.paid");
        assert_eq!(found[0].description, "An invoice was paid");
        assert!(found[0].deprecated);
        assert_eq!(found[0].group_name.as_deref(), Some("billing"));
        assert_eq!(found[0].feature_flags, Some(vec!["beta".to_owned()]));
        assert_eq!(
            found[0].schemas.as_ref().unwrap()["1"],
            json!({"type": "object", "properties": {"amount": {"type": "integer"}}})
        );
        assert_eq!(found[1].description, "A user");
        assert_eq!(found[1].schemas, None);
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert_eq!(event_types(&json!([])), Err(ImportError::NotAnObject));
        assert_eq!(event_types(&json!({})), Ok(vec![]));
        assert_eq!(event_types(&json!({"webhooks": 1})), Err(ImportError::BadWebhooks));
        assert_eq!(
            event_types(&json!({"webhooks": {"a": {"get": {}}}})),
            Err(ImportError::NoOperation("a".into()))
        );
        let dangling = json!({"webhooks": {"a": {"post": {"requestBody": {"content": {"application/json":
            {"schema": {"$ref": "#/components/schemas/Nope"}}}}}}}});
        assert!(matches!(event_types(&dangling), Err(ImportError::BadRef(..))));
        let cycle = json!({"webhooks": {"a": {"post": {"requestBody": {"content": {"application/json":
            {"schema": {"$ref": "#/components/schemas/A"}}}}}}},
            "components": {"schemas": {"A": {"$ref": "#/components/schemas/A"}}}});
        assert!(matches!(event_types(&cycle), Err(ImportError::BadRef(..))));
    }
}
