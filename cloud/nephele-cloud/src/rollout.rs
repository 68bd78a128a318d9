//! Staged rollouts of a deployment's new version, without IO: which devices run the new
//! version at each step, and whether the step's gate holds.
//!
//! An update that changes what devices run (another model version, variant, SLO, queue
//! bound, offload or hard-example threshold) does not reach every device at once. A
//! [`Rollout`] moves a canary share of the selected edge devices first, then larger
//! shares ([`RolloutSettings::steps`]). Each step waits until every device moved in it
//! reports the new version ready, then until the moved devices together served
//! `min_requests` and `min_step_s` passed, and then compares the new version's figures
//! (p99 latency, error rate, offload share) with the old one's: on the devices still
//! running the old version, or, when none is left with traffic, with what the old
//! version showed when the rollout began. A failing gate, or devices that do not run
//! the new version within `progress_deadline_s`, rolls back: exactly the moved devices
//! get the old version again. Accuracy is judged once, before the first device moves
//! ([`accuracy_verdict`]): devices have no labels, but two model versions pushed with
//! the same labelled validation rows were both measured on them. Devices keep serving the version they run until the
//! other is loaded (the agent swaps only once the new one is ready).
//!
//! Time is an argument (unix ms, so a rollout resumes where it was after a control
//! plane restart); the state is serde and lives in the deployment's record.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use nephele_api::{Figures, RolloutEvent, RolloutSettings, RolloutState, RuntimeSpec};

/// A model version's accuracy as measured at its push: percent, on the labelled
/// validation rows with this SHA-256.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredAccuracy {
    pub accuracy_pct: f64,
    pub rows_sha256: String,
    pub rows: String,
}

/// What the accuracy gate says of a new model version.
#[derive(Debug, Clone, PartialEq)]
pub enum AccuracyVerdict {
    Passed(String),
    Failed(String),
    /// Not comparable (no labels, or other rows); the rollout goes on, saying so.
    NotJudged(String),
}

/// Judges `new` against `old` (each `None` when its push had no labels).
pub fn accuracy_verdict(
    old: Option<&MeasuredAccuracy>,
    new: Option<&MeasuredAccuracy>,
    max_drop_points: f64,
) -> AccuracyVerdict {
    match (old, new) {
        (Some(old), Some(new)) if old.rows_sha256 == new.rows_sha256 => {
            let drop = old.accuracy_pct - new.accuracy_pct;
            let figures = format!(
                "accuracy {:.2}% on the new version against {:.2}% on the old, on the same {}",
                new.accuracy_pct, old.accuracy_pct, new.rows
            );
            if drop > max_drop_points {
                AccuracyVerdict::Failed(format!(
                    "{figures} (limit −{max_drop_points} points)"
                ))
            } else {
                AccuracyVerdict::Passed(figures)
            }
        }
        (Some(_), Some(_)) => AccuracyVerdict::NotJudged(
            "accuracy not judged: the two versions were pushed with different validation rows (push both with the same --validation file to gate on it)".into(),
        ),
        _ => AccuracyVerdict::NotJudged(
            "accuracy not judged: a version was pushed without labelled validation rows".into(),
        ),
    }
}

/// The figures of `devices` together (devices without requests count for nothing).
pub fn figures_of<'a>(devices: impl Iterator<Item = &'a DeviceFigures>) -> Figures {
    let mut figures = Figures::default();
    let mut p99s = Vec::new();
    for device in devices.filter(|d| d.requests > 0) {
        figures.devices += 1;
        figures.requests += device.requests;
        figures.failed += device.failed;
        figures.offloaded += device.offloaded;
        p99s.push(device.p99_ms);
    }
    p99s.sort_by(f64::total_cmp);
    figures.p99_ms = match p99s.len() {
        0 => 0.0,
        n if n % 2 == 1 => p99s[n / 2],
        n => (p99s[n / 2 - 1] + p99s[n / 2]) / 2.0,
    };
    figures
}

/// One selected device as the control plane sees it at a tick.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceFigures {
    pub online: bool,
    /// Ready, running bytes of the new version.
    pub on_new: bool,
    /// Ready, running bytes of the old version.
    pub on_old: bool,
    /// Why it is not ready, when the agent said (a failed load).
    pub failure: Option<String>,
    /// The agent could not load what it was sent (`failure` says why): the rollout is
    /// rolled back at once, not at the progress deadline, since the bytes were checked
    /// against their signed digest before the load.
    pub load_failed: bool,
    /// Since the agent loaded what it runs now.
    pub requests: u64,
    pub failed: u64,
    pub offloaded: u64,
    pub p99_ms: f64,
}

/// Events kept per rollout (the oldest are dropped first).
pub const MAX_EVENTS: usize = 64;

/// A deployment's rollout from one runtime spec to another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    /// Numbered per deployment from 1.
    pub number: u64,
    pub from: RuntimeSpec,
    pub to: RuntimeSpec,
    pub settings: RolloutSettings,
    pub state: RolloutState,
    /// Index into `settings.steps` of the step under way.
    pub step: usize,
    /// The devices told to run the new version (kept when rolled back or complete,
    /// for the record).
    pub moved: BTreeSet<String>,
    pub started_unix_ms: u64,
    pub step_started_unix_ms: u64,
    pub finished_unix_ms: Option<u64>,
    /// The old version's figures on the selected devices when the rollout began.
    pub baseline: Figures,
    /// What the last gate saw, or what it waits for.
    pub gate: String,
    pub events: Vec<RolloutEvent>,
}

/// What a tick changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// These devices now run the new version.
    Moved(Vec<String>),
    /// Every selected device runs the new version: it is the deployment's version now.
    Completed,
    /// The moved devices go back to the old version.
    RolledBack(Vec<String>),
    /// Only the gate's note changed (no device is affected).
    Noted,
}

impl Rollout {
    pub fn new(
        number: u64,
        from: RuntimeSpec,
        to: RuntimeSpec,
        settings: RolloutSettings,
        baseline: Figures,
        now_unix_ms: u64,
    ) -> Rollout {
        let mut rollout = Rollout {
            number,
            from,
            to,
            settings,
            state: RolloutState::Progressing,
            step: 0,
            moved: BTreeSet::new(),
            started_unix_ms: now_unix_ms,
            step_started_unix_ms: now_unix_ms,
            finished_unix_ms: None,
            baseline,
            gate: String::new(),
            events: Vec::new(),
        };
        rollout.event(now_unix_ms, "rollout started".into());
        rollout
    }

    fn event(&mut self, now_unix_ms: u64, message: String) {
        self.events.push(RolloutEvent {
            at_unix_ms: now_unix_ms,
            message,
        });
        if self.events.len() > MAX_EVENTS {
            let extra = self.events.len() - MAX_EVENTS;
            self.events.drain(..extra);
        }
    }

    /// Whether `device` is told to run the new version now.
    pub fn runs_new(&self, device: &str) -> bool {
        self.state.active() && self.moved.contains(device)
    }

    /// Devices wanted on the new version at the current step, of `selected`.
    pub fn wanted(&self, selected: usize) -> usize {
        let percent = self.settings.steps.get(self.step).copied().unwrap_or(100) as usize;
        (selected * percent).div_ceil(100).max(1).min(selected)
    }

    /// Stops a progressing rollout where it is.
    pub fn pause(&mut self, now_unix_ms: u64, by: &str) -> Result<(), String> {
        match self.state {
            RolloutState::Progressing => {
                self.state = RolloutState::Paused;
                self.event(now_unix_ms, format!("paused by {by}"));
                Ok(())
            }
            RolloutState::Paused => Ok(()),
            state => {
                Err(format!("the rollout is {state:?} already; nothing to pause").to_lowercase())
            }
        }
    }

    /// Resumes a paused rollout; the step's clock starts again.
    pub fn resume(&mut self, now_unix_ms: u64, by: &str) -> Result<(), String> {
        match self.state {
            RolloutState::Paused => {
                self.state = RolloutState::Progressing;
                self.step_started_unix_ms = now_unix_ms;
                self.event(now_unix_ms, format!("resumed by {by}"));
                Ok(())
            }
            RolloutState::Progressing => Ok(()),
            state => {
                Err(format!("the rollout is {state:?} already; nothing to resume").to_lowercase())
            }
        }
    }

    /// Sends the moved devices back to the old version; returns them.
    /// Records the accuracy gate's verdict, before any device moves; a failed one
    /// rolls back at once (nothing has moved).
    pub fn judge_accuracy(&mut self, now_unix_ms: u64, verdict: AccuracyVerdict) -> Option<Change> {
        match verdict {
            AccuracyVerdict::Passed(figures) => {
                self.event(now_unix_ms, format!("accuracy gate passed: {figures}"));
                None
            }
            AccuracyVerdict::NotJudged(why) => {
                self.event(now_unix_ms, why);
                None
            }
            AccuracyVerdict::Failed(figures) => self
                .roll_back(
                    now_unix_ms,
                    format!("accuracy gate failed before the first step: {figures}"),
                )
                .ok()
                .map(Change::RolledBack),
        }
    }

    pub fn roll_back(&mut self, now_unix_ms: u64, why: String) -> Result<Vec<String>, String> {
        if !self.state.active() {
            return Err(format!(
                "the rollout is {} already; to go back, update the deployment to the old version",
                self.state_name()
            ));
        }
        self.state = RolloutState::RolledBack;
        self.finished_unix_ms = Some(now_unix_ms);
        self.gate = why.clone();
        let devices: Vec<String> = self.moved.iter().cloned().collect();
        self.event(
            now_unix_ms,
            format!("rolled back on {} device(s): {why}", devices.len()),
        );
        Ok(devices)
    }

    pub fn state_name(&self) -> &'static str {
        match self.state {
            RolloutState::Progressing => "progressing",
            RolloutState::Paused => "paused",
            RolloutState::Complete => "complete",
            RolloutState::RolledBack => "rolled back",
        }
    }

    /// One tick: `selected` are the deployment's edge devices (by name), `figures`
    /// what each shows now.
    pub fn tick(
        &mut self,
        now_unix_ms: u64,
        selected: &[String],
        figures: &BTreeMap<String, DeviceFigures>,
    ) -> Option<Change> {
        if self.state != RolloutState::Progressing {
            return None;
        }
        if selected.is_empty() {
            self.state = RolloutState::Complete;
            self.finished_unix_ms = Some(now_unix_ms);
            self.gate = "no device is selected: the new version is the deployment's".into();
            self.event(now_unix_ms, self.gate.clone());
            return Some(Change::Completed);
        }
        let wanted = self.wanted(selected.len());
        let in_step: Vec<&String> = selected
            .iter()
            .filter(|d| self.moved.contains(*d))
            .collect();
        if in_step.len() < wanted {
            let moved = self.move_more(now_unix_ms, selected, figures, wanted - in_step.len());
            return Some(Change::Moved(moved));
        }
        let pending: Vec<&String> = in_step
            .iter()
            .copied()
            .filter(|d| !figures.get(*d).is_some_and(|f| f.online && f.on_new))
            .collect();
        let elapsed_ms = now_unix_ms.saturating_sub(self.step_started_unix_ms);
        let failed: Vec<String> = pending
            .iter()
            .filter_map(|d| {
                let f = figures.get(*d).filter(|f| f.load_failed)?;
                Some(format!(
                    "{d} ({})",
                    f.failure.as_deref().unwrap_or("failed to load")
                ))
            })
            .collect();
        if !failed.is_empty() {
            let why = format!(
                "{} of {} device(s) could not load the new version: {}",
                failed.len(),
                in_step.len(),
                failed.join(", ")
            );
            return self
                .roll_back(now_unix_ms, why)
                .ok()
                .map(Change::RolledBack);
        }
        if !pending.is_empty() {
            if elapsed_ms > self.settings.progress_deadline_s * 1000 {
                let detail: Vec<String> = pending
                    .iter()
                    .map(|d| match figures.get(*d) {
                        Some(f) if !f.online => format!("{d} (offline)"),
                        Some(DeviceFigures {
                            failure: Some(why), ..
                        }) => format!("{d} ({why})"),
                        _ => format!("{d} (not ready)"),
                    })
                    .collect();
                let why = format!(
                    "{} of {} device(s) did not run the new version within {} s: {}",
                    pending.len(),
                    in_step.len(),
                    self.settings.progress_deadline_s,
                    detail.join(", ")
                );
                return self
                    .roll_back(now_unix_ms, why)
                    .ok()
                    .map(Change::RolledBack);
            }
            return self.note(format!(
                "waiting for {} of {} device(s) to run the new version",
                pending.len(),
                in_step.len()
            ));
        }
        let new = figures_of(in_step.iter().filter_map(|d| figures.get(*d)));
        if new.requests < self.settings.min_requests || elapsed_ms < self.settings.min_step_s * 1000
        {
            return self.note(format!(
                "judging after {} request(s) and {} s on the new version: {} so far, {} s",
                self.settings.min_requests,
                self.settings.min_step_s,
                new.requests,
                elapsed_ms / 1000
            ));
        }
        let old = figures_of(
            selected
                .iter()
                .filter(|d| !self.moved.contains(*d))
                .filter_map(|d| figures.get(d))
                .filter(|f| f.online && f.on_old),
        );
        let (reference, against) = if old.requests >= self.settings.min_requests.max(1) {
            (old, "the devices still on the old version")
        } else {
            (self.baseline, "the old version when the rollout began")
        };
        match self.judge(&new, &reference) {
            Err(why) => {
                let why = format!(
                    "gate failed at step {}: {why} (against {against})",
                    self.step + 1
                );
                self.roll_back(now_unix_ms, why)
                    .ok()
                    .map(Change::RolledBack)
            }
            Ok(summary) => {
                let passed = format!(
                    "step {} of {} passed on {} device(s): {summary}",
                    self.step + 1,
                    self.settings.steps.len(),
                    in_step.len()
                );
                self.event(now_unix_ms, passed.clone());
                self.gate = passed;
                if self.step + 1 >= self.settings.steps.len() {
                    self.state = RolloutState::Complete;
                    self.finished_unix_ms = Some(now_unix_ms);
                    self.event(
                        now_unix_ms,
                        "complete: every selected device runs the new version".into(),
                    );
                    return Some(Change::Completed);
                }
                self.step += 1;
                self.step_started_unix_ms = now_unix_ms;
                let wanted = self.wanted(selected.len());
                let more = wanted.saturating_sub(in_step.len());
                if more == 0 {
                    return Some(Change::Noted);
                }
                Some(Change::Moved(self.move_more(
                    now_unix_ms,
                    selected,
                    figures,
                    more,
                )))
            }
        }
    }

    fn note(&mut self, gate: String) -> Option<Change> {
        (self.gate != gate).then(|| {
            self.gate = gate;
            Change::Noted
        })
    }

    /// Moves `count` more devices, online ones first, each group by name.
    fn move_more(
        &mut self,
        now_unix_ms: u64,
        selected: &[String],
        figures: &BTreeMap<String, DeviceFigures>,
        count: usize,
    ) -> Vec<String> {
        let mut candidates: Vec<&String> = selected
            .iter()
            .filter(|d| !self.moved.contains(*d))
            .collect();
        candidates.sort_by_key(|d| (!figures.get(*d).is_some_and(|f| f.online), d.as_str()));
        let chosen: Vec<String> = candidates.into_iter().take(count).cloned().collect();
        self.moved.extend(chosen.iter().cloned());
        self.step_started_unix_ms = now_unix_ms;
        self.gate = format!(
            "waiting for {} device(s) to run the new version",
            chosen.len()
        );
        self.event(
            now_unix_ms,
            format!(
                "step {} of {} ({}%): {} to the new version",
                self.step + 1,
                self.settings.steps.len(),
                self.settings.steps.get(self.step).copied().unwrap_or(100),
                chosen.join(", ")
            ),
        );
        chosen
    }

    /// The gate: Ok with a summary, or why it fails.
    fn judge(&self, new: &Figures, old: &Figures) -> Result<String, String> {
        let s = &self.settings;
        let summary = format!(
            "p99 {:.1} ms vs {:.1} ms, errors {:.2}% vs {:.2}%, offloaded {:.1}% vs {:.1}%",
            new.p99_ms,
            old.p99_ms,
            new.error_rate() * 100.0,
            old.error_rate() * 100.0,
            new.offload_share() * 100.0,
            old.offload_share() * 100.0
        );
        if old.devices > 0
            && new.p99_ms > old.p99_ms * s.max_p99_ratio
            && new.p99_ms - old.p99_ms > s.min_p99_increase_ms
        {
            return Err(format!(
                "p99 {:.1} ms on the new version against {:.1} ms on the old (limit ×{} and +{} ms)",
                new.p99_ms, old.p99_ms, s.max_p99_ratio, s.min_p99_increase_ms
            ));
        }
        let slo = f64::from(self.to.slo_ms);
        if new.p99_ms > slo && (old.devices == 0 || old.p99_ms <= slo) {
            return Err(format!(
                "p99 {:.1} ms on the new version is over its {} ms SLO",
                new.p99_ms, self.to.slo_ms
            ));
        }
        if new.error_rate() > old.error_rate() + s.max_error_rate_increase {
            return Err(format!(
                "error rate {:.2}% on the new version against {:.2}% (limit +{:.2} points)",
                new.error_rate() * 100.0,
                old.error_rate() * 100.0,
                s.max_error_rate_increase * 100.0
            ));
        }
        if new.offload_share() > old.offload_share() + s.max_offload_share_increase {
            return Err(format!(
                "{:.1}% offloaded on the new version against {:.1}% (limit +{:.1} points)",
                new.offload_share() * 100.0,
                old.offload_share() * 100.0,
                s.max_offload_share_increase * 100.0
            ));
        }
        Ok(summary)
    }
}

#[cfg(test)]
#[path = "rollout_tests.rs"]
mod tests;
