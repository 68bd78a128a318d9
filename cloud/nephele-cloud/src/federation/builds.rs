//! Models between upload and store: an asynchronous push registers a build here
//! ([`BeginModel`]), the build thread reports its progress ([`ModelProgress`]) and ends in
//! [`super::PutModel`] (stored, the build is forgotten) or [`ModelFailed`] (kept, with
//! the reason, until the name is pushed again). Only small messages reach the actor:
//! loading, measuring and writing the variant files all happen on the build thread.
//! Builds live in memory; the pushes behind them are kept on disk until they end
//! ([`crate::pending_pushes`]), so a control plane restarted mid-build builds them again.

use actix::prelude::*;
use nephele_runtime::variants::BuildProgress;
use serde::Serialize;

use super::{FederationActor, ModelView};
use crate::federation::ApiError;
use crate::store::{ModelRecord, Table};

/// One build in flight or failed.
#[derive(Debug, Clone)]
pub struct Build {
    pub sha256: String,
    pub size: u64,
    pub started_unix: u64,
    pub format: String,
    pub input_specs: Vec<String>,
    pub progress: Option<BuildProgress>,
    /// Set when the build failed: why, and what to do.
    pub error: Option<String>,
}

impl Build {
    fn view(&self, name: &str) -> ModelView {
        ModelView {
            name: name.to_string(),
            version: 1,
            state: if self.error.is_some() {
                ModelState::Failed
            } else {
                ModelState::Building
            },
            progress: self.progress.clone(),
            error: self.error.clone(),
            sha256: self.sha256.clone(),
            size: self.size,
            created_unix: self.started_unix,
            inputs: Vec::new(),
            outputs: Vec::new(),
            validation: String::new(),
            variants: Vec::new(),
            format: self.format.clone(),
            input_specs: self.input_specs.clone(),
            recurrent_state: Vec::new(),
        }
    }
}

/// Where a model is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelState {
    Building,
    Ready,
    Failed,
}

/// What [`BeginModel`] found.
pub enum Begin {
    /// A build was registered; its view (state `building`).
    Started(ModelView),
    /// The same file is already stored under that name: nothing to build.
    Existing(ModelView),
    /// The same file is being built under that name already (a retried push): its view.
    InFlight(ModelView),
}

#[derive(Message)]
#[rtype(result = "Result<Begin, ApiError>")]
pub struct BeginModel {
    pub name: String,
    pub sha256: String,
    pub size: u64,
    pub format: String,
    pub input_specs: Vec<String>,
    pub now_unix: u64,
}

impl Handler<BeginModel> for FederationActor {
    type Result = Result<Begin, ApiError>;
    fn handle(&mut self, message: BeginModel, _: &mut Self::Context) -> Self::Result {
        if let Some(existing) = self
            .store
            .get::<ModelRecord>(Table::Models, &message.name)?
        {
            if existing.sha256 == message.sha256 {
                return Ok(Begin::Existing(ModelView::from(&existing)));
            }
            return Err(ApiError::Conflict(format!(
                "model {} already exists with different content; upload under a new name (e.g. {}-v2)",
                message.name, message.name
            )));
        }
        if let Some(build) = self.builds.get(&message.name) {
            if build.error.is_none() && build.sha256 == message.sha256 {
                return Ok(Begin::InFlight(build.view(&message.name)));
            }
            if build.error.is_none() {
                let step = build
                    .progress
                    .as_ref()
                    .map(|p| format!(" (step {} of {})", p.done, p.total))
                    .unwrap_or_default();
                return Err(ApiError::Conflict(format!(
                    "model {} is being built from another file{step}; wait for it with `nephele model get {}`",
                    message.name, message.name
                )));
            }
        }
        let build = Build {
            sha256: message.sha256,
            size: message.size,
            started_unix: message.now_unix,
            format: message.format,
            input_specs: message.input_specs,
            progress: None,
            error: None,
        };
        let view = build.view(&message.name);
        self.builds.insert(message.name, build);
        Ok(Begin::Started(view))
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct ModelProgress {
    pub name: String,
    pub sha256: String,
    pub progress: BuildProgress,
}

impl Handler<ModelProgress> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: ModelProgress, _: &mut Self::Context) {
        if let Some(build) = self
            .builds
            .get_mut(&message.name)
            .filter(|b| b.sha256 == message.sha256)
        {
            build.progress = Some(message.progress);
        }
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct ModelFailed {
    pub name: String,
    pub sha256: String,
    pub error: String,
}

impl Handler<ModelFailed> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: ModelFailed, _: &mut Self::Context) {
        tracing::warn!(model = %message.name, error = %message.error, "model build failed");
        if let Some(build) = self
            .builds
            .get_mut(&message.name)
            .filter(|b| b.sha256 == message.sha256)
        {
            build.error = Some(message.error);
        }
    }
}

/// `GET /v1/models/{name}`: a stored model, or one being built or failed.
#[derive(Message)]
#[rtype(result = "Result<ModelView, ApiError>")]
pub struct GetModel(pub String);

impl Handler<GetModel> for FederationActor {
    type Result = Result<ModelView, ApiError>;
    fn handle(&mut self, message: GetModel, _: &mut Self::Context) -> Self::Result {
        if let Some(record) = self.store.get::<ModelRecord>(Table::Models, &message.0)? {
            return Ok(ModelView::from(&record));
        }
        match self.builds.get(&message.0) {
            Some(build) => Ok(build.view(&message.0)),
            None => Err(ApiError::NotFound(format!(
                "no model named {}; `nephele model list` shows the models",
                message.0
            ))),
        }
    }
}

impl FederationActor {
    /// Views of the builds in flight or failed, for the model list.
    pub(super) fn build_views(&self) -> Vec<ModelView> {
        let mut views: Vec<ModelView> = self
            .builds
            .iter()
            .map(|(name, build)| build.view(name))
            .collect();
        views.sort_by(|a, b| a.name.cmp(&b.name));
        views
    }
}
