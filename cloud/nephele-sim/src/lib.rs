//! `nephele sim`'s engine: reads the public traces and replays them in virtual time
//! through exactly the placement core the region actors call (`nephele-placement`).
//! The command line (`nephele sim …`) only parses arguments and prints.
//!
//! - [`trace`]: loaders for `../shared/data` (the caller passes the path).
//! - [`carbon`]: carbon-aware temporal and spatial shifting on the 2023 grid series.
//! - [`inflation`]: the FGD paper's workload-inflation protocol on openb;
//!   [`inflation_loo`] chooses ours' weights leaving each pod list out.
//! - [`replay`]: time replay of openb through the scheduling queue (queueing delay,
//!   JCT, utilisation, fairness, preemptions, cost and carbon per configuration).
//! - [`autoscale`]: one region's replicas of a deployment under a request trace, scaled
//!   by each policy of `nephele-autoscale` (static, HPA, KPA, ours) in virtual time;
//!   [`autoscale_trace`] loads the traces (Azure code, Alibaba GenAI LoRA),
//!   [`autoscale_llm`] is the continuous-batching LLM replica and
//!   [`autoscale_oracle`] the clairvoyant schedule (simulator only),
//!   [`autoscale_tune`] the grid that chose ours' parameters (tune parts only).
//! - [`pod_resample`]: pod lists resampled from a list's own pods (`default@multi30`).
//! - [`plot`]: SVG plots.
//! - [`bench`]: placement throughput (`cargo bench`, `nephele bench placement`).

pub mod autoscale;
pub mod autoscale_heldout;
pub mod autoscale_llm;
pub mod autoscale_oracle;
pub mod autoscale_trace;
pub mod autoscale_tune;
pub mod autoscale_variants;
pub mod bench;
pub mod carbon;
pub mod gpu_clustering;
pub mod inflation;
pub mod inflation_loo;
pub mod inflation_study;
pub mod offload;
pub mod plot;
pub mod pod_resample;
pub mod replay;
pub mod trace;
