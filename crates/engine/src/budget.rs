//! Live memory-budget changes: another thread asks through a [`BudgetHandle`], the engine applies
//! the request between tokens (on the tiered store) and logs what happened as a [`BudgetChange`].

use crate::{Engine, EngineOptions};
use sift_model::{Config, Model};
use sift_store::tiered::MemoryPlan;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A live budget change the engine applied (or refused) between tokens.
#[derive(Clone, Debug)]
pub struct BudgetChange {
    /// Tokens in the context when it was applied.
    pub n_past: usize,
    pub requested: u64,
    /// The new plan, or why the budget was refused (the old one stays).
    pub result: Result<MemoryPlan, String>,
    /// How long applying it took (evicting, compacting, returning memory).
    pub secs: f64,
    /// The process's resident memory right after (VmRSS), if known.
    pub rss_after: Option<u64>,
}

/// Asks a running engine for a new memory budget from any thread; the engine applies it before
/// its next batch (between tokens), see [`Engine::budget_handle`](crate::Engine::budget_handle).
#[derive(Clone, Debug)]
pub struct BudgetHandle(Arc<AtomicU64>);

impl BudgetHandle {
    /// Requests `bytes` (a later request replaces one not yet applied).
    pub fn request(&self, bytes: u64) {
        self.0.store(bytes.max(1), Ordering::SeqCst);
    }
}

/// The engine's side of live budget changes: the pending request and the log of applied ones.
#[derive(Default)]
pub(crate) struct LiveBudget {
    request: Arc<AtomicU64>,
    pub(crate) log: Vec<BudgetChange>,
}

impl LiveBudget {
    pub(crate) fn handle(&self) -> BudgetHandle {
        BudgetHandle(self.request.clone())
    }

    /// The budget asked for since the last call, if any.
    pub(crate) fn take_request(&self) -> Option<u64> {
        match self.request.swap(0, Ordering::SeqCst) {
            0 => None,
            b => Some(b),
        }
    }
}

/// The process's resident set (VmRSS) in bytes, where /proc tells it.
pub fn current_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

impl Engine {
    /// Bytes of the KV cache and per-batch scratch buffers this engine allocated.
    pub fn kv_and_scratch_bytes(model: &Model, opts: &EngineOptions) -> u64 {
        Self::kv_and_scratch_bytes_for(&model.config, opts)
    }

    /// [`Engine::kv_and_scratch_bytes`] from the model's configuration alone.
    pub fn kv_and_scratch_bytes_for(c: &Config, opts: &EngineOptions) -> u64 {
        let n_ctx = if opts.n_ctx == 0 { c.n_ctx_train } else { opts.n_ctx } as u64;
        let b = opts.n_batch.max(1) as u64;
        let (e, q, kv, ff) = (c.n_embd as u64, c.n_embd_q() as u64, c.n_embd_kv() as u64, c.n_ff as u64);
        let kv_cache = 2 * c.n_layer as u64 * n_ctx * kv * 4;
        let scratch = b * (e + e.max(q) + q + 2 * kv + q + e + 2 * ff) * 4;
        // Quantized activations (≤ one byte and a bit per value), scores, logits.
        let acts = b * ff.max(e) * 2;
        let scores = opts.n_threads.max(1) as u64 * n_ctx * 4;
        let logits = c.n_vocab as u64 * 4 * 2;
        kv_cache + scratch + acts + scores + logits
    }
}
