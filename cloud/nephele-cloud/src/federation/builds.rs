//! Models between upload and store, in the federation core: an asynchronous push
//! registers a build here ([`FleetCore::begin_model`]), the build thread reports its
//! progress ([`FleetCore::model_progress`]) and ends in [`FleetCore::put_model`] (stored,
//! the build is forgotten) or [`FleetCore::model_failed`] (kept, with the reason, until
//! the name is pushed again). Only small messages reach the actor:
//! loading, measuring and writing the variant files all happen on the build thread.
//! Builds live in memory; the pushes behind them are kept on disk until they end
//! ([`crate::pending_pushes`]), so a control plane restarted mid-build builds them again.

use nephele_runtime::variants::BuildProgress;

use super::fleet_core::FleetCore;
use super::views::ModelView;
use super::ApiError;

/// One build in flight or failed.
#[derive(Debug, Clone)]
pub struct Build {
    pub sha256: String,
    /// The tenant pushing it.
    pub tenant: String,
    pub size: u64,
    pub started_unix: u64,
    pub format: String,
    pub input_specs: Vec<String>,
    pub progress: Option<BuildProgress>,
    /// Set when the build failed: why, and what to do.
    pub error: Option<String>,
}

impl Build {
    pub fn view(&self, name: &str) -> ModelView {
        let version = self
            .sha256
            .get(..crate::store::VERSION_DIGITS)
            .unwrap_or(&self.sha256)
            .to_string();
        ModelView {
            name: name.to_string(),
            tenant: self.tenant.clone(),
            reference: format!("{name}:{version}"),
            version,
            state: if self.error.is_some() {
                ModelState::Failed
            } else {
                ModelState::Building
            },
            progress: self.progress.as_ref().map(super::views::progress_view),
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

pub use nephele_api::ModelState;

/// What [`FleetCore::begin_model`] found.
pub enum Begin {
    /// A build was registered; its view (state `building`).
    Started(ModelView),
    /// The same file is already stored under that name: nothing to build.
    Existing(ModelView),
    /// The same file is being built under that name already (a retried push): its view.
    InFlight(ModelView),
}

/// A push to build: the file's name, hash, size and format, and the `--input` specs.
pub struct NewBuild {
    pub name: String,
    pub tenant: String,
    pub sha256: String,
    pub size: u64,
    pub format: String,
    pub input_specs: Vec<String>,
}

impl FleetCore {
    /// Registers a build of a pushed file, unless it is stored or building already.
    pub fn begin_model(&mut self, now_unix: u64, new: NewBuild) -> Result<Begin, ApiError> {
        self.begin();
        self.check_model_owner(&new.name, &new.tenant)?;
        if let Some(existing) = self
            .catalog
            .versions(&new.name)
            .into_iter()
            .find(|m| m.sha256 == new.sha256)
        {
            // Versions are content-addressed: the same file is the same version.
            return Ok(Begin::Existing(super::views::model_view(existing)));
        }
        if let Some(build) = self.builds.get(&new.name) {
            if build.error.is_none() && build.sha256 == new.sha256 {
                return Ok(Begin::InFlight(build.view(&new.name)));
            }
            if build.error.is_none() {
                let step = build
                    .progress
                    .as_ref()
                    .map(|p| format!(" (step {} of {})", p.done, p.total))
                    .unwrap_or_default();
                return Err(ApiError::Conflict(format!(
                    "model {} is being built from another file{step}; wait for it with `nephele model get {}`",
                    new.name, new.name
                )));
            }
        }
        let build = Build {
            sha256: new.sha256,
            tenant: new.tenant,
            size: new.size,
            started_unix: now_unix,
            format: new.format,
            input_specs: new.input_specs,
            progress: None,
            error: None,
        };
        let view = build.view(&new.name);
        self.builds.insert(new.name, build);
        Ok(Begin::Started(view))
    }

    /// How far the build of `name` from the file `sha256` is.
    pub fn model_progress(&mut self, name: &str, sha256: &str, progress: BuildProgress) {
        self.begin();
        if let Some(build) = self.builds.get_mut(name).filter(|b| b.sha256 == sha256) {
            build.progress = Some(progress);
        }
    }

    /// The build of `name` from the file `sha256` failed: kept with the reason.
    pub fn model_failed(&mut self, name: &str, sha256: &str, error: String) {
        self.begin();
        tracing::warn!(model = %name, %error, "model build failed");
        if let Some(build) = self.builds.get_mut(name).filter(|b| b.sha256 == sha256) {
            build.error = Some(error);
        }
    }

    /// A model version (`name:version`), or a model's build in flight or failed, or
    /// else its latest version (`name`).
    pub fn model_view(&self, reference: &str) -> Result<ModelView, ApiError> {
        let (name, version) = match reference.split_once(':') {
            Some((name, version)) => (name, Some(version)),
            None => (reference, None),
        };
        if let Some(build) = self.builds.get(name) {
            let view = build.view(name);
            if version.is_none_or(|v| v == view.version) {
                return Ok(view);
            }
        }
        if let Some(record) = self.catalog.resolve(reference) {
            return Ok(super::views::model_view(record));
        }
        let known: Vec<String> = self
            .catalog
            .versions(name)
            .iter()
            .map(|m| m.reference())
            .collect();
        Err(ApiError::NotFound(if known.is_empty() {
            format!("no model named {name}; `nephele model list` shows the models")
        } else {
            format!(
                "model {name} has no version {}; it has {}",
                version.unwrap_or_default(),
                known.join(", ")
            )
        }))
    }

    /// Every stored model version (by name, oldest version first), then the builds in
    /// flight or failed, each by name.
    pub fn model_views(&self) -> Vec<ModelView> {
        let mut records: Vec<&crate::store::ModelRecord> = self.catalog.models().collect();
        records.sort_by_key(|m| (m.name.clone(), m.sequence, m.created_unix, m.key()));
        let mut views: Vec<ModelView> = records.into_iter().map(super::views::model_view).collect();
        let mut builds: Vec<ModelView> = self
            .builds
            .iter()
            .map(|(name, build)| build.view(name))
            .collect();
        builds.sort_by(|a, b| a.name.cmp(&b.name));
        views.extend(builds);
        views
    }
}
