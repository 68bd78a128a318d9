//! `GET /v1/watch[?kinds=&since=&timeout_s=]`: server-sent events, one per change to a
//! device, model, deployment, job or node the token may see (another tenant's models,
//! deployments and jobs are left out), each with its resource version as the event id.
//! A client that reconnects sends `Last-Event-ID` (browsers' EventSource does) or
//! `?since=` and gets what it missed; when that is no longer possible it gets a
//! `reset` event first and should list again. A comment every 15 s keeps proxies from
//! closing an idle stream.

use std::collections::VecDeque;
use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;

use super::{authorize, ApiState};
use crate::federation::access::visible;
use crate::federation::ApiError;
use crate::watch::{reset_sse, Event, Hub, Kind, Start};

/// Longest `timeout_s` (a watch without one lasts until the client goes).
pub const MAX_TIMEOUT_S: u64 = 24 * 3600;

const KEEPALIVE: Duration = Duration::from_secs(15);

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct WatchQuery {
    kinds: Option<String>,
    since: Option<String>,
    timeout_s: Option<u64>,
}

struct Follow {
    hub: Hub,
    rx: tokio::sync::broadcast::Receiver<Event>,
    kinds: Vec<Kind>,
    scope: Option<String>,
    queued: VecDeque<String>,
    deadline: Option<tokio::time::Instant>,
    done: bool,
}

impl Follow {
    fn wants(&self, event: &Event) -> bool {
        self.kinds.contains(&event.kind)
            && (!event.kind.tenanted()
                || visible(self.scope.as_deref(), event.tenant.as_deref().unwrap_or("")))
    }

    /// The next chunk of the stream, or `None` when it ends.
    async fn next(&mut self) -> Option<String> {
        if let Some(chunk) = self.queued.pop_front() {
            return Some(chunk);
        }
        if self.done {
            return None;
        }
        loop {
            let until_deadline = self
                .deadline
                .map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
            if until_deadline == Some(Duration::ZERO) {
                self.done = true;
                return None;
            }
            let wait = until_deadline.map_or(KEEPALIVE, |d| d.min(KEEPALIVE));
            match tokio::time::timeout(wait, self.rx.recv()).await {
                Ok(Ok(event)) if self.wants(&event) => return Some(self.hub.sse(&event)),
                Ok(Ok(_)) => continue,
                Ok(Err(RecvError::Lagged(missed))) => {
                    // Too slow a reader: say so and end; it resumes or lists again.
                    self.done = true;
                    return Some(reset_sse(&format!(
                        "this watch fell {missed} events behind; reconnect with Last-Event-ID, or list again"
                    )));
                }
                Ok(Err(RecvError::Closed)) => return None,
                Err(_)
                    if self
                        .deadline
                        .is_some_and(|d| d <= tokio::time::Instant::now()) =>
                {
                    return None
                }
                Err(_) => return Some(": keepalive\n\n".into()),
            }
        }
    }
}

pub async fn watch(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let query = web::Query::<WatchQuery>::from_query(request.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| {
            ApiError::invalid(
                "query",
                format!("bad query ({e}); accepted: kinds, since, timeout_s"),
            )
        })?;
    let kinds = match &query.kinds {
        Some(text) => Kind::parse_list(text).map_err(|e| ApiError::invalid("kinds", e))?,
        None => Kind::ALL.to_vec(),
    };
    if kinds.is_empty() {
        return Err(ApiError::invalid(
            "kinds",
            "kinds names none; leave it out for every kind",
        ));
    }
    if query.timeout_s.is_some_and(|t| t == 0 || t > MAX_TIMEOUT_S) {
        return Err(ApiError::invalid(
            "timeout_s",
            format!("timeout_s must be 1..={MAX_TIMEOUT_S}, or absent for a watch that lasts"),
        ));
    }
    let last_event_id = request
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let since = last_event_id.or(query.since);
    let hub = state.watch.clone();
    let (start, rx) = hub.subscribe(since.as_deref());
    let mut follow = Follow {
        hub: hub.clone(),
        rx,
        kinds,
        scope: principal.scope().map(str::to_string),
        queued: VecDeque::new(),
        deadline: query
            .timeout_s
            .map(|t| tokio::time::Instant::now() + Duration::from_secs(t)),
        done: false,
    };
    // Tell the client the stream is open at once (some wait for the first bytes).
    follow.queued.push_back(format!(
        ": watching {} from {}\n\n",
        follow
            .kinds
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(","),
        since.as_deref().unwrap_or("now")
    ));
    match start {
        Start::Reset(why) => follow.queued.push_back(reset_sse(why)),
        Start::Resume(backlog) => {
            let wanted: Vec<String> = backlog
                .iter()
                .filter(|e| follow.wants(e))
                .map(|e| hub.sse(e))
                .collect();
            follow.queued.extend(wanted);
        }
    }
    let stream = futures_util::stream::unfold(follow, |mut follow| async move {
        let chunk = follow.next().await?;
        Some((Ok::<_, actix_web::Error>(web::Bytes::from(chunk)), follow))
    });
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .insert_header(("x-accel-buffering", "no"))
        .streaming(stream))
}
