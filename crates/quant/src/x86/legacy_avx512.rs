//! AVX-512 VNNI kernels (256-bit `vpdpbusd`) for the non-K block formats: Q4_0 × Q8_0, Q4_1 × Q8_1,
//! Q5_0 × Q8_0 and Q8_0 × Q8_0, one token ([`DotFn`]) and four tokens ([`Dot4Fn`]). Each is one
//! `block_dot!` loop (see [`super::block_dot`]); their many-row versions are [`super::pair`]'s.

use super::block_dot::{block_dot, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q8_0_BYTES, Q8_1_BYTES};
use super::helpers::{hsum_ps, load4_u32, mul_us_vnni, nibbles, nibbles_x16, prefetch_weights, sched_barrier};
use super::wrappers::{check_rows, check_rows4, safe_wrapper};
use crate::WeightType;
#[cfg(doc)]
use crate::{Dot4Fn, DotFn};
use std::arch::x86_64::*;

safe_wrapper!(avx512_q4_0, avx512_q4_0_x4, dot_q4_0_avx512, WeightType::Q4_0, tokens = 4);
safe_wrapper!(avx512_q4_1, avx512_q4_1_x4, dot_q4_1_avx512, WeightType::Q4_1, tokens = 4);
safe_wrapper!(avx512_q5_0, avx512_q5_0_x4, dot_q5_0_avx512, WeightType::Q5_0, tokens = 4);
safe_wrapper!(avx512_q8_0, avx512_q8_0_x4, dot_q8_0_avx512, WeightType::Q8_0, tokens = 4);

// ---------------------------------------------------------------------------------------------
// AVX-512 VNNI kernels (256-bit `vpdpbusd`)
// ---------------------------------------------------------------------------------------------
//
// With AVX-512 VL the 32 `ymm` registers hold four tokens' accumulators: the multi-token wrappers
// use `T` = 4.

/// Q4_1 × Q8_1 (VNNI). SAFETY: AVX-512 F/BW/VL/VNNI + AVX2/FMA/F16C present; `w` and every `a[t]`
/// point to `nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q4_1_avx512<const T: usize, const PRE: bool>(
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
        hi_scale = 1.0 / 16.0,
        // SAFETY: `wp` is a whole Q4_1 block (`block_dot!`); its 16 quant bytes start at byte 4.
        |wp| unsafe { nibbles_x16(wp.add(4)) },
        // SAFETY: `ap` is a whole Q8_1 block (`block_dot!`); its 32 quants start at byte 4.
        |qx, ap| mul_us_vnni(qx, unsafe { _mm256_loadu_si256(ap.add(4) as *const __m256i) })
    )
}

/// Q4_0 × Q8_0 (VNNI): `Σ q·a − Σ 8·a`, quants as in [`nibbles_x16`]. SAFETY: as [`dot_q4_1_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q4_0_avx512<const T: usize, const PRE: bool>(
    nb: usize,
    w: *const u8,
    a: [*const u8; T],
    ah: [*const f32; T],
) -> [f32; T] {
    // The offset in the same ×16 layout as the quants: 8 in the low lane, 8 · 16 in the high.
    const LO: i64 = 0x0808_0808_0808_0808;
    const HI: i64 = 0x8080_8080_8080_8080_u64 as i64;
    let off = _mm256_setr_epi64x(LO, LO, HI, HI);
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
        hi_scale = 1.0 / 16.0,
        // SAFETY: `wp` is a whole Q4_0 block (`block_dot!`); its 16 quant bytes start at byte 2.
        |wp| unsafe { nibbles_x16(wp.add(2)) },
        |qx, ap| {
            // SAFETY: `ap` is a whole Q8_0 block (`block_dot!`); its 32 quants start at byte 2.
            let qy = unsafe { _mm256_loadu_si256(ap.add(2) as *const __m256i) };
            _mm256_sub_epi32(mul_us_vnni(qx, qy), mul_us_vnni(off, qy))
        }
    )
}

/// Q5_0 × Q8_0 (VNNI): `Σ q·a − 16·Σ a`, the fifth bits coming in as a byte mask. SAFETY: as
/// [`dot_q4_1_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q5_0_avx512<const T: usize, const PRE: bool>(
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
            let (qh, nib): (__mmask32, _) =
                unsafe { (std::ptr::read_unaligned(wp.add(2) as *const u32), nibbles(wp.add(6))) };
            _mm256_mask_add_epi8(nib, qh, nib, _mm256_set1_epi8(16))
        },
        |qx, ap| {
            // SAFETY: `ap` is a whole Q8_0 block (`block_dot!`); its 32 quants start at byte 2.
            let qy = unsafe { _mm256_loadu_si256(ap.add(2) as *const __m256i) };
            _mm256_sub_epi32(mul_us_vnni(qx, qy), mul_us_vnni(_mm256_set1_epi8(16), qy))
        }
    )
}

/// Q8_0 × Q8_0 (VNNI). SAFETY: as [`dot_q4_1_avx512`].
///
/// One token: `|x| · sign(y, x)` (one `vpdpbusd`; `y = −128` never comes out of the activation
/// quantizers). Several tokens: `x · (y + 128) − 128·Σ x` — the activations made unsigned with one
/// `vpxor` per token (which can issue on port 5, unlike `vpsignb`) and the correction, which
/// depends on the weights only, computed once per block and seeding each token's `vpdpbusd`.
/// Both integer sums are exact for every `x` and every `y > −128`, so they are equal.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q8_0_avx512<const T: usize, const PRE: bool>(
    nb: usize,
    w: *const u8,
    a: [*const u8; T],
    ah: [*const f32; T],
) -> [f32; T] {
    if T == 1 {
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
                mul_us_vnni(qx.0, _mm256_sign_epi8(qy, qx.1))
            }
        )
    } else {
        let x80 = _mm256_set1_epi8(0x80u8 as i8);
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
                (qx, _mm256_sub_epi32(_mm256_setzero_si256(), mul_us_vnni(x80, qx)))
            },
            |qx, ap| {
                // SAFETY: as for `wp`: `ap` is a whole Q8_0 block.
                let qy = unsafe { _mm256_loadu_si256(ap.add(2) as *const __m256i) };
                _mm256_dpbusd_epi32(qx.1, _mm256_xor_si256(qy, x80), qx.0)
            }
        )
    }
}
