//! Temporal shifting: the grid signal a feed pushes to the region, and the deferrable
//! jobs held for a lower-carbon hour, planned at submission and released by each tick.

use nephele_placement::grid::{
    utc_hour, DeferDecision, Deferral, GridError, GridPoint, NoOutlook, StartReason, HOUR_S,
};
use nephele_placement::JobId;

use super::{
    books, DeferralView, ForecastPush, GridHourView, GridPushView, GridView, Hold, JobSpec,
    ProviderForecastView, RegionScheduler, SchedError, SchedEvent, MAX_DEFER_S,
};

impl RegionScheduler {
    /// Checks a deadline and plans the wait; the first decision is the next tick's.
    pub(super) fn plan_deferral(
        &mut self,
        spec: &JobSpec,
        deadline: u64,
        now: u64,
    ) -> Result<(Deferral, DeferralView), SchedError> {
        let bad = |m: String| Err(SchedError::BadRequest(m));
        let Some(runtime) = spec.expected_runtime_s.filter(|r| *r > 0) else {
            return bad(
                "deadline_unix needs expected_runtime_s (> 0): the runtime decides when the job must start"
                    .into(),
            );
        };
        let Some(plan) = Deferral::new(runtime, deadline).filter(|p| p.latest_start >= now) else {
            return bad(format!(
                "deadline_unix {deadline} leaves less than expected_runtime_s ({runtime} s) after now ({now})"
            ));
        };
        if deadline - now > MAX_DEFER_S {
            return bad(format!(
                "deadline_unix {deadline} is more than {} days away",
                MAX_DEFER_S / 86_400
            ));
        }
        let carbon_at_submit = self
            .grid
            .best_window(now, None, plan.duration_hours)
            .ok()
            .map(|w| w.carbon);
        let view = DeferralView {
            deadline_unix: deadline,
            latest_start_unix: plan.latest_start,
            state: "waiting".into(),
            reason: "not decided yet".into(),
            carbon_at_submit,
            carbon_now: carbon_at_submit,
            best_start_unix: None,
            best_carbon: None,
            released_unix: None,
        };
        Ok((plan, view))
    }

    /// This hour's start-or-wait decision for every held job; released ones join the
    /// queue with `now` as their submission time.
    pub(super) fn release_deferred(&mut self, now: u64) -> Vec<SchedEvent> {
        let mut events = Vec::new();
        let held: Vec<JobId> = self
            .held_jobs()
            .filter(|(_, m)| matches!(m.held, Some((_, Hold::Deferred))))
            .map(|(id, _)| id)
            .collect();
        for id in held {
            let Some(meta) = self.jobs.get_mut(&id) else {
                continue;
            };
            let name = format!("{}/{}", self.tenants[meta.tenant], meta.name);
            let Some(deferred) = meta.deferral.as_mut() else {
                continue;
            };
            let view = &mut deferred.view;
            match self.grid.decide(now, &deferred.plan) {
                DeferDecision::Wait {
                    now_carbon,
                    best_hour,
                    best_carbon,
                } => {
                    view.carbon_now = Some(now_carbon);
                    view.best_start_unix = Some(best_hour * HOUR_S);
                    view.best_carbon = Some(best_carbon);
                    view.reason = format!(
                        "waiting for a lower-carbon hour: {now_carbon:.0} g/kWh if it started now, {best_carbon:.0} forecast from {}",
                        utc_hour(best_hour)
                    );
                }
                DeferDecision::Start(reason) => {
                    let Some((mut job, _)) = meta.held.take() else {
                        continue;
                    };
                    job.submit = now;
                    view.carbon_now = self
                        .grid
                        .best_window(now, None, deferred.plan.duration_hours)
                        .ok()
                        .map(|w| w.carbon);
                    view.reason = match reason {
                        StartReason::LatestStart => {
                            "released at its latest start: any later would miss the deadline"
                                .to_string()
                        }
                        StartReason::NoSignal(why) => format!("released without waiting: {why}"),
                        StartReason::LowestNow { carbon } => format!(
                            "released: no later window is forecast below this one ({carbon:.0} g/kWh)"
                        ),
                    };
                    if let Err(error) = self.queue.submit(job.clone()) {
                        // Cannot happen for a fresh id; keep it held rather than lose it.
                        view.reason = format!("could not queue it ({error}); retrying");
                        meta.held = Some((job, Hold::Deferred));
                        self.holding.insert(id);
                        continue;
                    }
                    view.state = "released".into();
                    view.released_unix = Some(now);
                    view.best_start_unix = None;
                    view.best_carbon = None;
                    events.push(SchedEvent::Released {
                        job: name,
                        reason: view.reason.clone(),
                    });
                }
            }
        }
        events
    }

    /// The forecast kept in the region's books (see
    /// [`RegionRecord::grid_forecast`](super::RegionRecord::grid_forecast)).
    pub fn stored_forecast(&self) -> Option<books::StoredForecast> {
        self.grid.provider_forecast().map(|f| {
            let points = f
                .carbon
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(i, v)| (f.first_hour + i as u64, *v))
                .collect();
            (f.issued, f.source.clone(), points)
        })
    }

    /// Stores grid measurements and a provider's forecast (all of both, or none) and
    /// re-decides the held jobs.
    pub fn push_grid(
        &mut self,
        points: &[GridPoint],
        forecast: Option<&ForecastPush>,
        now: u64,
    ) -> Result<(GridPushView, Vec<SchedEvent>), SchedError> {
        if points.is_empty() && forecast.is_none() {
            return Err(SchedError::BadRequest(
                "no points: give measured \"points\", a provider's \"forecast\", or both".into(),
            ));
        }
        let bad = |e: GridError| SchedError::BadRequest(e.to_string());
        // On a copy first, so that a bad forecast leaves the measurements out too.
        let mut grid = self.grid.clone();
        let ingested = if points.is_empty() {
            Default::default()
        } else {
            grid.ingest(points, now).map_err(bad)?
        };
        let forecast_ingested = forecast
            .map(|f| grid.ingest_forecast(&f.points, f.issued, &f.source, now))
            .transpose()
            .map_err(bad)?;
        self.grid = grid;
        let events = self.tick(now);
        Ok((
            GridPushView {
                kept: ingested.kept,
                too_old: ingested.too_old,
                forecast_hours: forecast_ingested.map(|f| f.hours),
                replaced_forecast_issued_unix: forecast_ingested.and_then(|f| f.replaced),
                grid: self.grid_view(now),
            },
            events,
        ))
    }

    /// The grid signal as the carbon decisions see it at `now`.
    pub fn grid_view(&mut self, now: u64) -> GridView {
        let deferred_jobs = self
            .held_jobs()
            .filter(|(_, m)| matches!(m.held, Some((_, Hold::Deferred))))
            .count();
        let (signal, note, outlook) = match self.grid.outlook(now) {
            Ok(outlook) => (
                "fresh",
                None,
                (0..outlook.carbon.len())
                    .map(|i| GridHourView {
                        unix: (outlook.from_hour + i as u64) * HOUR_S,
                        carbon_g_per_kwh: outlook.carbon[i],
                        measured: outlook.measured[i],
                        source: if outlook.measured[i] {
                            "measured"
                        } else if outlook.provider[i] {
                            "provider"
                        } else {
                            "model"
                        }
                        .into(),
                        price_per_mwh: Some(outlook.price[i]).filter(|p| p.is_finite()),
                    })
                    .collect(),
            ),
            Err(why @ NoOutlook::NoData) => (
                "none",
                Some(format!(
                    "{why}: push measurements with `nephele grid push {}` (PUT /v1/regions/{}/grid); until then deferrable jobs start at once",
                    self.region, self.region
                )),
                Vec::new(),
            ),
            Err(why @ NoOutlook::Stale { .. }) => (
                "stale",
                Some(format!(
                    "{why}: deferrable jobs start at once until the feed catches up"
                )),
                Vec::new(),
            ),
        };
        let forecast = self.grid.provider_forecast().map(|f| {
            let span = f.span().unwrap_or((f.first_hour, f.first_hour));
            ProviderForecastView {
                source: f.source.clone(),
                issued_unix: f.issued,
                hours: f.carbon.iter().filter(|v| v.is_finite()).count(),
                first_unix: span.0 * HOUR_S,
                last_unix: span.1 * HOUR_S,
                fresh: f.fresh(now),
            }
        });
        GridView {
            region: self.region.clone(),
            carbon_zone: self.carbon_zone.clone(),
            signal: signal.into(),
            note,
            forecast,
            measured_hours: self.grid.measured_hours(),
            latest_measured_unix: self.grid.latest_measured().map(|h| h * HOUR_S),
            outlook,
            deferred_jobs,
        }
    }
}
