//! F32, F16 and BF16 weights × f32 activations (AVX2 + FMA + F16C; AVX-512 uses these too): one
//! generic loop (`float_dot`) with four FMA accumulators, fed by a per-format load of eight
//! weights. The multi-token and multi-row versions are the one-token kernel per token and row.

use super::helpers::{hsum_ps, prefetch_weights};
use super::wrappers::{check_rows, safe_wrapper};
use crate::WeightType;
use std::arch::x86_64::*;

safe_wrapper!(float avx2_f32, dot_f32_avx2, WeightType::F32);
safe_wrapper!(float avx2_f16, dot_f16_avx2, WeightType::F16);
safe_wrapper!(float avx2_bf16, dot_bf16_avx2, WeightType::BF16);
crate::dot4_by_dot!(pub(super) avx2_f32_x4 = avx2_f32);
crate::dot4_by_dot!(pub(super) avx2_f16_x4 = avx2_f16);
crate::dot4_by_dot!(pub(super) avx2_bf16_x4 = avx2_bf16);
crate::rows_by_dot4!(pub(super) avx2_f32_rows = avx2_f32_x4);
crate::rows_by_dot4!(pub(super) avx2_f16_rows = avx2_f16_x4);
crate::rows_by_dot4!(pub(super) avx2_bf16_rows = avx2_bf16_x4);

/// F32 × F32 with four FMA accumulators.
///
/// # Safety
/// AVX2/FMA present; `n` f32s readable at each of `w` and `a` (any alignment).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32_avx2(n: usize, w: *const u8, a: *const u8) -> f32 {
    let (wf, af) = (w as *const f32, a as *const f32);
    // SAFETY: `float_dot` calls `load8(i)` only with `i + 8 <= n` and `load1(i)`
    // with `i < n`, and `n` f32 are readable at `w`.
    let load8 = |i: usize| unsafe { _mm256_loadu_ps(wf.add(i)) };
    // SAFETY: see `load8`.
    let load1 = |i: usize| unsafe { wf.add(i).read_unaligned() };
    // SAFETY: `load8` / `load1` are valid for those indices (above); `n` f32 readable at `af`.
    unsafe { float_dot(n, w, 4, load8, load1, af) }
}

/// F16 × F32.
///
/// # Safety
/// AVX2/FMA/F16C present; `n` f16 readable at `w`, `n` f32 at `a` (any alignment).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_avx2(n: usize, w: *const u8, a: *const u8) -> f32 {
    let (wh, af) = (w as *const u16, a as *const f32);
    // SAFETY: `float_dot` calls `load8(i)` only with `i + 8 <= n` (eight f16, 16
    // bytes) and `load1(i)` with `i < n`, and `n` f16 are readable at `w`.
    let load8 = |i: usize| _mm256_cvtph_ps(unsafe { _mm_loadu_si128(wh.add(i) as *const __m128i) });
    // SAFETY: see `load8`.
    let load1 = |i: usize| half::f16::from_bits(unsafe { wh.add(i).read_unaligned() }).to_f32();
    // SAFETY: `load8` / `load1` are valid for those indices (above); `n` f32 readable at `af`.
    unsafe { float_dot(n, w, 2, load8, load1, af) }
}

/// BF16 × F32.
///
/// # Safety
/// AVX2/FMA present; `n` bf16 readable at `w`, `n` f32 at `a` (any alignment).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16_avx2(n: usize, w: *const u8, a: *const u8) -> f32 {
    let (wh, af) = (w as *const u16, a as *const f32);
    let load8 = |i: usize| {
        // SAFETY: `float_dot` calls `load8(i)` only with `i + 8 <= n` (eight bf16, 16 bytes), and
        // `n` bf16 are readable at `w`.
        let x = _mm256_cvtepu16_epi32(unsafe { _mm_loadu_si128(wh.add(i) as *const __m128i) });
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x))
    };
    // SAFETY: `float_dot` calls `load1(i)` only with `i < n`.
    let load1 = |i: usize| f32::from_bits((unsafe { wh.add(i).read_unaligned() } as u32) << 16);
    // SAFETY: `load8` / `load1` are valid for those indices (above); `n` f32 readable at `af`.
    unsafe { float_dot(n, w, 2, load8, load1, af) }
}

/// `Σ w[i]·a[i]` for weights (`elem` bytes each, at `w`) loaded 8 at a time by `load8` (1 at a time
/// by `load1` for the tail).
///
/// # Safety
/// AVX2/FMA present; `load8(i)` / `load1(i)` valid for `i + 8 <= n` / `i < n`; `n` f32s
/// readable at `a` (unaligned is fine).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_dot(
    n: usize,
    w: *const u8,
    elem: usize,
    load8: impl Fn(usize) -> __m256,
    load1: impl Fn(usize) -> f32,
    a: *const f32,
) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        prefetch_weights(w.wrapping_add(i * elem), 32 * elem);
        for (k, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `i + 8k + 8 <= i + 32 <= n`: the 8 f32 are inside the `n` at `a`.
            *acc = _mm256_fmadd_ps(load8(i + 8 * k), unsafe { _mm256_loadu_ps(a.add(i + 8 * k)) }, *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`: the 8 f32 are inside the `n` at `a`.
        acc[0] = _mm256_fmadd_ps(load8(i), unsafe { _mm256_loadu_ps(a.add(i)) }, acc[0]);
        i += 8;
    }
    let mut sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    while i < n {
        // SAFETY: `i < n`: f32 `i` of the `n` at `a`.
        sum += load1(i) * unsafe { a.add(i).read_unaligned() };
        i += 1;
    }
    sum
}
