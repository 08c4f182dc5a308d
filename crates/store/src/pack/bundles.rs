//! The pack's neuron bundle sections: per layer with a gated FFN, every neuron's gate row, up row
//! and down column in one record ([`sift_quant::bundles`], [`BundleTensor`]), so that a token's
//! chosen neurons are read record by record. The down columns are the layer's down column
//! tensor's (same exact format, same scale plane: the bundles do not repeat it).

use super::PackError;
use sift_model::layout::{BundleTensor, LayerColumns, OpKind};
use sift_model::Model;
use sift_quant::bundles::BundleLayout;
use sift_quant::ColFormat;
use std::path::Path;

/// Layer `l`'s bundle records and their table entry (offset, length and CRC to be filled in by
/// the writer), given its down columns as written (`down_cols`, format `down`, in the model's
/// neuron order); `None` when the layer cannot be bundled (float or mixed-activation gate/up,
/// re-quantized down columns, a shape the formats do not fit).
pub(super) fn layer_records(
    model: &Model,
    l: usize,
    down: ColFormat,
    down_cols: &[u8],
) -> Option<(BundleTensor, Vec<u8>)> {
    let c = &model.config;
    let lw = &model.layers[l];
    let (gate, up) = (lw.op(OpKind::Gate), lw.op(OpKind::Up));
    let ColFormat::Exact(fmt) = down else { return None };
    let layout = BundleLayout::new(gate.ty, up.ty, fmt, c.n_embd, c.n_ff).ok()?;
    let bytes = model.file.bytes();
    let records = layout.records(&bytes[gate.range.clone()], &bytes[up.range.clone()], down_cols).ok()?;
    model.file.release(gate.range.clone());
    model.file.release(up.range.clone());
    let t = BundleTensor {
        layer: l,
        gate: gate.ty.name().into(),
        up: up.ty.name().into(),
        n_embd: c.n_embd,
        n_ff: c.n_ff,
        record_bytes: layout.record_bytes(),
        offset: 0,
        len: records.len() as u64,
        crc32: 0,
    };
    Some((t, records))
}

/// Checks the table's bundle entries against the model and the layers' column tensors, and
/// attaches them to `layers`.
pub(super) fn attach(
    path: &Path,
    model: &Model,
    bundles: &[BundleTensor],
    layers: &mut [LayerColumns],
) -> Result<(), PackError> {
    let toc_err = |msg: String| PackError::Toc { path: path.into(), msg };
    for b in bundles {
        let what = format!("layer {} neuron bundles", b.layer);
        let lc = layers.get_mut(b.layer).ok_or_else(|| toc_err(format!("{what}: no such layer")))?;
        if lc.bundles.is_some() {
            return Err(toc_err(format!("{what} are given twice")));
        }
        let lw = &model.layers[b.layer];
        let c = &model.config;
        let types_match = b.gate == lw.op(OpKind::Gate).ty.name() && b.up == lw.op(OpKind::Up).ty.name();
        lc.bundles = Some(b.clone());
        if !types_match || b.n_embd != c.n_embd || b.n_ff != c.n_ff || lc.bundle_layout().is_none() {
            return Err(toc_err(format!("{what}: shape does not match the model")));
        }
    }
    Ok(())
}
