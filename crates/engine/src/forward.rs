//! The dense forward pass: engine → layer → op → kernel.
//!
//! [`Engine::eval`] takes a batch of tokens, appends their keys and values to the KV cache and
//! returns logits. Prompts run as batches (GEMM-like: each weight row is read once per batch),
//! generation one token at a time (GEMV). All products go through [`crate::matmul`].

use crate::matmul::{matmul_many, matmul_rows, MatJob, QuantActs};
use crate::pool::{split, SharedMut, ThreadPool};
use crate::sparse::{column_matmul, column_matmul_batch, tensor_job, ColJob, ColOp};
use crate::vecops;
use sift_model::{Config, LayerWeights, Model, QTensor, RopeStyle};
use sift_sparsity::{top_k_indices, DenseSelector, Phase, Selection, Selector, Site, SiteDims};
use sift_store::io::AlignedBuf;
use sift_store::tiered::{MemoryPlan, TierError, TieredStore};
use sift_store::OpKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Which positions of a batch need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (generation).
    Last,
    /// Every token's (perplexity, prompt log-probabilities).
    All,
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub n_threads: usize,
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
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_threads: default_threads(),
            n_ctx: 4096,
            n_batch: 512,
            sparse_head: 0.0,
            column_kernels: true,
            all_columns: false,
        }
    }
}

/// The number of threads llama.cpp would pick: the available cores, at most 4 without asking.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8)
}

/// Errors from evaluating tokens.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("context is full: {n_past} + {n_new} tokens exceed the context size {n_ctx}; raise -c (up to the model's {n_ctx_train}) or shorten the prompt")]
    ContextFull { n_past: usize, n_new: usize, n_ctx: usize, n_ctx_train: usize },
    #[error("token id {id} is outside the vocabulary (size {n_vocab})")]
    BadToken { id: u32, n_vocab: usize },
    #[error("nothing to evaluate: the token list is empty")]
    Empty,
    #[error(transparent)]
    Store(#[from] TierError),
}

/// Keys and values of every layer for positions `0..n_past`, f32, `[pos][kv_head * head_dim]`.
struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// Per-batch working memory, sized for `n_batch` tokens.
struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    /// One attention-score row per worker thread.
    scores: Vec<Vec<f32>>,
    acts: QuantActs,
    logits: Vec<f32>,
}

/// A model ready to run: weights, KV cache, threads and scratch memory.
pub struct Engine {
    pub model: Model,
    pool: ThreadPool,
    kv: KvCache,
    s: Scratch,
    n_ctx: usize,
    n_batch: usize,
    n_past: usize,
    /// `freq_base^(-2/rope_dim)`, iterated as ggml does.
    theta_scale: f32,
    /// Chooses the active input units of every linear op ([`DenseSelector`] unless set).
    selector: Box<dyn Selector>,
    phase: Phase,
    sparse_head: f32,
    active: Vec<u32>,
    keep: Vec<bool>,
    head_scores: Vec<f32>,
    head_scratch: Vec<f32>,
    stats: SparsityStats,
    /// Column tensors of every layer (q, k, v, o, gate, up, down) when running a sift pack with
    /// column kernels enabled.
    cols: Option<Vec<Vec<ColOp>>>,
    coef: Vec<f32>,
    col_scratch: Vec<f32>,
    all_columns: bool,
    /// Compute only the fixed active neurons' gate/up rows (off with `column_kernels: false`).
    row_gather: bool,
    /// The tiered store, when running under a memory budget: every linear op's weights come
    /// from it (columns for a decoded token, the layer's rows streamed for a prompt batch).
    tiered: Option<TieredStore>,
    /// The current prompt layer's weights, read by the tiered store.
    prefill_w: Option<(AlignedBuf, LayerWeights)>,
    /// The first error of the tiered store during a batch.
    store_error: Option<TierError>,
    all_units: Vec<u32>,
    /// Watches decoded tokens for `sift trace`.
    tracer: Option<Box<dyn Tracer>>,
    /// A memory budget asked for from another thread (0: none), applied before the next batch.
    budget_request: Arc<AtomicU64>,
    budget_log: Vec<BudgetChange>,
}

/// Helper spins before parking when a tiered store is attached (~50 µs).
const TIERED_SPIN: u32 = 1 << 10;

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
/// its next batch (between tokens), see [`Engine::budget_handle`].
#[derive(Clone, Debug)]
pub struct BudgetHandle(Arc<AtomicU64>);

impl BudgetHandle {
    /// Requests `bytes` (a later request replaces one not yet applied).
    pub fn request(&self, bytes: u64) {
        self.0.store(bytes.max(1), Ordering::SeqCst);
    }
}

/// Watches a decoded token's path through the layers (`sift trace`): the residual entering each
/// layer and, at each site, the input the selector saw (before masking) and what it chose.
/// Prompt batches are only announced: under a memory budget they read whole layers and leave the
/// cache alone, so the cache's history is the decoded tokens'.
pub trait Tracer: Send {
    /// A prompt batch of `n` tokens is about to run.
    fn prompt(&mut self, _n: usize) {}
    /// A decoded token at position `pos` is about to run.
    fn token(&mut self, _pos: usize) {}
    /// The sequence restarts (the KV cache was cleared).
    fn reset(&mut self) {}
    /// Layer `layer` of the decoded token starts with this residual stream.
    fn layer(&mut self, layer: usize, residual: &[f32]);
    /// The selector chose `active` (ascending; `None`: every unit) at `site` from `input`.
    fn site(&mut self, layer: usize, site: Site, input: &[f32], active: Option<&[u32]>);
}

/// How many input units each site used, summed over the tokens run since the last reset.
#[derive(Clone, Debug, Default)]
pub struct SparsityStats {
    /// Token-layers that passed each site.
    pub visits: [u64; 4],
    /// Active units summed over those visits.
    pub active: [u64; 4],
    /// Units at each site (per visit).
    pub units: [u64; 4],
    /// Tokens whose output head ran, and the head's active input units over them.
    pub head_visits: u64,
    pub head_active: u64,
    /// Weight bytes read by the column kernels.
    pub column_bytes: u64,
}

impl SparsityStats {
    /// Mean fraction of units active at `site`.
    pub fn active_fraction(&self, site: Site) -> f64 {
        let i = site.index();
        if self.visits[i] == 0 || self.units[i] == 0 {
            1.0
        } else {
            self.active[i] as f64 / (self.visits[i] * self.units[i]) as f64
        }
    }
}

impl Engine {
    pub fn new(model: Model, opts: &EngineOptions) -> Engine {
        let c = model.config.clone();
        let n_ctx = if opts.n_ctx == 0 { c.n_ctx_train } else { opts.n_ctx };
        let b = opts.n_batch.max(1);
        let kv_len = n_ctx * c.n_embd_kv();
        let pool = ThreadPool::new(opts.n_threads);
        let s = Scratch {
            x: vec![0.0; b * c.n_embd],
            h: vec![0.0; b * c.n_embd.max(c.n_embd_q())],
            q: vec![0.0; b * c.n_embd_q()],
            k: vec![0.0; b * c.n_embd_kv()],
            v: vec![0.0; b * c.n_embd_kv()],
            att: vec![0.0; b * c.n_embd_q()],
            o: vec![0.0; b * c.n_embd],
            g: vec![0.0; b * c.n_ff],
            u: vec![0.0; b * c.n_ff],
            scores: (0..pool.n_threads()).map(|_| vec![0.0; n_ctx]).collect(),
            acts: QuantActs::new(),
            logits: Vec::new(),
        };
        let kv = KvCache {
            k: (0..c.n_layer).map(|_| vec![0.0; kv_len]).collect(),
            v: (0..c.n_layer).map(|_| vec![0.0; kv_len]).collect(),
        };
        let theta_scale = c.rope_base.powf(-2.0 / c.rope_dim as f32);
        let cols = match (&model.columns, opts.column_kernels) {
            (Some(p), true) => Some(p.layers.iter().map(|l| l.ops.iter().map(ColOp::new).collect()).collect()),
            _ => None,
        };
        let stats = SparsityStats {
            units: [c.n_embd as u64, c.n_embd_q() as u64, c.n_embd as u64, c.n_ff as u64],
            ..Default::default()
        };
        Engine {
            model,
            pool,
            kv,
            s,
            n_ctx,
            n_batch: b,
            n_past: 0,
            theta_scale,
            selector: Box::new(DenseSelector),
            phase: Phase::Prompt,
            sparse_head: opts.sparse_head.clamp(0.0, 0.99),
            active: Vec::new(),
            keep: Vec::new(),
            head_scores: Vec::new(),
            head_scratch: Vec::new(),
            stats,
            all_columns: opts.all_columns && cols.is_some(),
            row_gather: opts.column_kernels,
            cols,
            coef: Vec::new(),
            col_scratch: Vec::new(),
            tiered: None,
            prefill_w: None,
            store_error: None,
            all_units: Vec::new(),
            tracer: None,
            budget_request: Arc::new(AtomicU64::new(0)),
            budget_log: Vec::new(),
        }
    }

    /// Runs every linear op through `store` (a memory-budgeted run; see `sift_store::tiered`).
    pub fn attach_store(&mut self, store: TieredStore) {
        self.cols = self
            .model
            .columns
            .as_ref()
            .map(|p| p.layers.iter().map(|l| l.ops.iter().map(ColOp::new).collect()).collect());
        self.all_columns = false;
        self.row_gather = false;
        // Decoding under a budget blocks on reads between jobs: helpers park soon instead of
        // spinning through the wait on a core the loader thread needs.
        self.pool.set_spin(TIERED_SPIN);
        self.tiered = Some(store);
    }

    /// Starts (or with `None` stops) tracing decoded tokens; returns the previous tracer.
    pub fn set_tracer(&mut self, tracer: Option<Box<dyn Tracer>>) -> Option<Box<dyn Tracer>> {
        std::mem::replace(&mut self.tracer, tracer)
    }

    /// Changes the memory budget of a run under `--memory` (see
    /// [`TieredStore::set_budget`](sift_store::tiered::TieredStore::set_budget)) between tokens,
    /// keeping the conversation. Returns the new plan.
    pub fn set_memory_budget(&mut self, budget: u64) -> Result<sift_store::tiered::MemoryPlan, TierError> {
        match &mut self.tiered {
            Some(store) => store.set_budget(budget).cloned(),
            None => {
                Err(TierError::Unsupported("the memory budget can change only in a run started with --memory".into()))
            }
        }
    }

    /// A handle other threads use to change the budget of this engine's run while it runs.
    pub fn budget_handle(&self) -> BudgetHandle {
        BudgetHandle(self.budget_request.clone())
    }

    /// The budget changes applied since the last call.
    pub fn take_budget_log(&mut self) -> Vec<BudgetChange> {
        std::mem::take(&mut self.budget_log)
    }

    /// Applies a budget asked for through a [`BudgetHandle`], if any.
    fn apply_budget_request(&mut self) {
        let req = self.budget_request.swap(0, Ordering::SeqCst);
        if req == 0 {
            return;
        }
        let t0 = std::time::Instant::now();
        let result = self.set_memory_budget(req).map_err(|e| e.to_string());
        self.budget_log.push(BudgetChange {
            n_past: self.n_past,
            requested: req,
            result,
            secs: t0.elapsed().as_secs_f64(),
            rss_after: current_rss(),
        });
    }

    /// The tiered store, when attached.
    pub fn store(&self) -> Option<&TieredStore> {
        self.tiered.as_ref()
    }

    pub fn store_mut(&mut self) -> Option<&mut TieredStore> {
        self.tiered.as_mut()
    }

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

    /// Units at each selection site, for building selectors.
    pub fn site_dims(&self) -> SiteDims {
        let c = &self.model.config;
        SiteDims { n_layer: c.n_layer, units: [c.n_embd, c.n_embd_q(), c.n_embd, c.n_ff] }
    }

    /// Replaces the selection method (the sequence state of the old one is dropped).
    pub fn set_selector(&mut self, selector: Box<dyn Selector>) {
        self.selector = selector;
        self.selector.reset();
    }

    pub fn selector(&self) -> &dyn Selector {
        self.selector.as_ref()
    }

    /// Units used per site since the last [`Engine::reset_stats`].
    pub fn sparsity_stats(&self) -> &SparsityStats {
        &self.stats
    }

    pub fn reset_stats(&mut self) {
        let units = self.stats.units;
        self.stats = SparsityStats { units, ..Default::default() };
    }

    /// Weight bytes each site's ops read per token when dense: [q+k+v, o, gate+up, down], summed
    /// over layers; and the output head's bytes.
    pub fn site_bytes(&self) -> ([u64; 4], u64) {
        let mut b = [0u64; 4];
        for lw in &self.model.layers {
            let n = |t: &QTensor| (t.range.end - t.range.start) as u64;
            b[0] += n(&lw.wq) + n(&lw.wk) + n(&lw.wv);
            b[1] += n(&lw.wo);
            b[2] += n(&lw.w_gate) + n(&lw.w_up);
            b[3] += n(&lw.w_down);
        }
        let o = &self.model.output;
        (b, (o.range.end - o.range.start) as u64)
    }

    /// Mean weight bytes per token that the selections since the last stats reset needed
    /// (the seven linears scaled by their sites' active fractions, plus the output head).
    pub fn active_bytes_per_token(&self) -> f64 {
        let (b, head) = self.site_bytes();
        let mut total = 0.0;
        for s in Site::ALL {
            total += b[s.index()] as f64 * self.stats.active_fraction(s);
        }
        let head_frac = if self.stats.head_visits == 0 {
            1.0
        } else {
            self.stats.head_active as f64 / (self.stats.head_visits as f64 * self.model.config.n_embd as f64)
        };
        total + head as f64 * head_frac
    }

    pub fn config(&self) -> &Config {
        &self.model.config
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Tokens currently in the KV cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Forgets everything after the first `n` tokens (a new conversation: `truncate(0)`, which also
    /// resets the selector's sequence state).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
        if n == 0 {
            self.selector.reset();
            if let Some(t) = &mut self.tracer {
                t.reset();
            }
            if let Some(t) = &mut self.tiered {
                t.reset_context();
            }
        }
    }

    /// Evaluates `tokens` after the cached ones and returns logits: `n_vocab` values for
    /// [`Logits::Last`], `tokens.len() * n_vocab` for [`Logits::All`]. A batch of more than one
    /// token counts as prompt ([`Phase::Prompt`]), a single token as generation.
    pub fn eval(&mut self, tokens: &[u32], want: Logits) -> Result<&[f32], EvalError> {
        let phase = if tokens.len() > 1 { Phase::Prompt } else { Phase::Generate };
        self.eval_phase(tokens, want, phase)
    }

    /// [`Engine::eval`] with an explicit phase: selectors that fix their choice at prefill
    /// (core neurons) observe [`Phase::Prompt`] tokens and apply their set to [`Phase::Generate`]
    /// ones, however many arrive at once (perplexity scores a window's second half as a batch).
    pub fn eval_phase(&mut self, tokens: &[u32], want: Logits, phase: Phase) -> Result<&[f32], EvalError> {
        let c = &self.model.config;
        if tokens.is_empty() {
            return Err(EvalError::Empty);
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(EvalError::BadToken { id, n_vocab: c.n_vocab });
        }
        if self.n_past + tokens.len() > self.n_ctx {
            return Err(EvalError::ContextFull {
                n_past: self.n_past,
                n_new: tokens.len(),
                n_ctx: self.n_ctx,
                n_ctx_train: c.n_ctx_train,
            });
        }
        self.apply_budget_request();
        let c = &self.model.config;
        let n_vocab = c.n_vocab;
        let mut all = Vec::new();
        if want == Logits::All {
            all.reserve(tokens.len() * n_vocab);
        }
        let n_batches = tokens.len().div_ceil(self.n_batch);
        self.phase = phase;
        self.selector.begin_batch(phase);
        let n_past0 = self.n_past;
        for (i, batch) in tokens.chunks(self.n_batch).enumerate() {
            let last = i + 1 == n_batches;
            let rows = match want {
                Logits::All => batch.len(),
                Logits::Last if last => 1,
                Logits::Last => 0,
            };
            self.forward_batch(batch, rows);
            if let Some(e) = self.store_error.take() {
                // The batch's KV entries are garbage: forget them, return no logits.
                self.n_past = n_past0;
                self.selector.end_batch(phase);
                return Err(e.into());
            }
            if want == Logits::All {
                all.extend_from_slice(&self.s.logits[..rows * n_vocab]);
            }
        }
        self.selector.end_batch(phase);
        if want == Logits::All {
            self.s.logits = all;
        }
        let n = if want == Logits::All { tokens.len() } else { 1 };
        Ok(&self.s.logits[..n * n_vocab])
    }

    /// Runs `tokens` (at most one batch, from position 0) and returns each layer's input: the
    /// residual stream entering layer `l`, `tokens.len() * n_embd` values per layer. For calibration.
    pub fn layer_inputs(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EvalError> {
        let c = &self.model.config;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(EvalError::BadToken { id, n_vocab: c.n_vocab });
        }
        let n = tokens.len().min(self.n_batch).min(self.n_ctx);
        if n == 0 {
            return Err(EvalError::Empty);
        }
        let e = c.n_embd;
        self.truncate(0);
        self.embed(&tokens[..n]);
        let mut out = Vec::with_capacity(self.model.layers.len());
        for l in 0..self.model.layers.len() {
            out.push(self.s.x[..n * e].to_vec());
            self.layer(l, n);
        }
        Ok(out)
    }

    /// Runs layer `l` alone on `x` (`n` tokens at positions `0..n`, at most one batch) with the
    /// current selector and returns its output. Overwrites that layer's KV cache; call
    /// `truncate(0)` before evaluating text again.
    pub fn run_layer(&mut self, l: usize, x: &[f32], phase: Phase) -> Vec<f32> {
        let e = self.model.config.n_embd;
        let n = (x.len() / e).min(self.n_batch).min(self.n_ctx);
        self.n_past = 0;
        self.phase = phase;
        self.s.x[..n * e].copy_from_slice(&x[..n * e]);
        self.layer(l, n);
        self.s.x[..n * e].to_vec()
    }

    /// Embedding lookup: dequantize one row per token into `s.x`.
    fn embed(&mut self, tokens: &[u32]) {
        let e = self.model.config.n_embd;
        for (t, &id) in tokens.iter().enumerate() {
            let out = &mut self.s.x[t * e..(t + 1) * e];
            if let Some(store) = &mut self.tiered {
                match store.embedding_row(id as usize, out) {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(err) => {
                        self.store_error.get_or_insert(err);
                        continue;
                    }
                }
            }
            let row = self.model.row(&self.model.tok_embd, id as usize);
            self.model.tok_embd.ty.dequantize_row(row, out);
        }
    }

    /// Runs one batch through every layer; leaves logits of the last `n_logits` tokens in `s.logits`.
    fn forward_batch(&mut self, tokens: &[u32], n_logits: usize) {
        let n = tokens.len();
        if let Some(t) = &mut self.tracer {
            if n == 1 {
                t.token(self.n_past);
            } else {
                t.prompt(n);
            }
        }
        self.embed(tokens);
        for l in 0..self.model.layers.len() {
            if self.store_error.is_some() {
                return;
            }
            self.layer(l, n);
        }
        if self.store_error.is_some() {
            return;
        }
        self.n_past += n;
        if n_logits > 0 {
            self.output_head(n, n_logits);
        }
    }

    /// Asks the selector for each of `n` token rows of `x` (row length `len`) at `site` and zeroes
    /// the inactive inputs: a skipped input channel contributes nothing, exactly as if its weight
    /// column were not read, so dense kernels on masked inputs compute what sparse column kernels
    /// compute (which is how quality is measured on any file). Returns whether a single token's
    /// selection is a subset, left in `self.active` for the column kernels.
    fn select_and_mask(&mut self, l: usize, site: Site, which: Buf, len: usize, n: usize) -> bool {
        if n == 1 && self.selector.wants_cache_state() {
            if let Some(store) = &self.tiered {
                // DIP-CA re-weights by the live cache: the first op of the site stands for it
                // (gate and up, or q, k and v, see the same columns and policy decisions).
                let op = match site {
                    Site::AttnIn => OpKind::Q,
                    Site::AttnOut => OpKind::O,
                    Site::FfnIn => OpKind::Gate,
                    Site::FfnMid => OpKind::Down,
                };
                store.cached_mask(l, op, &mut self.keep);
                self.selector.observe_cache(l, site, &self.keep);
            }
        }
        let Engine { selector, phase, active, keep, s, stats, tracer, .. } = self;
        let x = match which {
            Buf::H => &mut s.h,
            Buf::Att => &mut s.att,
            Buf::G => &mut s.g,
        };
        let i = site.index();
        let mut subset = false;
        for row in x[..n * len].chunks_exact_mut(len) {
            stats.visits[i] += 1;
            let selection = selector.select(l, site, *phase, row, active);
            if let (Some(t), 1) = (tracer.as_mut(), n) {
                t.site(l, site, row, (selection == Selection::Subset).then_some(&active[..]));
            }
            match selection {
                Selection::All => {
                    stats.active[i] += len as u64;
                    subset = false;
                }
                Selection::Subset => {
                    stats.active[i] += active.len() as u64;
                    keep.clear();
                    keep.resize(len, false);
                    for &j in active.iter() {
                        if let Some(k) = keep.get_mut(j as usize) {
                            *k = true;
                        }
                    }
                    for (v, &k) in row.iter_mut().zip(keep.iter()) {
                        if !k {
                            *v = 0.0;
                        }
                    }
                    subset = true;
                }
            }
        }
        subset && n == 1
    }

    /// The products of one site: q, k, v (attention input), o, gate and up, or down. A single token
    /// whose selection is a subset runs on the pack's column kernels (only active columns are
    /// read); everything else on the dense kernels over the (masked) input.
    fn project(&mut self, l: usize, n: usize, site: Site, sparse: bool) {
        if self.tiered.is_some() && n == 1 {
            self.project_tiered(l, site, sparse);
            return;
        }
        let Engine {
            model,
            pool,
            s,
            cols,
            active,
            coef,
            col_scratch,
            stats,
            all_columns,
            selector,
            phase,
            row_gather,
            prefill_w,
            ..
        } = self;
        let c = &model.config;
        let (e, qd, kvd, ff) = (c.n_embd, c.n_embd_q(), c.n_embd_kv(), c.n_ff);
        // A prompt batch under a memory budget reads the layer's rows from the store's buffer.
        let (file, lw): (&[u8], &LayerWeights) = match prefill_w {
            Some((buf, lw)) => (&buf[..], lw),
            None => (model.file.bytes(), &model.layers[l]),
        };
        if let (true, Some(cols)) = (*all_columns && !(sparse && n == 1), cols.as_ref()) {
            let ops = &cols[l];
            let f = model.file.file_bytes();
            let (x, mut jobs): (&[f32], Vec<ColJob<'_>>) = match site {
                Site::AttnIn => (
                    &s.h[..n * e],
                    vec![
                        tensor_job(&ops[0], f, &[], &mut s.q[..n * qd]),
                        tensor_job(&ops[1], f, &[], &mut s.k[..n * kvd]),
                        tensor_job(&ops[2], f, &[], &mut s.v[..n * kvd]),
                    ],
                ),
                Site::AttnOut => (&s.att[..n * qd], vec![tensor_job(&ops[3], f, &[], &mut s.o[..n * e])]),
                Site::FfnIn => (
                    &s.h[..n * e],
                    vec![
                        tensor_job(&ops[4], f, &[], &mut s.g[..n * ff]),
                        tensor_job(&ops[5], f, &[], &mut s.u[..n * ff]),
                    ],
                ),
                Site::FfnMid => (&s.g[..n * ff], vec![tensor_job(&ops[6], f, &[], &mut s.o[..n * e])]),
            };
            column_matmul_batch(pool, x, n, &mut jobs);
            return;
        }
        if let (true, Some(cols)) = (sparse, cols.as_ref()) {
            let ops = &cols[l];
            let x: &[f32] = match site {
                Site::AttnIn | Site::FfnIn => &s.h[..e],
                Site::AttnOut => &s.att[..qd],
                Site::FfnMid => &s.g[..ff],
            };
            coef.clear();
            coef.extend(active.iter().map(|&j| x[j as usize]));
            let f = model.file.file_bytes();
            let a = &active[..];
            let mut jobs: Vec<ColJob<'_>> = match site {
                Site::AttnIn => vec![
                    tensor_job(&ops[0], f, a, &mut s.q[..qd]),
                    tensor_job(&ops[1], f, a, &mut s.k[..kvd]),
                    tensor_job(&ops[2], f, a, &mut s.v[..kvd]),
                ],
                Site::AttnOut => vec![tensor_job(&ops[3], f, a, &mut s.o[..e])],
                Site::FfnIn => {
                    vec![tensor_job(&ops[4], f, a, &mut s.g[..ff]), tensor_job(&ops[5], f, a, &mut s.u[..ff])]
                }
                Site::FfnMid => vec![tensor_job(&ops[6], f, a, &mut s.o[..e])],
            };
            stats.column_bytes += jobs.iter().map(|j| j.op.bytes(a.len()) as u64).sum::<u64>();
            column_matmul(pool, coef, &mut jobs, col_scratch);
            return;
        }
        match site {
            Site::AttnIn => {
                quantize_for(pool, &mut s.acts, &[&lw.wq, &lw.wk, &lw.wv], &s.h, e, n);
                matmul_many(
                    pool,
                    file,
                    &s.acts,
                    n,
                    &mut [
                        MatJob { w: &lw.wq, out: &mut s.q[..n * qd], stride: qd },
                        MatJob { w: &lw.wk, out: &mut s.k[..n * kvd], stride: kvd },
                        MatJob { w: &lw.wv, out: &mut s.v[..n * kvd], stride: kvd },
                    ],
                );
            }
            Site::AttnOut => {
                quantize_for(pool, &mut s.acts, &[&lw.wo], &s.att, qd, n);
                matmul_many(pool, file, &s.acts, n, &mut [MatJob { w: &lw.wo, out: &mut s.o[..n * e], stride: e }]);
            }
            Site::FfnIn => {
                quantize_for(pool, &mut s.acts, &[&lw.w_gate, &lw.w_up], &s.h, e, n);
                if n == 1 && *row_gather {
                    if let Some(rows) = selector.fixed_neurons(l, *phase) {
                        matmul_rows(
                            pool,
                            file,
                            &s.acts,
                            rows,
                            &mut [
                                MatJob { w: &lw.w_gate, out: &mut s.g[..ff], stride: ff },
                                MatJob { w: &lw.w_up, out: &mut s.u[..ff], stride: ff },
                            ],
                        );
                        return;
                    }
                }
                matmul_many(
                    pool,
                    file,
                    &s.acts,
                    n,
                    &mut [
                        MatJob { w: &lw.w_gate, out: &mut s.g[..n * ff], stride: ff },
                        MatJob { w: &lw.w_up, out: &mut s.u[..n * ff], stride: ff },
                    ],
                );
            }
            Site::FfnMid => {
                quantize_for(pool, &mut s.acts, &[&lw.w_down], &s.g, ff, n);
                matmul_many(pool, file, &s.acts, n, &mut [MatJob { w: &lw.w_down, out: &mut s.o[..n * e], stride: e }]);
            }
        }
    }

    /// A decoded token's products under a memory budget: the tiered store brings the active
    /// columns (all of them when the selection is not a subset) into its arena, and the column
    /// kernels run on them there.
    fn project_tiered(&mut self, l: usize, site: Site, sparse: bool) {
        let Engine { model, pool, s, cols, active, coef, col_scratch, stats, tiered, store_error, all_units, .. } =
            self;
        let (Some(store), Some(cols)) = (tiered.as_mut(), cols.as_ref()) else {
            return;
        };
        let c = &model.config;
        let (e, qd, kvd, ff) = (c.n_embd, c.n_embd_q(), c.n_embd_kv(), c.n_ff);
        let (x, ops): (&[f32], &[OpKind]) = match site {
            Site::AttnIn => (&s.h[..e], &[OpKind::Q, OpKind::K, OpKind::V]),
            Site::AttnOut => (&s.att[..qd], &[OpKind::O]),
            Site::FfnIn => (&s.h[..e], &[OpKind::Gate, OpKind::Up]),
            Site::FfnMid => (&s.g[..ff], &[OpKind::Down]),
        };
        let act: &[u32] = if sparse {
            active
        } else {
            all_units.clear();
            all_units.extend(0..x.len() as u32);
            all_units
        };
        if let Err(err) = store.fetch(l, ops, act) {
            store_error.get_or_insert(err);
            return;
        }
        coef.clear();
        coef.extend(act.iter().map(|&j| x[j as usize]));
        let colops = &cols[l];
        let view = |k: usize, op: OpKind| store.view(l, op, k);
        let mut jobs: Vec<ColJob<'_>> = match site {
            Site::AttnIn => {
                let ((dq, iq), (dk, ik), (dv, iv)) = (view(0, OpKind::Q), view(1, OpKind::K), view(2, OpKind::V));
                vec![
                    ColJob { op: &colops[0], data: dq, idx: iq, out: &mut s.q[..qd] },
                    ColJob { op: &colops[1], data: dk, idx: ik, out: &mut s.k[..kvd] },
                    ColJob { op: &colops[2], data: dv, idx: iv, out: &mut s.v[..kvd] },
                ]
            }
            Site::AttnOut => {
                let (d, i) = view(0, OpKind::O);
                vec![ColJob { op: &colops[3], data: d, idx: i, out: &mut s.o[..e] }]
            }
            Site::FfnIn => {
                let ((dg, ig), (du, iu)) = (view(0, OpKind::Gate), view(1, OpKind::Up));
                vec![
                    ColJob { op: &colops[4], data: dg, idx: ig, out: &mut s.g[..ff] },
                    ColJob { op: &colops[5], data: du, idx: iu, out: &mut s.u[..ff] },
                ]
            }
            Site::FfnMid => {
                let (d, i) = view(0, OpKind::Down);
                vec![ColJob { op: &colops[6], data: d, idx: i, out: &mut s.o[..e] }]
            }
        };
        stats.column_bytes += jobs.iter().map(|j| j.op.bytes(act.len()) as u64).sum::<u64>();
        column_matmul(pool, coef, &mut jobs, col_scratch);
    }

    /// One transformer block: attention, then the SwiGLU feed-forward, each added to the residual.
    fn layer(&mut self, l: usize, n: usize) {
        if let (Some(t), 1) = (&mut self.tracer, n) {
            t.layer(l, &self.s.x[..self.model.config.n_embd]);
        }
        if let Some(store) = &mut self.tiered {
            if n == 1 {
                store.begin_layer(l, &self.s.x[..self.model.config.n_embd]);
            } else {
                match store.prefill_layer(&self.model, l) {
                    Ok(w) => self.prefill_w = Some(w),
                    Err(err) => {
                        self.store_error.get_or_insert(err);
                        return;
                    }
                }
            }
        }
        self.layer_compute(l, n);
        if let (Some(store), Some((buf, _))) = (&mut self.tiered, self.prefill_w.take()) {
            store.end_prefill_layer(buf);
        }
    }

    fn layer_compute(&mut self, l: usize, n: usize) {
        let c = &self.model.config;
        let (e, qd, ff, eps) = (c.n_embd, c.n_embd_q(), c.n_ff, c.rms_eps);
        // Attention.
        {
            let Engine { model, pool, s, .. } = self;
            rms_norm_rows(pool, &s.x[..n * e], &model.layers[l].attn_norm, eps, &mut s.h[..n * e], e);
        }
        let sparse = self.select_and_mask(l, Site::AttnIn, Buf::H, e, n);
        self.project(l, n, Site::AttnIn, sparse);
        self.attention_core(l, n);
        let sparse = self.select_and_mask(l, Site::AttnOut, Buf::Att, qd, n);
        self.project(l, n, Site::AttnOut, sparse);
        vecops::add_assign(&mut self.s.x[..n * e], &self.s.o[..n * e]);
        // Feed-forward (SwiGLU).
        {
            let Engine { model, pool, s, .. } = self;
            rms_norm_rows(pool, &s.x[..n * e], &model.layers[l].ffn_norm, eps, &mut s.h[..n * e], e);
        }
        let sparse = self.select_and_mask(l, Site::FfnIn, Buf::H, e, n);
        self.project(l, n, Site::FfnIn, sparse);
        vecops::silu_mul(&mut self.s.g[..n * ff], &self.s.u[..n * ff]);
        let sparse = self.select_and_mask(l, Site::FfnMid, Buf::G, ff, n);
        self.project(l, n, Site::FfnMid, sparse);
        vecops::add_assign(&mut self.s.x[..n * e], &self.s.o[..n * e]);
    }

    /// Biases, RoPE, the KV cache append and attention over the projected q, k, v into `s.att`.
    fn attention_core(&mut self, l: usize, n: usize) {
        let Engine { model, pool, kv, s, n_past, theta_scale, .. } = self;
        let c = &model.config;
        let lw: &LayerWeights = &model.layers[l];
        let (qd, kvd) = (c.n_embd_q(), c.n_embd_kv());
        for t in 0..n {
            if let Some(b) = &lw.bq {
                vecops::add_assign(&mut s.q[t * qd..(t + 1) * qd], b);
            }
            if let Some(b) = &lw.bk {
                vecops::add_assign(&mut s.k[t * kvd..(t + 1) * kvd], b);
            }
            if let Some(b) = &lw.bv {
                vecops::add_assign(&mut s.v[t * kvd..(t + 1) * kvd], b);
            }
            let pos = *n_past + t;
            rope(c, *theta_scale, pos, &mut s.q[t * qd..(t + 1) * qd]);
            rope(c, *theta_scale, pos, &mut s.k[t * kvd..(t + 1) * kvd]);
        }
        // llama.cpp keeps K and V in f16 and rounds q to f16 for the K·q products; rounding to
        // f16 here (storage stays f32) reproduces its numerics without conversions in the hot loop.
        round_to_f16(&mut s.q[..n * qd]);
        round_to_f16(&mut s.k[..n * kvd]);
        round_to_f16(&mut s.v[..n * kvd]);
        let p0 = *n_past * kvd;
        kv.k[l][p0..p0 + n * kvd].copy_from_slice(&s.k[..n * kvd]);
        kv.v[l][p0..p0 + n * kvd].copy_from_slice(&s.v[..n * kvd]);
        attention(pool, c, &s.q[..n * qd], &kv.k[l], &kv.v[l], *n_past, n, &mut s.scores, &mut s.att[..n * qd]);
    }

    fn output_head(&mut self, n: usize, n_logits: usize) {
        let Engine { model, pool, s, sparse_head, head_scores, head_scratch, active, stats, .. } = self;
        let c = &model.config;
        let e = c.n_embd;
        let first = n - n_logits;
        rms_norm_rows(pool, &s.x[first * e..n * e], &model.output_norm, c.rms_eps, &mut s.h[..n_logits * e], e);
        if *sparse_head > 0.0 {
            // Input-channel Top-K on the output head (`--sparse-head R`).
            let k = e - ((*sparse_head as f64 * e as f64).round() as usize).min(e);
            for row in s.h[..n_logits * e].chunks_exact_mut(e) {
                head_scores.clear();
                head_scores.extend(row.iter().map(|v| v.abs()));
                top_k_indices(head_scores, k, head_scratch, active);
                let mut next = active.iter().peekable();
                for (j, v) in row.iter_mut().enumerate() {
                    if next.peek().is_some_and(|&&a| a as usize == j) {
                        next.next();
                    } else {
                        *v = 0.0;
                    }
                }
                stats.head_active += k as u64;
                stats.head_visits += 1;
            }
        } else {
            stats.head_active += (n_logits * e) as u64;
            stats.head_visits += n_logits as u64;
        }
        quantize_for(pool, &mut s.acts, &[&model.output], &s.h, e, n_logits);
        let nv = c.n_vocab;
        if s.logits.len() < n_logits * nv {
            s.logits.resize(n_logits * nv, 0.0);
        }
        matmul_many(
            pool,
            model.file.bytes(),
            &s.acts,
            n_logits,
            &mut [MatJob { w: &model.output, out: &mut s.logits[..n_logits * nv], stride: nv }],
        );
    }
}

/// Scratch buffers a site's activation lives in.
#[derive(Clone, Copy)]
enum Buf {
    H,
    Att,
    G,
}

/// Rounds every value to the nearest f16 (kept as f32).
/// The process's resident set (VmRSS) in bytes, where /proc tells it.
pub fn current_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn round_to_f16(x: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let mut buf = [half::f16::ZERO; 256];
    for c in x.chunks_mut(256) {
        let b = &mut buf[..c.len()];
        b.convert_from_f32_slice(c);
        b.convert_to_f32_slice(c);
    }
}

/// RMS-normalises each of the rows of `x` (row length `e`) into `out`.
fn rms_norm_rows(pool: &ThreadPool, x: &[f32], w: &[f32], eps: f32, out: &mut [f32], e: usize) {
    let n = x.len() / e;
    if n == 1 {
        vecops::rms_norm(x, w, eps, &mut out[..e]);
        return;
    }
    let sm = SharedMut::new(out);
    pool.run(&|tid, nth| {
        for t in split(n, nth, tid) {
            // SAFETY: each row is written by one thread.
            let o = unsafe { sm.slice(t * e..(t + 1) * e) };
            vecops::rms_norm(&x[t * e..(t + 1) * e], w, eps, o);
        }
    });
}

/// Quantizes `n` rows of `x` into every activation format the given weights need.
fn quantize_for(pool: &ThreadPool, acts: &mut QuantActs, ws: &[&QTensor], x: &[f32], cols: usize, n: usize) {
    acts.clear();
    let mut done: Vec<sift_quant::ActType> = Vec::with_capacity(2);
    for w in ws {
        let ty = w.ty.act_type();
        if !done.contains(&ty) {
            acts.quantize(pool, ty, x, cols, n);
            done.push(ty);
        }
    }
}

/// Rotates the q or k vectors of one token (all heads) by position `pos`, as ggml_rope does.
fn rope(c: &Config, theta_scale: f32, pos: usize, x: &mut [f32]) {
    let hd = c.head_dim;
    let half = c.rope_dim / 2;
    for head in x.chunks_exact_mut(hd) {
        let mut theta = pos as f32;
        for i in 0..half {
            let (sin, cos) = theta.sin_cos();
            let (a, b) = match c.rope_style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
            theta *= theta_scale;
        }
    }
}

/// Causal multi-head attention with grouped KV heads for `n` new tokens after `n_past` cached.
#[allow(clippy::too_many_arguments)]
fn attention(
    pool: &ThreadPool,
    c: &Config,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_past: usize,
    n: usize,
    scores: &mut [Vec<f32>],
    out: &mut [f32],
) {
    let (hd, nh, kvd) = (c.head_dim, c.n_head, c.n_embd_kv());
    let group = c.n_head / c.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    let qd = nh * hd;
    let work = n * nh;
    let out_sm = SharedMut::new(out);
    let scores_sm = SharedMut::new(scores);
    pool.run(&|tid, nth| {
        // SAFETY: each thread uses only its own score row.
        let sc = unsafe { &mut scores_sm.slice(tid..tid + 1)[0] };
        for w in split(work, nth, tid) {
            let (t, h) = (w / nh, w % nh);
            let kvh = h / group;
            let len = n_past + t + 1;
            let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
            let s = &mut sc[..len];
            for (p, sp) in s.iter_mut().enumerate() {
                let kp = &k[p * kvd + kvh * hd..p * kvd + (kvh + 1) * hd];
                *sp = vecops::dot(qh, kp) * scale;
            }
            vecops::softmax(s);
            round_to_f16(s);
            // SAFETY: the (token, head) output slice belongs to this work item only.
            let o = unsafe { out_sm.slice(t * qd + h * hd..t * qd + (h + 1) * hd) };
            o.fill(0.0);
            for (p, &sp) in s.iter().enumerate() {
                vecops::axpy(sp, &v[p * kvd + kvh * hd..p * kvd + (kvh + 1) * hd], o);
            }
        }
    });
}
