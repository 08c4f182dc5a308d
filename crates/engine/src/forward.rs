//! The dense forward pass: engine → layer → op → kernel.
//!
//! [`Engine::eval`] takes a batch of tokens, appends their keys and values to the KV cache and
//! returns logits. Prompts run as batches (GEMM-like: each weight row is read once per batch),
//! generation one token at a time (GEMV). All products go through [`crate::matmul`].

use crate::matmul::{matmul_many, MatJob, QuantActs};
use crate::pool::{split, SharedMut, ThreadPool};
use crate::vecops;
use sift_model::{Config, LayerWeights, Model, QTensor, RopeStyle};

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
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { n_threads: default_threads(), n_ctx: 4096, n_batch: 512 }
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
        Engine { model, pool, kv, s, n_ctx, n_batch: b, n_past: 0, theta_scale }
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

    /// Forgets everything after the first `n` tokens (a new conversation: `truncate(0)`).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    /// Evaluates `tokens` after the cached ones and returns logits: `n_vocab` values for
    /// [`Logits::Last`], `tokens.len() * n_vocab` for [`Logits::All`].
    pub fn eval(&mut self, tokens: &[u32], want: Logits) -> Result<&[f32], EvalError> {
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
        let n_vocab = c.n_vocab;
        let mut all = Vec::new();
        if want == Logits::All {
            all.reserve(tokens.len() * n_vocab);
        }
        let n_batches = tokens.len().div_ceil(self.n_batch);
        for (i, batch) in tokens.chunks(self.n_batch).enumerate() {
            let last = i + 1 == n_batches;
            let rows = match want {
                Logits::All => batch.len(),
                Logits::Last if last => 1,
                Logits::Last => 0,
            };
            self.forward_batch(batch, rows);
            if want == Logits::All {
                all.extend_from_slice(&self.s.logits[..rows * n_vocab]);
            }
        }
        if want == Logits::All {
            self.s.logits = all;
        }
        let n = if want == Logits::All { tokens.len() } else { 1 };
        Ok(&self.s.logits[..n * n_vocab])
    }

    /// Runs one batch through every layer; leaves logits of the last `n_logits` tokens in `s.logits`.
    fn forward_batch(&mut self, tokens: &[u32], n_logits: usize) {
        let n = tokens.len();
        let e = self.model.config.n_embd;
        // Embedding lookup: dequantize one row per token.
        for (t, &id) in tokens.iter().enumerate() {
            let row = self.model.row(&self.model.tok_embd, id as usize);
            self.model.tok_embd.ty.dequantize_row(row, &mut self.s.x[t * e..(t + 1) * e]);
        }
        for l in 0..self.model.layers.len() {
            self.layer(l, n);
        }
        self.n_past += n;
        if n_logits > 0 {
            self.output_head(n, n_logits);
        }
    }

    fn layer(&mut self, l: usize, n: usize) {
        let Engine { model, pool, kv, s, n_past, theta_scale, .. } = self;
        let c = &model.config;
        let lw: &LayerWeights = &model.layers[l];
        let file = model.file.bytes();
        let (e, qd, kvd, ff) = (c.n_embd, c.n_embd_q(), c.n_embd_kv(), c.n_ff);

        // Attention block.
        rms_norm_rows(pool, &s.x[..n * e], &lw.attn_norm, c.rms_eps, &mut s.h[..n * e], e);
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
        quantize_for(pool, &mut s.acts, &[&lw.wo], &s.att, qd, n);
        matmul_many(pool, file, &s.acts, n, &mut [MatJob { w: &lw.wo, out: &mut s.o[..n * e], stride: e }]);
        vecops::add_assign(&mut s.x[..n * e], &s.o[..n * e]);

        // Feed-forward block (SwiGLU).
        rms_norm_rows(pool, &s.x[..n * e], &lw.ffn_norm, c.rms_eps, &mut s.h[..n * e], e);
        quantize_for(pool, &mut s.acts, &[&lw.w_gate, &lw.w_up], &s.h, e, n);
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
        vecops::silu_mul(&mut s.g[..n * ff], &s.u[..n * ff]);
        quantize_for(pool, &mut s.acts, &[&lw.w_down], &s.g, ff, n);
        matmul_many(pool, file, &s.acts, n, &mut [MatJob { w: &lw.w_down, out: &mut s.o[..n * e], stride: e }]);
        vecops::add_assign(&mut s.x[..n * e], &s.o[..n * e]);
    }

    fn output_head(&mut self, n: usize, n_logits: usize) {
        let Engine { model, pool, s, .. } = self;
        let c = &model.config;
        let e = c.n_embd;
        let first = n - n_logits;
        rms_norm_rows(pool, &s.x[first * e..n * e], &model.output_norm, c.rms_eps, &mut s.h[..n_logits * e], e);
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

/// Rounds every value to the nearest f16 (kept as f32).
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
