//! The error every API call of the federation answers with, apart from the federation
//! so that the messages other actors send it (the `notes` module) can name it.

use crate::store::StoreError;

/// Errors the REST API maps to HTTP statuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    /// A bad value in one field of the request (400), naming it: a JSON path into the
    /// body (`rollout.steps[1]`), a query parameter, or a header (`authorization`).
    #[error("{message}")]
    Invalid { field: String, message: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    /// A body over its route's limit (413), saying the limit.
    #[error("{0}")]
    TooLarge(String),
    /// Too many at once (429), with the seconds to wait.
    #[error("{message}")]
    Busy { message: String, retry_after_s: u64 },
    #[error("{0}")]
    Internal(String),
    /// The control plane cannot take this now (its etcd cluster has no quorum): 503,
    /// retry later. Nothing was changed.
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    /// A bad value in `field` (see [`ApiError::Invalid`]).
    pub fn invalid(field: &str, message: impl Into<String>) -> ApiError {
        ApiError::Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(_) | StoreError::Fenced(_) => {
                ApiError::Unavailable(error.to_string())
            }
            _ => ApiError::Internal(error.to_string()),
        }
    }
}
