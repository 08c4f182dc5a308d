//! CATS' gate-first FFN step ([`FfnStep::GateFirst`](super::FfnStep::GateFirst)): the gate
//! product for every neuron, `act(gate)`, the selector's neurons on it, then up and down for
//! those neurons only.
//!
//! A neuron the selector skips contributes nothing: its `act(gate) · up` is set to zero before
//! the down projection, exactly as if its up row and down column were not read. Where the
//! weights allow it, only the chosen neurons' up rows and down columns are read: from the
//! layer's neuron bundles (a pack's, [`Bundles::ffn_lane`](sift_quant::bundles::Bundles::ffn_lane): each chosen neuron's up row and down
//! column in one record), else on the GGUF's rows ([`matmul_rows`]) and the pack's down columns;
//! otherwise the down projection runs on the masked input. A selection that keeps every neuron
//! computes the dense FFN bit for bit ([`vecops::silu`] then [`vecops::mul_assign`] is
//! [`vecops::silu_mul`]).

use super::{Engine, EvalError, LayerPlan, Products, RowMode};
use crate::matmul::{matmul_many, matmul_rows, MatJob};
use crate::pool::SharedMut;
use crate::source::SiteWeights;
use crate::vecops;
use sift_model::layout::OpKind;
use sift_quant::bundles::{add_lanes, BundleRow, Gate, BUNDLE_LANES};
use sift_quant::{axpy_exact_fn, Isa};
use sift_sparsity::Site;

impl Engine {
    /// Layer `l`'s FFN for `n` rows whose normed input is in `s.h`, gate first, into `s.o`.
    pub(crate) fn ffn_gate_first(&mut self, l: usize, n: usize, way: LayerPlan) -> Result<(), EvalError> {
        // (`--all-columns` measures the bundles' numerics: a batch then runs them token by token.)
        let bundled_batch = self.source.batches_as_lone_tokens() && self.source.bundles(&self.model, l).is_some();
        if n > 1 && (way.rows == RowMode::OneAtATime || bundled_batch) {
            return self.gate_first_row_by_row(l, n, way);
        }
        let c = &self.model.config;
        let (e, ff) = (c.n_embd, c.n_ff);
        // The FFN input site is dense (the selector keeps it whole): asked all the same, so that
        // traces, the read bound and the counters see every site of the layer.
        self.select_and_mask(l, Site::FfnIn, n);
        // A lone token on row-major weights computes its chosen neurons' up rows only (adapters
        // add to the whole gate and up outputs, so with them both run whole); with the layer's
        // neuron bundles, their up rows and down columns (an observer of the dense FFN's values
        // gets them from the other paths).
        let lone = n == 1 && way.products == Products::Cpu && self.lora.is_none();
        let bundled = lone && self.watch.ffn.is_none() && self.source.bundles(&self.model, l).is_some();
        let gather = lone && self.source.gathers_rows();
        let subset = if bundled {
            if self.gate_then_bundles(l)? {
                return Ok(());
            }
            false
        } else if gather {
            self.gate_then_chosen_up(l)?
        } else {
            match way.products {
                Products::Gpu => self.project_gpu(l, n, Site::FfnIn)?,
                Products::Hybrid | Products::Cpu => self.project(l, n, Site::FfnIn, false)?,
            }
            self.add_adapters(l, Site::FfnIn, n);
            vecops::silu_rows(&self.pool, &mut self.s.g[..n * ff]);
            let subset = self.select_and_mask(l, Site::FfnMid, n);
            vecops::mul_rows(&self.pool, &mut self.s.g[..n * ff], &self.s.u[..n * ff]);
            subset
        };
        self.watch.ffn(l, &self.s.h[..n * e], &self.s.g[..n * ff], n);
        self.site_products(l, n, Site::FfnMid, way, subset)
    }

    /// A lone token's FFN from the layer's neuron bundles: the gate product on the GGUF's rows,
    /// `act(gate)`, the selector's neurons, then those neurons' up rows and down columns, read
    /// record by record ([`Bundles::ffn_lane`](sift_quant::bundles::Bundles::ffn_lane), the lanes shared by the pool's threads), into
    /// `s.o`. When the selector keeps every neuron, it leaves `act(gate) · up` in `s.g` for the
    /// dense down product instead and returns false.
    fn gate_then_bundles(&mut self, l: usize) -> Result<bool, EvalError> {
        let (e, ff) = (self.model.config.n_embd, self.model.config.n_ff);
        {
            let Engine { model, pool, s, .. } = self;
            let (gate, up) = (model.layers[l].op(OpKind::Gate), model.layers[l].op(OpKind::Up));
            s.acts.quantize_for(pool, &[gate, up], &s.h[..e], e, 1);
            matmul_many(
                pool,
                model.file.bytes(),
                &s.acts,
                1,
                &mut [MatJob { w: gate, stride: ff, out: &mut s.g[..ff] }],
            );
        }
        vecops::silu(&mut self.s.g[..ff]);
        if !self.select_and_mask(l, Site::FfnMid, 1) {
            let Engine { model, pool, s, .. } = self;
            let up = model.layers[l].op(OpKind::Up);
            matmul_many(pool, model.file.bytes(), &s.acts, 1, &mut [MatJob { w: up, stride: ff, out: &mut s.u[..ff] }]);
            vecops::mul_assign(&mut s.g[..ff], &s.u[..ff]);
            return Ok(false);
        }
        let Engine { model, pool, s, source, sparsity, .. } = self;
        let b = source.bundles(model, l).expect("checked by the caller");
        let act_ty = b.layout.gate.act_type();
        let act = &s.acts.get(act_ty).1[..act_ty.row_bytes(e)];
        let dots = (b.layout.gate.dot_fn(), b.layout.up.dot_fn());
        let kernel = axpy_exact_fn(b.layout.down, Isa::detect());
        s.col_acc.resize(BUNDLE_LANES * e, 0.0);
        let lanes = SharedMut::new(&mut s.col_acc[..BUNDLE_LANES * e]);
        let (chosen, g) = (&s.active[..], &s.g[..ff]);
        pool.run(&|tid, nth| {
            for lane in (tid..BUNDLE_LANES).step_by(nth) {
                // SAFETY: a lane's accumulator is written only by the one thread that takes it.
                let y = unsafe { lanes.slice(lane * e..(lane + 1) * e) };
                y.fill(0.0);
                b.ffn_lane(lane, chosen, act, Gate::Given(g), dots, kernel, y);
            }
        });
        let o = &mut s.o[..e];
        o.fill(0.0);
        add_lanes(o, &s.col_acc[..BUNDLE_LANES * e]);
        let read = b.layout.row_bytes(BundleRow::Up) + b.layout.down_bytes();
        sparsity.stats.column_bytes += (chosen.len() * read) as u64;
        Ok(true)
    }

    /// A lone token's gate product on the GGUF's rows, its neurons chosen on `act(gate)`, and the
    /// up product for those neurons only; leaves `act(gate) · up` (zero for the skipped neurons)
    /// in `s.g`. Returns whether the choice is a subset (in `s.active`).
    fn gate_then_chosen_up(&mut self, l: usize) -> Result<bool, EvalError> {
        let ff = self.model.config.n_ff;
        let e = self.model.config.n_embd;
        {
            let Engine { model, pool, s, source, .. } = self;
            let Some(SiteWeights::Rows { file, layer, .. }) = source.site(model, l, Site::FfnIn, 1, None, 0)? else {
                unreachable!("a source that gathers rows gives a lone token's FFN input site as rows")
            };
            let (gate, up) = (layer.op(OpKind::Gate), layer.op(OpKind::Up));
            s.acts.quantize_for(pool, &[gate, up], &s.h[..e], e, 1);
            matmul_many(pool, file, &s.acts, 1, &mut [MatJob { w: gate, stride: ff, out: &mut s.g[..ff] }]);
        }
        vecops::silu(&mut self.s.g[..ff]);
        let subset = self.select_and_mask(l, Site::FfnMid, 1);
        {
            let Engine { model, pool, s, source, .. } = self;
            // (The mapped sources give the same rows again.)
            let Some(SiteWeights::Rows { file, layer, .. }) = source.site(model, l, Site::FfnIn, 1, None, 0)? else {
                unreachable!("a source that gathers rows gives a lone token's FFN input site as rows")
            };
            let mut job = [MatJob { w: layer.op(OpKind::Up), stride: ff, out: &mut s.u[..ff] }];
            match subset {
                true => matmul_rows(pool, file, &s.acts, &s.active, &mut job),
                false => matmul_many(pool, file, &s.acts, 1, &mut job),
            }
        }
        vecops::mul_assign(&mut self.s.g[..ff], &self.s.u[..ff]);
        Ok(subset)
    }

    /// [`Engine::ffn_gate_first`] for each of `n` rows as a lone token (its own neurons): row
    /// `t`'s input and output rows are swapped with row 0's, computed there, and swapped back.
    fn gate_first_row_by_row(&mut self, l: usize, n: usize, way: LayerPlan) -> Result<(), EvalError> {
        let e = self.model.config.n_embd;
        self.each_row_alone(n, Site::FfnMid, |engine, t| {
            swap_rows(&mut engine.s.h, e, 0, t);
            swap_rows(&mut engine.s.o, e, 0, t);
            let r = engine.ffn_gate_first(l, 1, way);
            swap_rows(&mut engine.s.o, e, 0, t);
            swap_rows(&mut engine.s.h, e, 0, t);
            r
        })
    }
}

/// Swaps rows `a` and `b` (of `w` values each) of `buf`.
fn swap_rows(buf: &mut [f32], w: usize, a: usize, b: usize) {
    let (lo, hi) = (a.min(b), a.max(b));
    if lo != hi {
        let (x, y) = buf.split_at_mut(hi * w);
        x[lo * w..(lo + 1) * w].swap_with_slice(&mut y[..w]);
    }
}
