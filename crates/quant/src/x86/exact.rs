//! AVX2 kernels over exact columns ([`crate::exact`]): the [`ExactAxpyFn`]s.
//!
//! Per run of active columns in one sub-block and per 32 outputs: each column's 32 integers are
//! widened to f32 (`load_q`: `vpmovzxbd`, `vcvtdq2ps`) and multiply-added by the column's coefficient into
//! four 8-lane accumulators; two columns are taken per step into two accumulator sets, so eight
//! FMA chains are in flight. Then the run's scales are applied once: `d` (`vcvtph2ps`) times the
//! sub-scale bytes, `y += a·(t − zero·s)`, plus `b·s` for formats with an offset.
//!
//! # Safety invariant
//!
//! [`axpy_avx2`] is an `unsafe fn` compiled with `#[target_feature(enable = "avx2,fma,f16c")]`
//! reading raw pointers into `m.cols`, `m.scales` and `y`. It is reachable only through
//! `wrapper`, an [`ExactAxpyFn`] handed out by [`avx2_axpy_fn`] after [`has_avx2`] confirmed the
//! features, which first runs [`check_axpy_exact`]: every `idx` names a whole column of `m.cols`,
//! every unit is below `n_in` (so its super-block record lies within the scale plane, whose
//! length is checked), `chunks` lies within a column and `y` is `32 · chunks.len()` long. Each
//! access below is within those bounds, as its `SAFETY:` line says.

use super::has_avx2;
use super::helpers::{bytes_from_bits, nibbles};
use crate::exact::{check_axpy_exact, piece_offset, runs, ExactAxpyFn, ExactFormat, ExactMatrix, SubScales};
use std::arch::x86_64::*;
use std::ops::Range;

/// Columns per pass over the outputs (a run of up to this many sums in registers only; 4 and 8
/// measured alike on matrices that stream from memory, 8 faster on short runs).
pub(super) const GROUP: usize = 8;

/// The AVX2 kernel for `fmt` (`None` if this CPU lacks AVX2 / FMA / F16C).
pub(crate) fn avx2_axpy_fn(fmt: ExactFormat) -> Option<ExactAxpyFn> {
    if !has_avx2() {
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
    // SAFETY: the arguments passed `check_axpy_exact` and `avx2_axpy_fn` checked the features
    // (module docs).
    unsafe { axpy_avx2::<BITS, SUB, OFF>(m, idx, units, coef, chunks, y) }
}

/// The 32 integers of one column chunk at `p` as four vectors of 8 f32, rows in order.
///
/// 4- and 8-bit chunks are widened straight from memory (`vpmovzxbd` with the load folded in;
/// for nibbles the low and high halves are split in 32-bit lanes, no byte shuffles); 5- and 6-bit
/// chunks are assembled in the byte domain (nibbles, plus the high-bit planes spread with
/// `bytes_from_bits_32`), then widened.
///
/// # Safety
/// AVX2 present; `p..p + chunk_bytes` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_q<const BITS: u8>(p: *const u8) -> [__m256; 4] {
    let f = _mm256_cvtepi32_ps;
    // SAFETY: every load below lies within the chunk's `chunk_bytes` (16, 20, 24 or 32 bytes at
    // `p`), readable by the caller's contract.
    unsafe {
        match BITS {
            4 => {
                let qa = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
                let qb = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i));
                let m = _mm256_set1_epi32(15);
                [
                    f(_mm256_and_si256(qa, m)),
                    f(_mm256_and_si256(qb, m)),
                    f(_mm256_srli_epi32::<4>(qa)),
                    f(_mm256_srli_epi32::<4>(qb)),
                ]
            }
            8 => [
                f(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))),
                f(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i))),
                f(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(16) as *const __m128i))),
                f(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(24) as *const __m128i))),
            ],
            _ => {
                let mut q =
                    _mm256_or_si256(nibbles(p), _mm256_and_si256(bytes_from_bits(p.add(16)), _mm256_set1_epi8(0x10)));
                if BITS == 6 {
                    q = _mm256_or_si256(q, _mm256_and_si256(bytes_from_bits(p.add(20)), _mm256_set1_epi8(0x20)));
                }
                widen(q)
            }
        }
    }
}

/// 32 unsigned bytes as four vectors of 8 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen(q: __m256i) -> [__m256; 4] {
    let lo = _mm256_castsi256_si128(q);
    let hi = _mm256_extracti128_si256(q, 1);
    [
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(lo, lo))),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(hi, hi))),
    ]
}

/// 8 bytes at `p` as 8 f32, signed when `SIGNED`.
///
/// # Safety
/// AVX2 present; `p..p + 8` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes8<const SIGNED: bool>(p: *const u8) -> __m256 {
    // SAFETY: an unaligned 8-byte load, readable by the caller's contract.
    let v = unsafe { _mm_loadl_epi64(p as *const __m128i) };
    _mm256_cvtepi32_ps(if SIGNED { _mm256_cvtepi8_epi32(v) } else { _mm256_cvtepu8_epi32(v) })
}

/// The column groups of a call in order: `(start, end, start of its run, last group of its run)`,
/// runs ([`runs`]) cut into groups of at most [`GROUP`] columns.
pub(super) fn plan_groups(units: &[u32], sub_block: usize, group: usize) -> Vec<(usize, usize, usize, bool)> {
    let mut groups = Vec::with_capacity(units.len() / group + 8);
    for (i0, i1) in runs(units, sub_block) {
        let mut g = i0;
        while g < i1 {
            let e = (g + group).min(i1);
            groups.push((g, e, i0, e == i1));
            g = e;
        }
    }
    groups
}

thread_local! {
    /// Per-thread run sums `t` (32 per output chunk), reused across calls.
    pub(super) static RUN_SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// # Safety
/// AVX2 + FMA + F16C present; the arguments passed [`check_axpy_exact`] (module docs).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_avx2<const BITS: u8, const SUB: u8, const OFF: bool>(
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    chunks: Range<usize>,
    y: &mut [f32],
) {
    RUN_SUMS.with(|t| {
        let mut t = t.borrow_mut();
        if t.len() < 32 * chunks.len() {
            t.resize(32 * chunks.len(), 0.0);
        }
        // SAFETY: the caller's contract, and `t` holds `32 · chunks.len()` f32.
        unsafe { axpy_avx2_with::<BITS, SUB, OFF>(m, idx, units, coef, chunks, y, &mut t) }
    })
}

/// The loop: per run, the run's columns are taken [`GROUP`] at a time, and each group streams
/// through the outputs chunk by chunk, adding `coef · q` into the run sums `t` (each column is
/// read front to back, one stream per column; `t` starts from zero in a run's first group and is
/// stored between groups of a longer run). The run's last group applies the scales instead of
/// storing: `y += a·(t − zero·s) + b·s`. While a group runs, the next group's columns (in this run or the next) are
/// prefetched in step, a line at a time: one group's pass ahead, as the re-quantized kernels do.
///
/// # Safety
/// As [`axpy_avx2`]; `t` is `32 · chunks.len()` long.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_avx2_with<const BITS: u8, const SUB: u8, const OFF: bool>(
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
    for (gi, &(g0, g1, i0, last)) in groups.iter().enumerate() {
        // The run's output: `y`, or its piece's slice of it (`check_axpy_exact` checked the length).
        let y_off = piece_offset(i0, y_len, width);
        let (n0, n1, _, n_last) = groups.get(gi + 1).copied().unwrap_or((0, 0, 0, false));
        // Where the next group's scale rows are, when it applies them.
        let next_scales = (n_last && n1 > n0).then(|| {
            let c = units[n0] as usize;
            let base = (c / f.super_block) * rec;
            (base, base + f16s * n_out + ((c % f.super_block) / f.sub_block) * sub_stride)
        });
        let first = g0 == i0;
        let c = units[g0] as usize;
        let (s, base, sub_at) = if last {
            let base = (c / f.super_block) * rec;
            (
                coef[i0..g1].iter().sum::<f32>(),
                base,
                base + f16s * n_out + ((c % f.super_block) / f.sub_block) * sub_stride,
            )
        } else {
            (0.0, 0, 0)
        };
        let (sv, zs) = (_mm256_set1_ps(s), _mm256_set1_ps(zero * s));
        let mut ptrs = [cols; GROUP];
        let mut cf = [_mm256_setzero_ps(); GROUP];
        for (k, i) in (g0..g1).enumerate() {
            // `idx[i]` names a whole column (checked): its bytes lie within `m.cols`.
            ptrs[k] = cols.wrapping_add(idx[i] as usize * cb);
            cf[k] = _mm256_set1_ps(coef[i]);
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
                // The next run's scale rows of this chunk (hints, as above): `d` (64 bytes), `b`,
                // and the sub-scale bytes.
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
            let mut acc: [__m256; 4] = if first {
                [_mm256_setzero_ps(); 4]
            } else {
                // SAFETY: as above.
                unsafe { std::array::from_fn(|k| _mm256_loadu_ps(tc.add(8 * k))) }
            };
            for k in 0..n {
                // SAFETY: `ch < n_out / 32`: chunk `ch` of column `k`, `kb` bytes within it.
                let q = unsafe { load_q::<BITS>(ptrs[k].add(ch * kb)) };
                for (a, qv) in acc.iter_mut().zip(q) {
                    *a = _mm256_fmadd_ps(cf[k], qv, *a);
                }
            }
            if !last {
                for (k, a) in acc.iter().enumerate() {
                    // SAFETY: as above.
                    unsafe { _mm256_storeu_ps(tc.add(8 * k), *a) };
                }
                continue;
            }
            for (k, a) in acc.iter().enumerate() {
                let r = ch * 32 + 8 * k;
                // SAFETY: `r + 8 ≤ n_out`; the record of super-block `c / super_block` (c < n_in,
                // checked) lies within the scale plane, whose length `check_axpy_exact` checked:
                // its f16 `d` at `base + 2r`, `b` at `base + 2·n_out + 2r`, the sub-scales at
                // `sub_at + r` and sub-offsets at `sub_at + n_out + r`, 8 of each.
                let (mut da, mut db) = unsafe {
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(scales.add(base + 2 * r) as *const __m128i));
                    let b = if OFF {
                        _mm256_cvtph_ps(_mm_loadu_si128(scales.add(base + 2 * n_out + 2 * r) as *const __m128i))
                    } else {
                        _mm256_setzero_ps()
                    };
                    (d, b)
                };
                if SUB != 0 {
                    // SAFETY: as above.
                    unsafe {
                        let sc = if SUB == 2 {
                            bytes8::<true>(scales.add(sub_at + r))
                        } else {
                            bytes8::<false>(scales.add(sub_at + r))
                        };
                        da = _mm256_mul_ps(da, sc);
                        if OFF {
                            db = _mm256_mul_ps(db, bytes8::<false>(scales.add(sub_at + n_out + r)));
                        }
                    }
                }
                let tz = _mm256_sub_ps(*a, zs);
                // SAFETY: `ci < chunks.len()`, and `y` holds `32 · chunks.len()` values from `y_off` (the
                // run's piece exists: `check_axpy_exact` checked the length).
                unsafe {
                    let yk = yp.add(y_off + ci * 32 + 8 * k);
                    let mut v = _mm256_fmadd_ps(da, tz, _mm256_loadu_ps(yk));
                    if OFF {
                        v = _mm256_fmadd_ps(db, sv, v);
                    }
                    _mm256_storeu_ps(yk, v);
                }
            }
        }
    }
}
