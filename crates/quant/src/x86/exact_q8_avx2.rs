//! AVX2 kernels over exact columns with 8-bit coefficients ([`crate::exact_q8`]): the integer
//! column products for CPUs without AVX-512 VNNI, bit for bit the scalar reference
//! [`crate::exact_q8::axpy_exact_q8_scalar`] as the VNNI kernel ([`super::exact_vnni`]) is.
//!
//! # Two columns per `vpmaddubsw` lane
//!
//! A quad (four active columns of one run, [`super::exact_plan`]) is read per 32 output rows as
//! two registers `[a | b]` and `[c | d]` (one column chunk's 16 nibble bytes per 128-bit lane).
//! Nibbles are split in place (`& 15`, `>> 4 & 15`: rows `0..16`, `16..32`; the 5- and 6-bit
//! formats add their high-bit planes with a byte shuffle, a bit test and a mask), and one byte
//! unpack interleaves `a` with `c` in the low lane and `b` with `d` in the high one, so that
//! `vpmaddubsw` against the coefficients `(c_a, c_c | c_b, c_d)` leaves, in word `k` of each lane,
//! row `k`'s products of two columns summed: 4 loads, 6 nibble operations, 4 unpacks, 4
//! `vpmaddubsw` and 4 adds per quad and 32 rows, against the f32 kernel's ([`super::exact`]) ~12
//! vector operations per column and 32 rows.
//!
//! The two lanes' 16-bit sums are added up over several quads and then widened to 32 bits, row
//! by row in order (`vpmovsxwd` of each lane, added): every word gains at most `2 · 127 · q_max`
//! per quad (`|C| ≤ 127`, `q ≤ 15 / 31 / 63`), so 8 / 4 / 2 quads ([`flush_quads`]) stay below
//! 2¹⁵ for 4 / 5 / 6 bits, and `vpmaddubsw`'s own pair sums (at most 16,002) never saturate. The
//! 8-bit format would saturate them (255 · 127 · 2 > 2¹⁵): it keeps the f32 kernel. The wide
//! layouts of 5- and 6-bit sources ([`ExactFormat::wide`]: their integers in bytes, byte `k` =
//! row `k`) take the same path with two more loads and no nibble or plane work at all (4 loads,
//! 4 unpacks, 4 `vpmaddubsw` and 4 adds per quad, against ~60 operations for the 6-bit planes),
//! flushed as their source's bits.
//!
//! # The 8-bit format (Q8_0): 16-bit products
//!
//! Q8_0's integers (stored as `q + 128`, `0..=255`) would saturate `vpmaddubsw`'s pair sums, so
//! its quads take the wide layout's loads and unpacks, then turn each byte back to the signed
//! value (`^ 0x80`: `q − 128`, the format's zero point taken out exactly), sign-extend it to 16
//! bits and multiply-add pairs with `vpmaddwd` into 32-bit sums: `Σ C·(q − 128)` per row, the
//! scalar reference's `T` without its zero-point term (exact in `i32`, no flush needed).
//!
//! Per run the sums get the zero point and the integer sub-scales (`vpmulld`), per group the f16
//! scales are converted and applied once, as in the VNNI kernel; the plan, the passes, the
//! prefetches one pass ahead and the sums kept between passes are that kernel's.
//!
//! # Safety invariant
//!
//! [`axpy_q8_avx2`] is an `unsafe fn` compiled with `#[target_feature(enable = "avx2,fma,f16c")]`
//! reading raw pointers into `m.cols`, `m.scales` and `y`. It is reachable only through `wrapper`,
//! an [`ExactAxpyFn`] handed out by [`avx2_q8_axpy_fn`] after [`has_avx2`] confirmed the
//! features, which first runs [`check_axpy_exact`]: every `idx` names a whole column of `m.cols`,
//! every unit is below `n_in` (so its super-block record lies within the scale plane, whose length
//! is checked), `chunks` lies within a column and `y` is as long as the pieces need. Every load
//! reads within one column chunk (`chunk_bytes`: 16, 20, 24 or 32 bytes; the planes through a
//! 16-byte load that ends at the chunk's end). Prefetches are hints computed with `wrapping_add`.

use super::exact_plan::{chunk_bytes, prefetch_next_pass, Plan, PLAN};
use super::has_avx2;
use crate::exact::{check_axpy_exact, ExactAxpyFn, ExactFormat, ExactMatrix, SubScales};
use std::arch::x86_64::*;
use std::ops::Range;

/// The 8-bit-coefficient AVX2 kernel for `fmt` (`None` without AVX2 / FMA / F16C).
pub(crate) fn avx2_q8_axpy_fn(fmt: ExactFormat) -> Option<ExactAxpyFn> {
    if !has_avx2() {
        return None;
    }
    if flush_quads(fmt.q_max()) == 0 {
        // The 8-bit format: 16-bit products (module docs).
        return match (fmt.bits, fmt.sub_scales, fmt.has_offset, fmt.zero) {
            (8, SubScales::None, false, 128) => Some(wrapper::<8, 0, false, true>),
            _ => None,
        };
    }
    Some(match (fmt.bits, fmt.sub_scales, fmt.has_offset) {
        (4, SubScales::None, false) => wrapper::<4, 0, false, false>,
        (4, SubScales::None, true) => wrapper::<4, 0, true, false>,
        (5, SubScales::None, false) => wrapper::<5, 0, false, false>,
        (4, SubScales::Unsigned, true) => wrapper::<4, 1, true, false>,
        (5, SubScales::Unsigned, true) => wrapper::<5, 1, true, false>,
        (6, SubScales::Signed, false) => wrapper::<6, 2, false, false>,
        // The wide layouts ([`ExactFormat::wide`]): Q5_0, Q5_K, Q6_K integers in bytes.
        (8, SubScales::None, false) => wrapper::<8, 0, false, false>,
        (8, SubScales::Unsigned, true) => wrapper::<8, 1, true, false>,
        (8, SubScales::Signed, false) => wrapper::<8, 2, false, false>,
        _ => return None,
    })
}

/// `W16`: the 8-bit format's 16-bit products (module docs).
fn wrapper<const BITS: u8, const SUB: u8, const OFF: bool, const W16: bool>(
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
    assert!(!W16 || m.fmt.zero == 128, "the 16-bit kernel is Q8_0's");
    // SAFETY: the arguments passed `check_axpy_exact` and `avx2_q8_axpy_fn` checked the features
    // (module docs).
    unsafe { axpy_q8_avx2::<BITS, SUB, OFF, W16>(m, idx, units, coef, chunks, y) }
}

/// Quads whose 16-bit sums can be added before they must be widened, for integers up to `q_max`
/// (module docs): each quad adds at most `2 · 127 · q_max` to a word, which must stay below 2¹⁵
/// (8 / 4 / 2 quads for 4 / 5 / 6 bits; none for Q8_0's 255, whose pairs alone would saturate).
const fn flush_quads(q_max: u8) -> usize {
    32767 / (2 * 127 * q_max as usize)
}

/// Byte `j` of each lane: the plane byte holding row `j`'s bit (`hi`: row `16 + j`'s), for a
/// plane at byte `at` of a 16-byte load that ends at the chunk's end.
const fn plane_pick(at: usize, hi: bool) -> [u8; 32] {
    let mut a = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        a[i] = (at + (i % 16) / 8 + if hi { 2 } else { 0 }) as u8;
        i += 1;
    }
    a
}

/// Byte `j` of each lane: the bit of row `j` (or `16 + j`) within its plane byte.
const BIT_OF_ROW: [u8; 32] = {
    let mut a = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        a[i] = 1 << (i % 8);
        i += 1;
    }
    a
};

/// Shuffle tables for the high-bit planes: `[lo, hi]` per plane (5 bits: one, 6 bits: two).
#[derive(Clone, Copy)]
struct Planes {
    pick: [[__m256i; 2]; 2],
    bit: __m256i,
}

impl Planes {
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load<const BITS: u8>() -> Planes {
        // A 16-byte load ending at the chunk's end starts at byte `kb − 16`: the first plane
        // (chunk byte 16) lies at `32 − kb` in it, the second (byte 20) 4 bytes further.
        let at = 32 - chunk_bytes(BITS);
        let v = |a: [u8; 32]| {
            // SAFETY: a 32-byte unaligned load from a 32-byte array.
            unsafe { _mm256_loadu_si256(a.as_ptr() as *const __m256i) }
        };
        Planes {
            pick: [
                [v(plane_pick(at, false)), v(plane_pick(at, true))],
                [v(plane_pick(at + 4, false)), v(plane_pick(at + 4, true))],
            ],
            bit: v(BIT_OF_ROW),
        }
    }
}

/// One quad's integers at chunk offset `off` as `vpmaddubsw` wants them: word `k` of register `j`
/// holds row `8j + k`'s integers of columns `a, c` (low lane) and `b, d` (high lane).
///
/// # Safety
/// AVX2 present; `p[j] + off .. + chunk_bytes` readable for every `j`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_quad<const BITS: u8>(p: &[*const u8; 4], off: usize, t: &Planes) -> [__m256i; 4] {
    let kb = chunk_bytes(BITS);
    // SAFETY: 16-byte loads at `p[j] + off` (the nibbles) and at `p[j] + off + kb − 16` (the
    // planes, `kb ≥ 16`), both within the chunk, readable by the contract.
    let (ab, cd, planes) = unsafe {
        let l2 = |x: usize, y: usize, at: usize| {
            _mm256_loadu2_m128i(p[y].add(off + at) as *const __m128i, p[x].add(off + at) as *const __m128i)
        };
        (
            l2(0, 1, 0),
            l2(2, 3, 0),
            if BITS > 4 { [l2(0, 1, kb - 16), l2(2, 3, kb - 16)] } else { [_mm256_setzero_si256(); 2] },
        )
    };
    if BITS == 8 {
        // A wide layout: byte `k` is row `k`; `[a | b]` and `[c | d]` of rows 0..16, then 16..32.
        // SAFETY: 16-byte loads at `p[j] + off + 16`, within the 32-byte chunk.
        let (ab1, cd1) = unsafe {
            let l2 = |x: usize, y: usize| {
                _mm256_loadu2_m128i(p[y].add(off + 16) as *const __m128i, p[x].add(off + 16) as *const __m128i)
            };
            (l2(0, 1), l2(2, 3))
        };
        return [
            _mm256_unpacklo_epi8(ab, cd),
            _mm256_unpackhi_epi8(ab, cd),
            _mm256_unpacklo_epi8(ab1, cd1),
            _mm256_unpackhi_epi8(ab1, cd1),
        ];
    }
    let m = _mm256_set1_epi8(15);
    if BITS == 4 {
        // Unpack first, then split the nibbles: two unpacks instead of four.
        let (lo, hi) = (_mm256_unpacklo_epi8(ab, cd), _mm256_unpackhi_epi8(ab, cd));
        return [
            _mm256_and_si256(lo, m),
            _mm256_and_si256(hi, m),
            _mm256_and_si256(_mm256_srli_epi16::<4>(lo), m),
            _mm256_and_si256(_mm256_srli_epi16::<4>(hi), m),
        ];
    }
    let mut v = [
        _mm256_and_si256(ab, m),
        _mm256_and_si256(cd, m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(ab), m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(cd), m),
    ];
    {
        for (plane, add) in [(0, 16), (1, 32)].into_iter().take(BITS as usize - 4) {
            let a = _mm256_set1_epi8(add);
            for (k, x) in v.iter_mut().enumerate() {
                let picked = _mm256_shuffle_epi8(planes[k % 2], t.pick[plane][k / 2]);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(picked, t.bit), t.bit);
                *x = _mm256_or_si256(*x, _mm256_and_si256(set, a));
            }
        }
    }
    [
        _mm256_unpacklo_epi8(v[0], v[1]),
        _mm256_unpackhi_epi8(v[0], v[1]),
        _mm256_unpacklo_epi8(v[2], v[3]),
        _mm256_unpackhi_epi8(v[2], v[3]),
    ]
}

/// A quad's coefficients `[c_a, c_b, c_c, c_d]` (the bytes of `cq`) in [`load_quad`]'s order:
/// `(c_a, c_c)` in every word of the low lane, `(c_b, c_d)` of the high one.
#[inline]
#[target_feature(enable = "avx2")]
fn quad_coefs(cq: i32) -> __m256i {
    let pick = _mm256_setr_epi8(
        0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3,
    );
    _mm256_shuffle_epi8(_mm256_set1_epi32(cq), pick)
}

/// Eight bytes at `p` as 8 `i32`, signed when `SIGNED`.
///
/// # Safety
/// AVX2 present; `p..p + 8` readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bytes8<const SIGNED: bool>(p: *const u8) -> __m256i {
    // SAFETY: an unaligned 8-byte load, readable by the caller's contract.
    let v = unsafe { _mm_loadl_epi64(p as *const __m128i) };
    if SIGNED {
        _mm256_cvtepi8_epi32(v)
    } else {
        _mm256_cvtepu8_epi32(v)
    }
}

/// # Safety
/// AVX2 + FMA + F16C present; the arguments passed [`check_axpy_exact`] (module docs).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_q8_avx2<const BITS: u8, const SUB: u8, const OFF: bool, const W16: bool>(
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    chunks: Range<usize>,
    y: &mut [f32],
) {
    PLAN.with(|plan| {
        let mut plan = plan.borrow_mut();
        let width = 32 * chunks.len();
        plan.build(m, idx, units, coef, y.len(), width);
        if plan.sums.len() < 3 * width {
            plan.sums.resize(3 * width, 0);
        }
        // SAFETY: the caller's contract; the plan was built from these arguments and `sums` holds
        // `3 · 32` values per chunk.
        unsafe { stream::<BITS, SUB, OFF, W16>(m, &mut plan, chunks, y) }
    })
}

/// Streams the plan's passes through the output chunks (the loop of [`super::exact_vnni`]).
///
/// # Safety
/// As [`axpy_q8_avx2`]; `plan` was built from the same arguments and `plan.sums` holds `96`
/// values per chunk of `chunks`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn stream<const BITS: u8, const SUB: u8, const OFF: bool, const W16: bool>(
    m: &ExactMatrix<'_>,
    plan: &mut Plan,
    chunks: Range<usize>,
    y: &mut [f32],
) {
    let f = m.fmt;
    let n_out = m.n_out;
    let kb = chunk_bytes(BITS);
    debug_assert_eq!(kb, f.chunk_bytes());
    let scales = m.scales.as_ptr();
    let yp = y.as_mut_ptr();
    let planes = Planes::load::<BITS>();
    let zero = f.zero as i32;
    let flush = if W16 { usize::MAX } else { flush_quads(f.q_max()) };
    debug_assert!(flush > 0);
    let Plan { quads, runs, passes, groups, sums } = plan;
    let sp = sums.as_mut_ptr();
    for (pi, pass) in passes.iter().enumerate() {
        let g = groups[pass.group];
        let next = passes.get(pi + 1).copied();
        for (ci, ch) in chunks.clone().enumerate() {
            if let Some(nx) = next {
                prefetch_next_pass::<BITS, SUB, OFF>(quads, runs, groups, nx, scales, n_out, ci, ch);
            }
            // SAFETY: `ci < chunks.len()`: the chunk's 96 sums lie within `sums`.
            let (tp, ap) = unsafe { (sp.add(96 * ci), sp.add(96 * ci + 32)) };
            // Only called with `p` one of `tp`, `ap` and `j < 4`.
            let ld = |p: *mut i32, j: usize| {
                // SAFETY: 8 `i32` at `p + 8j`, within the 32 of `p` (as above).
                unsafe { _mm256_loadu_si256(p.add(8 * j) as *const __m256i) }
            };
            let st = |p: *mut i32, j: usize, v: __m256i| {
                // SAFETY: as for `ld`.
                unsafe { _mm256_storeu_si256(p.add(8 * j) as *mut __m256i, v) }
            };
            let z = _mm256_setzero_si256();
            // The group's sums so far (the legacy formats have one run per group: none kept).
            let mut acc = if pass.first || SUB == 0 { [z; 4] } else { std::array::from_fn(|j| ld(ap, j)) };
            let mut q = pass.q0;
            while q < pass.q1 {
                let run = runs[quads[q].run];
                let mut t = if q == run.q0 {
                    // (The 16-bit products take the zero point out of each integer.)
                    [_mm256_set1_epi32(if W16 { 0 } else { -zero * run.sum_c }); 4]
                } else {
                    std::array::from_fn(|j| ld(tp, j))
                };
                let qe = run.q1.min(pass.q1);
                if W16 {
                    let flip = _mm256_set1_epi8(-128);
                    for qd in &quads[q..qe] {
                        // SAFETY: `ch < n_out / 32`: chunk `ch` of checked columns.
                        let v = unsafe { load_quad::<8>(&qd.ptrs, ch * kb, &planes) };
                        let cv = quad_coefs(qd.cq);
                        let (cl, chi) = (
                            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(cv)),
                            _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(cv)),
                        );
                        for j in 0..4 {
                            let s = _mm256_xor_si256(v[j], flip);
                            let lo = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(s)), cl);
                            let hi = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(s)), chi);
                            t[j] = _mm256_add_epi32(t[j], _mm256_add_epi32(lo, hi));
                        }
                    }
                }
                let mut q16 = if W16 { qe } else { q };
                while q16 < qe {
                    let qf = (q16 + flush).min(qe);
                    let mut w = [z; 4];
                    for qd in &quads[q16..qf] {
                        // SAFETY: `ch < n_out / 32`: chunk `ch` of checked columns.
                        let v = unsafe { load_quad::<BITS>(&qd.ptrs, ch * kb, &planes) };
                        let cv = quad_coefs(qd.cq);
                        for j in 0..4 {
                            w[j] = _mm256_add_epi16(w[j], _mm256_maddubs_epi16(v[j], cv));
                        }
                    }
                    for j in 0..4 {
                        let lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(w[j]));
                        let hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(w[j]));
                        t[j] = _mm256_add_epi32(t[j], _mm256_add_epi32(lo, hi));
                    }
                    q16 = qf;
                }
                q = qe;
                if qe < run.q1 {
                    // The run goes on in the next pass.
                    for (j, &v) in t.iter().enumerate() {
                        st(tp, j, v);
                    }
                    break;
                }
                if SUB == 0 {
                    acc = t;
                    continue;
                }
                for (j, a) in acc.iter_mut().enumerate() {
                    let r = ch * 32 + 8 * j;
                    // SAFETY: `r + 8 ≤ n_out`: the run's sub-scale bytes of rows `r..r + 8` lie
                    // within its super-block's record (module docs).
                    let sc = unsafe {
                        if SUB == 2 {
                            bytes8::<true>(scales.add(run.sub_at + r))
                        } else {
                            bytes8::<false>(scales.add(run.sub_at + r))
                        }
                    };
                    *a = _mm256_add_epi32(*a, _mm256_mullo_epi32(sc, t[j]));
                }
            }
            if !pass.last {
                if SUB != 0 {
                    for (j, &v) in acc.iter().enumerate() {
                        st(ap, j, v);
                    }
                }
                continue;
            }
            // The sub-offsets' term `Σ_run M_run·ΣC_run` straight from the bytes at the group's
            // last pass: it does not depend on the columns, so it is not carried between passes.
            let mut macc = [z; 4];
            if OFF && SUB != 0 {
                for run in &runs[g.run0..g.run1] {
                    let sum_c = _mm256_set1_epi32(run.sum_c);
                    for (j, mc) in macc.iter_mut().enumerate() {
                        // SAFETY: rows `32ch + 8j .. + 8 ≤ n_out`: within the run's sub-offset bytes.
                        let mv = unsafe { bytes8::<false>(scales.add(run.sub_at + n_out + ch * 32 + 8 * j)) };
                        *mc = _mm256_add_epi32(*mc, _mm256_mullo_epi32(mv, sum_c));
                    }
                }
            }
            let sv = _mm256_set1_ps(g.s);
            for (j, a) in acc.iter().enumerate() {
                let r = ch * 32 + 8 * j;
                // SAFETY: `r + 8 ≤ n_out`: the f16 `d` (and `b`) of rows `r..r + 8` lie within the
                // group's super-block record; `y` holds the piece's `32 · chunks.len()` values
                // from `y_off` (checked length), of which `ci·32 + 8j .. + 8`.
                unsafe {
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(scales.add(g.base + 2 * r) as *const __m128i));
                    let yk = yp.add(g.y_off + ci * 32 + 8 * j);
                    let mut v = _mm256_fmadd_ps(_mm256_mul_ps(d, sv), _mm256_cvtepi32_ps(*a), _mm256_loadu_ps(yk));
                    if OFF {
                        let b =
                            _mm256_cvtph_ps(_mm_loadu_si128(scales.add(g.base + 2 * n_out + 2 * r) as *const __m128i));
                        let mv = if SUB == 0 { _mm256_set1_ps(g.sum_c as f32) } else { _mm256_cvtepi32_ps(macc[j]) };
                        v = _mm256_fmadd_ps(_mm256_mul_ps(b, sv), mv, v);
                    }
                    _mm256_storeu_ps(yk, v);
                }
            }
        }
    }
}
