//! Quantized matrix × activation products spread over the thread pool.
//!
//! `y[t][r] = W[r] · x[t]` for every output row `r` of `W` and token `t`. Activations are quantized
//! once per op into the weight type's activation format ([`QuantActs`]); several products that read
//! the same activation (q, k, v; gate, up) run in one pool dispatch ([`matmul_many`]) so the
//! threads meet once instead of three times.
//!
//! Work is handed out in chunks of weight rows ([`ROW_CHUNK`], or [`ROW_CHUNK_BATCH`] for batches
//! of four tokens or more); a thread sweeps all tokens over its
//! chunk (the chunk's weights stay in L1 / L2 while the activations stream past), four tokens at a
//! time through the weight type's [`Dot4RowsFn`], which unpacks each weight block once for the four
//! tokens and converts the four activation rows' block headers once for the whole chunk. The last
//! `n_tok % 4` tokens go through the single-row [`DotFn`]. Both kernels give bit-identical results
//! per token, so a batch computes exactly what token-by-token evaluation computes.

use crate::pool::{SharedMut, ThreadPool};
use sift_model::QTensor;
use sift_quant::packed::{gemm_q4k_x8_on, gemv_q4k_x8_on, GEMM_TOKENS, PACK_ROWS};
use sift_quant::packed_q4k_x16::{gemm_q4k_x16_on, gemv_q4k_x16_on, PACK_ROWS_X16};
use sift_quant::packed_q5_0::{gemm_q5_0_x16_on, gemv_q5_0_x16_on, PACK_ROWS_Q5_0};
use sift_quant::{ActType, Dot4RowsFn, DotFn, WeightType};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Activations of `n_tok` tokens quantized into each format that some weight needs.
pub struct QuantActs {
    /// (format, bytes per token row, data)
    bufs: Vec<(ActType, usize, Vec<u8>)>,
}

impl QuantActs {
    pub fn new() -> Self {
        QuantActs { bufs: Vec::new() }
    }

    /// Quantizes `n` rows of `x` (row length `cols`) into every activation format the weights
    /// `ws` need (each once), dropping formats of earlier products.
    pub fn quantize_for(&mut self, pool: &ThreadPool, ws: &[&QTensor], x: &[f32], cols: usize, n: usize) {
        self.clear();
        let mut done: Vec<ActType> = Vec::with_capacity(2);
        for w in ws {
            let ty = w.ty.act_type();
            if !done.contains(&ty) {
                self.quantize(pool, ty, x, cols, n);
                done.push(ty);
            }
        }
    }

    /// Quantizes `n_tok` rows of `x` (row length `cols`) into format `ty` (kept beside other formats).
    pub fn quantize(&mut self, pool: &ThreadPool, ty: ActType, x: &[f32], cols: usize, n_tok: usize) {
        let rb = ty.row_bytes(cols);
        let idx = match self.bufs.iter().position(|b| b.0 == ty) {
            Some(i) => i,
            None => {
                self.bufs.push((ty, rb, Vec::new()));
                self.bufs.len() - 1
            }
        };
        let buf = &mut self.bufs[idx];
        buf.1 = rb;
        if buf.2.len() < rb * n_tok {
            buf.2.resize(rb * n_tok, 0);
        }
        let out = &mut buf.2[..rb * n_tok];
        if n_tok == 1 {
            ty.quantize(&x[..cols], out);
            return;
        }
        let sm = SharedMut::new(out);
        pool.run(&|tid, nth| {
            for t in crate::pool::split(n_tok, nth, tid) {
                // SAFETY: each token's output row is written by exactly one thread.
                let o = unsafe { sm.slice(t * rb..(t + 1) * rb) };
                ty.quantize(&x[t * cols..(t + 1) * cols], o);
            }
        });
    }

    /// Forgets which formats are current (call before quantizing a new input).
    pub fn clear(&mut self) {
        for b in &mut self.bufs {
            b.1 = 0;
        }
    }

    /// Quantized rows in format `ty`: (bytes per token row, data).
    pub fn get(&self, ty: ActType) -> (usize, &[u8]) {
        let b = self.bufs.iter().find(|b| b.0 == ty && b.1 > 0).expect("activation not quantized to this format");
        (b.1, &b.2)
    }
}

impl Default for QuantActs {
    fn default() -> Self {
        Self::new()
    }
}

/// One product of a [`matmul_many`] call: `out[t * stride + r] = W[r] · x[t]`.
pub struct MatJob<'a> {
    pub w: &'a QTensor,
    pub out: &'a mut [f32],
    pub stride: usize,
}

/// Rows per unit of work handed to a thread, for one token. Long stretches of consecutive rows:
/// each thread then streams its weights from DRAM in long runs and takes few work items from the
/// shared counter (16 rows per item made decode 1.4-1.9x slower on a 2-core Zen 5: see
/// docs/benchmarks.md, issue 17, fourth step).
const ROW_CHUNK: usize = 256;

/// Rows per unit of work when the batch has four tokens or more: a [`Dot4RowsFn`] call prepares
/// its four activation rows once (about as much work as one to two weight rows), so calls should
/// cover many rows; 64 rows of the largest matrices are still small enough to stay in L2.
const ROW_CHUNK_BATCH: usize = 64;

const _: () = assert!(ROW_CHUNK.is_multiple_of(PACK_ROWS) && ROW_CHUNK_BATCH.is_multiple_of(PACK_ROWS));
const _: () = assert!(PACK_ROWS_Q5_0 == 16 && PACK_ROWS_X16 == 16);
const _: () = assert!(ROW_CHUNK.is_multiple_of(16) && ROW_CHUNK_BATCH.is_multiple_of(16));

/// Runs several products over the same quantized input in one pool dispatch.
pub fn matmul_many(pool: &ThreadPool, file: &[u8], acts: &QuantActs, n_tok: usize, jobs: &mut [MatJob<'_>]) {
    struct Prepared<'a> {
        w: &'a QTensor,
        dot: DotFn,
        dot4_rows: Dot4RowsFn,
        act_rb: usize,
        act: &'a [u8],
        out: SharedMut<'a, f32>,
        stride: usize,
        first_chunk: usize,
    }
    let row_chunk = if n_tok >= 4 { ROW_CHUNK_BATCH } else { ROW_CHUNK };
    let mut chunks = 0;
    let prepared: Vec<Prepared<'_>> = jobs
        .iter_mut()
        .map(|j| {
            assert!(j.out.len() >= (n_tok - 1) * j.stride + j.w.rows, "matmul output too small for {}", j.w.name);
            let (act_rb, act) = acts.get(j.w.ty.act_type());
            let p = Prepared {
                w: j.w,
                dot: j.w.ty.dot_fn(),
                dot4_rows: j.w.ty.dot4_rows_fn(),
                act_rb,
                act,
                out: SharedMut::new(j.out),
                stride: j.stride,
                first_chunk: chunks,
            };
            chunks += j.w.rows.div_ceil(row_chunk);
            p
        })
        .collect();
    let next = AtomicUsize::new(0);
    let isa = sift_quant::Isa::detect();
    pool.run(&|_, _| loop {
        let c = next.fetch_add(1, Ordering::Relaxed);
        if c >= chunks {
            break;
        }
        let j = prepared.iter().rev().find(|p| p.first_chunk <= c).expect("chunk belongs to a job");
        let r0 = (c - j.first_chunk) * row_chunk;
        let r1 = (r0 + row_chunk).min(j.w.rows);
        let rb = j.w.row_bytes;
        let base = j.w.range.start;
        let n = j.w.cols;
        let w_row = |r: usize| &file[base + r * rb..base + (r + 1) * rb];
        let act = |t: usize| &j.act[t * j.act_rb..(t + 1) * j.act_rb];
        if let Some((gemm, gemv)) = group16_kernels(j.w) {
            // Groups of 16 interleaved rows (chunks are whole groups): four tokens at a time
            // share each group's unpacked weights, bit for bit one at a time.
            debug_assert!(r0.is_multiple_of(16) && r1.is_multiple_of(16));
            let w = &file[base + r0 * rb..base + r1 * rb];
            let mut t = 0;
            // The kernels write every output: one buffer for the chunk (clearing it per four
            // tokens was ~1 % of a prompt's time, as a `memset` call).
            let mut ybuf = [[0f32; 4]; ROW_CHUNK_BATCH];
            while t + 4 <= n_tok {
                let y = &mut ybuf[..r1 - r0];
                gemm(isa, n, w, [act(t), act(t + 1), act(t + 2), act(t + 3)], y);
                for k in 0..4 {
                    // SAFETY: rows r0..r1 of token t + k belong to this chunk only.
                    let out = unsafe { j.out.slice((t + k) * j.stride + r0..(t + k) * j.stride + r1) };
                    for (o, y) in out.iter_mut().zip(y.iter()) {
                        *o = y[k];
                    }
                }
                t += 4;
            }
            for t in t..n_tok {
                // SAFETY: rows r0..r1 of token t belong to this chunk only.
                let out = unsafe { j.out.slice(t * j.stride + r0..t * j.stride + r1) };
                gemv(isa, n, w, act(t), out);
            }
            continue;
        }
        if j.w.packed {
            // Groups of 8 interleaved rows (chunks are whole groups): every token through the
            // 8-row kernel, so a batch computes what token-by-token evaluation computes.
            debug_assert!(r0.is_multiple_of(PACK_ROWS) && (r1.is_multiple_of(PACK_ROWS) || r1 == j.w.rows));
            // Four tokens at a time share each group's unpacked weights (bit for bit one at a time).
            let gb = PACK_ROWS * rb;
            let mut t = 0;
            while t + GEMM_TOKENS <= n_tok {
                for g in r0 / PACK_ROWS..r1 / PACK_ROWS {
                    let w = &file[base + g * gb..base + (g + 1) * gb];
                    let y = gemm_q4k_x8_on(isa, n, w, std::array::from_fn(|k| act(t + k)));
                    for (k, y) in y.iter().enumerate() {
                        let at = (t + k) * j.stride + g * PACK_ROWS;
                        // SAFETY: rows r0..r1 of token t + k belong to this chunk only.
                        unsafe { j.out.slice(at..at + PACK_ROWS) }.copy_from_slice(y);
                    }
                }
                t += GEMM_TOKENS;
            }
            for t in t..n_tok {
                // SAFETY: rows r0..r1 of token t belong to this chunk only.
                let out = unsafe { j.out.slice(t * j.stride + r0..t * j.stride + r1) };
                for (g, o) in (r0 / PACK_ROWS..r1 / PACK_ROWS).zip(out.chunks_exact_mut(PACK_ROWS)) {
                    let w = &file[base + g * gb..base + (g + 1) * gb];
                    o.copy_from_slice(&gemv_q4k_x8_on(isa, n, w, act(t)));
                }
            }
            continue;
        }
        let mut t = 0;
        let mut ybuf = [[0f32; 4]; ROW_CHUNK_BATCH];
        while t + 4 <= n_tok {
            let y = &mut ybuf[..r1 - r0];
            let a = [act(t), act(t + 1), act(t + 2), act(t + 3)];
            (j.dot4_rows)(n, &file[base + r0 * rb..base + r1 * rb], rb, a, y);
            for k in 0..4 {
                // SAFETY: rows r0..r1 of token t + k belong to this chunk only.
                let out = unsafe { j.out.slice((t + k) * j.stride + r0..(t + k) * j.stride + r1) };
                for (o, y) in out.iter_mut().zip(y.iter()) {
                    *o = y[k];
                }
            }
            t += 4;
        }
        for t in t..n_tok {
            let a = act(t);
            // SAFETY: rows r0..r1 of token t belong to this chunk only.
            let out = unsafe { j.out.slice(t * j.stride + r0..t * j.stride + r1) };
            for (o, r) in out.iter_mut().zip(r0..r1) {
                *o = (j.dot)(n, w_row(r), a);
            }
        }
    });
}

/// A group kernel's product with four tokens (`out[r][t]`, as [`Dot4RowsFn`]) and with one.
type GroupGemm = fn(sift_quant::Isa, usize, &[u8], [&[u8]; 4], &mut [[f32; 4]]);
type GroupGemv = fn(sift_quant::Isa, usize, &[u8], &[u8], &mut [f32]);

/// The kernels of a matrix packed in groups of 16 rows (Q5_0, and Q4_K with AVX-512 VNNI), which
/// take runs of whole groups; `None` for plain rows and the 8-row Q4_K layout.
fn group16_kernels(w: &QTensor) -> Option<(GroupGemm, GroupGemv)> {
    match (w.ty, w.group_rows()) {
        (WeightType::Q5_0, 16) => Some((gemm_q5_0_x16_on, gemv_q5_0_x16_on)),
        (WeightType::Q4_K, 16) => Some((gemm_q4k_x16_on, gemv_q4k_x16_on)),
        _ => None,
    }
}

/// Row-gather products for one token: `out[r] = W[r] · x` for the rows in `rows` only (FFN
/// neuron sparsity: the active neurons' gate and up rows); every other output is set to 0. Several
/// matrices over the same input run in one dispatch. Each row's result is bit-identical to the
/// dense product's.
///
/// # Panics
/// If `rows` is not strictly ascending (as [`sift_sparsity::Selector::fixed_neurons`] gives
/// them), or holds a row a matrix does not have.
pub fn matmul_rows(pool: &ThreadPool, file: &[u8], acts: &QuantActs, rows: &[u32], jobs: &mut [MatJob<'_>]) {
    // Distinct rows: the threads below write `out[r]` for their own rows only.
    assert!(rows.windows(2).all(|p| p[0] < p[1]), "matmul_rows: rows not strictly ascending");
    let prepared: Vec<(&QTensor, DotFn, &[u8], SharedMut<'_, f32>)> = jobs
        .iter_mut()
        .map(|j| {
            assert!(j.out.len() >= j.w.rows, "matmul output too small for {}", j.w.name);
            assert!(rows.iter().all(|&r| (r as usize) < j.w.rows), "row index out of range for {}", j.w.name);
            j.out[..j.w.rows].fill(0.0);
            let (act_rb, act) = acts.get(j.w.ty.act_type());
            (j.w, j.w.ty.dot_fn(), &act[..act_rb], SharedMut::new(j.out))
        })
        .collect();
    let per_job = rows.len().div_ceil(ROW_CHUNK);
    let isa = sift_quant::Isa::detect();
    pool.for_each(prepared.len() * per_job, 1, &|range, _| {
        for c in range {
            let (w, dot, act, out) = &prepared[c / per_job];
            let i0 = (c % per_job) * ROW_CHUNK;
            let (rb, base) = (w.row_bytes, w.range.start);
            if w.packed {
                // The group kernel over each group holding a listed row (the dense product's
                // numbers), keeping the listed rows.
                let listed = &rows[i0..(i0 + ROW_CHUNK).min(rows.len())];
                let gr = w.group_rows();
                let gb = gr * rb;
                let mut y = [0f32; 16];
                let group16 = group16_kernels(w);
                let mut k = 0;
                while k < listed.len() {
                    let g = listed[k] as usize / gr;
                    let wg = &file[base + g * gb..base + (g + 1) * gb];
                    match group16 {
                        Some((_, gemv)) => gemv(isa, w.cols, wg, act, &mut y),
                        None => y[..PACK_ROWS].copy_from_slice(&gemv_q4k_x8_on(isa, w.cols, wg, act)),
                    }
                    while k < listed.len() && listed[k] as usize / gr == g {
                        let r = listed[k] as usize;
                        // SAFETY: as below: each listed row is written by the one chunk that
                        // holds it.
                        let o = unsafe { out.slice(r..r + 1) };
                        o[0] = y[r % gr];
                        k += 1;
                    }
                }
                continue;
            }
            for &r in &rows[i0..(i0 + ROW_CHUNK).min(rows.len())] {
                let r = r as usize;
                // SAFETY: each listed row is written by the one chunk that holds it (rows are
                // distinct: asserted above), and each chunk runs once.
                let o = unsafe { out.slice(r..r + 1) };
                o[0] = dot(w.cols, &file[base + r * rb..base + (r + 1) * rb], act);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use sift_quant::WeightType;

    /// Deterministic pseudo-random values in `-1..1` (xorshift; no dev-dependency needed).
    fn values(seed: &mut u64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                (*seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// A batch (groups of four tokens plus a remainder, several jobs, chunks that end mid-way)
    /// computes bit for bit what one token at a time computes.
    #[test]
    fn batched_products_equal_token_by_token_products() {
        let pool = ThreadPool::new(2);
        let mut seed = 0x5eed_0001u64;
        for ty in [
            WeightType::Q4_0,
            WeightType::Q4_1,
            WeightType::Q5_0,
            WeightType::Q8_0,
            WeightType::Q4_K,
            WeightType::Q5_K,
            WeightType::Q6_K,
            WeightType::F16,
        ] {
            let cols = 512;
            let shapes = [150usize, 70];
            let mut file = Vec::new();
            let mut tensors = Vec::new();
            for (k, &rows) in shapes.iter().enumerate() {
                let start = file.len();
                for _ in 0..rows {
                    file.extend(sift_quant::scalar::quantize_row(ty, &values(&mut seed, cols)));
                }
                tensors.push(QTensor {
                    name: format!("w{k}"),
                    ty,
                    rows,
                    cols,
                    row_bytes: ty.row_bytes(cols).unwrap(),
                    range: start..file.len(),
                    packed: false,
                });
            }
            let n_tok = 11;
            let x = values(&mut seed, n_tok * cols);
            let mut acts = QuantActs::new();
            acts.quantize(&pool, ty.act_type(), &x, cols, n_tok);
            let mut out: Vec<Vec<f32>> = shapes.iter().map(|&r| vec![f32::NAN; n_tok * r]).collect();
            {
                let [o0, o1] = &mut out[..] else { unreachable!() };
                let mut jobs = [
                    MatJob { w: &tensors[0], out: o0, stride: shapes[0] },
                    MatJob { w: &tensors[1], out: o1, stride: shapes[1] },
                ];
                matmul_many(&pool, &file, &acts, n_tok, &mut jobs);
            }
            for t in 0..n_tok {
                let mut one = QuantActs::new();
                one.quantize(&pool, ty.act_type(), &x[t * cols..(t + 1) * cols], cols, 1);
                for (k, w) in tensors.iter().enumerate() {
                    let mut o = vec![f32::NAN; w.rows];
                    matmul_many(&pool, &file, &one, 1, &mut [MatJob { w, out: &mut o, stride: w.rows }]);
                    for (r, (a, b)) in out[k][t * w.rows..(t + 1) * w.rows].iter().zip(&o).enumerate() {
                        assert_eq!(a.to_bits(), b.to_bits(), "{} job {k} token {t} row {r}: {a} vs {b}", ty.name());
                    }
                }
            }
        }
    }
}
