//! A sift session: a model opened with its options — sparsity, an optional memory budget and the
//! live-budget sources — measured and planned one way, and used as-is by the CLI, the server and
//! the tests.
//!
//! [`Session::open`] takes [`SessionOptions`] (the model path, [`sift_engine::EngineOptions`],
//! [`SparsityOptions`], [`MemoryOptions`]; the last two are also the command line's flags) and
//! gives a [`Session`]: the engine with its selector (and under `--memory` the tiered store sized
//! by the planner), the tokenizer, and the budget file / memory-pressure watchers, polled between
//! tokens with [`Session::poll`]. [`report`] formats what the store did; [`budget`] parses
//! budgets and measures the process's runtime memory.

pub mod autopack;
pub mod bench;
pub mod budget;
pub mod device_probe;
mod engine_costs;
pub mod live;
pub mod machine;
mod open;
mod options;
pub mod outputs;
pub mod planning;
pub mod plantrace;
pub mod profile;
pub mod prompt;
pub mod ranges;
pub mod report;
pub mod simulate;
pub mod sweep;
pub mod trace_recording;

pub use autopack::pack_for;
pub use budget::{parse_budget, peak_rss_bytes, runtime_bytes};
pub use open::{drop_tokenizer_tables, load, LiveBudget, Session};
pub use options::{GpuOptions, MemoryOptions, SessionOptions, SparsityOptions, DEFAULT_MAX_RATIO};
