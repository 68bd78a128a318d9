//! A standby's own answers to reads, from its copy of the fleet's records
//! ([`FleetCopy`]), loaded from the store and reloaded when it is older than
//! [`MAX_COPY_AGE`]. Every such answer says so in its headers:
//! `x-nephele-stale: true`, `x-nephele-copy-age-ms`, `x-nephele-known-leader`, and,
//! when the leader could not be asked, `x-nephele-stale-reason`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::http::respond;
use crate::api::{error_body, MISSING_TOKEN};
use crate::config::CloudConfig;
use crate::federation::fleet_copy::{CopyRead, FleetCopy};
use crate::federation::fleet_store::FleetStore as _;
use crate::federation::ApiError;
use crate::store::Store;

/// How old a copy may be before a read reloads it.
pub const MAX_COPY_AGE: Duration = Duration::from_secs(1);

/// The copy a standby answers from.
pub struct Reads {
    store: Store,
    config: CloudConfig,
    copy: tokio::sync::Mutex<Option<(Instant, Arc<FleetCopy>)>>,
}

/// Whether a leader was known when a read was answered here, and why the leader did
/// not answer it.
pub struct Leader {
    pub known: bool,
    pub why_not_asked: Option<String>,
}

impl Reads {
    pub fn new(store: Store, config: CloudConfig) -> Reads {
        Reads {
            store,
            config,
            copy: tokio::sync::Mutex::new(None),
        }
    }

    /// The copy, reloaded when older than [`MAX_COPY_AGE`]; when the store cannot be
    /// read, the last copy (its age says how old) or why there is none.
    async fn copy(&self) -> Result<(Arc<FleetCopy>, Duration), String> {
        let mut held = self.copy.lock().await;
        if let Some((loaded, copy)) = held.as_ref() {
            if loaded.elapsed() <= MAX_COPY_AGE {
                return Ok((copy.clone(), loaded.elapsed()));
            }
        }
        let store = self.store.clone();
        let loaded = Instant::now();
        let snapshot = tokio::task::spawn_blocking(move || store.load())
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        match snapshot {
            Ok(snapshot) => {
                let copy = Arc::new(FleetCopy::new(self.config.clone(), snapshot));
                *held = Some((loaded, copy.clone()));
                Ok((copy, loaded.elapsed()))
            }
            Err(error) => match held.as_ref() {
                Some((loaded, copy)) => {
                    tracing::warn!(%error, "standby: cannot reload the fleet's records; answering from the last copy");
                    Ok((copy.clone(), loaded.elapsed()))
                }
                None => Err(error),
            },
        }
    }

    /// Answers `read` from the copy, after checking `token` against it, and closes the
    /// connection.
    pub async fn answer(
        &self,
        client: &mut (impl tokio::io::AsyncWrite + Unpin),
        read: &CopyRead,
        token: Option<&str>,
        leader: Leader,
    ) {
        let mut headers = vec![
            ("x-nephele-stale", "true".to_string()),
            ("x-nephele-known-leader", leader.known.to_string()),
        ];
        if let Some(why) = leader.why_not_asked {
            headers.push(("x-nephele-stale-reason", why));
        }
        let answer = match self.copy().await {
            Ok((copy, age)) => {
                headers.push(("x-nephele-copy-age-ms", age.as_millis().to_string()));
                answer(&copy, read, token)
            }
            Err(error) => Err(ApiError::Unavailable(format!(
                "no leader answered and this standby cannot read the store ({error}); retry in a second"
            ))),
        };
        match answer {
            Ok(body) => respond(client, 200, &headers, &body).await,
            Err(error) => {
                if matches!(error, ApiError::Unavailable(_)) {
                    headers.push(("retry-after", "1".into()));
                }
                let status = actix_web::ResponseError::status_code(&error).as_u16();
                respond(client, status, &headers, &error_body(&error)).await
            }
        }
    }
}

/// The copy's answer to a request for `read` bearing `token`.
fn answer(
    copy: &FleetCopy,
    read: &CopyRead,
    token: Option<&str>,
) -> Result<serde_json::Value, ApiError> {
    let token = token.ok_or_else(|| ApiError::Unauthorized(MISSING_TOKEN.into()))?;
    let principal = copy
        .authenticate(token, crate::federation::now_unix())
        .map_err(|why| {
            tracing::warn!("standby: a read with an invalid API token was refused");
            ApiError::Unauthorized(why)
        })?;
    // The same table as the leader's: join tokens are for operators.
    let (method, path) = ("GET", read.path());
    principal
        .check(
            crate::federation::access::required(method, &path),
            method,
            &path,
        )
        .map_err(ApiError::Forbidden)?;
    copy.answer(read, principal.scope())
}
