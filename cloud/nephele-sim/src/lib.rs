//! `nephele sim`'s engine: reads the public traces and replays them in virtual time
//! through exactly the placement core the region actors call (`nephele-placement`).
//! The command line (`nephele sim …`) only parses arguments and prints.
//!
//! - [`trace`]: loaders for `../shared/data` (the caller passes the path).
//! - [`inflation`]: the FGD paper's workload-inflation protocol on openb.
//! - [`replay`]: time replay of openb through the scheduling queue (queueing delay,
//!   JCT, utilisation, fairness, preemptions, cost and carbon per configuration).
//! - [`plot`]: SVG plots.

// NodeSpec/PodRequest literals end in `..Default::default()` on purpose: the placement
// crate is adding fields to them concurrently, and this keeps the sim compiling.
#![allow(clippy::needless_update)]

pub mod inflation;
pub mod plot;
pub mod replay;
pub mod trace;
