//! Weight-aware selection (WINA, "Weight Informed Neuron Activation", 2025): an input channel's
//! score is `|x_i| · ‖W_:,i‖`, its activation times the norm of the weight column it multiplies,
//! instead of `|x_i|` alone. A channel with a small activation but a large column can move the
//! output more than a larger activation on a small column; ranking by the product keeps the
//! columns whose contribution `x_i · W_:,i` is largest.
//!
//! At a site read by several ops (q, k and v; gate and up) the column is the stacked one: its
//! norm is `sqrt(Σ_ops ‖W_op[:, i]‖²)`, the norm of channel `i`'s contribution to all the site's
//! outputs together. The norms come from the weights the fast path reads (a pack's columns, or
//! the GGUF's rows: `sift_engine::weight_norms`) and are kept in the calibration file when
//! `sift calibrate` made one.
//!
//! Two forms, as for `|x|`: `wina` keeps the top `1 − R` of the scores per token and site (as
//! [`crate::TopKSelector`]); `wina-threshold` keeps the scores at or above a per-layer, per-site
//! threshold calibrated on the scores' own histograms (as [`crate::ThresholdSelector`], with the
//! calibration's greedy allocation when it has one for the target).

use crate::calib::{Calibration, CalibrationError};
use crate::topk::{kept, top_k_indices};
use crate::{Phase, Ratios, Selection, Selector, Site, SiteDims};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Per layer and site, the norm of each input channel's (stacked) weight column.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ColumnNorms {
    /// `norms[layer][site][channel]`.
    pub norms: Vec<Vec<Vec<f32>>>,
}

impl ColumnNorms {
    /// Norms of a model of this shape, all zero (filled by the caller).
    pub fn zeros(dims: SiteDims) -> ColumnNorms {
        ColumnNorms { norms: (0..dims.n_layer).map(|_| dims.units.iter().map(|&n| vec![0.0; n]).collect()).collect() }
    }

    /// The norms of `site` in `layer`.
    pub fn site(&self, layer: usize, site: Site) -> &[f32] {
        &self.norms[layer][site.index()]
    }

    /// An error naming the first table whose shape is not `dims`' or whose value is not a finite
    /// norm (≥ 0): a file made for another model, or damaged.
    pub fn check(&self, dims: SiteDims) -> Result<(), String> {
        if self.norms.len() != dims.n_layer {
            return Err(format!("{} layers, expected {}", self.norms.len(), dims.n_layer));
        }
        for (l, row) in self.norms.iter().enumerate() {
            if row.len() != 4 {
                return Err(format!("layer {l}: {} sites, expected 4", row.len()));
            }
            for (s, (v, &n)) in row.iter().zip(&dims.units).enumerate() {
                if v.len() != n {
                    return Err(format!("[{l}][{s}]: {} channels, expected {n}", v.len()));
                }
                if let Some(c) = v.iter().position(|x| !(x.is_finite() && *x >= 0.0)) {
                    return Err(format!("[{l}][{s}][{c}] = {} is not a norm (finite, ≥ 0)", v[c]));
                }
            }
        }
        Ok(())
    }
}

/// The scores `|x_i| · n_i` of one token at one site, into `out`.
#[inline]
pub fn weighted_scores(x: &[f32], norms: &[f32], out: &mut Vec<f32>) {
    out.clear();
    out.extend(x.iter().zip(norms).map(|(v, n)| v.abs() * n));
}

/// How [`WeightAwareSelector`] cuts the scores.
enum Cut {
    /// Keep the top `1 − ratio` per token.
    TopK(Ratios),
    /// Keep scores ≥ `thresholds[layer][site]` (0: dense).
    Threshold(Vec<[f32; 4]>),
}

/// WINA: Top-K or calibrated thresholds over `|x_i| · ‖W_:,i‖` (module docs).
pub struct WeightAwareSelector {
    norms: Arc<ColumnNorms>,
    cut: Cut,
    describe: String,
    scores: Vec<f32>,
    scratch: Vec<u32>,
}

impl WeightAwareSelector {
    /// The Top-K form (`wina`), skipping `ratios` of each site's channels per token.
    pub fn top_k(norms: Arc<ColumnNorms>, ratios: Ratios) -> Self {
        let r = ratios.get(0, Site::FfnMid).max(ratios.get(0, Site::AttnIn));
        WeightAwareSelector {
            norms,
            cut: Cut::TopK(ratios),
            describe: format!("wina r={r:.2}"),
            scores: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// The threshold form (`wina-threshold`): per-site thresholds on the calibration's histograms
    /// of the weighted scores, for `ratios` (or the calibration's greedy allocation for the same
    /// overall ratio).
    pub fn threshold(norms: Arc<ColumnNorms>, calib: &Calibration, ratios: &Ratios) -> Result<Self, CalibrationError> {
        let (table, how) = calib.allocation_for(ratios);
        let mut thresholds = vec![[0f32; 4]; ratios.n_layer()];
        for (l, row) in thresholds.iter_mut().enumerate() {
            for s in Site::ALL {
                let r = table.get(l, s);
                row[s.index()] = if r > 0.0 { calib.weighted_histogram(l, s)?.threshold_for(r) } else { 0.0 };
            }
        }
        Ok(WeightAwareSelector {
            norms,
            cut: Cut::Threshold(thresholds),
            describe: format!("wina-threshold ({how})"),
            scores: Vec::new(),
            scratch: Vec::new(),
        })
    }
}

impl Selector for WeightAwareSelector {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn select(&mut self, layer: usize, site: Site, _: Phase, x: &[f32], active: &mut Vec<u32>) -> Selection {
        let norms = self.norms.site(layer, site);
        match &self.cut {
            Cut::TopK(ratios) => {
                let r = ratios.get(layer, site);
                if r <= 0.0 {
                    return Selection::All;
                }
                weighted_scores(x, norms, &mut self.scores);
                top_k_indices(&self.scores, kept(x.len(), r), &mut self.scratch, active);
            }
            Cut::Threshold(t) => {
                let t = t[layer][site.index()];
                if t <= 0.0 {
                    return Selection::All;
                }
                active.clear();
                active.extend(
                    x.iter().zip(norms).enumerate().filter(|(_, (v, n))| v.abs() * *n >= t).map(|(j, _)| j as u32),
                );
            }
        }
        Selection::Subset
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Method;

    fn dims() -> SiteDims {
        SiteDims { n_layer: 2, units: [4, 4, 4, 6] }
    }

    #[test]
    fn a_small_input_on_a_large_column_outranks_a_larger_one_on_a_small_column() {
        let mut norms = ColumnNorms::zeros(dims());
        for l in 0..2 {
            norms.norms[l][Site::FfnMid.index()] = vec![1.0, 10.0, 1.0, 1.0, 0.1, 1.0];
        }
        let ratios = Ratios::uniform(Method::TopK, 2, 0.5).unwrap();
        let mut sel = WeightAwareSelector::top_k(Arc::new(norms), ratios.clone());
        // |x|: channel 4 is the largest, channel 1 among the smallest; the scores are
        // 0.5, 2.0, 0.7, 0.6, 0.3, 0.55: channels 1, 2, 3 kept.
        let x = [0.5, -0.2, 0.7, -0.6, 3.0, 0.55];
        let mut active = Vec::new();
        assert_eq!(sel.select(1, Site::FfnMid, Phase::Generate, &x, &mut active), Selection::Subset);
        assert_eq!(active, vec![1, 2, 3]);
        // Plain Top-K on |x| keeps 4, 2, 3 instead.
        let mut topk = crate::TopKSelector::new("topk", ratios);
        topk.select(1, Site::FfnMid, Phase::Generate, &x, &mut active);
        assert_eq!(active, vec![2, 3, 4]);
    }

    #[test]
    fn norms_of_the_wrong_shape_or_not_finite_are_named() {
        let mut n = ColumnNorms::zeros(dims());
        assert!(n.check(dims()).is_ok());
        n.norms[1][3][5] = f32::NAN;
        assert!(n.check(dims()).unwrap_err().contains("[1][3][5]"));
        n.norms[1][3][5] = -1.0;
        assert!(n.check(dims()).unwrap_err().contains("not a norm"));
        n.norms[1][3].pop();
        assert!(n.check(dims()).unwrap_err().contains("5 channels, expected 6"));
        n.norms.pop();
        assert!(n.check(dims()).unwrap_err().contains("1 layers, expected 2"));
    }
}
