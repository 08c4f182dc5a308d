//! Sparse products over a pack's column layout: `y = Σ_{j active} x_j · W[:, j]`.
//!
//! When a selector keeps a subset of a site's inputs for a single decoded token, only those
//! columns of the site's weights are read. Each op's outputs are cut into ranges of 32-value
//! blocks handed to the pool's threads; a thread sums the active columns' slices of its range with
//! the `sift_quant` column kernel (AVX-512 / AVX2 / scalar, chosen at run time). Columns are
//! stored contiguously, so a thread reads `blocks × block_bytes` contiguous bytes per column.

use crate::pool::{SharedMut, ThreadPool};
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

/// Output blocks per unit of work.
fn blocks_per_chunk(total_blocks: usize, n_threads: usize) -> usize {
    (total_blocks / (n_threads * 4).max(1)).clamp(2, 16)
}

/// Runs several column products over the same active inputs in one pool dispatch.
pub fn column_matmul(pool: &ThreadPool, file: &[u8], active: &[u32], coef: &[f32], jobs: &mut [ColJob<'_>]) {
    struct Prepared<'a> {
        op: &'a ColOp,
        data: &'a [u8],
        out: SharedMut<f32>,
        n_blocks: usize,
        first_chunk: usize,
    }
    let total: usize = jobs.iter().map(|j| j.op.n_out / 32).sum();
    let bpc = blocks_per_chunk(total, pool.n_threads());
    let mut chunks = 0;
    let prepared: Vec<Prepared<'_>> = jobs
        .iter_mut()
        .map(|j| {
            assert!(j.out.len() >= j.op.n_out, "column product output too small");
            let n_blocks = j.op.n_out / 32;
            let p = Prepared {
                op: j.op,
                data: &file[j.op.range.clone()],
                out: SharedMut::new(&mut j.out[..j.op.n_out]),
                n_blocks,
                first_chunk: chunks,
            };
            chunks += n_blocks.div_ceil(bpc);
            p
        })
        .collect();
    pool.for_each(chunks, 1, &|range, _worker| {
        for c in range {
            let Some(p) = prepared.iter().rev().find(|p| p.first_chunk <= c) else { continue };
            let b0 = (c - p.first_chunk) * bpc;
            let b1 = (b0 + bpc).min(p.n_blocks);
            // SAFETY: chunk c covers output blocks b0..b1 of one job, written by this thread only.
            let y = unsafe { p.out.slice(b0 * 32..b1 * 32) };
            y.fill(0.0);
            (p.op.axpy)(p.data, p.op.col_bytes, active, coef, b0..b1, y);
        }
    });
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
