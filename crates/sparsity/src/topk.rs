//! Per-token magnitude Top-K (ActiveFlow, TEAL; `glu` is Top-K at the GLU site only).

use crate::{Phase, Ratios, Selection, Selector, Site};

/// Keeps, for each token and site, the `n - round(ratio * n)` inputs of largest magnitude.
pub struct TopKSelector {
    name: &'static str,
    ratios: Ratios,
    mags: Vec<f32>,
    scratch: Vec<u32>,
}

impl TopKSelector {
    pub fn new(name: &'static str, ratios: Ratios) -> Self {
        TopKSelector { name, ratios, mags: Vec::new(), scratch: Vec::new() }
    }
}

/// Number of units kept out of `n` when `ratio` of them are skipped.
#[inline]
pub fn kept(n: usize, ratio: f32) -> usize {
    n - ((ratio as f64 * n as f64).round() as usize).min(n)
}

/// Writes the indices of the `k` largest `scores` to `out` in ascending index order.
/// Ties at the boundary are broken by index (lower first), so the result is deterministic.
pub fn top_k_indices(scores: &[f32], k: usize, scratch: &mut Vec<u32>, out: &mut Vec<u32>) {
    out.clear();
    let n = scores.len();
    if k >= n {
        out.extend(0..n as u32);
        return;
    }
    if k == 0 {
        return;
    }
    scratch.clear();
    scratch.extend(0..n as u32);
    let cmp = |a: &u32, b: &u32| {
        let (sa, sb) = (scores[*a as usize], scores[*b as usize]);
        sb.total_cmp(&sa).then(a.cmp(b))
    };
    scratch.select_nth_unstable_by(k - 1, cmp);
    out.extend_from_slice(&scratch[..k]);
    out.sort_unstable();
}

impl Selector for TopKSelector {
    fn describe(&self) -> String {
        format!("{} r={:.2}", self.name, self.ratios.get(0, Site::FfnMid).max(self.ratios.get(0, Site::AttnIn)))
    }

    fn select(&mut self, layer: usize, site: Site, _: Phase, x: &[f32], active: &mut Vec<u32>) -> Selection {
        let r = self.ratios.get(layer, site);
        if r <= 0.0 {
            return Selection::All;
        }
        let k = kept(x.len(), r);
        self.mags.clear();
        self.mags.extend(x.iter().map(|v| v.abs()));
        top_k_indices(&self.mags, k, &mut self.scratch, active);
        Selection::Subset
    }
}
