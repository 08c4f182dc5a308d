//! The 8-bit-coefficient column kernel for many tokens over one active list
//! ([`crate::exact_q8::ExactAxpyTokensFn`]): FastForward's block-wise sparse FFN, where a block of
//! prompt tokens shares one set of neurons, so the down projection reads the same columns for
//! every token of the block.
//!
//! It runs [`super::exact_vnni`]'s arithmetic for up to four tokens at once: each quad's chunks
//! are loaded and transposed once ([`load_quad`]) and go through one `vpdpbusd` per token with that
//! token's four coefficients; the sub-scales (per run) and the f16 scales (per group) are loaded
//! once for the tokens too. Per token the integer sums and the `f32` operations are the one-token
//! kernel's, in its order, so every token's outputs equal a one-token call's bit for bit.
//!
//! Loop: per group and output chunk, the group's quads (at most 64 columns) are unpacked
//! once into a small buffer, then the tokens run four at a time through the group's runs from
//! that buffer: the unpacking (the expensive part for 5- and 6-bit formats) is paid once per
//! chunk for the whole block.
//!
//! # Safety invariant
//!
//! As [`super::exact_vnni`]: [`tokens_vnni`] is reachable only through `wrapper`, handed out by
//! [`vnni_tokens_fn`] after [`has_vnni_vbmi`], which first runs [`check_axpy_exact_tokens`];
//! every access is within the bounds that check establishes.

use super::exact_vnni::{bytes16, has_vnni_vbmi, load_quad, Tables};
use crate::exact::{runs, ExactFormat, ExactMatrix, SubScales, RUN_BREAK};
use crate::exact_q8::{check_axpy_exact_tokens, groups, quantize_group, ExactAxpyTokensFn};
use std::arch::x86_64::*;
use std::ops::Range;

/// The kernel for `fmt` (`None` if this CPU lacks the features).
pub(crate) fn vnni_tokens_fn(fmt: ExactFormat) -> Option<ExactAxpyTokensFn> {
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

#[allow(clippy::too_many_arguments)]
fn wrapper<const BITS: u8, const SUB: u8, const OFF: bool>(
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    n_tok: usize,
    chunks: Range<usize>,
    y: &mut [f32],
    y_stride: usize,
) {
    if let Err(e) = check_axpy_exact_tokens(m, idx, units, coef, n_tok, &chunks, y.len(), y_stride) {
        panic!("{e}");
    }
    assert!(
        m.fmt.bits == BITS && m.fmt.has_offset == OFF && (m.fmt.sub_scales != SubScales::None) == (SUB != 0),
        "exact column kernel chosen for another format"
    );
    if n_tok == 0 || idx.is_empty() {
        return;
    }
    let plan = TokenPlan::build(m, idx, units, coef, n_tok);
    // SAFETY: the arguments passed `check_axpy_exact_tokens`, `vnni_tokens_fn` checked the
    // features, and `plan` was built from these arguments.
    unsafe { tokens_vnni::<BITS, SUB, OFF>(m, &plan, chunks, y, y_stride) }
}

/// A group: its runs `r0..r1` and its super-block record.
struct TGroup {
    r0: usize,
    r1: usize,
    base: usize,
}

/// A run: its quads `q0..q1` and where its sub-scales start.
struct TRun {
    q0: usize,
    q1: usize,
    sub_at: usize,
}

/// A call's groups, runs and quads, and per token its coefficients: `cq[q·n_tok + t]` (quad `q`'s
/// four `i8`), `s[g·n_tok + t]` (group `g`'s scale), `sum_c[r·n_tok + t]` (run `r`'s `ΣC`).
struct TokenPlan {
    n_tok: usize,
    groups: Vec<TGroup>,
    runs: Vec<TRun>,
    ptrs: Vec<[*const u8; 4]>,
    cq: Vec<i32>,
    s: Vec<f32>,
    sum_c: Vec<i32>,
}

impl TokenPlan {
    /// The plan of a checked call (see [`check_axpy_exact_tokens`]).
    fn build(m: &ExactMatrix<'_>, idx: &[u32], units: &[u32], coef: &[f32], n_tok: usize) -> TokenPlan {
        let f = m.fmt;
        let (n_out, n) = (m.n_out, units.len());
        let rec = f.scale_record_bytes(n_out);
        let f16s = if f.has_offset { 4 } else { 2 };
        let sub_stride = if f.has_offset { 2 * n_out } else { n_out };
        let (cb, cols) = (m.stride, m.cols.as_ptr());
        let mut p = TokenPlan {
            n_tok,
            groups: Vec::new(),
            runs: Vec::new(),
            ptrs: Vec::new(),
            cq: Vec::new(),
            s: Vec::new(),
            sum_c: Vec::new(),
        };
        let mut c8 = vec![[0i8; RUN_BREAK]; n_tok];
        let mut sums = vec![0i32; n_tok];
        for (g0, g1) in groups(units, &f) {
            for (t, c) in c8.iter_mut().enumerate() {
                p.s.push(quantize_group(&coef[t * n + g0..t * n + g1], &mut c[..g1 - g0]));
            }
            let base = (units[g0] as usize / f.super_block) * rec;
            let r0 = p.runs.len();
            for (a, b) in runs(&units[g0..g1], f.sub_block) {
                let q0 = p.ptrs.len();
                sums.fill(0);
                for i in (a..b).step_by(4) {
                    let mut ptrs = [cols; 4];
                    for (j, ptr) in ptrs.iter_mut().enumerate() {
                        // Padding repeats the run's last column with a zero coefficient; `idx`
                        // entries name whole columns (checked): within `m.cols`.
                        *ptr = cols.wrapping_add(idx[g0 + (i + j).min(b - 1)] as usize * cb);
                    }
                    p.ptrs.push(ptrs);
                    for (t, c) in c8.iter().enumerate() {
                        let mut cq = [0u8; 4];
                        for j in 0..4 {
                            if i + j < b {
                                cq[j] = c[i + j] as u8;
                                sums[t] += c[i + j] as i32;
                            }
                        }
                        p.cq.push(i32::from_le_bytes(cq));
                    }
                }
                p.sum_c.extend_from_slice(&sums);
                let u = units[g0 + a] as usize;
                let sub_at = base + f16s * n_out + ((u % f.super_block) / f.sub_block) * sub_stride;
                p.runs.push(TRun { q0, q1: p.ptrs.len(), sub_at });
            }
            p.groups.push(TGroup { r0, r1: p.runs.len(), base });
        }
        p
    }
}

/// Every group and output chunk: the group's quads unpacked once per chunk into `qbuf`, then
/// the tokens four at a time ([`tile`]).
///
/// # Safety
/// The features of [`has_vnni_vbmi`] present; the call's arguments passed
/// [`check_axpy_exact_tokens`]; `plan` was built from them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c")]
unsafe fn tokens_vnni<const BITS: u8, const SUB: u8, const OFF: bool>(
    m: &ExactMatrix<'_>,
    plan: &TokenPlan,
    chunks: Range<usize>,
    y: &mut [f32],
    y_stride: usize,
) {
    let kb = m.fmt.chunk_bytes();
    let tables = Tables::load();
    let line_step = (64 / kb).max(1);
    let max_quads = plan.groups.iter().map(|g| plan.runs[g.r1 - 1].q1 - plan.runs[g.r0].q0).max().unwrap_or(0);
    let mut qbuf = vec![[_mm512_setzero_si512(); 2]; max_quads];
    for (gi, g) in plan.groups.iter().enumerate() {
        let q_first = plan.runs[g.r0].q0;
        let next = plan.groups.get(gi + 1);
        for (ci, ch) in chunks.clone().enumerate() {
            if let (Some(nx), 0) = (next, ci % line_step) {
                // The next group's columns into L2: hints that never fault.
                for ptrs in &plan.ptrs[plan.runs[nx.r0].q0..plan.runs[nx.r1 - 1].q1] {
                    for p in ptrs {
                        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ch * kb) as *const i8);
                    }
                }
            }
            for (b, ptrs) in qbuf.iter_mut().zip(&plan.ptrs[q_first..plan.runs[g.r1 - 1].q1]) {
                // SAFETY: `ch < n_out / 32`: chunk `ch` of checked columns.
                *b = unsafe { load_quad::<BITS>(ptrs, ch * kb, &tables) };
            }
            let mut t0 = 0;
            while t0 < plan.n_tok {
                let nt = (plan.n_tok - t0).min(4);
                let a = Tile { m, plan, gi, qbuf: &qbuf, t0, ci, ch };
                // SAFETY: the caller's contract; `t0 + nt <= n_tok`; `qbuf` holds the group's
                // quads of chunk `ch`.
                unsafe {
                    match nt {
                        4 => tile::<SUB, OFF, 4>(&a, y, y_stride),
                        3 => tile::<SUB, OFF, 3>(&a, y, y_stride),
                        2 => tile::<SUB, OFF, 2>(&a, y, y_stride),
                        _ => tile::<SUB, OFF, 1>(&a, y, y_stride),
                    }
                }
                t0 += nt;
            }
        }
    }
}

/// Where a tile works: group `gi` of `plan`, its quads of chunk `ch` (the `ci`-th of the call)
/// unpacked in `qbuf`, tokens from `t0`.
struct Tile<'a> {
    m: &'a ExactMatrix<'a>,
    plan: &'a TokenPlan,
    gi: usize,
    qbuf: &'a [[__m512i; 2]],
    t0: usize,
    ci: usize,
    ch: usize,
}

/// Tokens `t0..t0 + NT` through group `gi` at chunk `ch`: the runs' sums, the sub-scales, the
/// group's scales into `y`.
///
/// # Safety
/// As [`tokens_vnni`]; `t0 + NT <= plan.n_tok`; `qbuf` holds the group's quads of chunk `ch`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c")]
unsafe fn tile<const SUB: u8, const OFF: bool, const NT: usize>(a: &Tile<'_>, y: &mut [f32], y_stride: usize) {
    let Tile { m, plan, gi, qbuf, t0, ci, ch } = *a;
    let n_out = m.n_out;
    let scales = m.scales.as_ptr();
    let yp = y.as_mut_ptr();
    let zero = m.fmt.zero as i32;
    let nt = plan.n_tok;
    let g = &plan.groups[gi];
    let q_first = plan.runs[g.r0].q0;
    let sv: [__m512; NT] = std::array::from_fn(|t| _mm512_set1_ps(plan.s[gi * nt + t0 + t]));
    let mut acc = [[_mm512_setzero_si512(); 2]; NT];
    let mut macc = [[_mm512_setzero_si512(); 2]; NT];
    for (ri, run) in plan.runs[g.r0..g.r1].iter().enumerate() {
        let sc_at = (g.r0 + ri) * nt + t0;
        let mut tsum: [[__m512i; 2]; NT] =
            std::array::from_fn(|t| [_mm512_set1_epi32(-zero * plan.sum_c[sc_at + t]); 2]);
        for q in run.q0..run.q1 {
            let [lo, hi] = qbuf[q - q_first];
            for (t, ts) in tsum.iter_mut().enumerate() {
                let cv = _mm512_set1_epi32(plan.cq[q * nt + t0 + t]);
                ts[0] = _mm512_dpbusd_epi32(ts[0], lo, cv);
                ts[1] = _mm512_dpbusd_epi32(ts[1], hi, cv);
            }
        }
        if SUB == 0 {
            acc = tsum;
            continue;
        }
        for h in 0..2 {
            let r = ch * 32 + 16 * h;
            // SAFETY: `r + 16 ≤ n_out`: the run's sub-scale (and sub-offset) bytes of rows
            // `r..r + 16` lie within its super-block's record.
            let sc = unsafe {
                if SUB == 2 {
                    bytes16::<true>(scales.add(run.sub_at + r))
                } else {
                    bytes16::<false>(scales.add(run.sub_at + r))
                }
            };
            // SAFETY: as above.
            let mv = if OFF { unsafe { bytes16::<false>(scales.add(run.sub_at + n_out + r)) } } else { sc };
            for t in 0..NT {
                acc[t][h] = _mm512_add_epi32(acc[t][h], _mm512_mullo_epi32(sc, tsum[t][h]));
                if OFF {
                    let s = _mm512_set1_epi32(plan.sum_c[sc_at + t]);
                    macc[t][h] = _mm512_add_epi32(macc[t][h], _mm512_mullo_epi32(mv, s));
                }
            }
        }
    }
    let first_sum = g.r0 * nt + t0;
    for h in 0..2 {
        let r = ch * 32 + 16 * h;
        // SAFETY: `r + 16 ≤ n_out`: the f16 `d` (and `b`) of rows `r..r + 16` lie within the
        // group's super-block record.
        let (d, b) = unsafe {
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(g.base + 2 * r) as *const __m256i));
            let b = if OFF {
                _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(g.base + 2 * n_out + 2 * r) as *const __m256i))
            } else {
                d
            };
            (d, b)
        };
        for t in 0..NT {
            // SAFETY: token `t0 + t < n_tok`: its outputs `ci·32 + 16h .. + 16` lie within its
            // `32 · chunks.len()` values at `(t0 + t)·y_stride` (checked length).
            unsafe {
                let yk = yp.add((t0 + t) * y_stride + ci * 32 + 16 * h);
                let mut v =
                    _mm512_fmadd_ps(_mm512_mul_ps(d, sv[t]), _mm512_cvtepi32_ps(acc[t][h]), _mm512_loadu_ps(yk));
                if OFF {
                    let mm = if SUB == 0 {
                        _mm512_set1_ps(plan.sum_c[first_sum + t] as f32)
                    } else {
                        _mm512_cvtepi32_ps(macc[t][h])
                    };
                    v = _mm512_fmadd_ps(_mm512_mul_ps(b, sv[t]), mm, v);
                }
                _mm512_storeu_ps(yk, v);
            }
        }
    }
}
