//! [`EngineOptions`]: the settings an [`Engine`](crate::Engine) is built with (threads, context,
//! batch, KV cache types, kernel choices), with llama.cpp's defaults.

use crate::kv::KvType;
use crate::prefill::PrefillMasks;

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Threads for one-token decode steps (llama.cpp's `-t`).
    pub n_threads: usize,
    /// Threads for prompt batches (llama.cpp's `-tb`; 0 = `n_threads`).
    pub n_threads_batch: usize,
    /// How long idle threads poll for work before they sleep, 0-100 (llama.cpp's `--poll`; 0 sleeps
    /// at once, which suits a busy machine).
    pub poll: u8,
    /// Context size in tokens (KV cache capacity). 0 = the model's training context.
    pub n_ctx: usize,
    /// Tokens per forward batch (llama.cpp's `-ub`).
    pub n_batch: usize,
    /// Fraction of the output head's input channels skipped per token (magnitude Top-K; 0 = dense).
    pub sparse_head: f32,
    /// Decode sparse selections on a pack's column kernels (false: dense kernels on masked inputs).
    pub column_kernels: bool,
    /// Run every product of the seven linears on a pack's columns, batches and dense selections
    /// too (measures what the re-quantized columns cost).
    pub all_columns: bool,
    /// Storage type of the K and V caches (llama.cpp's `-ctk` / `-ctv`).
    pub cache_type_k: KvType,
    pub cache_type_v: KvType,
    /// FastForward's sparse prefill: the share of FFN neurons skipped in a prompt's middle blocks
    /// of 128 tokens (0 = dense prefill).
    pub prefill_sparsity: f32,
    /// How a sparse block's neurons are chosen.
    pub prefill_masks: PrefillMasks,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_threads: default_threads(),
            n_threads_batch: 0,
            poll: 50,
            n_ctx: 4096,
            n_batch: 512,
            sparse_head: 0.0,
            column_kernels: true,
            all_columns: false,
            cache_type_k: KvType::F16,
            cache_type_v: KvType::F16,
            prefill_sparsity: 0.0,
            prefill_masks: PrefillMasks::Oracle,
        }
    }
}

impl EngineOptions {
    /// Threads for prompt batches: `n_threads_batch`, or `n_threads` when it is 0.
    pub fn threads_batch(&self) -> usize {
        if self.n_threads_batch == 0 {
            self.n_threads.max(1)
        } else {
            self.n_threads_batch
        }
    }

    /// Threads the engine's pool starts: the larger of the decode and batch counts.
    pub fn max_threads(&self) -> usize {
        self.n_threads.max(self.threads_batch()).max(1)
    }
}

/// The number of threads llama.cpp would pick: the available cores, at most 8 without asking.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8)
}
