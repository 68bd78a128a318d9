//! The regions' routes: the region list, the grid signal, node slots, interruptions
//! and drains.

use actix_web::{web, HttpRequest, HttpResponse};

use super::*;

pub(super) async fn list_regions(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state).await?;
    Ok(HttpResponse::Ok().json(forward!(state, "list_regions", ListRegions)?))
}

pub use nephele_api::{GridForecastBody, GridForecastPointBody, GridPointBody, GridPushBody};

/// `PUT /v1/regions/{name}/grid` (admins: a carbon feed's token): hourly measured
/// carbon intensity and prices, and a provider's forecast; all of it is stored or none.
pub(super) async fn push_grid(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    // Admins only (a feed acts for every tenant): see `access::required`.
    authorize(&request, &state).await?;
    if body.len() > MAX_GRID_BYTES {
        return Err(ApiError::BadRequest(format!(
            "grid push of {} bytes; at most {MAX_GRID_BYTES} (send a year in several pushes)",
            body.len()
        )));
    }
    let parsed: GridPushBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::BadRequest(format!(
            "invalid grid push ({e}); expected {{\"points\": [{{\"unix\", \"carbon_g_per_kwh\"?, \"price_per_mwh\"?}}, ...], \"forecast\"?: {{\"issued_unix\", \"source\", \"points\": [{{\"unix\", \"carbon_g_per_kwh\"}}, ...]}}}}"
        ))
    })?;
    if parsed
        .forecast
        .as_ref()
        .is_some_and(|f| f.source.trim().is_empty() || f.source.len() > 64)
    {
        return Err(ApiError::BadRequest(
            "forecast.source must name the provider in 1 to 64 characters".into(),
        ));
    }
    let forecast = parsed
        .forecast
        .as_ref()
        .map(|f| crate::scheduler::ForecastPush {
            issued: f.issued_unix,
            source: f.source.trim().to_string(),
            points: f
                .points
                .iter()
                .map(|p| nephele_placement::grid::ForecastPoint {
                    hour: p.unix / nephele_placement::grid::HOUR_S,
                    carbon: p.carbon_g_per_kwh,
                })
                .collect(),
        });
    let points = parsed
        .points
        .iter()
        .map(|p| nephele_placement::grid::GridPoint {
            hour: p.unix / nephele_placement::grid::HOUR_S,
            carbon: p.carbon_g_per_kwh,
            price: p.price_per_mwh,
        })
        .collect();
    let actor = region_actor(&state, &name)?;
    let result = ask_region!(state, "push_grid", actor, PushGrid { points, forecast });
    Ok(HttpResponse::Ok().json(result?))
}

/// `GET /v1/regions/{name}/grid`: the signal, and the next 72 hours as the carbon
/// decisions see them.
pub(super) async fn get_grid(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state).await?;
    let actor = region_actor(&state, &name)?;
    let view = actor.send(GetGrid).await.map_err(mailbox)?;
    count(&state, "get_grid", true);
    Ok(HttpResponse::Ok().json(view))
}

/// `GET /v1/regions/{name}/nodes`: the region's node slots, who serves them, what is
/// free and which jobs hold them.
pub(super) async fn list_nodes(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let actor = region_actor(&state, &name)?;
    let mut nodes = actor.send(ListNodes).await.map_err(mailbox)?;
    if let Some(tenant) = principal.scope() {
        // Other tenants' job and deployment names stay hidden.
        let deployments: std::collections::HashSet<String> = forward!(
            state,
            "list_deployments",
            ListDeployments {
                scope: Some(tenant.to_string()),
                rows: false,
            }
        )?
        .into_iter()
        .map(|d| d.name)
        .collect();
        for node in &mut nodes {
            crate::federation::access::scope_node_view(node, tenant, &deployments);
        }
    }
    count(&state, "list_nodes", true);
    Ok(HttpResponse::Ok().json(nodes))
}

pub use nephele_api::InterruptBody;

/// `POST /v1/regions/{name}/nodes/{node}/interrupt` (admin) `{"notice_s"}`: the node's
/// provider will take it away (a spot interruption): its replicas start elsewhere
/// first, its jobs checkpoint and run again elsewhere, and it is released.
pub(super) async fn interrupt_node(
    request: HttpRequest,
    state: web::Data<ApiState>,
    path: web::Path<(String, String)>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    // Operators and admins: see `access::required`.
    authorize(&request, &state).await?;
    let parsed: InterruptBody = if body.is_empty() {
        InterruptBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::BadRequest(format!("invalid notice ({e}); expected {{\"notice_s\"}}"))
        })?
    };
    if parsed.notice_s == 0 || parsed.notice_s > 3600 {
        return Err(ApiError::BadRequest(
            "notice_s must be 1..=3600 seconds".into(),
        ));
    }
    let (region, node) = path.into_inner();
    let actor = region_actor(&state, &region)?;
    let result = ask_region!(
        state,
        "interrupt_node",
        actor,
        InterruptNode {
            node,
            seconds: parsed.notice_s,
            source: "API".into(),
        }
    );
    Ok(HttpResponse::Ok().json(result?))
}

/// `POST /v1/regions/{name}/nodes/{node}/drain` (admin): move its work elsewhere and,
/// in a pool with a provider, release it.
pub(super) async fn drain_node(
    request: HttpRequest,
    state: web::Data<ApiState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    // Operators and admins: see `access::required`.
    authorize(&request, &state).await?;
    let (region, node) = path.into_inner();
    let actor = region_actor(&state, &region)?;
    let result = ask_region!(state, "drain_node", actor, DrainNode { node });
    Ok(HttpResponse::Ok().json(result?))
}
