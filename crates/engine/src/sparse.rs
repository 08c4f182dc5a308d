//! Sparse products over a pack's column layout: `y = Σ_{j active} x_j · W[:, j]`.
//!
//! When a selector keeps a subset of a site's inputs for a single decoded token, only those
//! columns of the site's weights are read. The active list is cut into pieces of
//! [`COLUMN_PIECE`] columns, each summed over the op's whole output into its own accumulator;
//! a thread takes a long stretch of consecutive pieces in one call of the `sift_quant` column
//! kernel (AVX-512 / AVX2 / scalar, chosen at run time), so it reads each column whole and its
//! columns in ascending order, one stream. The accumulators are added in piece order.
//! Exact columns (`sift_quant::exact`) also read the op's scale plane, which stays in memory.

use crate::pool::{SharedMut, ThreadPool};
use crate::vecops;
use sift_model::layout::{ColumnTensor, UnitPositions};
use sift_quant::{axpy_cols_batch, axpy_exact_batch, AxpyColsFn, ColFormat, ColMatrix, ExactAxpyFn, ExactMatrix, Isa};

/// The kernel of one op's columns.
#[derive(Clone, Copy, Debug)]
pub enum ColKernel {
    Requant(AxpyColsFn),
    Exact(ExactAxpyFn),
}

/// One op's column tensor, ready for the kernel.
#[derive(Clone, Debug)]
pub struct ColOp {
    pub ty: ColFormat,
    pub n_in: usize,
    pub n_out: usize,
    pub col_bytes: usize,
    /// The columns' and the scale plane's byte ranges in the pack file.
    pub range: std::ops::Range<usize>,
    pub scales_range: std::ops::Range<usize>,
    /// Where each unit's column lies in the tensor, when the pack stores the op's site in a unit
    /// order of its own (see `sift_model::layout::UnitOrderTensor`).
    pub positions: Option<UnitPositions>,
    pub kernel: ColKernel,
}

impl ColOp {
    /// The op of column tensor `t`, whose units lie at `positions` (`None`: in the model's order).
    pub fn new(t: &ColumnTensor, positions: Option<&UnitPositions>) -> ColOp {
        let kernel = match t.ty {
            ColFormat::Requant(c) => ColKernel::Requant(c.axpy_fn()),
            ColFormat::Exact(f) => ColKernel::Exact(sift_quant::axpy_exact_fn(f, Isa::detect())),
        };
        ColOp {
            ty: t.ty,
            n_in: t.n_in,
            n_out: t.n_out,
            col_bytes: t.col_bytes,
            range: t.range(),
            scales_range: t.scales_range(),
            positions: positions.cloned(),
            kernel,
        }
    }

    /// A re-quantized column tensor of format `ty` at `range` (no scale plane).
    pub fn requant(ty: sift_quant::ColType, n_in: usize, n_out: usize, range: std::ops::Range<usize>) -> ColOp {
        ColOp {
            ty: ColFormat::Requant(ty),
            n_in,
            n_out,
            col_bytes: ty.col_bytes(n_out),
            range,
            scales_range: 0..0,
            positions: None,
            kernel: ColKernel::Requant(ty.axpy_fn()),
        }
    }

    /// `y += Σ_i coef[i] · column units[i]` (found at `data[idx[i]·col_bytes..]`) over all
    /// outputs: `y` holds `n_out` values, or `n_out` per piece of [`COLUMN_PIECE`] active inputs,
    /// each piece's sum in its own (see [`sift_quant::ExactAxpyFn`]).
    fn axpy(&self, data: &[u8], scales: &[u8], idx: &[u32], units: &[u32], coef: &[f32], y: &mut [f32]) {
        let blocks = 0..self.n_out / 32;
        match (self.kernel, self.ty) {
            (ColKernel::Requant(f), _) => {
                // The re-quantized kernels add into one output: one call per piece.
                let one = y.len() == self.n_out;
                for (p, yp) in y.chunks_mut(self.n_out).enumerate() {
                    let r = (p * COLUMN_PIECE).min(idx.len())..((p + 1) * COLUMN_PIECE).min(idx.len());
                    let r = if one { 0..idx.len() } else { r };
                    f(data, self.col_bytes, &idx[r.clone()], &coef[r], blocks.clone(), yp);
                }
            }
            (ColKernel::Exact(f), ColFormat::Exact(fmt)) => {
                let m = ExactMatrix::new(fmt, self.n_out, self.n_in, data, scales);
                f(&m, idx, units, coef, blocks, y)
            }
            (ColKernel::Exact(_), ColFormat::Requant(_)) => unreachable!("an exact kernel for re-quantized columns"),
        }
    }

    /// Unit `unit`'s column, dequantized into `y` (`n_out` values), from the pack bytes `file`.
    pub(crate) fn column_f32(&self, file: &[u8], unit: u32, y: &mut [f32]) {
        let idx = self.positions.as_ref().map_or(unit, |p| p[unit as usize]);
        y.fill(0.0);
        self.axpy(&file[self.range.clone()], &file[self.scales_range.clone()], &[idx], &[unit], &[1.0], y);
    }

    /// Bytes of `k` columns.
    pub fn bytes(&self, k: usize) -> usize {
        k * self.col_bytes
    }
}

/// One product of [`column_matmul`]: `out = Σ coef[i] · column idx[i] of data`.
pub struct ColJob<'a> {
    pub op: &'a ColOp,
    /// The columns, `op.col_bytes` each: the op's column tensor, or a cache arena.
    pub data: &'a [u8],
    /// Which column of `data` holds active input `i` (the active channel itself when `data` is
    /// the whole column tensor).
    pub idx: &'a [u32],
    /// The op's scale plane (exact columns; empty otherwise).
    pub scales: &'a [u8],
    pub out: &'a mut [f32],
}

/// Output blocks per unit of work (batched products).
fn blocks_per_chunk(total_blocks: usize, n_threads: usize) -> usize {
    (total_blocks / (n_threads * 4).max(1)).clamp(2, 16)
}

/// Active columns per piece of [`column_matmul`]'s work: the column kernels always end a run at
/// multiples of it ([`sift_quant::exact::RUN_BREAK`]). A site streamed in parts
/// ([`column_matmul_part`]) must cut its active list at multiples of it.
pub const COLUMN_PIECE: usize = sift_quant::exact::RUN_BREAK;

/// Runs several column products over the same active inputs in one pool dispatch.
///
/// The active list is cut into pieces of [`COLUMN_PIECE`] columns (the last one shorter), and
/// each piece of each op sums its columns over the op's whole output into the piece's own
/// accumulator; the accumulators are then added in piece order. A unit of work is a stretch of
/// consecutive pieces of one op (about one per thread), run as one kernel call that keeps the
/// pieces' sums apart (see [`sift_quant::ExactAxpyFn`]): each column is read whole, in ascending
/// order, as one stream from the first piece to the last. The result does not depend on which
/// thread ran which piece, on how pieces are grouped, nor on where the columns sit (a tensor or a
/// cache): the same inputs give the same bits. `units` are the active inputs (ascending), `coef`
/// their values; `scratch` holds the accumulators between calls.
pub fn column_matmul(pool: &ThreadPool, units: &[u32], coef: &[f32], jobs: &mut [ColJob<'_>], scratch: &mut Vec<f32>) {
    column_matmul_part(pool, units, coef, jobs, scratch, false);
}

/// [`column_matmul`] over one part of a site's active inputs: with `accumulate`, the products
/// are added to the outputs (the parts of a site streamed through a small buffer add up). Parts
/// cut at multiples of [`COLUMN_PIECE`] give the same bits as the whole site in one call: the
/// pieces' sums are added to the output in the same order.
pub fn column_matmul_part(
    pool: &ThreadPool,
    units: &[u32],
    coef: &[f32],
    jobs: &mut [ColJob<'_>],
    scratch: &mut Vec<f32>,
    accumulate: bool,
) {
    let n_active = coef.len();
    // Job `j`'s accumulators: `pieces` outputs of `n_out`, from `offsets[j]`.
    let pieces = n_active.div_ceil(COLUMN_PIECE).max(1);
    let mut offsets = Vec::with_capacity(jobs.len());
    let mut total = 0;
    for j in jobs.iter() {
        assert!(j.out.len() >= j.op.n_out, "column product output too small");
        assert_eq!(j.idx.len(), n_active, "one column index per active input");
        offsets.push(total);
        total += pieces * j.op.n_out;
    }
    if scratch.len() < total {
        scratch.resize(total, 0.0);
    }
    let acc = SharedMut::new(&mut scratch[..total]);
    // Per job: op, columns, column indices, scale plane.
    type Part<'a> = (&'a ColOp, &'a [u8], &'a [u32], &'a [u8]);
    let ops: Vec<Part<'_>> = jobs.iter().map(|j| (j.op, j.data, j.idx, j.scales)).collect();
    // Stretches of consecutive pieces: one per thread and op, or pieces alone when that would
    // leave threads idle.
    let stretch = pieces.div_ceil(pool.n_threads()).max(1);
    let per_job = pieces.div_ceil(stretch);
    pool.for_each(ops.len() * per_job, 1, &|range, _worker| {
        for item in range {
            let (ji, si) = (item / per_job, item % per_job);
            let (op, data, idx, scales) = ops[ji];
            let (p0, p1) = (si * stretch, ((si + 1) * stretch).min(pieces));
            let r = p0 * COLUMN_PIECE..(p1 * COLUMN_PIECE).min(n_active);
            let start = offsets[ji] + p0 * op.n_out;
            // SAFETY: stretch `si` of job `ji` owns the accumulators of its pieces,
            // `start..start + (p1 − p0)·n_out`; every item runs exactly once.
            let y = unsafe { acc.slice(start..start + (p1 - p0) * op.n_out) };
            y.fill(0.0);
            op.axpy(data, scales, &idx[r.clone()], &units[r.clone()], &coef[r], y);
        }
    });
    // The pieces' sums added in piece order, into each output: in parallel over ranges of the
    // outputs when there is enough to add.
    let sums = &scratch[..total];
    let lens: Vec<usize> = jobs.iter().map(|j| j.op.n_out).collect();
    let outs: Vec<SharedMut<'_, f32>> = jobs.iter_mut().map(|j| SharedMut::new(&mut j.out[..j.op.n_out])).collect();
    const REDUCE_BLOCK: usize = 2048;
    // (job, output range) items.
    let items: Vec<(usize, usize, usize)> = lens
        .iter()
        .enumerate()
        .flat_map(|(ji, &n)| (0..n).step_by(REDUCE_BLOCK).map(move |a| (ji, a, (a + REDUCE_BLOCK).min(n))))
        .collect();
    let reduce = |&(ji, a, b): &(usize, usize, usize)| {
        let (n, off) = (lens[ji], offsets[ji]);
        // SAFETY: output range `a..b` of job `ji` belongs to this item only.
        let out = unsafe { outs[ji].slice(a..b) };
        // (`vecops::add_assign`: the widest vectors of the CPU; the same sums in the same order.)
        if accumulate {
            vecops::add_assign(out, &sums[off + a..off + b]);
        } else {
            out.copy_from_slice(&sums[off + a..off + b]);
        }
        for p in 1..pieces {
            vecops::add_assign(out, &sums[off + p * n + a..off + p * n + b]);
        }
    };
    if total < 8 * REDUCE_BLOCK {
        items.iter().for_each(reduce);
    } else {
        pool.for_each(items.len(), 1, &|range, _| range.for_each(|i| reduce(&items[i])));
    }
}

/// A column product of a whole column tensor (no cache): `data` from the pack file.
pub fn tensor_job<'a>(op: &'a ColOp, file: &'a [u8], active: &'a [u32], out: &'a mut [f32]) -> ColJob<'a> {
    ColJob { op, data: &file[op.range.clone()], idx: active, scales: &file[op.scales_range.clone()], out }
}

/// Runs several column products for a batch of `n` tokens (`x`: `n` rows of each op's `n_in`
/// inputs, zeros for skipped inputs): each column is dequantized once per output range and added
/// for every token that uses it. Used when all products run on columns (`--all-columns`, to
/// measure what the re-quantized columns cost).
pub fn column_matmul_batch(pool: &ThreadPool, x: &[f32], n: usize, jobs: &mut [ColJob<'_>]) {
    let isa = Isa::detect();
    for j in jobs.iter_mut() {
        let op = j.op;
        let (n_blocks, width) = (op.n_out / 32, op.n_out);
        if let ColFormat::Exact(fmt) = op.ty {
            // Exact columns: the one-token kernel per token over all outputs, tokens split
            // across threads (each token's outputs are its own). Columns in a unit order of
            // their own go through the sparse kernel over the same nonzero inputs
            // `axpy_exact_batch` takes (so the same runs, the same bits), found at their positions.
            let m = ExactMatrix::new(fmt, op.n_out, op.n_in, j.data, j.scales);
            let out = SharedMut::new(&mut j.out[..n * width]);
            pool.for_each(n, 1, &|range, _| {
                for t in range {
                    // SAFETY: token t's outputs `t·width..(t + 1)·width` belong to item t only.
                    let y = unsafe { out.slice(t * width..(t + 1) * width) };
                    y.fill(0.0);
                    let xt = &x[t * op.n_in..(t + 1) * op.n_in];
                    match &op.positions {
                        Some(pos) => {
                            let units: Vec<u32> = (0..op.n_in as u32).filter(|&c| xt[c as usize] != 0.0).collect();
                            let idx: Vec<u32> = units.iter().map(|&c| pos[c as usize]).collect();
                            let coef: Vec<f32> = units.iter().map(|&c| xt[c as usize]).collect();
                            op.axpy(j.data, j.scales, &idx, &units, &coef, y)
                        }
                        None => axpy_exact_batch(&m, xt, 1, 0..n_blocks, y, width),
                    }
                }
            });
            continue;
        }
        // Re-quantized columns in a unit order of their own: the inputs put in that order.
        let permuted: Vec<f32>;
        let x = match &op.positions {
            Some(pos) => {
                let mut xp = vec![0f32; n * op.n_in];
                for t in 0..n {
                    for (u, &p) in pos.iter().enumerate() {
                        xp[t * op.n_in + p as usize] = x[t * op.n_in + u];
                    }
                }
                permuted = xp;
                &permuted[..]
            }
            None => x,
        };
        let bpc = blocks_per_chunk(n_blocks, pool.n_threads()).max(4);
        let n_chunks = n_blocks.div_ceil(bpc);
        let data = j.data;
        let out = SharedMut::new(&mut j.out[..n * width]);
        pool.for_each(n_chunks, 1, &|range, _| {
            for c in range {
                let (b0, b1) = (c * bpc, ((c + 1) * bpc).min(n_blocks));
                let w = (b1 - b0) * 32;
                let mut y = vec![0f32; n * w];
                if let ColFormat::Requant(ty) = op.ty {
                    let m = ColMatrix::new(ty, data, op.n_out, op.n_in).expect("column tensor shape checked at load");
                    axpy_cols_batch(&m, &x[..n * op.n_in], n, b0..b1, &mut y, w, isa);
                }
                for t in 0..n {
                    // SAFETY: token t's outputs b0*32..b1*32 belong to this chunk only.
                    let dst = unsafe { out.slice(t * width + b0 * 32..t * width + b1 * 32) };
                    dst.copy_from_slice(&y[t * w..(t + 1) * w]);
                }
            }
        });
    }
}
