//! Why one export call did not succeed, whichever transport made it.

/// Why a call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// No connection to the collector (refused, unreachable, name unknown).
    Connect(String),
    /// The connection or stream broke, or the answer was not OTLP.
    Transport(String),
    /// The collector answered with a gRPC status other than OK (OTLP/gRPC).
    Status { code: u32, message: String },
    /// The collector answered with an HTTP status other than 2xx (OTLP/HTTP).
    Http { status: u16, message: String },
}

impl CallError {
    /// Whether trying again later may succeed: any transport failure; OTLP/gRPC's
    /// retryable codes (cancelled, deadline exceeded, resource exhausted, aborted, out
    /// of range, unavailable, data loss); OTLP/HTTP's retryable statuses (429, 502,
    /// 503, 504).
    pub fn retryable(&self) -> bool {
        match self {
            CallError::Connect(_) | CallError::Transport(_) => true,
            CallError::Status { code, .. } => matches!(code, 1 | 4 | 8 | 10 | 11 | 14 | 15),
            CallError::Http { status, .. } => matches!(status, 429 | 502 | 503 | 504),
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Connect(e) => write!(f, "cannot connect: {e}"),
            CallError::Transport(e) => write!(f, "{e}"),
            CallError::Status { code, message } => write!(f, "gRPC status {code}: {message}"),
            CallError::Http { status, message } if message.is_empty() => {
                write!(f, "HTTP {status}")
            }
            CallError::Http { status, message } => write!(f, "HTTP {status}: {message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_failures_are_the_ones_otlp_names() {
        assert!(CallError::Connect("refused".into()).retryable());
        assert!(CallError::Status {
            code: 14,
            message: String::new()
        }
        .retryable());
        assert!(!CallError::Status {
            code: 3,
            message: String::new()
        }
        .retryable());
        for status in [429, 502, 503, 504] {
            let error = CallError::Http {
                status,
                message: String::new(),
            };
            assert!(error.retryable(), "{error}");
        }
        for status in [400, 401, 404, 413, 500] {
            let error = CallError::Http {
                status,
                message: "no".into(),
            };
            assert!(!error.retryable(), "{error}");
        }
        assert_eq!(
            CallError::Http {
                status: 400,
                message: "bad spans".into()
            }
            .to_string(),
            "HTTP 400: bad spans"
        );
    }
}
