//! How the API says no: every error is `application/problem+json` (RFC 9457).

use serde::{Deserialize, Serialize};

/// The media type of every error answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer. `field` names the value at fault where there is one: a JSON path
/// into the body (`rollout.steps[1]`), a query parameter, or a header
/// (`authorization`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Problem {
    /// `urn:nephele:problem:<kind>`.
    #[serde(rename = "type")]
    pub kind_uri: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// With a 429: seconds to wait (also in `Retry-After`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    /// The kind alone, for clients of the first API shape.
    #[serde(default)]
    pub error: String,
    /// `detail` again, for clients of the first API shape.
    #[serde(default)]
    pub message: String,
}

impl Problem {
    /// A problem of `kind` (`not_found`, `invalid`, …).
    pub fn new(status: u16, kind: &str, title: &str, detail: String) -> Problem {
        Problem {
            kind_uri: format!("urn:nephele:problem:{kind}"),
            title: title.to_string(),
            status,
            message: detail.clone(),
            detail,
            field: None,
            retry_after_s: None,
            error: kind.to_string(),
        }
    }
}
