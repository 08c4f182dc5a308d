//! Where a linear op's weights come from: the weight-source interface the forward pass computes
//! against.
//!
//! For each layer and selection site the engine asks its [`WeightSource`] for the weights of the
//! site's ops, given the batch size and the active input units, and gets back what to run:
//! row-major GGUF rows for the dense kernels ([`SiteWeights::Rows`]), the active columns of a
//! pack for the sparse column kernels ([`SiteWeights::Columns`]), or whole column tensors for a
//! batch ([`SiteWeights::ColumnTensors`], `--all-columns`). One implementation per place the
//! weights live:
//!
//! | source | weights | used when |
//! |---|---|---|
//! | [`MappedRows`] | the mmapped GGUF's rows | a `.gguf`, or a pack with `column_kernels` off |
//! | [`MappedColumns`] | the mmapped pack's columns (rows for batches) | a `.sift` pack in memory |
//! | [`TieredSource`] | the tiered store: columns through its cache, rows streamed per layer | `--memory` |
//!
//! A source's errors (a read that failed, a cut file) come back through `?`; everything a
//! source needs between calls (prefill buffers, preloads, the site-to-ops map) lives behind it.

mod mapped;
mod tiered;

pub use mapped::{MappedColumns, MappedRows};
pub use tiered::TieredSource;

use crate::sparse::ColOp;
use sift_model::{LayerWeights, Model, QTensor};
use sift_quant::bundles::Bundles;
use sift_sparsity::Site;
use sift_store::tiered::{MemoryTier, TierError};

/// One op's active columns: `data` holds them `op.col_bytes` apart, `idx[i]` is the column of
/// `data` that holds input `units[i]`.
pub struct ColumnPart<'a> {
    pub op: &'a ColOp,
    pub data: &'a [u8],
    pub idx: &'a [u32],
    /// The op's scale plane (exact columns; empty otherwise).
    pub scales: &'a [u8],
}

/// The weights of one site's ops, as the source holds them.
pub enum SiteWeights<'a> {
    /// Row-major GGUF weights: the layer's tensors index `file`. With `gather`, a single token
    /// whose FFN neurons are fixed in advance computes only those rows of gate and up.
    Rows { file: &'a [u8], layer: &'a LayerWeights, gather: bool },
    /// Rows `row0..row0 + w.rows` of the site's `op`-th op (a prompt batch whose weights stream
    /// through a buffer): `w`, those rows, indexes `file`.
    RowChunk { file: &'a [u8], op: usize, w: QTensor, row0: usize },
    /// The columns of the inputs `units` (ascending), per op of the site (one token). A source
    /// may give a site's active inputs in parts: each part's `units` continue the last.
    Columns { units: &'a [u32], parts: Vec<ColumnPart<'a>> },
    /// Whole column tensors, per op of the site, in `file` (a batch on columns).
    ColumnTensors { file: &'a [u8], ops: &'a [ColOp] },
}

/// Where the engine's weights come from (see the module docs).
pub trait WeightSource: Send {
    /// A short name for reports ("gguf rows", "pack columns", "tiered store").
    fn name(&self) -> &'static str;

    /// Layer `l` starts for a batch of `n` tokens; `x` is the residual entering it (the first
    /// token's row). A source that streams weights gets them ready here.
    fn begin_layer(&mut self, _model: &Model, _l: usize, _n: usize, _x: &[f32]) -> Result<(), TierError> {
        Ok(())
    }

    /// Part `part` of the weights of `site` in layer `l` for a batch of `n` tokens whose active
    /// inputs are `active` (ascending; `None`: all of them); `None` past the last part. Sources
    /// that hold the weights in memory give one part; a budgeted store streams a site through
    /// its buffers in several (row chunks of a batch, parts of a token's active columns), which
    /// the engine asks for in order, computing each before asking for the next.
    fn site<'a>(
        &'a mut self,
        model: &'a Model,
        l: usize,
        site: Site,
        n: usize,
        active: Option<&'a [u32]>,
        part: usize,
    ) -> Result<Option<SiteWeights<'a>>, TierError>;

    /// Token `id`'s embedding row, dequantized into `out`.
    fn embed(&mut self, model: &Model, id: u32, out: &mut [f32]) -> Result<(), TierError> {
        let row = model.row(&model.tok_embd, id as usize);
        model.tok_embd.ty.dequantize_row(row, out);
        Ok(())
    }

    /// Which units of `site` in layer `l` have their weights in fast memory (into `out`), for
    /// cache-aware selection; false when the source keeps no cache (every unit is resident).
    fn cached_mask(&self, _l: usize, _site: Site, _out: &mut Vec<bool>) -> bool {
        false
    }

    /// A new conversation starts (context-level counters restart).
    fn reset_context(&mut self) {}

    /// Whether a lone token (`n == 1`) gets other products here than the same token in a batch
    /// (column kernels on a sparse selection, the store's reads): then sequences cannot share a
    /// batch without changing their results ([`crate::Engine::eval_slots`]).
    fn lone_token_differs(&self, _sparse: bool) -> bool {
        false
    }

    /// The budgeted memory behind this source, when there is one.
    fn memory(&self) -> Option<&dyn MemoryTier> {
        None
    }

    fn memory_mut(&mut self) -> Option<&mut dyn MemoryTier> {
        None
    }

    /// Whether a lone token's FFN input site comes as the GGUF's rows that may be computed row
    /// by row ([`SiteWeights::Rows`] with `gather`): then a gate-first selection computes only
    /// its neurons' up rows.
    fn gathers_rows(&self) -> bool {
        false
    }

    /// Layer `l`'s FFN neuron bundles in memory (a pack's bundle section), from which a lone
    /// token's chosen neurons are computed (the gate-first step); `None` where the weights have
    /// none.
    fn bundles<'a>(&'a self, _model: &'a Model, _l: usize) -> Option<Bundles<'a>> {
        None
    }

    /// Whether a batch's sparse steps compute as its tokens would alone (`--all-columns`: the
    /// quality of a sparse method measured through the path that gives its speed, e.g. the
    /// neuron bundles of a gate-first FFN, token by token).
    fn batches_as_lone_tokens(&self) -> bool {
        false
    }

    /// Whether a prompt's rows come in chunks ([`SiteWeights::RowChunk`], through a budgeted
    /// store's prefill buffer) rather than from the mapped file.
    fn streams_rows(&self) -> bool {
        false
    }
}

/// The kernel-ready column ops of every layer of a pack (q, k, v, o, gate, up, down).
pub(crate) fn column_ops(model: &Model) -> Option<Vec<Vec<ColOp>>> {
    model
        .columns
        .as_ref()
        .map(|p| p.layers.iter().map(|l| l.ops.iter().map(|t| ColOp::new(t, l.positions(t.op))).collect()).collect())
}

/// The column ops of `site` among a layer's seven.
pub(crate) fn site_col_ops(ops: &[ColOp], site: Site) -> &[ColOp] {
    &ops[site.op_range()]
}
