//! CATS' gate-first neuron selection (Lee et al., "CATS: Contextually-Aware Thresholding for
//! Sparsity in Large Language Models"): a SwiGLU FFN's neuron `i` contributes
//! `act(gate_i) · up_i · down[:, i]`, and `|act(gate_i)|` alone already tells which neurons matter.
//! The engine computes the gate product for every neuron, asks this selector which neurons to
//! keep, and computes up and down for those neurons only: whole neurons are skipped (gate row,
//! up row and down column), not input channels. No training.
//!
//! The selection is a per-token Top-K of `|act(gate)|` at the GLU site ([`Site::FfnMid`]), with
//! `--ratio R` the share of neurons skipped; the other sites stay dense.

use crate::{Phase, Ratios, Selection, Selector, Site, TopKSelector};

/// Gate-first FFN neuron selection (`--sparsity cats`).
pub struct CatsSelector {
    top_k: TopKSelector,
}

impl CatsSelector {
    /// Skips `ratios` of each layer's FFN neurons (the ratios at [`Site::FfnMid`]).
    pub fn new(ratios: Ratios) -> Self {
        CatsSelector { top_k: TopKSelector::new("cats", ratios) }
    }
}

impl Selector for CatsSelector {
    fn describe(&self) -> String {
        self.top_k.describe()
    }

    fn gate_first(&self) -> bool {
        true
    }

    /// At [`Site::FfnMid`], `x` is the token's `act(gate)` (before the up product): the
    /// neurons of largest `|act(gate)|`. Every other site is dense.
    fn select(&mut self, layer: usize, site: Site, phase: Phase, x: &[f32], active: &mut Vec<u32>) -> Selection {
        match site {
            Site::FfnMid => self.top_k.select(layer, site, phase, x, active),
            _ => Selection::All,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
