//! Time replay of the openb trace through the scheduling queue (`nephele_placement::queue`),
//! in virtual time: an event queue of arrivals, completions and grace-period ends, one
//! `Queue::tick` per distinct event time. No wall clock anywhere.
//!
//! How the trace becomes jobs (documented choices, see also the README of the data):
//!
//! * **Duration** = `deletion_time − scheduled_time`, at least 1 s. The time between
//!   creation and scheduling was the original cluster's queueing; the replay makes its
//!   own, so counting it as work would count it twice.
//! * **Phases.** `Running`, `Succeeded` and `Failed` pods held their resources from
//!   scheduling to deletion, so all three are replayed (a failed pod's run is still
//!   work the cluster carried). `Pending` pods never ran in the trace (no
//!   `scheduled_time`; their "lifetime" is how long they waited before being deleted):
//!   replaying them would invent work, so they are left out and counted
//!   (`excluded_never_ran`). No replayed pod has a zero or negative duration; the floor
//!   of 1 s only guards bad input.
//! * **Arrival** = `creation_time / time_compression`. openb spans ~149 days with
//!   ~0.2% of the cluster's GPUs busy on average, so a faithful replay never queues;
//!   compressing arrivals (runtimes unchanged) and keeping every `node_stride`-th node
//!   (heterogeneity kept) gives the queue real contention.
//! * **Tenants**: the trace has none. `FNV-1a(pod name) mod 4` → tenant-a..d, weights
//!   2, 1, 1, 1 (tenant-a is entitled to twice the others' dominant share).
//! * **Priority** from `qos`: LS and Guaranteed → production, Burstable → batch, BE →
//!   best-effort (the only preemptible class); anything else → batch.
//! * **Expected runtime** handed to the queue = the real one (perfect estimates), so
//!   backfilling is at its best; the effect of misestimates is not studied here.
//! * **Preemption** keeps the work done up to the signal (checkpoint-then-stop); the
//!   grace period itself is lost time.
//! * **Regions**: each node goes to zone `FNV-1a(node name) mod N` of `zones` (default
//!   CA-ON, DE-LU, US-CAL-CISO, SG: all four have hourly carbon intensity and prices).
//!   Trace second `s` maps to hour `s / 3600` from 2023-01-01 00:00 UTC (wrapping after
//!   8760 h); the series are read by `trace::load_carbon`/`load_prices` (gaps interpolated and counted).
//! * **Energy model**: every node draws `node_idle_watts` plus `gpu_idle_watts` per GPU
//!   all the time; allocated GPU share adds `gpu_busy_watts − gpu_idle_watts` per whole
//!   GPU (allocation stands in for use). Emissions = energy × that hour's direct carbon
//!   intensity; cost = energy × that hour's price (negative prices count as they are).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use nephele_placement::fairness::jain_index;
use nephele_placement::queue::{Effect, Job, JobState, PriorityClass, Quota, Tenant};
use nephele_placement::{Cluster, Policy, Queue, QueueConfig, Topology, TypicalPods};
use serde::Serialize;

use crate::trace::{load_carbon, load_openb, load_prices, Trace};

/// One scheduler configuration to compare.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayConfig {
    pub name: String,
    pub queue: QueueConfig,
}

impl ReplayConfig {
    /// Global FIFO, no priorities, no fairness, no preemption, no reservation.
    pub fn fifo(policy: Policy) -> ReplayConfig {
        ReplayConfig {
            name: format!("fifo/{}", policy.name()),
            queue: QueueConfig {
                policy,
                priorities: false,
                fairness: false,
                preemption: false,
                aging_seconds: None,
                ..QueueConfig::default()
            },
        }
    }

    /// The full design: priority classes, DRF, preemption, aging reservation + backfill.
    pub fn full(policy: Policy, grace_seconds: u64, aging_seconds: u64) -> ReplayConfig {
        ReplayConfig {
            name: format!("drf+prio+preempt+backfill/{}", policy.name()),
            queue: QueueConfig {
                policy,
                grace_seconds,
                aging_seconds: Some(aging_seconds),
                ..QueueConfig::default()
            },
        }
    }
}

/// Knobs of a replay.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOptions {
    /// Arrival times are divided by this (≥ 1; runtimes are not).
    pub time_compression: f64,
    /// Keep every n-th GPU node (1 = all).
    pub node_stride: usize,
    /// Zones (file stems of the carbon and price series) nodes are spread over.
    pub zones: Vec<String>,
    pub configs: Vec<ReplayConfig>,
    /// Step of the utilisation series written to `replay.csv`.
    pub sample_seconds: u64,
    /// Replay only the first n jobs by arrival (for quick runs); `None`: all.
    pub limit_jobs: Option<usize>,
    /// Each tenant's GPU quota as a share of cluster GPUs; `None`: unlimited.
    pub tenant_gpu_quota: Option<f64>,
    pub node_idle_watts: f64,
    pub gpu_idle_watts: f64,
    pub gpu_busy_watts: f64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            time_compression: 100.0,
            node_stride: 10,
            zones: ["CA-ON", "DE-LU", "US-CAL-CISO", "SG"]
                .iter()
                .map(|z| z.to_string())
                .collect(),
            configs: vec![
                ReplayConfig::fifo(Policy::BestFit),
                ReplayConfig::full(Policy::BestFit, 30, 3600),
                ReplayConfig::full(Policy::Fgd, 30, 3600),
            ],
            sample_seconds: 600,
            limit_jobs: None,
            tenant_gpu_quota: None,
            node_idle_watts: 150.0,
            gpu_idle_watts: 50.0,
            gpu_busy_watts: 300.0,
        }
    }
}

/// A job of the replay, independent of the trace format (so tests can build their own).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayJob {
    pub name: String,
    pub arrival: u64,
    pub runtime: u64,
    pub class: PriorityClass,
    pub pod: nephele_placement::PodRequest,
}

/// Hourly series of one zone.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneSeries {
    pub zone: String,
    /// gCO₂eq/kWh per hour of 2023.
    pub carbon: Vec<f64>,
    /// USD/MWh per hour of 2023.
    pub price: Vec<f64>,
}

impl ZoneSeries {
    /// A zone with the same value every hour (tests).
    pub fn flat(zone: &str, carbon: f64, price: f64) -> ZoneSeries {
        ZoneSeries {
            zone: zone.to_string(),
            carbon: vec![carbon; HOURS],
            price: vec![price; HOURS],
        }
    }
}

const HOURS: usize = 8760;
/// Trace second 0 is this hour.
const GRID_START: &str = "2023-01-01 00";

#[derive(Debug, Clone, Serialize)]
pub struct RegionInfo {
    pub zone: String,
    pub nodes: usize,
    pub gpus: u64,
    pub mean_carbon_g_per_kwh: f64,
    pub mean_price_usd_per_mwh: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub name: String,
    pub policy: String,
    pub jobs: usize,
    pub finished: usize,
    /// Jobs still pending at the end (none of the nodes could ever take them).
    pub never_started: usize,
    /// Time spent pending (first submit to start, plus any time after a preemption).
    pub queue_delay_avg_s: f64,
    pub queue_delay_p95_s: f64,
    /// Completion time: finish − arrival, finished jobs only.
    pub jct_avg_s: f64,
    pub jct_p95_s: f64,
    /// Average queueing delay per priority class (finished jobs): who pays for it.
    pub queue_delay_avg_by_class_s: std::collections::BTreeMap<String, f64>,
    /// Allocated / capacity GPU, time-averaged between the first and last arrival
    /// (the window in which the queue is exercised), in %.
    pub gpu_util_mean_pct: f64,
    pub gpu_util_peak_pct: f64,
    /// Jain's index of weighted dominant shares (share / weight) over the tenants that
    /// have pending work, time-averaged over the periods when at least two do; 1 when
    /// there is no such period.
    pub jain: f64,
    /// Seconds covered by the Jain average.
    pub jain_seconds: u64,
    pub preemptions: u64,
    pub makespan_s: u64,
    pub energy_kwh: f64,
    /// The part of the energy from allocated GPUs (idle draw excluded).
    pub active_energy_kwh: f64,
    pub cost_usd: f64,
    pub carbon_kg: f64,
    pub wall_seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub pods_in_trace: usize,
    pub excluded_never_ran: usize,
    pub jobs: usize,
    pub nodes: usize,
    pub gpus: u64,
    pub time_compression: f64,
    pub node_stride: usize,
    pub regions: Vec<RegionInfo>,
    pub runs: Vec<RunSummary>,
    /// Per run: (seconds, allocated GPU %) every `sample_seconds`.
    #[serde(skip)]
    pub utilisation: Vec<Vec<(u64, f64)>>,
    #[serde(skip)]
    pub sample_seconds: u64,
}

impl ReplayReport {
    /// A table for people.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{} jobs ({} pending pods of {} left out: they never ran), {} nodes, {} GPUs, arrivals compressed {}x, regions: {}\n",
            self.jobs,
            self.excluded_never_ran,
            self.pods_in_trace,
            self.nodes,
            self.gpus / 1000,
            self.time_compression,
            self.regions
                .iter()
                .map(|r| format!("{} ({} nodes)", r.zone, r.nodes))
                .collect::<Vec<_>>()
                .join(", ")
        );
        out += &format!(
            "{:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} {:>5} {:>6} {:>9} {:>9} {:>6}\n",
            "configuration",
            "wait avg",
            "wait p95",
            "prod avg",
            "BE avg",
            "JCT avg",
            "JCT p95",
            "util%",
            "peak%",
            "Jain",
            "preempt",
            "cost $",
            "CO2 kg",
            "unrun"
        );
        for run in &self.runs {
            let class_wait = |class: &str| {
                run.queue_delay_avg_by_class_s
                    .get(class)
                    .copied()
                    .unwrap_or(0.0)
            };
            out += &format!(
                "{:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6.1} {:>6.1} {:>5.3} {:>6} {:>9.0} {:>9.0} {:>6}\n",
                run.name,
                duration(run.queue_delay_avg_s),
                duration(run.queue_delay_p95_s),
                duration(class_wait("production")),
                duration(class_wait("best-effort")),
                duration(run.jct_avg_s),
                duration(run.jct_p95_s),
                run.gpu_util_mean_pct,
                run.gpu_util_peak_pct,
                run.jain,
                run.preemptions,
                run.cost_usd,
                run.carbon_kg,
                run.never_started
            );
        }
        out
    }

    /// Writes `replay.csv` (utilisation over time), `replay.json` and `replay.svg`.
    pub fn write(&self, out: &Path) -> Result<()> {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        let mut csv = String::from("config,seconds,gpu_allocated_pct\n");
        for (run, series) in self.runs.iter().zip(&self.utilisation) {
            for (t, u) in series {
                csv += &format!("{},{t},{u:.3}\n", run.name);
            }
        }
        std::fs::write(out.join("replay.csv"), csv)?;
        std::fs::write(out.join("replay.json"), serde_json::to_string_pretty(self)?)?;
        let curves: Vec<(String, Vec<(f64, f64)>)> = self
            .runs
            .iter()
            .zip(&self.utilisation)
            .map(|(run, series)| {
                (
                    run.name.clone(),
                    series
                        .iter()
                        .map(|(t, u)| (*t as f64 / 3600.0, *u))
                        .collect(),
                )
            })
            .collect();
        std::fs::write(
            out.join("replay.svg"),
            crate::plot::svg_lines(&curves, "hours since trace start", "allocated GPU (%)"),
        )?;
        Ok(())
    }
}

fn duration(seconds: f64) -> String {
    if seconds >= 86_400.0 {
        format!("{:.1}d", seconds / 86_400.0)
    } else if seconds >= 3600.0 {
        format!("{:.1}h", seconds / 3600.0)
    } else if seconds >= 60.0 {
        format!("{:.1}m", seconds / 60.0)
    } else {
        format!("{seconds:.0}s")
    }
}

/// FNV-1a, 64 bit: a stable hash for deterministic tenants and regions.
pub fn fnv1a(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

pub const TENANTS: [(&str, f64); 4] = [
    ("tenant-a", 2.0),
    ("tenant-b", 1.0),
    ("tenant-c", 1.0),
    ("tenant-d", 1.0),
];

pub fn tenant_of(name: &str) -> usize {
    (fnv1a(name) % TENANTS.len() as u64) as usize
}

pub fn class_of(qos: &str) -> PriorityClass {
    match qos {
        "LS" | "Guaranteed" => PriorityClass::Production,
        "BE" => PriorityClass::BestEffort,
        _ => PriorityClass::Batch,
    }
}

/// Jobs from the trace (see the module documentation); returns them by arrival and the
/// number of pods left out.
pub fn jobs_from_trace(trace: &Trace, time_compression: f64) -> (Vec<ReplayJob>, usize) {
    let compression = if time_compression.is_finite() && time_compression >= 1.0 {
        time_compression
    } else {
        1.0
    };
    let mut excluded = 0;
    let mut jobs = Vec::new();
    for (pod, meta) in trace.pods.iter().zip(&trace.meta) {
        if meta.phase == "Pending" {
            excluded += 1;
            continue;
        }
        jobs.push(ReplayJob {
            name: meta.name.clone(),
            arrival: (meta.creation as f64 / compression).round() as u64,
            runtime: meta.deletion.saturating_sub(meta.scheduled).max(1),
            class: class_of(&meta.qos),
            pod: pod.clone(),
        });
    }
    jobs.sort_by(|a, b| a.arrival.cmp(&b.arrival).then_with(|| a.name.cmp(&b.name)));
    (jobs, excluded)
}

/// A zone's 2023 carbon intensity and prices on the replay's hour grid.
pub fn load_zone(data: &Path, zone: &str) -> Result<ZoneSeries> {
    Ok(ZoneSeries {
        zone: zone.to_string(),
        carbon: load_carbon(data, zone)?.on_grid(GRID_START, HOURS)?,
        price: load_prices(data, zone)?.on_grid(GRID_START, HOURS)?,
    })
}

/// Replays openb from `data` under every configuration of `options`.
pub fn run_replay(
    data: &Path,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ReplayReport> {
    let trace = load_openb(data)?;
    let zones = options
        .zones
        .iter()
        .map(|z| load_zone(data, z))
        .collect::<Result<Vec<_>>>()?;
    let (mut jobs, excluded) = jobs_from_trace(&trace, options.time_compression);
    if let Some(limit) = options.limit_jobs {
        jobs.truncate(limit);
    }
    let stride = options.node_stride.max(1);
    let nodes: Vec<_> = trace.nodes.iter().step_by(stride).cloned().collect();
    let typical = TypicalPods::from_pods(&trace.pods, 0.95).with_supply(&trace.nodes);
    let mut report = replay_jobs(&jobs, nodes, &zones, &typical, options, progress)?;
    report.pods_in_trace = trace.pods.len();
    report.excluded_never_ran = excluded;
    Ok(report)
}

/// Replays `jobs` on `nodes` (the engine behind [`run_replay`], usable on synthetic
/// input).
pub fn replay_jobs(
    jobs: &[ReplayJob],
    nodes: Vec<nephele_placement::NodeSpec>,
    zones: &[ZoneSeries],
    typical: &TypicalPods,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ReplayReport> {
    if nodes.is_empty() {
        bail!("no nodes to replay on");
    }
    if zones.is_empty() {
        bail!("at least one zone is needed");
    }
    let region: Vec<usize> = nodes
        .iter()
        .map(|n| (fnv1a(&n.name) % zones.len() as u64) as usize)
        .collect();
    let regions = zones
        .iter()
        .enumerate()
        .map(|(r, z)| RegionInfo {
            zone: z.zone.clone(),
            nodes: region.iter().filter(|x| **x == r).count(),
            gpus: nodes
                .iter()
                .zip(&region)
                .filter(|(_, x)| **x == r)
                .map(|(n, _)| u64::from(n.gpus))
                .sum(),
            mean_carbon_g_per_kwh: z.carbon.iter().sum::<f64>() / z.carbon.len().max(1) as f64,
            mean_price_usd_per_mwh: z.price.iter().sum::<f64>() / z.price.len().max(1) as f64,
        })
        .collect();
    let gpus: u64 = nodes.iter().map(|n| u64::from(n.gpus) * 1000).sum();
    let mut report = ReplayReport {
        pods_in_trace: jobs.len(),
        excluded_never_ran: 0,
        jobs: jobs.len(),
        nodes: nodes.len(),
        gpus,
        time_compression: options.time_compression,
        node_stride: options.node_stride,
        regions,
        runs: Vec::new(),
        utilisation: Vec::new(),
        sample_seconds: options.sample_seconds.max(1),
    };
    for config in &options.configs {
        progress(&format!("replaying {} jobs: {}", jobs.len(), config.name));
        let started = Instant::now();
        let (mut summary, series) =
            replay_one(jobs, &nodes, &region, zones, typical, config, options)?;
        summary.wall_seconds = started.elapsed().as_secs_f64();
        progress(&format!("  done in {:.1}s", summary.wall_seconds));
        report.runs.push(summary);
        report.utilisation.push(series);
    }
    Ok(report)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Completion of a job's current run (stale when the epoch moved on).
    Finish {
        job: u64,
        epoch: u32,
    },
    Arrive {
        job: u64,
    },
    /// A grace period ends: tick so the victim's resources are taken back.
    Wake,
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

#[derive(Debug, Clone, Default)]
struct JobTrack {
    remaining: u64,
    epoch: u32,
    start: u64,
    /// When it last became pending.
    pending_since: u64,
    waited: u64,
    signalled: Option<u64>,
    finished: Option<u64>,
}

fn replay_one(
    jobs: &[ReplayJob],
    nodes: &[nephele_placement::NodeSpec],
    region: &[usize],
    zones: &[ZoneSeries],
    typical: &TypicalPods,
    config: &ReplayConfig,
    options: &ReplayOptions,
) -> Result<(RunSummary, Vec<(u64, f64)>)> {
    let mut cluster = Cluster::new(nodes.to_vec());
    let capacity = [
        nodes.iter().map(|n| n.cpu_milli as f64).sum::<f64>(),
        nodes.iter().map(|n| n.memory_mib as f64).sum::<f64>(),
        nodes
            .iter()
            .map(|n| f64::from(n.gpus) * 1000.0)
            .sum::<f64>(),
    ];
    let tenants: Vec<Tenant> = TENANTS
        .iter()
        .map(|(name, weight)| Tenant {
            name: name.to_string(),
            weight: *weight,
            quota: Quota {
                gpu_milli: options
                    .tenant_gpu_quota
                    .map(|share| (share.max(0.0) * capacity[2]) as u64),
                ..Quota::default()
            },
        })
        .collect();
    let mut queue = Queue::new(config.queue.clone(), tenants, typical.clone());
    let mut heap: BinaryHeap<Reverse<(u64, Event)>> = BinaryHeap::new();
    for (id, job) in jobs.iter().enumerate() {
        heap.push(Reverse((job.arrival, Event::Arrive { job: id as u64 })));
    }
    let mut track: Vec<JobTrack> = jobs
        .iter()
        .map(|j| JobTrack {
            remaining: j.runtime,
            pending_since: j.arrival,
            ..JobTrack::default()
        })
        .collect();
    let zone_count = zones.len();
    // Step functions: (time, used GPU milli per region) and (time, Jain or none).
    let mut used_steps: Vec<(u64, Vec<u64>)> = vec![(0, vec![0; zone_count])];
    let mut jain_steps: Vec<(u64, Option<f64>)> = vec![(0, None)];
    let grace = config.queue.grace_seconds;
    while let Some(Reverse((now, _))) = heap.peek().copied() {
        // All events at `now`, then one tick.
        while let Some(Reverse((at, event))) = heap.peek().copied() {
            if at != now {
                break;
            }
            heap.pop();
            match event {
                Event::Arrive { job } => {
                    let spec = &jobs[job as usize];
                    let class = spec.class;
                    queue
                        .submit(Job {
                            id: job,
                            tenant: tenant_of(&spec.name),
                            priority: class.priority(),
                            submit: now,
                            members: vec![spec.pod.clone()],
                            topology: Topology::Any,
                            expected_runtime: Some(spec.runtime),
                            preemptible: class == PriorityClass::BestEffort,
                        })
                        .map_err(|e| anyhow::anyhow!("job {}: {e}", spec.name))?;
                }
                Event::Finish { job, epoch } => {
                    let t = &mut track[job as usize];
                    if t.epoch == epoch
                        && t.finished.is_none()
                        && queue.finish(&mut cluster, job, now)
                    {
                        t.finished = Some(now);
                    }
                }
                Event::Wake => {}
            }
        }
        let effects = queue.tick(&mut cluster, now);
        for effect in effects {
            match effect {
                Effect::Bind { job, .. } => {
                    let t = &mut track[job as usize];
                    t.waited += now.saturating_sub(t.pending_since);
                    t.start = now;
                    t.epoch += 1;
                    heap.push(Reverse((
                        now.saturating_add(t.remaining),
                        Event::Finish {
                            job,
                            epoch: t.epoch,
                        },
                    )));
                }
                Effect::Preempt { victim, .. } => {
                    track[victim as usize].signalled = Some(now);
                    heap.push(Reverse((now.saturating_add(grace), Event::Wake)));
                }
                Effect::Requeued { job } => {
                    let t = &mut track[job as usize];
                    // Progress up to the signal was checkpointed; the rest is redone.
                    let ran = t.signalled.unwrap_or(now).saturating_sub(t.start);
                    t.remaining = t.remaining.saturating_sub(ran).max(1);
                    t.epoch += 1;
                    t.pending_since = now;
                    t.signalled = None;
                }
                Effect::Pending { .. } => {}
            }
        }
        let mut used = vec![0u64; zone_count];
        for (_, (_, binding)) in cluster.reservations() {
            let milli: u64 = binding.gpus.iter().map(|(_, m)| u64::from(*m)).sum();
            if let Some(r) = region.get(binding.node) {
                used[*r] += milli;
            }
        }
        if used_steps.last().is_some_and(|(_, u)| *u != used) {
            used_steps.push((now, used));
        }
        let backlogged = queue.backlogged();
        let shares: Vec<f64> = queue
            .usage()
            .iter()
            .zip(queue.tenants())
            .zip(&backlogged)
            .filter(|(_, b)| **b)
            .map(|((u, t), _)| {
                nephele_placement::fairness::dominant_share(&capacity, &u.as_f64())
                    / t.weight.max(1e-9)
            })
            .collect();
        let jain = (shares.len() >= 2).then(|| jain_index(&shares));
        if jain_steps.last().is_some_and(|(_, j)| *j != jain) {
            jain_steps.push((now, jain));
        }
    }
    // Every job is finished or still pending (never fitted); nothing else is possible
    // once the event queue is empty.
    let counts = queue.counts();
    if counts.running + counts.terminating > 0 {
        bail!("replay ended with running jobs: {counts:?}");
    }
    let finished_jobs: Vec<usize> = (0..jobs.len())
        .filter(|j| track[*j].finished.is_some())
        .collect();
    let mut waits: Vec<f64> = finished_jobs
        .iter()
        .map(|j| track[*j].waited as f64)
        .collect();
    let mut jcts: Vec<f64> = finished_jobs
        .iter()
        .map(|j| {
            track[*j]
                .finished
                .unwrap_or(0)
                .saturating_sub(jobs[*j].arrival) as f64
        })
        .collect();
    let mut by_class: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for j in &finished_jobs {
        by_class
            .entry(jobs[*j].class.name().to_string())
            .or_default()
            .push(track[*j].waited as f64);
    }
    let queue_delay_avg_by_class_s = by_class.iter().map(|(c, w)| (c.clone(), mean(w))).collect();
    let makespan = track.iter().filter_map(|t| t.finished).max().unwrap_or(0);
    let first_arrival = jobs.iter().map(|j| j.arrival).min().unwrap_or(0);
    let last_arrival = jobs.iter().map(|j| j.arrival).max().unwrap_or(0);
    let total_gpu = capacity[2].max(1.0);
    let used_at = |steps: &[(u64, Vec<u64>)], t: u64| -> f64 {
        let idx = steps.partition_point(|(s, _)| *s <= t);
        steps
            .get(idx.saturating_sub(1))
            .map(|(_, u)| u.iter().sum::<u64>() as f64)
            .unwrap_or(0.0)
    };
    // Time-weighted utilisation over [first arrival, last arrival].
    let mut util_area = 0.0;
    let mut peak: f64 = 0.0;
    for (idx, (t, used)) in used_steps.iter().enumerate() {
        let next = used_steps.get(idx + 1).map_or(makespan, |(n, _)| *n);
        let (a, b) = ((*t).max(first_arrival), next.min(last_arrival));
        let total = used.iter().sum::<u64>() as f64;
        if b > a {
            util_area += total * (b - a) as f64;
        }
        peak = peak.max(total);
    }
    let window = last_arrival.saturating_sub(first_arrival);
    let util_mean = if window > 0 {
        util_area / window as f64 / total_gpu * 100.0
    } else {
        used_at(&used_steps, first_arrival) / total_gpu * 100.0
    };
    let (mut jain_area, mut jain_seconds) = (0.0, 0u64);
    for (idx, (t, jain)) in jain_steps.iter().enumerate() {
        let next = jain_steps.get(idx + 1).map_or(makespan, |(n, _)| *n);
        if let Some(j) = jain {
            let span = next.saturating_sub(*t);
            jain_area += j * span as f64;
            jain_seconds += span;
        }
    }
    let jain = if jain_seconds > 0 {
        jain_area / jain_seconds as f64
    } else {
        1.0
    };
    // Energy, cost and carbon, hour by hour.
    let idle_watts: Vec<f64> = (0..zone_count)
        .map(|r| {
            nodes
                .iter()
                .zip(region)
                .filter(|(_, x)| **x == r)
                .map(|(n, _)| options.node_idle_watts + f64::from(n.gpus) * options.gpu_idle_watts)
                .sum()
        })
        .collect();
    let per_milli = (options.gpu_busy_watts - options.gpu_idle_watts).max(0.0) / 1000.0;
    let (mut energy, mut active, mut cost, mut carbon) = (0.0, 0.0, 0.0, 0.0);
    for (idx, (t, used)) in used_steps.iter().enumerate() {
        let end = used_steps.get(idx + 1).map_or(makespan, |(n, _)| *n);
        let mut at = *t;
        while at < end {
            let hour_end = (at / 3600 + 1) * 3600;
            let until = hour_end.min(end);
            let hours = (until - at) as f64 / 3600.0;
            let hour = (at / 3600) as usize % HOURS;
            for (r, zone) in zones.iter().enumerate() {
                let busy_w = used[r] as f64 * per_milli;
                let kwh = (idle_watts[r] + busy_w) * hours / 1000.0;
                energy += kwh;
                active += busy_w * hours / 1000.0;
                carbon += kwh * zone.carbon.get(hour).copied().unwrap_or(0.0) / 1000.0;
                cost += kwh / 1000.0 * zone.price.get(hour).copied().unwrap_or(0.0);
            }
            at = until;
        }
    }
    let step = options.sample_seconds.max(1);
    let series: Vec<(u64, f64)> = (0..=makespan / step)
        .map(|i| {
            let t = i * step;
            (t, used_at(&used_steps, t) / total_gpu * 100.0)
        })
        .collect();
    let summary = RunSummary {
        name: config.name.clone(),
        policy: config.queue.policy.name().to_string(),
        jobs: jobs.len(),
        finished: finished_jobs.len(),
        never_started: counts.pending,
        queue_delay_avg_s: mean(&waits),
        queue_delay_p95_s: percentile(&mut waits, 95.0),
        jct_avg_s: mean(&jcts),
        jct_p95_s: percentile(&mut jcts, 95.0),
        queue_delay_avg_by_class_s,
        gpu_util_mean_pct: util_mean,
        gpu_util_peak_pct: peak / total_gpu * 100.0,
        jain,
        jain_seconds,
        preemptions: queue.preemptions(),
        makespan_s: makespan,
        energy_kwh: energy,
        active_energy_kwh: active,
        cost_usd: cost,
        carbon_kg: carbon,
        wall_seconds: 0.0,
    };
    debug_assert!(queue
        .jobs()
        .all(|(_, s)| matches!(s, JobState::Pending | JobState::Finished { .. })));
    Ok((summary, series))
}
