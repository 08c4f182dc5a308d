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
/// Scores are ordered as [`f32::total_cmp`] orders them.
///
/// O(n): the k-th largest score is found on keys whose unsigned order is `total_cmp`'s
/// ([`order_key`]): histograms of the keys' top bits find the bucket that holds it, a selection
/// among that bucket's keys the key itself; one more pass collects.
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
    // `scratch`: the keys, then room for the select's candidates.
    scratch.clear();
    scratch.extend(scores.iter().map(|&v| order_key(v)));
    scratch.resize(2 * n, 0);
    let (keys, cand) = scratch.split_at_mut(n);
    let t = kth_largest_key(keys, cand, k);
    let (above, equal) = keys.iter().fold((0, 0), |(a, e), &key| (a + (key > t) as usize, e + (key == t) as usize));
    let equal_left = k - above;
    // Branch-free collection (whether an input is taken is a coin flip at ratio 0.5): every
    // index is written, the write position moves on only for the taken ones.
    out.resize(n, 0);
    let mut w = 0;
    if equal == equal_left {
        // Every key equal to the k-th is taken (no tie at the boundary: the usual case).
        for (j, &key) in keys.iter().enumerate() {
            out[w] = j as u32;
            w += (key >= t) as usize;
        }
    } else {
        let mut equal = 0;
        for (j, &key) in keys.iter().enumerate() {
            let eq = key == t;
            let take = (key > t) | (eq & (equal < equal_left));
            equal += eq as usize;
            out[w] = j as u32;
            w += take as usize;
        }
    }
    debug_assert_eq!(w, k);
    out.truncate(k);
}

/// A key whose unsigned order is [`f32::total_cmp`]'s order of `v` (negative values' bits
/// inverted, positive values' sign bit set).
#[inline]
fn order_key(v: f32) -> u32 {
    let b = v.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The `k`-th largest (1-based, `1 ≤ k ≤ keys.len()`) of `keys`; `cand` (as long as `keys`)
/// holds the candidates. Radix passes over 11 bits at a time (top bits first) narrow the keys to
/// the bucket that holds it, until at most [`SELECT_BELOW`] are left (a model's activations:
/// after one pass for a few hundred inputs, two for thousands); a selection
/// (`select_nth_unstable`) orders those. Each histogram is four interleaved ones, so keys that
/// fall in one bucket one after the other do not wait on each other's increments, and its scan
/// starts at the largest digit present.
fn kth_largest_key(keys: &[u32], cand: &mut [u32], k: usize) -> u32 {
    let mut len = keys.len();
    let mut rank = k;
    for (pass, shift) in [21u32, 10].into_iter().enumerate() {
        if pass > 0 && len <= SELECT_BELOW {
            break;
        }
        let src: &[u32] = if pass == 0 { keys } else { &cand[..len] };
        let digit = |c: u32| ((c >> shift) & 0x7ff) as usize;
        let mut hist = [[0u32; 4]; 2048];
        let mut top = 0usize;
        let mut quads = src.chunks_exact(4);
        for q in &mut quads {
            for (lane, &c) in q.iter().enumerate() {
                hist[digit(c)][lane] += 1;
            }
            top = top.max(digit(q[0]).max(digit(q[1])).max(digit(q[2]).max(digit(q[3]))));
        }
        for &c in quads.remainder() {
            hist[digit(c)][0] += 1;
            top = top.max(digit(c));
        }
        let count = |d: usize| hist[d].iter().sum::<u32>() as usize;
        // The digit holding the rank-th largest: count down from the largest digit present.
        let mut d = top;
        let mut above = 0usize;
        while above + count(d) < rank {
            above += count(d);
            d -= 1;
        }
        rank -= above;
        // The candidates left: the keys with this digit (in place after the first pass: the
        // write position never passes the read position).
        let mut w = 0;
        for i in 0..len {
            let c = if pass == 0 { keys[i] } else { cand[i] };
            cand[w] = c;
            w += (digit(c) == d) as usize;
        }
        len = w;
    }
    *cand[..len].select_nth_unstable_by(rank - 1, |a, b| b.cmp(a)).1
}

/// Candidates few enough to order by a selection rather than another radix pass.
const SELECT_BELOW: usize = 256;

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: a stable sort by score, descending, the first `k` indices ascending.
    fn by_sorting(scores: &[f32], k: usize) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
        idx.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]));
        let mut top = idx[..k.min(scores.len())].to_vec();
        top.sort_unstable();
        top
    }

    #[test]
    fn radix_select_gives_what_sorting_gives() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, 1e-40, -1e-40];
        let (mut scratch, mut out) = (Vec::new(), Vec::new());
        for n in [1usize, 2, 7, 100, 1536, 8960] {
            for kind in 0..4 {
                let scores: Vec<f32> = (0..n)
                    .map(|_| {
                        let r = next();
                        match kind {
                            // Magnitudes, as Top-K sees them.
                            0 => ((r >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0).abs(),
                            // Few distinct values: many ties at the boundary.
                            1 => (r % 5) as f32,
                            // Signed values with the special ones mixed in.
                            2 => {
                                if r % 7 == 0 {
                                    specials[(r >> 8) as usize % specials.len()]
                                } else {
                                    (r >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
                                }
                            }
                            // All equal.
                            _ => 0.5,
                        }
                    })
                    .collect();
                for k in [0, 1, n / 3, n / 2, n - 1, n, n + 1] {
                    top_k_indices(&scores, k, &mut scratch, &mut out);
                    assert_eq!(out, by_sorting(&scores, k), "n {n}, kind {kind}, k {k}");
                }
            }
        }
    }
}
