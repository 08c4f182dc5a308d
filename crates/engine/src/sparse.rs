//! Sparse products over a pack's column layout: `y = Σ_{j active} x_j · W[:, j]`.
//!
//! When a selector keeps a subset of a site's inputs for a single decoded token, only those
//! columns of the site's weights are read. Each op's outputs are cut into ranges of 32-value
//! blocks handed to the pool's threads; a thread sums the active columns' slices of its range with
//! the `sift_quant` column kernel (AVX-512 / AVX2 / scalar, chosen at run time). Columns are
//! stored contiguously, so a thread reads `blocks × block_bytes` contiguous bytes per column.
//! Exact columns (`sift_quant::exact`) also read the op's scale plane, which stays in memory.

use crate::pool::{SharedMut, ThreadPool};
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

    /// `y += Σ_i coef[i] · column units[i]` (found at `data[idx[i]·col_bytes..]`), all outputs.
    fn axpy(&self, data: &[u8], scales: &[u8], idx: &[u32], units: &[u32], coef: &[f32], y: &mut [f32]) {
        match (self.kernel, self.ty) {
            (ColKernel::Requant(f), _) => f(data, self.col_bytes, idx, coef, 0..self.n_out / 32, y),
            (ColKernel::Exact(f), ColFormat::Exact(fmt)) => {
                let m = ExactMatrix { fmt, n_out: self.n_out, n_in: self.n_in, cols: data, scales };
                f(&m, idx, units, coef, 0..self.n_out / 32, y)
            }
            (ColKernel::Exact(_), ColFormat::Requant(_)) => unreachable!("an exact kernel for re-quantized columns"),
        }
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

/// Active columns per piece of [`column_matmul`]'s work. A site streamed in parts
/// ([`column_matmul_part`]) must cut its active list at multiples of it.
pub const COLUMN_PIECE: usize = 64;

/// Runs several column products over the same active inputs in one pool dispatch.
///
/// Work is split by *columns*: the active list is cut into pieces of [`COLUMN_PIECE`] columns
/// (the last one shorter); each unit of work sums one piece of one op's active
/// columns over the op's whole output into the piece's own accumulator, and the accumulators are
/// added in piece order at the end. Each column is thus read whole and in ascending order
/// (near-sequential memory access), and the result does not depend on which thread ran which
/// piece, nor on where the columns sit (a tensor or a cache): the same inputs give the same bits.
/// `scratch` holds the accumulators between calls.
/// `units` are the active inputs (ascending), `coef` their values.
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
    let mut offsets = Vec::with_capacity(jobs.len());
    let mut total = 0;
    for j in jobs.iter() {
        assert!(j.out.len() >= j.op.n_out, "column product output too small");
        assert_eq!(j.idx.len(), n_active, "one column index per active input");
        offsets.push(total);
        total += j.op.n_out;
    }
    // Pieces of the active list per op: `COLUMN_PIECE` columns each, whatever the thread count.
    let pieces = n_active.div_ceil(COLUMN_PIECE).max(1);
    if scratch.len() < pieces * total {
        scratch.resize(pieces * total, 0.0);
    }
    let acc = SharedMut::new(&mut scratch[..pieces * total]);
    // Per job: op, columns, column indices, scale plane.
    type Part<'a> = (&'a ColOp, &'a [u8], &'a [u32], &'a [u8]);
    let ops: Vec<Part<'_>> = jobs.iter().map(|j| (j.op, j.data, j.idx, j.scales)).collect();
    pool.for_each(ops.len() * pieces, 1, &|range, _worker| {
        for item in range {
            let (ji, pi) = (item / pieces, item % pieces);
            let (op, data, idx, scales) = ops[ji];
            let r = pi * COLUMN_PIECE..((pi + 1) * COLUMN_PIECE).min(n_active);
            let start = pi * total + offsets[ji];
            // SAFETY: piece `pi` of job `ji` owns accumulator range `start..start + n_out`;
            // every (job, piece) item runs exactly once.
            let y = unsafe { acc.slice(start..start + op.n_out) };
            y.fill(0.0);
            op.axpy(data, scales, &idx[r.clone()], &units[r.clone()], &coef[r], y);
        }
    });
    // The pieces' sums added in piece order, into each output: in parallel over ranges of the
    // outputs (one after the other, `offsets` order) when there is enough to add.
    let sums = &scratch[..pieces * total];
    let lens: Vec<usize> = jobs.iter().map(|j| j.op.n_out).collect();
    let outs: Vec<SharedMut<'_, f32>> = jobs.iter_mut().map(|j| SharedMut::new(&mut j.out[..j.op.n_out])).collect();
    let reduce = |lo: usize, hi: usize| {
        for (ji, &off) in offsets.iter().enumerate() {
            let n = lens[ji];
            let (a, b) = (lo.max(off), hi.min(off + n));
            if a >= b {
                continue;
            }
            // SAFETY: output positions `a..b` of the concatenated outputs belong to the range
            // `lo..hi` being reduced, and the ranges handed out are disjoint.
            let out = unsafe { outs[ji].slice(a - off..b - off) };
            if accumulate {
                for (o, v) in out.iter_mut().zip(&sums[a..b]) {
                    *o += v;
                }
            } else {
                out.copy_from_slice(&sums[a..b]);
            }
            for p in 1..pieces {
                for (o, v) in out.iter_mut().zip(&sums[p * total + a..p * total + b]) {
                    *o += v;
                }
            }
        }
    };
    const REDUCE_BLOCK: usize = 2048;
    if pieces * total < 8 * REDUCE_BLOCK {
        reduce(0, total);
    } else {
        pool.for_each(total.div_ceil(REDUCE_BLOCK), 1, &|range, _| {
            for b in range {
                reduce(b * REDUCE_BLOCK, ((b + 1) * REDUCE_BLOCK).min(total));
            }
        });
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
            // their own go through the sparse kernel, every unit active, found at its position.
            let m = ExactMatrix { fmt, n_out: op.n_out, n_in: op.n_in, cols: j.data, scales: j.scales };
            let all_units: Vec<u32> = if op.positions.is_some() { (0..op.n_in as u32).collect() } else { Vec::new() };
            let out = SharedMut::new(&mut j.out[..n * width]);
            pool.for_each(n, 1, &|range, _| {
                for t in range {
                    // SAFETY: token t's outputs `t·width..(t + 1)·width` belong to item t only.
                    let y = unsafe { out.slice(t * width..(t + 1) * width) };
                    y.fill(0.0);
                    let xt = &x[t * op.n_in..(t + 1) * op.n_in];
                    match &op.positions {
                        Some(pos) => op.axpy(j.data, j.scales, pos, &all_units, xt, y),
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
