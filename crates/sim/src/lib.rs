//! Know the machine (issue 5): what sift needs to predict and choose its own settings.
//!
//! - [`profile`]: a [`profile::DeviceProfile`] — memory bandwidth, the weight disk's bandwidth and
//!   latency by request size and queue depth, and the speed of sift's kernels — measured by
//!   `sift probe` or taken from the seed papers (`profiles/`), and the cost model built on it.
//! - [`probe`]: the measurements behind `sift probe`.
//! - [`trace`]: activation traces (`sift trace`): per decoded token, layer and site, the input the
//!   selector saw and the units it chose, enough to replay any selector.
//! - [`replay`]: the simulator (`sift simulate`): a trace replayed through the very cache and
//!   prefetch code the engine runs ([`sift_store::tiered::TieredStore`] in simulated mode), on a device
//!   profile's clock.
//! - [`bound`]: the physical bound of a budgeted decode (Belady's must-read bytes at the disk's
//!   best bandwidth, or the compute) and a run's telemetry beside it.
//! - [`hybrid`]: KAIROX's GPU–CPU hybrid decode simulated: neuron groups on a GPU under each
//!   balancing policy (static, eager, LRU, TAM, adaptive TAM, the oracle bound), on a GPU profile.
//! - [`hybrid_engine`]: sift's own hybrid decode replayed through the engine's balancer, each
//!   step at the engine's measured costs (`sift probe --gpu -m PACK`): what checks the
//!   simulator against real GPU runs.
//! - [`replay_report`], [`hybrid_report`]: `sift simulate`'s tables, JSON, CSV and charts of
//!   those runs.
//! - [`grouping`]: unit orders for the column file from a trace (hottest units first).
//! - [`planner`]: ActiveFlow §4.1's planner: sparsity, layer-group size and cache size for a
//!   memory budget; [`plan_report`]: `sift plan`'s report of its choice.

pub mod bound;
pub mod grouping;
pub mod hybrid;
pub mod hybrid_engine;
pub mod hybrid_report;
pub mod plan_report;
pub mod planner;
pub mod probe;
pub mod profile;
pub mod replay;
pub mod replay_report;
pub mod trace;
