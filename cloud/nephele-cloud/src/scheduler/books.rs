//! The region's durable books: what the region actor stores after every change, and
//! how a restarted control plane takes it back.
//!
//! Records are plain serde values (the store writes them as JSON). The scheduler makes
//! them and takes them back; it does no IO. After a restart:
//!
//! | stored as                     | restored as                                        |
//! |-------------------------------|----------------------------------------------------|
//! | pending, deferred, in backoff | the same (pending ones join the queue again)        |
//! | running or terminating at B   | recovering: out of the queue, its members still in its agents' desired state; adopted at B once every node of B has its agent back (terminating: with what is left of its grace); after `recover_timeout_s` it runs again as a new attempt |
//! | succeeded or failed           | the same                                           |
//! | node slots                    | their phase, last agent and address, so each agent gets its own slot back |
//!
//! Job ids are the queue's and are not stored: keys are `<tenant>/<name>`.

use std::collections::BTreeMap;

use nephele_placement::grid::{Deferral, GridPoint};
use nephele_placement::queue::JobState;
use nephele_placement::{Binding, Job, JobId, Topology};
use serde::{Deserialize, Serialize};

use super::nodes::NodePhase;
use super::replicas::{Replica, ReplicaSpec};
use super::run::RunState;
use super::{
    DeferralView, Deferred, Hold, JobKind, JobMeta, RegionChoiceView, RegionScheduler, SchedEvent,
    TopologySpec,
};

/// A binding by node name (indices are not stable across config changes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredBinding {
    pub node: String,
    pub gpus: Vec<(u8, u32)>,
    pub mig: Option<u16>,
}

/// Where a job was when it was stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum StoredState {
    Pending,
    Deferred,
    Backoff {
        until: u64,
    },
    Running {
        start: u64,
        bindings: Vec<StoredBinding>,
    },
    Terminating {
        start: u64,
        deadline: u64,
        bindings: Vec<StoredBinding>,
    },
    /// Ended (its outcome is in `run`), or cancelled.
    Ended,
}

/// One job (or serving replica) of a region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub tenant: String,
    pub name: String,
    pub kind: JobKind,
    pub spec: super::JobSpec,
    pub priority: u32,
    pub preemptible: bool,
    pub submitted_unix: u64,
    pub started_unix: Option<u64>,
    pub requeues: u32,
    pub state: StoredState,
    pub run: RunState,
    /// A deferrable job's plan: latest start, whole hours, and what it shows.
    pub deferral: Option<(u64, usize, DeferralView)>,
    pub region_choice: Option<RegionChoiceView>,
    /// A replica's index in its deployment.
    pub replica_index: Option<u32>,
    /// Numbers the submission (see `JobMeta::uid`).
    #[serde(default)]
    pub uid: u64,
}

/// One node slot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node: String,
    pub phase: NodePhase,
    pub last_agent: Option<String>,
    pub address: String,
    pub note: Option<String>,
}

/// One deployment's replica set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaSetRecord {
    pub spec: ReplicaSpec,
    pub desired: u32,
    pub next_index: u32,
    pub cold_starts_ms: Vec<u64>,
}

/// What a region keeps besides its jobs and nodes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegionRecord {
    /// The grid signal: (unix hour, carbon, price).
    pub grid: Vec<(u64, Option<f64>, Option<f64>)>,
    pub replica_sets: BTreeMap<String, ReplicaSetRecord>,
    /// The autoscalers' state per deployment (kept by the region actor).
    #[serde(default)]
    pub autoscalers: BTreeMap<String, serde_json::Value>,
    /// The next submission's number.
    #[serde(default)]
    pub next_uid: u64,
    /// The provider forecast held.
    #[serde(default)]
    pub grid_forecast: Option<StoredForecast>,
}

/// A provider forecast in the books: issued (unix s), source, (unix hour, carbon) points.
pub type StoredForecast = (u64, String, Vec<(u64, f64)>);

impl RegionScheduler {
    fn stored(&self, bindings: &[Binding]) -> Vec<StoredBinding> {
        bindings
            .iter()
            .map(|b| StoredBinding {
                node: self.cluster.nodes[b.node].name.clone(),
                gpus: b.gpus.clone(),
                mig: b.mig,
            })
            .collect()
    }

    /// Every job and replica as it should be stored, keyed `<tenant>/<name>`.
    pub fn job_records(&self) -> BTreeMap<String, JobRecord> {
        self.jobs
            .iter()
            .map(|(id, meta)| self.job_record(*id, meta))
            .collect()
    }

    /// The records of jobs `ids` (those still present), keyed as [`Self::job_records`].
    pub fn job_records_of(&self, ids: &[JobId]) -> BTreeMap<String, JobRecord> {
        ids.iter()
            .filter_map(|id| self.jobs.get(id).map(|meta| self.job_record(*id, meta)))
            .collect()
    }

    fn job_record(&self, id: JobId, meta: &JobMeta) -> (String, JobRecord) {
        let id = &id;
        {
            let state = match (&meta.held, &meta.run.outcome, self.queue.state(*id)) {
                (Some((_, Hold::Deferred)), _, _) => StoredState::Deferred,
                (Some((_, Hold::Backoff { until })), _, _) => {
                    StoredState::Backoff { until: *until }
                }
                (
                    Some((
                        _,
                        Hold::Recovering {
                            bindings,
                            start,
                            terminating_until,
                            ..
                        },
                    )),
                    _,
                    _,
                ) => match terminating_until {
                    Some(deadline) => StoredState::Terminating {
                        start: *start,
                        deadline: *deadline,
                        bindings: bindings.clone(),
                    },
                    None => StoredState::Running {
                        start: *start,
                        bindings: bindings.clone(),
                    },
                },
                (None, Some(_), _) => StoredState::Ended,
                (None, None, Some(JobState::Running { start, bindings })) => StoredState::Running {
                    start: *start,
                    bindings: self.stored(bindings),
                },
                (
                    None,
                    None,
                    Some(JobState::Terminating {
                        start,
                        deadline,
                        bindings,
                    }),
                ) => StoredState::Terminating {
                    start: *start,
                    deadline: *deadline,
                    bindings: self.stored(bindings),
                },
                (None, None, Some(JobState::Pending)) => StoredState::Pending,
                (None, None, _) => StoredState::Ended,
            };
            let tenant = self.tenants[meta.tenant].clone();
            let replica_index = match &meta.kind {
                JobKind::Replica { deployment } => self
                    .replica_sets
                    .get(deployment)
                    .and_then(|s| s.replicas.get(id))
                    .map(|r| r.index),
                JobKind::Batch => None,
            };
            (
                format!("{tenant}/{}", meta.name),
                JobRecord {
                    tenant,
                    name: meta.name.clone(),
                    kind: meta.kind.clone(),
                    spec: meta.spec.clone(),
                    priority: meta.priority,
                    preemptible: meta.preemptible,
                    submitted_unix: meta.submitted_unix,
                    started_unix: meta.started_unix,
                    requeues: meta.requeues,
                    state,
                    run: meta.run.clone(),
                    deferral: meta
                        .deferral
                        .as_ref()
                        .map(|d| (d.plan.latest_start, d.plan.duration_hours, d.view.clone())),
                    region_choice: meta.region_choice.clone(),
                    replica_index,
                    uid: meta.uid,
                },
            )
        }
    }

    /// Every node slot as it should be stored, keyed by node name.
    pub fn node_records(&self) -> BTreeMap<String, NodeRecord> {
        self.slots
            .iter()
            .map(|slot| {
                (
                    slot.name.clone(),
                    NodeRecord {
                        node: slot.name.clone(),
                        phase: slot.phase,
                        last_agent: slot.agent.clone().or_else(|| slot.last_agent.clone()),
                        address: slot.address.clone(),
                        note: slot.note.clone(),
                    },
                )
            })
            .collect()
    }

    /// The grid signal and the replica sets (the actor adds its autoscalers' state).
    pub fn region_record(&self) -> RegionRecord {
        RegionRecord {
            grid: self
                .grid
                .points()
                .into_iter()
                .map(|p| (p.hour, p.carbon, p.price))
                .collect(),
            replica_sets: self
                .replica_sets
                .iter()
                .map(|(name, set)| {
                    (
                        name.clone(),
                        ReplicaSetRecord {
                            spec: set.spec.clone(),
                            desired: set.desired,
                            next_index: set.next_index,
                            cold_starts_ms: set.cold_starts_ms.iter().copied().collect(),
                        },
                    )
                })
                .collect(),
            autoscalers: BTreeMap::new(),
            next_uid: self.next_uid,
            grid_forecast: self.stored_forecast(),
        }
    }

    /// Takes back the books of a previous run (see the module table). Call once, on a
    /// fresh scheduler, before any agent joins. Returns what could not be restored, in
    /// words (a tenant or node no longer configured...).
    pub fn restore(
        &mut self,
        jobs: Vec<JobRecord>,
        nodes: Vec<NodeRecord>,
        region: Option<RegionRecord>,
        now: u64,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        for record in nodes {
            let Some(index) = self.slot_named(&record.node) else {
                problems.push(format!(
                    "node {} is no longer in the config; forgotten",
                    record.node
                ));
                continue;
            };
            let slot = &mut self.slots[index];
            slot.last_agent = record.last_agent;
            slot.address = record.address;
            slot.note = record.note;
            slot.phase = match record.phase {
                // Its agent has to connect again before anything is placed there.
                NodePhase::Up { since } => NodePhase::Up { since },
                other => other,
            };
            if matches!(
                slot.phase,
                NodePhase::Up { .. } | NodePhase::Draining { .. }
            ) {
                slot.away_since = Some(now);
            }
        }
        if let Some(region) = &region {
            self.next_uid = self.next_uid.max(region.next_uid);
            let points: Vec<GridPoint> = region
                .grid
                .iter()
                .map(|(hour, carbon, price)| GridPoint {
                    hour: *hour,
                    carbon: *carbon,
                    price: *price,
                })
                .collect();
            if !points.is_empty() {
                if let Err(error) = self.grid.ingest(&points, now) {
                    problems.push(format!("the stored grid signal was refused: {error}"));
                }
            }
            if let Some((issued, source, points)) = &region.grid_forecast {
                let points: Vec<nephele_placement::grid::ForecastPoint> = points
                    .iter()
                    .map(|(hour, carbon)| nephele_placement::grid::ForecastPoint {
                        hour: *hour,
                        carbon: *carbon,
                    })
                    .collect();
                if let Err(error) = self.grid.ingest_forecast(&points, *issued, source, now) {
                    problems.push(format!("the stored provider forecast was refused: {error}"));
                }
            }
            for (deployment, set) in &region.replica_sets {
                self.replica_sets.insert(
                    deployment.clone(),
                    super::replicas::ReplicaSet::restored(
                        set.spec.clone(),
                        set.desired,
                        set.next_index,
                        set.cold_starts_ms.iter().copied().collect(),
                    ),
                );
            }
        }
        let mut jobs = jobs;
        jobs.sort_by_key(|r| (r.submitted_unix, r.tenant.clone(), r.name.clone()));
        // Never hand out a number a stored job has.
        let highest = jobs.iter().map(|r| r.uid).max().unwrap_or(0);
        self.next_uid = self.next_uid.max(highest + 1);
        for record in jobs {
            if let Err(why) = self.restore_job(record, now) {
                problems.push(why);
            }
        }
        problems
    }

    fn restore_job(&mut self, record: JobRecord, now: u64) -> Result<(), String> {
        let key = format!("{}/{}", record.tenant, record.name);
        let tenant = self
            .tenants
            .iter()
            .position(|t| t == &record.tenant)
            .ok_or_else(|| {
                format!(
                    "job {key}: tenant {} is no longer configured",
                    record.tenant
                )
            })?;
        let pod = match &record.kind {
            JobKind::Batch => self
                .pod_of(&record.spec)
                .map_err(|e| format!("job {key}: {e}"))?,
            JobKind::Replica { deployment } => {
                let set = self
                    .replica_sets
                    .get(deployment)
                    .ok_or_else(|| format!("replica {key}: its deployment is gone"))?;
                Self::replica_pod(&set.spec, set.group())
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let job = Job {
            id,
            tenant,
            priority: record.priority,
            submit: record.submitted_unix,
            members: vec![pod; usize::from(record.spec.members.max(1))],
            topology: match record.spec.topology {
                TopologySpec::Any => Topology::Any,
                TopologySpec::SameNode => Topology::SameNode { hard: true },
                TopologySpec::PreferSameNode => Topology::SameNode { hard: false },
            },
            expected_runtime: record.spec.expected_runtime_s,
            preemptible: record.preemptible,
        };
        let recover_until = now + self.settings.recover_timeout_s;
        let held = match &record.state {
            StoredState::Pending => {
                self.queue
                    .submit(job)
                    .map_err(|e| format!("job {key}: {e}"))?;
                None
            }
            StoredState::Deferred => Some((job, Hold::Deferred)),
            StoredState::Backoff { until } => Some((job, Hold::Backoff { until: *until })),
            StoredState::Running { start, bindings } => Some((
                job,
                Hold::Recovering {
                    bindings: bindings.clone(),
                    start: *start,
                    terminating_until: None,
                    until: recover_until,
                },
            )),
            StoredState::Terminating {
                start,
                deadline,
                bindings,
            } => Some((
                job,
                Hold::Recovering {
                    bindings: bindings.clone(),
                    start: *start,
                    terminating_until: Some(*deadline),
                    until: recover_until,
                },
            )),
            StoredState::Ended => None,
        };
        if let JobKind::Replica { deployment } = &record.kind {
            if let Some(set) = self.replica_sets.get_mut(deployment) {
                set.replicas.insert(
                    id,
                    Replica {
                        index: record.replica_index.unwrap_or(0),
                        adopted: true,
                        ..Replica::default()
                    },
                );
            }
        }
        self.by_name.insert((tenant, record.name.clone()), id);
        self.jobs.insert(
            id,
            JobMeta {
                name: record.name,
                tenant,
                uid: record.uid,
                kind: record.kind,
                priority: record.priority,
                preemptible: record.preemptible,
                spec: record.spec,
                submitted_unix: record.submitted_unix,
                started_unix: record.started_unix,
                preempted_by: None,
                requeues: record.requeues,
                deferral: record
                    .deferral
                    .map(|(latest_start, duration_hours, view)| Deferred {
                        plan: Deferral {
                            latest_start,
                            duration_hours,
                        },
                        view,
                    }),
                region_choice: record.region_choice,
                held,
                run: record.run,
            },
        );
        self.index_job(id);
        Ok(())
    }

    /// Recovering jobs whose nodes all have their agents back are adopted where they
    /// run; one whose place is taken or gone waits in the queue for a new attempt.
    pub(super) fn adopt_recovering(&mut self, now: u64) -> Vec<SchedEvent> {
        let ready: Vec<(u64, Vec<Binding>)> = self
            .held_jobs()
            .filter_map(|(id, meta)| match &meta.held {
                Some((_, Hold::Recovering { bindings, .. })) => {
                    let resolved = self.resolve(bindings)?;
                    resolved
                        .iter()
                        .all(|b| self.slots[b.node].agent.is_some())
                        .then_some((id, resolved))
                }
                _ => None,
            })
            .collect();
        let mut events = Vec::new();
        for (id, bindings) in ready {
            let Some(meta) = self.jobs.get_mut(&id) else {
                continue;
            };
            let Some((
                job,
                Hold::Recovering {
                    start,
                    terminating_until,
                    ..
                },
            )) = meta.held.take()
            else {
                continue;
            };
            // The nodes may be drained (they take no new work): the queue adopts onto
            // them regardless, as the processes run there.
            let adopted = self.queue.adopt(&mut self.cluster, job, &bindings, start);
            let name = self.qualified(id);
            match adopted {
                Ok(true) => {
                    if let Some(deadline) = terminating_until {
                        let grace = deadline.saturating_sub(now);
                        self.queue.evict(id, now, grace);
                    }
                    if let Some(JobKind::Replica { deployment }) =
                        self.jobs.get(&id).map(|m| m.kind.clone())
                    {
                        self.replica_placed(&deployment, id, start);
                    }
                    events.push(SchedEvent::Node {
                        node: name,
                        what: "adopted where it ran before the restart".into(),
                    });
                }
                Ok(false) | Err(_) => {
                    if let Some(meta) = self.jobs.get_mut(&id) {
                        meta.run
                            .end_attempt("its place was taken during a restart", now);
                        meta.run.members.clear();
                        meta.run.port = None;
                    }
                    events.push(SchedEvent::Requeued { job: name });
                }
            }
        }
        events
    }
}
