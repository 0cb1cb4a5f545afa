//! The query-string contract of every operation, read from the OpenAPI document and enforced in one place.
//!
//! Each operation's `parameters` with `in: query` in `openapi.json` are the only query parameters it
//! takes; [`refusal`] runs before every handler and answers a 422 naming the parameter for one it does
//! not take (`value_error.extra`), one given twice, or a value its schema refuses (`type`, `enum`,
//! `minimum`/`maximum`, `minLength`/`maxLength`, `pattern`, `format: date-time`, `maxItems`). So every
//! listing validates `limit`, `iterator`, times and filters the same way, a new listing is covered as soon
//! as it is documented, and the document cannot promise less (or more) than the server accepts.
//!
//! Handlers still parse the values they use (see [`crate::query`]); by then they are known to be valid.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use regex::Regex;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::error::{ApiError, FieldError, Problem, Source};

/// What one query parameter accepts.
#[derive(Debug)]
struct Param {
    name: String,
    schema: Schema,
}

/// The subset of JSON Schema the document uses for query parameters.
#[derive(Debug)]
enum Schema {
    Integer {
        minimum: Option<i64>,
        maximum: Option<i64>,
        allowed: Option<Vec<i64>>,
    },
    Boolean,
    Text {
        allowed: Option<Vec<String>>,
        date_time: bool,
        min_length: Option<usize>,
        max_length: Option<usize>,
        pattern: Option<Regex>,
    },
    /// A list, given by repeating the key or joining values with commas.
    List {
        item: Box<Schema>,
        max_items: Option<usize>,
    },
}

/// The query parameters of every documented operation, by path template and method (nested so that a
/// request's lookup borrows its matched path instead of copying it).
type Contracts = HashMap<String, HashMap<Method, Vec<Param>>>;

static CONTRACTS: LazyLock<Contracts> =
    LazyLock::new(|| contracts(crate::openapi::DOCUMENT).unwrap_or_else(|error| panic!("openapi.json: {error}")));

/// Check the query string of a request against its operation's documented parameters: the answer
/// refusing it, if its query breaks them.
///
/// A request whose route is not documented (the dashboard, `/metrics`) passes unchecked.
pub(crate) fn refusal(request: &Request) -> Option<Response> {
    let matched = request.extensions().get::<MatchedPath>()?;
    let method = if request.method() == Method::HEAD {
        Method::GET
    } else {
        request.method().clone()
    };
    let params = CONTRACTS.get(matched.as_str())?.get(&method)?;
    check(params, request.uri().query().unwrap_or(""))
        .err()
        .map(IntoResponse::into_response)
}

/// Force the document to be read (at start-up, so a broken document fails loudly and early).
pub(crate) fn load() {
    LazyLock::force(&CONTRACTS);
}

/// Most query parameters one operation may document: [`check`] keeps a count for each on the stack.
const MAX_PARAMS: usize = 64;

fn check(params: &[Param], query: &str) -> Result<(), ApiError> {
    if query.is_empty() {
        return Ok(());
    }
    // One pass, nothing collected (this runs before every handler): by each parameter's index, how many
    // times a parameter was given, or how many values a list got over all its repetitions.
    let mut given = [0usize; MAX_PARAMS];
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let Some((index, param)) = params.iter().enumerate().find(|(_, p)| p.name == name) else {
            return Err(unknown(params, &name));
        };
        let is_list = matches!(param.schema, Schema::List { .. });
        if !is_list && given[index] > 0 {
            return Err(ApiError::query(&name, "given more than once"));
        }
        if let Err((problem, msg)) = param.schema.check(&value) {
            return Err(ApiError::invalid(Source::Query, &name, problem, msg));
        }
        let values = if is_list { list_items(&value).count() } else { 1 };
        given[index] = given[index].saturating_add(values);
    }
    for (param, count) in params.iter().zip(given) {
        if let Schema::List {
            max_items: Some(max), ..
        } = &param.schema
            && count > *max
        {
            return Err(ApiError::query(
                &param.name,
                format!("at most {max} values, got {count}"),
            ));
        }
    }
    Ok(())
}

fn unknown(params: &[Param], name: &str) -> ApiError {
    let taken: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
    ApiError::fields(vec![FieldError::unknown_query(name, &taken)])
}

/// The values of one list parameter's occurrence (`a,b` is two; empty pieces are skipped).
fn list_items(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|item| !item.is_empty())
}

impl Schema {
    /// Whether `value` is acceptable; if not, the problem and why.
    fn check(&self, value: &str) -> Result<(), (Problem, String)> {
        match self {
            Schema::Integer {
                minimum,
                maximum,
                allowed,
            } => {
                let number: i64 = value
                    .parse()
                    .map_err(|_| (Problem::Type, format!("expected an integer, got {value:?}")))?;
                if let Some(allowed) = allowed
                    && !allowed.contains(&number)
                {
                    let list: Vec<String> = allowed.iter().map(i64::to_string).collect();
                    return Err((
                        Problem::Value,
                        format!("expected one of {}, got {number}", list.join(", ")),
                    ));
                }
                let below = minimum.is_some_and(|min| number < min);
                let above = maximum.is_some_and(|max| number > max);
                if below || above {
                    let range = match (minimum, maximum) {
                        (Some(min), Some(max)) => format!("from {min} to {max}"),
                        (Some(min), None) => format!("of at least {min}"),
                        (None, Some(max)) => format!("of at most {max}"),
                        (None, None) => String::new(),
                    };
                    return Err((Problem::Value, format!("expected an integer {range}, got {number}")));
                }
                Ok(())
            }
            Schema::Boolean => match value {
                "true" | "false" => Ok(()),
                _ => Err((Problem::Type, format!("expected true or false, got {value:?}"))),
            },
            Schema::Text {
                allowed,
                date_time,
                min_length,
                max_length,
                pattern,
            } => {
                if let Some(allowed) = allowed
                    && !allowed.iter().any(|a| a == value)
                {
                    return Err((
                        Problem::Value,
                        format!("expected one of {}, got {value:?}", allowed.join(", ")),
                    ));
                }
                let length = value.chars().count();
                if min_length.is_some_and(|min| length < min) || max_length.is_some_and(|max| length > max) {
                    let min = min_length.unwrap_or(0);
                    let max = max_length.map_or_else(|| "any number of".to_owned(), |m| m.to_string());
                    return Err((Problem::Value, format!("must be {min} to {max} characters")));
                }
                if *date_time && parse_date_time(value).is_none() {
                    return Err((Problem::Value, "expected an RFC 3339 date-time".to_owned()));
                }
                if let Some(pattern) = pattern
                    && !pattern.is_match(value)
                {
                    return Err((Problem::Value, format!("does not match {}", pattern.as_str())));
                }
                Ok(())
            }
            Schema::List { item, .. } => list_items(value).try_for_each(|one| item.check(one)),
        }
    }
}

/// An RFC 3339 date-time; one without an offset is read as UTC (some Svix clients send those).
pub(crate) fn parse_date_time(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &Rfc3339)
        .or_else(|_| OffsetDateTime::parse(&format!("{text}Z"), &Rfc3339))
        .ok()
}

// ---------------------------------------------------------------------------------------------------
// Reading the document
// ---------------------------------------------------------------------------------------------------

fn contracts(document: &str) -> Result<Contracts, String> {
    let doc: Value = serde_json::from_str(document).map_err(|e| e.to_string())?;
    let paths = doc["paths"].as_object().ok_or("no paths")?;
    let mut out = Contracts::new();
    for (path, operations) in paths {
        let operations = operations.as_object().ok_or_else(|| format!("{path}: not an object"))?;
        for (method, operation) in operations {
            let Ok(method) = method.to_ascii_uppercase().parse::<Method>() else {
                continue;
            };
            let mut params = Vec::new();
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                let parameter = resolve(&doc, parameter);
                if parameter["in"] != "query" {
                    continue;
                }
                let name = parameter["name"]
                    .as_str()
                    .ok_or_else(|| format!("{path}: unnamed parameter"))?;
                let schema = schema(&doc, &parameter["schema"]).map_err(|e| format!("{method} {path} {name}: {e}"))?;
                params.push(Param {
                    name: name.to_owned(),
                    schema,
                });
            }
            if params.len() > MAX_PARAMS {
                return Err(format!("{method} {path}: more than {MAX_PARAMS} query parameters"));
            }
            out.entry(path.clone()).or_default().insert(method, params);
        }
    }
    Ok(out)
}

/// Follow a local `$ref`.
fn resolve<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
    match value["$ref"].as_str().and_then(|r| r.strip_prefix('#')) {
        Some(pointer) => doc.pointer(pointer).unwrap_or(&Value::Null),
        None => value,
    }
}

fn schema(doc: &Value, value: &Value) -> Result<Schema, String> {
    let value = resolve(doc, value);
    let integer = |key: &str| value[key].as_i64();
    let size = |key: &str| value[key].as_u64().and_then(|n| usize::try_from(n).ok());
    match value["type"].as_str() {
        Some("integer") => Ok(Schema::Integer {
            minimum: integer("minimum"),
            maximum: integer("maximum"),
            allowed: value["enum"]
                .as_array()
                .map(|all| all.iter().filter_map(Value::as_i64).collect()),
        }),
        Some("boolean") => Ok(Schema::Boolean),
        Some("string") => Ok(Schema::Text {
            allowed: value["enum"]
                .as_array()
                .map(|all| all.iter().filter_map(Value::as_str).map(str::to_owned).collect()),
            date_time: value["format"] == "date-time",
            min_length: size("minLength"),
            max_length: size("maxLength"),
            pattern: value["pattern"]
                .as_str()
                .map(|p| Regex::new(p).map_err(|e| format!("pattern {p:?}: {e}")))
                .transpose()?,
        }),
        Some("array") => Ok(Schema::List {
            item: Box::new(schema(doc, &value["items"])?),
            max_items: size("maxItems"),
        }),
        other => Err(format!("unsupported schema type {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(name: &str, schema: Value) -> Param {
        Param {
            name: name.to_owned(),
            schema: super::schema(&Value::Null, &schema).expect("schema"),
        }
    }

    fn fields(result: Result<(), ApiError>) -> Vec<(Vec<String>, &'static str)> {
        result
            .err()
            .map(|e| e.field_errors().iter().map(|f| (f.loc.clone(), f.kind)).collect())
            .unwrap_or_default()
    }

    #[test]
    fn the_document_reads() {
        let all = contracts(crate::openapi::DOCUMENT).expect("document");
        let apps = &all["/api/v1/app"][&Method::GET];
        assert!(apps.iter().any(|p| p.name == "limit"));
    }

    #[test]
    fn unknown_repeated_and_bad_values_name_the_parameter() {
        let params = [
            param(
                "limit",
                serde_json::json!({"type": "integer", "minimum": 1, "maximum": 250}),
            ),
            param("since", serde_json::json!({"type": "string", "format": "date-time"})),
            param(
                "tags",
                serde_json::json!({"type": "array", "items": {"type": "string"}, "maxItems": 2}),
            ),
        ];
        assert!(check(&params, "limit=10&since=2024-01-01T00:00:00Z&tags=a,b").is_ok());
        let query = |name: &str| vec!["query".to_owned(), name.to_owned()];
        assert_eq!(fields(check(&params, "nope=1")), [(query("nope"), "value_error.extra")]);
        assert_eq!(fields(check(&params, "limit=0")), [(query("limit"), "value_error")]);
        assert_eq!(fields(check(&params, "limit=251")), [(query("limit"), "value_error")]);
        assert_eq!(fields(check(&params, "limit=x")), [(query("limit"), "type_error")]);
        assert_eq!(
            fields(check(&params, "limit=1&limit=2")),
            [(query("limit"), "value_error")]
        );
        assert_eq!(fields(check(&params, "since=xyz")), [(query("since"), "value_error")]);
        assert_eq!(
            fields(check(&params, "tags=a&tags=b,c")),
            [(query("tags"), "value_error")]
        );
        // A list may repeat; a key is read decoded; a repeat is found past other pairs.
        assert!(check(&params, "tags=a&tags=b").is_ok());
        assert!(check(&params, "li%6Dit=10&since=2024-01-01T00%3A00%3A00Z").is_ok());
        assert_eq!(
            fields(check(&params, "limit=1&since=2024-01-01T00:00:00Z&li%6Dit=2")),
            [(query("limit"), "value_error")]
        );
    }
}
