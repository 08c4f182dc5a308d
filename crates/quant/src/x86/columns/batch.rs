//! The SIMD parts of the batched column kernel ([`crate::columns::axpy_cols_batch`]): its f32
//! multiply-adds (`y += Σ a·s` over dequantized scratch columns) and its dequantizers of whole
//! column blocks, for AVX2 and AVX-512. Same safety invariant as the parent module: every kernel
//! is an `unsafe fn` reached only through a safe wrapper handed out after feature detection.

use super::*;
use crate::columns::{check_madd, DeqFn, MaddFn};

/// The SIMD f32 multiply-add of the batched kernel for `isa` (`None`: use the scalar one).
pub(crate) fn madd_fn(isa: Isa) -> Option<MaddFn> {
    if isa >= Isa::Avx512Vnni && has_avx512() {
        return Some(madd_avx512);
    }
    if isa >= Isa::Avx2 && has_avx2() {
        return Some(madd_avx2);
    }
    None
}

/// The SIMD dequantizer of the batched kernel for `ty` and `isa` (`None`: use the scalar one).
pub(crate) fn dequant_fn(ty: ColType, isa: Isa) -> Option<DeqFn> {
    if isa >= Isa::Avx512Vnni && has_avx512() {
        return Some(match ty {
            ColType::Q4_1 => deq_avx512_q4_1,
            ColType::Q5_0 => deq_avx512_q5_0,
            ColType::Q8_0 => deq_avx512_q8_0,
        });
    }
    if isa >= Isa::Avx2 && has_avx2() {
        return Some(match ty {
            ColType::Q4_1 => deq_avx2_q4_1,
            ColType::Q5_0 => deq_avx2_q5_0,
            ColType::Q8_0 => deq_avx2_q8_0,
        });
    }
    None
}

fn madd_avx512(y: &mut [f32], s: &[f32], w: usize, terms: &[(f32, usize)]) {
    check_madd(y, s, w, terms);
    // SAFETY: handed out only after AVX-512 F/BW/VL + AVX2/FMA/F16C detection (module
    // invariant); `check_madd` verified `y.len() == w` and every term's scratch column in `s`.
    unsafe { madd_avx512_k(y.as_mut_ptr(), s.as_ptr(), w, terms) }
}

fn madd_avx2(y: &mut [f32], s: &[f32], w: usize, terms: &[(f32, usize)]) {
    check_madd(y, s, w, terms);
    // SAFETY: as `madd_avx512`, with AVX2/FMA/F16C detected.
    unsafe { madd_avx2_k(y.as_mut_ptr(), s.as_ptr(), w, terms) }
}

/// `y[..w] += Σ a · s[g·w..][..w]`, 32 outputs at a time held in registers across the terms.
///
/// SAFETY: AVX-512F present; `w` (a multiple of 32) f32 at `y`; `g·w + w` f32 at `s` for every
/// term.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn madd_avx512_k(y: *mut f32, s: *const f32, w: usize, terms: &[(f32, usize)]) {
    // In this function, the outputs `v..v + 128` (or `v..v + 32`) of an iteration are inside the
    // `w` f32 at `y` by the loop condition, and for a term `(a, g)` the f32 `g·w + v..` of the same
    // length inside `s`, which holds `g·w + w` f32 (the caller's contract).
    let mut v = 0;
    // 128 outputs (eight independent FMA chains) at a time, then 32.
    while v + 128 <= w {
        let mut acc = [_mm512_setzero_ps(); 8];
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: `j < 8`: f32 `v + 16j..v + 16j + 16 <= v + 128 <= w` of `y`.
            *a = unsafe { _mm512_loadu_ps(y.add(v + 16 * j)) };
        }
        for &(a, g) in terms {
            // SAFETY: f32 `g·w + v`, the start of this iteration's 128 values of column `g` of `s`.
            let sp = unsafe { s.add(g * w + v) };
            let a = _mm512_set1_ps(a);
            for (j, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `j < 8`: f32 `16j..16j + 16` of those 128 values.
                *acc = _mm512_fmadd_ps(a, unsafe { _mm512_loadu_ps(sp.add(16 * j)) }, *acc);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: as for the loads from `y` above.
            unsafe { _mm512_storeu_ps(y.add(v + 16 * j), *a) };
        }
        v += 128;
    }
    while v + 32 <= w {
        // SAFETY: `v + 32 <= w`: f32 `v..v + 32` of `y`.
        let (mut a0, mut a1) = unsafe { (_mm512_loadu_ps(y.add(v)), _mm512_loadu_ps(y.add(v + 16))) };
        for &(a, g) in terms {
            // SAFETY: f32 `g·w + v..g·w + v + 32` of `s`, inside column `g` (`v + 32 <= w`).
            let (s0, s1) = unsafe {
                let sp = s.add(g * w + v);
                (_mm512_loadu_ps(sp), _mm512_loadu_ps(sp.add(16)))
            };
            let a = _mm512_set1_ps(a);
            a0 = _mm512_fmadd_ps(a, s0, a0);
            a1 = _mm512_fmadd_ps(a, s1, a1);
        }
        // SAFETY: f32 `v..v + 32` of `y`, as loaded above.
        unsafe {
            _mm512_storeu_ps(y.add(v), a0);
            _mm512_storeu_ps(y.add(v + 16), a1);
        }
        v += 32;
    }
}

/// The AVX2 twin of [`madd_avx512_k`]. SAFETY: as there, with AVX2/FMA present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn madd_avx2_k(y: *mut f32, s: *const f32, w: usize, terms: &[(f32, usize)]) {
    // As in `madd_avx512_k`: an iteration's outputs `v..v + 64` (or `v..v + 32`) are inside the
    // `w` f32 at `y` by the loop condition, and term `(a, g)`'s f32 `g·w + v..` of the same length
    // inside the `g·w + w` at `s` (the caller's contract).
    let mut v = 0;
    // 64 outputs (eight independent FMA chains) at a time, then 32.
    while v + 64 <= w {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: `j < 8`: f32 `v + 8j..v + 8j + 8 <= v + 64 <= w` of `y`.
            *a = unsafe { _mm256_loadu_ps(y.add(v + 8 * j)) };
        }
        for &(a, g) in terms {
            // SAFETY: f32 `g·w + v`, the start of this iteration's 64 values of column `g` of `s`.
            let sp = unsafe { s.add(g * w + v) };
            let a = _mm256_set1_ps(a);
            for (j, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `j < 8`: f32 `8j..8j + 8` of those 64 values.
                *acc = _mm256_fmadd_ps(a, unsafe { _mm256_loadu_ps(sp.add(8 * j)) }, *acc);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: as for the loads from `y` above.
            unsafe { _mm256_storeu_ps(y.add(v + 8 * j), *a) };
        }
        v += 64;
    }
    while v + 32 <= w {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: `j < 4`: f32 `v + 8j..v + 8j + 8 <= v + 32 <= w` of `y`.
            *a = unsafe { _mm256_loadu_ps(y.add(v + 8 * j)) };
        }
        for &(a, g) in terms {
            // SAFETY: f32 `g·w + v`, the start of this iteration's 32 values of column `g` of `s`.
            let sp = unsafe { s.add(g * w + v) };
            let a = _mm256_set1_ps(a);
            for (j, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `j < 4`: f32 `8j..8j + 8` of those 32 values.
                *acc = _mm256_fmadd_ps(a, unsafe { _mm256_loadu_ps(sp.add(8 * j)) }, *acc);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: as for the loads from `y` above.
            unsafe { _mm256_storeu_ps(y.add(v + 8 * j), *a) };
        }
        v += 32;
    }
}

// ---------------------------------------------------------------------------------------------
// Dequantizers of the batched kernel
// ---------------------------------------------------------------------------------------------

macro_rules! deq_wrapper {
    ($name:ident, $kernel:ident, $tag:expr) => {
        fn $name(src: &[u8], dst: &mut [f32]) {
            assert!(dst.len().is_multiple_of(32), "dequantize: {} values is not a whole number of blocks", dst.len());
            let nb = dst.len() / 32;
            assert!(src.len() >= nb * bytes($tag), "dequantize: {} bytes hold fewer than {nb} blocks", src.len());
            // SAFETY: handed out only after run-time detection of every feature `$kernel` is
            // compiled for (module invariant); `src` holds `nb` blocks and `dst` their values.
            unsafe { $kernel::<{ $tag }>(src.as_ptr(), nb, dst.as_mut_ptr()) }
        }
    };
}

deq_wrapper!(deq_avx512_q4_1, dequant_avx512, Q4_1);
deq_wrapper!(deq_avx512_q5_0, dequant_avx512, Q5_0);
deq_wrapper!(deq_avx512_q8_0, dequant_avx512, Q8_0);
deq_wrapper!(deq_avx2_q4_1, dequant_avx2, Q4_1);
deq_wrapper!(deq_avx2_q5_0, dequant_avx2, Q5_0);
deq_wrapper!(deq_avx2_q8_0, dequant_avx2, Q8_0);

/// The block's two header f16 values as f32 (`d` and Q4_1's `m`; junk for the others).
///
/// SAFETY: F16C present; 4 bytes readable at `b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn header(b: *const u8) -> (f32, f32) {
    // SAFETY: an unaligned read of the 4 bytes at `b`, readable by the caller's contract.
    let h = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe { std::ptr::read_unaligned(b as *const i32) }));
    (_mm_cvtss_f32(h), _mm_cvtss_f32(_mm_movehdup_ps(h)))
}

/// Dequantizes `nb` blocks at `src` into `32·nb` f32 at `dst` with the same f32 operations as
/// [`crate::scalar::dequantize_row`] (`q·d + m` as a product then a sum, `(q − 16)·d`, `q·d`), so
/// bit for bit its values. Q5_0's high half is `16·(q − 16)` times `d/16` (exact).
///
/// SAFETY: AVX-512 F/BW/VL, AVX2, FMA, F16C present; `nb` blocks at `src`; `32·nb` f32 at `dst`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dequant_avx512<const TY: u8>(src: *const u8, nb: usize, dst: *mut f32) {
    let bb = bytes(TY);
    for k in 0..nb {
        // SAFETY: `k < nb`: block `k` (`bb` bytes) at `src` is readable and its 32 output f32 at
        // `dst` writable (the caller's contract); each arm below reads that block's bytes (its
        // fields at the offsets named) and writes those 32 f32, in two halves of 16.
        unsafe {
            let b = src.add(k * bb);
            let o = dst.add(32 * k);
            let (d, m) = header(b);
            let dv = _mm512_set1_ps(d);
            match TY {
                Q4_1 => {
                    // Quants at 4..20.
                    let x = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(4) as *const __m128i));
                    let lo = _mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(15)));
                    let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(x));
                    let mv = _mm512_set1_ps(m);
                    _mm512_storeu_ps(o, _mm512_add_ps(_mm512_mul_ps(lo, dv), mv));
                    _mm512_storeu_ps(o.add(16), _mm512_add_ps(_mm512_mul_ps(hi, dv), mv));
                }
                Q5_0 => {
                    // High bits at 2..6, nibbles at 6..22.
                    let x = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(6) as *const __m128i));
                    let h0 = std::ptr::read_unaligned(b.add(2) as *const u16);
                    let h1 = std::ptr::read_unaligned(b.add(4) as *const u16);
                    let c15 = _mm512_set1_epi32(15);
                    let u = _mm512_or_si512(x, _mm512_set1_epi32(!15));
                    let lo = _mm512_mask_ternarylogic_epi32::<0xC0>(u, h0, c15, c15);
                    let cf0 = _mm512_set1_epi32(0xF0);
                    let v = _mm512_ternarylogic_epi32::<0xEA>(x, cf0, _mm512_set1_epi32(!0xFF));
                    let hi = _mm512_mask_ternarylogic_epi32::<0xC0>(v, h1, cf0, cf0);
                    _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), dv));
                    _mm512_storeu_ps(
                        o.add(16),
                        _mm512_mul_ps(_mm512_cvtepi32_ps(hi), _mm512_set1_ps(d * (1.0 / 16.0))),
                    );
                }
                _ => {
                    // Quants at 2..34.
                    let x0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2) as *const __m128i));
                    let x1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(18) as *const __m128i));
                    _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_cvtepi32_ps(x0), dv));
                    _mm512_storeu_ps(o.add(16), _mm512_mul_ps(_mm512_cvtepi32_ps(x1), dv));
                }
            }
        }
    }
}

/// The AVX2 twin of [`dequant_avx512`]. SAFETY: as there, with AVX2, FMA, F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_avx2<const TY: u8>(src: *const u8, nb: usize, dst: *mut f32) {
    let bb = bytes(TY);
    for k in 0..nb {
        // SAFETY: `k < nb`: block `k` (`bb` bytes) at `src` is readable and its 32 output f32 at
        // `dst` writable (the caller's contract); each arm below reads that block's fields (at
        // the offsets named), and the stores write those 32 f32 in quarters of 8.
        unsafe {
            let b = src.add(k * bb);
            let o = dst.add(32 * k);
            let (d, m) = header(b);
            let dv = _mm256_set1_ps(d);
            let x: [__m256i; 4] = match TY {
                Q4_1 => {
                    // Quants at 4..20.
                    let xa = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.add(4) as *const __m128i));
                    let xb = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.add(12) as *const __m128i));
                    let c15 = _mm256_set1_epi32(15);
                    [
                        _mm256_and_si256(xa, c15),
                        _mm256_and_si256(xb, c15),
                        _mm256_srli_epi32::<4>(xa),
                        _mm256_srli_epi32::<4>(xb),
                    ]
                }
                Q5_0 => {
                    // High bits at 2..6, nibbles at 6..22.
                    let q4 = nibbles(b.add(6));
                    let q = _mm256_or_si256(q4, _mm256_andnot_si256(bytes_from_bits(b.add(2)), _mm256_set1_epi8(-16)));
                    let lo = _mm256_castsi256_si128(q);
                    let hi = _mm256_extracti128_si256::<1>(q);
                    [
                        _mm256_cvtepi8_epi32(lo),
                        _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo)),
                        _mm256_cvtepi8_epi32(hi),
                        _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi)),
                    ]
                }
                // Quants at 2..34.
                _ => [
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(2) as *const __m128i)),
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(10) as *const __m128i)),
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(18) as *const __m128i)),
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(26) as *const __m128i)),
                ],
            };
            for (j, x) in x.into_iter().enumerate() {
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(x), dv);
                let v = if TY == Q4_1 { _mm256_add_ps(v, _mm256_set1_ps(m)) } else { v };
                _mm256_storeu_ps(o.add(8 * j), v);
            }
        }
    }
}
