//! The federation core's side of staged rollouts: a deployment update that changes
//! what devices run starts a [`Rollout`]; every tick feeds it what each selected
//! device reports (the bytes it runs, its requests, failures, offloads and p99) and
//! carries out what it decides: the moved devices' desired states, the deployment's
//! new version once complete, the old version again on exactly the moved devices when
//! a gate fails. All without IO, time as an argument.

use std::collections::BTreeMap;

use nephele_domain::{AgentRole, Selector};
use nephele_proto::DeploymentPhase;

use super::fleet::device_label;
use super::fleet_core::{Effect, FleetCore, Output};
use super::fleet_store::{Record, Write};
use super::rollout::{Change, DeviceFigures, Rollout, RuntimeSpec};
use super::views::{DeploymentSpec, DeploymentStatus, RolloutView};
use super::ApiError;
use crate::store::DeploymentRecord;

/// What an operator asks of a rollout under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutAction {
    Pause,
    Resume,
    Rollback,
}

impl RolloutAction {
    pub fn parse(action: &str) -> Option<RolloutAction> {
        match action {
            "pause" => Some(RolloutAction::Pause),
            "resume" => Some(RolloutAction::Resume),
            "rollback" | "undo" => Some(RolloutAction::Rollback),
            _ => None,
        }
    }
}

impl FleetCore {
    /// Replaces a deployment's spec. Its selector, replica and rollout settings take
    /// effect at once; a change of what devices run (model version, variant, SLO,
    /// queue bound, offload, hard-example threshold) starts a rollout.
    pub fn update_deployment(
        &mut self,
        now_unix_ms: u64,
        name: &str,
        spec: DeploymentSpec,
    ) -> Output<Result<DeploymentStatus, ApiError>> {
        self.begin();
        let result = self.update_checked(now_unix_ms, name, spec);
        let effects = match &result {
            Ok(_) => {
                let mut effects = self.broadcast();
                effects.push(self.sync_regions());
                effects
            }
            Err(_) => Vec::new(),
        };
        let reply = result.map(|record| self.status_of(&record));
        self.finish(reply, effects)
    }

    fn update_checked(
        &mut self,
        now_unix_ms: u64,
        name: &str,
        spec: DeploymentSpec,
    ) -> Result<DeploymentRecord, ApiError> {
        let Some(current) = self.catalog.deployment(name).cloned() else {
            return Err(ApiError::NotFound(format!(
                "no deployment named {name}; `nephele deploy` creates one"
            )));
        };
        if spec.name != name {
            return Err(ApiError::BadRequest(format!(
                "name: the body names deployment {:?} but the path {name:?}; a deployment cannot be renamed",
                spec.name
            )));
        }
        if let Some(rollout) = current.active_rollout() {
            return Err(ApiError::Conflict(format!(
                "deployment {name} has rollout {} {} at step {} of {}; wait for it, or `nephele rollout undo {name}` first",
                rollout.number,
                rollout.state_name(),
                rollout.step + 1,
                rollout.settings.steps.len()
            )));
        }
        let keep_settings = spec.rollout.is_none();
        let mut record = self
            .catalog
            .check(spec, current.created_unix, &current.tenant)?;
        self.check_replica_quota(&record)?;
        if keep_settings {
            record.rollout_settings = current.rollout_settings.clone();
        }
        let (from, to) = (current.runtime(), record.runtime());
        if from == to {
            record.rollout = current.rollout.clone();
            tracing::info!(deployment = %name, selector = %record.selector, "deployment updated (nothing devices run changed)");
            self.write(Write::Put(Record::Deployment(record.clone())));
            return Ok(record);
        }
        // Devices run the old spec until the rollout moves them.
        let mut base = record.with_runtime(&from);
        let selected = self.selected_edges(&base);
        let figures = self.device_figures(&base, &from, &to, &selected);
        let baseline = super::rollout::figures_of(
            selected
                .iter()
                .filter_map(|d| figures.get(d))
                .filter(|f| f.on_old),
        );
        let number = current.rollout.as_ref().map_or(1, |r| r.number + 1);
        let settings = record.rollout_settings.clone().unwrap_or_default();
        let max_drop = settings.max_accuracy_drop_points;
        let mut rollout = Rollout::new(number, from, to, settings, baseline, now_unix_ms);
        tracing::info!(deployment = %name, rollout = number, from = %rollout.from.model, to = %rollout.to.model, devices = selected.len(), "rollout started");
        if rollout.from.model != rollout.to.model {
            let verdict = super::rollout::accuracy_verdict(
                self.measured_accuracy(&rollout.from.model).as_ref(),
                self.measured_accuracy(&rollout.to.model).as_ref(),
                max_drop,
            );
            if let Some(Change::RolledBack(_)) = rollout.judge_accuracy(now_unix_ms, verdict) {
                tracing::info!(deployment = %name, rollout = number, gate = %rollout.gate, "rollout rolled back before the first step");
                base.rollout = Some(Box::new(rollout));
                self.write(Write::Put(Record::Deployment(base.clone())));
                return Ok(base);
            }
        }
        let change = rollout.tick(now_unix_ms, &selected, &figures);
        base.rollout = Some(Box::new(rollout));
        if change == Some(Change::Completed) {
            // No device selected: the new version is the deployment's at once.
            base = complete(&base);
        }
        self.write(Write::Put(Record::Deployment(base.clone())));
        Ok(base)
    }

    /// A model version's accuracy as measured at its push, when it had labelled rows.
    fn measured_accuracy(&self, key: &str) -> Option<super::rollout::MeasuredAccuracy> {
        let model = self.catalog.model(key)?;
        let accuracy_pct = model
            .variants
            .iter()
            .find(|v| v.name == "full")?
            .accuracy_pct?;
        Some(super::rollout::MeasuredAccuracy {
            accuracy_pct,
            rows_sha256: model.validation_sha256.clone()?,
            rows: model.validation.clone(),
        })
    }

    /// Pauses, resumes or rolls back a deployment's rollout under way.
    pub fn rollout_action(
        &mut self,
        now_unix_ms: u64,
        name: &str,
        action: RolloutAction,
        by: &str,
    ) -> Output<Result<DeploymentStatus, ApiError>> {
        self.begin();
        let mut record = match self.catalog.deployment(name) {
            Some(record) => record.clone(),
            None => {
                let error = ApiError::NotFound(format!("no deployment named {name}"));
                return self.finish(Err(error), Vec::new());
            }
        };
        let Some(rollout) = record.rollout.as_mut() else {
            let error = ApiError::Conflict(format!(
                "deployment {name} has never been rolled out; `nephele deployment update {name}` starts a rollout"
            ));
            return self.finish(Err(error), Vec::new());
        };
        let result = match action {
            RolloutAction::Pause => rollout.pause(now_unix_ms, by).map(|()| Vec::new()),
            RolloutAction::Resume => rollout.resume(now_unix_ms, by).map(|()| Vec::new()),
            RolloutAction::Rollback => {
                rollout.roll_back(now_unix_ms, format!("rolled back by {by}"))
            }
        };
        let devices = match result {
            Ok(devices) => devices,
            Err(error) => return self.finish(Err(ApiError::Conflict(error)), Vec::new()),
        };
        tracing::info!(deployment = %name, ?action, %by, devices = devices.len(), "rollout action");
        self.write(Write::Put(Record::Deployment(record.clone())));
        let effects = self.send_to(&devices);
        let status = self.status_of(&record);
        self.finish(Ok(status), effects)
    }

    /// Advances every rollout under way by what its devices report now; replies with
    /// the rollouts that ended (deployment, `complete` or `rolled_back`).
    pub fn tick_rollouts(&mut self, now_unix_ms: u64) -> Output<Vec<(String, &'static str)>> {
        self.begin();
        let names: Vec<String> = self
            .catalog
            .deployments()
            .filter(|d| d.active_rollout().is_some())
            .map(|d| d.name.clone())
            .collect();
        let mut effects = Vec::new();
        let mut everyone = false;
        let mut ended = Vec::new();
        for name in names {
            let Some(mut record) = self.catalog.deployment(&name).cloned() else {
                continue;
            };
            let Some(mut rollout) = record.rollout.take() else {
                continue;
            };
            let selected = self.selected_edges(&record);
            let figures = self.device_figures(&record, &rollout.from, &rollout.to, &selected);
            let change = rollout.tick(now_unix_ms, &selected, &figures);
            let gate = rollout.gate.clone();
            record.rollout = Some(rollout);
            match change {
                None => continue,
                Some(Change::Noted) => {}
                Some(Change::Moved(devices)) => {
                    tracing::info!(deployment = %name, devices = ?devices, %gate, "rollout moved devices to the new version");
                    self.write(Write::Put(Record::Deployment(record)));
                    effects.extend(self.send_to(&devices));
                    continue;
                }
                Some(Change::RolledBack(devices)) => {
                    tracing::warn!(deployment = %name, devices = ?devices, why = %gate, "rollout rolled back");
                    ended.push((name.clone(), "rolled_back"));
                    self.write(Write::Put(Record::Deployment(record)));
                    effects.extend(self.send_to(&devices));
                    continue;
                }
                Some(Change::Completed) => {
                    tracing::info!(deployment = %name, %gate, "rollout complete");
                    ended.push((name.clone(), "complete"));
                    record = complete(&record);
                    everyone = true;
                }
            }
            self.write(Write::Put(Record::Deployment(record)));
        }
        if everyone {
            // After the sends of the rollouts that moved or rolled back in this tick,
            // not instead of them: a device sent its state above counts as up to date,
            // so the broadcast would not send it again (a rollback in the same tick as
            // another deployment's completion was never sent).
            effects.extend(self.broadcast());
            effects.push(self.sync_regions());
        }
        self.finish(ended, effects)
    }

    /// The edge devices a deployment record selects, by name.
    pub(super) fn selected_edges(&self, deployment: &DeploymentRecord) -> Vec<String> {
        let Ok(selector) = Selector::parse(&deployment.selector) else {
            return Vec::new();
        };
        self.records
            .devices
            .values()
            .filter(|d| {
                d.role == AgentRole::Edge && selector.matches_by(|key| device_label(d, key))
            })
            .map(|d| d.name.clone())
            .collect()
    }

    /// What each of `selected` reports of `deployment`: whether it runs the bytes of
    /// `to` or of `from`, and its figures since it loaded them.
    fn device_figures(
        &self,
        deployment: &DeploymentRecord,
        from: &RuntimeSpec,
        to: &RuntimeSpec,
        selected: &[String],
    ) -> BTreeMap<String, DeviceFigures> {
        let new_digests = self.catalog.variant_digests(&to.model);
        let old_digests = self.catalog.variant_digests(&from.model);
        selected
            .iter()
            .map(|name| {
                let online = self.sessions.contains_key(name);
                let row = self.telemetry.get(name).and_then(|t| {
                    t.heartbeat
                        .deployments
                        .iter()
                        .find(|d| d.deployment == deployment.name)
                });
                let mut figures = DeviceFigures {
                    online,
                    ..DeviceFigures::default()
                };
                if let Some(row) = row {
                    let ready = row.phase == DeploymentPhase::Ready;
                    figures.on_new = ready && new_digests.contains(&row.model_sha256);
                    figures.on_old =
                        ready && !figures.on_new && old_digests.contains(&row.model_sha256);
                    figures.requests = row.served_local + row.served_offloaded + row.failed;
                    figures.failed = row.failed;
                    figures.offloaded = row.served_offloaded;
                    figures.p99_ms = row.p99_us as f64 / 1000.0;
                    figures.load_failed = matches!(row.phase, DeploymentPhase::Failed(_));
                    figures.failure = match &row.phase {
                        DeploymentPhase::Failed(why) => Some(why.clone()),
                        _ if figures.on_old => Some("still runs the old version".into()),
                        _ => None,
                    };
                }
                (name.clone(), figures)
            })
            .collect()
    }

    /// Sends the connected ones of `devices` their desired state (a new generation) where
    /// it changed.
    fn send_to(&mut self, devices: &[String]) -> Vec<Effect> {
        if devices.is_empty() {
            return Vec::new();
        }
        self.bump_generation();
        devices
            .iter()
            .filter_map(|name| self.send_desired(name))
            .collect()
    }

    /// The API's view of a deployment's latest rollout.
    pub(super) fn rollout_view(&self, deployment: &DeploymentRecord) -> Option<RolloutView> {
        let rollout = deployment.rollout.as_ref()?;
        Some(RolloutView {
            number: rollout.number,
            state: rollout.state,
            from: rollout.from.clone(),
            to: rollout.to.clone(),
            step: rollout.step + 1,
            steps: rollout.settings.steps.clone(),
            selected_devices: self.selected_edges(deployment).len(),
            moved_devices: rollout.moved.iter().cloned().collect(),
            gate: rollout.gate.clone(),
            settings: rollout.settings.clone(),
            started_unix_ms: rollout.started_unix_ms,
            finished_unix_ms: rollout.finished_unix_ms,
            baseline: rollout.baseline,
            events: rollout.events.clone(),
        })
    }

    /// Whether `device` reports the bytes of the model `key` for `deployment`.
    pub(super) fn runs_model(&self, device: &str, deployment: &str, key: &str) -> bool {
        let digests = self.catalog.variant_digests(key);
        self.telemetry.get(device).is_some_and(|t| {
            t.heartbeat.deployments.iter().any(|d| {
                d.deployment == deployment
                    && d.phase == DeploymentPhase::Ready
                    && digests.contains(&d.model_sha256)
            })
        })
    }
}

/// The record once its rollout completed: the new version is its own.
fn complete(record: &DeploymentRecord) -> DeploymentRecord {
    match &record.rollout {
        Some(rollout) => record.with_runtime(&rollout.to),
        None => record.clone(),
    }
}
