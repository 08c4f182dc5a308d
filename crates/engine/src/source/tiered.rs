//! Weights under a memory budget: the tiered store (`sift_store::tiered`) behind the
//! weight-source interface. A decoded token's columns come through the store's cache (all of a
//! site's columns when its selection is not a subset); a prompt batch reads each layer's GGUF
//! rows into the store's prefill buffer, where the dense kernels run on them.

use super::{column_ops, site_col_ops, site_ops, ColumnPart, SiteWeights, WeightSource};
use crate::sparse::ColOp;
use sift_model::Model;
use sift_sparsity::Site;
use sift_store::tiered::{TierError, TieredStore};

pub struct TieredSource {
    store: TieredStore,
    cols: Vec<Vec<ColOp>>,
    /// `0..n` for the widest site: the units of a dense selection.
    all_units: Vec<u32>,
}

impl TieredSource {
    pub fn new(model: &Model, store: TieredStore) -> Result<TieredSource, TierError> {
        let cols = column_ops(model)
            .ok_or_else(|| TierError::Unsupported("a memory budget needs a sift pack's column layout".into()))?;
        let c = &model.config;
        let widest = c.n_embd.max(c.n_embd_q()).max(c.n_ff) as u32;
        Ok(TieredSource { store, cols, all_units: (0..widest).collect() })
    }
}

impl WeightSource for TieredSource {
    fn name(&self) -> &'static str {
        "tiered store"
    }

    fn begin_layer(&mut self, model: &Model, l: usize, n: usize, x: &[f32]) -> Result<(), TierError> {
        if n == 1 {
            self.store.begin_layer(l, x);
            Ok(())
        } else {
            self.store.prefill_layer(model, l)
        }
    }

    fn site<'a>(
        &'a mut self,
        model: &'a Model,
        l: usize,
        site: Site,
        n: usize,
        active: Option<&'a [u32]>,
    ) -> Result<SiteWeights<'a>, TierError> {
        if n > 1 {
            let (file, layer) = self.store.prefill_view(l).ok_or_else(|| {
                TierError::Unsupported(format!("layer {l}'s weights were not read for this prompt batch"))
            })?;
            return Ok(SiteWeights::Rows { file, layer, gather: false });
        }
        let c = &model.config;
        let width = match site {
            Site::AttnIn | Site::FfnIn => c.n_embd,
            Site::AttnOut => c.n_embd_q(),
            Site::FfnMid => c.n_ff,
        };
        let units = active.unwrap_or(&self.all_units[..width]);
        let ops = site_ops(site);
        let fetched = self.store.fetch(l, ops, units)?;
        let parts = site_col_ops(&self.cols[l], site)
            .iter()
            .enumerate()
            .map(|(k, op)| {
                let (data, idx, scales) = fetched.op(k);
                ColumnPart { op, data, idx, scales }
            })
            .collect();
        Ok(SiteWeights::Columns { units, parts })
    }

    fn embed(&mut self, model: &Model, id: u32, out: &mut [f32]) -> Result<(), TierError> {
        if !self.store.embedding_row(id as usize, out)? {
            let row = model.row(&model.tok_embd, id as usize);
            model.tok_embd.ty.dequantize_row(row, out);
        }
        Ok(())
    }

    fn cached_mask(&self, l: usize, site: Site, out: &mut Vec<bool>) -> bool {
        // The site's first op stands for it (gate and up, or q, k and v, see the same columns
        // and policy decisions).
        self.store.cached_mask(l, site_ops(site)[0], out);
        true
    }

    fn reset_context(&mut self) {
        self.store.reset_context();
    }

    fn store(&self) -> Option<&TieredStore> {
        Some(&self.store)
    }

    fn store_mut(&mut self) -> Option<&mut TieredStore> {
        Some(&mut self.store)
    }
}
