//! Pure policies for serving inference on the edge: decisions an agent makes about a
//! model it runs, each one a deterministic function or a small sans-IO state machine.
//!
//! | module       | decides                                                        | state machine      |
//! |--------------|----------------------------------------------------------------|--------------------|
//! | [`variant`]  | which model variant (fp32, int8, ...) a device runs            | —                  |
//! | [`split`]    | where to cut a model between edge and cloud (Neurosurgeon)     | [`split::Replanner`] |
//! | [`batching`] | how many requests to batch and how long to wait for them       | [`batching::ArrivalEstimator`], [`batching::BatchQueue`] |
//! | [`offload`]  | local, offload or refuse, per request; hard examples to cloud  | [`offload::CircuitBreaker`] |
//! | [`lateness`] | how much later than predicted local answers come (a learned margin) | [`lateness::LocalLateness`] |
//! | [`remote`]   | how long an offload will take: an estimate that ages and is re-probed | [`remote::RemoteEstimator`] |
//!
//! What this crate deliberately does not do: no IO, no async, no threads, and no clock.
//! Time comes in as `now_us: u64` microseconds from whatever clock the caller uses (a
//! tokio `Instant` in the agent, a virtual clock in simulations), so every decision can
//! be replayed exactly in a test. It does not depend on `nephele-domain`: callers
//! convert firmware profiles into the plain numbers taken here. It never panics on
//! its inputs (NaN, zero, empty slices, huge values): each function documents the
//! typed error or the fallback it uses instead.

pub mod batching;
pub mod lateness;
pub mod offload;
pub mod remote;
pub mod split;
pub mod variant;
