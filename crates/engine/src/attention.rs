//! Attention: the KV cache, RoPE, and causal grouped-query attention over the cache, with
//! llama.cpp's f16 rounding of q, k, v and the softmax weights.

use crate::pool::{split, SharedMut, ThreadPool};
use crate::vecops;
use sift_model::{Config, RopeStyle};

/// Keys and values of every layer for positions `0..n_past`, f32, `[pos][kv_head * head_dim]`.
pub(crate) struct KvCache {
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(c: &Config, n_ctx: usize) -> KvCache {
        let len = n_ctx * c.n_embd_kv();
        KvCache {
            k: (0..c.n_layer).map(|_| vec![0.0; len]).collect(),
            v: (0..c.n_layer).map(|_| vec![0.0; len]).collect(),
        }
    }
}

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

/// Causal multi-head attention with grouped KV heads for `n` new tokens after `n_past` cached.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
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
