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

/// One product of [`column_matmul`]: `out = Σ coef[i] · W[:, active[i]]`.
pub struct ColJob<'a> {
    pub op: &'a ColOp,
    pub out: &'a mut [f32],
}

/// Output blocks per unit of work (batched products).
fn blocks_per_chunk(total_blocks: usize, n_threads: usize) -> usize {
    (total_blocks / (n_threads * 4).max(1)).clamp(2, 16)
}

/// Runs several column products over the same active inputs in one pool dispatch.
///
/// Work is split by *columns*: each unit of work is a contiguous run of the active columns of
/// one op, summed over the op's whole output into the worker's own accumulator; the workers'
/// accumulators are added at the end. Each column is thus read whole and in ascending order
/// (near-sequential memory access), instead of every thread gathering small slices of every
/// column. `scratch` holds the accumulators between calls.
pub fn column_matmul(
    pool: &ThreadPool,
    file: &[u8],
    active: &[u32],
    coef: &[f32],
    jobs: &mut [ColJob<'_>],
    scratch: &mut Vec<f32>,
) {
    let nt = pool.n_threads();
    let mut offsets = Vec::with_capacity(jobs.len());
    let mut total = 0;
    for j in jobs.iter() {
        assert!(j.out.len() >= j.op.n_out, "column product output too small");
        offsets.push(total);
        total += j.op.n_out;
    }
    scratch.clear();
    scratch.resize(nt * total, 0.0);
    // Pieces of the active list per op: enough to balance, each at least 32 columns.
    let pieces = (nt * 2).min(active.len().div_ceil(32)).max(1);
    let acc = SharedMut::new(&mut scratch[..]);
    let ops: Vec<(&ColOp, &[u8])> = jobs.iter().map(|j| (j.op, &file[j.op.range.clone()])).collect();
    pool.for_each(ops.len() * pieces, 1, &|range, worker| {
        for item in range {
            let (ji, pi) = (item / pieces, item % pieces);
            let (op, data) = ops[ji];
            let r = split(active.len(), pieces, pi);
            let start = worker * total + offsets[ji];
            // SAFETY: worker `worker`'s accumulator region is used by that thread alone.
            let y = unsafe { acc.slice(start..start + op.n_out) };
            (op.axpy)(data, op.col_bytes, &active[r.clone()], &coef[r], 0..op.n_out / 32, y);
        }
    });
    for (j, &off) in jobs.iter_mut().zip(&offsets) {
        let n = j.op.n_out;
        let out = &mut j.out[..n];
        out.copy_from_slice(&scratch[off..off + n]);
        for w in 1..nt {
            let part = &scratch[w * total + off..w * total + off + n];
            for (o, p) in out.iter_mut().zip(part) {
                *o += p;
            }
        }
    }
}

/// Runs several column products for a batch of `n` tokens (`x`: `n` rows of each op's `n_in`
/// inputs, zeros for skipped inputs): each column is dequantized once per output range and added
/// for every token that uses it. Used when all products run on columns (`--all-columns`, to
/// measure what the re-quantized columns cost).
pub fn column_matmul_batch(pool: &ThreadPool, file: &[u8], x: &[f32], n: usize, jobs: &mut [ColJob<'_>]) {
    let isa = Isa::detect();
    for j in jobs.iter_mut() {
        let op = j.op;
        let (n_blocks, width) = (op.n_out / 32, op.n_out);
        let m = ColMatrix::new(op.ty, &file[op.range.clone()], op.n_out, op.n_in)
            .expect("column tensor shape checked at load");
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
