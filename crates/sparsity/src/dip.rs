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
//! [`LfuCacheState`]: the store's own LFU ([`sift_cache::UnitCache`]) over a fixed number of units
//! per layer and site, updated with every selection, standing in for the cache a budget would
//! have.

use crate::topk::{kept, top_k_indices};
use crate::{Phase, Ratios, Selection, Selector, Site, SiteDims};
use sift_cache::{Policy, UnitCache};

/// The cache DIP-CA re-weights against when there is no budget: per (layer, site) a
/// [`UnitCache`] under ActiveFlow's LFU, the very policy and admission rule the tiered store runs
/// under `--memory --cache-policy lfu`, fed with every selection. With the store's slot count it
/// holds what the store would hold.
pub struct LfuCacheState {
    caches: Vec<Vec<Option<StandIn>>>,
}

struct StandIn {
    cache: UnitCache,
    hits: u64,
    accesses: u64,
}

impl StandIn {
    fn new(units: usize, capacity: usize) -> StandIn {
        StandIn { cache: UnitCache::new(units, capacity, Policy::Lfu), hits: 0, accesses: 0 }
    }

    /// One token's use of `active` (ascending, unique, in range): the store's protocol (record,
    /// split hits from misses, admit the misses protecting the hits).
    fn access(&mut self, active: &[u32]) {
        if self.cache.record(active).is_err() {
            return; // units out of range cannot come from a selection over this site's input
        }
        let (hits, misses): (Vec<u32>, Vec<u32>) = active.iter().partition(|&&u| self.cache.contains(u));
        self.accesses += active.len() as u64;
        self.hits += hits.len() as u64;
        if !misses.is_empty() && self.cache.slots() > 0 {
            let _ = self.cache.admit(&misses, &hits);
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
                            StandIn::new(n, cap)
                        })
                    })
                    .collect()
            })
            .collect();
        LfuCacheState { caches }
    }

    /// Whether `unit` of `site` in `layer` is cached now.
    pub fn is_cached(&self, layer: usize, site: Site, unit: usize) -> bool {
        self.caches[layer][site.index()].as_ref().is_some_and(|c| c.cache.contains(unit as u32))
    }

    /// Units cached at (layer, site).
    pub fn len(&self, layer: usize, site: Site) -> usize {
        self.caches[layer][site.index()].as_ref().map_or(0, |c| c.cache.len())
    }

    pub fn is_empty(&self, layer: usize, site: Site) -> bool {
        self.len(layer, site) == 0
    }

    /// Capacity in units at (layer, site).
    pub fn capacity(&self, layer: usize, site: Site) -> usize {
        self.caches[layer][site.index()].as_ref().map_or(0, |c| c.cache.slots())
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
            *c = StandIn::new(c.cache.n_units(), c.cache.slots());
        }
    }
}

/// DIP, or DIP-CA when built with a cache state and γ.
pub struct DipSelector {
    ratios: Ratios,
    cache_aware: Option<(LfuCacheState, f32)>,
    scores: Vec<f32>,
    scratch: Vec<u32>,
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

    /// The stand-in admits as the tiered store's LFU does: a newcomer must have been used more
    /// often than the least-used resident to evict it (ActiveFlow's strict rule), free slots first.
    #[test]
    fn stand_in_cache_admits_like_the_stores_lfu() {
        let dims = SiteDims { n_layer: 1, units: [4, 4, 4, 4] };
        let mut lfu = LfuCacheState::new(dims, &[Site::FfnIn], |_, _| 0.25);
        assert_eq!(lfu.capacity(0, Site::FfnIn), 1);
        lfu.access(0, Site::FfnIn, &[0]);
        lfu.access(0, Site::FfnIn, &[0]);
        assert!(lfu.is_cached(0, Site::FfnIn, 0), "a free slot takes the first miss");
        lfu.access(0, Site::FfnIn, &[1]);
        assert!(lfu.is_cached(0, Site::FfnIn, 0) && !lfu.is_cached(0, Site::FfnIn, 1), "count 1 does not beat count 2");
        lfu.access(0, Site::FfnIn, &[1]);
        lfu.access(0, Site::FfnIn, &[1]);
        assert!(lfu.is_cached(0, Site::FfnIn, 1) && !lfu.is_cached(0, Site::FfnIn, 0), "count 3 beats count 2");
        assert_eq!(lfu.len(0, Site::FfnIn), 1);
        assert!((lfu.hit_rate() - 1.0 / 5.0).abs() < 1e-12, "one hit (the second use of unit 0) in five");
    }
}
