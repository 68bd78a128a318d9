//! `GET /v1/reports/cost` and `GET /v1/reports/carbon`: chargeback and showback over a
//! time range ([`crate::reports`] says what each figure is). Any role may read them;
//! a token sees its own tenant's rows, an admin every tenant's (or one, `?tenant=`).

use actix_web::{web, HttpRequest, HttpResponse};

use super::{acting_tenant, authorize, count, mailbox, regions_to_search, ApiState};
use crate::federation::usage::GetEdgeUsage;
use crate::federation::ApiError;
use crate::region::GetLedger;
use crate::reports::{GroupBy, Inputs, Range};

pub use nephele_api::ReportQuery;

fn parse(request: &HttpRequest) -> Result<ReportQuery, ApiError> {
    web::Query::<ReportQuery>::from_query(request.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| {
            ApiError::invalid(
                "query",
                format!(
                    "bad query ({e}); accepted: from and to (unix seconds), group=workload|tenant, tenant, region"
                ),
            )
        })
}

/// Gathers what a report is made of, for the caller's scope.
async fn gather(
    request: &HttpRequest,
    state: &ApiState,
) -> Result<(Inputs, Range, Option<String>, GroupBy), ApiError> {
    let principal = authorize(request, state).await?;
    let query = parse(request)?;
    let scope = match query.tenant.as_deref() {
        None => principal.scope().map(str::to_string),
        requested => Some(acting_tenant(&principal, requested)?),
    };
    let range = Range::new(
        query.from,
        query.to,
        crate::federation::now_unix_ms() / 1000,
    )
    .map_err(|e| ApiError::invalid("from", e))?;
    let mut inputs = Inputs {
        serving_tenant: crate::scheduler::SERVING_TENANT.to_string(),
        ..Inputs::default()
    };
    for (_, actor) in regions_to_search(state, query.region.as_deref())? {
        inputs.regions.push(
            actor
                .send(GetLedger {
                    from: range.from,
                    to: range.to,
                })
                .await
                .map_err(mailbox)?,
        );
    }
    let (edge, owners) = state
        .federation
        .send(GetEdgeUsage {
            from: range.from,
            to: range.to,
        })
        .await
        .map_err(mailbox)?;
    // Requests served on devices are not in any region's pools: left out when the
    // caller asks for one region.
    if query.region.is_none() {
        inputs.edge = edge;
    }
    inputs.owners = owners;
    Ok((inputs, range, scope, query.group))
}

/// `GET /v1/reports/cost[?from=&to=&group=&tenant=&region=]`.
pub async fn cost(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let result = gather(&request, &state).await;
    count(&state, "report_cost", result.is_ok());
    let (inputs, range, scope, group) = result?;
    Ok(HttpResponse::Ok().json(crate::reports::cost(
        &inputs,
        range,
        scope.as_deref(),
        group,
    )))
}

/// `GET /v1/reports/carbon[?from=&to=&group=&tenant=&region=]`.
pub async fn carbon(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let result = gather(&request, &state).await;
    count(&state, "report_carbon", result.is_ok());
    let (inputs, range, scope, group) = result?;
    Ok(HttpResponse::Ok().json(crate::reports::carbon(
        &inputs,
        range,
        scope.as_deref(),
        group,
    )))
}
