//! The REST API's contract: the request and answer types of every `/v1` route, as the
//! control plane serves them (`nephele-cloud`, which also generates its OpenAPI
//! document from them with schemars) and as clients read them (the `nephele` CLI).
//!
//! Serialization is a boundary: these are the API's own types. The control plane's
//! records, its wire messages (`nephele-proto`) and the runtime's types convert into
//! them at the edge, so the API changes only when these do. Pure data with the
//! checks that belong to a request itself (a job's command, a rollout's settings); no
//! IO, no async, no server.
//!
//! | module | routes |
//! |---|---|
//! | [`fleet`] | join tokens, devices, a device's usage, regions |
//! | [`models`] | models and their variants |
//! | [`deployments`] | deployments, their status per device |
//! | [`rollouts`] | a deployment's rollouts, their settings and gates |
//! | [`jobs`] | jobs, node slots, replica sets |
//! | [`grid`] | a region's grid signal |
//! | [`access`] | API tokens, roles, tenants, the audit log |
//! | [`reports`] | chargeback and showback |
//! | [`watch`] | the events of `GET /v1/watch` |
//! | [`problem`] | every error (`application/problem+json`) |

pub mod access;
pub mod autoscaler;
pub mod deployments;
pub mod fleet;
pub mod grid;
pub mod jobs;
pub mod models;
pub mod problem;
pub mod reports;
pub mod rollouts;
pub mod watch;

pub use access::*;
pub use autoscaler::*;
pub use deployments::*;
pub use fleet::*;
pub use grid::*;
pub use jobs::*;
pub use models::*;
pub use problem::*;
pub use reports::*;
pub use rollouts::*;
pub use watch::*;
