//! The placement core that region actors call and `nephele sim` replays traces through.
//!
//! Pipeline for one pod (see DESIGN.md): filter every node (a typed [`Reason`] for each
//! rejection, counted) → score the feasible ones with one normalised scorer → select the
//! best, ties broken by a fixed per-run node priority → choose GPUs on that node →
//! [`Cluster::reserve`] (idempotent). Everything is deterministic for a given input and
//! seed; time, randomness and IO come from the caller.
//!
//! [`queue`] orders pending jobs (priority classes, DRF across tenants, quotas),
//! preempts lower-priority work and keeps large gangs from starving (reservation with
//! EASY backfilling). [`carbon`] forecasts grid carbon intensity from past data and
//! decides when a deferrable job starts and which region takes it; [`grid`] is the
//! live form of that, a region's measured hourly series as a feed pushes it. This crate has no
//! dependencies at all.

pub mod carbon;
pub mod cluster;
pub mod cost;
pub mod fairness;
pub mod fragmentation;
pub mod gang;
pub mod grid;
pub mod model;
pub mod policy;
pub mod queue;
pub mod rng;
pub mod workload;

pub use cluster::{Binding, Cluster, ReserveError};
pub use fragmentation::TypicalPods;
pub use gang::{place_gang, GangRequest, Topology};
pub use model::{
    CapacityType, DomainLevel, GpuModel, Location, MigPartition, MigProfile, NodeSpec, PodRequest,
    Reason, Spread, Taint, TaintEffect, MILLI_PER_GPU,
};
pub use policy::{
    place, place_on, place_with, Objective, OursParams, Placement, Policy, Unschedulable, Weights,
};
pub use queue::{Effect, Job, JobId, JobState, PriorityClass, Queue, QueueConfig, Quota, Tenant};
