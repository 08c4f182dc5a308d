//! AVX2 activation quantizers: Q8_0 and Q8_1 (GGML's x86 `quantize_row_q8_0` / `_q8_1`) and Q8_K
//! (a vectorized `quantize_row_q8_K_ref`), behind `quantize_act`.

use super::block_dot::{Q8_0_BYTES, Q8_1_BYTES};
use super::has_avx2;
use crate::blocks::BlockQ8K;
use crate::{scalar, ActType};
use std::arch::x86_64::*;
use std::mem::size_of;

/// Quantizes an activation row with the AVX2 quantizers (GGML's `quantize_row_q8_0` /
/// `quantize_row_q8_1` for x86, and a vectorized `quantize_row_q8_K_ref`); falls back to
/// [`scalar::quantize_act`] without AVX2.
///
/// Q8_K output is identical to the scalar quantizer's. Q8_0 / Q8_1 multiply by `127 / amax` and
/// round half to even, as GGML's AVX2 code does, where the reference multiplies by `1 / (amax /
/// 127)` and rounds half away from zero, so a value within an ulp or two of `k + 0.5` may round
/// differently (rare; `d` is always identical, and Q8_1's `s` is always `d * Σq` of its own `q`).
///
/// # Panics
/// If `x.len()` is not a multiple of the block size or `out.len() != t.row_bytes(x.len())`.
pub(crate) fn quantize_act(t: ActType, x: &[f32], out: &mut [u8]) {
    if !has_avx2() || t == ActType::F32 {
        return scalar::quantize_act(t, x, out);
    }
    let nb = scalar::block_count(x.len(), t.block_size());
    assert_eq!(out.len(), t.row_bytes(x.len()), "activation buffer size for {t:?}");
    // SAFETY: AVX2/FMA/F16C detected above; `x` holds `nb` blocks of values and `out` exactly `nb`
    // blocks of `t`, which is all each quantizer touches.
    unsafe {
        match t {
            ActType::Q8_0 => quantize_q8_0_avx2(nb, x.as_ptr(), out.as_mut_ptr()),
            ActType::Q8_1 => quantize_q8_1_avx2(nb, x.as_ptr(), out.as_mut_ptr()),
            ActType::Q8_K => quantize_q8_k_avx2(nb, x.as_ptr(), out.as_mut_ptr()),
            ActType::F32 => unreachable!(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Activation quantizers (AVX2)
// ---------------------------------------------------------------------------------------------

/// Quantizes one 32-value block at `x` to i8 (GGML's AVX2 `quantize_row_q8_0` / `_q8_1` core):
/// returns `d = amax / 127`, the 32 bytes in element order, and the i32 sum of the quants.
///
/// # Safety
/// AVX2 present; 32 f32s readable at `x` (any alignment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_block(x: *const f32) -> (f32, __m256i, i32) {
    // SAFETY: four loads of 8 f32 cover exactly the 32 f32 at `x` the caller guarantees.
    let v = unsafe {
        [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))]
    };
    let sign = _mm256_set1_ps(-0.0);
    let m = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
    let m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    let m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    let amax = _mm_cvtss_f32(m4);
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    const RN: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    let q = v.map(|v| _mm256_cvtps_epi32(_mm256_round_ps::<RN>(_mm256_mul_ps(v, id))));
    let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    let sum = _mm_cvtsi128_si32(s);
    // Packs work per 128-bit lane; the permute restores element order.
    let p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    (d, p, sum)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_bits(x: f32) -> [u8; 2] {
    (_mm_cvtsi128_si32(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x))) as u16).to_le_bytes()
}

/// # Safety
/// AVX2/F16C present; `nb` blocks of 32 f32 at `x`, `nb` Q8_0 blocks writable at `out`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_0_avx2(nb: usize, x: *const f32, out: *mut u8) {
    for i in 0..nb {
        // SAFETY: `i < nb`: the 32 f32 of block `i` are readable at `x` and Q8_0 block `i`
        // (2-byte `d`, then 32 quants) writable at `out`, by the caller's contract.
        unsafe {
            let (d, q, _) = q8_block(x.add(32 * i));
            let o = out.add(i * Q8_0_BYTES);
            std::ptr::copy_nonoverlapping(f16_bits(d).as_ptr(), o, 2);
            _mm256_storeu_si256(o.add(2) as *mut __m256i, q);
        }
    }
}

/// # Safety
/// AVX2/F16C present; `nb` blocks of 32 f32 at `x`, `nb` Q8_1 blocks writable at `out`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_1_avx2(nb: usize, x: *const f32, out: *mut u8) {
    for i in 0..nb {
        // SAFETY: `i < nb`: the 32 f32 of block `i` are readable at `x` and Q8_1 block `i`
        // (2-byte `d`, 2-byte `s`, then 32 quants) writable at `out`, by the caller's contract.
        unsafe {
            let (d, q, sum) = q8_block(x.add(32 * i));
            let o = out.add(i * Q8_1_BYTES);
            std::ptr::copy_nonoverlapping(f16_bits(d).as_ptr(), o, 2);
            std::ptr::copy_nonoverlapping(f16_bits(d * sum as f32).as_ptr(), o.add(2), 2);
            _mm256_storeu_si256(o.add(4) as *mut __m256i, q);
        }
    }
}

/// Vectorized `quantize_row_q8_K_ref` (bit-identical to [`scalar::quantize_q8_k`]).
///
/// # Safety
/// AVX2 present; `nb` 256-value blocks of f32 at `x`, `nb` Q8_K blocks writable at `out`; the two
/// ranges do not overlap.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_k_avx2(nb: usize, x: *const f32, out: *mut u8) {
    const RN: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    let sign = _mm256_set1_ps(-0.0);
    for i in 0..nb {
        // SAFETY: `i < nb`: the 256 f32 of block `i` are readable at `x` and Q8_K block `i` is
        // writable at `out` (the caller's contract, which also rules out overlap).
        let (xs, o) = unsafe {
            (
                std::slice::from_raw_parts(x.add(256 * i), 256),
                std::slice::from_raw_parts_mut(out.add(i * size_of::<BlockQ8K>()), size_of::<BlockQ8K>()),
            )
        };
        let mut m = _mm256_setzero_ps();
        for c in xs.chunks_exact(8) {
            // SAFETY: `c` is a chunk of exactly 8 f32, the 8 lanes loaded.
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, unsafe { _mm256_loadu_ps(c.as_ptr()) }));
        }
        let m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        // GGML keeps the first value of largest magnitude, with its sign.
        let max = match xs.iter().find(|v| v.abs() == amax) {
            Some(&v) if amax != 0.0 && amax.is_finite() => v,
            // All zero, or NaN / infinite input: the scalar code defines what happens.
            _ => {
                scalar::quantize_q8_k(xs, o);
                continue;
            }
        };
        let iscale = -127.0 / max;
        let vs = _mm256_set1_ps(iscale);
        let lim = _mm256_set1_epi32(127);
        let (d, rest) = o.split_at_mut(4);
        let (qs, bsums) = rest.split_at_mut(256);
        for ((c, q), bs) in xs.chunks_exact(32).zip(qs.chunks_exact_mut(32)).zip(bsums.chunks_exact_mut(4)) {
            let p = c.as_ptr();
            let v: [__m256i; 4] = std::array::from_fn(|k| {
                // SAFETY: `c` is a chunk of exactly 32 f32 and `k < 4`: f32 `8k..8k + 8` of it.
                let r = _mm256_round_ps::<RN>(_mm256_mul_ps(vs, unsafe { _mm256_loadu_ps(p.add(8 * k)) }));
                _mm256_min_epi32(_mm256_cvtps_epi32(r), lim)
            });
            let lo = _mm256_add_epi32(v[0], v[1]);
            let hi = _mm256_add_epi32(v[2], v[3]);
            // [sum of lo, sum of hi] via one horizontal reduction of both.
            let h = _mm256_hadd_epi32(lo, hi);
            let h = _mm256_hadd_epi32(h, h);
            let h = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            bs[..2].copy_from_slice(&(_mm_cvtsi128_si32(h) as i16).to_le_bytes());
            bs[2..].copy_from_slice(&(_mm_extract_epi32::<1>(h) as i16).to_le_bytes());
            let pk = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            let pk = _mm256_permutevar8x32_epi32(pk, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            // SAFETY: `q` is a chunk of exactly 32 bytes, the 32 stored.
            unsafe { _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, pk) };
        }
        d.copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
