//! Weights under a memory budget: the tiered store (`sift_store::tiered`) behind the
//! weight-source interface. A decoded token's columns come through the store's cache (all of a
//! site's columns when its selection is not a subset), in as many parts as its transient area
//! needs; a prompt batch streams each op's GGUF rows through the store's prefill buffer, a chunk
//! of rows at a time, and the dense kernels run on each chunk.

use super::{column_ops, site_col_ops, ColumnPart, SiteWeights, WeightSource};
use crate::sparse::{ColOp, COLUMN_PIECE};
use sift_model::Model;
use sift_sparsity::Site;
use sift_store::tiered::{MemoryTier, TierError, TieredStore};

pub struct TieredSource {
    store: TieredStore,
    cols: Vec<Vec<ColOp>>,
    /// `0..n` for the widest site: the units of a dense selection.
    all_units: Vec<u32>,
    /// How many of the current site's active units earlier parts covered.
    units_done: usize,
}

impl TieredSource {
    pub fn new(model: &Model, store: TieredStore) -> Result<TieredSource, TierError> {
        let cols = column_ops(model)
            .ok_or_else(|| TierError::Unsupported("a memory budget needs a sift pack's column layout".into()))?;
        let widest = Site::ALL.iter().map(|s| s.width(&model.config)).max().unwrap_or(0) as u32;
        Ok(TieredSource { store, cols, all_units: (0..widest).collect(), units_done: 0 })
    }
}

impl WeightSource for TieredSource {
    fn name(&self) -> &'static str {
        "tiered store"
    }

    fn lone_token_differs(&self, _sparse: bool) -> bool {
        true
    }

    fn begin_layer(&mut self, _model: &Model, l: usize, n: usize, x: &[f32]) -> Result<(), TierError> {
        if n == 1 {
            self.store.begin_layer(l, x);
        }
        Ok(())
    }

    fn site<'a>(
        &'a mut self,
        model: &'a Model,
        l: usize,
        site: Site,
        n: usize,
        active: Option<&'a [u32]>,
        part: usize,
    ) -> Result<Option<SiteWeights<'a>>, TierError> {
        let ops = site.ops();
        if n > 1 {
            // Part `part` is a chunk of rows of one op, the ops in kernel order.
            let mut p = part;
            for (k, &op) in ops.iter().enumerate() {
                let w = model.layers[l].op(op);
                let per = self.store.prefill_rows_per_chunk(w);
                let chunks = w.rows.div_ceil(per);
                if p < chunks {
                    let row0 = p * per;
                    let (file, w) = self.store.prefill_rows(w, row0..row0 + per)?;
                    return Ok(Some(SiteWeights::RowChunk { file, op: k, w, row0 }));
                }
                p -= chunks;
            }
            return Ok(None);
        }
        let width = site.width(&model.config);
        let units = active.unwrap_or(&self.all_units[..width]);
        if part == 0 {
            self.units_done = 0;
        }
        let rest = &units[self.units_done.min(units.len())..];
        if rest.is_empty() {
            return Ok(None);
        }
        let fetched = self.store.fetch(l, ops, rest, COLUMN_PIECE)?;
        let taken = &rest[..fetched.taken];
        self.units_done += fetched.taken;
        let parts = site_col_ops(&self.cols[l], site)
            .iter()
            .enumerate()
            .map(|(k, op)| {
                let (data, idx, scales) = fetched.op(k);
                ColumnPart { op, data, idx, scales }
            })
            .collect();
        Ok(Some(SiteWeights::Columns { units: taken, parts }))
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
        self.store.cached_mask(l, site.ops()[0], out);
        true
    }

    fn reset_context(&mut self) {
        self.store.reset_context();
    }

    fn memory(&self) -> Option<&dyn MemoryTier> {
        Some(&self.store)
    }

    fn memory_mut(&mut self) -> Option<&mut dyn MemoryTier> {
        Some(&mut self.store)
    }

    fn streams_rows(&self) -> bool {
        true
    }
}
