//! CATS' gate-first neuron selection (Lee et al., "CATS: Contextually-Aware Thresholding for
//! Sparsity in Large Language Models"): a SwiGLU FFN's neuron `i` contributes
//! `act(gate_i) · up_i · down[:, i]`, and `|act(gate_i)|` alone already tells which neurons matter.
//! The engine computes the gate product for every neuron, asks this selector which neurons to
//! keep, and computes up and down for those neurons only: whole neurons are skipped (gate row,
//! up row and down column), not input channels. No training.
//!
//! Two rules at the GLU site ([`Site::FfnMid`]), `--ratio R` the share of neurons skipped; the
//! other sites stay dense:
//! - `cats`: per-token Top-K of `|act(gate)|` (every token keeps the same count);
//! - `cats-threshold`: the paper's own rule, a per-layer magnitude threshold — the `R` quantile
//!   of the layer's `|act(gate)|` over calibration text (`sift calibrate`'s gate histograms) —
//!   so a token keeps as many neurons as clear it and the share skipped is `R` on average.

use crate::calib::{Calibration, CalibrationError};
use crate::{Phase, Ratios, Selection, Selector, Site, TopKSelector};

/// Gate-first FFN neuron selection (`--sparsity cats`, `--sparsity cats-threshold`).
pub struct CatsSelector {
    rule: Rule,
}

enum Rule {
    TopK(TopKSelector),
    /// Per layer the threshold on `|act(gate)|`; 0 keeps the layer dense.
    Threshold {
        thresholds: Vec<f32>,
        describe: String,
    },
}

impl CatsSelector {
    /// Skips `ratios` of each layer's FFN neurons, per token (the ratios at [`Site::FfnMid`]).
    pub fn new(ratios: Ratios) -> Self {
        CatsSelector { rule: Rule::TopK(TopKSelector::new("cats", ratios)) }
    }

    /// Skips the neurons whose `|act(gate)|` lies below their layer's threshold: the quantile of
    /// the layer's ratio at [`Site::FfnMid`] in `calib`'s gate histograms.
    pub fn threshold(calib: &Calibration, ratios: &Ratios) -> Result<Self, CalibrationError> {
        let thresholds = (0..ratios.n_layer())
            .map(|l| {
                let r = ratios.get(l, Site::FfnMid);
                Ok(if r > 0.0 { calib.gate_histogram(l)?.threshold_for(r) } else { 0.0 })
            })
            .collect::<Result<Vec<f32>, CalibrationError>>()?;
        let r0 = ratios.get(0, Site::FfnMid);
        let uniform = (0..ratios.n_layer()).all(|l| ratios.get(l, Site::FfnMid) == r0);
        let describe = match uniform {
            true => format!("cats-threshold {r0:.2} (per-layer |act(gate)| thresholds)"),
            false => "cats-threshold (per-layer ratios, |act(gate)| thresholds)".to_string(),
        };
        Ok(CatsSelector { rule: Rule::Threshold { thresholds, describe } })
    }
}

impl Selector for CatsSelector {
    fn describe(&self) -> String {
        match &self.rule {
            Rule::TopK(t) => t.describe(),
            Rule::Threshold { describe, .. } => describe.clone(),
        }
    }

    fn gate_first(&self) -> bool {
        true
    }

    /// At [`Site::FfnMid`], `x` is the token's `act(gate)` (before the up product): the
    /// neurons of largest `|act(gate)|`, or those at or above the layer's threshold. Every other
    /// site is dense.
    fn select(&mut self, layer: usize, site: Site, phase: Phase, x: &[f32], active: &mut Vec<u32>) -> Selection {
        if site != Site::FfnMid {
            return Selection::All;
        }
        match &mut self.rule {
            Rule::TopK(t) => t.select(layer, site, phase, x, active),
            Rule::Threshold { thresholds, .. } => {
                let t = thresholds.get(layer).copied().unwrap_or(0.0);
                if t <= 0.0 {
                    return Selection::All;
                }
                active.clear();
                active.extend(x.iter().enumerate().filter(|(_, v)| v.abs() >= t).map(|(j, _)| j as u32));
                Selection::Subset
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SiteDims;

    /// The neurons kept are those of largest |act(gate)|, whatever their sign; other sites
    /// are dense.
    #[test]
    fn keeps_the_largest_gate_activations() {
        let ratios = Ratios::uniform(crate::Method::Cats, 1, 0.5).unwrap();
        let mut cats = CatsSelector::new(ratios);
        assert!(cats.gate_first());
        let act = [0.1, -3.0, 0.2, 2.5, -0.05, 1.0];
        let mut active = Vec::new();
        assert_eq!(cats.select(0, Site::FfnMid, Phase::Generate, &act, &mut active), Selection::Subset);
        assert_eq!(active, vec![1, 3, 5]);
        assert_eq!(cats.select(0, Site::FfnIn, Phase::Generate, &[1.0; 4], &mut active), Selection::All);
    }

    /// The threshold rule keeps what clears the layer's quantile of the calibrated |act(gate)|:
    /// on the calibration's own values, the share kept is the share asked for (within a
    /// histogram bin), and a token with larger gates keeps more neurons.
    #[test]
    fn thresholds_keep_the_calibrated_share() {
        let dims = SiteDims { n_layer: 2, units: [8, 8, 8, 1000] };
        let mut calib = Calibration::new("test".into(), dims);
        calib.start_gate_histograms();
        // Layer 0: gates spread over 0.001 .. 10 (log-uniform); layer 1: ten times larger.
        let values: Vec<f32> = (0..1000).map(|i| 0.001 * 10f32.powf(4.0 * i as f32 / 1000.0)).collect();
        calib.add_gate(0, &values);
        calib.add_gate(1, &values.iter().map(|v| -v * 10.0).collect::<Vec<_>>());
        let ratios = Ratios::uniform(crate::Method::CatsThreshold, 2, 0.5).unwrap();
        let mut cats = CatsSelector::threshold(&calib, &ratios).unwrap();
        assert!(cats.gate_first());
        let mut active = Vec::new();
        assert_eq!(cats.select(0, Site::FfnMid, Phase::Generate, &values, &mut active), Selection::Subset);
        assert!((active.len() as i64 - 500).abs() <= 10, "kept {} of 1000", active.len());
        assert!(active.iter().all(|&j| j >= 490), "the smallest gates are skipped");
        let scaled: Vec<f32> = values.iter().map(|v| v * 10.0).collect();
        assert_eq!(cats.select(1, Site::FfnMid, Phase::Generate, &scaled, &mut active), Selection::Subset);
        assert!((active.len() as i64 - 500).abs() <= 10, "layer 1's own threshold: kept {}", active.len());
        cats.select(0, Site::FfnMid, Phase::Generate, &scaled, &mut active);
        assert!(active.len() > 700, "larger gates keep more neurons: {}", active.len());
        assert_eq!(cats.select(0, Site::AttnIn, Phase::Generate, &[1.0; 8], &mut active), Selection::All);
        // A calibration from before the gate histograms were recorded is refused by name.
        let old = Calibration::new("test".into(), dims);
        let err = CatsSelector::threshold(&old, &ratios).err().unwrap().to_string();
        assert!(err.contains("no gate histograms") && err.contains("sift calibrate"), "{err}");
    }
}
