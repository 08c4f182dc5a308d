//! The engine's settings and state, set and read between batches: where the weights come from
//! (a tiered store, the GPU), the selector, adapters, FastForward's prefill parts, the live memory
//! budget, observers, and the context's position. The forward pass itself is in the parent module.

use super::*;
use crate::prefill::PrefillMasks;
use sift_store::tiered::MemoryTier;

impl Engine {
    /// Runs every linear op through `store` (a memory-budgeted run; see `sift_store::tiered`).
    pub fn attach_store(&mut self, store: TieredStore) -> Result<(), TierError> {
        self.source = Box::new(TieredSource::new(&self.model, store)?);
        // Decoding under a budget blocks on reads between jobs: helpers park soon instead of
        // spinning through the wait on a core the loader thread needs.
        self.pool.set_spin(TIERED_SPIN.min(crate::pool::spin_for_poll(self.pool.poll_level())));
        Ok(())
    }

    /// Runs the layers `gpu` holds on the GPU (see [`crate::gpu`]).
    pub fn attach_gpu(&mut self, gpu: GpuLayers) {
        self.gpu.layers = Some(gpu);
    }

    /// Adds `lora`'s low-rank products to the ops it adapts, on their masked inputs (`--lora`;
    /// `None`: none), sparse prompt blocks' chosen neurons included.
    pub fn set_lora(&mut self, lora: Option<std::sync::Arc<crate::lora::LoraAdapters>>) {
        self.lora = lora;
    }

    pub fn lora(&self) -> Option<&crate::lora::LoraAdapters> {
        self.lora.as_deref()
    }

    /// Uses `p` to choose the neurons of sparse prompt blocks ([`PrefillMasks::Predicted`]).
    pub fn set_prefill_predictor(&mut self, p: Option<std::sync::Arc<crate::predictor::ExpertPredictors>>) {
        self.prefill.predictor = p;
    }

    /// How sparse prompt blocks choose their neurons from now on.
    /// Whether sparse prompt blocks add the error compensator of the predictor file (when it
    /// has one; `--prefill-compensator`).
    pub fn set_prefill_compensator(&mut self, on: bool) {
        self.prefill.compensate = on;
    }

    /// Each layer's share of FFN neurons sparse prompt blocks keep (FastForward's layerwise
    /// schedule, [`crate::prefill::linear_schedule`]); `None`: `1 − R` in every layer.
    pub fn set_prefill_schedule(&mut self, keep: Option<Vec<f32>>) {
        self.prefill.keep = keep;
    }

    /// The share of FFN neurons sparse prompt blocks skip (0: dense prefill; `--prefill-sparsity`).
    pub fn set_prefill_sparsity(&mut self, ratio: f32) {
        self.prefill.ratio = ratio.clamp(0.0, 0.99);
    }

    /// With `true`, makes the 8-bit neuron-major copy of every down projection that sparse
    /// blocks then use ([`crate::prefill::DownCopy`]) and returns its bytes (0 where it is not
    /// worth it: no AVX-512 VNNI, or a width not a multiple of 64); with `false`, drops it (the pack's columns serve).
    pub fn set_prefill_down_copy(&mut self, on: bool) -> Result<usize, sift_quant::transposed_q8::ShapeError> {
        self.prefill.down = None;
        if !on || !crate::prefill::DownCopy::worth_it(&self.model) {
            return Ok(0);
        }
        let copy = crate::prefill::DownCopy::build(&self.model, &self.pool)?;
        let bytes = copy.bytes();
        self.prefill.down = Some(std::sync::Arc::new(copy));
        Ok(bytes)
    }

    pub fn set_prefill_masks(&mut self, masks: PrefillMasks) {
        self.prefill.masks = masks;
    }

    /// Starts (or with `None` stops) watching every dense FFN; returns the previous observer.
    /// While one watches, prompts run dense.
    pub fn set_ffn_observer(&mut self, o: Option<Box<dyn FfnObserver>>) -> Option<Box<dyn FfnObserver>> {
        std::mem::replace(&mut self.watch.ffn, o)
    }

    /// The layers held on the GPU, if any.
    pub fn gpu(&self) -> Option<&GpuLayers> {
        self.gpu.layers.as_ref()
    }

    /// Where this engine's weights come from ("gguf rows", "pack columns", "tiered store").
    pub fn weight_source(&self) -> &'static str {
        self.source.name()
    }

    /// Starts (or with `None` stops) tracing decoded tokens; returns the previous tracer.
    pub fn set_tracer(&mut self, tracer: Option<Box<dyn Tracer>>) -> Option<Box<dyn Tracer>> {
        std::mem::replace(&mut self.watch.tracer, tracer)
    }

    /// Changes the memory budget of a run under `--memory` (see [`TieredStore::set_budget`])
    /// between tokens, keeping the conversation. Returns the new plan.
    /// A budget set aside ([`Engine::set_budget_reserve`]) is taken from `budget` first.
    pub fn set_memory_budget(&mut self, budget: u64) -> Result<MemoryPlan, TierError> {
        let reserve = self.budget.reserve;
        match self.source.memory_mut() {
            Some(store) => store.set_budget(budget.saturating_sub(reserve)).cloned(),
            None => {
                Err(TierError::Unsupported("the memory budget can change only in a run started with --memory".into()))
            }
        }
    }

    /// Keeps `reserve` bytes of the budget (this one and every later one) for work outside the
    /// engine: a server's request bodies, tokenizing and responses. The store's plan then holds
    /// the rest. Refused, with nothing changed, when the rest cannot hold the run.
    pub fn set_budget_reserve(&mut self, reserve: u64) -> Result<MemoryPlan, TierError> {
        let old = self.budget.reserve;
        let Some(store) = self.source.memory_mut() else {
            return Err(TierError::Unsupported("a budget reserve needs a run started with --memory".into()));
        };
        let total = store.plan().budget + old;
        match store.set_budget(total.saturating_sub(reserve)) {
            Ok(plan) => {
                self.budget.reserve = reserve;
                Ok(plan.clone())
            }
            Err(e) => Err(e),
        }
    }

    /// The bytes of the budget kept for work outside the engine.
    pub fn budget_reserve(&self) -> u64 {
        self.budget.reserve
    }

    /// A handle other threads use to change the budget of this engine's run while it runs.
    pub fn budget_handle(&self) -> BudgetHandle {
        self.budget.handle()
    }

    /// The budget changes applied since the last call.
    pub fn take_budget_log(&mut self) -> Vec<BudgetChange> {
        std::mem::take(&mut self.budget.log)
    }

    /// Applies a budget asked for through a [`BudgetHandle`], if any.
    pub(crate) fn apply_budget_request(&mut self) {
        let Some(requested) = self.budget.take_request() else { return };
        let t0 = std::time::Instant::now();
        let result = self.set_memory_budget(requested).map_err(|e| e.to_string());
        let change = BudgetChange {
            n_past: self.seq.n_past,
            requested,
            result,
            secs: t0.elapsed().as_secs_f64(),
            rss_after: current_rss(),
        };
        self.budget.log.push(change);
    }

    /// The budgeted memory of a run under `--memory`: its plan, counters and cache.
    pub fn memory(&self) -> Option<&dyn MemoryTier> {
        self.source.memory()
    }

    pub fn memory_mut(&mut self) -> Option<&mut dyn MemoryTier> {
        self.source.memory_mut()
    }

    /// Units at each selection site, for building selectors.
    pub fn site_dims(&self) -> SiteDims {
        let c = &self.model.config;
        SiteDims::of(c)
    }

    /// Replaces the selection method (the sequence state of the old one is dropped).
    pub fn set_selector(&mut self, selector: Box<dyn Selector>) {
        self.sparsity.selector = selector;
        self.sparsity.selector.reset();
    }

    pub fn selector(&self) -> &dyn Selector {
        self.sparsity.selector.as_ref()
    }

    pub fn config(&self) -> &Config {
        &self.model.config
    }

    pub fn n_ctx(&self) -> usize {
        self.seq.n_ctx
    }

    /// Tokens per forward batch (`-b`; at most 64 under a memory budget).
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Threads of one-token decode steps (`-t`).
    pub fn n_threads(&self) -> usize {
        self.pool.step_threads().0
    }

    /// Threads of prompt batches (`-tb`).
    pub fn n_threads_batch(&self) -> usize {
        self.pool.step_threads().1
    }

    /// Tokens currently in the KV cache.
    pub fn n_past(&self) -> usize {
        self.seq.n_past
    }

    /// Forgets everything after the first `n` tokens (a new conversation: `truncate(0)`, which also
    /// resets the selector's sequence state).
    pub fn truncate(&mut self, n: usize) {
        self.seq.n_past = self.seq.n_past.min(n);
        if let Some(g) = &mut self.gpu.layers {
            g.truncate(n);
        }
        if n == 0 {
            if let Some(h) = &mut self.gpu.hybrid {
                h.reset();
            }
            // Every KV page but the first goes back (under a budget, to the weight cache).
            self.seq.kv.set_capacity(self.kv_first_page());
            let growth = self.parked_kv_bytes();
            if let Some(store) = self.source.memory_mut() {
                // Growing the cache back never fails: the fixed part only shrinks.
                let _ = store.set_kv_growth(growth);
            }
            self.sparsity.selector.reset();
            if let Some(t) = &mut self.watch.tracer {
                t.reset();
            }
            self.source.reset_context();
        }
    }
}
