//! `nephele sim`'s engine: reads the public traces and replays them in virtual time
//! through exactly the placement core the region actors call (`nephele-placement`).
//! The command line (`nephele sim …`) only parses arguments and prints.
//!
//! - [`trace`]: loaders for `../shared/data` (the caller passes the path).
//! - [`carbon`]: carbon-aware temporal and spatial shifting on the 2023 grid series.
//! - [`inflation`]: the FGD paper's workload-inflation protocol on openb.
//! - [`replay`]: time replay of openb through the scheduling queue (queueing delay,
//!   JCT, utilisation, fairness, preemptions, cost and carbon per configuration).
//! - [`plot`]: SVG plots.
//! - [`bench`]: placement throughput (`cargo bench`, `nephele bench placement`).

pub mod bench;
pub mod carbon;
pub mod inflation;
pub mod offload;
pub mod plot;
pub mod replay;
pub mod trace;
