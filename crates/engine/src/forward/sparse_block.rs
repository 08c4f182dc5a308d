//! FastForward's sparse prompt block in the forward pass (the block grid, its settings and the
//! down copy are [`crate::prefill`]): a block's chosen neurons, their gate and up rows, the GLU,
//! and the down projection over them.

use super::*;
use crate::matmul::{matmul_many, MatJob};
use crate::pool::SharedMut;
use crate::prefill::*;
use crate::source::SiteWeights;
use crate::vecops;
use sift_model::layout::OpKind;
use sift_model::QTensor;
use sift_quant::exact_q8::axpy_exact_tokens_fn;
use sift_quant::transposed_q8::{gemm_chosen_fn, TransposedQ8, PANEL};
use sift_quant::{ColFormat, ExactMatrix, Isa};
use sift_sparsity::{top_k_indices, Site};
use std::sync::Mutex;

impl Engine {
    /// The FFN of a sparse prompt block of `n` tokens (`s.h` holds its normed input): leaves the
    /// output in `s.o`, as the dense FFN does.
    pub(crate) fn ffn_sparse_block(&mut self, l: usize, n: usize) -> Result<(), EvalError> {
        let (ff, e) = (self.model.config.n_ff, self.model.config.n_embd);
        let (ratio, masks) = (self.prefill.ratio, self.prefill.masks);
        let lw = &self.model.layers[l];
        // Neurons are chosen one by one (the predictor is trained per neuron, and choosing
        // whole groups of a repacked matrix's interleaved rows, 8 or 16 at a time, cost the
        // 0.5B +19 % perplexity against +0 % per neuron); a repacked gate/up's chosen rows are
        // re-packed into groups for its kernels, so their number is a multiple of the group.
        let group = lw.w_gate.group_rows().max(lw.w_up.group_rows());
        // The layer's share of neurons kept: the layerwise schedule's, else 1 − R everywhere.
        let keep = self.prefill.keep.as_ref().and_then(|k| k.get(l).copied()).unwrap_or(1.0 - ratio);
        let k = ((keep as f64 * (ff / group) as f64).round() as usize).clamp(1, ff / group) * group;
        match masks {
            PrefillMasks::Oracle => {
                // The dense gate and up (with their adapters), the GLU, and its norm per neuron
                // over the block.
                self.project_site(l, n, Site::FfnIn)?;
                if let Some(lora) = self.lora.clone() {
                    let (x, mut outs) = self.s.site_io(&self.model.config, Site::FfnIn, n);
                    lora.apply(l, Site::FfnIn, x, n, &mut outs);
                }
                vecops::silu_mul_rows(&self.pool, &mut self.s.g[..n * ff], &self.s.u[..n * ff]);
                let p = &mut self.prefill.scratch;
                p.score.clear();
                p.score.resize(ff, 0.0);
                for row in self.s.g[..n * ff].chunks_exact(ff) {
                    for (sc, v) in p.score.iter_mut().zip(row) {
                        *sc += v * v;
                    }
                }
                top_k_indices(&p.score, k, &mut p.topk, &mut p.units);
                p.units.sort_unstable();
                p.gs.clear();
                for row in self.s.g[..n * ff].chunks_exact(ff) {
                    p.gs.extend(p.units.iter().map(|&j| row[j as usize]));
                }
            }
            PrefillMasks::Random | PrefillMasks::Predicted => {
                let FastForward { scratch: p, predictor, .. } = &mut self.prefill;
                match (predictor, masks) {
                    (Some(pred), PrefillMasks::Predicted) => {
                        pred.scores(l, &self.s.h[..n * e], n, &mut p.score, Some(&self.pool))
                    }
                    _ => {
                        let seed = (l as u64) << 32 ^ self.seq.n_past as u64;
                        p.score.clear();
                        p.score.extend((0..ff as u64).map(|j| hash01(seed, j)));
                    }
                }
                top_k_indices(&p.score, k, &mut p.topk, &mut p.units);
                p.units.sort_unstable();
                self.sparse_gate_up(l, n, k)?;
            }
        }
        self.sparsity.stats.prefill_neurons[0] += (n * k) as u64;
        self.sparsity.stats.prefill_neurons[1] += (n * ff) as u64;
        self.sparse_down(l, n, k, e)?;
        // Down's adapter on the GLU of the chosen neurons (zero elsewhere), as on a dense
        // block's masked input.
        if let Some(lora) = &self.lora {
            let p = &self.prefill.scratch;
            lora.apply_units(l, OpKind::Down, &p.units, &p.gs[..n * k], n, &mut self.s.o[..n * e]);
        }
        // The error compensator (§3.3): what the skipped neurons would have added, estimated
        // from each token's FFN input.
        if let (Some(p), true) = (&self.prefill.predictor, self.prefill.compensate) {
            p.compensate(l, &self.s.h[..n * e], n, &mut self.s.o[..n * e]);
        }
        Ok(())
    }

    /// Gate and up for the chosen rows only: copied into compact matrices, run as a batch; leaves
    /// the GLU of the chosen neurons in `gs` (n × k).
    fn sparse_gate_up(&mut self, l: usize, n: usize, k: usize) -> Result<(), EvalError> {
        let e = self.model.config.n_embd;
        let Engine { model, pool, s, source, prefill, lora, .. } = self;
        let p = &mut prefill.scratch;
        let lw = &model.layers[l];
        let (gate, up) = (&lw.w_gate, &lw.w_up);
        // The chosen rows of gate, then of up, side by side in `rows`. A repacked matrix (its
        // groups of `g` rows interleaved) has each output group of `g` chosen rows gathered from
        // the source groups that hold them (unpacked) and packed again, so that the compact
        // matrix runs on the same kernels; the output groups are spread over the threads.
        let (gb, ub) = (k * gate.row_bytes, k * up.row_bytes);
        // Every byte of `rows[..gb + ub]`, and below every output of `gs` and `us`, is written
        // before it is read: grown, never cleared (clearing them was a `memset` per block).
        grow(&mut p.rows, gb + ub, 0);
        if source.streams_rows() {
            // Under a memory budget the rows stream through the store's prefill buffer a chunk
            // at a time (plain rows: nothing is repacked there); each chunk's chosen rows are
            // copied to their places.
            for part in 0.. {
                match source.site(model, l, Site::FfnIn, n, None, part)? {
                    None => break,
                    Some(SiteWeights::RowChunk { file, op, w, row0 }) => {
                        let (at, rb) = if op == 0 { (0, gate.row_bytes) } else { (gb, up.row_bytes) };
                        let lo = p.units.partition_point(|&u| (u as usize) < row0);
                        let hi = p.units.partition_point(|&u| (u as usize) < row0 + w.rows);
                        for (i, &u) in p.units.iter().enumerate().take(hi).skip(lo) {
                            let src = w.range.start + (u as usize - row0) * rb;
                            p.rows[at + i * rb..at + (i + 1) * rb].copy_from_slice(&file[src..src + rb]);
                        }
                    }
                    Some(_) => unreachable!("a budgeted store streams a batch's rows"),
                }
            }
        } else {
            let (gd, ud) = (model.data(gate), model.data(up));
            let (gg, ug) = (gate.group_rows(), up.group_rows());
            let (n_gate, n_up) = (k / gg, k / ug);
            let units = &p.units;
            let dst = SharedMut::new(&mut p.rows);
            pool.for_each(n_gate + n_up, 8, &|range, _| {
                let mut scratch = Vec::new();
                for i in range {
                    let (w, data, at, oi, g) =
                        if i < n_gate { (gate, gd, 0, i, gg) } else { (up, ud, gb, i - n_gate, ug) };
                    let rb = w.row_bytes;
                    // SAFETY: output group `oi` of this matrix owns bytes `at + oi·g·rb ..` of `rows`.
                    let out = unsafe { dst.slice(at + oi * g * rb..at + (oi + 1) * g * rb) };
                    gather_group(w, data, &units[oi * g..(oi + 1) * g], out, &mut scratch);
                }
            });
        }
        let cg = QTensor { rows: k, range: 0..gb, ..gate.clone() };
        let cu = QTensor { rows: k, range: gb..gb + ub, ..up.clone() };
        let ws: Vec<&QTensor> = Site::FfnIn.ops().iter().map(|&op| lw.op(op)).collect();
        s.acts.quantize_for(pool, &ws, &s.h[..n * e], e, n);
        grow(&mut p.gs, n * k, 0.0);
        grow(&mut p.us, n * k, 0.0);
        let mut jobs = [MatJob { w: &cg, stride: k, out: &mut p.gs }, MatJob { w: &cu, stride: k, out: &mut p.us }];
        matmul_many(pool, &p.rows, &s.acts, n, &mut jobs);
        // The adapters of gate and up on the chosen rows only.
        if let Some(lora) = lora {
            lora.apply_rows(l, OpKind::Gate, &s.h[..n * e], n, &p.units, &mut p.gs);
            lora.apply_rows(l, OpKind::Up, &s.h[..n * e], n, &p.units, &mut p.us);
        }
        vecops::silu_mul_rows(pool, &mut p.gs, &p.us);
        Ok(())
    }

    /// Down over the chosen neurons (their GLU in `gs`, n × k) into `s.o`: the pack's exact columns
    /// through the many-token kernel, or the dense kernel on the masked GLU.
    fn sparse_down(&mut self, l: usize, n: usize, k: usize, e: usize) -> Result<(), EvalError> {
        let ff = self.model.config.n_ff;
        if let Some(copy) = self.prefill.down.clone() {
            self.down_from_copy(&copy.layers[l], n, k, e);
            return Ok(());
        }
        let cols = self.model.columns.as_ref().map(|c| c.layers[l].op(OpKind::Down).clone());
        let exact = cols.as_ref().is_some_and(|t| matches!(t.ty, ColFormat::Exact(_)));
        if self.source.streams_rows() && exact {
            return self.down_from_store(l, n, k, e);
        }
        let positions = self.model.columns.as_ref().and_then(|c| c.layers[l].positions(OpKind::Down).cloned());
        match cols {
            Some(t) if exact && !self.source.streams_rows() => {
                let ColFormat::Exact(fmt) = t.ty else { unreachable!() };
                let Engine { model, pool, s, prefill, .. } = self;
                let p = &mut prefill.scratch;
                let file = model.pack_bytes();
                let m = ExactMatrix::new(fmt, t.n_out, t.n_in, &file[t.range()], &file[t.scales_range()]);
                p.idx.clear();
                p.idx.extend(p.units.iter().map(|&u| positions.as_ref().map_or(u, |pos| pos[u as usize])));
                let kernel = axpy_exact_tokens_fn(fmt, Isa::detect());
                let out = SharedMut::new(&mut s.o[..n * e]);
                let (units, idx, gs) = (&p.units, &p.idx, &p.gs);
                // Tokens in fours per work item: each thread reads the block's columns for its
                // tokens (after the first, from the shared cache).
                let per_item = 4 * n.div_ceil(4 * pool.n_threads()).max(1);
                pool.for_each(n.div_ceil(per_item), 1, &|range, _| {
                    for it in range {
                        let (t0, t1) = (it * per_item, ((it + 1) * per_item).min(n));
                        // SAFETY: tokens `t0..t1`'s outputs belong to this item only.
                        let y = unsafe { out.slice(t0 * e..t1 * e) };
                        y.fill(0.0);
                        kernel(&m, idx, units, &gs[t0 * k..t1 * k], t1 - t0, 0..e / 32, y, e);
                    }
                });
                Ok(())
            }
            _ => {
                // The GLU scattered back, zero outside the chosen neurons; the dense down.
                let Engine { s, prefill, .. } = self;
                let p = &prefill.scratch;
                s.g[..n * ff].fill(0.0);
                for (t, row) in s.g[..n * ff].chunks_exact_mut(ff).enumerate() {
                    for (&j, &v) in p.units.iter().zip(&p.gs[t * k..(t + 1) * k]) {
                        row[j as usize] = v;
                    }
                }
                self.project_site(l, n, Site::FfnMid)
            }
        }
    }
}

impl Engine {
    /// Down over the chosen neurons under a memory budget: their columns come through the tiered
    /// store's cache, as a decoded token's do (only those columns are read; they stay cached for
    /// the tokens that follow), in as many parts as its transient area needs, each through the
    /// many-token column kernel.
    fn down_from_store(&mut self, l: usize, n: usize, k: usize, e: usize) -> Result<(), EvalError> {
        let Engine { model, pool, s, source, sparsity, prefill, .. } = self;
        let stats = &mut sparsity.stats;
        let p = &mut prefill.scratch;
        let y_all = &mut s.o[..n * e];
        y_all.fill(0.0);
        let mut done = 0;
        for part in 0.. {
            let Some(weights) = source.site(model, l, Site::FfnMid, 1, Some(&p.units[..]), part)? else {
                break;
            };
            let SiteWeights::Columns { units, parts } = weights else {
                unreachable!("a budgeted store gives a lone token's columns");
            };
            let cp = &parts[0];
            let ColFormat::Exact(fmt) = cp.op.ty else {
                unreachable!("checked by the caller: the pack's down is exact");
            };
            let m = ExactMatrix::new(fmt, cp.op.n_out, cp.op.n_in, cp.data, cp.scales);
            // These units' coefficients, token after token.
            let len = units.len();
            p.us.clear();
            for t in 0..n {
                p.us.extend_from_slice(&p.gs[t * k + done..t * k + done + len]);
            }
            stats.column_bytes += cp.op.bytes(len) as u64;
            let kernel = axpy_exact_tokens_fn(fmt, Isa::detect());
            let out = SharedMut::new(&mut *y_all);
            let (idx, coef) = (cp.idx, &p.us);
            let per_item = 4 * n.div_ceil(4 * pool.n_threads()).max(1);
            pool.for_each(n.div_ceil(per_item), 1, &|range, _| {
                for it in range {
                    let (t0, t1) = (it * per_item, ((it + 1) * per_item).min(n));
                    // SAFETY: tokens `t0..t1`'s outputs belong to this item only.
                    let y = unsafe { out.slice(t0 * e..t1 * e) };
                    kernel(&m, idx, units, &coef[t0 * len..t1 * len], t1 - t0, 0..e / 32, y, e);
                }
            });
            done += len;
        }
        debug_assert_eq!(done, k, "every chosen neuron's column");
        Ok(())
    }

    /// Down over the chosen neurons from the layer's 8-bit copy `w`: the GLU (`gs`, n × k)
    /// quantized per token on the pool, then the output panels spread over the threads, then
    /// put back token-major in `s.o`.
    fn down_from_copy(&mut self, w: &TransposedQ8, n: usize, k: usize, e: usize) {
        let Engine { pool, s, prefill, .. } = self;
        let p = &mut prefill.scratch;
        let PrefillScratch { units, gs, q8, yp, panels, .. } = p;
        q8.reset(w, units, n).expect("chosen neurons are the layer's");
        let parts: Vec<Mutex<_>> = q8.token_chunks(n.div_ceil(pool.n_threads())).into_iter().map(Mutex::new).collect();
        let gs = &gs[..n * k];
        pool.for_each(parts.len(), 1, &|range, _| {
            for i in range {
                parts[i].lock().unwrap_or_else(|e| e.into_inner()).quantize(gs);
            }
        });
        drop(parts);
        let n_panels = w.n_panels();
        grow(yp, n_panels * n * PANEL, 0.0);
        while panels.len() < pool.capacity() {
            panels.push(Mutex::new(Vec::new()));
        }
        let kernel = gemm_chosen_fn(Isa::detect());
        let (units, q8, panels) = (&*units, &*q8, &*panels);
        let out = SharedMut::new(&mut yp[..n_panels * n * PANEL]);
        pool.for_each(n_panels, 1, &|range, worker| {
            // SAFETY: panels `range` own their `n × PANEL` tiles of the output.
            let y = unsafe { out.slice(range.start * n * PANEL..range.end * n * PANEL) };
            let mut scratch = panels[worker].lock().unwrap_or_else(|e| e.into_inner());
            kernel(w, units, q8, range, y, &mut scratch);
        });
        for (t, row) in s.o[..n * e].chunks_exact_mut(e).enumerate() {
            for (pi, dst) in row.chunks_exact_mut(PANEL).enumerate() {
                dst.copy_from_slice(&yp[(pi * n + t) * PANEL..][..PANEL]);
            }
        }
    }
}
