//! AVX-512 VNNI and AVX2 kernels for the 16-row interleaved Q5_0 layout ([`crate::packed_q5_0`]).
//!
//! Per packed block (16 rows × 32 values) the weights are unpacked once for all tokens of the
//! call: four 64-byte loads of nibbles, each giving two registers of 16 rows × 4 values (`and`,
//! shift + `and`), the fifth bits added by one masked byte add per register with the layout's
//! ready-made 64-bit masks. Each register then meets each token's 4-byte broadcast of the matching
//! activations in one `vpdpbusd`, so a block's 16 row sums accumulate in the lanes of one register
//! per token (two chains, low and high quads, for latency), seeded with `−16·Σ a` (the quants'
//! offset; prepared once per call). Then one convert and one fused multiply-add per block and
//! token: `acc = fma(d_w · d_a, sum, acc)`, lane for lane the scalar reference
//! [`crate::packed_q5_0::gemv_q5_0_x16`].
//!
//! AVX2 ([`group_avx2`]) takes each half of the 16 rows in its own register (8 rows × 4 values):
//! the weights of a block are unpacked once into 16 registers (nibbles split, the fifth bits
//! spread from the same masks with GGML's `bytes_from_bits_32` and or'ed in), then per token
//! `vpmaddubsw` against the 4-byte broadcasts and 16-bit adds over four quads (at most
//! `4 · 2 · 31 · 127 = 31,496`: exact), one `vpmaddwd` per four quads to 32 bits, and the same
//! convert and fused multiply-add per block, half and token.
//!
//! # Safety invariant
//!
//! As in [`crate::x86`]: the kernels are `unsafe fn`s compiled with `#[target_feature]`, reachable
//! only through [`gemv`] and [`gemm`], which check the lengths and that the CPU supports
//! [`Isa::Avx512Vnni`] (AVX-512 F/BW/VL/VNNI with AVX2, FMA and F16C) before calling the VNNI
//! kernels, or [`Isa::Avx2`] (AVX2, FMA and F16C) before calling the AVX2 one.

use crate::blocks::BlockQ8_0;
use crate::packed_q5_0::{check, BlockQ5_0x16, PACK_ROWS_Q5_0};
use crate::Isa;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::mem::size_of;

const WB: usize = size_of::<BlockQ5_0x16>();
const AB: usize = size_of::<BlockQ8_0>();
/// Offsets inside a packed block: the 64-bit fifth-bit masks, then the nibbles.
const QH: usize = 32;
const QS: usize = 96;

thread_local! {
    /// Per call: each token's `−16·Σ a` and `d_a` per block (token-major).
    static PREP: RefCell<(Vec<i32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Fills `corr[t·nb + b] = −16·Σ a` and `da[t·nb + b] = d_a` for block `b` of token `t`.
///
/// SAFETY: AVX2 and F16C present; every `a[t]` points to `nb` readable Q8_0 blocks; `corr` and
/// `da` hold `T · nb` values.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prepare<const T: usize>(nb: usize, a: [*const u8; T], corr: &mut [i32], da: &mut [f32]) {
    let flip = _mm256_set1_epi8(-128);
    for (t, &at) in a.iter().enumerate() {
        for b in 0..nb {
            // SAFETY: block `b < nb` of token `t`: its 2-byte header and 32 quants (the caller's
            // contract).
            let (x, h) = unsafe {
                let p = at.add(b * AB);
                (_mm256_loadu_si256(p.add(2) as *const __m256i), std::ptr::read_unaligned(p as *const u16))
            };
            // Σ (a + 128) per 8 bytes, then over the four partial sums.
            let s = _mm256_sad_epu8(_mm256_xor_si256(x, flip), _mm256_setzero_si256());
            let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let sum = (_mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s)) as i32 - 32 * 128;
            corr[t * nb + b] = -16 * sum;
            da[t * nb + b] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))));
        }
    }
}

/// One group of 16 rows (`nb` packed blocks at `w`) times `T` tokens: the 16 rows' results per
/// token.
///
/// SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present; `w` points to `nb` readable packed
/// blocks; every `a[t]` to `nb` readable Q8_0 blocks; `corr` and `da` hold `T · nb` values
/// prepared by [`prepare`] from the same activations.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group<const T: usize>(nb: usize, w: *const u8, a: [*const u8; T], corr: &[i32], da: &[f32]) -> [__m512; T] {
    let low4 = _mm512_set1_epi8(0x0F);
    let c16 = _mm512_set1_epi8(16);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        // SAFETY: block `b < nb` of the group (the caller's contract).
        let x = unsafe { w.add(b * WB) };
        // SAFETY: the 16 f16 scales, bytes `0..32` of the block.
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(x as *const __m256i) });
        let mut lo: [__m512i; T] = std::array::from_fn(|t| _mm512_set1_epi32(corr[t * nb + b]));
        let mut hi = [_mm512_setzero_si512(); T];
        for g in 0..4 {
            // SAFETY: nibbles `64g..64g + 64` and masks `g`, `g + 4` (8 bytes each) of the block.
            let (v, kl, kh) = unsafe {
                (
                    _mm512_loadu_si512(x.add(QS + 64 * g) as *const __m512i),
                    std::ptr::read_unaligned(x.add(QH + 8 * g) as *const u64),
                    std::ptr::read_unaligned(x.add(QH + 8 * (g + 4)) as *const u64),
                )
            };
            let ql = _mm512_and_si512(v, low4);
            let qh = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4);
            let ql = _mm512_mask_add_epi8(ql, kl, ql, c16);
            let qh = _mm512_mask_add_epi8(qh, kh, qh, c16);
            for t in 0..T {
                // SAFETY: quants `4g..4g + 4` and `16 + 4g..16 + 4g + 4` of block `b < nb` of
                // token `t` (the caller's contract).
                let (al, ah) = unsafe {
                    let q = a[t].add(b * AB + 2);
                    (
                        std::ptr::read_unaligned(q.add(4 * g) as *const i32),
                        std::ptr::read_unaligned(q.add(16 + 4 * g) as *const i32),
                    )
                };
                lo[t] = _mm512_dpbusd_epi32(lo[t], ql, _mm512_set1_epi32(al));
                hi[t] = _mm512_dpbusd_epi32(hi[t], qh, _mm512_set1_epi32(ah));
            }
        }
        for t in 0..T {
            let s = _mm512_mul_ps(dw, _mm512_set1_ps(da[t * nb + b]));
            acc[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_add_epi32(lo[t], hi[t])), acc[t]);
        }
    }
    acc
}

/// [`group`] on AVX2: one group of 16 rows times `T` tokens, rows `0..8` and `8..16` of each
/// token's result in `[lo, hi]`.
///
/// SAFETY: AVX2, FMA and F16C present; otherwise as [`group`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const T: usize>(
    nb: usize,
    w: *const u8,
    a: [*const u8; T],
    corr: &[i32],
    da: &[f32],
) -> [[__m256; 2]; T] {
    let low4 = _mm256_set1_epi8(0x0F);
    let c16 = _mm256_set1_epi8(16);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..nb {
        // SAFETY: block `b < nb` of the group (the caller's contract).
        let x = unsafe { w.add(b * WB) };
        // SAFETY: the 16 f16 scales, bytes `0..32` of the block.
        let dw = unsafe {
            [
                _mm256_cvtph_ps(_mm_loadu_si128(x as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(x.add(16) as *const __m128i)),
            ]
        };
        // `q[h][g]`: rows `8h..8h + 8` of quad `g` (values `4g..4g + 4` for `g < 4`, the high
        // nibbles' `16 + 4(g − 4)..` after), 4 values per row, fifth bits in.
        let mut q = [[_mm256_setzero_si256(); 8]; 2];
        for (h, qh) in q.iter_mut().enumerate() {
            for g in 0..4 {
                // SAFETY: nibbles `64g + 32h .. + 32` and 32-bit halves `h` of masks `g`, `g + 4`
                // of the block.
                let (v, bl, bh) = unsafe {
                    (
                        _mm256_loadu_si256(x.add(QS + 64 * g + 32 * h) as *const __m256i),
                        super::helpers::bytes_from_bits(x.add(QH + 8 * g + 4 * h)),
                        super::helpers::bytes_from_bits(x.add(QH + 8 * (g + 4) + 4 * h)),
                    )
                };
                let l = _mm256_and_si256(v, low4);
                let u = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
                qh[g] = _mm256_or_si256(l, _mm256_and_si256(bl, c16));
                qh[g + 4] = _mm256_or_si256(u, _mm256_and_si256(bh, c16));
            }
        }
        for t in 0..T {
            // SAFETY: the 32 quants of block `b < nb` of token `t` (the caller's contract), read
            // four at a time.
            let bc = |g: usize| unsafe {
                let p = a[t].add(b * AB + 2);
                _mm256_set1_epi32(std::ptr::read_unaligned(p.add(4 * g) as *const i32))
            };
            let s = _mm256_set1_ps(da[t * nb + b]);
            for (h, qh) in q.iter().enumerate() {
                let mut lo = _mm256_maddubs_epi16(qh[0], bc(0));
                let mut hi = _mm256_maddubs_epi16(qh[4], bc(4));
                for g in 1..4 {
                    lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(qh[g], bc(g)));
                    hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(qh[g + 4], bc(g + 4)));
                }
                let sum = _mm256_add_epi32(
                    _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones)),
                    _mm256_set1_epi32(corr[t * nb + b]),
                );
                acc[t][h] = _mm256_fmadd_ps(_mm256_mul_ps(dw[h], s), _mm256_cvtepi32_ps(sum), acc[t][h]);
            }
        }
    }
    acc
}

/// Runs `f` with the thread's preparation buffers sized for `len` values each.
fn with_prep<R>(len: usize, f: impl FnOnce(&mut [i32], &mut [f32]) -> R) -> R {
    PREP.with(|p| {
        let mut p = p.borrow_mut();
        let (corr, da) = &mut *p;
        if corr.len() < len {
            corr.resize(len, 0);
            da.resize(len, 0.0);
        }
        f(&mut corr[..len], &mut da[..len])
    })
}

/// The packed gemv ([`crate::packed_q5_0::gemv_q5_0_x16`]) on `isa` where it has a kernel
/// (AVX-512 VNNI, AVX2): returns whether it ran. Safe: checks the lengths, and that the CPU runs it.
///
/// # Panics
/// As the reference.
pub fn gemv(isa: Isa, n: usize, w: &[u8], a: &[u8], out: &mut [f32]) -> bool {
    let vnni = isa >= Isa::Avx512Vnni && isa.is_supported();
    let avx2 = isa >= Isa::Avx2 && Isa::Avx2.is_supported();
    if !(vnni || avx2) {
        return false;
    }
    let (nb, groups) = check(n, w, a);
    assert_eq!(out.len(), groups * PACK_ROWS_Q5_0, "16 outputs per group");
    with_prep(nb, |corr, da| {
        // SAFETY: `Avx512Vnni` (with `vnni`) or `Avx2` is supported (checked above); `check`
        // verified `groups` whole groups of `nb` blocks in `w` and `nb` blocks in `a`; the buffers
        // hold `nb` values; each store writes the 16 (or 8 + 8) outputs of group `k`.
        unsafe {
            prepare::<1>(nb, [a.as_ptr()], corr, da);
            for (k, o) in out.chunks_exact_mut(PACK_ROWS_Q5_0).enumerate() {
                let wk = w.as_ptr().add(k * nb * WB);
                if vnni {
                    let [acc] = group::<1>(nb, wk, [a.as_ptr()], corr, da);
                    _mm512_storeu_ps(o.as_mut_ptr(), acc);
                } else {
                    let [[lo, hi]] = group_avx2::<1>(nb, wk, [a.as_ptr()], corr, da);
                    _mm256_storeu_ps(o.as_mut_ptr(), lo);
                    _mm256_storeu_ps(o.as_mut_ptr().add(8), hi);
                }
            }
        }
    });
    true
}

/// The packed product with four tokens ([`crate::packed_q5_0::gemm_q5_0_x16_on`]) on `isa` where
/// it has a kernel (AVX-512 VNNI, AVX2): returns whether it ran. Safe: checks the lengths, and that the
/// CPU runs it.
///
/// # Panics
/// As the reference, for each token.
pub fn gemm(isa: Isa, n: usize, w: &[u8], a: [&[u8]; 4], out: &mut [[f32; 4]]) -> bool {
    let vnni = isa >= Isa::Avx512Vnni && isa.is_supported();
    let avx2 = isa >= Isa::Avx2 && Isa::Avx2.is_supported();
    if !(vnni || avx2) {
        return false;
    }
    let (nb, groups) = check(n, w, a[0]);
    for a in &a[1..] {
        check(n, w, a);
    }
    assert_eq!(out.len(), groups * PACK_ROWS_Q5_0, "16 outputs per group");
    let ap = a.map(<[u8]>::as_ptr);
    with_prep(4 * nb, |corr, da| {
        // SAFETY: `Avx512Vnni` (with `vnni`) or `Avx2` is supported (checked above); `check`
        // verified `groups` whole groups of `nb` blocks in `w` and `nb` blocks in every `a[t]`;
        // the buffers hold `4 · nb` values.
        unsafe {
            prepare::<4>(nb, ap, corr, da);
            for (k, o) in out.chunks_exact_mut(PACK_ROWS_Q5_0).enumerate() {
                let wk = w.as_ptr().add(k * nb * WB);
                if vnni {
                    super::helpers::store_rows_x4(group::<4>(nb, wk, ap, corr, da), o);
                } else {
                    let acc = group_avx2::<4>(nb, wk, ap, corr, da);
                    let mut y = [[0f32; 16]; 4];
                    for (y, [lo, hi]) in y.iter_mut().zip(acc) {
                        _mm256_storeu_ps(y.as_mut_ptr(), lo);
                        _mm256_storeu_ps(y.as_mut_ptr().add(8), hi);
                    }
                    for (r, o) in o.iter_mut().enumerate() {
                        *o = [y[0][r], y[1][r], y[2][r], y[3][r]];
                    }
                }
            }
        }
    });
    true
}
