//! The online softmax step of tiled attention, for one query row and one tile of scores
//! (FlashAttention's update): the row's running maximum grows to the tile's, its sum of weights and
//! weighted values are rescaled by e^(old − new), the scores become weights e^(s − max) and are
//! added to the sum; for an f16 value cache the weights are then rounded to f16 (as llama.cpp's
//! non-flash path rounds them before they weight the values).
//!
//! [`softmax_step_scalar`] is the reference: the vector kernels [`max_value`] and
//! [`exp_shifted_sum`] and an f16 round trip, one pass each. [`softmax_step`] does the same in one
//! pass over registers where the CPU has AVX-512 (the tile's 64 scores are four vectors): the same
//! polynomial with fused multiply-adds, sums as trees, the hardware's round-to-nearest f16
//! conversion. It agrees with the reference within rounding (tested on every tile length); on
//! one machine one path runs for every token, batched or alone.

use super::kernels::TILE_K;
use super::round_to_f16;
use crate::vecops::{exp_shifted_sum, max_value};
use sift_quant::Isa;

/// One row's running softmax state over a tile: `s` (the tile's first `s.len()` ≤ [`TILE_K`]
/// scores, which become the weights), `m` the running maximum, `l` the running sum of weights,
/// `o` the running weighted values (scaled with `l`). Weights are rounded to f16 when `round`.
pub fn softmax_step(s: &mut [f32], m: &mut f32, l: &mut f32, o: &mut [f32], round: bool) {
    assert!(s.len() <= TILE_K, "a tile holds at most {TILE_K} scores");
    #[cfg(target_arch = "x86_64")]
    if Isa::detect() == Isa::Avx512Vnni {
        // SAFETY: AVX-512F comes with `Isa::Avx512Vnni`, which `Isa::detect` reports only where
        // the CPU has it; `s` holds at most TILE_K (64) scores (asserted).
        return unsafe { x86::softmax_step_avx512(s, m, l, o, round) };
    }
    softmax_step_scalar(s, m, l, o, round)
}

/// The reference of [`softmax_step`].
pub fn softmax_step_scalar(s: &mut [f32], m: &mut f32, l: &mut f32, o: &mut [f32], round: bool) {
    let mt = max_value(s);
    if mt > *m {
        let corr = (*m - mt).exp();
        *l *= corr;
        for v in o.iter_mut() {
            *v *= corr;
        }
        *m = mt;
    }
    *l += exp_shifted_sum(s, *m);
    if round {
        round_to_f16(s);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::TILE_K;
    use std::arch::x86_64::*;

    /// e^x on 16 lanes: `exp_poly`'s range reduction and polynomial (Cephes' `expf`, clamped to
    /// [−87, 88]) with fused multiply-adds and `vscalefps` for the power of two: within 2 ulp of
    /// `f32::exp`, as the scalar one, but not its bits.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp_fma(x: __m512) -> __m512 {
        let c = _mm512_set1_ps;
        let x = _mm512_min_ps(_mm512_max_ps(x, c(-87.0)), c(88.0));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            x,
            c(std::f32::consts::LOG2_E),
        ));
        let r = _mm512_fnmadd_ps(n, c(-2.121_944_4e-4), _mm512_fnmadd_ps(n, c(0.693_359_4), x));
        let mut p = _mm512_fmadd_ps(c(1.987_569_1e-4), r, c(1.398_199_9e-3));
        p = _mm512_fmadd_ps(p, r, c(8.333_452e-3));
        p = _mm512_fmadd_ps(p, r, c(4.166_579_6e-2));
        p = _mm512_fmadd_ps(p, r, c(1.666_666_5e-1));
        p = _mm512_fmadd_ps(p, r, c(0.5));
        p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), c(1.0));
        _mm512_scalef_ps(p, n)
    }

    /// [`super::softmax_step_scalar`] over registers (sums and maximum as trees).
    ///
    /// # Safety
    /// AVX-512F present; `s.len() <= TILE_K`.
    #[allow(clippy::needless_range_loop)] // vectors of the tile, indexed with their masks
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn softmax_step_avx512(s: &mut [f32], m: &mut f32, l: &mut f32, o: &mut [f32], round: bool) {
        let n = s.len();
        let vecs = n.div_ceil(16);
        let mask = |v: usize| -> __mmask16 {
            let left = n - 16 * v;
            if left >= 16 {
                0xFFFF
            } else {
                (1u16 << left) - 1
            }
        };
        let mut x = [_mm512_set1_ps(f32::NEG_INFINITY); TILE_K / 16];
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        for v in 0..vecs {
            // SAFETY: the lanes of `mask(v)` are scores 16v.. < n, inside s.
            x[v] = unsafe { _mm512_mask_loadu_ps(x[v], mask(v), s.as_ptr().add(16 * v)) };
            mx = _mm512_max_ps(mx, x[v]);
        }
        // A maximum is the same in any order (no score is NaN: the products of finite rows).
        let mt = _mm512_reduce_max_ps(mx);
        if mt > *m {
            let corr = (*m - mt).exp();
            *l *= corr;
            for v in o.iter_mut() {
                *v *= corr;
            }
            *m = mt;
        }
        let mv = _mm512_set1_ps(*m);
        let mut acc = _mm512_setzero_ps();
        for v in 0..vecs {
            // Lanes past the scores are e^(−∞ − m) = 0.
            let mut w = exp_fma(_mm512_sub_ps(x[v], mv));
            w = _mm512_maskz_mov_ps(mask(v), w);
            acc = _mm512_add_ps(acc, w);
            if round {
                w = _mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(w));
            }
            // SAFETY: as the load above.
            unsafe { _mm512_mask_storeu_ps(s.as_mut_ptr().add(16 * v), mask(v), w) };
        }
        *l += _mm512_reduce_add_ps(acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2654435761) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32) * 24.0 - 12.0
            })
            .collect()
    }

    /// The dispatched step agrees with the reference for every tile length, a maximum that grows
    /// or not, a first tile (−∞), with and without the f16 rounding: the same maximum and rescaled
    /// values (bit for bit), weights within 4 ulp (rounded: within one f16 step, a tie may fall
    /// either way), sums within 1e-6; and the weights are e^(s − max) within 4 ulp.
    #[test]
    fn the_fused_step_agrees_with_the_reference() {
        for n in 1..=TILE_K {
            for (k, m0) in [f32::NEG_INFINITY, -3.0, 0.5, 40.0].into_iter().enumerate() {
                for round in [false, true] {
                    let s0 = data(n, (n * 8 + k) as u32);
                    let o0 = data(64, 77);
                    let (mut s1, mut m1, mut l1, mut o1) = (s0.clone(), m0, 2.5f32, o0.clone());
                    let (mut s2, mut m2, mut l2, mut o2) = (s0.clone(), m0, 2.5f32, o0.clone());
                    softmax_step(&mut s1, &mut m1, &mut l1, &mut o1, round);
                    softmax_step_scalar(&mut s2, &mut m2, &mut l2, &mut o2, round);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let at = format!("n {n}, m0 {m0}, round {round}");
                    assert_eq!(m1.to_bits(), m2.to_bits(), "m: {at}");
                    assert!((l1 - l2).abs() <= 1e-6 * l2, "l: {at}: {l1} vs {l2}");
                    assert_eq!(bits(&o1), bits(&o2), "values: {at}");
                    let mx = s0.iter().copied().fold(m0, f32::max);
                    assert_eq!(m1, mx, "{at}");
                    for ((w1, w2), &x) in s1.iter().zip(&s2).zip(&s0) {
                        let e = (x - mx).exp();
                        let tol = if round { e / 1024.0 + 6e-8 } else { e * 5e-7 };
                        assert!((w1 - w2).abs() <= tol, "{at}: {w1} vs the reference's {w2}");
                        assert!((w1 - e).abs() <= tol, "{at}: e^{} = {e}, got {w1}", x - mx);
                    }
                }
            }
        }
    }
}
