//! The memory budget's part of the forward pass ([`crate::budget`] holds the live budget): the KV
//! cache's pages reserved before a batch, inside the store's budget, and the budget asked for
//! between tokens applied.

use crate::attention::AttnScratch;
use crate::kv::{KvCache, KV_PAGE};
use crate::{Engine, EngineOptions, EvalError};
use sift_model::{Config, Model};

impl Engine {
    /// Bytes of the KV cache at the start of a sequence (its first page; it grows from there) and
    /// of the per-batch scratch buffers this engine allocates.
    pub fn kv_and_scratch_bytes(model: &Model, opts: &EngineOptions) -> u64 {
        Self::kv_and_scratch_bytes_for(&model.config, opts) + Self::sparse_block_bytes(model, opts)
    }

    /// With sparse prefill, a sparse block's working memory beyond the batch scratch: the chosen
    /// neurons' gate and up values (a block's tokens × at most every neuron, twice) and the
    /// compact matrix of their gate and up rows (at most every row: the layerwise schedule may
    /// keep a whole layer).
    pub fn sparse_block_bytes(model: &Model, opts: &EngineOptions) -> u64 {
        if opts.prefill_sparsity <= 0.0 {
            return 0;
        }
        let ff = model.config.n_ff as u64;
        let values = crate::prefill::PREFILL_BLOCK as u64 * 2 * ff * 4;
        let rows = model.layers.iter().map(|l| (l.w_gate.row_bytes + l.w_up.row_bytes) as u64 * ff).max().unwrap_or(0);
        values + rows
    }

    /// [`Engine::kv_and_scratch_bytes`] from the model's configuration alone.
    pub fn kv_and_scratch_bytes_for(c: &Config, opts: &EngineOptions) -> u64 {
        let n_ctx = if opts.n_ctx == 0 { c.n_ctx_train } else { opts.n_ctx } as u64;
        let b = opts.n_batch.max(1) as u64;
        let (e, q, kv, ff) = (c.n_embd as u64, c.n_embd_q() as u64, c.n_embd_kv() as u64, c.n_ff as u64);
        // The KV cache's first page: it grows a page at a time from there (under a budget, out of the
        // weight cache; see `Engine::reserve_kv`).
        let kv_cache = KvCache::bytes(c, KV_PAGE.min(n_ctx as usize), opts.cache_type_k, opts.cache_type_v);
        let scratch = b * (e + e.max(q) + q + 2 * kv + q + e + 2 * ff) * 4;
        // Quantized activations (≤ one byte and a bit per value), attention's tiles, logits.
        let acts = b * ff.max(e) * 2;
        let scores = AttnScratch::bytes(c, opts.max_threads(), n_ctx as usize);
        let logits = c.n_vocab as u64 * 4 * 2;
        kv_cache + scratch + acts + scores + logits
    }

    /// Positions of the KV cache's first page, allocated from the start (at most the context).
    pub(crate) fn kv_first_page(&self) -> usize {
        KV_PAGE.min(self.seq.n_ctx)
    }

    /// Makes room in the KV cache for `positions` tokens, a page at a time (never past the
    /// context). Under a budget the new pages' bytes are first taken from the weight cache
    /// ([`TieredStore::set_kv_growth`]); when the cache cannot give them up the batch is refused
    /// with [`EvalError::KvBudget`] and nothing changes. Evaluating a batch reserves its positions
    /// itself; a caller that feeds a long prompt in several batches (the server) reserves the
    /// whole prompt first, so that a prompt the budget cannot hold is refused before any work.
    pub fn reserve_kv(&mut self, positions: usize) -> Result<(), EvalError> {
        if positions <= self.seq.kv.capacity() {
            return Ok(());
        }
        let target = positions.div_ceil(KV_PAGE).max(1) * KV_PAGE;
        let c = &self.model.config;
        let (k_type, v_type) = (self.seq.kv.k_type, self.seq.kv.v_type);
        let bytes = |p: usize| KvCache::bytes(c, p, k_type, v_type);
        let growth = bytes(target) + self.parked_kv_bytes() - bytes(self.kv_first_page());
        if let Some(store) = self.source.memory_mut() {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            let refuse =
                |reason: String| EvalError::KvBudget { positions, kv_mib: mib(bytes(target)), k_type, v_type, reason };
            let plan = store.plan();
            let fixed = plan.fixed() - plan.kv_growth + growth;
            // What of the fixed parts a user can give up, named.
            let predictor = match &self.prefill.predictor {
                Some(p) => format!(
                    " (the expert predictor of sparse prefill holds {:.1} MiB of them: --prefill-masks oracle or --prefill-sparsity 0 frees it)",
                    mib(p.bytes() as u64)
                ),
                None => String::new(),
            };
            if fixed > plan.budget {
                return Err(refuse(format!(
                    "with it the parts that are not weight cache take {:.1} MiB of the {:.1} MiB budget{predictor}",
                    mib(fixed),
                    mib(plan.budget)
                )));
            }
            store.set_kv_growth(growth).map_err(|e| refuse(format!("{e}{predictor}")))?;
        }
        self.seq.kv.set_capacity(target);
        Ok(())
    }
}
