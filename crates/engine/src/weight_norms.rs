//! The weight columns' norms the weight-aware selectors rank by (WINA: `|x_i| · ‖W_:,i‖`,
//! [`sift_sparsity::weight_aware`]).
//!
//! Read from the model's GGUF (a pack's exact columns hold the same values; a model opened from a
//! pack keeps its source GGUF beside it): the file is read again with `pread`, one tensor at a
//! time (the largest op's bytes held at once, whatever the model's own weights are: mapped,
//! repacked in memory, or streamed under a budget), its rows dequantized, on up to two threads.
//! A site read by several ops gets the stacked column's norm, `sqrt(Σ_ops ‖W_op[:, i]‖²)`.

use sift_model::layout::SITE_OPS;
use sift_model::{Model, QTensor};
use sift_sparsity::{ColumnNorms, Site, SiteDims};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Errors reading the weights for their norms.
#[derive(Debug, thiserror::Error)]
pub enum NormsError {
    #[error("cannot read {path} for the weight columns' norms: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {what} lies outside the file: the file is damaged or was changed while open")]
    Range { path: String, what: String },
}

/// The norms of every site's input channels in every layer of `model` (module docs).
pub fn column_norms(model: &Model) -> Result<ColumnNorms, NormsError> {
    let c = &model.config;
    let dims = SiteDims::of(c);
    let path = model.file.path();
    let file = File::open(path).map_err(|source| NormsError::Io { path: path.display().to_string(), source })?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 2);
    let mut norms = ColumnNorms::zeros(dims);
    let layers: Vec<(usize, &mut Vec<Vec<f32>>)> = norms.norms.iter_mut().enumerate().collect();
    let mut shares: Vec<Vec<LayerSlot>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, l) in layers.into_iter().enumerate() {
        shares[i % threads].push(l);
    }
    let reader = Reader { file: &file, path, model };
    std::thread::scope(|s| {
        let handles: Vec<_> = shares
            .into_iter()
            .map(|share| {
                let reader = &reader;
                s.spawn(move || -> Result<(), NormsError> {
                    for (l, sites) in share {
                        reader.layer(l, sites)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("a norms thread panicked"))
    })?;
    Ok(norms)
}

/// A layer's index and its per-site norm tables, for one thread.
type LayerSlot<'a> = (usize, &'a mut Vec<Vec<f32>>);

struct Reader<'a> {
    file: &'a File,
    path: &'a Path,
    model: &'a Model,
}

impl Reader<'_> {
    /// Fills `sites[site][channel]` with layer `l`'s stacked column norms.
    fn layer(&self, l: usize, sites: &mut [Vec<f32>]) -> Result<(), NormsError> {
        for (s, ops) in SITE_OPS.iter().enumerate() {
            let sq = &mut sites[s];
            for &op in *ops {
                self.add_rows(self.model.layers[l].op(op), sq)?;
            }
            debug_assert_eq!(Site::ALL[s].index(), s);
            sq.iter_mut().for_each(|v| *v = v.sqrt());
        }
        Ok(())
    }

    fn read(&self, offset: u64, len: u64, what: impl Fn() -> String) -> Result<Vec<u8>, NormsError> {
        let size = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        if offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(NormsError::Range { path: self.path.display().to_string(), what: what() });
        }
        let mut buf = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|source| NormsError::Io { path: self.path.display().to_string(), source })?;
        Ok(buf)
    }

    /// Adds the squares of `t`'s rows, column by column, to `sq` (a GGUF's row-major tensor).
    fn add_rows(&self, t: &QTensor, sq: &mut [f32]) -> Result<(), NormsError> {
        let bytes = self.read(t.range.start as u64, (t.range.end - t.range.start) as u64, || t.name.clone())?;
        let mut row = vec![0f32; t.cols];
        for r in bytes.chunks_exact(t.row_bytes).take(t.rows) {
            t.ty.dequantize_row(r, &mut row);
            for (s, v) in sq.iter_mut().zip(&row) {
                *s += v * v;
            }
        }
        Ok(())
    }
}
