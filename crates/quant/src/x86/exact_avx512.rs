//! AVX-512 kernels over exact columns ([`crate::exact`]): the AVX2 loop of [`super::exact`] on
//! 16-lane vectors.
//!
//! A column chunk of 32 outputs is two `zmm` of 16 f32: its 16 nibble bytes widen in one
//! `vpmovzxbd` (low nibbles are rows 0..15, high nibbles rows 16..31), and the 5th and 6th bits
//! come from the chunk's 32-bit planes as mask registers (`vpord` under the mask, one op per
//! plane and 16 rows) instead of being spread into bytes. Per lane the operations, and their
//! order, are the AVX2 kernel's: each column's FMA into the run sum in list order, then the scales
//! once per run. So this kernel gives the AVX2 kernel's result bit for bit (tested), in about half
//! the instructions.
//!
//! # Safety invariant
//!
//! As [`super::exact`]'s: [`axpy_avx512`] is reachable only through `wrapper`, handed out by
//! [`avx512_axpy_fn`] after [`has_avx512`] confirmed the features, which first runs
//! [`check_axpy_exact`]; each access below is within the bounds that check establishes.

use super::exact::{plan_groups, RUN_SUMS};
use super::has_avx512;
use crate::exact::{check_axpy_exact, piece_offset, ExactAxpyFn, ExactFormat, ExactMatrix, SubScales};
use std::arch::x86_64::*;
use std::ops::Range;

/// Columns per pass over the outputs.
const GROUP: usize = 8;

/// The AVX-512 kernel for `fmt` (`None` if this CPU lacks AVX-512 F/BW/VL + VNNI).
pub(crate) fn avx512_axpy_fn(fmt: ExactFormat) -> Option<ExactAxpyFn> {
    if !has_avx512() {
        return None;
    }
    Some(match (fmt.bits, fmt.sub_scales, fmt.has_offset) {
        (4, SubScales::None, false) => wrapper::<4, 0, false>,
        (4, SubScales::None, true) => wrapper::<4, 0, true>,
        (5, SubScales::None, false) => wrapper::<5, 0, false>,
        (8, SubScales::None, false) => wrapper::<8, 0, false>,
        (4, SubScales::Unsigned, true) => wrapper::<4, 1, true>,
        (5, SubScales::Unsigned, true) => wrapper::<5, 1, true>,
        (6, SubScales::Signed, false) => wrapper::<6, 2, false>,
        // The wide layouts of Q5_K and Q6_K (Q5_0's is the 8-bit legacy case above).
        (8, SubScales::Unsigned, true) => wrapper::<8, 1, true>,
        (8, SubScales::Signed, false) => wrapper::<8, 2, false>,
        _ => return None,
    })
}

fn wrapper<const BITS: u8, const SUB: u8, const OFF: bool>(
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
    assert!(
        m.fmt.bits == BITS && m.fmt.has_offset == OFF && (m.fmt.sub_scales != SubScales::None) == (SUB != 0),
        "exact column kernel chosen for another format"
    );
    RUN_SUMS.with(|t| {
        let mut t = t.borrow_mut();
        if t.len() < 32 * chunks.len() {
            t.resize(32 * chunks.len(), 0.0);
        }
        // SAFETY: the arguments passed `check_axpy_exact`, `avx512_axpy_fn` checked the features
        // (module docs), and `t` holds `32 · chunks.len()` f32.
        unsafe { axpy_avx512::<BITS, SUB, OFF>(m, idx, units, coef, chunks, y, &mut t) }
    })
}

/// The 32 integers of one column chunk at `p` as two vectors of 16 f32, rows in order.
///
/// # Safety
/// AVX-512 F/BW/VL present; `p..p + chunk_bytes` readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn load_q<const BITS: u8>(p: *const u8) -> [__m512; 2] {
    let f = _mm512_cvtepi32_ps;
    // SAFETY: every load below lies within the chunk's `chunk_bytes` (16, 20, 24 or 32 bytes at
    // `p`), readable by the caller's contract.
    unsafe {
        if BITS == 8 {
            return [
                f(_mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))),
                f(_mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(16) as *const __m128i))),
            ];
        }
        let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
        let mut lo = _mm512_and_si512(q, _mm512_set1_epi32(15));
        let mut hi = _mm512_srli_epi32::<4>(q);
        if BITS >= 5 {
            // Bit 4 of row k is bit k of the plane at byte 16.
            let b = (p.add(16) as *const u32).read_unaligned();
            let v = _mm512_set1_epi32(0x10);
            lo = _mm512_mask_or_epi32(lo, b as __mmask16, lo, v);
            hi = _mm512_mask_or_epi32(hi, (b >> 16) as __mmask16, hi, v);
        }
        if BITS == 6 {
            let b = (p.add(20) as *const u32).read_unaligned();
            let v = _mm512_set1_epi32(0x20);
            lo = _mm512_mask_or_epi32(lo, b as __mmask16, lo, v);
            hi = _mm512_mask_or_epi32(hi, (b >> 16) as __mmask16, hi, v);
        }
        [f(lo), f(hi)]
    }
}

/// 16 bytes at `p` as 16 f32, signed when `SIGNED`.
///
/// # Safety
/// AVX-512 F present; `p..p + 16` readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn bytes16<const SIGNED: bool>(p: *const u8) -> __m512 {
    // SAFETY: an unaligned 16-byte load, readable by the caller's contract.
    let v = unsafe { _mm_loadu_si128(p as *const __m128i) };
    _mm512_cvtepi32_ps(if SIGNED { _mm512_cvtepi8_epi32(v) } else { _mm512_cvtepu8_epi32(v) })
}

/// The loop of [`super::exact`]'s `axpy_avx2_with` (groups, run sums in `t`, prefetch of the next
/// group one pass ahead, scales at a run's last group), 16 rows per vector.
///
/// # Safety
/// AVX-512 F/BW/VL + AVX2/FMA/F16C present; the arguments passed [`check_axpy_exact`] (module
/// docs); `t` is `32 · chunks.len()` long.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn axpy_avx512<const BITS: u8, const SUB: u8, const OFF: bool>(
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    chunks: Range<usize>,
    y: &mut [f32],
    t: &mut [f32],
) {
    let f = m.fmt;
    let n_out = m.n_out;
    let (cb, kb) = (m.stride, f.chunk_bytes());
    let rec = f.scale_record_bytes(n_out);
    let f16s = if OFF { 4 } else { 2 };
    let sub_stride = if OFF { 2 * n_out } else { n_out };
    let zero = f.zero as f32;
    let cols = m.cols.as_ptr();
    let scales = m.scales.as_ptr();
    let (y_len, width) = (y.len(), 32 * chunks.len());
    let yp = y.as_mut_ptr();
    let tp = t.as_mut_ptr();
    let line_step = (64 / kb).max(1);
    let groups = plan_groups(units, f.sub_block, GROUP);
    let sub_at_of = |c: usize| {
        let base = (c / f.super_block) * rec;
        (base, base + f16s * n_out + ((c % f.super_block) / f.sub_block) * sub_stride)
    };
    for (gi, &(g0, g1, i0, last)) in groups.iter().enumerate() {
        // The run's output: `y`, or its piece's slice of it (`check_axpy_exact` checked the length).
        let y_off = piece_offset(i0, y_len, width);
        let (n0, n1, _, n_last) = groups.get(gi + 1).copied().unwrap_or((0, 0, 0, false));
        let next_scales = (n_last && n1 > n0).then(|| sub_at_of(units[n0] as usize));
        let first = g0 == i0;
        let (s, base, sub_at) = if last {
            let (base, sub_at) = sub_at_of(units[g0] as usize);
            (coef[i0..g1].iter().sum::<f32>(), base, sub_at)
        } else {
            (0.0, 0, 0)
        };
        let (sv, zs) = (_mm512_set1_ps(s), _mm512_set1_ps(zero * s));
        let mut ptrs = [cols; GROUP];
        let mut cf = [0f32; GROUP];
        for (k, i) in (g0..g1).enumerate() {
            // `idx[i]` names a whole column (checked): its bytes lie within `m.cols`.
            ptrs[k] = cols.wrapping_add(idx[i] as usize * cb);
            cf[k] = coef[i];
        }
        let n = g1 - g0;
        for (ci, ch) in chunks.clone().enumerate() {
            if ci % line_step == 0 {
                for &j in &idx[n0..n1] {
                    // A prefetch is a hint that never faults (the address lies within `m.cols`
                    // anyway: `j` is a checked index and `ch` a chunk of the column).
                    _mm_prefetch::<_MM_HINT_T0>(cols.wrapping_add(j as usize * cb + ch * kb) as *const i8);
                }
            }
            if let Some((nb, ns)) = next_scales {
                // The next run's scale rows of this chunk (hints, as above).
                _mm_prefetch::<_MM_HINT_T0>(scales.wrapping_add(nb + 64 * ch) as *const i8);
                if OFF {
                    _mm_prefetch::<_MM_HINT_T0>(scales.wrapping_add(nb + 2 * n_out + 64 * ch) as *const i8);
                }
                if SUB != 0 {
                    _mm_prefetch::<_MM_HINT_T0>(scales.wrapping_add(ns + 32 * ch) as *const i8);
                    if OFF {
                        _mm_prefetch::<_MM_HINT_T0>(scales.wrapping_add(ns + n_out + 32 * ch) as *const i8);
                    }
                }
            }
            // SAFETY: `ci < chunks.len()`: f32 `32·ci..32·ci + 32` of `t`.
            let tc = unsafe { tp.add(32 * ci) };
            let mut acc: [__m512; 2] = if first {
                [_mm512_setzero_ps(); 2]
            } else {
                // SAFETY: as above.
                unsafe { [_mm512_loadu_ps(tc), _mm512_loadu_ps(tc.add(16))] }
            };
            for k in 0..n {
                // SAFETY: `ch < n_out / 32`: chunk `ch` of column `k`, `kb` bytes within it.
                let q = unsafe { load_q::<BITS>(ptrs[k].add(ch * kb)) };
                let c = _mm512_set1_ps(cf[k]);
                acc[0] = _mm512_fmadd_ps(c, q[0], acc[0]);
                acc[1] = _mm512_fmadd_ps(c, q[1], acc[1]);
            }
            if !last {
                // SAFETY: as above.
                unsafe {
                    _mm512_storeu_ps(tc, acc[0]);
                    _mm512_storeu_ps(tc.add(16), acc[1]);
                }
                continue;
            }
            for (k, a) in acc.iter().enumerate() {
                let r = ch * 32 + 16 * k;
                // SAFETY: `r + 16 ≤ n_out`; the record of super-block `c / super_block` (c < n_in,
                // checked) lies within the scale plane, whose length `check_axpy_exact` checked:
                // its f16 `d` at `base + 2r`, `b` at `base + 2·n_out + 2r`, the sub-scales at
                // `sub_at + r` and sub-offsets at `sub_at + n_out + r`, 16 of each.
                let (mut da, mut db) = unsafe {
                    let d = _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(base + 2 * r) as *const __m256i));
                    let b = if OFF {
                        _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(base + 2 * n_out + 2 * r) as *const __m256i))
                    } else {
                        _mm512_setzero_ps()
                    };
                    (d, b)
                };
                if SUB != 0 {
                    // SAFETY: as above.
                    unsafe {
                        let sc = if SUB == 2 {
                            bytes16::<true>(scales.add(sub_at + r))
                        } else {
                            bytes16::<false>(scales.add(sub_at + r))
                        };
                        da = _mm512_mul_ps(da, sc);
                        if OFF {
                            db = _mm512_mul_ps(db, bytes16::<false>(scales.add(sub_at + n_out + r)));
                        }
                    }
                }
                let tz = _mm512_sub_ps(*a, zs);
                // SAFETY: `ci < chunks.len()`, and `y` holds `32 · chunks.len()` values from `y_off` (the
                // run's piece exists: `check_axpy_exact` checked the length).
                unsafe {
                    let yk = yp.add(y_off + ci * 32 + 16 * k);
                    let mut v = _mm512_fmadd_ps(da, tz, _mm512_loadu_ps(yk));
                    if OFF {
                        v = _mm512_fmadd_ps(db, sv, v);
                    }
                    _mm512_storeu_ps(yk, v);
                }
            }
        }
    }
}
