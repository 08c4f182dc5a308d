//! Attention: RoPE and causal grouped-query attention over the KV cache ([`crate::kv`]), with
//! llama.cpp's f16 rounding of q and the softmax weights for f16 caches.

use crate::kv::{key_scores, weighted_values, KvCache, KvType, QueryQ8};
use crate::pool::{split, SharedMut, ThreadPool};
use crate::vecops;
use sift_model::{Config, RopeStyle};

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

/// Causal multi-head attention with grouped KV heads for `n` new tokens after `n_past` cached,
/// over layer `l` of `kv` (which already holds the new tokens' keys and values). `q` is rounded
/// to f16 by the caller when the keys are f16; the softmax weights are rounded to f16 here when the
/// values are (llama.cpp's f16 products).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    pool: &ThreadPool,
    c: &Config,
    q: &[f32],
    kv: &KvCache,
    l: usize,
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
    let (keys, values) = (&kv.k[l], &kv.v[l]);
    let round_weights = kv.v_type == KvType::F16;
    let out_sm = SharedMut::new(out);
    let scores_sm = SharedMut::new(scores);
    pool.run(&|tid, nth| {
        // SAFETY: each thread uses only its own score row.
        let sc = unsafe { &mut scores_sm.slice(tid..tid + 1)[0] };
        let mut q8 = QueryQ8::new(kv.k_type);
        let mut tmp = Vec::new();
        for w in split(work, nth, tid) {
            let (t, h) = (w / nh, w % nh);
            let head = (h / group) * hd..(h / group + 1) * hd;
            let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
            let s = &mut sc[..n_past + t + 1];
            q8.set(qh);
            key_scores(keys, kvd, head.clone(), qh, &q8, scale, s);
            vecops::softmax(s);
            if round_weights {
                round_to_f16(s);
            }
            // SAFETY: the (token, head) output slice belongs to this work item only.
            let o = unsafe { out_sm.slice(t * qd + h * hd..t * qd + (h + 1) * hd) };
            weighted_values(values, kvd, head, s, o, &mut tmp);
        }
    });
}
