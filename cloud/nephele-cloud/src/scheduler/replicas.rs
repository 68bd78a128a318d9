//! Cloud replicas of deployments that may offload: pods the queue places on pool
//! nodes like any job, with the deployment's priority (above batch work, so they
//! preempt it; strictly higher priorities may preempt them), in the internal `serving`
//! tenant, and at most one replica of a
//! deployment per node (an agent serves a deployment once; anti-affinity). Only the
//! pool agents holding a replica load the model, and the region routes offloaded
//! requests only to ready replicas.
//!
//! | replica   | on                                              | next      |
//! |-----------|-------------------------------------------------|-----------|
//! | pending   | the queue places it                              | starting  |
//! | starting  | its agent reports the deployment ready           | ready (cold start measured) |
//! | starting  | its agent reports it failed                      | failed (kept out of routing) |
//! | ready     | its node is drained: a replacement is started    | retiring  |
//! | retiring  | the replacement is ready, or the drain's deadline | removed  |
//! | any       | scaled in                                        | removed (pending first, then starting, then ready on the emptiest node) |
//! | any       | its node is lost                                 | pending   |
//!
//! The autoscaler (in the region actor) sets how many replicas there should be;
//! retiring replicas do not count.

use std::collections::{BTreeMap, VecDeque};

use nephele_placement::queue::JobState;
use nephele_placement::{Job, JobId, MigProfile, PodRequest, Topology};
use serde::{Deserialize, Serialize};

use super::{
    run::RunState, JobKind, JobMeta, JobSpec, RegionScheduler, ReplicaSetView, ReplicaView,
    SchedError, SchedEvent,
};

/// What a deployment asks of its cloud replicas, from the deployment and its model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaSpec {
    pub deployment: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// A share of one GPU (1..=1000), unless `mig_profile` asks for a slice.
    pub gpu_milli: u32,
    pub mig_profile: Option<String>,
    pub priority: u32,
    pub min: u32,
    pub max: u32,
    /// May run on spot nodes (a spot interruption moves it first).
    pub spot_ok: bool,
}

/// Cold starts remembered per deployment.
const COLD_STARTS_KEPT: usize = 32;

pub(super) struct ReplicaSet {
    pub(super) spec: ReplicaSpec,
    /// The anti-affinity group of its replicas.
    group: u64,
    pub(super) replicas: BTreeMap<JobId, Replica>,
    pub(super) next_index: u32,
    /// Recent cold starts (placed → ready), ms, newest last.
    pub(super) cold_starts_ms: VecDeque<u64>,
    /// What the autoscaler asked for last.
    pub(super) desired: u32,
}

impl ReplicaSet {
    /// A set taken back from the books (its replicas are added as their jobs are).
    pub(super) fn restored(
        spec: ReplicaSpec,
        desired: u32,
        next_index: u32,
        cold_starts_ms: VecDeque<u64>,
    ) -> ReplicaSet {
        ReplicaSet {
            group: group_of(&spec.deployment),
            spec,
            replicas: BTreeMap::new(),
            next_index,
            cold_starts_ms,
            desired,
        }
    }

    pub(super) fn group(&self) -> u64 {
        self.group
    }
}

#[derive(Debug, Clone, Default)]
pub(super) struct Replica {
    /// Adopted after a restart: its first ready report is no cold start.
    pub(super) adopted: bool,
    pub(super) index: u32,
    pub(super) placed_unix: Option<u64>,
    pub(super) ready_unix: Option<u64>,
    pub(super) failed: Option<String>,
    /// Being replaced by this replica (its node is drained).
    pub(super) retiring_for: Option<JobId>,
}

/// FNV-1a of the deployment name: its replicas' anti-affinity group.
fn group_of(deployment: &str) -> u64 {
    deployment
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

impl RegionScheduler {
    /// Brings the replica sets in line with the deployments that may offload: new ones
    /// start at their minimum, changed ones keep their replicas (a changed shape applies
    /// to replicas placed from now on), gone ones lose every replica.
    pub fn sync_replica_sets(&mut self, specs: &[ReplicaSpec], now: u64) -> Vec<SchedEvent> {
        let wanted: BTreeMap<&str, &ReplicaSpec> =
            specs.iter().map(|s| (s.deployment.as_str(), s)).collect();
        let gone: Vec<String> = self
            .replica_sets
            .keys()
            .filter(|d| !wanted.contains_key(d.as_str()))
            .cloned()
            .collect();
        for deployment in gone {
            if let Some(set) = self.replica_sets.remove(&deployment) {
                for id in set.replicas.keys() {
                    self.forget(*id);
                }
            }
        }
        if self.slots.is_empty() {
            // No pools here: nothing could ever hold a replica.
            return self.tick(now);
        }
        for spec in specs {
            match self.replica_sets.get_mut(&spec.deployment) {
                Some(set) => {
                    set.spec = spec.clone();
                    set.desired = set.desired.clamp(spec.min, spec.max);
                }
                None => {
                    self.replica_sets.insert(
                        spec.deployment.clone(),
                        ReplicaSet {
                            spec: spec.clone(),
                            group: group_of(&spec.deployment),
                            replicas: BTreeMap::new(),
                            next_index: 0,
                            cold_starts_ms: VecDeque::new(),
                            desired: spec.min,
                        },
                    );
                }
            }
            let desired = self.replica_sets[&spec.deployment].desired;
            self.scale_to(&spec.deployment, desired, now);
        }
        self.tick(now)
    }

    /// The pod one replica of `spec` asks for.
    pub(super) fn replica_pod(spec: &ReplicaSpec, group: u64) -> PodRequest {
        let mut pod = PodRequest {
            cpu_milli: spec.cpu_milli,
            memory_mib: spec.memory_mib,
            num_gpu: 1,
            gpu_milli: spec.gpu_milli.clamp(1, 1000),
            spot_ok: spec.spot_ok,
            anti_affinity: Some(group),
            ..PodRequest::default()
        };
        if let Some(profile) = spec.mig_profile.as_deref().and_then(MigProfile::parse) {
            let mig = PodRequest::mig(spec.cpu_milli, spec.memory_mib, profile);
            pod.gpu_milli = mig.gpu_milli;
            pod.mig_profile = mig.mig_profile;
        }
        pod
    }

    /// Adds one replica job for `deployment` to the queue.
    fn add_replica(&mut self, deployment: &str, now: u64) -> Option<JobId> {
        let set = self.replica_sets.get_mut(deployment)?;
        let index = set.next_index;
        set.next_index += 1;
        let pod = Self::replica_pod(&set.spec, set.group);
        let priority = set.spec.priority;
        let id = self.next_id;
        self.next_id += 1;
        let name = format!("{deployment}-{index}");
        let job = Job {
            id,
            tenant: self.serving_tenant,
            priority,
            submit: now,
            members: vec![pod.clone()],
            topology: Topology::Any,
            expected_runtime: None,
            // Strictly higher priorities (a more important deployment's replicas,
            // production jobs) may take its place: lower priorities lose capacity first.
            preemptible: true,
        };
        if self.queue.submit(job).is_err() {
            return None;
        }
        let mut spec = JobSpec::named(&name);
        spec.cpu_milli = pod.cpu_milli;
        spec.memory_mib = pod.memory_mib;
        spec.gpus = 1;
        spec.gpu_milli = pod.mig_profile.is_none().then_some(pod.gpu_milli);
        spec.mig_profile = set_mig(&pod);
        spec.tenant = Some(super::SERVING_TENANT.into());
        spec.region = Some(self.region.clone());
        self.by_name.insert((self.serving_tenant, name.clone()), id);
        self.jobs.insert(
            id,
            JobMeta {
                name,
                tenant: self.serving_tenant,
                uid: {
                    self.next_uid += 1;
                    self.next_uid - 1
                },
                kind: JobKind::Replica {
                    deployment: deployment.to_string(),
                },
                priority,
                preemptible: true,
                spec,
                submitted_unix: now,
                started_unix: None,
                preempted_by: None,
                requeues: 0,
                deferral: None,
                region_choice: None,
                held: None,
                run: RunState::default(),
            },
        );
        self.index_job(id);
        self.replica_sets.get_mut(deployment)?.replicas.insert(
            id,
            Replica {
                index,
                ..Replica::default()
            },
        );
        Some(id)
    }

    /// Sets how many replicas `deployment` should have (clamped to its min and max):
    /// adds replicas to the queue, or removes the least useful ones (pending, then
    /// starting, then ready on the node with the least other work). Returns the count.
    pub fn scale(
        &mut self,
        deployment: &str,
        desired: u32,
        now: u64,
    ) -> Result<(u32, Vec<SchedEvent>), SchedError> {
        if !self.replica_sets.contains_key(deployment) {
            return Err(SchedError::NotFound(format!(
                "deployment {deployment} has no replicas in region {}",
                self.region
            )));
        }
        let count = self.scale_to(deployment, desired, now);
        Ok((count, self.tick(now)))
    }

    fn scale_to(&mut self, deployment: &str, desired: u32, now: u64) -> u32 {
        let Some(set) = self.replica_sets.get_mut(deployment) else {
            return 0;
        };
        let desired = desired.clamp(set.spec.min, set.spec.max);
        set.desired = desired;
        let active: Vec<JobId> = set
            .replicas
            .iter()
            .filter(|(_, r)| r.retiring_for.is_none())
            .map(|(id, _)| *id)
            .collect();
        let have = active.len() as u32;
        if have < desired {
            for _ in have..desired {
                self.add_replica(deployment, now);
            }
        } else if have > desired {
            let mut ranked: Vec<(u8, u32, std::cmp::Reverse<u32>, JobId)> = active
                .iter()
                .map(|id| {
                    let replica = &self.replica_sets[deployment].replicas[id];
                    let (stage, node_load) = match self.queue.state(*id) {
                        Some(JobState::Running { bindings, .. }) => {
                            let node = bindings.first().map(|b| b.node);
                            let load = self
                                .cluster
                                .reservations()
                                .filter(|(_, (_, b))| Some(b.node) == node)
                                .count() as u32;
                            (if replica.ready_unix.is_some() { 2 } else { 1 }, load)
                        }
                        _ => (0, 0),
                    };
                    (stage, node_load, std::cmp::Reverse(replica.index), *id)
                })
                .collect();
            ranked.sort();
            for (_, _, _, id) in ranked.into_iter().take((have - desired) as usize) {
                self.forget(id);
            }
        }
        desired
    }

    /// A replica was placed: it starts loading its model.
    pub(super) fn replica_placed(&mut self, deployment: &str, id: JobId, now: u64) {
        if let Some(replica) = self
            .replica_sets
            .get_mut(deployment)
            .and_then(|s| s.replicas.get_mut(&id))
        {
            replica.placed_unix = Some(now);
            replica.ready_unix = None;
            replica.failed = None;
        }
    }

    /// A replica lost its place (node lost): it is pending again.
    pub(super) fn replica_unplaced(&mut self, id: JobId) {
        let Some(JobKind::Replica { deployment }) = self.jobs.get(&id).map(|m| m.kind.clone())
        else {
            return;
        };
        if let Some(replica) = self
            .replica_sets
            .get_mut(&deployment)
            .and_then(|s| s.replicas.get_mut(&id))
        {
            replica.placed_unix = None;
            replica.ready_unix = None;
        }
    }

    /// Starts a replacement for replica `id` (its node is drained); `id` leaves once
    /// the replacement is ready, or when its node goes.
    pub(super) fn replace_replica(
        &mut self,
        deployment: &str,
        id: JobId,
        now: u64,
    ) -> Vec<SchedEvent> {
        let already = self
            .replica_sets
            .get(deployment)
            .and_then(|s| s.replicas.get(&id))
            .is_none_or(|r| r.retiring_for.is_some());
        if already {
            return Vec::new();
        }
        let Some(replacement) = self.add_replica(deployment, now) else {
            return Vec::new();
        };
        if let Some(replica) = self
            .replica_sets
            .get_mut(deployment)
            .and_then(|s| s.replicas.get_mut(&id))
        {
            replica.retiring_for = Some(replacement);
        }
        vec![SchedEvent::Replica {
            replica: self.qualified(id),
            what: format!(
                "retiring: {} starts in its place",
                self.qualified(replacement)
            ),
        }]
    }

    /// Retiring replicas whose replacement is ready leave.
    pub(super) fn replicas_tick(&mut self, _now: u64) -> Vec<SchedEvent> {
        let mut done = Vec::new();
        for set in self.replica_sets.values() {
            for (id, replica) in &set.replicas {
                if let Some(replacement) = replica.retiring_for {
                    let ready = set
                        .replicas
                        .get(&replacement)
                        .is_none_or(|r| r.ready_unix.is_some());
                    if ready {
                        done.push(*id);
                    }
                }
            }
        }
        let mut events = Vec::new();
        for id in done {
            events.push(SchedEvent::Replica {
                replica: self.qualified(id),
                what: "retired: its replacement is ready".into(),
            });
            self.forget(id);
        }
        events
    }

    /// What a pool agent reports of its deployments: a replica on its node whose
    /// deployment is ready there becomes ready (its cold start is measured); one that
    /// failed to load is kept out of routing.
    pub fn replica_reports(
        &mut self,
        agent: &str,
        deployments: &[nephele_proto::DeploymentTelemetry],
        now: u64,
    ) -> Vec<SchedEvent> {
        let Some(index) = self.slot_of_agent(agent) else {
            return Vec::new();
        };
        let mut events = Vec::new();
        let mut changes: Vec<(String, JobId, Result<(), String>)> = Vec::new();
        for (deployment, set) in &self.replica_sets {
            for id in set.replicas.keys() {
                let on_node = matches!(
                    self.queue.state(*id),
                    Some(JobState::Running { bindings, .. }) if bindings.first().is_some_and(|b| b.node == index)
                );
                if !on_node {
                    continue;
                }
                match deployments
                    .iter()
                    .find(|t| &t.deployment == deployment)
                    .map(|t| &t.phase)
                {
                    Some(nephele_proto::DeploymentPhase::Ready) => {
                        changes.push((deployment.clone(), *id, Ok(())))
                    }
                    Some(nephele_proto::DeploymentPhase::Failed(why)) => {
                        changes.push((deployment.clone(), *id, Err(why.clone())))
                    }
                    _ => {}
                }
            }
        }
        for (deployment, id, result) in changes {
            let name = self.qualified(id);
            let Some(set) = self.replica_sets.get_mut(&deployment) else {
                continue;
            };
            let Some(replica) = set.replicas.get_mut(&id) else {
                continue;
            };
            match result {
                Ok(()) if replica.ready_unix.is_none() => {
                    replica.ready_unix = Some(now);
                    replica.failed = None;
                    if replica.adopted {
                        replica.adopted = false;
                        events.push(SchedEvent::Replica {
                            replica: name,
                            what: "ready (adopted after a restart)".into(),
                        });
                        continue;
                    }
                    let cold_ms = now.saturating_sub(replica.placed_unix.unwrap_or(now)) * 1000;
                    set.cold_starts_ms.push_back(cold_ms);
                    if set.cold_starts_ms.len() > COLD_STARTS_KEPT {
                        set.cold_starts_ms.pop_front();
                    }
                    events.push(SchedEvent::Replica {
                        replica: name,
                        what: format!("ready after {} s", cold_ms / 1000),
                    });
                }
                Err(why) if replica.failed.as_deref() != Some(why.as_str()) => {
                    replica.failed = Some(why.clone());
                    events.push(SchedEvent::Replica {
                        replica: name,
                        what: format!("failed to load: {why}"),
                    });
                }
                _ => {}
            }
        }
        events
    }

    /// The agents of `deployment`'s ready replicas, for routing (retiring ones
    /// included until they leave).
    pub fn ready_agents(&self, deployment: &str) -> Vec<String> {
        let Some(set) = self.replica_sets.get(deployment) else {
            return Vec::new();
        };
        set.replicas
            .iter()
            .filter(|(_, r)| r.ready_unix.is_some() && r.failed.is_none())
            .filter_map(|(id, _)| match self.queue.state(*id) {
                Some(JobState::Running { bindings, .. }) => {
                    let node = bindings.first()?.node;
                    self.slots.get(node)?.agent.clone()
                }
                _ => None,
            })
            .collect()
    }

    /// Deployments with replicas here.
    pub fn replica_deployments(&self) -> Vec<String> {
        self.replica_sets.keys().cloned().collect()
    }

    pub fn replica_spec(&self, deployment: &str) -> Option<&ReplicaSpec> {
        self.replica_sets.get(deployment).map(|s| &s.spec)
    }

    /// Ready, starting (placed, loading) and pending replicas of `deployment`, retiring
    /// ones left out.
    pub fn replica_counts(&self, deployment: &str) -> (u32, u32, u32) {
        let Some(set) = self.replica_sets.get(deployment) else {
            return (0, 0, 0);
        };
        let mut counts = (0, 0, 0);
        for (id, replica) in &set.replicas {
            if replica.retiring_for.is_some() {
                continue;
            }
            match (self.queue.state(*id), replica.ready_unix) {
                (Some(JobState::Running { .. }), Some(_)) if replica.failed.is_none() => {
                    counts.0 += 1
                }
                (Some(JobState::Running { .. }), _) => counts.1 += 1,
                _ => counts.2 += 1,
            }
        }
        counts
    }

    /// The mean of the recent cold starts of `deployment`, ms.
    pub fn cold_start_ms(&self, deployment: &str) -> Option<f64> {
        let set = self.replica_sets.get(deployment)?;
        (!set.cold_starts_ms.is_empty()).then(|| {
            set.cold_starts_ms.iter().sum::<u64>() as f64 / set.cold_starts_ms.len() as f64
        })
    }

    pub fn replica_set_view(&self, deployment: &str) -> Option<ReplicaSetView> {
        let set = self.replica_sets.get(deployment)?;
        let (ready, starting, pending) = self.replica_counts(deployment);
        let replicas = set
            .replicas
            .iter()
            .map(|(id, r)| {
                let binding = match self.queue.state(*id) {
                    Some(JobState::Running { bindings, .. }) => bindings.first().cloned(),
                    _ => None,
                };
                let state = match (&binding, r.ready_unix, &r.failed, r.retiring_for) {
                    (_, _, _, Some(_)) => "retiring",
                    (_, _, Some(_), _) => "failed",
                    (None, _, _, _) => "pending",
                    (Some(_), None, _, _) => "starting",
                    (Some(_), Some(_), _, _) => "ready",
                };
                ReplicaView {
                    name: self
                        .jobs
                        .get(id)
                        .map(|m| m.name.clone())
                        .unwrap_or_default(),
                    state: state.into(),
                    node: binding
                        .as_ref()
                        .map(|b| self.cluster.nodes[b.node].name.clone()),
                    agent: binding
                        .as_ref()
                        .and_then(|b| self.slots.get(b.node)?.agent.clone()),
                    placed_unix: r.placed_unix,
                    cold_start_ms: r
                        .ready_unix
                        .zip(r.placed_unix)
                        .map(|(ready, placed)| ready.saturating_sub(placed) * 1000),
                    error: r.failed.clone(),
                    why_pending: (state == "pending").then(|| self.why(*id)),
                }
            })
            .collect();
        Some(ReplicaSetView {
            region: self.region.clone(),
            deployment: deployment.to_string(),
            priority: set.spec.priority,
            min: set.spec.min,
            max: set.spec.max,
            desired: set.desired,
            ready,
            starting,
            pending,
            replicas,
            cold_starts_ms: set.cold_starts_ms.iter().copied().collect(),
            autoscaler: None,
        })
    }
}

fn set_mig(pod: &PodRequest) -> Option<String> {
    pod.mig_profile.map(|p| p.to_string())
}
