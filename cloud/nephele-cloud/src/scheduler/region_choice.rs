//! Spatial shifting: what a region offers a job submitted with `"region": "auto"`, and
//! the choice of a region from every region's offer.

use nephele_placement::carbon::{self, Excluded, RegionOffer, RegionWeights};
use nephele_placement::grid::{utc_hour, HOUR_S};
use nephele_placement::MigProfile;

use super::{
    JobOffer, JobSpec, RegionCandidate, RegionChoiceView, RegionScheduler, RegionWeightsConfig,
    SchedError,
};

impl RegionScheduler {
    /// What this region offers `spec` for `"region": "auto"`: whether it could ever
    /// take it, its free capacity, and the job's greenest window here.
    pub fn offer(&mut self, spec: &JobSpec, now: u64) -> JobOffer {
        let members = f64::from(spec.members.max(1));
        let gpu_job = spec.gpus > 0 || spec.mig_profile.is_some();
        let per_member =
            if let Some(profile) = spec.mig_profile.as_deref().and_then(MigProfile::parse) {
                f64::from(profile.milli()) / 1000.0
            } else if spec.gpus > 0 {
                f64::from(spec.gpus) * f64::from(spec.gpu_milli.unwrap_or(1000)) / 1000.0
            } else {
                spec.cpu_milli as f64 / 1000.0
            };
        let free = self
            .cluster
            .state
            .iter()
            .filter(|state| state.up)
            .map(|state| {
                if gpu_job {
                    state.gpu_left.iter().map(|m| f64::from(*m)).sum::<f64>() / 1000.0
                } else {
                    state.cpu_left as f64 / 1000.0
                }
            })
            // Not `sum()`: an empty f64 sum is -0.0.
            .fold(0.0, |total, free| total + free);
        let unfit = match self.pod_of(spec) {
            Err(error) => Some(error.to_string()),
            Ok(_) if self.slots.is_empty() => Some(format!("region {} has no pools", self.region)),
            Ok(pod) => (!(0..self.templates.nodes.len())
                .any(|i| self.templates.check(i, &pod).is_ok()))
            .then(|| {
                format!(
                    "no pool of region {} has nodes that fit one member",
                    self.region
                )
            }),
        };
        let duration = spec
            .expected_runtime_s
            .map_or(1, |r| r.div_ceil(HOUR_S).max(1) as usize);
        let latest = spec
            .deadline_unix
            .and_then(|d| d.checked_sub(spec.expected_runtime_s.unwrap_or(0)));
        let window = self
            .grid
            .best_window(now, latest, duration)
            .map(|w| (w.start_hour * HOUR_S, w.carbon, w.price))
            .map_err(|why| why.to_string());
        JobOffer {
            region: self.region.clone(),
            unfit,
            unit: if gpu_job { "gpu" } else { "cpu" },
            demand: per_member * members,
            free,
            window,
        }
    }
}

/// Chooses a region for a job from every region's [`JobOffer`] (spatial shifting).
///
/// Regions that could never take the job are left out. Among the rest, those with a
/// fresh grid signal are ranked by [`carbon::choose_region`] on the carbon of the job's
/// greenest window within its deadline, price (only when every candidate has one) and
/// free capacity; regions without a signal are not compared on carbon, so they are
/// chosen only when no region has one, and then by free capacity alone. When no region
/// has the free capacity now, the job is queued where carbon and price are best.
pub fn choose_region_for(
    offers: &[JobOffer],
    weights: RegionWeightsConfig,
) -> Result<RegionChoiceView, SchedError> {
    let fit: Vec<&JobOffer> = offers.iter().filter(|o| o.unfit.is_none()).collect();
    if fit.is_empty() {
        let why: Vec<String> = offers
            .iter()
            .map(|o| format!("{}: {}", o.region, o.unfit.as_deref().unwrap_or("?")))
            .collect();
        return Err(SchedError::BadRequest(format!(
            "no region can take this job ({})",
            if why.is_empty() {
                "no regions".to_string()
            } else {
                why.join("; ")
            }
        )));
    }
    let signalled: Vec<&JobOffer> = fit.iter().copied().filter(|o| o.window.is_ok()).collect();
    let use_carbon = !signalled.is_empty();
    let pool = if use_carbon { signalled } else { fit };
    let priced = use_carbon
        && pool
            .iter()
            .all(|o| o.window.as_ref().is_ok_and(|w| w.2.is_finite()));
    let inputs: Vec<RegionOffer> = pool
        .iter()
        .map(|o| {
            let (carbon, price) = match &o.window {
                Ok((_, carbon, price)) if use_carbon => {
                    (*carbon, if priced { *price } else { 0.0 })
                }
                _ => (0.0, 0.0),
            };
            RegionOffer {
                name: o.region.clone(),
                carbon_forecast: vec![carbon],
                price,
                free_capacity: o.free,
            }
        })
        .collect();
    let clean = |w: f64| if w.is_finite() && w > 0.0 { w } else { 0.0 };
    let used = RegionWeights {
        carbon: if use_carbon {
            clean(weights.carbon)
        } else {
            0.0
        },
        price: if priced { clean(weights.price) } else { 0.0 },
        capacity: clean(weights.capacity),
    };
    let demand = pool.first().map_or(0.0, |o| o.demand);
    let mut ranking = carbon::choose_region(&inputs, demand, used);
    let mut full = false;
    if ranking.ranked.is_empty() {
        full = true;
        ranking = carbon::choose_region(&inputs, 0.0, used);
    }
    let best = ranking
        .ranked
        .first()
        .ok_or_else(|| SchedError::BadRequest("no region could be ranked for this job".into()))?;
    let chosen = pool[best.index];
    let mut reason = match (&chosen.window, use_carbon) {
        (Ok((start, carbon, _)), true) => format!(
            "lowest score {:.2} of {}: {carbon:.0} g/kWh for its greenest window (from {})",
            best.score,
            inputs.len(),
            utc_hour(start / HOUR_S)
        ),
        _ => "no region has a grid signal: chosen by free capacity".to_string(),
    };
    if full {
        reason.push_str(
            "; no region has the free capacity now, so it queues where carbon and price are best",
        );
    }
    let candidates = offers
        .iter()
        .map(|o| {
            let index = pool.iter().position(|p| p.region == o.region);
            let ranked = index.and_then(|i| ranking.ranked.iter().find(|r| r.index == i));
            let excluded = if let Some(why) = &o.unfit {
                Some(why.clone())
            } else if let Err(why) = &o.window {
                Some(if use_carbon {
                    format!("no grid signal ({why}), so it cannot be compared on carbon")
                } else {
                    format!("no grid signal ({why})")
                })
            } else {
                index
                    .and_then(|i| ranking.excluded.iter().find(|(e, _)| *e == i))
                    .map(|(_, why)| match why {
                        Excluded::NoCapacity => "not enough free capacity now".to_string(),
                        Excluded::BadInput => "no usable carbon or price figure".to_string(),
                    })
            };
            let window = o.window.as_ref().ok();
            RegionCandidate {
                region: o.region.clone(),
                score: ranked.map(|r| r.score),
                carbon_g_per_kwh: window.map(|w| w.1),
                best_start_unix: window.map(|w| w.0),
                price_per_mwh: window.map(|w| w.2).filter(|p| p.is_finite()),
                free: o.free,
                excluded: if ranked.is_some() { None } else { excluded },
            }
        })
        .collect();
    Ok(RegionChoiceView {
        chosen: chosen.region.clone(),
        reason,
        unit: chosen.unit.to_string(),
        demand,
        weights,
        candidates,
    })
}
