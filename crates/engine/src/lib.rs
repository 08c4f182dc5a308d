//! The engine that runs a model: a persistent thread pool, quantized matrix products, the dense
//! forward pass with its KV cache, sampling, text generation, perplexity and benchmarks.
//!
//! One token's path reads top to bottom: [`forward::Engine::eval`] → `layer` → `matmul_many` →
//! the dot kernels of `sift_quant`.

mod attention;
pub mod balancer;
pub mod bench;
pub mod budget;
pub mod calibrate;
pub mod forward;
pub mod generate;
pub mod gpu;
pub mod hybrid;
pub mod kv;
pub mod lora;
pub mod matmul;
mod options;
pub mod perplexity;
pub mod pool;
pub mod predictor;
pub mod prefill;
pub mod sampling;
pub mod slots;
pub mod source;
pub mod sparse;
pub mod trace;
pub mod vecops;
pub mod weight_norms;

pub use budget::{current_rss, BudgetChange, BudgetHandle};
pub use forward::{default_threads, Engine, EngineOptions, EvalError, FfnObserver, Logits};
pub use generate::{GenerateOptions, Generation, Generator, Step, StopReason};
pub use kv::KvType;
pub use sampling::{Pick, Sampler, SamplerChain, SamplerOptions, SamplerStage};
pub use sift_sparsity as sparsity;
pub use slots::{SlotRun, SlotsMode};
pub use source::{SiteWeights, WeightSource};
pub use trace::{SparsityStats, Tracer};
