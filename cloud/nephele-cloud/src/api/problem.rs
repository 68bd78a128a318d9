//! How the API says no: every error is `application/problem+json` (RFC 9457) with
//! `type`, `title`, `status` and `detail`, the field at fault where there is one
//! (`field`: a JSON path into the body, a query parameter, or a header), and for
//! clients of the first API shape `error` (the kind) and `message` (= `detail`).
//! Bodies are parsed with the path of the value at fault ([`parse_json`]).

use actix_web::{http::StatusCode, HttpResponse, ResponseError};
use serde::de::DeserializeOwned;

use crate::federation::ApiError;

/// The media type of every error answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::Invalid { .. } => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        match self {
            ApiError::Busy { retry_after_s, .. } => {
                response.insert_header(("retry-after", retry_after_s.to_string()));
            }
            ApiError::Unavailable(_) => {
                response.insert_header(("retry-after", "5"));
            }
            ApiError::Unauthorized(_) => {
                response.insert_header(("www-authenticate", "Bearer realm=\"nephele\""));
            }
            _ => {}
        }
        response
            .content_type(PROBLEM_JSON)
            .body(error_body(self).to_string())
    }
}

fn kind_and_title(error: &ApiError) -> (&'static str, &'static str) {
    match error {
        ApiError::BadRequest(_) => ("bad_request", "Bad request"),
        ApiError::Invalid { .. } => ("invalid", "Invalid value"),
        ApiError::NotFound(_) => ("not_found", "Not found"),
        ApiError::Conflict(_) => ("conflict", "Conflict"),
        ApiError::Unauthorized(_) => ("unauthorized", "Not authenticated"),
        ApiError::Forbidden(_) => ("forbidden", "Not allowed"),
        ApiError::TooLarge(_) => ("too_large", "Request too large"),
        ApiError::Busy { .. } => ("busy", "Too many requests"),
        ApiError::Internal(_) => ("internal", "Internal error"),
        ApiError::Unavailable(_) => ("unavailable", "Unavailable"),
    }
}

/// The field at fault, where the error has one.
fn field(error: &ApiError) -> Option<&str> {
    match error {
        ApiError::Invalid { field, .. } => Some(field),
        ApiError::Unauthorized(_) => Some("authorization"),
        ApiError::Forbidden(message) if message.starts_with("tenant:") => Some("tenant"),
        ApiError::Forbidden(_) => Some("authorization"),
        ApiError::TooLarge(_) => Some("body"),
        _ => None,
    }
}

/// The problem document for `error` (also what a standby answers with).
pub fn error_body(error: &ApiError) -> serde_json::Value {
    let (kind, title) = kind_and_title(error);
    let status = error.status_code().as_u16();
    let mut body = serde_json::json!({
        "type": format!("urn:nephele:problem:{kind}"),
        "title": title,
        "status": status,
        "detail": error.to_string(),
        "error": kind,
        "message": error.to_string(),
    });
    if let Some(field) = field(error) {
        body["field"] = field.into();
    }
    if let ApiError::Busy { retry_after_s, .. } = error {
        body["retry_after_s"] = (*retry_after_s).into();
    }
    body
}

/// A problem document for an answer that is not an [`ApiError`] (a 405).
pub fn problem(status: StatusCode, kind: &str, title: &str, detail: String) -> HttpResponse {
    HttpResponse::build(status).content_type(PROBLEM_JSON).body(
        serde_json::json!({
            "type": format!("urn:nephele:problem:{kind}"),
            "title": title,
            "status": status.as_u16(),
            "detail": detail,
            "error": kind,
            "message": detail,
        })
        .to_string(),
    )
}

/// The field a serde error is about: the path to the value at fault, or for a missing
/// or unknown field (where serde's path ends at the object) the object's path and the
/// field's name.
fn field_at(path: &str, message: &str) -> String {
    let named = ["missing field `", "unknown field `"]
        .iter()
        .find_map(|prefix| message.split_once(prefix))
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(name, _)| name);
    match (path, named) {
        (".", Some(name)) => name.to_string(),
        (".", None) => "body".to_string(),
        (path, Some(name)) if path == name || path.ends_with(&format!(".{name}")) => {
            path.to_string()
        }
        (path, Some(name)) => format!("{path}.{name}"),
        (path, None) => path.to_string(),
    }
}

/// Parses a JSON body as `T`; a bad one is refused naming the field at fault and
/// what was expected (`expected`, e.g. `{"name", "role", "tenant", "ttl_s"?}`).
pub fn parse_json<T: DeserializeOwned>(body: &[u8], expected: &str) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize::<_, T>(&mut deserializer).map_err(|error| {
        let message = error.inner().to_string();
        let field = field_at(&error.path().to_string(), &message);
        ApiError::Invalid {
            message: format!("invalid JSON body: {field}: {message}; expected {expected}"),
            field,
        }
    })?;
    deserializer.end().map_err(|error| ApiError::Invalid {
        field: "body".into(),
        message: format!("invalid JSON body: {error}; expected {expected}"),
    })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Spec {
        name: String,
        rollout: Option<Inner>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        steps: Vec<u32>,
    }

    fn field_of(body: &str) -> String {
        match parse_json::<Spec>(body.as_bytes(), "a spec") {
            Err(ApiError::Invalid { field, message }) => {
                assert!(message.contains("expected a spec"), "{message}");
                field
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_bad_body_names_the_field_at_fault() {
        assert_eq!(field_of(r#"{"rollout": null}"#), "name");
        assert_eq!(field_of(r#"{"name": "a", "colour": 1}"#), "colour");
        assert_eq!(field_of(r#"{"name": 7}"#), "name");
        assert_eq!(
            field_of(r#"{"name": "a", "rollout": {"steps": [1, "x"]}}"#),
            "rollout.steps[1]"
        );
        assert_eq!(
            field_of(r#"{"name": "a", "rollout": {"step": []}}"#),
            "rollout.step"
        );
        assert_eq!(field_of("not json"), "body");
        assert_eq!(field_of(r#"{"name": "a"} trailing"#), "body");
        assert!(parse_json::<Spec>(br#"{"name": "a"}"#, "").is_ok());
    }

    #[test]
    fn every_error_is_a_problem_document() {
        let body = error_body(&ApiError::invalid("ttl_s", "ttl_s must be positive"));
        assert_eq!(body["status"], 400);
        assert_eq!(body["field"], "ttl_s");
        assert_eq!(body["type"], "urn:nephele:problem:invalid");
        assert_eq!(body["detail"], body["message"]);
        let busy = error_body(&ApiError::Busy {
            message: "slow down".into(),
            retry_after_s: 3,
        });
        assert_eq!(busy["status"], 429);
        assert_eq!(busy["retry_after_s"], 3);
        assert_eq!(
            error_body(&ApiError::Unauthorized("no".into()))["field"],
            "authorization"
        );
    }
}
