//! Dynamic Input Pruning (DIP) and its cache-aware variant (DIP-CA).
//!
//! DIP (Eq. 7–8) keeps, per token, the Top-K of |x| among the MLP's input channels (columns of
//! gate and up) and the Top-K of |GLU~(x)| among the down projection's columns, where GLU~ is
//! computed from the pruned gate/up. The engine feeds the GLU site with that pruned activation, so
//! this selector only ranks. The split of the budget between gate/up and down is the per-site
//! ratio ([`crate::Ratios`]); `--ratio R` sets both to R, so R is also the MLP's overall ratio.
//!
//! DIP-CA (Eq. 10) ranks by `|x| (c + γ (1 − c)) / ‖x‖∞` instead, where `c` is 1 for units in the
//! cache: uncached units must be 1/γ times stronger to win a slot. Under a memory budget the
//! cache is the tiered store's live state ([`Selector::observe_cache`]); without one it is
//! [`LfuCacheState`]: a least-frequently-used set of a fixed number of units per layer and site,
//! updated with every selection, standing in for the cache a budget would have.

use crate::topk::{kept, top_k_indices};
use crate::{Phase, Ratios, Selection, Selector, Site, SiteDims};
use std::collections::BTreeSet;

/// A simple LFU cache of units per (layer, site): context-level use counts, a fixed capacity, and
/// on a miss the least-used cached unit (not needed by the current token) is evicted.
pub struct LfuCacheState {
    caches: Vec<Vec<Option<Lfu>>>,
}

struct Lfu {
    capacity: usize,
    counts: Vec<u32>,
    cached: Vec<bool>,
    /// Cached units ordered by (count, unit): the first is the eviction victim.
    order: BTreeSet<(u32, u32)>,
    hits: u64,
    accesses: u64,
}

impl Lfu {
    fn new(units: usize, capacity: usize) -> Lfu {
        Lfu {
            capacity: capacity.min(units),
            counts: vec![0; units],
            cached: vec![false; units],
            order: BTreeSet::new(),
            hits: 0,
            accesses: 0,
        }
    }

    /// One token's use of `active` (ascending): counts go up; missing units are admitted, evicting
    /// the least-used cached units (lowest index among equals) that this token does not use.
    /// The victims are found in one pass over the cache order, so a token costs
    /// O(cache + misses · log cache) however many units miss.
    fn access(&mut self, active: &[u32]) {
        let mut misses = Vec::new();
        for &u in active {
            let u = u as usize;
            self.accesses += 1;
            let c = self.counts[u];
            self.counts[u] = c + 1;
            if self.cached[u] {
                self.hits += 1;
                self.order.remove(&(c, u as u32));
                self.order.insert((c + 1, u as u32));
            } else {
                misses.push(u);
            }
        }
        if self.capacity == 0 || misses.is_empty() {
            return;
        }
        let free = self.capacity - self.order.len();
        let need = misses.len().saturating_sub(free);
        let victims: Vec<(u32, u32)> =
            self.order.iter().filter(|(_, v)| active.binary_search(v).is_err()).take(need).copied().collect();
        for v in &victims {
            self.order.remove(v);
            self.cached[v.1 as usize] = false;
        }
        let room = self.capacity - self.order.len();
        for &u in misses.iter().take(room) {
            self.cached[u] = true;
            self.order.insert((self.counts[u], u as u32));
        }
    }
}

impl LfuCacheState {
    /// A cache for `sites` of every layer holding `fraction(layer, site)` of the site's units.
    pub fn new(dims: SiteDims, sites: &[Site], fraction: impl Fn(usize, Site) -> f32) -> Self {
        let caches = (0..dims.n_layer)
            .map(|l| {
                Site::ALL
                    .iter()
                    .map(|&s| {
                        sites.contains(&s).then(|| {
                            let n = dims.units[s.index()];
                            let cap = (fraction(l, s).clamp(0.0, 1.0) as f64 * n as f64).round() as usize;
                            Lfu::new(n, cap)
                        })
                    })
                    .collect()
            })
            .collect();
        LfuCacheState { caches }
    }

    /// Whether `unit` of `site` in `layer` is cached now.
    pub fn is_cached(&self, layer: usize, site: Site, unit: usize) -> bool {
        self.caches[layer][site.index()].as_ref().is_some_and(|c| c.cached[unit])
    }

    /// Units cached at (layer, site).
    pub fn len(&self, layer: usize, site: Site) -> usize {
        self.caches[layer][site.index()].as_ref().map_or(0, |c| c.order.len())
    }

    pub fn is_empty(&self, layer: usize, site: Site) -> bool {
        self.len(layer, site) == 0
    }

    /// Capacity in units at (layer, site).
    pub fn capacity(&self, layer: usize, site: Site) -> usize {
        self.caches[layer][site.index()].as_ref().map_or(0, |c| c.capacity)
    }

    /// Records that a token used `active` (ascending) at (layer, site).
    pub fn access(&mut self, layer: usize, site: Site, active: &[u32]) {
        if let Some(c) = self.caches[layer][site.index()].as_mut() {
            c.access(active);
        }
    }

    /// Hit rate over all accesses so far.
    pub fn hit_rate(&self) -> f64 {
        let (h, a) =
            self.caches.iter().flatten().flatten().fold((0u64, 0u64), |(h, a), c| (h + c.hits, a + c.accesses));
        if a == 0 {
            0.0
        } else {
            h as f64 / a as f64
        }
    }

    fn clear(&mut self) {
        for c in self.caches.iter_mut().flatten().flatten() {
            c.counts.fill(0);
            c.cached.fill(false);
            c.order.clear();
            c.hits = 0;
            c.accesses = 0;
        }
    }
}

/// DIP, or DIP-CA when built with a cache state and γ.
pub struct DipSelector {
    ratios: Ratios,
    cache_aware: Option<(LfuCacheState, f32)>,
    scores: Vec<f32>,
    scratch: Vec<f32>,
    /// The tiered store's cache state for the next selection, and which (layer, site) it is for.
    live: Vec<bool>,
    live_for: Option<(usize, Site)>,
}

impl DipSelector {
    pub fn new(ratios: Ratios, cache_aware: Option<(LfuCacheState, f32)>) -> Self {
        DipSelector { ratios, cache_aware, scores: Vec::new(), scratch: Vec::new(), live: Vec::new(), live_for: None }
    }

    /// The cache state DIP-CA re-weights against (None for plain DIP).
    pub fn cache(&self) -> Option<&LfuCacheState> {
        self.cache_aware.as_ref().map(|(c, _)| c)
    }
}

/// DIP-CA's score (Eq. 10) for one unit.
#[inline]
pub fn dip_ca_score(x: f32, max_abs: f32, cached: bool, gamma: f32) -> f32 {
    let w = if cached { 1.0 } else { gamma };
    x.abs() * w / max_abs
}

impl Selector for DipSelector {
    fn describe(&self) -> String {
        let (a, b) = (self.ratios.get(0, Site::FfnIn), self.ratios.get(0, Site::FfnMid));
        match &self.cache_aware {
            None => format!("dip r_in={a:.2} r_down={b:.2}"),
            Some((_, g)) => format!("dip-ca r_in={a:.2} r_down={b:.2} gamma={g}"),
        }
    }

    fn reset(&mut self) {
        if let Some((c, _)) = &mut self.cache_aware {
            c.clear();
        }
    }

    fn wants_cache_state(&self) -> bool {
        self.cache_aware.is_some()
    }

    fn observe_cache(&mut self, layer: usize, site: Site, cached: &[bool]) {
        self.live.clear();
        self.live.extend_from_slice(cached);
        self.live_for = Some((layer, site));
    }

    fn select(&mut self, layer: usize, site: Site, _: Phase, x: &[f32], active: &mut Vec<u32>) -> Selection {
        let live = self.live_for.take() == Some((layer, site)) && self.live.len() == x.len();
        let r = self.ratios.get(layer, site);
        if r <= 0.0 || !matches!(site, Site::FfnIn | Site::FfnMid) {
            return Selection::All;
        }
        let k = kept(x.len(), r);
        self.scores.clear();
        match &mut self.cache_aware {
            None => {
                self.scores.extend(x.iter().map(|v| v.abs()));
                top_k_indices(&self.scores, k, &mut self.scratch, active);
            }
            Some((cache, gamma)) => {
                let max_abs = x.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
                if live {
                    // The store's real cache; the store itself records the accesses.
                    let cached = &self.live;
                    self.scores.extend(x.iter().zip(cached).map(|(&v, &c)| dip_ca_score(v, max_abs, c, *gamma)));
                    top_k_indices(&self.scores, k, &mut self.scratch, active);
                } else {
                    self.scores.extend(
                        x.iter()
                            .enumerate()
                            .map(|(j, &v)| dip_ca_score(v, max_abs, cache.is_cached(layer, site, j), *gamma)),
                    );
                    top_k_indices(&self.scores, k, &mut self.scratch, active);
                    cache.access(layer, site, active);
                }
            }
        }
        Selection::Subset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With the store's cache state, a cached unit beats an uncached one unless the uncached one is
    /// more than 1/γ times stronger; the state applies to the next selection of that site only.
    #[test]
    fn live_cache_state_reweights_the_next_selection() {
        let ratios = Ratios::from_table(vec![[0.0, 0.0, 0.5, 0.5]]);
        let lfu =
            LfuCacheState::new(SiteDims { n_layer: 1, units: [4, 4, 4, 4] }, &[Site::FfnIn, Site::FfnMid], |_, _| 0.5);
        let mut sel = DipSelector::new(ratios, Some((lfu, 0.2)));
        assert!(sel.wants_cache_state());
        let x = [1.0f32, 4.0, 0.3, 6.0];
        let mut active = Vec::new();
        // Units 0 and 2 cached: 1.0 and 0.3 stay, 4.0 · 0.2 = 0.8 loses to 1.0, 6.0 · 0.2 = 1.2 wins.
        sel.observe_cache(0, Site::FfnIn, &[true, false, true, false]);
        sel.select(0, Site::FfnIn, Phase::Generate, &x, &mut active);
        assert_eq!(active, vec![0, 3]);
        // The state was for one selection: the next one uses the stand-in LFU (empty: plain DIP).
        sel.select(0, Site::FfnIn, Phase::Generate, &x, &mut active);
        assert_eq!(active, vec![1, 3]);
    }
}
