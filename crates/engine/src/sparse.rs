//! Sparse products over a pack's column layout: `y = Σ_{j active} x_j · W[:, j]`.
//!
//! When a selector keeps a subset of a site's inputs for a single decoded token, only those
//! columns of the site's weights are read. Each op's outputs are cut into ranges of 32-value
//! blocks handed to the pool's threads; a thread sums the active columns' slices of its range with
//! the `sift_quant` column kernel (AVX-512 / AVX2 / scalar, chosen at run time). Columns are
//! stored contiguously, so a thread reads `blocks × block_bytes` contiguous bytes per column.

use crate::pool::{split, SharedMut, ThreadPool};
use sift_model::layout::ColumnTensor;
use sift_quant::{axpy_cols_batch, AxpyColsFn, ColMatrix, ColType, Isa};

/// One op's column tensor, ready for the kernel.
#[derive(Clone, Debug)]
pub struct ColOp {
    pub ty: ColType,
    pub n_in: usize,
    pub n_out: usize,
    pub col_bytes: usize,
    pub range: std::ops::Range<usize>,
    pub axpy: AxpyColsFn,
}

impl ColOp {
    pub fn new(t: &ColumnTensor) -> ColOp {
        ColOp { ty: t.ty, n_in: t.n_in, n_out: t.n_out, col_bytes: t.col_bytes, range: t.range(), axpy: t.ty.axpy_fn() }
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
    pub out: &'a mut [f32],
}

/// Output blocks per unit of work (batched products).
fn blocks_per_chunk(total_blocks: usize, n_threads: usize) -> usize {
    (total_blocks / (n_threads * 4).max(1)).clamp(2, 16)
}

/// Runs several column products over the same active inputs in one pool dispatch.
///
/// Work is split by *columns*: the active list is cut into a few pieces (a number that depends
/// only on its length and the thread count); each unit of work sums one piece of one op's active
/// columns over the op's whole output into the piece's own accumulator, and the accumulators are
/// added in piece order at the end. Each column is thus read whole and in ascending order
/// (near-sequential memory access), and the result does not depend on which thread ran which
/// piece, nor on where the columns sit (a tensor or a cache): the same inputs give the same bits.
/// `scratch` holds the accumulators between calls.
pub fn column_matmul(pool: &ThreadPool, coef: &[f32], jobs: &mut [ColJob<'_>], scratch: &mut Vec<f32>) {
    let nt = pool.n_threads();
    let n_active = coef.len();
    let mut offsets = Vec::with_capacity(jobs.len());
    let mut total = 0;
    for j in jobs.iter() {
        assert!(j.out.len() >= j.op.n_out, "column product output too small");
        assert_eq!(j.idx.len(), n_active, "one column index per active input");
        offsets.push(total);
        total += j.op.n_out;
    }
    // Pieces of the active list per op: enough to balance, each at least 32 columns.
    let pieces = (nt * 2).min(n_active.div_ceil(32)).max(1);
    scratch.clear();
    scratch.resize(pieces * total, 0.0);
    let acc = SharedMut::new(&mut scratch[..]);
    let ops: Vec<(&ColOp, &[u8], &[u32])> = jobs.iter().map(|j| (j.op, j.data, j.idx)).collect();
    pool.for_each(ops.len() * pieces, 1, &|range, _worker| {
        for item in range {
            let (ji, pi) = (item / pieces, item % pieces);
            let (op, data, idx) = ops[ji];
            let r = split(n_active, pieces, pi);
            let start = pi * total + offsets[ji];
            // SAFETY: piece `pi` of job `ji` owns accumulator range `start..start + n_out`;
            // every (job, piece) item runs exactly once.
            let y = unsafe { acc.slice(start..start + op.n_out) };
            (op.axpy)(data, op.col_bytes, &idx[r.clone()], &coef[r], 0..op.n_out / 32, y);
        }
    });
    for (j, &off) in jobs.iter_mut().zip(&offsets) {
        let n = j.op.n_out;
        let out = &mut j.out[..n];
        out.copy_from_slice(&scratch[off..off + n]);
        for p in 1..pieces {
            let part = &scratch[p * total + off..p * total + off + n];
            for (o, v) in out.iter_mut().zip(part) {
                *o += v;
            }
        }
    }
}

/// A column product of a whole column tensor (no cache): `data` from the pack file.
pub fn tensor_job<'a>(op: &'a ColOp, file: &'a [u8], active: &'a [u32], out: &'a mut [f32]) -> ColJob<'a> {
    ColJob { op, data: &file[op.range.clone()], idx: active, out }
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
        let m = ColMatrix::new(op.ty, j.data, op.n_out, op.n_in).expect("column tensor shape checked at load");
        let bpc = blocks_per_chunk(n_blocks, pool.n_threads()).max(4);
        let n_chunks = n_blocks.div_ceil(bpc);
        let out = SharedMut::new(&mut j.out[..n * width]);
        pool.for_each(n_chunks, 1, &|range, _| {
            for c in range {
                let (b0, b1) = (c * bpc, ((c + 1) * bpc).min(n_blocks));
                let w = (b1 - b0) * 32;
                let mut y = vec![0f32; n * w];
                axpy_cols_batch(&m, &x[..n * op.n_in], n, b0..b1, &mut y, w, isa);
                for t in 0..n {
                    // SAFETY: token t's outputs b0*32..b1*32 belong to this chunk only.
                    let dst = unsafe { out.slice(t * width + b0 * 32..t * width + b1 * 32) };
                    dst.copy_from_slice(&y[t * w..(t + 1) * w]);
                }
            }
        });
    }
}
