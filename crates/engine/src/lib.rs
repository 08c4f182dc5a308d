//! The engine that runs a model: a persistent thread pool, quantized matrix products, the dense
//! forward pass with its KV cache, sampling, text generation, perplexity and benchmarks.
//!
//! One token's path reads top to bottom: [`forward::Engine::eval`] → `layer` → `matmul_many` →
//! the dot kernels of `sift_quant`.

pub mod bench;
pub mod calibrate;
pub mod forward;
pub mod generate;
pub mod matmul;
pub mod perplexity;
pub mod pool;
pub mod sampling;
pub mod sparse;
pub mod vecops;

pub use forward::{
    current_rss, default_threads, BudgetChange, BudgetHandle, Engine, EngineOptions, EvalError, Logits, SparsityStats,
    Tracer,
};
pub use generate::{GenerateOptions, Generation, StopReason};
pub use sampling::{Sampler, SamplerOptions};
pub use sift_sparsity as sparsity;
