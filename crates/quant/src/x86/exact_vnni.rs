//! AVX-512 VNNI kernels over exact columns with 8-bit coefficients ([`crate::exact_q8`]).
//!
//! # Four columns per instruction
//!
//! A *quad* is four active columns of one run with their four `i8` coefficients packed in a
//! dword. For 32 output rows the quad's four column chunks are loaded into two `zmm` (or one, for
//! 4-bit chunks) and transposed with one byte permute (`vpermb` / `vpermt2b`, AVX-512 VBMI) so
//! that dword `k` holds row `k`'s four integers, one per column; `vpdpbusd` then multiplies them
//! by the four coefficients and adds the four products into row `k`'s 32-bit sum. Nibbles are
//! split after the permute (`& 15`, `>> 4 & 15`: rows `0..16` and `16..32`). For the 5- and 6-bit
//! formats the chunk's high-bit planes (bit `k` = row `k`) go through a second byte permute that
//! puts, in each 64-bit lane, the plane bytes that lane's rows need, and `vpshufbitqmb` (AVX-512
//! BITALG) picks each row's bit into a mask that adds 16 (or 32) to its byte.
//!
//! Against the f32 kernel ([`super::exact_avx512`]: per column and 32 rows a widening, two
//! conversions and two FMAs) this is ~2.5 vector operations per column and 32 rows for 4 bits.
//! Per run the sums get the zero point and the integer sub-scales (`vpmulld`); per group (a
//! super-block) the f16 scales are converted and applied once.
//!
//! # Loop structure
//!
//! A call is planned first ([`Plan`]): per group the coefficients are quantized and its runs laid
//! out as quads (a run's last quad padded with zero coefficients and its last column), and the
//! quads are cut into *passes* of whole runs, up to [`PASS_QUADS`] quads (a longer run is cut,
//! its partial sums kept). Each pass then streams through the output chunks: per chunk every quad
//! of the pass is read once (each column front to back, one stream per column), the group's
//! integer sums are kept between its passes in a per-chunk scratch, and the next pass's columns
//! (into L2) and the scales it will apply are prefetched in step, one pass ahead.
//!
//! Measured (`cargo bench -p sift-quant --bench exact`, one thread, Zen 4, columns 64-byte
//! aligned as in a pack): 1.4-2.2× the f32 kernel; on the 1.5B's Q4_K `ffn_up` read from DRAM,
//! 298 / 189 / 129 µs at 0 / 50 / 75 % of the inputs skipped. Within a pass the integer sums of
//! 128 rows stay in registers and go to memory between passes, so passes of 8 quads (32 column
//! streams) halve that traffic against 4 (−20 % time in the kernel bench, +1-2 % in `sift bench`
//! decode, where the memory bounds it; with the earlier kernel 8 measured slower). Prefetching
//! into L1 or not at all measured slower in `sift bench` decode.
//!
//! # Safety invariant
//!
//! [`axpy_vnni`] is an `unsafe fn` compiled with the features [`has_vnni_vbmi`] checks, reading raw
//! pointers into `m.cols`, `m.scales` and `y`. It is reachable only through `wrapper`, an
//! [`ExactAxpyFn`] handed out by [`vnni_axpy_fn`] after [`has_vnni_vbmi`], which first runs
//! [`check_axpy_exact`]: every `idx` names a whole column of `m.cols`, every unit is below `n_in`
//! (so its super-block record lies within the scale plane, whose length is checked), `chunks`
//! lies within a column and `y` is as long as the pieces need. The 5- and 6-bit chunks are read
//! with masked loads of exactly `chunk_bytes`. Prefetches are hints computed with `wrapping_add`.

use super::exact_plan::{prefetch_next_pass, Group, Pass, Plan, Quad, Run, PLAN};
use super::has_avx512;
use crate::exact::{check_axpy_exact, ExactAxpyFn, ExactFormat, ExactMatrix, SubScales};
use std::arch::x86_64::*;
use std::ops::Range;

/// AVX-512 VNNI ([`has_avx512`]) plus VBMI (byte permutes) and BITALG (bit shuffles).
pub(crate) fn has_vnni_vbmi() -> bool {
    has_avx512() && is_x86_feature_detected!("avx512vbmi") && is_x86_feature_detected!("avx512bitalg")
}

/// The 8-bit-coefficient kernel for `fmt` (`None` if this CPU lacks the features).
pub(crate) fn vnni_axpy_fn(fmt: ExactFormat) -> Option<ExactAxpyFn> {
    if !has_vnni_vbmi() {
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
    // SAFETY: the arguments passed `check_axpy_exact` and `vnni_axpy_fn` checked the features
    // (module docs).
    unsafe { axpy_vnni::<BITS, SUB, OFF>(m, idx, units, coef, chunks, y) }
}

/// 4-bit chunks in one `zmm` (`[a | b | c | d]`, 16 bytes each): dword `k` = byte `k` of each.
const IDX_NIB4: [u8; 64] = {
    let mut a = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        a[i] = (16 * (i % 4) + i / 4) as u8;
        i += 1;
    }
    a
};

/// Chunks in two `zmm` (`[a | b]`, `[c | d]`, 32-byte slots): dword `k` = byte `at + k` of each.
const fn idx_slots(at: usize) -> [u8; 64] {
    let mut a = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        a[i] = (32 * (i % 4) + at + i / 4) as u8;
        i += 1;
    }
    a
}

/// The plane bytes each 64-bit lane `l` needs (rows `2l`, `2l + 1` and `16 + 2l`, `17 + 2l`):
/// byte `m < 4` is plane byte `l / 4` of column `m`, byte `4 + m` plane byte `2 + l / 4`; the
/// plane starts at chunk byte `at`.
const fn idx_planes(at: usize) -> [u8; 64] {
    let mut a = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let (l, m) = (i / 8, i % 8);
        a[i] = (32 * (m % 4) + at + 2 * (m / 4) + l / 4) as u8;
        i += 1;
    }
    a
}

/// `vpshufbitqmb` indices: mask bit `4k + j` = row `k`'s (or `16 + k`'s, `hi`) bit of column `j`
/// in a lane laid out by [`idx_planes`].
const fn idx_bits(hi: bool) -> [u8; 64] {
    let mut a = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let (k, j) = (i / 4, i % 4);
        a[i] = ((if hi { 32 } else { 0 }) + 8 * j + k % 8) as u8;
        i += 1;
    }
    a
}

const IDX_LO: [u8; 64] = idx_slots(0);
const IDX_HI8: [u8; 64] = idx_slots(16);
const IDX_PLANE1: [u8; 64] = idx_planes(16);
const IDX_PLANE2: [u8; 64] = idx_planes(20);
const IDX_BITS_LO: [u8; 64] = idx_bits(false);
const IDX_BITS_HI: [u8; 64] = idx_bits(true);

/// The permute tables in registers.
#[derive(Clone, Copy)]
pub(super) struct Tables {
    nib4: __m512i,
    lo: __m512i,
    hi8: __m512i,
    plane1: __m512i,
    plane2: __m512i,
    bits_lo: __m512i,
    bits_hi: __m512i,
}

impl Tables {
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn load() -> Tables {
        let v = |a: &[u8; 64]| {
            // SAFETY: a 64-byte unaligned load from a 64-byte array.
            unsafe { _mm512_loadu_si512(a.as_ptr() as *const __m512i) }
        };
        Tables {
            nib4: v(&IDX_NIB4),
            lo: v(&IDX_LO),
            hi8: v(&IDX_HI8),
            plane1: v(&IDX_PLANE1),
            plane2: v(&IDX_PLANE2),
            bits_lo: v(&IDX_BITS_LO),
            bits_hi: v(&IDX_BITS_HI),
        }
    }
}

/// The integers of one quad's chunks at `p[j] + off`: rows `0..16` and `16..32`, dword `k` holding
/// row `k`'s four unsigned integers (columns 0..4 in bytes 0..4).
///
/// # Safety
/// AVX-512 F/BW/VL/VBMI/BITALG present; `p[j] + off .. + chunk_bytes` readable for every `j`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512bitalg")]
pub(super) unsafe fn load_quad<const BITS: u8>(p: &[*const u8; 4], off: usize, t: &Tables) -> [__m512i; 2] {
    // SAFETY: every load below reads within `p[j] + off .. p[j] + off + chunk_bytes` (16 bytes for
    // 4 bits, 32 for 8 bits, masked to 20 / 24 bytes for 5 / 6 bits), readable by the contract.
    unsafe {
        let l128 = |j: usize| _mm_loadu_si128(p[j].add(off) as *const __m128i);
        let nib = |n: __m512i| {
            let m = _mm512_set1_epi8(15);
            [_mm512_and_si512(n, m), _mm512_and_si512(_mm512_srli_epi16::<4>(n), m)]
        };
        if BITS == 4 {
            let mut z = _mm512_castsi128_si512(l128(0));
            z = _mm512_inserti32x4::<1>(z, l128(1));
            z = _mm512_inserti32x4::<2>(z, l128(2));
            z = _mm512_inserti32x4::<3>(z, l128(3));
            return nib(_mm512_permutexvar_epi8(t.nib4, z));
        }
        let l256 = |j: usize| {
            if BITS == 8 {
                _mm256_loadu_si256(p[j].add(off) as *const __m256i)
            } else {
                let bytes = if BITS == 5 { 20 } else { 24 };
                _mm256_maskz_loadu_epi8(((1u64 << bytes) - 1) as __mmask32, p[j].add(off) as *const i8)
            }
        };
        let z0 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(l256(0)), l256(1));
        let z1 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(l256(2)), l256(3));
        if BITS == 8 {
            return [_mm512_permutex2var_epi8(z0, t.lo, z1), _mm512_permutex2var_epi8(z0, t.hi8, z1)];
        }
        let [mut lo, mut hi] = nib(_mm512_permutex2var_epi8(z0, t.lo, z1));
        let h = _mm512_permutex2var_epi8(z0, t.plane1, z1);
        let v = _mm512_set1_epi8(16);
        lo = _mm512_mask_add_epi8(lo, _mm512_bitshuffle_epi64_mask(h, t.bits_lo), lo, v);
        hi = _mm512_mask_add_epi8(hi, _mm512_bitshuffle_epi64_mask(h, t.bits_hi), hi, v);
        if BITS == 6 {
            let h = _mm512_permutex2var_epi8(z0, t.plane2, z1);
            let v = _mm512_set1_epi8(32);
            lo = _mm512_mask_add_epi8(lo, _mm512_bitshuffle_epi64_mask(h, t.bits_lo), lo, v);
            hi = _mm512_mask_add_epi8(hi, _mm512_bitshuffle_epi64_mask(h, t.bits_hi), hi, v);
        }
        [lo, hi]
    }
}

/// 16 sub-scale bytes at `p` as 16 `i32`, signed when `SIGNED`.
///
/// # Safety
/// AVX-512 F present; `p..p + 16` readable.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn bytes16<const SIGNED: bool>(p: *const u8) -> __m512i {
    // SAFETY: an unaligned 16-byte load, readable by the caller's contract.
    let v = unsafe { _mm_loadu_si128(p as *const __m128i) };
    if SIGNED {
        _mm512_cvtepi8_epi32(v)
    } else {
        _mm512_cvtepu8_epi32(v)
    }
}

/// Sub-scale bytes of 128 rows (four chunks) in the order [`load_quad4`] leaves its sums: slot
/// `s = 2j + h`, byte `4k + m` = row `32k + 16h + 4j + m` (a `vpermt2b` index into two 64-byte
/// registers of rows `0..64`, `64..128`; only the low 16 bytes are used).
const fn idx_rows4(s: usize) -> [u8; 64] {
    let (j, h) = (s / 2, s % 2);
    let mut a = [0u8; 64];
    let mut i = 0;
    while i < 16 {
        let (k, m) = (i / 4, i % 4);
        a[i] = (32 * k + 16 * h + 4 * j + m) as u8;
        i += 1;
    }
    a
}

const IDX_ROWS4: [[u8; 64]; 8] =
    [idx_rows4(0), idx_rows4(1), idx_rows4(2), idx_rows4(3), idx_rows4(4), idx_rows4(5), idx_rows4(6), idx_rows4(7)];

/// The integers of one 4-bit quad over four chunks (128 rows), from one 64-byte load per column:
/// in-lane byte and word unpacks put, in 128-bit lane `k` (chunk `k`), dword `m` of slot `2j`
/// row `4j + m`'s four integers (low nibbles) and of slot `2j + 1` row `16 + 4j + m`'s (high
/// nibbles, kept in place: 16 × each integer). Against four [`load_quad`]s: 4 loads and 8
/// unpacks instead of 16 loads, 12 inserts and 4 `vpermb`, and 8 masks and no shift.
///
/// # Safety
/// AVX-512 F/BW present; `p[j] + off .. + 64` readable for every `j`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load_quad4(p: &[*const u8; 4], off: usize) -> [__m512i; 8] {
    // SAFETY: 64-byte loads within `p[j] + off .. + 64`, readable by the contract.
    let l = |j: usize| unsafe { _mm512_loadu_si512(p[j].add(off) as *const __m512i) };
    let (a, b, c, d) = (l(0), l(1), l(2), l(3));
    let (ab_lo, ab_hi) = (_mm512_unpacklo_epi8(a, b), _mm512_unpackhi_epi8(a, b));
    let (cd_lo, cd_hi) = (_mm512_unpacklo_epi8(c, d), _mm512_unpackhi_epi8(c, d));
    let w = [
        _mm512_unpacklo_epi16(ab_lo, cd_lo),
        _mm512_unpackhi_epi16(ab_lo, cd_lo),
        _mm512_unpacklo_epi16(ab_hi, cd_hi),
        _mm512_unpackhi_epi16(ab_hi, cd_hi),
    ];
    // High nibbles stay in place (16 × the integer): no shift; [`four_chunks`] takes the 16 out
    // of the f32 scale, exactly.
    let (m, mh) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0xf0u8 as i8));
    let lo = |v: __m512i| _mm512_and_si512(v, m);
    let hi = |v: __m512i| _mm512_and_si512(v, mh);
    [lo(w[0]), hi(w[0]), lo(w[1]), hi(w[1]), lo(w[2]), hi(w[2]), lo(w[3]), hi(w[3])]
}

/// 16 of 128 sub-scale bytes (`s0`: rows `0..64`, `s1`: `64..128`) for slot `s` of
/// [`load_quad4`]'s order, as 16 `i32`, signed when `SIGNED`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn rows4<const SIGNED: bool>(s0: __m512i, s1: __m512i, s: usize) -> __m512i {
    // SAFETY: a 64-byte unaligned load from a 64-byte array.
    let idx = unsafe { _mm512_loadu_si512(IDX_ROWS4[s].as_ptr() as *const __m512i) };
    let b = _mm512_castsi512_si128(_mm512_permutex2var_epi8(s0, idx, s1));
    if SIGNED {
        _mm512_cvtepi8_epi32(b)
    } else {
        _mm512_cvtepu8_epi32(b)
    }
}

/// Sums of [`load_quad4`]'s slots `h, 2 + h, 4 + h, 6 + h` back in row order: chunk `k`'s rows
/// `16h .. 16h + 16` (a 4 × 4 transpose of 128-bit lanes).
#[inline]
#[target_feature(enable = "avx512f")]
fn rows_in_order(a: [__m512i; 4]) -> [__m512i; 4] {
    let t0 = _mm512_shuffle_i32x4::<0x44>(a[0], a[1]);
    let t1 = _mm512_shuffle_i32x4::<0xEE>(a[0], a[1]);
    let t2 = _mm512_shuffle_i32x4::<0x44>(a[2], a[3]);
    let t3 = _mm512_shuffle_i32x4::<0xEE>(a[2], a[3]);
    [
        _mm512_shuffle_i32x4::<0x88>(t0, t2),
        _mm512_shuffle_i32x4::<0xDD>(t0, t2),
        _mm512_shuffle_i32x4::<0x88>(t1, t3),
        _mm512_shuffle_i32x4::<0xDD>(t1, t3),
    ]
}

/// The loop of the module docs.
///
/// # Safety
/// The features of [`has_vnni_vbmi`] present; the arguments passed [`check_axpy_exact`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c")]
unsafe fn axpy_vnni<const BITS: u8, const SUB: u8, const OFF: bool>(
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
        unsafe { stream::<BITS, SUB, OFF>(m, &mut plan, chunks, y) }
    })
}

/// Streams the plan's passes through the output chunks.
///
/// # Safety
/// As [`axpy_vnni`]; `plan` was built from the same arguments and `plan.sums` holds `96` values per
/// chunk of `chunks`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c")]
unsafe fn stream<const BITS: u8, const SUB: u8, const OFF: bool>(
    m: &ExactMatrix<'_>,
    plan: &mut Plan,
    chunks: Range<usize>,
    y: &mut [f32],
) {
    let f = m.fmt;
    let n_out = m.n_out;
    let kb = super::exact_plan::chunk_bytes(BITS);
    let scales = m.scales.as_ptr();
    let yp = y.as_mut_ptr();
    let tables = Tables::load();
    let zero = f.zero as i32;
    let Plan { quads, runs, passes, groups, sums } = plan;
    let sp = sums.as_mut_ptr();
    for (pi, pass) in passes.iter().enumerate() {
        let g = groups[pass.group];
        let sv = _mm512_set1_ps(g.s);
        let next = passes.get(pi + 1).copied();
        // 4-bit columns go four chunks (128 rows, one 64-byte line per column) at a time where
        // four are left ([`load_quad4`]), the rest one chunk at a time.
        let n_chunks = chunks.len();
        let four_end = if BITS == 4 { n_chunks / 4 * 4 } else { 0 };
        let steps = (0..four_end).step_by(4).map(|ci| (ci, 4)).chain((four_end..n_chunks).map(|ci| (ci, 1)));
        for (ci, step) in steps {
            let ch = chunks.start + ci;
            for (ci, ch) in (ci..ci + step).zip(ch..) {
                if let Some(nx) = next {
                    prefetch_next_pass::<BITS, SUB, OFF>(quads, runs, groups, nx, scales, n_out, ci, ch);
                }
            }
            if step == 4 {
                // SAFETY: `ci + 4 ≤ chunks.len()`: the four chunks' 4 · 96 sums lie within `sums`,
                // and `ch + 4 ≤ n_out / 32`: their rows lie within the columns and records.
                unsafe { four_chunks::<SUB, OFF>(m, pass, g, runs, quads, sp.add(96 * ci), ci, ch, yp) };
                continue;
            }
            // SAFETY: `ci < chunks.len()`: the chunk's 96 sums lie within `sums`.
            let (tp, ap, mp) = unsafe { (sp.add(96 * ci), sp.add(96 * ci + 32), sp.add(96 * ci + 64)) };
            // Only called with `p` one of `tp`, `ap`, `mp` and `h < 2`.
            let ld = |p: *mut i32, h: usize| {
                // SAFETY: 16 `i32` at `p + 16h`, within the 32 of `p` (as above).
                unsafe { _mm512_loadu_si512(p.add(16 * h) as *const __m512i) }
            };
            let st = |p: *mut i32, h: usize, v: __m512i| {
                // SAFETY: as for `ld`.
                unsafe { _mm512_storeu_si512(p.add(16 * h) as *mut __m512i, v) }
            };
            // The group's sums so far (the legacy formats have one run per group: none kept).
            let (mut acc, mut macc) = if pass.first || SUB == 0 {
                ([_mm512_setzero_si512(); 2], [_mm512_setzero_si512(); 2])
            } else if OFF {
                ([ld(ap, 0), ld(ap, 1)], [ld(mp, 0), ld(mp, 1)])
            } else {
                ([ld(ap, 0), ld(ap, 1)], [_mm512_setzero_si512(); 2])
            };
            let mut q = pass.q0;
            while q < pass.q1 {
                let run = runs[quads[q].run];
                let mut t =
                    if q == run.q0 { [_mm512_set1_epi32(-zero * run.sum_c); 2] } else { [ld(tp, 0), ld(tp, 1)] };
                let qe = run.q1.min(pass.q1);
                for qd in &quads[q..qe] {
                    // SAFETY: `ch < n_out / 32`: chunk `ch` of checked columns.
                    let [lo, hi] = unsafe { load_quad::<BITS>(&qd.ptrs, ch * kb, &tables) };
                    let cv = _mm512_set1_epi32(qd.cq);
                    t[0] = _mm512_dpbusd_epi32(t[0], lo, cv);
                    t[1] = _mm512_dpbusd_epi32(t[1], hi, cv);
                }
                q = qe;
                if qe < run.q1 {
                    // The run goes on in the next pass.
                    st(tp, 0, t[0]);
                    st(tp, 1, t[1]);
                    break;
                }
                if SUB == 0 {
                    acc = t;
                    continue;
                }
                for h in 0..2 {
                    let r = ch * 32 + 16 * h;
                    // SAFETY: `r + 16 ≤ n_out`: the run's sub-scale (and sub-offset) bytes of rows
                    // `r..r + 16` lie within its super-block's record (module docs).
                    let sc = unsafe {
                        if SUB == 2 {
                            bytes16::<true>(scales.add(run.sub_at + r))
                        } else {
                            bytes16::<false>(scales.add(run.sub_at + r))
                        }
                    };
                    acc[h] = _mm512_add_epi32(acc[h], _mm512_mullo_epi32(sc, t[h]));
                    if OFF {
                        // SAFETY: as above.
                        let mv = unsafe { bytes16::<false>(scales.add(run.sub_at + n_out + r)) };
                        macc[h] = _mm512_add_epi32(macc[h], _mm512_mullo_epi32(mv, _mm512_set1_epi32(run.sum_c)));
                    }
                }
            }
            if !pass.last {
                if SUB != 0 {
                    for h in 0..2 {
                        st(ap, h, acc[h]);
                        if OFF {
                            st(mp, h, macc[h]);
                        }
                    }
                }
                continue;
            }
            for h in 0..2 {
                let r = ch * 32 + 16 * h;
                // SAFETY: `r + 16 ≤ n_out`: the f16 `d` (and `b`) of rows `r..r + 16` lie within the
                // group's super-block record; `y` holds the piece's `32 · chunks.len()` values
                // from `y_off` (checked length), of which `ci·32 + 16h .. + 16`.
                unsafe {
                    let d = _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(g.base + 2 * r) as *const __m256i));
                    let yk = yp.add(g.y_off + ci * 32 + 16 * h);
                    let mut v = _mm512_fmadd_ps(_mm512_mul_ps(d, sv), _mm512_cvtepi32_ps(acc[h]), _mm512_loadu_ps(yk));
                    if OFF {
                        let b = _mm512_cvtph_ps(_mm256_loadu_si256(
                            scales.add(g.base + 2 * n_out + 2 * r) as *const __m256i
                        ));
                        let mm = if SUB == 0 { _mm512_set1_ps(g.sum_c as f32) } else { _mm512_cvtepi32_ps(macc[h]) };
                        v = _mm512_fmadd_ps(_mm512_mul_ps(b, sv), mm, v);
                    }
                    _mm512_storeu_ps(yk, v);
                }
            }
        }
    }
}

/// One pass over four chunks of 4-bit columns (128 rows): [`stream`]'s loop body with
/// [`load_quad4`]'s sums (slot `s`, kept in that order until the pass that adds them to `y`).
///
/// # Safety
/// As [`stream`]; `ch + 4 ≤ n_out / 32`; `sums` points at the four chunks' `4 · 96` sums
/// (chunks `ci .. ci + 4` of the call) and `yp` at `y` ([`stream`]'s), where slot `s` of part `r` (0: a run's sums, 1: the
/// group's `acc`, 2: its `M`) lies at `96 · (s / 2) + 32 · r + 16 · (s % 2)`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c")]
unsafe fn four_chunks<const SUB: u8, const OFF: bool>(
    m: &ExactMatrix<'_>,
    pass: &Pass,
    g: Group,
    runs: &[Run],
    quads: &[Quad],
    sums: *mut i32,
    ci: usize,
    ch: usize,
    yp: *mut f32,
) {
    let f = m.fmt;
    let n_out = m.n_out;
    let kb = f.chunk_bytes();
    let scales = m.scales.as_ptr();
    let zero = f.zero as i32;
    let at = |r: usize, s: usize| 96 * (s / 2) + 32 * r + 16 * (s % 2);
    // SAFETY: `at(r, s) + 16 ≤ 4 · 96` for `r < 3`, `s < 8` (the contract's layout).
    let ld = |r: usize, s: usize| unsafe { _mm512_loadu_si512(sums.add(at(r, s)) as *const __m512i) };
    // SAFETY: as for `ld`.
    let st = |r: usize, s: usize, v: __m512i| unsafe { _mm512_storeu_si512(sums.add(at(r, s)) as *mut __m512i, v) };
    let z = _mm512_setzero_si512();
    let mut acc = if pass.first || SUB == 0 { [z; 8] } else { std::array::from_fn(|s| ld(1, s)) };
    let mut q = pass.q0;
    while q < pass.q1 {
        let run = runs[quads[q].run];
        // Odd slots (high nibbles) sum 16 × their integers, the zero point's term too.
        let mut t: [__m512i; 8] = if q == run.q0 {
            std::array::from_fn(|s| _mm512_set1_epi32(-zero * run.sum_c * if s % 2 == 1 { 16 } else { 1 }))
        } else {
            std::array::from_fn(|s| ld(0, s))
        };
        let qe = run.q1.min(pass.q1);
        for qd in &quads[q..qe] {
            // SAFETY: `ch + 4 ≤ n_out / 32`: chunks `ch .. ch + 4` (64 bytes) of checked columns.
            let v = unsafe { load_quad4(&qd.ptrs, ch * kb) };
            let cv = _mm512_set1_epi32(qd.cq);
            for s in 0..8 {
                t[s] = _mm512_dpbusd_epi32(t[s], v[s], cv);
            }
        }
        q = qe;
        if qe < run.q1 {
            // The run goes on in the next pass.
            for (s, &v) in t.iter().enumerate() {
                st(0, s, v);
            }
            break;
        }
        if SUB == 0 {
            acc = t;
            continue;
        }
        // SAFETY: rows `32ch .. 32ch + 128 ≤ n_out`: the run's sub-scale (and sub-offset) bytes
        // of those rows lie within its super-block's record (module docs).
        let p = scales.wrapping_add(run.sub_at + 32 * ch);
        // SAFETY: as above (128 sub-scale bytes from `p`).
        let (s0, s1) =
            unsafe { (_mm512_loadu_si512(p as *const __m512i), _mm512_loadu_si512(p.add(64) as *const __m512i)) };
        for s in 0..8 {
            let sc = if SUB == 2 { rows4::<true>(s0, s1, s) } else { rows4::<false>(s0, s1, s) };
            acc[s] = _mm512_add_epi32(acc[s], _mm512_mullo_epi32(sc, t[s]));
        }
    }
    if !pass.last {
        if SUB != 0 {
            for (s, &v) in acc.iter().enumerate() {
                st(1, s, v);
            }
        }
        return;
    }
    // The sub-offsets' term `Σ_run M_run·ΣC_run` in row order (`macc[k]`: rows `16k .. 16k + 16`
    // of the four chunks), straight from the bytes once the group's last pass is here: it does
    // not depend on the columns, so it is not carried between passes.
    let mut macc = [z; 8];
    if OFF && SUB != 0 {
        for run in &runs[g.run0..g.run1] {
            let sum_c = _mm512_set1_epi32(run.sum_c);
            let p = scales.wrapping_add(run.sub_at + n_out + 32 * ch);
            for (k, m) in macc.iter_mut().enumerate() {
                // SAFETY: rows `32ch + 16k .. + 16 ≤ n_out`: within the run's sub-offset bytes.
                let mv = unsafe { bytes16::<false>(p.add(16 * k)) };
                *m = _mm512_add_epi32(*m, _mm512_mullo_epi32(mv, sum_c));
            }
        }
    }
    let sv = _mm512_set1_ps(g.s);
    for h in 0..2 {
        let a = rows_in_order([acc[h], acc[2 + h], acc[4 + h], acc[6 + h]]);
        // High-nibble rows (`h = 1`) summed 16 × their integers: `(d·s/16)·(16·acc)` is
        // `(d·s)·acc` to the bit (scaling by powers of two is exact, and 16 × a group's sum stays
        // below 2³¹: at most 128 inputs × 15 × 127 × 63 × 16), so the 16 comes out of the scale.
        let sd = if h == 1 { _mm512_set1_ps(g.s / 16.0) } else { sv };
        for k in 0..4 {
            let r = (ch + k) * 32 + 16 * h;
            let yi = g.y_off + (ci + k) * 32 + 16 * h;
            // SAFETY: `r + 16 ≤ n_out`: the f16 `d` (and `b`) of rows `r..r + 16` lie within the
            // group's super-block record; `y` holds the piece's outputs from `y_off` (checked
            // length), of which `yi .. yi + 16`.
            unsafe {
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(g.base + 2 * r) as *const __m256i));
                let yk = yp.add(yi);
                let mut v = _mm512_fmadd_ps(_mm512_mul_ps(d, sd), _mm512_cvtepi32_ps(a[k]), _mm512_loadu_ps(yk));
                if OFF {
                    let b =
                        _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(g.base + 2 * n_out + 2 * r) as *const __m256i));
                    let mv =
                        if SUB == 0 { _mm512_set1_ps(g.sum_c as f32) } else { _mm512_cvtepi32_ps(macc[2 * k + h]) };
                    v = _mm512_fmadd_ps(_mm512_mul_ps(b, sv), mv, v);
                }
                _mm512_storeu_ps(yk, v);
            }
        }
    }
}
