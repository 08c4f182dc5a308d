//! AVX2 (+ FMA + F16C) kernels for the non-K block formats: Q4_0 × Q8_0, Q4_1 × Q8_1, Q5_0 × Q8_0
//! and Q8_0 × Q8_0, one token ([`DotFn`]), four tokens as two pairs ([`Dot4Fn`]) and many weight
//! rows × four tokens with the activation headers converted once ([`Dot4RowsFn`]). Each is one
//! `block_dot!` loop (see [`super::block_dot`]) with the format's unpacking and integer product.

use super::block_dot::{block_dot, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q8_0_BYTES, Q8_1_BYTES};
use super::helpers::{bytes_from_bits, hsum_ps, load4_u32, mul_us_avx2, nibbles, prefetch_weights, sched_barrier};
use super::wrappers::{act_headers, check_row_block, check_rows, check_rows4, safe_wrapper, MAX_PRE_BLOCKS};
use crate::WeightType;
#[cfg(doc)]
use crate::{Dot4Fn, Dot4RowsFn, DotFn};
use std::arch::x86_64::*;

safe_wrapper!(
    avx2_q4_0,
    avx2_q4_0_x4,
    dot_q4_0_avx2,
    WeightType::Q4_0,
    tokens = 2,
    rows = avx2_q4_0_rows,
    "avx2,fma,f16c"
);
safe_wrapper!(
    avx2_q4_1,
    avx2_q4_1_x4,
    dot_q4_1_avx2,
    WeightType::Q4_1,
    tokens = 2,
    rows = avx2_q4_1_rows,
    "avx2,fma,f16c"
);
safe_wrapper!(
    avx2_q5_0,
    avx2_q5_0_x4,
    dot_q5_0_avx2,
    WeightType::Q5_0,
    tokens = 2,
    rows = avx2_q5_0_rows,
    "avx2,fma,f16c"
);
safe_wrapper!(
    avx2_q8_0,
    avx2_q8_0_x4,
    dot_q8_0_avx2,
    WeightType::Q8_0,
    tokens = 2,
    rows = avx2_q8_0_rows,
    "avx2,fma,f16c"
);

// ---------------------------------------------------------------------------------------------
// AVX2 kernels
// ---------------------------------------------------------------------------------------------
//
// Block kernels take `T` activation rows (`T` = 1 for a single dot; the AVX2 multi-token wrappers
// use `T` = 2, since four tokens' accumulators would not fit in 16 `ymm` registers).

/// Q4_1 × Q8_1 (AVX2). SAFETY: AVX2/FMA/F16C present; `w` and every `a[t]` point to `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1_avx2<const T: usize, const PRE: bool>(
    nb: usize,
    w: *const u8,
    a: [*const u8; T],
    ah: [*const f32; T],
) -> [f32; T] {
    block_dot!(
        T,
        PRE,
        nb,
        w,
        a,
        ah,
        Q4_1_BYTES,
        Q8_1_BYTES,
        true,
        // SAFETY: `wp` is a whole Q4_1 block (`block_dot!`); its 16 quant bytes start at byte 4.
        |wp| unsafe { nibbles(wp.add(4)) },
        // SAFETY: `ap` is a whole Q8_1 block (`block_dot!`); its 32 quants start at byte 4.
        |qx, ap| mul_us_avx2(qx, unsafe { _mm256_loadu_si256(ap.add(4) as *const __m256i) })
    )
}

/// Q4_0 × Q8_0 (AVX2): `Σ q·a − 8·Σ a` per block. SAFETY: as [`dot_q4_1_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0_avx2<const T: usize, const PRE: bool>(
    nb: usize,
    w: *const u8,
    a: [*const u8; T],
    ah: [*const f32; T],
) -> [f32; T] {
    block_dot!(
        T,
        PRE,
        nb,
        w,
        a,
        ah,
        Q4_0_BYTES,
        Q8_0_BYTES,
        false,
        // SAFETY: `wp` is a whole Q4_0 block (`block_dot!`); its 16 quant bytes start at byte 2.
        |wp| unsafe { nibbles(wp.add(2)) },
        |qx, ap| {
            // SAFETY: `ap` is a whole Q8_0 block (`block_dot!`); its 32 quants start at byte 2.
            let qy = unsafe { _mm256_loadu_si256(ap.add(2) as *const __m256i) };
            let p = _mm256_maddubs_epi16(qx, qy);
            let p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(_mm256_set1_epi8(8), qy));
            _mm256_madd_epi16(p, _mm256_set1_epi16(1))
        }
    )
}

/// Q5_0 × Q8_0 (AVX2): `Σ q·a − 16·Σ a` per block. SAFETY: as [`dot_q4_1_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0_avx2<const T: usize, const PRE: bool>(
    nb: usize,
    w: *const u8,
    a: [*const u8; T],
    ah: [*const f32; T],
) -> [f32; T] {
    block_dot!(
        T,
        PRE,
        nb,
        w,
        a,
        ah,
        Q5_0_BYTES,
        Q8_0_BYTES,
        false,
        |wp| {
            // SAFETY: `wp` is a whole Q5_0 block (`block_dot!`): its 4 high-bit bytes start at
            // byte 2, its 16 nibble bytes at byte 6.
            let (qh, q4) = unsafe { (bytes_from_bits(wp.add(2)), nibbles(wp.add(6))) };
            _mm256_or_si256(q4, _mm256_and_si256(qh, _mm256_set1_epi8(0x10)))
        },
        |qx, ap| {
            // SAFETY: `ap` is a whole Q8_0 block (`block_dot!`); its 32 quants start at byte 2.
            let qy = unsafe { _mm256_loadu_si256(ap.add(2) as *const __m256i) };
            let p = _mm256_maddubs_epi16(qx, qy);
            let p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(_mm256_set1_epi8(16), qy));
            _mm256_madd_epi16(p, _mm256_set1_epi16(1))
        }
    )
}

/// Q8_0 × Q8_0 (AVX2): `|x| · (sign(x) · y)`. SAFETY: as [`dot_q4_1_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_avx2<const T: usize, const PRE: bool>(
    nb: usize,
    w: *const u8,
    a: [*const u8; T],
    ah: [*const f32; T],
) -> [f32; T] {
    block_dot!(
        T,
        PRE,
        nb,
        w,
        a,
        ah,
        Q8_0_BYTES,
        Q8_0_BYTES,
        false,
        |wp| {
            // SAFETY: `wp` is a whole Q8_0 block (`block_dot!`); its 32 quants start at byte 2.
            let qx = unsafe { _mm256_loadu_si256(wp.add(2) as *const __m256i) };
            (_mm256_abs_epi8(qx), qx)
        },
        |qx, ap| {
            // SAFETY: as for `wp`: `ap` is a whole Q8_0 block.
            let qy = unsafe { _mm256_loadu_si256(ap.add(2) as *const __m256i) };
            mul_us_avx2(qx.0, _mm256_sign_epi8(qy, qx.1))
        }
    )
}
