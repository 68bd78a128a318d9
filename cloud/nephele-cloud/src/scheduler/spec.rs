//! The job spec that `POST /v1/jobs` takes: the API's own type (`nephele_api::jobs`),
//! with the checks that belong to the request itself.

pub use nephele_api::jobs::{JobSpec, PrioritySpec, TopologySpec, MAX_COMMAND_BYTES};
