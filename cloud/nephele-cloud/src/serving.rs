//! One offloading deployment's serving state in a region: what the region actor keeps
//! between the requests it routes and the autoscaler ticks, without the actor or its
//! connections, so it is tested alone.
//!
//! Every rule comes from the serving core (`nephele_autoscale::serving`), composed as
//! `nephele sim autoscale` composes it: the ready replica with the least outstanding
//! requests ([`least_loaded`]), the gate asked with the wait predicted at that replica
//! ([`predicted_wait_ms`] over the measured service time), the window closed with a
//! [`Snapshot`] of the ready replicas. The property test below drives this state and a
//! replay of the simulator's composition with the same events and asserts the same
//! routes, verdicts, signals and decisions.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nephele_autoscale::admission::{predicted_wait_ms, ShedReason};
use nephele_autoscale::serving::{least_loaded, service_estimate_ms};
use nephele_autoscale::{Decision, Deployment, Ours, SignalWindow, Snapshot, Verdict};
use nephele_proto::{DeploymentPhase, DeploymentTelemetry};

/// Requests one pool replica declares it serves at once (an agent runs one batch of a
/// deployment at a time; the scaler learns the rest).
pub const REPLICA_CONCURRENCY: u32 = 1;

/// What the gateway measures of one deployment's offloaded requests, shared with the
/// leases it holds while a request is at a replica.
#[derive(Default)]
pub struct ServingStats {
    /// Arrivals and answers since the last autoscaler tick (the serving core's window).
    window: Mutex<SignalWindow>,
    /// The deployment's latency target (ms), which an answer is judged against.
    target_ms: AtomicU64,
}

impl ServingStats {
    fn window(&self) -> MutexGuard<'_, SignalWindow> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request's round trip through a replica, judged against the target.
    pub fn record(&self, elapsed: Duration) {
        let latency_ms = elapsed.as_micros() as f64 / 1000.0;
        let target_ms = self.target_ms.load(Ordering::Relaxed) as f64;
        self.window()
            .answer(latency_ms, latency_ms <= target_ms, true);
    }
}

/// Where one offered request goes.
#[derive(Debug)]
pub enum Choice {
    /// To this agent's replica; its outstanding count is already incremented (the
    /// holder decrements it when the request is done).
    Replica {
        agent: String,
        outstanding: Arc<AtomicU32>,
    },
    /// Refused by admission control.
    Shed {
        retry_after_ms: u64,
        reason: ShedReason,
    },
    /// No ready replica among the candidates.
    NoReplica,
}

/// One deployment's serving state in a region.
pub struct Serving {
    /// The scaler, the admission gate and the last decision: the serving core's state.
    pub core: Deployment<Ours>,
    stats: Arc<ServingStats>,
    /// Requests at each replica's agent now.
    outstanding: HashMap<String, Arc<AtomicU32>>,
    /// The latest telemetry of each replica's agent for this deployment (ordered, so
    /// the mean service time is the same sum whatever order reports came in).
    telemetry: BTreeMap<String, DeploymentTelemetry>,
}

impl Serving {
    pub fn new(policy: Ours, now_ms: u64) -> Serving {
        let stats = ServingStats::default();
        stats
            .target_ms
            .store(policy.config.target_p99_ms as u64, Ordering::Relaxed);
        Serving {
            core: Deployment::new(policy, now_ms),
            stats: Arc::new(stats),
            outstanding: HashMap::new(),
            telemetry: BTreeMap::new(),
        }
    }

    /// What the API shows of its autoscaler: the last decision and its signals.
    pub fn autoscaler_view(&self) -> nephele_api::AutoscalerView {
        let decision = self
            .core
            .decision
            .as_ref()
            .map(|d| nephele_api::AutoscaleDecisionView {
                desired: d.desired,
                warm: d.warm,
                mode: match d.mode {
                    nephele_autoscale::Mode::Stable => "stable",
                    nephele_autoscale::Mode::Panic => "panic",
                }
                .to_string(),
                admission: nephele_api::AdmissionView {
                    max_wait_ms: d.admission.max_wait_ms,
                    max_rate_per_s: d.admission.max_rate_per_s,
                    burst: d.admission.burst,
                    retry_after_ms: d.admission.retry_after_ms,
                },
                forecast_rate_per_s: d.forecast_rate_per_s,
                reason: d.reason.clone(),
            });
        let signals = self
            .core
            .signals
            .as_ref()
            .map(|s| nephele_api::AutoscaleSignalsView {
                window_ms: s.window_ms,
                arrivals: s.arrivals,
                in_flight: s.in_flight,
                queued: s.queued,
                p99_ms: s.p99_ms,
                utilisation: s.utilisation,
                ready: s.ready,
                starting: s.starting,
                service_ms: s.service_ms,
                concurrency: s.concurrency,
                cold_start_ms: s.cold_start_ms,
                priority: s.priority,
                answered: s.answered,
                within_target: s.within_target,
            });
        nephele_api::AutoscalerView {
            decision,
            signals,
            forecaster: self.core.policy.forecaster().kind_name(),
            capacity_per_replica_per_s: self.core.policy.capacity().current(),
            capacity_learned: self.core.policy.capacity().is_learned(),
        }
    }

    /// The counters a lease records its answer in.
    pub fn stats(&self) -> Arc<ServingStats> {
        self.stats.clone()
    }

    /// New bounds and latency target from the deployment's spec.
    pub fn configure(&mut self, min: u32, max: u32, target_p99_ms: u32) {
        let config = &mut self.core.policy.config;
        config.min_replicas = min;
        config.max_replicas = max.max(min).max(1);
        config.target_p99_ms = f64::from(target_p99_ms.max(1));
        self.stats
            .target_ms
            .store(u64::from(target_p99_ms.max(1)), Ordering::Relaxed);
    }

    /// An agent's latest report for this deployment.
    pub fn report(&mut self, agent: &str, telemetry: DeploymentTelemetry) {
        self.telemetry.insert(agent.to_string(), telemetry);
    }

    /// The agent left: its reports no longer count.
    pub fn forget(&mut self, agent: &str) {
        self.telemetry.remove(agent);
    }

    /// Mean measured compute time of one request at the ready replicas, ms (None
    /// when none reported one).
    pub fn measured_service_ms(&self) -> Option<f64> {
        let measured: Vec<f64> = self
            .telemetry
            .values()
            .filter(|t| t.service_us > 0 && t.phase == DeploymentPhase::Ready)
            .map(|t| t.service_us as f64 / 1000.0)
            .collect();
        (!measured.is_empty()).then(|| measured.iter().sum::<f64>() / measured.len() as f64)
    }

    /// The service time the core is given: the replicas' own compute time when they
    /// report it, else the mean round trip of the window's answers
    /// ([`service_estimate_ms`]).
    fn service_ms(&self, window: &SignalWindow) -> Option<f64> {
        self.measured_service_ms()
            .or_else(|| window.mean_latency_ms())
    }

    /// A request offered at `now_ms` to the `candidates` (ready, reachable agents):
    /// counted as an arrival, routed to the least loaded one, and admitted or shed by
    /// the gate with the wait predicted there.
    pub fn offer<'a>(
        &mut self,
        now_ms: u64,
        candidates: impl IntoIterator<Item = &'a String>,
    ) -> Choice {
        let service_ms = {
            let mut window = self.stats.window();
            window.arrival();
            service_estimate_ms(self.service_ms(&window))
        };
        let outstanding = &self.outstanding;
        let chosen = least_loaded(candidates.into_iter().map(|agent| {
            let load = outstanding
                .get(agent)
                .map_or(0, |n| n.load(Ordering::Relaxed));
            (load, agent)
        }));
        let Some(agent) = chosen.cloned() else {
            return Choice::NoReplica;
        };
        let outstanding = self
            .outstanding
            .entry(agent.clone())
            .or_insert_with(|| Arc::new(AtomicU32::new(0)))
            .clone();
        let ahead = outstanding.load(Ordering::Relaxed);
        let verdict = self.core.admit(now_ms, || {
            predicted_wait_ms(ahead, REPLICA_CONCURRENCY, service_ms, None)
        });
        match verdict {
            Verdict::Admit => {
                outstanding.fetch_add(1, Ordering::Relaxed);
                Choice::Replica { agent, outstanding }
            }
            Verdict::Shed {
                retry_after_ms,
                reason,
            } => Choice::Shed {
                retry_after_ms,
                reason,
            },
        }
    }

    /// One autoscaler tick at `now_ms`: the window closed with what the
    /// `ready_agents` carry now, the scaler ticked with it.
    pub fn tick(&mut self, now_ms: u64, ready_agents: &[String], fleet: Fleet) -> &Decision {
        let in_flight: u32 = self
            .outstanding
            .iter()
            .filter(|(agent, _)| ready_agents.contains(agent))
            .map(|(_, n)| n.load(Ordering::Relaxed))
            .sum();
        let queued: u32 = self
            .telemetry
            .iter()
            .filter(|(agent, _)| ready_agents.contains(agent))
            .map(|(_, t)| t.queue_len)
            .sum();
        let mut window = self.stats.window();
        let service_ms = self.service_ms(&window).unwrap_or(0.0);
        let snapshot = Snapshot {
            in_flight,
            queued,
            ready: fleet.ready,
            starting: fleet.starting,
            service_ms,
            concurrency: REPLICA_CONCURRENCY,
            cold_start_ms: fleet.cold_start_ms,
            priority: fleet.priority,
        };
        self.core.tick(now_ms, &mut window, snapshot)
    }
}

/// The deployment's replicas as the scheduler counts them at a tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fleet {
    pub ready: u32,
    pub starting: u32,
    pub cold_start_ms: Option<f64>,
    pub priority: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use nephele_autoscale::OursConfig;
    use proptest::prelude::*;

    /// What happens to a deployment between ticks, as both shells see it.
    #[derive(Debug, Clone)]
    enum Event {
        /// A request offered to the ready replicas in this mask (bit i: agent i).
        Offer { ready: u8, after_ms: u64 },
        /// The oldest request still at a replica is answered after this long.
        Answer { latency_ms: u32 },
        /// Agent `agent` reports its measured compute time and queue.
        Report {
            agent: usize,
            service_us: u64,
            queue: u32,
        },
        /// An autoscaler tick, with the replicas in the mask ready.
        Tick { ready: u8, starting: u32 },
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            4 => (any::<u8>(), 0u64..400).prop_map(|(ready, after_ms)| Event::Offer { ready, after_ms }),
            3 => (1u32..3_000).prop_map(|latency_ms| Event::Answer { latency_ms }),
            1 => (0usize..AGENTS, 0u64..900_000, 0u32..20)
                .prop_map(|(agent, service_us, queue)| Event::Report { agent, service_us, queue }),
            1 => (any::<u8>(), 0u32..3).prop_map(|(ready, starting)| Event::Tick { ready, starting }),
        ]
    }

    const AGENTS: usize = 5;

    fn agents(mask: u8) -> Vec<String> {
        (0..AGENTS)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| format!("pool-{i}"))
            .collect()
    }

    fn policy() -> Ours {
        let config = OursConfig {
            min_replicas: 1,
            max_replicas: 6,
            target_p99_ms: 800.0,
            ..OursConfig::default()
        };
        Ours::new(config).unwrap()
    }

    fn telemetry(service_us: u64, queue: u32) -> DeploymentTelemetry {
        DeploymentTelemetry {
            service_us,
            queue_len: queue,
            ..DeploymentTelemetry::idle("d", DeploymentPhase::Ready)
        }
    }

    /// The simulator's composition of the core (`nephele-sim`'s `autoscale.rs`):
    /// per-replica outstanding counts, the least loaded ready replica, the gate asked
    /// with `predicted_wait_ms` at its declared slots, the window closed with the
    /// ready replicas' work.
    struct SimReplay {
        core: Deployment<Ours>,
        window: SignalWindow,
        outstanding: Vec<u32>,
        service: Vec<Option<f64>>,
        queue: Vec<u32>,
    }

    impl SimReplay {
        fn service_ms(&self) -> Option<f64> {
            let measured: Vec<f64> = self.service.iter().flatten().copied().collect();
            if measured.is_empty() {
                self.window.mean_latency_ms()
            } else {
                Some(measured.iter().sum::<f64>() / measured.len() as f64)
            }
        }

        fn offer(&mut self, now_ms: u64, ready: &[usize]) -> Option<usize> {
            self.window.arrival();
            let service_ms = service_estimate_ms(self.service_ms());
            let index = least_loaded(
                ready
                    .iter()
                    .map(|&i| (self.outstanding[i], format!("pool-{i}"))),
            )?;
            let index: usize = index["pool-".len()..].parse().unwrap();
            let ahead = self.outstanding[index];
            let verdict = self.core.admit(now_ms, || {
                predicted_wait_ms(ahead, REPLICA_CONCURRENCY, service_ms, None)
            });
            matches!(verdict, Verdict::Admit).then(|| {
                self.outstanding[index] += 1;
                index
            })
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The region's serving state and the simulator's composition of the same core,
        /// given the same events, route every request to the same replica, admit and
        /// shed the same ones, and tick the scaler with the same signals into the same
        /// decisions.
        #[test]
        fn the_region_decides_as_the_simulator_does(events in proptest::collection::vec(event(), 1..300)) {
            let mut region = Serving::new(policy(), 0);
            let mut sim = SimReplay {
                core: Deployment::new(policy(), 0),
                window: SignalWindow::default(),
                outstanding: vec![0; AGENTS],
                service: vec![None; AGENTS],
                queue: vec![0; AGENTS],
            };
            let mut now_ms = 0u64;
            let mut leases: std::collections::VecDeque<(usize, Arc<AtomicU32>)> = Default::default();
            for event in events {
                match event {
                    Event::Offer { ready, after_ms } => {
                        now_ms += after_ms;
                        let names = agents(ready);
                        let indices: Vec<usize> = (0..AGENTS).filter(|i| ready & (1 << i) != 0).collect();
                        let ours = region.offer(now_ms, &names);
                        let theirs = sim.offer(now_ms, &indices);
                        match (&ours, theirs) {
                            (Choice::Replica { agent, outstanding }, Some(index)) => {
                                prop_assert_eq!(agent, &format!("pool-{index}"));
                                leases.push_back((index, outstanding.clone()));
                            }
                            (Choice::Shed { .. }, None) | (Choice::NoReplica, None) => {}
                            _ => prop_assert!(false, "region {ours:?}, simulator {theirs:?}"),
                        }
                    }
                    Event::Answer { latency_ms } => {
                        if let Some((index, outstanding)) = leases.pop_front() {
                            let latency = f64::from(latency_ms);
                            region.stats.record(Duration::from_millis(u64::from(latency_ms)));
                            outstanding.fetch_sub(1, Ordering::Relaxed);
                            sim.window.answer(latency, latency <= 800.0, true);
                            sim.outstanding[index] -= 1;
                        }
                    }
                    Event::Report { agent, service_us, queue } => {
                        region.report(&format!("pool-{agent}"), telemetry(service_us, queue));
                        sim.service[agent] = (service_us > 0).then(|| service_us as f64 / 1000.0);
                        sim.queue[agent] = queue;
                    }
                    Event::Tick { ready, starting } => {
                        now_ms += 1_000;
                        let names = agents(ready);
                        let indices: Vec<usize> = (0..AGENTS).filter(|i| ready & (1 << i) != 0).collect();
                        let fleet = Fleet { ready: names.len() as u32, starting, cold_start_ms: Some(5_000.0), priority: 0 };
                        let ours = region.tick(now_ms, &names, fleet).clone();
                        let snapshot = Snapshot {
                            in_flight: indices.iter().map(|&i| sim.outstanding[i]).sum(),
                            queued: indices.iter().map(|&i| sim.queue[i]).sum(),
                            ready: fleet.ready,
                            starting,
                            service_ms: sim.service_ms().unwrap_or(0.0),
                            concurrency: REPLICA_CONCURRENCY,
                            cold_start_ms: fleet.cold_start_ms,
                            priority: 0,
                        };
                        let theirs = sim.core.tick(now_ms, &mut sim.window, snapshot).clone();
                        prop_assert_eq!(&region.core.signals, &sim.core.signals);
                        prop_assert_eq!(ours, theirs);
                    }
                }
            }
        }
    }

    #[test]
    fn an_unmeasured_deployment_is_judged_on_the_default_service_time() {
        let mut serving = Serving::new(policy(), 0);
        let names = agents(0b1);
        assert!(matches!(
            serving.offer(0, &names),
            Choice::Replica { ref agent, .. } if agent == "pool-0"
        ));
        assert!(matches!(serving.offer(0, &[]), Choice::NoReplica));
        serving.report("pool-0", telemetry(250_000, 3));
        assert_eq!(serving.measured_service_ms(), Some(250.0));
        let decision = serving
            .tick(
                1_000,
                &names,
                Fleet {
                    ready: 1,
                    starting: 0,
                    cold_start_ms: None,
                    priority: 0,
                },
            )
            .clone();
        let signals = serving.core.signals.clone().unwrap();
        assert_eq!(
            (signals.arrivals, signals.in_flight, signals.queued),
            (2, 1, 3)
        );
        assert!(decision.desired >= 1);
    }
}
