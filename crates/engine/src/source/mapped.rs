//! Weights in memory: the mmapped GGUF's rows, or a mmapped pack's columns.

use super::{column_ops, site_col_ops, ColumnPart, SiteWeights, WeightSource};
use crate::sparse::ColOp;
use sift_model::layout::OpKind;
use sift_model::Model;
use sift_quant::bundles::{BundleLayout, Bundles};
use sift_sparsity::Site;
use sift_store::tiered::TierError;
use std::ops::Range;

/// Every product on the GGUF's row-major weights (masked inputs for sparse selections).
pub struct MappedRows {
    /// Compute only a single token's fixed FFN neurons' rows of gate and up.
    pub row_gather: bool,
}

impl WeightSource for MappedRows {
    fn name(&self) -> &'static str {
        "gguf rows"
    }

    fn gathers_rows(&self) -> bool {
        self.row_gather
    }

    fn site<'a>(
        &'a mut self,
        model: &'a Model,
        l: usize,
        _site: Site,
        _n: usize,
        _active: Option<&'a [u32]>,
        part: usize,
    ) -> Result<Option<SiteWeights<'a>>, TierError> {
        Ok((part == 0).then(|| SiteWeights::Rows {
            file: model.file.bytes(),
            layer: &model.layers[l],
            gather: self.row_gather,
        }))
    }
}

/// A sift pack in memory: a single token's sparse selection runs on the active columns of the
/// pack's column tensors; batches and dense selections on the GGUF rows, or with `all_columns`
/// on the whole column tensors (which measures what the re-quantized columns cost).
pub struct MappedColumns {
    cols: Vec<Vec<ColOp>>,
    /// Per layer, its neuron bundles.
    bundles: Vec<Option<LayerBundles>>,
    all_columns: bool,
    /// The active units' column positions, for a site in a unit order of its own.
    positions: Vec<u32>,
}

impl MappedColumns {
    /// `None` when `model` has no column layout (not a pack).
    pub fn new(model: &Model, all_columns: bool) -> Option<MappedColumns> {
        let bundles = model.columns.as_ref()?.layers.iter().map(|l| {
            let b = l.bundles.as_ref()?;
            Some(LayerBundles {
                layout: l.bundle_layout()?,
                records: b.range(),
                scales: l.op(OpKind::Down).scales_range(),
            })
        });
        Some(MappedColumns { cols: column_ops(model)?, bundles: bundles.collect(), all_columns, positions: Vec::new() })
    }
}

/// A layer's neuron bundles in a pack: their layout, the records and down's scale plane (byte
/// ranges in the pack file).
struct LayerBundles {
    layout: BundleLayout,
    records: Range<usize>,
    scales: Range<usize>,
}

impl WeightSource for MappedColumns {
    fn name(&self) -> &'static str {
        "pack columns"
    }

    fn lone_token_differs(&self, sparse: bool) -> bool {
        sparse || self.all_columns
    }

    fn gathers_rows(&self) -> bool {
        !self.all_columns
    }

    fn batches_as_lone_tokens(&self) -> bool {
        self.all_columns
    }

    fn bundles<'a>(&'a self, model: &'a Model, l: usize) -> Option<Bundles<'a>> {
        let b = self.bundles.get(l)?.as_ref()?;
        let file = model.pack_bytes();
        Bundles::new(b.layout, &file[b.records.clone()], &file[b.scales.clone()]).ok()
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
        if part > 0 {
            return Ok(None);
        }
        let ops = site_col_ops(&self.cols[l], site);
        let file = model.pack_bytes();
        Ok(Some(match active {
            Some(units) if n == 1 => {
                // The ops of a site share its unit order.
                let idx: &[u32] = match &ops[0].positions {
                    Some(pos) => {
                        self.positions.clear();
                        self.positions.extend(units.iter().map(|&u| pos[u as usize]));
                        &self.positions
                    }
                    None => units,
                };
                SiteWeights::Columns {
                    units,
                    parts: ops
                        .iter()
                        .map(|op| ColumnPart {
                            op,
                            data: &file[op.range.clone()],
                            idx,
                            scales: &file[op.scales_range.clone()],
                        })
                        .collect(),
                }
            }
            _ if self.all_columns => SiteWeights::ColumnTensors { file, ops },
            _ => SiteWeights::Rows { file: model.file.bytes(), layer: &model.layers[l], gather: true },
        }))
    }
}
