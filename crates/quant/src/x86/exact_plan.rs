//! The layout of one call of an 8-bit-coefficient column kernel ([`crate::exact_q8`]), shared by
//! the AVX-512 VNNI kernel ([`super::exact_vnni`]) and the AVX2 one ([`super::exact_q8_avx2`]):
//! per group (an active list's entries in one source super-block) its coefficients quantized to
//! `i8`, its runs (entries in one sub-block) laid out as *quads* of four columns, and the quads cut
//! into *passes* that stream through the output chunks. Built before any column is read; plain
//! Rust, no instruction set of its own.

use crate::exact::{piece_offset, runs, ExactMatrix, RUN_BREAK};
use crate::exact_q8::{groups, quantize_group};
use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};

/// A quad: its four column pointers (a padded quad repeats a column), its four coefficients and
/// its run (an index into [`Plan::runs`]).
#[derive(Clone, Copy)]
pub(super) struct Quad {
    pub(super) ptrs: [*const u8; 4],
    pub(super) cq: i32,
    pub(super) run: usize,
}

/// One run: its quads `q0..q1`, `ΣC`, and where its sub-scales start in the scale plane.
#[derive(Clone, Copy)]
pub(super) struct Run {
    pub(super) q0: usize,
    pub(super) q1: usize,
    pub(super) sum_c: i32,
    pub(super) sub_at: usize,
}

/// A pass over the output chunks: quads `q0..q1` of group `group`.
#[derive(Clone, Copy)]
pub(super) struct Pass {
    pub(super) q0: usize,
    pub(super) q1: usize,
    pub(super) group: usize,
    /// The group's first pass (its sums start from zero) / last pass (it adds them to `y`).
    pub(super) first: bool,
    pub(super) last: bool,
}

/// One group: its coefficients' scale, its super-block record, where its piece's outputs start.
#[derive(Clone, Copy)]
pub(super) struct Group {
    pub(super) s: f32,
    pub(super) base: usize,
    pub(super) y_off: usize,
    /// `ΣC` of its (only) run, for the legacy formats' offset term.
    pub(super) sum_c: i32,
    /// Its runs (indices into [`Plan::runs`]).
    pub(super) run0: usize,
    pub(super) run1: usize,
}

/// Quads per pass: each pass streams through `4 · PASS_QUADS` columns at once (and prefetches as
/// many), few enough for the TLB and the hardware prefetchers ([`super::exact_vnni`]'s docs); a group's integer sums are kept
/// between its passes (exact, so the passes change nothing in the result).
pub(super) const PASS_QUADS: usize = 8;

/// A call's work laid out before any column is read, and the integer sums kept between passes.
#[derive(Default)]
pub(super) struct Plan {
    pub(super) quads: Vec<Quad>,
    pub(super) runs: Vec<Run>,
    pub(super) passes: Vec<Pass>,
    pub(super) groups: Vec<Group>,
    /// Per output chunk: a run's partial sums (32), the group's `acc` (32) and `M` (32).
    pub(super) sums: Vec<i32>,
}

thread_local! {
    pub(super) static PLAN: std::cell::RefCell<Plan> = std::cell::RefCell::new(Plan::default());
}

impl Plan {
    /// Groups, runs, quads and passes of a call (arguments checked by `check_axpy_exact`).
    pub(super) fn build(
        &mut self,
        m: &ExactMatrix<'_>,
        idx: &[u32],
        units: &[u32],
        coef: &[f32],
        y_len: usize,
        width: usize,
    ) {
        let f = m.fmt;
        let n_out = m.n_out;
        let rec = f.scale_record_bytes(n_out);
        let f16s = if f.has_offset { 4 } else { 2 };
        let sub_stride = if f.has_offset { 2 * n_out } else { n_out };
        let cb = m.stride;
        let cols = m.cols.as_ptr();
        // Block sizes are powers of two (`runs` checks): shifts, not divisions.
        let (sb_shift, sub_shift) = (f.super_block.trailing_zeros(), f.sub_block.trailing_zeros());
        self.quads.clear();
        self.runs.clear();
        self.passes.clear();
        self.groups.clear();
        let mut c8 = [0i8; RUN_BREAK];
        for (g0, g1) in groups(units, &f) {
            let s = quantize_group(&coef[g0..g1], &mut c8[..g1 - g0]);
            let base = (units[g0] as usize >> sb_shift) * rec;
            let q_start = self.quads.len();
            let run_start = self.runs.len();
            let mut sum_c_first = 0;
            for (r0, r1) in runs(&units[g0..g1], f.sub_block) {
                let q0 = self.quads.len();
                let mut sum_c = 0i32;
                for i in (r0..r1).step_by(4) {
                    let mut ptrs = [cols; 4];
                    let mut cq = [0u8; 4];
                    for (j, p) in ptrs.iter_mut().enumerate() {
                        // Padding repeats the run's last column with a zero coefficient; `idx`
                        // entries name whole columns (checked), so the pointers lie within `m.cols`.
                        *p = cols.wrapping_add(idx[g0 + (i + j).min(r1 - 1)] as usize * cb);
                        if i + j < r1 {
                            cq[j] = c8[i + j] as u8;
                            sum_c += c8[i + j] as i32;
                        }
                    }
                    self.quads.push(Quad { ptrs, cq: i32::from_le_bytes(cq), run: self.runs.len() });
                }
                let u = units[g0 + r0] as usize;
                let sub_at = base + f16s * n_out + ((u & (f.super_block - 1)) >> sub_shift) * sub_stride;
                if q0 == q_start {
                    sum_c_first = sum_c;
                }
                self.runs.push(Run { q0, q1: self.quads.len(), sum_c, sub_at });
            }
            let group = self.groups.len();
            let (run0, run1) = (run_start, self.runs.len());
            self.groups.push(Group { s, base, y_off: piece_offset(g0, y_len, width), sum_c: sum_c_first, run0, run1 });
            // Passes of whole runs, up to PASS_QUADS quads; a longer run is cut into passes of
            // PASS_QUADS (its partial sums kept between them).
            let q_end = self.quads.len();
            let mut p0 = q_start;
            for r in &self.runs[run_start..] {
                if r.q1 - p0 > PASS_QUADS && r.q0 > p0 {
                    self.passes.push(Pass { q0: p0, q1: r.q0, group, first: p0 == q_start, last: false });
                    p0 = r.q0;
                }
                while r.q1 - p0 > PASS_QUADS {
                    self.passes.push(Pass { q0: p0, q1: p0 + PASS_QUADS, group, first: p0 == q_start, last: false });
                    p0 += PASS_QUADS;
                }
            }
            self.passes.push(Pass { q0: p0, q1: q_end, group, first: p0 == q_start, last: true });
        }
    }
}

/// Bytes of one column chunk of `bits`-bit integers ([`crate::exact::ExactFormat::chunk_bytes`]),
/// as a constant for the kernels' const parameter `BITS`.
pub(super) const fn chunk_bytes(bits: u8) -> usize {
    match bits {
        4 => 16,
        5 => 20,
        6 => 24,
        _ => 32,
    }
}

/// While a pass reads output chunk `ch` (the `ci`-th of the call, [`chunk_bytes`]`(BITS)` bytes per column chunk),
/// prefetches what the next pass `nx` will read there, one pass ahead: its columns into L2 (`T1`)
/// a cache line at a time (into L1, or not at all, measured 10-40 % slower on the VNNI and AVX2
/// kernels alike), its runs' sub-scale (and sub-offset) bytes every other chunk, and, when `nx`
/// ends its group, the group's f16 scales (and offsets). Hints that never fault: every address
/// lies within checked columns and records, computed with `wrapping_add`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn prefetch_next_pass<const BITS: u8, const SUB: u8, const OFF: bool>(
    quads: &[Quad],
    runs: &[Run],
    groups: &[Group],
    nx: Pass,
    scales: *const u8,
    n_out: usize,
    ci: usize,
    ch: usize,
) {
    // Constants: a division per chunk measured ~3 % of a Qwen2.5-1.5B sparse token on AVX2.
    let kb = chunk_bytes(BITS);
    let line_step = (64 / kb).max(1);
    if ci.is_multiple_of(line_step) {
        for qd in &quads[nx.q0..nx.q1] {
            for p in qd.ptrs {
                // SAFETY: a prefetch is a hint; SSE is part of x86-64.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ch * kb) as *const i8) };
            }
        }
    }
    let hint = |p: *const u8| {
        // SAFETY: as above.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
    };
    if SUB != 0 && ci.is_multiple_of(2) {
        for r in &runs[quads[nx.q0].run..=quads[nx.q1 - 1].run] {
            if r.q1 <= nx.q1 {
                hint(scales.wrapping_add(r.sub_at + 32 * ch));
                if OFF {
                    hint(scales.wrapping_add(r.sub_at + n_out + 32 * ch));
                }
            }
        }
    }
    if nx.last {
        let nb = groups[nx.group].base;
        hint(scales.wrapping_add(nb + 64 * ch));
        if OFF {
            hint(scales.wrapping_add(nb + 2 * n_out + 64 * ch));
        }
    }
}
