//! The jobs' routes: submit, list, get, delete and logs, answered by the region
//! schedulers.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::*;

impl From<SchedError> for ApiError {
    fn from(error: SchedError) -> Self {
        match error {
            SchedError::BadRequest(m) => ApiError::BadRequest(m),
            SchedError::Invalid { field, message } => ApiError::Invalid { field, message },
            SchedError::NotFound(m) => ApiError::NotFound(m),
            SchedError::Conflict(m) => ApiError::Conflict(m),
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct JobQuery {
    pub region: Option<String>,
    pub tenant: Option<String>,
    /// `?stale`: any replica may answer (a standby from its copy, where it can). The
    /// leader always may, so it accepts and ignores it.
    #[serde(default, rename = "stale")]
    pub _stale: Option<String>,
    /// Pagination of `GET /v1/jobs` ([`page`]).
    #[serde(default, rename = "limit")]
    pub _limit: Option<String>,
    #[serde(default, rename = "after")]
    pub _after: Option<String>,
    /// `GET /v1/jobs?state=`: only the jobs in that state ([`JOB_STATES`]).
    pub state: Option<String>,
}

/// What `GET /v1/jobs?state=` takes: a job's states as [`JobView::state`] names them.
pub const JOB_STATES: [&str; 9] = [
    "deferred",
    "pending",
    "running",
    "terminating",
    "backoff",
    "recovering",
    "succeeded",
    "failed",
    "finished",
];

pub(super) fn parse_query(request: &HttpRequest) -> Result<JobQuery, ApiError> {
    web::Query::<JobQuery>::from_query(request.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| {
            ApiError::BadRequest(format!(
                "bad query ({e}); accepted: region, tenant, stale (and limit, after, state on lists)"
            ))
        })
}

/// `POST /v1/jobs` with a [`JobSpec`]: queues it and answers with where it went or why it
/// is not placed yet.
pub(super) async fn submit_job(
    request: HttpRequest,
    state: web::Data<ApiState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    if body.len() > MAX_JOB_BYTES {
        return Err(ApiError::BadRequest(format!(
            "job spec of {} bytes; at most {MAX_JOB_BYTES}",
            body.len()
        )));
    }
    let spec: JobSpec = parse_json(
        &body,
        "{\"name\", \"gpus\"?, \"members\"?, \"cpu_milli\"?, \"memory_mib\"?, \"priority\"?, ...} (see the README's API section)",
    )?;
    let tenant = acting_tenant(&principal, spec.tenant.as_deref())?;
    let (region, choice) = match spec.region.as_deref() {
        Some(AUTO_REGION) => {
            let mut offers = Vec::new();
            for (_, actor) in regions_to_search(&state, None)? {
                offers.push(
                    actor
                        .send(OfferJob { spec: spec.clone() })
                        .await
                        .map_err(mailbox)?,
                );
            }
            let choice = choose_region_for(&offers, state.region_weights)?;
            (choice.chosen.clone(), Some(choice))
        }
        Some(name) => (name.to_string(), None),
        None => (state.default_region.clone(), None),
    };
    let actor = region_actor(&state, &region)?;
    let result = ask_region!(
        state,
        "submit_job",
        actor,
        SubmitJob {
            tenant,
            spec,
            choice,
        }
    );
    Ok(HttpResponse::Created().json(result?))
}

/// `GET /v1/jobs[?region=&tenant=&state=]`: the caller's tenant's jobs; admins see every
/// tenant's unless they name one.
pub(super) async fn list_jobs(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let query = parse_query(&request)?;
    if let Some(wanted) = query.state.as_deref() {
        if !JOB_STATES.contains(&wanted) {
            return Err(ApiError::Invalid {
                field: "state".into(),
                message: format!("state={wanted:?}: give one of {}", JOB_STATES.join(", ")),
            });
        }
    }
    let tenant = match query.tenant.as_deref() {
        None if principal.is_admin() => None,
        requested => Some(acting_tenant(&principal, requested)?),
    };
    // Each region builds only its page's views (a count is a page of one); their pages
    // merged in key order hold the whole list's page.
    let page = page::Page::parse(request.query_string())?;
    let window = page.is_paged().then(|| (page.after.clone(), page.fetch()));
    let (mut jobs, mut total) = (Vec::<JobView>::new(), 0);
    for (_, actor) in regions_to_search(&state, query.region.as_deref())? {
        let (views, matching) = actor
            .send(ListJobs {
                tenant: tenant.clone(),
                state: query.state.clone(),
                page: window.clone(),
            })
            .await
            .map_err(mailbox)?;
        jobs.extend(views);
        total += matching;
    }
    count(&state, "list_jobs", true);
    let key = |j: &JobView| format!("{}/{}/{}", j.region, j.tenant, j.name);
    if page.is_paged() {
        jobs.sort_by_cached_key(key);
    }
    page::answer_fetched(&request, &page, jobs, total, key)
}

/// Finds the caller's job `name` in the named region or, without one, in the only
/// region that has it.
pub(super) async fn find_job(
    state: &ApiState,
    principal: &Principal,
    query: &JobQuery,
    name: &str,
) -> Result<(Addr<RegionActor>, String, JobView), ApiError> {
    let tenant = acting_tenant(principal, query.tenant.as_deref())?;
    let mut found = Vec::new();
    let mut searched = Vec::new();
    let mut other_error = None;
    for (region, actor) in regions_to_search(state, query.region.as_deref())? {
        match actor
            .send(GetJob {
                tenant: tenant.clone(),
                name: name.to_string(),
            })
            .await
            .map_err(mailbox)?
        {
            Ok(view) => found.push((actor, region, view)),
            Err(SchedError::NotFound(_)) => searched.push(region),
            Err(error) => other_error = other_error.or(Some(error)),
        }
    }
    match found.len() {
        // Not found anywhere: say where it was looked for, not only the last region.
        0 => Err(other_error.map(ApiError::from).unwrap_or_else(|| {
            ApiError::NotFound(format!(
                "no job named {name} for tenant {tenant} in {} {}{}",
                if searched.len() == 1 {
                    "region"
                } else {
                    "regions"
                },
                searched.join(", "),
                if query.tenant.is_none() {
                    " (another tenant's job needs ?tenant=, admins only)"
                } else {
                    ""
                }
            ))
        })),
        1 => {
            let (actor, _, view) = found.remove(0);
            Ok((actor, tenant, view))
        }
        _ => Err(ApiError::Conflict(format!(
            "job {name} exists in regions {}; add ?region=",
            found
                .iter()
                .map(|(_, r, _)| r.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// `GET /v1/jobs/{name}[?region=&tenant=]`: state, placement, and why it is pending.
pub(super) async fn get_job(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let query = parse_query(&request)?;
    let result = find_job(&state, &principal, &query, &name).await;
    count(&state, "get_job", result.is_ok());
    Ok(HttpResponse::Ok().json(result?.2))
}

/// `DELETE /v1/jobs/{name}[?region=&tenant=]`: cancels or ends it; its resources go
/// back at once. Answers with the job as it was.
pub(super) async fn delete_job(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let query = parse_query(&request)?;
    let (actor, tenant, _) = find_job(&state, &principal, &query, &name).await?;
    let result = ask_region!(
        state,
        "delete_job",
        actor,
        DeleteJob {
            tenant,
            name: name.into_inner(),
        }
    );
    Ok(HttpResponse::Ok().json(result?))
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    pub region: Option<String>,
    pub tenant: Option<String>,
    #[serde(default)]
    pub member: u16,
    pub attempt: Option<u32>,
    #[serde(default)]
    pub offset: u64,
    pub max_bytes: Option<u32>,
    /// `?stale`, accepted and ignored, as on [`JobQuery`].
    #[serde(default, rename = "stale")]
    pub _stale: Option<String>,
}

/// Most log bytes one call returns.
pub const MAX_LOG_BYTES: u32 = 1024 * 1024;

/// `GET /v1/jobs/{name}/logs[?member=&attempt=&offset=&max_bytes=&region=&tenant=]`: a
/// job member's output (stdout and stderr as they came), read from its pool agent,
/// from `offset`. `finished` says the member has exited (the log will not grow);
/// follow a running one by asking again from `next_offset`.
pub(super) async fn job_logs(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let query = web::Query::<LogQuery>::from_query(request.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| {
            ApiError::BadRequest(format!(
                "bad query ({e}); accepted: member, attempt, offset, max_bytes, region, tenant"
            ))
        })?;
    let job_query = JobQuery {
        region: query.region.clone(),
        tenant: query.tenant.clone(),
        ..JobQuery::default()
    };
    let (actor, tenant, view) = find_job(&state, &principal, &job_query, &name).await?;
    let max_bytes = query
        .max_bytes
        .unwrap_or(256 * 1024)
        .clamp(1, MAX_LOG_BYTES);
    let (connection, body) = ask_region!(
        state,
        "job_logs",
        actor,
        JobLogs {
            tenant,
            name: name.to_string(),
            member: query.member,
            attempt: query.attempt,
            offset: query.offset,
            max_bytes,
        }
    )?;
    let attempt = match &body {
        nephele_proto::RequestBody::JobLogs { attempt, .. } => *attempt,
        _ => view.attempt,
    };
    let exchange = async {
        let (mut send, mut recv) = connection
            .open_bi()
            .await
            .map_err(|e| ApiError::Internal(format!("cannot reach the node's agent: {e}")))?;
        nephele_net::write_frame(
            &mut send,
            &nephele_proto::StreamRequest {
                protocol_version: nephele_proto::PROTOCOL_VERSION,
                body,
            },
        )
        .await
        .map_err(|e| ApiError::Internal(format!("cannot ask the node's agent: {e}")))?;
        let _ = send.finish();
        nephele_net::read_frame::<nephele_proto::StreamResponse>(
            &mut recv,
            nephele_proto::MAX_FRAME_BYTES,
        )
        .await
        .map_err(|e| ApiError::Internal(format!("the node's agent did not answer: {e}")))?
        .ok_or_else(|| ApiError::Internal("the node's agent closed the stream".into()))
    };
    let response = tokio::time::timeout(std::time::Duration::from_secs(15), exchange)
        .await
        .map_err(|_| ApiError::Internal("the node's agent did not answer in 15 s".into()))??;
    match response {
        nephele_proto::StreamResponse::Logs {
            data,
            size,
            finished,
        } => Ok(HttpResponse::Ok().json(nephele_api::JobLogsView {
            job: name.to_string(),
            attempt,
            member: query.member,
            offset: query.offset,
            next_offset: query.offset + data.len() as u64,
            size,
            finished,
            data: String::from_utf8_lossy(&data).into_owned(),
        })),
        nephele_proto::StreamResponse::Error(error) => Err(match error.code {
            nephele_proto::ErrorCode::NotFound => ApiError::NotFound(error.message),
            nephele_proto::ErrorCode::BadRequest => ApiError::BadRequest(error.message),
            _ => ApiError::Internal(error.message),
        }),
        _ => Err(ApiError::Internal(
            "the node's agent answered something else than a log".into(),
        )),
    }
}
