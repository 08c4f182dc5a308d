//! Attention: RoPE and causal grouped-query attention over the KV cache ([`crate::kv`]), tiled,
//! with an online softmax (FlashAttention's scheme).
//!
//! A work item is one KV head and a block of up to [`TILE_Q`] query tokens: its rows (each token ×
//! each query head of the group) share every tile of [`TILE_K`] keys and values, converted once
//! from the cache's type into f32 ([`crate::kv::load_tile`]), so the products run on SIMD kernels
//! ([`kernels`]) instead of one dot product per position. A row's softmax is kept as a running
//! maximum, sum and weighted value sum, rescaled when the maximum grows; the causal mask cuts the
//! last tiles per row.
//!
//! Keys are taken in chunks of [`CHUNK_K`]: each chunk's softmax is computed on its own and the
//! chunks merged in order. A decode step (one token) spreads a head's chunks over the threads
//! (with few KV heads there are fewer heads than threads); a batch goes through the same chunks
//! and the same merge in one work item, so a token's result is the same bits whether it comes in
//! a batch or alone, on any thread count.
//!
//! As llama.cpp's default (non-flash) path: q is rounded to f16 by the caller when the keys are
//! f16 (it computes K·q in the keys' type), and for f16 values the softmax weights are rounded to
//! f16 before they weight the values — here the weights relative to the running maximum, which
//! rounds with the same relative precision (on SmolLM2 this keeps the logits as close to
//! llama.cpp's as the two-pass softmax was: max |diff| 0.57–0.72 over four prompts, against
//! 0.47–1.07 unrounded). Keys and values of a q8_0 cache are dequantized into the tiles.
//!
//! A row's softmax update over a tile (maximum, rescaling, weights, their sum and f16 rounding)
//! runs in one pass over registers ([`softmax`]).

mod kernels;
mod softmax;

pub(crate) use kernels::TILE_K;

use crate::kv::{load_tile, KvCache, KV_PAGE};
use crate::pool::{SharedMut, ThreadPool};
use kernels::{tile_scores_rows, tile_values_rows, ROWS};
use sift_model::{Config, RopeStyle};
use softmax::softmax_step;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Query tokens per work item of a batch.
const TILE_Q: usize = 16;

/// Keys per chunk (whole tiles; a page holds whole chunks).
pub const CHUNK_K: usize = 256;

const _: () = assert!(CHUNK_K.is_multiple_of(TILE_K) && KV_PAGE.is_multiple_of(CHUNK_K));

/// Rounds every value to the nearest f16 (kept as f32).
pub(crate) fn round_to_f16(x: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let mut buf = [half::f16::ZERO; 256];
    for c in x.chunks_mut(256) {
        let b = &mut buf[..c.len()];
        b.convert_from_f32_slice(c);
        b.convert_to_f32_slice(c);
    }
}

/// Rotates the q or k vectors of one token (all heads) by position `pos`, as ggml_rope does.
pub(crate) fn rope(c: &Config, theta_scale: f32, pos: usize, x: &mut [f32]) {
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

/// One thread's tiles and running softmax state, for up to [`TILE_Q`] tokens × a group's heads.
#[derive(Default)]
struct Lane {
    /// Query rows, pre-scaled by 1/√head_dim.
    q: Vec<f32>,
    /// Keys transposed, `[dim][TILE_K]`, and values, `[TILE_K][dim]`, of the current tile.
    kt: Vec<f32>,
    vt: Vec<f32>,
    /// One row's scores over the tile.
    s: Vec<f32>,
    /// A dequantized row (q8_0 caches).
    tmp: Vec<f32>,
    /// Per row: the chunk's running maximum, sum and weighted values ...
    chunk: Softmax,
    /// ... and the merge of the chunks so far.
    total: Softmax,
}

/// Running softmax state of a set of rows: maximum score, Σ e^(s − max), Σ e^(s − max) · v.
#[derive(Default)]
struct Softmax {
    m: Vec<f32>,
    l: Vec<f32>,
    o: Vec<f32>,
}

impl Softmax {
    fn reset(&mut self, rows: usize, hd: usize) {
        self.m.clear();
        self.m.resize(rows, f32::NEG_INFINITY);
        self.l.clear();
        self.l.resize(rows, 0.0);
        self.o.clear();
        self.o.resize(rows * hd, 0.0);
    }
}

/// Merges one chunk's row state (`m`, `l`, `o`) into a running one (`tm`, `tl`, `to`).
fn merge(tm: &mut f32, tl: &mut f32, to: &mut [f32], m: f32, l: f32, o: &[f32]) {
    if m == f32::NEG_INFINITY {
        return;
    }
    let mx = tm.max(m);
    let (a, b) = ((*tm - mx).exp(), (m - mx).exp());
    *tl = *tl * a + l * b;
    for (t, &v) in to.iter_mut().zip(o) {
        *t = *t * a + v * b;
    }
    *tm = mx;
}

/// Scratch of [`attention`]: a lane per thread and the decode step's per-chunk results.
#[derive(Default)]
pub(crate) struct AttnScratch {
    lanes: Vec<Lane>,
    /// Decode: per query head and chunk, `m`, `l` and the head's weighted values.
    parts: Vec<f32>,
}

impl AttnScratch {
    /// Bytes the scratch grows to for `n_threads` threads and `n_ctx` positions.
    pub fn bytes(c: &Config, n_threads: usize, n_ctx: usize) -> u64 {
        let hd = c.head_dim;
        let rows = TILE_Q * (c.n_head / c.n_head_kv.max(1));
        let lane = 5 * rows * hd + 2 * hd * TILE_K + ROWS * TILE_K + hd + 4 * rows;
        let parts = c.n_head * n_ctx.div_ceil(CHUNK_K) * (hd + 2);
        4 * (n_threads.max(1) * lane + parts) as u64
    }
}

/// Causal multi-head attention with grouped KV heads for `n` new tokens after `n_past` cached,
/// over layer `l` of `kv` (which already holds the new tokens' keys and values), into `out`
/// (`n` rows of `n_head · head_dim`). `q` is rounded to f16 by the caller when the keys are f16.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    pool: &ThreadPool,
    c: &Config,
    q: &[f32],
    kv: &KvCache,
    l: usize,
    n_past: usize,
    n: usize,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let nth = pool.n_threads();
    scratch.lanes.resize_with(nth, Lane::default);
    let (nh, nkv, hd) = (c.n_head, c.n_head_kv, c.head_dim);
    let group = nh / nkv;
    let qd = nh * hd;
    let lanes = SharedMut::new(&mut scratch.lanes);
    let next = AtomicUsize::new(0);
    if n == 1 {
        // Decode: one item per (KV head, chunk); each writes its heads' chunk state to `parts`,
        // merged below in chunk order.
        let chunks = (n_past + 1).div_ceil(CHUNK_K);
        let part = hd + 2;
        scratch.parts.resize(nh * chunks * part, 0.0);
        let parts = SharedMut::new(&mut scratch.parts);
        pool.run(&|tid, _| {
            // SAFETY: each thread uses only its own lane.
            let lane = unsafe { &mut lanes.slice(tid..tid + 1)[0] };
            loop {
                let w = next.fetch_add(1, Ordering::Relaxed);
                if w >= nkv * chunks {
                    break;
                }
                let (g, ch) = (w / chunks, w % chunks);
                let keys = ch * CHUNK_K..((ch + 1) * CHUNK_K).min(n_past + 1);
                let item = Item { c, kv, l, n_past, g, t0: 0, tokens: 1 };
                item.gather_queries(q, lane);
                item.chunk(keys, lane);
                for gh in 0..group {
                    let h = g * group + gh;
                    // SAFETY: head h's part for chunk ch is written by this item only.
                    let dst = unsafe { parts.slice((h * chunks + ch) * part..(h * chunks + ch + 1) * part) };
                    dst[0] = lane.chunk.m[gh];
                    dst[1] = lane.chunk.l[gh];
                    dst[2..].copy_from_slice(&lane.chunk.o[gh * hd..(gh + 1) * hd]);
                }
            }
        });
        let lane = &mut scratch.lanes[0];
        for h in 0..nh {
            lane.total.reset(1, hd);
            for ch in 0..chunks {
                let p = &scratch.parts[(h * chunks + ch) * part..(h * chunks + ch + 1) * part];
                merge(&mut lane.total.m[0], &mut lane.total.l[0], &mut lane.total.o, p[0], p[1], &p[2..]);
            }
            finish(&lane.total, 0, hd, &mut out[h * hd..(h + 1) * hd]);
        }
        return;
    }
    // A batch: one item per (KV head, block of tokens), the blocks with the most keys first.
    let blocks = n.div_ceil(TILE_Q);
    let out_sm = SharedMut::new(out);
    pool.run(&|tid, _| {
        // SAFETY: each thread uses only its own lane.
        let lane = unsafe { &mut lanes.slice(tid..tid + 1)[0] };
        loop {
            let w = next.fetch_add(1, Ordering::Relaxed);
            if w >= nkv * blocks {
                break;
            }
            let (b, g) = (blocks - 1 - w / nkv, w % nkv);
            let t0 = b * TILE_Q;
            let item = Item { c, kv, l, n_past, g, t0, tokens: TILE_Q.min(n - t0) };
            item.gather_queries(q, lane);
            let rows = item.tokens * group;
            lane.total.reset(rows, hd);
            let end = n_past + t0 + item.tokens;
            for ch in 0..end.div_ceil(CHUNK_K) {
                item.chunk(ch * CHUNK_K..((ch + 1) * CHUNK_K).min(end), lane);
                let Lane { chunk, total, .. } = &mut *lane;
                for r in 0..rows {
                    let o = &mut total.o[r * hd..(r + 1) * hd];
                    merge(&mut total.m[r], &mut total.l[r], o, chunk.m[r], chunk.l[r], &chunk.o[r * hd..(r + 1) * hd]);
                }
            }
            for ti in 0..item.tokens {
                let t = t0 + ti;
                for gh in 0..group {
                    let h = g * group + gh;
                    // SAFETY: token t's head h belongs to this item only.
                    let o = unsafe { out_sm.slice(t * qd + h * hd..t * qd + (h + 1) * hd) };
                    finish(&lane.total, ti * group + gh, hd, o);
                }
            }
        }
    });
}

/// Row `r`'s attention output: its weighted values over its sum of weights.
fn finish(s: &Softmax, r: usize, hd: usize, out: &mut [f32]) {
    let inv = 1.0 / s.l[r];
    for (o, &v) in out.iter_mut().zip(&s.o[r * hd..(r + 1) * hd]) {
        *o = v * inv;
    }
}

/// One work item: KV head `g` of layer `l` and query tokens `t0..t0 + tokens` (positions
/// `n_past + t`).
struct Item<'a> {
    c: &'a Config,
    kv: &'a KvCache,
    l: usize,
    n_past: usize,
    g: usize,
    t0: usize,
    tokens: usize,
}

impl Item<'_> {
    fn group(&self) -> usize {
        self.c.n_head / self.c.n_head_kv
    }

    /// Copies the item's query rows (token-major, then head) into the lane, scaled by 1/√hd.
    fn gather_queries(&self, q: &[f32], lane: &mut Lane) {
        let (hd, group) = (self.c.head_dim, self.group());
        let qd = self.c.n_head * hd;
        let scale = 1.0 / (hd as f32).sqrt();
        lane.q.clear();
        for t in self.t0..self.t0 + self.tokens {
            let heads = &q[t * qd + self.g * group * hd..t * qd + (self.g + 1) * group * hd];
            lane.q.extend(heads.iter().map(|v| v * scale));
        }
    }

    /// The rows' softmax state over `keys` (whole tiles from a multiple of [`TILE_K`]; a row sees
    /// positions up to its own) into `lane.chunk`.
    fn chunk(&self, keys: std::ops::Range<usize>, lane: &mut Lane) {
        let (hd, group) = (self.c.head_dim, self.group());
        let kvd = self.c.n_embd_kv();
        let head = self.g * hd..(self.g + 1) * hd;
        let rows = self.tokens * group;
        lane.chunk.reset(rows, hd);
        lane.kt.resize(hd * TILE_K, 0.0);
        lane.vt.resize(TILE_K * hd, 0.0);
        lane.s.resize(ROWS * TILE_K, 0.0);
        let (ks, vs) = (&self.kv.k[self.l], &self.kv.v[self.l]);
        let round_weights = self.kv.v_type == crate::kv::KvType::F16;
        let Lane { q, kt, vt, s, tmp, chunk, .. } = lane;
        let mut p0 = keys.start;
        while p0 < keys.end {
            let kn = TILE_K.min(keys.end - p0);
            load_tile(ks, kvd, head.clone(), p0, kn, true, kt, tmp);
            load_tile(vs, kvd, head.clone(), p0, kn, false, vt, tmp);
            // Keys token `ti` sees in the tile (causal mask).
            let seen_by = |ti: usize| (self.n_past + self.t0 + ti + 1).saturating_sub(p0).min(kn);
            let mut r0 = 0;
            while r0 < rows {
                let seen = seen_by(r0 / group);
                if seen == 0 {
                    r0 = (r0 / group + 1) * group;
                    continue;
                }
                // Up to ROWS rows that see the same keys go through the kernels together.
                let mut r1 = r0 + 1;
                while r1 < rows && r1 - r0 < ROWS && seen_by(r1 / group) == seen {
                    r1 += 1;
                }
                let sr = &mut s[..(r1 - r0) * TILE_K];
                tile_scores_rows(&q[r0 * hd..r1 * hd], hd, kt, sr);
                for (k, r) in (r0..r1).enumerate() {
                    let s = &mut sr[k * TILE_K..k * TILE_K + seen];
                    let o = &mut chunk.o[r * hd..(r + 1) * hd];
                    softmax_step(s, &mut chunk.m[r], &mut chunk.l[r], o, round_weights);
                }
                tile_values_rows(sr, seen, vt, hd, &mut chunk.o[r0 * hd..r1 * hd]);
                r0 = r1;
            }
            p0 += TILE_K;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvType;
    use sift_model::Arch;

    fn config(n_head: usize, n_head_kv: usize, head_dim: usize) -> Config {
        Config {
            arch: Arch::Llama,
            n_layer: 1,
            n_embd: n_head * head_dim,
            n_ff: 4,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab: 4,
            n_ctx_train: 4096,
            rms_eps: 1e-5,
            rope_base: 10000.0,
            rope_dim: head_dim,
            rope_style: RopeStyle::Neox,
        }
    }

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
            })
            .collect()
    }

    /// Plain two-pass softmax attention in f64 over the cache's stored (rounded) values.
    fn reference(c: &Config, q: &[f32], k: &[f32], v: &[f32], n_past: usize, n: usize) -> Vec<f64> {
        let (hd, nh, kvd) = (c.head_dim, c.n_head, c.n_embd_kv());
        let group = nh / c.n_head_kv;
        let mut out = vec![0f64; n * nh * hd];
        for t in 0..n {
            for h in 0..nh {
                let g = h / group;
                let qh = &q[(t * nh + h) * hd..(t * nh + h + 1) * hd];
                let s: Vec<f64> = (0..=n_past + t)
                    .map(|p| {
                        let kp = &k[p * kvd + g * hd..p * kvd + (g + 1) * hd];
                        qh.iter().zip(kp).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = w.iter().sum();
                for (p, wp) in w.iter().enumerate() {
                    for d in 0..hd {
                        out[(t * nh + h) * hd + d] += wp / sum * v[p * kvd + g * hd + d] as f64;
                    }
                }
            }
        }
        out
    }

    /// The values a cache of type `t` holds for `x` (f16 rounding; q8_0 through its blocks).
    fn stored(t: KvType, x: &[f32]) -> Vec<f32> {
        match t {
            KvType::F32 => x.to_vec(),
            KvType::F16 => x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
            KvType::Q8_0 => {
                let mut b = vec![0u8; KvType::Q8_0.row_bytes(x.len())];
                sift_quant::ActType::Q8_0.quantize(x, &mut b);
                let mut y = vec![0f32; x.len()];
                sift_quant::WeightType::Q8_0.dequantize_row(&b, &mut y);
                y
            }
        }
    }

    /// Runs the tiled attention over `total` positions fed in batches of `batch` (1: one token at
    /// a time) on `threads` threads; returns every token's output.
    #[allow(clippy::too_many_arguments)]
    fn run(
        c: &Config,
        t: KvType,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        total: usize,
        batch: usize,
        threads: usize,
    ) -> Vec<f32> {
        let pool = ThreadPool::new(threads);
        let (qd, kvd) = (c.n_embd_q(), c.n_embd_kv());
        let mut kv = KvCache::new(c, t, t);
        kv.set_capacity(total);
        let mut scratch = AttnScratch::default();
        let mut out = vec![0f32; total * qd];
        let mut p = 0;
        while p < total {
            let n = batch.min(total - p);
            kv.store(0, p, &k[p * kvd..(p + n) * kvd], &v[p * kvd..(p + n) * kvd]);
            attention(&pool, c, &q[p * qd..(p + n) * qd], &kv, 0, p, n, &mut scratch, &mut out[p * qd..(p + n) * qd]);
            p += n;
        }
        out
    }

    /// Against two-pass softmax in f64, for every cache type, GQA groups of 1, 2 and 7 heads and
    /// head sizes on and off the SIMD kernels, past several chunks: within 2e-4 absolute (values
    /// are ±3; f32 sums of up to 600 terms; f16 values: 3 · 2^-11, the weights' f16 rounding), and
    /// a token gives the same bits alone or in a batch, on one thread or three.
    #[test]
    fn tiled_attention_matches_two_pass_softmax_and_is_the_same_in_a_batch_or_alone() {
        for (nh, nkv, hd, total) in
            [(2usize, 2usize, 64usize, 600usize), (14, 2, 64, 300), (4, 2, 128, 70), (3, 1, 48, 270)]
        {
            let c = config(nh, nkv, hd);
            let (qd, kvd) = (c.n_embd_q(), c.n_embd_kv());
            let q = data(total * qd, 1);
            let (k, v) = (data(total * kvd, 2), data(total * kvd, 3));
            for t in [KvType::F32, KvType::F16, KvType::Q8_0] {
                if t.check_head_dim(hd).is_err() {
                    continue;
                }
                let ks: Vec<f32> = k.chunks(kvd).flat_map(|r| stored(t, r)).collect();
                let vs: Vec<f32> = v.chunks(kvd).flat_map(|r| stored(t, r)).collect();
                let want = reference(&c, &q, &ks, &vs, 0, total);
                let batched = run(&c, t, &q, &k, &v, total, 64, 2);
                let max = batched.iter().zip(&want).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
                // f16 values: each weight rounded to f16 (relative 2^-11) times |v| <= 3.
                let tol = if t == KvType::F16 { 3.0 * 2f64.powi(-11) } else { 2e-4 };
                assert!(max < tol, "{nh}/{nkv} heads, dim {hd}, {t}: max |diff| {max}");
                for (batch, threads) in [(1, 1), (1, 3), (37, 3), (total, 1)] {
                    let other = run(&c, t, &q, &k, &v, total, batch, threads);
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert!(
                        bits(&other) == bits(&batched),
                        "{nh}/{nkv} heads, {t}: batch {batch} on {threads} threads differs"
                    );
                }
            }
        }
    }
}
