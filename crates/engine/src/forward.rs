//! The forward pass: engine → layer → site → (selector, weight source, kernel).
//!
//! [`Engine::eval`] takes a batch of tokens, appends their keys and values to the KV cache and
//! returns logits. Prompts run as batches (GEMM-like: each weight row is read once per batch),
//! generation one token at a time (GEMV). A layer has four selection sites (`Site`); at each the
//! selector picks the active inputs ([`Engine::select_and_mask`]), the [`WeightSource`] says where
//! the site's weights are ([`SiteWeights`]), and [`Engine::project`] runs the matching kernels:
//! the dense products of [`crate::matmul`] or the column products of [`crate::sparse`].

mod budget;
mod gate_first;
mod hybrid;
mod parts;
mod settings;
mod slots;
mod sparse_block;

use crate::attention::{attention, rope, round_to_f16, AttnScratch};
use crate::budget::{current_rss, BudgetChange, BudgetHandle, LiveBudget};
use crate::gpu::{GpuLayers, GpuWay};
use crate::kv::{KvCache, KvType, KV_PAGE};
use crate::matmul::{matmul_many, matmul_rows, MatJob, QuantActs};
pub use crate::options::{default_threads, EngineOptions};
use crate::pool::ThreadPool;
use crate::prefill::{FastForward, PREFILL_BLOCK};
pub use crate::slots::Logits;
use crate::slots::SlotRun;
use crate::source::{MappedColumns, MappedRows, SiteWeights, TieredSource, WeightSource};
use crate::sparse::{column_matmul_batch, column_matmul_part, tensor_job, ColJob};
use crate::trace::{SparsityStats, Tracer};
use crate::vecops::{self, rms_norm_rows};
pub use parts::FfnObserver;
pub(crate) use parts::{GpuTier, Sparsity, Spent, Watchers};
use sift_model::{Config, LayerWeights, Model, QTensor};
use sift_sparsity::{top_k_indices, DenseSelector, Phase, Selection, Selector, Site, SiteDims};
use sift_store::tiered::{MemoryPlan, TierError, TieredStore};

/// Errors from evaluating tokens.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("context is full: {n_past} + {n_new} tokens exceed the context size {n_ctx}; raise -c (up to the model's {n_ctx_train}) or shorten the prompt")]
    ContextFull { n_past: usize, n_new: usize, n_ctx: usize, n_ctx_train: usize },
    #[error("token id {id} is outside the vocabulary (size {n_vocab})")]
    BadToken { id: u32, n_vocab: usize },
    #[error("nothing to evaluate: the token list is empty")]
    Empty,
    #[error(
        "the KV cache for {positions} tokens ({kv_mib:.1} MiB with -ctk {k_type} -ctv {v_type}) does not fit the memory budget: {reason}; raise --memory, use -ctk q8_0 -ctv q8_0, or keep conversations shorter"
    )]
    KvBudget { positions: usize, kv_mib: f64, k_type: KvType, v_type: KvType, reason: String },
    #[error(transparent)]
    Store(#[from] TierError),
    #[error("GPU: {0}")]
    Gpu(#[from] sift_gpu::GpuError),
    #[error("the model computed non-finite values (NaN or infinity) in {where_} for tokens {first}..{end}: its weights are damaged or out of range (check the file with `sift inspect`, or fetch it again){}", if *lora { "; LoRA adapters are attached (--lora): run without them to tell which file" } else { "" })]
    NonFinite { where_: String, first: usize, end: usize, lora: bool },
}

/// Whether every value is finite (NaN and infinities make `v · 0` NaN; one vectorized pass).
pub(crate) fn all_finite(x: &[f32]) -> bool {
    x.iter().fold(0f32, |a, &v| a + v * 0.0) == 0.0
}

/// Per-batch working memory, sized for `n_batch` tokens.
pub(crate) struct Scratch {
    pub(crate) x: Vec<f32>,
    pub(crate) h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    pub(crate) o: Vec<f32>,
    pub(crate) g: Vec<f32>,
    pub(crate) u: Vec<f32>,
    /// Attention's tiles and softmax state, per worker thread.
    attn: AttnScratch,
    pub(crate) acts: QuantActs,
    logits: Vec<f32>,
    /// A single token's active units at the current site (ascending), and the mask built from them.
    pub(crate) active: Vec<u32>,
    keep: Vec<bool>,
    /// The store's cache state at the current site, for cache-aware selectors (DIP-CA).
    cached: Vec<bool>,
    /// Column products: the active inputs' values and the per-piece accumulators.
    coef: Vec<f32>,
    col_acc: Vec<f32>,
    /// The sparse output head's scores and selection scratch.
    head_scores: Vec<f32>,
    head_scratch: Vec<u32>,
}

impl Scratch {
    /// A site's input (`n` rows) and its ops' outputs (`n` rows each, in [`Site::ops`] order).
    pub(crate) fn site_io(&mut self, c: &Config, site: Site, n: usize) -> (&[f32], Vec<&mut [f32]>) {
        let (e, qd, kvd, ff) = (c.n_embd, c.n_embd_q(), c.n_embd_kv(), c.n_ff);
        let Scratch { h, att, g, u, q, k, v, o, .. } = self;
        match site {
            Site::AttnIn => (&h[..n * e], vec![&mut q[..n * qd], &mut k[..n * kvd], &mut v[..n * kvd]]),
            Site::AttnOut => (&att[..n * qd], vec![&mut o[..n * e]]),
            Site::FfnIn => (&h[..n * e], vec![&mut g[..n * ff], &mut u[..n * ff]]),
            Site::FfnMid => (&g[..n * ff], vec![&mut o[..n * e]]),
        }
    }

    /// Swaps token rows `a` and `b` of `site`'s input and outputs (a batch computed a row at a
    /// time computes each row in row 0, [`Engine::eval_slots`]).
    pub(crate) fn swap_site_rows(&mut self, c: &Config, site: Site, a: usize, b: usize) {
        let (e, qd, kvd, ff) = (c.n_embd, c.n_embd_q(), c.n_embd_kv(), c.n_ff);
        let Scratch { h, att, g, u, q, k, v, o, .. } = self;
        let bufs: Vec<(&mut Vec<f32>, usize)> = match site {
            Site::AttnIn => vec![(h, e), (q, qd), (k, kvd), (v, kvd)],
            Site::AttnOut => vec![(att, qd), (o, e)],
            Site::FfnIn => vec![(h, e), (g, ff), (u, ff)],
            Site::FfnMid => vec![(g, ff), (o, e)],
        };
        let (lo, hi) = (a.min(b), a.max(b));
        if lo == hi {
            return;
        }
        for (buf, w) in bufs {
            let (x, y) = buf.split_at_mut(hi * w);
            x[lo * w..(lo + 1) * w].swap_with_slice(&mut y[..w]);
        }
    }
}

/// How one forward batch runs, chosen once before its layers by [`Engine::exec_plan`] rather
/// than tested at every site: for each layer that runs here, its attention, FFN step, products
/// and rows; and how the GPU runs the layers it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ExecPlan {
    /// The layers that run here, from the first (when the GPU holds whole layers, the rest run
    /// there).
    pub layers: Vec<LayerPlan>,
    /// How the GPU runs its layers in this batch (none without GPU layers).
    pub gpu: Option<GpuWay>,
}

/// How one layer runs in a batch (see [`ExecPlan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LayerPlan {
    pub attention: AttentionStep,
    pub ffn: FfnStep,
    pub products: Products,
    pub rows: RowMode,
}

/// How a layer's attention half runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttentionStep {
    /// The norm, the q/k/v site, attention over the KV cache and the output site, here.
    Sites,
    /// On the GPU (KAIROX's placement): the residual after it and the FFN's norm come back.
    Gpu,
}

/// What a layer's FFN does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FfnStep {
    /// Gate and up at the FFN input site, SiLU·up, down at the GLU site (each site as the
    /// selector and the weight source say).
    Sites,
    /// FastForward's sparse prompt block: the chosen neurons' rows and columns only
    /// ([`crate::prefill`]).
    SparseBlock,
    /// CATS' gate first: the gate product for every neuron, the selector's neurons on
    /// `act(gate)`, then up and down for those neurons only ([`Engine::ffn_gate_first`]).
    GateFirst,
}

/// Where a layer's site products are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Products {
    /// On the CPU, from the weight source.
    Cpu,
    /// On the GPU, which holds the layer (op by op).
    Gpu,
    /// A lone token's sparse FFN sites shared between the GPU's column pools and the CPU
    /// (KAIROX's hybrid tier); everything else on the CPU.
    Hybrid,
}

/// How a batch's rows run a site's products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowMode {
    /// All rows in one product (dense kernels on rows give each row the same bits).
    Together,
    /// One row at a time, each as a lone token (its own active columns; [`Engine::eval_slots`]'s
    /// row-by-row mode): the rows read as lone tokens at each layer's start.
    OneAtATime,
}

/// A model ready to run: weights and where they come from, KV cache, threads, selector, scratch.
pub struct Engine {
    pub model: Model,
    /// The workers, with `-t`, `-tb` and `--poll`.
    pub(crate) pool: ThreadPool,
    /// Where each site's weights come from (GGUF rows, pack columns, the tiered store).
    pub(crate) source: Box<dyn WeightSource>,
    /// The sparsity method: the selector, the phase it selects for, the head's ratio, and what
    /// it has measured.
    pub(crate) sparsity: Sparsity,
    pub(crate) s: Scratch,
    pub(crate) n_batch: usize,
    /// What watches the forward pass: `sift trace`'s tracer, `sift train`'s FFN observer.
    pub(crate) watch: Watchers,
    budget: LiveBudget,
    /// FastForward's block-wise sparse prefill: its settings, trained parts and working memory.
    pub(crate) prefill: FastForward,
    /// The GPU tier: whole layers or attention on the GPU, KAIROX's hybrid decode.
    pub(crate) gpu: GpuTier,
    /// LoRA adapters added as side products on each op's masked input (`--lora`).
    pub(crate) lora: Option<std::sync::Arc<crate::lora::LoraAdapters>>,
    /// The sequences: the one in use (its KV cache, position and context) and the parked ones.
    pub(crate) seq: crate::slots::Sequences,
}

/// Helper spins before parking when a tiered store is attached (~50 µs).
const TIERED_SPIN: u32 = 1 << 10;

impl Engine {
    pub fn new(model: Model, opts: &EngineOptions) -> Engine {
        let c = model.config.clone();
        let n_ctx = if opts.n_ctx == 0 { c.n_ctx_train } else { opts.n_ctx };
        let b = opts.n_batch.max(1);
        let mut pool = ThreadPool::new(opts.max_threads());
        pool.set_poll(opts.poll);
        pool.set_step_threads(opts.n_threads.max(1), opts.threads_batch());
        // A type this model's heads cannot use (q8_0 needs whole blocks of 32) falls back to f16;
        // the session refuses it with a message first.
        let usable = |t: KvType| if t.check_head_dim(c.head_dim).is_ok() { t } else { KvType::F16 };
        let kv_types = (usable(opts.cache_type_k), usable(opts.cache_type_v));
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
            attn: AttnScratch::default(),
            acts: QuantActs::new(),
            logits: Vec::new(),
            active: Vec::new(),
            keep: Vec::new(),
            cached: Vec::new(),
            coef: Vec::new(),
            col_acc: Vec::new(),
            head_scores: Vec::new(),
            head_scratch: Vec::new(),
        };
        let source: Box<dyn WeightSource> = match MappedColumns::new(&model, opts.all_columns) {
            Some(cols) if opts.column_kernels => Box::new(cols),
            _ => Box::new(MappedRows { row_gather: opts.column_kernels }),
        };
        let stats = SparsityStats { units: SiteDims::of(&c).units.map(|u| u as u64), ..Default::default() };
        let mut kv = KvCache::new(&c, kv_types.0, kv_types.1);
        kv.set_capacity(KV_PAGE.min(n_ctx));
        Engine {
            model,
            pool,
            source,
            sparsity: Sparsity {
                selector: Box::new(DenseSelector),
                phase: Phase::Prompt,
                head_ratio: opts.sparse_head.clamp(0.0, 0.99),
                stats,
            },
            s,
            n_batch: b,
            watch: Watchers::default(),
            budget: LiveBudget::default(),
            prefill: FastForward::new(opts.prefill_sparsity, opts.prefill_masks),
            gpu: GpuTier::default(),
            lora: None,
            seq: crate::slots::Sequences::new(kv, n_ctx),
        }
    }

    /// Evaluates `tokens` after the cached ones and returns logits: `n_vocab` values for
    /// [`Logits::Last`], `tokens.len() * n_vocab` for [`Logits::All`]. A batch of more than one
    /// token counts as prompt ([`Phase::Prompt`]), a single token as generation.
    pub fn eval(&mut self, tokens: &[u32], want: Logits) -> Result<&[f32], EvalError> {
        let run = SlotRun { slot: self.current_slot(), tokens, logits: want, prompt_end: None };
        self.decode(&[run], None)
    }

    /// [`Engine::eval`] with an explicit phase: selectors that fix their choice at prefill
    /// (core neurons) observe [`Phase::Prompt`] tokens and apply their set to [`Phase::Generate`]
    /// ones, however many arrive at once (perplexity scores a window's second half as a batch).
    /// On an error nothing of the batch stays in the KV cache.
    pub fn eval_phase(&mut self, tokens: &[u32], want: Logits, phase: Phase) -> Result<&[f32], EvalError> {
        let run = SlotRun { slot: self.current_slot(), tokens, logits: want, prompt_end: None };
        self.decode(&[run], Some(phase))
    }

    /// [`Engine::eval_phase`] for a part of a prompt that ends at position `prompt_end` (a
    /// prompt read in chunks, as the server reads it): sparse prefill's blocks lie on the grid
    /// of positions either way ([`crate::prefill::prompt_blocks`]), and its last dense block is
    /// the prompt's, not the chunk's, so the chunks compute what the whole prompt computes in
    /// one call.
    pub fn eval_prompt_part(&mut self, tokens: &[u32], want: Logits, prompt_end: usize) -> Result<&[f32], EvalError> {
        let run = SlotRun { slot: self.current_slot(), tokens, logits: want, prompt_end: Some(prompt_end) };
        self.decode(&[run], Some(Phase::Prompt))
    }

    /// Whether prompts run in sparse blocks (`--prefill-sparsity`, and a batch size that holds a
    /// block).
    pub fn sparse_prefill(&self) -> bool {
        self.prefill.ratio > 0.0 && self.n_batch >= PREFILL_BLOCK
    }

    /// One run of the sequence in use, as [`Engine::decode`] gives it: checked, its KV pages
    /// reserved, cut into the batches its phase asks for (the prompt's sparse blocks, or
    /// `n_batch` tokens), each batch through the layers with its [`ExecPlan`].
    pub(crate) fn run_one(
        &mut self,
        tokens: &[u32],
        want: Logits,
        phase: Phase,
        prompt_end: Option<usize>,
    ) -> Result<&[f32], EvalError> {
        self.check_tokens(tokens)?;
        if self.seq.n_past + tokens.len() > self.seq.n_ctx {
            return Err(EvalError::ContextFull {
                n_past: self.seq.n_past,
                n_new: tokens.len(),
                n_ctx: self.seq.n_ctx,
                n_ctx_train: self.model.config.n_ctx_train,
            });
        }
        self.apply_budget_request();
        self.reserve_kv(self.seq.n_past + tokens.len())?;
        let n_vocab = self.model.config.n_vocab;
        let mut all = Vec::new();
        if want == Logits::All {
            all.reserve(tokens.len() * n_vocab);
        }
        // The batches: with sparse prefill, the prompt's blocks on the grid of positions (each
        // at most a block: the batch size holds one); else `n_batch` tokens at a time.
        let (start, end) = (self.seq.n_past, self.seq.n_past + tokens.len());
        let pieces: Vec<(std::ops::Range<usize>, bool)> = if self.sparse_prefill() && phase == Phase::Prompt {
            let blocks = crate::prefill::prompt_blocks(start, end, prompt_end.unwrap_or(end).max(end));
            blocks.into_iter().map(|(r, sparse)| (r.start - start..r.end - start, sparse && r.len() > 1)).collect()
        } else {
            (0..tokens.len()).step_by(self.n_batch).map(|i| (i..(i + self.n_batch).min(tokens.len()), false)).collect()
        };
        let n_batches = pieces.len();
        self.sparsity.begin_batch(phase);
        let n_past0 = self.seq.n_past;
        for (i, (range, sparse)) in pieces.into_iter().enumerate() {
            let batch = &tokens[range];
            let rows = match want {
                Logits::All => batch.len(),
                Logits::Last if i + 1 == n_batches => 1,
                Logits::Last | Logits::None => 0,
            };
            let ffn = if sparse { FfnStep::SparseBlock } else { FfnStep::Sites };
            let plan = self.exec_plan(ffn, RowMode::Together);
            let r = self.forward_batch(batch, rows, &plan);
            if let Err(e) = r {
                // The batch's KV entries are garbage: forget them, return no logits.
                self.seq.n_past = n_past0;
                self.sparsity.end_batch();
                return Err(e);
            }
            if want == Logits::All {
                all.extend_from_slice(&self.s.logits[..rows * n_vocab]);
            }
        }
        self.sparsity.end_batch();
        if want == Logits::All {
            self.s.logits = all;
        }
        let n = match want {
            Logits::All => tokens.len(),
            Logits::Last => 1,
            Logits::None => 0,
        };
        Ok(&self.s.logits[..n * n_vocab])
    }

    pub(crate) fn check_tokens(&self, tokens: &[u32]) -> Result<(), EvalError> {
        let n_vocab = self.model.config.n_vocab;
        match tokens.iter().find(|&&t| t as usize >= n_vocab) {
            _ if tokens.is_empty() => Err(EvalError::Empty),
            Some(&id) => Err(EvalError::BadToken { id, n_vocab }),
            None => Ok(()),
        }
    }

    /// Embedding lookup: one dequantized row per token into `s.x`.
    pub(crate) fn embed(&mut self, tokens: &[u32]) -> Result<(), EvalError> {
        let e = self.model.config.n_embd;
        for (t, &id) in tokens.iter().enumerate() {
            self.source.embed(&self.model, id, &mut self.s.x[t * e..(t + 1) * e])?;
        }
        Ok(())
    }

    /// Whether a tracer or an FFN observer watches each token.
    pub(crate) fn watched(&self) -> bool {
        self.watch.tracer.is_some() || self.watch.ffn.is_some()
    }

    /// Before a batch of several sequences' `n` tokens ([`Engine::eval_slots`]).
    pub(crate) fn begin_slots_batch(&mut self, phase: Phase, n: usize) {
        self.pool.for_tokens(n);
        self.sparsity.begin_batch(phase);
    }

    pub(crate) fn end_slots_batch(&mut self) {
        self.sparsity.end_batch();
    }

    /// The logits [`Engine::output_head`] left for `k` tokens.
    pub(crate) fn head_logits(&self, k: usize) -> &[f32] {
        &self.s.logits[..k * self.model.config.n_vocab]
    }

    /// Runs one batch through every layer as `plan` says; leaves logits of the last `n_logits`
    /// tokens in `s.logits`.
    fn forward_batch(&mut self, tokens: &[u32], n_logits: usize, plan: &ExecPlan) -> Result<(), EvalError> {
        let n = tokens.len();
        self.pool.for_tokens(n);
        self.watch.batch(self.seq.n_past, n);
        self.embed(tokens)?;
        let n_layer = self.model.layers.len();
        let cpu_layers = plan.layers.len();
        if let (Some(g), Some(way)) = (&mut self.gpu.layers, plan.gpu) {
            g.begin_batch(way, self.seq.n_past, n)?;
        }
        let e = self.model.config.n_embd;
        let lora = self.lora.is_some();
        let non_finite =
            |where_: String, n_past: usize| EvalError::NonFinite { where_, first: n_past, end: n_past + n, lora };
        for (l, &way) in plan.layers.iter().enumerate() {
            self.layer(l, n, way)?;
            // A damaged model must not pass silently (NaN logits would read as end of text).
            if !all_finite(&self.s.x[..n * e]) {
                return Err(non_finite(format!("layer {l}"), self.seq.n_past));
            }
        }
        let mut logits_done = false;
        if cpu_layers < n_layer {
            // The held layers as whole layers on the GPU, the head too when it holds it.
            let nv = self.model.config.n_vocab;
            let gpu = self.gpu.layers.as_mut().expect("whole layers need the GPU");
            let head = n_logits > 0 && gpu.holds_output() && self.sparsity.head_ratio == 0.0;
            if head && self.s.logits.len() < n_logits * nv {
                self.s.logits.resize(n_logits * nv, 0.0);
            }
            let logits = if head { Some((n_logits, &mut self.s.logits[..n_logits * nv])) } else { None };
            gpu.run_layers(&mut self.s.x[..n * e], n, self.seq.n_past, logits)?;
            logits_done = head;
            if !all_finite(&self.s.x[..n * e]) {
                return Err(non_finite(format!("the GPU's layers {cpu_layers}..{n_layer}"), self.seq.n_past));
            }
        }
        if n_logits > 0 && !logits_done {
            let t = std::time::Instant::now();
            self.output_head(n, n_logits)?;
            self.gpu.spent(Spent::Head, n, t);
        }
        if n_logits > 0 && !all_finite(&self.s.logits[..n_logits * self.model.config.n_vocab]) {
            return Err(non_finite("the output head".into(), self.seq.n_past));
        }
        self.seq.n_past += n;
        Ok(())
    }

    /// The plan of a batch whose FFN runs `ffn` and whose rows run `rows`: what each layer does
    /// here, given the GPU tier, the watchers and the selector.
    pub(crate) fn exec_plan(&self, ffn: FfnStep, rows: RowMode) -> ExecPlan {
        let n_layer = self.model.layers.len();
        let gpu = self.gpu.layers.as_ref().map(|g| {
            // Whole layers when nothing asks at each site (dense selector, no watcher, no
            // sparse prefill) and the kernels take the model.
            let whole =
                g.whole_layers() && self.sparsity.selector.is_dense() && !self.watched() && self.prefill.ratio == 0.0;
            match () {
                _ if g.attention_only() => GpuWay::Attention,
                _ if whole => GpuWay::WholeLayers,
                _ => GpuWay::OpByOp,
            }
        });
        let here = match (&self.gpu.layers, gpu) {
            (Some(g), Some(GpuWay::WholeLayers)) => g.first_layer(),
            _ => n_layer,
        };
        ExecPlan { layers: (0..here).map(|l| self.layer_plan(l, ffn, rows)).collect(), gpu }
    }

    /// How layer `l` runs here in a batch whose FFN runs `ffn` and whose rows run `rows`.
    pub(crate) fn layer_plan(&self, l: usize, ffn: FfnStep, rows: RowMode) -> LayerPlan {
        let gpu = self.gpu.layers.as_ref();
        let held = gpu.is_some_and(|g| g.holds(l));
        LayerPlan {
            attention: match gpu.is_some_and(|g| g.attention_only()) {
                true => AttentionStep::Gpu,
                false => AttentionStep::Sites,
            },
            ffn: match ffn {
                // A sparse prompt block where the layer runs here and no observer needs the
                // dense GLU.
                FfnStep::SparseBlock if !held && self.watch.ffn.is_none() => FfnStep::SparseBlock,
                _ if self.sparsity.selector.gate_first() => FfnStep::GateFirst,
                _ => FfnStep::Sites,
            },
            products: match () {
                _ if held => Products::Gpu,
                _ if self.gpu.hybrid.is_some() => Products::Hybrid,
                _ => Products::Cpu,
            },
            rows,
        }
    }

    /// One transformer block: attention, then the SwiGLU feed-forward, each added to the residual;
    /// how its parts run is the batch's plan for the layer.
    pub(crate) fn layer(&mut self, l: usize, n: usize, way: LayerPlan) -> Result<(), EvalError> {
        let c = &self.model.config;
        let (e, ff, eps) = (c.n_embd, c.n_ff, c.rms_eps);
        self.watch.layer(l, n, &self.s.x[..e]);
        // A batch computed a token at a time reads as lone tokens (the first one's residual
        // guides the store's preloading).
        let n_read = match way.rows {
            RowMode::Together => n,
            RowMode::OneAtATime => 1,
        };
        self.source.begin_layer(&self.model, l, n_read, &self.s.x[..e])?;
        let t = std::time::Instant::now();
        match way.attention {
            AttentionStep::Gpu => {
                let gpu = self.gpu.layers.as_mut().expect("the plan puts attention on the GPU");
                gpu.run_attention(l, &mut self.s.x[..n * e], &mut self.s.h[..n * e], n, self.seq.n_past)?;
                self.gpu.spent(Spent::GpuAttention, n, t);
            }
            AttentionStep::Sites => {
                let Engine { model, pool, s, .. } = self;
                rms_norm_rows(pool, &s.x[..n * e], &model.layers[l].attn_norm, eps, &mut s.h[..n * e], e);
                self.site(l, n, Site::AttnIn, way)?;
                self.attention_core(l, n);
                self.site(l, n, Site::AttnOut, way)?;
                vecops::add_assign(&mut self.s.x[..n * e], &self.s.o[..n * e]);
                let Engine { model, pool, s, .. } = self;
                rms_norm_rows(pool, &s.x[..n * e], &model.layers[l].ffn_norm, eps, &mut s.h[..n * e], e);
                self.gpu.spent(Spent::CpuAttention, n, t);
            }
        }
        match way.ffn {
            // Under a memory budget too: its rows and columns come through the tiered store.
            FfnStep::SparseBlock => self.ffn_sparse_block(l, n)?,
            FfnStep::GateFirst => self.ffn_gate_first(l, n, way)?,
            FfnStep::Sites => {
                self.site(l, n, Site::FfnIn, way)?;
                vecops::silu_mul_rows(&self.pool, &mut self.s.g[..n * ff], &self.s.u[..n * ff]);
                self.watch.ffn(l, &self.s.h[..n * e], &self.s.g[..n * ff], n);
                self.site(l, n, Site::FfnMid, way)?;
            }
        }
        vecops::add_assign(&mut self.s.x[..n * e], &self.s.o[..n * e]);
        Ok(())
    }

    /// One selection site: choose the active inputs, run the site's products as the layer's
    /// plan says (for the batch's rows together, or one at a time), add the adapters' side
    /// products.
    pub(crate) fn site(&mut self, l: usize, n: usize, site: Site, way: LayerPlan) -> Result<(), EvalError> {
        if n > 1 && way.rows == RowMode::OneAtATime {
            return self.site_row_by_row(l, n, site, way);
        }
        let subset = self.select_and_mask(l, site, n);
        self.site_products(l, n, site, way, subset)
    }

    /// A site's products where the layer's plan puts them, on its (masked) input whose
    /// selection is `subset` (a lone token's, left in `s.active`), and the adapters' side
    /// products.
    pub(crate) fn site_products(
        &mut self,
        l: usize,
        n: usize,
        site: Site,
        way: LayerPlan,
        subset: bool,
    ) -> Result<(), EvalError> {
        match way.products {
            Products::Gpu => self.project_gpu(l, n, site)?,
            // (A subset is a lone token's.)
            Products::Hybrid if subset => self.project_hybrid(l, site)?,
            Products::Hybrid | Products::Cpu => self.project(l, n, site, subset)?,
        }
        self.add_adapters(l, site, n);
        Ok(())
    }

    /// A site's products on the dense (unmasked) input, without asking the selector.
    pub(crate) fn project_site(&mut self, l: usize, n: usize, site: Site) -> Result<(), EvalError> {
        match self.gpu.layers.as_ref().is_some_and(|g| g.holds(l)) {
            true => self.project_gpu(l, n, site),
            false => self.project(l, n, site, false),
        }
    }

    /// The LoRA adapters' side products on a site's (masked) input, added to its outputs.
    pub(crate) fn add_adapters(&mut self, l: usize, site: Site, n: usize) {
        if let Some(lora) = &self.lora {
            let (x, mut outs) = self.s.site_io(&self.model.config, site, n);
            lora.apply(l, site, x, n, &mut outs);
        }
    }

    /// Asks the selector for each of `n` token rows of `site`'s input and zeroes the inactive
    /// inputs: a skipped input channel contributes nothing, exactly as if its weight column were
    /// not read, so dense kernels on masked inputs compute what sparse column kernels compute
    /// (which is how quality is measured on any file). Returns whether a single token's selection
    /// is a subset, left in `s.active` for the column kernels.
    pub(crate) fn select_and_mask(&mut self, l: usize, site: Site, n: usize) -> bool {
        let Engine { model, sparsity, s, watch, source, gpu, .. } = self;
        let Sparsity { selector, phase, stats, .. } = sparsity;
        let hybrid = &mut gpu.hybrid;
        let prompt_pool = hybrid.as_ref().filter(|_| n > 1).and_then(|h| h.pool_of(l, site));
        // Under a budget a cache-aware selector sees the store's own cache, for every row.
        let live_cache = selector.wants_cache_state() && source.cached_mask(l, site, &mut s.cached);
        let c = &model.config;
        let Scratch { h, att, g, active, keep, cached, .. } = s;
        let x = match site {
            Site::AttnIn | Site::FfnIn => h,
            Site::AttnOut => att,
            Site::FfnMid => g,
        };
        let len = site.width(c);
        let i = site.index();
        let mut subset = false;
        for row in x[..n * len].chunks_exact_mut(len) {
            stats.visits[i] += 1;
            if live_cache {
                selector.observe_cache(l, site, cached);
            }
            let selection = selector.select(l, site, *phase, row, active);
            watch.site(l, site, n, row, (selection == Selection::Subset).then_some(&active[..]));
            subset = selection == Selection::Subset;
            if !subset {
                stats.active[i] += len as u64;
                continue;
            }
            stats.active[i] += active.len() as u64;
            if let (Some(p), Some(h)) = (prompt_pool, hybrid.as_mut()) {
                h.balancer.observe_prompt(p, active);
            }
            keep.clear();
            keep.resize(len, false);
            for &j in active.iter() {
                if let Some(k) = keep.get_mut(j as usize) {
                    *k = true;
                }
            }
            for (v, &k) in row.iter_mut().zip(keep.iter()) {
                // An unconditional store (a blend), not a branch per input.
                *v = if k { *v } else { 0.0 };
            }
        }
        subset && n == 1
    }

    /// The products of one site (q, k, v; o; gate and up; down) on the CPU, on whatever the
    /// weight source gives: dense kernels over (masked) inputs on rows, with the fixed FFN
    /// neurons' rows only when the source allows a row gather; column kernels over the active
    /// columns; or the batch column kernel over whole column tensors.
    pub(crate) fn project(&mut self, l: usize, n: usize, site: Site, subset: bool) -> Result<(), EvalError> {
        let Engine { model, pool, s, source, sparsity, .. } = self;
        let Sparsity { selector, phase, stats, .. } = sparsity;
        let c = &model.config;
        let (e, qd, kvd, ff) = (c.n_embd, c.n_embd_q(), c.n_embd_kv(), c.n_ff);
        let Scratch { h, att, g, u, q, k, v, o, acts, active, coef, col_acc, .. } = s;
        // The site's input (n rows of `width`) and one output per op.
        let (x, width, mut outs): (&[f32], usize, Vec<&mut [f32]>) = match site {
            Site::AttnIn => (&h[..n * e], e, vec![&mut q[..n * qd], &mut k[..n * kvd], &mut v[..n * kvd]]),
            Site::AttnOut => (&att[..n * qd], qd, vec![&mut o[..n * e]]),
            Site::FfnIn => (&h[..n * e], e, vec![&mut g[..n * ff], &mut u[..n * ff]]),
            Site::FfnMid => (&g[..n * ff], ff, vec![&mut o[..n * e]]),
        };
        // The source gives the site whole, or in parts computed one after the other.
        for part in 0.. {
            let Some(weights) = source.site(model, l, site, n, subset.then_some(&active[..]), part)? else {
                break;
            };
            match weights {
                SiteWeights::Rows { file, layer, gather } => {
                    let ws: Vec<&QTensor> = site.ops().iter().map(|&op| layer.op(op)).collect();
                    acts.quantize_for(pool, &ws, x, width, n);
                    let mut jobs: Vec<MatJob<'_>> = ws
                        .iter()
                        .zip(outs.iter_mut())
                        .map(|(&w, out)| MatJob { w, stride: out.len() / n, out })
                        .collect();
                    let fixed = match (gather, n, site) {
                        (true, 1, Site::FfnIn) => selector.fixed_neurons(l, *phase),
                        _ => None,
                    };
                    match fixed {
                        Some(rows) => matmul_rows(pool, file, acts, rows, &mut jobs),
                        None => matmul_many(pool, file, acts, n, &mut jobs),
                    }
                }
                SiteWeights::RowChunk { file, op, w, row0 } => {
                    if part == 0 {
                        let ws: Vec<&QTensor> = site.ops().iter().map(|&op| model.layers[l].op(op)).collect();
                        acts.quantize_for(pool, &ws, x, width, n);
                    }
                    let out = &mut *outs[op];
                    let stride = out.len() / n;
                    matmul_many(pool, file, acts, n, &mut [MatJob { w: &w, stride, out: &mut out[row0..] }]);
                }
                SiteWeights::Columns { units, parts } => {
                    coef.clear();
                    coef.extend(units.iter().map(|&j| x[j as usize]));
                    let mut jobs: Vec<ColJob<'_>> = parts
                        .into_iter()
                        .zip(outs.iter_mut())
                        .map(|(p, out)| ColJob { op: p.op, data: p.data, idx: p.idx, scales: p.scales, out })
                        .collect();
                    stats.column_bytes += jobs.iter().map(|j| j.op.bytes(units.len()) as u64).sum::<u64>();
                    column_matmul_part(pool, units, coef, &mut jobs, col_acc, part > 0);
                }
                SiteWeights::ColumnTensors { file, ops } => {
                    let mut jobs: Vec<ColJob<'_>> =
                        ops.iter().zip(outs.iter_mut()).map(|(op, out)| tensor_job(op, file, &[], out)).collect();
                    column_matmul_batch(pool, x, n, &mut jobs);
                }
            }
        }
        Ok(())
    }

    /// A site's products in a layer the GPU holds: dense over the (masked) input. A fixed neuron
    /// set needs no row gather here: the selector masks the other neurons at the down projection.
    pub(crate) fn project_gpu(&mut self, l: usize, n: usize, site: Site) -> Result<(), EvalError> {
        let Engine { model, s, gpu, .. } = self;
        let gpu = &mut gpu.layers;
        let (x, mut outs) = s.site_io(&model.config, site, n);
        let width = x.len() / n;
        gpu.as_mut().expect("called for held layers").project(l, site, x, width, n, &mut outs)?;
        Ok(())
    }

    /// Biases, RoPE, the KV cache append and attention over the projected q, k, v into `s.att`:
    /// the batch as one sequence, or, in a batch of several sequences ([`Engine::eval_slots`]),
    /// each sequence's rows over its own KV cache.
    fn attention_core(&mut self, l: usize, n: usize) {
        if self.seq.runs.is_empty() {
            return self.attention_rows(l, 0, n);
        }
        for i in 0..self.seq.runs.len() {
            let r = self.seq.runs[i];
            self.use_slot(r.slot);
            self.attention_rows(l, r.row0, r.len);
        }
    }

    /// [`Engine::attention_core`] for the `n` rows from `row0`, the next positions of the KV
    /// cache in use.
    fn attention_rows(&mut self, l: usize, row0: usize, n: usize) {
        let Engine { model, pool, seq, s, watch, .. } = self;
        let ffn_observer = &mut watch.ffn;
        let (kv, n_past) = (&mut seq.kv, &mut seq.n_past);
        let c = &model.config;
        let theta_scale = c.rope_theta_scale();
        let lw: &LayerWeights = &model.layers[l];
        let (qd, kvd) = (c.n_embd_q(), c.n_embd_kv());
        let (q_rows, k_rows) = (row0 * qd..(row0 + n) * qd, row0 * kvd..(row0 + n) * kvd);
        let observe = |s: &Scratch, o: &mut Option<Box<dyn FfnObserver>>| {
            if let Some(o) = o {
                o.attention(l, &s.q[q_rows.clone()], &s.k[k_rows.clone()], n, *n_past);
            }
        };
        for t in row0..row0 + n {
            let (q, k, v) =
                (&mut s.q[t * qd..(t + 1) * qd], &mut s.k[t * kvd..(t + 1) * kvd], &mut s.v[t * kvd..(t + 1) * kvd]);
            for (x, b) in [(&mut *q, &lw.bq), (&mut *k, &lw.bk), (&mut *v, &lw.bv)] {
                if let Some(b) = b {
                    vecops::add_assign(x, b);
                }
            }
            rope(c, theta_scale, *n_past + t - row0, q);
            rope(c, theta_scale, *n_past + t - row0, k);
        }
        observe(s, ffn_observer);
        // llama.cpp computes K·q in the keys' type: q is rounded to f16 for f16 keys (q8_0 keys
        // quantize it per head inside `attention`). Storing converts k and v to the cache's type.
        if kv.k_type == KvType::F16 {
            round_to_f16(&mut s.q[q_rows.clone()]);
        }
        kv.store(l, *n_past, &s.k[k_rows.clone()], &s.v[k_rows]);
        attention(pool, c, &s.q[q_rows.clone()], kv, l, *n_past, n, &mut s.attn, &mut s.att[q_rows]);
    }

    /// The final norm and the output head for the last `n_logits` of `n` tokens, into `s.logits`.
    pub(crate) fn output_head(&mut self, n: usize, n_logits: usize) -> Result<(), EvalError> {
        let Engine { model, pool, s, sparsity, gpu, .. } = self;
        let Sparsity { head_ratio, stats, .. } = sparsity;
        let gpu = &mut gpu.layers;
        let c = &model.config;
        let e = c.n_embd;
        let first = n - n_logits;
        rms_norm_rows(pool, &s.x[first * e..n * e], &model.output_norm, c.rms_eps, &mut s.h[..n_logits * e], e);
        if *head_ratio > 0.0 {
            // Input-channel Top-K on the output head (`--sparse-head R`).
            let k = e - ((*head_ratio as f64 * e as f64).round() as usize).min(e);
            for row in s.h[..n_logits * e].chunks_exact_mut(e) {
                s.head_scores.clear();
                s.head_scores.extend(row.iter().map(|v| v.abs()));
                top_k_indices(&s.head_scores, k, &mut s.head_scratch, &mut s.active);
                let mut next = s.active.iter().peekable();
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
        let nv = c.n_vocab;
        if s.logits.len() < n_logits * nv {
            s.logits.resize(n_logits * nv, 0.0);
        }
        if let Some(gpu) = gpu.as_mut().filter(|g| g.holds_output()) {
            gpu.output_head(&s.h[..n_logits * e], e, n_logits, &mut s.logits[..n_logits * nv])?;
            return Ok(());
        }
        s.acts.quantize_for(pool, &[&model.output], &s.h, e, n_logits);
        let job = MatJob { w: &model.output, out: &mut s.logits[..n_logits * nv], stride: nv };
        matmul_many(pool, model.file.bytes(), &s.acts, n_logits, &mut [job]);
        Ok(())
    }
}
