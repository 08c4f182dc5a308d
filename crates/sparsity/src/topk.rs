//! Per-token magnitude Top-K (ActiveFlow, TEAL; `glu` is Top-K at the GLU site only).

use crate::{Phase, Ratios, Selection, Selector, Site};

/// Keeps, for each token and site, the `n - round(ratio * n)` inputs of largest magnitude.
pub struct TopKSelector {
    name: &'static str,
    ratios: Ratios,
    mags: Vec<f32>,
    scratch: Vec<f32>,
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
/// O(n): the k-th largest value is found by selection on a copy, then one pass collects.
pub fn top_k_indices(scores: &[f32], k: usize, scratch: &mut Vec<f32>, out: &mut Vec<u32>) {
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
    scratch.extend_from_slice(scores);
    let (_, &mut t, _) = scratch.select_nth_unstable_by(n - k, |a, b| a.total_cmp(b));
    let above = scores.iter().filter(|v| v.total_cmp(&t).is_gt()).count();
    let mut equal_left = k - above;
    out.reserve(k);
    for (j, v) in scores.iter().enumerate() {
        match v.total_cmp(&t) {
            std::cmp::Ordering::Greater => out.push(j as u32),
            std::cmp::Ordering::Equal if equal_left > 0 => {
                out.push(j as u32);
                equal_left -= 1;
            }
            _ => {}
        }
    }
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
