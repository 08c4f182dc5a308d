//! Exact columns with 8-bit coefficients: the integer form of [`crate::exact`]'s column kernels.
//!
//! The f32 column kernels widen every stored integer to f32 and multiply-add it by its column's
//! coefficient: about six vector operations per 32 weights, so at sparsity 0.5 they run out of
//! compute before they run out of memory bandwidth (~20 GB/s on two Zen 4 cores against a dense
//! decode's ~28). Here the coefficients of a *group* (the active inputs of one source
//! super-block) are quantized to `i8` with one scale, as the dense kernels quantize activations to
//! Q8, and the VNNI kernel ([`crate::x86::exact_vnni`]) multiplies four columns' integers by their
//! four coefficients and sums them in one `vpdpbusd` (AVX2: two columns per `vpmaddubsw` lane,
//! [`crate::x86::exact_q8_avx2`]). The weights stay the source's, value for
//! value; the coefficients carry the same 8-bit rounding the dense path's activations carry
//! (per 256 inputs for the K-quants, as Q8_K; per 32 for the legacy formats, as Q8_0).
//!
//! # Numerics (the scalar reference [`axpy_exact_q8_scalar`]; the SIMD kernel gives it bit for bit)
//!
//! - **Groups**: consecutive entries of the active list in the same super-block (32 inputs for
//!   the legacy formats, 256 for the K-quants), also cut at list positions that are multiples of
//!   [`RUN_BREAK`] (so pieces of a list add up to the whole list's result, as for the f32
//!   kernels). **Runs**: consecutive entries of a group in the same sub-block.
//! - Per group ([`quantize_group`]): `amax = max |coef|`, `s = amax / 127`,
//!   `C_i = round(coef_i / s)` in `−127..=127` (all zero when `amax` is zero; a NaN or infinite
//!   coefficient makes `s` non-finite, so the group's outputs become NaN instead of silently
//!   losing it).
//! - Per run `r` and output row `k`: `T = Σ_i C_i·q_ik − zero·ΣC_r`; per group
//!   `acc_k = Σ_r sc_rk·T_rk` and `M_k = Σ_r m_rk·ΣC_r` (`sc = m = 1` for the legacy formats),
//!   exact in `i32` (at most [`RUN_BREAK`] = 128 entries per group: `|acc| < 2^29`).
//! - `y_k = fma(d_k·s, acc_k, y_k)`, then for formats with an offset `y_k = fma(b_k·s, M_k, y_k)`
//!   (`d`, `b` the row's f16 super-block scale and offset).
//!
//! The error against the f32 kernels is the coefficients' rounding, at most `s/2` each
//! (`tests/exact.rs` bounds it per output); perplexity through the pack's columns is measured in
//! docs/benchmarks.md.

use crate::columns::ColsError;
use crate::exact::{check_axpy_exact, piece_offset, runs, ExactAxpyFn, ExactFormat, ExactMatrix, RUN_BREAK};
use crate::Isa;
use std::ops::Range;

/// Quantizes a group's coefficients to `out` (the same length) and returns their scale `s`
/// (`coef_i ≈ s · out_i`, rounded half away from zero as `f32::round`): `s = max |coef| / 127`,
/// NaN or infinite when a coefficient is. Written so that it compiles to vector code (no libm
/// `roundf` per value: the prompt blocks quantize `tokens × active columns` of them per op).
pub fn quantize_group(coef: &[f32], out: &mut [i8]) -> f32 {
    assert_eq!(coef.len(), out.len(), "quantize_group: lengths differ");
    // Sixteen lanes of maxima (vector code: each lane's max is its own chain).
    let (mut m, mut bad) = ([0f32; 16], [false; 16]);
    let blocks = coef.chunks_exact(16);
    let tail = blocks.remainder();
    for b in blocks {
        for i in 0..16 {
            let a = b[i].abs();
            bad[i] |= a.is_nan();
            m[i] = m[i].max(a);
        }
    }
    for (i, &c) in tail.iter().enumerate() {
        bad[i] |= c.is_nan();
        m[i] = m[i].max(c.abs());
    }
    let amax = m.iter().fold(0f32, |a, &b| a.max(b));
    let nan = bad.iter().any(|&b| b);
    if nan || amax == 0.0 || !amax.is_finite() {
        out.fill(0);
        return if amax == 0.0 && !nan { 0.0 } else { f32::NAN };
    }
    let inv = 127.0 / amax;
    for (o, &c) in out.iter_mut().zip(coef) {
        *o = round_away(c * inv) as i8;
    }
    amax / 127.0
}

/// `x.round() as i32` for `|x| < 2^31`: truncation, then one step away from zero where the
/// dropped fraction is a half or more (exact: `x − trunc(x)` is representable).
#[inline]
fn round_away(x: f32) -> i32 {
    let t = x as i32;
    let frac = x - t as f32;
    t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32
}

/// The groups of an active list (`(start, end)` into it, see the module docs): runs of one
/// super-block, cut at multiples of [`RUN_BREAK`]; never longer than [`RUN_BREAK`] entries.
pub(crate) fn groups<'a>(units: &'a [u32], fmt: &ExactFormat) -> impl Iterator<Item = (usize, usize)> + 'a {
    runs(units, fmt.super_block)
}

/// The scale `s` of each entry's group (its coefficient is rounded by at most `s / 2`): what
/// tests need to bound the kernels' error against exact sums.
pub fn group_scales(units: &[u32], fmt: &ExactFormat, coef: &[f32]) -> Vec<f32> {
    assert_eq!(units.len(), coef.len(), "group_scales: lengths differ");
    let mut out = vec![0f32; units.len()];
    let mut c8 = [0i8; RUN_BREAK];
    for (g0, g1) in groups(units, fmt) {
        let s = quantize_group(&coef[g0..g1], &mut c8[..g1 - g0]);
        out[g0..g1].fill(s);
    }
    out
}

/// The scalar reference of the 8-bit-coefficient kernels (an [`ExactAxpyFn`]): the sums of the
/// module docs, in that order.
///
/// # Panics
/// On arguments [`check_axpy_exact`] rejects, with its message.
pub fn axpy_exact_q8_scalar(
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    chunks: Range<usize>,
    y: &mut [f32],
) {
    if let Err(e) = check_axpy_exact(m, idx, units, coef, &chunks, y.len()) {
        panic!("{e}");
    }
    let f = m.fmt;
    let (cb, kb, n_out) = (m.stride, f.chunk_bytes(), m.n_out);
    let zero = f.zero as i32;
    let mut c8 = [0i8; RUN_BREAK];
    for (g0, g1) in groups(units, &f) {
        let s = quantize_group(&coef[g0..g1], &mut c8[..g1 - g0]);
        let y_off = piece_offset(g0, y.len(), 32 * chunks.len());
        let first = units[g0] as usize;
        for (ci, ch) in chunks.clone().enumerate() {
            let (mut acc, mut macc) = ([0i32; 32], [0i32; 32]);
            for (r0, r1) in runs(&units[g0..g1], f.sub_block) {
                let sum_c: i32 = c8[r0..r1].iter().map(|&c| c as i32).sum();
                let unit = units[g0 + r0] as usize;
                for k in 0..32 {
                    let mut t: i32 = 0;
                    for i in r0..r1 {
                        let col = &m.cols[idx[g0 + i] as usize * cb + ch * kb..][..kb];
                        t += c8[i] as i32 * crate::exact::get_q(f.bits, col, k) as i32;
                    }
                    t -= zero * sum_c;
                    let (sc, mm) = f.sub_scale_of(m.scales, n_out, ch * 32 + k, unit);
                    acc[k] += sc * t;
                    macc[k] += mm * sum_c;
                }
            }
            for k in 0..32 {
                let (d, b) = f.super_scale_of(m.scales, n_out, ch * 32 + k, first);
                let v = &mut y[y_off + ci * 32 + k];
                *v = (d * s).mul_add(acc[k] as f32, *v);
                if f.has_offset {
                    *v = (b * s).mul_add(macc[k] as f32, *v);
                }
            }
        }
    }
}

/// The SIMD 8-bit-coefficient kernel for `fmt` at or below `isa`, if this CPU has one: AVX-512
/// VNNI with VBMI and BITALG, else AVX2 (for the 8-bit format with 16-bit products, whose pairs
/// would saturate `vpmaddubsw`). Without one, [`axpy_exact_q8_scalar`] computes the same bits.
pub fn axpy_exact_q8_fn(fmt: ExactFormat, isa: Isa) -> Option<ExactAxpyFn> {
    #[cfg(target_arch = "x86_64")]
    {
        let isa = isa.min(Isa::detect());
        if isa >= Isa::Avx512Vnni {
            if let Some(f) = crate::x86::exact_vnni::vnni_axpy_fn(fmt) {
                return Some(f);
            }
        }
        if isa >= Isa::Avx2 {
            return crate::x86::exact_q8_avx2::avx2_q8_axpy_fn(fmt);
        }
    }
    let _ = (fmt, isa);
    None
}

/// Many tokens over one active list: for every token `t < n_tok`, what the one-token
/// [`ExactAxpyFn`] computes with the coefficients `coef[t·n..(t + 1)·n]` (`n = units.len()`) into
/// `y[t·y_stride..t·y_stride + 32·chunks.len()]` (one output per token, no pieces). FastForward's
/// block-wise sparse FFN: the tokens of a prompt block share one set of neurons, so the down
/// projection reads each of their columns once for all of them.
pub type ExactAxpyTokensFn = fn(
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    n_tok: usize,
    chunks: Range<usize>,
    y: &mut [f32],
    y_stride: usize,
);

/// Checks an [`ExactAxpyTokensFn`]'s arguments.
#[allow(clippy::too_many_arguments)]
pub fn check_axpy_exact_tokens(
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    n_tok: usize,
    chunks: &Range<usize>,
    y_len: usize,
    y_stride: usize,
) -> Result<(), ColsError> {
    let n = units.len();
    let need = n.checked_mul(n_tok).ok_or(ColsError::Overflow)?;
    if coef.len() != need {
        return Err(ColsError::Len { what: "coef (n_tok rows of the active list)", expected: need, got: coef.len() });
    }
    let width = 32 * chunks.len();
    check_axpy_exact(m, idx, units, &coef[..n.min(coef.len())], chunks, width).or_else(|e| match e {
        // With no token there are no coefficients to check against the list.
        ColsError::Len { what: "idx / units", .. } if n_tok == 0 && idx.len() == n => Ok(()),
        e => Err(e),
    })?;
    if y_stride < width {
        return Err(ColsError::TooShort { what: "y_stride", need: width, got: y_stride });
    }
    if n_tok > 0 {
        let need = (n_tok - 1).checked_mul(y_stride).and_then(|v| v.checked_add(width)).ok_or(ColsError::Overflow)?;
        if y_len < need {
            return Err(ColsError::TooShort { what: "y", need, got: y_len });
        }
    }
    Ok(())
}

/// The scalar reference [`ExactAxpyTokensFn`]: [`axpy_exact_q8_scalar`] per token.
#[allow(clippy::too_many_arguments)]
pub fn axpy_exact_tokens_q8_scalar(
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    n_tok: usize,
    chunks: Range<usize>,
    y: &mut [f32],
    y_stride: usize,
) {
    by_token(axpy_exact_q8_scalar, m, idx, units, coef, n_tok, chunks, y, y_stride)
}

/// This CPU's one-token kernel ([`crate::axpy_exact_fn`]) per token.
#[allow(clippy::too_many_arguments)]
fn axpy_exact_tokens_by_token(
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    n_tok: usize,
    chunks: Range<usize>,
    y: &mut [f32],
    y_stride: usize,
) {
    by_token(crate::axpy_exact_fn(m.fmt, Isa::detect()), m, idx, units, coef, n_tok, chunks, y, y_stride)
}

#[allow(clippy::too_many_arguments)]
fn by_token(
    f: ExactAxpyFn,
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    n_tok: usize,
    chunks: Range<usize>,
    y: &mut [f32],
    y_stride: usize,
) {
    if let Err(e) = check_axpy_exact_tokens(m, idx, units, coef, n_tok, &chunks, y.len(), y_stride) {
        panic!("{e}");
    }
    let (n, width) = (units.len(), 32 * chunks.len());
    for t in 0..n_tok {
        f(m, idx, units, &coef[t * n..(t + 1) * n], chunks.clone(), &mut y[t * y_stride..t * y_stride + width]);
    }
}

/// The fastest [`ExactAxpyTokensFn`] for `fmt` at or below `isa` on this CPU: the VNNI kernel
/// over four tokens at a time where the CPU has it, else this CPU's one-token kernel per token.
pub fn axpy_exact_tokens_fn(fmt: ExactFormat, isa: Isa) -> ExactAxpyTokensFn {
    #[cfg(target_arch = "x86_64")]
    if isa.min(Isa::detect()) >= Isa::Avx512Vnni {
        if let Some(f) = crate::x86::exact_vnni_tokens::vnni_tokens_fn(fmt) {
            return f;
        }
    }
    let _ = (fmt, isa);
    axpy_exact_tokens_by_token
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the plain `round()` on every half-way value and a sweep of others, NaN and
    /// infinite groups, and an all-zero one.
    #[test]
    fn quantize_group_rounds_as_f32_round() {
        let mut vals: Vec<f32> = (-260..=260).map(|i| i as f32 / 2.0).collect();
        vals.extend((0..4000).map(|i| ((i as f32) * 0.7731).sin() * 127.0));
        vals.extend([126.5, -126.5, 0.49999997, -0.49999997, 1e-30, -1e-30]);
        for g in vals.chunks(128) {
            let mut out = vec![0i8; g.len()];
            let s = quantize_group(g, &mut out);
            let amax = g.iter().fold(0f32, |m, c| m.max(c.abs()));
            assert_eq!(s, amax / 127.0);
            for (&c, &o) in g.iter().zip(&out) {
                assert_eq!(o, (c * (127.0 / amax)).round() as i8, "{c}");
            }
        }
        for v in [-127.5f32, -64.5, -0.5, 0.5, 2.5, 63.5, 126.5, -0.49999997, 0.49999997] {
            assert_eq!(round_away(v), v.round() as i32, "{v}");
        }
        let mut out = [1i8; 3];
        assert!(quantize_group(&[1.0, f32::NAN, 2.0], &mut out).is_nan() && out == [0; 3]);
        assert!(quantize_group(&[f32::INFINITY, 2.0, 0.0], &mut out).is_nan());
        assert_eq!(quantize_group(&[0.0, -0.0, 0.0], &mut out), 0.0);
    }
}
